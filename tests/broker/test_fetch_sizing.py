"""A fetch answer always fits its frame, and a consumer always makes progress.

An answer is sized by what it encodes to: payload, and the bytes msgpack
adds around every batch and partition. Counting payload alone once let many
small batches (40 producers sending at once) build an answer larger than
the frame; the consumer was told FRAME_TOO_LARGE at that offset on every
try, for good. The per-field bounds are checked against the real encoder at
the largest value of every field, the stall is replayed end to end, and a
batch larger than the fetch limit is still returned, alone.
"""

from __future__ import annotations

import pytest
import trio

from trio_coord import TopicPartition, open_admin, open_broker, open_consumer, open_producer
from trio_coord.broker import partitions as sizing
from trio_coord.kafka.records import encode_records
from trio_coord.log import KAFKA_FORMAT
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.errors import ErrorCode, InvalidRequestError
from trio_coord.protocol.framing import HEADER_SIZE, FrameCodec
from trio_coord.protocol.messages import (
    FETCH_ENVELOPE_BYTES,
    FETCH_PARTITION_BYTES,
    FetchedBatch,
    FetchedPartition,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    Response,
)
from trio_coord.protocol.records import WireRecord, encode_batch

BIG = 2**63 - 1
CODEC = FrameCodec(max_frame_size=2**31)


def encoded(frame: object) -> int:
    return len(CODEC.encode(frame)) - HEADER_SIZE  # type: ignore[arg-type]


def test_the_size_bounds_hold_at_the_largest_value_of_every_field() -> None:
    envelope = encoded(Response(2**64 - 1, ErrorCode.NONE, "", FetchResponse([])))
    assert envelope + 4 <= FETCH_ENVELOPE_BYTES  # (+ a list header of up to 2**32)
    empty = encoded(Response(1, 0, "", FetchResponse([FetchedPartition("t", 0, 0, "", 0, 0)])))
    for payload in (b"", b"x" * 255, b"x" * 65_535, b"x" * 70_000):
        batch = FetchedBatch(BIG, 2**31 - 1, payload)
        one = FetchResponse([FetchedPartition("t", 0, 0, "", 0, 0, [batch])])
        assert encoded(Response(1, 0, "", one)) - empty <= len(payload) + sizing._BATCH_BYTES
    for topic in ("t", "t" * 249, "é" * 124):
        for message in ("", "m" * 1024, "ü" * 512):
            part = FetchedPartition(
                topic, 2**31 - 1, ErrorCode.UNKNOWN_SERVER_ERROR, message, BIG, BIG
            )
            one = encoded(Response(1, 0, "", FetchResponse([part])))
            bare = len(topic.encode()) + len(message.encode())
            assert one - encoded(Response(1, 0, "", FetchResponse([]))) <= (
                bare + FETCH_PARTITION_BYTES
            )


async def test_many_small_batches_never_outgrow_the_frame(tmp_path) -> None:
    """The stall as found: a backlog of one-record batches of ~230 bytes, read from the start.

    Each batch adds ~7 bytes of framing to its ~240 of payload: 4,000 of them
    in a 1 MiB answer used to add ~28 KB that nobody counted.
    """
    count = 6000
    async with open_broker(tmp_path / "data") as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 1)
        async with open_connection(*broker.address) as conn:

            async def produce(first: int) -> None:
                for i in range(first, count, 50):  # 50 pipelined, one record per batch
                    payload = encode_batch([WireRecord(1, None, f"{i:05d}{'x' * 230}".encode())])
                    await conn.request(ProduceRequest("t", 0, payload, 1, 1))

            async with trio.open_nursery() as nursery:
                for first in range(50):
                    nursery.start_soon(produce, first)
        seen = 0
        async with open_consumer(
            broker.bootstrap, partitions=[TopicPartition("t", 0)], offset_reset="earliest"
        ) as consumer:
            with trio.fail_after(30):
                while seen < count:
                    seen += len(await consumer.getmany())
    assert seen == count


async def test_every_answer_fits_with_long_names_tiny_batches_and_errors(tmp_path) -> None:
    frame = 64 * 1024  # a small frame, so that the test fills it quickly
    topics = [f"{'n' * 200}-{i}" for i in range(4)]
    async with open_broker(tmp_path / "data", max_frame_size=frame) as broker:
        async with open_admin(broker.bootstrap) as admin:
            for topic in topics:
                await admin.create_topic(topic, 3)
        async with open_producer(broker.bootstrap, linger=0) as producer:

            async def send(topic: str, value: str, partition: int) -> None:
                await producer.send(topic, value, partition=partition)

            async with trio.open_nursery() as nursery:
                for topic in topics:
                    for p in range(3):
                        for i in range(40):
                            nursery.start_soon(send, topic, f"{i}", p)
        fetch = [FetchPartition(t, p, 0) for t in topics for p in range(3)]
        fetch += [FetchPartition(topics[0], 9, 0), FetchPartition(topics[1], 0, 10**6)]  # errors
        answer = await broker.partitions.fetch(FetchRequest(fetch, max_wait_ms=0), frame)
        assert encoded(Response(2**32, 0, "", answer)) <= frame
        errors = [p for p in answer.partitions if p.error != ErrorCode.NONE]
        assert len(errors) == 2 and all(p.message for p in errors)
        served = [p for p in answer.partitions if p.batches]
        assert served, "records were returned"


