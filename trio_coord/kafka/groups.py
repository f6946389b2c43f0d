"""The consumer-group APIs: a Kafka classic group is a group of the broker's group engine.

Its one job is to translate. JoinGroup, SyncGroup, Heartbeat and LeaveGroup
become engine calls (join, heartbeat, leave); the engine's pushes to a
member (StopFetchers, ComputeAssignment, StartFetchers) become answers to
that member's pending Kafka requests, through one :class:`KafkaMemberLink`
per member (the engine's :class:`~trio_coord.broker.group.MemberLink`):

* StopFetchers: a member already waiting in JoinGroup has stopped (Kafka
  clients revoke before they join again): acknowledged at once. Otherwise
  the member is told to rejoin (Heartbeat and a pending SyncGroup answer
  REBALANCE_IN_PROGRESS) and the stop is acknowledged when its JoinGroup
  comes.
* ComputeAssignment (to the leader: the group's assignor is one of the
  Kafka members' protocols, named ``kafka:NAME``, which only the Kafka
  leader computes): every pending JoinGroup of the group is answered (the
  leader's with every member's metadata for the protocol, generation the
  one the engine's plan creates); a member not waiting in JoinGroup is told
  to rejoin and answered when it does. The leader's SyncGroup carries the
  assignment: decoded to partitions it is the engine's answer, and each
  member's bytes are kept for its SyncGroup.
* StartFetchers: answers the member's SyncGroup with those bytes (the
  engine starts a member in stages when some of its partitions are fenced:
  SyncGroup is answered at the stage listing the whole assignment).

OffsetCommit/OffsetFetch are the engine's commits and committed offsets;
ListGroups, DescribeGroups, DeleteGroups and OffsetDelete the coordinator's
views and deletions. ``docs/kafka.md`` ("Consumer groups") has the mapping
and where it differs from Apache Kafka.
"""

from __future__ import annotations

import datetime
import io
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import trio
from kio.schema.consumer_protocol_assignment.v0.data import (
    ConsumerProtocolAssignment as _AssignmentV0,
)
from kio.schema.consumer_protocol_assignment.v0.data import TopicPartition as _AssignedV0
from kio.schema.consumer_protocol_assignment.v1.data import (
    ConsumerProtocolAssignment as _AssignmentV1,
)
from kio.schema.consumer_protocol_assignment.v2.data import (
    ConsumerProtocolAssignment as _AssignmentV2,
)
from kio.schema.consumer_protocol_assignment.v3.data import (
    ConsumerProtocolAssignment as _AssignmentV3,
)
from kio.schema.consumer_protocol_subscription.v0.data import (
    ConsumerProtocolSubscription as _SubscriptionV0,
)
from kio.schema.consumer_protocol_subscription.v1.data import (
    ConsumerProtocolSubscription as _SubscriptionV1,
)
from kio.schema.consumer_protocol_subscription.v2.data import (
    ConsumerProtocolSubscription as _SubscriptionV2,
)
from kio.schema.consumer_protocol_subscription.v3.data import (
    ConsumerProtocolSubscription as _SubscriptionV3,
)
from kio.serial import entity_reader, entity_writer

from ..core.assignors import KAFKA_ASSIGNOR_PREFIX
from ..core.group import MAX_NAME_LENGTH, GroupState
from ..protocol.errors import (
    AuthorizationError,
    ConnectionClosedError,
    CoordError,
    ErrorCode,
    InvalidRequestError,
)
from ..protocol.messages import (
    ComputeAssignmentRequest,
    ComputeAssignmentResponse,
    DeleteOffsetsRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    MemberAssignment,
    OffsetCommitRequest,
    PartitionOffset,
    RequestBody,
    ResponseBody,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
    TopicPartition,
)
from ..security.acl import ANONYMOUS
from ._links import ConnectionWatch, LinkBase
from .codec import KafkaCode, make, ms, nested, response_schema
from .dispatch import Api, FrontEnd, RequestContext
from .errors import KafkaError, kafka_code

__all__ = ["APIS", "KafkaGroups", "KafkaMemberLink", "decode_assignment", "decode_subscription"]

log = logging.getLogger(__name__)

_NO_THROTTLE: Final = datetime.timedelta(0)
PROTOCOL_TYPE: Final = "consumer"
"""The only protocol type a Kafka group may have here (Kafka's consumer protocol)."""

_SUBSCRIPTIONS: Final = (_SubscriptionV0, _SubscriptionV1, _SubscriptionV2, _SubscriptionV3)
_ASSIGNMENTS: Final = (_AssignmentV0, _AssignmentV1, _AssignmentV2, _AssignmentV3)

_STATES: Final = {
    GroupState.EMPTY: "Empty",
    GroupState.STOPPING: "PreparingRebalance",
    GroupState.ASSIGNING: "CompletingRebalance",
    GroupState.STARTING: "CompletingRebalance",
    GroupState.STABLE: "Stable",
    GroupState.DEAD: "Dead",
}
"""The engine's states as Kafka names a classic group's."""

