"""The Kafka group handlers on the group engine, driven directly on Trio's virtual clock.

No sockets and no Kafka client: the handlers of ``trio_coord.kafka.groups``
are called with kio request objects on an ephemeral broker (in-memory
store), each member on a fake connection, so that the exact time at which
the engine acts can be asserted (``autojump_clock``). A Kafka member that
dies in the middle of a rebalance (its connection ends while the group
waits for it to join again) restarts the rebalance at that very moment, not
after its rebalance timeout; KIP-394's member id is required first; the
leader is answered with every member's metadata and the followers' SyncGroup
carries what the leader assigned them; a leader's assignment that does not
decode fails that rebalance cleanly.
"""

from __future__ import annotations

import math
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import trio
from kafka_fixtures import FakeConnection
from kio.index import load_request_schema

from trio_coord import Broker, open_broker
from trio_coord.broker.events import GroupEvent, RebalanceFailed, RebalanceRestarted
from trio_coord.kafka.codec import KafkaCode, RequestHead
from trio_coord.kafka.dispatch import FrontEnd, RequestContext
from trio_coord.kafka.groups import decode_assignment, encode_assignment, encode_subscription
from trio_coord.kafka.service import KafkaLimits
from trio_coord.protocol.messages import TopicPartition

REBALANCE_TIMEOUT = 300.0


class Recorder:
    """The broker's group events, with their (virtual) times."""

    def __init__(self) -> None:
        self.events: list[GroupEvent] = []

    def __call__(self, event: GroupEvent) -> None:
        self.events.append(event)

    def times(self, what: str) -> list[float]:
        return [e.time for e in self.events if e.kind == what]


@asynccontextmanager
async def front_end(recorder: Recorder) -> AsyncIterator[tuple[Broker, FrontEnd]]:
    async with open_broker(
        None,
        min_session_timeout=0.01,
        initial_rebalance_delay=0.0,
        connections_max_idle=math.inf,
        request_read_timeout=math.inf,
        on_event=recorder,
    ) as broker:
        await broker.topics.create_topic("t", 4)
        yield broker, FrontEnd(broker, KafkaLimits())


class Member:
    """One Kafka member: its connection, its id, and its calls to the handlers."""

    def __init__(self, front: FrontEnd, name: str) -> None:
        self.front = front
        self.name = name
        self.conn = FakeConnection()
        self.member_id = ""
        self.generation = -1
        self.corr = 0

    async def call(self, key: int, version: int, **fields: Any) -> Any:
        self.corr += 1
        schema = load_request_schema(key, version)
        body = schema(**fields)
        ctx = RequestContext(
            self.front, RequestHead(key, version, self.corr), self.name, self.name, conn=self.conn
        )
        api = self.front.table.get(key)
        assert api is not None
        return await api.handler(ctx, body)

    async def join(self, metadata: bytes | None = None) -> Any:
        protocol = sys.modules[load_request_schema(11, 9).__module__].JoinGroupRequestProtocol
        return await self.call(
            11,
            9,
            group_id="g",
            session_timeout=timedelta(seconds=10),
            rebalance_timeout=timedelta(seconds=REBALANCE_TIMEOUT),
            member_id=self.member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(
                protocol(
                    name="range",
                    metadata=encode_subscription(["t"]) if metadata is None else metadata,
                ),
            ),
            reason=None,
        )

    async def join_fully(self) -> Any:
        """KIP-394's two steps: the member id first, then the join proper."""
        first = await self.join()
        assert first.error_code == KafkaCode.member_id_required
        self.member_id = first.member_id
        answer = await self.join()
        assert answer.error_code == KafkaCode.none, answer
        self.generation = answer.generation_id
        return answer

    async def sync(self, assignments: dict[str, bytes] | None = None) -> Any:
        entry = sys.modules[load_request_schema(14, 5).__module__].SyncGroupRequestAssignment
        return await self.call(
            14,
            5,
            group_id="g",
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=tuple(
                entry(member_id=m, assignment=a) for m, a in (assignments or {}).items()
            ),
        )

    async def heartbeat(self) -> Any:
        return await self.call(
            12,
            4,
            group_id="g",
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=None,
        )


