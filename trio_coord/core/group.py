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
new owner only after the fence ends (``StartPlan.not_before``); the new
owner's other partitions do not wait for it (a plan starts each member in
stages, one per fence end).

The planning of a rebalance (assignor input, a leader's assignment checked, the
StartFetchers plan) is :attr:`Group.planning`, an :class:`._planning.AssignmentPlanner`
that reads the group (a :class:`._planning.GroupView`) and changes nothing; the group
applies what it returns. :class:`Member` and :class:`Fence` live in ``_member.py``.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..protocol.errors import (
    GroupMaxSizeReachedError,
    InconsistentAssignorError,
    InvalidRebalanceTimeoutError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
)
from ..protocol.messages import (
    MAX_DESCRIBED_OWNED,
    GroupDescription,
    GroupSummary,
    MemberDescription,
    PartitionOffset,
    TopicPartition,
)
from ._member import Fence, Member
from ._planning import (
    AssignmentInput,
    AssignmentPlan,
    AssignmentPlanner,
    GroupView,
    StartPlan,
)
from .assignors import (
    Assignment,
    Assignor,
)
from .records import (
    GroupRecord,
    GroupTombstone,
    OffsetRecord,
    OffsetTombstone,
    Record,
    supersedes,
)
from .states import (
    REBALANCING,
    STATE_DOCS,
    STATE_TABLE,
    TRANSITIONS,
    GroupState,
    IllegalTransitionError,
    Trigger,
)
from .validation import MAX_NAME_LENGTH, validate_subscription

__all__ = [
    "MAX_ASSIGNORS",
    "MAX_USER_DATA",
    "OFFSET_RESET_POLICIES",
    "PREDECESSOR_SUFFIX",
    "REBALANCE_PROTOCOLS",
    "STATE_DOCS",
    "STATE_TABLE",
    "TRANSITIONS",
    "AssignmentInput",
    "AssignmentPlan",
    "AssignmentPlanner",
    "Fence",
    "Group",
    "GroupLimits",
    "GroupState",
    "GroupView",
    "IllegalTransitionError",
    "Member",
    "StartPlan",
    "Trigger",
]

OFFSET_RESET_POLICIES = ("earliest", "latest", "none")
REBALANCE_PROTOCOLS = ("eager", "cooperative")
"""How a member wants rebalances run: stop everything, or only what moves."""
MAX_USER_DATA = 64 * 1024
"""The most opaque ``user_data`` a member may bring (a group holds every member's)."""
MAX_ASSIGNORS = 32
"""The most assignor names a member may list (preferences, and those it computes)."""
PREDECESSOR_SUFFIX = "~previous-process"
"""Appended to a static member's id to key the fence over what its former process may
fetch (:meth:`Group.replace_process`); no member id the coordinator hands out ends so."""


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """The broker's bounds on what members may ask for."""

    min_session_timeout: float = 1.0
    max_session_timeout: float = 300.0
    max_group_size: int = 1000
    initial_rebalance_delay: float = 0.0
    """How long a group coming to life waits for more joins before its first rebalance."""
    max_rebalance_timeout: float = 300.0
    """The longest a member may take to answer a rebalance (the group waits that long)."""
    offset_metadata_max_bytes: int = 4096
    """The most metadata (UTF-8 bytes) one committed offset may carry (Kafka's default)."""


