"""The broker's side of one client connection: requests in, answers out.

A :class:`BrokerHandler` is bound to one :class:`~trio_coord.protocol.Connection`
and routes each request to the topic manager, the partition service (Produce,
Fetch, ListOffsets) or the coordinator service. It decides nothing itself.
Cheap requests (Heartbeat first of all, and the read-only Metadata,
ListGroups, DescribeGroup, OffsetFetch, ListOffsets) are answered inline
by ``handle_now``, without spawning a task; the rest run in a handler task.
When the connection ends, the members that lived on it are removed as failed.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import msgspec
import trio

from ..core.validation import PATTERN_PREFIX
from ..protocol.connection import Connection, RequestHandler
from ..protocol.errors import (
    AuthorizationError,
    BrokerShuttingDownError,
    InvalidRequestError,
    InvalidTopicError,
    UnsupportedMessageError,
)
from ..protocol.messages import (
    AddPartitionsRequest,
    AddPartitionsResponse,
    CreateGroupRequest,
    CreateGroupResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    DeleteOffsetsRequest,
    DeleteOffsetsResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    FetchRequest,
    FetchResponse,
    GroupDescription,
    GroupSummary,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    MemberDescription,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    ProduceRequest,
    RequestBody,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
    ResponseBody,
    SecurityAdminRequest,
    SecurityAdminResponse,
    TopicPartition,
)
from ..protocol.sizing import encoded_size, page
from ..security.acl import CLUSTER, Authorizer
from ..security.quota import Quotas
from ..security.store import security_admin
from .coordinator import Coordinators
from .paging import page_members
from .partitions import PartitionService
from .topics import TopicManager


class NativeBroker(Protocol):
    """What a native connection's handler uses of its broker (``Broker`` is one).

    The handler depends on this, not on the broker itself: it is built with
    any object that has these, and nothing here imports ``server``.
    """

    @property
    def coordinator(self) -> Coordinators:
        """The coordinator services of the slots this broker holds."""
        ...

    @property
    def topics(self) -> TopicManager:
        """The topics."""
        ...

    @property
    def partitions(self) -> PartitionService:
        """Produce, Fetch, ListOffsets on the partitions this broker holds."""
        ...

    @property
    def clustered(self) -> bool:
        """True in a cluster on ZooKeeper (topics made elsewhere may not be here yet)."""
        ...

    @property
    def shutting_down(self) -> bool:
        """True once the broker refuses new work."""
        ...

    @property
    def page_bytes(self) -> int:
        """How much of a frame one page of a listing may fill."""
        ...

    @property
    def max_frame_size(self) -> int:
        """The largest frame."""
        ...

    @property
    def max_fetch_bytes(self) -> int:
        """The most one fetch answer carries."""
        ...

    async def read_topics(self, names: list[str]) -> None:
        """Read topics just made by another broker of the cluster (a no-op otherwise)."""
        ...

    def metadata(self, request: MetadataRequest) -> MetadataResponse:
        """Brokers, topics, and a group's coordinator, as Metadata answers them."""
        ...


__all__ = ["BrokerHandler", "NativeBroker"]

_HEARTBEAT_OK = HeartbeatResponse()


def _group_id(summary: GroupSummary) -> str:
    return summary.group_id


def _tp(offset: PartitionOffset) -> TopicPartition:
    return offset.tp


def _described(
    bare: GroupDescription, members: list[MemberDescription], offsets: list[PartitionOffset]
) -> GroupDescription:
    return msgspec.structs.replace(bare, members=members, offsets=offsets)


