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
    "DEFAULT_FRAME",
    "EARLIEST",
    "FETCH_ENVELOPE_BYTES",
    "FETCH_PARTITION_BYTES",
    "LATEST",
    "MAX_DESCRIBED_OWNED",
    "NO_OFFSET",
    "AddPartitionsRequest",
    "AddPartitionsResponse",
    "BrokerInfo",
    "ComputeAssignmentRequest",
    "ComputeAssignmentResponse",
    "CreateGroupRequest",
    "CreateGroupResponse",
    "CreateTopicRequest",
    "CreateTopicResponse",
    "DeleteGroupRequest",
    "DeleteGroupResponse",
    "DeleteOffsetsRequest",
    "DeleteOffsetsResponse",
    "DeleteTopicRequest",
    "DeleteTopicResponse",
    "DescribeGroupRequest",
    "DescribeGroupResponse",
    "FetchPartition",
    "FetchRequest",
    "FetchResponse",
    "FetchedBatch",
    "FetchedPartition",
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
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListedOffset",
    "MemberAssignment",
    "MemberCursor",
    "MemberDescription",
    "MemberSubscription",
    "MetadataRequest",
    "MetadataResponse",
    "OffsetCommitRequest",
    "OffsetCommitResponse",
    "OffsetFetchRequest",
    "OffsetFetchResponse",
    "PartitionOffset",
    "ProduceRequest",
    "ProduceResponse",
    "Request",
    "RequestBody",
    "ResetOffsetsRequest",
    "ResetOffsetsResponse",
    "Response",
    "ResponseBody",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "SecurityAdminRequest",
    "SecurityAdminResponse",
    "StartFetchersRequest",
    "StartFetchersResponse",
    "StopFetchersRequest",
    "StopFetchersResponse",
    "TopicInfo",
    "TopicPartition",
    "fetch_partition_bytes",
]

NO_OFFSET = -1
"""The offset value that means "no committed offset"."""

LATEST = -1
"""ListOffsets ``timestamp_ms``: the log end offset (the next record's offset)."""

EARLIEST = -2
"""ListOffsets ``timestamp_ms``: the log start offset (the oldest record still held)."""


class TopicPartition(NamedTuple):
    """One partition of one topic; hashable, and a 2-array on the wire."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


DEFAULT_FRAME = 1024 * 1024
"""What a peer's frame is taken to be when it does not say (``framing.DEFAULT_MAX_FRAME_SIZE``,
which framing re-exports: framing imports this module, not the other way round)."""


class _Wire(msgspec.Struct, frozen=True, array_like=True, omit_defaults=False, gc=False):
    """Base of every wire struct (frozen, array-encoded).

    ``gc=False``: a wire struct holds only strings, numbers, bytes and
    lists of other wire structs, never a cycle, so the cyclic garbage
    collector need not track it (with thousands of members, decoded
    requests were much of what every collection walked).
    """


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
    """A live broker and the address clients reach it at.

    ``kafka_port`` is the port of its Kafka listener on the same host (0:
    it has none; see docs/kafka.md).
    """

    broker_id: int
    host: str
    port: int
    kafka_port: int = 0
    rack: str = ""
    """The rack (availability zone) it runs in ("": none; its ``--rack``)."""

    @property
    def address(self) -> str:
        """``host:port``, the form bootstrap lists use."""
        return f"{self.host}:{self.port}"


class TopicInfo(_Wire):
    """A topic and its partition count.

    ``leaders`` names, per partition, the broker holding it; empty means
    every partition is on the broker that answered.
    """

    name: str
    partitions: int
    leaders: list[int] = []
    topic_id: str = ""
    """The topic's id, 32 hex digits (Kafka clients see it as a UUID)."""
    configs: dict[str, str] = {}
    """Only if asked (``MetadataRequest.configs``): the settings the topic's log follows, by
    their Kafka names (retention.ms, segment.bytes, ...), as the answering broker has them."""


class GroupSummary(_Wire):
    """One line of ListGroups."""

    group_id: str
    state: str
    generation: int
    members: int


MAX_DESCRIBED_OWNED = 64
"""The most partitions of a member's current assignment a description lists (it keeps a
member's description within a page: see ``broker/paging.py``)."""


