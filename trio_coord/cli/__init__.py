# PYTHON_ARGCOMPLETE_OK
"""The ``trio-coord`` command line: parse, call the public API, print.

Every subcommand is a thin shell over ``open_broker``, ``open_admin``,
``open_producer`` or ``open_consumer``: it prints tables for people and, with ``--json``, one JSON
document (or one JSON object per line for event streams) for scripts. Errors
a user can cause are printed as one ``error:`` line saying what to do, with
exit status 1 (2 for bad usage). SIGINT and SIGTERM stop a broker or a
consumer gracefully: the consumer leaves its group, the broker finishes its
writes.

The package keeps one job per module: ``parser`` builds the argparse tree (and
reads the broker's settings), ``render`` turns results into tables and JSON,
``_common`` turns the client options into client arguments, and the command
modules (``broker``, ``topics``, ``groups``, ``data``, ``security``) each run one
family of subcommands. This module keeps ``main``, the entry point, and the
names scripts and tests import from ``trio_coord.cli``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence

import trio

from .._settings import SettingsError, apply_settings, effective_settings
from ..log import LogError
from ..protocol.errors import CoordError
from ..store.base import StoreError
from ._common import DEFAULT_BOOTSTRAP, DEFAULT_PORT, UsageError
from .parser import _log_level, _subparser, build_parser
from .render import _print_json, describe_text, format_table, group_to_json, kafka_topic_id

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_PORT",
    "UsageError",
    "build_parser",
    "describe_text",
    "format_table",
    "group_to_json",
    "kafka_topic_id",
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (see docs/operations.md)
        import argcomplete

        argcomplete.autocomplete(parser)
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    if args.command == "broker":  # file, then environment, under the flags: parse again
        broker = _subparser(parser, "broker")
        try:
            origin = apply_settings(broker, args.config, os.environ)
        except SettingsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        args = parser.parse_args(arguments)
        if args.print_config:
            rows = effective_settings(broker, args, origin, arguments)
            if args.json:
                _print_json({name: value for name, value, _ in rows})
            else:
                for name, value, source in rows:
                    shown = json.dumps(value) if value is not None else "(unset)"
                    print(f"{name} = {shown}  # {source}")
            return 0
    try:
        level = _log_level(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        trio.run(args.func, args)
    except (CoordError, StoreError, LogError, UsageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `trio-coord groups describe g | head`
        sys.stderr.close()  # (and say nothing more on a closed pipe)
        return 0
    except OSError as exc:
        print(f"error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
