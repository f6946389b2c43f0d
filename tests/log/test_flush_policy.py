"""The flush policy: group commit, what readers see before an fsync, cancellation, failures.

With ``flush_interval == 0`` an append is acknowledged, and becomes visible,
only after an fsync covers it; concurrent appends share fsyncs. In interval
mode appends are acknowledged at once and fsynced in the background. Fsyncs
are blocked or failed here by patching ``Segment.sync``, which the log calls
in a worker thread.
"""

from __future__ import annotations

import errno
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing

import trio_coord.log.segment as segment_module
from trio_coord.log import LogConfig, LogError, PartitionLog, StoredBatch, open_log_manager
from trio_coord.log.segment import Segment

from .util import append_all, log_files, payload, read_all

FSYNC = LogConfig(retention_seconds=None)


class GatedSync:
    """Replaces ``Segment.sync``: each call waits until the gate opens (worker thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        self.calls = 0
        real: Callable[[Segment], None] = Segment.sync

        def sync(segment: Segment) -> None:
            self.calls += 1
            assert self.gate.wait(10), "test never opened the gate"
            real(segment)

        monkeypatch.setattr(Segment, "sync", sync)

    async def wait_for_call(self, n: int = 1) -> None:
        with trio.fail_after(5):
            while self.calls < n:
                await trio.sleep(0.001)


async def test_readers_see_a_batch_only_once_it_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_log_manager(tmp_path, FSYNC) as manager:
        log = await manager.create("t", 0)
        first = await append_all(log, [10])
        gated = GatedSync(monkeypatch)
        woken = log.subscribe()
        acked: list[int] = []
        async with trio.open_nursery() as nursery:

            async def append() -> None:
                acked.append(await log.append(b"pending", 1, 50))

            nursery.start_soon(append)
            await gated.wait_for_call()
            # Written to the file, but not fsynced: not acknowledged, not visible.
            assert log.size_bytes() > len(first[0].payload) + 29
            assert acked == [] and log.end_offset == 1 and not woken.is_set()
            assert log.read(0, 1 << 20) == first
            assert log.read(1, 100) == []
            assert log.batch_at_time(50) is None
            gated.gate.set()
        assert acked == [1] and log.end_offset == 2 and woken.is_set()
        assert log.read(1, 100) == [StoredBatch(1, 1, 50, b"pending")]
        assert log.batch_at_time(50) == StoredBatch(1, 1, 50, b"pending")


async def test_concurrent_appends_get_offsets_in_call_order_and_share_fsyncs(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=4096, retention_seconds=None)
    n = 300
    async with open_log_manager(tmp_path, config) as manager:
        log = await manager.create("t", 0)
        called: list[int] = []
        bases: dict[int, int] = {}
        seen_ends: list[int] = []

        async def watch_end() -> None:
            while True:
                event = log.subscribe()
                await event.wait()
                seen_ends.append(log.end_offset)

        async def append(i: int) -> None:
            called.append(i)  # no checkpoint between this and the call
            base = await log.append(payload(i, 40 + i % 60), 1 + i % 3, i)
            assert log.end_offset >= base + 1 + i % 3  # acknowledged => visible
            bases[i] = base

        async with trio.open_nursery() as outer:
            outer.start_soon(watch_end)
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(append, i)
                    if i % 50 == 49:
                        await trio.lowlevel.checkpoint()
            outer.cancel_scope.cancel()
        # Offsets are contiguous and follow the order of the calls.
        offsets = [bases[i] for i in called]
        expected = 0
        for i, offset in zip(called, offsets, strict=True):
            assert offset == expected
            expected += 1 + i % 3
        assert log.end_offset == expected
        # end_offset only ever moved forward, and each move woke the watcher.
        assert seen_ends == sorted(set(seen_ends)) and seen_ends[-1] == expected
        # Group commit: far fewer fsyncs than appends (rolls included).
        assert log.segment_count > 3
        assert log.fsync_count < n / 3, log.fsync_count
        batches = read_all(log)
        assert [b.payload for b in batches] == [payload(i, 40 + i % 60) for i in called]


async def test_a_cancelled_append_consumes_its_offset_and_becomes_visible_after_the_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_log_manager(tmp_path, FSYNC) as manager:
        log = await manager.create("t", 0)
        gated = GatedSync(monkeypatch)
        with trio.move_on_after(0.05) as scope:
            await log.append(b"cancelled", 3, 1)
        assert scope.cancelled_caught
        assert gated.calls == 1 and log.end_offset == 0
        advanced = log.subscribe()
        gated.gate.set()
        with trio.fail_after(5):
            await advanced.wait()  # the syncer finishes the fsync it was asked for
        assert log.end_offset == 3
        assert log.read(0, 100) == [StoredBatch(0, 3, 1, b"cancelled")]
        assert await log.append(b"next", 1, 2) == 3


async def test_an_append_cancelled_behind_a_roll_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LogConfig(segment_bytes=100, retention_seconds=None)
    async with open_log_manager(tmp_path, config) as manager:
        log = await manager.create("t", 0)
        await append_all(log, [60])
        gated = GatedSync(monkeypatch)
        async with trio.open_nursery() as nursery:
            results: list[int] = []

            async def rolling_append() -> None:
                results.append(await log.append(payload(1, 60), 1, 0))  # rolls: fsync blocked

            nursery.start_soon(rolling_append)
            await gated.wait_for_call()
            with trio.move_on_after(0.05) as scope:
                await log.append(b"behind the roll", 1, 0)  # waits for the append lock
            assert scope.cancelled_caught
            gated.gate.set()
        assert results == [1]
        assert await log.append(b"last", 1, 0) == 2
        assert [b.payload for b in read_all(log)][1:] == [payload(1, 60), b"last"]


async def test_a_failed_fsync_fails_the_partition_and_keeps_what_was_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_log_manager(tmp_path, FSYNC) as manager:
        log = await manager.create("t", 0)
        other = await manager.create("t", 1)
        durable = await append_all(log, [20, 20])

        def broken_sync(segment: Segment) -> None:
            raise OSError(errno.EIO, "disk on fire")

        monkeypatch.setattr(Segment, "sync", broken_sync)
        with pytest.raises(LogError, match="refuses appends until the broker restarts"):
            await log.append(b"lost", 1, 0)
        with pytest.raises(LogError, match="disk on fire"):
            await log.append(b"refused", 1, 0)
        with pytest.raises(LogError):
            await log.flush()
        assert log.end_offset == durable[-1].next_offset
        assert read_all(log) == durable
        monkeypatch.undo()
        assert await other.append(b"fine", 1, 0) == 0  # other partitions carry on
    assert "could not make data durable" in caplog.text
    # A restart recovers what the disk holds (here the page cache kept "lost" too).
    async with open_log_manager(tmp_path, FSYNC) as manager:
        log2 = manager.get("t", 0)
        assert log2 is not None
        assert read_all(log2)[: len(durable)] == durable
        await log2.append(b"again", 1, 0)


async def test_a_failed_write_appends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_log_manager(tmp_path, FSYNC) as manager:
        log = await manager.create("t", 0)
        before = await append_all(log, [30])
        size = log.size_bytes()
        real = os.pwritev

        def short_then_enospc(fd: int, buffers: list[memoryview], offset: int) -> int:
            real(fd, [buffers[0][:10]], offset)  # a partial frame reaches the file
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(segment_module.os, "pwritev", short_then_enospc)
        with pytest.raises(LogError, match="No space left"):
            await log.append(b"too much", 1, 0)
        monkeypatch.undo()
        path = log_files(tmp_path / "t" / "0")[-1]
        assert path.stat().st_size == size == log.size_bytes()  # the partial frame was cut
        assert log.end_offset == 1
        assert await log.append(b"fits", 1, 0) == 1
        assert read_all(log) == [*before, StoredBatch(1, 1, 0, b"fits")]


async def test_interval_mode_acknowledges_at_once_and_fsyncs_in_the_background(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Virtual time that moves only when the test moves it: on real time, 50 appends on a
    # busy machine outlasted the 20 ms interval and were fsynced before the test looked.
    autojump_clock.autojump_threshold = math.inf
    config = LogConfig(flush_interval=0.02, retention_seconds=None)
    async with open_log_manager(tmp_path, config) as manager:
        log = await manager.create("t", 0)
        quiet = await manager.create("t", 1)
        batches = await append_all(log, [10] * 50)
        assert log.end_offset == batches[-1].next_offset  # visible before any fsync
        assert log.fsync_count == 0
        autojump_clock.jump(0.02)  # one interval: the flusher has the new data fsynced
        give_up = time.monotonic() + 10
        while log.fsync_count == 0:  # (in a worker thread: real time)
            assert time.monotonic() < give_up, "no fsync after the interval"
            await trio.lowlevel.checkpoint()
        count = log.fsync_count
        for _ in range(5):  # five intervals without new data: no fsync
            autojump_clock.jump(0.02)
            await trio.testing.wait_all_tasks_blocked()
        assert log.fsync_count == count
        assert quiet.fsync_count == 0
        await log.append(b"x", 1, 0)
        await log.flush()  # an explicit flush does not wait for the interval
        assert log.fsync_count == count + 1


async def test_closing_fsyncs_what_interval_mode_had_not(tmp_path: Path) -> None:
    config = LogConfig(flush_interval=3600, retention_seconds=None)
    async with open_log_manager(tmp_path, config) as manager:
        log = await manager.create("t", 0)
        batches = await append_all(log, [10] * 5)
        assert log.fsync_count == 0
    assert log.fsync_count == 1
    async with open_log_manager(tmp_path, config) as manager:
        log2 = manager.get("t", 0)
        assert log2 is not None and read_all(log2) == batches


async def test_flush_returns_once_everything_written_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LogConfig(flush_interval=3600, retention_seconds=None)
    async with open_log_manager(tmp_path, config) as manager:
        log = await manager.create("t", 0)
        await log.flush()  # nothing to do
        assert log.fsync_count == 0
        await append_all(log, [10] * 3)
        gated = GatedSync(monkeypatch)
        done = trio.Event()
        async with trio.open_nursery() as nursery:

            async def flush() -> None:
                await log.flush()
                done.set()

            nursery.start_soon(flush)
            await gated.wait_for_call()
            await trio.sleep(0.01)
            assert not done.is_set()
            gated.gate.set()
        assert log.fsync_count == 1


# -- waking readers (virtual time) --------------------------------------------------------------


async def test_subscribe_wakes_a_long_poll_when_the_end_advances(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = LogConfig(flush_interval=1.0, retention_seconds=None)
    async with open_log_manager(None, config) as manager:
        log = await manager.create("t", 0)
        t0 = trio.current_time()
        woken: list[tuple[float, int]] = []

        async def long_poll(offset: int, timeout: float) -> list[StoredBatch]:
            with trio.move_on_after(timeout):
                while True:
                    event = log.subscribe()
                    got = log.read(offset, 1000)
                    if got:
                        return got
                    await event.wait()
                    woken.append((trio.current_time() - t0, log.end_offset))
            return []

        async with trio.open_nursery() as nursery:
            results: list[list[StoredBatch]] = []

            async def poll() -> None:
                results.append(await long_poll(0, 10))

            nursery.start_soon(poll)
            await trio.sleep(3)
            await log.append(b"hello", 2, 0)
        assert woken == [(3.0, 2)]
        assert results == [[StoredBatch(0, 2, 0, b"hello")]]
        # Nothing new: the poll times out at its deadline, exactly.
        start = trio.current_time()
        assert await long_poll(2, 5) == []
        assert trio.current_time() - start == 5.0


async def test_each_advance_sets_the_event_and_hands_out_a_fresh_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_log_manager(None, LogConfig(flush_interval=1.0)) as manager:
        log: PartitionLog = await manager.create("t", 0)
        first = log.subscribe()
        assert log.subscribe() is first  # same event until the end moves
        await log.append(b"a", 1, 0)
        assert first.is_set()
        second = log.subscribe()
        assert second is not first and not second.is_set()
        with pytest.raises(ValueError):
            await log.append(b"b", 0, 0)  # refused: nothing moved
        assert not second.is_set()