_CODES: Final[dict[int, KafkaCode]] = {
    ErrorCode.UNKNOWN_MEMBER_ID: KafkaCode.unknown_member_id,
    ErrorCode.ILLEGAL_GENERATION: KafkaCode.illegal_generation,
    ErrorCode.REBALANCE_IN_PROGRESS: KafkaCode.rebalance_in_progress,
    ErrorCode.INVALID_SESSION_TIMEOUT: KafkaCode.invalid_session_timeout,
    ErrorCode.INVALID_REBALANCE_TIMEOUT: KafkaCode.invalid_session_timeout,
    ErrorCode.INVALID_GROUP_ID: KafkaCode.invalid_group_id,
    ErrorCode.GROUP_ID_NOT_FOUND: KafkaCode.group_id_not_found,
    ErrorCode.NON_EMPTY_GROUP: KafkaCode.non_empty_group,
    ErrorCode.INCONSISTENT_ASSIGNOR: KafkaCode.inconsistent_group_protocol,
    ErrorCode.PARTITION_NOT_OWNED: KafkaCode.illegal_generation,
    ErrorCode.GROUP_MAX_SIZE_REACHED: KafkaCode.group_max_size_reached,
    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC: KafkaCode.group_subscribed_to_topic,
    ErrorCode.OFFSET_METADATA_TOO_LARGE: KafkaCode.offset_metadata_too_large,
    ErrorCode.FENCED_INSTANCE_ID: KafkaCode.fenced_instance_id,
    ErrorCode.MEMBER_ID_IN_USE: KafkaCode.fenced_instance_id,
    ErrorCode.INVALID_REQUEST: KafkaCode.invalid_request,
    ErrorCode.AUTHORIZATION_FAILED: KafkaCode.group_authorization_failed,
    ErrorCode.UNKNOWN_TOPIC: KafkaCode.unknown_topic_or_partition,
    ErrorCode.INVALID_PARTITIONS: KafkaCode.unknown_topic_or_partition,
    ErrorCode.OFFSET_REGRESSION: KafkaCode.invalid_request,
    ErrorCode.REQUEST_TIMED_OUT: KafkaCode.rebalance_in_progress,
}


def _consumer_groups() -> Any:
    """The KIP-848 module (imported late: it imports this one's neighbours)."""
    from . import consumer_groups

    return consumer_groups


def _denied(ctx: RequestContext, group_id: str, member_id: str = "", op: str = "read") -> bool:
    """True if the principal may not do ``op`` on the group, or act as ``member_id``.

    A member id is bound to the principal that joined with it: another may
    not join, sync, heartbeat, commit or leave with it (docs/security.md).
    """
    if ctx.front.authorizer is None:
        return False
    if not ctx.allowed(op, "group", group_id):
        return True
    if member_id:
        link: Any = ctx.front.state(KafkaGroups).links.get((group_id, member_id))
        if link is None:  # (a KIP-848 member's commit)
            link = ctx.front.state(_consumer_groups().ConsumerGroups).links.get(
                (group_id, member_id)
            )
        if link is not None and link.principal != ctx.principal:
            log.warning(
                "%s (%s) tried to act as member %s of group %s, which %s joined",
                ctx.principal,
                ctx.peer,
                member_id,
                group_id,
                link.principal,
            )
            return True
        try:
            ctx.front.service.coordinator.check_owner(group_id, member_id, ctx.principal)
        except CoordError:
            return True
    return False


def _code(exc: BaseException) -> KafkaCode:
    """Kafka's code for a group API failure (the group codes first, then the common ones)."""
    if isinstance(exc, CoordError) and exc.code in _CODES:
        return _CODES[exc.code]
    return kafka_code(exc)


# -- the consumer protocol's embedded messages ------------------------------------------------


def _decode(data: bytes, family: tuple[type[Any], ...], what: str) -> Any:
    """One of Kafka's versioned embedded messages (2-byte version, then the struct)."""
    if len(data) < 2:
        raise ValueError(f"{what} of {len(data)} bytes is shorter than its version")
    version = int.from_bytes(data[:2], "big", signed=True)
    if version < 0:
        raise ValueError(f"{what} has version {version}")
    # A newer version only appends fields: read it as the newest known (as Kafka does).
    schema = family[min(version, len(family) - 1)]
    try:
        value, _ = entity_reader(schema)(data, 2)
    except Exception as exc:  # kio raises assorted errors for bad bytes
        raise ValueError(f"cannot decode {what} v{version}: {exc!r}") from None
    return value


