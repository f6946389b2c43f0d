"""Offset retention as the pure core decides it (Kafka's offsets.retention.minutes).

An empty group's committed offsets expire once it has been empty for the
retention (on the coordinator's clock) and each was committed longer ago
than that (on the wall clock, where commit times are kept); a group with
members keeps them all. Both clocks are arguments.
"""

from __future__ import annotations

from _members import add_member

from trio_coord.core.group import Group
from trio_coord.core.records import OffsetRecord
from trio_coord.protocol import TopicPartition


def _offset(partition: int, commit_time_ms: int) -> OffsetRecord:
    return OffsetRecord("g", "t", partition, 5, "", commit_time_ms)


def test_offsets_expire_only_once_the_group_was_empty_and_they_are_old() -> None:
    group = Group("g", now=100.0)  # empty since 100 (coordinator clock)
    group.replay(_offset(0, commit_time_ms=1_000_000), now=100.0)
    group.replay(_offset(1, commit_time_ms=1_055_000), now=100.0)  # committed later
    retention = 60.0
    # Not empty for the retention yet: nothing expires, however old the commits.
    assert group.expired_offsets(159.0, 2_000_000, retention) == []
    # Empty long enough: only offsets committed more than the retention ago expire (a
    # standalone committer that keeps committing keeps its offsets).
    assert group.expired_offsets(160.0, 1_070_000, retention) == [TopicPartition("t", 0)]
    assert group.expired_offsets(160.0, 1_115_000, retention) == [
        TopicPartition("t", 0),
        TopicPartition("t", 1),
    ]
    # A group with members keeps them all.
    add_member(group, "a", 161.0)
    assert group.expired_offsets(1e9, 10**12, retention) == []
