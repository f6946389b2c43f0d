"""The sticky and uniform assignors: balanced first, then keeping what members own.

What a user relies on (trio_coord/core/assignors.py, docs/assignment.md):

* balanced: no member could take a partition of a topic it subscribes to from
  a member that has at least two more partitions;
* with identical subscriptions, the most owned (member, partition) pairs kept
  of any balanced assignment: a joiner's share is all that moves, taken from
  the most loaded; a leaver's partitions are all that move;
* with any subscriptions, locally sticky: no partition can go back to a member
  that owned it (alone, or in exchange for one of the new holder's that it
  holds) without unbalancing; an assignment fed back comes back unchanged;
* uniform only: no hand-over of one partition and no exchange of two lowers
  the sum of squared per-topic counts while keeping the balance and at least
  as many owned pairs; so a new group with identical subscriptions gets every
  topic within one between members.

The checks below are written from those definitions, independently of the
algorithm, and small cases are compared against brute force.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_assignors import tps

from trio_coord.core.assignors import (
    Assignment,
    GroupSpec,
    MemberSpec,
    RoundRobinAssignor,
    StickyAssignor,
    UniformAssignor,
    validate_assignment,
)
from trio_coord.protocol.messages import TopicPartition as TP

sticky = StickyAssignor()
uniform = UniformAssignor()
BOTH = pytest.mark.parametrize("assignor", [sticky, uniform], ids=lambda a: a.name)


def spec(
    members: Mapping[str, Iterable[str]],
    partitions: Mapping[str, int],
    owned: Mapping[str, Iterable[TP]] | None = None,
) -> GroupSpec:
    """Members by id with their topics (``"tu"`` is topics t and u) and what they own."""
    owned = owned or {}
    return GroupSpec(
        members={
            m: MemberSpec(m, frozenset(topics), frozenset(owned.get(m, ())))
            for m, topics in members.items()
        },
        partitions=dict(partitions),
    )


def fed_back(s: GroupSpec, result: Mapping[str, Iterable[TP]], **changes) -> GroupSpec:
    """``s`` with every member owning what ``result`` gave it; ``changes`` maps a member
    id to its topics (a new member, or new topics) or to None (it left)."""
    members = {m: sorted(spec_.topics) for m, spec_ in s.members.items()}
    for member_id, topics in changes.items():
        if topics is None:
            del members[member_id]
        else:
            members[member_id] = topics
    return spec(members, s.partitions, result)


# -- the definitions, written out -------------------------------------------------------------


def live_topics(s: GroupSpec, member_id: str) -> set[str]:
    return {t for t in s.members[member_id].topics if s.partitions.get(t, 0) > 0}


def unbalanced_pairs(s: GroupSpec, result: Mapping[str, list[TP]]) -> list[tuple[str, str]]:
    """(rich, poor): poor could take a partition it subscribes to from rich, who has 2+ more."""
    found = []
    for rich, poor in itertools.permutations(result, 2):
        if len(result[rich]) >= len(result[poor]) + 2 and any(
            tp.topic in live_topics(s, poor) for tp in result[rich]
        ):
            found.append((rich, poor))
    return found


def is_balanced(s: GroupSpec, result: Mapping[str, list[TP]]) -> bool:
    return not unbalanced_pairs(s, result)


def valid_owners(s: GroupSpec) -> dict[TP, str]:
    """Each partition's owner that counts: subscribed, existing, first claimant by id."""
    owners: dict[TP, str] = {}
    for member_id in sorted(s.members):
        for tp in s.members[member_id].owned:
            if tp.topic in live_topics(s, member_id) and 0 <= tp.partition < s.partitions[tp.topic]:
                owners.setdefault(tp, member_id)
    return owners


def kept(s: GroupSpec, result: Mapping[str, list[TP]]) -> int:
    owners = valid_owners(s)
    return sum(1 for m, owned in result.items() for tp in owned if owners.get(tp) == m)


def moved(before: Mapping[str, list[TP]], after: Mapping[str, list[TP]]) -> int:
    """Partitions whose owner changed (a partition nobody owned before counts too)."""
    old = {tp: m for m, owned in before.items() for tp in owned}
    return sum(1 for m, owned in after.items() for tp in owned if old.get(tp) != m)


def phi(result: Mapping[str, list[TP]]) -> int:
    """Sum over members and topics of (partitions of that topic it holds) ** 2."""
    counts = [Counter(tp.topic for tp in owned) for owned in result.values()]
    return sum(n * n for per_topic in counts for n in per_topic.values())


