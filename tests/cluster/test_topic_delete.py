"""Deleting a topic in a cluster: every broker forgets it and removes the logs it held.

The DeleteTopic goes to one broker; the others learn of it from their watch on
the topics root, as they learn of new topics. The group's offsets are
forgotten by whichever broker coordinates it, and a restarted broker that
missed the deletion sets its stale logs aside instead of serving them.
"""

from __future__ import annotations

import trio

from trio_coord import TopicPartition, open_admin, open_broker, open_producer

from .test_cluster import SETTINGS, settled


async def test_every_broker_forgets_a_deleted_topic_and_its_logs(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    dirs = [tmp_path / f"b{i}" / "partitions" / "t" for i in (1, 2)]
    async with open_broker(tmp_path / "b1", store=url, broker_id=1, **SETTINGS) as first:
        async with open_broker(tmp_path / "b2", store=url, broker_id=2, **SETTINGS) as second:
            brokers = [first, second]
            await settled(brokers)
            boot = ",".join(b.bootstrap for b in brokers)
            async with open_admin(boot) as admin:
                await admin.create_topic("t", 4)  # placed on both brokers
                await _one_record_each(boot, 4)
                await admin.reset_offsets("g", {("t", p): 1 for p in range(4)})
                assert all(d.exists() for d in dirs)

                async with open_admin(first.bootstrap) as one:
                    await one.delete_topic("t")
                with trio.fail_after(20):
                    while any("t" in b.topics.partitions for b in brokers) or any(
                        d.exists() for d in dirs
                    ):
                        await trio.sleep(0.05)
                    while await admin.committed_offsets("g"):
                        await trio.sleep(0.05)
                metadata = await admin.metadata()
                assert "t" not in {t.name for t in metadata.topics}

                # Made again, it is new and empty on every broker.
                await admin.create_topic("t", 2)
                ends = await admin.list_offsets([("t", 0), ("t", 1)])
                assert [ends[TopicPartition("t", p)].log_end for p in (0, 1)] == [0, 0]
                await _one_record_each(boot, 2)

        # Deleted while broker 2 is down: at its restart, its logs of "t" are set aside.
        async with open_admin(first.bootstrap) as admin:
            await admin.delete_topic("t")
        assert dirs[1].exists()
        async with open_broker(tmp_path / "b2", store=url, broker_id=2, **SETTINGS) as second:
            await settled([first, second])
            aside = [p.name for p in dirs[1].parent.iterdir() if p.name.startswith("t@")]
            assert not dirs[1].exists() and len(aside) == 1 and "orphaned" in aside[0]


async def _one_record_each(bootstrap: str, partitions: int) -> None:
    async with open_producer(bootstrap) as producer:
        for p in range(partitions):
            await producer.send("t", b"x", partition=p)
