"""Cooperative incremental rebalancing: only what moves stops, and never two owners at once.

The fake members record, as they see it, when they owned which partition
(``Timeline``) and every StopFetchers they got; the broker runs on Trio's
virtual clock. The promises: a member gets a StopFetchers only if it gives
partitions up, and it names exactly those; every partition that stays put is
owned without a break through the rebalance; a moving partition starts on
its new owner only after its old owner acknowledged the stop, or after the
old owner's lease ended if it died; and the real consumer's listeners hear
only of the moving partitions.
"""

from __future__ import annotations

import pytest
import trio

from trio_coord import (
    ConsumerState,
    IllegalGenerationError,
    PartitionNotOwnedError,
    TopicPartition,
    open_admin,
    open_broker,
    open_consumer,
    open_producer,
)
from trio_coord.protocol import OffsetCommitRequest, PartitionOffset

from .harness import (
    FakeMember,
    Recorder,
    Timeline,
    connected,
    ephemeral_broker,
    heartbeat_forever,
    join_one_by_one,
)

S = 10.0
R = 5.0


def coop(broker, timeline, *names, topics=("t",)):
    return [
        FakeMember(
            broker,
            "g",
            list(topics),
            session_timeout=S,
            rebalance_timeout=R,
            timeline=timeline,
            name=name,
            protocol="cooperative",
            assignors=["uniform"],
        )
        for name in names
    ]


def unbroken(timeline: Timeline, member: FakeMember, tp: TopicPartition, since: float) -> bool:
    """True if ``member`` has owned ``tp`` in one interval from before ``since`` until now."""
    mine = [i for i in timeline.intervals if i.member == member.member_id and i.tp == tp]
    return len(mine) == 1 and mine[0].start < since and mine[0].end is None


async def test_a_join_stops_only_the_partitions_that_move(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 30)
        a, b, c, d = coop(broker, timeline, "a", "b", "c", "d")
        async with connected(a), connected(b), connected(c), connected(d):
            await join_one_by_one(rec, a, b, c)
            assert sorted(len(m.owned) for m in (a, b, c)) == [10, 10, 10]
            before = {m.name: set(m.owned) for m in (a, b, c)}
            for m in (a, b, c):
                m.stops.clear()
            await trio.sleep(1.0)
            mark = rec.mark()
            await d.join()
            stable = await rec.wait_for("stable", since=mark)
            assert stable["time"] == 1.0  # nobody had to wait for anything

            # Balanced (30 over 4), and only the joiner's share moved.
            assert sorted(len(m.owned) for m in (a, b, c, d)) == [7, 7, 8, 8]
            moved = set(d.owned)
            assert all(tp in before["a"] | before["b"] | before["c"] for tp in moved)
            for m in (a, b, c):
                lost = sorted(before[m.name] - set(m.owned))
                assert set(m.owned) <= before[m.name]  # nothing new for the old members
                # One StopFetchers naming exactly what it gave up, or none at all.
                assert [tps for _, tps in m.stops] == ([lost] if lost else [])
                for tp in m.owned:  # what stayed was never stopped
                    assert unbroken(timeline, m, tp, since=1.0)
            assert d.stops == []  # the joiner loses nothing and is never stopped
            assert [e["member_id"] for e in rec.all("started", since=mark)]  # all started
        assert timeline.overlaps() == []


async def test_a_leave_stops_no_one_else(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 30)
        a, b, c = coop(broker, timeline, "a", "b", "c")
        async with connected(a), connected(b), connected(c):
            await join_one_by_one(rec, a, b, c)
            kept = {m.name: set(m.owned) for m in (a, b)}
            leaving = set(c.owned)
            for m in (a, b):
                m.stops.clear()
            await trio.sleep(1.0)
            mark = rec.mark()
            await c.leave()
            await rec.wait_for("stable", since=mark)
            for m in (a, b):
                assert m.stops == []  # not losing anything: never stopped
                assert kept[m.name] <= set(m.owned)
                for tp in kept[m.name]:
                    assert unbroken(timeline, m, tp, since=1.0)
            assert set(a.owned) | set(b.owned) == kept["a"] | kept["b"] | leaving
            assert sorted(len(m.owned) for m in (a, b)) == [15, 15]
        assert timeline.overlaps() == []


