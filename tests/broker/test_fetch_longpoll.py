"""The fetch long poll, asserted exactly on Trio's virtual clock.

A Fetch is Kafka's fetch purgatory in Trio's shape: a request that finds
less than ``min_bytes`` waits in a cancel scope whose deadline is its
``max_wait``, woken by every append to a partition it reads. So an empty
fetch answers the moment a batch lands (not at its deadline), a fetch that
wants more than arrives answers at its deadline exactly (with what there
is), and a fetch that cannot succeed (an unknown partition) answers at once.

How these tests get exact times. The broker is an ephemeral one (in-memory
metadata store) served over ``trio.testing.memory_stream_pair`` on the
``autojump_clock``, as in ``harness.py``. The autojump clock advances
virtual time to the next deadline as soon as every task is blocked, and a
task waiting for a worker thread (``trio.to_thread.run_sync``) counts as
blocked: while a thread runs for a few real milliseconds the clock would
jump to the fetch's ``max_wait`` and expire it. Worker threads and
autojump do not mix, so the tests keep the log off worker threads while
the clock matters:

* the log's flush policy is interval based (``flush_interval=3600``): an
  append is acknowledged once written to the page cache, inline on the Trio
  thread, instead of waiting for the syncer's fsync in a worker thread (and
  the interval flusher's first fsync is an hour away);
* a partition's log is created lazily by its first Produce, in a worker
  thread (``mkdir`` + directory fsync), so each test creates the logs it
  reads (``broker.logs.create``) before it takes its start time. Empty
  logs: "an empty partition" exactly as a fresh topic's, minus the thread.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from trio_coord import Broker
from trio_coord.log import LogConfig
from trio_coord.log.segment import Segment
from trio_coord.protocol import (
    Connection,
    CreateTopicRequest,
    ErrorCode,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    ProduceResponse,
)
from trio_coord.protocol.records import WireRecord, decode_batch, encode_batch

from .harness import ephemeral_broker

LOG = LogConfig(flush_interval=3600, retention_seconds=None)


@asynccontextmanager
async def broker_and_client(
    partitions: int = 2, *, log: LogConfig = LOG, make_logs: bool = True
) -> AsyncIterator[tuple[Broker, Connection]]:
    """An ephemeral broker with topic ``t`` and a client connection; with ``make_logs``,
    the partitions' logs are made (empty) before the test starts, else the first
    Produce makes them."""
    async with ephemeral_broker(log=log) as broker:
        client_side, broker_side = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.serve_stream, broker_side)
            conn = Connection(client_side, name="longpoll-client")
            await nursery.start(conn.serve)
            await conn.request(CreateTopicRequest("t", partitions))
            for partition in range(partitions if make_logs else 0):
                await broker.logs.create("t", partition)  # (a worker thread; see above)
            try:
                yield broker, conn
            finally:
                nursery.cancel_scope.cancel()


def batch(*values: bytes, ts: int = 1_700_000_000_000) -> ProduceRequest:
    """A Produce of one batch of ``values`` to t-0."""
    payload = encode_batch([WireRecord(ts, None, v) for v in values])
    return ProduceRequest("t", 0, payload, len(values), ts)


async def produce(conn: Connection, request: ProduceRequest) -> int:
    response = await conn.request(request)
    assert isinstance(response, ProduceResponse)
    return response.base_offset


class TimedFetch:
    """A fetch run in the background; remembers its answer and when it came."""

    def __init__(self) -> None:
        self.answer: FetchResponse | None = None
        self.at: float | None = None

    async def run(self, conn: Connection, request: FetchRequest) -> None:
        response = await conn.request(request)
        assert isinstance(response, FetchResponse)
        self.answer, self.at = response, trio.current_time()

    def values(self, index: int = 0) -> list[bytes | None]:
        assert self.answer is not None
        part = self.answer.partitions[index]
        return [r.value for b in part.batches for r in decode_batch(b.records)]


async def test_an_empty_fetch_answers_when_a_batch_lands_not_at_max_wait(autojump_clock):
    async with broker_and_client() as (_, conn):
        t0 = trio.current_time()
        fetch = TimedFetch()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                fetch.run, conn, FetchRequest([FetchPartition("t", 0, 0)], max_wait_ms=10_000)
            )
            await trio.sleep(2)
            assert fetch.at is None  # still parked
            assert await produce(conn, batch(b"hello")) == 0
            produced_at = trio.current_time()
        assert produced_at - t0 == 2
        assert fetch.at == produced_at  # woken by the append, not by its deadline
        assert fetch.answer is not None
        (part,) = fetch.answer.partitions
        assert (part.topic, part.partition, part.error) == ("t", 0, ErrorCode.NONE)
        assert (part.log_start, part.log_end) == (0, 1)
        assert [(b.base_offset, b.count) for b in part.batches] == [(0, 1)]
        assert fetch.values() == [b"hello"]


async def test_an_append_to_any_partition_of_the_fetch_wakes_it(autojump_clock):
    async with broker_and_client() as (_, conn):
        t0 = trio.current_time()
        fetch = TimedFetch()
        request = FetchRequest(
            [FetchPartition("t", 0, 0), FetchPartition("t", 1, 0)], max_wait_ms=10_000
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch.run, conn, request)
            await trio.sleep(3)
            one = batch(b"on-1")
            await produce(conn, ProduceRequest("t", 1, one.records, 1, one.max_timestamp_ms))
        assert fetch.at == t0 + 3
        assert fetch.answer is not None
        assert [p.partition for p in fetch.answer.partitions] == [0, 1]
        assert fetch.answer.partitions[0].batches == []
        assert fetch.values(1) == [b"on-1"]


async def test_a_fetch_wanting_more_than_arrives_answers_at_max_wait_exactly(autojump_clock):
    async with broker_and_client() as (_, conn):
        t0 = trio.current_time()
        fetch = TimedFetch()
        request = FetchRequest([FetchPartition("t", 0, 0)], max_wait_ms=10_000, min_bytes=10_000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch.run, conn, request)
            await trio.sleep(2)
            await produce(conn, batch(b"a"))
            await trio.sleep(3)
            await produce(conn, batch(b"b"))
            assert fetch.at is None  # woken twice, still short of min_bytes: parked again
        assert fetch.at == t0 + 10
        assert fetch.values() == [b"a", b"b"]  # what there is, at the deadline


async def test_min_bytes_reached_by_the_second_batch_answers_then(autojump_clock):
    async with broker_and_client() as (_, conn):
        t0 = trio.current_time()
        first = batch(b"x" * 100)
        fetch = TimedFetch()
        request = FetchRequest(
            [FetchPartition("t", 0, 0)], max_wait_ms=10_000, min_bytes=len(first.records) + 1
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch.run, conn, request)
            await trio.sleep(2)
            await produce(conn, first)
            await trio.sleep(3)
            assert fetch.at is None
            await produce(conn, batch(b"y" * 100))
        assert fetch.at == t0 + 5
        assert fetch.values() == [b"x" * 100, b"y" * 100]


async def test_a_fetch_woken_short_of_min_bytes_counts_what_it_sends_once(autojump_clock):
    # Every read of a long poll was counted as fetched traffic, the ones it waited over
    # too: a fetch woken twice short of min_bytes counted the first batch three times.
    async with broker_and_client() as (broker, conn):
        first, second = batch(b"a" * 50), batch(b"b" * 50)
        request = FetchRequest([FetchPartition("t", 0, 0)], max_wait_ms=10_000, min_bytes=10_000)
        fetch = TimedFetch()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch.run, conn, request)
            await trio.sleep(2)
            await produce(conn, first)
            await trio.sleep(3)
            await produce(conn, second)
        assert fetch.values() == [b"a" * 50, b"b" * 50]
        sent = len(first.records) + len(second.records)
        assert broker.partitions.traffic["t"] == [sent, 2]


async def test_a_full_answer_is_sent_at_once_though_short_of_min_bytes(autojump_clock):
    # min_bytes counts records; an answer holds fewer than max_bytes of them (headers and
    # framing come out of it). A consumer of fetch_min_bytes=1 MiB, Kafka's tuning for
    # throughput, asked for more than its 1 MiB frame ever holds, and every fetch of a
    # backlog waited fetch_max_wait, full as it was.
    async with broker_and_client() as (_, conn):
        for i in range(3):
            await produce(conn, batch(b"%d" % i * 400))
        t0 = trio.current_time()
        fetch = TimedFetch()
        request = FetchRequest(
            [FetchPartition("t", 0, 0)], max_wait_ms=10_000, min_bytes=1100, max_bytes=1100
        )
        await fetch.run(conn, request)
        assert fetch.at == t0  # the next batch does not fit: nothing to wait for
        assert fetch.values() == [b"0" * 400, b"1" * 400]


async def test_a_fetch_that_finds_nothing_answers_empty_at_max_wait(autojump_clock):
    async with broker_and_client() as (_, conn):
        t0 = trio.current_time()
        fetch = TimedFetch()
        await fetch.run(conn, FetchRequest([FetchPartition("t", 0, 0)], max_wait_ms=7_500))
        assert fetch.at == t0 + 7.5
        assert fetch.answer is not None
        (part,) = fetch.answer.partitions
        assert (part.error, part.log_end, part.batches) == (ErrorCode.NONE, 0, [])


async def test_a_fetch_of_an_unknown_partition_answers_at_once_with_its_error(autojump_clock):
    async with broker_and_client() as (_, conn):
        t0 = trio.current_time()
        fetch = TimedFetch()
        await fetch.run(
            conn,
            FetchRequest(
                [
                    FetchPartition("t", 0, 0),
                    FetchPartition("t", 5, 0),
                    FetchPartition("nope", 0, 0),
                ],
                max_wait_ms=10_000,
            ),
        )
        assert fetch.at == t0  # no wait: it could never be satisfied
        assert fetch.answer is not None
        ok, bad_partition, bad_topic = fetch.answer.partitions
        assert (ok.partition, ok.error, ok.batches) == (0, ErrorCode.NONE, [])
        assert (bad_partition.partition, bad_partition.error) == (5, ErrorCode.UNKNOWN_TOPIC)
        assert "partition 5 does not exist" in bad_partition.message
        assert (bad_topic.topic, bad_topic.error) == ("nope", ErrorCode.UNKNOWN_TOPIC)
        assert "nope" in bad_topic.message


async def test_a_fetch_beyond_the_log_end_answers_at_once_out_of_range(autojump_clock):
    async with broker_and_client() as (_, conn):
        await produce(conn, batch(b"only"))
        t0 = trio.current_time()
        fetch = TimedFetch()
        await fetch.run(conn, FetchRequest([FetchPartition("t", 0, 5)], max_wait_ms=10_000))
        assert fetch.at == t0
        assert fetch.answer is not None
        (part,) = fetch.answer.partitions
        assert part.error == ErrorCode.OFFSET_OUT_OF_RANGE
        assert "[0, 1]" in part.message


async def test_a_fetch_parked_before_a_partitions_first_batch_wakes_when_its_log_is_made():
    """Real time: the first Produce creates the log (in a worker thread), then wakes the fetch.

    Not on the virtual clock (see the module docstring); a fetch that was not
    woken would wait its whole ``max_wait`` of a minute and fail the bound.
    """
    async with broker_and_client(1, make_logs=False) as (broker, conn):
        assert broker.logs.get("t", 0) is None  # no log until the first batch
        fetch = TimedFetch()
        with trio.fail_after(20):
            async with trio.open_nursery() as inner:
                inner.start_soon(
                    fetch.run,
                    conn,
                    FetchRequest([FetchPartition("t", 0, 0)], max_wait_ms=60_000),
                )
                await trio.sleep(0.1)
                assert fetch.at is None
                assert await produce(conn, batch(b"first")) == 0
        assert fetch.values() == [b"first"]


async def test_a_fetch_wakes_when_a_batch_becomes_visible_even_if_its_produce_was_cancelled(
    monkeypatch,
):
    """Real time, fsync per batch: a batch is readable once its fsync ends, whether or
    not the Produce that wrote it is still waiting (its client may have given up).

    The fsync is held on a ``threading.Event`` so that the Produce is certainly
    cancelled while it waits; a fetch woken only by Produce answers would then
    sleep through its minute of ``max_wait`` and fail the bound.
    """
    hold, release = threading.Event(), threading.Event()
    real_sync = Segment.sync

    def held_sync(segment: Segment) -> None:
        if hold.is_set():
            release.wait(10)
        real_sync(segment)

    monkeypatch.setattr(Segment, "sync", held_sync)
    fsync_each = LogConfig(flush_interval=0, retention_seconds=None)
    async with broker_and_client(1, log=fsync_each) as (broker, conn):
        hold.set()
        fetch = TimedFetch()
        produce_scope = trio.CancelScope()

        async def produce_then_give_up() -> None:
            with produce_scope:
                await broker.partitions.produce(batch(b"first"))

        with trio.fail_after(20):
            async with trio.open_nursery() as inner:
                inner.start_soon(
                    fetch.run,
                    conn,
                    FetchRequest([FetchPartition("t", 0, 0)], max_wait_ms=60_000),
                )
                inner.start_soon(produce_then_give_up)
                await trio.testing.wait_all_tasks_blocked()  # both wait; fsync held
                produce_scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                assert fetch.at is None  # not visible before its fsync
                release.set()
        assert produce_scope.cancelled_caught
        assert fetch.values() == [b"first"]
