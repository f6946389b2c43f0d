"""The pure core's side of cooperative rebalancing, static members and leader-side assignors.

Without Trio: a cooperative plan is made from what members may be fetching,
revokes only what moves, and starts incrementally (only new partitions wait
for fences); positions and commits of partitions a member keeps fetching
count through the rebalance; a name only a member can compute makes that
member the leader; a static member is found by its instance id.
"""

from __future__ import annotations

import functools

import _members
import pytest

from trio_coord.core.assignors import ASSIGNORS
from trio_coord.core.fencing import check_commit
from trio_coord.core.group import Group, GroupLimits, GroupState
from trio_coord.core.records import GroupRecord, MemberRecord
from trio_coord.protocol.errors import (
    IllegalGenerationError,
    InconsistentAssignorError,
    InvalidRequestError,
)
from trio_coord.protocol.messages import PartitionOffset
from trio_coord.protocol.messages import TopicPartition as TP

LIMITS = GroupLimits(min_session_timeout=1.0, max_session_timeout=60.0, max_group_size=10)
PARTITIONS = {"t": 6}


def t(*ps: int) -> list[TP]:
    return [TP("t", p) for p in ps]


# A member of these tests is a cooperative ``uniform`` one unless a test says otherwise.
join = functools.partial(
    _members.join, limits=LIMITS, assignors=("uniform",), protocol="cooperative"
)


def stable(group: Group, now: float) -> None:
    """Run a whole rebalance the way the broker does for a cooperative group."""
    group.begin_rebalance()
    computed = (
        (inp := group.planning.assignment_input(partitions=PARTITIONS, available=ASSIGNORS)),
        group.planning.compute_assignment(inp, ASSIGNORS),
    )
    for member_id, tps in group.planning.revocations(computed[1]).items():
        group.member_stopped(member_id, [], tps)
    plan = group.plan_assignment(
        now,
        partitions=PARTITIONS,
        available=ASSIGNORS,
        log_offsets=lambda tp: (0, 0),
        computed=computed,
    )
    group.replay(plan.record, now=now)
    group.begin_starting()
    for start in plan.starts:
        group.member_starting(start.member_id)
        group.member_started(start.member_id)
    group.complete_rebalance()


def test_a_cooperative_plan_revokes_only_what_moves_and_starts_incrementally():
    group = Group("g", now=0.0)
    join(group, "a")
    stable(group, 0.0)
    assert group.members["a"].may_own == set(t(0, 1, 2, 3, 4, 5))
    join(group, "b", 1.0)
    assert group.cooperative
    group.begin_rebalance()
    inp = group.planning.assignment_input(partitions=PARTITIONS, available=ASSIGNORS)
    assert inp.spec.members["a"].owned == frozenset(t(0, 1, 2, 3, 4, 5))  # what it fetches
    assignment = group.planning.compute_assignment(inp, ASSIGNORS)
    revoke = group.planning.revocations(assignment)
    assert list(revoke) == ["a"] and revoke["a"] == assignment["b"]
    assert len(revoke["a"]) == 3
    group.member_stopped("a", [PartitionOffset("t", revoke["a"][0].partition, 7)], revoke["a"])
    assert group.members["a"].may_own == set(assignment["a"])  # still fetching the rest
    assert group.positions[revoke["a"][0]].offset == 7
    plan = group.plan_assignment(
        2.0,
        partitions=PARTITIONS,
        available=ASSIGNORS,
        log_offsets=lambda tp: (0, 0),
        computed=(inp, assignment),
    )
    assert all(s.incremental for s in plan.starts)
    assert {s.member_id: [p.tp for p in s.partitions] for s in plan.starts} == assignment


def plan_now(group: Group, now: float):
    """A cooperative plan for the members there now (after the stop phase)."""
    group.begin_rebalance()
    inp = group.planning.assignment_input(partitions=PARTITIONS, available=ASSIGNORS)
    assignment = group.planning.compute_assignment(inp, ASSIGNORS)
    for member_id, tps in group.planning.revocations(assignment).items():
        group.member_stopped(member_id, [], tps)
    return group.plan_assignment(
        now,
        partitions=PARTITIONS,
        available=ASSIGNORS,
        log_offsets=lambda tp: (0, 0),
        computed=(inp, assignment),
    )