def all_partitions(s: GroupSpec) -> list[TP]:
    return [TP(t, p) for t in s.topics() for p in range(s.partitions[t])]


def brute_force_best_kept(s: GroupSpec) -> int:
    """The most owned pairs any complete, exclusive, balanced assignment keeps."""
    parts = all_partitions(s)
    choices = [[m for m in sorted(s.members) if tp.topic in live_topics(s, m)] for tp in parts]
    best = -1
    for combo in itertools.product(*choices):
        result: Assignment = {m: [] for m in s.members}
        for tp, member_id in zip(parts, combo, strict=True):
            result[member_id].append(tp)
        if is_balanced(s, result):
            best = max(best, kept(s, result))
    return best


def _moved_copy(result: Mapping[str, list[TP]], *moves: tuple[TP, str, str]) -> Assignment:
    out = {m: list(owned) for m, owned in result.items()}
    for tp, src, dst in moves:
        out[src].remove(tp)
        out[dst].append(tp)
    return out


def give_backs(s: GroupSpec, result: Mapping[str, list[TP]]) -> list[tuple]:
    """Ways to return owned partitions (alone or two in exchange) that keep the balance."""
    owners = valid_owners(s)
    holder = {tp: m for m, owned in result.items() for tp in owned}
    lost = [(tp, o, holder[tp]) for tp, o in owners.items() if holder[tp] != o]
    found = []
    for tp, o, h in lost:
        if is_balanced(s, _moved_copy(result, (tp, h, o))):
            found.append((tp, h, o))
        for tq, o2, h2 in lost:
            if (o2, h2) == (h, o) and is_balanced(s, _moved_copy(result, (tp, h, o), (tq, o, h))):
                found.append((tp, tq))
    return found


def uniform_improvements(s: GroupSpec, result: Mapping[str, list[TP]]) -> list[tuple]:
    """Hand-overs and exchanges that lower phi, keep the balance and the owned pairs kept."""
    base, floor = phi(result), kept(s, result)
    held = [(tp, m) for m, owned in result.items() for tp in owned]
    found = []

    def better(candidate: Assignment) -> bool:
        return phi(candidate) < base and kept(s, candidate) >= floor and is_balanced(s, candidate)

    for tp, x in held:
        for y in result:
            if y != x and tp.topic in live_topics(s, y):
                if better(_moved_copy(result, (tp, x, y))):
                    found.append((tp, x, y))
        for tq, y in held:
            if (
                y != x
                and tq.topic != tp.topic
                and tp.topic in live_topics(s, y)
                and tq.topic in live_topics(s, x)
                and better(_moved_copy(result, (tp, x, y), (tq, y, x)))
            ):
                found.append((tp, x, tq, y))
    return found


def check_valid(s: GroupSpec, result: Assignment) -> None:
    validate_assignment(s, result)
    assert list(result) == sorted(s.members)
    assert all(owned == sorted(owned) for owned in result.values())
    assert is_balanced(s, result), unbalanced_pairs(s, result)


# -- strategies -------------------------------------------------------------------------------

TOPICS = ["t", "u", "v"]
member_ids = st.text(alphabet="abcdefgh", min_size=1, max_size=2)


@st.composite
def groups(
    draw,
    *,
    identical: bool | None = None,
    max_members: int = 6,
    max_partitions: int = 8,
    owned: bool = True,
) -> GroupSpec:
    """Groups whose members own random partitions: some of topics they do not
    subscribe to, some that do not exist, some claimed twice."""
    ids = draw(st.lists(member_ids, min_size=1, max_size=max_members, unique=True))
    if identical is None:
        identical = draw(st.booleans())
    topic_sets = st.frozensets(st.sampled_from([*TOPICS, "absent"]), min_size=1)
    shared = draw(topic_sets)
    partitions = draw(
        st.dictionaries(st.sampled_from(TOPICS), st.integers(0, max_partitions), min_size=1)
    )
    universe = [TP(t, p) for t in [*TOPICS, "absent"] for p in range(max_partitions + 1)]
    members = {}
    for m in ids:
        topics = shared if identical else draw(topic_sets)
        mine = draw(st.frozensets(st.sampled_from(universe), max_size=10)) if owned else frozenset()
        members[m] = MemberSpec(m, topics, mine)
    return GroupSpec(members=members, partitions=partitions)


