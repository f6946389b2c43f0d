"""Behaviour specific to the embedded store: persistence, recovery, locking, group commit."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import trio_coord.store.embedded as embedded
from trio_coord import _files
from trio_coord.store import (
    Check,
    Create,
    Delete,
    EmbeddedStore,
    SetData,
    Stat,
    StoreClosedError,
    StoreError,
    open_embedded_store,
)
from trio_coord.store._wal import _scan_frames
from trio_coord.store.embedded import LOG_FILE, SNAPSHOT_FILE

Node = tuple[bytes, int, tuple[str, ...]]
Action = tuple[Any, ...]


def log_records(data_dir: Path) -> int:
    payloads, _ = _scan_frames((data_dir / LOG_FILE).read_bytes())
    return len(payloads)


async def dump(store: EmbeddedStore, *, persistent_only: bool = False) -> dict[str, Node]:
    """The whole tree through the public API: path -> (data, version, children)."""
    out: dict[str, Node] = {}
    todo = ["/"]
    while todo:
        path = todo.pop()
        data, stat = await store.get(path)
        if persistent_only and stat.ephemeral_owner:
            continue
        names = await store.children(path)
        if persistent_only:
            kids = []
            for name in names:
                child = await store.exists(f"{path.rstrip('/')}/{name}")
                if child is not None and not child.ephemeral_owner:
                    kids.append(name)
            names = kids
        out[path] = (data, stat.version, tuple(names))
        todo.extend(f"{path.rstrip('/')}/{name}" for name in names)
    return out


# -- durability and recovery -------------------------------------------------------


async def test_data_survives_reopen(tmp_path: Path) -> None:
    data_dir = tmp_path / "nested" / "dir"  # created on demand
    async with open_embedded_store(str(data_dir)) as store:
        await store.create("/a/b", b"ab", make_parents=True)
        await store.set("/a", b"A")
        await store.set("/a", b"AA", version=1)
        await store.create("/q")
        assert await store.create("/q/s-", sequential=True) == "/q/s-0000000000"
        await store.create("/gone", b"x")
        await store.delete("/gone")
        await store.multi([Create("/m"), SetData("/m", b"m1"), Create("/m/c")])
        before = await dump(store)
        a_stat = await store.exists("/a")
    async with open_embedded_store(data_dir) as store:
        assert await dump(store) == before
        assert await store.exists("/a") == a_stat
        # The parent's sequence counter was persisted.
        assert await store.create("/q/s-", sequential=True) == "/q/s-0000000001"


async def test_new_data_dir_entries_are_made_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An acknowledged write is only as durable as the directory entries that
    # lead to the log: every directory the store creates must be fsynced
    # into its parent, not just the last one.
    synced: list[Path] = []
    real_fsync_dir = embedded._fsync_dir

    def recording_fsync_dir(path: Path) -> None:
        synced.append(Path(path))
        real_fsync_dir(path)

    monkeypatch.setattr(embedded, "_fsync_dir", recording_fsync_dir)
    monkeypatch.setattr(_files, "fsync_dir", recording_fsync_dir)  # (mkdir_durably's)
    data_dir = tmp_path / "a" / "b" / "c"
    async with open_embedded_store(data_dir) as store:
        await store.create("/x")
    assert {tmp_path, tmp_path / "a", tmp_path / "a" / "b", data_dir} <= set(synced)


async def test_compaction_keeps_everything(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path, compact_records=4) as store:
        for i in range(30):
            await store.create(f"/n{i:02}", str(i).encode())
            if i % 3 == 0:
                await store.set(f"/n{i:02}", b"set")
        await store.create("/q")
        for _ in range(3):
            await store.create("/q/x-", sequential=True)
        before = await dump(store)
    # Compaction runs in the flusher after the writers were woken, so look
    # once the store is closed (the flusher has finished by then).
    assert store.compaction_count >= 5
    assert log_records(tmp_path) < 4
    assert (tmp_path / SNAPSHOT_FILE).exists()
    async with open_embedded_store(tmp_path, compact_records=4) as store:
        assert await dump(store) == before
        assert await store.get("/n03") == (b"set", Stat(version=1))
        assert await store.create("/q/x-", sequential=True) == "/q/x-0000000003"


async def test_compaction_by_size(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path, compact_bytes=1024) as store:
        await store.create("/big", b"x" * 2000)
        await store.create("/small", b"y")
    assert store.compaction_count == 1
    assert 0 < (tmp_path / LOG_FILE).stat().st_size < 100  # just "/small"
    async with open_embedded_store(tmp_path) as store:
        assert (await store.get("/big"))[0] == b"x" * 2000
        assert (await store.get("/small"))[0] == b"y"


async def test_replay_skips_records_covered_by_snapshot(tmp_path: Path) -> None:
    # A crash after the snapshot was replaced but before the log was emptied
    # leaves old records behind; replay must skip them.
    async with open_embedded_store(tmp_path) as store:
        for i in range(10):
            await store.create(f"/n{i}")
        old_log = (tmp_path / LOG_FILE).read_bytes()
        await store._compact()  # test hook: compact now
        assert (tmp_path / LOG_FILE).stat().st_size == 0
    (tmp_path / LOG_FILE).write_bytes(old_log)
    async with open_embedded_store(tmp_path) as store:
        assert await store.children("/") == [f"n{i}" for i in range(10)]
        await store.create("/after")
    async with open_embedded_store(tmp_path) as store:
        assert len(await store.children("/")) == 11


@pytest.mark.parametrize("damage", ["garbage", "zeros", "cut", "flipped"])
async def test_torn_tail_is_cut_on_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    log_path = tmp_path / LOG_FILE
    async with open_embedded_store(tmp_path) as store:
        for i in range(5):
            await store.create(f"/n{i}", b"v" * i)
        intact = log_path.stat().st_size
        await store.create("/last", b"the last record")
    whole = log_path.read_bytes()
    if damage == "garbage":
        log_path.write_bytes(whole + b"\x13\x00\x00\x00\xde\xad\xbe\xefgarbage")
        kept = ["last"]
    elif damage == "zeros":
        log_path.write_bytes(whole + bytes(4096))
        kept = ["last"]
    elif damage == "cut":
        log_path.write_bytes(whole[: intact + (len(whole) - intact) // 2])
        kept = []
    else:
        log_path.write_bytes(whole[:-3] + bytes([whole[-3] ^ 0xFF]) + whole[-2:])
        kept = []
    damaged_bytes = log_path.read_bytes()

    with caplog.at_level(logging.WARNING, logger="trio_coord.store.embedded"):
        async with open_embedded_store(tmp_path) as store:
            names = await store.children("/")
            assert names == sorted([f"n{i}" for i in range(5)] + kept)
            await store.create("/after-recovery")
    assert any("cut a torn tail" in r.getMessage() for r in caplog.records)
    # The cut bytes are kept beside the log for a post-mortem, exactly.
    (cut,) = [p for p in os.listdir(tmp_path) if p.startswith(f"{LOG_FILE}.cut-")]
    cut = tmp_path / cut
    offset = int(cut.name.rpartition("-")[2])
    assert cut.read_bytes() == damaged_bytes[offset:]
    # The cut was made durable and new records were appended after it.
    async with open_embedded_store(tmp_path) as store:
        assert "after-recovery" in await store.children("/")
        assert (await store.get("/n4"))[0] == b"vvvv"


async def test_multi_is_one_log_record(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        before = log_records(tmp_path)
        await store.multi([Create("/a"), Create("/a/b"), SetData("/a", b"x"), Delete("/a/b")])
        assert log_records(tmp_path) == before + 1
        await store.create("/r/s/t", make_parents=True)
        assert log_records(tmp_path) == before + 2
        await store.delete("/r", recursive=True)
        assert log_records(tmp_path) == before + 3
        with pytest.raises(StoreError):
            await store.multi([Create("/z"), Delete("/nope")])
        assert log_records(tmp_path) == before + 3


# -- locking ------------------------------------------------------------------------------


async def test_data_dir_lock(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.create("/a")
        with pytest.raises(StoreError, match="in use by another process") as info:
            async with open_embedded_store(tmp_path):
                pass  # pragma: no cover
        message = str(info.value)
        assert str(tmp_path / "LOCK") in message
        assert "--data-dir" in message
        await store.create("/b")  # the first store is unaffected
    async with open_embedded_store(tmp_path) as store:  # released on close
        assert await store.children("/") == ["a", "b"]


# -- group commit and durability waits -----------------------------------------------------


async def test_group_commit(tmp_path: Path) -> None:
    writes = 200
    async with open_embedded_store(tmp_path) as store:
        flushes_before = store.flush_count
        async with trio.open_nursery() as nursery:
            for i in range(writes):
                nursery.start_soon(store.create, f"/n{i:03}", b"x")
        flushes = store.flush_count - flushes_before
        assert 1 <= flushes <= writes // 20
        assert len(await store.children("/")) == writes
    async with open_embedded_store(tmp_path) as store:
        assert len(await store.children("/")) == writes


async def test_reads_wait_until_what_they_see_is_durable(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        real_write = store._write_log

        def slow_write(data: bytes) -> None:
            time.sleep(0.2)
            real_write(data)

        store._write_log = slow_write  # type: ignore[method-assign]
        flushes_before = store.flush_count
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.create, "/slow", b"x")
            await trio.sleep(0.01)  # the write is applied in memory, not yet durable
            stat = await store.exists("/slow")
            assert stat is not None
            assert store.flush_count == flushes_before + 1


async def test_errors_wait_until_the_state_they_report_is_durable(tmp_path: Path) -> None:
    # A "no node" / "bad version" answer describes the in-memory tree just as a
    # successful read does: it must not be given while the write that made it
    # so can still be lost in a crash (after which the node would be back).
    async with open_embedded_store(tmp_path) as store:
        real_write = store._write_log
        slow = False

        def slow_write(data: bytes) -> None:
            if slow:
                time.sleep(0.1)
            real_write(data)

        store._write_log = slow_write  # type: ignore[method-assign]
        calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("get", lambda: store.get("/x")),
            ("children", lambda: store.children("/x")),
            ("set", lambda: store.set("/x", b"1")),
            ("delete", lambda: store.delete("/x", recursive=True)),
            ("create", lambda: store.create("/x/child")),
            ("multi", lambda: store.multi([Check("/x", 0)])),
        ]
        for what, call in calls:
            await store.create("/x", b"0")
            slow = True
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.delete, "/x")  # applied now, durable in 0.1 s
                await trio.sleep(0.01)
                lsn = store._appended_lsn
                assert store._durable_lsn < lsn
                with pytest.raises(StoreError):
                    await call()
                assert store._durable_lsn >= lsn, f"{what} failed on a state not yet durable"
            slow = False
    async with open_embedded_store(tmp_path) as store:
        assert await store.exists("/x") is None


async def test_cancelled_writer_stays_applied_through_a_compaction(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path, compact_records=2) as store:
        await store.create("/first")
        real_write = store._write_log

        def slow_write(data: bytes) -> None:
            time.sleep(0.05)
            real_write(data)

        store._write_log = slow_write  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.create, "/busy")  # this flush triggers a compaction
            await trio.sleep(0.01)
            with trio.move_on_after(0.01) as scope:
                await store.create("/cancelled")  # pending, so only the snapshot will hold it
            assert scope.cancelled_caught
        assert await store.exists("/cancelled") is not None
        await store.create("/after")
    assert store.compaction_count >= 1
    async with open_embedded_store(tmp_path) as store:
        assert await store.children("/") == ["after", "busy", "cancelled", "first"]


async def test_flush_failure_is_fail_stop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.create("/durable")

        def broken_write(data: bytes) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        store._write_log = broken_write  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR), pytest.raises(StoreError, match="fail-stop") as info:
            await store.create("/lost")
        assert not isinstance(info.value, StoreClosedError)
        with pytest.raises(StoreClosedError, match="/other"):
            await store.get("/other")
    async with open_embedded_store(tmp_path) as store:
        assert await store.children("/") == ["durable"]


# -- sessions and ephemeral nodes ------------------------------------------------------------


async def test_aclose_removes_ephemerals_and_ends_watches(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.create("/g")
        await store.create("/g/me", b"alive", ephemeral=True)
        async with store.watch_children("/g") as snapshots:
            assert await anext(snapshots) == ["me"]
            await store.aclose()
            await store.aclose()  # idempotent
            with pytest.raises(StoreClosedError):
                await anext(snapshots)
    async with open_embedded_store(tmp_path) as store:
        assert await store.children("/g") == []
        stat = await store.exists("/g")
        assert stat is not None
        assert stat.cversion == 2  # the ephemeral child came and went


@pytest.mark.parametrize("compact", [False, True], ids=["log", "snapshot"])
async def test_crash_drops_ephemerals_without_reusing_numbers(
    tmp_path: Path, compact: bool
) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    async with open_embedded_store(live) as store:
        await store.create("/g")
        member = await store.create("/g/m-", b"me", ephemeral=True, sequential=True)
        assert member == "/g/m-0000000000"
        seen = await store.exists("/g")
        assert seen is not None
        assert seen.num_children == 1
        if compact:  # test hook: move everything into the snapshot now
            await store._compact()
            assert (live / LOG_FILE).stat().st_size == 0
        # Everything acknowledged is on disk: a copy is what a crash leaves.
        shutil.copytree(live, crashed)
    async with open_embedded_store(crashed) as store:
        assert await store.children("/g") == []
        after = await store.exists("/g")
        assert after is not None
        assert after.cversion > seen.cversion  # the child list did change
        assert await store.create("/g/m-", sequential=True) == "/g/m-0000000001"
        # The bump itself was logged, so it survives another restart.
        bumped = after.cversion
    async with open_embedded_store(crashed) as store:
        stat = await store.exists("/g")
        assert stat is not None
        assert stat.cversion == bumped + 1


async def test_ephemeral_data_is_never_written(tmp_path: Path) -> None:
    secret = b"ephemeral-payload-0123456789"
    async with open_embedded_store(tmp_path, compact_records=2) as store:
        await store.create("/e", secret, ephemeral=True)
        await store.set("/e", secret + b"!")
        for i in range(5):  # force compactions while the ephemeral node exists
            await store.create(f"/p{i}")
    assert store.compaction_count >= 1
    for name in (LOG_FILE, SNAPSHOT_FILE):
        assert secret not in (tmp_path / name).read_bytes()


# -- watches and context manager behaviour ----------------------------------------------------


async def test_watch_unregisters_and_skips_unchanged_states(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        async with store.watch_data("/w") as snapshots:
            assert await anext(snapshots) is None
            await store.create("/w")
            await store.delete("/w")  # net effect: no change
            with trio.move_on_after(0.05) as scope:
                await anext(snapshots)
            assert scope.cancelled_caught
            assert store._data_watches
        assert not store._data_watches
        async with store.watch_children("/"):
            assert store._child_watches
        assert not store._child_watches


async def test_watch_cancelled_mid_delivery_redelivers(tmp_path: Path) -> None:
    async with open_embedded_store(tmp_path) as store:
        await store.create("/w", b"0")
        real_write = store._write_log

        def slow_write(data: bytes) -> None:
            time.sleep(0.2)
            real_write(data)

        store._write_log = slow_write  # type: ignore[method-assign]
        async with store.watch_data("/w") as snapshots, trio.open_nursery() as nursery:
            assert await anext(snapshots) == (b"0", Stat(version=0))
            nursery.start_soon(store.set, "/w", b"1")
            # Woken by the change, then cancelled while waiting for its fsync.
            with trio.move_on_after(0.05) as scope:
                await anext(snapshots)
            assert scope.cancelled_caught
            with trio.fail_after(5):
                assert await anext(snapshots) == (b"1", Stat(version=1))


async def test_body_exception_is_not_wrapped(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="boom"):
        async with open_embedded_store(tmp_path):
            raise KeyError("boom")


async def test_outer_cancellation_still_flushes_and_closes(tmp_path: Path) -> None:
    with trio.CancelScope() as scope:
        async with open_embedded_store(tmp_path) as store:
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(store.create, f"/n{i:02}")
                await trio.lowlevel.checkpoint()
                scope.cancel()
    assert scope.cancelled_caught
    async with open_embedded_store(tmp_path) as store:  # lock released, dir readable
        await store.create("/next")


async def test_unopened_store_refuses_calls(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path)
    with pytest.raises(StoreClosedError, match="open_embedded_store"):
        await store.get("/")


# -- randomized: what is acknowledged is exactly what recovery sees ---------------------------

_names = st.sampled_from(["a", "b", "c"])
_paths = st.lists(_names, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
_datas = st.binary(max_size=8)
_versions = st.sampled_from([-1, 0, 1])
_simple_ops = st.one_of(
    st.builds(Create, _paths, _datas, st.booleans()),
    st.builds(SetData, _paths, _datas, _versions),
    st.builds(Delete, _paths, _versions),
)
_actions = st.one_of(
    st.tuples(st.just("create"), _paths, _datas, st.booleans(), st.booleans(), st.booleans()),
    st.tuples(st.just("set"), _paths, _datas, _versions),
    st.tuples(st.just("delete"), _paths, _versions, st.booleans()),
    st.tuples(st.just("multi"), st.lists(_simple_ops, min_size=1, max_size=3)),
    st.tuples(st.just("reopen")),
)


async def _run(store: EmbeddedStore, action: Action) -> None:
    kind = action[0]
    if kind == "create":
        _, path, data, ephemeral, sequential, parents = action
        await store.create(
            path, data, ephemeral=ephemeral, sequential=sequential, make_parents=parents
        )
    elif kind == "set":
        await store.set(action[1], action[2], version=action[3])
    elif kind == "delete":
        await store.delete(action[1], version=action[2], recursive=action[3])
    else:
        await store.multi(action[1])


@settings(max_examples=40, deadline=None)
@given(actions=st.lists(_actions, max_size=25), compact_records=st.sampled_from([1, 3, 1000]))
async def test_random_histories_recover_exactly(
    actions: list[Action], compact_records: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        live, crashed = Path(tmp) / "live", Path(tmp) / "crashed"
        sessions: list[list[Action]] = [[]]
        for action in actions:
            if action[0] == "reopen":
                sessions.append([])
            else:
                sessions[-1].append(action)
        expected: dict[str, Node] = {"/": (b"", 0, ())}
        for session in sessions:
            async with open_embedded_store(live, compact_records=compact_records) as store:
                assert await dump(store, persistent_only=True) == expected
                for action in session:
                    before = await dump(store)
                    try:
                        await _run(store, action)
                    except StoreError:
                        assert await dump(store) == before  # failed ops change nothing
                expected = await dump(store, persistent_only=True)
        # A crash image (copy of the directory while open) recovers the same
        # state. (Default thresholds: no compaction may run during the copy.)
        async with open_embedded_store(live) as store:
            await store.create("/eph", ephemeral=True)
            shutil.copytree(live, crashed)
        async with open_embedded_store(crashed) as store:
            assert await dump(store, persistent_only=True) == expected
