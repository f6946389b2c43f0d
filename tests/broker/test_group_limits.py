"""Group limits: the first rebalance waits for the burst of joins, groups have a maximum
size, and a new member is given its id before it is admitted.

On Trio's virtual clock with fake members: a group coming to life rebalances
once for a burst of joins (each join re-arms ``initial_rebalance_delay``, up
to the members' rebalance timeout), while a living group rebalances at once;
a join past ``max_group_size`` is refused with a message saying so; a join
without a member id gets one and must join again with it; an id never used
expires soon (at most ``PENDING_JOIN_TIMEOUT``), and the ids waiting are at
most the group's maximum size (the oldest is forgotten past it), so retried
first steps neither fill memory nor lock real members out. A member may not
ask for a rebalance or session timeout above the broker's bounds: one that
never answers holds its group's rebalance for its rebalance timeout, and its
partitions from everyone else for its session timeout.
"""

from __future__ import annotations

import contextlib

import pytest
import trio

from trio_coord import (
    GroupMaxSizeReachedError,
    InvalidRebalanceTimeoutError,
    InvalidSessionTimeoutError,
    UnknownMemberError,
)
from trio_coord.broker.group import PENDING_JOIN_TIMEOUT
from trio_coord.protocol.errors import CoordError
from trio_coord.protocol.messages import PartitionOffset
from trio_coord.protocol.sizing import in_parts

from .harness import FakeMember, Recorder, connected, ephemeral_broker

S = 10.0
R = 5.0


def fakes(broker, *names):
    return [
        FakeMember(broker, "g", ["t"], session_timeout=S, rebalance_timeout=R, name=n)
        for n in names
    ]


async def join_at(member: FakeMember, when: float) -> None:
    await trio.sleep_until(when)
    await member.join()


async def test_a_new_group_waits_for_the_burst_of_joins(autojump_clock):
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, initial_rebalance_delay=1.0) as broker:
        await broker.topics.create_topic("t", 6)
        a, b, c, d = fakes(broker, "a", "b", "c", "d")
        async with connected(a), connected(b), connected(c), connected(d):
            async with trio.open_nursery() as nursery:
                for member, when in ((a, 0.0), (b, 0.5), (c, 1.2)):
                    nursery.start_soon(join_at, member, when)
            first = await rec.wait_for("rebalance_started")
            assert (first["time"], first["members"]) == (2.2, 3)  # 1.0 after the last join
            assert rec.all("initial_delay")[0]["until"] == 1.0
            stable = await rec.wait_for("stable")
            assert stable["generation"] == 1 and len(set(stable["ownership"].values())) == 3
            # A living group does not wait.
            await trio.sleep_until(3.0)
            mark = rec.mark()
            await d.join()
            assert (await rec.wait_for("rebalance_started", since=mark))["time"] == 3.0


async def test_the_initial_delay_ends_at_the_rebalance_timeout_however_many_join(autojump_clock):
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, initial_rebalance_delay=1.0) as broker:
        await broker.topics.create_topic("t", 6)
        members = fakes(broker, *"abcdef")
        async with connected(members[0]) as first:
            await first.join()
            async with trio.open_nursery() as nursery:
                for i, member in enumerate(members[1:], start=1):
                    nursery.start_soon(connected_join_at, member, 0.9 * i, rec)
                started = await rec.wait_for("rebalance_started")
                assert started["time"] == R  # the joins kept coming: capped at R
                nursery.cancel_scope.cancel()


async def test_a_burst_that_outlasts_a_rebalance_is_taken_in_by_one_more(autojump_clock):
    # A fleet starting together whose joins paused once (a loaded load process, seen at
    # 18,500 members): the first generation starts with part of it. The joins that keep
    # arriving while a rebalance runs (each stop takes 0.25 s here) then wait for the
    # burst to end, as a new group's do, instead of making one eager rebalance of
    # everyone per rebalance they overlap (11 to 76 generations were seen).
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, initial_rebalance_delay=0.2) as broker:
        await broker.topics.create_topic("t", 12)
        members = fakes(broker, *(f"m{i}" for i in range(10)))
        for member in members:
            member.stop_delay = 0.25
        times = [0.0] + [0.5 + 0.1 * i for i in range(9)]  # the last at 1.3
        async with trio.open_nursery() as nursery:
            for member, when in zip(members, times, strict=True):
                nursery.start_soon(connected_join_at, member, when, rec)
            await rec.wait_for("stable", generation=1)
            second = await rec.wait_for("stable", generation=2)
            assert len(set(second["ownership"].values())) < 10  # joins went on meanwhile
            third = await rec.wait_for("stable", generation=3)
            assert len(set(third["ownership"].values())) == 10  # all the rest at once
            started = rec.all("rebalance_started")
            assert started[-1]["time"] >= 1.3 + 0.2  # after the burst ended
            await trio.sleep(2.0)
            assert len(rec.all("stable")) == 3
            nursery.cancel_scope.cancel()


async def connected_join_at(member: FakeMember, when: float, rec: Recorder) -> None:
    async with connected(member):
        await join_at(member, when)
        await trio.sleep_forever()


async def test_a_join_past_the_maximum_group_size_is_refused(autojump_clock):
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, max_group_size=2) as broker:
        await broker.topics.create_topic("t", 2)
        a, b, c = fakes(broker, "a", "b", "c")
        async with connected(a), connected(b), connected(c):
            await a.join()
            await b.join()
            with pytest.raises(
                GroupMaxSizeReachedError, match="group g has reached its maximum size of 2"
            ):
                await c.join()
            await rec.wait_for("stable", generation=2)
            assert len(rec.all("joined")) == 2


