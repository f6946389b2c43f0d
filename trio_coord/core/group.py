"""The consumer group as a pure state machine: members, generations, rebalance decisions.

A :class:`Group` knows who is in the group, which generation it is in, who was
told to own what, who may still be fetching what, and the committed offsets.
It does no I/O and reads no clock: every method that needs the time takes
``now``; the broker's group task (``trio_coord.broker.group``) moves the bytes,
keeps the deadlines, and calls in here for every decision. A rebalance is the
stop/start protocol of the coordinator-driven design, in states (the legal
moves are :data:`TRANSITIONS`)::

    EMPTY ──join──▶ STOPPING ──all stopped──▶ ASSIGNING ──planned──▶ STARTING ──all acked──▶ STABLE
                       ▲  any membership change restarts the rebalance │                       │
                       └────────────────────────────────────────────────┴───────────────────────┘

Exclusive ownership is kept by bookkeeping here: ``Member.may_own`` is what a
member may be fetching (set when StartFetchers is sent, cleared when it
acknowledges a stop); a member removed without that acknowledgement leaves a
:class:`Fence` over those partitions until its session has certainly expired
(its last heartbeat, as received, plus its session timeout: the client drops
its partitions one session timeout after *sending* its last successful
heartbeat, which is no later). A partition under a fence is started on its
new owner only after the fence ends (``StartPlan.not_before``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..protocol.errors import (
    GroupMaxSizeReachedError,
    InconsistentAssignorError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
)
from ..protocol.messages import (
    NO_OFFSET,
    GroupDescription,
    GroupSummary,
    MemberDescription,
    PartitionOffset,
    TopicPartition,
)
from .assignors import Assignor, GroupSpec, MemberSpec, choose_assignor, validate_assignment
from .records import (
    GroupRecord,
    GroupTombstone,
    MemberRecord,
    OffsetRecord,
    OffsetTombstone,
    Record,
    supersedes,
)

__all__ = [
    "OFFSET_RESET_POLICIES",
    "TRANSITIONS",
    "AssignmentPlan",
    "Fence",
    "Group",
    "GroupLimits",
    "GroupState",
    "IllegalTransitionError",
    "Member",
    "StartPlan",
]

OFFSET_RESET_POLICIES = ("earliest", "latest", "none")


class GroupState(enum.StrEnum):
    """Where a group is in its life and in its rebalance."""

    EMPTY = "EMPTY"
    STOPPING = "STOPPING"
    ASSIGNING = "ASSIGNING"
    STARTING = "STARTING"
    STABLE = "STABLE"
    DEAD = "DEAD"


_S = GroupState
TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    _S.EMPTY: frozenset({_S.STOPPING, _S.DEAD}),
    _S.STOPPING: frozenset({_S.STOPPING, _S.ASSIGNING, _S.EMPTY}),
    _S.ASSIGNING: frozenset({_S.STOPPING, _S.STARTING, _S.EMPTY}),
    _S.STARTING: frozenset({_S.STOPPING, _S.STABLE, _S.EMPTY}),
    _S.STABLE: frozenset({_S.STOPPING, _S.EMPTY}),
    _S.DEAD: frozenset(),
}
"""The legal state changes; any other is a bug and raises :class:`IllegalTransitionError`."""

REBALANCING = frozenset({_S.STOPPING, _S.ASSIGNING, _S.STARTING})


class IllegalTransitionError(RuntimeError):
    """A state change not in :data:`TRANSITIONS` was attempted (a coordinator bug)."""


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """The broker's bounds on what members may ask for."""

    min_session_timeout: float = 1.0
    max_session_timeout: float = 1800.0
    max_group_size: int = 1000


