"""The record writer keeps the store equal to memory: what replay ignores is never written.

Each test writes records through a real broker's writer (on an in-memory
store), then reads the store back with ``load_records`` (what a restart
does) and compares it with the broker's in-memory state.
"""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing

from trio_coord.broker.persistence import RecordWriter, load_records
from trio_coord.core.records import GroupRecord, GroupTombstone, OffsetRecord, TopicRecord
from trio_coord.protocol.messages import TopicPartition
from trio_coord.store import open_embedded_store
from trio_coord.store.base import StoreClosedError, StoreConnectionError

from .harness import ephemeral_broker

TP0 = TopicPartition("t", 0)


async def stored(broker) -> dict[str, object]:
    records, _ = await load_records(broker.store)
    out: dict[str, object] = {}
    for record in records:
        if isinstance(record, OffsetRecord):
            out[f"{record.group_id}/{record.tp}"] = record.offset
        elif isinstance(record, GroupRecord):
            out[f"{record.group_id}/generation"] = record.generation
        elif isinstance(record, TopicRecord):
            out[f"topic/{record.name}"] = record.partitions
    return out


def offset(group: str, value: int, *, reset: bool = False) -> OffsetRecord:
    return OffsetRecord(group, "t", 0, value, reset=reset)


async def test_concurrent_writes_are_one_transaction_and_store_equals_memory(autojump_clock):
    async with ephemeral_broker() as broker:
        writes_before = broker.writer.writes
        async with trio.open_nursery() as nursery:
            for value in (10, 8, 12, 11):  # 8 and 11 would move the offset back: ignored
                nursery.start_soon(broker.writer.write, [offset("g", value)])
        assert broker.writer.writes == writes_before + 1  # group commit
        assert broker.coordinator.committed_offset("g", TP0) == 12
        assert (await stored(broker))["g/t-0"] == 12


async def test_an_explicit_reset_moves_back_and_an_older_generation_does_not(autojump_clock):
    async with ephemeral_broker() as broker:
        await broker.writer.write([offset("g", 10), GroupRecord("g", 3, "range", [])])
        await broker.writer.write([offset("g", 4, reset=True), GroupRecord("g", 0, "", [])])
        runner = broker.coordinator.runner("g")
        assert (runner.group.generation, broker.coordinator.committed_offset("g", TP0)) == (3, 4)
        assert await stored(broker) == {"g/t-0": 4, "g/generation": 3}


async def test_a_tombstone_clears_the_group_and_later_records_start_afresh(autojump_clock):
    async with ephemeral_broker() as broker:
        await broker.writer.write([offset("g", 10), GroupRecord("g", 5, "range", [])])
        await broker.writer.write(
            [offset("g", 20), GroupTombstone("g"), offset("g", 3), GroupRecord("g", 1, "", [])]
        )
        runner = broker.coordinator.runner("g")
        assert (runner.group.generation, broker.coordinator.committed_offset("g", TP0)) == (1, 3)
        assert await stored(broker) == {"g/t-0": 3, "g/generation": 1}