class MemberDescription(_Wire):
    """A member as DescribeGroup shows it."""

    member_id: str
    client_id: str
    host: str
    topics: list[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    partitions: list[TopicPartition]
    instance_id: str = ""
    """A static member's instance id (empty: dynamic)."""
    rebalance_protocol: str = "eager"
    generation: int = -1
    """The last generation the member acknowledged (-1: unknown)."""
    owned: list[TopicPartition] = []
    """While its current assignment (what it may still be fetching) differs from the
    target (``partitions``), as in a rebalance: the current one, its first
    :data:`MAX_DESCRIBED_OWNED` partitions (empty: the same as the target). Only on the
    member's first page of a paged description."""
    owned_more: int = 0
    """How many partitions of the current assignment ``owned`` leaves out."""
    member_epoch: int = -1
    """A Kafka consumer-protocol (KIP-848) member's epoch; -1 for other members."""


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
    """Ask for live brokers, topics (None: all) and, if ``group`` is set, its coordinator.

    All topics come a page at a time: those named after ``after``, as many
    as fit; the answer's ``next`` is where the next page starts ("": done).
    """

    topics: list[str] | None = None
    group: str = ""
    after: str = ""
    configs: bool = False
    """Also the settings each topic's log follows (``TopicInfo.configs``)."""


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
    rebalance_protocol: str = "eager"
    """"eager" (every rebalance stops all fetchers) or "cooperative" (only what moves)."""
    instance_id: str = ""
    """A static member's stable identity (empty: a dynamic member)."""
    user_data: bytes = b""
    """Opaque bytes for a leader-side assignor, passed to it with this member's subscription."""
    client_assignors: list[str] = []
    """The names in ``assignors`` that this member can compute itself, as the group's leader."""
    rack: str = ""
    """The rack (availability zone) the member runs in ("": none): rack-aware assignors
    prefer giving it partitions whose broker is in the same rack."""
    owned: list[TopicPartition] | None = None
    """What the member fetches as it rejoins with its id (None: not said). Only a member
    that still fetches exactly its assignment may be spared a rebalance (or, cooperative,
    told just the new generation); one that dropped partitions (its lease ran out) is
    started with its partitions again."""
    max_frame_size: int = DEFAULT_FRAME
    """The largest frame the member reads: the coordinator cuts what it pushes to the
    member (a long assignment) to fit it as well as its own."""


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
    stay: bool = False
    """A static member stepping out (it has stopped): keep it, and its partitions for
    its successor, until its session expires."""


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
    """Read a group's committed offsets (``partitions=None``: all of them), a page at a time:
    those after ``after``, in (topic, partition) order; the answer's ``next`` continues (a
    client asks again with the same ``partitions``)."""

    group: str
    partitions: list[TopicPartition] | None = None
    after: TopicPartition | None = None


class ListGroupsRequest(_Wire, tag=9):
    """List the groups this broker coordinates, a page at a time (those after ``after``)."""

    after: str = ""


class MemberCursor(_Wire):
    """Where a page of a group's members ends: after ``member_id``'s partition ``partition``.

    ``partition=None``: after the whole member. A member whose partitions do
    not fit one page is cut there, and the next page repeats the member with
    the partitions that follow.
    """

    member_id: str
    partition: TopicPartition | None = None


class DescribeGroupRequest(_Wire, tag=10):
    """Describe one group: state, generation, members, assignment, offsets.

    The description comes a page at a time, members first, then offsets.
    The first request sets no cursor. The answer's ``members_next`` (more
    members remain) is sent back as ``members_after``; its ``offsets_next``
    (every member given, more offsets remain) as ``offsets_after``, and that
    page lists no members. Pages are read from the live group, not a
    snapshot: a group that changes between pages is described partly before,
    partly after the change.
    """

    group: str
    offsets_after: TopicPartition | None = None
    members_after: MemberCursor | None = None


class CreateGroupRequest(_Wire, tag=11):
    """Create an empty group (joining creates one too).

    Like any group, it is removed once it has stayed empty, with no committed
    offsets, for the broker's group retention period.
    """

    group: str


class DeleteGroupRequest(_Wire, tag=12):
    """Delete an empty group and its committed offsets."""

    group: str


class DeleteTopicRequest(_Wire, tag=18):
    """Delete a topic: its records, and every group's committed offsets of it.

    Groups subscribed to it rebalance without it. A topic created again
    under the same name is a new, empty topic.
    """

    name: str


class ProduceRequest(_Wire, tag=13):
    """Append one record batch (``protocol.records`` encodes it) to a partition.

    ``count`` is the number of records in the batch and ``max_timestamp_ms``
    the newest record timestamp in it; the broker checks both against the
    batch before it stores it.
    """

    topic: str
    partition: int
    records: bytes
    count: int
    max_timestamp_ms: int


FETCH_ENVELOPE_BYTES = 64
"""At most what Response and FetchResponse take around a fetch answer's partitions (28
bytes). With :func:`fetch_partition_bytes`, the estimate a broker sizes a fetch answer's
headers by (it refuses a fetch whose partitions would take over a quarter of its frame),
and a client cuts its fetches by (a test checks both against the real encoder)."""

FETCH_PARTITION_BYTES = 64
"""At most what a FetchedPartition takes but its topic name, message and batches (52 bytes)."""


def fetch_partition_bytes(topic: str) -> int:
    """What a partition of ``topic`` adds to a fetch answer's headers, at most."""
    return FETCH_PARTITION_BYTES + len(topic.encode())


class FetchPartition(_Wire):
    """One partition of a fetch: read from ``offset``, at most ``max_bytes`` of batches."""

    topic: str
    partition: int
    offset: int
    max_bytes: int = 1024 * 1024


class FetchRequest(_Wire, tag=14):
    """Read record batches from several partitions (a long poll).

    The broker answers once it has ``min_bytes`` of batches for the
    partitions together, or after ``max_wait_ms`` with what it has.
    ``max_bytes`` bounds the answer as a whole (0: the broker's limit).
    """

    partitions: list[FetchPartition]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 0


class ListOffsetsRequest(_Wire, tag=15):
    """Find offsets: the earliest (``timestamp_ms=-2``), the latest (``-1``), or
    the first record at or after a time (``timestamp_ms >= 0``)."""

    partitions: list[TopicPartition]
    timestamp_ms: int = -1


class ResetOffsetsRequest(_Wire, tag=16):
    """Rewind (or move) a group's committed offsets, even while it runs.

    The coordinator stops the group's members (all of them: rebalancing is
    eager), records the offsets as explicit resets after the positions they
    hand back, and restarts their fetchers there.
    """

    group: str
    offsets: list[PartitionOffset]


class DeleteOffsetsRequest(_Wire, tag=17):
    """Forget a group's committed offsets for partitions no live member consumes."""

    group: str
    partitions: list[TopicPartition]


# --- requests the coordinator pushes to a member ------------------------------


class StopFetchersRequest(_Wire, tag=20):
    """Stop fetching and hand back the positions: of every owned partition, or of ``partitions``.

    ``partitions`` is None in an eager rebalance (stop everything); in a
    cooperative one it lists just the partitions that move away from this
    member, and the member keeps fetching the rest.
    """

    group: str
    member_id: str
    generation: int
    partitions: list[TopicPartition] | None = None


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
    incremental: bool = False
    """Cooperative: ``partitions`` is the whole assignment; keep fetching the ones already
    owned (their offsets are ignored) and start the others from their offsets."""
    more: bool = False
    """The assignment did not fit one frame: it continues in the next StartFetchers of this
    generation. Keep these partitions and start nothing until the part without ``more``."""
    unchanged: bool = False
    """Cooperative: the member's assignment is exactly what it fetches now; keep it all and
    take ``generation`` as the new one (``partitions`` is empty)."""
    leaders: list[int] = []
    """Per entry of ``partitions``, the id of the broker holding it; ``brokers`` gives their
    addresses, so the member fetches without asking Metadata first (empty: ask)."""


class MemberSubscription(_Wire):
    """One member as a leader-side assignor sees it."""

    member_id: str
    topics: list[str]
    owned: list[TopicPartition] = []
    user_data: bytes = b""


class ComputeAssignmentRequest(_Wire, tag=40):
    """Pushed to the group's leader: compute the assignment with ``assignor``.

    ``partitions`` maps every subscribed topic that exists to its partition
    count. The leader answers within its rebalance timeout or is expelled.
    """

    group: str
    member_id: str
    generation: int
    assignor: str
    members: list[MemberSubscription]
    partitions: dict[str, int]


class SaslHandshakeRequest(_Wire, tag=60):
    """The first message on a broker that authenticates: the SASL mechanism the client uses."""

    mechanism: str


class SaslAuthenticateRequest(_Wire, tag=61):
    """One SASL message from the client (SCRAM: client-first, then client-final)."""

    data: bytes


class SecurityAdminRequest(_Wire, tag=62):
    """A super user's change to users or ACLs, or a listing of them (``trio-coord users/acls``).

    ``action`` is add-user, delete-user, list-users, add-acl, remove-acl or
    list-acls. ``credentials`` is the JSON of the SCRAM credentials the client
    derived (the password itself never travels); ``acl`` the JSON of one ACL.
    """

    action: str
    user: str = ""
    credentials: bytes = b""
    acl: bytes = b""


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
    | DeleteTopicRequest
    | ProduceRequest
    | FetchRequest
    | ListOffsetsRequest
    | ResetOffsetsRequest
    | DeleteOffsetsRequest
    | StopFetchersRequest
    | StartFetchersRequest
    | ComputeAssignmentRequest
    | SaslHandshakeRequest
    | SaslAuthenticateRequest
    | SecurityAdminRequest
)