def starts_of(plan) -> dict[str, tuple[bool, list[TP]]]:
    return {s.member_id: (s.unchanged, [p.tp for p in s.partitions]) for s in plan.starts}


def test_a_member_whose_start_never_reached_it_hears_its_partitions_not_unchanged():
    # A coordinator took over (seen in a failover test): "a" lost its partitions when its
    # lease ran out, and rejoins while the load's fence (a bound) still says it may fetch
    # them. It is planned into a generation whose start never reaches it: the rebalance
    # restarts after the generation is durable (another member rejoined). The next plan
    # must hand it its partitions; "unchanged" would leave it STABLE and idle.
    group = Group("g", now=100.0)
    record = GroupRecord(
        "g",
        4,
        "uniform",
        [
            MemberRecord("a", "a", "h", ["t"], 10_000, 5_000, t(0, 1, 2)),
            MemberRecord("b", "b", "h", ["t"], 10_000, 5_000, t(3, 4, 5)),
        ],
    )
    group.replay(record, now=100.0, loading=True)
    join(group, "a", 101.0)
    join(group, "b", 101.0)
    assert group.members["a"].may_own == set(t(0, 1, 2))  # the fence's bound, not a fact
    planned = plan_now(group, 101.0)
    group.replay(planned.record, now=101.0)  # durable; then the rebalance restarts:
    join(group, "b", 101.5)  # no start of generation 5 was sent
    assert group.members["a"].assignment == group.members["a"].may_own
    plan = plan_now(group, 102.0)
    assert starts_of(plan)["a"] == (False, t(0, 1, 2))
    assert all(s.incremental for s in plan.starts)


@pytest.mark.parametrize(
    "says", ["nothing", "less", "all", "all twice", "more", "another's", "unknown topic"]
)
def test_a_member_that_rejoins_hears_its_partitions_unless_it_says_it_fetches_them(says):
    # Rejoining (a new connection), a member may have dropped what it fetched (its lease
    # ran out first): it hears its partitions again, unless its JoinGroup says it still
    # fetches exactly them. One that did not rejoin is told only the new generation. What
    # a member says is only ever compared with its own assignment: a lie (more, another
    # member's, a topic nobody has, 100,000 of them) costs nobody else anything, and at
    # worst leaves its own partitions unread, which it could do anyway by not fetching.
    group = Group("g", now=0.0)
    join(group, "a")
    join(group, "b")
    stable(group, 0.0)
    owned = {m: sorted(group.members[m].assignment) for m in "ab"}
    nowhere = [TP("nowhere", p) for p in range(100_000)]
    said = {
        "nothing": None,
        "less": owned["a"][1:],
        "all": owned["a"],
        "all twice": owned["a"] * 2,
        "more": owned["a"] + owned["b"][:1],
        "another's": owned["b"],
        "unknown topic": nowhere,
    }[says]
    join(group, "a", 1.0, owned=said)  # the same member id, while it is still in the group
    plan = plan_now(group, 1.0)
    a = (True, []) if says in ("all", "all twice") else (False, owned["a"])
    assert starts_of(plan) == {"a": a, "b": (True, [])}


def test_an_eager_rebalance_is_not_skipped_for_a_member_that_rejoined():
    group = Group("g", now=0.0)
    join(group, "a", protocol="eager", assignors=("range",))
    group.begin_rebalance()
    group.member_stopped("a", [])
    plan = group.plan_assignment(
        0.0, partitions=PARTITIONS, available=ASSIGNORS, log_offsets=lambda tp: (0, 0)
    )
    group.replay(plan.record, now=0.0)
    group.begin_starting()
    group.member_starting("a")
    group.member_started("a")
    group.complete_rebalance()
    assert group.planning.may_be_unchanged()  # started in this generation: a no-op
    fetched = sorted(group.members["a"].assignment)
    join(group, "a", 1.0, protocol="eager", assignors=("range",), owned=fetched)
    assert group.planning.may_be_unchanged()  # it says it fetches all of it: still a no-op
    join(group, "a", 2.0, protocol="eager", assignors=("range",), owned=[])
    assert not group.planning.may_be_unchanged()  # it holds nothing now


