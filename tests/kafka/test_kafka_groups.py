"""Kafka consumer groups (confluent-kafka) run on the broker's group engine.

Three librdkafka consumers share six partitions exactly once, and the
survivors take a closed member's partitions at once; committed offsets
equal the log end after a clean close, and native tools (``trio-coord
groups describe``, ``Admin.group_lag``) show the Kafka group; a member
SIGKILLed in a subprocess loses no acknowledged record; static membership
(``group.instance.id``) comes back without a rebalance; librdkafka's
``cooperative-sticky`` assignor works; the Kafka admin API lists, describes
and deletes groups. Hostile group requests get an error code, never a crash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka_fixtures import KafkaBroker, create_topic
from kio.index import load_request_schema
from test_kafka_hostile import connect, read_response, request_frame, still_serving

from trio_coord import open_admin
from trio_coord.kafka.codec import KafkaCode

FAST = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def consumer(broker: KafkaBroker, group: str, **config: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.kafka,
            "group.id": group,
            "auto.offset.reset": "earliest",
            **FAST,
            **config,
        }
    )


def produce(broker: KafkaBroker, topic: str, count: int, partitions: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": broker.kafka})
    for i in range(start, start + count):
        producer.produce(topic, b"v%d" % i, b"%d" % i, partition=i % partitions)
    assert producer.flush(15) == 0


def owned(c: Consumer) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


def poll_until(consumers: list[Consumer], done: Any, limit: float = 20.0) -> dict[bytes, int]:
    """Poll every consumer until ``done(got)``; returns key → consumer index."""
    got: dict[bytes, int] = {}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            m = c.poll(0.05)
            if m is not None and m.error() is None:
                got[m.key()] = i
        if done(got):
            return got
    raise AssertionError(
        f"not done after {limit}s: {len(got)} records, {[owned(c) for c in consumers]}"
    )


@contextmanager
def closing(consumers: list[Consumer]) -> Iterator[list[Consumer]]:
    try:
        yield consumers
    finally:
        for c in consumers:
            c.close()


def test_three_members_share_six_partitions_and_take_over_at_once(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """Each partition has exactly one owner; a member that closes is replaced in well under 1 s."""
    create_topic(kafka_broker.kafka, topic, 6)
    produce(kafka_broker, topic, 60, 6)
    group = f"g-{topic}"
    with closing([consumer(kafka_broker, group) for _ in range(3)]) as members:
        for c in members:
            c.subscribe([topic])
        poll_until(members, lambda got: len(got) == 60)
        assignments = [owned(c) for c in members]
        assert sorted(p for a in assignments for p in a) == list(range(6))
        assert all(len(a) == 2 for a in assignments)
        first = members.pop(0)
        started = time.monotonic()
        first.close()
        poll_until(members, lambda got: sum(len(owned(c)) for c in members) == 6)
        assert time.monotonic() - started < 3.0
        assert sorted(p for c in members for p in owned(c)) == list(range(6))


async def test_committed_offsets_equal_log_end_after_clean_close(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """Commits land in the engine: native tools see the Kafka group and its lag 0."""
    create_topic(kafka_broker.kafka, topic, 3)
    produce(kafka_broker, topic, 30, 3)
    group = f"g-{topic}"

    def consume_and_close() -> None:
        with closing([consumer(kafka_broker, group, **{"enable.auto.commit": True})]) as cs:
            cs[0].subscribe([topic])
            poll_until(cs, lambda got: len(got) == 30)

    await trio.to_thread.run_sync(consume_and_close)
    async with open_admin(kafka_broker.native) as admin:
        lag = await admin.group_lag(group)
    assert [(row.tp.partition, row.committed, row.lag) for row in lag] == [
        (p, 10, 0) for p in range(3)
    ]
    described = await trio.to_thread.run_sync(_describe, kafka_broker, group)
    assert {(o["topic"], o["partition"], o["committed"]) for o in described["offsets"]} == {
        (topic, p, 10) for p in range(3)
    }
    # The Kafka side reads them back (OffsetFetch).
    c = consumer(kafka_broker, group)
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
        assert [tp.offset for tp in committed] == [10, 10, 10]
    finally:
        c.close()


MEMBER = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
c.subscribe([sys.argv[3]])
print("ready", flush=True)
while True:
    m = c.poll(0.1)
    if m is None or m.error():
        continue
    print(m.key().decode(), flush=True)
    c.commit(m, asynchronous=False)
"""


