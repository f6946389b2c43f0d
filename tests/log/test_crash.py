"""Crash safety with real SIGKILLs: every acknowledged batch survives, exactly and in order.

A child process appends from three concurrent writer tasks and prints each
acknowledged base offset; it is killed at a random moment, in both flush
modes, and then restarted on the same directory (recovering, appending
more) and killed again. A process crash keeps the page cache, so interval
mode must keep every acknowledged batch too (it is power loss that can
cost interval mode its last interval, which no test here can cause).
"""

from __future__ import annotations

import random
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
from acking_child import AckingChild

from trio_coord.log import LogConfig, open_log_manager

from .util import read_all

WRITERS = 3
SEGMENT_BYTES = 8192  # small: kills land in rolls too

_CHILD = (
    textwrap.dedent(
        """
    import sys, trio
    from trio_coord.log import LogConfig, open_log_manager

    def payload(run, w, i):
        return f"{run}:{w}:{i}|".encode() * (1 + (i * 7 + w) % 40)

    async def writer(log, run, w):
        i = 0
        while True:
            i += 1
            base = await log.append(payload(run, w, i), 1 + i % 3, i)
            print(base, run, w, i, flush=True)

    async def main(root, interval, run):
        config = LogConfig(
            segment_bytes=SEGMENT_BYTES, index_interval_bytes=512, flush_interval=interval,
            retention_seconds=None,
        )
        async with open_log_manager(root, config) as manager:
            log = await manager.create("t", 0)
            print("ready", flush=True)
            async with trio.open_nursery() as nursery:
                for w in range(WRITERS):
                    nursery.start_soon(writer, log, run, w)

    trio.run(main, sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
    """
    )
    .replace("SEGMENT_BYTES", str(SEGMENT_BYTES))
    .replace("WRITERS", str(WRITERS))
)


def _payload(run: int, w: int, i: int) -> bytes:
    return f"{run}:{w}:{i}|".encode() * (1 + (i * 7 + w) % 40)


async def _check(root: Path, acked: list[tuple[int, int, int, int]]) -> int:
    """Every acknowledged batch is there, exact; nothing torn; each writer's batches in order."""
    async with open_log_manager(root, LogConfig(retention_seconds=None)) as manager:
        log = manager.get("t", 0)
        assert log is not None
        batches = read_all(log)
    by_offset = {}
    last_i: dict[tuple[int, int], int] = {}
    for batch in batches:
        run, w, i = map(int, batch.payload.split(b"|", 1)[0].split(b":"))
        assert batch.payload == _payload(run, w, i)
        assert (batch.count, batch.max_timestamp) == (1 + i % 3, i)
        # A writer appends its next batch only after the last one was
        # acknowledged: its batches are 1, 2, 3, ... in offset order.
        assert i == last_i.get((run, w), 0) + 1, (run, w, i)
        last_i[(run, w)] = i
        by_offset[batch.base_offset] = (run, w, i)
    for base, run, w, i in acked:
        assert by_offset.get(base) == (run, w, i), f"acknowledged batch at {base} was lost"
    return len(batches)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_sigkill_keeps_every_acknowledged_batch(tmp_path: Path) -> None:
    rng = random.Random()
    modes = [0.0, 0.01]  # fsync before each acknowledgement; fsync every 10 ms
    roots = [tmp_path / f"interval-{interval}" for interval in modes]
    totals = [0] * len(modes)
    for run in range(2):  # the second run recovers from the first crash, then crashes again
        children = [
            AckingChild(_CHILD, root, interval, run)
            for root, interval in zip(roots, modes, strict=True)
        ]
        try:
            for child in children:
                child.wait_ready(30, "appender process")
            time.sleep(rng.uniform(0.1, 0.4))
            # Each child acknowledged (base, run, writer, i) per batch.
            acked = [[tuple(map(int, fields)) for fields in child.kill()] for child in children]
        finally:
            for child in children:
                child.reap()
        for n, root in enumerate(roots):
            assert acked[n], "the child acknowledged nothing before it was killed"
            total = trio.run(_check, root, acked[n])
            assert total >= totals[n] + len(acked[n])
            totals[n] = total
    segments = [len(list((root / "t" / "0").glob("*.log"))) for root in roots]
    assert all(count > 1 for count in segments), segments
