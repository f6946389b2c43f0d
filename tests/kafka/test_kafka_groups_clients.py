"""kafka-python 3 and aiokafka 0.14 consumer groups on the broker's group engine.

With each client: two members of one group share four partitions exactly
once and read every record, commit, and after a clean close the committed
offsets equal the log end (read back by a new member of the group); one
member leaving hands its partitions to the other; the admin client lists
and describes the group.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from confluent_kafka import Producer
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from kafka.admin import KafkaAdminClient
from kafka_fixtures import KafkaBroker, create_topic


def produce(broker: KafkaBroker, topic: str, count: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": broker.kafka})
    for i in range(count):
        producer.produce(topic, b"v%d" % i, b"%d" % i, partition=i % partitions)
    assert producer.flush(15) == 0


def test_kafka_python_group_round_trip(kafka_broker: KafkaBroker, topic: str) -> None:
    """Two kafka-python members share, read everything, commit; one leaves, the other takes all."""
    create_topic(kafka_broker.kafka, topic, 4)
    produce(kafka_broker, topic, 40, 4)
    group = f"g-{topic}"

    def member() -> KafkaConsumer:
        return KafkaConsumer(
            topic,
            bootstrap_servers=kafka_broker.kafka,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    # One thread per consumer, as applications run them (kafka-python polls its group
    # membership from poll(): two consumers polled in turn by one thread, with short
    # timeouts, keep leaving each other's join half done).
    got: set[bytes] = set()
    members: list[KafkaConsumer] = []
    stop = threading.Event()
    stopping: set[int] = set()

    def run(index: int) -> None:
        m = member()
        members.append(m)
        try:
            while not stop.is_set() and index not in stopping:
                for records in m.poll(timeout_ms=200).values():
                    got.update(r.key for r in records)
                if got and len(got) == 40:
                    m.commit()
        finally:
            m.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:

        def wait(done: Callable[[], bool], limit: float) -> None:
            deadline = time.monotonic() + limit
            while time.monotonic() < deadline and not done():
                time.sleep(0.05)
            assert done()

        wait(lambda: len(got) == 40 and len(members) == 2, 30)
        wait(lambda: all(len(m.assignment()) == 2 for m in members), 15)
        parts = [sorted(tp.partition for tp in m.assignment()) for m in members]
        assert sorted(p for a in parts for p in a) == [0, 1, 2, 3]
        admin = KafkaAdminClient(bootstrap_servers=kafka_broker.kafka)
        try:
            assert group in {g["group_id"] for g in admin.list_groups()}
            described = admin.describe_groups([group])[group]
            assert described["group_state"] == "Stable"
            assert len(described["members"]) == 2
        finally:
            admin.close()
        stopping.add(1)
        threads[1].join(15)
        wait(lambda: len(members[0].assignment()) == 4 or len(members[1].assignment()) == 4, 15)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    check = KafkaConsumer(bootstrap_servers=kafka_broker.kafka, group_id=group)
    try:
        tps = [KTopicPartition(topic, p) for p in range(4)]
        assert [check.committed(tp) for tp in tps] == [10, 10, 10, 10]
    finally:
        check.close()


def test_aiokafka_group_round_trip(kafka_broker: KafkaBroker, topic: str) -> None:
    """Two aiokafka members share, read everything, commit; one leaves, the other takes all."""
    create_topic(kafka_broker.kafka, topic, 4)
    produce(kafka_broker, topic, 40, 4)
    group = f"g-{topic}"

    def member() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_broker.kafka,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    async def run() -> None:
        members = [member(), member()]
        for m in members:
            await m.start()
        try:
            got: set[bytes] = set()
            async with asyncio.timeout(30):
                while not (len(got) == 40 and all(len(m.assignment()) == 2 for m in members)):
                    for m in members:
                        batches = await m.getmany(timeout_ms=100)
                        for records in batches.values():
                            got.update(r.key for r in records)
            parts = [sorted(tp.partition for tp in m.assignment()) for m in members]
            assert sorted(p for a in parts for p in a) == [0, 1, 2, 3]
            for m in members:
                await m.commit()
            await members.pop().stop()
            async with asyncio.timeout(15):
                while len(members[0].assignment()) != 4:
                    await members[0].getmany(timeout_ms=100)
        finally:
            for m in members:
                await m.stop()
        check = AIOKafkaConsumer(bootstrap_servers=kafka_broker.kafka, group_id=group)
        await check.start()
        try:
            from aiokafka import TopicPartition

            committed = [await check.committed(TopicPartition(topic, p)) for p in range(4)]
            assert committed == [10, 10, 10, 10]
        finally:
            await check.stop()

    asyncio.run(run())
