"""kafka-python 3 against the Kafka listener: produce, consume, admin, idempotence.

The same checks as with confluent-kafka: every codec round trip with keys,
headers and timestamps (manual assignment, no group), an idempotent retry
after a lost answer stores nothing twice, and KafkaAdminClient creates and
deletes topics.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka_fixtures import KafkaBroker, check_codec_round_trip, codec_records, create_topic
from kafka_proxy import LosingProxy

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


def consume(bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 20.0):
    """``count`` records of ``topic`` from offset 0, by manual assignment."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(kafka_broker: KafkaBroker, topic: str, codec: str | None) -> None:
    """Keys, values, headers and timestamps come back exactly, for each codec."""
    create_topic(kafka_broker.kafka, topic, partitions=2)
    producer = KafkaProducer(
        bootstrap_servers=kafka_broker.kafka, compression_type=codec, linger_ms=5
    )
    futures = [producer.send(topic, **record) for record in codec_records()]
    producer.flush(15)
    for future in futures:
        future.get(15)
    producer.close()
    check_codec_round_trip(consume(kafka_broker.kafka, topic, 2, 100))


def test_idempotent_retry_stores_no_duplicate(kafka_broker: KafkaBroker, topic: str) -> None:
    """The answer to the first Produce is lost; the retry does not store the batch again."""
    create_topic(kafka_broker.kafka, topic)
    proxy = LosingProxy(kafka_broker.kafka)
    try:
        producer = KafkaProducer(
            bootstrap_servers=proxy.address, enable_idempotence=True, linger_ms=50, retries=5
        )
        futures = [producer.send(topic, b"%d" % i, partition=0) for i in range(50)]
        producer.flush(30)
        offsets = sorted(f.get(30).offset for f in futures)
        producer.close()
    finally:
        proxy.close()
    assert proxy.dropped == 1
    assert offsets == list(range(50))
    got = consume(kafka_broker.kafka, topic, 1, 50)
    assert [r.value for r in got] == [b"%d" % i for i in range(50)]
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.kafka)
    try:
        tp = TopicPartition(topic, 0)
        assert consumer.end_offsets([tp])[tp] == 50
    finally:
        consumer.close()


def test_admin_creates_and_deletes_topics(kafka_broker: KafkaBroker, topic: str) -> None:
    """KafkaAdminClient creates a topic, lists it, and deletes it."""
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.kafka)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        assert topic in admin.list_topics()
        admin.delete_topics([topic])
        assert topic not in admin.list_topics()
    finally:
        admin.close()