def decode_subscription(data: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (ValueError if malformed)."""
    value = _decode(data, _SUBSCRIPTIONS, "consumer subscription")
    topics = list(value.topics)
    if not all(isinstance(t, str) and t for t in topics):
        raise ValueError("consumer subscription names an empty or null topic")
    return topics


def decode_assignment(data: bytes) -> list[TopicPartition]:
    """The partitions of a ConsumerProtocolAssignment (ValueError if malformed; b"": none)."""
    if not data:
        return []
    value = _decode(data, _ASSIGNMENTS, "consumer assignment")
    out: list[TopicPartition] = []
    for entry in value.assigned_partitions:
        if not isinstance(entry.topic, str):
            raise ValueError("consumer assignment names a null topic")
        out.extend(TopicPartition(entry.topic, int(p)) for p in entry.partitions)
    return out


def encode_assignment(partitions: Iterable[TopicPartition]) -> bytes:
    """A ConsumerProtocolAssignment v0 of ``partitions`` (no user data)."""
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    value = _AssignmentV0(
        assigned_partitions=tuple(
            _AssignedV0(topic=t, partitions=tuple(ps))  # type: ignore[arg-type]
            for t, ps in by_topic.items()
        ),
        user_data=None,
    )
    out = io.BytesIO()
    out.write(b"\0\0")
    entity_writer(_AssignmentV0)(out, value)
    return out.getvalue()


def encode_subscription(topics: Iterable[str]) -> bytes:
    """A ConsumerProtocolSubscription v0 of ``topics`` (for members of other front ends)."""
    out = io.BytesIO()
    out.write(b"\0\0")
    entity_writer(_SubscriptionV0)(out, _SubscriptionV0(topics=tuple(sorted(topics))))
    return out.getvalue()


def _metadata(user_data: bytes) -> dict[str, bytes]:
    """The member's protocols' metadata, as the Kafka front end stored it in ``user_data``."""
    try:
        value = msgspec.msgpack.decode(user_data, type=dict[str, bytes])
    except msgspec.DecodeError:
        return {}
    return value


# -- the links ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _JoinAnswer:
    """What a member's JoinGroup is answered with, once the engine computes a generation."""

    generation: int
    protocol: str
    leader: str
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    """The leader's: (member id, instance id, metadata) of every member."""


@dataclass(slots=True)
class _LeaderRound:
    """The engine waits for the leader's SyncGroup: the assignment of ``generation``."""

    generation: int
    members: list[str]
    done: trio.Event = field(default_factory=trio.Event)
    assignments: dict[str, bytes] = field(default_factory=dict)


class KafkaMemberLink(LinkBase):
    """One Kafka member as the group engine reaches it (see the module docstring)."""

    def __init__(self, groups: KafkaGroups, group_id: str, instance_id: str) -> None:
        super().__init__(groups, group_id)
        self._groups: KafkaGroups = groups
        self.member_id = ""
        self.instance_id = instance_id
        self.principal = ANONYMOUS
        """The principal that joined as this member (only it may act as the member)."""
        self.rebalancing = False
        """The engine began a rebalance: the member must join again (Heartbeat says so)."""
        self.generation = -1
        """The engine generation the member was last started in."""
        self.protocol = ""
        """The protocol (assignor) the member was last given."""
        self.join_pending = False
        self.join_ready = trio.Event()
        self.join_answer: _JoinAnswer | None = None
        self.answer_waiting = False
        """``join_answer`` is for a JoinGroup still to come (the member was told to rejoin)."""
        self.stop_waiter: trio.Event | None = None
        self.sync_ready = trio.Event()
        self.sync_answer: tuple[int, bytes] | None = None
        self.sync_sent = trio.Event()
        self.assignment: tuple[int, bytes, frozenset[TopicPartition]] | None = None
        """The leader's assignment of this member: (generation, bytes, partitions)."""
        self.leader_round: _LeaderRound | None = None
        self._start_parts: list[PartitionOffset] = []

    def __repr__(self) -> str:
        return f"<KafkaMemberLink {self.group_id}/{self.member_id}>"

    @property
    def engine_member_id(self) -> str:
        """The engine's id of the member: the one the Kafka client uses too."""
        return self.member_id

    def _wake(self) -> None:
        """Wake every engine push and every request waiting on the member (it is gone)."""
        for event in (self.stop_waiter, self.sync_sent, self.join_ready, self.sync_ready):
            if event is not None:
                event.set()
        if self.leader_round is not None:
            self.leader_round.done.set()

    # -- what the JoinGroup, SyncGroup and Heartbeat handlers do ---------------------------

    def joining(self) -> None:
        """A JoinGroup arrived: the member stopped; it waits for its answer (or has it)."""
        self.join_pending = True
        self.join_ready = trio.Event()
        if self.answer_waiting:
            # The engine reached its assign phase while the member was elsewhere: the
            # answer is ready (the leader's round waits for this member's SyncGroup).
            self.answer_waiting = False
            self.join_ready.set()
        else:
            self.join_answer = None
        self.rebalancing = False
        if self.stop_waiter is not None:
            self.stop_waiter.set()
        self._fail_sync()

    def give_join_answer(self, answer: _JoinAnswer) -> None:
        """The engine reached its assign phase: answer the JoinGroup (now, or when it comes)."""
        self.join_answer = answer
        self.protocol = answer.protocol
        self.sync_answer = None
        if self.join_pending:
            self.join_ready.set()
        else:
            self.rebalancing = True  # (it is in SyncGroup or stable: it must join again)
            self.answer_waiting = True
            self._fail_sync()

    def _fail_sync(self) -> None:
        self.sync_answer = None
        self.sync_ready.set()  # a pending SyncGroup sees no answer: REBALANCE_IN_PROGRESS
        self.sync_ready = trio.Event()

    # -- what the engine pushes (MemberLink.request) ---------------------------------------

    async def request(self, body: RequestBody) -> ResponseBody | None:
        """The engine's push, answered once the Kafka member did what it means."""
        if self.closed:
            raise ConnectionClosedError(f"Kafka member {self.member_id} is gone")
        if isinstance(body, StopFetchersRequest):
            return await self._stop()
        if isinstance(body, ComputeAssignmentRequest):
            return await self._compute(body)
        if isinstance(body, StartFetchersRequest):
            return await self._start(body)
        raise InvalidRequestError(f"a Kafka member cannot answer {type(body).__name__}")

    async def _stop(self) -> StopFetchersResponse:
        if not self.join_pending:
            self.rebalancing = True
            self.answer_waiting = False  # (a new round: the next assign phase answers)
            self._fail_sync()
            self.stop_waiter = event = trio.Event()
            try:
                await event.wait()
            finally:
                if self.stop_waiter is event:
                    self.stop_waiter = None
            if self.closed:
                raise ConnectionClosedError(f"Kafka member {self.member_id} is gone")
        return StopFetchersResponse([])

    async def _compute(self, body: ComputeAssignmentRequest) -> ComputeAssignmentResponse:
        protocol = body.assignor.removeprefix(KAFKA_ASSIGNOR_PREFIX)
        generation = body.generation + 1  # (the generation the engine's plan makes)
        groups = self._groups
        members = []
        for m in body.members:
            link = groups.links.get((self.group_id, m.member_id))
            metadata = _metadata(m.user_data).get(protocol, b"")
            members.append((m.member_id, (link.instance_id or None) if link else None, metadata))
        groups.leaders[self.group_id] = self.member_id
        round = self.leader_round = _LeaderRound(generation, [m.member_id for m in body.members])
        try:
            for m in body.members:
                link = groups.links.get((self.group_id, m.member_id))
                if link is None:
                    continue
                link.give_join_answer(
                    _JoinAnswer(
                        generation,
                        protocol,
                        self.member_id,
                        tuple(members) if link is self else (),
                    )
                )
            await round.done.wait()
        finally:
            if self.leader_round is round:
                self.leader_round = None
        if self.closed:
            raise ConnectionClosedError(f"Kafka member {self.member_id} is gone")
        given = []
        for member_id in round.members:
            data = round.assignments.get(member_id, b"")
            try:
                partitions = decode_assignment(data)
            except ValueError as exc:
                raise InvalidRequestError(
                    f"the Kafka leader's assignment of member {member_id}: {exc}"
                ) from None
            link = groups.links.get((self.group_id, member_id))
            if link is not None:
                link.assignment = (
                    generation,
                    data or encode_assignment(()),
                    frozenset(partitions),
                )
            given.append(MemberAssignment(member_id, partitions))
        return ComputeAssignmentResponse(given)

    async def _start(self, body: StartFetchersRequest) -> StartFetchersResponse:
        if body.more:
            self._start_parts.extend(body.partitions)
            return StartFetchersResponse()
        parts, self._start_parts = self._start_parts + list(body.partitions), []
        tps = frozenset(p.tp for p in parts)
        generation = body.generation
        mine = self.assignment
        if mine is not None and mine[0] == generation:
            if not mine[2] <= tps:
                return StartFetchersResponse()  # an early stage: SyncGroup waits for the last
            data = mine[1]
        else:
            # Started without a Kafka leader's assignment (a static member resumed
            # without a rebalance): the partitions, encoded.
            data = encode_assignment(tps)
        if self.join_pending and (
            self.join_answer is None or self.join_answer.generation != generation
        ):
            # A static member came back and resumes its partitions: its JoinGroup is
            # answered with the current generation, as a follower.
            leader = self._groups.leaders.get(self.group_id, self.member_id)
            self.give_join_answer(
                _JoinAnswer(generation, self.protocol or self._first_protocol(), leader)
            )
        self.sync_sent = sent = trio.Event()
        self.sync_answer = (generation, data)
        self.sync_ready.set()
        await sent.wait()
        if self.closed:
            raise ConnectionClosedError(f"Kafka member {self.member_id} is gone")
        self.generation = generation
        return StartFetchersResponse()

    def _first_protocol(self) -> str:
        runner = self._groups.front.service.coordinator.runner(self.group_id)
        member = runner.group.members.get(self.member_id) if runner is not None else None
        if member is None or not member.assignors:
            return ""
        return member.assignors[0].removeprefix(KAFKA_ASSIGNOR_PREFIX)


class KafkaGroups:
    """The Kafka members of the broker's groups: their links, by group and member id."""

    def __init__(self, front: FrontEnd) -> None:
        self.front = front
        self.links: dict[tuple[str, str], KafkaMemberLink] = {}
        self.by_instance: dict[tuple[str, str], KafkaMemberLink] = {}
        self.leaders: dict[str, str] = {}
        self.conns: ConnectionWatch[KafkaMemberLink] = ConnectionWatch()
        """Which links live on which connection (one close callback per connection)."""

    def register(self, link: KafkaMemberLink, member_id: str) -> None:
        """``link`` is the member ``member_id`` (the engine admitted it)."""
        if link.member_id and link.member_id != member_id:
            self.links.pop((link.group_id, link.member_id), None)
        link.member_id = member_id
        self.links[(link.group_id, member_id)] = link
        if link.instance_id:
            self.by_instance[(link.group_id, link.instance_id)] = link

    def drop(self, link: KafkaMemberLink) -> None:
        """Forget ``link`` (the member left, or its connection ended)."""
        link.detach()
        if self.links.get((link.group_id, link.member_id)) is link:
            del self.links[(link.group_id, link.member_id)]
        if link.instance_id and self.by_instance.get((link.group_id, link.instance_id)) is link:
            del self.by_instance[(link.group_id, link.instance_id)]


# -- JoinGroup -------------------------------------------------------------------------------


async def _keep_alive(ctx: RequestContext, link: KafkaMemberLink) -> None:
    """A member waiting in JoinGroup or SyncGroup is alive: renew its session meanwhile."""
    coordinator = ctx.front.service.coordinator
    while not link.closed:  # (a static member's session must run out once it is gone)
        runner = coordinator.runner(link.group_id)
        member = runner.group.members.get(link.member_id) if runner is not None else None
        if member is None:
            return
        try:
            coordinator.heartbeat(
                HeartbeatRequest(link.group_id, link.member_id, member.generation)
            )
        except CoordError:
            return
        await trio.sleep(max(member.session_timeout / 3, 0.05))


async def _wait(
    ctx: RequestContext, link: KafkaMemberLink, event: trio.Event, limit: float
) -> bool:
    """Wait for ``event`` (True), keeping the member alive; False after ``limit`` seconds."""
    with trio.move_on_after(limit):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep_alive, ctx, link)
            await event.wait()
            nursery.cancel_scope.cancel()
        return True
    return False


