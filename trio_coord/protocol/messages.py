"""The wire messages: msgspec Structs in tagged unions, one per request and response.

A frame on the wire is one msgpack-encoded :data:`Frame`: a :class:`Request`
(a correlation id and a :data:`RequestBody`), a :class:`Response` (the same
correlation id, an error code, a human message and, on success, a
:data:`ResponseBody`), or a :class:`Goodbye` a peer sends before it closes a
connection over a protocol violation. Every struct is frozen and
``array_like`` (encoded as a msgpack array, so field names cost nothing on the
wire) and carries an integer tag, its API key.

Compatibility rules, which every change to this module must keep:

* fields are only ever appended, at the end, and always with a default, so an
  older peer's shorter array still decodes;
* a tag is never reused or renumbered; a retired message keeps its number;
* times are integer milliseconds on the wire (seconds as floats in the API);
* offsets are absolute record offsets; ``-1`` means "none".

``docs/protocol.md`` describes every message: who sends it, its fields, its
errors and the design it comes from.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

__all__ = [
    "NO_OFFSET",
    "AddPartitionsRequest",
    "AddPartitionsResponse",
    "BrokerInfo",
    "CreateGroupRequest",
    "CreateGroupResponse",
    "CreateTopicRequest",
    "CreateTopicResponse",
    "DeleteGroupRequest",
    "DeleteGroupResponse",
    "DescribeGroupRequest",
    "DescribeGroupResponse",
    "Frame",
    "Goodbye",
    "GroupDescription",
    "GroupSummary",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "JoinGroupRequest",
    "JoinGroupResponse",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "MemberDescription",
    "MetadataRequest",
    "MetadataResponse",
    "OffsetCommitRequest",
    "OffsetCommitResponse",
    "OffsetFetchRequest",
    "OffsetFetchResponse",
    "PartitionOffset",
    "Request",
    "RequestBody",
    "Response",
    "ResponseBody",
    "StartFetchersRequest",
    "StartFetchersResponse",
    "StopFetchersRequest",
    "StopFetchersResponse",
    "TopicInfo",
    "TopicPartition",
]

NO_OFFSET = -1
"""The offset value that means "no committed offset"."""


class TopicPartition(NamedTuple):
    """One partition of one topic; hashable, and a 2-array on the wire."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class _Wire(msgspec.Struct, frozen=True, array_like=True, omit_defaults=False):
    """Base of every wire struct (frozen, array-encoded)."""


class PartitionOffset(_Wire):
    """An offset for one partition, with the committer's optional metadata."""

    topic: str
    partition: int
    offset: int
    metadata: str = ""

    @property
    def tp(self) -> TopicPartition:
        """The partition this offset belongs to."""
        return TopicPartition(self.topic, self.partition)


class BrokerInfo(_Wire):
    """A live broker and the address clients reach it at."""

    broker_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        """``host:port``, the form bootstrap lists use."""
        return f"{self.host}:{self.port}"


class TopicInfo(_Wire):
    """A topic and its partition count."""

    name: str
    partitions: int


class GroupSummary(_Wire):
    """One line of ListGroups."""

    group_id: str
    state: str
    generation: int
    members: int


