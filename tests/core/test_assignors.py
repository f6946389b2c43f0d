"""The server-side assignors: exact examples, edge cases and properties.

A user relies on an assignor being complete (no subscribed partition left
unconsumed), exclusive (no partition consumed twice), deterministic (every
coordinator computes the same assignment from the same group) and balanced
within what each strategy promises.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_coord.core.assignors import (
    ASSIGNORS,
    BUILTIN_ASSIGNORS,
    Assignment,
    GroupSpec,
    MemberSpec,
    RangeAssignor,
    RoundRobinAssignor,
    choose_assignor,
    collector_paused,
    make_registry,
    validate_assignment,
)
from trio_coord.core.group import AssignmentInput, Group
from trio_coord.protocol.messages import TopicPartition as TP


def spec(members: dict[str, set[str]], partitions: dict[str, int]) -> GroupSpec:
    return GroupSpec(
        members={m: MemberSpec(m, frozenset(topics)) for m, topics in members.items()},
        partitions=partitions,
    )


def tps(*names: str) -> list[TP]:
    """``tps("t-0", "u-1")`` → [TP("t", 0), TP("u", 1)]."""
    out = []
    for name in names:
        topic, _, partition = name.rpartition("-")
        out.append(TP(topic, int(partition)))
    return out


range_ = RangeAssignor()
roundrobin = RoundRobinAssignor()
EVERY = pytest.mark.parametrize("assignor", BUILTIN_ASSIGNORS, ids=lambda a: a.name)


# -- the worked examples of the module docstring ------------------------------------------


def test_range_docstring_example() -> None:
    result = range_.assign(spec({"a": {"t"}, "b": {"t"}}, {"t": 5}))
    assert result == {"a": tps("t-0", "t-1", "t-2"), "b": tps("t-3", "t-4")}


def test_roundrobin_docstring_example() -> None:
    result = roundrobin.assign(spec({"a": {"t", "u"}, "b": {"t", "u"}}, {"t": 3, "u": 2}))
    assert result == {"a": tps("t-0", "t-2", "u-1"), "b": tps("t-1", "u-0")}


def test_registry_holds_the_four_builtins_by_name() -> None:
    assert list(ASSIGNORS) == ["range", "roundrobin", "sticky", "uniform"]
    assert all(name == assignor.name for name, assignor in ASSIGNORS.items())


# -- range ------------------------------------------------------------------------------------


def test_range_gives_larger_blocks_to_the_first_members_per_topic() -> None:
    result = range_.assign(spec({"a": {"t"}, "b": {"t"}, "c": {"t"}}, {"t": 7}))
    assert result == {
        "a": tps("t-0", "t-1", "t-2"),
        "b": tps("t-3", "t-4"),
        "c": tps("t-5", "t-6"),
    }


def test_range_splits_each_topic_among_its_own_subscribers() -> None:
    result = range_.assign(spec({"a": {"t", "u"}, "b": {"u"}, "c": {"t"}}, {"t": 3, "u": 4}))
    assert result == {
        "a": tps("t-0", "t-1", "u-0", "u-1"),
        "b": tps("u-2", "u-3"),
        "c": tps("t-2"),
    }


def test_range_more_members_than_partitions_leaves_the_last_ones_idle() -> None:
    result = range_.assign(spec({"a": {"t"}, "b": {"t"}, "c": {"t"}}, {"t": 2}))
    assert result == {"a": tps("t-0"), "b": tps("t-1"), "c": []}


# -- roundrobin ------------------------------------------------------------------------------


def test_roundrobin_skips_members_that_do_not_subscribe() -> None:
    # Dealing order a, b, c, a, ...: t-0 a, t-1 b, t-2 a (c skipped), then u continues the
    # circle at b: u-0 b (skipping nothing), u-1 c.
    result = roundrobin.assign(spec({"a": {"t"}, "b": {"t", "u"}, "c": {"u"}}, {"t": 3, "u": 2}))
    assert result == {"a": tps("t-0", "t-2"), "b": tps("t-1", "u-0"), "c": tps("u-1")}


def test_roundrobin_deals_across_topics_not_per_topic() -> None:
    # Per topic a range/restart would give a both t-0 and u-0; dealing continues instead.
    result = roundrobin.assign(spec({"a": {"t", "u"}, "b": {"t", "u"}}, {"t": 1, "u": 1}))
    assert result == {"a": tps("t-0"), "b": tps("u-0")}


# -- every built-in assignor ----------------------------------------------------------------


@EVERY
def test_members_without_an_existing_subscribed_topic_get_nothing(assignor) -> None:
    result = assignor.assign(
        spec({"a": {"t"}, "b": {"missing"}, "c": {"u"}}, {"t": 2, "u": 0, "other": 3})
    )
    assert result == {"a": tps("t-0", "t-1"), "b": [], "c": []}


@EVERY
def test_unsubscribed_topics_are_not_assigned(assignor) -> None:
    result = assignor.assign(spec({"a": {"t"}}, {"t": 1, "u": 5}))
    assert result == {"a": tps("t-0")}


@EVERY
def test_no_members_no_assignment(assignor) -> None:
    assert assignor.assign(spec({}, {"t": 3})) == {}


@EVERY
def test_result_is_independent_of_dict_insertion_order(assignor) -> None:
    members = {"b": {"t", "u"}, "a": {"u"}, "c": {"t", "v"}, "d": {"v", "u"}}
    partitions = {"v": 2, "t": 5, "u": 3}
    forward = assignor.assign(spec(members, partitions))
    backward = assignor.assign(
        spec(dict(reversed(members.items())), dict(reversed(partitions.items())))
    )
    assert forward == backward
    assert list(forward) == ["a", "b", "c", "d"]


# -- choose_assignor ----------------------------------------------------------------------------


def test_choose_takes_the_first_members_order_among_common_names() -> None:
    prefs = [("roundrobin", "range"), ("range", "roundrobin")]
    assert choose_assignor(prefs, ASSIGNORS) == "roundrobin"
    assert choose_assignor(list(reversed(prefs)), ASSIGNORS) == "range"


def test_choose_skips_names_not_common_to_every_member() -> None:
    prefs = [("roundrobin", "sticky", "range"), ("range", "sticky")]
    assert choose_assignor(prefs, ASSIGNORS) == "sticky"


def test_choose_skips_names_the_broker_does_not_have() -> None:
    prefs = [("cooperative-sticky", "range"), ("cooperative-sticky", "range")]
    assert choose_assignor(prefs, ASSIGNORS) == "range"


@pytest.mark.parametrize(
    "prefs",
    [
        [],
        [()],
        [("range",), ("roundrobin",)],
        [("cooperative-sticky",), ("cooperative-sticky",)],
        [("range", "roundrobin"), ()],
    ],
)
def test_choose_returns_none_without_a_usable_common_name(prefs) -> None:
    assert choose_assignor(prefs, ASSIGNORS) is None


def test_choose_accepts_any_iterable_of_lists() -> None:
    assert choose_assignor(iter([["range"], ("range", "roundrobin")]), ASSIGNORS) == "range"


# -- properties -----------------------------------------------------------------------------

TOPICS = ["t0", "t1", "t2", "t3"]
member_ids = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
subscriptions = st.frozensets(st.sampled_from([*TOPICS, "absent"]), min_size=1, max_size=5)


@st.composite
def group_specs(draw, *, identical: bool = False) -> GroupSpec:
    ids = draw(st.lists(member_ids, min_size=1, max_size=8, unique=True))
    # What members own matters only to sticky and uniform; some of it is stale.
    owned = st.frozensets(st.builds(TP, st.sampled_from([*TOPICS, "absent"]), st.integers(0, 13)))
    shared = draw(subscriptions)
    members = {
        m: MemberSpec(m, shared if identical else draw(subscriptions), draw(owned)) for m in ids
    }
    partitions = draw(
        st.dictionaries(st.sampled_from(TOPICS), st.integers(min_value=0, max_value=12))
    )
    return GroupSpec(members=members, partitions=partitions)


def expected_partitions(s: GroupSpec) -> set[TP]:
    wanted = set().union(*(m.topics for m in s.members.values()))
    return {TP(t, p) for t, n in s.partitions.items() if t in wanted for p in range(n)}


def check_complete_and_exclusive(s: GroupSpec, result: Assignment) -> None:
    assert set(result) == set(s.members), "every member appears in the result"
    assigned = [tp for owned in result.values() for tp in owned]
    counts = Counter(assigned)
    assert not [tp for tp, n in counts.items() if n > 1], "a partition was assigned twice"
    assert set(assigned) == expected_partitions(s)
    for member_id, owned in result.items():
        assert owned == sorted(owned)
        for tp in owned:
            assert tp.topic in s.members[member_id].topics, f"{member_id} got {tp} unsubscribed"


def shuffled(s: GroupSpec, data: st.DataObject) -> GroupSpec:
    members = data.draw(st.permutations(list(s.members.items())))
    partitions = data.draw(st.permutations(list(s.partitions.items())))
    return GroupSpec(members=dict(members), partitions=dict(partitions))


@EVERY
@settings(max_examples=150, deadline=None)
@given(s=group_specs(), data=st.data())
def test_property_complete_exclusive_deterministic(assignor, s: GroupSpec, data) -> None:
    result = assignor.assign(s)
    check_complete_and_exclusive(s, result)
    validate_assignment(s, result)
    assert assignor.assign(s) == result
    assert assignor.assign(shuffled(s, data)) == result


HASH_SEED_PROGRAM = """
import json, random
from trio_coord.core.assignors import ASSIGNORS, GroupSpec, MemberSpec
from trio_coord.protocol.messages import TopicPartition

