"""Broker settings from a TOML file and ``TRIO_COORD_*`` variables, under the flags.

Its one job is the precedence of ``trio-coord broker``'s settings: a flag given
on the command line wins, then the environment variable named after it
(``--max-connections`` -> ``TRIO_COORD_MAX_CONNECTIONS``), then the
``--config FILE`` (TOML, read with the standard ``tomllib``: keys are the
flags' names without the dashes, ``max-connections = 5000``; ``_`` may stand
for ``-``), then the built-in default. It works on the broker command's
argparse parser, so every flag is a setting and no setting is written twice;
a key or variable that names no setting, or a value of the wrong type, is an
error that names it.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ENV_PREFIX", "SettingsError", "apply_settings", "effective_settings"]

ENV_PREFIX = "TRIO_COORD_"
_NOT_SETTINGS = {"help", "config", "print_config", "json", "log_level"}
_SECRETS = {"zk_auth"}
"""Settings whose value ``--print-config`` does not show (credentials)."""


class SettingsError(ValueError):
    """A config file or an environment variable that cannot be used; the message says why."""


def _settings(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's settings: option dest -> action (flags that are not settings left out)."""
    return {
        action.dest: action
        for action in parser._actions
        if action.option_strings and action.dest not in _NOT_SETTINGS
    }


def _convert(action: argparse.Action, value: Any, where: str) -> Any:
    """``value`` (from TOML or the environment) as the flag would have parsed it."""
    flag = action.option_strings[-1]
    if isinstance(action, argparse._StoreTrueAction):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise SettingsError(f"{where}: {flag} is a switch; give true or false, not {value!r}")
    if isinstance(value, bool | list | dict):
        raise SettingsError(f"{where}: {flag} takes one value, not {value!r}")
    try:
        converted = action.type(str(value)) if callable(action.type) else str(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{where}: {flag} {value!r} is not a valid value") from None
    if action.choices is not None and converted not in action.choices:
        raise SettingsError(
            f"{where}: {flag} {value!r} is not one of {', '.join(map(str, action.choices))}"
        )
    return converted


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise SettingsError(f"--config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"--config {path} is not valid TOML: {exc}") from None


def apply_settings(
    parser: argparse.ArgumentParser, config_file: str | None, environ: Mapping[str, str]
) -> dict[str, str]:
    """Set the parser's defaults from ``config_file`` and ``environ``; return where each came from.

    Call before parsing the command line: flags given there still win.
    """
    actions = _settings(parser)
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if config_file is not None:
        for key, value in _read_file(config_file).items():
            dest = key.replace("-", "_")
            action = actions.get(dest)
            if action is None:
                close = difflib.get_close_matches(dest, actions, n=1)
                hint = f" (did you mean {close[0].replace('_', '-')}?)" if close else ""
                raise SettingsError(
                    f"--config {config_file}: {key!r} is not a broker setting{hint}; the "
                    "settings are the flags of 'trio-coord broker --help', without dashes"
                )
            values[dest] = _convert(action, value, f"--config {config_file}")
            origin[dest] = config_file
    for dest, action in actions.items():
        name = ENV_PREFIX + dest.upper()
        if name in environ:
            values[dest] = _convert(action, environ[name], name)
            origin[dest] = name
    parser.set_defaults(**values)
    return origin


def effective_settings(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    origin: Mapping[str, str],
    argv: Sequence[str],
) -> list[tuple[str, Any, str]]:
    """Every setting as ``(flag name, value, where it came from)``, for ``--print-config``."""
    given = {s.split("=", 1)[0] for s in argv if s.startswith("--")}
    rows = []
    for dest, action in sorted(_settings(parser).items()):
        flag = action.option_strings[-1]
        if any(option in given for option in action.option_strings):
            source = "flag"
        else:
            source = origin.get(dest, "default")
        value = getattr(args, dest)
        if dest in _SECRETS and value is not None:
            value = "(hidden)"
        rows.append((flag.lstrip("-"), value, source))
    return rows
