"""The coordinator's timing, asserted exactly on Trio's virtual clock.

These are the promises of the design's invariants 1 and 5: a member's death
restarts an in-flight rebalance at the moment it is known (not at a
timeout), a member that does not answer is expelled at its rebalance
timeout exactly, a silent member is declared dead at its session timeout
exactly, and a dead member's partitions reach a new owner only once its
lease has certainly ended. And no member's action or timing, nor a
deletion racing a join, takes the broker down.
"""

from __future__ import annotations

import contextlib

import pytest
import trio

from trio_coord import (
    GroupNotFoundError,
    IllegalGenerationError,
    InvalidSessionTimeoutError,
    UnknownMemberError,
)
from trio_coord.protocol import (
    HeartbeatRequest,
    OffsetCommitRequest,
    PartitionOffset,
    StartFetchersResponse,
    StopFetchersRequest,
)

from .harness import (
    FakeMember,
    Recorder,
    Timeline,
    connected,
    ephemeral_broker,
    join_one_by_one,
)

S = 10.0  # session timeout of the fake members
R = 5.0  # their rebalance timeout


def members(broker, timeline, *names, group="g", topics=("t",)):
    return [
        FakeMember(
            broker,
            group,
            list(topics),
            session_timeout=S,
            rebalance_timeout=R,
            timeline=timeline,
            name=name,
        )
        for name in names
    ]


async def heartbeat_at(member: FakeMember, times: list[float]) -> None:
    """Heartbeat at exactly these virtual times."""
    for t in times:
        await trio.sleep_until(t)
        await member.heartbeat()