rng = random.Random(7)
topics = [f"topic-{i}" for i in range(6)]
partitions = {t: rng.randint(1, 9) for t in topics}
every = [TopicPartition(t, p) for t in topics for p in range(partitions[t])]
for shape in ("identical", "mixed"):
    members = {}
    for i in range(9):
        mine = frozenset(topics) if shape == "identical" else frozenset(rng.sample(topics, 3))
        owned = frozenset(rng.sample(every, 6))
        members[f"member-{i}"] = MemberSpec(f"member-{i}", mine, owned)
    spec = GroupSpec(members, partitions)
    for name, assignor in ASSIGNORS.items():
        print(shape, name, json.dumps(assignor.assign(spec), sort_keys=True))
"""


def test_results_do_not_depend_on_the_hash_seed() -> None:
    # Sets of strings iterate in an order that PYTHONHASHSEED decides; every coordinator
    # must still compute the same assignment.
    outputs = set()
    for seed in ("0", "1", "2", "4242"):
        done = subprocess.run(
            [sys.executable, "-c", HASH_SEED_PROGRAM],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1
    lines = outputs.pop().splitlines()
    assert len(lines) == 2 * len(ASSIGNORS)
    assert all(json.loads(line.split(" ", 2)[2]) for line in lines)


@settings(max_examples=150, deadline=None)
@given(s=group_specs())
def test_property_range_is_balanced_per_topic(s: GroupSpec) -> None:
    result = range_.assign(s)
    for topic in s.topics():
        counts = [sum(1 for tp in result[m] if tp.topic == topic) for m in s.subscribers(topic)]
        assert max(counts) - min(counts) <= 1, (topic, counts)
        # Larger blocks first: the counts never increase down the sorted member list.
        assert counts == sorted(counts, reverse=True)


@settings(max_examples=150, deadline=None)
@given(s=group_specs(identical=True))
def test_property_roundrobin_is_balanced_with_identical_subscriptions(s: GroupSpec) -> None:
    result = roundrobin.assign(s)
    counts = [len(owned) for owned in result.values()]
    assert max(counts) - min(counts) <= 1, counts


# -- validate_assignment ----------------------------------------------------------------------

VALID = spec({"a": {"t", "u"}, "b": {"t"}}, {"t": 2, "u": 1, "unused": 4})


def test_validate_accepts_a_valid_assignment_and_a_member_left_out() -> None:
    validate_assignment(VALID, {"a": tps("u-0"), "b": tps("t-0", "t-1")})
    validate_assignment(VALID, {"a": tps("t-0", "t-1", "u-0")})  # b owns nothing


def test_validate_incomplete_checks_everything_but_completeness() -> None:
    """A Kafka leader's cooperative assignor leaves revoked partitions out for one round."""
    validate_assignment(VALID, {"a": tps("u-0"), "b": tps("t-0")}, complete=False)
    with pytest.raises(ValueError, match=r"assigned more than once: t-0$"):
        validate_assignment(VALID, {"a": tps("t-0"), "b": tps("t-0")}, complete=False)
    with pytest.raises(ValueError, match=r"'b' got u-0 but does not subscribe to 'u'$"):
        validate_assignment(VALID, {"b": tps("u-0")}, complete=False)


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ({"a": tps("u-0"), "b": tps("t-0")}, r"assigned to no member: t-1$"),
        ({"a": tps("t-1", "u-0"), "b": tps("t-0", "t-1")}, r"assigned more than once: t-1$"),
        ({"a": tps("u-0", "u-0"), "b": tps("t-0", "t-1")}, r"assigned more than once: u-0$"),
        (
            {"a": tps("u-0"), "b": tps("t-0", "t-1"), "z": [], "y": []},
            r"unknown member\(s\) 'y', 'z'$",
        ),
        (
            {"a": tps("t-0"), "b": tps("t-1", "u-0")},
            r"'b' got u-0 but does not subscribe to 'u'$",
        ),
        (
            {"a": tps("u-0", "t-2"), "b": tps("t-0", "t-1")},
            r"'a' got t-2: no such partition \('t' has 2\)$",
        ),
        (
            {"a": tps("u-0", "x-0"), "b": tps("t-0", "t-1")},
            r"'a' got x-0: no such partition \('x' has 0\)$",
        ),
        (
            {"a": [("u", 0)], "b": tps("t-0", "t-1")},
            r"'a' got \('u', 0\), not a TopicPartition; assigned to no member: u-0$",
        ),
        (
            {"a": None, "b": tps("t-0", "t-1")},
            r"'a' got None, not a list of TopicPartitions; assigned to no member: u-0$",
        ),
        (
            {"a": [TP("u", "0")], "b": tps("t-0", "t-1")},  # type: ignore[arg-type]
            r"'a' got TopicPartition\(topic='u', partition='0'\), not a TopicPartition; .*",
        ),
        (  # -1 would index the last partition of a list: counted as u-0 it would hide
            {"a": [TP("u", -1)], "b": tps("t-0", "t-1")},
            r"'a' got u--1: no such partition \('u' has 1\); assigned to no member: u-0$",
        ),
        (  # a partition of a topic a member does not subscribe to, in place of the right one
            {"a": tps("t-0", "t-1"), "b": tps("u-0")},
            r"'b' got u-0 but does not subscribe to 'u'$",
        ),
    ],
    ids=[
        "incomplete",
        "twice",
        "twice-to-one",
        "unknown-members",
        "unsubscribed",
        "no-such-partition",
        "no-such-topic",
        "not-a-topicpartition",
        "not-a-list",
        "partition-not-an-int",
        "negative-partition",
        "swapped-subscriptions",
    ],
)
def test_validate_says_what_is_wrong(assignment, message) -> None:
    with pytest.raises(ValueError, match=r"^invalid assignment: .*" + message):
        validate_assignment(VALID, assignment)


