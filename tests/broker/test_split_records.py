"""Split generation records on the embedded store: the same record shape as on ZooKeeper.

The writer here cuts records into 1 KiB chunks, so that small groups take
the two-phase path (tests/cluster/test_split_generation.py writes a group too
large for a ZooKeeper node).
"""

from __future__ import annotations

import trio

from trio_coord.broker.persistence import RecordWriter, chunk_dir, group_path, load_records
from trio_coord.core.records import GroupRecord, GroupTombstone, MemberRecord, Record
from trio_coord.protocol.messages import TopicPartition
from trio_coord.store import open_embedded_store
from trio_coord.store.base import MetadataStore, SetData, StoreConnectionError


def _generation(generation: int, members: int = 100) -> GroupRecord:
    return GroupRecord(
        "g",
        generation,
        "range",
        [
            MemberRecord(f"m-{m}-{generation}", "c", "/h", ["t"], 1, 2, [TopicPartition("t", m)])
            for m in range(members)
        ],
    )


async def _write(store: MetadataStore, records: list[Record]) -> dict[str, Record]:
    """Load the store as a restarted coordinator would, write ``records``, return the state
    (a write that fails with a lost connection leaves it as loaded)."""
    loaded, paths = await load_records(store)
    state = {getattr(r, "group_id", ""): r for r in loaded}

    def replay(record: Record) -> None:
        if isinstance(record, GroupTombstone):
            state.pop(record.group_id, None)
        else:
            state[getattr(record, "group_id", "")] = record

    writer = RecordWriter(
        store,
        existing_paths=paths,
        replay=replay,
        current=lambda r: state.get(getattr(r, "group_id", "")),
        chunk_bytes=1024,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        try:
            await writer.write(records)
        except StoreConnectionError:
            pass
        nursery.cancel_scope.cancel()
    return state


async def test_a_group_deleted_and_written_again_in_one_batch_is_split_anew():
    async with open_embedded_store(None) as store:
        await _write(store, [_generation(1)])
        assert len(await store.children(chunk_dir("g"))) > 1
        state = await _write(store, [GroupTombstone("g"), _generation(1, members=80)])
        assert state["g"] == _generation(1, members=80)
        loaded, _ = await load_records(store)
        assert loaded == [_generation(1, members=80)]


async def test_orphan_chunks_beside_a_whole_record_are_found_and_deleted():
    async with open_embedded_store(None) as store:
        await _write(store, [_generation(1, members=2)])  # small: stored whole
        assert await store.exists(chunk_dir("g")) is None
        # The first split write of the group dies after its chunks are written.
        real_multi = store.multi

        async def crash_at_the_head(ops):  # type: ignore[no-untyped-def]
            if any(isinstance(op, SetData) and op.path == group_path("g") for op in ops):
                raise StoreConnectionError("died before the head")
            return await real_multi(ops)

        store.multi = crash_at_the_head  # type: ignore[method-assign]
        assert (await _write(store, [_generation(2)]))["g"] == _generation(1, members=2)
        store.multi = real_multi  # type: ignore[method-assign]
        orphans = await store.children(chunk_dir("g"))
        assert orphans and all(name.startswith("2.") for name in orphans)
        loaded, _ = await load_records(store)
        assert loaded == [_generation(1, members=2)]  # the previous generation loads
        # A restarted coordinator splits generation 3: it finds and deletes 2's chunks.
        await _write(store, [_generation(3)])
        names = await store.children(chunk_dir("g"))
        assert names and all(name.startswith("3.") for name in names)
        assert (await load_records(store))[0] == [_generation(3)]