async def test_a_new_member_gets_an_id_and_must_join_again_with_it(autojump_clock):
    rec = Recorder()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        a, b = fakes(broker, "a", "b")
        async with connected(a), connected(b):
            first = await a.join_once()
            assert first.rejoin and first.member_id.startswith("a-")
            assert rec.all("joined") == []  # not a member yet
            with pytest.raises(UnknownMemberError):
                await a.heartbeat()
            second = await a.join_once()
            assert (second.member_id, second.rejoin) == (first.member_id, False)
            await rec.wait_for("stable", generation=1)
            # An id handed out and never used expires (here with the rebalance timeout).
            given = await b.join_once()
            assert given.rejoin
            await trio.sleep(R)
            with pytest.raises(UnknownMemberError, match="rejoin with an empty member id"):
                await b.join_once()


async def test_unfinished_first_steps_lock_no_one_out_of_a_group(autojump_clock):
    """A client that retries the first step of a join and never comes back: its ids
    expire within PENDING_JOIN_TIMEOUT (not at the 300 s it asked for), and meanwhile
    a real member's first step evicts the oldest of them rather than being refused."""
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, max_group_size=3) as broker:
        await broker.topics.create_topic("t", 2)
        retrier = FakeMember(
            broker, "g", ["t"], session_timeout=300.0, rebalance_timeout=300.0, name="r"
        )
        (real,) = fakes(broker, "real")
        async with connected(retrier), connected(real):
            given = []
            for _ in range(3):
                retrier.member_id = ""
                given.append((await retrier.join_once()).member_id)
            response = await real.join()  # the group is full of pending ids, and empty
            assert not response.rejoin
            await rec.wait_for("stable", generation=1)
            retrier.member_id = given[0]  # the oldest made room
            with pytest.raises(UnknownMemberError, match="rejoin with an empty member id"):
                await retrier.join_once()
            await trio.sleep(PENDING_JOIN_TIMEOUT)  # the others expired, long before 300s
            for member_id in given[1:]:
                retrier.member_id = member_id
                with pytest.raises(UnknownMemberError, match="rejoin with an empty member id"):
                    await retrier.join_once()


def test_a_negative_initial_delay_is_refused():
    from trio_coord.broker.server import BrokerConfig

    with pytest.raises(ValueError, match="initial_rebalance_delay must not be negative"):
        BrokerConfig(initial_rebalance_delay=-1.0).validate()


async def test_a_rogue_rebalance_timeout_is_refused_and_the_bound_holds(autojump_clock):
    """A JoinGroup asking to be waited for 292 million years used to hold its group in
    STOPPING for ever; now it is refused, and a member at the bound that never answers
    holds a rebalance exactly ``max_rebalance_timeout``, then is expelled."""
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, max_rebalance_timeout=60.0) as broker:
        await broker.topics.create_topic("t", 4)
        healthy, newcomer = fakes(broker, "healthy", "newcomer")
        rogue = FakeMember(broker, "g", ["t"], session_timeout=S, rebalance_timeout=1.0, name="r")
        async with connected(healthy), connected(rogue), connected(newcomer):
            rogue.rebalance_timeout = 9_223_372_036_854_775 / 1000
            with pytest.raises(InvalidRebalanceTimeoutError, match=r"\(0s, 60s\].*--max-rebalance"):
                await rogue.join()
            rogue.session_timeout = 3600.0
            with pytest.raises(InvalidSessionTimeoutError, match=r"300s\]"):
                await rogue.join()
            rogue.rebalance_timeout, rogue.session_timeout = 60.0, S  # at the bounds: admitted
            await rogue.join()
            await healthy.join()
            await rec.wait_for("stable", generation=2)
            async with trio.open_nursery() as nursery:

                async def keep_alive(member: FakeMember) -> None:
                    while True:
                        await trio.sleep(1.0)
                        with contextlib.suppress(CoordError):
                            await member.heartbeat()

                for member in (rogue, healthy, newcomer):
                    nursery.start_soon(keep_alive, member)
                rogue.hold_stop = True  # it will never answer StopFetchers, yet stays connected
                await trio.sleep_until(10.0)
                mark = rec.mark()
                await newcomer.join()
                expelled = await rec.wait_for("removed", since=mark, member_id=rogue.member_id)
                assert expelled["time"] == 10.0 + 60.0  # held exactly the bound, not for ever
                stable = await rec.wait_for("stable", since=mark)
                owners = set(stable["ownership"].values())
                assert owners == {healthy.member_id, newcomer.member_id}
                nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("said", "reads"),
    [(0, 64 * 1024), (-1, 64 * 1024), (64 * 1024, 64 * 1024), (1 << 40, 1024 * 1024)],
    ids=["zero", "negative", "64KiB", "a-terabyte"],
)
async def test_the_frame_a_member_says_it_reads_cuts_its_pushes_within_bounds(
    autojump_clock, said, reads
):
    # A member's join says the largest frame it reads, and its assignment is pushed in
    # parts of half of it. Taken as said, 0 or less would have cut 3,000 partitions into
    # a push each, and a terabyte would have been pushed past the broker's own frame: it
    # takes at least 64 KiB (a consumer's least fetch_max_bytes) and at most its own.
    topic = "t" * 40
    async with ephemeral_broker() as broker:
        await broker.topics.create_topic(topic, 3000)
        member = FakeMember(broker, "g", [topic], session_timeout=S, rebalance_timeout=R)
        member.frame = said
        async with connected(member):
            await member.join()
            with trio.fail_after(S):
                while len(member.owned) < 3000:
                    await trio.sleep(0.01)
            offsets = [PartitionOffset(topic, p, 0) for p in range(3000)]
            assert member.start_requests == len(list(in_parts(offsets, reads // 2)))
            assert member.start_requests == (1 if reads > 64 * 1024 else 5)