async def test_a_fence_survives_a_restart(tmp_path):
    """A member crashed just before the broker restarted: its partitions stay fenced.

    (Real time, real store: two brokers on one data dir, one after the other.)
    """
    from trio_coord import open_broker

    from .harness import FakeMember, Recorder, Timeline, connected

    data = tmp_path / "data"
    rec = Recorder()
    async with open_broker(data, min_session_timeout=0.05, on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        a, b = (
            FakeMember(broker, "g", ["t"], session_timeout=30.0, timeline=Timeline(), name=n)
            for n in "ab"
        )
        async with connected(a), connected(b):
            await a.join()
            await rec.wait_for("stable", generation=1)
            await b.join()
            await rec.wait_for("stable", generation=2)
            b_had = list(b.owned)
            await b.crash()  # b may go on fetching for 30 s
            await rec.wait_for("removed", member_id=b.member_id)
            await rec.wait_for("start_delayed")  # a's new generation waits for b's lease
            b_id = b.member_id
    # The broker restarts before b's lease ends: the new coordinator must fence b too.
    async with open_broker(data, min_session_timeout=0.05) as broker:
        group = broker.coordinator.runner("g").group
        assert b_id in group.fences
        assert set(b_had) <= group.fences[b_id].partitions
        assert group.fences[b_id].until >= trio.current_time() + 29.0


class _StalledStore:
    """A store whose transactions wait until released (a ZooKeeper that is slow to answer)."""

    def __init__(self, store) -> None:
        self._store = store
        self.release = trio.Event()
        self.started = trio.Event()

    async def multi(self, ops):
        self.started.set()
        await self.release.wait()
        return await self._store.multi(ops)


async def test_a_stopped_writer_fails_what_it_was_writing_and_what_was_queued():
    # A slot given up cancels its writer; the commits waiting on it run elsewhere
    # (in request handlers) and must not wait for ever.
    async with open_embedded_store(None) as inner:
        await load_records(inner)  # (creates the roots)
        store = _StalledStore(inner)
        writer = RecordWriter(
            store,
            existing_paths={"/topics", "/groups"},
            replay=lambda r: None,
            current=lambda r: None,
        )
        outcomes: list[str] = []

        async def commit(value: int) -> None:
            try:
                await writer.write([offset("g", value)])
            except StoreClosedError as exc:
                outcomes.append(f"{value}: {exc}")

        with trio.fail_after(30):  # a hang guard: the bug was waiting for ever
            async with trio.open_nursery() as callers:
                async with trio.open_nursery() as slot:
                    await slot.start(writer.run)
                    callers.start_soon(commit, 1)
                    await store.started.wait()  # 1 is being written
                    callers.start_soon(commit, 2)
                    await trio.testing.wait_all_tasks_blocked()  # 2 is queued
                    slot.cancel_scope.cancel()
        assert sorted(o.split(":")[0] for o in outcomes) == ["1", "2"]
        assert "find the coordinator again" in outcomes[0]
        with pytest.raises(StoreClosedError):
            await writer.write([offset("g", 3)])
        await writer.drain()  # returns: nothing can be pending


class _LostAnswerStore:
    """A store that applies the next transaction, then loses its answer (ConnectionLoss)."""

    def __init__(self, store) -> None:
        self._store = store
        self.lose_next = False

    async def exists(self, path):
        return await self._store.exists(path)

    async def multi(self, ops):
        result = await self._store.multi(ops)
        if self.lose_next:
            self.lose_next = False
            raise StoreConnectionError("connection lost (the transaction was applied)")
        return result


async def test_a_write_whose_answer_was_lost_does_not_poison_the_next_ones():
    # The lost write created g's offset node; the writer, not knowing, would create
    # it again (NodeExistsError), and fail every later commit batched with it.
    async with open_embedded_store(None) as inner:
        await load_records(inner)
        store = _LostAnswerStore(inner)
        applied: list[object] = []
        writer = RecordWriter(
            store,
            existing_paths={"/topics", "/groups"},
            replay=applied.append,
            current=lambda r: None,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            store.lose_next = True
            with pytest.raises(StoreConnectionError):
                await writer.write([offset("g", 10)])
            await writer.write([offset("g", 11), offset("h", 5)])  # the retry, and another group
            nursery.cancel_scope.cancel()
        assert applied == [offset("g", 11), offset("h", 5)]
        loaded, _ = await load_records(inner)
        assert sorted((r.group_id, r.offset) for r in loaded if isinstance(r, OffsetRecord)) == [
            ("g", 11),
            ("h", 5),
        ]


class _DisconnectedReads:
    """A store whose reads of nodes fail as a lost ZooKeeper connection does."""

    def __init__(self, store) -> None:
        self._store = store

    async def exists(self, path):
        return await self._store.exists(path)

    async def children(self, path):
        return await self._store.children(path)

    async def get(self, path):
        await trio.lowlevel.checkpoint()
        raise StoreConnectionError("connection lost")


async def test_loading_through_a_lost_connection_raises_it_as_itself():
    # The reads run 64 at a time; each fails. A caller retrying on
    # StoreConnectionError (a slot's loader) must see that, not a group of them.
    async with open_embedded_store(None) as inner:
        await load_records(inner)
        for n in range(10):
            await inner.create(f"/groups/g{n}", b"")
        with pytest.raises(StoreConnectionError, match="connection lost"):
            await load_records(_DisconnectedReads(inner))
