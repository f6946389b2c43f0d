"""Fencing (Invariant 3): which heartbeats and offset commits a group accepts.

A stale or unknown member must be refused with the code that tells its client
what to do; a member that still owns a partition must be able to commit it,
including from ``on_revoked`` while its fetchers are being stopped.
"""

from __future__ import annotations

import functools

import pytest
from _members import add_member

from trio_coord.core.assignors import ASSIGNORS
from trio_coord.core.fencing import (
    STANDALONE_GENERATION,
    check_commit,
    check_heartbeat,
    check_member,
)
from trio_coord.core.group import Group, GroupState
from trio_coord.core.records import OffsetRecord
from trio_coord.protocol.errors import (
    ErrorCode,
    IllegalGenerationError,
    InvalidPartitionsError,
    InvalidRequestError,
    OffsetRegressionError,
    PartitionNotOwnedError,
    RebalanceInProgressError,
    UnknownMemberError,
    UnknownTopicError,
)
from trio_coord.protocol.messages import PartitionOffset as PO
from trio_coord.protocol.messages import TopicPartition as TP

T0, T1, T2, T3 = (TP("t", p) for p in range(4))


# Members of these tests commit by hand (no auto-commit).
add = functools.partial(add_member, auto_commit=False)


def plan(group: Group, now: float = 0.0, partitions: int = 4):
    for member in group.begin_rebalance():
        group.member_stopped(member.member_id, [])
    result = group.plan_assignment(
        now, partitions={"t": partitions}, available=ASSIGNORS, log_offsets=lambda tp: (0, 0)
    )
    group.replay(result.record, now=now)
    group.begin_starting()
    return result


def start(group: Group, *member_ids: str) -> None:
    for member_id in member_ids:
        group.member_starting(member_id)
        group.member_started(member_id)


def stable_group() -> Group:
    """Generation 1, STABLE: a owns t-0, t-1 and b owns t-2, t-3."""
    group = Group("g", now=0.0)
    add(group, "a")
    add(group, "b")
    plan(group)
    start(group, "a", "b")
    group.complete_rebalance()
    assert group.generation == 1
    assert group.ownership() == {T0: "a", T1: "a", T2: "b", T3: "b"}
    return group


TOPICS = {"t": 4, "u": 4}
"""The topics that exist in these tests, with their partition counts."""


def commit(group: Group, member_id: str, generation: int, *offsets: PO, allow: bool = False):
    check_commit(
        group, member_id, generation, list(offsets), allow_regression=allow, partitions=TOPICS
    )


# -- heartbeats ----------------------------------------------------------------------------


def test_heartbeat_from_unknown_member_is_refused() -> None:
    group = stable_group()
    with pytest.raises(UnknownMemberError, match=r"'zed' is not in group g.*rejoin") as info:
        check_heartbeat(group, "zed", 1)
    assert info.value.code is ErrorCode.UNKNOWN_MEMBER_ID


def test_heartbeat_from_a_removed_member_is_refused() -> None:
    group = stable_group()
    group.remove_member(1.0, "a", stopped=False)
    with pytest.raises(UnknownMemberError):
        check_heartbeat(group, "a", 1)
    with pytest.raises(UnknownMemberError):
        check_member(group, "a")


@pytest.mark.parametrize("generation", [0, 2, -1])
def test_heartbeat_with_a_stale_or_future_generation_is_refused(generation) -> None:
    group = stable_group()
    with pytest.raises(
        IllegalGenerationError, match=f"generation {generation} is stale.*at generation 1"
    ):
        check_heartbeat(group, "a", generation)


def test_heartbeat_in_the_current_generation_returns_the_member() -> None:
    group = stable_group()
    assert check_heartbeat(group, "a", 1) is group.members["a"]
    assert check_member(group, "b") is group.members["b"]


