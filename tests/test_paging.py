"""Listings come a page at a time, so that no answer's size is bound by the frame.

4,500 topics with long names once made ``Metadata(all)`` (and ``topics
list``) fail for everyone, for good; a group's offsets did the same to
OffsetFetch and DescribeGroup. Here, with a 64 KiB frame so that a few
hundred names overflow it: every listing is complete through the clients,
each page a raw client sees fits, and the pages chain without a gap.
"""

from __future__ import annotations

import trio

from trio_coord import TopicPartition, open_admin, open_broker
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.framing import FrameCodec
from trio_coord.protocol.messages import (
    CreateGroupRequest,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    PartitionOffset,
    Response,
)
from trio_coord.spark._client import BlockingClient

FRAME = 64 * 1024


async def test_every_listing_is_complete_and_every_page_fits(tmp_path) -> None:
    names = [f"{i:04d}-" + "n" * 240 for i in range(400)]  # ~100 KB of names
    groups = [f"{i:04d}-" + "g" * 240 for i in range(300)]
    async with open_broker(tmp_path, max_frame_size=FRAME, max_partitions=5000) as broker:
        async with open_admin(broker.bootstrap) as admin:
            for name in names:
                await admin.create_topic(name, 1)
            await admin.create_topic("wide", 2000)
            async with open_connection(*broker.address) as conn:
                for group in groups:
                    await conn.request(CreateGroupRequest(group))
                offsets = [PartitionOffset("wide", p, p, "m" * 1024) for p in range(2000)]
                for first in range(0, 2000, 40):  # each commit fits a frame
                    await conn.request(
                        OffsetCommitRequest("g", "", -1, offsets[first : first + 40])
                    )

                # A raw client sees pages that fit, and chain.
                seen, after, pages = [], "", 0
                while True:
                    answer = await conn.request(MetadataRequest(None, after=after))
                    assert isinstance(answer, MetadataResponse)
                    assert len(FrameCodec(2**30).encode(Response(1, 0, "", answer))) <= FRAME
                    seen += [t.name for t in answer.topics]
                    pages += 1
                    if not answer.next:
                        break
                    after = answer.next
                assert seen == sorted([*names, "wide"]) and pages > 1

            listed = await admin.list_topics()
            assert [t.name for t in listed] == sorted([*names, "wide"])
            assert [g.group_id for g in await admin.list_groups()] == sorted([*groups, "g"])
            committed = await admin.committed_offsets("g")
            assert committed == {TopicPartition("wide", p): p for p in range(2000)}
            description = await admin.describe_group("g")
            assert [o.offset for o in description.offsets] == list(range(2000))
            lag = await admin.group_lag("g")
            assert len(lag) == 2000

        def blocking() -> None:
            with BlockingClient(broker.bootstrap) as client:
                assert len(client.partition_counts()) == 401
                assert len(client.committed("g")) == 2000

        await trio.to_thread.run_sync(blocking)
