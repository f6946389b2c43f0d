"""Lists a consumer sends or is sent that outgrow a frame: positions, commits, lookups, pushes.

A consumer of 10,000 partitions of a 120-character topic name hands back
1.3 MB of positions, more than a default broker's 1 MiB frame; the same
happens with 1,000 partitions of a 100-character name on a broker of a
64 KiB frame, which these tests use to stay fast. Every such message was
refused, and sent again, forever: the heartbeat carrying auto-commit
positions killed the consumer, a stop answer or a leave lost its positions,
a commit or a lookup of committed offsets always failed (a standalone
consumer with a group could not even start), and a broker of a larger frame
pushed an assignment larger than the member reads, so it never got one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from trio_coord import open_admin, open_consumer, open_producer
from trio_coord.broker.server import Broker, open_broker
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.errors import FrameTooLargeError
from trio_coord.protocol.messages import (
    LATEST,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    TopicPartition,
)
from trio_coord.spark._client import BlockingClient
from trio_coord.spark._read import commit_forward

TOPIC = "t" * 100
COUNT = 1000
FRAME = 64 * 1024  # (the broker's: 1,000 positions of TOPIC take 108 KB)
ALL = [TopicPartition(TOPIC, p) for p in range(COUNT)]


async def make_topic_with_a_record_each(bootstrap: str) -> None:
    async with open_admin(bootstrap) as admin:
        await admin.create_topic(TOPIC, COUNT)
    async with open_producer(bootstrap, linger=0.05) as producer:
        for p in range(COUNT):
            await producer.enqueue(TOPIC, b"x", partition=p)
        await producer.flush()


@asynccontextmanager
async def a_broker_with_a_record_in_each(tmp_path) -> AsyncIterator[Broker]:
    """A broker of FRAME with TOPIC, whose 1,000 partitions hold a record each."""
    async with open_broker(tmp_path, max_frame_size=FRAME, max_partitions=COUNT) as broker:
        await make_topic_with_a_record_each(broker.bootstrap)
        yield broker


def reading(broker: Broker, group: str, **options):
    """A member of ``group`` reading TOPIC from its start."""
    return open_consumer(broker.bootstrap, group, [TOPIC], offset_reset="earliest", **options)


async def consume_all(consumer) -> None:
    """Read the 1,000 records, and ask once more: the last ones count as consumed then."""
    got = 0
    with trio.fail_after(30):
        while got < COUNT:
            got += len(await consumer.getmany(COUNT))
    with trio.move_on_after(0.1):
        await consumer.getmany()


async def committed(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    async with open_admin(bootstrap) as admin:
        return await admin.committed_offsets(group)


async def test_auto_commit_heartbeats_carry_more_positions_than_one_frame_holds(tmp_path):
    async with a_broker_with_a_record_in_each(tmp_path) as broker:
        async with reading(broker, "g", session_timeout=1.5) as consumer:
            await consume_all(consumer)
            with trio.fail_after(20):  # (a heartbeat every 0.5 s)
                while sum((await committed(broker.bootstrap, "g")).values()) < COUNT:
                    await trio.sleep(0.2)
            generation = consumer.generation
        # One session all along: no heartbeat was refused and no connection closed.
        assert generation == 1
        assert await committed(broker.bootstrap, "g") == dict.fromkeys(ALL, 1)


async def test_a_stop_answer_and_a_leave_hand_back_more_positions_than_one_frame_holds(
    tmp_path,
):
    # A heartbeat every 10 s: what was consumed is handed back by the stop and the leave.
    async with a_broker_with_a_record_in_each(tmp_path) as broker:
        async with reading(broker, "g", session_timeout=30) as first:
            await consume_all(first)
            async with open_consumer(
                broker.bootstrap, "g", [TOPIC], session_timeout=30, auto_commit=False
            ) as second:
                with trio.fail_after(20):
                    while len(second.assignment) + len(first.assignment) < COUNT or not (
                        second.assignment
                    ):
                        await trio.sleep(0.05)
                # The stop answer's positions are durable before anything restarts.
                assert await committed(broker.bootstrap, "g") == dict.fromkeys(ALL, 1)
                assert set(second.assignment.values()) == {1}
    async with open_broker(tmp_path, max_frame_size=FRAME, max_partitions=COUNT) as broker:
        async with reading(broker, "h", session_timeout=30) as alone:
            await consume_all(alone)
        # Closed: its leave handed back all 1,000 (the log was read again by group h).
        assert await committed(broker.bootstrap, "h") == dict.fromkeys(ALL, 1)


@pytest.mark.parametrize("how", ["cooperative stop", "static member closes", "poll interval"])
async def test_every_way_a_member_gives_partitions_up_hands_back_more_than_a_frame(tmp_path, how):
    # The overflow goes by OffsetCommits, which the coordinator accepts in each of these.
    async with a_broker_with_a_record_in_each(tmp_path) as broker:
        if how == "cooperative stop":
            async with reading(
                broker, "g", session_timeout=30, rebalance_protocol="cooperative"
            ) as first:
                await consume_all(first)
                async with reading(
                    broker, "g", auto_commit=False, rebalance_protocol="cooperative"
                ) as second:
                    with trio.fail_after(20):
                        while not second.assignment or (
                            len(first.assignment) + len(second.assignment) < COUNT
                        ):
                            await trio.sleep(0.05)
                    moved = await committed(broker.bootstrap, "g")
                    assert {moved.get(tp) for tp in second.assignment} == {1}
                    assert set(second.assignment.values()) == {1}
            return
        if how == "static member closes":
            async with reading(broker, "g", session_timeout=30, instance_id="one") as member:
                await consume_all(member)
        else:
            async with reading(broker, "g", session_timeout=30, max_poll_interval=1) as member:
                await consume_all(member)  # then it asks for nothing: it leaves
                with trio.fail_after(20):
                    while member.state != "UNJOINED":
                        await trio.sleep(0.05)
        assert await committed(broker.bootstrap, "g") == dict.fromkeys(ALL, 1)


async def test_commits_and_lookups_of_more_partitions_than_one_frame_holds(tmp_path):
    offsets = {tp: 7 for tp in ALL}
    async with open_broker(tmp_path, max_frame_size=FRAME, max_partitions=COUNT) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic(TOPIC, COUNT)
        # A standalone committer learns the broker's frame from its refusals.
        async with open_consumer(
            broker.bootstrap, "alone", partitions=ALL, auto_commit=False
        ) as consumer:
            await consumer.commit(offsets)
            assert await consumer.committed() == offsets
        # A member knows it from its join.
        async with open_consumer(
            broker.bootstrap, "member", [TOPIC], auto_commit=False, offset_reset="earliest"
        ) as consumer:
            with trio.fail_after(20):
                while len(consumer.assignment) < COUNT:
                    await trio.sleep(0.05)
            await consumer.commit(offsets)
            assert await consumer.committed() == offsets
        async with open_admin(broker.bootstrap) as admin:
            assert await admin.committed_offsets("alone", ALL) == offsets
            assert await admin.committed_offsets("member", ALL) == offsets


async def test_a_lookup_whose_answer_outgrows_the_frame_is_answered_in_pages(tmp_path):
    # Offsets committed with metadata (as Kafka clients commit them) make the answer to a
    # lookup larger than the lookup: 200 offsets of 400 bytes of metadata each, 82 KB.
    metadata = "m" * 400
    async with open_broker(tmp_path, max_frame_size=FRAME) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 200)
        host, port = broker.address
        async with open_connection(host, port) as conn:
            for first in (0, 100):
                positions = [
                    PartitionOffset("t", p, p, metadata) for p in range(first, first + 100)
                ]
                await conn.request(OffsetCommitRequest("g", "", -1, positions))
            # Named in any order, some twice (a hostile or careless client): each is
            # answered once, in order, a page at a time.
            wanted = [TopicPartition("t", p) for p in range(200)]
            asked = [*reversed(wanted), *wanted[:150]]
            answered: list[PartitionOffset] = []
            after = None
            while True:
                response = await conn.request(OffsetFetchRequest("g", asked, after))
                assert isinstance(response, OffsetFetchResponse)
                answered.extend(response.offsets)
                if response.next is None:
                    break
                after = response.next
            assert [o.tp for o in answered] == wanted
        async with open_admin(broker.bootstrap) as admin:
            assert await admin.committed_offsets("g", wanted) == {tp: tp.partition for tp in wanted}


async def test_an_assignment_larger_than_the_member_reads_is_pushed_in_parts(tmp_path):
    # A broker of an 8 MiB frame pushed 10,000 partitions of a 120-character name (1.3 MB)
    # in one StartFetchers to a member that reads 1 MiB: refused, forever.
    topic, partitions = "t" * 120, 10_000
    async with open_broker(
        tmp_path, max_frame_size=8 << 20, max_connection_bytes=32 << 20, max_partitions=partitions
    ) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic(topic, partitions)
        async with open_consumer(broker.bootstrap, "g", [topic], auto_commit=False) as consumer:
            with trio.fail_after(20):
                while len(consumer.assignment) < partitions:
                    await trio.sleep(0.05)
            await consumer.commit(dict.fromkeys(consumer.assignment, 5))
        # Nor did it page a listing to the 1 MiB its clients read: 10,000 offsets took a
        # 1.3 MB page, which the admin client refused.
        async with open_admin(broker.bootstrap) as admin:
            every = {TopicPartition(topic, p): 5 for p in range(partitions)}
            assert await admin.committed_offsets("g") == every


async def test_a_stream_commits_and_looks_up_offsets_of_more_partitions_than_a_frame_holds(
    tmp_path, caplog
):
    # A Spark streaming query over 1,000 partitions of TOPIC plans each micro-batch with
    # ListOffsets and commits its progress to a group after it: each list was refused.
    async with open_broker(tmp_path, max_frame_size=FRAME, max_partitions=COUNT) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic(TOPIC, COUNT)

        def refusals() -> int:
            return caplog.text.count("exceeds the maximum frame size")

        def stream() -> None:
            with BlockingClient(broker.bootstrap) as client:
                ends = client.list_offsets(ALL, LATEST)
                assert {tp: o.log_end for tp, o in ends.items()} == dict.fromkeys(ALL, 0)
                learnt = refusals()
                for batch in (1, 2):  # (one client per commit, as a micro-batch has)
                    with BlockingClient(broker.bootstrap) as committer:
                        commit_forward(committer, "stream", dict.fromkeys(ALL, batch))
                    # Each micro-batch's client learnt the broker's frame again, refused
                    # once more (a connection closed, a broker WARNING) at every batch.
                    assert refusals() == learnt
                assert client.committed("stream") == dict.fromkeys(ALL, 2)

        await trio.to_thread.run_sync(stream)
        async with open_admin(broker.bootstrap) as admin:
            assert len(await admin.list_offsets(ALL)) == COUNT


async def test_lag_reset_and_delete_of_a_group_of_more_partitions_than_one_frame_holds(tmp_path):
    # `trio-coord groups lag` asked each broker for the log ends of all the group's
    # partitions in one ListOffsets (an answer entry is larger than its request's).
    async with a_broker_with_a_record_in_each(tmp_path) as broker:
        async with open_consumer(broker.bootstrap, "g", partitions=ALL, auto_commit=False) as c:
            await c.commit(dict.fromkeys(ALL, 0))
        async with open_admin(broker.bootstrap) as admin:
            lag = await admin.group_lag("g")
            # A reset is one request (a running group restarts once): it says what to do.
            with pytest.raises(FrameTooLargeError, match="reset them in several calls"):
                await admin.reset_offsets("g", dict.fromkeys(ALL, 1))
            await admin.delete_offsets("g", ALL)  # (in parts)
            assert await admin.committed_offsets("g") == {}
    assert [(row.partition, row.lag) for row in lag] == [(p, 1) for p in range(COUNT)]
