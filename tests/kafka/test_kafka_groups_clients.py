"""kafka-python 3 and aiokafka 0.14 consumer groups on the broker's group engine.

With each client: two members of one group share four partitions exactly
once and read every record, commit, and after a clean close the committed
offsets equal the log end (read back by a new member of the group); one
member leaving hands its partitions to the other; the admin client lists
and describes the group. Three members on six partitions, one of them a
subprocess SIGKILLed mid-stream: the survivors own every partition and read
every acknowledged record it left, and after they close cleanly the committed
offsets equal the log end.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from confluent_kafka import Producer
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from kafka.admin import KafkaAdminClient
from kafka_fixtures import KafkaBroker, Victim, create_topic


def produce(broker: KafkaBroker, topic: str, count: int, partitions: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": broker.kafka})
    for i in range(start, start + count):
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


KAFKA_PYTHON_MEMBER = """
import sys
from kafka import KafkaConsumer
c = KafkaConsumer(sys.argv[3], bootstrap_servers=sys.argv[1], group_id=sys.argv[2],
                  auto_offset_reset="earliest", enable_auto_commit=False,
                  session_timeout_ms=3000, heartbeat_interval_ms=500)
print("ready", flush=True)
while True:
    batches = c.poll(timeout_ms=100)
    for records in batches.values():
        for r in records:
            print(r.key.decode(), flush=True)
    if batches:
        c.commit()
"""

AIOKAFKA_MEMBER = """
import asyncio, sys
from aiokafka import AIOKafkaConsumer
async def main():
    c = AIOKafkaConsumer(sys.argv[3], bootstrap_servers=sys.argv[1], group_id=sys.argv[2],
                         auto_offset_reset="earliest", enable_auto_commit=False,
                         session_timeout_ms=3000, heartbeat_interval_ms=500)
    await c.start()
    print("ready", flush=True)
    while True:
        batches = await c.getmany(timeout_ms=100)
        for records in batches.values():
            for r in records:
                print(r.key.decode(), flush=True)
        if batches:
            await c.commit()
