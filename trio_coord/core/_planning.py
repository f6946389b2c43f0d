"""Assignment planning for a group: what to assign, to whom, from which offsets, and when.

An :class:`AssignmentPlanner` reads a group through :class:`GroupView` (what a
:class:`~trio_coord.core.group.Group` is: members, fences, committed offsets, the last
durable record) and turns it into a rebalance's decisions: the input of an assignor
(:class:`AssignmentInput`), checking what a client-side leader computed, which
partitions each member must give up, and the :class:`AssignmentPlan` of StartFetchers
(offsets, and stages that wait for fences to end). It changes nothing: its inputs are
the view and its arguments, its outputs these frozen dataclasses; the group applies
them (``Group.plan_assignment`` enters ASSIGNING, replay applies the record). Membership
(join, heartbeat, leave, fences) and replay stay in ``group.py``. Pure, like all of
``core``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..protocol.errors import (
    InconsistentAssignorError,
)
from ..protocol.messages import (
    NO_OFFSET,
    PartitionOffset,
    TopicPartition,
)
from ._member import Fence, Member
from .assignors import (
    Assignment,
    Assignor,
    GroupSpec,
    MemberSpec,
    collector_paused,
    validate_assignment,
)
from .records import (
    GroupRecord,
    MemberRecord,
    OffsetRecord,
)
from .states import GroupState
from .validation import PATTERN_PREFIX


@dataclass(frozen=True, slots=True)
class StartPlan:
    """One member's StartFetchers: its partitions with start offsets, not before a time.

    ``incremental``: the member keeps fetching the partitions it has, and
    starts the others from their offsets (a cooperative start, or a later
    stage of a staged one). ``partitions`` is everything the member owns once
    this StartFetchers is done, not only what it adds.
    """

    member_id: str
    partitions: list[PartitionOffset]
    not_before: float
    incremental: bool = False
    unchanged: bool = False
    """Cooperative: the member, started in the current generation, keeps exactly what it
    fetches and hears only of the new generation (``partitions`` is empty: no offsets to
    look up or send)."""


@dataclass(frozen=True, slots=True)
class AssignmentInput:
    """What the next assignment is computed from, and by whom.

    ``leader`` is None when the broker has the assignor; otherwise the
    member (one that can compute ``assignor`` itself) to ask.
    """

    assignor: str
    spec: GroupSpec
    leader: str | None = None


@dataclass(frozen=True, slots=True)
class AssignmentPlan:
    """The outcome of the assign phase: the record to persist, then the starts to send.

    ``starts`` holds, per member (in member-id order), its StartFetchers in
    the order to send them, by ``not_before``: the first starts what is free
    at once; each later one (incremental) adds the partitions a fence kept
    until then. A member whose partitions are all free has exactly one.
    """

    record: GroupRecord
    starts: list[StartPlan]

    def stages(self) -> dict[str, list[StartPlan]]:
        """``starts`` grouped by member: each member's StartFetchers, in order."""
        staged: dict[str, list[StartPlan]] = {}
        for start in self.starts:
            staged.setdefault(start.member_id, []).append(start)
        return staged


class GroupView(Protocol):
    """What an :class:`AssignmentPlanner` reads of a group; it writes none of it.

    :class:`~trio_coord.core.group.Group` provides it; a test may hand in any
    object with these attributes.
    """

    @property
    def group_id(self) -> str:
        """The group's id."""
        ...

    @property
    def state(self) -> GroupState:
        """The group's state."""
        ...

    @property
    def generation(self) -> int:
        """The current generation."""
        ...

    @property
    def members(self) -> Mapping[str, Member]:
        """The live members, by member id."""
        ...

    @property
    def offsets(self) -> Mapping[TopicPartition, OffsetRecord]:
        """The committed offsets."""
        ...

    @property
    def fences(self) -> Mapping[str, Fence]:
        """Per former member (or former process), what it may still fetch, and until when;
        fences that ended by the ``now`` a planner is given count as gone."""
        ...

    @property
    def record(self) -> GroupRecord | None:
        """The last generation record replayed (what the store holds)."""
        ...

    @property
    def cooperative(self) -> bool:
        """True if every member asked for cooperative rebalancing."""
        ...

    @property
    def assignor_votes(self) -> Mapping[str, int]:
        """Per assignor name, how many members accept it."""
        ...

    @property
    def computable(self) -> Mapping[str, int]:
        """Per assignor name, how many members can compute it themselves."""
        ...


