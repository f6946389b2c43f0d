"""Records end to end: producer → partition log → consumer group, over real sockets.

What an application relies on: every record sent comes back, with its key,
value, headers and timestamp, in order per partition; keyed records land on
a partition that depends only on the key (the same in every process); a
consumer group reads exactly the partitions it owns, never a record of a
revoked partition after ``on_revoked``; a crash costs duplicates only after
the last commit (at least once); a live group rewinds when its offsets are
reset; fixed-partition consumers commit as standalone committers.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import traceback
import types
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from trio_coord import (
    EARLIEST,
    ConsumerRecord,
    NoOffsetForPartitionError,
    OffsetRegressionError,
    RecordTooLargeError,
    RequestTimedOutError,
    TopicPartition,
    UnknownTopicError,
    open_admin,
    open_broker,
    open_consumer,
    open_producer,
)
from trio_coord.client import partition_for_key
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.messages import ProduceRequest
from trio_coord.protocol.records import WireRecord, encode_batch

S = 0.6  # session timeout (seconds of real time)


async def make_topic(bootstrap: str, name: str, partitions: int) -> None:
    async with open_admin(bootstrap) as admin:
        await admin.create_topic(name, partitions)


async def produce(bootstrap: str, topic: str, count: int, **kw) -> list:
    async with open_producer(bootstrap, **kw) as producer:
        deliveries = [
            await producer.enqueue(
                topic,
                f"value-{i}",
                key=f"key-{i % 17}",
                headers=[("n", str(i).encode())],
                timestamp=1_700_000_000 + i,
            )
            for i in range(count)
        ]
        return [await d for d in deliveries]


async def read_all(consumer, count: int, timeout: float = 10.0) -> list[ConsumerRecord]:
    records: list[ConsumerRecord] = []
    with trio.fail_after(timeout):
        async for record in consumer:
            records.append(record)
            if len(records) == count:
                break
    return records


async def test_every_record_comes_back_in_order_with_key_value_headers(broker):
    await make_topic(broker.bootstrap, "t", 3)
    metas = await produce(broker.bootstrap, "t", 300)
    # Offsets are dense and in send order per partition.
    per_partition: dict[int, list[int]] = defaultdict(list)
    for meta in metas:
        per_partition[meta.partition].append(meta.offset)
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))
    async with open_consumer(
        broker.bootstrap, "g", ["t"], session_timeout=S, offset_reset="earliest"
    ) as consumer:
        records = await read_all(consumer, 300)
    by_n = {int(dict(r.headers)["n"]): r for r in records}
    assert sorted(by_n) == list(range(300))
    for i, record in by_n.items():
        assert record.value == f"value-{i}".encode()
        assert record.key == f"key-{i % 17}".encode()
        assert record.timestamp == 1_700_000_000 + i
        assert (record.partition, record.offset) == (metas[i].partition, metas[i].offset)
        assert record.partition == partition_for_key(record.key, 3)
    # Order per partition as consumed.
    seen: dict[int, list[int]] = defaultdict(list)
    for record in records:
        seen[record.partition].append(record.offset)
    assert all(offsets == sorted(offsets) for offsets in seen.values())


async def test_send_waits_for_the_broker_and_returns_the_offset(broker):
    await make_topic(broker.bootstrap, "t", 2)
    async with open_producer(broker.bootstrap, linger=0) as producer:
        first = await producer.send("t", b"a", partition=1)
        second = await producer.send("t", b"b", partition=1)
        keyless = [await producer.send("t", b"x") for _ in range(4)]
    assert (first.partition, first.offset, second.offset) == (1, 0, 1)
    assert all(m.topic == "t" and m.partition in (0, 1) for m in keyless)


async def test_a_cancelled_block_closes_the_producer_at_once_failing_what_was_unsent(broker):
    # Cancelling the block cancels the producer's senders with it: waiting for a
    # flush then would only wait out close_timeout (it did, with a lingering batch).
    await make_topic(broker.bootstrap, "t", 1)
    with trio.fail_after(60):  # a hang guard: close_timeout is an hour
        with trio.CancelScope() as outer:
            async with open_producer(broker.bootstrap, linger=3600, close_timeout=3600) as p:
                first = await p.enqueue("t", b"stored")
                await p.flush()
                stored = await first
                lingering = await p.enqueue("t", b"lingering")
                outer.cancel()
                await trio.sleep_forever()
    assert outer.cancelled_caught
    assert stored.offset == 0
    with pytest.raises(RequestTimedOutError, match="closed before the record was stored"):
        await lingering


async def test_each_failed_delivery_raises_with_a_traceback_of_its_own_await(broker):
    # The records of a batch share one error. Raising the same exception object
    # again extends its traceback: the 200th delivery awaited raised with the frames
    # of all 199 awaits before it, a traceback growing with every await.
    await make_topic(broker.bootstrap, "t", 1)
    with trio.CancelScope() as outer:
        async with open_producer(broker.bootstrap, linger=3600) as p:
            lingering = [await p.enqueue("t", b"x") for _ in range(200)]
            outer.cancel()
    depths = []
    for delivery in lingering:
        try:
            await delivery
        except RequestTimedOutError as exc:
            depths.append(len(traceback.extract_tb(exc.__traceback__)))
    assert len(depths) == 200
    assert set(depths) == {depths[0]}


async def test_an_enqueue_that_raises_cancelled_did_not_enqueue(broker):
    # Trio's rule: Cancelled means the operation did not happen. An enqueue cancelled
    # at its last checkpoint had queued its record, which was then sent all the same.
    await make_topic(broker.bootstrap, "t", 1)
    async with open_producer(broker.bootstrap, linger=0.001) as producer:
        await producer.send("t", b"first")  # (the topic's metadata is known now)
        with trio.CancelScope() as scope:
            scope.cancel()
            await producer.enqueue("t", b"cancelled")
        assert scope.cancelled_caught
        kept = await producer.enqueue("t", b"kept")
    assert (await kept).offset == 1  # nothing stored between
    async with open_admin(broker.bootstrap) as admin:
        (ends,) = (await admin.list_offsets([TopicPartition("t", 0)])).values()
    assert ends.log_end == 2


@pytest.mark.parametrize(
    ("partitions", "frame", "topic"),
    [
        (5000, None, "t"),
        (600, 64 * 1024, "t"),
        # Long topic names: their offsets lookup (ListOffsets) was one request of every
        # partition, larger than the consumer's frame (10,000 of a 120-character name)
        # or the broker's (1,000 of a 100-character name at 64 KiB, where the fetch is,
        # too): refused, and retried, forever.
        (10_000, None, "t" * 120),
        (1000, 64 * 1024, "t" * 100),
        # (A request larger than the broker's frame and smaller than half the budget.)
        (300, 64 * 1024, "t" * 249),
    ],
    ids=[
        "5000",
        "600-of-64KiB",
        "10000-long-names",
        "1000-long-names-of-64KiB",
        "300-longest-names-of-64KiB",
    ],
)
async def test_a_consumer_of_more_partitions_than_one_fetch_holds_reads_them_all(
    tmp_path, partitions, frame, topic
):
    # A broker refuses a fetch whose partitions would take over a quarter of its frame:
    # 5,000 of a broker's default 1 MiB frame, or 600 of a 64 KiB one (a size the
    # consumer cannot know, and learns from the refusal). Every fetch was refused, forever.
    settings = {} if frame is None else {"max_frame_size": frame}
    async with open_broker(tmp_path, max_partitions=partitions, **settings) as broker:
        await make_topic(broker.bootstrap, topic, partitions)
        ends = [0, partitions // 2, partitions - 1]
        async with open_producer(broker.bootstrap, linger=0) as producer:
            for p in ends:
                await producer.send(topic, str(p).encode(), partition=p)
        async with open_consumer(
            broker.bootstrap,
            partitions=[(topic, p) for p in range(partitions)],
            offset_reset="earliest",
        ) as consumer:
            with trio.fail_after(30):
                got = [await consumer.getone() for _ in ends]
            # And one produced now to a partition that had caught up comes too.
            async with open_producer(broker.bootstrap) as producer:
                await producer.send(topic, b"later", partition=1)
            with trio.fail_after(30):
                later = await consumer.getone()
    assert sorted((r.partition, r.value) for r in got) == [(p, str(p).encode()) for p in ends]
    assert (later.partition, later.value) == (1, b"later")


async def test_caught_up_partitions_of_several_fetches_each_wait_at_most_fetch_max_wait(
    tmp_path,
):
    # 10,000 partitions of a 120-character topic name take 8 fetches. Caught up, they were
    # long-polled 8 in turn, one at a time, each for fetch_max_wait (3 s here): a record
    # produced to a partition just polled waited for the 7 other polls (18-21 s). Polls
    # of a turn now share fetch_max_wait, so every partition is asked within it.
    topic, partitions = "t" * 120, 10_000
    async with open_broker(tmp_path, max_partitions=partitions) as broker:
        await make_topic(broker.bootstrap, topic, partitions)
        async with open_producer(broker.bootstrap, linger=0) as producer:
            await producer.send(topic, b"first", partition=0)
            async with open_consumer(
                broker.bootstrap,
                partitions=[(topic, p) for p in range(partitions)],
                offset_reset="earliest",
                fetch_max_wait=3,
            ) as consumer:
                with trio.fail_after(10):  # (fetched at once: partition 0 had a record)
                    first = await consumer.getone()
                # Partition 0 was in the fetch just answered: its turn comes last.
                await producer.send(topic, b"second", partition=0)
                with trio.fail_after(10):  # a hang guard: the turn of 8 polls took 18-21 s
                    second = await consumer.getone()
    assert [(r.partition, r.value) for r in (first, second)] == [(0, b"first"), (0, b"second")]


async def test_a_large_assignment_is_read_at_once_though_most_partitions_are_empty(tmp_path):
    # A member is started where its group left each partition, not knowing where the logs
    # end: every partition counts as having records, and went in fetches that each waited
    # fetch_max_wait for the empty ones (here 10 fetches of 100 partitions, three at a
    # time, 5 s each). Records in a few of them came after the whole sweep: 15-20 s.
    topic, partitions = "t" * 100, 1000
    async with open_broker(tmp_path, max_frame_size=64 * 1024, max_partitions=partitions) as b:
        await make_topic(b.bootstrap, topic, partitions)
        spread = range(0, partitions, 100)
        async with open_producer(b.bootstrap, linger=0) as producer:
            for p in spread:
                await producer.send(topic, str(p).encode(), partition=p)
        async with open_consumer(
            b.bootstrap, "g", [topic], offset_reset="earliest", fetch_max_wait=5
        ) as consumer:
            got: list = []
            with trio.fail_after(8):  # (a hang guard: the sweep took 15-20 s)
                while len(got) < len(spread):
                    got += await consumer.getmany()
    assert sorted(r.partition for r in got) == list(spread)


async def test_a_fetch_larger_than_the_brokers_frame_is_sent_smaller(tmp_path):
    # Partitions placed by seek need no offsets lookup, so the first request is the fetch
    # of all 1,000: a frame larger than the broker's 64 KiB, which it refuses by closing
    # the connection (not with the error a fetch of too many partitions gets). The
    # consumer took that for an error of the application's, and sent it again, forever.
    topic = "t" * 100
    async with open_broker(tmp_path, max_frame_size=64 * 1024) as broker:
        await make_topic(broker.bootstrap, topic, 1000)
        async with open_producer(broker.bootstrap, linger=0) as producer:
            await producer.send(topic, b"last", partition=999)
        async with open_consumer(
            broker.bootstrap,
            partitions=[(topic, p) for p in range(1000)],
            offset_reset="none",  # (a partition not sought would raise: none is looked up)
        ) as consumer:
            for p in range(1000):
                consumer.seek(TopicPartition(topic, p), 0)
            with trio.fail_after(30):
                record = await consumer.getone()
    assert (record.partition, record.value) == (999, b"last")


async def test_a_consumer_reads_from_a_broker_of_a_larger_frame(tmp_path):
    # A broker of an 8 MiB frame answered a fetch with up to 8 MiB, more than the
    # consumer's connection reads (1 MiB): FRAME_TOO_LARGE, on every fetch, forever.
    # The consumer now bounds the whole answer by its frame (max_bytes).
    async with open_broker(
        tmp_path, max_frame_size=8 << 20, max_connection_bytes=32 << 20
    ) as broker:
        await make_topic(broker.bootstrap, "t", 1)
        async with open_producer(broker.bootstrap, linger=0.05) as producer:
            for i in range(600):
                await producer.enqueue("t", b"%06d" % i + b"x" * 10_000)
            await producer.flush()
        async with open_consumer(
            broker.bootstrap,
            partitions=[("t", 0)],
            offset_reset="earliest",
            max_partition_fetch_bytes=8 << 20,
        ) as consumer:
            got: list = []
            with trio.fail_after(30):
                while len(got) < 600:
                    got += await consumer.getmany(1000)
    assert [r.value[:6] for r in got] == [b"%06d" % i for i in range(600)]


@asynccontextmanager
async def broker_holding_a_2_mib_batch(tmp_path, partitions: int) -> AsyncIterator:
    """A broker of an 8 MiB frame whose topic ``t`` holds, in partition 0, a batch of one
    2 MiB record (offset 0) and then one of ``b"after"`` (offset 1)."""
    async with open_broker(
        tmp_path, max_frame_size=8 << 20, max_connection_bytes=32 << 20, max_batch_bytes=4 << 20
    ) as broker:
        await make_topic(broker.bootstrap, "t", partitions)
        async with open_connection(*broker.address, max_frame_size=8 << 20) as conn:
            for value in (b"y" * (2 << 20), b"after"):
                batch = encode_batch([WireRecord(1, None, value)])
                await conn.request(ProduceRequest("t", 0, batch, 1, 1))
        yield broker


async def test_a_batch_larger_than_the_consumers_frame_is_reported_with_its_offset(tmp_path):
    # A broker of an 8 MiB frame holds a 2 MiB batch (a Spark job's batchSize): it came
    # whole, first in the answer, to a consumer that reads 1 MiB. The consumer heard
    # "frame of 2097218 bytes exceeds the maximum frame size" on every fetch, for good,
    # naming no partition or offset, and lost its connection each time.
    async with broker_holding_a_2_mib_batch(tmp_path, partitions=2) as broker:
        async with open_producer(broker.bootstrap) as producer:
            for i in range(100):
                await producer.enqueue("t", b"%d" % i, partition=1)
        async with open_consumer(
            broker.bootstrap, partitions=[("t", 0), ("t", 1)], offset_reset="earliest"
        ) as consumer:
            got: list = []
            with trio.fail_after(30):
                with pytest.raises(RecordTooLargeError, match="offset 0 of t-0") as caught:
                    while True:
                        got += await consumer.getmany(1000)
                assert "seek" in str(caught.value)
                consumer.seek(("t", 0), 1)
                while len(got) < 101:
                    got += await consumer.getmany(1000)
    assert sorted(r.value for r in got if r.partition == 0) == [b"after"]
    assert sorted(int(r.value) for r in got if r.partition == 1) == list(range(100))
    assert "fetch_max_bytes" in str(caught.value)


async def test_a_consumer_of_a_larger_fetch_max_bytes_reads_a_batch_past_the_default(tmp_path):
    # What the error above tells a user to do: a consumer whose frame (fetch_max_bytes,
    # Kafka's fetch.max.bytes) holds the 2 MiB batch reads it, and what follows.
    async with broker_holding_a_2_mib_batch(tmp_path, partitions=1) as broker:
        async with open_consumer(
            broker.bootstrap,
            partitions=[("t", 0)],
            offset_reset="earliest",
            fetch_max_bytes=4 << 20,
            max_partition_fetch_bytes=4 << 20,
        ) as consumer:
            got: list = []
            with trio.fail_after(30):
                while len(got) < 2:
                    got += await consumer.getmany(10)
    assert [len(r.value) for r in got] == [2 << 20, 5]


def reachable_from(root: object) -> list[object]:
    """Every object ``root`` keeps alive (through gc's view of references)."""
    seen: dict[int, object] = {id(root): root}
    frontier = [root]
    while frontier:
        for child in gc.get_referents(frontier.pop()):
            if id(child) not in seen and not isinstance(child, type | types.ModuleType):
                seen[id(child)] = child
                frontier.append(child)
    return list(seen.values())


async def test_the_records_of_one_batch_each_get_their_own_outcome(broker):
    # One batch, one event: its deliveries share the batch's outcome, yet each
    # gives its own offset and timestamp, to every task that awaits it, and none
    # keeps the batch's records (a million values) alive once they are sent.
    await make_topic(broker.bootstrap, "t", 1)
    value = b"v" * 10_000
    async with open_producer(broker.bootstrap, linger=3600) as producer:
        deliveries = [
            await producer.enqueue("t", value if i == 0 else b"x", timestamp=1_700_000_000 + i)
            for i in range(5)
        ]
        assert not any(d.done for d in deliveries)
        await producer.flush()
        assert all(d.done for d in deliveries)
        got: dict[int, list] = defaultdict(list)

        async def wait(index: int) -> None:
            got[index].append(await deliveries[index])

        async with trio.open_nursery() as nursery:
            for index in [*range(5), 0, 4]:  # two tasks await the first and the last
                nursery.start_soon(wait, index)
    offsets = {i: [(m.offset, m.timestamp) for m in metas] for i, metas in got.items()}
    assert offsets == {i: [(i, 1_700_000_000 + i)] * (2 if i in (0, 4) else 1) for i in range(5)}
    assert producer.batches_sent == 1
    for d in deliveries:
        assert not any(obj is value for obj in reachable_from(d))


async def test_a_caught_up_partition_does_not_hold_up_the_others(broker):
    # p0 is read to its end first, so the next fetch of it is a long poll (a minute
    # here) while p1 still has records on the broker, a few at a time: those are
    # fetched as p1 drains, not once the long poll ends (which they used to wait for).
    await make_topic(broker.bootstrap, "t", 2)
    async with open_producer(broker.bootstrap, linger=0) as producer:
        await producer.send("t", b"first", partition=0)
        for i in range(40):
            await producer.send("t", b"x" * 200 + str(i).encode(), partition=1)
    async with open_consumer(
        broker.bootstrap,
        partitions=[("t", 0), ("t", 1)],
        offset_reset="earliest",
        fetch_max_wait=60,
        max_partition_fetch_bytes=1000,  # a few stored batches per fetch
    ) as consumer:
        with trio.fail_after(20):  # a hang guard: a stall lasts the minute
            got = []
            while len(got) < 41:
                got += await consumer.getmany(1)  # p0 drains before p1 does
            assert [r.partition for r in got].count(1) == 40
            # A seek of the partition in the long poll is fetched at once, too.
            consumer.seek(TopicPartition("t", 0), 0)
            (again,) = await consumer.getmany(1)
    assert (again.partition, again.offset, again.value) == (0, 0, b"first")


class _OnFetchSpawned(trio.abc.Instrument):
    """Runs ``action`` once, when the next fetch task is spawned (before it first runs)."""

    def __init__(self) -> None:
        self.action = None

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if self.action is not None and task.name.endswith("._fetch_some"):
            action, self.action = self.action, None
            action()


async def test_a_seek_to_beginning_just_as_a_fetch_starts_is_not_lost(broker):
    # The application drains the partition and seeks it to its beginning at the
    # moment the fetch loop hands the next fetch to a task, before that task has
    # run: the fetch must be of the partition as the loop saw it, not of its
    # unresolved position (-1: out of range, and the reset policy, latest here,
    # then overrode the seek, so records 0-2 were never handed out again).
    await make_topic(broker.bootstrap, "t", 1)
    tp = TopicPartition("t", 0)
    async with open_producer(broker.bootstrap, linger=0) as producer:
        for i in range(3):
            await producer.send("t", f"r{i}", partition=0)
        async with open_consumer(
            broker.bootstrap, partitions=[tp], offset_reset="latest"
        ) as consumer:
            consumer.seek(tp, 0)
            hook = _OnFetchSpawned()
            trio.lowlevel.add_instrument(hook)
            try:
                with trio.fail_after(10):  # a hang guard (the lost seek left nothing to read)
                    got = []
                    while len(got) < 3:
                        got += await consumer.getmany()
                    hook.action = lambda: consumer.seek_to_beginning(tp)
                    again = []
                    while hook.action is not None or not again:
                        again += await consumer.getmany()
                    await producer.send("t", "r3", partition=0)
                    while again[-1].offset < 3:
                        again += await consumer.getmany()
            finally:
                trio.lowlevel.remove_instrument(hook)
    assert [r.offset for r in got] == [0, 1, 2]
    assert [(r.offset, r.value) for r in again] == [(i, f"r{i}".encode()) for i in range(4)]


def test_key_partitioning_is_stable_across_processes():
    keys = [f"user-{i}".encode() for i in range(50)]
    here = [partition_for_key(k, 12) for k in keys]
    script = textwrap.dedent(
        """
        from trio_coord.client import partition_for_key
        keys = [f"user-{i}".encode() for i in range(50)]
        print([partition_for_key(k, 12) for k in keys])
        """
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        assert out.strip() == str(here)
    assert len(set(here)) > 6  # and it spreads


async def test_unknown_topic_and_oversized_records_fail_clearly(broker):
    await make_topic(broker.bootstrap, "t", 1)
    async with open_producer(broker.bootstrap, max_batch_bytes=64 * 1024) as producer:
        with pytest.raises(UnknownTopicError, match="nope"):
            await producer.send("nope", b"x")
        with pytest.raises(UnknownTopicError, match="partition 5"):
            await producer.send("t", b"x", partition=5)
        with pytest.raises(RecordTooLargeError, match="max_batch_bytes"):
            await producer.send("t", b"x" * 100_000)
        assert (await producer.send("t", b"fine")).offset == 0


async def test_a_record_the_producer_accepts_fits_the_brokers_batch_limit(broker):
    # The producer's max_batch_bytes is the broker's (512 KiB each, by default): a record it
    # accepts, alone in its batch or filling one with another, compressed or not, is
    # stored, not refused by the broker once the batch's own bytes (its header, padding, a
    # codec's framing of incompressible bytes) are added.
    await make_topic(broker.bootstrap, "t", 1)
    limit = 512 * 1024
    stored = 0
    for codec in (None, "lz4"):
        async with open_producer(
            broker.bootstrap, batch_size=limit, linger=0.05, compression=codec
        ) as producer:
            for size in (limit - 24 - 80, limit - 24 - 7, limit - 24):
                try:
                    await producer.send("t", os.urandom(size))
                    stored += 1
                except RecordTooLargeError as exc:
                    assert "max_batch_bytes" in str(exc)  # the producer's own refusal
            async with trio.open_nursery() as nursery:  # two halves fill one batch
                for _ in range(2):
                    nursery.start_soon(producer.send, "t", os.urandom(limit // 2 - 24))
    assert stored >= 2  # (a record just under the limit is not refused up front)


async def test_compressed_batches_round_trip(broker):
    await make_topic(broker.bootstrap, "t", 1)
    codecs = ("zlib", "lzma", "lz4", "zstd")
    for codec in codecs:
        await produce(broker.bootstrap, "t", 20, compression=codec)
    async with open_consumer(broker.bootstrap, partitions=[("t", 0)], offset_reset="earliest") as c:
        records = await read_all(c, 20 * len(codecs))
    assert [r.offset for r in records] == list(range(20 * len(codecs)))
    assert [r.value for r in records] == [f"value-{i}".encode() for i in range(20)] * len(codecs)


async def test_fixed_partitions_seek_pause_and_standalone_commits(broker):
    await make_topic(broker.bootstrap, "t", 2)
    await produce(broker.bootstrap, "t", 40)
    tp0 = TopicPartition("t", 0)
    async with open_consumer(
        broker.bootstrap, "standalone", partitions=[tp0], offset_reset="earliest"
    ) as consumer:
        first = await read_all(consumer, 3)
        assert [r.offset for r in first] == [0, 1, 2]
        consumer.seek(tp0, 1)
        again = await consumer.getone()
        assert again.offset == 1
        assert consumer.position(tp0) == 2
        await consumer.commit()  # what was handed out counts as consumed
        async with open_admin(broker.bootstrap) as admin:
            assert await admin.committed_offsets("standalone") == {tp0: 2}
        with pytest.raises(OffsetRegressionError):
            await consumer.commit({tp0: 1})
        await consumer.commit({tp0: 1}, allow_regression=True)
        consumer.pause()
        with trio.move_on_after(0.3) as idle:
            await consumer.getone()
        assert idle.cancelled_caught
        consumer.resume()
        assert (await consumer.getone()).offset == 2


async def test_a_partition_paused_while_caught_up_is_fetched_again_once_resumed(broker):
    # A fetch loop looks again only at partitions something touched: one paused while
    # it waited for its long poll is dropped from the turn, and the resume must bring it
    # back, or its records never come.
    await make_topic(broker.bootstrap, "t", 2)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    async with open_consumer(
        broker.bootstrap, partitions=[tp0, tp1], offset_reset="earliest", fetch_max_wait=0.1
    ) as consumer:
        with trio.move_on_after(0.3):  # (both caught up, long-polled)
            await consumer.getone()
        consumer.pause(tp0)
        async with open_producer(broker.bootstrap, linger=0) as producer:
            await producer.send("t", b"paused", partition=0)
            await producer.send("t", b"running", partition=1)
        with trio.fail_after(10):
            assert (await consumer.getone()).value == b"running"
        with trio.move_on_after(0.5) as idle:
            await consumer.getone()
        assert idle.cancelled_caught
        consumer.resume(tp0)
        with trio.fail_after(10):
            assert (await consumer.getone()).value == b"paused"


async def test_offset_reset_none_raises_until_the_application_seeks(broker):
    await make_topic(broker.bootstrap, "t", 1)
    await produce(broker.bootstrap, "t", 5)
    async with open_consumer(broker.bootstrap, partitions=[("t", 0)], offset_reset="none") as c:
        with trio.fail_after(5), pytest.raises(NoOffsetForPartitionError, match="offset_reset"):
            await c.getone()
        c.seek(("t", 0), 3)
        assert (await c.getone()).offset == 3
        c.seek_to_beginning()
        assert (await c.getone()).offset == 0


async def test_no_record_of_a_revoked_partition_after_on_revoked(broker):
    await make_topic(broker.bootstrap, "t", 4)
    handed: list[tuple[float, TopicPartition]] = []
    revoked_at: dict[TopicPartition, float] = {}

    def on_revoked(tps):
        for tp in tps:
            revoked_at[tp] = trio.current_time()

    async def consume(consumer):
        async for record in consumer:
            handed.append((trio.current_time(), record.tp))
            await trio.sleep(0.001)

    opts = dict(session_timeout=S, offset_reset="earliest")
    async with trio.open_nursery() as nursery:
        async with open_producer(broker.bootstrap, linger=0.001) as producer:

            async def keep_producing():
                i = 0
                while True:
                    # Once cancelled, stop before the next send: the producer closes right
                    # after the cancel, and a send on a closed producer raises at once
                    # (this test used to fail now and then that way).
                    await trio.lowlevel.checkpoint_if_cancelled()
                    await producer.send("t", str(i), partition=i % 4)
                    i += 1

            nursery.start_soon(keep_producing)
            async with open_consumer(
                broker.bootstrap, "g", ["t"], on_revoked=on_revoked, **opts
            ) as a:
                nursery.start_soon(consume, a)
                await a.wait_assigned()
                await trio.sleep(0.3)
                async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as b:
                    with trio.fail_after(5):
                        while len(b.assignment) != 2 or len(a.assignment) != 2:
                            await trio.sleep(0.01)
                    await trio.sleep(0.3)
                    kept = set(a.assignment)
                    for tp, at in revoked_at.items():
                        if tp in kept:
                            continue
                        late = [t for t, seen in handed if seen == tp and t > at]
                        assert late == [], f"{tp} handed out after on_revoked"
                    assert revoked_at, "the rebalance revoked nothing"
            nursery.cancel_scope.cancel()


async def test_reset_offsets_rewinds_a_live_group(broker):
    await make_topic(broker.bootstrap, "t", 1)
    await produce(broker.bootstrap, "t", 30)
    tp = TopicPartition("t", 0)
    async with open_consumer(
        broker.bootstrap, "g", ["t"], session_timeout=S, offset_reset="earliest"
    ) as consumer:
        assert [r.offset for r in await read_all(consumer, 30)] == list(range(30))
        async with open_admin(broker.bootstrap) as admin:
            await admin.reset_offsets("g", {tp: 10})
            again = await read_all(consumer, 5)
            assert [r.offset for r in again] == [10, 11, 12, 13, 14]
            lag = await admin.group_lag("g")
        assert [(row.log_end, row.owner != "") for row in lag] == [(30, True)]


async def test_plan_offset_reset_is_a_dry_run_until_executed_and_clamps_into_the_log(broker):
    """What ``groups reset-offsets`` shows and does, from the library: the plan, then the reset."""
    await make_topic(broker.bootstrap, "t", 2)
    await produce(broker.bootstrap, "t", 20)
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    async with open_admin(broker.bootstrap) as admin:
        ends = {tp: o.log_end for tp, o in (await admin.list_offsets([t0, t1])).items()}
        await admin.reset_offsets("g", {t0: 1})
        plan = await admin.plan_offset_reset("g", [t1, t0], shift_by=-5)
        # Sorted; from the committed offset, or from the log end where none is; clamped at 0.
        assert [(p.tp, p.current, p.new) for p in plan] == [
            (t0, 1, 0),
            (t1, None, max(0, ends[t1] - 5)),
        ]
        assert await admin.committed_offsets("g") == {t0: 1}  # a dry run changed nothing
        executed = await admin.plan_offset_reset("g", offsets={t0: 10**9}, execute=True)
        assert [(p.tp, p.new) for p in executed] == [(t0, ends[t0])]
        assert await admin.committed_offsets("g") == {t0: ends[t0]}
        with pytest.raises(ValueError, match="exactly one target"):
            await admin.plan_offset_reset("g", [t0], to_earliest=True, to_latest=True)
        with pytest.raises(ValueError, match="do not exist"):
            await admin.plan_offset_reset("g", offsets={TopicPartition("t", 7): 0})


async def test_delete_offsets_refuses_partitions_a_member_consumes(broker):
    await make_topic(broker.bootstrap, "t", 1)
    tp = TopicPartition("t", 0)
    async with open_admin(broker.bootstrap) as admin:
        async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=S) as consumer:
            await consumer.wait_assigned()
            await consumer.commit({tp: 0})
            with pytest.raises(CoordErrorOf("GroupSubscribedToTopicError")):
                await admin.delete_offsets("g", [tp])
        await admin.delete_offsets("g", [tp])
        assert await admin.committed_offsets("g") == {}


def CoordErrorOf(name: str) -> type[Exception]:
    import trio_coord

    return getattr(trio_coord, name)


async def test_list_offsets_by_time(broker):
    await make_topic(broker.bootstrap, "t", 1)
    await produce(broker.bootstrap, "t", 10)  # timestamps 1_700_000_000 + i seconds
    tp = TopicPartition("t", 0)
    async with open_admin(broker.bootstrap) as admin:
        assert (await admin.list_offsets([tp], EARLIEST))[tp].offset == 0
        assert (await admin.list_offsets([tp]))[tp].offset == 10
        at = await admin.list_offsets([tp], (1_700_000_000 + 4) * 1000)
        assert at[tp].offset == 4
        later = await admin.list_offsets([tp], 1_800_000_000_000)
        assert later[tp].offset == 10
