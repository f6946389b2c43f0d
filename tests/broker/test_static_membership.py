"""Static membership: a member with an ``instance_id`` survives its own restart.

A static member that disconnects stays in the group, its partitions kept
for it, until its session expires; coming back before then (a new process,
same instance id) it gets its member id and partitions back and nobody else
hears a thing: no rebalance (unless it asks for other timeouts, which a
rebalance must record for a coordinator taking over). A second live member with the same instance id
is refused (FENCED_INSTANCE_ID) and the first keeps running. Past the
session timeout it is removed as any member would be. Fake members on Trio's
virtual clock assert the exact times; a test with real consumers checks the
client side (a static consumer closes without leaving, and comes back).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_coord import (
    FencedInstanceIdError,
    TopicPartition,
    open_admin,
    open_broker,
    open_consumer,
)
from trio_coord.core.group import Group
from trio_coord.protocol.messages import StartFetchersRequest

from .harness import FakeMember, Recorder, Timeline, connected, ephemeral_broker, heartbeat_forever

S = 10.0


def member(broker, timeline, name, instance_id=""):
    return FakeMember(
        broker,
        "g",
        ["t"],
        session_timeout=S,
        rebalance_timeout=5.0,
        timeline=timeline,
        name=name,
        instance_id=instance_id,
    )


async def a_then_b(
    rec: Recorder, nursery: trio.Nursery, a: FakeMember, b: FakeMember
) -> dict[str, Any]:
    """a joins alone (generation 1), then b (generation 2), which then heartbeats every
    second: returns generation 2's ``stable`` event."""
    await a.join()
    await rec.wait_for("stable", generation=1)
    await b.join()
    stable = await rec.wait_for("stable", generation=2)
    nursery.start_soon(heartbeat_forever, b, 1.0)
    return stable


async def test_a_static_member_back_within_its_session_resumes_without_a_rebalance(
    autojump_clock,
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 6)
        a = member(broker, timeline, "a", instance_id="host-a")
        b = member(broker, timeline, "b")
        async with connected(b), trio.open_nursery() as nursery:
            async with connected(a):
                stable = await a_then_b(rec, nursery, a, b)
                had, generation = list(a.owned), a.generation
                assert len(had) == 3
                pushes_to_b = len(b.pushes)
                await trio.sleep_until(2.0)
                mark = rec.mark()
                await a.crash()  # the process dies (or restarts)
            gone = await rec.wait_for("disconnected", since=mark, member_id=a.member_id)
            assert gone["time"] == 2.0 and gone["until"] == S  # kept for it until then
            # (If a was only cut off, it fetches until its lease ends, at S.)
            timeline.stop_at(a.member_id, S)  # type: ignore[attr-defined]
            await trio.sleep_until(6.0)
            again = member(broker, timeline, "a2", instance_id="host-a")
            async with connected(again):
                response = await again.join()  # a new process: no member id, same instance
                assert response.member_id == a.member_id and not response.rejoin
                resumed = await rec.wait_for("started", since=mark, member_id=a.member_id)
                # It did not say goodbye: its partitions wait for its former lease.
                assert resumed["time"] == S
                assert rec.all("start_delayed", since=mark)[0]["until"] == S
                assert again.owned == had and again.generation == generation
                # Nobody else heard anything: no rebalance, no push.
                assert rec.all("rebalance_started", since=mark) == []
                assert rec.all("removed", since=mark) == []
                assert len(b.pushes) == pushes_to_b
                runner = broker.coordinator.runner("g")
                assert runner is not None and runner.group.generation == stable["generation"]
                # It lives on as the same member: its heartbeats count.
                await again.heartbeat()
                nursery.cancel_scope.cancel()
        assert timeline.overlaps() == []


