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

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import msgspec

from ..protocol.connection import Connection, RequestHandler
from ..protocol.errors import (
    BrokerShuttingDownError,
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
    TopicPartition,
)
from .coordinator import Coordinators
from .paging import encoded_size, page, page_members
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
        answer = _NOW.get(type(body))
        return None if answer is None else answer(self, body)

    async def handle(self, body: RequestBody) -> ResponseBody:
        """Answer a request that may wait (joins, writes)."""
        answer = _LATER.get(type(body))
        if answer is None:
            raise UnsupportedMessageError(f"a broker does not accept {type(body).__name__}")
        if self._broker.shutting_down:
            raise BrokerShuttingDownError("the broker is shutting down; use another broker")
        return await answer(self, body)

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
        return self._broker.metadata(body)

    def _list_offsets(self, body: ListOffsetsRequest) -> ResponseBody | None:
        if self._broker.clustered and self._unknown({tp.topic for tp in body.partitions}):
            return None  # a topic made on another broker may not have reached us yet
        return self._partitions.list_offsets(body)

    def _unknown(self, topics: Iterable[str]) -> list[str]:
        return [t for t in topics if t not in self._topics.partitions]

    def _list_groups(self, body: ListGroupsRequest) -> ResponseBody:
        groups = (g for g in self._coordinator.list_groups() if g.group_id > body.after)
        listed, following = page(groups, _group_id, self._broker.page_bytes)
        return ListGroupsResponse(listed, following or "")

    def _describe_group(self, body: DescribeGroupRequest) -> ResponseBody:
        group = self._coordinator.describe_group(body.group)
        bare = msgspec.structs.replace(group, members=[], offsets=[])
        room = self._broker.page_bytes - encoded_size(bare)
        members: list[MemberDescription] = []
        after = body.offsets_after
        if after is None:  # members first; offsets once every member is given
            members, members_next, used = page_members(group.members, body.members_after, room)
            if members_next is not None:
                return DescribeGroupResponse(
                    _described(bare, members, []), members_next=members_next
                )
            room -= used
        offsets = (o for o in group.offsets if after is None or o.tp > after)
        listed, following = page(offsets, _tp, max(room, 1))
        return DescribeGroupResponse(_described(bare, members, listed), following)

    def _fetch_offsets(self, body: OffsetFetchRequest) -> ResponseBody:
        offsets = self._coordinator.fetch_offsets(body.group, body.partitions)
        if body.partitions is not None:
            return OffsetFetchResponse(offsets)
        after = body.after
        wanted = (o for o in offsets if after is None or o.tp > after)
        listed, following = page(wanted, _tp, self._broker.page_bytes)
        return OffsetFetchResponse(listed, following)

    # -- in a task -----------------------------------------------------------------

    async def _join(self, body: JoinGroupRequest) -> ResponseBody:
        size, most = encoded_size(body.topics), self._broker.page_bytes // 2
        if size > most:  # (at the default frame, the entry count binds first)
            raise InvalidTopicError(
                f"a subscription of {size} bytes is more than the {most} this broker allows "
                "(a quarter of its frame size: DescribeGroup must show the member on one page); "
                "subscribe to a pattern that covers the topics instead"
            )
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
        return self._broker.metadata(body)

    async def _list_offsets_after_reading_topics(self, body: ListOffsetsRequest) -> ResponseBody:
        """ListOffsets naming topics this broker does not know: read them from the store first."""
        await self._broker.read_topics(self._unknown(sorted({tp.topic for tp in body.partitions})))
        return self._partitions.list_offsets(body)

    async def _produce(self, body: ProduceRequest) -> ResponseBody:
        await self._broker.read_topics(self._unknown([body.topic]))
        return await self._partitions.produce(body)

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
        return await self._partitions.fetch(body, self._broker.max_frame_size)


_NOW: dict[type, Callable[[BrokerHandler, Any], ResponseBody | None]] = {
    HeartbeatRequest: BrokerHandler._heartbeat,
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
}
"""Requests answered in a task of their own."""
