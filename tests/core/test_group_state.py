"""The pure group state machine: states, admission, a full rebalance, records and fences.

Everything here runs without Trio: a fake ``now`` goes in, decisions and
records come out, and the tests assert them exactly.
"""

from __future__ import annotations

import itertools
from typing import Any

import _members
import pytest

from trio_coord.core.assignors import ASSIGNORS
from trio_coord.core.group import (
    PREDECESSOR_SUFFIX,
    TRANSITIONS,
    Fence,
    Group,
    GroupLimits,
    GroupState,
    IllegalTransitionError,
    Member,
    StartPlan,
)
from trio_coord.core.records import (
    GroupRecord,
    GroupTombstone,
    MemberRecord,
    OffsetRecord,
    TopicRecord,
    decode_record,
    encode_record,
)
from trio_coord.protocol.errors import (
    GroupMaxSizeReachedError,
    InconsistentAssignorError,
    InvalidRebalanceTimeoutError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
)
from trio_coord.protocol.messages import NO_OFFSET, PartitionOffset
from trio_coord.protocol.messages import TopicPartition as TP

S = GroupState
LIMITS = GroupLimits(min_session_timeout=2.0, max_session_timeout=60.0, max_group_size=10)


def join(group: Group, member_id: str, now: float, **values: Any) -> Member:
    """Join validated, offering ``range`` and ``roundrobin``; client and host named after it."""
    return _members.join(
        group,
        member_id,
        now,
        limits=LIMITS,
        **{
            "client_id": f"client-{member_id}",
            "host": f"host-{member_id}",
            "assignors": ("range", "roundrobin"),
            **values,
        },
    )


def validate(group: Group, **overrides) -> None:
    args = {
        "member_id": "",
        "topics": ["t"],
        "session_timeout": 10.0,
        "rebalance_timeout": 5.0,
        "assignors": ["range"],
        "offset_reset": "earliest",
        "limits": LIMITS,
        "available": ASSIGNORS,
    }
    args.update(overrides)
    group.validate_join(**args)


LOG = {
    TP("t", 0): (0, 100),
    TP("t", 1): (10, 110),
    TP("t", 2): (20, 120),
    TP("u", 0): (30, 130),
    TP("u", 1): (40, 140),
    TP("v", 0): (50, 150),
}


def log_offsets(tp: TP) -> tuple[int, int]:
    return LOG[tp]


def stop_all(group: Group, positions: dict[str, list[PartitionOffset]] | None = None):
    for member in group.begin_rebalance():
        group.member_stopped(member.member_id, (positions or {}).get(member.member_id, []))


def start_all(group: Group, plan) -> None:
    group.begin_starting()
    for start in plan.starts:
        group.member_starting(start.member_id)
        group.member_started(start.member_id)
    group.complete_rebalance()


def rebalance(group: Group, now: float, partitions: dict[str, int], positions=None):
    """Run the whole protocol as the broker shell does; return (offset records, plan)."""
    stop_all(group, positions)
    offsets = group.drain_positions(round(now * 1000))
    for record in offsets:
        group.replay(record, now=now)
    plan = group.plan_assignment(
        now, partitions=partitions, available=ASSIGNORS, log_offsets=log_offsets
    )
    group.replay(plan.record, now=now)
    start_all(group, plan)
    return offsets, plan


# -- states -------------------------------------------------------------------------------


def test_transition_table_is_the_documented_state_diagram() -> None:
    assert {
        S.EMPTY: {S.STOPPING, S.DEAD},
        S.STOPPING: {S.STOPPING, S.ASSIGNING, S.EMPTY},
        S.ASSIGNING: {S.STOPPING, S.STARTING, S.EMPTY},
        S.STARTING: {S.STOPPING, S.STABLE, S.EMPTY},
        S.STABLE: {S.STOPPING, S.EMPTY},
        S.DEAD: set(),
    } == {state: set(targets) for state, targets in TRANSITIONS.items()}


@pytest.mark.parametrize(
    ("src", "dst"),
    [(a, b) for a, b in itertools.product(GroupState, GroupState) if b not in TRANSITIONS[a]],
)
def test_every_illegal_transition_raises_and_changes_nothing(src, dst) -> None:
    group = Group("g", now=0.0)
    group.state = src
    with pytest.raises(IllegalTransitionError, match=f"g: {src} -> {dst}"):
        group.transition(dst)
    assert group.state is src


@pytest.mark.parametrize(
    ("src", "dst"), [(a, b) for a in GroupState for b in sorted(TRANSITIONS[a])]
)
def test_every_legal_transition_is_taken(src, dst) -> None:
    group = Group("g", now=0.0)
    group.state = src
    group.transition(dst)
    assert group.state is dst


