"""confluent-kafka (librdkafka) against the Kafka listener: produce, consume, admin, idempotence.

Consumers use manual partition assignment (no group: the group APIs come
later). Every compression codec librdkafka offers is produced and read back
with keys, headers and timestamps intact; an idempotent producer whose
first answer is lost retries without storing a duplicate; the admin client
creates and deletes topics; and a topic written by the native producer is
read by confluent-kafka, and the reverse.
"""

from __future__ import annotations

import time

import pytest
import trio
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka_fixtures import KafkaBroker, create_topic
from kafka_proxy import LosingProxy

from trio_coord import open_consumer, open_producer

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def consume(bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 20.0):
    """``count`` messages of ``topic`` from offset 0, by manual assignment."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",  # (librdkafka requires one; assign() joins no group)
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(kafka_broker: KafkaBroker, topic: str, codec: str) -> None:
    """Keys, values, headers and timestamps come back exactly, for each codec."""
    create_topic(kafka_broker.kafka, topic, partitions=2)
    producer = Producer(
        {"bootstrap.servers": kafka_broker.kafka, "compression.codec": codec, "linger.ms": 5}
    )
    sent = {}
    for i in range(200):
        key = None if i % 10 == 0 else b"key-%d" % i
        value = b"value-%d-" % i + bytes(i % 50)
        headers = [("n", b"%d" % i), ("n", b"again"), ("empty", b"")]
        producer.produce(
            topic, value, key, partition=i % 2, headers=headers, timestamp=1_700_000_000_000 + i
        )
        sent[value] = (key, headers, 1_700_000_000_000 + i, i % 2)
    assert producer.flush(15) == 0
    got = consume(kafka_broker.kafka, topic, 2, 200)
    assert len(got) == 200
    for message in got:
        key, headers, ts, partition = sent[message.value()]
        assert message.key() == key
        assert message.headers() == headers
        assert message.timestamp()[1] == ts
        assert message.partition() == partition
    offsets = sorted((m.partition(), m.offset()) for m in got)
    assert offsets == sorted([(0, i) for i in range(100)] + [(1, i) for i in range(100)])


def test_idempotent_retry_stores_no_duplicate(kafka_broker: KafkaBroker, topic: str) -> None:
    """The answer to the first Produce is lost; the retry is answered with the same offsets."""
    create_topic(kafka_broker.kafka, topic)
    proxy = LosingProxy(kafka_broker.kafka)
    try:
        producer = Producer(
            {
                "bootstrap.servers": proxy.address,
                "enable.idempotence": True,
                "linger.ms": 50,
            }
        )
        delivered = []
        for i in range(50):
            producer.produce(
                topic, b"%d" % i, partition=0, on_delivery=lambda e, m: delivered.append((e, m))
            )
        assert producer.flush(30) == 0
    finally:
        proxy.close()
    assert proxy.dropped == 1
    assert all(error is None for error, _ in delivered), delivered
    assert sorted(m.offset() for _, m in delivered) == list(range(50))
    got = consume(kafka_broker.kafka, topic, 1, 50)
    assert [m.value() for m in got] == [b"%d" % i for i in range(50)]
    # Nothing beyond the 50: the retried batch was not stored twice.
    consumer = Consumer({"bootstrap.servers": kafka_broker.kafka, "group.id": "unused"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert (low, high) == (0, 50)


def test_admin_creates_grows_and_deletes_topics(kafka_broker: KafkaBroker, topic: str) -> None:
    """AdminClient: create (and a duplicate refused), add partitions, describe, delete."""
    admin = AdminClient({"bootstrap.servers": kafka_broker.kafka})
    admin.create_topics([NewTopic(topic, 2)])[topic].result(15)
    with pytest.raises(Exception, match=r"TOPIC_ALREADY_EXISTS|already exists"):
        admin.create_topics([NewTopic(topic, 2)])[topic].result(15)
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(15)
    metadata = admin.list_topics(topic, timeout=10)
    assert len(metadata.topics[topic].partitions) == 3
    admin.delete_topics([topic])[topic].result(15)
    deadline = time.monotonic() + 10
    while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    assert topic not in admin.list_topics(timeout=10).topics


async def test_native_topic_read_by_confluent_and_the_reverse(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """Native records read by librdkafka, and librdkafka's read by the native consumer."""
    create_topic(kafka_broker.kafka, topic, partitions=1)
    async with open_producer(kafka_broker.native) as producer:
        for i in range(20):
            await producer.enqueue(
                topic, b"native-%d" % i, key=b"k%d" % i, partition=0, headers=[("h", b"%d" % i)]
            )
    got = await trio.to_thread.run_sync(consume, kafka_broker.kafka, topic, 1, 20)
    assert [(m.key(), m.value(), m.headers()) for m in got] == [
        (b"k%d" % i, b"native-%d" % i, [("h", b"%d" % i)]) for i in range(20)
    ]

    def produce_kafka() -> None:
        producer = Producer({"bootstrap.servers": kafka_broker.kafka, "compression.codec": "zstd"})
        for i in range(20):
            producer.produce(
                topic, b"kafka-%d" % i, b"k%d" % i, partition=0, headers=[("h", b"%d" % i)]
            )
        assert producer.flush(15) == 0

    await trio.to_thread.run_sync(produce_kafka)
    async with open_consumer(
        kafka_broker.native, partitions=[(topic, 0)], offset_reset="earliest"
    ) as consumer:
        records = []
        with trio.fail_after(20):
            while len(records) < 40:
                records.extend(await consumer.getmany())
    assert [r.offset for r in records] == list(range(40))
    assert [(r.key, r.value, r.headers) for r in records[20:]] == [
        (b"k%d" % i, b"kafka-%d" % i, (("h", b"%d" % i),)) for i in range(20)
    ]


def test_offsets_for_times_and_describe_configs(kafka_broker: KafkaBroker, topic: str) -> None:
    """ListOffsets by timestamp finds the first record at or after it; configs are described."""
    from confluent_kafka.admin import ConfigResource

    create_topic(kafka_broker.kafka, topic)
    producer = Producer({"bootstrap.servers": kafka_broker.kafka, "compression.codec": "lz4"})
    for i in range(10):
        producer.produce(topic, b"%d" % i, partition=0, timestamp=1_000_000 + 1000 * i)
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": kafka_broker.kafka, "group.id": "unused"})
    try:
        found = [
            consumer.offsets_for_times([TopicPartition(topic, 0, t)], timeout=10)[0].offset
            for t in (0, 1_004_500, 1_009_000, 2_000_000)
        ]
    finally:
        consumer.close()
    assert found == [0, 5, 9, -1]
    admin = AdminClient({"bootstrap.servers": kafka_broker.kafka})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["cleanup.policy"].value == "delete"
    assert configs["max.message.bytes"].value == str(1024 * 1024 + 12)
