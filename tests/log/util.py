"""Helpers shared by the partition log tests."""

from __future__ import annotations

import os
from pathlib import Path

from trio_coord.log import PartitionLog, StoredBatch
from trio_coord.log.segment import HEADER


def payload(n: int, size: int) -> bytes:
    """A recognizable payload for batch number ``n``."""
    return bytes((n * 31 + j) % 251 for j in range(size))


def read_all(log: PartitionLog, max_bytes: int = 1 << 20) -> list[StoredBatch]:
    """Every batch from ``start_offset`` to ``end_offset``, checking that reads chain up."""
    out: list[StoredBatch] = []
    offset = log.start_offset
    while offset < log.end_offset:
        got = log.read(offset, max_bytes)
        assert got, f"no batch at {offset} below end {log.end_offset}"
        assert got[0].base_offset == offset
        out.extend(got)
        offset = got[-1].next_offset
    assert offset == log.end_offset
    return out


async def append_all(log: PartitionLog, sizes: list[int], first: int = 0) -> list[StoredBatch]:
    """Append one batch per size (counts 1, 2, 3, 1, ...; timestamps 1000 * n); return them."""
    batches = []
    for n, size in enumerate(sizes, first):
        data = payload(n, size)
        count = 1 + n % 3
        base = await log.append(data, count, 1000 * n)
        batches.append(StoredBatch(base, count, 1000 * n, data))
    return batches


def log_files(directory: Path) -> list[Path]:
    """The segment ``.log`` files of a partition directory, in offset order."""
    return sorted(directory.glob("*.log"))


def truncate(path: Path, length: int) -> None:
    """Cut a file to ``length`` bytes (what a crash mid-write can leave)."""
    os.truncate(path, length)


def frame_size(batch: StoredBatch) -> int:
    """Bytes the batch takes in a segment file."""
    return HEADER.size + len(batch.payload)