async def _join_group(ctx: RequestContext, body: Any) -> Any:
    v = ctx.version
    schema = response_schema(11, v)
    member_cls = nested(schema, "JoinGroupResponseMember")
    groups = ctx.front.state(KafkaGroups)
    coordinator = ctx.front.service.coordinator
    group_id = body.group_id

    def answer(code: KafkaCode, member_id: str = "", answer: _JoinAnswer | None = None) -> Any:
        return make(
            schema,
            throttle_time=_NO_THROTTLE,
            error_code=code,
            generation_id=-1 if answer is None else answer.generation,
            protocol_type=PROTOCOL_TYPE,
            protocol_name=(None if v >= 7 else "") if answer is None else answer.protocol,
            leader="" if answer is None else answer.leader,
            skip_assignment=False,
            member_id=member_id,
            members=()
            if answer is None
            else tuple(
                make(member_cls, member_id=m, group_instance_id=i, metadata=d)
                for m, i, d in answer.members
            ),
        )

    member_id = body.member_id
    if _denied(ctx, group_id, member_id):
        return answer(KafkaCode.group_authorization_failed, member_id)
    instance_id = (getattr(body, "group_instance_id", None) or "") if v >= 5 else ""
    if body.protocol_type != PROTOCOL_TYPE or not body.protocols:
        return answer(KafkaCode.inconsistent_group_protocol, member_id)
    if ctx.front.state(_consumer_groups().ConsumerGroups).is_consumer_group(group_id):
        # As Kafka without its mixed-group upgrade path: one protocol per group.
        log.info("JoinGroup of group %s refused: it is a KIP-848 consumer group", group_id)
        return answer(KafkaCode.inconsistent_group_protocol, member_id)
    try:
        topics = decode_subscription(body.protocols[0].metadata)
    except ValueError as exc:
        log.info("JoinGroup of group %s from %s refused: %s", group_id, ctx.peer, exc)
        return answer(KafkaCode.inconsistent_group_protocol, member_id)
    names: list[str] = []
    metadata: dict[str, bytes] = {}
    for protocol in body.protocols:
        if protocol.name not in metadata:
            names.append(protocol.name)
            metadata[protocol.name] = bytes(protocol.metadata)
    assignors = [KAFKA_ASSIGNOR_PREFIX + n for n in names]
    session_ms = ms(body.session_timeout)
    rebalance_ms = ms(body.rebalance_timeout) if v >= 1 else session_ms
    request = JoinGroupRequest(
        group_id,
        member_id,
        topics,
        session_ms,
        rebalance_ms,
        assignors,
        auto_commit=False,
        offset_reset="latest",
        client_id=(ctx.client_id or "")[:MAX_NAME_LENGTH],
        rebalance_protocol="eager",
        instance_id=instance_id,
        user_data=msgspec.msgpack.encode(metadata),
        client_assignors=assignors,
        max_frame_size=LinkBase.max_frame_size,  # (pushes are answers of its own size)
    )
    try:
        if not member_id and not instance_id:
            # KIP-394: a new member is given an id to join again with.
            probe = KafkaMemberLink(groups, group_id, "")
            probe.principal = ctx.principal
            first = await coordinator.join(request, probe)
            if v >= 4:
                return answer(KafkaCode.member_id_required, first.member_id)
            member_id = first.member_id
            request = msgspec.structs.replace(request, member_id=member_id)
        link = groups.links.get((group_id, member_id)) if member_id else None
        if link is None and instance_id:
            link = groups.by_instance.get((group_id, instance_id))
            if link is not None and link.principal != ctx.principal and ctx.front.authorizer:
                return answer(KafkaCode.group_authorization_failed, member_id)
        runner = coordinator.runner(group_id)
        member = runner.group.members.get(member_id) if runner and member_id else None
        same = (
            link is not None
            and member is not None
            and runner is not None
            and link.member_id == member_id
            and member.topics == frozenset(topics)
            and member.assignors == tuple(assignors)
            and member.user_data == request.user_data
            and member.session_timeout == session_ms / 1000
            and member.rebalance_timeout == rebalance_ms / 1000
        )
        state = runner.group.state if runner is not None else None
        if same and link is not None and runner is not None and member is not None:
            # A member joining again as it was (Kafka clients do, e.g. after a timeout of
            # their own): the engine need not hear of it (a join would restart a rebalance).
            link.bind(ctx.conn, ctx.peer)
            current = link.join_answer
            if link.stop_waiter is not None or link.rebalancing:
                link.joining()  # (asked to join again: acknowledges the stop)
            elif state in (GroupState.ASSIGNING, GroupState.STARTING) and current is not None:
                # The assignment of this round is being made: the same answer again.
                return answer(KafkaCode.none, member_id, current)
            elif state is GroupState.STOPPING:
                link.joining()
            elif (
                state is GroupState.STABLE
                and groups.leaders.get(group_id) != member_id
                and link.generation == runner.group.generation
            ):
                # As Kafka does: a follower of a stable group gets the current generation
                # and, in SyncGroup, its current assignment.
                generation = runner.group.generation
                mine = link.assignment
                data = (
                    mine[1]
                    if mine is not None and mine[0] == generation
                    else encode_assignment(member.assignment)
                )
                link.join_answer = _JoinAnswer(
                    generation,
                    link.protocol or names[0],
                    groups.leaders.get(group_id, member_id),
                )
                link.sync_answer = (generation, data)
                return answer(KafkaCode.none, member_id, link.join_answer)
            else:
                same = False
        if not same or link is None:
            if link is None:
                link = KafkaMemberLink(groups, group_id, instance_id)
                link.principal = ctx.principal
            # (the engine sees the link's old connection first: a static member's
            # former process, still connected, fences this one)
            was_pending = link.join_pending
            link.join_pending = True  # a StopFetchers pushed meanwhile is acknowledged
            try:
                joined = await coordinator.join(request, link)
            except BaseException:
                link.join_pending = was_pending
                raise
            groups.register(link, joined.member_id)
            link.bind(ctx.conn, ctx.peer)
            link.joining()
            if link.generation < 0:
                link.generation = joined.generation
        timeout = rebalance_ms / 1000
        if not await _wait(ctx, link, link.join_ready, timeout) or link.join_answer is None:
            link.join_pending = False
            if link.closed:
                return answer(KafkaCode.unknown_member_id, link.member_id)
            return answer(KafkaCode.rebalance_in_progress, link.member_id)
        link.join_pending = False
        return answer(KafkaCode.none, link.member_id, link.join_answer)
    except CoordError as exc:
        log.debug("JoinGroup of group %s from %s: %s", group_id, ctx.peer, exc)
        return answer(_code(exc), member_id)


