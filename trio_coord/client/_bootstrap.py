"""Finding brokers: bootstrap lists, bounded retries with backoff, and the coordinator of a group.

A client is given a bootstrap list (``"host:port,host:port"``). It asks any
reachable broker for metadata, retrying with jittered exponential backoff
while no broker answers or no coordinator is available yet, and connects to
the broker that Metadata names as the group's coordinator. Every wait is
bounded twice: each attempt (a connect, a request) by ``request_timeout``, and
the whole operation by its caller's deadline, set with
:meth:`Bootstrap.fail_after`. A :class:`Bootstrap` remembers why each address
last failed (``connection refused``, ``no answer within request_timeout``) so
that the error raised when a deadline passes names every address it could not
reach and why, and says what to check.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import NamedTuple

import trio

from .._retry import RetryPolicy
from .._routing import Address, coordinator_of, parse_bootstrap
from ..protocol.connection import Connection, os_reason, serving
from ..protocol.errors import ConnectionClosedError, CoordError, RequestTimedOutError
from ..protocol.messages import BrokerInfo, MetadataRequest, MetadataResponse
from ..security.client import ClientSecurity, secure_stream

__all__ = ["Answer", "Backoff", "Bootstrap", "lower_reason", "parse_bootstrap"]

log = logging.getLogger(__name__)

_WARN_AFTER = 3.0
_WARN_EVERY = 30.0


class Answer(NamedTuple):
    """A Metadata answer and the address of the broker that gave it (None: not known)."""

    response: MetadataResponse
    address: Address | None


def lower_reason(exc: OSError) -> str:
    """Why a connect failed, in the OS's words, lower-cased (``"connection refused"``)."""
    text = os_reason(exc)
    return text[:1].lower() + text[1:]


class Backoff(RetryPolicy):
    """The clients' :class:`~trio_coord._retry.RetryPolicy`, slept with Trio."""

    async def sleep(self) -> None:
        """Sleep for the current delay (with ±20% jitter), then double it."""
        await trio.sleep(self.next_delay())


