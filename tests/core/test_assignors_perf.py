"""The assignors answer large groups correctly: the groups their cost is measured on.

An assignment is computed on the Trio thread of the group's task, so its cost
matters; it is measured in ``bench/assign.py`` (as a ratio, never as a timed
assertion here: the test machines are shared) and docs/assignment.md has the
typical figures for these groups. This test checks what each built-in
assignor answers for them: 20 members with 200 partitions and 1000 members
with 10 000 partitions, for a new group, a join and a leave, with identical
and with mixed subscriptions: every subscribed partition given exactly once,
to a member that subscribes to its topic.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from trio_coord.core.assignors import (
    BUILTIN_ASSIGNORS,
    Assignment,
    GroupSpec,
    MemberSpec,
    validate_assignment,
)


def group(
    members: int, partitions: int, topics: int, mixed: bool
) -> tuple[list[str], dict[str, int], Callable[[str], frozenset[str]]]:
    rng = random.Random(members * 31 + topics)
    ids = [f"consumer-{i:04d}-{rng.randrange(10**6):06d}" for i in range(members)]
    sizes = {f"topic-{t:03d}": partitions // topics for t in range(topics)}
    names = sorted(sizes)
    chosen = {m: frozenset(rng.sample(names, rng.randint(1, min(5, topics)))) for m in ids}
    everything = frozenset(names)
    return ids, sizes, (chosen.__getitem__ if mixed else lambda m: everything)


def make(
    ids: list[str],
    sizes: dict[str, int],
    topics_of: Callable[[str], frozenset[str]],
    owned: Assignment | None = None,
) -> GroupSpec:
    owned = owned or {}
    return GroupSpec(
        {m: MemberSpec(m, topics_of(m), frozenset(owned.get(m, ()))) for m in ids}, sizes
    )


@pytest.mark.parametrize("assignor", BUILTIN_ASSIGNORS, ids=lambda a: a.name)
@pytest.mark.parametrize(
    ("members", "partitions", "topics", "mixed"),
    [
        (20, 200, 1, False),
        (20, 200, 10, True),
        (1000, 10_000, 1, False),
        (1000, 10_000, 10, False),
        (1000, 10_000, 100, False),
        (1000, 10_000, 20, True),
    ],
    ids=["20x200", "20x200-mixed", "1000x10000", "1000x10000-10t", "1000x10000-100t", "mixed"],
)
def test_large_groups_get_a_complete_valid_assignment(
    assignor, members, partitions, topics, mixed
) -> None:
    ids, sizes, topics_of = group(members, partitions, topics, mixed)
    fresh = make(ids, sizes, topics_of)
    previous = assignor.assign(fresh)

    def topics_of_joined(member_id: str) -> frozenset[str]:
        return topics_of(ids[0] if member_id == "consumer-new" else member_id)

    joined = make([*ids, "consumer-new"], sizes, topics_of_joined, previous)
    left = make(ids[1:], sizes, topics_of, previous)
    validate_assignment(fresh, previous)
    for spec in (joined, left):
        validate_assignment(spec, assignor.assign(spec))
