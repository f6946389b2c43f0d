"""What a closed connection costs a group, asserted exactly on Trio's virtual clock.

A member whose connection closes is failed at that moment: an idle group
rebalances at once, and a rebalance in flight restarts at once without it
(the fail-fast promise). What it may still be fetching stays fenced until its
lease has certainly run out (invariant 1), but only those partitions: the
other members start everything else at once, each fenced partition when its
own fence ends. A member that had acknowledged its stop leaves no fence at
all. And what a member may ask for is bounded, whatever the integer it sends.
"""

from __future__ import annotations

import pytest
import trio

from trio_coord import InvalidRebalanceTimeoutError, InvalidSessionTimeoutError
from trio_coord.protocol import JoinGroupRequest, JoinGroupResponse
from trio_coord.protocol.errors import InvalidRequestError

from .harness import FakeMember, Recorder, Timeline, connected, ephemeral_broker
from .test_rebalance_timing import heartbeat_at, join_one_by_one

S = 10.0
R = 5.0


async def test_an_idle_member_lost_with_a_long_session_fences_only_its_own_partitions(
    autojump_clock,
):
    """A member with the longest session the broker allows (300 s) takes half the
    partitions and its connection closes. The group rebalances at that moment; the
    healthy member restarts its own partitions at once and gets the lost member's
    when that member's lease ends, not a partition earlier and not all of them later."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:  # max_session_timeout: 300 s
        await broker.topics.create_topic("t", 4)
        healthy = FakeMember(broker, "g", ["t"], session_timeout=S, timeline=timeline, name="h")
        rogue = FakeMember(broker, "g", ["t"], session_timeout=300.0, timeline=timeline, name="r")
        async with connected(healthy), connected(rogue), trio.open_nursery() as nursery:
            await join_one_by_one(rec, healthy, rogue)
            kept, lost = list(healthy.owned), list(rogue.owned)
            assert len(kept) == len(lost) == 2
            nursery.start_soon(heartbeat_at, healthy, [x + 0.5 for x in range(400)])
            await heartbeat_at(rogue, [1.5])
            await trio.sleep_until(2.0)
            mark = rec.mark()
            await rogue.crash()
            removed = await rec.wait_for("removed", since=mark, member_id=rogue.member_id)
            assert (removed["time"], removed["reason"]) == (2.0, "lost its connection")
            assert removed["fenced_until"] == 1.5 + 300.0  # its last heartbeat + its session
            assert (await rec.wait_for("rebalance_started", since=mark))["time"] == 2.0
            first = await rec.wait_for("started", since=mark, member_id=healthy.member_id)
            assert first["time"] == 2.0  # its own partitions do not wait for the fence
            assert first["partitions"] == [f"{tp.topic}-{tp.partition}" for tp in kept]
            stable = await rec.wait_for("stable", since=mark)
            assert stable["time"] == 1.5 + 300.0  # the lost ones, once the lease has ended
            assert set(stable["ownership"].values()) == {healthy.member_id}
            assert sorted(healthy.owned) == sorted(kept + lost)
            nursery.cancel_scope.cancel()
        # Cut off rather than dead, the rogue may fetch until its lease ends: no overlap.
        timeline.stop_at(rogue.member_id, removed["fenced_until"])
        assert timeline.overlaps() == []


async def test_a_connection_lost_after_the_stop_was_acknowledged_leaves_no_fence(
    autojump_clock,
):
    """Mid-rebalance, b acknowledges its stop and then its connection closes: the
    rebalance restarts at that moment without b, and since b said it stopped, its
    partitions move at once; nobody waits for b's lease."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 6)
        a, b, c = (
            FakeMember(broker, "g", ["t"], session_timeout=S, rebalance_timeout=R, name=n)
            for n in "abc"
        )
        for member in (a, b, c):
            member.timeline = timeline
        async with connected(a), connected(b), connected(c), trio.open_nursery() as nursery:
            await join_one_by_one(rec, a, b)
            nursery.start_soon(heartbeat_at, a, [x + 0.5 for x in range(30)])
            nursery.start_soon(heartbeat_at, b, [0.5, 1.5, 2.5])
            await trio.sleep_until(2.0)
            a.hold_stop = True  # holds this rebalance in STOPPING; b answers at once
            mark = rec.mark()
            await c.join()
            nursery.start_soon(heartbeat_at, c, [x + 2.5 for x in range(30)])
            await trio.sleep_until(3.0)
            assert [t for t, what in b.pushes if what == "stop"][-1] == 2.0
            a.hold_stop = False  # a answers the next StopFetchers
            await b.crash()
            removed = await rec.wait_for("removed", since=mark, member_id=b.member_id)
            assert (removed["time"], removed["fenced_until"]) == (3.0, None)
            stable = await rec.wait_for("stable", since=mark)
            restarted = rec.all("rebalance_started", since=mark)
            assert [e["time"] for e in restarted] == [2.0, 3.0]
            assert stable["time"] == 3.0  # not b's lease end (2.5 + S)
            assert set(stable["ownership"].values()) == {a.member_id, c.member_id}
            nursery.cancel_scope.cancel()
        assert timeline.overlaps() == []


