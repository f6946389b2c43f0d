"""The embedded store's log: a torn tail is cut, damage in the middle is refused or repaired.

A bit flipped in the store's log once made recovery cut everything after it
as a "torn tail": a whole topic vanished ("loaded 0 topics") with only a
WARNING. A torn write is an incomplete *last* write; bytes that fail their
checks but are followed by an intact record are damage: the store is not
opened (the error names the file and byte, and the fix), and ``repair``
keeps every intact record, before and after, moving the damaged log aside.
Running out of file descriptors while writing a snapshot is no reason to
close the store either: nothing on disk changed, compaction waits.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from trio_coord.store import Create, SetData, StoreError, open_embedded_store
from trio_coord.store._wal import _FRAME, _scan_frames
from trio_coord.store.embedded import LOG_FILE, SNAPSHOT_FILE


async def _write(data_dir: Path, names: list[str]) -> None:
    async with open_embedded_store(data_dir) as store:
        await store.create("/topics", b"")
        for name in names:
            await store.multi([Create(f"/topics/{name}", name.encode())])
        await store.multi([SetData("/topics", b"done")])


def _flip_inside_record(data_dir: Path, index: int) -> int:
    """Flip a bit in the payload of the log's ``index``-th record; returns its position."""
    path = data_dir / LOG_FILE
    buf = bytearray(path.read_bytes())
    pos = 0
    for _ in range(index):
        length, _crc = _FRAME.unpack_from(buf, pos)
        pos += _FRAME.size + length
    buf[pos + _FRAME.size + 2] ^= 0x04
    path.write_bytes(bytes(buf))
    return pos


async def test_damage_in_the_middle_of_the_log_is_refused_then_repaired(tmp_path: Path) -> None:
    names = [f"t{i}" for i in range(10)]
    await _write(tmp_path, names)
    damaged_at = _flip_inside_record(tmp_path, 4)  # record 4 creates /topics/t3
    original = (tmp_path / LOG_FILE).read_bytes()
    with pytest.raises(StoreError) as info:
        async with open_embedded_store(tmp_path):
            pass  # pragma: no cover
    message = str(info.value)
    assert f"{tmp_path / LOG_FILE} is damaged at byte {damaged_at}" in message
    assert "--repair" in message and "backup" in message
    assert (tmp_path / LOG_FILE).read_bytes() == original, "a refused store is left alone"

    async with open_embedded_store(tmp_path, repair=True) as store:
        kept = await store.children("/topics")
        assert sorted(kept) == sorted(set(names) - {"t3"}), "every intact record is kept"
        assert (await store.get("/topics"))[0] == b"done"
        await store.create("/after", b"")
    assert (tmp_path / f"{LOG_FILE}.damaged-{damaged_at}").read_bytes() == original
    async with open_embedded_store(tmp_path) as store:  # repaired for good
        assert len(await store.children("/topics")) == 9
        assert await store.exists("/after") is not None


async def test_a_torn_tail_is_still_cut_silently(tmp_path: Path) -> None:
    await _write(tmp_path, ["a", "b"])
    path = tmp_path / LOG_FILE
    _payloads, end = _scan_frames(path.read_bytes())
    os.truncate(path, end - 3)  # the last record, torn
    async with open_embedded_store(tmp_path) as store:
        assert sorted(await store.children("/topics")) == ["a", "b"]
        assert (await store.get("/topics"))[0] == b""  # (the torn record was the last one)


async def test_a_snapshot_that_cannot_open_its_file_leaves_the_store_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_snapshot_files(path, *args, **kwargs):
        if str(path).endswith("snapshot.tmp"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)

    async with open_embedded_store(tmp_path, compact_records=5) as store:
        monkeypatch.setattr(os, "open", no_snapshot_files)
        for i in range(20):
            await store.create(f"/n{i}", b"x")  # acknowledged: durable in the log
        assert store.compaction_count == 0 and not (tmp_path / SNAPSHOT_FILE).exists()
        monkeypatch.undo()
        for i in range(20, 1030):
            await store.multi([Create(f"/n{i}", b"x")])
        assert store.compaction_count >= 1, "compaction is tried again later"
    async with open_embedded_store(tmp_path) as store:
        assert len(await store.children("/")) == 1030