@dataclass(slots=True)
class Member:
    """A live member of the group, as its coordinator sees it."""

    member_id: str
    client_id: str
    host: str
    topics: frozenset[str]
    session_timeout: float
    rebalance_timeout: float
    assignors: tuple[str, ...]
    auto_commit: bool
    offset_reset: str
    last_heartbeat: float
    generation: int
    """The last generation this member joined in or acknowledged."""
    assignment: frozenset[TopicPartition] = frozenset()
    """Its partitions in the group's current generation."""
    may_own: set[TopicPartition] = field(default_factory=set)
    """Partitions it may be fetching: started and not yet acknowledged as stopped."""

    @property
    def lease_end(self) -> float:
        """When this member certainly stops fetching if it hears nothing more."""
        return self.last_heartbeat + self.session_timeout


@dataclass(frozen=True, slots=True)
class Fence:
    """Partitions a departed member may still fetch, until ``until``.

    ``session_timeout`` is that member's: how long to fence again after a
    restart, when ``until`` (a reading of a clock that is gone) means nothing.
    """

    partitions: frozenset[TopicPartition]
    until: float
    session_timeout: float = field(default=0.0, compare=False)


@dataclass(frozen=True, slots=True)
class StartPlan:
    """One member's StartFetchers: its partitions with start offsets, not before a time."""

    member_id: str
    partitions: list[PartitionOffset]
    not_before: float


@dataclass(frozen=True, slots=True)
class AssignmentPlan:
    """The outcome of the assign phase: the record to persist, then the starts to send."""

    record: GroupRecord
    starts: list[StartPlan]