def small(s: GroupSpec) -> bool:
    """Small enough for brute force over every assignment."""
    return len(all_partitions(s)) <= 6 and len(s.members) <= 3


def shuffled(s: GroupSpec, data: st.DataObject) -> GroupSpec:
    members = data.draw(st.permutations(list(s.members.items())))
    partitions = data.draw(st.permutations(list(s.partitions.items())))
    rebuilt = {
        m: MemberSpec(m, frozenset(data.draw(st.permutations(sorted(ms.topics)))), ms.owned)
        for m, ms in members
    }
    return GroupSpec(members=rebuilt, partitions=dict(partitions))


# -- worked examples (the tables of docs/assignment.md) ----------------------------------------

THREE = {"a": "tu", "b": "tu", "c": "tu"}
SIZES = {"t": 4, "u": 2}


@settings(max_examples=100, deadline=None)
@given(s=groups(identical=True, owned=False, max_members=8, max_partitions=12))
def test_property_a_new_group_with_identical_subscriptions_is_dealt_like_roundrobin(s) -> None:
    assert sticky.assign(s) == uniform.assign(s) == RoundRobinAssignor().assign(s)


@BOTH
def test_a_new_group_with_identical_subscriptions_is_dealt_like_roundrobin(assignor) -> None:
    assert assignor.assign(spec(THREE, SIZES)) == {
        "a": tps("t-0", "t-3"),
        "b": tps("t-1", "u-0"),
        "c": tps("t-2", "u-1"),
    }


def test_on_a_leave_sticky_moves_only_the_leavers_partitions() -> None:
    before = sticky.assign(spec(THREE, SIZES))
    after = sticky.assign(fed_back(spec(THREE, SIZES), before, c=None))
    assert after == {"a": tps("t-0", "t-2", "t-3"), "b": tps("t-1", "u-0", "u-1")}
    assert moved(before, after) == 2


def test_on_a_leave_uniform_moves_as_little_and_evens_out_the_topics() -> None:
    # c's t-2 and u-1 move, as with sticky, but each survivor gets one of each topic.
    before = uniform.assign(spec(THREE, SIZES))
    after = uniform.assign(fed_back(spec(THREE, SIZES), before, c=None))
    assert after == {"a": tps("t-0", "t-3", "u-1"), "b": tps("t-1", "t-2", "u-0")}
    assert moved(before, after) == 2


def test_on_a_join_sticky_takes_the_share_from_the_first_of_the_most_loaded() -> None:
    before = sticky.assign(spec(THREE, SIZES))
    after = sticky.assign(fed_back(spec(THREE, SIZES), before, d="tu"))
    assert after == {
        "a": tps("t-0", "t-3"),
        "b": tps("t-1", "u-0"),
        "c": tps("t-2"),
        "d": tps("u-1"),
    }


def test_on_a_join_uniform_takes_the_share_from_the_most_lopsided() -> None:
    # a, b and c own two each; a owns two of t, so a is the one that gives one up.
    before = uniform.assign(spec(THREE, SIZES))
    after = uniform.assign(fed_back(spec(THREE, SIZES), before, d="tu"))
    assert after == {
        "a": tps("t-0"),
        "b": tps("t-1", "u-0"),
        "c": tps("t-2", "u-1"),
        "d": tps("t-3"),
    }
    assert moved(before, after) == 1


@BOTH
def test_overall_balance_wins_over_spreading_a_topic(assignor) -> None:
    # Only a subscribes to u; giving a a partition of t as well would let b take it.
    result = assignor.assign(spec({"a": "tu", "b": "t"}, {"t": 2, "u": 2}))
    assert result == {"a": tps("u-0", "u-1"), "b": tps("t-0", "t-1")}


def test_keeping_ownership_wins_over_spreading_a_topic() -> None:
    # a leaves. t-0 must go to b (c would have three, b one) and nothing else moves,
    # though b: t-0, u-0 and c: t-1, v-0 would spread t evenly at the cost of two moves.
    s = spec(
        {"b": "tuv", "c": "tuv"},
        {"t": 2, "u": 1, "v": 1},
        {"a": tps("t-0"), "b": tps("t-1"), "c": tps("u-0", "v-0")},
    )
    assert uniform.assign(s) == {"b": tps("t-0", "t-1"), "c": tps("u-0", "v-0")}


# -- edge cases -------------------------------------------------------------------------------