def test_dead_is_terminal() -> None:
    group = Group("g", now=0.0)
    group.replay(GroupTombstone("g"), now=1.0)
    assert group.state is S.DEAD
    for target in GroupState:
        with pytest.raises(IllegalTransitionError):
            group.transition(target)
    with pytest.raises(IllegalTransitionError):
        group.begin_rebalance()
    group.replay(GroupTombstone("g"), now=2.0)  # a second tombstone is harmless
    assert group.state is S.DEAD


def test_phases_out_of_order_raise() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0)
    with pytest.raises(IllegalTransitionError):
        group.begin_starting()  # EMPTY -> STARTING
    group.begin_rebalance()
    with pytest.raises(IllegalTransitionError):
        group.complete_rebalance()  # STOPPING -> STABLE
    with pytest.raises(IllegalTransitionError):
        group.begin_starting()  # STOPPING -> STARTING skips the assignment
    assert group.state is S.STOPPING


# -- admission ------------------------------------------------------------------------------


@pytest.mark.parametrize("session_timeout", [1.999, 60.001, 0.0, -1.0])
def test_session_timeout_outside_limits_is_refused_with_the_limits(session_timeout) -> None:
    with pytest.raises(InvalidSessionTimeoutError) as info:
        validate(Group("g", now=0.0), session_timeout=session_timeout)
    assert "[2s, 60s]" in str(info.value)
    assert f"{session_timeout:g}s" in str(info.value)


@pytest.mark.parametrize("session_timeout", [2.0, 60.0])
def test_session_timeout_at_the_limits_is_accepted(session_timeout) -> None:
    validate(Group("g", now=0.0), session_timeout=session_timeout)


@pytest.mark.parametrize("rebalance_timeout", [0.0, -5.0, 300.001, 9_223_372_036_854_775.0])
def test_rebalance_timeout_must_be_within_the_brokers_bound(rebalance_timeout) -> None:
    with pytest.raises(InvalidRebalanceTimeoutError, match=r"rebalance timeout .* 300s"):
        validate(Group("g", now=0.0), rebalance_timeout=rebalance_timeout)
    assert LIMITS.max_rebalance_timeout == 300.0  # (the default)
    validate(Group("g", now=0.0), rebalance_timeout=300.0)


def test_a_member_must_subscribe_to_a_topic() -> None:
    with pytest.raises(InvalidRequestError, match="at least one topic"):
        validate(Group("g", now=0.0), topics=[])


@pytest.mark.parametrize("policy", ["smallest", "", "EARLIEST"])
def test_unknown_offset_reset_policy_is_refused(policy) -> None:
    with pytest.raises(InvalidRequestError, match="earliest, latest, none"):
        validate(Group("g", now=0.0), offset_reset=policy)


@pytest.mark.parametrize("policy", ["earliest", "latest", "none"])
def test_known_offset_reset_policies_are_accepted(policy) -> None:
    validate(Group("g", now=0.0), offset_reset=policy)


def test_group_max_size_refuses_a_new_member_but_not_a_rejoin() -> None:
    group = Group("g", now=0.0)
    limits = GroupLimits(min_session_timeout=2.0, max_session_timeout=60.0, max_group_size=3)
    for member_id in "ab":
        join(group, member_id, 0.0)
    validate(group, member_id="c", limits=limits)
    join(group, "c", 0.0)
    with pytest.raises(GroupMaxSizeReachedError, match="group g has reached its maximum size of 3"):
        validate(group, member_id="d", limits=limits)
    with pytest.raises(GroupMaxSizeReachedError):
        validate(group, member_id="", limits=limits)
    validate(group, member_id="b", limits=limits)  # an existing member may rejoin


def test_no_common_assignor_is_refused() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0, assignors=("range",))
    with pytest.raises(InconsistentAssignorError, match="range, roundrobin"):
        validate(group, member_id="b", assignors=["roundrobin"])
    validate(group, member_id="b", assignors=["roundrobin", "range"])
    # The member's own old preferences do not count against its rejoin.
    validate(group, member_id="a", assignors=["roundrobin"])


def test_an_assignor_the_broker_lacks_is_refused_even_alone() -> None:
    with pytest.raises(InconsistentAssignorError):
        validate(Group("g", now=0.0), assignors=["cooperative-sticky"])
    with pytest.raises(InconsistentAssignorError):
        validate(Group("g", now=0.0), assignors=[])


def test_refused_join_leaves_the_group_unchanged() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0)
    with pytest.raises(InvalidSessionTimeoutError):
        join(group, "b", 1.0, session_timeout=0.5)
    assert list(group.members) == ["a"]
    assert group.state is S.EMPTY


