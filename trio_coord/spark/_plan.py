"""Offset arithmetic for planning reads: stream offsets as JSON, admission control, task ranges.

Pure functions (no network, no Spark): the readers resolve offsets with the
blocking client, then plan here.

* A stream offset is the per-partition end of what has been read, as a JSON
  object with sorted keys, so that two equal offsets are equal strings (Spark
  compares them to decide whether there is anything new):
  ``{"partitions": {"events": {"0": 17, "1": 12}}}``. When the stream commits
  to a group, ``"bootstrap"`` and ``"group"`` say where, so that the query
  listener on the driver can commit the last batch too.
* :func:`admit` caps a micro-batch at ``max_records``, shared among the
  partitions in proportion to their backlog (largest remainders first), with
  at least one record for every partition that has a backlog (in turns, when
  the cap is smaller than their number): no partition waits forever.
* :func:`split_ranges` turns ranges of offsets into tasks of at most
  ``max_per_task`` records each, and into at least ``min_tasks`` tasks where
  the records allow, cutting each range into near-equal contiguous pieces.
* :func:`share_ranges` cuts the records of all ranges, one after the other,
  into ``tasks`` near-equal shares (more where ``max_per_task`` needs it), a
  share taking a piece of one range or pieces of several: what a read does
  when it knows how many cores the session has. A Python data source task
  costs Spark tens of milliseconds besides its records (a worker round trip,
  a projection generated per task), so one task per core, each with an
  equal share, beats one task per partition whenever partitions outnumber
  cores or differ in size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ..protocol.messages import TopicPartition

__all__ = [
    "OffsetRange",
    "admit",
    "offsets_from_json",
    "offsets_to_json",
    "share_ranges",
    "split_ranges",
]


class OffsetRange(NamedTuple):
    """Records ``start`` (inclusive) to ``end`` (exclusive) of one partition: one task's work."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        """The partition the range belongs to."""
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        """How many offsets the range covers."""
        return self.end - self.start


def offsets_to_json(
    offsets: Mapping[TopicPartition, int],
    *,
    group: str | None = None,
    bootstrap: str | None = None,
) -> dict[str, Any]:
    """The stream offset for ``offsets``: sorted, so that equal offsets serialize equally."""
    partitions: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        partitions.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    result: dict[str, Any] = {}
    if group is not None:
        result["bootstrap"] = bootstrap
        result["group"] = group
    result["partitions"] = partitions
    return result


def offsets_from_json(offset: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """The per-partition offsets of a stream offset made by :func:`offsets_to_json`."""
    partitions = offset.get("partitions")
    if not isinstance(partitions, dict):
        raise ValueError(
            f"{offset!r} is not a trio_coord stream offset; was the checkpoint written by "
            "another source? Start the query with a new checkpointLocation"
        )
    return {
        TopicPartition(topic, int(partition)): int(value)
        for topic, by_partition in partitions.items()
        for partition, value in by_partition.items()
    }


def admit(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_records: int | None,
) -> dict[TopicPartition, int]:
    """The end of the next micro-batch: ``latest``, capped at ``max_records`` in all.

    ``start`` gives where each partition of ``latest`` resumes (a partition
    missing from it resumes at its latest offset: nothing to read). The cap
    is shared in proportion to each partition's backlog; the records the
    rounding leaves go to the largest remainders (ties: partition order).
    Every partition with a backlog then takes at least one record, from the
    largest shares, so a quiet partition next to a busy one is never starved.
    When the cap is smaller than the number of partitions with a backlog,
    each of ``max_records`` of them takes one record, in turn: the turn comes
    from how far the stream has read in all, which grows by the cap each
    batch, so consecutive batches serve consecutive partitions.
    """
    backlog = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return dict(latest)
    waiting = sorted(tp for tp, lag in backlog.items() if lag)
    taken = dict.fromkeys(backlog, 0)
    if max_records < len(waiting):
        turn = sum(start.get(tp, end) for tp, end in latest.items()) % len(waiting)
        for index in range(turn, turn + max_records):
            taken[waiting[index % len(waiting)]] = 1
    else:
        shares = {tp: max_records * lag / total for tp, lag in backlog.items()}
        taken = {tp: math.floor(share) for tp, share in shares.items()}
        left = max_records - sum(taken.values())
        by_remainder = sorted(backlog, key=lambda tp: (-(shares[tp] - taken[tp]), tp))
        for tp in by_remainder[:left]:
            taken[tp] += 1
        for tp in waiting:
            if not taken[tp]:  # a share under one record: one from the largest share
                donor = max(waiting, key=lambda other: (taken[other], other))
                taken[donor] -= 1
                taken[tp] = 1
    return {tp: start.get(tp, end) + taken[tp] for tp, end in latest.items()}


def split_ranges(
    ranges: Iterable[OffsetRange], max_per_task: int, min_tasks: int | None = None
) -> list[OffsetRange]:
    """Cut ``ranges`` into tasks: each at most ``max_per_task`` records, at least
    ``min_tasks`` tasks in all where there are that many records; empty ranges go."""
    if max_per_task <= 0:
        raise ValueError("max_per_task must be positive")
    work = [r for r in ranges if r.size > 0]
    pieces = {r: math.ceil(r.size / max_per_task) for r in work}
    total = sum(r.size for r in work)
    if min_tasks is not None and total and sum(pieces.values()) < min_tasks:
        for r in work:
            pieces[r] = max(pieces[r], min(r.size, math.ceil(r.size * min_tasks / total)))
    tasks: list[OffsetRange] = []
    for r in work:
        count = pieces[r]
        step, extra = divmod(r.size, count)
        at = r.start
        for index in range(count):
            size = step + (1 if index < extra else 0)
            tasks.append(OffsetRange(r.topic, r.partition, at, at + size))
            at += size
    return tasks


def share_ranges(
    ranges: Iterable[OffsetRange], tasks: int, max_per_task: int
) -> list[tuple[OffsetRange, ...]]:
    """Cut the records of ``ranges`` (in their order) into ``tasks`` near-equal contiguous
    shares, or into as many more as keep each share within ``max_per_task`` records (never
    more shares than records); a share is the pieces of one or more ranges it covers."""
    if tasks <= 0 or max_per_task <= 0:
        raise ValueError("tasks and max_per_task must be positive")
    work = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in work)
    if not total:
        return []
    count = min(total, max(tasks, math.ceil(total / max_per_task)))
    step, extra = divmod(total, count)
    shares: list[tuple[OffsetRange, ...]] = []
    pieces: list[OffsetRange] = []
    want = step + (1 if extra else 0)  # records the current share still takes
    for r in work:
        at = r.start
        while at < r.end:
            take = min(want, r.end - at)
            pieces.append(OffsetRange(r.topic, r.partition, at, at + take))
            at += take
            want -= take
            if want == 0:
                shares.append(tuple(pieces))
                pieces = []
                want = step + (1 if len(shares) < extra else 0)
    assert not pieces and len(shares) == count
    return shares