async def test_a_static_member_that_stepped_out_is_resumed_at_once(autojump_clock):
    """A clean restart: LeaveGroup with ``stay`` (what a static consumer sends when it
    closes) keeps its place; its successor gets the partitions the moment it joins."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 6)
        a = member(broker, timeline, "a", instance_id="host-a")
        b = member(broker, timeline, "b")
        async with connected(b), trio.open_nursery() as nursery:
            async with connected(a):
                await a_then_b(rec, nursery, a, b)
                had = list(a.owned)
                await trio.sleep_until(2.0)
                mark = rec.mark()
                await a.leave(stay=True)
            out = await rec.wait_for("stepped_out", since=mark, member_id=a.member_id)
            assert out["time"] == 2.0
            await trio.sleep_until(3.0)
            again = member(broker, timeline, "a2", instance_id="host-a")
            async with connected(again):
                await again.join()
                resumed = await rec.wait_for("started", since=mark, member_id=a.member_id)
                assert resumed["time"] == 3.0 and again.owned == had
                assert rec.all("rebalance_started", since=mark) == []
                assert rec.all("removed", since=mark) == []
            nursery.cancel_scope.cancel()
        assert timeline.overlaps() == []


class _GatedStarts(FakeMember):
    """Holds each StartFetchers until the test opens its gate (in the order they came)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gates: list[tuple[int, trio.Event]] = []

    async def handle(self, body):
        if isinstance(body, StartFetchersRequest):
            gate = trio.Event()
            self.gates.append((body.generation, gate))
            await gate.wait()
        return await super().handle(body)


async def test_a_resumed_start_acknowledged_after_a_new_generation_does_not_start_that_one(
    autojump_clock,
):
    """A resumed static member acknowledges the StartFetchers of the generation it was
    resumed in only after a rebalance made the next generation durable: that answer
    says nothing of the next one, whose own StartFetchers it has not acknowledged. Had
    it been counted as started in it, its heartbeats (of the generation it knows) would
    be refused as stale and it would be sent to rejoin."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 6)
        a = member(broker, timeline, "a", instance_id="host-a")
        b = member(broker, timeline, "b")
        async with connected(b), trio.open_nursery() as nursery:
            async with connected(a):
                await a.join()
                await rec.wait_for("stable", generation=1)
                await b.join()
                await rec.wait_for("stable", generation=2)
                await a.leave(stay=True)
            again = _GatedStarts(
                broker, "g", ["t"], session_timeout=S, rebalance_timeout=5.0, name="a2"
            )
            again.instance_id = "host-a"
            async with connected(again):
                await again.join()  # resumed in generation 2, at once
                while len(again.gates) < 1:
                    await trio.sleep(0.01)
                mark = rec.mark()
                await b.leave()  # a rebalance: generation 3, whose start a2 holds too
                while len(again.gates) < 2:
                    await trio.sleep(0.01)
                assert [g for g, _ in again.gates] == [2, 3]
                again.gates[0][1].set()  # the resumed start (generation 2) is answered
                while again.generation != 2:
                    await trio.sleep(0.01)
                await trio.sleep(0.1)
                started = [e for e in rec.all("started", since=mark) if e["generation"] == 3]
                assert started == []
                await again.heartbeat()  # generation 2: what it knows, still accepted
                again.gates[1][1].set()
                stable = await rec.wait_for("stable", since=mark, generation=3)
                assert set(stable["ownership"].values()) == {a.member_id}
            nursery.cancel_scope.cancel()
        assert timeline.overlaps() == []


@pytest.mark.parametrize("changed", ["session_timeout", "rebalance_timeout"])
async def test_a_static_member_back_with_other_timeouts_rejoins_through_a_rebalance(
    autojump_clock, changed
):
    """A resume writes no generation record, so a coordinator taking over would fence the
    member's partitions only for the session timeout in the last one: a successor that
    asks for a longer session, cut off later, would still be fetching when they move.
    Other timeouts therefore mean a rebalance, whose record carries them; loaded after a
    failover, it fences for the new session."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a = member(broker, timeline, "a", instance_id="host-a")
        a.process = "A"
        b = member(broker, timeline, "b")
        async with connected(b), trio.open_nursery() as nursery:
            async with connected(a):
                await a_then_b(rec, nursery, a, b)
                had = list(a.owned)
                mark = rec.mark()
                await a.crash()
            timeline.stop_at("A", S)  # type: ignore[attr-defined]  # cut off, not dead
            await trio.sleep_until(3.0)
            again = member(broker, timeline, "a2", instance_id="host-a")
            again.process = "A'"
            setattr(again, changed, 3 * getattr(again, changed))
            async with connected(again):
                response = await again.join()
                assert response.member_id == a.member_id
                nursery.start_soon(heartbeat_forever, again, 1.0)
                await rec.wait_for("started", since=mark, member_id=a.member_id)
                assert rec.all("resumed", since=mark) == []  # not resumed as it was
                stable = await rec.wait_for("stable", since=mark)
                assert [e["time"] for e in rec.all("rebalance_started", since=mark)] == [3.0]
                # The former process's partitions still waited for its lease to end.
                starts = [
                    e
                    for e in rec.all("started", since=mark)
                    if set(e["partitions"]) & {str(tp) for tp in had}
                ]
                assert starts and all(e["time"] >= S for e in starts)
                runner = broker.coordinator.runner("g")
                assert runner is not None and runner.group.record is not None
                record = runner.group.record
                assert record.generation == stable["generation"] == 3
                (persisted,) = [m for m in record.members if m.member_id == a.member_id]
                assert persisted.session_timeout_ms == round(again.session_timeout * 1000)
                assert persisted.rebalance_timeout_ms == round(again.rebalance_timeout * 1000)
                # A coordinator taking over at 50 fences its partitions for its new session.
                successor = Group("g", now=50.0)
                successor.replay(record, now=50.0, loading=True)
                fence = successor.fences[a.member_id]
                assert fence.partitions == frozenset(again.owned)
                assert fence.until == 50.0 + again.session_timeout
                nursery.cancel_scope.cancel()
        assert timeline.overlaps() == []