class Bootstrap:
    """Asks the brokers of a bootstrap list for metadata, with bounded retries.

    ``request_timeout`` bounds each connect and each request; the methods
    that retry take the total deadline of their operation (``timeout``, in
    seconds; ``math.inf`` for a background task that must keep trying).
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        backoff: Backoff | None = None,
        request_timeout: float = 30.0,
        security: ClientSecurity | None = None,
    ) -> None:
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be positive (seconds), not {request_timeout}")
        self.addresses = parse_bootstrap(bootstrap)
        self.request_timeout = request_timeout
        self.security = security or ClientSecurity()
        """TLS and the SASL login of every connection this client opens."""
        self._backoff = backoff or Backoff()
        self._last_error: Exception | None = None
        self._failures: dict[Address, str] = {}
        self._tried: set[Address] = set()
        self._note = ""  # why a wait goes on although brokers answer

    # -- why addresses failed ----------------------------------------------------------

    def failed(self, address: Address, why: str) -> None:
        """Remember why ``address`` failed (for the error raised when a deadline passes)."""
        self._failures[address] = why

    def answered(self, address: Address) -> None:
        """``address`` answered: forget its last failure."""
        self._failures.pop(address, None)

    def saw(self, error: Exception) -> None:
        """Remember ``error`` as the last retriable one (for :meth:`deadline_error`)."""
        self._last_error = error

    def unreachable(self) -> str:
        """Every address that failed, and why: ``"127.0.0.1:9 — connection refused, ..."``.

        Bootstrap addresses come first (one not tried before the deadline
        says so), then the other brokers this client failed to reach.
        """
        untried = [a for a in self.addresses if a not in self._tried]
        parts = [f"{h}:{p} — {why}" for (h, p), why in self._failures.items()]
        parts += [f"{h}:{p} — not tried before the deadline" for h, p in untried]
        return ", ".join(parts) or "every broker answered"

    def deadline_error(
        self, what: str, timeout: float, setting: str = "", last: BaseException | None = None
    ) -> RequestTimedOutError:
        """The error for an operation whose deadline passed: what, every failure, what to do.

        ``setting`` names the option that set the deadline; ``last`` (default:
        the last retriable error this bootstrap saw) is reported when no
        address failed outright (a broker that answers, but with a retriable
        error).
        """
        within = f"{timeout:g}s ({setting})" if setting else f"{timeout:g}s"
        last = last or self._last_error
        if self._note:
            return RequestTimedOutError(f"{what} within {within}: {self._note}")
        if self._failures or last is None:
            return RequestTimedOutError(
                f"{what} within {within}: {self.unreachable()}; check that a broker is "
                "running at these addresses and reachable from here (or allow more time)"
            )
        return RequestTimedOutError(f"{what} within {within}; the last error: {last}")

    # -- asking ----------------------------------------------------------------------------

    async def connect(self, address: Address) -> trio.abc.Stream:
        """A stream to ``address`` within ``request_timeout``; remembers why one failed.

        With TLS or SASL (``security``) the stream is encrypted and logged in.
        Raises ConnectionClosedError or RequestTimedOutError (both retriable),
        or SaslAuthenticationError (not retriable) if the broker refuses the login.
        """
        host, port = address
        self._tried.add(address)
        with trio.move_on_after(self.request_timeout):
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError as exc:
                why = lower_reason(exc)
                self.failed(address, why)
                raise ConnectionClosedError(
                    f"cannot connect to {host}:{port} ({why}); is a broker running there?"
                ) from None
            if self.security.plain:
                return stream
            try:
                return await secure_stream(stream, host, self.security)
            except ConnectionClosedError as exc:
                self.failed(address, str(exc))
                raise
        why = f"no connection within request_timeout ({self.request_timeout:g}s)"
        self.failed(address, why)
        raise RequestTimedOutError(f"cannot connect to {host}:{port}: {why}")

    async def _ask(self, address: Address, request: MetadataRequest) -> Answer:
        host, port = address
        stream = await self.connect(address)
        async with serving(Connection(stream, name=f"{host}:{port}")) as conn:
            with trio.move_on_after(self.request_timeout):
                try:
                    response = await conn.request(request)
                except CoordError as exc:
                    if exc.retriable:
                        self.failed(address, str(exc))
                    raise
                assert isinstance(response, MetadataResponse)
                self.answered(address)
                return Answer(response, address)
        why = f"no answer within request_timeout ({self.request_timeout:g}s)"
        self.failed(address, why)
        raise RequestTimedOutError(f"{host}:{port} gave {why}")

    async def metadata_once(self, request: MetadataRequest) -> Answer:
        """Ask each bootstrap broker in turn; raise the last error if none answers.

        The answer comes with the address it came from: the routing policy
        reaches a broker that lists only itself there (``_routing``).
        """
        error: Exception | None = None
        for address in self.addresses:
            try:
                return await self._ask(address, request)
            except CoordError as exc:
                if not exc.retriable:
                    raise
                error = exc
        assert error is not None
        raise error

    async def metadata(self, request: MetadataRequest) -> Answer:
        """Like :meth:`metadata_once`, retrying retriable errors with backoff until answered.

        Non-retriable errors (an unknown topic) are raised at once. Bound it
        with :meth:`fail_after` (or any cancel scope).
        """
        failing_since: float | None = None
        warned_at = -math.inf
        while True:
            try:
                answer = await self.metadata_once(request)
            except CoordError as exc:
                if not exc.retriable:
                    raise
                self._last_error = exc
                now = trio.current_time()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= _WARN_AFTER and now - warned_at >= _WARN_EVERY:
                    warned_at = now
                    log.warning(
                        "no broker has answered for %.0fs (%s); still trying",
                        now - failing_since,
                        self.unreachable(),
                    )
                await self._backoff.sleep()
                continue
            self._backoff.reset()
            return answer

    @asynccontextmanager
    async def open(self, address: Address) -> AsyncIterator[Connection]:
        """A served connection to ``address`` for the life of the block (TLS, login)."""
        stream = await self.connect(address)
        async with serving(Connection(stream, name=f"{address[0]}:{address[1]}")) as conn:
            yield conn

    async def connect_any(self) -> tuple[trio.abc.Stream, Address]:
        """Connect to the first bootstrap broker that accepts, retrying with backoff.

        Bound it with :meth:`fail_after` (or any cancel scope).
        """
        while True:
            for address in self.addresses:
                try:
                    stream = await self.connect(address)
                except CoordError as exc:
                    if not exc.retriable:
                        raise  # (a refused login: retrying would be refused again)
                    self._last_error = exc
                    continue
                self.answered(address)
                self._backoff.reset()
                return stream, address
            await self._backoff.sleep()

    async def find_coordinator(self, group_id: str) -> BrokerInfo:
        """The broker that coordinates ``group_id``, retrying until one is known.

        Bound it with :meth:`fail_after` (or any cancel scope).
        """
        while True:
            answer = await self.metadata(MetadataRequest(topics=[], group=group_id))
            found = coordinator_of(answer.response, group_id, answer.address)
            if isinstance(found, BrokerInfo):
                self._note = ""
                return found
            self._note = str(found)
            await self._backoff.sleep()

    @contextmanager
    def fail_after(self, timeout: float, what: str, setting: str = "") -> Iterator[None]:
        """Like ``trio.fail_after``, but the error says what failed at every address and why.

        ``what`` says what did not happen (``"no broker answered"``); ``setting``
        names the option that set ``timeout``. The error is a
        RequestTimedOutError: ``"<what> within 2s (setting): 127.0.0.1:9 —
        connection refused; check that a broker is running ..."``.
        """
        self._last_error = None
        self._note = ""
        with trio.move_on_after(timeout) as scope:
            yield
        if scope.cancelled_caught:
            raise self.deadline_error(what, timeout, setting)

    @property
    def last_error(self) -> Exception | None:
        """The last retriable error seen (to explain a long wait)."""
        return self._last_error