# -- a full rebalance walk ---------------------------------------------------------------------


def test_full_rebalance_walk() -> None:
    group = Group("g", now=0.0)
    assert (group.state, group.generation, group.empty_since) == (S.EMPTY, 0, 0.0)

    # Generation 1: a alone, subscribed to t (3) and u (2).
    join(group, "a", 1.0, topics=("t", "u"), offset_reset="earliest")
    assert group.empty_since is None
    assert [m.member_id for m in group.begin_rebalance()] == ["a"]
    assert group.state is S.STOPPING and group.rebalancing
    group.member_stopped("a", [])
    assert group.drain_positions(1000) == []
    plan = group.plan_assignment(
        1.0, partitions={"t": 3, "u": 2}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert group.state is S.ASSIGNING
    assert group.generation == 0  # nothing changes until the record is replayed
    assert plan.record == GroupRecord(
        "g",
        1,
        "range",
        [
            MemberRecord(
                "a",
                "client-a",
                "host-a",
                ["t", "u"],
                10_000,
                5_000,
                [TP("t", 0), TP("t", 1), TP("t", 2), TP("u", 0), TP("u", 1)],
            )
        ],
        topics={"t": 3, "u": 2},  # the partition counts the group has seen
    )
    assert plan.starts == [
        StartPlan(
            "a",
            [
                PartitionOffset("t", 0, 0),
                PartitionOffset("t", 1, 10),
                PartitionOffset("t", 2, 20),
                PartitionOffset("u", 0, 30),
                PartitionOffset("u", 1, 40),
            ],
            1.0,
        )
    ]
    group.replay(plan.record, now=1.0)
    assert (group.generation, group.assignor) == (1, "range")
    assert group.members["a"].assignment == {
        TP("t", 0),
        TP("t", 1),
        TP("t", 2),
        TP("u", 0),
        TP("u", 1),
    }
    assert group.members["a"].may_own == set()
    group.begin_starting()
    group.member_starting("a")
    assert group.members["a"].may_own == group.members["a"].assignment
    assert group.members["a"].generation == 0
    group.member_started("a")
    assert group.members["a"].generation == 1
    group.complete_rebalance()
    assert group.state is S.STABLE and not group.rebalancing

    # Generation 2: b (latest, u only) and c (none, v only) join; a hands back positions.
    join(group, "b", 2.0, topics=("u",), offset_reset="latest")
    join(group, "c", 2.0, topics=("v",), offset_reset="none")
    offsets, plan = rebalance(
        group,
        3.0,
        {"t": 3, "u": 2, "v": 1},
        positions={"a": [PartitionOffset("t", 0, 42, "m"), PartitionOffset("u", 1, 7)]},
    )
    assert offsets == [
        OffsetRecord("g", "t", 0, 42, "m", 3000),
        OffsetRecord("g", "u", 1, 7, "", 3000),
    ]
    assert plan.record.generation == 2
    assert [(m.member_id, m.partitions) for m in plan.record.members] == [
        ("a", [TP("t", 0), TP("t", 1), TP("t", 2), TP("u", 0)]),
        ("b", [TP("u", 1)]),
        ("c", [TP("v", 0)]),
    ]
    assert plan.starts == [
        StartPlan(
            "a",
            [
                PartitionOffset("t", 0, 42, "m"),  # committed offset wins over the policy
                PartitionOffset("t", 1, 10),  # earliest: the log start
                PartitionOffset("t", 2, 20),
                PartitionOffset("u", 0, 30),
            ],
            3.0,
        ),
        StartPlan("b", [PartitionOffset("u", 1, 7)], 3.0),  # committed, though b says latest
        StartPlan("c", [PartitionOffset("v", 0, NO_OFFSET)], 3.0),  # "none": no offset
    ]
    assert group.generation == 2 and group.state is S.STABLE
    assert group.ownership() == {
        TP("t", 0): "a",
        TP("t", 1): "a",
        TP("t", 2): "a",
        TP("u", 0): "a",
        TP("u", 1): "b",
        TP("v", 0): "c",
    }

    # A rebalance restarted during STARTING still ends one generation later than it began.
    join(group, "d", 4.0, topics=("u",), offset_reset="latest")
    stop_all(group)
    plan = group.plan_assignment(
        4.0, partitions={"t": 3, "u": 2, "v": 1}, available=ASSIGNORS, log_offsets=log_offsets
    )
    group.replay(plan.record, now=4.0)
    group.begin_starting()
    group.member_starting("a")
    group.remove_member(4.5, "d", stopped=True)  # membership changes: start over
    assert [m.member_id for m in group.begin_rebalance()] == ["a", "b", "c"]
    assert group.generation == 3
    assert not group.fences
    _, plan = rebalance(group, 5.0, {"t": 3, "u": 2, "v": 1})
    assert plan.record.generation == 4 and group.generation == 4
    latest = {s.member_id: s.partitions for s in plan.starts}
    assert latest["b"] == [PartitionOffset("u", 1, 7)]
    assert group.describe().members[1].partitions == [TP("u", 1)]
    assert group.summary().generation == 4


def test_rebalance_with_positions_only_for_partitions_the_member_had() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0, topics=("t",))
    rebalance(group, 1.0, {"t": 1})
    join(group, "b", 2.0, topics=("t",))
    offsets, _ = rebalance(
        group,
        3.0,
        {"t": 1},
        positions={"a": [PartitionOffset("t", 0, 5)], "b": [PartitionOffset("t", 0, 99)]},
    )
    # b never owned t-0: its claim is ignored; a's position is committed.
    assert offsets == [OffsetRecord("g", "t", 0, 5, "", 3000)]


