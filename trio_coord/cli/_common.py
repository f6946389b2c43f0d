"""What every client subcommand shares: the defaults, ``UsageError``, and the client options.

``--timeout``, ``--tls-ca``, ``--user`` and the password become the keyword arguments of
``open_admin``/``open_producer``/``open_consumer`` here, once, so that each command module
only says which call it makes; ``_ask_admin`` runs one admin call under those deadlines.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from ..client import Admin, open_admin
from ..security.client import PASSWORD_ENV, Sasl, client_ssl_context

DEFAULT_PORT = 9192


DEFAULT_BOOTSTRAP = f"127.0.0.1:{DEFAULT_PORT}"


_T = TypeVar("_T")


class UsageError(Exception):
    """A mistake in the command line that argparse could not catch."""


def _timeouts(args: argparse.Namespace) -> dict[str, Any]:
    """``--timeout`` as the deadlines of an admin client (each wait at most that long), and
    ``--tls-ca``/``--user`` as its TLS and login."""
    return {
        "api_timeout": args.timeout,
        "request_timeout": min(30.0, args.timeout),
        **_security(args),
    }


def _security(args: argparse.Namespace) -> dict[str, Any]:
    """``ssl_context=`` and ``sasl=`` of a client, from ``--tls-ca``, ``--user`` and the
    password (``$TRIO_COORD_PASSWORD`` or ``--password-file``)."""
    options: dict[str, Any] = {}
    if getattr(args, "tls_ca", None):
        options["ssl_context"] = client_ssl_context(
            args.tls_ca, certfile=args.tls_cert, keyfile=args.tls_key
        )
    user = getattr(args, "user", None)
    if user:
        if args.password_file:
            try:
                with open(args.password_file, encoding="utf-8") as file:
                    password = file.read().rstrip("\r\n")
            except OSError as exc:
                raise UsageError(f"cannot read --password-file: {exc}") from None
        else:
            password = os.environ.get(PASSWORD_ENV, "")
        if not password:
            raise UsageError(
                f"--user {user} needs a password: set ${PASSWORD_ENV} or give --password-file"
            )
        options["sasl"] = Sasl(user, password, args.sasl_mechanism)
    return options


async def _ask_admin(args: argparse.Namespace, call: Callable[[Admin], Awaitable[_T]]) -> _T:
    """Run one admin call against ``--bootstrap``; no wait in it lasts over ``--timeout`` s."""
    async with open_admin(args.bootstrap, **_timeouts(args)) as admin:
        return await call(admin)


def _names(text: str | None) -> tuple[str, ...]:
    """``"a, b"`` → ``("a", "b")``."""
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


async def _until_signalled() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return