async def test_a_crashed_members_partitions_wait_for_its_lease_and_nothing_else_does(
    autojump_clock,
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 12)
        a, b, c = coop(broker, timeline, "a", "b", "c")
        async with connected(a), connected(b), connected(c), trio.open_nursery() as nursery:
            await join_one_by_one(rec, a, b, c)
            # c's join at t=0 is its last word: its lease ends at t=S. a and b live on.
            nursery.start_soon(heartbeat_forever, a, 1.0)
            nursery.start_soon(heartbeat_forever, b, 1.0)
            kept = {m.name: set(m.owned) for m in (a, b)}
            victim = set(c.owned)
            for m in (a, b):
                m.stops.clear()
            await trio.sleep(2.0)
            mark = rec.mark()
            await c.crash()
            timeline.stop_at(c.member_id, S)  # type: ignore[attr-defined]
            removed = await rec.wait_for("removed", since=mark, member_id=c.member_id)
            assert removed["time"] == 2.0
            assert removed["fenced_until"] == S
            # a and b keep fetching all along; the victim's partitions wait for its lease.
            stable = await rec.wait_for("stable", since=mark)
            assert stable["time"] == S
            delayed = rec.all("start_delayed", since=mark)
            assert {e["until"] for e in delayed} == {S}
            for m in (a, b):
                assert m.stops == []
                for tp in kept[m.name]:
                    assert unbroken(timeline, m, tp, since=2.0)
            assert set(a.owned) | set(b.owned) == kept["a"] | kept["b"] | victim
            nursery.cancel_scope.cancel()
        assert timeline.overlaps() == []


async def test_an_untouched_member_commits_through_the_rebalance(autojump_clock):
    """Fencing still holds: a commit for a partition the member gave up is refused."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a, b = coop(broker, timeline, "a", "b")
        async with connected(a), connected(b):
            await join_one_by_one(rec, a)
            old_generation = a.generation
            b.hold_start = True  # the rebalance stays in STARTING until b acknowledges
            mark = rec.mark()
            await b.join()
            await rec.wait_for("started", since=mark, member_id=a.member_id)
            runner = broker.coordinator.runner("g")
            assert runner is not None and runner.group.state.value == "STARTING"
            kept, gone = a.owned[0], sorted(set(range(4)) - {tp.partition for tp in a.owned})
            assert a.conn is not None
            # a acknowledged the new generation and commits what it kept...
            await a.conn.request(
                OffsetCommitRequest(
                    "g", a.member_id, a.generation, [PartitionOffset("t", kept.partition, 5)]
                )
            )
            assert a.generation == old_generation + 1
            # ...but not what moved to b, with either generation.
            with pytest.raises(PartitionNotOwnedError):
                await a.conn.request(
                    OffsetCommitRequest(
                        "g", a.member_id, a.generation, [PartitionOffset("t", gone[0], 5)]
                    )
                )
            with pytest.raises(IllegalGenerationError):
                await a.conn.request(
                    OffsetCommitRequest(
                        "g", a.member_id, old_generation, [PartitionOffset("t", gone[0], 5)]
                    )
                )


async def test_consumer_listeners_hear_only_the_moving_partitions(tmp_path):
    calls: dict[str, list[tuple[str, list[TopicPartition]]]] = {"a": [], "b": []}

    def recorder(name: str, what: str):
        return lambda tps: calls[name].append((what, list(tps)))

    def opts(name: str):
        return dict(
            session_timeout=1.0,
            rebalance_protocol="cooperative",
            on_assigned=recorder(name, "assigned"),
            on_revoked=recorder(name, "revoked"),
            on_lost=recorder(name, "lost"),
        )

    async with open_broker(tmp_path, min_session_timeout=0.05) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 6)
        async with open_consumer(broker.bootstrap, "g", ["t"], **opts("a")) as a:
            with trio.fail_after(10):
                await a.wait_state(ConsumerState.STABLE)
                while len(a.assignment) != 6:
                    await trio.sleep(0.01)
            async with open_consumer(broker.bootstrap, "g", ["t"], **opts("b")) as b:
                with trio.fail_after(10):
                    while len(b.assignment) != 3:
                        await trio.sleep(0.01)
                moved = sorted(b.assignment)
                assert calls["b"] == [("assigned", moved)]
                assert calls["a"] == [
                    ("assigned", [TopicPartition("t", p) for p in range(6)]),
                    ("revoked", moved),
                ]
                assert a.state is ConsumerState.STABLE
                assert sorted(a.assignment) == sorted(
                    set(TopicPartition("t", p) for p in range(6)) - set(moved)
                )
                async with open_admin(broker.bootstrap) as admin:
                    assert (await admin.describe_group("g")).assignor == "uniform"


async def test_a_member_that_loses_nothing_is_never_stopped(autojump_clock):
    """30 partitions over 3 members, c alone on its topic: when d joins on the other
    topic, a and b give up d's share and c, which keeps everything, hears nothing."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 24)
        await broker.topics.create_topic("u", 6)
        a, b, d = coop(broker, timeline, "a", "b", "d", topics=("t",))
        (c,) = coop(broker, timeline, "c", topics=("u",))
        async with connected(a), connected(b), connected(c), connected(d):
            await join_one_by_one(rec, a, b, c)
            assert [len(m.owned) for m in (a, b, c)] == [12, 12, 6]
            before = {m.name: set(m.owned) for m in (a, b, c)}
            for m in (a, b, c):
                m.stops.clear()
            pushes_to_c = len(c.pushes)
            await trio.sleep(1.0)
            mark = rec.mark()
            await d.join()
            await rec.wait_for("stable", since=mark)
            assert [len(m.owned) for m in (a, b, d)] == [8, 8, 8]
            assert c.stops == [] and set(c.owned) == before["c"]
            assert [kind for _, kind in c.pushes[pushes_to_c:]] == ["start"]  # the generation
            for tp in c.owned:
                assert unbroken(timeline, c, tp, since=1.0)
            for m in (a, b):
                assert [tps for _, tps in m.stops] == [sorted(before[m.name] - set(m.owned))]
        assert timeline.overlaps() == []