# --- responses (a response's tag is its request's tag) -----------------------


class MetadataResponse(_Wire, tag=1):
    """Live brokers, the topics asked for, and the group's coordinator if asked."""

    brokers: list[BrokerInfo]
    topics: list[TopicInfo]
    coordinator: BrokerInfo | None = None
    next: str = ""
    """All topics did not fit: ask again with ``after=next`` for the rest ("": complete)."""


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
    rejoin: bool = False
    """The member id was just assigned and the member is not admitted yet: join again with it."""
    max_frame_size: int = DEFAULT_FRAME
    """The largest frame the coordinator reads: the member cuts the lists it sends (its
    positions, its commits) to fit it as well as its own."""


class HeartbeatResponse(_Wire, tag=5):
    """The heartbeat was accepted."""


class LeaveGroupResponse(_Wire, tag=6):
    """The member has left."""


class OffsetCommitResponse(_Wire, tag=7):
    """Every offset in the request is durable."""


class OffsetFetchResponse(_Wire, tag=8):
    """Committed offsets (partitions with none are omitted)."""

    offsets: list[PartitionOffset]
    next: TopicPartition | None = None
    """More remain: ask again with ``after=next``."""


class ListGroupsResponse(_Wire, tag=9):
    """The groups this broker coordinates."""

    groups: list[GroupSummary]
    next: str = ""
    """More remain: ask again with ``after=next``."""


