"""Which API keys the Kafka front end serves, at which versions, and by which handler.

Its one job is the dispatch table. A handler module (``metadata``,
``produce``, ``fetch``, ``admin``, ``groups``, ``consumer_groups``)
exports ``APIS``, a list of :class:`Api` entries: key, version range, the
async handler and optionally a synchronous fast path, a cost in bytes (what
the answer may hold, charged against the connection's byte budget while the
request is handled) and whether its requests take turns per connection
(``ordered``: handlers run concurrently, and Trio may start them in any
order, so an API whose effects must follow the request order says so).
:class:`FrontEnd` gathers the modules' tables into one :class:`ApiTable` and
carries what handlers share per broker: the :class:`~.service.KafkaService`,
the :class:`~.service.KafkaLimits` and one instance of each module's state
class (:meth:`FrontEnd.state`). Adding an API is adding an entry; adding a
family of APIs is adding a module to :data:`HANDLER_MODULES`.
"""

from __future__ import annotations

import datetime
import importlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

import trio

from ..security.acl import ANONYMOUS, Authorizer
from ..security.server import ServerSecurity
from .codec import RequestHead, known_versions
from .service import KafkaLimits, KafkaService

__all__ = ["HANDLER_MODULES", "Api", "ApiTable", "ClientConnection", "FrontEnd", "RequestContext"]

HANDLER_MODULES: Final = (
    "trio_coord.kafka.metadata",
    "trio_coord.kafka.produce",
    "trio_coord.kafka.fetch",
    "trio_coord.kafka.admin",
    "trio_coord.kafka.groups",
    "trio_coord.kafka.consumer_groups",
    "trio_coord.kafka.sasl",
)
"""The modules whose ``APIS`` the front end serves."""

_S = TypeVar("_S")
_NO_DELAY: Final = datetime.timedelta(0)


class ClientConnection(Protocol):
    """The Kafka connection a request came on, as handlers that outlive a request need it."""

    @property
    def closed(self) -> bool:
        """True once the client is gone."""
        ...

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the connection ends (at once if it has)."""
        ...


@dataclass(slots=True)
class RequestContext:
    """One request as a handler sees it: the front end, the header, the client.

    For an API served ``ordered``, ``after`` is set once the connection's
    previous ordered request has ended its turn, and the handler ends its own
    with :meth:`end_turn` (the listener ends it anyway when the handler returns).
    """

    front: FrontEnd
    head: RequestHead
    client_id: str | None
    peer: str
    after: trio.Event | None = None
    turn: trio.Event | None = None
    conn: ClientConnection | None = None
    """The connection (None in tests that call a handler directly)."""
    principal: str = ANONYMOUS
    """Who the client proved to be (``User:ANONYMOUS`` without authentication)."""

    async def throttle(self, kind: str, amount: int) -> datetime.timedelta:
        """Delay while the principal is over its ``kind`` byte-rate quota; the delay (for the
        answer's ``throttle_time``)."""
        security = self.front.security
        if security is None or not security.quotas.enabled:
            return _NO_DELAY
        delay = security.quotas.record(self.principal, kind, amount, trio.current_time())
        if delay <= 0:
            return _NO_DELAY
        await trio.sleep(delay)
        return datetime.timedelta(seconds=delay)

    def allowed(self, operation: str, resource_type: str, name: str) -> bool:
        """May this request's principal do ``operation`` on the resource (docs/security.md)?"""
        authorizer = self.front.authorizer
        return authorizer is None or authorizer.allowed(
            self.principal, operation, resource_type, name
        )

    @property
    def version(self) -> int:
        """The API version the client used (the response must use the same)."""
        return self.head.api_version

    async def wait_turn(self) -> None:
        """Wait until the previous ordered request of the connection ended its turn."""
        if self.after is not None:
            await self.after.wait()

    def end_turn(self) -> None:
        """Let the next ordered request of the connection go on (idempotent)."""
        if self.turn is not None:
            self.turn.set()


Handler = Callable[[RequestContext, Any], Awaitable[Any | None]]
"""An API handler: the response object, or None for no response (Produce with acks=0)."""
FastPath = Callable[[RequestContext, Any], Any | None]
"""A synchronous handler: the response, or None to run the async handler instead."""


@dataclass(frozen=True, slots=True)
class Api:
    """One API key as served: versions, handler, optional fast path and cost."""

    key: int
    min_version: int
    max_version: int
    handler: Handler
    now: FastPath | None = None
    cost: Callable[[FrontEnd, Any], int] | None = None
    ordered: bool = False
    """Requests of this API on one connection take turns (``RequestContext.wait_turn``):
    Produce, whose batches must reach each partition in the order they were sent."""
    authorizes: bool = False
    """Its handler checks ACLs itself (docs/security.md). With authorization on, an API
    that does not say so is refused (CLUSTER_AUTHORIZATION_FAILED) to all but super users:
    a new API is denied by default until its checks are written."""


@dataclass(slots=True)
class ApiTable:
    """API key → :class:`Api`; checked against the versions kio has schemas for."""

    apis: dict[int, Api] = field(default_factory=dict)

    def add(self, api: Api) -> None:
        """Serve ``api`` (ValueError for a key served twice or a version kio lacks)."""
        if api.key in self.apis:
            raise ValueError(f"API key {api.key} is served twice")
        known = known_versions(api.key)
        if known is None or not known[0] <= api.min_version <= api.max_version <= known[1]:
            raise ValueError(f"API key {api.key}: kio has schemas for {known} only")
        self.apis[api.key] = api

    def get(self, key: int) -> Api | None:
        """The entry of ``key``, or None if it is not served."""
        return self.apis.get(key)

    def ranges(self) -> list[tuple[int, int, int]]:
        """(key, min, max) of every API served, by key (what ApiVersions lists)."""
        return [(k, a.min_version, a.max_version) for k, a in sorted(self.apis.items())]


def load_table(modules: Iterable[str] = HANDLER_MODULES) -> ApiTable:
    """The table of every ``APIS`` entry of ``modules``."""
    table = ApiTable()
    for name in modules:
        for api in importlib.import_module(name).APIS:
            table.add(api)
    return table


class FrontEnd:
    """What the Kafka handlers of one broker share: service, limits, APIs, module state."""

    def __init__(
        self,
        service: KafkaService,
        limits: KafkaLimits,
        modules: Iterable[str] = HANDLER_MODULES,
    ) -> None:
        self.service = service
        self.limits = limits
        self.table = load_table(modules)
        self._states: dict[type[Any], Any] = {}
        security = getattr(service, "security", None)
        self.security: ServerSecurity | None = security
        """The broker's TLS, logins and authorizer (None: a test double without them)."""
        self.authorizer: Authorizer | None = (
            security.authorizer if security is not None and security.authorizer.enabled else None
        )
        """None when authorization is off (nothing to check)."""

    def state(self, kind: Callable[[FrontEnd], _S]) -> _S:
        """The one instance of ``kind`` (a module's per-broker state) for this front end."""
        found = self._states.get(kind)  # type: ignore[call-overload]
        if found is None:
            found = self._states[kind] = kind(self)  # type: ignore[index]
        return found
