"""Crash safety of the embedded store: real SIGKILLs, and crash images taken inside compaction.

The invariant: after a crash (SIGKILL or power loss) the store recovers the
state of some prefix of the issued transactions that includes every
acknowledged one.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
from acking_child import AckingChild

import trio_coord.store.embedded as embedded
from trio_coord.store import Create, SetData, StoreError, open_embedded_store
from trio_coord.store._wal import _record_decoder, _scan_frames
from trio_coord.store.embedded import LOG_FILE, SNAPSHOT_FILE


def log_lsns(data_dir: Path) -> list[int]:
    payloads, _ = _scan_frames((data_dir / LOG_FILE).read_bytes())
    return [_record_decoder.decode(payload).lsn for payload in payloads]


# -- a real SIGKILL -------------------------------------------------------------------------

WRITERS = 4

# Each writer task appends records w-000001, w-000002, ... with one multi per
# record (and the writer's high-water mark in the same transaction; a rerun
# resumes after it), and
# prints "w i" once the multi returned, i.e. once the write is acknowledged.
# Small compaction thresholds make the kill land in compactions too.
_CHILD = textwrap.dedent(
    """
    import sys, trio
    from trio_coord.store import Create, SetData, open_embedded_store

    async def writer(store, w):
        i = int((await store.get(f"/w/{w}"))[0])  # resume after a previous crash
        while True:
            i += 1
            await store.multi([
                Create(f"/r/{w}-{i:06d}", b"%d" % i * 20),
                SetData(f"/w/{w}", b"%d" % i),
            ])
            print(w, i, flush=True)

    async def main(data_dir, writers):
        async with open_embedded_store(data_dir, compact_records=37, compact_bytes=8192) as store:
            for path in ("/r", "/w"):
                if await store.exists(path) is None:
                    await store.create(path)
            for w in range(writers):
                if await store.exists(f"/w/{w}") is None:
                    await store.create(f"/w/{w}", b"0")
            print("ready", flush=True)
            async with trio.open_nursery() as nursery:
                for w in range(writers):
                    nursery.start_soon(writer, store, w)

    trio.run(main, sys.argv[1], int(sys.argv[2]))
    """
)


async def _check_recovered(data_dir: Path, acked: list[tuple[int, int]]) -> int:
    async with open_embedded_store(data_dir) as store:
        names = await store.children("/r")
        present: dict[int, list[int]] = {w: [] for w in range(WRITERS)}
        for name in names:
            w, i = name.split("-")
            present[int(w)].append(int(i))
        for w, numbers in present.items():
            # A prefix of what the writer issued: 1..k with no hole ...
            assert sorted(numbers) == list(range(1, len(numbers) + 1)), f"writer {w}"
            # ... in the same transactions as the high-water marks.
            assert (await store.get(f"/w/{w}"))[0] == b"%d" % len(numbers)
            for i in numbers:
                assert (await store.get(f"/r/{w}-{i:06d}"))[0] == b"%d" % i * 20
        for w, i in acked:
            assert i in present[w], f"acknowledged write {w}-{i} was lost"
        return len(names)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_sigkill_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    delays = [0.02, 0.1, 0.25, 0.4]
    dirs = [tmp_path / f"run{n}" for n in range(len(delays))]
    totals = []
    for _round in range(2):  # the second round recovers from the first crash, then crashes again
        children = [AckingChild(_CHILD, d, WRITERS) for d in dirs]
        try:
            for child in children:
                child.wait_ready(20, "writer process")
            start = time.monotonic()
            acked: list[list[tuple[int, int]]] = [[] for _ in children]
            for n, delay in sorted(enumerate(delays), key=lambda item: item[1]):
                time.sleep(max(0.0, start + delay - time.monotonic()))
                # Each child acknowledged (writer, number) per write.
                acked[n] = [(int(w), int(i)) for w, i in children[n].kill()]
        finally:
            for child in children:
                child.reap()
        for n, data_dir in enumerate(dirs):
            totals.append(trio.run(_check_recovered, data_dir, acked[n]))
    assert sum(totals) > 0


# -- crash images inside compaction ----------------------------------------------------------


class _Crash(OSError):
    """The simulated crash: the flusher fails stop, and the test inspects the copied image."""


async def _write_while_compacting(
    live: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> tuple[list[int], list[int], Path]:
    """Write in overlapping transactions with compactions after every flush; crash at ``at``.

    Returns (issued order, acknowledged, crash image). Writes overlap the
    flushes, so records are appended while a compaction runs and some are
    pending (covered by the snapshot, not in the log) when it starts.
    """
    image = live.parent / "image"
    armed = False

    def crash_point(name: str) -> None:
        if armed and name == at and not image.exists():
            shutil.copytree(live, image)  # what a SIGKILL right here leaves
            raise _Crash(errno.EIO, f"simulated crash {name}")

    real_replace, real_fsync_dir, real_ftruncate = os.replace, embedded._fsync_dir, os.ftruncate

    def replace(src: str, dst: str) -> None:
        crash_point("before-rename")
        real_replace(src, dst)
        crash_point("after-rename")

    def fsync_dir(path: Path) -> None:
        real_fsync_dir(path)
        crash_point("after-dir-fsync")

    def ftruncate(fd: int, length: int) -> None:
        real_ftruncate(fd, length)
        crash_point("after-truncate")

    monkeypatch.setattr(embedded.os, "replace", replace)
    monkeypatch.setattr(embedded, "_fsync_dir", fsync_dir)
    monkeypatch.setattr(embedded.os, "ftruncate", ftruncate)
    issued: list[int] = []
    acked: list[int] = []
    async with open_embedded_store(live, compact_records=3) as store:
        await store.create("/g", b"-1")
        armed = True
        real_write = store._write_log

        def slow_write(data: bytes) -> None:
            time.sleep(0.002)  # let more transactions pile up behind each flush
            real_write(data)

        store._write_log = slow_write  # type: ignore[method-assign]

        async def write(i: int) -> None:
            issued.append(i)
            try:
                await store.multi([Create(f"/g/{i:03}"), SetData("/g", b"%d" % i)])
            except StoreError:  # the simulated crash: nothing more is acknowledged
                return
            acked.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(60):
                nursery.start_soon(write, i)
                if i % 4 == 3:
                    await trio.sleep(0.003)
    assert image.exists(), f"no compaction reached {at}"
    return issued, acked, image


@pytest.mark.parametrize(
    "at", ["before-rename", "after-rename", "after-dir-fsync", "after-truncate"]
)
async def test_crash_inside_compaction_recovers_a_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    issued, acked, image = await _write_while_compacting(tmp_path / "live", monkeypatch, at)
    monkeypatch.undo()
    for reopen in range(2):  # and again after writing on top of the recovered state
        async with open_embedded_store(image) as store:
            got = sorted(int(name) for name in await store.children("/g"))
            assert got == sorted(issued[: len(got)])  # a prefix of the issued transactions
            last = int((await store.get("/g"))[0])
            assert last == (issued[len(got) - 1] if got else -1)
            assert set(acked) <= set(got)
            if reopen == 0:
                await store.create("/next")
            else:
                assert await store.exists("/next") is not None


async def test_reopen_makes_an_unsynced_snapshot_rename_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A crash between the snapshot's rename and the directory fsync leaves a
    # rename that the next open sees but that power loss can still undo. The
    # next session must make it durable before acknowledging anything that
    # depends on it: here the snapshot covers a record the log never got.
    live, durable, image, lost = (tmp_path / name for name in ("live", "durable", "image", "lost"))
    real_replace = os.replace

    def rename_then_crash(src: str, dst: str) -> None:
        shutil.copytree(live, durable)  # the directory as last fsynced (at open)
        real_replace(src, dst)
        shutil.copytree(live, image)  # what a SIGKILL right after the rename leaves
        raise _Crash(errno.EIO, "simulated crash after the rename")

    async with open_embedded_store(live) as store:
        await store.create("/a")
        real_write = store._write_log

        def slow_write(data: bytes) -> None:
            time.sleep(0.05)
            real_write(data)

        store._write_log = slow_write  # type: ignore[method-assign]
        store.compact_records = 1  # compact after the next flush
        monkeypatch.setattr(embedded.os, "replace", rename_then_crash)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.create, "/b")  # logged, then the compaction starts
            await trio.sleep(0.01)
            with pytest.raises(StoreError):
                await store.create("/c")  # only in the snapshot; the crash comes first
    monkeypatch.undo()
    assert log_lsns(image) == [1, 2]
    assert (image / SNAPSHOT_FILE).exists() and not (durable / SNAPSHOT_FILE).exists()

    synced: list[Path] = []
    real_fsync_dir = embedded._fsync_dir

    def recording_fsync_dir(path: Path) -> None:
        synced.append(Path(path))
        real_fsync_dir(path)

    monkeypatch.setattr(embedded, "_fsync_dir", recording_fsync_dir)
    async with open_embedded_store(image) as store:
        assert await store.children("/") == ["a", "b", "c"]
        await store.create("/after")  # acknowledged: in the log, fdatasync'd
        # Power loss now. Directory entries are as of the last fsync of the
        # directory; file contents as of their last fsync.
        if image in synced:
            shutil.copytree(image, lost)
        else:
            shutil.copytree(durable, lost)
            shutil.copy(image / LOG_FILE, lost / LOG_FILE)
    monkeypatch.undo()
    async with open_embedded_store(lost) as store:
        assert "after" in await store.children("/")
