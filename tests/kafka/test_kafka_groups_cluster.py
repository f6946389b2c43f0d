"""Kafka consumer groups follow their coordinator when its broker is SIGKILLed.

Two broker processes on ZooKeeper, each with a Kafka listener; two
confluent-kafka consumers of one group. The broker coordinating the group
is SIGKILLed: the other broker wins its slot, loads the group and its
committed offsets from ZooKeeper, and the consumers (FindCoordinator again,
UNKNOWN_MEMBER_ID, join again) re-form the group there, sharing every
partition once more, with the offsets committed before the crash intact.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_fixtures import KafkaBroker, start_broker, stop_broker


def _cluster_broker(base: Path, url: str, broker_id: int) -> KafkaBroker:
    return start_broker(
        base / f"b{broker_id}",
        "--store",
        url,
        "--broker-id",
        str(broker_id),
        "--coordinator-slots",
        "4",
        "--zk-session-timeout",
        "2",
    )


def _owned(c: Consumer) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


def test_group_follows_a_coordinator_sigkill(
    zookeeper_server: Any, zk_chroot: str, tmp_path: Path
) -> None:
    url = zookeeper_server.url(zk_chroot)
    brokers = [_cluster_broker(tmp_path, url, i) for i in (1, 2)]
    members: list[Consumer] = []
    try:
        bootstrap = ",".join(b.kafka for b in brokers)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        deadline = time.monotonic() + 30
        while len(admin.list_topics(timeout=10).brokers) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        admin.create_topics([NewTopic("t", 4)])["t"].result(20)
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(40):
            producer.produce("t", b"v%d" % i, b"%d" % i, partition=i % 4)
        assert producer.flush(20) == 0
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": "g",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
        members.extend(Consumer(config) for _ in range(2))
        for c in members:
            c.subscribe(["t"])
        got: set[bytes] = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(got) < 40:
            for c in members:
                m = c.poll(0.05)
                if m is not None and m.error() is None:
                    got.add(m.key())
        assert len(got) == 40
        for c in members:
            c.commit(asynchronous=False)
        described = admin.describe_consumer_groups(["g"], request_timeout=10)["g"].result(10)
        coordinator = described.coordinator.id
        (victim,) = [b for b in brokers if b.kafka.endswith(f":{described.coordinator.port}")]
        victim.process.kill()
        victim.process.wait(10)
        killed = time.monotonic()
        survivor = next(b for b in brokers if b is not victim)
        # The group re-forms on the surviving broker: every partition owned once.
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            for c in members:
                c.poll(0.05)
            parts = [_owned(c) for c in members]
            if sorted(p for a in parts for p in a) == [0, 1, 2, 3] and all(parts):
                new = AdminClient({"bootstrap.servers": survivor.kafka})
                group = new.describe_consumer_groups(["g"], request_timeout=10)["g"].result(10)
                if group.coordinator.id != coordinator and str(group.state).endswith("STABLE"):
                    break
        else:
            raise AssertionError(f"no group on the survivor: {[_owned(c) for c in members]}")
        assert time.monotonic() - killed < 45
        committed = members[0].committed([TopicPartition("t", p) for p in range(4)], timeout=10)
        assert [tp.offset for tp in committed] == [10, 10, 10, 10]
    finally:
        for c in members:
            c.close()
        for b in brokers:
            if b.process.poll() is None:
                stop_broker(b)