class MemberDescription(_Wire):
    """A member as DescribeGroup shows it."""

    member_id: str
    client_id: str
    host: str
    topics: list[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    partitions: list[TopicPartition]


class GroupDescription(_Wire):
    """A group's state, members, assignment and committed offsets."""

    group_id: str
    state: str
    generation: int
    assignor: str
    members: list[MemberDescription]
    offsets: list[PartitionOffset]


# --- requests a client sends to a broker -------------------------------------


class MetadataRequest(_Wire, tag=1):
    """Ask for live brokers, topics (None: all) and, if ``group`` is set, its coordinator."""

    topics: list[str] | None = None
    group: str = ""


class CreateTopicRequest(_Wire, tag=2):
    """Create a topic with ``partitions`` partitions."""

    name: str
    partitions: int


class AddPartitionsRequest(_Wire, tag=3):
    """Grow a topic to ``total`` partitions (never shrinks)."""

    topic: str
    total: int


class JoinGroupRequest(_Wire, tag=4):
    """Join a group; an empty ``member_id`` asks the coordinator to assign one.

    ``assignors`` lists the member's preferred assignors, most preferred first;
    ``offset_reset`` is "earliest", "latest" or "none" and applies where the
    group has no committed offset.
    """

    group: str
    member_id: str
    topics: list[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    assignors: list[str]
    auto_commit: bool = True
    offset_reset: str = "latest"
    client_id: str = ""


class HeartbeatRequest(_Wire, tag=5):
    """Prove liveness; with auto-commit it carries the member's positions."""

    group: str
    member_id: str
    generation: int
    positions: list[PartitionOffset] = []


class LeaveGroupRequest(_Wire, tag=6):
    """Leave a group after stopping fetchers; final positions are committed."""

    group: str
    member_id: str
    positions: list[PartitionOffset] = []
    reason: str = ""


class OffsetCommitRequest(_Wire, tag=7):
    """Commit offsets for partitions the member owns in ``generation``.

    A standalone committer (not a member) sends ``member_id=""`` and
    ``generation=-1``; it is accepted only while the group has no members.
    A commit that moves an offset backwards needs ``allow_regression=True``.
    """

    group: str
    member_id: str
    generation: int
    offsets: list[PartitionOffset]
    allow_regression: bool = False


class OffsetFetchRequest(_Wire, tag=8):
    """Read a group's committed offsets (``partitions=None``: all of them)."""

    group: str
    partitions: list[TopicPartition] | None = None


class ListGroupsRequest(_Wire, tag=9):
    """List the groups this broker coordinates."""


class DescribeGroupRequest(_Wire, tag=10):
    """Describe one group: state, generation, members, assignment, offsets."""

    group: str


class CreateGroupRequest(_Wire, tag=11):
    """Create an empty group (joining creates one too).

    Like any group, it is removed once it has stayed empty, with no committed
    offsets, for the broker's group retention period.
    """

    group: str


class DeleteGroupRequest(_Wire, tag=12):
    """Delete an empty group and its committed offsets."""

    group: str


# --- requests the coordinator pushes to a member ------------------------------


class StopFetchersRequest(_Wire, tag=20):
    """Stop fetching every owned partition and hand back the positions."""

    group: str
    member_id: str
    generation: int


class StartFetchersRequest(_Wire, tag=21):
    """Own exactly these partitions from these offsets, as of ``generation``.

    Where the group has no committed offset the coordinator has applied the
    member's reset policy already; ``-1`` means it had none to apply (policy
    "none"), so the member has no position there.
    """

    group: str
    member_id: str
    generation: int
    partitions: list[PartitionOffset]
    brokers: list[BrokerInfo] = []


RequestBody = (
    MetadataRequest
    | CreateTopicRequest
    | AddPartitionsRequest
    | JoinGroupRequest
    | HeartbeatRequest
    | LeaveGroupRequest
    | OffsetCommitRequest
    | OffsetFetchRequest
    | ListGroupsRequest
    | DescribeGroupRequest
    | CreateGroupRequest
    | DeleteGroupRequest
    | StopFetchersRequest
    | StartFetchersRequest
)


# --- responses (a response's tag is its request's tag) -----------------------


class MetadataResponse(_Wire, tag=1):
    """Live brokers, the topics asked for, and the group's coordinator if asked."""

    brokers: list[BrokerInfo]
    topics: list[TopicInfo]
    coordinator: BrokerInfo | None = None


class CreateTopicResponse(_Wire, tag=2):
    """The topic as created."""

    topic: TopicInfo


class AddPartitionsResponse(_Wire, tag=3):
    """The topic with its new partition count."""

    topic: TopicInfo


class JoinGroupResponse(_Wire, tag=4):
    """The member id to use from now on; partitions follow by StartFetchers."""

    member_id: str
    generation: int
    session_timeout_ms: int


class HeartbeatResponse(_Wire, tag=5):
    """The heartbeat was accepted."""


class LeaveGroupResponse(_Wire, tag=6):
    """The member has left."""


class OffsetCommitResponse(_Wire, tag=7):
    """Every offset in the request is durable."""


class OffsetFetchResponse(_Wire, tag=8):
    """Committed offsets (partitions with none are omitted)."""

    offsets: list[PartitionOffset]


class ListGroupsResponse(_Wire, tag=9):
    """The groups this broker coordinates."""

    groups: list[GroupSummary]


class DescribeGroupResponse(_Wire, tag=10):
    """The group, described."""

    group: GroupDescription


class CreateGroupResponse(_Wire, tag=11):
    """The group exists (durably)."""


class DeleteGroupResponse(_Wire, tag=12):
    """The group and its offsets are gone."""


class StopFetchersResponse(_Wire, tag=20):
    """Fetchers stopped; the positions consumed (empty without auto-commit)."""

    positions: list[PartitionOffset] = []


class StartFetchersResponse(_Wire, tag=21):
    """Fetchers started for the assigned partitions."""


ResponseBody = (
    MetadataResponse
    | CreateTopicResponse
    | AddPartitionsResponse
    | JoinGroupResponse
    | HeartbeatResponse
    | LeaveGroupResponse
    | OffsetCommitResponse
    | OffsetFetchResponse
    | ListGroupsResponse
    | DescribeGroupResponse
    | CreateGroupResponse
    | DeleteGroupResponse
    | StopFetchersResponse
    | StartFetchersResponse
)


# --- the envelope -------------------------------------------------------------


class Request(_Wire, tag=1):
    """A request; the answer carries the same ``corr_id``."""

    corr_id: int
    body: RequestBody


class Response(_Wire, tag=2):
    """The answer to the request with ``corr_id``; ``body`` is None on error.

    ``error`` is an :class:`~.errors.ErrorCode` value, typed ``int`` so that a
    code only a newer peer knows still decodes (``error_for`` maps it to a
    plain ``CoordError``) instead of failing the whole frame as corrupt.
    """

    corr_id: int
    error: int
    message: str = ""
    body: ResponseBody | None = None


class Goodbye(_Wire, tag=3):
    """Sent before closing a connection over a protocol violation (``error`` as in Response)."""

    error: int
    message: str


Frame = Request | Response | Goodbye