# -- SyncGroup -------------------------------------------------------------------------------


async def _sync_group(ctx: RequestContext, body: Any) -> Any:
    v = ctx.version
    schema = response_schema(14, v)
    groups = ctx.front.state(KafkaGroups)

    def answer(code: KafkaCode, data: bytes = b"", protocol: str | None = None) -> Any:
        return make(
            schema,
            throttle_time=_NO_THROTTLE,
            error_code=code,
            protocol_type=PROTOCOL_TYPE if protocol is not None else None,
            protocol_name=protocol,
            assignment=data,
        )

    if _denied(ctx, body.group_id, body.member_id):
        return answer(KafkaCode.group_authorization_failed)
    link = groups.links.get((body.group_id, body.member_id))
    if link is None:
        try:  # (NOT_COORDINATOR where another broker coordinates the group)
            ctx.front.service.coordinator.fetch_offsets(body.group_id, [])
        except CoordError as exc:
            return answer(_code(exc))
        return answer(KafkaCode.unknown_member_id)
    joined = link.join_answer
    if link.rebalancing or joined is None:
        return answer(KafkaCode.rebalance_in_progress)
    if body.generation_id != joined.generation:
        return answer(KafkaCode.illegal_generation)
    link.bind(ctx.conn, ctx.peer)
    round = link.leader_round
    if round is not None and round.generation == body.generation_id and body.assignments:
        if not round.done.is_set():
            for entry in body.assignments:
                round.assignments[entry.member_id] = bytes(entry.assignment)
            round.done.set()
    runner = ctx.front.service.coordinator.runner(body.group_id)
    member = runner.group.members.get(link.member_id) if runner is not None else None
    timeout = member.rebalance_timeout if member is not None else 60.0
    while True:
        ready = link.sync_ready
        found = link.sync_answer
        if found is not None and found[0] == joined.generation:
            link.sync_sent.set()
            link.rebalancing = False
            return answer(KafkaCode.none, found[1], joined.protocol)
        if link.rebalancing or link.closed or link.join_answer is not joined:
            return answer(KafkaCode.rebalance_in_progress)
        if not await _wait(ctx, link, ready, timeout):
            return answer(KafkaCode.rebalance_in_progress)


