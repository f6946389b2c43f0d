"""Two brokers on ZooKeeper with Kafka listeners: Metadata, leaders and coordinators.

Each broker registers its Kafka port beside its native address; Metadata
from either lists both Kafka listeners, confluent-kafka produces to and
consumes from partitions led by each broker through a bootstrap list naming
only one of them, and FindCoordinator's answer (``kafka_coordinator``) is
the Kafka address of the broker holding the group's slot, on both brokers.
"""

from __future__ import annotations

import collections
import contextlib
import time

import trio
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from trio_coord import open_broker
from trio_coord.store import SessionState

SETTINGS = dict(coordinator_slots=4, zk_session_timeout=2.0, claim_grace=0.3, kafka_port=0)


def _kafka(broker) -> str:
    host, port = broker.kafka_address
    return f"{host}:{port}"


def _round_trip(bootstrap: str, topic: str) -> tuple[dict[int, str], list[tuple[int, bytes]]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 4)])[topic].result(20)
    metadata = admin.list_topics(timeout=10)
    brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(4):
        producer.produce(topic, b"to-%d" % p, partition=p)
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
        deadline = time.monotonic() + 20
        while len(got) < 4 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append((message.partition(), message.value()))
    finally:
        consumer.close()
    return brokers, sorted(got)


async def test_metadata_leaders_and_coordinators_span_the_cluster(
    zookeeper_server, zk_chroot, tmp_path
) -> None:
    """Both Kafka listeners are listed; partitions on both brokers are written and read."""
    url = zookeeper_server.url(zk_chroot)
    async with contextlib.AsyncExitStack() as stack:
        brokers = [
            await stack.enter_async_context(
                open_broker(tmp_path / f"b{i}", store=url, broker_id=i, **SETTINGS)
            )
            for i in (1, 2)
        ]

        def settled() -> bool:
            # Connected, both brokers seen, the 4 slots handed out 2 and 2 (a broker that
            # held them all hands some over: wait for the end of that), and every slot's
            # coordinator installed where its holder is.
            if not all(
                b.store.session_state.value is SessionState.CONNECTED
                and b.cluster is not None
                and set(b.cluster.brokers) == {1, 2}
                for b in brokers
            ):
                return False
            holders = dict(brokers[0].cluster.holders)
            return (
                all(dict(b.cluster.holders) == holders for b in brokers)
                and sorted(collections.Counter(holders.values()).values()) == [2, 2]
                and all(
                    set(b.coordinator.services)
                    == {s for s, h in holders.items() if h == b.config.broker_id}
                    for b in brokers
                )
            )

        with trio.fail_after(30):
            while not settled():
                await trio.sleep(0.05)
        listed, got = await trio.to_thread.run_sync(_round_trip, _kafka(brokers[0]), "spread")
        assert listed == {1: _kafka(brokers[0]), 2: _kafka(brokers[1])}
        assert got == [(p, b"to-%d" % p) for p in range(4)]
        leaders = set(brokers[0].topics.leaders["spread"])
        assert leaders == {1, 2}  # (the partitions really are on both brokers)
        for group in ("g1", "g2", "g3", "g4", "g5"):
            slot = brokers[0].coordinator.slot_of(group)
            (owner,) = [b for b in brokers if slot in b.coordinator.services]
            for b in brokers:
                node = b.kafka_coordinator(group)
                assert node is not None
                assert (node.node_id, f"{node.host}:{node.port}") == (
                    owner.config.broker_id,
                    _kafka(owner),
                )
