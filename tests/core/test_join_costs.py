"""Admitting a member costs O(1), whatever the group's size.

Join validation used to build every other member's assignor union (O(N) per
join, O(N^2) to form a group: 72 s of CPU at 20,000 members), and
``cooperative`` and ``member_by_instance`` walked every member each time they
were asked. Now running counts answer them. Checked by operation counts, not
time: the group's member map is never walked while a member joins; and the
counts agree with the full computation over every member, whatever the
sequence of joins, rejoins and departures.
"""

from __future__ import annotations

import functools

from _members import join
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_coord.core.assignors import choose_assignor
from trio_coord.core.group import Group, GroupLimits

LIMITS = GroupLimits(0.1, 300.0, 100_000, 0.0, 300.0, 4096)
AVAILABLE = frozenset({"range", "uniform"})


class _CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts how often it is walked (iterated, or its views taken)."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()

    def values(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().values()

    def items(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().items()

    def keys(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().keys()


# Members here join cooperative, offering uniform and range, at time 0.
_join = functools.partial(
    join,
    now=0.0,
    limits=LIMITS,
    available=AVAILABLE,
    rebalance_timeout=10.0,
    assignors=("uniform", "range"),
    offset_reset="latest",
    protocol="cooperative",
    client_id="c",
)


def test_a_join_never_walks_the_group() -> None:
    group = Group("g", now=0.0)
    for i in range(2000):
        _join(group, f"m{i:05d}", instance_id=f"i{i}" if i % 2 else "")
    group.members = _CountingDict(group.members)
    _CountingDict.walks = 0
    _join(group, "late", instance_id="i-late")  # a new static member
    _join(group, "m00001", instance_id="i1")  # a rejoin
    assert group.cooperative
    assert group.member_by_instance("i1") is group.members["m00001"]
    assert group.member_by_instance("i-late") is group.members["late"]
    group.remove_member(0.0, "m00002", stopped=True)
    assert _CountingDict.walks == 0


_NAMES = st.sampled_from(["range", "uniform", "sticky", "mine"])
_STEP = st.tuples(
    st.sampled_from(["join", "leave"]),
    st.integers(0, 5),  # which member
    st.lists(_NAMES, min_size=1, max_size=3),  # its assignors
    st.lists(_NAMES, max_size=1),  # what it can compute itself
    st.sampled_from(["eager", "cooperative"]),
    st.sampled_from(["", "a", "b"]),  # its instance id
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, max_size=30))
def test_running_counts_agree_with_walking_every_member(steps) -> None:
    group = Group("g", now=0.0)
    for action, index, assignors, mine, protocol, instance in steps:
        member_id = f"m{index}"
        if action == "leave":
            if member_id in group.members:
                group.remove_member(0.0, member_id, stopped=True)
            continue
        others = [m for m in group.members.values() if m.member_id != member_id]
        computable = set(AVAILABLE).union(mine, *(m.client_assignors for m in others))
        expected = choose_assignor([assignors, *(m.assignors for m in others)], computable)
        taken = group.member_by_instance(instance)
        if taken is not None and taken.member_id != member_id:
            continue  # (the broker fences a second live process of a static member)
        try:
            _join(
                group,
                member_id,
                assignors=assignors,
                client_assignors=mine,
                protocol=protocol,
                instance_id=instance,
            )
        except Exception:
            assert expected is None
        else:
            assert expected is not None
        members = list(group.members.values())
        assert group.cooperative == (
            bool(members) and all(m.protocol == "cooperative" for m in members)
        )
        for m in members:
            if m.instance_id:
                assert group.member_by_instance(m.instance_id) is m