class Group:
    """One consumer group's state; see the module docstring."""

    def __init__(self, group_id: str, *, now: float) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.generation = 0
        self.assignor = ""
        self.members: dict[str, Member] = {}
        self.offsets: dict[TopicPartition, OffsetRecord] = {}
        self.positions: dict[TopicPartition, PartitionOffset] = {}
        self.fences: dict[str, Fence] = {}
        self.record: GroupRecord | None = None
        """The last generation record replayed (what the store holds)."""
        self.empty_since: float | None = now

    def __repr__(self) -> str:
        return (
            f"<Group {self.group_id} {self.state} gen={self.generation} "
            f"members={len(self.members)}>"
        )

    # -- states ----------------------------------------------------------------

    @property
    def rebalancing(self) -> bool:
        """True while a rebalance is in one of its phases."""
        return self.state in REBALANCING

    def transition(self, new: GroupState) -> None:
        """Move to ``new``, which must be legal from the current state."""
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"group {self.group_id}: {self.state} -> {new}")
        self.state = new

    def _became_empty(self, now: float) -> None:
        if self.state is not GroupState.EMPTY:
            self.transition(GroupState.EMPTY)
        self.empty_since = now

    # -- membership ------------------------------------------------------------

    def validate_join(
        self,
        *,
        member_id: str,
        topics: Iterable[str],
        session_timeout: float,
        rebalance_timeout: float,
        assignors: Iterable[str],
        offset_reset: str,
        limits: GroupLimits,
        available: Mapping[str, Assignor],
    ) -> None:
        """Raise the error a JoinGroup with these values deserves, if any."""
        if not (limits.min_session_timeout <= session_timeout <= limits.max_session_timeout):
            raise InvalidSessionTimeoutError(
                f"session timeout {session_timeout:g}s is outside this broker's limits "
                f"[{limits.min_session_timeout:g}s, {limits.max_session_timeout:g}s]; "
                "choose a value within them"
            )
        if rebalance_timeout <= 0:
            raise InvalidRequestError("rebalance timeout must be positive")
        if not list(topics):
            raise InvalidRequestError("a member must subscribe to at least one topic")
        if offset_reset not in OFFSET_RESET_POLICIES:
            raise InvalidRequestError(
                f"offset reset policy {offset_reset!r} is not one of "
                f"{', '.join(OFFSET_RESET_POLICIES)}"
            )
        if member_id not in self.members and len(self.members) >= limits.max_group_size:
            raise GroupMaxSizeReachedError(
                f"group {self.group_id} has reached its maximum size of "
                f"{limits.max_group_size} members"
            )
        others = [m.assignors for m in self.members.values() if m.member_id != member_id]
        if choose_assignor([tuple(assignors), *others], available) is None:
            raise InconsistentAssignorError(
                f"no assignor that the broker supports ({', '.join(sorted(available))}) "
                f"is common to this member ({', '.join(assignors) or 'none'}) and the "
                f"members of group {self.group_id}"
            )

    def add_member(
        self,
        now: float,
        *,
        member_id: str,
        client_id: str,
        host: str,
        topics: Iterable[str],
        session_timeout: float,
        rebalance_timeout: float,
        assignors: Iterable[str],
        auto_commit: bool,
        offset_reset: str,
    ) -> Member:
        """Admit a member (validated by :meth:`validate_join`); replaces one with the same id.

        A former member rejoining with its id while fenced (it lost its
        connection, or this coordinator took over) may still be fetching what
        the fence covers, and its rejoin renews its lease: those partitions
        become its ``may_own``, so that they stay fenced if it goes away again
        before acknowledging a stop.
        """
        old = self.members.get(member_id)
        fence = self.fences.get(member_id)
        member = Member(
            member_id=member_id,
            client_id=client_id,
            host=host,
            topics=frozenset(topics),
            session_timeout=session_timeout,
            rebalance_timeout=rebalance_timeout,
            assignors=tuple(assignors),
            auto_commit=auto_commit,
            offset_reset=offset_reset,
            last_heartbeat=now,
            generation=self.generation,
        )
        if old is not None:
            member.may_own = old.may_own
            member.assignment = old.assignment
        elif fence is not None and fence.until > now:
            member.may_own = set(fence.partitions)
        self.members[member_id] = member
        self.empty_since = None
        return member

    def knows_former_member(self, member_id: str) -> bool:
        """True if ``member_id`` held partitions before a restart or failover and may rejoin."""
        return member_id in self.fences

    def remove_member(self, now: float, member_id: str, *, stopped: bool) -> Member:
        """Remove a member; without a stop acknowledgement its partitions are fenced.

        ``stopped`` is True when the member stopped its fetchers itself
        (LeaveGroup is sent after stopping). Otherwise (session expiry, lost
        connection, expulsion) what it may own stays fenced until its lease
        ends. The group becomes EMPTY when its last member goes.
        """
        member = self.members.pop(member_id)
        if not stopped and member.may_own and member.lease_end > now:
            self.fences[member_id] = Fence(
                frozenset(member.may_own), member.lease_end, member.session_timeout
            )
        if not self.members:
            self._became_empty(now)
        return member

    def heartbeat(self, now: float, member: Member, positions: Iterable[PartitionOffset]) -> None:
        """Record a fenced-in heartbeat (see ``fencing.check_heartbeat``) and its positions.

        Positions count only in a stable generation and only for partitions the
        member owns; they are committed later, in a batch (:meth:`drain_positions`).
        """
        member.last_heartbeat = now
        if self.state is GroupState.STABLE and member.generation == self.generation:
            assignment = member.assignment
            for position in positions:
                if position.tp in assignment:
                    self.positions[position.tp] = position

    def expire_fences(self, now: float) -> None:
        """Forget fences that have ended."""
        for member_id in [m for m, f in self.fences.items() if f.until <= now]:
            del self.fences[member_id]

    # -- the rebalance -----------------------------------------------------------

    def begin_rebalance(self) -> list[Member]:
        """Enter STOPPING (from any state but EMPTY/DEAD); return the members to stop."""
        self.transition(GroupState.STOPPING)
        return list(self.members.values())

    def member_stopped(self, member_id: str, positions: Iterable[PartitionOffset]) -> None:
        """A member acknowledged StopFetchers: it owns nothing now; keep its positions."""
        member = self.members[member_id]
        for position in positions:
            if position.tp in member.may_own or position.tp in member.assignment:
                self.positions[position.tp] = position
        member.may_own.clear()
        self.fences.pop(member_id, None)

    def drain_positions(self, now_ms: int) -> list[OffsetRecord]:
        """Turn collected positions that advance a committed offset into offset records."""
        records = []
        for tp, position in self.positions.items():
            current = self.offsets.get(tp)
            if current is None or position.offset > current.offset:
                records.append(
                    OffsetRecord(
                        self.group_id,
                        tp.topic,
                        tp.partition,
                        position.offset,
                        position.metadata,
                        now_ms,
                    )
                )
        self.positions.clear()
        return records

    def requeue_positions(self, records: Iterable[OffsetRecord]) -> None:
        """Put back drained positions whose commit failed, unless newer ones arrived."""
        for record in records:
            self.positions.setdefault(
                record.tp,
                PartitionOffset(record.topic, record.partition, record.offset, record.metadata),
            )

    def plan_assignment(
        self,
        now: float,
        *,
        partitions: Mapping[str, int],
        available: Mapping[str, Assignor],
        log_offsets: Callable[[TopicPartition], tuple[int, int]],
    ) -> AssignmentPlan:
        """Enter ASSIGNING and compute the next generation's assignment.

        ``partitions`` maps each existing topic to its partition count;
        ``log_offsets`` gives a partition's (log start, log end) for members
        whose group has no committed offset there. Nothing changes until the
        returned record is replayed (after it is durable).
        """
        self.transition(GroupState.ASSIGNING)
        self.expire_fences(now)
        members = sorted(self.members.values(), key=lambda m: m.member_id)
        name = choose_assignor([m.assignors for m in members], available)
        if name is None:  # validate_join keeps this from happening
            raise InconsistentAssignorError(f"group {self.group_id} has no common assignor")
        spec = GroupSpec(
            members={
                m.member_id: MemberSpec(m.member_id, m.topics, frozenset(m.assignment))
                for m in members
            },
            partitions={t: n for t, n in partitions.items() if n > 0},
        )
        assignment = available[name].assign(spec)
        try:
            validate_assignment(spec, assignment)
        except ValueError as exc:
            raise ValueError(f"assignor {name!r} returned a bad assignment: {exc}") from None
        record = GroupRecord(
            self.group_id,
            self.generation + 1,
            name,
            [
                MemberRecord(
                    m.member_id,
                    m.client_id,
                    m.host,
                    sorted(m.topics),
                    round(m.session_timeout * 1000),
                    round(m.rebalance_timeout * 1000),
                    sorted(assignment.get(m.member_id, [])),
                )
                for m in members
            ],
            [
                MemberRecord(
                    member_id,
                    "",
                    "",
                    [],
                    round(fence.session_timeout * 1000),
                    0,
                    sorted(fence.partitions),
                )
                for member_id, fence in sorted(self.fences.items())
            ],
        )
        starts = []
        for m in members:
            owned = sorted(assignment.get(m.member_id, []))
            starts.append(
                StartPlan(
                    m.member_id,
                    [self._start_offset(tp, m.offset_reset, log_offsets) for tp in owned],
                    self._fenced_until(owned, now),
                )
            )
        return AssignmentPlan(record, starts)

    def _start_offset(
        self,
        tp: TopicPartition,
        reset: str,
        log_offsets: Callable[[TopicPartition], tuple[int, int]],
    ) -> PartitionOffset:
        committed = self.offsets.get(tp)
        if committed is not None:
            return PartitionOffset(tp.topic, tp.partition, committed.offset, committed.metadata)
        if reset == "none":
            return PartitionOffset(tp.topic, tp.partition, NO_OFFSET)
        start, end = log_offsets(tp)
        return PartitionOffset(tp.topic, tp.partition, start if reset == "earliest" else end)

    def _fenced_until(self, partitions: Iterable[TopicPartition], now: float) -> float:
        wanted = set(partitions)
        until = now
        for fence in self.fences.values():
            if fence.until > until and not wanted.isdisjoint(fence.partitions):
                until = fence.until
        return until

    def begin_starting(self) -> None:
        """Enter STARTING: the new generation is durable and replayed."""
        self.transition(GroupState.STARTING)

    def member_starting(self, member_id: str) -> None:
        """StartFetchers is about to be sent: from now on the member may own its partitions."""
        member = self.members[member_id]
        member.may_own |= member.assignment

    def member_started(self, member_id: str) -> None:
        """The member acknowledged StartFetchers of the current generation."""
        self.members[member_id].generation = self.generation

    def complete_rebalance(self) -> None:
        """Every member acknowledged its start: the group is STABLE."""
        self.transition(GroupState.STABLE)

    # -- records -----------------------------------------------------------------

    def replay(self, record: Record, *, now: float, loading: bool = False) -> None:
        """Apply a durable record (after a write, or with ``loading=True`` at start-up).

        A :class:`GroupRecord` sets the generation and the members'
        assignments. While loading (after a restart or a failover) the
        partitions of its members, and of the departed members it lists as
        still fenced, are fenced for one session timeout from ``now``, since
        they may still be fetching; after a live write, a member in the record
        that is gone already left through :meth:`remove_member`, which fenced
        what it needed. A record older than the current generation is ignored
        (generations never go back, or fencing would weaken). An
        :class:`OffsetRecord` never moves an offset backwards unless it is an
        explicit reset; an :class:`OffsetTombstone` forgets one.
        """
        if isinstance(record, OffsetRecord):
            if supersedes(record, self.offsets.get(record.tp)):
                self.offsets[record.tp] = record
        elif isinstance(record, GroupRecord):
            if not supersedes(record, self.record):
                return  # e.g. a CreateGroup that raced the first join
            self.record = record
            self.generation = record.generation
            self.assignor = record.assignor
            for persisted in record.members:
                live = self.members.get(persisted.member_id)
                if live is not None:
                    live.assignment = frozenset(persisted.partitions)
            if loading:
                for persisted in [*record.members, *record.departed]:
                    if persisted.partitions and persisted.member_id not in self.members:
                        session = persisted.session_timeout_ms / 1000
                        self.fences[persisted.member_id] = Fence(
                            frozenset(persisted.partitions), now + session, session
                        )
        elif isinstance(record, OffsetTombstone):
            self.offsets.pop(record.tp, None)
            self.positions.pop(record.tp, None)
        elif isinstance(record, GroupTombstone):
            self.offsets.clear()
            self.positions.clear()
            if self.state is not GroupState.DEAD:
                self.transition(GroupState.DEAD)

    # -- views ---------------------------------------------------------------------

    def summary(self) -> GroupSummary:
        """The group as ListGroups shows it."""
        return GroupSummary(self.group_id, self.state.value, self.generation, len(self.members))

    def describe(self) -> GroupDescription:
        """The group as DescribeGroup shows it."""
        return GroupDescription(
            self.group_id,
            self.state.value,
            self.generation,
            self.assignor,
            [
                MemberDescription(
                    m.member_id,
                    m.client_id,
                    m.host,
                    sorted(m.topics),
                    round(m.session_timeout * 1000),
                    round(m.rebalance_timeout * 1000),
                    sorted(m.assignment),
                )
                for m in sorted(self.members.values(), key=lambda m: m.member_id)
            ],
            [
                PartitionOffset(tp.topic, tp.partition, rec.offset, rec.metadata)
                for tp, rec in sorted(self.offsets.items())
            ],
        )

    def ownership(self) -> dict[TopicPartition, str]:
        """Who owns each partition in the current generation (for checks and tests)."""
        return {tp: m.member_id for m in self.members.values() for tp in m.assignment}