async def test_a_second_live_member_with_the_same_instance_id_is_fenced(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a = member(broker, timeline, "a", instance_id="host-a")
        twin = member(broker, timeline, "twin", instance_id="host-a")
        async with connected(a), connected(twin):
            await a.join()
            await rec.wait_for("stable", generation=1)
            mark = rec.mark()
            with pytest.raises(FencedInstanceIdError, match="in use by live member"):
                await twin.join()
            await a.heartbeat()  # the first keeps running, untouched
            assert a.owned == [TopicPartition("t", p) for p in range(4)]
            assert rec.all("rebalance_started", since=mark) == []


async def test_a_static_member_not_back_in_time_is_removed_at_its_session_timeout(
    autojump_clock,
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a = member(broker, timeline, "a", instance_id="host-a")
        b = member(broker, timeline, "b")
        async with connected(b), trio.open_nursery() as nursery:
            async with connected(a):
                await a_then_b(rec, nursery, a, b)
                mark = rec.mark()
                await a.crash()
            removed = await rec.wait_for("removed", since=mark, member_id=a.member_id)
            assert removed["time"] == S and removed["reason"] == "session timeout expired"
            stable = await rec.wait_for("stable", since=mark)
            assert stable["time"] == S  # its lease ended with its session: no wait
            assert b.owned == [TopicPartition("t", p) for p in range(4)]
            nursery.cancel_scope.cancel()


async def test_a_static_consumer_restarts_without_disturbing_the_group(tmp_path):
    """Real consumers: closing a static one does not leave; its successor gets its partitions."""
    calls: list[tuple[str, list[TopicPartition]]] = []
    async with open_broker(tmp_path, min_session_timeout=0.05) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 4)
        options = dict(session_timeout=5.0, instance_id="worker-1")
        async with open_consumer(
            broker.bootstrap,
            "g",
            ["t"],
            session_timeout=5.0,
            on_assigned=lambda tps: calls.append(("assigned", tps)),
            on_revoked=lambda tps: calls.append(("revoked", tps)),
        ) as other:
            async with open_consumer(broker.bootstrap, "g", ["t"], **options) as static:
                with trio.fail_after(10):
                    while len(static.assignment) != 2 or len(other.assignment) != 2:
                        await trio.sleep(0.01)
                had, member_id = sorted(static.assignment), static.member_id
            calls.clear()
            async with open_consumer(broker.bootstrap, "g", ["t"], **options) as again:
                with trio.fail_after(4):  # well within the session: no expiry involved
                    while sorted(again.assignment) != had:
                        await trio.sleep(0.01)
                assert again.member_id == member_id
                assert calls == []  # the other member heard of nothing
                async with open_admin(broker.bootstrap) as admin:
                    described = await admin.describe_group("g")
                instances = {m.member_id: m.instance_id for m in described.members}
                assert instances == {member_id: "worker-1", other.member_id: ""}


async def test_a_twin_consumer_is_refused_after_a_session_timeout_and_the_first_runs_on(tmp_path):
    """A consumer refused as a twin retries for one session timeout (its own former
    process may not be seen gone yet), then raises FencedInstanceIdError."""
    async with open_broker(tmp_path, min_session_timeout=0.05) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 2)
        async with open_consumer(
            broker.bootstrap, "g", ["t"], session_timeout=1.0, instance_id="worker-1"
        ) as first:
            with trio.fail_after(10):
                owned = await first.wait_assigned()
            with trio.fail_after(10), pytest.raises(FencedInstanceIdError, match="worker-1"):
                async with open_consumer(
                    broker.bootstrap, "g", ["t"], session_timeout=0.3, instance_id="worker-1"
                ):
                    pass
            assert first.assignment == owned
            await first.commit()  # still a member in good standing


