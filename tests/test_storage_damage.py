"""A broker with damaged files: it says what is damaged, serves the rest, and repairs on request.

Through ``open_broker`` and the CLI, what docs/operations.md ("Corruption and
recovery") promises: a partition whose last segment is damaged mid-file is
refused with STORAGE_ERROR naming the file (never cut and its offsets given
out again) while every other partition is served; a batch of a closed
segment that fails its CRC is reported to whoever reads it, without failing
the other partitions of the same fetch; ``repair`` keeps every intact batch
and never reuses an offset; a damaged metadata log stops ``trio-coord
broker`` with one line that says what to do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from trio_coord import StorageError, open_admin, open_broker, open_producer
from trio_coord.log import LogConfig
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.errors import ErrorCode
from trio_coord.protocol.messages import FetchPartition, FetchRequest, FetchResponse
from trio_coord.protocol.records import decode_batch
from trio_coord.store.embedded import LOG_FILE

SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=100, retention_seconds=None)


async def _fill(data: Path) -> dict[int, list[str]]:
    """Topic t, 2 partitions, 40 one-record batches each; returns the values by partition."""
    values: dict[int, list[str]] = {0: [], 1: []}
    async with open_broker(data, log=SMALL) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 2)
        async with open_producer(broker.bootstrap, linger=0) as producer:
            for i in range(40):
                for p in (0, 1):
                    value = f"{p}-{i:03d}" + "x" * 40
                    await producer.send("t", value, partition=p)
                    values[p].append(value)
    return values


def _segments(data: Path, partition: int) -> list[Path]:
    return sorted((data / "partitions" / "t" / str(partition)).glob("*.log"))


def _flip(path: Path, where: float = 0.5) -> None:
    raw = bytearray(path.read_bytes())
    raw[int(len(raw) * where)] ^= 0x20
    path.write_bytes(bytes(raw))


async def _fetch(broker, offsets: dict[int, int]) -> FetchResponse:
    async with open_connection(*broker.address) as conn:
        parts = [FetchPartition("t", p, o) for p, o in offsets.items()]
        answer = await conn.request(FetchRequest(parts, max_wait_ms=0))
    assert isinstance(answer, FetchResponse)
    return answer


def _values(answer: FetchResponse, partition: int) -> list[str]:
    (part,) = [p for p in answer.partitions if p.partition == partition]
    return [r.value.decode() for b in part.batches for r in decode_batch(b.records)]


async def test_a_damaged_partition_is_refused_the_others_served_and_repair_keeps_the_rest(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    values = await _fill(data)
    active = _segments(data, 0)[-1]
    _flip(active, 0.3)  # mid-file: intact batches follow
    async with open_broker(data, log=SMALL) as broker:
        async with open_producer(broker.bootstrap, linger=0, delivery_timeout=2.0) as producer:
            meta = await producer.send("t", "fine", partition=1)
            assert meta.offset == 40
            with pytest.raises(StorageError, match=rf"{active}.*--repair"):
                await producer.send("t", "refused", partition=0)
        answer = await _fetch(broker, {0: 0, 1: 0})
        by = {p.partition: p for p in answer.partitions}
        assert by[0].error == ErrorCode.STORAGE_ERROR and active.name in by[0].message
        assert by[1].error == ErrorCode.NONE and _values(answer, 1)[0] == values[1][0]
        end_before = 40
    assert active.read_bytes() != b"", "a refused partition's files are left alone"

    async with open_broker(data, log=SMALL, repair=True) as broker:
        answer = await _fetch(broker, {0: 0})
        got = []
        offset = 0
        while offset < end_before:
            answer = await _fetch(broker, {0: offset})
            (part,) = answer.partitions
            assert part.error == ErrorCode.NONE, part.message
            got += _values(answer, 0)
            offset = part.batches[-1].base_offset + part.batches[-1].count
        lost = set(values[0]) - set(got)
        assert got == [v for v in values[0] if v not in lost] and 0 < len(lost) <= 2
        async with open_producer(broker.bootstrap, linger=0) as producer:
            meta = await producer.send("t", "after the repair", partition=0)
        assert meta.offset == end_before, "no offset is given out again"
    assert list(active.parent.glob(f"{active.name}.damaged-*"))


async def test_a_damaged_closed_segment_is_reported_to_its_reader_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    values = await _fill(data)
    closed = _segments(data, 0)[0]
    assert len(_segments(data, 0)) > 1
    _flip(closed, 0.5)
    async with open_broker(data, log=SMALL) as broker:
        answer = await _fetch(broker, {0: 0, 1: 0})
        by = {p.partition: p for p in answer.partitions}
        assert by[0].error == ErrorCode.STORAGE_ERROR
        assert str(closed) in by[0].message and "--repair" in by[0].message
        assert _values(answer, 1)[0] == values[1][0], "the other partition is served"
        tail = await _fetch(broker, {0: 39})  # past the damage: served
        assert _values(tail, 0) == [values[0][39]]


def test_a_damaged_metadata_log_stops_the_broker_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    trio.run(_fill, data)
    _flip(data / LOG_FILE, 0.4)
    run = subprocess.run(
        [sys.executable, "-m", "trio_coord", "broker", "--data-dir", str(data), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is damaged at byte" in errors[0] and "--repair" in errors[0]
    assert "Traceback" not in run.stderr
