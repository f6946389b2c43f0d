"""A group's committed offsets listed in order, a page at a time, as DescribeGroup and
OffsetFetch of all take them: every offset once, in (topic, partition) order, after any
cursor, as the offsets are committed, recommitted and forgotten in between."""

from __future__ import annotations

import random

from trio_coord.core.group import Group
from trio_coord.core.records import GroupTombstone, OffsetRecord, OffsetTombstone
from trio_coord.protocol import TopicPartition


def listed(group: Group, after: TopicPartition | None = None) -> list[tuple[str, int, int]]:
    return [(o.topic, o.partition, o.offset) for o in group.offsets_after(after)]


def test_offsets_are_listed_in_order_after_a_cursor_as_they_change() -> None:
    group = Group("g", now=0.0)
    tps = [TopicPartition(t, p) for t in ("b", "a", "c") for p in range(40)]
    random.Random(7).shuffle(tps)
    for offset, tp in enumerate(tps):
        group.replay(OffsetRecord("g", tp.topic, tp.partition, offset), now=0.0)
    expected = sorted((tp.topic, tp.partition, group.offsets[tp].offset) for tp in tps)
    assert listed(group) == expected
    cursor = TopicPartition("b", 17)
    assert listed(group, cursor) == [e for e in expected if (e[0], e[1]) > ("b", 17)]
    # A cursor that is not a committed partition starts after where it would be.
    assert listed(group, TopicPartition("b", 1_000))[0][:2] == ("c", 0)
    # A recommit changes the offset listed; a new partition and a forgotten one show.
    group.replay(OffsetRecord("g", "a", 3, 10_000), now=0.0)
    group.replay(OffsetRecord("g", "aa", 0, 1), now=0.0)
    group.replay(OffsetTombstone("g", "c", 39), now=0.0)
    now = listed(group)
    assert ("a", 3, 10_000) in now and ("aa", 0, 1) in now and ("c", 39) not in [e[:2] for e in now]
    assert [e[:2] for e in now] == sorted(e[:2] for e in now)
    assert len(now) == len(tps)  # one added, one forgotten
    # A listing begun before a partition is forgotten skips it rather than fail.
    pages = group.offsets_after(None)
    first = next(pages)
    group.replay(OffsetTombstone("g", "a", 1), now=0.0)
    assert [(o.topic, o.partition) for o in pages][:2] == [("a", 2), ("a", 3)]
    assert (first.topic, first.partition) == ("a", 0)
    group.replay(GroupTombstone("g"), now=0.0)
    assert listed(group) == []