def test_validate_refuses_what_is_not_a_mapping() -> None:
    with pytest.raises(ValueError, match=r"^invalid assignment: list, not a mapping$"):
        validate_assignment(VALID, [("a", tps("t-0"))])  # type: ignore[arg-type]


def test_validate_reports_every_kind_of_problem_and_shortens_long_lists() -> None:
    s = spec({"a": {"t"}}, {"t": 9, "u": 1})
    with pytest.raises(ValueError) as raised:
        validate_assignment(s, {"a": tps("t-0", "t-0", "u-0"), "ghost": []})
    assert str(raised.value) == (
        "invalid assignment: unknown member(s) 'ghost'; "
        "'a' got u-0 but does not subscribe to 'u'; "
        "assigned more than once: t-0; "
        "assigned to no member: t-1, t-2, t-3, t-4, t-5 and 3 more"
    )


@EVERY
@settings(max_examples=50, deadline=None)
@given(s=group_specs(), data=st.data())
def test_property_validate_rejects_a_dropped_or_doubled_partition(assignor, s, data) -> None:
    result = assignor.assign(s)
    validate_assignment(s, result)
    holders = [m for m, owned in result.items() if owned]
    if not holders:
        return
    member_id = data.draw(st.sampled_from(holders))
    victim = data.draw(st.sampled_from(result[member_id]))
    dropped = {m: [tp for tp in owned if tp != victim] for m, owned in result.items()}
    with pytest.raises(ValueError, match=f"assigned to no member: {victim}"):
        validate_assignment(s, dropped)
    doubled = {m: [*owned, victim] for m, owned in result.items()}
    with pytest.raises(ValueError, match="assigned more than once"):
        validate_assignment(s, doubled)


