"""The group consumer against a real broker over real sockets (real time, short timeouts).

What an application relies on: joining spreads the partitions, every
rebalance leaves each partition with exactly one owner, leaving the block
(or being cancelled) leaves the group at once, commits survive a broker
restart, a consumer rejoins by itself after its coordinator restarts, and a
bad setting fails loudly at ``open_consumer``. The consumer's side of the
lease is also checked on its own, on the virtual clock.
"""

from __future__ import annotations

from collections import Counter

import pytest
import trio

from trio_coord import (
    Consumer,
    ConsumerState,
    CoordError,
    InvalidSessionTimeoutError,
    OffsetRegressionError,
    TopicPartition,
    open_admin,
    open_broker,
    open_consumer,
)
from trio_coord.protocol import PartitionOffset, StartFetchersRequest

S = 0.6  # session timeout for these tests (seconds of real time)


def ownership(consumers) -> Counter:
    return Counter(tp for c in consumers for tp in c.assignment)


async def wait_until(predicate, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def complete_and_exclusive(consumers, partitions: int, topic: str = "t") -> bool:
    owners = ownership(consumers)
    return all(c.state is ConsumerState.STABLE for c in consumers) and owners == Counter(
        {TopicPartition(topic, p): 1 for p in range(partitions)}
    )


async def test_members_join_leave_and_partitions_stay_complete_and_exclusive(broker):
    async with open_admin(broker.bootstrap) as admin:
        await admin.create_topic("t", 12)
    opts = dict(session_timeout=S)
    async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as a:
        assert len(await a.wait_assigned()) == 12
        async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as b:
            async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as c:
                await wait_until(lambda: complete_and_exclusive([a, b, c], 12))
                assert sorted(len(x.assignment) for x in (a, b, c)) == [4, 4, 4]
                async with open_admin(broker.bootstrap) as admin:
                    desc = await admin.describe_group("g")
                assert desc.state == "STABLE"
                assert {m.member_id for m in desc.members} == {x.member_id for x in (a, b, c)}
                for m in desc.members:
                    mine = next(x for x in (a, b, c) if x.member_id == m.member_id)
                    assert sorted(m.partitions) == sorted(mine.assignment)
            # c left by leaving its block: a and b share everything at once.
            await wait_until(lambda: complete_and_exclusive([a, b], 12), timeout=S / 2)
        await wait_until(lambda: complete_and_exclusive([a], 12), timeout=S / 2)


async def test_callbacks_see_every_revoke_before_the_next_assignment(broker):
    async with open_admin(broker.bootstrap) as admin:
        await admin.create_topic("t", 4)
    log: list[tuple[str, str, list]] = []

    def callbacks(name):
        return dict(
            on_assigned=lambda ps: log.append((name, "assigned", ps)),
            on_revoked=lambda ps: log.append((name, "revoked", ps)),
        )

    opts = dict(session_timeout=S)
    async with open_consumer(broker.bootstrap, "g", ["t"], **opts, **callbacks("a")) as a:
        await a.wait_assigned()
        async with open_consumer(
            broker.bootstrap, "g", ["t"], session_timeout=S, **callbacks("b")
        ) as b:
            await wait_until(lambda: complete_and_exclusive([a, b], 4))
    # Replay the callbacks: no partition is ever assigned to two members at once.
    owner: dict[TopicPartition, str] = {}
    for name, what, partitions in log:
        for tp in partitions:
            if what == "assigned":
                assert tp not in owner, f"{tp} assigned to {name} while {owner.get(tp)} owns it"
                owner[tp] = name
            else:
                assert owner.pop(tp) == name
    assert ("a", "revoked", [TopicPartition("t", p) for p in range(4)]) in log


async def test_cancelling_the_consumer_leaves_the_group_cleanly(broker):
    async with open_admin(broker.bootstrap) as admin:
        await admin.create_topic("t", 2)
    async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=30.0) as stays:
        with trio.CancelScope() as scope:
            async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=30.0) as goes:
                await wait_until(lambda: complete_and_exclusive([stays, goes], 2))
                scope.cancel()
                await trio.sleep_forever()
        # Its session timeout is 30 s: only a real LeaveGroup explains a quick handover.
        await wait_until(lambda: complete_and_exclusive([stays], 2), timeout=2.0)