async def test_a_batch_larger_than_the_fetch_limit_is_returned_alone(tmp_path) -> None:
    async with open_broker(tmp_path / "data") as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 2)
        async with open_producer(broker.bootstrap, linger=0.05) as producer:
            for p in (0, 1):
                for _ in range(50):
                    await producer.enqueue("t", "y" * 1000, partition=p)
        both = [FetchPartition("t", 0, 0, max_bytes=10), FetchPartition("t", 1, 0)]
        # (a partition's max_bytes is exceeded by a first batch; a request's is the most
        # the client reads: one batch of ~50 KB, not two)
        answer = await broker.partitions.fetch(
            FetchRequest(both, max_wait_ms=0, max_bytes=60_000), broker.config.max_frame_size
        )
        first, second = answer.partitions
        assert len(first.batches) == 1 and len(first.batches[0].records) > 40_000
        assert second.error == ErrorCode.NONE and second.batches == [], "the limit was reached"
        # A first batch larger than the request's max_bytes allows is refused, not sent:
        # the client could not read the answer (its frame), so it is told what to do.
        answer = await broker.partitions.fetch(
            FetchRequest(both, max_wait_ms=0, max_bytes=10_000), broker.config.max_frame_size
        )
    first, _ = answer.partitions
    assert first.error == ErrorCode.RECORD_TOO_LARGE and first.batches == []
    assert "offset 0 of t-0" in first.message and "seek past it" in first.message


async def test_an_answer_fits_the_max_bytes_asked_for_errors_included(tmp_path) -> None:
    # max_bytes is the whole answer (a consumer sends its frame, smaller than the
    # broker's): error messages after the records were counted only against the
    # broker's frame, and the answer outgrew what the client reads.
    asked = 64 * 1024
    topic = "n" * 200
    async with open_broker(tmp_path / "data") as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic(topic, 1)
        async with open_connection(*broker.address) as conn:

            async def produce(first: int) -> None:
                for _ in range(first, 600, 20):  # 20 pipelined, one record per batch
                    payload = encode_batch([WireRecord(1, None, b"x" * 230)])
                    await conn.request(ProduceRequest(topic, 0, payload, 1, 1))

            async with trio.open_nursery() as nursery:
                for first in range(20):
                    nursery.start_soon(produce, first)
        fetch = [FetchPartition(topic, 0, 0)]
        fetch += [FetchPartition(topic, 9 + i, 0) for i in range(20)]  # errors, last
        request = FetchRequest(fetch, max_wait_ms=0, max_bytes=asked)
        answer = await broker.partitions.fetch(request, broker.config.max_frame_size)
    assert encoded(Response(2**32, 0, "", answer)) <= asked
    assert answer.partitions[0].batches, "records were returned"
    errors = [p for p in answer.partitions if p.error != ErrorCode.NONE]
    assert len(errors) == 20, "every failed partition is named, with its code"


async def test_a_kafka_batch_is_converted_within_the_max_bytes_asked_for(tmp_path) -> None:
    # A Kafka batch is cut into native batches of a quarter of the broker's frame: with
    # a broker of an 8 MiB frame, a 1.5 MiB batch came whole to a consumer of a 1 MiB
    # frame, which failed with FRAME_TOO_LARGE at that offset on every fetch, for good.
    async with open_broker(
        tmp_path / "data", max_frame_size=8 << 20, max_connection_bytes=32 << 20
    ) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 1)
        log = await broker.logs.create("t", 0)
        records = [WireRecord(1, None, b"%06d" % i + b"x" * 500) for i in range(3000)]
        await log.append(encode_records(0, records), 3000, 1, fmt=KAFKA_FORMAT)
        request = FetchRequest([FetchPartition("t", 0, 0, 8 << 20)], max_bytes=1 << 20)
        answer = await broker.partitions.fetch(request, broker.config.max_frame_size)
        assert encoded(Response(2**32, 0, "", answer)) <= 1 << 20
        async with open_consumer(
            broker.bootstrap, partitions=[("t", 0)], offset_reset="earliest"
        ) as consumer:
            got: list = []
            with trio.fail_after(30):
                while len(got) < 3000:
                    got += await consumer.getmany(1000)
    assert [r.value[:6] for r in got] == [b"%06d" % i for i in range(3000)]


async def test_a_fetch_whose_headers_alone_exceed_its_max_bytes_is_refused(tmp_path) -> None:
    # An answer of these partitions, even empty, is larger than the client said it reads.
    async with open_broker(tmp_path / "data") as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t" * 100, 8)
        fetch = [FetchPartition("t" * 100, p, 0) for p in range(8)]
        request = FetchRequest(fetch, max_wait_ms=0, max_bytes=1000)
        with pytest.raises(InvalidRequestError, match="fetch fewer partitions"):
            await broker.partitions.fetch(request, broker.config.max_frame_size)
