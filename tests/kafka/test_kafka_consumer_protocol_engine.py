"""KIP-848 members (ConsumerGroupHeartbeat) on the group engine, on Trio's virtual clock.

No sockets and no Kafka client: the handler of ``trio_coord.kafka.consumer_groups``
is called with kio request objects on an ephemeral broker (in-memory store), by
model clients that do what a KIP-848 client must: take the assignment a
heartbeat answer carries (giving up what it no longer lists, then starting what
is new), report what they own when it changed, and drop everything when they
could not heartbeat for a session timeout. Hypothesis drives random sequences of
joins, clean leaves, crashes (the connection ends) and stalls (the member goes
silent, still fetching); after every answer no partition has two owners, and
once the sequence ends and the survivors have heartbeated a while, every
partition has exactly one. Examples: a member joining takes partitions from the
others without the others giving up any they keep; a mixed group is refused.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka_fixtures import FakeConnection
from kio.index import load_request_schema
from kio.schema.consumer_group_heartbeat.v1.request import TopicPartitions

from trio_coord import Broker, open_broker
from trio_coord.kafka.codec import KafkaCode, RequestHead
from trio_coord.kafka.dispatch import FrontEnd, RequestContext
from trio_coord.kafka.groups import encode_subscription
from trio_coord.kafka.metadata import TopicIds, topic_id
from trio_coord.kafka.service import KafkaLimits

SESSION = 3.0
INTERVAL = 0.5
TOPIC = "t"
PARTITIONS = 6


@asynccontextmanager
async def front_end() -> AsyncIterator[tuple[Broker, FrontEnd]]:
    async with open_broker(
        None,
        min_session_timeout=0.01,
        initial_rebalance_delay=0.0,
        connections_max_idle=math.inf,
        request_read_timeout=math.inf,
    ) as broker:
        await broker.topics.create_topic(TOPIC, PARTITIONS)
        limits = KafkaLimits(consumer_session_timeout=SESSION, consumer_heartbeat_interval=INTERVAL)
        yield broker, FrontEnd(broker, limits)


async def call(front: FrontEnd, conn: FakeConnection, key: int, version: int, **fields: Any) -> Any:
    body = load_request_schema(key, version)(**fields)
    ctx = RequestContext(front, RequestHead(key, version, 1), "model", "model", conn=conn)
    api = front.table.get(key)
    assert api is not None
    return await api.handler(ctx, body)


class Client:
    """A model KIP-848 client: what it owns, and what it does with each answer."""

    def __init__(self, front: FrontEnd, name: str, group: str = "g") -> None:
        self.front = front
        self.group = group
        self.member_id = uuid.uuid4().hex[:22]
        self.name = name
        self.conn = FakeConnection()
        self.epoch = 0
        self.owned: frozenset[int] = frozenset()
        self.reported: frozenset[int] | None = None
        self.last_ok = trio.current_time()
        self.revoked: list[set[int]] = []
        self.state = "live"  # live, stalled, dead, left

    def lost(self) -> bool:
        """A client that could not heartbeat for a session timeout drops everything."""
        return trio.current_time() - self.last_ok >= SESSION

    async def heartbeat(self) -> Any:
        joining = self.epoch == 0
        changed = self.reported != self.owned
        answer = await call(
            self.front,
            self.conn,
            68,
            1,
            group_id=self.group,
            member_id=self.member_id,
            member_epoch=self.epoch,
            rebalance_timeout=timedelta(seconds=10) if joining else timedelta(milliseconds=-1),
            subscribed_topic_names=(TOPIC,) if joining else None,
            topic_partitions=(
                (
                    TopicPartitions(
                        topic_id=topic_id(self.front.service.topics, TOPIC),
                        partitions=tuple(sorted(self.owned)),
                    ),
                )
                if changed or joining
                else None
            ),
        )
        if changed or joining:
            self.reported = self.owned
        if answer.error_code is not KafkaCode.none:
            self.epoch = 0
            self.owned = frozenset()
            return answer
        self.last_ok = trio.current_time()
        self.epoch = answer.member_epoch
        if answer.assignment is not None:
            target = frozenset(
                int(p)
                for tp in answer.assignment.topic_partitions
                if tp.topic_id == topic_id(self.front.service.topics, TOPIC)
                for p in tp.partitions
            )
            gone = self.owned - target
            if gone:
                self.revoked.append(set(gone))
            self.owned = target  # (revoke, then assign: both before the next heartbeat)
        return answer

    async def leave(self) -> None:
        self.owned = frozenset()
        await call(
            self.front,
            self.conn,
            68,
            1,
            group_id=self.group,
            member_id=self.member_id,
            member_epoch=-1,
            topic_partitions=None,
        )
        self.state = "left"


def owners(clients: list[Client]) -> dict[int, list[str]]:
    """Who may be fetching each partition: live members, and stalled ones not lost yet."""
    out: dict[int, list[str]] = {}
    for c in clients:
        if c.state == "live" or (c.state == "stalled" and not c.lost()):
            for p in c.owned:
                out.setdefault(p, []).append(c.name)
    return out


def check_exclusive(clients: list[Client]) -> None:
    doubled = {p: who for p, who in owners(clients).items() if len(who) > 1}
    assert not doubled, f"partitions with two owners at {trio.current_time():.2f}: {doubled}"


async def run_for(clients: list[Client], seconds: float) -> None:
    """Every live client heartbeats each interval for ``seconds``, exclusivity checked."""
    end = trio.current_time() + seconds
    while trio.current_time() < end:
        for c in clients:
            if c.state == "live":
                await c.heartbeat()
                check_exclusive(clients)
        await trio.sleep(INTERVAL)
        check_exclusive(clients)


ACTIONS = st.lists(
    st.tuples(st.sampled_from(["join", "leave", "crash", "stall", "wait"]), st.integers(0, 7)),
    min_size=1,
    max_size=14,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ACTIONS)
def test_random_joins_leaves_crashes_never_two_owners(actions: list[tuple[str, int]]) -> None:
    """Random joins, leaves, crashes, stalls: never two owners; all owned once it settles."""

    async def main() -> None:
        async with front_end() as (_broker, front):
            clients: list[Client] = [Client(front, "m0")]
            await run_for(clients, 1.0)
            for what, index in actions:
                live = [c for c in clients if c.state == "live"]
                if what == "join":
                    clients.append(Client(front, f"m{len(clients)}"))
                elif live and what == "leave":
                    await live[index % len(live)].leave()
                elif live and what == "crash":
                    victim = live[index % len(live)]
                    victim.state = "dead"
                    victim.owned = frozenset()
                    victim.conn.close()
                elif live and what == "stall":
                    live[index % len(live)].state = "stalled"
                await run_for(clients, INTERVAL * (1 + index % 4))
            if not any(c.state == "live" for c in clients):
                clients.append(Client(front, f"m{len(clients)}"))
            await run_for(clients, 2 * SESSION + 5)
            live = [c for c in clients if c.state == "live"]
            taken = sorted(p for c in live for p in c.owned)
            assert taken == list(range(PARTITIONS)), {c.name: sorted(c.owned) for c in live}
            runner = front.service.coordinator.runner("g")
            assert runner is not None
            assert {m.generation for m in runner.group.members.values()} == {
                runner.group.generation
            }
            assert {c.epoch for c in live} == {runner.group.generation + 1}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_joining_member_moves_only_what_it_takes(autojump_clock: Any) -> None:
    """Two members share six partitions; a third joins: each gives up one, keeps the rest."""
    async with front_end() as (_broker, front):
        a, b = Client(front, "a"), Client(front, "b")
        clients = [a, b]
        await run_for(clients, 3.0)
        assert sorted(a.owned | b.owned) == list(range(PARTITIONS))
        before = {c.name: c.owned for c in clients}
        c = Client(front, "c")
        clients.append(c)
        await run_for(clients, 5.0)
        assert len(c.owned) == 2
        assert sorted(a.owned | b.owned | c.owned) == list(range(PARTITIONS))
        for old in (a, b):
            # It gave up only what the newcomer took, and kept the rest throughout.
            assert old.owned <= before[old.name]
            assert [set(r) for r in old.revoked] == [set(before[old.name] - old.owned)]
            assert before[old.name] - old.owned <= c.owned


async def test_classic_and_consumer_members_never_share_a_group(autojump_clock: Any) -> None:
    """A consumer-protocol join into a classic group is GROUP_ID_NOT_FOUND, and the reverse
    INCONSISTENT_GROUP_PROTOCOL, as Kafka answers without its mixed-group upgrade."""
    import sys

    async with front_end() as (_broker, front):
        member = Client(front, "k", group="kip848")
        await run_for([member], 1.0)
        protocol = sys.modules[load_request_schema(11, 9).__module__].JoinGroupRequestProtocol

        async def classic_join(group: str, member_id: str = "") -> Any:
            """A classic JoinGroup (v9, range) into ``group``, on a connection of its own."""
            return await call(
                front,
                FakeConnection(),
                11,
                9,
                group_id=group,
                session_timeout=timedelta(seconds=10),
                rebalance_timeout=timedelta(seconds=10),
                member_id=member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=(protocol(name="range", metadata=encode_subscription([TOPIC])),),
            )

        classic = await classic_join("kip848")
        assert classic.error_code is KafkaCode.inconsistent_group_protocol

        async with trio.open_nursery() as nursery:
            # A classic member that waits in its JoinGroup (KIP-394's second step).
            first = await classic_join("classic")
            assert first.error_code is KafkaCode.member_id_required
            nursery.start_soon(classic_join, "classic", first.member_id)
            await trio.sleep(0.01)
            other = Client(front, "x", group="classic")
            answer = await other.heartbeat()
            assert answer.error_code is KafkaCode.group_id_not_found
            described = await call(
                front,
                FakeConnection(),
                69,
                0,
                group_ids=("classic", "nope", "kip848"),
                include_authorized_operations=False,
            )
            codes = [g.error_code for g in described.groups]
            assert codes == [KafkaCode.group_id_not_found] * 2 + [KafkaCode.none]
            (kip848,) = described.groups[2].members
            assert kip848.member_id == member.member_id
            assert kip848.member_epoch == member.epoch
            assert len(kip848.target_assignment.topic_partitions[0].partitions) == PARTITIONS
            nursery.cancel_scope.cancel()


async def test_offset_commit_and_fetch_check_the_member_epoch(autojump_clock: Any) -> None:
    """OffsetCommit/OffsetFetch v9 of a KIP-848 member: its epoch commits, another one is
    STALE_MEMBER_EPOCH, a stranger UNKNOWN_MEMBER_ID; an admin (no member, epoch -1) reads."""
    from kio.schema.offset_commit.v9.request import (
        OffsetCommitRequestPartition,
        OffsetCommitRequestTopic,
    )
    from kio.schema.offset_fetch.v9.request import OffsetFetchRequestGroup

    async with front_end() as (_broker, front):
        a = Client(front, "a")
        await run_for([a], 2.0)
        assert a.owned and a.epoch > 0

        async def commit(member_id: str, epoch: int) -> Any:
            answer = await call(
                front,
                a.conn,
                8,
                9,
                group_id="g",
                generation_id_or_member_epoch=epoch,
                member_id=member_id,
                group_instance_id=None,
                topics=(
                    OffsetCommitRequestTopic(
                        name=TOPIC,
                        partitions=(
                            OffsetCommitRequestPartition(
                                partition_index=min(a.owned),
                                committed_offset=0,
                                committed_leader_epoch=-1,
                                committed_metadata=None,
                            ),
                        ),
                    ),
                ),
            )
            return answer.topics[0].partitions[0].error_code

        async def fetch(member_id: str | None, epoch: int) -> Any:
            answer = await call(
                front,
                a.conn,
                9,
                9,
                groups=(
                    OffsetFetchRequestGroup(
                        group_id="g", member_id=member_id, member_epoch=epoch, topics=None
                    ),
                ),
                require_stable=False,
            )
            return answer.groups[0].error_code

        assert await commit(a.member_id, a.epoch) is KafkaCode.none
        assert await commit(a.member_id, a.epoch + 5) is KafkaCode.stale_member_epoch
        assert await commit("stranger", a.epoch) is KafkaCode.unknown_member_id
        assert await fetch(a.member_id, a.epoch) is KafkaCode.none
        assert await fetch(a.member_id, a.epoch + 5) is KafkaCode.stale_member_epoch
        assert await fetch("stranger", 3) is KafkaCode.unknown_member_id
        assert await fetch(None, -1) is KafkaCode.none


async def test_a_bad_regex_or_assignor_is_refused_as_kafka_does(autojump_clock: Any) -> None:
    """A pattern RE2 refuses is INVALID_REGULAR_EXPRESSION; an assignor the broker does not
    have is UNSUPPORTED_ASSIGNOR; neither joins the group."""
    async with front_end() as (_broker, front):

        async def join(**fields: Any) -> Any:
            return await call(
                front,
                FakeConnection(),
                68,
                1,
                group_id="g",
                member_id=uuid.uuid4().hex[:22],
                member_epoch=0,
                rebalance_timeout=timedelta(seconds=10),
                topic_partitions=(),
                **fields,
            )

        bad = await join(subscribed_topic_regex="t(")
        assert bad.error_code is KafkaCode.invalid_regular_expression
        assert "RE2" in bad.error_message
        odd = await join(subscribed_topic_names=(TOPIC,), server_assignor="sticky")
        assert odd.error_code is KafkaCode.unsupported_assignor
        assert front.service.coordinator.runner("g") is None or not (
            front.service.coordinator.runner("g").group.members  # type: ignore[union-attr]
        )
        good = await join(subscribed_topic_regex="t|u", server_assignor="range")
        assert good.error_code is KafkaCode.none and good.member_epoch > 0


async def test_a_heartbeat_that_changes_the_subscription_rebalances(autojump_clock: Any) -> None:
    """A member that adds a topic in a later heartbeat is given its partitions too."""
    async with front_end() as (broker, front):
        await broker.topics.create_topic("u", 2)
        a = Client(front, "a")
        await run_for([a], 2.0)
        assert a.owned == frozenset(range(PARTITIONS))
        answer = await call(
            front,
            a.conn,
            68,
            1,
            group_id="g",
            member_id=a.member_id,
            member_epoch=a.epoch,
            subscribed_topic_names=(TOPIC, "u"),
            topic_partitions=None,
        )
        assert answer.error_code is KafkaCode.none
        epoch = answer.member_epoch
        for _ in range(10):
            await trio.sleep(INTERVAL)
            answer = await call(
                front,
                a.conn,
                68,
                1,
                group_id="g",
                member_id=a.member_id,
                member_epoch=epoch,
                topic_partitions=None,
            )
            assert answer.error_code is KafkaCode.none
            epoch = answer.member_epoch
            if answer.assignment is not None:
                names = {
                    front.state(TopicIds).name(tp.topic_id): len(tp.partitions)
                    for tp in answer.assignment.topic_partitions
                }
                if names == {TOPIC: PARTITIONS, "u": 2}:
                    break
        else:
            raise AssertionError("the new topic's partitions never came")


async def test_joins_on_one_connection_do_not_pile_up_close_callbacks(
    autojump_clock: Any,
) -> None:
    """A client that keeps joining on one connection (refused joins, or join-leave cycles
    with fresh member ids) holds one close callback there, not one per join: the
    connection's memory must not grow with the requests a hostile client sends."""
    async with front_end() as (_broker, front):
        conn = FakeConnection()

        async def beat(member_id: str, epoch: int, **fields: Any) -> Any:
            return await call(
                front,
                conn,
                68,
                1,
                group_id="g",
                member_id=member_id,
                member_epoch=epoch,
                rebalance_timeout=timedelta(seconds=10),
                topic_partitions=(),
                **fields,
            )

        for _ in range(20):
            odd = await beat(
                uuid.uuid4().hex[:22], 0, subscribed_topic_names=(TOPIC,), server_assignor="sticky"
            )
            assert odd.error_code is KafkaCode.unsupported_assignor
        for _ in range(20):
            member_id = uuid.uuid4().hex[:22]
            joined = await beat(member_id, 0, subscribed_topic_names=(TOPIC,))
            assert joined.error_code is KafkaCode.none
            await beat(member_id, -1)
        assert len(conn._callbacks) <= 1
        # The connection's end still reaches a member living on it.
        member_id = uuid.uuid4().hex[:22]
        assert (await beat(member_id, 0, subscribed_topic_names=(TOPIC,))).error_code is (
            KafkaCode.none
        )
        runner = front.service.coordinator.runner("g")
        assert runner is not None and len(runner.group.members) == 1
        conn.close()
        await trio.sleep(1)
        assert not runner.group.members