async def test_commits_survive_a_broker_restart(tmp_path):
    data = tmp_path / "data"
    async with open_broker(data, min_session_timeout=0.05) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 3)
        async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=S) as consumer:
            await consumer.wait_assigned()
            await consumer.commit({("t", 0): 10, ("t", 1): 20})
            assert (
                await consumer.committed()
                == {
                    TopicPartition("t", 0): 10,
                    TopicPartition("t", 1): 20,
                    TopicPartition("t", 2): 0,  # the start offset auto-commit reported
                }
                or (await consumer.committed())[TopicPartition("t", 1)] == 20
            )
            with pytest.raises(OffsetRegressionError, match="allow_regression"):
                await consumer.commit({("t", 0): 5})
            await consumer.commit({("t", 0): 5}, allow_regression=True)
    async with open_broker(data) as broker:
        async with open_admin(broker.bootstrap) as admin:
            committed = await admin.committed_offsets("g")
            desc = await admin.describe_group("g")
    assert committed[TopicPartition("t", 0)] == 5
    assert committed[TopicPartition("t", 1)] == 20
    assert desc.generation >= 1
    # A consumer joining after the restart starts from the committed offsets.
    async with open_broker(data, min_session_timeout=0.05) as broker:
        async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=S) as consumer:
            assignment = await consumer.wait_assigned()
    assert assignment[TopicPartition("t", 0)] == 5
    assert assignment[TopicPartition("t", 1)] == 20


async def test_consumer_rejoins_by_itself_after_its_coordinator_restarts(tmp_path):
    data = tmp_path / "data"
    async with open_broker(data, min_session_timeout=0.05) as broker:
        port = broker.address[1]
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 2)
    events: list[str] = []
    async with trio.open_nursery() as nursery:
        restarted = trio.Event()

        async def run_broker(task_status=trio.TASK_STATUS_IGNORED):
            async with open_broker(data, port=port, min_session_timeout=0.05):
                task_status.started()
                await restarted.wait()
            async with open_broker(data, port=port, min_session_timeout=0.05):
                await trio.sleep_forever()

        await nursery.start(run_broker)
        async with open_consumer(
            f"127.0.0.1:{port}",
            "g",
            ["t"],
            session_timeout=2.0,
            on_lost=lambda ps: events.append("lost"),
        ) as consumer:
            await consumer.wait_assigned()
            member_id, generation = consumer.member_id, consumer.generation
            restarted.set()  # the broker stops and starts again on the same port
            await wait_until(
                lambda: consumer.generation > generation and consumer.state is ConsumerState.STABLE,
                timeout=10.0,
            )
            assert len(consumer.assignment) == 2
            # It kept its partitions through the short outage (its lease never ran out).
            assert events == []
            # The restarted coordinator recognized the member from its persisted generation.
            assert consumer.member_id == member_id
        nursery.cancel_scope.cancel()


async def test_a_setting_the_broker_refuses_fails_at_open(broker):
    async with open_admin(broker.bootstrap) as admin:
        await admin.create_topic("t", 1)
    with pytest.raises(InvalidSessionTimeoutError, match="outside this broker's limits"):
        async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=10_000.0):
            pass  # pragma: no cover - never entered


async def test_bad_arguments_are_refused_before_any_connection():
    with pytest.raises(ValueError, match="host:port"):
        open_consumer("localhost", "g", ["t"])
    with pytest.raises(ValueError, match="offset_reset"):
        open_consumer("127.0.0.1:1", "g", ["t"], offset_reset="oldest")
    with pytest.raises(ValueError, match="at least one topic"):
        open_consumer("127.0.0.1:1", "g", [])
    for size in (1024, 1 << 30):
        with pytest.raises(ValueError, match="fetch_max_bytes must be 65536 to 536870912"):
            open_consumer("127.0.0.1:1", "g", ["t"], fetch_max_bytes=size)


