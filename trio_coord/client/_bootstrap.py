"""Finding brokers: bootstrap lists, retry with backoff, and the coordinator of a group.

A client is given a bootstrap list (``"host:port,host:port"``). It asks any
reachable broker for metadata, retrying with jittered exponential backoff
while no broker answers or no coordinator is available yet, and connects to
the broker that Metadata names as the group's coordinator.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence

import trio

from ..protocol.connection import connect_tcp, open_connection
from ..protocol.errors import CoordError
from ..protocol.messages import BrokerInfo, MetadataRequest, MetadataResponse

__all__ = ["Backoff", "Bootstrap", "parse_bootstrap"]

log = logging.getLogger(__name__)

_WARN_AFTER = 3.0
_WARN_EVERY = 30.0

Address = tuple[str, int]


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[Address]:
    """Parse ``"h1:p1,h2:p2"`` (or a list of ``"h:p"``) into addresses.

    Raises ValueError with the offending entry if one is not ``host:port``.
    """
    entries = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses: list[Address] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"bootstrap entry {entry!r} is not host:port (for example 127.0.0.1:9092)"
            )
        addresses.append((host.strip("[]"), int(port)))
    if not addresses:
        raise ValueError("the bootstrap list is empty; give at least one broker as host:port")
    return addresses


class Backoff:
    """Jittered exponential backoff: ``initial``, doubling up to ``maximum``."""

    def __init__(self, initial: float = 0.05, maximum: float = 2.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def reset(self) -> None:
        """Start again from the initial delay (after a success)."""
        self._next = self.initial

    async def sleep(self) -> None:
        """Sleep for the current delay (with ±20% jitter), then double it."""
        delay = self._next * random.uniform(0.8, 1.2)
        self._next = min(self._next * 2, self.maximum)
        await trio.sleep(delay)


class Bootstrap:
    """Asks the brokers of a bootstrap list for metadata, with retries."""

    def __init__(self, bootstrap: str | Sequence[str], *, backoff: Backoff | None = None) -> None:
        self.addresses = parse_bootstrap(bootstrap)
        self._backoff = backoff or Backoff()
        self._last_error: Exception | None = None

    async def metadata_once(self, request: MetadataRequest) -> MetadataResponse:
        """Ask each bootstrap broker in turn; raise the last error if none answers."""
        error: Exception | None = None
        for host, port in self.addresses:
            try:
                async with open_connection(host, port) as conn:
                    response = await conn.request(request)
                    assert isinstance(response, MetadataResponse)
                    return response
            except CoordError as exc:
                if not exc.retriable:
                    raise
                error = exc
        assert error is not None
        raise error

    async def metadata(self, request: MetadataRequest) -> MetadataResponse:
        """Like :meth:`metadata_once`, retrying retriable errors with backoff until it succeeds.

        Bound it with a cancel scope; non-retriable errors (an unknown topic)
        are raised at once.
        """
        failing_since: float | None = None
        warned_at = -math.inf
        while True:
            try:
                response = await self.metadata_once(request)
            except CoordError as exc:
                if not exc.retriable:
                    raise
                self._last_error = exc
                now = trio.current_time()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= _WARN_AFTER and now - warned_at >= _WARN_EVERY:
                    warned_at = now
                    log.warning(
                        "no broker at %s has answered for %.0fs (%s); still trying",
                        ",".join(f"{h}:{p}" for h, p in self.addresses),
                        now - failing_since,
                        exc,
                    )
                await self._backoff.sleep()
                continue
            self._backoff.reset()
            return response

    async def connect_any(self) -> tuple[trio.SocketStream, Address]:
        """Connect to the first bootstrap broker that accepts, retrying with backoff."""
        while True:
            for host, port in self.addresses:
                try:
                    stream = await connect_tcp(host, port)
                except CoordError as exc:
                    self._last_error = exc
                    continue
                self._backoff.reset()
                return stream, (host, port)
            await self._backoff.sleep()

    async def find_coordinator(self, group_id: str) -> BrokerInfo:
        """The broker that coordinates ``group_id`` (retrying until one is known)."""
        while True:
            response = await self.metadata(MetadataRequest(topics=[], group=group_id))
            if response.coordinator is not None:
                return response.coordinator
            await self._backoff.sleep()

    @property
    def last_error(self) -> Exception | None:
        """The last retriable error seen (to explain a long wait)."""
        return self._last_error
