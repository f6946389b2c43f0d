"""Appending and reading back: offsets, read limits, ranges, rolling, the index, time lookups.

Also the manager's own surface: creating and listing partitions, the
directory layout, its lock, and configuration checks.
"""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path

import pytest
import trio

from trio_coord import InvalidTopicError
from trio_coord.log import (
    LogConfig,
    LogError,
    LogManager,
    LogOffsetOutOfRangeError,
    PartitionLog,
    StoredBatch,
    open_log_manager,
)
from trio_coord.log.manager import LOCK_FILE
from trio_coord.log.segment import Segment

from .util import append_all, frame_size, log_files, payload, read_all

NO_RETENTION = LogConfig(retention_seconds=None)


async def test_append_returns_contiguous_offsets_and_reads_round_trip(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        log = await manager.create("orders", 0)
        assert (log.start_offset, log.end_offset) == (0, 0)
        batches = await append_all(log, [10, 0, 300, 1, 4000])
        assert [b.base_offset for b in batches] == [0, 1, 3, 6, 7]
        assert log.end_offset == 9 == batches[-1].next_offset
        assert read_all(log) == batches
        assert log.size_bytes() == sum(frame_size(b) for b in batches)
    # And after a clean restart.
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        log2 = manager.get("orders", 0)
        assert log2 is not None
        assert read_all(log2) == batches
        assert await log2.append(b"more", 2, 5) == 9
        assert log2.end_offset == 11


async def test_read_returns_at_least_one_batch_and_respects_max_bytes(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        log = await manager.create("t", 0)
        # counts 1, 2, 3, 1, 2: offsets 0 | 1-2 | 3-5 | 6 | 7-8
        batches = await append_all(log, [100, 100, 500, 100, 100])
        # max_bytes smaller than the first batch: still that one batch.
        assert log.read(0, 1) == batches[:1]
        assert log.read(0, 0) == batches[:1]
        assert log.read(0, -5) == batches[:1]
        # Exactly two fit; a third would not.
        assert log.read(0, 200) == batches[:2]
        assert log.read(0, 699) == batches[:2]
        assert log.read(0, 700) == batches[:3]
        # The batch that does not fit is not skipped for a smaller one after it.
        assert log.read(1, 150) == batches[1:2]
        # An offset inside a batch returns the whole batch, starting below it.
        assert log.read(4, 10) == batches[2:3]
        assert log.read(8, 1 << 20) == batches[4:]
        assert log.read(5, 1 << 20) == batches[2:]
        # At the end: nothing, no error.
        assert log.read(9, 100) == []


async def test_offsets_out_of_range_say_the_valid_range(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        log = await manager.create("t", 2)
        await append_all(log, [5, 5])  # offsets 0 and 1-2
        for bad in (-1, 4, 1000):
            with pytest.raises(LogOffsetOutOfRangeError) as info:
                log.read(bad, 100)
            assert "[0, 3]" in str(info.value) and f"offset {bad}" in str(info.value)
            assert "t-2" in str(info.value)
            assert (info.value.offset, info.value.start, info.value.end) == (bad, 0, 3)
            assert isinstance(info.value, LogError)
        assert log.read(3, 100) == []


async def test_rolling_segments_keeps_offsets_and_reads_across_them(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=300, index_interval_bytes=0, retention_seconds=None)
    async with open_log_manager(tmp_path, config) as manager:
        log = await manager.create("t", 0)
        sizes = [50, 120, 7, 200, 200, 0, 90, 1000, 3, 3, 3, 260]
        batches = await append_all(log, sizes)
        assert log.segment_count > 4
        files = log_files(tmp_path / "t" / "0")
        assert len(files) == log.segment_count
        # Each file is named by the base offset of its first batch, and no
        # segment but one holding a single oversized batch exceeds segment_bytes.
        bases = {b.base_offset for b in batches}
        for path in files:
            assert len(path.stem) == 20 and int(path.stem) in bases
            size = path.stat().st_size
            assert size <= 300 or any(
                b.base_offset == int(path.stem) and frame_size(b) == size for b in batches
            )
            assert path.with_suffix(".index").exists() or path == files[-1]
        assert read_all(log) == batches
        assert read_all(log, max_bytes=1) == batches  # one batch at a time
        # A read spanning segments.
        assert log.read(0, 10_000) == batches
        # Every offset finds its batch.
        for b in batches:
            for offset in range(b.base_offset, b.next_offset):
                assert log.read(offset, 0) == [b]
    async with open_log_manager(tmp_path, config) as manager:
        log = manager.get("t", 0)
        assert log is not None
        assert read_all(log) == batches


async def test_batches_larger_than_a_read_ahead_read_back_whole_in_any_thread(
    tmp_path: Path,
) -> None:
    # A fetch reads ahead (up to 4 MiB) into a buffer its thread reuses: a batch larger than
    # that, or straddling its end, comes back whole, and what a read returned stays as it
    # was after later reads, in this thread or in others reading at the same time.
    mib = 1 << 20
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        log = await manager.create("t", 0)
        sizes = [10, 70_000, 4 * mib - 30, 4 * mib + 1000, 5, 3 * mib, 2 * mib, 12]
        batches = []
        for n, size in enumerate(sizes):
            data = random.Random(n).randbytes(size)
            batches.append(StoredBatch(await log.append(data, 1, n), 1, n, data))
        first = log.read(0, 8 * mib)
        assert first == batches[:3]
        limits = [1, 64 * 1024, 4 * mib, 9 * mib, 32 * mib]

        def reads(failures: list[str]) -> None:
            for limit in limits:
                for offset in range(len(batches)):
                    got = log.read(offset, limit)
                    if got != batches[offset : offset + len(got)] or not got:
                        failures.append(f"read({offset}, {limit})")

        failures: list[str] = []
        reads(failures)
        threads = [threading.Thread(target=reads, args=(failures,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert first == batches[:3]
        assert all(type(b.payload) is bytes for b in first)


async def test_sparse_index_finds_every_offset_among_many_batches(tmp_path: Path) -> None:
    config = LogConfig(index_interval_bytes=256, retention_seconds=None)
    async with open_log_manager(tmp_path, config) as manager:
        log = await manager.create("t", 0)
        batches = await append_all(log, [(n * 37) % 90 for n in range(600)])
        segment = log._segments[-1]
        # One entry per 256 bytes or a little more (entries sit at batch starts).
        largest = max(frame_size(b) for b in batches)
        size = log.size_bytes()
        assert size // (256 + largest) <= segment.index_entries <= size // 256 + 1 < len(batches)
        for b in batches:
            assert log.read(b.base_offset, 0) == [b]
            assert log.read(b.next_offset - 1, 0) == [b]
        assert log.read(0, 1 << 30) == batches
    async with open_log_manager(tmp_path, config) as manager:
        log = manager.get("t", 0)
        assert log is not None
        for b in batches[::7]:
            assert log.read(b.next_offset - 1, 0) == [b]


async def test_batch_at_time_finds_the_first_batch_at_or_after_a_timestamp(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=400, index_interval_bytes=64, retention_seconds=None)
    # Timestamps are not monotonic: a late batch (90) comes before earlier ones.
    stamps = [10, 20, 20, 90, 30, 40, 100, 50, 60, 200, 70]
    async with open_log_manager(tmp_path, config) as manager:
        log = await manager.create("t", 0)
        batches = []
        for n, ts in enumerate(stamps):
            base = await log.append(payload(n, 60), 1, ts)
            batches.append(StoredBatch(base, 1, ts, payload(n, 60)))
        assert log.segment_count > 2

        def expected(ts: int) -> StoredBatch | None:
            return next((b for b in batches if b.max_timestamp >= ts), None)

        for ts in [-5, 0, 10, 11, 20, 21, 30, 35, 89, 90, 91, 100, 101, 150, 199, 200, 201]:
            assert log.batch_at_time(ts) == expected(ts), ts
        assert log.batch_at_time(201) is None


async def test_bad_batches_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        log = await manager.create("t", 0)
        with pytest.raises(ValueError, match="1 to"):
            await log.append(b"x", 0, 0)
        with pytest.raises(ValueError, match="1 to"):
            await log.append(b"x", 2**31, 0)
        with pytest.raises(ValueError, match="64-bit"):
            await log.append(b"x", 1, 2**63)
        assert log.end_offset == 0 and log.size_bytes() == 0
        assert await log.append(b"x", 1, -1) == 0


async def test_closed_log_refuses_appends_and_reads(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        log = await manager.create("t", 0)
        await log.append(b"x", 1, 0)
    with pytest.raises(LogError, match="closed"):
        await log.append(b"y", 1, 0)
    with pytest.raises(LogError, match="closed"):
        log.read(0, 10)
    with pytest.raises(LogError, match="closed"):
        await manager.create("t", 1)
    assert log.subscribe().is_set() is False  # a fresh event; the old one was set at close


# -- the manager ------------------------------------------------------------------------------


async def test_manager_creates_lists_and_finds_partitions(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        assert manager.partitions() == [] and manager.get("a", 0) is None
        created = {}
        async with trio.open_nursery() as nursery:
            # Concurrent creates of the same partition give one log.
            for key in [("b", 1), ("a", 10), ("a", 2), ("b", 1), ("b", 1)]:

                async def make(key: tuple[str, int] = key) -> None:
                    log = await manager.create(*key)
                    assert created.setdefault(key, log) is log

                nursery.start_soon(make)
        assert manager.partitions() == [("a", 2), ("a", 10), ("b", 1)]
        log = manager.get("b", 1)
        assert isinstance(log, PartitionLog) and log is created[("b", 1)]
        assert await manager.create("b", 1) is log  # idempotent
        await log.append(b"kept", 1, 0)
        assert (tmp_path / "b" / "1" / f"{0:020d}.log").exists()
        with pytest.raises(InvalidTopicError):
            await manager.create("no/slashes", 0)
        with pytest.raises(InvalidTopicError):
            await manager.create("..", 0)
        with pytest.raises(ValueError, match="partition"):
            await manager.create("a", -1)
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        assert manager.partitions() == [("a", 2), ("a", 10), ("b", 1)]
        log = manager.get("b", 1)
        assert log is not None and log.read(0, 10)[0].payload == b"kept"


async def test_manager_ignores_stray_files_and_directories(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "t" / "01").mkdir(parents=True)  # not a canonical partition number
    (tmp_path / "t" / "x").mkdir()
    (tmp_path / "bad name").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "t" / "3").mkdir()  # an empty partition directory: a partition, empty
    with caplog.at_level(logging.WARNING, logger="trio_coord.log"):
        async with open_log_manager(tmp_path, NO_RETENTION) as manager:
            assert manager.partitions() == [("t", 3)]
            log = manager.get("t", 3)
            assert log is not None and log.end_offset == 0
            assert await log.append(b"a", 1, 0) == 0
    warned = " ".join(r.getMessage() for r in caplog.records)
    for name in ("01", "x", "bad name", "notes.txt"):
        assert f"ignoring {name}," in warned


async def test_root_none_is_a_temporary_directory_removed_on_exit() -> None:
    async with open_log_manager(None, NO_RETENTION) as manager:
        root = manager.root
        log = await manager.create("t", 0)
        await log.append(b"x", 1, 0)
        assert (root / "t" / "0").is_dir()
    assert not root.exists()


async def test_a_second_manager_on_the_same_root_is_refused(tmp_path: Path) -> None:
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        await manager.create("t", 0)
        with pytest.raises(LogError) as info:
            async with open_log_manager(tmp_path, NO_RETENTION):
                pass  # pragma: no cover - must not get here
        message = str(info.value)
        assert str(tmp_path) in message and "in use by another process" in message
        assert str(tmp_path / LOCK_FILE) in message and "another log directory" in message
        # The first manager is unharmed.
        log = manager.get("t", 0)
        assert log is not None and await log.append(b"x", 1, 0) == 0
    # Released on exit.
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        assert manager.partitions() == [("t", 0)]


async def test_an_exception_in_the_block_comes_out_unwrapped_after_a_clean_close(
    tmp_path: Path,
) -> None:
    holder: list[LogManager] = []
    with pytest.raises(KeyError):
        async with open_log_manager(tmp_path, LogConfig(flush_interval=100)) as manager:
            holder.append(manager)
            log = await manager.create("t", 0)
            await log.append(b"x", 1, 0)
            raise KeyError("boom")
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        log = manager.get("t", 0)
        assert log is not None and log.end_offset == 1


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("segment_bytes", 0),
        ("segment_bytes", 2**31),
        ("index_interval_bytes", -1),
        ("flush_interval", -1.0),
        ("flush_interval", float("nan")),
        ("retention_seconds", -1.0),
        ("retention_bytes", -1),
        ("retention_check_interval", 0.0),
        ("io_threads", 0),
    ],
)
async def test_bad_settings_are_named(tmp_path: Path, setting: str, value: float) -> None:
    config = LogConfig(**{setting: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=setting):
        config.validate()
    with pytest.raises(ValueError, match=setting):
        async with open_log_manager(tmp_path, config):
            pass  # pragma: no cover
    LogConfig().validate()


async def test_a_create_in_flight_when_the_manager_closes_is_closed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    entered = threading.Event()
    created: list[PartitionLog] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with open_log_manager(tmp_path, NO_RETENTION) as manager:
                real = manager._make_partition

                def slow(directory: Path) -> list[Segment]:
                    entered.set()
                    assert gate.wait(10)
                    return real(directory)

                monkeypatch.setattr(manager, "_make_partition", slow)

                async def create() -> None:
                    created.append(await manager.create("t", 0))

                nursery.start_soon(create)
                while not entered.is_set():
                    await trio.sleep(0.001)

                async def open_gate_soon() -> None:
                    await trio.sleep(0.05)
                    gate.set()

                nursery.start_soon(open_gate_soon)
            # The manager's exit waited for the create, then closed its log as well.
    (log,) = created
    with pytest.raises(LogError, match="closed"):
        await log.append(b"x", 1, 0)
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        assert manager.partitions() == [("t", 0)]


async def test_a_root_that_is_not_a_directory_is_a_log_error(tmp_path: Path) -> None:
    root = tmp_path / "file"
    root.write_text("not a directory")
    with pytest.raises(LogError, match="cannot open the partition logs in"):
        async with open_log_manager(root, NO_RETENTION):
            pass  # pragma: no cover