class BrokerHandler(RequestHandler):
    """Routes one connection's requests; see the module docstring."""

    def __init__(self, broker: NativeBroker, conn: Connection) -> None:
        self._broker = broker
        self._coordinator = broker.coordinator
        self._topics = broker.topics
        self._partitions = broker.partitions
        self._conn = conn
        security = getattr(broker, "security", None)
        authorizer = None if security is None else security.authorizer
        self._security = security
        self._authorizer: Authorizer | None = (
            authorizer if authorizer is not None and authorizer.enabled else None
        )
        """None: authorization is off (no login required): nothing to check."""
        quotas = None if security is None else security.quotas
        self._quotas: Quotas | None = quotas if quotas is not None and quotas.enabled else None
        """None: no quota is set (nothing to count)."""
        self._owed: dict[int, float] | None = None if self._quotas is None else {}
        """Request (by id) → the delay its answer owes (over the request-rate quota); None
        without quotas (a connection costs no empty dict then)."""
        # (The routing tables are the class's: a connection costs no dict of bound methods.)

    def cost(self, body: RequestBody) -> int:
        """A fetch may be answered with up to a frame of records: charge it while it waits."""
        if type(body) is not FetchRequest:
            return 0
        broker = self._broker
        limit = min(broker.max_fetch_bytes, broker.max_frame_size)
        return min(limit, body.max_bytes) if body.max_bytes > 0 else limit

    def handle_now(self, body: RequestBody) -> ResponseBody | None:
        """Answer the cheap, synchronous requests inline."""
        if self._quotas is not None and self._quotas.requests:
            now = trio.current_time()
            delay = self._quotas.record(self._conn.principal, "request", 1, now)
            if delay > 0:
                if self._owed is None:
                    self._owed = {}
                self._owed[id(body)] = delay  # (answered in a task, late: see handle)
                return None
        answer = _NOW.get(type(body))
        if answer is None:
            return None
        if self._authorizer is not None:
            self._authorize(body)
        return answer(self, body)

    async def handle(self, body: RequestBody) -> ResponseBody:
        """Answer a request that may wait (joins, writes), or one over the request quota."""
        owed = self._owed.pop(id(body), 0.0) if self._owed else 0.0
        if owed:
            await trio.sleep(owed)
        answer = _LATER.get(type(body))
        if answer is None:
            inline = _NOW.get(type(body)) if owed else None
            if inline is not None:  # (a heartbeat over the quota: answered late)
                if self._authorizer is not None:
                    self._authorize(body)
                found = inline(self, body)
                if found is not None:
                    return found
            raise UnsupportedMessageError(f"a broker does not accept {type(body).__name__}")
        if self._broker.shutting_down:
            raise BrokerShuttingDownError("the broker is shutting down; use another broker")
        if self._authorizer is not None:
            self._authorize(body)
        return await answer(self, body)

    # -- authorization (only with authentication on) ---------------------------------

    def _authorize(self, body: RequestBody) -> None:
        """Raise AuthorizationError unless the connection's principal may send ``body``."""
        check = _ACL.get(type(body))
        if check is not None:
            check(self, body)
        elif type(body) not in _FILTERED:
            # A request with no check written (a message added later): deny by default,
            # but to super users (ALTER on the cluster).
            self._require("alter", "cluster", CLUSTER)

    def _allowed(self, operation: str, resource_type: str, name: str) -> bool:
        authorizer = self._authorizer
        return authorizer is None or authorizer.allowed(
            self._conn.principal, operation, resource_type, name
        )

    def _require(self, operation: str, resource_type: str, name: str) -> None:
        if not self._allowed(operation, resource_type, name):
            raise AuthorizationError(denied(self._conn.principal, operation, resource_type, name))

    def _member(self, group: str, member_id: str) -> None:
        self._require("read", "group", group)
        self._coordinator.check_owner(group, member_id, self._conn.principal)

    def _acl_metadata(self, body: MetadataRequest) -> None:
        for topic in body.topics or ():
            self._require("describe", "topic", topic)
        if body.group:
            self._require("describe", "group", body.group)

    def _acl_create_topic(self, body: CreateTopicRequest) -> None:
        if not self._allowed("create", "cluster", CLUSTER):
            self._require("create", "topic", body.name)

    def _acl_join(self, body: JoinGroupRequest) -> None:
        self._require("read", "group", body.group)
        for topic in body.topics:
            if not topic.startswith(PATTERN_PREFIX):
                self._require("read", "topic", topic)
        if body.member_id:
            self._coordinator.check_owner(body.group, body.member_id, self._conn.principal)

    def _acl_commit(self, body: OffsetCommitRequest) -> None:
        self._member(body.group, body.member_id)
        for topic in {o.topic for o in body.offsets}:
            self._require("read", "topic", topic)

    def _acl_reset(self, body: ResetOffsetsRequest) -> None:
        self._require("read", "group", body.group)
        for topic in {o.topic for o in body.offsets}:
            self._require("describe", "topic", topic)

    def _acl_fetch(self, body: FetchRequest) -> None:
        for topic in {p.topic for p in body.partitions}:
            self._require("read", "topic", topic)

    def _acl_list_offsets(self, body: ListOffsetsRequest) -> None:
        for topic in {p.topic for p in body.partitions}:
            self._require("describe", "topic", topic)

    def _acl_security(self, body: SecurityAdminRequest) -> None:
        operation = "describe" if body.action.startswith("list") else "alter"
        self._require(operation, "cluster", CLUSTER)

    def connection_lost(self) -> None:
        """Remove the members that lived on this connection."""
        self._coordinator.connection_lost(self._conn)

    # -- inline ------------------------------------------------------------------

    def _heartbeat(self, body: HeartbeatRequest) -> ResponseBody:
        self._coordinator.heartbeat(body)
        return _HEARTBEAT_OK

    def _metadata(self, body: MetadataRequest) -> ResponseBody | None:
        if self._broker.clustered and self._unknown(body.topics or ()):
            return None  # a topic made on another broker may not have reached us yet
        return self._visible(self._broker.metadata(body))

    def _visible(self, response: MetadataResponse) -> MetadataResponse:
        """Metadata of all topics lists only those the principal may describe."""
        if self._authorizer is None:
            return response
        topics = [t for t in response.topics if self._allowed("describe", "topic", t.name)]
        if len(topics) == len(response.topics):
            return response
        return msgspec.structs.replace(response, topics=topics)

    def _list_offsets(self, body: ListOffsetsRequest) -> ResponseBody | None:
        if self._broker.clustered and self._unknown({tp.topic for tp in body.partitions}):
            return None  # a topic made on another broker may not have reached us yet
        return self._partitions.list_offsets(body)

    def _unknown(self, topics: Iterable[str]) -> list[str]:
        return [t for t in topics if t not in self._topics.partitions]

    def _list_groups(self, body: ListGroupsRequest) -> ResponseBody:
        groups = (
            g
            for g in self._coordinator.list_groups()
            if g.group_id > body.after and self._allowed("describe", "group", g.group_id)
        )
        listed, following = page(groups, _group_id, self._broker.page_bytes)
        return ListGroupsResponse(listed, following or "")

    def _describe_group(self, body: DescribeGroupRequest) -> ResponseBody:
        after = body.offsets_after
        cursor = body.members_after
        start = None if after is not None else cursor.member_id if cursor is not None else ""
        # (Only the members this page shows are described: see Group.describe_members.)
        # (bare: without its members and offsets, which the iterators give page by page)
        bare, described, offsets = self._coordinator.describe_group_page(body.group, start, after)
        room = self._broker.page_bytes - encoded_size(bare)
        members: list[MemberDescription] = []
        if after is None:  # members first; offsets once every member is given
            members, members_next, used = page_members(described, cursor, room)
            if members_next is not None:
                return DescribeGroupResponse(
                    _described(bare, members, []), members_next=members_next
                )
            room -= used
        listed, following = page(offsets, _tp, max(room, 1))
        return DescribeGroupResponse(_described(bare, members, listed), following)

    def _fetch_offsets(self, body: OffsetFetchRequest) -> ResponseBody:
        after = body.after
        named = body.partitions
        if named is not None:
            # Paged too: an answer carries each offset's metadata, so the answer to a
            # lookup that fits a frame may not. Named in any order, any number of times,
            # each is answered once, in order; the names of pages before are left out
            # before anything is looked up (the clients ask in order, once each: they pay
            # no sort, 10 ms a page for 100,000 names).
            if after is not None:
                named = [tp for tp in named if tp > after]
            if any(a >= b for a, b in itertools.pairwise(named)):
                named = sorted(set(named))
            offsets: Iterable[PartitionOffset] = self._coordinator.fetch_offsets(body.group, named)
        else:  # all of them (none of an unknown group), built as the page takes them
            offsets = self._coordinator.offsets_after(body.group, after)
        listed, following = page(offsets, _tp, self._broker.page_bytes)
        return OffsetFetchResponse(listed, following)

    # -- in a task -----------------------------------------------------------------

    def _check_subscription(self, body: JoinGroupRequest) -> None:
        size, most = encoded_size(body.topics), self._broker.page_bytes // 2
        if size > most:  # (at the default frame, the entry count binds first)
            raise InvalidTopicError(
                f"a subscription of {size} bytes is more than the {most} this broker allows "
                "(a quarter of the frame a client reads: DescribeGroup must show the member on "
                "one page); "
                "subscribe to a pattern that covers the topics instead"
            )

    def _join_now(self, body: JoinGroupRequest) -> ResponseBody | None:
        """A join into a group whose task runs is O(1): answered inline, with no task."""
        if self._broker.shutting_down:
            return None  # (answered BROKER_SHUTTING_DOWN by handle, as any request in a task)
        self._check_subscription(body)
        return self._coordinator.join_now(body, self._conn)

    async def _join(self, body: JoinGroupRequest) -> ResponseBody:
        self._check_subscription(body)
        return await self._coordinator.join(body, self._conn)

    async def _leave(self, body: LeaveGroupRequest) -> ResponseBody:
        await self._coordinator.leave(body)
        return LeaveGroupResponse()

    async def _commit(self, body: OffsetCommitRequest) -> ResponseBody:
        await self._coordinator.commit(body)
        return OffsetCommitResponse()

    async def _metadata_after_reading_topics(self, body: MetadataRequest) -> ResponseBody:
        """Metadata naming topics this broker does not know: read them from the store first.

        Another broker's topic reaches this one through a watch, a moment
        after it is acknowledged; a client told "created" must not be told
        UNKNOWN_TOPIC here meanwhile.
        """
        await self._broker.read_topics(self._unknown(body.topics or ()))
        return self._visible(self._broker.metadata(body))

    async def _list_offsets_after_reading_topics(self, body: ListOffsetsRequest) -> ResponseBody:
        """ListOffsets naming topics this broker does not know: read them from the store first."""
        await self._broker.read_topics(self._unknown(sorted({tp.topic for tp in body.partitions})))
        return self._partitions.list_offsets(body)

    async def _produce(self, body: ProduceRequest) -> ResponseBody:
        await self._broker.read_topics(self._unknown([body.topic]))
        answer = await self._partitions.produce(body)
        if self._quotas is not None:
            await self._throttle("produce", len(body.records))
        return answer

    async def _throttle(self, kind: str, amount: int) -> None:
        """Delay the answer while the principal is over its ``kind`` byte-rate quota."""
        assert self._quotas is not None
        delay = self._quotas.record(self._conn.principal, kind, amount, trio.current_time())
        if delay > 0:
            await trio.sleep(delay)

    async def _create_topic(self, body: CreateTopicRequest) -> ResponseBody:
        return CreateTopicResponse(await self._topics.create_topic(body.name, body.partitions))

    async def _add_partitions(self, body: AddPartitionsRequest) -> ResponseBody:
        await self._broker.read_topics(self._unknown([body.topic]))
        return AddPartitionsResponse(await self._topics.add_partitions(body.topic, body.total))

    async def _delete_topic(self, body: DeleteTopicRequest) -> ResponseBody:
        await self._broker.read_topics(self._unknown([body.name]))
        await self._topics.delete_topic(body.name)
        return DeleteTopicResponse()

    async def _create_group(self, body: CreateGroupRequest) -> ResponseBody:
        await self._coordinator.create_group(body.group)
        return CreateGroupResponse()

    async def _delete_group(self, body: DeleteGroupRequest) -> ResponseBody:
        await self._coordinator.delete_group(body.group)
        return DeleteGroupResponse()

    async def _reset_offsets(self, body: ResetOffsetsRequest) -> ResponseBody:
        await self._coordinator.reset_offsets(body)
        return ResetOffsetsResponse()

    async def _delete_offsets(self, body: DeleteOffsetsRequest) -> ResponseBody:
        await self._coordinator.delete_offsets(body)
        return DeleteOffsetsResponse()

    async def _fetch(self, body: FetchRequest) -> ResponseBody:
        answer = await self._partitions.fetch(body, self._broker.max_frame_size)
        if self._quotas is not None and isinstance(answer, FetchResponse):
            size = sum(len(b.records) for p in answer.partitions for b in p.batches)
            await self._throttle("fetch", size)
        return answer

    async def _security_admin(self, body: SecurityAdminRequest) -> ResponseBody:
        if self._security is None:
            raise UnsupportedMessageError("this broker has no security settings")
        try:
            data, count = await security_admin(self._broker.store, body)  # type: ignore[attr-defined]
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        await self._security.cache.reload()  # (in force here at once; the watch tells the rest)
        return SecurityAdminResponse(data, count)