asyncio.run(main())
"""


def wait_for(done: Callable[[], bool], limit: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not done():
        time.sleep(0.02)
    assert done(), what()


EVERYTHING = {b"%d" % i for i in range(120)}
# Short sessions (the broker allows 1 s): a SIGKILLed member's partitions move once its
# session has ended.


def test_kafka_python_member_sigkilled_loses_no_acknowledged_record(
    kafka_broker: KafkaBroker, topic: str, tmp_path: Path
) -> None:
    """Three kafka-python members, one SIGKILLed mid-stream: the two survivors own all six
    partitions and read what it left; after they close cleanly, the committed offsets equal
    the log end."""
    create_topic(kafka_broker.kafka, topic, 6)
    group = f"g-{topic}"
    script = tmp_path / "member.py"
    script.write_text(KAFKA_PYTHON_MEMBER)
    victim = Victim(script, kafka_broker, group, topic)
    seen: set[bytes] = set()
    members: dict[int, KafkaConsumer] = {}
    stop = threading.Event()

    def run(index: int) -> None:
        m = KafkaConsumer(
            topic,
            bootstrap_servers=kafka_broker.kafka,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=3000,
            heartbeat_interval_ms=500,
        )
        members[index] = m
        try:
            while not stop.is_set():
                batches = m.poll(timeout_ms=100)
                for records in batches.values():
                    seen.update(r.key for r in records)
                if batches:
                    m.commit()
        finally:
            m.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        state = lambda: f"{len(seen)} + {len(victim.seen)} seen, {len(members)} members"  # noqa: E731
        wait_for(
            lambda: len(members) == 2 and all(len(m.assignment()) == 2 for m in members.values()),
            30,
            state,
        )
        produce(kafka_broker, topic, 60, 6)
        wait_for(lambda: len(victim.seen) >= 5 and len(seen) >= 10, 30, state)
        victim.kill()
        killed = time.monotonic()
        produce(kafka_broker, topic, 60, 6, start=60)

        def owners() -> list[int]:
            return sorted(tp.partition for m in members.values() for tp in m.assignment())

        wait_for(lambda: owners() == list(range(6)) and seen | victim.seen == EVERYTHING, 30, state)
        assert time.monotonic() - killed < 15
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        if victim.process.poll() is None:
            victim.kill()
    check = KafkaConsumer(bootstrap_servers=kafka_broker.kafka, group_id=group)
    try:
        tps = [KTopicPartition(topic, p) for p in range(6)]
        assert [check.committed(tp) for tp in tps] == [20] * 6
        assert list(check.end_offsets(tps).values()) == [20] * 6
    finally:
        check.close()


def test_aiokafka_member_sigkilled_loses_no_acknowledged_record(
    kafka_broker: KafkaBroker, topic: str, tmp_path: Path
) -> None:
    """Three aiokafka members, one SIGKILLed mid-stream: the two survivors own all six
    partitions and read what it left; after they stop cleanly, the committed offsets equal
    the log end."""
    from aiokafka import TopicPartition

    create_topic(kafka_broker.kafka, topic, 6)
    group = f"g-{topic}"
    script = tmp_path / "member.py"
    script.write_text(AIOKAFKA_MEMBER)
    victim = Victim(script, kafka_broker, group, topic)

    def member() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_broker.kafka,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=3000,
            heartbeat_interval_ms=500,
        )

    async def run() -> None:
        seen: set[bytes] = set()
        members = [member(), member()]
        stop = asyncio.Event()

        async def poll(m: AIOKafkaConsumer) -> None:
            while not stop.is_set():
                batches = await m.getmany(timeout_ms=100)
                for records in batches.values():
                    seen.update(r.key for r in records)
                if batches:
                    await m.commit()

        def owners() -> list[int]:
            return sorted(tp.partition for m in members for tp in m.assignment())

        async def until(done: Callable[[], bool], limit: float) -> None:
            deadline = time.monotonic() + limit
            while time.monotonic() < deadline and not done():
                await asyncio.sleep(0.02)
            assert done(), f"{len(seen)} + {len(victim.seen)} seen, {owners()}"

        for m in members:
            await m.start()
        tasks = [asyncio.create_task(poll(m)) for m in members]
        try:
            await until(lambda: all(len(m.assignment()) == 2 for m in members), 30)
            await asyncio.to_thread(produce, kafka_broker, topic, 60, 6)
            await until(lambda: len(victim.seen) >= 5 and len(seen) >= 10, 30)
            victim.kill()
            killed = time.monotonic()
            await asyncio.to_thread(produce, kafka_broker, topic, 60, 6, 60)
            await until(lambda: owners() == list(range(6)) and seen | victim.seen == EVERYTHING, 30)
            assert time.monotonic() - killed < 15
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            for m in members:
                await m.stop()
            if victim.process.poll() is None:
                victim.kill()
        check = AIOKafkaConsumer(bootstrap_servers=kafka_broker.kafka, group_id=group)
        await check.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(6)]
            assert [await check.committed(tp) for tp in tps] == [20] * 6
            assert list((await check.end_offsets(tps)).values()) == [20] * 6
        finally:
            await check.stop()

    asyncio.run(run())


def _group_with_offsets(broker: KafkaBroker, topic: str, group: str) -> None:
    """An empty group with committed offsets (made with trio-coord's own admin)."""
    import trio

    from trio_coord import open_admin

    async def make() -> None:
        async with open_admin(broker.native) as admin:
            await admin.reset_offsets(group, {(topic, 0): 0})

    create_topic(broker.kafka, topic, 1)
    trio.run(make)


def test_kafka_python_admin_lists_describes_and_deletes_groups(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    group = f"g-{topic}"
    _group_with_offsets(kafka_broker, topic, group)
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.kafka)
    try:
        assert group in {g["group_id"] for g in admin.list_groups()}
        described = admin.describe_groups([group])[group]
        assert (described["group_state"], described["members"]) == ("Empty", [])
        admin.delete_groups([group])
        assert group not in {g["group_id"] for g in admin.list_groups()}
    finally:
        admin.close()


def test_aiokafka_admin_lists_and_describes_groups(kafka_broker: KafkaBroker, topic: str) -> None:
    # (aiokafka 0.14's admin client has no DeleteGroups of its own.)
    from aiokafka.admin import AIOKafkaAdminClient

    group = f"g-{topic}"
    _group_with_offsets(kafka_broker, topic, group)

    async def ask() -> tuple[list, list]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.kafka)
        await admin.start()
        try:
            return await admin.list_consumer_groups(), await admin.describe_consumer_groups([group])
        finally:
            await admin.close()

    listed, described = asyncio.run(ask())
    assert group in {g[0] for g in listed}
    (response,) = described
    ((error, described_group, state, protocol_type, _protocol, members),) = response.groups
    assert (error, described_group, state, protocol_type, members) == (
        0,
        group,
        "Empty",
        "consumer",
        [],
    )
