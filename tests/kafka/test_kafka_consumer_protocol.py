"""confluent-kafka with ``group.protocol=consumer`` (KIP-848) on the broker's group engine.

Three members on six partitions, one of them a subprocess SIGKILLed
mid-stream: the survivors own every partition exactly once and read every
record it had not committed, and after they commit and close the committed
offsets equal the log end. Two members share six partitions and a third
joins: the others give up only the partitions it takes (their rebalance
callbacks revoke nothing else). A member subscribed by regular expression
picks up a topic created after it joined. ConsumerGroupDescribe (the admin
client's describe_consumer_groups) shows member epochs and assignments.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from kafka_fixtures import KafkaBroker, Victim, create_topic, start_broker, stop_broker

# Short sessions and heartbeats (the broker's settings under KIP-848): a SIGKILLed
# member's partitions move once its session has ended, and members hear of a
# rebalance within a heartbeat interval.
BROKER_FLAGS = (
    "--kafka-consumer-session-timeout",
    "3",
    "--kafka-consumer-heartbeat-interval",
    "0.25",
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One broker for the module, with short KIP-848 sessions and heartbeats."""
    broker = start_broker(tmp_path_factory.mktemp("kip848-broker"), *BROKER_FLAGS)
    try:
        yield broker
    finally:
        stop_broker(broker)


def consumer(broker: KafkaBroker, group: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.kafka,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **extra,
        }
    )