def test_latest_policy_starts_at_the_log_end() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0, topics=("t",), offset_reset="latest")
    _, plan = rebalance(group, 1.0, {"t": 2})
    assert plan.starts == [
        StartPlan("a", [PartitionOffset("t", 0, 100), PartitionOffset("t", 1, 110)], 1.0)
    ]


def test_topics_without_partitions_or_unknown_are_not_assigned() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0, topics=("t", "nope", "empty"))
    _, plan = rebalance(group, 1.0, {"t": 1, "empty": 0})
    assert plan.record.members[0].partitions == [TP("t", 0)]


# -- membership, heartbeats and positions ---------------------------------------------------------


def test_last_member_leaving_empties_the_group() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0)
    join(group, "b", 0.0)
    rebalance(group, 1.0, {"t": 2})
    group.remove_member(2.0, "a", stopped=True)
    assert group.state is S.STABLE and group.empty_since is None
    group.remove_member(3.0, "b", stopped=True)
    assert group.state is S.EMPTY and group.empty_since == 3.0


def test_rejoin_keeps_what_the_member_may_still_fetch() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0)
    rebalance(group, 1.0, {"t": 2})
    member = join(group, "a", 2.0, topics=("t", "u"))
    assert member.topics == {"t", "u"}
    assert member.may_own == {TP("t", 0), TP("t", 1)}
    assert member.assignment == {TP("t", 0), TP("t", 1)}
    assert member.last_heartbeat == 2.0


def test_heartbeat_moves_the_lease_and_collects_owned_positions_when_stable() -> None:
    group = Group("g", now=0.0)
    member = join(group, "a", 0.0, session_timeout=10.0)
    group.heartbeat(3.0, member, [PartitionOffset("t", 0, 1)])
    assert member.lease_end == 13.0
    assert group.positions == {}  # not stable: positions do not count
    rebalance(group, 4.0, {"t": 1})
    group.heartbeat(5.0, member, [PartitionOffset("t", 0, 8), PartitionOffset("t", 9, 1)])
    assert member.lease_end == 15.0
    assert group.positions == {TP("t", 0): PartitionOffset("t", 0, 8)}
    assert group.drain_positions(5000) == [OffsetRecord("g", "t", 0, 8, "", 5000)]
    assert group.positions == {}


def test_positions_count_from_a_members_start_not_from_the_groups() -> None:
    # A member started while another still starts consumes, and may reach the
    # log end then: those positions are its last; dropped, its lag stayed above 0.
    group = Group("g", now=0.0)
    a = join(group, "a", 0.0)
    b = join(group, "b", 0.0)
    stop_all(group)
    plan = group.plan_assignment(
        1.0, partitions={"t": 2}, available=ASSIGNORS, log_offsets=log_offsets
    )
    group.replay(plan.record, now=1.0)
    group.begin_starting()
    for start in plan.starts:
        group.member_starting(start.member_id)
    (tp_a,) = a.assignment
    (tp_b,) = b.assignment
    # a's StartFetchers reached it, its acknowledgement not yet the group: its heartbeat
    # carries the new generation. b has not been started: it may not commit yet.
    group.heartbeat(2.0, a, [PartitionOffset(tp_a.topic, tp_a.partition, 90)], group.generation)
    group.heartbeat(2.0, b, [PartitionOffset(tp_b.topic, tp_b.partition, 95)], b.generation)
    assert group.state is S.STARTING
    assert group.positions == {tp_a: PartitionOffset(tp_a.topic, tp_a.partition, 90)}
    group.member_started("a")
    group.heartbeat(3.0, a, [PartitionOffset(tp_a.topic, tp_a.partition, 99)])  # acknowledged
    assert group.positions[tp_a].offset == 99


