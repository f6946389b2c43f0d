"""A property test: the log behaves like a list of batches, through appends, reads and restarts.

Hypothesis draws a configuration (tiny segments and index intervals, either
flush mode, a size limit) and a sequence of operations: appends of random
sizes, reads at any offset with any byte limit, lookups by time, retention,
a clean restart, and a crash that tears the last batch at a random byte.
After each operation the log must agree with the model: the batches from
``start_offset`` on, with their offsets.
"""

from __future__ import annotations

import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_coord.log import (
    LogConfig,
    LogManager,
    LogOffsetOutOfRangeError,
    PartitionLog,
    StoredBatch,
    open_log_manager,
)

from .util import frame_size, log_files, payload, read_all, truncate

configs = st.builds(
    LogConfig,
    segment_bytes=st.one_of(st.integers(1, 700), st.integers(700, 4000)),
    index_interval_bytes=st.one_of(st.sampled_from([0, 1]), st.integers(0, 300)),
    flush_interval=st.sampled_from([0.0, 30.0]),
    retention_seconds=st.none(),
    retention_bytes=st.one_of(st.none(), st.integers(0, 1500)),
)

_append = st.tuples(st.just("append"), st.integers(0, 300), st.integers(1, 4), st.integers(0, 99))
operations = st.lists(
    st.one_of(
        _append,
        _append,
        _append,
        st.tuples(st.just("read"), st.integers(-2, 60), st.integers(-1, 900)),
        st.tuples(st.just("time"), st.integers(-1, 101)),
        st.tuples(st.just("retain")),
        st.tuples(st.just("restart")),
        st.tuples(st.just("tear"), st.integers(1, 400)),
    ),
    min_size=10,
    max_size=50,
)


def expected_read(model: list[StoredBatch], offset: int, max_bytes: int) -> list[StoredBatch]:
    """What ``read`` must return, by its definition, from the model."""
    out: list[StoredBatch] = []
    used = 0
    for batch in model:
        if batch.next_offset <= offset:
            continue
        if out and used + len(batch.payload) > max_bytes:
            break
        out.append(batch)
        used += len(batch.payload)
    return out


class Harness:
    """Holds the open manager, the log under test, and the model."""

    def __init__(self, root: Path, config: LogConfig) -> None:
        self.root = root
        self.config = config
        self.model: list[StoredBatch] = []
        self.start = 0
        self.end = 0
        self.stack = AsyncExitStack()
        self.log: PartitionLog | None = None
        self.appended = 0

    async def open(self) -> PartitionLog:
        manager: LogManager = await self.stack.enter_async_context(
            open_log_manager(self.root, self.config)
        )
        self.log = await manager.create("t", 0)
        return self.log

    async def close(self) -> None:
        await self.stack.aclose()
        self.stack = AsyncExitStack()

    def check(self, log: PartitionLog) -> None:
        """The log agrees with the model, asked every way that is cheap to ask."""
        model = self.model
        assert (log.start_offset, log.end_offset) == (self.start, self.end)
        assert read_all(log) == model
        assert log.size_bytes() >= sum(frame_size(b) for b in model)
        for batch in model:  # every batch by its first and last offset, through the index
            for offset in (batch.base_offset, batch.next_offset - 1):
                got = log.read(offset, 0)  # the batch, and any empty ones after it
                assert got == expected_read(model, offset, 0) and got[0] == batch
        used = 0
        for k, batch in enumerate(model[:5], 1):  # byte limits that fit k batches exactly
            used += len(batch.payload)
            assert log.read(self.start, used) == expected_read(model, self.start, used)
            assert log.read(self.start, used)[:k] == model[:k]
            assert log.read(self.start, used - 1) == expected_read(model, self.start, used - 1)

    async def run(self, op: tuple[Any, ...]) -> None:
        log = self.log
        assert log is not None
        kind = op[0]
        if kind == "append":
            _, size, count, ts = op
            data = payload(self.appended, size)
            self.appended += 1
            assert await log.append(data, count, ts) == self.end
            self.model.append(StoredBatch(self.end, count, ts, data))
            self.end += count
        elif kind == "read":
            _, where, max_bytes = op
            offset = self.start + where  # from below the start to past the end
            if offset < self.start or offset > self.end:
                with pytest.raises(LogOffsetOutOfRangeError):
                    log.read(offset, max_bytes)
            else:
                assert log.read(offset, max_bytes) == expected_read(self.model, offset, max_bytes)
        elif kind == "time":
            wanted = next((b for b in self.model if b.max_timestamp >= op[1]), None)
            assert log.batch_at_time(op[1]) == wanted
        elif kind == "retain":
            deleted = await log.enforce_retention(0.0)
            start = log.start_offset
            assert (deleted > 0) == (start > self.start)
            assert start in {b.base_offset for b in self.model} | {self.end}
            limit = self.config.retention_bytes
            assert limit is not None or deleted == 0
            assert log.segment_count == 1 or limit is None or log.size_bytes() <= limit
            self.model = [b for b in self.model if b.base_offset >= start]
            self.start = start
        elif kind == "restart":
            await self.close()
            log = await self.open()
        else:  # tear: a crash in the middle of writing the last batch
            await self.close()
            last = log_files(self.root / "t" / "0")[-1]
            size = last.stat().st_size
            if size and self.model:  # the last segment ends with the model's last batch
                torn = self.model.pop()
                truncate(last, size - min(op[1], frame_size(torn)))
                self.end = torn.base_offset
            log = await self.open()
        self.check(log)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(config=configs, ops=operations)
async def test_log_matches_a_list_of_batches(config: LogConfig, ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        harness = Harness(Path(tmp), config)
        try:
            harness.check(await harness.open())
            for op in ops:
                await harness.run(op)
        finally:
            await harness.close()