def produce(broker: KafkaBroker, topic: str, count: int, partitions: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": broker.kafka})
    for i in range(start, start + count):
        producer.produce(topic, b"v%d" % i, b"%d" % i, partition=i % partitions)
    assert producer.flush(15) == 0


def wait_for(done: Callable[[], bool], limit: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not done():
        time.sleep(0.02)
    assert done(), what()


class Poller:
    """Members polled by one thread each; what they read, and what their callbacks said."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.revoked: dict[int, list[set[int]]] = {}
        self.members: dict[int, Consumer] = {}
        self.assigned: dict[int, set[tuple[str, int]]] = {}
        """Each member's assignment, as its own thread last saw it (a Consumer is called from
        its thread only: assignment() from another thread can deadlock with a rebalance
        callback waiting for the GIL)."""
        self.stop = threading.Event()
        self.refused: list[int] = []  # the error codes of commits refused
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def start(self, index: int, make: Callable[[], Consumer], topics: list[str]) -> None:
        def run() -> None:
            c = make()
            self.revoked[index] = []

            def on_revoke(_c: Consumer, parts: list[TopicPartition]) -> None:
                if parts:
                    self.revoked[index].append({p.partition for p in parts})

            c.subscribe(topics, on_revoke=on_revoke)
            self.members[index] = c
            try:
                while not self.stop.is_set():
                    msg = c.poll(0.05)
                    self.assigned[index] = {(tp.topic, tp.partition) for tp in c.assignment()}
                    if msg is None or msg.error():
                        continue
                    with self.lock:
                        self.seen.add(msg.key())
                    try:
                        c.commit(message=msg, asynchronous=False)
                    except KafkaException as exc:
                        # A commit that crosses a rebalance may be refused (STALE_MEMBER_EPOCH
                        # for a partition moving away, as Kafka refuses it): an application
                        # goes on, and the partition's next owner reads from the last commit.
                        self.refused.append(exc.args[0].code())
            finally:
                c.close()

        thread = threading.Thread(target=run)
        self.threads.append(thread)
        thread.start()

    def assignment(self, index: int) -> set[int]:
        return {p for _t, p in self.assigned.get(index, set())}

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(20)


VICTIM = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "group.protocol": "consumer", "auto.offset.reset": "earliest",
              "enable.auto.commit": False})
c.subscribe([sys.argv[3]])
print("ready", flush=True)
while True:
    msg = c.poll(0.05)
    if msg is None or msg.error():
        continue
    print(msg.key().decode(), flush=True)
    c.commit(message=msg, asynchronous=False)
"""


def committed(broker: KafkaBroker, group: str, topic: str, partitions: int) -> list[int]:
    check = Consumer({"bootstrap.servers": broker.kafka, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return [tp.offset for tp in check.committed(tps, timeout=15)]
    finally:
        check.close()


def test_member_sigkilled_loses_no_acknowledged_record(
    broker: KafkaBroker, topic: str, tmp_path: Path
) -> None:
    """Three members, one SIGKILLed mid-stream: the survivors own all six partitions exactly
    once and read what it left; the committed offsets reach the log end."""
    create_topic(broker.kafka, topic, 6)
    group = f"g-{topic}"
    script = tmp_path / "victim.py"
    script.write_text(VICTIM)
    victim = Victim(script, broker, group, topic)
    poller = Poller()
    everything = {b"%d" % i for i in range(120)}
    try:
        for i in range(2):
            poller.start(i, lambda: consumer(broker, group), [topic])

        def state() -> str:
            return (
                f"{len(poller.seen)} + {len(victim.seen)} seen, "
                f"{[sorted(poller.assignment(i)) for i in range(2)]}"
            )

        wait_for(lambda: all(len(poller.assignment(i)) == 2 for i in range(2)), 30, state)
        produce(broker, topic, 60, 6)
        wait_for(lambda: len(victim.seen) >= 5 and len(poller.seen) >= 10, 30, state)
        victim.kill()
        produce(broker, topic, 60, 6, start=60)

        def owned() -> list[int]:
            return sorted(p for i in range(2) for p in poller.assignment(i))

        wait_for(
            lambda: owned() == list(range(6)) and poller.seen | victim.seen == everything,
            30,
            state,
        )
    finally:
        poller.close()
        if victim.process.poll() is None:
            victim.kill()
    assert committed(broker, group, topic, 6) == [20] * 6
    assert set(poller.refused) <= {KafkaError.STALE_MEMBER_EPOCH}


def test_joining_member_moves_only_the_partitions_it_takes(broker: KafkaBroker, topic: str) -> None:
    """Two members own three partitions each; a third joins and takes two: each of the two
    revokes exactly the one partition that moves, never the two it keeps."""
    create_topic(broker.kafka, topic, 6)
    group = f"g-{topic}"
    poller = Poller()
    try:
        for i in range(2):
            poller.start(i, lambda: consumer(broker, group), [topic])

        def state() -> str:
            return f"{[sorted(poller.assignment(i)) for i in range(3)]}, revoked {poller.revoked}"

        wait_for(lambda: all(len(poller.assignment(i)) == 3 for i in range(2)), 30, state)
        before = {i: poller.assignment(i) for i in range(2)}
        earlier = {i: len(poller.revoked[i]) for i in range(2)}  # (if one joined first)
        poller.start(2, lambda: consumer(broker, group), [topic])
        wait_for(lambda: all(len(poller.assignment(i)) == 2 for i in range(3)), 30, state)
        taken = poller.assignment(2)
        for i in range(2):
            moved = before[i] - poller.assignment(i)
            assert poller.assignment(i) <= before[i]
            assert poller.revoked[i][earlier[i] :] == [moved], state()
            assert moved <= taken
        assert sorted(p for i in range(3) for p in poller.assignment(i)) == list(range(6))
        admin = AdminClient({"bootstrap.servers": broker.kafka})
        described = admin.describe_consumer_groups([group])[group].result(15)
        assert described.type == ConsumerGroupType.CONSUMER
        assert len(described.members) == 3
        assert sorted(
            tp.partition for m in described.members for tp in m.assignment.topic_partitions
        ) == list(range(6))
        # trio-coord's own view: member epochs, target vs current (the same once stable).
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "trio_coord",
                "groups",
                "describe",
                group,
                "--json",
                "-b",
                broker.native,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert cli.returncode == 0, cli.stderr
        members = json.loads(cli.stdout)["members"]
        generation = json.loads(cli.stdout)["generation"]
        assert [m["member_epoch"] for m in members] == [generation + 1] * 3
        assert all(m["current"] == m["partitions"] for m in members)
        assert sorted(p for m in members for _t, p in m["partitions"]) == list(range(6))
        text = subprocess.run(
            [sys.executable, "-m", "trio_coord", "groups", "describe", group, "-b", broker.native],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        assert "EPOCH" in text and "TARGET ASSIGNMENT" in text
    finally:
        poller.close()


def test_regex_subscription_picks_up_a_topic_created_later(broker: KafkaBroker, topic: str) -> None:
    """A member subscribed to ^prefix-.* reads a matching topic created after it joined."""
    prefix = f"rx{abs(hash(topic)) % 10**8}"
    create_topic(broker.kafka, f"{prefix}-a", 2)
    poller = Poller()
    try:
        poller.start(0, lambda: consumer(broker, f"g-{topic}"), [f"^{prefix}-.*"])

        def topics() -> set[str]:
            return {t for t, _p in poller.assigned.get(0, set())}

        wait_for(lambda: topics() == {f"{prefix}-a"}, 30, lambda: str(topics()))
        create_topic(broker.kafka, f"{prefix}-b", 3)
        create_topic(broker.kafka, f"other{prefix}", 1)
        wait_for(lambda: topics() == {f"{prefix}-a", f"{prefix}-b"}, 30, lambda: str(topics()))
        produce(broker, f"{prefix}-b", 9, 3)
        wait_for(lambda: len(poller.seen) == 9, 30, lambda: str(poller.seen))
    finally:
        poller.close()


def test_static_member_restarting_gets_its_partitions_back(broker: KafkaBroker, topic: str) -> None:
    """A static member (group.instance.id) closes (epoch -2) and a new process with its
    instance id comes back: it gets the same partitions, the other member keeps its own."""
    create_topic(broker.kafka, topic, 4)
    group = f"g-{topic}"

    def member(instance: str) -> Consumer:
        c = consumer(broker, group, **{"group.instance.id": instance})
        c.subscribe([topic])
        return c

    def owned(*members: Consumer) -> list[list[int]]:
        return [sorted(tp.partition for tp in m.assignment()) for m in members]

    def settle(members: list[Consumer], done: Callable[[], bool]) -> None:
        # (one thread polls every member and asks for assignments: see Poller.assigned)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not done():
            for m in members:
                m.poll(0.02)
        assert done(), owned(*members)

    a, b = member("a"), member("b")
    try:
        settle([a, b], lambda: all(len(p) == 2 for p in owned(a, b)))
        before = owned(a, b)
        a.close()
        settle([b], lambda: True)
        a = member("a")
        settle([a, b], lambda: owned(a, b) == before)
    finally:
        b.close()
        a.close()


def test_topic_ids_in_metadata_and_topics_describe(broker: KafkaBroker, topic: str) -> None:
    """Metadata gives the id persisted with the topic, the one `topics describe` shows; a
    topic recreated under the same name has a new one."""
    from confluent_kafka import TopicCollection

    admin = AdminClient({"bootstrap.servers": broker.kafka})

    def kafka_id() -> str:
        described = admin.describe_topics(TopicCollection([topic]))[topic].result(15)
        # (librdkafka prints standard base64; Kafka's tools, and trio-coord's, URL-safe)
        return str(described.topic_id).replace("+", "-").replace("/", "_")

    def cli_id() -> str:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "trio_coord",
                "topics",
                "describe",
                topic,
                "--json",
                "-b",
                broker.native,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)[0]["topic_id"]

    create_topic(broker.kafka, topic, 1)
    first = kafka_id()
    assert first == cli_id()
    for future in admin.delete_topics([topic]).values():
        future.result(15)
    create_topic(broker.kafka, topic, 1)
    assert kafka_id() == cli_id() != first
