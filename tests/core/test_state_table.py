"""The group state machine is data: (state, trigger) -> state, and a line per state.

The engine moves a group only through :meth:`Group.fire`, which looks the
next state up in :data:`STATE_TABLE`; these tests check every pair, listed
or not, and that a group driven through its life by the engine's own
methods takes exactly the moves the table lists.
"""

from __future__ import annotations

import itertools

import pytest
from _members import add_member

from trio_coord.core.group import Group
from trio_coord.core.records import GroupTombstone
from trio_coord.core.states import (
    STATE_DOCS,
    STATE_TABLE,
    TRANSITIONS,
    GroupState,
    IllegalTransitionError,
    Trigger,
)

S, T = GroupState, Trigger


def test_every_state_says_how_it_answers_requests() -> None:
    assert set(STATE_DOCS) == set(GroupState)
    for state, doc in STATE_DOCS.items():
        assert len(doc) > 40, state
    for state in (S.EMPTY, S.STOPPING, S.STABLE):  # the requests a client sends most
        assert "Heartbeat" in STATE_DOCS[state] and "OffsetCommit" in STATE_DOCS[state]


def test_the_legal_moves_are_derived_from_the_table() -> None:
    assert {s: set(t) for s, t in TRANSITIONS.items()} == {
        s: {new for (old, _), new in STATE_TABLE.items() if old is s} for s in GroupState
    }
    assert TRANSITIONS[S.DEAD] == frozenset()  # terminal


@pytest.mark.parametrize(("state", "trigger"), list(itertools.product(GroupState, Trigger)))
def test_fire_moves_as_the_table_says_or_raises_and_changes_nothing(state, trigger) -> None:
    group = Group("g", now=0.0)
    group.state = state
    expected = STATE_TABLE.get((state, trigger))
    if expected is None:
        with pytest.raises(IllegalTransitionError, match=f"g: {state} on {trigger}"):
            group.fire(trigger)
        assert group.state is state
    else:
        assert group.fire(trigger) is expected
        assert group.state is expected


def test_the_engines_own_moves_are_the_tables() -> None:
    from trio_coord.core.assignors import ASSIGNORS

    group = Group("g", now=0.0)
    seen = [group.state]

    def step() -> None:
        if group.state is not seen[-1]:
            seen.append(group.state)

    add_member(group, "a", 1.0)
    group.begin_rebalance()
    step()
    plan = group.plan_assignment(
        2.0, partitions={"t": 2}, available=ASSIGNORS, log_offsets=lambda tp: (0, 0)
    )
    step()
    group.replay(plan.record, now=2.0)
    group.begin_starting()
    step()
    group.member_started("a")
    group.complete_rebalance()
    step()
    group.begin_rebalance()  # a membership change
    step()
    group.remove_member(3.0, "a", stopped=True)
    step()
    group.replay(GroupTombstone("g"), now=4.0)
    step()
    assert seen == [
        S.EMPTY,
        S.STOPPING,
        S.ASSIGNING,
        S.STARTING,
        S.STABLE,
        S.STOPPING,
        S.EMPTY,
        S.DEAD,
    ]
    triggers = [T.REBALANCE, T.STOPPED, T.PLANNED, T.STARTED, T.REBALANCE, T.EMPTIED, T.DELETED]
    for (old, new), trigger in zip(itertools.pairwise(seen), triggers, strict=True):
        assert STATE_TABLE[(old, trigger)] is new