@BOTH
def test_a_partition_claimed_twice_counts_for_the_first_member_by_id(assignor) -> None:
    s = spec({"b": "t", "a": "t"}, {"t": 2}, {"b": tps("t-0", "t-1"), "a": tps("t-0")})
    assert assignor.assign(s) == {"a": tps("t-0"), "b": tps("t-1")}
    # With a's claim on t-1 instead, b's t-1 goes to a, who claims it first.
    s = spec({"a": "t", "b": "t"}, {"t": 2}, {"a": tps("t-1"), "b": tps("t-0", "t-1")})
    assert assignor.assign(s) == {"a": tps("t-1"), "b": tps("t-0")}


@BOTH
def test_claims_on_partitions_that_cannot_count_are_ignored(assignor) -> None:
    plain = spec({"a": "t", "b": "tu"}, {"t": 3, "u": 1})
    stale = spec(
        {"a": "t", "b": "tu"},
        {"t": 3, "u": 1},
        # u-0: a does not subscribe; t-7: no such partition; gone-0: no such topic.
        {"a": tps("u-0", "t-7", "gone-0")},
    )
    assert assignor.assign(stale) == assignor.assign(plain)


@BOTH
def test_members_without_an_existing_topic_get_nothing_and_do_not_count(assignor) -> None:
    result = assignor.assign(spec({"a": "t", "b": ["missing"], "c": "u"}, {"t": 3, "u": 0}))
    assert result == {"a": tps("t-0", "t-1", "t-2"), "b": [], "c": []}


@BOTH
def test_no_members_or_no_partitions(assignor) -> None:
    assert assignor.assign(spec({}, {"t": 3})) == {}
    assert assignor.assign(spec({"a": "t"}, {})) == {"a": []}


# -- properties: every group ------------------------------------------------------------------


@BOTH
@settings(max_examples=120, deadline=None)
@given(s=groups(), data=st.data())
def test_property_balanced_complete_exclusive_deterministic(assignor, s, data) -> None:
    result = assignor.assign(s)
    check_valid(s, result)
    assert assignor.assign(shuffled(s, data)) == result


@BOTH
@settings(max_examples=100, deadline=None)
@given(s=groups())
def test_property_an_assignment_fed_back_comes_back_unchanged(assignor, s) -> None:
    result = assignor.assign(s)
    assert assignor.assign(fed_back(s, result)) == result


@BOTH
@settings(max_examples=100, deadline=None)
@given(s=groups())
def test_property_no_partition_can_go_back_to_its_owner(assignor, s) -> None:
    result = assignor.assign(s)
    assert give_backs(s, result) == []


@BOTH
@settings(max_examples=100, deadline=None)
@given(s=groups(identical=True, max_members=3, max_partitions=3).filter(small))
def test_property_identical_subscriptions_keep_the_most_owned_pairs(assignor, s) -> None:
    assert kept(s, assignor.assign(s)) == brute_force_best_kept(s)


@BOTH
@settings(max_examples=100, deadline=None)
@given(s=groups(identical=False, max_members=3, max_partitions=3).filter(small))
def test_property_mixed_subscriptions_keep_no_more_than_possible(assignor, s) -> None:
    # Not a promise of the maximum (local stickiness is): a sanity check of the checkers.
    assert kept(s, assignor.assign(s)) <= brute_force_best_kept(s)


# -- properties: joins and leaves ---------------------------------------------------------------


@BOTH
@settings(max_examples=120, deadline=None)
@given(s=groups(identical=True), newcomer=member_ids)
def test_property_a_join_moves_only_the_newcomers_share(assignor, s, newcomer) -> None:
    if newcomer in s.members:
        return
    before = assignor.assign(s)
    topics = sorted(next(iter(s.members.values())).topics)
    after = assignor.assign(fed_back(s, before, **{newcomer: topics}))
    check_valid(fed_back(s, before, **{newcomer: topics}), after)
    total = len(all_partitions(s))
    assert len(after[newcomer]) == total // (len(s.members) + 1)
    assert moved(before, after) == len(after[newcomer])
    assert all(set(after[m]) <= set(before[m]) for m in s.members)
    # The share comes from the most loaded: whoever gave has at least as many as whoever did not.
    gave = [len(before[m]) for m in s.members if after[m] != before[m]]
    kept_all = [len(before[m]) for m in s.members if after[m] == before[m]]
    if gave and kept_all:
        assert min(gave) >= max(kept_all)