# -- Heartbeat --------------------------------------------------------------------------------


def _heartbeat_now(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(12, ctx.version)
    groups = ctx.front.state(KafkaGroups)
    coordinator = ctx.front.service.coordinator
    code = KafkaCode.none
    try:
        if _denied(ctx, body.group_id, body.member_id):
            raise KafkaError(KafkaCode.group_authorization_failed, "not authorized")
        link = groups.links.get((body.group_id, body.member_id))
        runner = coordinator.runner(body.group_id)
        if link is None or runner is None:
            if runner is None:
                coordinator.heartbeat(HeartbeatRequest(body.group_id, body.member_id, -1))
            raise KafkaError(KafkaCode.unknown_member_id, "not a member")
        member = runner.group.members.get(body.member_id)
        if member is None:
            groups.drop(link)  # (expelled: it joins again with no member id)
            raise KafkaError(KafkaCode.unknown_member_id, "not a member")
        link.bind(ctx.conn, ctx.peer)
        if link.rebalancing:
            raise KafkaError(KafkaCode.rebalance_in_progress, "join again")
        kafka_generation = (
            link.join_answer.generation if link.join_answer is not None else link.generation
        )
        if body.generation_id != kafka_generation:
            raise KafkaError(KafkaCode.illegal_generation, "stale generation")
        generation = link.generation if link.generation >= member.generation else member.generation
        coordinator.heartbeat(HeartbeatRequest(body.group_id, body.member_id, generation))
    except (KafkaError, CoordError) as exc:
        code = _code(exc)
        if code is KafkaCode.group_id_not_found:
            code = KafkaCode.unknown_member_id
    return make(schema, throttle_time=_NO_THROTTLE, error_code=code)


async def _heartbeat(ctx: RequestContext, body: Any) -> Any:
    return _heartbeat_now(ctx, body)


# -- LeaveGroup ------------------------------------------------------------------------------


async def _leave_group(ctx: RequestContext, body: Any) -> Any:
    v = ctx.version
    schema = response_schema(13, v)
    groups = ctx.front.state(KafkaGroups)
    coordinator = ctx.front.service.coordinator
    if v >= 3:
        leaving = [
            (m.member_id, m.group_instance_id, getattr(m, "reason", None)) for m in body.members
        ]
    else:
        leaving = [(body.member_id, None, None)]
    results = []
    top = KafkaCode.none
    for member_id, instance_id, reason in leaving:
        code = KafkaCode.none
        if _denied(ctx, body.group_id, member_id):
            results.append((member_id, instance_id, KafkaCode.group_authorization_failed))
            if v < 3:
                top = KafkaCode.group_authorization_failed
            continue
        link = groups.links.get((body.group_id, member_id)) if member_id else None
        if link is None and instance_id:
            link = groups.by_instance.get((body.group_id, instance_id))
            if link is not None and member_id and link.member_id != member_id:
                code = KafkaCode.fenced_instance_id
        if link is not None and not member_id:
            member_id = link.member_id
        if code is KafkaCode.none:
            try:
                await coordinator.leave(
                    LeaveGroupRequest(body.group_id, member_id, reason=reason or "")
                )
            except CoordError as exc:
                code = _code(exc)
            if link is not None:
                groups.drop(link)
        results.append((member_id, instance_id, code))
        if v < 3:
            top = code
    member_cls = nested(schema, "MemberResponse") if v >= 3 else None
    return make(
        schema,
        throttle_time=_NO_THROTTLE,
        error_code=top,
        members=()
        if member_cls is None
        else tuple(
            make(member_cls, member_id=m, group_instance_id=i, error_code=c) for m, i, c in results
        ),
    )


# -- OffsetCommit / OffsetFetch --------------------------------------------------------------


async def _offset_commit(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(8, ctx.version)
    topic_cls = nested(schema, "OffsetCommitResponseTopic")
    part_cls = nested(schema, "OffsetCommitResponsePartition")
    generation: int = getattr(
        body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1)
    )
    offsets = [
        PartitionOffset(t.name, p.partition_index, p.committed_offset, p.committed_metadata or "")
        for t in body.topics
        for p in t.partitions
    ]
    code = KafkaCode.none
    member_id = body.member_id
    identity = None
    if _denied(ctx, body.group_id, body.member_id):
        code = KafkaCode.group_authorization_failed
    elif any(not ctx.allowed("read", "topic", t) for t in {o.topic for o in offsets}):
        code = KafkaCode.topic_authorization_failed
    elif offsets:
        try:
            if any(o.offset < 0 for o in offsets):
                raise KafkaError(KafkaCode.invalid_commit_offset_size, "negative offset")
            # A KIP-848 member commits with its member epoch: checked as Kafka does, then
            # the engine's own fencing with the engine's id and generation.
            identity = _consumer_groups().commit_identity(
                ctx.front, body.group_id, member_id, generation, [o.tp for o in offsets]
            )
            if identity is not None:
                member_id, generation = identity
            # Kafka lets a consumer commit any offset, backwards too (a seek).
            await ctx.front.service.coordinator.commit(
                OffsetCommitRequest(
                    body.group_id, member_id, generation, offsets, allow_regression=True
                )
            )
        except (KafkaError, CoordError) as exc:
            code = _code(exc)
            if identity is not None and code in (
                KafkaCode.illegal_generation,
                KafkaCode.rebalance_in_progress,
            ):
                code = KafkaCode.stale_member_epoch  # (what a KIP-848 client retries on)
    return make(
        schema,
        throttle_time=_NO_THROTTLE,
        topics=tuple(
            make(
                topic_cls,
                name=t.name,
                partitions=tuple(
                    make(part_cls, partition_index=p.partition_index, error_code=code)
                    for p in t.partitions
                ),
            )
            for t in body.topics
        ),
    )


def _fetch_group(
    ctx: RequestContext,
    group_id: str,
    topics: Iterable[Any] | None,
    indexes: Callable[[Any], Iterable[int]],
    topic_cls: type[Any],
    part_cls: type[Any],
) -> tuple[KafkaCode, tuple[Any, ...]]:
    coordinator = ctx.front.service.coordinator
    if _denied(ctx, group_id, op="describe"):
        return KafkaCode.group_authorization_failed, ()
    try:
        wanted = (
            None
            if topics is None
            else [TopicPartition(t.name, int(p)) for t in topics for p in indexes(t)]
        )
        found = coordinator.fetch_offsets(group_id, wanted)
    except CoordError as exc:
        return _code(exc), ()
    committed = {o.tp: o for o in found}
    order = wanted if wanted is not None else sorted(committed)
    by_topic: dict[str, list[Any]] = {}
    for tp in order:
        o = committed.get(tp)
        by_topic.setdefault(tp.topic, []).append(
            make(
                part_cls,
                partition_index=tp.partition,
                committed_offset=-1 if o is None else o.offset,
                committed_leader_epoch=-1,
                metadata="" if o is None else o.metadata,
                error_code=KafkaCode.none,
            )
        )
    return KafkaCode.none, tuple(
        make(topic_cls, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()
    )


async def _offset_fetch(ctx: RequestContext, body: Any) -> Any:
    return _offset_fetch_now(ctx, body)


def _offset_fetch_now(ctx: RequestContext, body: Any) -> Any:
    v = ctx.version
    schema = response_schema(9, v)
    if v >= 8:
        group_cls = nested(schema, "OffsetFetchResponseGroup")
        topic_cls = nested(schema, "OffsetFetchResponseTopics")
        part_cls = nested(schema, "OffsetFetchResponsePartitions")
        out = []
        for g in body.groups:
            if v >= 9:
                try:
                    _consumer_groups().fetch_check(
                        ctx.front, g.group_id, g.member_id, g.member_epoch
                    )
                except KafkaError as exc:
                    out.append(make(group_cls, group_id=g.group_id, topics=(), error_code=exc.code))
                    continue
            code, topics = _fetch_group(
                ctx, g.group_id, g.topics, lambda t: t.partition_indexes, topic_cls, part_cls
            )
            out.append(make(group_cls, group_id=g.group_id, topics=topics, error_code=code))
        return make(schema, throttle_time=_NO_THROTTLE, groups=tuple(out))
    topic_cls = nested(schema, "OffsetFetchResponseTopic")
    part_cls = nested(schema, "OffsetFetchResponsePartition")
    code, topics = _fetch_group(
        ctx, body.group_id, body.topics, lambda t: t.partition_indexes, topic_cls, part_cls
    )
    return make(schema, throttle_time=_NO_THROTTLE, topics=topics, error_code=code)


# -- ListGroups / DescribeGroups / DeleteGroups / OffsetDelete -------------------------------


def _list_groups_now(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(16, ctx.version)
    listed_cls = nested(schema, "ListedGroup")
    states = set(getattr(body, "states_filter", ()) or ())
    types = set(getattr(body, "types_filter", ()) or ())
    out = []
    wanted = {t.lower() for t in types}
    consumer = _consumer_groups()
    kip848 = ctx.front.state(consumer.ConsumerGroups)
    for g in ctx.front.service.coordinator.list_groups():
        kind = "consumer" if kip848.is_consumer_group(g.group_id) else "classic"
        if wanted and kind not in wanted:
            continue
        state = _STATES.get(GroupState(g.state), g.state)
        if kind == "consumer":
            state = consumer.STATE_NAMES.get(GroupState(g.state), state)
        if states and state not in states:
            continue
        if not ctx.allowed("describe", "group", g.group_id):
            continue
        out.append(
            make(
                listed_cls,
                group_id=g.group_id,
                protocol_type=PROTOCOL_TYPE,
                group_state=state,
                group_type=kind,
            )
        )
    return make(schema, throttle_time=_NO_THROTTLE, error_code=KafkaCode.none, groups=tuple(out))


async def _list_groups(ctx: RequestContext, body: Any) -> Any:
    return _list_groups_now(ctx, body)


def _describe_groups_now(ctx: RequestContext, body: Any) -> Any:
    v = ctx.version
    schema = response_schema(15, v)
    group_cls = nested(schema, "DescribedGroup")
    member_cls = nested(schema, "DescribedGroupMember")
    groups = ctx.front.state(KafkaGroups)
    coordinator = ctx.front.service.coordinator
    out = []
    for group_id in body.groups:
        try:
            if _denied(ctx, group_id, op="describe"):
                raise AuthorizationError(f"{ctx.principal} may not DESCRIBE group {group_id!r}")
            d = coordinator.describe_group(group_id)
        except CoordError as exc:
            code = _code(exc)
            if code is KafkaCode.group_id_not_found and v < 6:
                code = KafkaCode.none  # (Kafka before v6: an unknown group is Dead)
            out.append(
                make(
                    group_cls,
                    error_code=code,
                    error_message=str(exc),
                    group_id=group_id,
                    group_state="Dead",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                    authorized_operations=-(2**31),
                )
            )
            continue
        protocol = d.assignor.removeprefix(KAFKA_ASSIGNOR_PREFIX)
        members = []
        for m in d.members:
            link = groups.links.get((group_id, m.member_id))
            metadata = b""
            assignment = b""
            if link is not None:
                runner = coordinator.runner(group_id)
                member = runner.group.members.get(m.member_id) if runner else None
                if member is not None:
                    metadata = _metadata(member.user_data).get(protocol, b"")
                if link.assignment is not None and link.assignment[0] == d.generation:
                    assignment = link.assignment[1]
            metadata = metadata or encode_subscription(m.topics)
            assignment = assignment or encode_assignment(m.partitions)
            members.append(
                make(
                    member_cls,
                    member_id=m.member_id,
                    group_instance_id=m.instance_id or None,
                    client_id=m.client_id,
                    client_host=m.host,
                    member_metadata=metadata,
                    member_assignment=assignment,
                )
            )
        state = _STATES.get(GroupState(d.state), d.state)
        out.append(
            make(
                group_cls,
                error_code=KafkaCode.none,
                error_message=None,
                group_id=group_id,
                group_state=state,
                protocol_type=PROTOCOL_TYPE,
                protocol_data=protocol if state == "Stable" else "",
                members=tuple(members),
                authorized_operations=-(2**31),
            )
        )
    return make(schema, throttle_time=_NO_THROTTLE, groups=tuple(out))


async def _describe_groups(ctx: RequestContext, body: Any) -> Any:
    return _describe_groups_now(ctx, body)


async def _delete_groups(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(42, ctx.version)
    result_cls = nested(schema, "DeletableGroupResult")
    coordinator = ctx.front.service.coordinator
    groups = ctx.front.state(KafkaGroups)
    results = []
    for group_id in body.groups_names:
        code = KafkaCode.none
        try:
            if _denied(ctx, group_id, op="delete"):
                raise AuthorizationError(f"{ctx.principal} may not DELETE group {group_id!r}")
            await coordinator.delete_group(group_id)
            groups.leaders.pop(group_id, None)
        except CoordError as exc:
            code = _code(exc)
        results.append(make(result_cls, group_id=group_id, error_code=code))
    return make(schema, throttle_time=_NO_THROTTLE, results=tuple(results))


async def _offset_delete(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(47, ctx.version)
    topic_cls = nested(schema, "OffsetDeleteResponseTopic")
    part_cls = nested(schema, "OffsetDeleteResponsePartition")
    coordinator = ctx.front.service.coordinator
    top = KafkaCode.none
    codes: dict[TopicPartition, KafkaCode] = {}
    partitions = [
        TopicPartition(t.name, p.partition_index) for t in body.topics for p in t.partitions
    ]
    try:
        if _denied(ctx, body.group_id, op="delete"):
            raise AuthorizationError(f"{ctx.principal} may not DELETE group {body.group_id!r}")
        coordinator.describe_group(body.group_id)  # (GROUP_ID_NOT_FOUND, NOT_COORDINATOR)
        runner = coordinator.runner(body.group_id)
        consumed: set[str] = set()
        if runner is not None:
            for m in runner.group.members.values():
                consumed |= m.topics
        free = [tp for tp in partitions if tp.topic not in consumed]
        for tp in partitions:
            if tp.topic in consumed:
                codes[tp] = KafkaCode.group_subscribed_to_topic
        if free:
            await coordinator.delete_offsets(DeleteOffsetsRequest(body.group_id, free))
    except CoordError as exc:
        top = _code(exc)
    return make(
        schema,
        error_code=top,
        throttle_time=_NO_THROTTLE,
        topics=()
        if top is not KafkaCode.none
        else tuple(
            make(
                topic_cls,
                name=t.name,
                partitions=tuple(
                    make(
                        part_cls,
                        partition_index=p.partition_index,
                        error_code=codes.get(
                            TopicPartition(t.name, p.partition_index), KafkaCode.none
                        ),
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        ),
    )


APIS: Final = [
    Api(11, 0, 9, _join_group, authorizes=True),
    Api(14, 0, 5, _sync_group, authorizes=True),
    Api(12, 0, 4, _heartbeat, now=_heartbeat_now, authorizes=True),
    Api(13, 0, 5, _leave_group, authorizes=True),
    Api(8, 2, 9, _offset_commit, authorizes=True),
    Api(9, 1, 9, _offset_fetch, now=_offset_fetch_now, authorizes=True),
    Api(16, 0, 5, _list_groups, now=_list_groups_now, authorizes=True),
    Api(15, 0, 5, _describe_groups, now=_describe_groups_now, authorizes=True),
    Api(42, 0, 2, _delete_groups, authorizes=True),
    Api(47, 0, 0, _offset_delete, authorizes=True),
]