def test_heartbeat_accepts_the_acked_and_the_current_generation_while_starting() -> None:
    group = stable_group()
    add(group, "c", 1.0)  # joins in generation 1
    plan(group)  # generation 2, STARTING; nobody has acked yet
    start(group, "a")
    assert group.generation == 2
    # a acknowledged generation 2; b has not (StartFetchers and a heartbeat may cross).
    assert check_heartbeat(group, "a", 2) is group.members["a"]
    assert check_heartbeat(group, "b", 1) is group.members["b"]
    assert check_heartbeat(group, "b", 2) is group.members["b"]
    assert check_heartbeat(group, "c", 1) is group.members["c"]
    with pytest.raises(IllegalGenerationError):
        check_heartbeat(group, "a", 1)  # a has moved on: 1 is neither acked nor current
    with pytest.raises(IllegalGenerationError):
        check_heartbeat(group, "b", 0)


# -- commits: who may commit what ------------------------------------------------------------


def test_owner_commits_its_partitions_when_stable() -> None:
    group = stable_group()
    commit(group, "a", 1, PO("t", 0, 5), PO("t", 1, 0, "meta"))
    commit(group, "b", 1, PO("t", 3, 9))
    commit(group, "a", 1)  # nothing to commit is fine too
    assert group.offsets == {}  # a check only: nothing changes


def test_commit_from_unknown_member_is_refused() -> None:
    group = stable_group()
    with pytest.raises(UnknownMemberError):
        commit(group, "zed", 1, PO("t", 0, 5))


@pytest.mark.parametrize("generation", [0, 2])
def test_commit_with_a_stale_generation_is_refused(generation) -> None:
    group = stable_group()
    with pytest.raises(IllegalGenerationError, match=f"generation {generation} is stale"):
        commit(group, "a", generation, PO("t", 0, 5))


def test_commit_for_a_partition_not_owned_is_refused() -> None:
    group = stable_group()
    with pytest.raises(PartitionNotOwnedError, match="'a' does not own t-2 in generation 1"):
        commit(group, "a", 1, PO("t", 0, 5), PO("t", 2, 5))
    with pytest.raises(PartitionNotOwnedError):
        commit(group, "a", 1, PO("u", 0, 5))


def test_commit_during_stopping_for_a_partition_still_fetched_is_accepted() -> None:
    # The member commits its progress in on_revoked, before it acks StopFetchers.
    group = stable_group()
    group.begin_rebalance()
    assert group.state is GroupState.STOPPING
    commit(group, "a", 1, PO("t", 0, 5), PO("t", 1, 6))
    commit(group, "b", 1, PO("t", 2, 5))


def test_commit_during_stopping_for_a_partition_already_stopped_is_refused() -> None:
    group = stable_group()
    group.begin_rebalance()
    group.member_stopped("a", [PO("t", 0, 5)])
    with pytest.raises(RebalanceInProgressError, match="already stopped t-0") as info:
        commit(group, "a", 1, PO("t", 0, 5))
    assert info.value.retriable
    commit(group, "b", 1, PO("t", 2, 5))  # b has not stopped yet
    with pytest.raises(PartitionNotOwnedError):
        commit(group, "b", 1, PO("t", 0, 5))  # never b's, rebalance or not


def test_commit_while_assigning_is_refused() -> None:
    group = stable_group()
    for member in group.begin_rebalance():
        group.member_stopped(member.member_id, [])
    group.plan_assignment(
        0.0, partitions={"t": 4}, available=ASSIGNORS, log_offsets=lambda tp: (0, 0)
    )
    assert group.state is GroupState.ASSIGNING
    with pytest.raises(RebalanceInProgressError):
        commit(group, "a", 1, PO("t", 0, 5))


def test_commit_while_starting_needs_the_members_start_ack() -> None:
    group = stable_group()
    add(group, "c", 1.0)
    plan(group)  # generation 2: a t-0 t-1, b t-2, c t-3
    assert group.state is GroupState.STARTING and group.generation == 2
    with pytest.raises(IllegalGenerationError):
        commit(group, "a", 1, PO("t", 0, 5))  # generation 1 is over
    with pytest.raises(RebalanceInProgressError):
        commit(group, "a", 2, PO("t", 0, 5))  # not started yet
    group.member_starting("a")
    with pytest.raises(RebalanceInProgressError):
        commit(group, "a", 2, PO("t", 0, 5))  # StartFetchers not acknowledged yet
    group.member_started("a")
    commit(group, "a", 2, PO("t", 0, 5), PO("t", 1, 5))
    with pytest.raises(PartitionNotOwnedError):
        commit(group, "a", 2, PO("t", 2, 5))