@BOTH
@settings(max_examples=120, deadline=None)
@given(s=groups(identical=True), data=st.data())
def test_property_a_leave_moves_only_the_leavers_partitions(assignor, s, data) -> None:
    before = assignor.assign(s)
    leaver = data.draw(st.sampled_from(sorted(s.members)))
    after = assignor.assign(fed_back(s, before, **{leaver: None}))
    assert moved(before, after) == (len(before[leaver]) if len(s.members) > 1 else 0)
    assert all(set(after[m]) >= set(before[m]) for m in after)


@BOTH
@settings(max_examples=100, deadline=None)
@given(s=groups(identical=False), data=st.data())
def test_property_mixed_joins_and_leaves_are_balanced_and_locally_sticky(assignor, s, data) -> None:
    # With mixed subscriptions a leave can force more than the leaver's partitions to move
    # (docs/assignment.md has the example); what holds is balance and that no partition
    # that moved could have stayed on its own.
    before = assignor.assign(s)
    if data.draw(st.booleans()) and len(s.members) > 1:
        changed = fed_back(s, before, **{data.draw(st.sampled_from(sorted(s.members))): None})
    else:
        newcomer = data.draw(member_ids.filter(lambda m: m not in s.members))
        changed = fed_back(s, before, **{newcomer: data.draw(st.sampled_from(["t", "tu", "uv"]))})
    after = assignor.assign(changed)
    check_valid(changed, after)
    assert give_backs(changed, after) == []


def test_a_mixed_leave_can_force_other_partitions_to_move() -> None:
    # c leaves; only b subscribes to u besides c, so b takes u-1 and then has three to a's
    # one: b must give a t-1 as well. Two moves for one leaver's partition.
    s = spec({"a": "t", "b": "tu", "c": "u"}, {"t": 2, "u": 2})
    before = sticky.assign(s)
    assert before == {"a": tps("t-0"), "b": tps("t-1", "u-0"), "c": tps("u-1")}
    after = sticky.assign(fed_back(s, before, c=None))
    assert after == {"a": tps("t-0", "t-1"), "b": tps("u-0", "u-1")}
    assert moved(before, after) == 2


@st.composite
def churn(draw) -> tuple[dict[str, int], list[str | None]]:
    """Partition counts and a list of steps: a member id joins, or None (someone leaves)."""
    partitions = draw(st.dictionaries(st.sampled_from(TOPICS), st.integers(1, 12), min_size=1))
    steps = draw(st.lists(st.one_of(st.none(), member_ids), min_size=1, max_size=25))
    return partitions, steps


@BOTH
@settings(max_examples=60, deadline=None)
@given(plan=churn(), data=st.data())
def test_property_a_join_and_leave_sequence_moves_the_least_each_time(assignor, plan, data):
    partitions, steps = plan
    total = sum(partitions.values())
    topics = sorted(partitions)
    current: Assignment = {}
    for step in steps:
        members = {m: topics for m in current}
        if step is None:
            if not current:
                continue
            leaver = data.draw(st.sampled_from(sorted(current)))
            del members[leaver]
            expected = len(current[leaver]) if members else 0
        elif step in current:
            continue
        else:
            members[step] = topics
            expected = total // len(members)
        s = spec(members, partitions, current)
        after = assignor.assign(s)
        check_valid(s, after)
        assert moved(current, after) == expected
        current = after


# -- properties: uniform ----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(s=groups(max_members=4, max_partitions=4))
def test_property_uniform_leaves_no_hand_over_or_exchange_that_evens_out(s) -> None:
    assert uniform_improvements(s, uniform.assign(s)) == []


@settings(max_examples=100, deadline=None)
@given(s=groups(identical=True, owned=False, max_members=8, max_partitions=12))
def test_property_uniform_new_identical_group_spreads_every_topic_within_one(s) -> None:
    result = uniform.assign(s)
    for topic in s.topics():
        counts = [sum(1 for tp in result[m] if tp.topic == topic) for m in s.members]
        assert max(counts) - min(counts) <= 1, (topic, counts)
    totals = [len(owned) for owned in result.values()]
    assert max(totals) - min(totals) <= 1


@settings(max_examples=100, deadline=None)
@given(s=groups(identical=True))
def test_property_uniform_keeps_as_many_owned_pairs_as_sticky(s) -> None:
    assert kept(s, uniform.assign(s)) == kept(s, sticky.assign(s))