class DescribeGroupResponse(_Wire, tag=10):
    """The group, described."""

    group: GroupDescription
    offsets_next: TopicPartition | None = None
    """More offsets remain: ask again with ``offsets_after=offsets_next``."""
    members_next: MemberCursor | None = None
    """More members remain: ask again with ``members_after=members_next``."""


class CreateGroupResponse(_Wire, tag=11):
    """The group exists (durably)."""


class DeleteGroupResponse(_Wire, tag=12):
    """The group and its offsets are gone."""


class DeleteTopicResponse(_Wire, tag=18):
    """The topic is deleted (durably; its logs are removed in the background)."""


class ProduceResponse(_Wire, tag=13):
    """The batch is stored (durable as the broker's flush policy says) from ``base_offset``."""

    base_offset: int


class FetchedBatch(_Wire):
    """A stored batch: its records have offsets ``base_offset``, ``base_offset + 1``, ..."""

    base_offset: int
    count: int
    records: bytes


class FetchedPartition(_Wire):
    """One partition's part of a fetch answer; ``error`` is per partition.

    ``log_start`` and ``log_end`` are the partition's offsets when it was
    read (the consumer's lag is ``log_end`` minus its position). The first
    batch may begin before the offset asked for.
    """

    topic: str
    partition: int
    error: int
    message: str
    log_start: int
    log_end: int
    batches: list[FetchedBatch] = []


class FetchResponse(_Wire, tag=14):
    """Batches per partition, in the order asked."""

    partitions: list[FetchedPartition]


class ListedOffset(_Wire):
    """The offset found for one partition, with its log start and end offsets."""

    topic: str
    partition: int
    offset: int
    log_start: int
    log_end: int

    @property
    def tp(self) -> TopicPartition:
        """The partition this offset belongs to."""
        return TopicPartition(self.topic, self.partition)


class ListOffsetsResponse(_Wire, tag=15):
    """One offset per partition asked for (by time: the log end if no record is that new)."""

    offsets: list[ListedOffset]


class ResetOffsetsResponse(_Wire, tag=16):
    """The new offsets are durable; owners restart from them."""


class DeleteOffsetsResponse(_Wire, tag=17):
    """The offsets are gone."""


class StopFetchersResponse(_Wire, tag=20):
    """Fetchers stopped; the positions consumed (empty without auto-commit)."""

    positions: list[PartitionOffset] = []


class StartFetchersResponse(_Wire, tag=21):
    """Fetchers started for the assigned partitions."""


class MemberAssignment(_Wire):
    """One member's partitions, as a leader computed them."""

    member_id: str
    partitions: list[TopicPartition]


class ComputeAssignmentResponse(_Wire, tag=40):
    """The leader's assignment: every member's partitions."""

    assignment: list[MemberAssignment]


class SaslHandshakeResponse(_Wire, tag=60):
    """The mechanism is accepted; ``mechanisms`` lists every one the broker offers."""

    mechanisms: list[str]


class SaslAuthenticateResponse(_Wire, tag=61):
    """The server's next SASL message (SCRAM: server-first, then server-final)."""

    data: bytes


class SecurityAdminResponse(_Wire, tag=62):
    """The result: ``data`` is JSON (users and their mechanisms, or ACLs), ``count`` changed."""

    data: bytes = b""
    count: int = 0


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
    | DeleteTopicResponse
    | ProduceResponse
    | FetchResponse
    | ListOffsetsResponse
    | ResetOffsetsResponse
    | DeleteOffsetsResponse
    | StopFetchersResponse
    | StartFetchersResponse
    | ComputeAssignmentResponse
    | SaslHandshakeResponse
    | SaslAuthenticateResponse
    | SecurityAdminResponse
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
