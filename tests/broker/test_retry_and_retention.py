"""Broker settings of the group engine: rebalance retry backoff, and offset retention.

A rebalance that cannot persist is retried after ``rebalance_retry_backoff``,
doubling per failure in a row up to ``rebalance_retry_backoff_max`` (not a
fixed second); an empty group's committed offsets expire
``offsets_retention`` after it became empty (Kafka's
offsets.retention.minutes), from memory and from the store, while a group
with members keeps them however old they are.
"""

from __future__ import annotations

import itertools

import trio

from trio_coord import open_admin, open_broker, open_consumer
from trio_coord.broker.persistence import RecordWriter
from trio_coord.core.records import GroupRecord
from trio_coord.protocol import TopicPartition
from trio_coord.store.base import StoreError

from .harness import FakeMember, Recorder, connected, ephemeral_broker, heartbeat_forever


async def test_failed_rebalances_back_off_doubling_up_to_the_maximum(
    autojump_clock, monkeypatch
) -> None:
    failures = [5]
    write = RecordWriter.write

    async def flaky(self, records):
        if failures[0] and any(isinstance(r, GroupRecord) for r in records):
            failures[0] -= 1
            raise StoreError("the store is down (test)")
        await write(self, records)

    monkeypatch.setattr(RecordWriter, "write", flaky)
    rec = Recorder()
    async with ephemeral_broker(
        on_event=rec, rebalance_retry_backoff=1.0, rebalance_retry_backoff_max=4.0
    ) as broker:
        await broker.topics.create_topic("t", 2)
        a = FakeMember(broker, "g", ["t"], name="a")
        async with connected(a), trio.open_nursery() as nursery:
            await a.join()
            nursery.start_soon(heartbeat_forever, a, 1.0)
            stable = await rec.wait_for("stable")
            failed = [d["time"] for d in rec.all("rebalance_failed")]
            assert len(failed) == 5
            assert [round(b - a, 6) for a, b in itertools.pairwise(failed)] == [1, 2, 4, 4]
            assert stable["time"] == failed[-1] + 4
            nursery.cancel_scope.cancel()


async def test_an_empty_groups_offsets_expire_after_offsets_retention(tmp_path) -> None:
    settings = dict(min_session_timeout=0.05, initial_rebalance_delay=0.0, group_retention=3600)
    async with open_broker(tmp_path, offsets_retention=0.5, **settings) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 1)
        tp = TopicPartition("t", 0)
        async with open_consumer(
            broker.bootstrap, "g", ["t"], session_timeout=0.5, auto_commit=False
        ) as consumer:
            await consumer.wait_assigned()
            await consumer.commit({tp: 0})
            await trio.sleep(1.5)  # older than the retention, but the group has a member
            assert broker.coordinator.committed_offset("g", tp) == 0
        # Empty now: gone once it has been empty for the retention.
        with trio.fail_after(10):
            while broker.coordinator.committed_offset("g", tp) is not None:
                await trio.sleep(0.05)
    # ... and gone from the store: a restart (retention off) does not bring it back.
    async with open_broker(tmp_path, offsets_retention=None, **settings) as broker:
        assert broker.coordinator.committed_offset("g", tp) is None


async def test_a_commit_in_flight_during_the_expiry_sweep_survives_it(
    autojump_clock, monkeypatch
) -> None:
    # A standalone committer (a Spark stream, say) commits to an empty group whose old
    # offset has just expired; the sweep runs while that commit is being written. The
    # sweep's tombstone must not land after the commit and delete it.
    from trio_coord.broker import group as group_module
    from trio_coord.protocol.messages import OffsetCommitRequest, PartitionOffset

    wall = [1_000_000_000_000]
    monkeypatch.setattr(group_module, "_wall_clock_ms", lambda: wall[0])
    tp = TopicPartition("t", 0)
    async with ephemeral_broker(offsets_retention=None) as broker:
        await broker.topics.create_topic("t", 1)
        await broker.coordinator.commit(
            OffsetCommitRequest("g", "", -1, [PartitionOffset("t", 0, 5)])
        )
        runner = broker.coordinator.runner("g")
        assert runner is not None
        await trio.sleep(60)  # empty for a minute; the offset is a minute old
        wall[0] += 60_000
        store = runner._writer.store
        multi = store.multi
        gate = trio.Event()

        async def slow_multi(ops):  # the next store write waits for the gate
            await gate.wait()
            return await multi(ops)

        monkeypatch.setattr(store, "multi", slow_multi)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                broker.coordinator.commit,
                OffsetCommitRequest("g", "", -1, [PartitionOffset("t", 0, 9)]),
            )
            await trio.sleep(1)  # the fresh commit is queued (or in flight), not replayed
            assert broker.coordinator.committed_offset("g", tp) == 5
            nursery.start_soon(runner.expire_offsets, 30.0)  # (its write waits too)
            await trio.sleep(1)
            gate.set()
        assert broker.coordinator.committed_offset("g", tp) == 9