# -- make_registry ----------------------------------------------------------------------------


class Reversed:
    """A custom assignor: range, with the members in reverse order."""

    def __init__(self, name: str = "reverse-range") -> None:
        self.name = name

    def assign(self, spec: GroupSpec) -> Assignment:
        ranged = RangeAssignor().assign(spec)
        ids = list(ranged)
        return {m: ranged[r] for m, r in zip(ids, reversed(ids), strict=True)}


def test_registry_adds_custom_assignors_to_the_builtins_without_touching_them() -> None:
    custom = Reversed()
    registry = make_registry([custom])
    assert list(registry) == ["range", "roundrobin", "sticky", "uniform", "reverse-range"]
    assert registry["reverse-range"] is custom
    assert list(ASSIGNORS) == ["range", "roundrobin", "sticky", "uniform"]
    assert make_registry() == ASSIGNORS and make_registry() is not ASSIGNORS
    prefs = [("reverse-range", "range"), ("reverse-range",)]
    assert choose_assignor(prefs, registry) == "reverse-range"
    s = spec({"a": {"t"}, "b": {"t"}}, {"t": 3})
    validate_assignment(s, registry["reverse-range"].assign(s))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "is not 1 to 255 letters"),
        ("two words", "is not 1 to 255 letters"),
        (" range", "is not 1 to 255 letters"),
        ("x" * 256, "is not 1 to 255 letters"),
        ("naïve", "is not 1 to 255 letters"),
        (None, "has no name"),
        (3, "has no name"),
    ],
)
def test_registry_refuses_bad_names(name, message) -> None:
    with pytest.raises(ValueError, match=message):
        make_registry([Reversed(name)])  # type: ignore[arg-type]


