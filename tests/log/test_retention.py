"""Retention: whole old segments go by age or by size, never the active one.

Each batch here is about 130 bytes and ``segment_bytes`` is 150, so every
batch gets a segment of its own and segment ``n`` holds batch ``n``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from trio_coord.log import (
    LogConfig,
    LogOffsetOutOfRangeError,
    PartitionLog,
    StoredBatch,
    open_log_manager,
)

from .util import frame_size, log_files, payload, read_all


async def _fill(log: PartitionLog, stamps: list[int]) -> list[StoredBatch]:
    batches = []
    for n, ts in enumerate(stamps):
        base = await log.append(payload(n, 100), 2, ts)
        batches.append(StoredBatch(base, 2, ts, payload(n, 100)))
    assert log.segment_count == len(stamps)
    return batches


def _config(**retention: float | None) -> LogConfig:
    settings: dict[str, float | None] = {"retention_seconds": None, **retention}
    return LogConfig(segment_bytes=150, retention_check_interval=3600, **settings)  # type: ignore[arg-type]


async def test_segments_older_than_retention_seconds_are_deleted(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, _config(retention_seconds=10)) as manager:
        log = await manager.create("t", 0)
        batches = await _fill(log, [1000 * n for n in range(10)])  # 0 s .. 9 s
        directory = tmp_path / "t" / "0"
        # now = 15.5 s: everything up to 5.5 s is older than 10 s.
        assert await log.enforce_retention(15.5) == 6
        assert log.start_offset == batches[6].base_offset
        assert read_all(log) == batches[6:]
        assert [int(p.stem) for p in log_files(directory)] == [b.base_offset for b in batches[6:]]
        assert len(list(directory.glob("*.index"))) == 3  # the active one has none yet
        with pytest.raises(LogOffsetOutOfRangeError, match=r"\[12, 20\]"):
            log.read(batches[5].base_offset, 100)
        assert await log.enforce_retention(15.5) == 0  # nothing more is due
        # Far in the future: all but the active segment.
        assert await log.enforce_retention(1e9) == 3
        assert log.segment_count == 1 and read_all(log) == batches[9:]
        assert log.batch_at_time(0) == batches[9]
        assert await log.append(b"still writable", 1, 0) == 20
    async with open_log_manager(tmp_path, _config(retention_seconds=10)) as manager:
        log = manager.get("t", 0)
        assert log is not None and log.start_offset == batches[9].base_offset


async def test_age_retention_deletes_only_a_prefix(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, _config(retention_seconds=10)) as manager:
        log = await manager.create("t", 0)
        # Segment 1 holds a record from the future; segment 2 behind it is old
        # but stays, or the log would have a hole.
        batches = await _fill(log, [0, 10**9, 0, 0])
        assert await log.enforce_retention(1000.0) == 1
        assert read_all(log) == batches[1:]


async def test_segments_are_deleted_oldest_first_while_the_partition_is_too_big(
    tmp_path: Path,
) -> None:
    async with open_log_manager(tmp_path, _config(retention_bytes=0)) as manager:
        log = await manager.create("t", 0)
        batches = await _fill(log, [0] * 8)
    per_segment = frame_size(batches[0])
    limit = 3 * per_segment + 1  # room for 3 segments and a byte
    async with open_log_manager(tmp_path, _config(retention_bytes=limit)) as manager:
        log = manager.get("t", 0)
        assert log is not None
        assert log.size_bytes() == 8 * per_segment
        assert await log.enforce_retention(time.time()) == 5
        assert log.size_bytes() == 3 * per_segment <= limit
        assert read_all(log) == batches[5:]
        assert await log.enforce_retention(time.time()) == 0
    # Even a limit of 0 keeps the active segment.
    async with open_log_manager(tmp_path, _config(retention_bytes=0)) as manager:
        log = manager.get("t", 0)
        assert log is not None
        assert await log.enforce_retention(time.time()) == 2
        assert read_all(log) == batches[7:] and log.segment_count == 1
        assert await log.enforce_retention(time.time()) == 0


async def test_no_retention_settings_delete_nothing(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, _config()) as manager:
        log = await manager.create("t", 0)
        await _fill(log, [0] * 4)
        assert await log.enforce_retention(1e12) == 0
        assert await manager.enforce_retention(1e12) == 0
        assert log.segment_count == 4


async def test_the_manager_applies_retention_every_check_interval(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = LogConfig(segment_bytes=150, retention_seconds=3600, retention_check_interval=60)
    old = int((time.time() - 7200) * 1000)  # two hours ago: due
    # Virtual time would jump while the set-up waits for worker threads: hold it.
    autojump_clock.autojump_threshold = math.inf
    async with open_log_manager(tmp_path, config) as manager:
        start = trio.current_time()
        logs = [await manager.create("t", p) for p in range(3)]
        for log in logs:
            await _fill(log, [old, old, old])
        assert trio.current_time() == start
        autojump_clock.autojump_threshold = 0
        await trio.sleep(59.9)
        assert all(log.start_offset == 0 for log in logs)
        await trio.sleep(0.2)  # the check ran at 60 and may be deleting in worker threads
        autojump_clock.autojump_threshold = math.inf  # hold virtual time while they finish
        give_up = time.monotonic() + 10
        while not all(log.start_offset == 4 for log in logs):  # all but the active segment
            assert time.monotonic() < give_up, [log.start_offset for log in logs]
            await trio.to_thread.run_sync(time.sleep, 0.002)
        assert trio.current_time() - start == pytest.approx(60.1)