def test_drain_positions_only_emits_advances() -> None:
    group = Group("g", now=0.0)
    member = join(group, "a", 0.0)
    rebalance(group, 1.0, {"t": 2})
    group.replay(OffsetRecord("g", "t", 0, 50), now=1.0)
    group.replay(OffsetRecord("g", "t", 1, 50), now=1.0)
    group.heartbeat(2.0, member, [PartitionOffset("t", 0, 50), PartitionOffset("t", 1, 60)])
    assert group.drain_positions(2000) == [OffsetRecord("g", "t", 1, 60, "", 2000)]


# -- records ---------------------------------------------------------------------------------------


def test_offset_replay_never_moves_backwards_unless_reset() -> None:
    group = Group("g", now=0.0)
    tp = TP("t", 0)
    group.replay(OffsetRecord("g", "t", 0, 10), now=0.0)
    group.replay(OffsetRecord("g", "t", 0, 9, "older"), now=0.0)
    assert group.offsets[tp].offset == 10
    group.replay(OffsetRecord("g", "t", 0, 10, "same"), now=0.0)
    assert (group.offsets[tp].offset, group.offsets[tp].metadata) == (10, "same")
    group.replay(OffsetRecord("g", "t", 0, 3, "rewind", reset=True), now=0.0)
    assert (group.offsets[tp].offset, group.offsets[tp].metadata) == (3, "rewind")
    group.replay(OffsetRecord("g", "t", 0, 4), now=0.0)
    assert group.offsets[tp].offset == 4
    assert group.describe().offsets == [PartitionOffset("t", 0, 4)]


def test_group_record_for_members_not_live_fences_their_partitions() -> None:
    # A coordinator loading after a failover: the generation's members may still fetch.
    group = Group("g", now=100.0)
    record = GroupRecord(
        "g",
        7,
        "roundrobin",
        [
            MemberRecord("a", "ca", "ha", ["t"], 10_000, 5_000, [TP("t", 0), TP("t", 2)]),
            MemberRecord("b", "cb", "hb", ["t"], 3_500, 5_000, [TP("t", 1)]),
            MemberRecord("c", "cc", "hc", ["t"], 3_000, 5_000, []),
        ],
    )
    group.replay(record, now=100.0, loading=True)
    assert (group.generation, group.assignor, group.state) == (7, "roundrobin", S.EMPTY)
    assert group.members == {}
    assert group.fences == {
        "a": Fence(frozenset({TP("t", 0), TP("t", 2)}), 110.0),
        "b": Fence(frozenset({TP("t", 1)}), 103.5),
    }
    assert group.knows_former_member("a") and group.knows_former_member("b")
    assert not group.knows_former_member("c")

    # A new member gets each partition only once its former owner's fence has ended:
    # b's at 103.5 (b's shorter session), a's at 110.
    join(group, "n", 101.0, topics=("t",))
    stop_all(group)
    plan = group.plan_assignment(
        101.0, partitions={"t": 3}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert plan.record.generation == 8
    assert [(s.not_before, [p.tp for p in s.partitions], s.incremental) for s in plan.starts] == [
        (103.5, [TP("t", 1)], False),
        (110.0, [TP("t", 0), TP("t", 1), TP("t", 2)], True),
    ]

    # Fences end: forgotten once their time has passed.
    group.expire_fences(103.5)
    assert set(group.fences) == {"a"}
    group.expire_fences(110.0)
    assert group.fences == {}


def test_a_live_write_does_not_fence_a_member_that_left_meanwhile() -> None:
    # Planned with "a", who then left cleanly while the generation was being written.
    group = Group("g", now=0.0)
    record = GroupRecord(
        "g", 2, "range", [MemberRecord("a", "", "", ["t"], 10_000, 5_000, [TP("t", 0)])]
    )
    group.replay(record, now=1.0)
    assert group.fences == {}


def test_group_record_sets_assignments_of_live_members_without_fencing_them() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0)
    record = GroupRecord(
        "g", 3, "range", [MemberRecord("a", "", "", ["t"], 10_000, 5_000, [TP("t", 0)])]
    )
    group.replay(record, now=1.0)
    assert group.members["a"].assignment == {TP("t", 0)}
    assert group.fences == {}