def split(answer: Any) -> dict[str, bytes]:
    """The leader's range assignment of "t" (4 partitions) among the members it was given."""
    ids = sorted(m.member_id for m in answer.members)
    return {
        m: encode_assignment(TopicPartition("t", p) for p in range(4) if p % len(ids) == i)
        for i, m in enumerate(ids)
    }


async def join_and_sync(members: list[Member]) -> dict[str, list[TopicPartition]]:
    """Every member joins (in parallel); the leader assigns; every member syncs."""
    answers: dict[str, Any] = {}
    synced: dict[str, list[TopicPartition]] = {}

    async def one(m: Member) -> None:
        answer = await (m.join_fully() if not m.member_id else m.join())
        assert answer.error_code == KafkaCode.none, answer
        m.generation = answer.generation_id
        answers[m.name] = answer
        given = split(answer) if answer.leader == m.member_id else None
        result = await m.sync(given)
        assert result.error_code == KafkaCode.none, result
        synced[m.member_id] = decode_assignment(result.assignment)

    async with trio.open_nursery() as nursery:
        for m in members:
            nursery.start_soon(one, m)
    return synced


async def test_member_dying_mid_rebalance_restarts_it_at_once(autojump_clock: Any) -> None:
    """B is asked to join again and dies instead: the rebalance goes on without it at once."""
    recorder = Recorder()
    async with front_end(recorder) as (broker, front):
        a, b = Member(front, "a"), Member(front, "b")
        synced = await join_and_sync([a, b])
        assert sorted(tp for tps in synced.values() for tp in tps) == [
            TopicPartition("t", p) for p in range(4)
        ]
        runner = broker.coordinator.runner("g")
        assert runner is not None and runner.group.generation == 1
        # C joins: the engine asks A and B to stop (Kafka: join again). A does; B dies.
        c = Member(front, "c")
        async with trio.open_nursery() as nursery:
            results: dict[str, Any] = {}

            async def join_c() -> None:
                results["c"] = await c.join_fully()

            nursery.start_soon(join_c)
            await trio.sleep(1.0)
            assert (await a.heartbeat()).error_code == KafkaCode.rebalance_in_progress
            assert (await b.heartbeat()).error_code == KafkaCode.rebalance_in_progress

            async def rejoin_a() -> None:
                results["a"] = await a.join()

            nursery.start_soon(rejoin_a)
            await trio.sleep(5.0)
            assert not results, "nobody is answered while B has not joined again"
            died = trio.current_time()
            b.conn.close()
        # The moment B died, it was removed and the rebalance restarted without it.
        assert recorder.times("removed")[-1] == died
        assert recorder.times("rebalance_restarted")[-1] == died
        # ... and says why (what the metrics count as trio_coord_rebalance_restarts{cause}):
        restarts = [e for e in recorder.events if isinstance(e, RebalanceRestarted)]
        assert restarts[-1].cause == "crash"
        assert trio.current_time() - died < 0.01  # (not REBALANCE_TIMEOUT later)
        assert {results["a"].generation_id, results["c"].generation_id} == {2}
        leader = a if results["a"].leader == a.member_id else c
        assert {m.member_id for m in results[leader.name].members} == {a.member_id, c.member_id}
        a.generation = c.generation = 2
        async with trio.open_nursery() as nursery:
            got: dict[str, Any] = {}

            async def sync(m: Member) -> None:
                got[m.name] = await m.sync(split(results[m.name]) if m is leader else None)

            nursery.start_soon(sync, a)
            nursery.start_soon(sync, c)
        owned = sorted(tp for r in got.values() for tp in decode_assignment(r.assignment))
        assert owned == [TopicPartition("t", p) for p in range(4)]
        assert (await a.heartbeat()).error_code == KafkaCode.none
        assert runner.group.generation == 2