_NOW: dict[type, Callable[[BrokerHandler, Any], ResponseBody | None]] = {
    HeartbeatRequest: BrokerHandler._heartbeat,
    JoinGroupRequest: BrokerHandler._join_now,
    MetadataRequest: BrokerHandler._metadata,
    ListGroupsRequest: BrokerHandler._list_groups,
    DescribeGroupRequest: BrokerHandler._describe_group,
    OffsetFetchRequest: BrokerHandler._fetch_offsets,
    ListOffsetsRequest: BrokerHandler._list_offsets,
}
"""Requests answered inline, without a task (None: not now, in a task after all)."""

_LATER: dict[type, Callable[[BrokerHandler, Any], Awaitable[ResponseBody]]] = {
    JoinGroupRequest: BrokerHandler._join,
    LeaveGroupRequest: BrokerHandler._leave,
    OffsetCommitRequest: BrokerHandler._commit,
    CreateTopicRequest: BrokerHandler._create_topic,
    AddPartitionsRequest: BrokerHandler._add_partitions,
    DeleteTopicRequest: BrokerHandler._delete_topic,
    CreateGroupRequest: BrokerHandler._create_group,
    DeleteGroupRequest: BrokerHandler._delete_group,
    ProduceRequest: BrokerHandler._produce,
    FetchRequest: BrokerHandler._fetch,
    ResetOffsetsRequest: BrokerHandler._reset_offsets,
    DeleteOffsetsRequest: BrokerHandler._delete_offsets,
    MetadataRequest: BrokerHandler._metadata_after_reading_topics,
    ListOffsetsRequest: BrokerHandler._list_offsets_after_reading_topics,
    SecurityAdminRequest: BrokerHandler._security_admin,
}
"""Requests answered in a task of their own."""

