"""Failover of a three-broker cluster in real processes, on a private ZooKeeper chroot.

The brokers are ``trio-coord broker --store zk://...`` processes; the
clients (producer, consumers, admin) run in the test. What the issue asks of
a cluster is checked as it would be by an operator with ``kill``:

- SIGKILL the coordinator of a group with live members (eager, and
  cooperative): the group is stable again (a new generation, every
  partition owned once) on another broker
  within the ZooKeeper session timeout plus two seconds, every acknowledged
  commit is still there, and the members' ownership timelines (recorded
  from their assignment callbacks, in one process, so in one order) never
  give a partition to two members at once.
- SIGSTOP a coordinator past its ZooKeeper session, then SIGCONT it: the
  write it was asked for is rejected, the offset stays as the new
  coordinator has it, and the woken broker steps down, re-registers and
  serves again.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import AsyncIterator

import pytest
import trio

from trio_coord import ConsumerState, open_admin, open_consumer, open_producer
from trio_coord.broker.cluster import COORDINATORS, coordinator_path
from trio_coord.broker.coordinator import slot_of
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.errors import (
    CoordError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)
from trio_coord.protocol.messages import (
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    PartitionOffset,
    TopicPartition,
)
from trio_coord.store import MetadataStore, open_zookeeper_store

from .ownership import Ownership
from .procs import SLOTS, ZK_SESSION, BrokerProcess

log = logging.getLogger(__name__)

TOPIC = "events"
PARTITIONS = 4


async def holders(zk: MetadataStore) -> dict[int, int]:
    """slot → broker id, as ZooKeeper has it."""
    found = {}
    for name in await zk.children(COORDINATORS):
        with contextlib.suppress(CoordError, Exception):
            data, _ = await zk.get(coordinator_path(int(name)))
            found[int(name)] = int(data)
    return found


async def wait_spread(zk: MetadataStore, ids: set[int]) -> dict[int, int]:
    """Wait until every slot is held, evenly, by the brokers ``ids``."""
    with trio.fail_after(60):
        while True:
            held = await holders(zk)
            counts = [list(held.values()).count(b) for b in ids]
            if len(held) == SLOTS and set(held.values()) <= ids and max(counts) - min(counts) <= 1:
                return held
            await trio.sleep(0.1)


def group_on(held: dict[int, int], broker_id: int, prefix: str) -> str:
    """A group id whose slot ``broker_id`` holds."""
    return next(
        f"{prefix}{n}" for n in range(10_000) if held[slot_of(f"{prefix}{n}", SLOTS)] == broker_id
    )


async def coordinator_id(bootstrap: str, group: str) -> int | None:
    """The coordinator of ``group`` that the broker at ``bootstrap`` names."""
    host, _, port = bootstrap.rpartition(":")
    async with open_connection(host, int(port)) as conn:
        response = await conn.request(MetadataRequest([], group=group))
    assert isinstance(response, MetadataResponse)
    return None if response.coordinator is None else response.coordinator.broker_id


@contextlib.asynccontextmanager
async def three_brokers(url: str, base) -> AsyncIterator[tuple[list[BrokerProcess], MetadataStore]]:
    """Brokers 1-3 on ``url``; the topic's partitions live on brokers 1 and 2 only.

    Broker 3 joins after the topic is made, so that killing it loses no
    partition, only coordination: the failover is the coordinator's.
    """
    procs = [BrokerProcess(url, i, base) for i in (1, 2, 3)]
    async with open_zookeeper_store(url) as zk:
        try:
            await procs[0].start()
            await procs[1].start()
            await wait_spread(zk, {1, 2})
            async with open_admin(procs[0].bootstrap) as admin:
                await admin.create_topic(TOPIC, PARTITIONS)
            await procs[2].start()
            await wait_spread(zk, {1, 2, 3})
            yield procs, zk
        finally:
            with trio.CancelScope(shield=True):
                for proc in procs:
                    await proc.stop()


@pytest.mark.parametrize("protocol", ["eager", "cooperative"])
async def test_sigkill_of_a_coordinator_moves_its_group_within_the_session_plus_2s(
    zookeeper_server, zk_chroot, tmp_path, protocol
):
    url = zookeeper_server.url(zk_chroot)
    async with three_brokers(url, tmp_path) as (procs, zk):
        victim = procs[2]
        group = group_on(await holders(zk), 3, "g")
        bootstrap = ",".join(p.bootstrap for p in procs)
        survivors = ",".join(p.bootstrap for p in procs[:2])
        ownership = Ownership()
        acked: dict[TopicPartition, int] = {}

        async def consume(name: str, consumer, task_status=trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            while True:
                records = await consumer.getmany(100)
                done = {}
                for r in records:
                    done[TopicPartition(r.topic, r.partition)] = r.offset + 1
                try:
                    await consumer.commit()
                except CoordError:
                    continue  # moving: the positions are handed back or committed later
                for tp, offset in done.items():
                    acked[tp] = max(acked.get(tp, 0), offset)

        async def produce(producer) -> None:
            n = 0
            while True:
                await producer.send(TOPIC, f"r{n}", partition=n % PARTITIONS)
                n += 1
                await trio.sleep(0.01)

        async with contextlib.AsyncExitStack() as stack:
            producer = await stack.enter_async_context(open_producer(survivors))
            consumers = []
            for i in range(3):
                name = f"c{i}"
                consumer = await stack.enter_async_context(
                    open_consumer(
                        bootstrap,
                        group,
                        [TOPIC],
                        client_id=name,
                        session_timeout=1.0,
                        offset_reset="earliest",
                        rebalance_protocol=protocol,
                        **ownership.callbacks(name),
                    )
                )
                consumers.append((name, consumer))
            nursery = await stack.enter_async_context(trio.open_nursery())
            nursery.start_soon(produce, producer)
            for name, consumer in consumers:
                nursery.start_soon(consume, name, consumer)
            consumers = [c for _, c in consumers]

            def stable_generation() -> int | None:
                gens = {c.generation for c in consumers}
                owned = [tp for c in consumers for tp in c.assignment]
                if (
                    len(gens) == 1
                    and all(c.state is ConsumerState.STABLE for c in consumers)
                    and sorted(owned) == sorted(set(owned))
                    and len(owned) == PARTITIONS
                ):
                    return gens.pop()
                return None

            with trio.fail_after(30):
                while stable_generation() is None or len(acked) < PARTITIONS:
                    await trio.sleep(0.02)
            before = stable_generation()
            assert before is not None
            assert await coordinator_id(procs[0].bootstrap, group) == 3
            acked_before = dict(acked)

            killed_at = trio.current_time()
            await victim.kill()
            with trio.fail_after(30):
                while True:
                    generation = stable_generation()
                    if generation is not None and generation > before:
                        break
                    await trio.sleep(0.01)
            took = trio.current_time() - killed_at
            log.info("group %s stable again %.2fs after its coordinator was killed", group, took)
            assert took <= ZK_SESSION + 2.0, f"stable again after {took:.2f}s"
            assert await coordinator_id(procs[0].bootstrap, group) in (1, 2)

            async with open_admin(survivors) as admin:
                committed = await admin.committed_offsets(group)
            for tp, offset in acked_before.items():
                assert committed[tp] >= offset, (tp, committed[tp], offset)
            nursery.cancel_scope.cancel()

        # No partition was ever owned by two members at once.
        ownership.check_exclusive()
        assert ownership.count("lost") + ownership.count("revoked") > 0


async def test_a_coordinator_stopped_past_its_session_is_fenced_and_steps_down(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with three_brokers(url, tmp_path) as (procs, zk):
        paused = procs[2]
        group = group_on(await holders(zk), 3, "h")
        tp = TopicPartition(TOPIC, 0)

        def commit(offset: int) -> OffsetCommitRequest:
            return OffsetCommitRequest(
                group, "", -1, [PartitionOffset(tp.topic, tp.partition, offset)]
            )

        assert paused.address is not None
        async with open_connection(*paused.address) as stale:
            await stale.request(commit(10))
            paused.signal(signal.SIGSTOP)
            # The others notice its session expire and one of them wins its slots.
            with trio.fail_after(30):
                while await coordinator_id(procs[0].bootstrap, group) in (3, None):
                    await trio.sleep(0.1)
            async with open_admin(procs[0].bootstrap) as admin:
                assert (await admin.committed_offsets(group))[tp] == 10

                # A commit reaches the paused broker's socket; then it wakes up.
                rejected: list[CoordError] = []

                async def late_commit() -> None:
                    try:
                        await stale.request(commit(99))
                    except CoordError as exc:
                        rejected.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(late_commit)
                    await trio.sleep(0.2)
                    paused.signal(signal.SIGCONT)
                assert len(rejected) == 1, "the deposed coordinator accepted a write"
                assert isinstance(
                    rejected[0], NotCoordinatorError | CoordinatorNotAvailableError
                ), rejected
                assert (await admin.committed_offsets(group))[tp] == 10

                # It stepped down, registered again with a new session, and serves.
                with trio.fail_after(30):
                    while "registering again with a new session" not in paused.log_text():
                        await trio.sleep(0.1)
                    while len(await admin.brokers()) < 3:
                        await trio.sleep(0.1)
                await wait_spread(zk, {1, 2, 3})
                await admin.create_topic("after", 1)


async def test_brokers_killed_one_at_a_time_move_their_groups_and_keep_every_offset(
    zookeeper_server, zk_chroot, tmp_path
):
    """The operator's check: groups on all three brokers, brokers SIGKILLed in turn.

    The topic's partitions are on all three brokers, so a killed broker takes
    its partitions down with it (they wait for it; there are no replicas),
    but its groups move: each affected group is stable again on a survivor
    within the ZooKeeper session timeout plus two seconds, and every group's
    committed offsets never go backwards, across both kills.
    """
    url = zookeeper_server.url(zk_chroot)
    procs = [BrokerProcess(url, i, tmp_path) for i in (1, 2, 3)]
    async with open_zookeeper_store(url) as zk, contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(_stop_all, procs)
        for proc in procs:
            await proc.start()
        held = await wait_spread(zk, {1, 2, 3})
        groups = {b: group_on(held, b, f"b{b}-") for b in (1, 2, 3)}
        bootstrap = ",".join(p.bootstrap for p in procs)
        admin = await stack.enter_async_context(open_admin(bootstrap))
        await admin.create_topic(TOPIC, 6)
        producer = await stack.enter_async_context(open_producer(bootstrap))
        for n in range(600):
            await producer.send(TOPIC, f"r{n}", partition=n % 6)
        ownership = {group: Ownership() for group in groups.values()}  # one timeline per group
        members: dict[str, list] = {}
        for group in groups.values():
            members[group] = [
                await stack.enter_async_context(
                    open_consumer(
                        bootstrap,
                        group,
                        [TOPIC],
                        client_id=f"{group}c{i}",
                        session_timeout=1.0,
                        offset_reset="earliest",
                        **ownership[group].callbacks(f"{group}c{i}"),
                    )
                )
                for i in range(2)
            ]

        def generation(group: str) -> int | None:
            consumers = members[group]
            gens = {c.generation for c in consumers}
            owned = [tp for c in consumers for tp in c.assignment]
            if (
                len(gens) == 1
                and all(c.state is ConsumerState.STABLE for c in consumers)
                and len(owned) == len(set(owned)) == 6
            ):
                return gens.pop()
            return None

        async def consume(consumer) -> None:
            while True:
                await consumer.getmany(50)
                with contextlib.suppress(CoordError):
                    await consumer.commit()

        committed: dict[str, dict[TopicPartition, int]] = {g: {} for g in groups.values()}

        async def check_offsets_never_go_back() -> None:
            for group in groups.values():
                now = await admin.committed_offsets(group)
                for tp, offset in committed[group].items():
                    assert now.get(tp, -1) >= offset, (group, tp, now.get(tp), offset)
                committed[group] = now

        nursery = await stack.enter_async_context(trio.open_nursery())
        for consumers in members.values():
            for consumer in consumers:
                nursery.start_soon(consume, consumer)
        with trio.fail_after(30):
            while any(generation(g) is None for g in groups.values()):
                await trio.sleep(0.02)
            for group in groups.values():
                while len(await admin.committed_offsets(group)) < 6:
                    await trio.sleep(0.05)
        await check_offsets_never_go_back()

        survivors = [1, 2, 3]
        for victim in (3, 2):
            survivors.remove(victim)
            moved = []
            for group in groups.values():
                if await coordinator_id(procs[survivors[0] - 1].bootstrap, group) == victim:
                    moved.append(group)
            assert moved, f"broker {victim} coordinates none of {sorted(groups.values())}"
            before = {g: generation(g) for g in moved}
            killed_at = trio.current_time()
            await procs[victim - 1].kill()
            with trio.fail_after(30):
                for group in moved:
                    old = before[group]
                    assert old is not None
                    while (gen := generation(group)) is None or gen <= old:
                        await trio.sleep(0.01)
                    took = trio.current_time() - killed_at
                    log.info("group %s stable again after %.2fs", group, took)
                    assert took <= ZK_SESSION + 2.0, f"{group} stable again after {took:.2f}s"
            for group in moved:
                assert await coordinator_id(procs[survivors[0] - 1].bootstrap, group) in survivors
            await check_offsets_never_go_back()
        nursery.cancel_scope.cancel()
    for timeline in ownership.values():
        timeline.check_exclusive()


async def _stop_all(procs: list[BrokerProcess]) -> None:
    with trio.CancelScope(shield=True):
        for proc in procs:
            await proc.stop()


async def test_a_killed_broker_restarted_with_its_id_rejoins_and_serves_its_partitions(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    procs = [BrokerProcess(url, i, tmp_path) for i in (1, 2, 3)]
    async with open_zookeeper_store(url) as zk, contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(_stop_all, procs)
        for proc in procs:
            await proc.start()
        await wait_spread(zk, {1, 2, 3})
        bootstrap = ",".join(p.bootstrap for p in procs[:2])
        admin = await stack.enter_async_context(open_admin(bootstrap))
        info = await admin.create_topic(TOPIC, 3)
        mine = info.leaders.index(3)
        async with open_admin(procs[2].bootstrap) as third:  # its watch has seen the topic
            with trio.fail_after(10):
                while TOPIC not in [t.name for t in await third.list_topics()]:
                    await trio.sleep(0.02)
        async with open_producer(procs[2].bootstrap) as producer:
            for n in range(10):
                await producer.send(TOPIC, f"r{n}", partition=mine)
        await procs[2].kill()
        await wait_spread(zk, {1, 2})
        await procs[2].start()  # same id, same data dir, a new port
        await wait_spread(zk, {1, 2, 3})
        assert [b.broker_id for b in await admin.brokers()] == [1, 2, 3]
        async with open_admin(procs[0].bootstrap) as fresh:  # (broker 3 has a new port)
            offsets = await fresh.list_offsets([TopicPartition(TOPIC, mine)])
        assert offsets[TopicPartition(TOPIC, mine)].offset == 10  # its records survived


async def test_a_broker_stopped_with_sigterm_hands_its_groups_over_without_a_session_wait(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with three_brokers(url, tmp_path) as (procs, zk):
        leaving = procs[2]
        group = group_on(await holders(zk), 3, "s")
        bootstrap = ",".join(p.bootstrap for p in procs)
        async with open_consumer(bootstrap, group, [TOPIC], session_timeout=1.0) as consumer:
            with trio.fail_after(20):
                while consumer.state is not ConsumerState.STABLE:
                    await trio.sleep(0.02)
            before = consumer.generation
            leaving.signal(signal.SIGTERM)
            assert leaving.process is not None
            assert await leaving.process.wait() == 0
            # Its session was closed, not left to expire: its nodes are gone already.
            assert await zk.exists("/brokers/3") is None
            assert 3 not in (await holders(zk)).values()
            with trio.fail_after(20):
                while consumer.state is not ConsumerState.STABLE or consumer.generation <= before:
                    await trio.sleep(0.02)
            assert await coordinator_id(procs[0].bootstrap, group) in (1, 2)
