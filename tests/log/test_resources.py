"""Running out of file descriptors is transient: the log refuses one append and goes on.

Under a connection flood a segment roll once hit EMFILE, and the partition
treated it like a failed fsync: it refused every append until the broker
restarted. Only a failed write or fsync of data may stop a partition (after
one, the state of the file is unknown); a roll that cannot open its new
files is undone, the append that needed it fails with :class:`LogBusyError`
(retriable), and the next one rolls.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from trio_coord.log import LogBusyError, LogConfig, LogError, open_log_manager
from trio_coord.log.segment import Segment

from .util import append_all, log_files, read_all

SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100, retention_seconds=None)


def _emfile(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EMFILE, "Too many open files")


@pytest.mark.parametrize("what", ["create", "write_index"])
async def test_a_roll_that_cannot_open_files_is_undone_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    async with open_log_manager(tmp_path, SMALL) as manager:
        log = await manager.create("t", 0)
        before = await append_all(log, [150, 150])  # the next append rolls
        with monkeypatch.context() as patch:
            if what == "create":
                patch.setattr(Segment, "create", classmethod(lambda cls, *a: _emfile()))
            else:
                patch.setattr(Segment, "write_index", _emfile)
            with pytest.raises(LogBusyError, match=r"Too many open files.*retry"):
                await log.append(b"x" * 150, 1, 5000)
        assert len(log_files(tmp_path / "t" / "0")) == 1, "no new file outlives the undo"
        after = await append_all(log, [150, 150, 150], first=2)  # it rolls, and goes on
        assert after[0].base_offset == before[-1].next_offset
        assert len(log_files(tmp_path / "t" / "0")) > 1
    async with open_log_manager(tmp_path, SMALL) as manager:
        log = manager.get("t", 0)
        assert log is not None and read_all(log) == before + after


async def test_a_failed_fsync_of_data_still_stops_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_log_manager(tmp_path, SMALL) as manager:
        log = await manager.create("t", 0)
        await append_all(log, [150, 150])
        monkeypatch.setattr(Segment, "sync", lambda self: _emfile())
        with pytest.raises(LogError) as info:
            await log.append(b"x" * 150, 1, 5000)
        assert not isinstance(info.value, LogBusyError)
        monkeypatch.undo()
        with pytest.raises(LogError, match="refuses appends until the broker restarts"):
            await log.append(b"y", 1, 5000)


async def test_creating_a_partition_without_file_descriptors_is_retriable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_log_manager(tmp_path, SMALL) as manager:
        with monkeypatch.context() as patch:
            patch.setattr(Segment, "create", classmethod(lambda cls, *a: _emfile()))
            with pytest.raises(LogBusyError):
                await manager.create("t", 0)
        log = await manager.create("t", 0)
        assert await log.append(b"x", 1, 1) == 0