async def test_a_slow_on_revoked_is_called_once_per_revocation(broker):
    async with open_admin(broker.bootstrap) as admin:
        await admin.create_topic("t", 2)
    calls: list[list[TopicPartition]] = []

    async def slow_revoke(partitions):
        calls.append(partitions)
        await trio.sleep(0.3)  # a rebalance restart sends another StopFetchers meanwhile

    opts = dict(session_timeout=5.0)
    async with open_consumer(broker.bootstrap, "g", ["t"], on_revoked=slow_revoke, **opts) as a:
        await a.wait_assigned()
        async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as b:
            await trio.sleep(0.1)
            async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as c:
                await wait_until(lambda: complete_and_exclusive([a, b, c], 2), timeout=5.0)
            # Every partition a lost, it heard about once per assignment it held.
            assert all(calls.count(p) == 1 for p in calls)


async def test_leaving_while_a_rebalance_starts_revokes_once_and_assigns_nothing(broker):
    async with open_admin(broker.bootstrap) as admin:
        await admin.create_topic("t", 2)
    calls: list[tuple[str, list[TopicPartition]]] = []
    revoking = trio.Event()
    a: Consumer

    async def slow_revoke(partitions):
        calls.append(("revoked", partitions))
        revoking.set()
        await trio.sleep(0.3)  # b joins meanwhile: StopFetchers, then StartFetchers, for a
        await a.commit({tp: 7 for tp in partitions})  # still possible while revoking

    def assigned(partitions):
        calls.append(("assigned", partitions))

    opts = dict(session_timeout=5.0)
    async with trio.open_nursery() as nursery:

        async def a_leaves_at_once():
            nonlocal a
            async with open_consumer(
                broker.bootstrap, "g", ["t"], on_revoked=slow_revoke, on_assigned=assigned, **opts
            ) as a:
                await a.wait_assigned()

        nursery.start_soon(a_leaves_at_once)
        await revoking.wait()
        async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as b:
            await wait_until(lambda: complete_and_exclusive([b], 2))
            assert b.assignment == {TopicPartition("t", 0): 7, TopicPartition("t", 1): 7}
    everything = [TopicPartition("t", 0), TopicPartition("t", 1)]
    assert calls == [("assigned", everything), ("revoked", everything)]


def _as_member(consumer: Consumer, nursery: trio.Nursery) -> None:
    """As if ``consumer`` (never connected) had joined as member ``m`` with a heartbeat
    accepted just now; its watchdog watches the lease."""
    nursery.start_soon(consumer._membership._watchdog)
    consumer._membership.member_id = "m"
    consumer._membership._member_ready.set()
    consumer._membership._renew_lease(trio.current_time())


async def test_a_start_arriving_after_the_lease_ran_out_is_refused(autojump_clock):
    # The lease ran out while the consumer owned nothing (stopped, its heartbeats not
    # answered in time), so the watchdog had nothing to drop and waits for the lease to
    # move. A StartFetchers delivered now was sent before the coordinator declared the
    # member dead: obeying it, the consumer would fetch with no lease and nothing would
    # drop the partitions while it stays cut off, whereas the coordinator hands them
    # over once its fence ends.
    consumer = open_consumer("127.0.0.1:1", "g", ["t"], session_timeout=S)
    async with trio.open_nursery() as nursery:
        _as_member(consumer, nursery)  # its last heartbeat accepted now
        await trio.sleep(S * 1.5)
        start = StartFetchersRequest("g", "m", 2, [PartitionOffset("t", 0, 0)])
        with pytest.raises(CoordError, match="lease"):
            await consumer._membership._handler.handle(start)
        await trio.sleep(S)
        assert consumer.assignment == {}
        nursery.cancel_scope.cancel()


async def test_commit_while_reconnecting_is_retriable_and_after_leaving_is_not(tmp_path):
    stop_broker = trio.Event()
    async with trio.open_nursery() as nursery:

        async def run_broker(task_status=trio.TASK_STATUS_IGNORED):
            async with open_broker(tmp_path / "data", min_session_timeout=0.05) as broker:
                async with open_admin(broker.bootstrap) as admin:
                    await admin.create_topic("t", 1)
                task_status.started(broker.bootstrap)
                await stop_broker.wait()

        bootstrap = await nursery.start(run_broker)
        async with open_consumer(bootstrap, "g", ["t"], session_timeout=5.0) as consumer:
            await consumer.wait_assigned()
            stop_broker.set()  # the consumer keeps its partitions and tries to reconnect
            membership = consumer._membership  # (private: its connection to the coordinator)
            await wait_until(lambda: membership._conn is None or membership._conn.closed)
            with pytest.raises(CoordError, match="retry") as info:
                await consumer.commit({("t", 0): 1})
            assert info.value.retriable
        with pytest.raises(CoordError, match="left its group") as info:
            await consumer.commit({("t", 0): 1})
        assert not info.value.retriable


