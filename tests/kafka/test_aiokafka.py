"""aiokafka 0.14 against the Kafka listener: produce, consume, admin, idempotence.

The same checks as with confluent-kafka and kafka-python, in asyncio (each
test runs its own event loop): every codec round trip with keys, headers and
timestamps (manual assignment, no group), an idempotent retry after a lost
answer stores nothing twice, and the admin client creates and deletes topics.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kafka_fixtures import KafkaBroker, check_codec_round_trip, codec_records, create_topic
from kafka_proxy import LosingProxy

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


async def consume(bootstrap: str, topic: str, partitions: int, count: int) -> list:
    """``count`` records of ``topic`` from offset 0, by manual assignment."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        got: list = []
        async with asyncio.timeout(20):
            while len(got) < count:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    got.extend(records)
        return got
    finally:
        await consumer.stop()


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(kafka_broker: KafkaBroker, topic: str, codec: str | None) -> None:
    """Keys, values, headers and timestamps come back exactly, for each codec."""
    create_topic(kafka_broker.kafka, topic, partitions=2)

    async def run() -> list:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_broker.kafka, compression_type=codec, linger_ms=5
        )
        await producer.start()
        try:
            futures = [await producer.send(topic, **record) for record in codec_records()]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return await consume(kafka_broker.kafka, topic, 2, 100)

    check_codec_round_trip(asyncio.run(run()))


def test_idempotent_retry_stores_no_duplicate(kafka_broker: KafkaBroker, topic: str) -> None:
    """The answer to the first Produce is lost; the retry does not store the batch again."""
    create_topic(kafka_broker.kafka, topic)
    proxy = LosingProxy(kafka_broker.kafka)

    async def run() -> tuple[list[int], list, int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=proxy.address, enable_idempotence=True, linger_ms=50
        )
        await producer.start()
        try:
            futures = [await producer.send(topic, b"%d" % i, partition=0) for i in range(50)]
            offsets = sorted(m.offset for m in await asyncio.gather(*futures))
        finally:
            await producer.stop()
        got = await consume(kafka_broker.kafka, topic, 1, 50)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.kafka)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            end = (await consumer.end_offsets([tp]))[tp]
        finally:
            await consumer.stop()
        return offsets, got, end

    try:
        offsets, got, end = asyncio.run(run())
    finally:
        proxy.close()
    assert proxy.dropped == 1
    assert offsets == list(range(50))
    assert [r.value for r in got] == [b"%d" % i for i in range(50)]
    assert end == 50


def test_admin_creates_and_deletes_topics(kafka_broker: KafkaBroker, topic: str) -> None:
    """AIOKafkaAdminClient creates a topic, lists it, and deletes it."""

    async def run() -> tuple[list[str], list[str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.kafka)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
            listed = await admin.list_topics()
            await admin.delete_topics([topic])
            after = await admin.list_topics()
        finally:
            await admin.close()
        return listed, after

    listed, after = asyncio.run(run())
    assert topic in listed
    assert topic not in after