def test_member_sigkilled_loses_no_acknowledged_record(
    kafka_broker: KafkaBroker, topic: str, tmp_path: Path
) -> None:
    """A member killed mid-stream: the survivors own everything and read what it left."""
    create_topic(kafka_broker.kafka, topic, 6)
    group = f"g-{topic}"
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    victim = subprocess.Popen(
        [sys.executable, str(script), kafka_broker.kafka, group, topic],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert victim.stdout is not None
    assert victim.stdout.readline().strip() == "ready"
    with closing([consumer(kafka_broker, group, **{"enable.auto.commit": False})]) as members:
        members.append(consumer(kafka_broker, group, **{"enable.auto.commit": False}))
        for c in members:
            c.subscribe([topic])
        produce(kafka_broker, topic, 60, 6)
        seen: set[bytes] = set()

        def step(limit: float, done: Any) -> None:
            deadline = time.monotonic() + limit
            while time.monotonic() < deadline and not done():
                for c in members:
                    m = c.poll(0.05)
                    if m is not None and m.error() is None:
                        seen.add(m.key())
                        c.commit(m, asynchronous=False)

        step(20, lambda: len(seen) >= 20)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        victim_seen = {line.strip().encode() for line in victim.stdout if line.strip()}
        killed = time.monotonic()
        produce(kafka_broker, topic, 60, 6, start=60)
        everything = {b"%d" % i for i in range(120)}
        step(
            30,
            lambda: sum(len(owned(c)) for c in members) == 6 and seen | victim_seen == everything,
        )
        # Owned within the dead member's session timeout (its partitions are fenced until then).
        assert time.monotonic() - killed < 15
        assert sorted(p for c in members for p in owned(c)) == list(range(6))
        assert seen | victim_seen == everything
    admin = AdminClient({"bootstrap.servers": kafka_broker.kafka})
    offsets = admin.list_consumer_group_offsets([_request(group, topic)], request_timeout=10)[
        group
    ].result(10)
    # Every record produced (120) is consumed and committed by someone.
    assert sum(tp.offset for tp in offsets.topic_partitions) == 120


def _request(group: str, topic: str) -> Any:
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(6)])


def test_static_member_restarts_without_rebalance(kafka_broker: KafkaBroker, topic: str) -> None:
    """A static member that closes and comes back gets its partitions, the others keep theirs."""
    create_topic(kafka_broker.kafka, topic, 4)
    produce(kafka_broker, topic, 40, 4)
    group = f"g-{topic}"
    static = {"group.instance.id": "i0"}
    with closing([consumer(kafka_broker, group, **static), consumer(kafka_broker, group)]) as cs:
        for c in cs:
            c.subscribe([topic])
        poll_until(cs, lambda got: len(got) == 40)
        before = owned(cs[0])
        generations = _generation(kafka_broker, group)
        cs[0].close()
        cs[0] = consumer(kafka_broker, group, **static)
        cs[0].subscribe([topic])
        poll_until(cs, lambda got: owned(cs[0]) == before)
        assert _generation(kafka_broker, group) == generations
        assert sorted(owned(cs[0]) + owned(cs[1])) == list(range(4))