async def test_join_and_leave_rebalance_at_once(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a, b = members(broker, timeline, "a", "b")
        async with connected(a), connected(b):
            await a.join()
            first = await rec.wait_for("stable", generation=1)
            assert first["time"] == 0.0
            assert a.owned == [("t", 0), ("t", 1), ("t", 2), ("t", 3)]
            await trio.sleep(1.0)
            await b.join()
            second = await rec.wait_for("stable", generation=2)
            assert second["time"] == 1.0
            assert sorted(a.owned + b.owned) == [("t", p) for p in range(4)]
            assert not set(a.owned) & set(b.owned)
            await trio.sleep(1.0)
            await b.leave()
            third = await rec.wait_for("stable", generation=3)
            assert third["time"] == 2.0  # a clean leave is no reason to wait
            assert a.owned == [("t", p) for p in range(4)]
        assert timeline.overlaps() == []


async def test_death_during_stop_restarts_the_rebalance_at_that_moment(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 6)
        a, b, c = members(broker, timeline, "a", "b", "c")
        async with connected(a), connected(b), connected(c), trio.open_nursery() as nursery:
            await join_one_by_one(rec, a, b)
            b_had = list(b.owned)
            nursery.start_soon(heartbeat_at, b, [0.5, 1.5])
            nursery.start_soon(heartbeat_at, a, [x + 0.5 for x in range(30)])
            await trio.sleep_until(2.0)
            b.hold_stop = True  # b will hang on the coming StopFetchers
            mark = rec.mark()
            await c.join()  # a rebalance starts at t=2 and waits on b
            nursery.start_soon(heartbeat_at, c, [x + 2.5 for x in range(30)])
            await rec.wait_for("rebalance_started", since=mark)
            await trio.sleep_until(3.0)
            await b.crash()
            removed = await rec.wait_for("removed", since=mark, member_id=b.member_id)
            assert removed["time"] == 3.0
            assert removed["reason"] == "lost its connection"
            # b's lease: its last heartbeat (t=1.5) plus its session timeout.
            assert removed["fenced_until"] == 1.5 + S
            stable = await rec.wait_for("stable", since=mark)
            restarted = rec.all("rebalance_started", since=mark)
            assert [e["time"] for e in restarted] == [2.0, 3.0]  # not at 2.0 + R
            # b's partitions could go to a new owner only when its lease ended.
            assert stable["time"] == 1.5 + S
            assert sorted(a.owned + c.owned) == [("t", p) for p in range(6)]
            assert set(b_had) <= set(a.owned + c.owned)
            nursery.cancel_scope.cancel()
        # A crashed member might only have been cut off: it fetches until its lease ends.
        timeline.stop_at(b.member_id, removed["fenced_until"])
        assert timeline.overlaps() == []


async def test_member_that_never_answers_is_expelled_at_its_rebalance_timeout(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a, b, c = members(broker, timeline, "a", "b", "c")
        async with connected(a), connected(b), connected(c), trio.open_nursery() as nursery:
            await join_one_by_one(rec, a, b)
            nursery.start_soon(heartbeat_at, a, [x + 0.5 for x in range(30)])
            nursery.start_soon(heartbeat_at, b, [0.5, 1.5, 2.5, 3.5, 4.5, 5.5])
            await trio.sleep_until(1.0)
            b.hold_stop = True
            mark = rec.mark()
            await c.join()
            nursery.start_soon(heartbeat_at, c, [x + 1.5 for x in range(30)])
            removed = await rec.wait_for("removed", since=mark, member_id=b.member_id)
            assert removed["time"] == 1.0 + R
            assert "did not answer within its rebalance timeout" in removed["reason"]
            assert removed["fenced_until"] == 5.5 + S  # last accepted heartbeat + S
            stable = await rec.wait_for("stable", since=mark)
            assert stable["time"] == 5.5 + S
            assert len(stable["ownership"]) == 4
            assert set(stable["ownership"].values()) == {a.member_id, c.member_id}
            with pytest.raises(UnknownMemberError):
                await b.heartbeat()  # expelled: its lease can no longer be renewed
            nursery.cancel_scope.cancel()
        timeline.stop_at(b.member_id, removed["fenced_until"])
        assert timeline.overlaps() == []


async def test_silent_member_is_declared_dead_at_its_session_timeout(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a, b = members(broker, timeline, "a", "b")
        async with connected(a), connected(b), trio.open_nursery() as nursery:
            await join_one_by_one(rec, a, b)
            nursery.start_soon(heartbeat_at, a, [x + 0.5 for x in range(40)])
            await heartbeat_at(b, [1.0, 2.25])  # then silence
            removed = await rec.wait_for("removed", member_id=b.member_id)
            assert removed["time"] == 2.25 + S
            assert removed["reason"] == "session timeout expired"
            stable = await rec.wait_for("stable", generation=3)
            assert stable["time"] == 2.25 + S  # the lease had ended: no further wait
            assert a.owned == [("t", p) for p in range(4)]
            nursery.cancel_scope.cancel()


async def test_adding_partitions_rebalances_subscribed_groups_only(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        await broker.topics.create_topic("u", 2)
        (a,) = members(broker, timeline, "a", group="on-t")
        (z,) = members(broker, timeline, "z", group="on-u", topics=("u",))
        async with connected(a), connected(z):
            await join_one_by_one(rec, a, z)
            await trio.sleep(1.0)
            mark = rec.mark()
            await broker.topics.add_partitions("t", 5)
            stable = await rec.wait_for("stable", since=mark, group="on-t")
            assert stable["time"] == 1.0
            assert a.owned == [("t", p) for p in range(5)]
            await trio.sleep(1.0)
            assert rec.all("rebalance_started", since=mark) == [
                e for e in rec.all("rebalance_started", since=mark) if e["group"] == "on-t"
            ]


async def test_fencing_of_heartbeats_and_commits(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        a, b = members(broker, timeline, "a", "b")
        async with connected(a), connected(b):
            await join_one_by_one(rec, a, b)
            conn = a.conn
            with pytest.raises(IllegalGenerationError, match="stale"):
                await conn.request(HeartbeatRequest("g", a.member_id, 0))
            with pytest.raises(UnknownMemberError, match="rejoin"):
                await conn.request(HeartbeatRequest("g", "nobody", 2))
            owned = a.owned[0]
            offset = PartitionOffset(owned.topic, owned.partition, 7)
            with pytest.raises(IllegalGenerationError):
                await conn.request(OffsetCommitRequest("g", a.member_id, 1, [offset]))
            with pytest.raises(UnknownMemberError):
                await conn.request(OffsetCommitRequest("g", "nobody", 2, [offset]))
            await conn.request(OffsetCommitRequest("g", a.member_id, 2, [offset]))
            assert broker.coordinator.committed_offset("g", owned) == 7


async def test_session_timeout_outside_the_broker_limits_is_refused(autojump_clock):
    async with ephemeral_broker(min_session_timeout=1.0, max_session_timeout=60.0) as broker:
        await broker.topics.create_topic("t", 1)
        timeline = Timeline()
        (a,) = members(broker, timeline, "a")
        a.session_timeout = 0.5
        async with connected(a):
            with pytest.raises(InvalidSessionTimeoutError, match=r"\[1s, 60s\]"):
                await a.join()


async def test_member_ids_are_unique(autojump_clock):
    async with ephemeral_broker() as broker:
        await broker.topics.create_topic("t", 1)
        fakes = members(broker, Timeline(), *"abcdefgh")
        ids = set()
        for fake in fakes:
            async with connected(fake):
                ids.add((await fake.join()).member_id)
        assert len(ids) == len(fakes)


async def test_empty_group_without_offsets_is_removed_after_retention(autojump_clock):
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, group_retention=60.0) as broker:
        await broker.topics.create_topic("t", 1)
        a, b = members(broker, Timeline(), "a", "b")
        b.group = "keeps-offsets"
        async with connected(a), connected(b):
            await join_one_by_one(rec, a, b)
            await b.conn.request(
                OffsetCommitRequest("keeps-offsets", b.member_id, 1, [PartitionOffset("t", 0, 3)])
            )
            await a.leave()
            await b.leave()
        assert broker.coordinator.runner("g") is not None
        await trio.sleep(59.0)
        assert broker.coordinator.runner("g") is not None
        await trio.sleep(60.0 / 4 + 1.0)
        assert broker.coordinator.runner("g") is None
        assert broker.coordinator.runner("keeps-offsets") is not None


async def test_a_bug_in_one_groups_rebalance_stays_in_that_group(autojump_clock, monkeypatch):
    from trio_coord.core.assignors import RangeAssignor

    original = RangeAssignor.assign

    def assign(self, spec):
        if "poison" in spec.partitions:
            raise RuntimeError("assignor bug")
        return original(self, spec)

    monkeypatch.setattr(RangeAssignor, "assign", assign)
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("poison", 1)
        await broker.topics.create_topic("t", 1)
        (bad,) = members(broker, timeline, "bad", group="bad", topics=("poison",))
        (good,) = members(broker, timeline, "good", group="good")
        async with connected(bad), connected(good):
            await bad.join()
            failed = await rec.wait_for("rebalance_failed", group="bad")
            assert "assignor bug" in failed["error"]
            await good.join()
            await rec.wait_for("stable", group="good")
            assert good.owned == [("t", 0)]
            # The failing group keeps retrying (backing off), and recovers once it can.
            monkeypatch.setattr(RangeAssignor, "assign", original)
            await rec.wait_for("stable", group="bad")
            assert bad.owned == [("poison", 0)]


async def test_a_hung_store_fails_the_rebalance_at_its_deadline_then_it_recovers(
    autojump_clock, monkeypatch
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        store_back = trio.Event()
        real_multi = broker.store.multi

        async def hung_multi(ops):
            await store_back.wait()
            return await real_multi(ops)

        monkeypatch.setattr(broker.store, "multi", hung_multi)
        (a,) = members(broker, timeline, "a")
        async with connected(a), trio.open_nursery() as nursery:
            nursery.start_soon(heartbeat_at, a, [x + 0.5 for x in range(20)])
            await a.join()  # the rebalance's generation write hangs
            failed = await rec.wait_for("rebalance_failed")
            assert failed["time"] == R and "TooSlowError" in failed["error"]
            await trio.sleep_until(8.0)
            assert rec.all("stable") == []
            store_back.set()
            stable = await rec.wait_for("stable")
            assert stable["time"] == 8.0
            assert a.owned == [("t", 0), ("t", 1)]
            nursery.cancel_scope.cancel()


async def test_a_join_racing_a_group_deletion_is_told_to_retry(autojump_clock, monkeypatch):
    from trio_coord import CoordinatorNotAvailableError, GroupNotFoundError

    rec = Recorder()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 1)
        await broker.coordinator.create_group("g")
        store_back = trio.Event()
        real_multi = broker.store.multi

        async def slow_multi(ops):
            await store_back.wait()
            return await real_multi(ops)

        monkeypatch.setattr(broker.store, "multi", slow_multi)
        (a,) = members(broker, Timeline(), "a")
        async with connected(a), trio.open_nursery() as nursery:
            nursery.start_soon(broker.coordinator.delete_group, "g")
            await trio.sleep(1.0)  # the tombstone is being written
            with pytest.raises(CoordinatorNotAvailableError, match="being deleted"):
                await a.join()
            store_back.set()
        with pytest.raises(GroupNotFoundError):
            broker.coordinator.describe_group("g")
        async with connected(a):
            await a.join()  # a fresh group
            await rec.wait_for("stable", group="g")


async def test_a_commit_still_in_flight_when_planning_reaches_the_new_owner(
    autojump_clock, monkeypatch
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        real_multi = broker.store.multi

        async def slow_multi(ops):
            await trio.sleep(0.1)
            return await real_multi(ops)

        monkeypatch.setattr(broker.store, "multi", slow_multi)
        a, b = members(broker, timeline, "a", "b")
        async with connected(a), connected(b), trio.open_nursery() as nursery:
            await join_one_by_one(rec, a)
            assert a.owned == [("t", 0), ("t", 1)]
            offsets = [PartitionOffset("t", 1, 100)]
            commit = OffsetCommitRequest("g", a.member_id, a.generation, offsets)
            nursery.start_soon(a.conn.request, commit)  # its write takes 0.1 s...
            await trio.sleep(0.01)
            mark = rec.mark()
            await b.join()  # ...and this rebalance plans meanwhile
            await rec.wait_for("stable", since=mark)
            assert b.owned == [("t", 1)]
            assert b.start_offsets == {("t", 1): 100}


def gated_store(broker, monkeypatch, gates: list[trio.Event]) -> None:
    """Hold the broker's next store writes, the i-th until ``gates[i]`` is set."""
    real_multi = broker.store.multi
    writes = 0

    async def gated_multi(ops):
        nonlocal writes
        writes += 1
        if writes <= len(gates):
            await gates[writes - 1].wait()
        return await real_multi(ops)

    monkeypatch.setattr(broker.store, "multi", gated_multi)


async def test_the_sweeper_spares_a_group_that_a_member_joined_while_it_swept(
    autojump_clock, monkeypatch
):
    # Two groups expire in the same sweep, which deletes them one store write after
    # the other. A member joining the second meanwhile must keep it: tombstoning a
    # group with members used to crash the record writer, and with it the broker.
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, group_retention=60.0) as broker:
        await broker.topics.create_topic("t", 1)
        await broker.coordinator.create_group("g1")
        await broker.coordinator.create_group("g2")
        (a,) = members(broker, Timeline(), "a", group="g2")
        async with connected(a):
            await trio.sleep_until(59.0)
            store_back = trio.Event()
            gated_store(broker, monkeypatch, [store_back])
            await trio.sleep_until(61.0)
            assert broker.coordinator.runner("g1").deleting  # the sweep of t=60 is writing
            await a.join()
            store_back.set()
            stable = await rec.wait_for("stable", group="g2")
            assert stable["ownership"] == {"t-0": a.member_id}
            assert broker.coordinator.runner("g1") is None


async def test_a_retried_delete_cannot_tombstone_the_group_that_replaced_it(
    autojump_clock, monkeypatch
):
    # A DeleteGroup retried while the first one's tombstone is being written used to
    # queue a second tombstone, written after a member had joined a new group of the
    # same name: replaying it then crashed the broker.
    rec = Recorder()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 1)
        await broker.coordinator.create_group("g")
        first_write, second_write = trio.Event(), trio.Event()
        gated_store(broker, monkeypatch, [first_write, second_write])
        (a,) = members(broker, Timeline(), "a")
        retried: list[Exception | None] = []

        async def delete_again():
            try:
                await broker.coordinator.delete_group("g")
            except GroupNotFoundError as exc:
                retried.append(exc)
            else:
                retried.append(None)

        async with connected(a), trio.open_nursery() as nursery:
            nursery.start_soon(broker.coordinator.delete_group, "g")
            await trio.sleep(1.0)  # the tombstone is being written
            nursery.start_soon(delete_again)
            # Another group's commit shares the next store write.
            other = OffsetCommitRequest("other", "", -1, [PartitionOffset("t", 0, 5)])
            nursery.start_soon(broker.coordinator.commit, other)
            await trio.sleep(1.0)
            first_write.set()  # g is gone
            await trio.sleep(1.0)
            await a.join()  # a new g
            second_write.set()
            await rec.wait_for("stable", group="g")
        assert isinstance(retried[0], GroupNotFoundError)
        assert "being deleted" in str(retried[0])


async def test_a_member_lost_as_the_rebalance_begins_is_only_removed(autojump_clock):
    # b's connection is lost in the same scheduling step as the rebalance begins, before
    # the task that sends b its StopFetchers first runs (a coincidence of scheduling,
    # pinned here by acting on the rebalance_started event). That task used to raise
    # KeyError, which escaped with the other members' cancellations and crashed the broker.
    rec, timeline = Recorder(), Timeline()
    lose: list[str] = []

    def on_event(event):
        rec(event)
        if event.kind == "rebalance_started" and lose:
            broker.coordinator.runner("g").connection_lost(lose.pop())

    async with ephemeral_broker(on_event=on_event) as broker:
        await broker.topics.create_topic("t", 4)
        a, b, c = members(broker, timeline, "a", "b", "c")
        async with connected(a), connected(b), connected(c), trio.open_nursery() as nursery:
            await join_one_by_one(rec, a, b)
            nursery.start_soon(heartbeat_at, a, [x + 0.5 for x in range(20)])
            mark = rec.mark()
            lose.append(b.member_id)
            await c.join()
            nursery.start_soon(heartbeat_at, c, [x + 0.5 for x in range(20)])
            removed = await rec.wait_for("removed", since=mark, member_id=b.member_id)
            assert removed["reason"] == "lost its connection"
            stable = await rec.wait_for("stable", since=mark)
            assert stable["time"] == S  # b's lease, from its join at t=0
            assert set(stable["ownership"].values()) == {a.member_id, c.member_id}
            assert rec.all("rebalance_failed") == []
            nursery.cancel_scope.cancel()


async def heartbeat_until_expelled(member: FakeMember, first: float) -> None:
    """Heartbeat every second from ``first`` until the coordinator no longer knows it."""
    await trio.sleep_until(first)
    with contextlib.suppress(UnknownMemberError):
        while True:
            await member.heartbeat()
            await trio.sleep(1.0)


class _Confused(FakeMember):
    """Answers StopFetchers with the wrong message once ``confused`` is set."""

    confused = False

    async def handle(self, body):
        if self.confused and isinstance(body, StopFetchersRequest):
            return StartFetchersResponse()
        return await super().handle(body)


async def test_a_member_answering_a_stop_with_the_wrong_message_is_expelled(autojump_clock):
    # A member's wrong answer used to fail every rebalance of its group as a broker bug
    # (an assert), retried forever: one bad client wedged the group.
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        (a,) = members(broker, timeline, "a")
        b = _Confused(broker, "g", ["t"], session_timeout=S, rebalance_timeout=R, name="b")
        async with connected(a), connected(b), trio.open_nursery() as nursery:
            await join_one_by_one(rec, a, b)
            nursery.start_soon(heartbeat_at, a, [x + 0.5 for x in range(20)])
            nursery.start_soon(heartbeat_until_expelled, b, 0.5)
            b.confused = True
            await trio.sleep(1.0)
            mark = rec.mark()
            await broker.topics.add_partitions("t", 3)
            removed = await rec.wait_for("removed", since=mark, member_id=b.member_id)
            assert removed["time"] == 1.0
            assert "answered StopFetchers with StartFetchersResponse" in removed["reason"]
            stable = await rec.wait_for("stable", since=mark)
            assert stable["time"] == 0.5 + S  # b may fetch until its lease ends
            assert set(stable["ownership"].values()) == {a.member_id}
            assert rec.all("rebalance_failed", since=mark) == []
            nursery.cancel_scope.cancel()


async def test_a_bug_raised_while_the_rebalance_is_cancelled_stays_in_the_group(
    autojump_clock, monkeypatch
):
    from trio_coord.broker.group import GroupRunner

    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        a, b, c = members(broker, timeline, "a", "b", "c")
        async with connected(a), connected(b), connected(c), trio.open_nursery() as nursery:
            for fake in (a, b, c):
                nursery.start_soon(heartbeat_at, fake, [x + 0.5 for x in range(20)])
            await join_one_by_one(rec, a, b)
            # (The rebalance's task awaits the phase's answers: a and b stop, pushed.)
            original = GroupRunner._await_answers

            async def buggy(self, answers):
                await original(self, answers)
                monkeypatch.setattr(GroupRunner, "_await_answers", original)
                self.remove_member(b.member_id, "left", stopped=True)  # cancels it...
                raise RuntimeError("a bug, raised amid the cancellation")

            monkeypatch.setattr(GroupRunner, "_await_answers", buggy)
            mark = rec.mark()
            await c.join()
            failed = await rec.wait_for("rebalance_failed", since=mark)
            assert "a bug, raised amid the cancellation" in failed["error"]
            stable = await rec.wait_for("stable", since=mark)  # and the group recovers
            assert set(stable["ownership"].values()) == {a.member_id, c.member_id}
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("protocol", ["eager", "cooperative"])
async def test_joins_during_a_rebalance_do_not_restart_it(autojump_clock, protocol):
    # A burst of joins used to restart the rebalance once per join (each restart stopping
    # every member again). New members own nothing to stop: the rebalance runs on, takes
    # in those that came before its plan, and one more rebalance takes in the rest.
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 12)

        def member(name: str) -> FakeMember:
            return FakeMember(broker, "g", ["t"], timeline=timeline, name=name, protocol=protocol)

        first, *late = [member(n) for n in "abcdef"]
        first.stop_delay = 1.0  # the rebalance the first join of the burst starts is slow
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(connected(first))
            await first.join()
            await rec.wait_for("stable", generation=1)
            mark = len(rec.events)
            for m in late:
                await stack.enter_async_context(connected(m))
                await m.join()
                await trio.sleep(0.1)  # one by one, while the rebalance waits for the stop
            with trio.fail_after(30):
                while True:
                    stable = rec.all("stable", since=mark)
                    if stable and len(set(stable[-1]["ownership"].values())) == 6:
                        break
                    await trio.sleep(0.05)
            assert rec.all("rebalance_restarted", since=mark) == []
            assert len(rec.all("rebalance_started", since=mark)) <= 2
            assert not timeline.overlaps()
