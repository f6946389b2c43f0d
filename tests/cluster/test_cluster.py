"""Brokers of one cluster in one process on a real ZooKeeper: registration, slots, routing.

These tests run several ``open_broker(store="zk://...")`` in one Trio
process, on a private chroot of the session's ZooKeeper server, in real
time. They check what every broker must agree on: the live brokers, an even
spread of the coordinator slots, where each group and partition lives, the
NOT_COORDINATOR answer of a broker asked about another's group, the fencing
of a deposed slot holder's writes, and topics made on one broker reaching
the others' groups.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator

import msgspec
import pytest
import trio
from zkserver import free_port

from trio_coord import open_admin, open_broker, open_consumer, open_producer
from trio_coord.broker import Broker
from trio_coord.broker.cluster import (
    COORDINATORS,
    ClusterConfigError,
    coordinator_path,
    epoch_path,
)
from trio_coord.broker.coordinator import PATTERN_PREFIX
from trio_coord.cli import main
from trio_coord.core.records import OffsetRecord, TopicRecord, encode_record
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    NotCoordinatorError,
    NotLeaderForPartitionError,
    TopicAlreadyExistsError,
    UnknownTopicError,
)
from trio_coord.protocol.messages import (
    BrokerInfo,
    HeartbeatRequest,
    MetadataRequest,
    MetadataResponse,
    OffsetFetchRequest,
    ProduceRequest,
    TopicPartition,
)
from trio_coord.store import (
    BadVersionError,
    Create,
    Delete,
    SessionState,
    SetData,
    open_zookeeper_store,
)

SLOTS = 6
SETTINGS = dict(
    min_session_timeout=0.2,
    coordinator_slots=SLOTS,
    zk_session_timeout=2.0,
    claim_grace=0.3,
)


@contextlib.asynccontextmanager
async def open_cluster(url: str, tmp_path, count: int) -> AsyncIterator[list[Broker]]:
    """``count`` brokers (ids 1..count) on ``url``, once the slots are spread over all."""
    async with contextlib.AsyncExitStack() as stack:
        brokers = [
            await stack.enter_async_context(
                open_broker(tmp_path / f"b{i}", store=url, broker_id=i, **SETTINGS)
            )
            for i in range(1, count + 1)
        ]
        await settled(brokers)
        yield brokers


async def settled(brokers: list[Broker]) -> None:
    """Wait until every broker is connected, sees all of them, and the slots are spread evenly
    and loaded."""
    ids = {b.config.broker_id for b in brokers}
    slots = brokers[0].coordinator.slots
    with trio.fail_after(30):
        while True:
            views = [b.cluster for b in brokers if b.cluster is not None]
            held = [len(b.coordinator.services) for b in brokers]
            if (
                all(b.store.session_state.value is SessionState.CONNECTED for b in brokers)
                and all(set(v.brokers) == ids for v in views)
                and sum(held) == slots
                and max(held) - min(held) <= 1
                and all(len(v.holders) == slots for v in views)
            ):
                return
            await trio.sleep(0.05)


def coordinator_broker(brokers: list[Broker], group: str) -> Broker:
    """The broker whose coordinator services hold ``group``'s slot."""
    slot = brokers[0].coordinator.slot_of(group)
    (owner,) = [b for b in brokers if slot in b.coordinator.services]
    return owner


async def test_a_broker_not_in_its_own_view_sends_clients_elsewhere(
    zookeeper_server, zk_chroot, tmp_path
):
    # After a session expiry the view is cleared until the broker has registered
    # again: an empty broker list would leave a client nothing to ask.
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 1) as (broker,):
        assert broker.cluster is not None
        away = broker.cluster.brokers.pop(broker.config.broker_id)
        try:
            with pytest.raises(CoordinatorNotAvailableError, match="not registered"):
                broker.metadata(MetadataRequest([], group="g1"))
        finally:
            broker.cluster.brokers[broker.config.broker_id] = away
        assert broker.metadata(MetadataRequest([])).brokers == [away]