def _describe(broker: KafkaBroker, group: str) -> Any:
    """``trio-coord groups describe GROUP --json``, parsed."""
    command = [sys.executable, "-m", "trio_coord", "groups", "describe", group, "--json"]
    out = subprocess.run(
        [*command, "-b", broker.native], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return json.loads(out)


def _generation(broker: KafkaBroker, group: str) -> int:
    return int(_describe(broker, group)["generation"])


def test_cooperative_sticky(kafka_broker: KafkaBroker, topic: str) -> None:
    """librdkafka's incremental rebalance: a second member takes half, the first keeps the rest."""
    create_topic(kafka_broker.kafka, topic, 4)
    produce(kafka_broker, topic, 40, 4)
    group = f"g-{topic}"
    coop = {"partition.assignment.strategy": "cooperative-sticky"}
    with closing([consumer(kafka_broker, group, **coop)]) as cs:
        cs[0].subscribe([topic])
        poll_until(cs, lambda got: owned(cs[0]) == [0, 1, 2, 3])
        cs.append(consumer(kafka_broker, group, **coop))
        cs[1].subscribe([topic])
        poll_until(cs, lambda got: len(owned(cs[0])) == 2 and len(owned(cs[1])) == 2)
        assert sorted(owned(cs[0]) + owned(cs[1])) == [0, 1, 2, 3]
        cs.pop(1).close()
        poll_until(cs, lambda got: owned(cs[0]) == [0, 1, 2, 3])


def test_admin_lists_describes_and_deletes_groups(kafka_broker: KafkaBroker, topic: str) -> None:
    """ListGroups, DescribeGroups, DeleteGroups through confluent-kafka's AdminClient."""
    create_topic(kafka_broker.kafka, topic, 2)
    produce(kafka_broker, topic, 10, 2)
    group = f"g-{topic}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.kafka})
    with closing([consumer(kafka_broker, group)]) as cs:
        cs[0].subscribe([topic])
        poll_until(cs, lambda got: len(got) == 10)
        cs[0].commit(asynchronous=False)
        listed = admin.list_consumer_groups(request_timeout=10).result(10)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result(10)
        assert str(described.state).endswith("STABLE")
        assert len(described.members) == 1
        assert sorted(tp.partition for tp in described.members[0].assignment.topic_partitions) == [
            0,
            1,
        ]
        refused = admin.delete_consumer_groups([group], request_timeout=10)[group]
        with pytest.raises(Exception, match="NON_EMPTY_GROUP"):
            refused.result(10)
    admin.delete_consumer_groups([group], request_timeout=10)[group].result(10)
    listed = admin.list_consumer_groups(request_timeout=10).result(10)
    assert group not in {g.group_id for g in listed.valid}


def test_hostile_group_requests_get_error_codes(kafka_broker: KafkaBroker, topic: str) -> None:
    """Bad metadata, a wrong protocol type, bad assignments: error codes, the broker serves on."""
    schema = load_request_schema(11, 5)
    protocol_cls = sys.modules[schema.__module__].JoinGroupRequestProtocol

    def join(member_id: str, protocol_type: str, metadata: bytes) -> Any:
        return schema(
            group_id=f"g-{topic}",
            session_timeout=timedelta(seconds=6),
            rebalance_timeout=timedelta(seconds=6),
            member_id=member_id,
            group_instance_id=None,
            protocol_type=protocol_type,
            protocols=(protocol_cls(name="range", metadata=metadata),),
        )

    create_topic(kafka_broker.kafka, topic, 1)
    with connect(kafka_broker) as sock:
        sock.sendall(request_frame(11, 5, 1, join("", "consumer", b"\x00")))
        _, body = read_response(sock, 11, 5)
        assert body.error_code == KafkaCode.inconsistent_group_protocol
        sock.sendall(request_frame(11, 5, 2, join("", "connect", b"\x00\x00")))
        _, body = read_response(sock, 11, 5)
        assert body.error_code == KafkaCode.inconsistent_group_protocol
        for garbage in (b"\x00\x00\xff\xff\xff\x00", b"\x7f\xff" + os.urandom(40), b"\xff\xff"):
            sock.sendall(request_frame(11, 5, 3, join("", "consumer", garbage)))
            _, body = read_response(sock, 11, 5)
            assert body.error_code == KafkaCode.inconsistent_group_protocol
        # Heartbeat and SyncGroup from nobody.
        hb = load_request_schema(12, 3)
        sock.sendall(
            request_frame(
                12,
                3,
                4,
                hb(group_id=f"g-{topic}", generation_id=1, member_id="x", group_instance_id=None),
            )
        )
        _, body = read_response(sock, 12, 3)
        assert body.error_code == KafkaCode.unknown_member_id
    still_serving(kafka_broker)
    assert "Traceback" not in kafka_broker.log_text()


async def test_a_live_kafka_group_is_rewound_by_trio_coord_reset_offsets(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """`groups reset-offsets` (Admin.reset_offsets) rewinds a running Kafka group: the
    engine stops its member, records the offsets, and the member reads from there again."""
    create_topic(kafka_broker.kafka, topic, 3)
    produce(kafka_broker, topic, 30, 3)
    group = f"g-{topic}"
    member = consumer(kafka_broker, group, **{"enable.auto.commit": True})
    member.subscribe([topic])
    seen: list[bytes] = []
    stop = threading.Event()

    def poll_again() -> None:
        while not stop.is_set():
            m = member.poll(0.05)
            if m is not None and m.error() is None:
                seen.append(m.key())

    try:
        await trio.to_thread.run_sync(poll_until, [member], lambda got: len(got) == 30)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, poll_again)
            try:
                async with open_admin(kafka_broker.native) as admin:
                    with trio.fail_after(30):
                        await admin.reset_offsets(group, {(topic, p): 0 for p in range(3)})
                with trio.fail_after(30):
                    while len(set(seen)) < 30:
                        await trio.sleep(0.05)
            finally:
                stop.set()
        assert sorted(set(seen), key=int) == [b"%d" % i for i in range(30)]
    finally:
        await trio.to_thread.run_sync(member.close)
