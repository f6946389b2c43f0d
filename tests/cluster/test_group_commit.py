"""Offset commits in a cluster are group-committed into ZooKeeper multi writes, sized by bytes.

The record writer gathers every commit queued while its previous write was
in flight into one ``multi``, and cuts a transaction before it would carry
more than ``max_batch_bytes``, so that no write exceeds ZooKeeper's request
limit (``jute.maxbuffer``, 1 MiB) however many members commit at once.
"""

from __future__ import annotations

import trio

from trio_coord.broker.persistence import (
    DEFAULT_MAX_BATCH_BYTES,
    RecordWriter,
    load_records,
)
from trio_coord.core.records import OffsetRecord, Record
from trio_coord.store import open_zookeeper_store


async def test_many_commits_at_once_are_split_under_the_request_limit(zookeeper_server, zk_chroot):
    async with open_zookeeper_store(zookeeper_server.url(zk_chroot)) as store:
        await load_records(store)  # (creates the roots)
        applied: list[Record] = []
        writer = RecordWriter(
            store,
            existing_paths={"/topics", "/groups"},
            replay=applied.append,
            current=lambda record: None,
        )
        # 4000 commits of long names: about 1.5 MiB in all, too much for one request.
        group = "g" * 200
        records = [OffsetRecord(group, "t" * 100, p, p) for p in range(4000)]
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            async with trio.open_nursery() as committers:
                for record in records:
                    committers.start_soon(writer.write, [record])
            nursery.cancel_scope.cancel()
        assert sorted(applied, key=lambda r: r.partition) == records  # type: ignore[union-attr]
        assert 2 <= writer.writes <= 8  # grouped, and cut by bytes, not one per commit
        loaded, _ = await load_records(store)
        assert sorted((r.partition, r.offset) for r in loaded if isinstance(r, OffsetRecord)) == [
            (p, p) for p in range(4000)
        ]
        assert DEFAULT_MAX_BATCH_BYTES < 1024 * 1024
