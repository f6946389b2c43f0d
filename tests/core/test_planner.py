"""The assignment planner on its own: a read-only view of a group in, decisions out.

No ``Group`` here: the planner is driven through a hand-made view (the
:class:`GroupView` protocol), which shows what it depends on and that it
changes none of it. What a user relies on: new owners start from the group's
committed offsets (else the reset policy), a partition a departed member may
still fetch waits for its fence while the rest start at once, a name only a
member computes makes that member the leader, and a leader's bad assignment
is refused with a message naming it.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field

import pytest
from _members import add_member

from trio_coord.core.assignors import ASSIGNORS
from trio_coord.core.group import AssignmentPlanner, Fence, Group, GroupState, Member, StartPlan
from trio_coord.core.records import GroupRecord, OffsetRecord
from trio_coord.protocol.messages import PartitionOffset
from trio_coord.protocol.messages import TopicPartition as TP


@dataclass(frozen=True)
class View:
    """A group as the planner sees it, made by hand (frozen: nothing may be rebound)."""

    members: dict[str, Member]
    group_id: str = "g"
    state: GroupState = GroupState.ASSIGNING
    generation: int = 4
    offsets: dict[TP, OffsetRecord] = field(default_factory=dict)
    fences: dict[str, Fence] = field(default_factory=dict)
    record: GroupRecord | None = None
    cooperative: bool = False
    assignor_votes: Counter[str] = field(default_factory=Counter)
    computable: Counter[str] = field(default_factory=Counter)


def member(member_id: str, *, assignors=("range",), client_assignors=(), reset="latest") -> Member:
    return Member(
        member_id=member_id,
        client_id=member_id,
        host="h",
        topics=frozenset({"t"}),
        session_timeout=10.0,
        rebalance_timeout=5.0,
        assignors=tuple(assignors),
        auto_commit=True,
        offset_reset=reset,
        last_heartbeat=0.0,
        generation=4,
        client_assignors=tuple(client_assignors),
    )


def view(*members: Member, **extra) -> View:
    votes = Counter(n for m in members for n in set(m.assignors))
    computable = Counter(n for m in members for n in set(m.client_assignors))
    return View(
        {m.member_id: m for m in members},
        assignor_votes=votes,
        computable=computable,
        **extra,
    )


def log_offsets(tp: TP) -> tuple[int, int]:
    return 0, 100  # (log start, log end) of every partition


def test_a_plan_starts_from_committed_offsets_and_waits_only_for_fenced_partitions():
    group = view(
        member("a"),
        member("b"),
        offsets={TP("t", 0): OffsetRecord("g", "t", 0, 7, "m")},
        fences={"gone": Fence(frozenset({TP("t", 3)}), until=20.0, session_timeout=10.0)},
    )
    before = copy.deepcopy(group)
    plan = AssignmentPlanner(group).plan(
        10.0, partitions={"t": 4}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert plan.record.generation == 5
    assert plan.record.assignor == "range"
    assert [(m.member_id, m.partitions) for m in plan.record.members] == [
        ("a", [TP("t", 0), TP("t", 1)]),
        ("b", [TP("t", 2), TP("t", 3)]),
    ]
    assert [d.member_id for d in plan.record.departed] == ["gone"]  # still fenced
    assert plan.stages() == {
        # t-0 from the committed offset (and its metadata); t-1 by "latest", the log end.
        "a": [
            StartPlan("a", [PartitionOffset("t", 0, 7, "m"), PartitionOffset("t", 1, 100)], 10.0)
        ],
        # t-2 at once; t-3 only once the departed member's fence has ended.
        "b": [
            StartPlan("b", [PartitionOffset("t", 2, 100)], 10.0),
            StartPlan(
                "b", [PartitionOffset("t", 2, 100), PartitionOffset("t", 3, 100)], 20.0, True
            ),
        ],
    }
    assert group == before  # the planner changed nothing it was shown


def test_a_fence_that_has_ended_holds_nothing_back_and_leaves_the_record():
    group = view(
        member("a"),
        fences={"gone": Fence(frozenset({TP("t", 1)}), until=20.0, session_timeout=10.0)},
    )
    plan = AssignmentPlanner(group).plan(
        20.0, partitions={"t": 2}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert plan.record.departed == []
    assert plan.starts == [
        StartPlan("a", [PartitionOffset("t", 0, 100), PartitionOffset("t", 1, 100)], 20.0)
    ]
    assert "gone" in group.fences  # forgetting it is the group's business, not the planner's


def test_an_assignor_only_a_member_can_compute_makes_it_the_leader():
    group = view(
        member("a", assignors=("mine", "range")),
        member("b", assignors=("mine", "range"), client_assignors=("mine",)),
    )
    planner = AssignmentPlanner(group)
    given = planner.assignment_input(partitions={"t": 2}, available=ASSIGNORS)
    assert (given.assignor, given.leader) == ("mine", "b")
    assert sorted(given.spec.members) == ["a", "b"]
    # With no member able to compute it, the next common name runs on the broker.
    alone = AssignmentPlanner(view(member("a", assignors=("mine", "range"))))
    given = alone.assignment_input(partitions={"t": 2}, available=ASSIGNORS)
    assert (given.assignor, given.leader) == ("range", None)


def test_a_leaders_assignment_that_gives_a_partition_twice_is_refused_naming_the_leader():
    group = view(
        member("a", assignors=("mine",)),
        member("b", assignors=("mine",), client_assignors=("mine",)),
    )
    planner = AssignmentPlanner(group)
    given = planner.assignment_input(partitions={"t": 2}, available=ASSIGNORS)
    with pytest.raises(ValueError, match=r"'mine' \(computed by leader b\)"):
        planner.check_assignment(given, {"a": [TP("t", 0)], "b": [TP("t", 0), TP("t", 1)]})
    ok = planner.check_assignment(given, {"b": [TP("t", 1), TP("t", 0)]})
    assert ok == {"a": [], "b": [TP("t", 0), TP("t", 1)]}


def test_a_group_enters_assigning_and_forgets_ended_fences_then_asks_its_planner():
    group = Group("g", now=0.0)
    add_member(group, "a", offset_reset="latest")
    group.fences["old"] = Fence(frozenset({TP("t", 1)}), until=5.0, session_timeout=10.0)
    group.begin_rebalance()
    args = {"partitions": {"t": 2}, "available": ASSIGNORS, "log_offsets": log_offsets}
    expected = group.planning.plan(6.0, **args)
    assert (
        group.state is GroupState.STOPPING and "old" in group.fences
    )  # (planning changed nothing)
    assert group.plan_assignment(6.0, **args) == expected
    assert group.state is GroupState.ASSIGNING
    assert "old" not in group.fences
