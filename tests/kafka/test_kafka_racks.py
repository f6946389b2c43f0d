"""Racks (KIP-881) end to end: two brokers with ``rack``, KIP-848 members with ``client.rack``.

Each broker is started with its own rack; Kafka Metadata lists every broker's
rack, and a partition's rack is its leader's. Two confluent-kafka consumers
with ``group.protocol=consumer``, one per rack, share a topic whose
partitions are spread over both brokers: the server assignor gives each one
exactly the partitions led by the broker of its rack (and, balance first, two
each). Both join the group's first generation: the assignors put stickiness
before racks, so partitions a member already owns stay with it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import trio
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.index import load_request_schema

from trio_coord import open_broker
from trio_coord.kafka.codec import RequestHead
from trio_coord.kafka.dispatch import FrontEnd, RequestContext
from trio_coord.kafka.service import KafkaLimits
from trio_coord.store import SessionState

RACKS = {1: "rack-a", 2: "rack-b"}
SETTINGS = dict(
    coordinator_slots=2,
    zk_session_timeout=2.0,
    claim_grace=0.3,
    kafka_port=0,
    kafka_consumer_session_timeout=3.0,
    kafka_consumer_heartbeat_interval=0.25,
    # Both members must be in the group's first generation: stickiness comes before
    # racks, so a member that joined alone first would keep half of what it owned,
    # whatever its rack (a shared machine can delay the second join that long). Each
    # join re-arms the delay, so the first rebalance waits for both.
    initial_rebalance_delay=3.0,
)
TOPIC = "racked"


def _kafka(broker: Any) -> str:
    host, port = broker.kafka_address
    return f"{host}:{port}"


async def _metadata_racks(broker: Any) -> dict[int, str | None]:
    """Every broker's rack as Kafka Metadata (v12, through the front end) states it."""
    body = load_request_schema(3, 12)(
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    front = FrontEnd(broker, KafkaLimits())
    ctx = RequestContext(front, RequestHead(3, 12, 1), "t", "t")
    api = front.table.get(3)
    assert api is not None
    answer = await api.handler(ctx, body)
    return {b.node_id: b.rack for b in answer.brokers}


def _members_by_rack(bootstrap: str) -> tuple[dict[int, int], dict[str, set[int]]]:
    """(leader of each partition, partitions each rack's consumer was given once stable)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 4)])[TOPIC].result(20)
    leaders = {
        p: meta.leader
        for p, meta in admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions.items()
    }
    consumers = {
        rack: Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "racks",
                "group.protocol": "consumer",
                "client.rack": rack,
                "enable.auto.commit": False,
            }
        )
        for rack in RACKS.values()
    }
    got: dict[str, set[int]] = {rack: set() for rack in consumers}
    try:
        for c in consumers.values():
            c.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        # (one thread polls both: each Consumer is called from this thread only)
        while time.monotonic() < deadline:
            for rack, c in consumers.items():
                c.poll(0.05)
                got[rack] = {tp.partition for tp in c.assignment()}
            if all(len(v) == 2 for v in got.values()) and set().union(*got.values()) == set(
                range(4)
            ):
                break
    finally:
        for c in consumers.values():
            c.close()
    return leaders, got


async def test_each_member_gets_the_partitions_of_its_own_rack(
    zookeeper_server: Any, zk_chroot: str, tmp_path: Any
) -> None:
    url = zookeeper_server.url(zk_chroot)
    async with contextlib.AsyncExitStack() as stack:
        brokers = [
            await stack.enter_async_context(
                open_broker(tmp_path / f"b{i}", store=url, broker_id=i, rack=RACKS[i], **SETTINGS)
            )
            for i in (1, 2)
        ]
        with trio.fail_after(30):
            while (
                not all(
                    b.store.session_state.value is SessionState.CONNECTED
                    and b.cluster is not None
                    and set(b.cluster.brokers) == {1, 2}
                    and len(b.cluster.holders) == 2
                    for b in brokers
                )
                or sum(len(b.coordinator.services) for b in brokers) < 2
            ):
                await trio.sleep(0.05)
        for b in brokers:
            assert await _metadata_racks(b) == RACKS
        leaders, got = await trio.to_thread.run_sync(_members_by_rack, _kafka(brokers[0]))
    assert sorted(leaders.values()) == [1, 1, 2, 2]  # (the topic spans both racks)
    assert got == {
        rack: {p for p, leader in leaders.items() if leader == broker_id}
        for broker_id, rack in RACKS.items()
    }