def test_member_stopped_clears_its_fence() -> None:
    group = Group("g", now=0.0)
    group.replay(
        GroupRecord(
            "g", 1, "range", [MemberRecord("a", "", "", ["t"], 10_000, 5_000, [TP("t", 0)])]
        ),
        now=0.0,
        loading=True,
    )
    assert "a" in group.fences
    join(group, "a", 1.0)  # the former member rejoins with its id
    stop_all(group)
    assert group.fences == {}
    plan = group.plan_assignment(
        1.0, partitions={"t": 1}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert plan.starts[0].not_before == 1.0  # no wait: the only fetcher said it stopped


def test_unacknowledged_removal_fences_until_the_lease_ends() -> None:
    group = Group("g", now=0.0)
    a = join(group, "a", 0.0, session_timeout=10.0)
    join(group, "b", 0.0, session_timeout=10.0)
    rebalance(group, 1.0, {"t": 2})
    group.heartbeat(4.0, a, [])
    removed = group.remove_member(5.0, "a", stopped=False)  # connection lost
    assert removed is a
    assert group.fences == {"a": Fence(frozenset({TP("t", 0)}), 14.0)}
    assert group.knows_former_member("a")
    stop_all(group)
    plan = group.plan_assignment(
        6.0, partitions={"t": 2}, available=ASSIGNORS, log_offsets=log_offsets
    )
    # b's own partition starts at once; a's waits for a's lease (not all of b's for it).
    assert plan.starts == [
        StartPlan("b", [PartitionOffset("t", 1, 10)], 6.0),
        StartPlan("b", [PartitionOffset("t", 0, 0), PartitionOffset("t", 1, 10)], 14.0, True),
    ]
    assert plan.stages() == {"b": plan.starts}
    group.replay(plan.record, now=6.0)
    group.begin_starting()
    group.member_starting("b", [TP("t", 1)])
    assert group.members["b"].may_own == {TP("t", 1)}  # not yet what is fenced


def test_former_member_rejoining_while_fenced_may_still_own_its_partitions() -> None:
    # Its connection dropped; the client keeps fetching and rejoins with its id, which
    # renews its lease. If it goes away again before acknowledging a stop, its
    # partitions stay fenced until the renewed lease ends, not the old one.
    group = Group("g", now=0.0)
    join(group, "a", 0.0, session_timeout=10.0)
    rebalance(group, 0.0, {"t": 2})
    group.remove_member(1.0, "a", stopped=False)
    assert group.fences == {"a": Fence(frozenset({TP("t", 0), TP("t", 1)}), 10.0)}
    rejoined = join(group, "a", 4.0, session_timeout=10.0)
    assert rejoined.may_own == {TP("t", 0), TP("t", 1)}
    group.begin_rebalance()
    group.remove_member(5.0, "a", stopped=False)
    assert group.fences == {"a": Fence(frozenset({TP("t", 0), TP("t", 1)}), 14.0)}
    join(group, "b", 5.0)
    stop_all(group)
    plan = group.plan_assignment(
        5.0, partitions={"t": 2}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert plan.starts[0].not_before == 14.0


def test_former_member_rejoining_hands_back_positions_of_fenced_partitions() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0)
    rebalance(group, 0.0, {"t": 1})
    group.remove_member(1.0, "a", stopped=False)
    join(group, "a", 2.0)
    offsets, _ = rebalance(group, 3.0, {"t": 1}, positions={"a": [PartitionOffset("t", 0, 17)]})
    assert offsets == [OffsetRecord("g", "t", 0, 17, "", 3000)]
    assert group.fences == {}


def test_rejoin_after_the_fence_ended_owns_nothing() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0, session_timeout=10.0)
    rebalance(group, 0.0, {"t": 1})
    group.remove_member(1.0, "a", stopped=False)
    assert join(group, "a", 10.0).may_own == set()  # its lease ended at 10: it stopped