@pytest.mark.parametrize("protocol", ["eager", "cooperative"])
@pytest.mark.parametrize("arrives", ["resumed", "rejoined"])
async def test_a_successor_and_its_cut_off_predecessor_never_fetch_at_once(
    autojump_clock, protocol, arrives
):
    """A static member's process is cut off from its coordinator but keeps fetching until
    its lease ends; its successor (same instance id) joins, and so does a new member. The
    old process's partitions are fenced until its lease ends, whoever gets them next: the
    successor's stop acknowledgement (it holds nothing) does not lift that fence."""
    rec, timeline = Recorder(), Timeline()
    session = 6.0
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)

        def make(name, instance_id=""):
            return FakeMember(
                broker,
                "g",
                ["t"],
                session_timeout=session,
                rebalance_timeout=5.0,
                timeline=timeline,
                name=name,
                instance_id=instance_id,
                protocol=protocol,
                process=name,
            )

        a, b = make("A", "w1"), make("B")
        successor, c = make("A'", "w1"), make("C")
        async with connected(b), connected(successor), connected(c):
            async with trio.open_nursery() as nursery:
                async with connected(a):
                    await a_then_b(rec, nursery, a, b)
                    had = list(a.owned)
                    assert len(had) == 2
                    await trio.sleep_until(2.0)
                    await a.heartbeat()  # its last: its lease ends at 2 + 6
                    mark = rec.mark()
                    await a.crash()
                lease_end = 2.0 + session
                timeline.stop_at("A", lease_end)  # type: ignore[attr-defined]
                await trio.sleep_until(2.5)
                if arrives == "resumed":
                    await successor.join()  # resumed (a start at its lease end, pending)
                    await trio.sleep_until(3.0)
                    await c.join()  # a rebalance supersedes that start
                else:
                    # Asking for something else, it is not resumed but joins as any member
                    # would, into a rebalance, and a new member comes along.
                    successor.assignors = ["roundrobin", "range"]
                    await successor.join()
                    await c.join()
                    assert rec.all("resumed", since=mark) == []
                assert successor.member_id == a.member_id
                nursery.start_soon(heartbeat_forever, successor, 1.0)
                nursery.start_soon(heartbeat_forever, c, 1.0)
                stable = await rec.wait_for("stable", since=mark)
                # Whoever got the old process's partitions started them after its lease.
                starts = [
                    e
                    for e in rec.all("started", since=mark)
                    if set(e["partitions"]) & {str(tp) for tp in had}
                ]
                assert starts and all(e["time"] >= lease_end for e in starts)
                assert stable["time"] >= lease_end
                owners = {tp: m for m in (b, successor, c) for tp in m.owned}
                assert sorted(owners) == [TopicPartition("t", p) for p in range(4)]
                nursery.cancel_scope.cancel()
        assert timeline.overlaps() == []