async def _join_with(member: FakeMember, session_ms: int, rebalance_ms: int) -> JoinGroupResponse:
    assert member.conn is not None
    response = await member.conn.request(
        JoinGroupRequest(member.group, "", member.topics, session_ms, rebalance_ms, ["range"])
    )
    assert isinstance(response, JoinGroupResponse)
    return response


@pytest.mark.parametrize(
    ("session_ms", "rebalance_ms", "error", "message"),
    [
        (10_000, 9_223_372_036_854_775, InvalidRebalanceTimeoutError, r"--max-rebalance-timeout"),
        (10_000, 2**64 - 1, InvalidRebalanceTimeoutError, r"\(0s, 300s\]"),
        (10_000, 0, InvalidRebalanceTimeoutError, r"rebalance timeout 0s"),
        (10_000, -(2**63), InvalidRebalanceTimeoutError, r"rebalance timeout -9\.22"),
        (2**64 - 1, 5_000, InvalidSessionTimeoutError, r"--max-session-timeout"),
        (-(2**63), 5_000, InvalidSessionTimeoutError, r"session timeout -9\.22"),
    ],
)
async def test_every_timeout_a_join_carries_is_bounded(
    autojump_clock, session_ms, rebalance_ms, error, message
):
    """The extremes msgpack can carry in an int field are refused with the bound and
    the flag to change it, and the group (and the broker) carry on."""
    rec = Recorder()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        healthy = FakeMember(broker, "g", ["t"], name="h")
        rogue = FakeMember(broker, "g", ["t"], name="r")
        async with connected(healthy), connected(rogue):
            await healthy.join()
            with pytest.raises(error, match=message):
                await _join_with(rogue, session_ms, rebalance_ms)
            assert (await rec.wait_for("stable"))["generation"] == 1
            assert rec.all("joined") == [
                {"group": "g", "time": 0.0, "member_id": healthy.member_id}
            ]


async def test_the_names_a_join_brings_are_bounded(autojump_clock):
    async with ephemeral_broker() as broker:
        await broker.topics.create_topic("t", 2)
        member = FakeMember(broker, "g", ["t"], name="x" * 250)
        async with connected(member):
            with pytest.raises(InvalidRequestError, match="is 250 characters, more than the 249"):
                await member.join()
            member.name = "ok"
            member.assignors = ["range"] * 33
            with pytest.raises(InvalidRequestError, match="at most 32 assignors"):
                await member.join()
            member.assignors = ["range"]
            member.rack = "r" * 250
            with pytest.raises(InvalidRequestError, match=r"rack 'rrr.*is 250 characters"):
                await member.join()
            member.rack = "r1"
            await member.join()