async def test_bad_leader_assignment_and_metadata_are_refused(autojump_clock: Any) -> None:
    """Undecodable subscription metadata and a leader's garbage assignment: clean errors."""
    recorder = Recorder()
    async with front_end(recorder) as (_, front):
        bad = Member(front, "bad")
        for garbage in (b"", b"\x00", b"\x00\x00\xff\xff\xff\xf0", b"\xff\xff\x00"):
            answer = await bad.join(garbage)
            assert answer.error_code == KafkaCode.inconsistent_group_protocol
        a = Member(front, "a")
        answer = await a.join_fully()
        assert answer.leader == a.member_id
        a.generation = answer.generation_id
        with trio.move_on_after(5):
            result = await a.sync({a.member_id: b"\x00\x00\x00\x00\x00\x09garbage"})
            assert result.error_code == KafkaCode.rebalance_in_progress
        assert recorder.times("rebalance_failed")
        # The group recovers once the leader joins again with a good assignment.
        synced = await join_and_sync([a])
        assert synced[a.member_id] == [TopicPartition("t", p) for p in range(4)]


async def test_leader_assigning_what_does_not_exist_fails_the_rebalance(
    autojump_clock: Any,
) -> None:
    """A partition that does not exist, or given twice: the leader's mistake, then recovery."""
    recorder = Recorder()
    async with front_end(recorder) as (_, front):
        a = Member(front, "a")
        answer = await a.join_fully()
        bad = {a.member_id: encode_assignment([TopicPartition("t", 9), TopicPartition("u", 0)])}
        with trio.move_on_after(5):
            result = await a.sync(bad)
            assert result.error_code == KafkaCode.rebalance_in_progress
        assert answer.leader == a.member_id
        failures = [e.error for e in recorder.events if isinstance(e, RebalanceFailed)]
        assert failures and "LeaderAssignmentError" in failures[0]
        assert "no such partition" in failures[0]
        synced = await join_and_sync([a])
        assert synced[a.member_id] == [TopicPartition("t", p) for p in range(4)]


async def test_a_join_waiting_on_a_closed_connection_ends_at_once(autojump_clock: Any) -> None:
    """The connection of a member waiting in JoinGroup ends: removed, and its handler returns."""
    recorder = Recorder()
    async with front_end(recorder) as (broker, front):
        a, b = Member(front, "a"), Member(front, "b")
        await join_and_sync([a, b])
        c = Member(front, "c")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(c.join_fully)
            await trio.sleep(1.0)
            ended: list[float] = []

            async def rejoin_a() -> None:
                answer = await a.join()
                assert answer.error_code != KafkaCode.none
                ended.append(trio.current_time())

            nursery.start_soon(rejoin_a)
            await trio.sleep(1.0)
            closed = trio.current_time()
            a.conn.close()
            await trio.sleep(0.5)
            assert ended == [closed]
            assert recorder.times("removed")[-1] == closed
            nursery.cancel_scope.cancel()
        runner = broker.coordinator.runner("g")
        assert runner is not None and a.member_id not in runner.group.members


async def test_join_leave_cycles_on_one_connection_hold_one_close_callback(
    autojump_clock: Any,
) -> None:
    """A classic client joining and leaving with fresh ids on one connection holds one close
    callback there, not one per join, and a member that goes silent (its connection still
    open) is forgotten once its session ends: neither grows without bound."""
    from trio_coord.kafka.groups import KafkaGroups

    recorder = Recorder()
    async with front_end(recorder) as (_broker, front):
        m = Member(front, "cycler")
        for _ in range(10):
            m.member_id = ""
            await m.join_fully()
            left = await m.call(13, 4, group_id="g", members=(_leaving(m.member_id),))
            assert left.error_code == KafkaCode.none
        assert len(m.conn._callbacks) <= 1
        groups = front.state(KafkaGroups)
        assert not groups.links and groups.conns.bound() == 0
        # Silent: joined, then nothing (session 10 s): forgotten once the engine removes it.
        m.member_id = ""
        await m.join_fully()
        assert len(groups.links) == 1
        await trio.sleep(30)
        assert not groups.links and groups.conns.bound() == 0
        assert len(m.conn._callbacks) <= 1


def _leaving(member_id: str) -> Any:
    identity = sys.modules[load_request_schema(13, 4).__module__].MemberIdentity
    return identity(member_id=member_id, group_instance_id=None)