def test_registry_accepts_the_longest_name_and_the_punctuation() -> None:
    assert "a" * 255 in make_registry([Reversed("a" * 255)])
    assert "My_Assignor.v2-beta" in make_registry([Reversed("My_Assignor.v2-beta")])


def test_registry_refuses_two_assignors_with_one_name() -> None:
    with pytest.raises(ValueError, match="two assignors are named 'mine'"):
        make_registry([Reversed("mine"), Reversed("mine")])


def test_registry_refuses_to_shadow_a_builtin_unless_told_to() -> None:
    with pytest.raises(ValueError, match=r"'range' is a built-in.*replace_builtins=True"):
        make_registry([Reversed("range")])
    replacement = Reversed("range")
    registry = make_registry([replacement], replace_builtins=True)
    assert registry["range"] is replacement
    assert ASSIGNORS["range"] is not replacement


def test_registry_refuses_an_object_without_assign() -> None:
    class NoAssign:
        name = "lazy"

    with pytest.raises(ValueError, match="'lazy' has no assign"):
        make_registry([NoAssign()])  # type: ignore[list-item]


def test_a_coordinator_runs_an_assignor_with_the_collector_paused() -> None:
    # An assignment allocates much and frees nothing until it returns: collections during
    # it walk tens of thousands of live containers for nothing (#14). A coordinator runs
    # it with the collector off, and leaves the collector as it found it.
    seen: list[bool] = []

    class Spy:
        name = "spy"

        def assign(self, spec: GroupSpec) -> dict[str, list[TP]]:
            seen.append(gc.isenabled())
            return RangeAssignor().assign(spec)

    spec = GroupSpec({"a": MemberSpec("a", frozenset({"t"}))}, {"t": 3})
    group = Group("g", now=0.0)
    assert gc.isenabled()
    assignment = group.planning.compute_assignment(AssignmentInput("spy", spec), {"spy": Spy()})
    assert assignment == {"a": [TP("t", 0), TP("t", 1), TP("t", 2)]}
    assert seen == [False] and gc.isenabled()
    gc.disable()  # an application that runs with the collector off keeps it off
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