def test_only_new_partitions_wait_for_a_departed_owners_lease():
    group = Group("g", now=0.0)
    for m in "abc":
        join(group, m)
    stable(group, 0.0)
    victim = sorted(group.members["c"].may_own)
    group.remove_member(3.0, "c", stopped=False)  # crashed: fenced until 0 + 10
    group.begin_rebalance()
    inp = group.planning.assignment_input(partitions=PARTITIONS, available=ASSIGNORS)
    assignment = group.planning.compute_assignment(inp, ASSIGNORS)
    assert group.planning.revocations(assignment) == {}  # nobody gives anything up
    plan = group.plan_assignment(
        3.0,
        partitions=PARTITIONS,
        available=ASSIGNORS,
        log_offsets=lambda tp: (0, 0),
        computed=(inp, assignment),
    )
    for start in plan.starts:
        gets_victims = not set(victim).isdisjoint(p.tp for p in start.partitions)
        assert start.not_before == (10.0 if gets_victims else 3.0)


def test_positions_and_commits_of_kept_partitions_count_through_the_rebalance():
    group = Group("g", now=0.0)
    join(group, "a")
    stable(group, 0.0)
    generation = group.generation
    join(group, "b", 1.0)
    group.begin_rebalance()
    a = group.members["a"]
    group.heartbeat(1.5, a, [PartitionOffset("t", 0, 11)])
    assert group.positions[TP("t", 0)].offset == 11
    check_commit(
        group,
        "a",
        generation,
        [PartitionOffset("t", 0, 12)],
        allow_regression=False,
        partitions=PARTITIONS,
    )
    a.may_own.discard(TP("t", 0))  # given up (its stop was acknowledged)
    with pytest.raises(IllegalGenerationError):
        check_commit(
            group,
            "a",
            generation - 1,
            [PartitionOffset("t", 1, 12)],
            allow_regression=False,
            partitions=PARTITIONS,
        )
    assert group.state is GroupState.STOPPING


def test_an_eager_member_makes_the_group_eager():
    group = Group("g", now=0.0)
    join(group, "a")
    join(group, "b", protocol="eager")
    assert not group.cooperative
    with pytest.raises(InvalidRequestError, match="rebalance protocol 'lazy'"):
        join(group, "c", protocol="lazy")


def test_an_assignor_only_a_member_has_makes_it_the_leader():
    group = Group("g", now=0.0)
    join(group, "b", assignors=("mine", "uniform"), client_assignors=("mine",))
    join(group, "a", assignors=("mine", "uniform"))
    join(group, "c", assignors=("mine", "uniform"), client_assignors=("mine",))
    inp = group.planning.assignment_input(partitions=PARTITIONS, available=ASSIGNORS)
    assert (inp.assignor, inp.leader) == ("mine", "b")  # the first that can compute it
    with pytest.raises(InconsistentAssignorError):
        join(group, "d", assignors=("theirs",))
    with pytest.raises(ValueError, match=r"assignor 'mine' \(computed by leader b\)"):
        group.planning.check_assignment(inp, {"a": t(0, 1, 2, 3, 4)})  # t-5 assigned to no one


def test_a_static_member_is_found_by_its_instance_id():
    group = Group("g", now=0.0)
    join(group, "a", instance_id="host-1")
    join(group, "b")
    assert group.member_by_instance("host-1") is group.members["a"]
    assert group.member_by_instance("host-2") is None
    assert group.member_by_instance("") is None


def test_user_data_is_bounded():
    group = Group("g", now=0.0)
    with pytest.raises(InvalidRequestError, match="more than the 65536 a member may bring"):
        group.validate_join(
            member_id="",
            topics=["t"],
            session_timeout=10.0,
            rebalance_timeout=5.0,
            assignors=["uniform"],
            offset_reset="earliest",
            limits=LIMITS,
            available=ASSIGNORS,
            user_data=b"x" * (64 * 1024 + 1),
        )