async def test_unknown_topic_ids_do_not_rebuild_the_id_map_each_time(
    autojump_clock: Any, monkeypatch: Any
) -> None:
    """Made-up topic ids (Metadata v10+, a heartbeat's owned partitions) are looked up in
    O(1): the id → name map is rebuilt only when the topics changed, not once per unknown
    id (a request naming thousands would stall the event loop for O(ids x topics))."""
    import trio_coord.kafka.metadata as metadata

    async with front_end() as (broker, front):
        for n in range(20):
            await broker.topics.create_topic(f"x{n}", 1)
        ids = front.state(TopicIds)
        assert ids.name(topic_id(front.service.topics, "x3")) == "x3"
        calls = 0
        real = metadata.topic_id

        def counting(topics: Any, name: str) -> Any:
            nonlocal calls
            calls += 1
            return real(topics, name)

        monkeypatch.setattr(metadata, "topic_id", counting)
        for _ in range(200):
            assert ids.name(uuid.uuid4()) is None
        assert calls <= 2 * 21, calls
        # A topic created since is found (the topics changed: the map is rebuilt).
        await broker.topics.create_topic("late", 1)
        assert ids.name(real(front.service.topics, "late")) == "late"
        await broker.topics.delete_topic("x3")
        assert ids.name(real(front.service.topics, "x4")) == "x4"


