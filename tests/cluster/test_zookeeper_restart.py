"""A cluster outlives a restart of its ZooKeeper server.

Two brokers run in this process on a private ZooKeeper server that the test
stops and starts again (same port, same data). Whether their sessions
survive the restart (ZooKeeper restores them) or expire meanwhile (a slow
server start), the brokers must come back on their own: registered, the
slots spread and loaded, group writes and topic writes served, and the
offsets committed before the restart still there.
"""

from __future__ import annotations

import trio

from trio_coord import open_admin
from trio_coord.protocol.messages import OffsetCommitRequest, PartitionOffset, TopicPartition

from .test_cluster import coordinator_broker, open_cluster, settled


async def test_brokers_reconnect_and_serve_after_a_zookeeper_restart(private_zookeeper, tmp_path):
    url = private_zookeeper.url("/cluster")
    tp = TopicPartition("t", 0)
    async with open_cluster(url, tmp_path, 2) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        async with open_admin(bootstrap) as admin:
            await admin.create_topic("t", 2)
            with trio.fail_after(10):
                while not all("t" in b.topics.partitions for b in brokers):
                    await trio.sleep(0.02)
            owner = coordinator_broker(brokers, "g")
            await owner.coordinator.commit(
                OffsetCommitRequest("g", "", -1, [PartitionOffset("t", 0, 42)])
            )

            await trio.to_thread.run_sync(private_zookeeper.restart)

            await settled(brokers)
            assert (await admin.committed_offsets("g"))[tp] == 42
            owner = coordinator_broker(brokers, "g")
            await owner.coordinator.commit(
                OffsetCommitRequest("g", "", -1, [PartitionOffset("t", 0, 43)])
            )
            assert (await admin.committed_offsets("g"))[tp] == 43
            info = await admin.create_topic("u", 2)
            assert sorted(info.leaders) == [1, 2]
            assert [b.broker_id for b in await admin.brokers()] == [1, 2]
