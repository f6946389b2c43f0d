"""DescribeGroup of a group larger than a frame: members, then offsets, a page at a time.

A group of thousands of members, or one member owning thousands of
partitions, once described in a single answer would outgrow the frame and
fail ``groups describe`` for good. Here, with a 64 KiB frame: a member that
owns 4,000 partitions is cut between pages, 31 members with long
subscriptions take several pages, offsets follow the members, and the
admin client joins it all back into exactly the group as it is.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio

from trio_coord import TopicPartition, open_admin, open_broker, open_consumer
from trio_coord.broker.paging import page_members
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.errors import GroupNotFoundError, InvalidTopicError
from trio_coord.protocol.framing import FrameCodec
from trio_coord.protocol.messages import (
    DeleteOffsetsRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupDescription,
    JoinGroupRequest,
    MemberCursor,
    MemberDescription,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    Response,
)
from trio_coord.protocol.sizing import encoded_size, in_parts

from .harness import FakeMember, connected

FRAME = 64 * 1024
PARTITIONS = 4000
LONG = [f"{i:02d}-" + "x" * 237 for i in range(60)]  # ~14.6 KB of subscription


async def _settled(admin, members: list[FakeMember]) -> GroupDescription:
    """Wait until the group is stable with every member in it and every partition owned."""
    with trio.fail_after(30):
        while True:
            group = await admin.describe_group("g")
            owned = sum(len(m.partitions) for m in group.members)
            if group.state == "STABLE" and len(group.members) == len(members):
                if owned == PARTITIONS:
                    return group
            await trio.sleep(0.05)


async def _raw_pages(address: tuple[str, int]) -> list[DescribeGroupResponse]:
    """Every page a raw client gets, checking that each fits the frame."""
    pages: list[DescribeGroupResponse] = []
    request = DescribeGroupRequest("g")
    async with open_connection(*address) as conn:
        while True:
            answer = await conn.request(request)
            assert isinstance(answer, DescribeGroupResponse)
            assert len(FrameCodec(2**30).encode(Response(1, 0, "", answer))) <= FRAME
            pages.append(answer)
            if answer.members_next is not None:
                request = DescribeGroupRequest("g", members_after=answer.members_next)
            elif answer.offsets_next is not None:
                request = DescribeGroupRequest("g", offsets_after=answer.offsets_next)
            else:
                return pages


async def test_a_group_larger_than_a_frame_is_described_a_page_at_a_time(tmp_path: Path) -> None:
    settings = dict(max_frame_size=FRAME, max_partitions=10_000, initial_rebalance_delay=0.0)
    async with open_broker(tmp_path, port=0, **settings) as broker:  # type: ignore[arg-type]
        async with open_admin(broker.bootstrap) as admin, contextlib.AsyncExitStack() as stack:
            await admin.create_topic("wide", PARTITIONS)
            async with open_connection(*broker.address) as conn:  # offsets, before any member
                committed = [PartitionOffset("wide", p, p, "m" * 100) for p in range(600)]
                for first in range(0, len(committed), 100):
                    await conn.request(OffsetCommitRequest("g", "", -1, committed[first:][:100]))

            # One member owns all 4,000 partitions: more than a page on its own.
            alone = FakeMember(broker, "g", ["wide"], session_timeout=60, name="alone")
            await stack.enter_async_context(connected(alone))
            await alone.join()
            group = await _settled(admin, [alone])
            assert group.members[0].partitions == [
                TopicPartition("wide", p) for p in range(PARTITIONS)
            ]
            pages = await _raw_pages(broker.address)
            assert len(pages) > 2
            assert all(len(p.group.members) == 1 for p in pages if p.members_next)
            assert [o.offset for o in group.offsets] == list(range(600))

            # 30 more, each with a long subscription: the members take several pages.
            others = [
                FakeMember(broker, "g", ["wide", *LONG], session_timeout=60, name=f"m{i}")
                for i in range(30)
            ]
            for member in others:
                await stack.enter_async_context(connected(member))
            async with trio.open_nursery() as nursery:
                for member in others:
                    nursery.start_soon(member.join)
            everyone = [alone, *others]
            group = await _settled(admin, everyone)

            pages = await _raw_pages(broker.address)
            assert sum(1 for p in pages if p.members_next) >= 5
            owners: dict[TopicPartition, str] = {}
            for member in group.members:
                for tp in member.partitions:
                    assert tp not in owners, f"{tp} described twice"
                    owners[tp] = member.member_id
            assert len(owners) == PARTITIONS
            assert sorted(m.member_id for m in group.members) == sorted(
                m.member_id for m in everyone
            )
            long_ones = [m for m in group.members if m.member_id != alone.member_id]
            assert all(m.topics == sorted(["wide", *LONG]) for m in long_ones)
            assert [o.offset for o in group.offsets] == list(range(600))


async def test_a_subscription_too_large_to_describe_on_one_page_is_refused(
    tmp_path: Path,
) -> None:
    names = [f"{i:03d}-" + "y" * 236 for i in range(80)]  # ~19.5 KB > a quarter of 64 KiB
    async with open_broker(tmp_path, port=0, max_frame_size=FRAME) as broker:
        async with open_connection(*broker.address) as conn:
            with trio.fail_after(10), pytest.raises(InvalidTopicError, match="quarter"):
                await conn.request(JoinGroupRequest("g", "", names, 10_000, 30_000, ["range"]))


def _member(member_id: str, partitions: int) -> MemberDescription:
    tps = [TopicPartition("t", p) for p in range(partitions)]
    return MemberDescription(member_id, "c", "h", ["t"], 10_000, 30_000, tps)


@pytest.mark.parametrize("budget", [200, 1000, 5000])
def test_member_pages_chain_without_gap_or_repeat(budget: int) -> None:
    members = [_member(f"m{i:02d}", n) for i, n in enumerate([0, 3, 400, 1, 0, 90, 7])]
    seen: list[tuple[str, TopicPartition | None]] = []
    after: MemberCursor | None = None
    while True:
        got, after, used = page_members(members, after, budget)
        assert got and (used <= budget or len(got) == 1)
        seen += [(m.member_id, tp) for m in got for tp in m.partitions or [None]]
        if after is None:
            break
    expected = [(m.member_id, tp) for m in members for tp in m.partitions or [None]]
    # A member cut exactly after its last partition may come back once with none.
    assert [s for s in seen if s[1] is not None] == [e for e in expected if e[1] is not None]
    assert {s[0] for s in seen} == {m.member_id for m in members}


@pytest.mark.parametrize("budget", [60, 600, 6000, 60_000])
def test_start_offsets_in_parts_keep_order_and_fit_the_budget(budget: int) -> None:
    """Parts of a StartFetchers: every offset once, in order, each part within the budget
    (a part of one offset may be larger); a list that fits whole is one part."""
    offsets = [PartitionOffset("t", p, p * 7, "m" * (p % 5)) for p in range(500)]
    parts = list(in_parts(offsets, budget))
    assert [o for part in parts for o in part] == offsets
    for part in parts:
        assert part and (sum(encoded_size(o) for o in part) <= budget or len(part) == 1)
    fits_whole = sum(encoded_size(o) for o in offsets) <= budget
    assert len(parts) == 1 if fits_whole else len(parts) > 1
    assert list(in_parts([], budget)) == [[]]


@pytest.mark.parametrize("protocol", ["eager", "cooperative"])
async def test_an_assignment_larger_than_a_frame_reaches_a_consumer_in_parts(
    tmp_path: Path, protocol: str
) -> None:
    # 4,000 partitions with their offsets are ~60 KB of StartFetchers: more than half of
    # the 64 KiB frame, so the assignment comes in parts and the consumer joins them.
    async with open_broker(tmp_path, port=0, max_frame_size=FRAME, max_partitions=10_000) as b:
        async with open_admin(b.bootstrap) as admin:
            await admin.create_topic("wide", PARTITIONS)
        opts = dict(rebalance_protocol=protocol, session_timeout=10.0)
        async with open_consumer(b.bootstrap, "g", ["wide"], **opts) as first:  # type: ignore[arg-type]
            with trio.fail_after(30):
                assigned = await first.wait_assigned()
            assert sorted(assigned) == [TopicPartition("wide", p) for p in range(PARTITIONS)]
            async with open_consumer(b.bootstrap, "g", ["wide"], **opts) as second:  # type: ignore[arg-type]
                with trio.fail_after(30):
                    while len(first.assignment) + len(second.assignment) != PARTITIONS or not (
                        first.assignment and second.assignment
                    ):
                        await trio.sleep(0.02)
                assert not set(first.assignment) & set(second.assignment)


@pytest.mark.parametrize("kind", ["offset-fetch", "describe"])
async def test_offsets_paged_while_commits_go_on_are_each_listed_once(
    tmp_path: Path, kind: str
) -> None:
    # A page lists the offsets after the last one of the page before, from an order kept
    # until a partition comes or goes: commits between pages (a new partition before the
    # cursor and one after, a recommit, a partition forgotten) lose none at a page's edge
    # and repeat none. An unknown group has no offsets for OffsetFetch, as before, and is
    # not found by DescribeGroup.
    settings = dict(max_frame_size=FRAME, max_partitions=10_000)
    async with open_broker(tmp_path, port=0, **settings) as broker:  # type: ignore[arg-type]
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("wide", PARTITIONS)
        async with open_connection(*broker.address) as conn:

            async def commit(*offsets: tuple[int, int]) -> None:
                batch = [PartitionOffset("wide", p, o, "m" * 100) for p, o in offsets]
                await conn.request(OffsetCommitRequest("g", "", -1, batch))

            for first in range(0, 2000, 200):  # the even partitions below 4,000
                await commit(*((p, p) for p in range(2 * first, 2 * first + 400, 2)))
            listed: list[PartitionOffset] = []
            cursor: TopicPartition | None = None
            before: set[int] = set()  # added behind the cursor: not this listing's
            after: set[int] = set()  # added or recommitted ahead of it: listed, as they are
            forgotten: set[int] = set()
            while True:
                if kind == "offset-fetch":
                    fetched = await conn.request(OffsetFetchRequest("g", after=cursor))
                    assert isinstance(fetched, OffsetFetchResponse)
                    page, cursor = fetched.offsets, fetched.next
                else:
                    described = await conn.request(DescribeGroupRequest("g", offsets_after=cursor))
                    assert isinstance(described, DescribeGroupResponse)
                    page, cursor = described.group.offsets, described.offsets_next
                listed += page
                if cursor is None:
                    break
                edge = cursor.partition
                await commit((edge - 1, 7_000_000), (edge + 1, 1), (edge + 2, 5_000_000))
                before.add(edge - 1)
                after.update((edge + 1, edge + 2))
                if len(before) % 2:  # (every other page: a page after only commits too)
                    await conn.request(
                        DeleteOffsetsRequest("g", [TopicPartition("wide", edge + 4)])
                    )
                    forgotten.add(edge + 4)
            assert len(before) > 3  # (pages)
            tps = [(o.topic, o.partition) for o in listed]
            assert tps == sorted(set(tps))  # in order, none twice
            got = {o.partition: o.offset for o in listed}
            expected = {p: p for p in range(0, 4000, 2)}
            expected.update((p, 1 if p % 2 else 5_000_000) for p in after)
            for p in forgotten:
                expected.pop(p, None)
            assert not before & expected.keys()  # (edges are committed partitions)
            assert got == expected

            answer = await conn.request(OffsetFetchRequest("nobody"))
            assert isinstance(answer, OffsetFetchResponse)
            assert answer.offsets == [] and answer.next is None
            with pytest.raises(GroupNotFoundError):
                await conn.request(DescribeGroupRequest("nobody"))