async def test_the_watchdog_still_watches_a_lease_renewed_while_on_lost_ran(autojump_clock):
    # The lease ran out and the watchdog dropped t-0. While on_lost ran, a late heartbeat
    # answer renewed the lease and a StartFetchers gave the consumer t-1; then its
    # coordinator became unreachable for good. The watchdog must still drop t-1 when
    # that lease ends (it used to wait for a renewal it had already missed).
    consumer: Consumer
    lost: list[list[TopicPartition]] = []

    async def slow_on_lost(partitions):
        lost.append(partitions)
        if len(lost) > 1:
            return
        consumer._membership._renew_lease(trio.current_time())
        # The push is handled once on_lost returns (pushes and drops take turns).
        nursery.start_soon(
            consumer._membership._handler.handle,
            StartFetchersRequest("g", "m", 3, [PartitionOffset("t", 1, 0)]),
        )
        await trio.sleep(S / 10)

    consumer = open_consumer("127.0.0.1:1", "g", ["t"], session_timeout=S, on_lost=slow_on_lost)
    async with trio.open_nursery() as nursery:
        _as_member(consumer, nursery)
        await consumer._membership._handler.handle(
            StartFetchersRequest("g", "m", 2, [PartitionOffset("t", 0, 0)])
        )
        await trio.sleep(S * 1.5)
        assert list(consumer.assignment) == [TopicPartition("t", 1)]
        await trio.sleep(S)
        assert consumer.assignment == {}
        assert lost == [[TopicPartition("t", 0)], [TopicPartition("t", 1)]]
        nursery.cancel_scope.cancel()


async def test_a_drop_waits_for_a_running_revoke_and_loses_nothing_twice(autojump_clock):
    from trio_coord.protocol import StopFetchersRequest

    revoked: list[list[TopicPartition]] = []
    lost: list[list[TopicPartition]] = []

    async def slow_revoke(partitions):
        revoked.append(partitions)
        await trio.sleep(S)  # the lease runs out meanwhile

    consumer = open_consumer(
        "127.0.0.1:1", "g", ["t"], session_timeout=S, on_revoked=slow_revoke, on_lost=lost.append
    )
    async with trio.open_nursery() as nursery:
        _as_member(consumer, nursery)
        await consumer._membership._handler.handle(
            StartFetchersRequest("g", "m", 2, [PartitionOffset("t", 0, 0)])
        )
        await consumer._membership._handler.handle(StopFetchersRequest("g", "m", 2))
        await trio.sleep(S)
        assert revoked == [[TopicPartition("t", 0)]]
        assert lost == []  # revoked once, never also lost
        nursery.cancel_scope.cancel()


async def test_a_native_member_with_the_brokers_rack_gets_its_range_first(tmp_path):
    """With racks, ``range`` gives each member the partitions of its own rack first: on a
    broker in rack r1, member b (rack r1) gets t-0..2, which without racks go to member a
    (rack r2, first in member-id order); each still gets three."""
    async with open_broker(tmp_path / "data", min_session_timeout=0.05, rack="r1") as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 6)
        opts = dict(session_timeout=S, assignors=["range"])
        async with (
            open_consumer(broker.bootstrap, "g", ["t"], client_id="a", rack="r2", **opts) as a,
            open_consumer(broker.bootstrap, "g", ["t"], client_id="b", rack="r1", **opts) as b,
        ):
            await wait_until(lambda: complete_and_exclusive([a, b], 6))
            assert a.member_id < b.member_id
            assert sorted(b.assignment) == [TopicPartition("t", p) for p in (0, 1, 2)]
            assert sorted(a.assignment) == [TopicPartition("t", p) for p in (3, 4, 5)]