async def test_an_offset_reset_makes_one_rebalance_eager(autojump_clock):
    """Every owner must restart from the reset offsets: all stop, all start afresh."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a, b = coop(broker, timeline, "a", "b")
        async with connected(a), connected(b):
            await join_one_by_one(rec, a, b)
            kept = {m.name: list(m.owned) for m in (a, b)}
            for m in (a, b):
                m.stops.clear()
            runner = broker.coordinator.runner("g")
            assert runner is not None
            mark = rec.mark()
            await runner.reset_offsets([PartitionOffset("t", p, 3) for p in range(4)])
            stable = await rec.wait_for("stable", since=mark)
            assert rec.all("rebalance_started", since=mark)[0]["cooperative"] is False
            for m in (a, b):
                assert [tps for _, tps in m.stops] == [None]  # everything stopped
                assert m.owned == kept[m.name]  # sticky all the same
                assert m.start_offsets == {tp: 3 for tp in m.owned}
            # The next change is cooperative again.
            c = coop(broker, timeline, "c")[0]
            async with connected(c):
                mark = rec.mark()
                await c.join()
                await rec.wait_for("stable", since=mark)
                assert rec.all("rebalance_started", since=mark)[0]["cooperative"] is True
            assert stable["generation"] == 3
        assert timeline.overlaps() == []


async def test_records_of_kept_partitions_keep_flowing_once_each(broker):
    """Real consumers and records: through b's join, a hands out every record of the
    partitions it keeps exactly once and in order (they were never restarted), and no
    record of a partition it gave up after its ``on_revoked``."""
    async with open_admin(broker.bootstrap) as admin:
        await admin.create_topic("t", 4)
    handed: list[tuple[float, TopicPartition, int]] = []
    revoked_at: dict[TopicPartition, float] = {}

    def on_revoked(tps):
        for tp in tps:
            revoked_at[tp] = trio.current_time()

    async def consume(consumer):
        async for record in consumer:
            handed.append((trio.current_time(), record.tp, record.offset))
            await trio.sleep(0.001)

    opts = dict(session_timeout=3.0, offset_reset="earliest", rebalance_protocol="cooperative")
    async with trio.open_nursery() as nursery:
        async with open_producer(broker.bootstrap, linger=0.001) as producer:
            producing = trio.CancelScope()

            async def keep_producing():
                with producing:
                    i = 0
                    while True:
                        await producer.send("t", str(i), partition=i % 4)
                        i += 1

            nursery.start_soon(keep_producing)
            async with open_consumer(
                broker.bootstrap, "g", ["t"], on_revoked=on_revoked, **opts
            ) as a:
                nursery.start_soon(consume, a)
                await a.wait_assigned()
                await trio.sleep(0.3)
                async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as b:
                    with trio.fail_after(5):
                        while len(b.assignment) != 2 or len(a.assignment) != 2:
                            await trio.sleep(0.01)
                    await trio.sleep(0.3)
                    kept = set(a.assignment)
                    assert set(revoked_at) == set(b.assignment)  # exactly what moved
                    for tp, at in revoked_at.items():
                        late = [t for t, seen, _ in handed if seen == tp and t > at]
                        assert late == [], f"{tp} handed out after on_revoked"
                    for tp in kept:
                        offsets = [o for _, seen, o in handed if seen == tp]
                        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
                producing.cancel()  # (then the producer flushes what it holds)
            nursery.cancel_scope.cancel()