async def test_an_unreadable_topic_node_is_skipped_not_fatal(zookeeper_server, zk_chroot, tmp_path):
    # A node this broker cannot decode (a newer broker's, or damaged by hand) is
    # logged and skipped; the broker goes on following the other topics.
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as (broker, other):
        await broker.store.create("/topics/junk", b"\xff\x00 not a record")
        async with open_admin(other.bootstrap) as admin:  # broker hears of it by its watch
            await admin.create_topic("real", 2)
        with trio.fail_after(10):
            while broker.topics.partitions.get("real") != 2:
                await trio.sleep(0.02)
        assert "junk" not in broker.topics.partitions
        broker.metadata(MetadataRequest([]))  # still serving


async def test_brokers_register_and_spread_the_slots(zookeeper_server, zk_chroot, tmp_path):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 3) as brokers:
        async with open_connection(*brokers[0].address) as conn:
            response = await conn.request(MetadataRequest([], group="g1"))
        assert isinstance(response, MetadataResponse)
        assert [b.broker_id for b in response.brokers] == [1, 2, 3]
        assert {(b.host, b.port) for b in response.brokers} == {b.address for b in brokers}
        owner = coordinator_broker(brokers, "g1")
        assert response.coordinator is not None
        assert response.coordinator.broker_id == owner.config.broker_id
        # Each broker holds 2 of the 6 slots, and all agree who holds which.
        assert sorted(len(b.coordinator.services) for b in brokers) == [2, 2, 2]
        views = [b.cluster.holders for b in brokers if b.cluster is not None]
        assert views[0] == views[1] == views[2]


