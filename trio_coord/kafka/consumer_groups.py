"""Kafka's consumer protocol (KIP-848): a ``group.protocol=consumer`` group is an engine group.

Its one job is to translate ConsumerGroupHeartbeat (key 68) and
ConsumerGroupDescribe (key 69) into the group engine's calls, through one
:class:`ConsumerMemberLink` per member (the engine's
:class:`~trio_coord.broker.group.MemberLink`). KIP-848 moved assignment to
the broker and made rebalances incremental, which is how the engine works
already: a heartbeat with member epoch 0 is a join (with the broker's
session timeout, the member's rebalance timeout, the server assignor it
names, ``uniform`` by default, and cooperative rebalancing), -1 a leave, -2
a static member stepping out; any other heartbeat renews the session. The
engine's pushes become what the next heartbeat answer says:

* StopFetchers (a cooperative revocation): the partitions leave the
  member's assignment at once, and the stop is acknowledged when a
  heartbeat sent after the member received that assignment reports owned
  partitions without them (as Kafka's ``CurrentAssignmentBuilder`` waits
  for the revocation): the engine starts them elsewhere only then.
* StartFetchers: the assignment (the engine's whole assignment of the
  member) and the member epoch (the engine generation + 1) the next
  heartbeat answer carries; acknowledged at once (what the member may not
  own yet is never handed to anyone else before the member gives it back).

Partitions travel as topic ids (:func:`~.metadata.topic_id`). A group is
either classic or consumer, never both (Kafka 4's mixed-group upgrade path
is not implemented): a ConsumerGroupHeartbeat joining a group that has
classic (or native) members gets GROUP_ID_NOT_FOUND, a JoinGroup into a
consumer group INCONSISTENT_GROUP_PROTOCOL, as Kafka answers them.
``docs/kafka.md`` ("Consumer protocol (KIP-848)") has the details.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import re2
import trio

from ..core.group import MAX_NAME_LENGTH, GroupState
from ..core.validation import PATTERN_PREFIX
from ..protocol.errors import (
    ConnectionClosedError,
    CoordError,
    ErrorCode,
    InvalidRequestError,
)
from ..protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
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
from .metadata import TopicIds, topic_id

__all__ = [
    "APIS",
    "SERVER_ASSIGNORS",
    "STATE_NAMES",
    "ConsumerGroups",
    "ConsumerMemberLink",
    "commit_identity",
    "describe_members",
    "fetch_check",
]

log = logging.getLogger(__name__)

_NO_THROTTLE: Final = datetime.timedelta(0)
MAX_REGEX_LENGTH: Final = 1000
"""The longest ``subscribed_topic_regex`` (the engine's bound on ``re:`` patterns)."""
SERVER_ASSIGNORS: Final = ("uniform", "range")
"""The server assignors a KIP-848 member may name (``uniform`` when it names none)."""

_CODES: Final[dict[int, KafkaCode]] = {
    ErrorCode.UNKNOWN_MEMBER_ID: KafkaCode.unknown_member_id,
    ErrorCode.INVALID_SESSION_TIMEOUT: KafkaCode.invalid_request,
    ErrorCode.INVALID_REBALANCE_TIMEOUT: KafkaCode.invalid_request,
    ErrorCode.INVALID_GROUP_ID: KafkaCode.invalid_group_id,
    ErrorCode.GROUP_ID_NOT_FOUND: KafkaCode.unknown_member_id,
    ErrorCode.GROUP_MAX_SIZE_REACHED: KafkaCode.group_max_size_reached,
    ErrorCode.INCONSISTENT_ASSIGNOR: KafkaCode.unsupported_assignor,
    ErrorCode.FENCED_INSTANCE_ID: KafkaCode.unreleased_instance_id,
    ErrorCode.MEMBER_ID_IN_USE: KafkaCode.unreleased_instance_id,
    ErrorCode.INVALID_REQUEST: KafkaCode.invalid_request,
    ErrorCode.INVALID_TOPIC: KafkaCode.invalid_request,
    ErrorCode.ILLEGAL_GENERATION: KafkaCode.fenced_member_epoch,
    ErrorCode.REBALANCE_IN_PROGRESS: KafkaCode.stale_member_epoch,
    ErrorCode.PARTITION_NOT_OWNED: KafkaCode.stale_member_epoch,
}

STATE_NAMES: Final = {
    GroupState.EMPTY: "empty",
    GroupState.STOPPING: "reconciling",
    GroupState.ASSIGNING: "assigning",
    GroupState.STARTING: "reconciling",
    GroupState.STABLE: "stable",
    GroupState.DEAD: "dead",
}
"""The engine's states as Kafka names a consumer group's."""


def _code(exc: BaseException) -> KafkaCode:
    if isinstance(exc, CoordError) and exc.code in _CODES:
        return _CODES[exc.code]
    return kafka_code(exc)


@dataclass(slots=True)
class _Stop:
    """A revocation the engine waits for: ``partitions`` must leave what the member owns."""

    partitions: frozenset[TopicPartition]
    done: trio.Event = field(default_factory=trio.Event)
    delivered: bool = False
    """A heartbeat answer without ``partitions`` reached the member: its next report counts."""


class ConsumerMemberLink(LinkBase):
    """One KIP-848 member as the group engine reaches it (see the module docstring)."""

    def __init__(self, groups: ConsumerGroups, group_id: str, member_id: str) -> None:
        super().__init__(groups, group_id)
        self._groups: ConsumerGroups = groups
        self.member_id = member_id
        """The member id the client chose (Kafka's); the engine's is :attr:`engine_id`."""
        self.engine_id = ""
        self.instance_id = ""
        self.rack_id = ""
        self.topics: tuple[str, ...] = ()
        self.regex: str | None = None
        self.assignor = SERVER_ASSIGNORS[0]
        self.rebalance_ms = 0
        self.epoch = 0
        """The member epoch: the engine generation the member was last started in, + 1."""
        self.told_epochs: tuple[int, int] = (0, 0)
        """The epochs of the last two heartbeat answers (a heartbeat may carry either)."""
        self.assigned: frozenset[TopicPartition] = frozenset()
        """The member's assignment as the engine last gave it (minus what it revokes)."""
        self.version = 0
        self.told_version = -1
        self.told: frozenset[TopicPartition] = frozenset()
        """The assignment the last answer that carried one gave the member."""
        self.owned: frozenset[TopicPartition] = frozenset()
        """What the member last reported owning."""
        self.stopping: _Stop | None = None
        self._start_parts: list[TopicPartition] = []
        self.principal = ANONYMOUS
        """The principal that joined as this member: only it may act as the member (the
        engine reads it from here too, as from any member link)."""

    def __repr__(self) -> str:
        return f"<ConsumerMemberLink {self.group_id}/{self.member_id}>"

    @property
    def member_epoch(self) -> int:
        """The member epoch (what ``GroupRunner.describe`` shows for the member)."""
        return self.epoch

    @property
    def engine_member_id(self) -> str:
        """The engine's id of the member (not the one the client chose)."""
        return self.engine_id

    def _wake(self) -> None:
        if self.stopping is not None:
            self.stopping.done.set()

    # -- what the heartbeat handler does ------------------------------------------------

    def reported(self, owned: frozenset[TopicPartition] | None) -> None:
        """A heartbeat arrived, with the partitions the member owns (None: unchanged)."""
        if owned is not None:
            self.owned = owned
        stop = self.stopping
        if stop is not None and stop.delivered and not (self.owned & stop.partitions):
            stop.done.set()

    def answer_assignment(self, full: bool) -> frozenset[TopicPartition] | None:
        """The assignment this heartbeat answer carries (None: unchanged since the last)."""
        if not full and self.told_version == self.version:
            return None
        self.told_version = self.version
        self.told = self.assigned
        if self.stopping is not None and not (self.assigned & self.stopping.partitions):
            self.stopping.delivered = True
        return self.assigned

    def tell_epoch(self) -> int:
        """The epoch this answer carries (remembered: the next heartbeat may carry it)."""
        if self.told_epochs[0] != self.epoch:
            self.told_epochs = (self.epoch, self.told_epochs[0])
        return self.epoch

    # -- what the engine pushes ------------------------------------------------------------

    async def request(self, body: RequestBody) -> ResponseBody | None:
        """The engine's push, answered once the member did what it means."""
        if self.closed:
            raise ConnectionClosedError(f"Kafka member {self.member_id} is gone")
        if isinstance(body, StopFetchersRequest):
            return await self._stop(body)
        if isinstance(body, StartFetchersRequest):
            return self._start(body)
        raise InvalidRequestError(f"a KIP-848 member cannot answer {type(body).__name__}")

    async def _stop(self, body: StopFetchersRequest) -> StopFetchersResponse:
        revoked = self.assigned if body.partitions is None else frozenset(body.partitions)
        removed = revoked & self.assigned
        if removed:
            self.assigned -= removed
            self.version += 1
        if not revoked & (self.owned | self.told):
            return StopFetchersResponse([])  # never told of them, never reported them
        self.stopping = stop = _Stop(revoked)
        acknowledged = False
        try:
            await stop.done.wait()
            acknowledged = True
        finally:
            if self.stopping is stop:
                self.stopping = None
            if not acknowledged and removed:
                # The rebalance was cancelled before the member gave them up: the engine
                # still counts them as the member's (the next plan may leave them there,
                # "unchanged"), so they are its again, whatever it did with them meanwhile.
                self.assigned |= removed
                self.version += 1
        if self.closed:
            raise ConnectionClosedError(f"Kafka member {self.member_id} is gone")
        return StopFetchersResponse([])

    def _start(self, body: StartFetchersRequest) -> StartFetchersResponse:
        self._start_parts.extend(p.tp for p in body.partitions)
        if body.more:
            return StartFetchersResponse()
        parts, self._start_parts = frozenset(self._start_parts), []
        new = self.assigned if body.unchanged else parts
        if new != self.assigned:
            self.assigned = new
            self.version += 1
        self.epoch = max(self.epoch, body.generation + 1)
        return StartFetchersResponse()


class ConsumerGroups:
    """The KIP-848 members of the broker's groups, by (group, member id) and by engine id."""

    def __init__(self, front: FrontEnd) -> None:
        self.front = front
        self.links: dict[tuple[str, str], ConsumerMemberLink] = {}
        self.by_engine: dict[tuple[str, str], ConsumerMemberLink] = {}
        self.by_group: dict[str, set[str]] = {}
        """group → the engine ids of its KIP-848 members (for O(1) protocol checks)."""
        self.by_instance: dict[tuple[str, str], ConsumerMemberLink] = {}
        self.conns: ConnectionWatch[ConsumerMemberLink] = ConnectionWatch()
        """Which links live on which connection (one close callback per connection)."""

    def register(self, link: ConsumerMemberLink, engine_id: str) -> None:
        """``link`` is the engine's member ``engine_id``."""
        if link.engine_id and link.engine_id != engine_id:
            self.by_engine.pop((link.group_id, link.engine_id), None)
        link.engine_id = engine_id
        self.links[(link.group_id, link.member_id)] = link
        self.by_engine[(link.group_id, engine_id)] = link
        self.by_group.setdefault(link.group_id, set()).add(engine_id)
        if link.instance_id:
            self.by_instance[(link.group_id, link.instance_id)] = link

    def drop(self, link: ConsumerMemberLink) -> None:
        """Forget ``link`` (the member left, was fenced, or its connection ended)."""
        link.detach()
        for table, key in (
            (self.links, (link.group_id, link.member_id)),
            (self.by_engine, (link.group_id, link.engine_id)),
            (self.by_instance, (link.group_id, link.instance_id)),
        ):
            if table.get(key) is link:
                del table[key]
        if (link.group_id, link.engine_id) not in self.by_engine:
            ids = self.by_group.get(link.group_id)
            if ids is not None:
                ids.discard(link.engine_id)
                if not ids:
                    del self.by_group[link.group_id]

    def step_out(self, link: ConsumerMemberLink) -> None:
        """A static member stepped out (epoch -2): its process is gone, but the engine keeps
        the member (and its partitions) for a successor with its instance id, who takes
        ``link``'s place in :attr:`by_engine` and :attr:`by_instance` when it joins."""
        link.detach()
        if self.links.get((link.group_id, link.member_id)) is link:
            del self.links[(link.group_id, link.member_id)]

    def is_consumer_group(self, group_id: str) -> bool:
        """True if the group has KIP-848 members (a classic JoinGroup is refused then)."""
        runner = self.front.service.coordinator.runner(group_id)
        if runner is None:
            return False
        ids = self.by_group.get(group_id)
        if not ids:
            return False
        members = runner.group.members
        for engine_id in list(ids):
            if engine_id in members:
                return True
            # (removed by the engine: a static member whose session ended) forget it
            link = self.by_engine.pop((group_id, engine_id), None)
            ids.discard(engine_id)
            if link is not None and link.instance_id:
                if self.by_instance.get((group_id, link.instance_id)) is link:
                    del self.by_instance[(group_id, link.instance_id)]
        if not ids:
            del self.by_group[group_id]
        return False

    def partitions(self, entries: Any) -> frozenset[TopicPartition] | None:
        """The partitions of a heartbeat's topic_partitions (None stays None)."""
        if entries is None:
            return None
        out: set[TopicPartition] = set()
        ids = self.front.state(TopicIds)
        for entry in entries:
            name = ids.name(entry.topic_id)
            if name is not None:
                out.update(TopicPartition(name, int(p)) for p in entry.partitions)
        return frozenset(out)


def _topic_partitions(
    front: FrontEnd, cls: type[Any], partitions: frozenset[TopicPartition]
) -> tuple[Any, ...]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return tuple(
        make(cls, topic_id=topic_id(front.service.topics, t), topic_name=t, partitions=tuple(ps))
        for t, ps in by_topic.items()
    )


# -- ConsumerGroupHeartbeat ------------------------------------------------------------------


def _answerer(ctx: RequestContext) -> Any:
    """The function that makes this request's ConsumerGroupHeartbeat answer."""
    schema = response_schema(68, ctx.version)
    assignment_cls = nested(schema, "Assignment")
    tp_cls = nested(schema, "TopicPartitions")
    interval = datetime.timedelta(seconds=ctx.front.limits.consumer_heartbeat_interval)

    def answer(
        code: KafkaCode,
        message: str | None = None,
        link: ConsumerMemberLink | None = None,
        epoch: int | None = None,
        member_id: str | None = None,
        full: bool = False,
    ) -> Any:
        given = None
        if link is not None and code is KafkaCode.none and epoch is None:
            parts = link.answer_assignment(full)
            if parts is not None:
                given = make(
                    assignment_cls, topic_partitions=_topic_partitions(ctx.front, tp_cls, parts)
                )
            epoch = link.tell_epoch()
        return make(
            schema,
            throttle_time=_NO_THROTTLE,
            error_code=code,
            error_message=message,
            member_id=member_id if member_id is not None else (link.member_id if link else None),
            member_epoch=epoch if epoch is not None else (-1 if link is None else link.epoch),
            heartbeat_interval=interval if code is KafkaCode.none else datetime.timedelta(0),
            assignment=given,
        )

    return answer


def _refusal(ctx: RequestContext, body: Any, groups: ConsumerGroups) -> KafkaError | None:
    """Why the principal may not send this heartbeat (docs/security.md), or None.

    As Kafka: READ on the group, DESCRIBE on every topic named in the
    subscription (a regex is resolved over all topics: fetching still needs
    READ on each); and a member id acts only for the principal that joined
    with it.
    """
    if ctx.front.authorizer is None:
        return None
    if not ctx.allowed("read", "group", body.group_id):
        return KafkaError(
            KafkaCode.group_authorization_failed,
            f"{ctx.principal} may not READ group {body.group_id!r}",
        )
    denied = sorted(
        t for t in body.subscribed_topic_names or () if not ctx.allowed("describe", "topic", t)
    )
    if denied:
        return KafkaError(
            KafkaCode.topic_authorization_failed,
            f"{ctx.principal} may not DESCRIBE topic(s) {', '.join(denied)}",
        )
    link = groups.links.get((body.group_id, body.member_id))
    if link is not None and not link.dropped and link.principal != ctx.principal:
        log.warning(
            "%s (%s) tried to act as member %s of group %s, which %s joined",
            ctx.principal,
            ctx.peer,
            body.member_id,
            body.group_id,
            link.principal,
        )
        return KafkaError(
            KafkaCode.group_authorization_failed,
            f"{ctx.principal} may not act as member {body.member_id!r}, which "
            f"{link.principal} joined",
        )
    return None


def _heartbeat_now(ctx: RequestContext, body: Any) -> Any | None:
    """A plain heartbeat, answered at once (O(1) but for partitions that changed); None
    for a join, a leave or a change of subscription (the async handler)."""
    if body.member_epoch <= 0 or not body.group_id:
        return None
    groups = ctx.front.state(ConsumerGroups)
    refused = _refusal(ctx, body, groups)
    if refused is not None:
        return _answerer(ctx)(refused.code, str(refused), epoch=-1, member_id=body.member_id)
    link = groups.links.get((body.group_id, body.member_id))
    if link is not None and not link.dropped and _changed(link, body):
        return None
    return _beat(ctx, body, groups, link, _answerer(ctx))


async def _heartbeat(ctx: RequestContext, body: Any) -> Any:
    answer = _answerer(ctx)
    groups = ctx.front.state(ConsumerGroups)
    try:
        if not body.group_id:
            raise KafkaError(KafkaCode.invalid_group_id, "the group id is empty")
        refused = _refusal(ctx, body, groups)
        if refused is not None:
            raise refused
        epoch = body.member_epoch
        if epoch == 0:
            return await _join(ctx, body, groups, answer)
        link = groups.links.get((body.group_id, body.member_id))
        if epoch in (-1, -2):
            return await _leave(ctx, body, groups, link, answer)
        if (
            link is not None
            and not link.dropped
            and epoch in link.told_epochs
            and _changed(link, body)
        ):
            await _rejoin(ctx, body, groups, link)
    except KafkaError as exc:
        return answer(exc.code, str(exc), epoch=-1, member_id=body.member_id)
    except CoordError as exc:
        log.debug("ConsumerGroupHeartbeat of group %s from %s: %s", body.group_id, ctx.peer, exc)
        return answer(_code(exc), str(exc), epoch=-1, member_id=body.member_id)
    return _beat(ctx, body, groups, link, answer)


def _beat(
    ctx: RequestContext,
    body: Any,
    groups: ConsumerGroups,
    link: ConsumerMemberLink | None,
    answer: Any,
) -> Any:
    """A heartbeat of a member (epoch > 0): fenced, renewed, answered."""
    epoch = body.member_epoch
    try:
        if link is None or link.dropped:
            ctx.front.service.coordinator.fetch_offsets(body.group_id, [])  # NOT_COORDINATOR
            raise KafkaError(KafkaCode.unknown_member_id, "not a member; join with epoch 0")
        runner = ctx.front.service.coordinator.runner(body.group_id)
        member = runner.group.members.get(link.engine_id) if runner is not None else None
        if member is None or runner is None:
            groups.drop(link)
            raise KafkaError(KafkaCode.unknown_member_id, "not a member any more; join again")
        if epoch not in link.told_epochs:
            # As Kafka: a member with an epoch it was never told (or long ago) is fenced,
            # gives up its partitions and joins again with epoch 0.
            runner.remove_member(link.engine_id, f"fenced: member epoch {epoch}", stopped=False)
            groups.drop(link)
            raise KafkaError(
                KafkaCode.fenced_member_epoch,
                f"member epoch {epoch} is not {link.epoch}; join again with epoch 0",
            )
        link.bind(ctx.conn, ctx.peer)
        owned = groups.partitions(body.topic_partitions)
        ctx.front.service.coordinator.heartbeat(
            HeartbeatRequest(body.group_id, link.engine_id, member.generation)
        )
        link.reported(owned)
        full = owned is not None and owned != link.assigned
        return answer(KafkaCode.none, link=link, full=full)
    except KafkaError as exc:
        return answer(exc.code, str(exc), epoch=-1, member_id=body.member_id)
    except CoordError as exc:
        log.debug("ConsumerGroupHeartbeat of group %s from %s: %s", body.group_id, ctx.peer, exc)
        return answer(_code(exc), str(exc), epoch=-1, member_id=body.member_id)


def _subscription(body: Any, link: ConsumerMemberLink | None) -> tuple[tuple[str, ...], str | None]:
    names = body.subscribed_topic_names
    regex = body.subscribed_topic_regex
    if names is None and regex is None and link is not None:
        return link.topics, link.regex
    return tuple(names or ()), regex or None


def _changed(link: ConsumerMemberLink, body: Any) -> bool:
    """True if a heartbeat changes what the engine knows of the member (a rejoin)."""
    if (
        body.subscribed_topic_names is not None
        and tuple(body.subscribed_topic_names) != link.topics
    ):
        return True
    if (
        body.subscribed_topic_regex is not None
        and (body.subscribed_topic_regex or None) != link.regex
    ):
        return True
    return body.server_assignor is not None and body.server_assignor != link.assignor


def _rebalance_ms(limit: float, asked: int) -> int:
    """A member's rebalance timeout (its max.poll.interval.ms), capped by the broker's."""
    return max(1, min(asked, int(limit * 1000)))


def _check_regex(regex: str) -> None:
    """INVALID_REGULAR_EXPRESSION (as Kafka) for a pattern RE2 refuses or one too long."""
    if len(regex) > MAX_REGEX_LENGTH:
        raise KafkaError(
            KafkaCode.invalid_regular_expression,
            f"subscribed_topic_regex of {len(regex)} characters is longer than "
            f"{MAX_REGEX_LENGTH}; use a shorter pattern",
        )
    try:
        re2.compile(regex)
    except re2.error as exc:
        raise KafkaError(
            KafkaCode.invalid_regular_expression,
            f"subscribed_topic_regex {regex!r} is not an RE2 regular expression: {exc}",
        ) from None


def _request(
    ctx: RequestContext, body: Any, link: ConsumerMemberLink, engine_id: str
) -> JoinGroupRequest:
    """The engine's JoinGroup for the member as ``body`` (and what it said before) has it."""
    topics, regex = _subscription(body, link)
    entries = list(dict.fromkeys(topics))
    if regex is not None:
        _check_regex(regex)
        entries.append(PATTERN_PREFIX + regex)
    if not entries:
        raise KafkaError(
            KafkaCode.invalid_request,
            "subscribed_topic_names or subscribed_topic_regex must name something",
        )
    assignor = body.server_assignor or link.assignor
    if assignor not in SERVER_ASSIGNORS:
        raise KafkaError(
            KafkaCode.unsupported_assignor,
            f"server assignor {assignor!r} is not one of {', '.join(SERVER_ASSIGNORS)}",
        )
    asked = ms(body.rebalance_timeout)
    rebalance_ms = link.rebalance_ms if asked <= 0 else asked
    if rebalance_ms <= 0:
        raise KafkaError(
            KafkaCode.invalid_request, "a joining member must give its rebalance timeout"
        )
    limits = ctx.front.limits
    rebalance_ms = _rebalance_ms(limits.max_rebalance_timeout, rebalance_ms)
    link.topics, link.regex, link.assignor, link.rebalance_ms = (
        topics,
        regex,
        assignor,
        rebalance_ms,
    )
    # Every member accepts both assignors, its own first: the engine picks the one most
    # members name (as Kafka does), instead of refusing a member that names the other.
    assignors = [assignor] + [a for a in SERVER_ASSIGNORS if a != assignor]
    return JoinGroupRequest(
        body.group_id,
        engine_id,
        entries,
        int(limits.consumer_session_timeout * 1000),
        rebalance_ms,
        assignors,
        auto_commit=False,
        offset_reset="latest",
        client_id=(ctx.client_id or "")[:MAX_NAME_LENGTH],
        rebalance_protocol="cooperative",
        instance_id=link.instance_id,
        rack=link.rack_id,
        max_frame_size=LinkBase.max_frame_size,  # (pushes are answers of its own size)
    )


async def _rejoin(
    ctx: RequestContext, body: Any, groups: ConsumerGroups, link: ConsumerMemberLink
) -> None:
    """The member changed its subscription or assignor: the engine hears it as a join."""
    request = _request(ctx, body, link, link.engine_id)
    joined = await ctx.front.service.coordinator.join(request, link)
    groups.register(link, joined.member_id)


def _check_protocol(ctx: RequestContext, groups: ConsumerGroups, group_id: str) -> None:
    """GROUP_ID_NOT_FOUND if the group has members that are not KIP-848 members (as Kafka)."""
    runner = ctx.front.service.coordinator.runner(group_id)
    if runner is None:
        return
    others = [m for m in runner.group.members if (group_id, m) not in groups.by_engine]
    if others:
        raise KafkaError(
            KafkaCode.group_id_not_found,
            f"group {group_id} is a classic group with {len(others)} member(s) (JoinGroup); "
            "a group uses one protocol at a time: stop its classic members first, or use "
            "another group id",
        )


async def _join(ctx: RequestContext, body: Any, groups: ConsumerGroups, answer: Any) -> Any:
    group_id = body.group_id
    member_id = body.member_id
    if not member_id:
        if ctx.version >= 1:
            raise KafkaError(KafkaCode.invalid_request, "a member id is required (v1)")
        member_id = uuid.uuid4().hex
    if len(member_id) > MAX_NAME_LENGTH or len(body.rack_id or "") > MAX_NAME_LENGTH:
        raise KafkaError(
            KafkaCode.invalid_request,
            f"member id and rack id may have at most {MAX_NAME_LENGTH} characters",
        )
    _check_protocol(ctx, groups, group_id)
    coordinator = ctx.front.service.coordinator
    link = groups.links.get((group_id, member_id))
    instance_id = body.instance_id or ""
    if link is not None and not link.dropped:
        runner = coordinator.runner(group_id)
        if runner is not None and link.engine_id in runner.group.members:
            # Joining again with the id it has: its first answer was lost, or it lost its
            # partitions (fenced by the client itself). The engine hears it as a join.
            link.bind(ctx.conn, ctx.peer)
            if _changed(link, body):
                await _rejoin(ctx, body, groups, link)
            link.owned = frozenset()
            return answer(KafkaCode.none, link=link, full=True)
        groups.drop(link)
    link = ConsumerMemberLink(groups, group_id, member_id)
    link.principal = ctx.principal
    link.instance_id = instance_id
    link.rack_id = body.rack_id or ""
    try:
        link.bind(ctx.conn, ctx.peer)
        request = _request(ctx, body, link, "")
        if not instance_id:
            first = await coordinator.join(request, link)  # (the engine's id for the member)
            request = msgspec.structs.replace(request, member_id=first.member_id)
        else:
            former = groups.by_instance.get((group_id, instance_id))
            if former is not None and not former.closed:
                raise KafkaError(
                    KafkaCode.unreleased_instance_id,
                    f"instance id {instance_id!r} is in use by member {former.member_id}; give "
                    "every consumer its own group.instance.id",
                )
        joined = await coordinator.join(request, link)
        if instance_id:
            former = groups.by_instance.get((group_id, instance_id))
            if former is not None and former is not link:
                groups.drop(former)
        groups.register(link, joined.member_id)
    except BaseException:
        # Refused (or cancelled): forget the link, and any engine member on it, so that
        # nothing of a failed join stays on the connection (a client may retry forever).
        groups.drop(link)
        try:
            coordinator.connection_lost(link)
        except CoordError:
            pass  # (not the coordinator any more)
        raise
    link.epoch = max(link.epoch, joined.generation + 1)
    return answer(KafkaCode.none, link=link, full=True)


async def _leave(
    ctx: RequestContext,
    body: Any,
    groups: ConsumerGroups,
    link: ConsumerMemberLink | None,
    answer: Any,
) -> Any:
    if link is None:
        if body.member_epoch == -2 and body.instance_id:
            link = groups.by_instance.get((body.group_id, body.instance_id))
            if link is not None and link.member_id != body.member_id:
                # As Kafka: only the member holding the instance id may step it out.
                raise KafkaError(
                    KafkaCode.fenced_instance_id,
                    f"instance id {body.instance_id!r} belongs to member {link.member_id}, "
                    f"not {body.member_id}",
                )
        if link is None:
            ctx.front.service.coordinator.fetch_offsets(body.group_id, [])  # NOT_COORDINATOR
            raise KafkaError(KafkaCode.unknown_member_id, "not a member")
    stay = body.member_epoch == -2 and bool(link.instance_id)
    try:
        await ctx.front.service.coordinator.leave(
            LeaveGroupRequest(
                body.group_id,
                link.engine_id,
                reason="left the group (KIP-848 heartbeat)" if not stay else "",
                stay=stay,
            )
        )
    finally:
        if stay:
            groups.step_out(link)
        else:
            groups.drop(link)
    return answer(KafkaCode.none, link=link, epoch=body.member_epoch, member_id=body.member_id)


# -- OffsetCommit / OffsetFetch of KIP-848 members (called by groups.py) --------------------


def commit_identity(
    front: FrontEnd,
    group_id: str,
    member_id: str,
    epoch: int,
    partitions: list[TopicPartition],
) -> tuple[str, int] | None:
    """The engine's (member id, generation) for a KIP-848 member's OffsetCommit.

    None if ``member_id`` is no KIP-848 member of the group (then the
    classic rules apply). Raises KafkaError: UNKNOWN_MEMBER_ID for a member
    the group does not have (a consumer group with members), STALE_MEMBER_EPOCH
    for an epoch other than the member's, except the one it had before if
    every partition committed is still assigned to it (a commit may cross
    the heartbeat answer that moved the epoch on, as KIP-1251 allows).
    """
    groups = front.state(ConsumerGroups)
    link = groups.links.get((group_id, member_id))
    if link is None:
        if epoch >= 0 and groups.is_consumer_group(group_id):
            raise KafkaError(KafkaCode.unknown_member_id, "not a member of this consumer group")
        return None
    runner = front.service.coordinator.runner(group_id)
    member = runner.group.members.get(link.engine_id) if runner is not None else None
    if member is None:
        raise KafkaError(KafkaCode.unknown_member_id, "not a member any more")
    if epoch != link.epoch and not (
        epoch in link.told_epochs and all(tp in link.assigned for tp in partitions)
    ):
        raise KafkaError(KafkaCode.stale_member_epoch, f"member epoch {epoch} is not {link.epoch}")
    return link.engine_id, member.generation


def fetch_check(front: FrontEnd, group_id: str, member_id: str | None, epoch: int) -> None:
    """Raise KafkaError unless an OffsetFetch v9+ from ``member_id`` at ``epoch`` may read.

    As Kafka: no member id and epoch -1 is an admin's read; a KIP-848 member
    must be one (UNKNOWN_MEMBER_ID) at its epoch (STALE_MEMBER_EPOCH).
    """
    if not member_id and epoch < 0:
        return
    groups = front.state(ConsumerGroups)
    link = groups.links.get((group_id, member_id or ""))
    if link is None:
        if groups.is_consumer_group(group_id):
            raise KafkaError(KafkaCode.unknown_member_id, "not a member of this consumer group")
        return
    if epoch != link.epoch and epoch not in link.told_epochs:
        raise KafkaError(KafkaCode.stale_member_epoch, f"member epoch {epoch} is not {link.epoch}")


# -- ConsumerGroupDescribe -------------------------------------------------------------------


def describe_members(front: FrontEnd, group_id: str) -> dict[str, dict[str, Any]]:
    """Per engine member id, what a KIP-848 member adds to a description (for the CLI too)."""
    groups = front.state(ConsumerGroups)
    out = {}
    for engine_id in groups.by_group.get(group_id, ()):
        link = groups.by_engine.get((group_id, engine_id))
        if link is not None:
            out[engine_id] = {
                "member_id": link.member_id,
                "member_epoch": link.epoch,
                "current": sorted(link.told & link.owned) if link.owned else sorted(link.told),
                "target": sorted(link.assigned),
                "topics": list(link.topics),
                "regex": link.regex,
                "rack": link.rack_id,
                "assignor": link.assignor,
            }
    return out


def _describe_code(exc: KafkaError | CoordError) -> KafkaCode:
    """ConsumerGroupDescribe's code for a group it cannot describe (unknown: GROUP_ID_NOT_FOUND)."""
    if isinstance(exc, CoordError) and exc.code == ErrorCode.GROUP_ID_NOT_FOUND:
        return KafkaCode.group_id_not_found
    return kafka_code(exc)


async def _describe(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(69, ctx.version)
    group_cls = nested(schema, "DescribedGroup")
    member_cls = nested(schema, "Member")
    assignment_cls = nested(schema, "Assignment")
    tp_cls = nested(schema, "TopicPartitions")
    coordinator = ctx.front.service.coordinator
    groups = ctx.front.state(ConsumerGroups)
    out = []
    for group_id in body.group_ids:
        try:
            if not ctx.allowed("describe", "group", group_id):
                raise KafkaError(
                    KafkaCode.group_authorization_failed,
                    f"{ctx.principal} may not DESCRIBE group {group_id!r}",
                )
            d = coordinator.describe_group(group_id)
            runner = coordinator.runner(group_id)
            if (
                runner is not None
                and runner.group.members
                and not groups.is_consumer_group(group_id)
            ):
                raise KafkaError(
                    KafkaCode.group_id_not_found, f"{group_id} is not a consumer group"
                )
        except (KafkaError, CoordError) as exc:
            out.append(
                make(
                    group_cls,
                    error_code=_describe_code(exc),
                    error_message=str(exc),
                    group_id=group_id,
                    group_state="dead",
                    group_epoch=-1,
                    assignment_epoch=-1,
                    assignor_name="",
                    members=(),
                    authorized_operations=-(2**31),
                )
            )
            continue
        extra = describe_members(ctx.front, group_id)
        members = []
        for m in d.members:
            x = extra.get(m.member_id)
            if x is None:
                continue
            members.append(
                make(
                    member_cls,
                    member_id=x["member_id"],
                    instance_id=m.instance_id or None,
                    rack_id=x["rack"] or None,
                    member_epoch=x["member_epoch"],
                    client_id=m.client_id,
                    client_host=m.host,
                    subscribed_topic_names=tuple(x["topics"]),
                    subscribed_topic_regex=x["regex"],
                    assignment=make(
                        assignment_cls,
                        topic_partitions=_topic_partitions(
                            ctx.front, tp_cls, frozenset(x["current"])
                        ),
                    ),
                    target_assignment=make(
                        assignment_cls,
                        topic_partitions=_topic_partitions(
                            ctx.front, tp_cls, frozenset(x["target"])
                        ),
                    ),
                )
            )
        out.append(
            make(
                group_cls,
                error_code=KafkaCode.none,
                error_message=None,
                group_id=group_id,
                group_state=STATE_NAMES.get(GroupState(d.state), str(d.state)),
                group_epoch=d.generation + 1,
                assignment_epoch=d.generation + 1,
                assignor_name=d.assignor,
                members=tuple(members),
                authorized_operations=-(2**31),
            )
        )
    return make(schema, throttle_time=_NO_THROTTLE, groups=tuple(out))


APIS: Final = [
    Api(68, 0, 1, _heartbeat, now=_heartbeat_now, authorizes=True),
    Api(69, 0, 0, _describe, authorizes=True),
]
