"""Recovery at start-up: torn and corrupt tails of the last segment, broken indexes, bad segments.

The last segment is validated in full and a bad tail cut off (its bytes
kept beside it); earlier segments are trusted, their indexes rebuilt if
missing or broken, and damage in them is an error that names the file.
"""

from __future__ import annotations

import logging
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from trio_coord.log import LogConfig, LogCorruptError, LogError, StoredBatch, open_log_manager
from trio_coord.log.segment import INDEX_ENTRY, NO_TIMESTAMP

from .util import append_all, frame_size, log_files, read_all, truncate

NO_RETENTION = LogConfig(retention_seconds=None)


async def _build(root: Path, config: LogConfig, sizes: list[int]) -> list[StoredBatch]:
    async with open_log_manager(root, config) as manager:
        log = await manager.create("t", 0)
        return await append_all(log, sizes)


async def _reopen_and_check(
    root: Path, config: LogConfig, expected: list[StoredBatch]
) -> list[StoredBatch]:
    """Reopen ``root``: the log holds exactly ``expected`` and appends continue after it."""
    async with open_log_manager(root, config) as manager:
        log = manager.get("t", 0)
        assert log is not None
        assert read_all(log) == expected
        next_offset = expected[-1].next_offset if expected else 0
        assert log.end_offset == next_offset
        assert await log.append(b"after", 2, 7) == next_offset
        after = [*expected, StoredBatch(next_offset, 2, 7, b"after")]
        assert read_all(log) == after
        return after


# Segments big enough for several batches, and one batch per segment (the
# last segment then holds only the torn batch and is cut to empty).
@pytest.mark.parametrize("segment_bytes", [400, 1])
async def test_torn_tail_at_every_byte_of_the_last_batch(
    tmp_path: Path, segment_bytes: int
) -> None:
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=64, retention_seconds=None)
    live = tmp_path / "live"
    batches = await _build(live, config, [40, 90, 10, 120, 33, 0, 70, 45])
    last_file = log_files(live / "t" / "0")[-1]
    full = last_file.stat().st_size
    first_cut = full - frame_size(batches[-1])
    for length in range(first_cut, full + 1):
        work = tmp_path / f"cut-{length}"
        shutil.copytree(live, work)
        work_file = work / "t" / "0" / last_file.name
        truncate(work_file, length)
        expected = batches if length == full else batches[:-1]
        after = await _reopen_and_check(work, config, expected)
        # Recovered once, the log reopens as it is.
        await _reopen_and_check(work, config, after)
        cut_files = list(work_file.parent.glob("*.cut-*"))
        if first_cut < length < full:
            assert [p.name for p in cut_files] == [f"{last_file.name}.cut-{first_cut}"]
            assert cut_files[0].stat().st_size == length - first_cut
        else:
            assert cut_files == []  # ends on a frame boundary: nothing to cut
        shutil.rmtree(work)