class AssignmentPlanner:
    """Plans a group's rebalances from a read-only :class:`GroupView`: see the module doc.

    It keeps no state of its own besides the view, so making one is free:
    ``Group.planning`` makes one on each use (and holds none, so a group and
    its planner form no reference cycle).
    """

    __slots__ = ("_group",)

    def __init__(self, group: GroupView) -> None:
        self._group = group

    def assignment_input(
        self,
        *,
        partitions: Mapping[str, int],
        available: Mapping[str, Assignor],
        cooperative: bool | None = None,
        racks: Mapping[str, Sequence[str]] | None = None,
    ) -> AssignmentInput:
        """The assignor to use, its input, and who computes it (the broker, or a leader).

        The assignor is the first of the members' common preferences that the
        broker has (``available``) or that some member can compute itself; in
        the latter case the leader is the first such member in member-id
        order. Each member's ``owned`` is what it owned in the current
        generation; in a cooperative rebalance, what it may still be fetching
        (a cooperative plan is made before anything stops). ``cooperative``
        None means the group's ``cooperative``; the broker passes False for a
        rebalance it runs eagerly in a cooperative group (an offset reset).
        ``racks`` gives each topic's partitions' racks (:class:`GroupSpec`).
        """
        group = self._group
        members = sorted(group.members.values(), key=lambda m: m.member_id)
        # choose_assignor over every member's list, from the group's running counts:
        computable = set(available).union(n for n, count in group.computable.items() if count)
        votes = group.assignor_votes
        common = [
            n for n in (members[0].assignors if members else ()) if votes.get(n, 0) == len(members)
        ]
        name = next((n for n in common if n in computable), None)
        if name is None:
            # A join is refused unless the group would have one; but the only member
            # that could compute the common assignor may leave, and the others wait.
            raise InconsistentAssignorError(
                f"no member of group {group.group_id} can compute its members' common "
                f"assignor ({', '.join(common) or 'none'}), and the broker has none of them "
                f"({', '.join(sorted(available))}): its members wait without partitions "
                "until a member that can joins, or until they join again naming an "
                "assignor the broker has"
            )
        if cooperative is None:
            cooperative = group.cooperative
        spec = GroupSpec(
            members={
                m.member_id: MemberSpec(
                    m.member_id,
                    m.topics,
                    frozenset(m.may_own if cooperative else m.assignment),
                    m.user_data,
                    m.rack,
                )
                for m in members
            },
            partitions={t: n for t, n in partitions.items() if n > 0},
            racks={t: racks[t] for t in partitions if t in racks} if racks else {},
        )
        leader = None
        if name not in available:
            leader = next(m.member_id for m in members if name in m.client_assignors)
        return AssignmentInput(name, spec, leader)

    def compute_assignment(
        self, input: AssignmentInput, available: Mapping[str, Assignor]
    ) -> Assignment:
        """Run a broker-side assignor on ``input`` and check what it returned."""
        with collector_paused():  # (see the assignors module's docstring)
            return self.check_assignment(input, available[input.assignor].assign(input.spec))

    def check_assignment(
        self, input: AssignmentInput, assignment: object, *, complete: bool = True
    ) -> Assignment:
        """Return ``assignment`` (from an assignor or a leader), sorted, or raise ValueError.

        ``complete=False`` accepts partitions given to nobody (a Kafka leader's
        cooperative assignor holds back what it revokes for one round);
        exclusivity and subscriptions are checked all the same.
        """
        try:
            validate_assignment(input.spec, assignment, complete=complete)  # type: ignore[arg-type]
        except ValueError as exc:
            by = f" (computed by leader {input.leader})" if input.leader else ""
            raise ValueError(
                f"assignor {input.assignor!r}{by} returned a bad assignment: {exc}"
            ) from None
        assert isinstance(assignment, Mapping)
        return {m: sorted(assignment.get(m, [])) for m in sorted(input.spec.members)}

    def revocations(self, assignment: Assignment) -> dict[str, list[TopicPartition]]:
        """Cooperative: per member, what it may be fetching that it must give up."""
        revoke = {}
        for member in self._group.members.values():
            gone = member.may_own.difference(assignment.get(member.member_id, []))
            if gone:
                revoke[member.member_id] = sorted(gone)
        return revoke

    def plan(
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
        """The next generation: its record and its starts (``Group.plan_assignment`` enters
        ASSIGNING first, then asks this).

        ``partitions`` maps each existing topic to its partition count;
        ``log_offsets`` gives a partition's (log start, log end) for members
        whose group has no committed offset there. ``computed`` is an
        assignment made already (a cooperative plan, or a leader's);
        otherwise a broker-side assignor computes it now. In a cooperative
        rebalance (``cooperative``, default the group's) the starts
        are incremental, and only the partitions a member does not have yet
        wait for fences. A partition under a fence waits for that fence
        only: each member is started in stages (:class:`AssignmentPlan`).
        ``created_since`` names topics that a ``re:`` entry the group had
        already subscribed to (in its last generation) matches only now: they
        were created since, and all their partitions count as new
        (:meth:`_start_offset`). Fences that end by ``now`` count as gone. The
        group changes only when the returned record is replayed (after it is
        durable).
        """
        group = self._group
        members = sorted(group.members.values(), key=lambda m: m.member_id)
        if computed is None:
            input = self.assignment_input(
                partitions=partitions, available=available, cooperative=cooperative, racks=racks
            )
            if input.leader is not None:
                raise InconsistentAssignorError(
                    f"assignor {input.assignor!r} runs on the group's leader, not the broker"
                )
            assignment = self.compute_assignment(input, available)
        else:
            input, assignment = computed
        record = self._next_record(
            now,
            group.generation + 1,
            input.assignor,
            members,
            assignment,
            partitions,
            created_since,
        )
        starts = []
        if cooperative is None:
            cooperative = group.cooperative
        fenced = self._fence_ends(now)
        for m in members:
            mine = assignment.get(m.member_id, [])
            if (
                cooperative
                and m.started_in == group.generation  # (it fetches its assignment: _member)
                and m.may_own == m.assignment
                and m.assignment.issuperset(mine)
            ):
                if len(mine) == len(m.assignment):  # (the same partitions, and still fetched)
                    starts.append(StartPlan(m.member_id, [], now, True, unchanged=True))
                    continue
            owned = sorted(mine)
            offsets = [
                self._start_offset(tp, m.offset_reset, log_offsets, record.topics) for tp in owned
            ]
            # When each partition is free for this member: at once if it fetches it
            # already (cooperative), else when the last fence over it ends.
            free_at = [
                now if cooperative and tp in m.may_own else fenced.get(tp, now) for tp in owned
            ]
            times = sorted(set(free_at)) or [now]
            for stage, at in enumerate(times):
                starts.append(
                    StartPlan(
                        m.member_id,
                        [o for o, t in zip(offsets, free_at, strict=True) if t <= at],
                        at,
                        cooperative or stage > 0,
                    )
                )
        return AssignmentPlan(record, starts)

    def unchanged_by(
        self,
        now: float,
        assignment: Assignment,
        *,
        assignor: str,
        partitions: Mapping[str, int],
        created_since: Collection[str] = (),
    ) -> bool:
        """True if a rebalance to ``assignment`` would change nothing, so none is needed.

        The check of the coordinator-driven design before an eager rebalance
        (stop fetchers only if the new ownership differs from the current
        one): the group is STABLE, every member was started in the current
        generation and fetches what it was told, and the next generation's
        record would be the current one but for its number (same members,
        subscriptions, timeouts, assignor, partitions per member, fences and
        topics; fences that ended by ``now`` count as gone). Then the
        coordinator bumps no generation and stops no one.
        """
        if not self.may_be_unchanged():
            return False
        group = self._group
        members = sorted(group.members.values(), key=lambda m: m.member_id)
        record = self._next_record(
            now, group.generation, assignor, members, assignment, partitions, created_since
        )
        return record == group.record

    def may_be_unchanged(self) -> bool:
        """The cheap half of :meth:`unchanged_by` (O(members), no assignor run): False if a
        rebalance certainly changes something (not STABLE, a member not started in the
        current generation, members or subscriptions other than the current record's)."""
        group = self._group
        record = group.record
        if group.state is not GroupState.STABLE or record is None:
            return False
        if len(record.members) != len(group.members):
            return False
        for persisted in record.members:
            m = group.members.get(persisted.member_id)
            if (
                m is None
                or m.started_in != group.generation
                or m.may_own != m.assignment
                or len(persisted.topics) != len(m.topics)
                or not m.topics.issuperset(persisted.topics)
            ):
                return False
        return True

    def _next_record(
        self,
        now: float,
        generation: int,
        assignor: str,
        members: list[Member],
        assignment: Assignment,
        partitions: Mapping[str, int],
        created_since: Collection[str],
    ) -> GroupRecord:
        """The group record of a generation with ``members`` owning ``assignment``, listing
        the fences still on at ``now``."""
        group = self._group
        return GroupRecord(
            group.group_id,
            generation,
            assignor,
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
                for member_id, fence in sorted(group.fences.items())
                if fence.until > now
            ],
            self._topics_seen(members, partitions, created_since),
        )

    def _fence_ends(self, now: float) -> dict[TopicPartition, float]:
        """Per fenced partition, when the last fence over it ends (only those after ``now``)."""
        ends: dict[TopicPartition, float] = {}
        for fence in self._group.fences.values():
            if fence.until > now:
                for tp in fence.partitions:
                    if fence.until > ends.get(tp, now):
                        ends[tp] = fence.until
        return ends

    def _topics_seen(
        self,
        members: Iterable[Member],
        partitions: Mapping[str, int],
        created_since: Collection[str],
    ) -> dict[str, int]:
        """Per topic the group subscribes to, how many partitions it had when it subscribed.

        A topic keeps the count it was first seen with (0 if it did not
        exist yet, or if a pattern already subscribed matched it only once it
        was created: ``created_since``); so a partition above it stays "new"
        until the group commits an offset for it, whatever happens in
        between (a crash of its first owner, a restart). ``re:`` entries are
        kept too (with 0), to tell later which patterns came first. A topic
        the group no longer subscribes to keeps its entry (a resubscription
        is not a first subscription); a subscribed topic that is gone is
        reset to 0, so that a topic created again under its name counts as
        created after the subscription.
        """
        last = self._group.record
        seen = dict(last.topics) if last is not None else {}
        subscribed = {t for m in members for t in m.topics}
        for entry in subscribed:
            count = partitions.get(entry)
            if entry.startswith(PATTERN_PREFIX):
                seen.setdefault(entry, 0)
            elif count is None:
                seen[entry] = 0  # not there (yet, or any more): all its partitions are new
            elif entry in created_since:
                seen.setdefault(entry, 0)
            else:
                seen.setdefault(entry, count)
        return seen

    def _start_offset(
        self,
        tp: TopicPartition,
        reset: str,
        log_offsets: Callable[[TopicPartition], tuple[int, int]],
        seen: Mapping[str, int] | None = None,
    ) -> PartitionOffset:
        """Where a member starts ``tp``: its committed offset, else the reset policy's.

        A partition with no committed offset that was created after the group
        subscribed to its topic starts at its log start, whatever the policy:
        its records were written for this group, and ``latest`` would skip
        those written before the partition's first assignment (seed 000's
        rule; the Spark source does the same). It is "new" while the group
        has no committed offset for it; ``seen`` is the generation's
        ``GroupRecord.topics`` (default: the last durable one's).
        """
        committed = self._group.offsets.get(tp)
        if committed is not None:
            return PartitionOffset(tp.topic, tp.partition, committed.offset, committed.metadata)
        if seen is None:
            last = self._group.record
            seen = last.topics if last is not None else {}
        first = seen.get(tp.topic)
        if first is not None and tp.partition >= first:
            reset = "earliest"  # a partition created since the group subscribed
        if reset == "none":
            return PartitionOffset(tp.topic, tp.partition, NO_OFFSET)
        start, end = log_offsets(tp)
        return PartitionOffset(tp.topic, tp.partition, start if reset == "earliest" else end)

    def _fenced_until(self, partitions: Iterable[TopicPartition], now: float) -> float:
        wanted = set(partitions)
        until = now
        for fence in self._group.fences.values():
            if fence.until > until and not wanted.isdisjoint(fence.partitions):
                until = fence.until
        return until

    def resume_plan(
        self, now: float, member_id: str, log_offsets: Callable[[TopicPartition], tuple[int, int]]
    ) -> StartPlan:
        """A static member came back: its own partitions again, in the current generation.

        Incremental, from the committed offsets: if it is the same process
        that merely reconnected, it keeps fetching what it still has. Not
        before the fences over them end (a former process's lease, after
        ``Group.replace_process``).
        """
        member = self._group.members[member_id]
        return StartPlan(
            member_id,
            [
                self._start_offset(tp, member.offset_reset, log_offsets)
                for tp in sorted(member.assignment)
            ],
            self._fenced_until(member.assignment - member.may_own, now),
            True,
        )