def test_unfenced_partitions_start_at_once() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0, topics=("t",))
    join(group, "b", 0.0, topics=("t", "u"))
    join(group, "c", 0.0, topics=("u",))
    rebalance(group, 1.0, {"t": 1, "u": 2})
    group.remove_member(2.0, "a", stopped=False)  # a fetched t-0 only; b gets it
    stop_all(group)
    plan = group.plan_assignment(
        2.0, partitions={"t": 1, "u": 2}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert {s.member_id: s.not_before for s in plan.starts} == {"b": 10.0, "c": 2.0}


def test_removal_after_a_stop_ack_or_a_clean_leave_fences_nothing() -> None:
    group = Group("g", now=0.0)
    for member_id in "abc":
        join(group, member_id, 0.0)
    rebalance(group, 1.0, {"t": 3})
    group.remove_member(2.0, "a", stopped=True)
    group.begin_rebalance()
    group.member_stopped("b", [])
    group.remove_member(2.0, "b", stopped=False)  # stopped already: nothing to fence
    group.remove_member(11.0, "c", stopped=False)  # its lease has ended: nothing to fence
    assert group.fences == {}
    assert group.state is S.EMPTY


def test_records_round_trip_through_their_encoding() -> None:
    records = [
        TopicRecord("t", 3),
        GroupRecord("g", 2, "range", [MemberRecord("a", "c", "h", ["t"], 1, 2, [TP("t", 1)])]),
        OffsetRecord("g", "t", 1, 5, "meta", 123, reset=True),
        GroupTombstone("g"),
    ]
    for record in records:
        assert decode_record(encode_record(record)) == record


def test_tombstone_forgets_offsets() -> None:
    group = Group("g", now=0.0)
    group.replay(OffsetRecord("g", "t", 0, 10), now=0.0)
    group.replay(GroupTombstone("g"), now=1.0)
    assert group.offsets == {} and group.state is S.DEAD


def test_requeued_positions_do_not_overwrite_newer_ones() -> None:
    group = Group("g", now=0.0)
    group.positions[TP("t", 0)] = PartitionOffset("t", 0, 5)
    group.positions[TP("t", 1)] = PartitionOffset("t", 1, 7)
    drained = group.drain_positions(1)
    assert group.positions == {}
    group.positions[TP("t", 0)] = PartitionOffset("t", 0, 9)  # newer, arrived meanwhile
    group.requeue_positions(drained)
    assert group.positions == {
        TP("t", 0): PartitionOffset("t", 0, 9),
        TP("t", 1): PartitionOffset("t", 1, 7),
    }


def test_replaying_an_older_generation_changes_nothing() -> None:
    group = Group("g", now=0.0)
    group.replay(GroupRecord("g", 3, "range", []), now=0.0)
    group.replay(GroupRecord("g", 0, "", []), now=1.0)  # a CreateGroup racing the first join
    assert (group.generation, group.assignor) == (3, "range")


def test_a_static_members_new_process_leaves_the_old_ones_partitions_fenced() -> None:
    # The old process of static member "a" is cut off, not dead: it may fetch what it
    # may own until its lease ends (last heartbeat 4 + session 10). Its successor holds
    # nothing; acknowledging a stop, it must not lift that fence, which also survives
    # in the generation record, and a failover.
    group = Group("g", now=0.0)
    a = join(group, "a", 0.0, session_timeout=10.0)
    join(group, "b", 0.0, session_timeout=10.0)
    rebalance(group, 1.0, {"t": 2})
    group.heartbeat(4.0, a, [])
    group.replace_process(6.0, "a")
    key = "a" + PREDECESSOR_SUFFIX
    assert group.fences == {key: Fence(frozenset({TP("t", 0)}), 14.0)}
    assert a.may_own == set()
    assert not group.knows_former_member(key)  # not a member id anyone may join with
    resumed = group.planning.resume_plan(6.0, "a", log_offsets)
    assert resumed.not_before == 14.0  # the successor itself waits for the old lease
    join(group, "c", 7.0)
    stop_all(group)  # "a" (the new process) acknowledges: it had nothing
    assert key in group.fences
    plan = group.plan_assignment(
        8.0, partitions={"t": 2}, available=ASSIGNORS, log_offsets=log_offsets
    )
    owner_of_t0 = next(s for s in plan.starts if TP("t", 0) in [p.tp for p in s.partitions])
    assert owner_of_t0.not_before == 14.0
    assert [(d.member_id, d.partitions) for d in plan.record.departed] == [(key, [TP("t", 0)])]
    # A new coordinator replays the record: the fence is there again, for a session.
    successor = Group("g", now=100.0)
    successor.replay(plan.record, now=100.0, loading=True)
    assert successor.fences[key] == Fence(frozenset({TP("t", 0)}), 110.0)


def test_successive_takeovers_merge_their_fences_to_the_longest_lease() -> None:
    group = Group("g", now=0.0)
    a = join(group, "a", 0.0, session_timeout=10.0)
    rebalance(group, 0.0, {"t": 2})
    group.replace_process(2.0, "a")  # old process's lease: 0 + 10
    group.heartbeat(3.0, a, [])
    group.member_starting("a")  # the second process is started, and cut off in turn
    group.replace_process(5.0, "a")  # its lease: 3 + 10
    assert group.fences == {
        "a" + PREDECESSOR_SUFFIX: Fence(frozenset({TP("t", 0), TP("t", 1)}), 13.0)
    }


def test_the_same_process_reconnecting_keeps_what_it_fetches() -> None:
    # Rejoining with its member id, it is the process that fetches: no fence, no wait.
    group = Group("g", now=0.0)
    join(group, "a", 0.0, session_timeout=10.0)
    rebalance(group, 0.0, {"t": 2})
    assert group.planning.resume_plan(3.0, "a", log_offsets).not_before == 3.0
    assert group.fences == {}


# -- partitions created after the group subscribed start at their log start ----------------


def _starts(plan) -> dict[TP, int]:
    return {p.tp: p.offset for s in plan.starts for p in s.partitions}


def test_a_new_partition_starts_at_its_log_start_until_the_group_commits_it() -> None:
    # "latest" everywhere; t had 2 partitions when the group subscribed, then 3.
    group = Group("g", now=0.0)
    join(group, "a", 0.0, offset_reset="latest")
    _, plan = rebalance(group, 0.0, {"t": 2})
    assert plan.record.topics == {"t": 2}
    assert _starts(plan) == {TP("t", 0): 100, TP("t", 1): 110}  # latest: the log end
    _, plan = rebalance(group, 1.0, {"t": 3})
    assert _starts(plan)[TP("t", 2)] == 20  # created since: its log start
    assert plan.record.topics == {"t": 2}  # the count it subscribed with, kept
    # Its first owner goes before committing anything there: the partition is still
    # new, and its next owner starts it at its log start again, not at its end.
    group.remove_member(2.0, "a", stopped=True)
    join(group, "b", 3.0, offset_reset="latest")
    _, plan = rebalance(group, 3.0, {"t": 3})
    assert _starts(plan)[TP("t", 2)] == 20
    # Once the group has committed an offset for it, that offset rules.
    group.replay(OffsetRecord("g", "t", 2, 42), now=3.0)
    _, plan = rebalance(group, 4.0, {"t": 3})
    assert _starts(plan)[TP("t", 2)] == 42


def test_a_topic_created_after_the_group_subscribed_to_its_name_starts_at_its_log_start() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0, topics=("t", "u"), offset_reset="latest")
    _, plan = rebalance(group, 0.0, {"t": 1})  # u does not exist yet
    assert plan.record.topics == {"t": 1, "u": 0}
    _, plan = rebalance(group, 1.0, {"t": 1, "u": 2})  # u is created
    assert _starts(plan) == {TP("t", 0): 100, TP("u", 0): 30, TP("u", 1): 40}
    # A brand-new group on the existing topics follows its policy everywhere.
    fresh = Group("fresh", now=0.0)
    join(fresh, "f", 0.0, topics=("t", "u"), offset_reset="latest")
    _, plan = rebalance(fresh, 2.0, {"t": 1, "u": 2})
    assert _starts(plan) == {TP("t", 0): 100, TP("u", 0): 130, TP("u", 1): 140}