async def test_a_cut_is_logged_with_the_bytes_it_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    batches = await _build(tmp_path, NO_RETENTION, [100, 100])
    path = log_files(tmp_path / "t" / "0")[-1]
    truncate(path, path.stat().st_size - 7)
    with caplog.at_level(logging.WARNING, logger="trio_coord.log"):
        await _reopen_and_check(tmp_path, NO_RETENTION, batches[:1])
    (message,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    cut = frame_size(batches[1]) - 7
    assert f"cut a torn tail of {cut} bytes at position {frame_size(batches[0])}" in (message)
    assert str(path) in message


async def test_a_corrupt_byte_anywhere_in_the_last_batch_cuts_that_batch(tmp_path: Path) -> None:
    live = tmp_path / "live"
    batches = await _build(live, NO_RETENTION, [30, 50, 20])
    path = log_files(live / "t" / "0")[-1]
    data = path.read_bytes()
    start = len(data) - frame_size(batches[-1])
    for pos in range(start, len(data)):
        work = tmp_path / f"flip-{pos}"
        shutil.copytree(live, work)
        work_file = work / "t" / "0" / path.name
        damaged = bytearray(data)
        damaged[pos] ^= 0x5A
        work_file.write_bytes(bytes(damaged))
        await _reopen_and_check(work, NO_RETENTION, batches[:-1])
        shutil.rmtree(work)


@pytest.mark.parametrize("where", ["payload", "header"])
async def test_damage_inside_the_last_segment_refuses_the_partition_not_cut_it(
    tmp_path: Path, where: str
) -> None:
    """A flipped bit mid-file used to be cut as a "torn tail": 6 acknowledged batches
    dropped and their offsets given out again. Intact data after it proves it is damage."""
    batches = await _build(tmp_path, NO_RETENTION, [30] * 10)
    path = log_files(tmp_path / "t" / "0")[-1]
    original = path.read_bytes()
    data = bytearray(original)
    at = sum(frame_size(b) for b in batches[:4])
    data[at + (40 if where == "payload" else 3)] ^= 1  # batch 4's payload, or its base offset
    path.write_bytes(bytes(data))
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:
        assert manager.get("t", 0) is None
        damage = manager.damage("t", 0)
        assert isinstance(damage, LogCorruptError)
        assert (damage.path, damage.position, damage.offset) == (path, at, batches[4].base_offset)
        assert f"{path} is damaged at byte {at}" in str(damage) and "--repair" in str(damage)
        with pytest.raises(LogCorruptError):
            await manager.create("t", 0)  # never afresh: that would reuse offsets 0..
    assert path.read_bytes() == bytes(data), "a refused partition's files are left alone"

    # --repair: every intact batch kept, the damaged one a gap, no offset given out again.
    repair = LogConfig(retention_seconds=None, repair=True)
    async with open_log_manager(tmp_path, repair) as manager:
        log = manager.get("t", 0)
        assert log is not None
        assert read_all(log) == batches[:4] + batches[5:]
        assert log.end_offset == batches[-1].next_offset
        assert await log.append(b"after", 1, 1) == batches[-1].next_offset
        assert log.read(batches[4].base_offset, 10**6)[0] == batches[5]  # (in the gap)
    kept = path.with_name(f"{path.name}.damaged-{at}")
    assert kept.read_bytes() == bytes(data)
    async with open_log_manager(tmp_path, NO_RETENTION) as manager:  # and it stays repaired
        log = manager.get("t", 0)
        assert log is not None and len(read_all(log)) == 10


async def test_repair_keeps_a_torn_tail_cut_and_changes_nothing_intact(tmp_path: Path) -> None:
    batches = await _build(tmp_path, NO_RETENTION, [30] * 3)
    path = log_files(tmp_path / "t" / "0")[-1]
    path.write_bytes(path.read_bytes()[:-5])  # a torn last write
    repair = LogConfig(retention_seconds=None, repair=True)
    async with open_log_manager(tmp_path, repair) as manager:
        log = manager.get("t", 0)
        assert log is not None and read_all(log) == batches[:2]
    assert not list(path.parent.glob("*.damaged-*"))


async def test_zero_filled_tail_is_cut(tmp_path: Path) -> None:
    # Some file systems extend a file before its data is written; a crash
    # then leaves zeros.
    batches = await _build(tmp_path, NO_RETENTION, [30, 30])
    path = log_files(tmp_path / "t" / "0")[-1]
    path.write_bytes(path.read_bytes() + bytes(4096))
    await _reopen_and_check(tmp_path, NO_RETENTION, batches)


def _index_of(path: Path) -> Path:
    return path.with_suffix(".index")


SMALL = LogConfig(segment_bytes=500, index_interval_bytes=100, retention_seconds=None)


def _entries_blob(entries: list[tuple[int, int, int]]) -> bytes:
    body = b"".join(INDEX_ENTRY.pack(*entry) for entry in entries)
    return body + struct.pack(">I", zlib.crc32(body))


@pytest.mark.parametrize(
    "damage",
    ["missing", "garbage", "empty", "truncated", "bad crc", "wrong entries", "beyond the log"],
)
async def test_broken_index_of_an_earlier_segment_is_rebuilt(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    batches = await _build(tmp_path, SMALL, [60 + n % 50 for n in range(40)])
    files = log_files(tmp_path / "t" / "0")
    assert len(files) >= 4
    index = _index_of(files[1])
    good = index.read_bytes()
    assert len(good) > 2 * INDEX_ENTRY.size  # a sparse index with several entries
    if damage == "missing":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(bytes(range(256)) * 3)
    elif damage == "empty":
        index.write_bytes(b"")
    elif damage == "truncated":
        index.write_bytes(good[:-5])
    elif damage == "bad crc":
        index.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    elif damage == "wrong entries":
        # Well formed, checksummed, but pointing into the middle of a frame.
        index.write_bytes(_entries_blob([(0, 0, NO_TIMESTAMP), (1, 13, 5)]))
    else:
        index.write_bytes(_entries_blob([(0, 0, NO_TIMESTAMP), (1, 10_000, 5)]))
    with caplog.at_level(logging.WARNING, logger="trio_coord.log"):
        await _reopen_and_check(tmp_path, SMALL, batches)
    assert index.read_bytes() == good  # rebuilt as it was
    assert "rebuilding" in caplog.text and index.name in caplog.text


async def test_index_files_without_a_log_are_removed(tmp_path: Path) -> None:
    batches = await _build(tmp_path, SMALL, [60] * 20)
    directory = tmp_path / "t" / "0"
    stray = directory / f"{99999:020d}.index"
    stray.write_bytes(b"old")
    await _reopen_and_check(tmp_path, SMALL, batches)
    assert not stray.exists()


async def test_corruption_in_an_earlier_segment_is_an_error_naming_the_file(
    tmp_path: Path,
) -> None:
    await _build(tmp_path, SMALL, [60] * 20)
    first = log_files(tmp_path / "t" / "0")[0]
    data = bytearray(first.read_bytes())
    data[-3] ^= 1  # its last batch: in the part after the last index entry
    first.write_bytes(bytes(data))
    async with open_log_manager(tmp_path, SMALL) as manager:
        assert manager.get("t", 0) is None  # refused; the broker serves the others
        message = str(manager.damage("t", 0))
    assert str(first) in message and "not the last segment" in message
    assert "--repair" in message and "backup" in message
    second_base = int(log_files(tmp_path / "t" / "0")[1].stem)
    repair = LogConfig(
        segment_bytes=500, index_interval_bytes=100, retention_seconds=None, repair=True
    )
    async with open_log_manager(tmp_path, repair) as manager:
        log = manager.get("t", 0)
        assert log is not None
        batches = read_all(log)
        # The damaged last batch of the first segment is a gap up to the second one.
        assert batches[0].base_offset == 0 and second_base in [b.base_offset for b in batches]
        offsets = {o for b in batches for o in range(b.base_offset, b.next_offset)}
        assert set(range(log.end_offset)) - offsets == set(range(7, second_base))


async def test_corruption_an_earlier_index_vouches_for_is_found_by_reads(tmp_path: Path) -> None:
    batches = await _build(tmp_path, SMALL, [60] * 20)
    first = log_files(tmp_path / "t" / "0")[0]
    data = bytearray(first.read_bytes())
    data[40] ^= 1  # the first batch's payload: trusted, not scanned at start-up
    first.write_bytes(bytes(data))
    async with open_log_manager(tmp_path, SMALL) as manager:
        log = manager.get("t", 0)
        assert log is not None
        with pytest.raises(LogError, match="CRC"):
            log.read(0, 100)
        assert log.read(batches[1].base_offset, 100)[0] == batches[1]


async def test_a_missing_segment_in_the_middle_refuses_that_partition_only(
    tmp_path: Path,
) -> None:
    await _build(tmp_path, SMALL, [60] * 20)
    files = log_files(tmp_path / "t" / "0")
    files[1].unlink()
    _index_of(files[1]).unlink()
    async with open_log_manager(tmp_path, SMALL) as manager:
        other = await manager.create("u", 0)  # the rest of the broker works
        assert await other.append(b"x", 1, 1) == 0
        assert manager.get("t", 0) is None
        message = str(manager.damage("t", 0))
    assert "do not follow each other" in message
    assert files[0].name in message and files[2].name in message and "backup" in message


async def test_empty_last_segment_after_a_roll_is_recovered(tmp_path: Path) -> None:
    # A crash right after a roll created the new segment, before its first batch.
    batches = await _build(tmp_path, SMALL, [60] * 20)
    directory = tmp_path / "t" / "0"
    (directory / f"{batches[-1].next_offset:020d}.log").write_bytes(b"")
    after = await _reopen_and_check(tmp_path, SMALL, batches)
    async with open_log_manager(tmp_path, SMALL) as manager:
        log = manager.get("t", 0)
        assert log is not None and read_all(log) == after