async def test_a_member_whose_session_ends_is_forgotten(autojump_clock: Any) -> None:
    """A KIP-848 member that stops heartbeating (its connection still open) is removed by
    the engine at its session timeout, and its link goes with it: a client joining with
    fresh member ids and going silent must not grow the broker's tables without bound."""
    from trio_coord.kafka.consumer_groups import ConsumerGroups

    async with front_end() as (_broker, front):
        conn = FakeConnection()
        silent = []
        for _ in range(5):
            member_id = uuid.uuid4().hex[:22]
            answer = await call(
                front,
                conn,
                68,
                1,
                group_id="g",
                member_id=member_id,
                member_epoch=0,
                rebalance_timeout=timedelta(seconds=10),
                subscribed_topic_names=(TOPIC,),
                topic_partitions=(),
            )
            assert answer.error_code is KafkaCode.none
            silent.append(member_id)
        groups = front.state(ConsumerGroups)
        assert len(groups.links) == 5
        await trio.sleep(SESSION * 3)
        runner = front.service.coordinator.runner("g")
        assert runner is not None and not runner.group.members
        assert not groups.links and not groups.by_engine and not groups.by_group
        assert groups.conns.bound() == 0


async def test_a_static_leave_must_come_from_the_member_holding_the_instance_id(
    autojump_clock: Any,
) -> None:
    """Epoch -2 steps a static member out only if it comes from that member: another
    member id naming the same group.instance.id is FENCED_INSTANCE_ID, as Kafka answers,
    and the member keeps its place."""
    from trio_coord.kafka.consumer_groups import ConsumerGroups

    async with front_end() as (_broker, front):
        owner = uuid.uuid4().hex[:22]

        async def beat(member_id: str, epoch: int, **fields: Any) -> Any:
            return await call(
                front,
                FakeConnection(),
                68,
                1,
                group_id="g",
                member_id=member_id,
                member_epoch=epoch,
                instance_id="i1",
                rebalance_timeout=timedelta(seconds=10),
                topic_partitions=(),
                **fields,
            )

        assert (await beat(owner, 0, subscribed_topic_names=(TOPIC,))).error_code is (
            KafkaCode.none
        )
        groups = front.state(ConsumerGroups)
        intruder = await beat(uuid.uuid4().hex[:22], -2)
        assert intruder.error_code is KafkaCode.fenced_instance_id
        assert ("g", owner) in groups.links and not groups.links[("g", owner)].dropped
        assert (await beat(owner, -2)).error_code is KafkaCode.none
        assert ("g", owner) not in groups.links