async def test_a_broker_asked_about_another_brokers_group_answers_not_coordinator(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        owner = coordinator_broker(brokers, "g1")
        other = next(b for b in brokers if b is not owner)
        async with open_connection(*other.address) as conn:
            with pytest.raises(NotCoordinatorError, match="does not coordinate group 'g1'"):
                await conn.request(HeartbeatRequest("g1", "m", 1))
            with pytest.raises(NotCoordinatorError):
                await conn.request(OffsetFetchRequest("g1", None))


async def test_partitions_are_spread_and_served_by_their_leader(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 3) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        async with open_admin(brokers[0].bootstrap) as admin:
            info = await admin.create_topic("t", 6)
        assert sorted(info.leaders) == [1, 1, 2, 2, 3, 3]
        # Every broker learns the topic through its watch, with the same leaders.
        with trio.fail_after(10):
            while not all(b.topics.leaders.get("t") == info.leaders for b in brokers):
                await trio.sleep(0.02)
        # ...and the same topic id, persisted with the topic's record in ZooKeeper.
        assert len(info.topic_id) == 32
        assert [b.topics.ids["t"] for b in brokers] == [info.topic_id] * 3
        # A broker refuses a partition it does not hold...
        not_leader = next(b for b in brokers if b.config.broker_id != info.leaders[0])
        async with open_connection(*not_leader.address) as conn:
            with pytest.raises(NotLeaderForPartitionError, match="held by broker"):
                await conn.request(ProduceRequest("t", 0, b"", 0, 0))
        # ...and clients route each partition to its leader.
        async with open_producer(bootstrap) as producer:
            for p in range(6):
                await producer.send("t", f"v{p}".encode(), partition=p)
        for b in brokers:
            mine = [p for p, leader in enumerate(info.leaders) if leader == b.config.broker_id]
            for p in mine:
                assert b.partitions.log_offsets(TopicPartition("t", p)) == (0, 1)
        async with open_consumer(
            bootstrap, "g", ["t"], session_timeout=1.0, offset_reset="earliest"
        ) as consumer:
            seen = set()
            with trio.fail_after(20):
                while len(seen) < 6:
                    record = await consumer.getone()
                    seen.add(record.value)
        assert seen == {f"v{p}".encode() for p in range(6)}


async def test_a_deposed_holders_writes_are_fenced_and_it_steps_down(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        owner = coordinator_broker(brokers, "g1")
        slot = owner.coordinator.slot_of("g1")
        service = owner.coordinator.services[slot]
        await owner.coordinator.create_group("g1")
        # Another session takes the slot behind the holder's back (as a broker that
        # won it after this one's session expired would): it bumps the epoch.
        async with open_zookeeper_store(url) as rogue:
            bumped = await rogue.set(epoch_path(slot), b"rogue")
            with pytest.raises(BadVersionError):
                await service._writer.write([OffsetRecord("g1", "t", 0, 5)])
        assert service.committed_offset("g1", TopicPartition("t", 0)) is None
        # It stepped down and gave its node up; the slot is won again (by whichever
        # broker), with a newer epoch, and the group is served again from the store.
        with trio.fail_after(10):
            while True:
                now = [
                    b for b in brokers if b.coordinator.services.get(slot, service) is not service
                ]
                if now:
                    break
                await trio.sleep(0.02)
        (new_owner,) = now
        assert new_owner.cluster is not None
        assert new_owner.cluster.held[slot].epoch > bumped.version
        new_service = new_owner.coordinator.services[slot]
        assert new_service.describe_group("g1").group_id == "g1"
        await new_service._writer.write([OffsetRecord("g1", "t", 0, 7)])
        assert new_owner.coordinator.committed_offset("g1", TopicPartition("t", 0)) == 7


async def test_a_topic_made_on_one_broker_rebalances_a_group_on_another(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        owner = coordinator_broker(brokers, "g1")
        other = next(b for b in brokers if b is not owner)
        bootstrap = ",".join(b.bootstrap for b in brokers)
        async with open_admin(other.bootstrap) as admin:
            await admin.create_topic("a", 1)
            async with open_consumer(bootstrap, "g1", ["a"], session_timeout=1.0) as consumer:
                with trio.fail_after(20):
                    while set(consumer.assignment) != {TopicPartition("a", 0)}:
                        await trio.sleep(0.02)
                await admin.add_partitions("a", 3)  # on the broker that does not coordinate
                with trio.fail_after(20):
                    while len(consumer.assignment) != 3:
                        await trio.sleep(0.02)


async def test_cluster_status_shows_brokers_slot_holders_and_groups(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        for group in ("a", "b", "c"):
            await coordinator_broker(brokers, group).coordinator.create_group(group)
        result = await trio.run_process(
            [sys.executable, "-m", "trio_coord", "cluster", "status", "--store", url, "--json"],
            capture_stdout=True,
        )
        status = json.loads(result.stdout)
        assert status["slots"] == SLOTS
        assert [b["broker_id"] for b in status["brokers"]] == [1, 2]
        holders = {int(s): b for s, b in status["holders"].items()}
        assert holders == brokers[0].cluster.holders  # type: ignore[union-attr]
        expected: dict[str, list[str]] = {}
        for group in ("a", "b", "c"):
            owner = coordinator_broker(brokers, group).config.broker_id
            expected.setdefault(str(owner), []).append(group)
        assert status["groups"] == expected
        text = await trio.run_process(
            [sys.executable, "-m", "trio_coord", "cluster", "status", "--store", url],
            capture_stdout=True,
        )
        assert b"2 live broker(s), 6 coordinator slot(s)" in text.stdout


async def test_a_regex_subscription_picks_up_matching_topics_made_on_any_broker(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        owner = coordinator_broker(brokers, "rx")
        other = next(b for b in brokers if b is not owner)
        bootstrap = ",".join(b.bootstrap for b in brokers)
        async with open_admin(other.bootstrap) as admin:
            await admin.create_topic("orders-eu", 2)
            with trio.fail_after(10):
                while "orders-eu" not in owner.topics.partitions:
                    await trio.sleep(0.02)
            async with open_consumer(
                bootstrap, "rx", [f"{PATTERN_PREFIX}orders-.*"], session_timeout=1.0
            ) as consumer:

                async def owns(topics: dict[str, int]) -> None:
                    wanted = {TopicPartition(t, p) for t, n in topics.items() for p in range(n)}
                    with trio.fail_after(20):
                        while set(consumer.assignment) != wanted:
                            await trio.sleep(0.02)

                await owns({"orders-eu": 2})  # matched when it joined
                await admin.create_topic("billing", 1)  # does not match
                await admin.create_topic("orders-us", 1)  # matches: made on the other broker
                await owns({"orders-eu": 2, "orders-us": 1})
                await admin.add_partitions("orders-us", 3)
                await owns({"orders-eu": 2, "orders-us": 3})
                description = await admin.describe_group("rx")
                (member,) = description.members
                assert set(member.topics) == {"re:orders-.*", "orders-eu", "orders-us"}


async def test_a_bad_regex_subscription_is_refused_with_a_clear_message(tmp_path):
    async with open_broker(None, min_session_timeout=0.2) as broker:
        with pytest.raises(InvalidRequestError, match=r"re:\(orders.*not a valid regular exp"):
            async with open_consumer(broker.bootstrap, "g", ["re:(orders"], session_timeout=1.0):
                pass  # pragma: no cover


async def test_one_topic_created_on_two_brokers_at_once_exists_once(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        outcomes: list[object] = []

        async def create(broker: Broker) -> None:
            try:
                outcomes.append(await broker.topics.create_topic("twice", 2))
            except TopicAlreadyExistsError as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            for broker in brokers:
                nursery.start_soon(create, broker)
        assert sorted(type(o).__name__ for o in outcomes) == [
            "TopicAlreadyExistsError",
            "TopicInfo",
        ]


async def test_a_broker_with_another_slot_count_is_refused_with_the_count_to_use(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 1):
        with pytest.raises(ClusterConfigError, match=f"--coordinator-slots {SLOTS}"):
            async with open_broker(
                tmp_path / "odd", store=url, broker_id=9, **{**SETTINGS, "coordinator_slots": 7}
            ):
                pass  # pragma: no cover


def test_the_cli_refuses_a_store_that_is_not_a_zookeeper_url(capsys, tmp_path):
    status = main(
        ["broker", "--store", "zookeeper:2181", "--data-dir", str(tmp_path), "--port", "0"]
    )
    assert status == 1
    assert "is not a ZooKeeper URL: give zk://host:port" in capsys.readouterr().err


def test_cluster_status_refuses_a_store_that_is_not_a_zookeeper_url_as_the_broker_does(capsys):
    status = main(["cluster", "status", "--store", "127.0.0.1:2181/x"])
    assert status == 1
    err = capsys.readouterr().err
    assert "error: store '127.0.0.1:2181/x' is not a ZooKeeper URL: give zk://host:port" in err


def test_cluster_status_without_zookeeper_says_so_in_one_line(capsys):
    port = free_port()  # nothing listens there
    status = main(["cluster", "status", "--store", f"zk://127.0.0.1:{port}/x", "--timeout", "0.5"])
    assert status == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"error: could not connect to ZooKeeper 127.0.0.1:{port}/x within 0.5 s "
        "(is ZooKeeper running there?)"
    )


async def test_a_broker_waits_for_an_old_registration_of_its_id_to_vanish(
    zookeeper_server, zk_chroot, tmp_path, caplog
):
    url = zookeeper_server.url(zk_chroot)
    entered = trio.Event()
    async with open_zookeeper_store(url) as squatter:
        # The registration of an old session of broker 5 (a new broker would have another port).
        old = msgspec.msgpack.encode(BrokerInfo(5, "127.0.0.1", 1))
        await squatter.create("/brokers/5", old, ephemeral=True, make_parents=True)

        async def run_broker(task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with open_broker(tmp_path / "b5", store=url, broker_id=5, **SETTINGS):
                entered.set()
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_broker)
            waiting = (
                "broker id 5 is registered by another ZooKeeper session at 127.0.0.1:1, "
                "where no broker answers"
            )
            with trio.fail_after(10):
                while waiting not in caplog.text:
                    await trio.sleep(0.02)
            assert not entered.is_set()
            await squatter.aclose()  # (as an old session expiring would)
            with trio.fail_after(10):
                await entered.wait()
            nursery.cancel_scope.cancel()


async def test_a_broker_started_with_the_id_of_a_live_broker_is_refused(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        live = brokers[0]
        with trio.fail_after(20), pytest.raises(ClusterConfigError) as refused:
            async with open_broker(tmp_path / "dup", store=url, broker_id=1, **SETTINGS):
                pass  # pragma: no cover
        assert str(refused.value) == (
            f"broker id 1 is taken: the broker at {live.bootstrap} is registered with it and "
            "answers; give every broker of a cluster its own --broker-id"
        )
        assert live.cluster is not None and set(live.cluster.brokers) == {1, 2}
        await settled(brokers)  # (nothing was disturbed)


async def test_a_topic_not_yet_seen_through_the_watch_is_read_from_zookeeper_on_demand(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        # Written without touching /topics, so that no broker's watch learns of it: the
        # state of a broker that a just-created topic has not reached yet.
        async with open_zookeeper_store(url) as other:
            await other.create("/topics/fresh", encode_record(TopicRecord("fresh", 1, [2])))
        assert all("fresh" not in b.topics.partitions for b in brokers)
        async with open_connection(*brokers[0].address) as conn:
            response = await conn.request(MetadataRequest(["fresh"]))
        assert isinstance(response, MetadataResponse)
        assert [(t.name, t.partitions, t.leaders) for t in response.topics] == [("fresh", 1, [2])]
        async with open_producer(brokers[1].bootstrap) as producer:
            await producer.send("fresh", b"v", partition=0)
        assert brokers[1].partitions.log_offsets(TopicPartition("fresh", 0)) == (0, 1)
        async with open_connection(*brokers[0].address) as conn:
            with pytest.raises(UnknownTopicError):
                await conn.request(MetadataRequest(["never"]))


async def test_a_claim_whose_answer_was_lost_is_recognized_by_its_session(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        first, second = (b.cluster for b in brokers)
        assert first is not None and second is not None
        slot = next(iter(first.held))
        # What _claim asks after a lost connection: does this session hold the slot?
        assert await first._won_meanwhile(brokers[0].store, slot) == first.held[slot].epoch
        assert await second._won_meanwhile(brokers[1].store, slot) is None


async def test_clients_follow_a_broker_restarted_on_another_port(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_broker(tmp_path / "b1", store=url, broker_id=1, **SETTINGS) as first:
        async with open_producer(first.bootstrap) as producer:
            async with open_broker(tmp_path / "b2", store=url, broker_id=2, **SETTINGS) as b2:
                await settled([first, b2])
                info = await first.topics.create_topic("moving", 2)
                on_two = info.leaders.index(2)
                await producer.send("moving", b"before", partition=on_two)
                old_port = b2.address[1]
            async with open_broker(tmp_path / "b2", store=url, broker_id=2, **SETTINGS) as b2:
                assert b2.address[1] != old_port
                await settled([first, b2])
                with trio.fail_after(20):
                    await producer.send("moving", b"after", partition=on_two)
                assert b2.partitions.log_offsets(TopicPartition("moving", on_two)) == (0, 2)


async def test_a_slot_held_in_zookeeper_but_served_by_no_task_is_given_up_and_elected_again(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        cluster = brokers[0].cluster
        assert cluster is not None
        slot, holder = next(iter(cluster.held.items()))
        # What a load that failed leaves behind: the node is ours, nothing serves the slot.
        cluster._drop(holder)
        assert slot not in brokers[0].coordinator.services
        with trio.fail_after(10):
            while not any(
                b.cluster is not None and b.cluster.held.get(slot, holder).epoch > holder.epoch
                for b in brokers
            ):
                await trio.sleep(0.02)
        await settled(brokers)


async def test_sixteen_slots_spread_over_three_brokers_joining_one_by_one(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    settings = {**SETTINGS, "coordinator_slots": 16, "claim_grace": 0.1}
    async with contextlib.AsyncExitStack() as stack:
        brokers: list[Broker] = []
        for i in (1, 2, 3):
            brokers.append(
                await stack.enter_async_context(
                    open_broker(tmp_path / f"b{i}", store=url, broker_id=i, **settings)
                )
            )
            await settled(brokers)  # each joiner takes a share: 16, then 8/8, then 6/5/5
        assert sorted(len(b.coordinator.services) for b in brokers) == [5, 5, 6]


async def test_a_handover_that_leaves_the_same_node_names_is_seen_by_every_broker(
    zookeeper_server, zk_chroot, tmp_path
):
    """A slot given up and won again between two reads leaves /coordinators' names as
    they were; the claim's touch of /coordinators is what makes every broker look."""
    url = zookeeper_server.url(zk_chroot)
    async with open_cluster(url, tmp_path, 2) as brokers:
        second = brokers[1]
        assert second.cluster is not None
        slot = next(iter(second.cluster.held))
        async with open_zookeeper_store(url) as other:
            # Given up and won by "broker 1" in one transaction, as a claim does it.
            await other.multi(
                [
                    Delete(coordinator_path(slot)),
                    Create(coordinator_path(slot), b"1", ephemeral=True),
                    SetData(epoch_path(slot), b"1"),
                    SetData(COORDINATORS, b""),
                ]
            )
            with trio.fail_after(10):
                while slot in second.coordinator.services:
                    await trio.sleep(0.02)
            assert all(b.cluster is not None and b.cluster.holders[slot] == 1 for b in brokers)
        await settled(brokers)  # (the slot is elected again once that session closed)