class Group:
    """One consumer group's state; see the module docstring."""

    def __init__(self, group_id: str, *, now: float) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.generation = 0
        self.assignor = ""
        self.members: dict[str, Member] = {}
        self.offsets: dict[TopicPartition, OffsetRecord] = {}
        self._offset_order: list[TopicPartition] | None = None
        """``offsets``' partitions sorted, made when a listing needs them and dropped when
        a partition is added or forgotten (a commit of one already there keeps it)."""
        self.positions: dict[TopicPartition, PartitionOffset] = {}
        self.fences: dict[str, Fence] = {}
        self.record: GroupRecord | None = None
        """The last generation record replayed (what the store holds)."""
        self.empty_since: float | None = now
        # Kept as members come and go, so that admitting one costs O(1), not O(members):
        self._assignor_votes: Counter[str] = Counter()  # how many members accept each
        self._computable: Counter[str] = Counter()  # how many members can compute each
        self._eager = 0  # members that asked for eager rebalancing
        self._instances: dict[str, str] = {}  # static instance id -> member id

    def __repr__(self) -> str:
        return (
            f"<Group {self.group_id} {self.state} gen={self.generation} "
            f"members={len(self.members)}>"
        )

    # -- states ----------------------------------------------------------------

    @property
    def cooperative(self) -> bool:
        """True if every member asked for cooperative rebalancing (then only moves stop).

        O(1): members asking for eager rebalancing are counted as they come and go.
        """
        return bool(self.members) and not self._eager

    def _count(self, member: Member, sign: int) -> None:
        """Add (``sign=1``) or withdraw (-1) a member's votes in the running counts."""
        for name in set(member.assignors):
            self._assignor_votes[name] += sign
        for name in set(member.client_assignors):
            self._computable[name] += sign
        if member.protocol != "cooperative":
            self._eager += sign
        if member.instance_id:
            if sign > 0:
                self._instances[member.instance_id] = member.member_id
            elif self._instances.get(member.instance_id) == member.member_id:
                del self._instances[member.instance_id]

    def member_by_instance(self, instance_id: str) -> Member | None:
        """The live member with this static ``instance_id``, if any."""
        member_id = self._instances.get(instance_id) if instance_id else None
        return None if member_id is None else self.members.get(member_id)

    @property
    def rebalancing(self) -> bool:
        """True while a rebalance is in one of its phases."""
        return self.state in REBALANCING

    def fire(self, trigger: Trigger) -> GroupState:
        """Move as :data:`STATE_TABLE` says ``trigger`` moves the current state; return it."""
        new = STATE_TABLE.get((self.state, trigger))
        if new is None:
            raise IllegalTransitionError(f"group {self.group_id}: {self.state} on {trigger}")
        self.state = new
        return new

    def transition(self, new: GroupState) -> None:
        """Move to ``new``, which must be legal from the current state (:data:`TRANSITIONS`)."""
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"group {self.group_id}: {self.state} -> {new}")
        self.state = new

    def _became_empty(self, now: float) -> None:
        if self.state is not GroupState.EMPTY:
            self.fire(Trigger.EMPTIED)
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
        protocol: str = "eager",
        client_assignors: Iterable[str] = (),
        user_data: bytes = b"",
        client_id: str = "",
        instance_id: str = "",
        rack: str = "",
    ) -> None:
        """Raise the error a JoinGroup with these values deserves, if any.

        Every value a member brings is bounded, since the group keeps it for
        the member's life, persists it, and repeats it in answers: timeouts by
        the broker's limits, names by :data:`MAX_NAME_LENGTH`, the assignor
        lists by :data:`MAX_ASSIGNORS`, ``user_data`` by :data:`MAX_USER_DATA`.
        """
        if not (limits.min_session_timeout <= session_timeout <= limits.max_session_timeout):
            raise InvalidSessionTimeoutError(
                f"session timeout {session_timeout:g}s is outside this broker's limits "
                f"[{limits.min_session_timeout:g}s, {limits.max_session_timeout:g}s]; "
                "choose a value within them (the broker's --min-session-timeout and "
                "--max-session-timeout)"
            )
        if not 0 < rebalance_timeout <= limits.max_rebalance_timeout:
            raise InvalidRebalanceTimeoutError(
                f"rebalance timeout {rebalance_timeout:g}s is outside this broker's limits "
                f"(0s, {limits.max_rebalance_timeout:g}s]: a member that never answered would "
                "hold its whole group that long; choose a value within them (the broker's "
                "--max-rebalance-timeout)"
            )
        topics = list(topics)
        if not topics:
            raise InvalidRequestError("a member must subscribe to at least one topic")
        validate_subscription(topics)
        if offset_reset not in OFFSET_RESET_POLICIES:
            raise InvalidRequestError(
                f"offset reset policy {offset_reset!r} is not one of "
                f"{', '.join(OFFSET_RESET_POLICIES)}"
            )
        for what, name in (("client id", client_id), ("instance id", instance_id), ("rack", rack)):
            if len(name) > MAX_NAME_LENGTH:
                raise InvalidRequestError(
                    f"{what} {name[:40]!r}... is {len(name)} characters, more than the "
                    f"{MAX_NAME_LENGTH} allowed; use a shorter one"
                )
        assignors = tuple(assignors)
        client_assignors = tuple(client_assignors)
        for names in (assignors, client_assignors):
            if len(names) > MAX_ASSIGNORS or any(len(n) > MAX_NAME_LENGTH for n in names):
                raise InvalidRequestError(
                    f"a member may name at most {MAX_ASSIGNORS} assignors of at most "
                    f"{MAX_NAME_LENGTH} characters each; this one named {len(names)}"
                )
        if len(user_data) > MAX_USER_DATA:
            raise InvalidRequestError(
                f"user data of {len(user_data)} bytes is more than the {MAX_USER_DATA} a "
                "member may bring; keep it to what the assignor needs"
            )
        if protocol not in REBALANCE_PROTOCOLS:
            raise InvalidRequestError(
                f"rebalance protocol {protocol!r} is not one of {', '.join(REBALANCE_PROTOCOLS)}"
            )
        if member_id not in self.members and len(self.members) >= limits.max_group_size:
            raise GroupMaxSizeReachedError(
                f"group {self.group_id} has reached its maximum size of "
                f"{limits.max_group_size} members"
            )
        if not self._common_assignor(member_id, assignors, client_assignors, available):
            others = [m for m in self.members.values() if m.member_id != member_id]
            theirs = ""
            if others:
                accepted = set(others[0].assignors).intersection(*(m.assignors for m in others))
                theirs = f" (who all accept: {', '.join(sorted(accepted)) or 'nothing common'})"
            raise InconsistentAssignorError(
                f"no assignor that the broker ({', '.join(sorted(available))}) or a member "
                f"can compute is common to this member ({', '.join(assignors) or 'none'}) "
                f"and the members of group {self.group_id}{theirs}"
            )

    def _common_assignor(
        self,
        member_id: str,
        assignors: Iterable[str],
        client_assignors: Iterable[str],
        available: Collection[str],
    ) -> bool:
        """Whether an assignor of this member's list is accepted by every other member and
        can be computed (by the broker, or by a member that has it): O(len(assignors)).

        The same question as ``choose_assignor(...) is not None`` over every
        member's list, answered from the running counts instead.
        """
        old = self.members.get(member_id)
        others = len(self.members) - (old is not None)
        own = set(client_assignors)

        def votes(counter: Counter[str], name: str, theirs: tuple[str, ...]) -> int:
            return counter[name] - (old is not None and name in theirs)

        for name in assignors:
            accepted = votes(self._assignor_votes, name, old.assignors if old else ())
            if accepted < others:
                continue
            if (
                name in available
                or name in own
                or votes(self._computable, name, old.client_assignors if old else ()) > 0
            ):
                return True
        return False

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
        protocol: str = "eager",
        instance_id: str = "",
        user_data: bytes = b"",
        client_assignors: Iterable[str] = (),
        rack: str = "",
        owned: Iterable[TopicPartition] | None = None,
    ) -> Member:
        """Admit a member (validated by :meth:`validate_join`); replaces one with the same id.

        A former member rejoining with its id while fenced (it lost its
        connection, or this coordinator took over) may still be fetching what
        the fence covers, and its rejoin renews its lease: those partitions
        become its ``may_own``, so that they stay fenced if it goes away again
        before acknowledging a stop. A live member rejoining keeps its
        ``may_own`` and assignment; it still counts as fetching its assignment
        (``started_in``) only if it says it ``owned`` exactly that: it may have
        dropped everything when its lease ran out.
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
            protocol=protocol,
            instance_id=instance_id,
            user_data=user_data,
            client_assignors=tuple(client_assignors),
            rack=rack,
        )
        if old is not None:
            member.may_own = old.may_own
            member.assignment = old.assignment
            if owned is not None and old.assignment == frozenset(owned):
                member.started_in = old.started_in
            self._count(old, -1)
        elif fence is not None and fence.until > now:
            member.may_own = set(fence.partitions)
        self.members[member_id] = member
        self._count(member, 1)
        self.empty_since = None
        return member

    def knows_former_member(self, member_id: str) -> bool:
        """True if ``member_id`` held partitions before a restart or failover and may rejoin."""
        return member_id in self.fences and not member_id.endswith(PREDECESSOR_SUFFIX)

    def replace_process(self, now: float, member_id: str) -> None:
        """A new process of static member ``member_id`` takes the place of the old one.

        The old process did not step out (then it would own nothing), so it
        may be cut off rather than dead, and fetch what it may own until its
        lease ends. That becomes a fence of its own, under the key
        ``member_id + PREDECESSOR_SUFFIX``: the new process starts with
        nothing, and its stop acknowledgements (it holds nothing to stop)
        cannot lift what only the old process's lease ends. Whoever is
        started on those partitions next, the new process included, waits
        for the fence. Successive takeovers merge into one fence, as long as
        the longest lease.
        """
        member = self.members[member_id]
        partitions = set(member.may_own)
        until = member.lease_end
        session = member.session_timeout
        key = member_id + PREDECESSOR_SUFFIX
        for former in (self.fences.pop(member_id, None), self.fences.pop(key, None)):
            if former is not None and former.until > now:  # an older process's fence
                partitions |= former.partitions
                until = max(until, former.until)
                session = max(session, former.session_timeout)
        if partitions and until > now:
            self.fences[key] = Fence(frozenset(partitions), until, session)
        member.may_own = set()

    def remove_member(self, now: float, member_id: str, *, stopped: bool) -> Member:
        """Remove a member; without a stop acknowledgement its partitions are fenced.

        ``stopped`` is True when the member stopped its fetchers itself
        (LeaveGroup is sent after stopping). Otherwise (session expiry, lost
        connection, expulsion) what it may own stays fenced until its lease
        ends. The group becomes EMPTY when its last member goes.
        """
        member = self.members.pop(member_id)
        self._count(member, -1)
        if not stopped and member.may_own and member.lease_end > now:
            self.fences[member_id] = Fence(
                frozenset(member.may_own), member.lease_end, member.session_timeout
            )
        if not self.members:
            self._became_empty(now)
        return member

    def heartbeat(
        self,
        now: float,
        member: Member,
        positions: Iterable[PartitionOffset],
        generation: int | None = None,
    ) -> None:
        """Record a fenced-in heartbeat (see ``fencing.check_heartbeat``) and its positions.

        ``generation`` is the one the heartbeat carries (default: the
        member's acknowledged one). Positions count only for partitions the
        member owns in the current generation once it has been started in it
        (it acknowledged, or its heartbeat carries that generation, which only
        a StartFetchers gives it), while the group is starting or stable; or,
        in a cooperative group, for partitions it may be fetching (it keeps
        fetching through a rebalance what does not move). They are committed
        later, in a batch (:meth:`drain_positions`). Positions dropped here
        are never lost: a member hands back everything it consumed when it
        is stopped. But a member started while the others still were, which
        consumed the last records of its partitions then, sends no further
        positions: dropping those left its lag above zero for good.
        """
        member.last_heartbeat = now
        started = member.generation if generation is None else max(member.generation, generation)
        if self.state in (GroupState.STARTING, GroupState.STABLE) and started == self.generation:
            owned: Collection[TopicPartition] = member.assignment
        elif self.cooperative:
            owned = member.may_own
        else:
            return
        for position in positions:
            if position.tp in owned:
                self.positions[position.tp] = position

    def expire_fences(self, now: float) -> None:
        """Forget fences that have ended."""
        for member_id in [m for m, f in self.fences.items() if f.until <= now]:
            del self.fences[member_id]

    # -- the rebalance -----------------------------------------------------------

    def begin_rebalance(self) -> list[Member]:
        """Enter STOPPING (from any state but EMPTY/DEAD); return the members to stop."""
        self.fire(Trigger.REBALANCE)
        return list(self.members.values())

    def member_stopped(
        self,
        member_id: str,
        positions: Iterable[PartitionOffset],
        partitions: Iterable[TopicPartition] | None = None,
    ) -> None:
        """A member acknowledged StopFetchers: keep its positions; it no longer owns them.

        ``partitions`` None: it stopped everything (eager); otherwise just those
        (cooperative), and it may still be fetching the rest.
        """
        member = self.members[member_id]
        stopped = set(member.may_own | member.assignment if partitions is None else partitions)
        for position in positions:
            if position.tp in stopped:
                self.positions[position.tp] = position
        member.may_own -= stopped
        fence = self.fences.pop(member_id, None)
        if fence is not None and member.may_own:
            self.fences[member_id] = Fence(
                fence.partitions & member.may_own, fence.until, fence.session_timeout
            )

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

    def begin_starting(self) -> None:
        """Enter STARTING: the new generation is durable and replayed."""
        self.fire(Trigger.PLANNED)

    def member_starting(
        self, member_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> None:
        """StartFetchers is about to be sent: from now on the member may own ``partitions``.

        None means its whole assignment; a staged start names the partitions
        of the StartFetchers being sent.
        """
        member = self.members[member_id]
        member.may_own |= member.assignment if partitions is None else set(partitions)

    def member_started(self, member_id: str) -> None:
        """The member acknowledged StartFetchers of the current generation."""
        member = self.members[member_id]
        member.generation = member.started_in = self.generation

    def complete_rebalance(self) -> None:
        """Every member acknowledged its start: the group is STABLE."""
        self.fire(Trigger.STARTED)

    # -- planning (the planner reads the group; the group applies its plans) -------------

    @property
    def planning(self) -> AssignmentPlanner:
        """The planner of this group's rebalances: it reads the group, changes nothing.

        A new, stateless :class:`AssignmentPlanner` on each use (the group
        holds none, so the two form no reference cycle).
        """
        view: GroupView = self
        return AssignmentPlanner(view)

    @property
    def assignor_votes(self) -> Mapping[str, int]:
        """Per assignor name, how many members accept it (a running count: O(1) to read)."""
        return self._assignor_votes

    @property
    def computable(self) -> Mapping[str, int]:
        """Per assignor name, how many members can compute it themselves (a running count)."""
        return self._computable

    def plan_assignment(
        self,
        now: float,
        *,
        partitions: Mapping[str, int],
        available: Mapping[str, Assignor],
        log_offsets: Callable[[TopicPartition], tuple[int, int]],
        computed: tuple[AssignmentInput, Assignment] | None = None,
        cooperative: bool | None = None,
        created_since: Collection[str] = (),
        racks: Mapping[str, Sequence[str]] | None = None,
    ) -> AssignmentPlan:
        """Enter ASSIGNING, forget the fences that ended, and plan the next generation.

        The plan is :meth:`AssignmentPlanner.plan` (see it for the arguments);
        nothing else changes until its record is replayed (after it is durable).
        """
        self.fire(Trigger.STOPPED)
        self.expire_fences(now)
        return self.planning.plan(
            now,
            partitions=partitions,
            available=available,
            log_offsets=log_offsets,
            computed=computed,
            cooperative=cooperative,
            created_since=created_since,
            racks=racks,
        )

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
                if record.tp not in self.offsets:
                    self._offset_order = None
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
            if self.offsets.pop(record.tp, None) is not None:
                self._offset_order = None
            self.positions.pop(record.tp, None)
        elif isinstance(record, GroupTombstone):
            self.offsets.clear()
            self._offset_order = None
            self.positions.clear()
            if self.state is not GroupState.DEAD:
                self.fire(Trigger.DELETED)

    # -- views ---------------------------------------------------------------------

    def summary(self) -> GroupSummary:
        """The group as ListGroups shows it."""
        return GroupSummary(self.group_id, self.state.value, self.generation, len(self.members))

    def describe(self, *, members: bool = True, offsets: bool = True) -> GroupDescription:
        """The group as DescribeGroup shows it (``members`` False: without its members;
        ``offsets`` False: without its committed offsets, for :meth:`offsets_after`)."""
        return GroupDescription(
            self.group_id,
            self.state.value,
            self.generation,
            self.assignor,
            list(self.describe_members()) if members else [],
            list(self.offsets_after(None)) if offsets else [],
        )

    def offsets_after(self, after: TopicPartition | None) -> Iterator[PartitionOffset]:
        """The committed offsets of the partitions after ``after`` (None: all), in order,
        made as they are iterated (iterate before the offsets change again): a page of a
        listing builds only what it shows. Sorting all 100,000 of a group and building
        each for every page made a listing of them quadratic (25 pages, 3 s)."""
        order = self._offset_order
        if order is None:
            order = self._offset_order = sorted(self.offsets)
        offsets = self.offsets
        for i in range(0 if after is None else bisect.bisect_right(order, after), len(order)):
            tp = order[i]
            rec = offsets.get(tp)
            if rec is not None:  # (forgotten since the order was made)
                yield PartitionOffset(tp.topic, tp.partition, rec.offset, rec.metadata)

    def describe_members(self, start: str = "") -> Iterator[MemberDescription]:
        """The members whose ids sort at or after ``start``, in id order, described one at
        a time: a page of a large group's description builds only the members it shows
        (each a dozen objects; describing 20,000 to send a few hundred cost a page of
        DescribeGroup O(group) in time and, freed at once, fragmented the heap)."""
        ids = sorted(self.members)
        for member_id in ids[bisect.bisect_left(ids, start) :]:
            m = self.members[member_id]
            yield MemberDescription(
                m.member_id,
                m.client_id,
                m.host,
                sorted(m.topics),
                round(m.session_timeout * 1000),
                round(m.rebalance_timeout * 1000),
                sorted(m.assignment),
                m.instance_id,
                m.protocol,
                m.generation,
                [] if m.may_own == m.assignment else sorted(m.may_own)[:MAX_DESCRIBED_OWNED],
                0 if m.may_own == m.assignment else max(0, len(m.may_own) - MAX_DESCRIBED_OWNED),
            )

    def expired_offsets(self, now: float, wall_ms: int, retention: float) -> list[TopicPartition]:
        """The partitions whose committed offsets have expired (Kafka's offsets.retention).

        Only an EMPTY group's offsets expire: once it has been empty for
        ``retention`` seconds (``now`` and ``empty_since`` on the coordinator's
        clock), each offset committed more than ``retention`` ago (its
        wall-clock ``commit_time_ms`` against ``wall_ms``; a standalone
        committer keeps the offsets it still commits) is gone.
        """
        if self.state is not GroupState.EMPTY or self.empty_since is None:
            return []
        if now - self.empty_since < retention:
            return []
        oldest = wall_ms - retention * 1000
        return sorted(tp for tp, rec in self.offsets.items() if rec.commit_time_ms <= oldest)

    def ownership(self) -> dict[TopicPartition, str]:
        """Who owns each partition in the current generation (for checks and tests)."""
        return {tp: m.member_id for m in self.members.values() for tp in m.assignment}