_ACL: dict[type, Callable[[BrokerHandler, Any], None]] = {
    MetadataRequest: BrokerHandler._acl_metadata,
    CreateTopicRequest: BrokerHandler._acl_create_topic,
    AddPartitionsRequest: lambda h, b: h._require("alter", "topic", b.topic),
    DeleteTopicRequest: lambda h, b: h._require("delete", "topic", b.name),
    JoinGroupRequest: BrokerHandler._acl_join,
    HeartbeatRequest: lambda h, b: h._member(b.group, b.member_id),
    LeaveGroupRequest: lambda h, b: h._member(b.group, b.member_id),
    OffsetCommitRequest: BrokerHandler._acl_commit,
    OffsetFetchRequest: lambda h, b: h._require("describe", "group", b.group),
    DescribeGroupRequest: lambda h, b: h._require("describe", "group", b.group),
    CreateGroupRequest: lambda h, b: h._require("read", "group", b.group),
    DeleteGroupRequest: lambda h, b: h._require("delete", "group", b.group),
    ResetOffsetsRequest: BrokerHandler._acl_reset,
    DeleteOffsetsRequest: lambda h, b: h._require("delete", "group", b.group),
    ProduceRequest: lambda h, b: h._require("write", "topic", b.topic),
    FetchRequest: BrokerHandler._acl_fetch,
    ListOffsetsRequest: BrokerHandler._acl_list_offsets,
    SecurityAdminRequest: BrokerHandler._acl_security,
}
"""What each request needs, once authentication is on (docs/security.md lists it)."""

_FILTERED: frozenset[type] = frozenset({ListGroupsRequest})
"""Requests that need no ACL of their own: their answers list only what the principal may
see. Any request in neither table is refused to all but super users."""


def denied(principal: str, operation: str, resource_type: str, name: str) -> str:
    """The refusal: who, what, on which resource, and the command that would allow it."""
    what = "the cluster" if resource_type == "cluster" else f"{resource_type} {name!r}"
    flag = "--cluster" if resource_type == "cluster" else f"--{resource_type} {name}"
    return (
        f"{principal} may not {operation.upper()} {what}: no ACL grants it "
        f"(an operator can: trio-coord acls add --principal {principal} "
        f"--operation {operation} {flag})"
    )
