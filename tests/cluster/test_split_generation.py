"""A generation record too large for one ZooKeeper node is stored split, in two phases.

ZooKeeper refuses a node, and a whole ``multi``, beyond ``jute.maxbuffer``
(1 MiB by default), and #14 bounds every node at 512 KB. The record writer
writes the chunks of a large generation first, then a small head that makes
it current; a crash between the two leaves the previous generation current
and orphan chunks that the next generation write deletes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from trio_coord.broker.persistence import (
    RecordWriter,
    chunk_dir,
    group_path,
    load_records,
)
from trio_coord.core.records import GroupRecord, MemberRecord, OffsetRecord, Record
from trio_coord.protocol.messages import TopicPartition
from trio_coord.store import open_zookeeper_store
from trio_coord.store.base import MetadataStore, SetData, StoreConnectionError

NODE_BOUND = 512 * 1024
GROUP = "big"


def _generation(generation: int, members: int = 4000, partitions_each: int = 50) -> GroupRecord:
    """A group of ``members`` members with ``partitions_each`` partitions each: about
    2.5 MB encoded, beyond what one ZooKeeper node or transaction takes."""
    return GroupRecord(
        GROUP,
        generation,
        "range",
        [
            MemberRecord(
                f"consumer-{m}-{generation}-0f0e0d0c-0b0a-0908-0706-050403020100",
                f"consumer-{m}",
                "/10.1.2.3",
                ["events"],
                45000,
                300000,
                [TopicPartition("events", m * partitions_each + p) for p in range(partitions_each)],
            )
            for m in range(members)
        ],
        topics={"events": members * partitions_each},
    )


class _Coordinator:
    """A record writer over ``store`` loaded as a coordinator loads it (after a restart)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.state: dict[str, Record] = {}

    async def load(self) -> None:
        records, paths = await load_records(self.store)
        for record in records:
            self.state[_key(record)] = record
        self.writer = RecordWriter(
            self.store,
            existing_paths=paths,
            replay=lambda record: self.state.__setitem__(_key(record), record),
            current=lambda record: self.state.get(_key(record)),
        )

    async def write(self, records: list[Record]) -> Exception | None:
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            await nursery.start(self.writer.run)
            try:
                await self.writer.write(records)
            except StoreConnectionError as exc:
                error = exc
            nursery.cancel_scope.cancel()
        return error


def _key(record: Record) -> str:
    if isinstance(record, OffsetRecord):
        return f"{record.group_id}/{record.tp}"
    return getattr(record, "group_id", "")


async def _largest_node(store: MetadataStore, path: str = "/") -> int:
    data = (await store.get(path))[0] if path != "/" else b""
    children = await store.children(path)
    sizes = [len(data)]
    for child in children:
        sizes.append(await _largest_node(store, f"{path.rstrip('/')}/{child}"))
    return max(sizes)


async def _restarted(url: str, then: Callable[[_Coordinator], Awaitable[None]]) -> None:
    async with open_zookeeper_store(url) as store:
        coordinator = _Coordinator(store)
        await coordinator.load()
        await then(coordinator)


async def test_a_large_generation_is_split_survives_a_restart_and_a_crash_between_phases(
    zookeeper_server, zk_chroot
):
    url = zookeeper_server.url(zk_chroot)
    first, second, third = _generation(1), _generation(2), _generation(3, members=3000)
    offset = OffsetRecord(GROUP, "events", 0, 42)

    async def write_first(c: _Coordinator) -> None:
        assert await c.write([first, offset]) is None

    await _restarted(url, write_first)

    async def check_first_then_crash(c: _Coordinator) -> None:
        # Read back equal by a new session (a restarted or failed-over coordinator).
        assert c.state[GROUP] == first and c.state[_key(offset)] == offset
        assert await _largest_node(c.store) <= NODE_BOUND
        chunks = await c.store.children(chunk_dir(GROUP))
        assert len(chunks) >= 8 and all(name.startswith("1.") for name in chunks)
        # A crash between the phases: the chunks of generation 2 are written, its head not.
        real_multi = c.store.multi

        async def crash_at_the_head(ops):  # type: ignore[no-untyped-def]
            if any(isinstance(op, SetData) and op.path == group_path(GROUP) for op in ops):
                raise StoreConnectionError("the coordinator died before writing the head")
            return await real_multi(ops)

        c.store.multi = crash_at_the_head  # type: ignore[method-assign]
        assert await c.write([second]) is not None

    await _restarted(url, check_first_then_crash)

    async def check_orphans_then_write_third(c: _Coordinator) -> None:
        names = await c.store.children(chunk_dir(GROUP))
        assert {name.split(".")[0] for name in names} == {"1", "2"}  # orphans of 2 are there
        assert c.state[GROUP] == first  # ... but the previous generation is what loads
        assert await c.write([third]) is None
        names = await c.store.children(chunk_dir(GROUP))
        assert names and {name.split(".")[0] for name in names} == {"3"}  # 1's and 2's gone

    await _restarted(url, check_orphans_then_write_third)

    async def check_third(c: _Coordinator) -> None:
        assert c.state[GROUP] == third and c.state[_key(offset)] == offset
        assert await _largest_node(c.store) <= NODE_BOUND
        # A generation small enough for one node is stored whole, and the chunks go.
        small = _generation(4, members=10)
        assert await c.write([small]) is None
        assert await c.store.children(chunk_dir(GROUP)) == []

    await _restarted(url, check_third)

    async def check_small(c: _Coordinator) -> None:
        assert c.state[GROUP] == _generation(4, members=10)

    await _restarted(url, check_small)
