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
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import trio

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


class _Child:
    """One appender process whose stdout is drained by a thread (so it never blocks on the pipe)."""

    def __init__(self, root: Path, interval: float, run: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(root), str(interval), str(run)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line == "ready\n":
                self.ready.set()
            else:
                self.lines.append(line)
        self.ready.set()  # died early: let the test see why

    def kill(self) -> list[tuple[int, int, int, int]]:
        """SIGKILL the child; return every (base, run, writer, i) it acknowledged."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        acked = []
        for line in self.lines:
            if line.endswith("\n"):  # a line cut by the kill was not acknowledged
                base, run, w, i = map(int, line.split())
                acked.append((base, run, w, i))
        return acked


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
            _Child(root, interval, run) for root, interval in zip(roots, modes, strict=True)
        ]
        try:
            for child in children:
                assert child.ready.wait(timeout=30), "appender process did not start"
                if child.proc.poll() is not None:  # pragma: no cover - a broken child
                    assert child.proc.stderr is not None
                    pytest.fail(f"appender process died: {child.proc.stderr.read()}")
            time.sleep(rng.uniform(0.1, 0.4))
            acked = [child.kill() for child in children]
        finally:
            for child in children:
                if child.proc.poll() is None:  # pragma: no cover - only after a failure above
                    child.proc.kill()
                    child.proc.wait()
        for n, root in enumerate(roots):
            assert acked[n], "the child acknowledged nothing before it was killed"
            total = trio.run(_check, root, acked[n])
            assert total >= totals[n] + len(acked[n])
            totals[n] = total
    segments = [len(list((root / "t" / "0").glob("*.log"))) for root in roots]
    assert all(count > 1 for count in segments), segments