def test_commit_for_a_started_partition_is_accepted_after_a_restart() -> None:
    # StartFetchers(2) reached a, but the rebalance restarted before its ack was handled:
    # a may be fetching generation 2's partitions and may commit them in on_revoked.
    group = stable_group()
    add(group, "c", 1.0)
    plan(group)
    group.member_starting("a")
    group.remove_member(1.0, "c", stopped=True)
    group.begin_rebalance()
    assert group.members["a"].generation == 1
    commit(group, "a", 2, PO("t", 0, 5))
    with pytest.raises(RebalanceInProgressError):
        commit(group, "b", 2, PO("t", 2, 5))  # b was never started on it


def test_commit_from_a_new_member_before_its_first_assignment_is_refused() -> None:
    group = Group("g", now=0.0)
    add(group, "a")
    assert group.state is GroupState.EMPTY  # the rebalance has not begun yet
    with pytest.raises(PartitionNotOwnedError):
        commit(group, "a", 0, PO("t", 0, 5))


# -- commits: the offsets themselves -------------------------------------------------------------


def test_negative_offset_is_refused() -> None:
    group = stable_group()
    with pytest.raises(InvalidRequestError, match="offset -1 for t-0 is negative"):
        commit(group, "a", 1, PO("t", 0, -1))
    with pytest.raises(InvalidRequestError):
        commit(group, "a", 1, PO("t", 0, -5), allow=True)


def test_regression_is_refused_unless_allowed() -> None:
    group = stable_group()
    group.replay(OffsetRecord("g", "t", 0, 50), now=0.0)
    with pytest.raises(OffsetRegressionError, match=r"back from 50.*allow_regression=True"):
        commit(group, "a", 1, PO("t", 0, 49))
    commit(group, "a", 1, PO("t", 0, 49), allow=True)
    commit(group, "a", 1, PO("t", 0, 50))  # the same offset is no regression
    commit(group, "a", 1, PO("t", 0, 51))
    commit(group, "a", 1, PO("t", 1, 0))  # no committed offset yet: anything goes


# -- standalone committers -------------------------------------------------------------------------


def test_standalone_committer_may_commit_to_a_group_without_members() -> None:
    group = Group("g", now=0.0)
    check_commit(
        group,
        "",
        STANDALONE_GENERATION,
        [PO("t", 0, 5), PO("u", 3, 1)],
        allow_regression=False,
        partitions=TOPICS,
    )
    group.replay(OffsetRecord("g", "t", 0, 50), now=0.0)
    with pytest.raises(OffsetRegressionError):
        commit(group, "", STANDALONE_GENERATION, PO("t", 0, 5))
    commit(group, "", STANDALONE_GENERATION, PO("t", 0, 5), allow=True)
    with pytest.raises(InvalidRequestError):
        commit(group, "", STANDALONE_GENERATION, PO("t", 0, -2))


def test_standalone_committer_is_refused_while_the_group_has_members() -> None:
    group = stable_group()
    with pytest.raises(UnknownMemberError, match="2 active member"):
        commit(group, "", STANDALONE_GENERATION, PO("t", 0, 5))
    group.remove_member(1.0, "a", stopped=True)
    group.remove_member(1.0, "b", stopped=True)
    assert group.state is GroupState.EMPTY
    commit(group, "", STANDALONE_GENERATION, PO("t", 0, 5))


def test_empty_member_id_with_a_real_generation_is_not_standalone() -> None:
    group = Group("g", now=0.0)
    with pytest.raises(UnknownMemberError):
        commit(group, "", 0, PO("t", 0, 5))


def test_commits_only_to_partitions_that_exist() -> None:
    group = Group("g", now=0.0)
    with pytest.raises(UnknownTopicError, match="topic 'nope' does not exist"):
        commit(group, "", STANDALONE_GENERATION, PO("nope", 0, 1))
    with pytest.raises(InvalidPartitionsError, match="has partitions 0 to 3"):
        commit(group, "", STANDALONE_GENERATION, PO("t", 4, 1))
    assert group.offsets == {}
