"""Rack-aware assignment (KIP-881): matches preferred, balance and stickiness kept.

``range``, ``sticky`` and ``uniform`` prefer giving members partitions of their
own rack, but each member's count per topic is what it is without racks; and
with no rack on either side every assignor gives what it gives without racks.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_coord.core.assignors import (
    ASSIGNORS,
    GroupSpec,
    MemberSpec,
    validate_assignment,
)
from trio_coord.protocol.messages import TopicPartition as TP

RACK_AWARE = ["range", "sticky", "uniform"]


def _spec(
    members: dict[str, tuple[str, set[str]]],
    partitions: dict[str, int],
    racks: dict[str, list[str]],
    owned: dict[str, set[TP]] | None = None,
) -> GroupSpec:
    owned = owned or {}
    return GroupSpec(
        members={
            m: MemberSpec(m, frozenset(topics), frozenset(owned.get(m, ())), rack=rack)
            for m, (rack, topics) in members.items()
        },
        partitions=partitions,
        racks=racks,
    )


def _unracked(spec: GroupSpec) -> GroupSpec:
    return GroupSpec(
        members={
            m: MemberSpec(s.member_id, s.topics, s.owned, s.user_data)
            for m, s in spec.members.items()
        },
        partitions=spec.partitions,
    )


def _matches(spec: GroupSpec, assignment: dict[str, list[TP]]) -> int:
    return sum(
        1
        for m, tps in assignment.items()
        for tp in tps
        if spec.members[m].rack and spec.members[m].rack == spec.rack_of(tp.topic, tp.partition)
    )


def _counts(assignment: dict[str, list[TP]]) -> Counter[tuple[str, str]]:
    return Counter((m, tp.topic) for m, tps in assignment.items() for tp in tps)


# Three members in three racks; the partitions' racks are in blocks that neither
# consecutive ranges nor dealing in turn would line up with.
THREE = {"a": ("r1", {"t"}), "b": ("r2", {"t"}), "c": ("r3", {"t"})}
BLOCKS = {"t": ["r3", "r3", "r3", "r1", "r1", "r1", "r2", "r2", "r2"]}


@pytest.mark.parametrize("name", RACK_AWARE)
def test_each_member_gets_the_partitions_of_its_rack_when_balance_allows(name: str) -> None:
    spec = _spec(THREE, {"t": 9}, BLOCKS)
    got = ASSIGNORS[name].assign(spec)
    assert got == {
        "a": [TP("t", 3), TP("t", 4), TP("t", 5)],
        "b": [TP("t", 6), TP("t", 7), TP("t", 8)],
        "c": [TP("t", 0), TP("t", 1), TP("t", 2)],
    }


@pytest.mark.parametrize("name", RACK_AWARE)
def test_balance_wins_over_racks(name: str) -> None:
    # Every partition is in r1, where only a is: a still gets just its share.
    spec = _spec(THREE, {"t": 9}, {"t": ["r1"] * 9})
    got = ASSIGNORS[name].assign(spec)
    assert sorted(len(v) for v in got.values()) == [3, 3, 3]
    assert _matches(spec, got) == 3
    assert _counts(got) == _counts(ASSIGNORS[name].assign(_unracked(spec)))


def test_range_takes_its_racks_partitions_first_then_fills_in_order() -> None:
    # 7 partitions over a, b (racks r1, r2): a gets 4, b 3 (as without racks). a takes
    # r1's 2 and 4, b the first three of r2 (0, 1, 3); what is left (5, 6) fills a.
    spec = _spec(
        {"a": ("r1", {"t"}), "b": ("r2", {"t"})},
        {"t": 7},
        {"t": ["r2", "r2", "r1", "r2", "r1", "r2", "r2"]},
    )
    got = ASSIGNORS["range"].assign(spec)
    assert got == {
        "a": [TP("t", 2), TP("t", 4), TP("t", 5), TP("t", 6)],
        "b": [TP("t", 0), TP("t", 1), TP("t", 3)],
    }


@pytest.mark.parametrize("name", ["sticky", "uniform"])
def test_owned_partitions_stay_even_in_another_rack(name: str) -> None:
    # A balanced assignment fed back comes back unchanged, racks or not.
    owned = {"a": {TP("t", 0), TP("t", 1), TP("t", 2)}, "b": {TP("t", 3), TP("t", 4)}}
    spec = _spec(
        {"a": ("r1", {"t"}), "b": ("r2", {"t"})}, {"t": 5}, {"t": ["r2"] * 3 + ["r1"] * 2}, owned
    )
    got = ASSIGNORS[name].assign(spec)
    assert {m: set(v) for m, v in got.items()} == owned


def test_roundrobin_ignores_racks() -> None:
    spec = _spec(THREE, {"t": 9}, BLOCKS)
    assert ASSIGNORS["roundrobin"].assign(spec) == ASSIGNORS["roundrobin"].assign(_unracked(spec))


@st.composite
def _racked_specs(draw: st.DrawFn) -> GroupSpec:
    topics = {f"t{k}": draw(st.integers(0, 12)) for k in range(draw(st.integers(1, 3)))}
    rack_names = ["", "r1", "r2", "r3"]
    members: dict[str, tuple[str, set[str]]] = {}
    for k in range(draw(st.integers(1, 6))):
        subscribed = draw(st.sets(st.sampled_from(sorted(topics)), min_size=1))
        members[f"m{k}"] = (draw(st.sampled_from(rack_names)), subscribed)
    racks = {
        t: [draw(st.sampled_from(rack_names)) for _ in range(n)]
        for t, n in topics.items()
        if draw(st.booleans())
    }
    owned: dict[str, set[TP]] = {}
    for m, (_, subscribed) in members.items():
        owned[m] = {
            TP(t, p)
            for t in sorted(subscribed)
            for p in range(topics[t])
            if draw(st.integers(0, 3)) == 0
        }
    return _spec(members, topics, racks, owned)


@pytest.mark.parametrize("name", RACK_AWARE)
@settings(max_examples=150, deadline=None)
@given(spec=_racked_specs())
def test_racks_change_no_count_and_never_lose_matches_or_kept_partitions(
    name: str, spec: GroupSpec
) -> None:
    plain = ASSIGNORS[name].assign(_unracked(spec))
    racked = ASSIGNORS[name].assign(spec)
    validate_assignment(spec, racked)
    # The same count of every topic for every member: balance (and uniform's evenness)
    # is exactly what it is without racks.
    assert _counts(racked) == _counts(plain)
    assert _matches(spec, racked) >= _matches(spec, plain)
    if name != "range":
        # A partition several members claim counts for the first in member-id order.
        owner: dict[TP, str] = {}
        for m in sorted(spec.members, reverse=True):
            owner.update(dict.fromkeys(spec.members[m].owned, m))

        def kept(assignment: dict[str, list[TP]]) -> int:
            return sum(1 for m, v in assignment.items() for tp in v if owner.get(tp) == m)

        assert kept(racked) >= kept(plain)
    # Deterministic: the same input, the same answer.
    assert ASSIGNORS[name].assign(spec) == racked


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_without_racks_on_either_side_nothing_changes(name: str) -> None:
    members = {"a": ("", {"t", "u"}), "b": ("", {"t"}), "c": ("", {"t", "u"})}
    partitions = {"t": 7, "u": 4}
    no_member_racks = _spec(members, partitions, {"t": ["r1"] * 7, "u": ["r2"] * 4})
    no_partition_racks = _spec(
        {m: ("r1", topics) for m, (_, topics) in members.items()}, partitions, {}
    )
    for spec in (no_member_racks, no_partition_racks):
        assert ASSIGNORS[name].assign(spec) == ASSIGNORS[name].assign(_unracked(spec))