def test_a_subscribed_topic_that_is_deleted_counts_as_new_when_created_again() -> None:
    group = Group("g", now=0.0)
    join(group, "a", 0.0, topics=("u",), offset_reset="latest")
    _, plan = rebalance(group, 0.0, {"u": 2})
    assert plan.record.topics == {"u": 2}
    _, plan = rebalance(group, 1.0, {})  # deleted
    assert plan.record.topics == {"u": 0}
    _, plan = rebalance(group, 2.0, {"u": 2})  # created again: everything in it is new
    assert _starts(plan) == {TP("u", 0): 30, TP("u", 1): 40}


def test_a_topic_a_pattern_matches_only_after_the_group_subscribed_starts_at_its_log_start() -> (
    None
):
    group = Group("g", now=0.0)
    join(group, "a", 0.0, topics=("re:u|v", "u"), offset_reset="latest")  # u matched at once
    stop_all(group)
    plan = group.plan_assignment(
        0.0, partitions={"u": 2}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert plan.record.topics == {"re:u|v": 0, "u": 2}
    assert _starts(plan) == {TP("u", 0): 130, TP("u", 1): 140}  # existed: latest
    group.replay(plan.record, now=0.0)
    start_all(group, plan)
    # v is created; the broker's matcher finds that the group's pattern, recorded in
    # the last generation, matches it only now.
    group.members["a"].topics |= {"v"}
    stop_all(group)
    plan = group.plan_assignment(
        1.0,
        partitions={"u": 2, "v": 1},
        available=ASSIGNORS,
        log_offsets=log_offsets,
        created_since={"v"},
    )
    assert plan.record.topics == {"re:u|v": 0, "u": 2, "v": 0}
    assert _starts(plan)[TP("v", 0)] == 50  # its log start, not its end (150)
    group.replay(plan.record, now=1.0)
    start_all(group, plan)
    stop_all(group)
    plan = group.plan_assignment(
        2.0, partitions={"u": 2, "v": 1}, available=ASSIGNORS, log_offsets=log_offsets
    )
    assert _starts(plan)[TP("v", 0)] == 50  # and again, until the group commits there
