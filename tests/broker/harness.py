"""A harness for exact-time broker tests: fake members over in-memory streams.

A :class:`FakeMember` speaks the real protocol to a real broker (an
ephemeral one: in-memory store, no threads) through
``trio.testing.memory_stream_pair``, so that the whole exchange runs on
Trio's virtual clock (``autojump_clock``) and a test can assert the exact
time at which the coordinator did something. A fake member answers
StopFetchers and StartFetchers itself, or holds them (``hold_stop``) to play
a member that hangs, and records when it owned what.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio
import trio.testing

from trio_coord import Broker, open_broker
from trio_coord.broker.events import GroupEvent
from trio_coord.core.assignors import GroupSpec, MemberSpec
from trio_coord.protocol import (
    ComputeAssignmentRequest,
    ComputeAssignmentResponse,
    Connection,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberAssignment,
    RequestBody,
    RequestHandler,
    ResponseBody,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
    TopicPartition,
)


@dataclass
class Ownership:
    """One member's ownership interval of one partition (end None: still owned)."""

    member: str
    tp: TopicPartition
    start: float
    end: float | None = None


@dataclass
class Timeline:
    """Who owned which partition when, as the members themselves saw it."""

    intervals: list[Ownership] = field(default_factory=list)

    def start(self, member: str, tps: list[TopicPartition]) -> None:
        now = trio.current_time()
        self.intervals.extend(Ownership(member, tp, now) for tp in tps)

    def stop(self, member: str, tps: list[TopicPartition] | None = None) -> None:
        now = trio.current_time()
        for interval in self.intervals:
            if (
                interval.member == member
                and interval.end is None
                and (tps is None or interval.tp in tps)
            ):
                interval.end = now

    def overlaps(self) -> list[tuple[Ownership, Ownership]]:
        """Pairs of intervals in which two members owned one partition at once."""
        found = []
        by_tp: dict[TopicPartition, list[Ownership]] = {}
        for interval in self.intervals:
            by_tp.setdefault(interval.tp, []).append(interval)
        for intervals in by_tp.values():
            for i, a in enumerate(intervals):
                for b in intervals[i + 1 :]:
                    if a.member == b.member:
                        continue
                    a_end = a.end if a.end is not None else float("inf")
                    b_end = b.end if b.end is not None else float("inf")
                    if a.start < b_end and b.start < a_end:
                        found.append((a, b))
        return found


class FakeMember(RequestHandler):
    """A group member under the test's control; see the module docstring."""

    def __init__(
        self,
        broker: Broker,
        group: str,
        topics: list[str],
        *,
        session_timeout: float = 10.0,
        rebalance_timeout: float = 5.0,
        timeline: Timeline | None = None,
        name: str = "",
        protocol: str = "eager",
        assignors: list[str] | None = None,
        instance_id: str = "",
        compute: Any = None,
        process: str = "",
    ) -> None:
        self.broker = broker
        self.group = group
        self.topics = topics
        self.session_timeout = session_timeout
        self.rebalance_timeout = rebalance_timeout
        self.timeline = timeline if timeline is not None else Timeline()
        self.name = name
        self.rack = ""
        self.member_id = ""
        self.generation = -1
        self.owned: list[TopicPartition] = []
        self.start_offsets: dict[TopicPartition, int] = {}
        self.pushes: list[tuple[float, str]] = []
        self.hold_stop = False
        self.stop_delay = 0.0  # seconds a StopFetchers takes to answer
        self.hold_start = False
        self.hold_compute = False
        self.protocol = protocol
        self.assignors = assignors or ["range"]
        self.instance_id = instance_id
        self.compute = compute  # an assignor this member runs as the group's leader
        self.stops: list[tuple[float, list[TopicPartition] | None]] = []
        self.parts: list[StartFetchersRequest] = []  # of an assignment cut in parts
        self.start_requests = 0  # StartFetchers received, every part counted
        self.frame: int | None = None  # the frame its joins say it reads (None: not said)
        # The timeline's name for this member: its member id, unless it is one of
        # several processes of one static member (which share their member id).
        self.process = process

        self.conn: Connection | None = None
        self.dead = False

    async def handle(self, body: RequestBody) -> ResponseBody:
        now = trio.current_time()
        if isinstance(body, StopFetchersRequest):
            self.pushes.append((now, "stop"))
            self.parts = []
            self.stops.append((now, body.partitions))
            if self.hold_stop:
                await trio.sleep_forever()
            await trio.sleep(self.stop_delay)
            if body.partitions is None:
                self.timeline.stop(self.who)
                self.owned = []
            else:
                self.timeline.stop(self.who, body.partitions)
                self.owned = [tp for tp in self.owned if tp not in body.partitions]
            return StopFetchersResponse()
        if isinstance(body, StartFetchersRequest):
            self.start_requests += 1
            self.parts.append(body)
            if body.more:  # the assignment continues in the next part
                return StartFetchersResponse()
            body = msgspec.structs.replace(
                body, partitions=[p for part in self.parts for p in part.partitions]
            )
            self.parts = []
            self.pushes.append((now, "start"))
            if self.hold_start:
                await trio.sleep_forever()
            self.generation = body.generation
            if body.unchanged:  # the same partitions, in the new generation
                return StartFetchersResponse()
            wanted = [p.tp for p in body.partitions]
            if body.incremental:
                added = [tp for tp in wanted if tp not in self.owned]
                self.timeline.stop(self.who, [tp for tp in self.owned if tp not in wanted])
            else:
                self.timeline.stop(self.who)
                added = wanted
            self.owned = wanted
            self.start_offsets = {p.tp: p.offset for p in body.partitions}
            self.timeline.start(self.who, added)
            return StartFetchersResponse()
        if isinstance(body, ComputeAssignmentRequest):
            self.pushes.append((now, "compute"))
            if self.hold_compute:
                await trio.sleep_forever()
            spec = GroupSpec(
                {
                    m.member_id: MemberSpec(
                        m.member_id, frozenset(m.topics), frozenset(m.owned), m.user_data
                    )
                    for m in body.members
                },
                dict(body.partitions),
            )
            result = self.compute.assign(spec)
            return ComputeAssignmentResponse(
                [MemberAssignment(m, sorted(tps)) for m, tps in sorted(result.items())]
            )
        return await super().handle(body)

    @property
    def who(self) -> str:
        """The name this member's ownership goes by in the timeline."""
        return self.process or self.member_id

    async def join(self) -> JoinGroupResponse:
        """Join (both steps: a new member is given its id, then joins with it)."""
        response = await self.join_once()
        if response.rejoin:
            response = await self.join_once()
        return response

    async def join_once(self) -> JoinGroupResponse:
        """One JoinGroup request, as it is."""
        assert self.conn is not None
        response = await self.conn.request(
            JoinGroupRequest(
                self.group,
                self.member_id,
                self.topics,
                round(self.session_timeout * 1000),
                round(self.rebalance_timeout * 1000),
                self.assignors,
                client_id=self.name or "fake",
                rebalance_protocol=self.protocol,
                instance_id=self.instance_id,
                client_assignors=[self.compute.name] if self.compute is not None else [],
                rack=self.rack,
                owned=self.owned if self.member_id else None,
                **({} if self.frame is None else {"max_frame_size": self.frame}),
            )
        )
        assert isinstance(response, JoinGroupResponse)
        self.member_id = response.member_id
        if self.generation < 0 and not response.rejoin:  # (a first step is no join)
            self.generation = response.generation
        return response

    async def heartbeat(self) -> None:
        assert self.conn is not None
        await self.conn.request(HeartbeatRequest(self.group, self.member_id, self.generation))

    async def leave(self, *, stay: bool = False) -> None:
        """LeaveGroup after stopping; ``stay``: a static member stepping out for a restart."""
        assert self.conn is not None
        self.timeline.stop(self.who)
        self.owned = []
        await self.conn.request(LeaveGroupRequest(self.group, self.member_id, stay=stay))

    async def crash(self) -> None:
        """Drop the connection without a word (the process died).

        Ownership, as the member saw it, ends only when its lease would have:
        a crashed process owns nothing, but a cut-off one keeps fetching until
        then, and that is the case the coordinator must be safe against.
        """
        assert self.conn is not None
        self.dead = True
        await self.conn.aclose()


@asynccontextmanager
async def ephemeral_broker(**settings: Any) -> AsyncIterator[Broker]:
    """A broker on an in-memory store, safe to use on the virtual clock."""
    settings.setdefault("min_session_timeout", 0.01)
    settings.setdefault("initial_rebalance_delay", 0.0)  # exact times: no debounce unless asked
    # No idle or slow-frame reaping unless asked: while a worker thread runs, the autojump
    # clock would race to the reaper's deadlines and close connections merely waiting.
    settings.setdefault("connections_max_idle", math.inf)
    settings.setdefault("request_read_timeout", math.inf)
    async with open_broker(None, **settings) as broker:
        yield broker


class _WholeSends(trio.abc.Stream):
    """A memory stream whose ``send_all`` cannot be cancelled half-way, like a socket's
    when its buffer has room (trio's memory streams checkpoint before they send, so a
    cancelled request would look torn and close the connection, as no socket does)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self._inner = inner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with trio.CancelScope(shield=True):  # (a memory stream's buffer never fills)
            await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def connected(member: FakeMember) -> AsyncIterator[FakeMember]:
    """Connect ``member`` to its broker over an in-memory stream pair."""
    client_side, broker_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(member.broker.serve_stream, _WholeSends(broker_side))
        member.conn = Connection(client_side, member, name=f"fake-{member.name}")
        await nursery.start(member.conn.serve)
        try:
            yield member
        finally:
            nursery.cancel_scope.cancel()


async def heartbeat_forever(member: FakeMember, interval: float) -> None:
    """Heartbeat every ``interval`` until cancelled or the member is dead."""
    while not member.dead:
        await member.heartbeat()
        await trio.sleep(interval)


class Recorder:
    """Collects the broker's group events (``BrokerConfig.on_event``) and awaits them.

    Each event is kept as it came (:attr:`typed`) and as ``(kind, its fields as a
    dict)`` (:attr:`events`), which ``wait_for`` matches on.
    """

    def __init__(self) -> None:
        self.typed: list[GroupEvent] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._changed = trio.Event()

    def __call__(self, event: GroupEvent) -> None:
        self.typed.append(event)
        self.events.append((event.kind, msgspec.structs.asdict(event)))
        self._changed.set()
        self._changed = trio.Event()

    def mark(self) -> int:
        """A position in the event list, for ``wait_for(..., since=mark)``."""
        return len(self.events)

    def all(self, what: str, since: int = 0) -> list[dict[str, Any]]:
        """Every event named ``what`` after ``since``."""
        return [d for w, d in self.events[since:] if w == what]

    async def wait_for(
        self, what: str, since: int = 0, *, within: float = 600.0, **match: Any
    ) -> dict[str, Any]:
        """Return the first event ``what`` after ``since`` whose details match.

        Fails (rather than hangs) if it has not happened ``within`` seconds of
        virtual time, listing the events seen.
        """
        with trio.move_on_after(within):
            while True:
                for name, details in self.events[since:]:
                    if name == what and all(details.get(k) == v for k, v in match.items()):
                        return details
                await self._changed.wait()
        seen = "\n".join(f"  {w} {d}" for w, d in self.events[since:])
        raise AssertionError(f"no {what} event matching {match} within {within}s; saw:\n{seen}")


async def join_one_by_one(rec: Recorder, *fakes: FakeMember) -> None:
    """Join each member and wait for its group to be stable with it."""
    for fake in fakes:
        mark = rec.mark()
        await fake.join()
        await rec.wait_for("stable", since=mark, group=fake.group)


def _stop_at(self: Timeline, member: str, when: float) -> None:
    """End ``member``'s open intervals at ``when`` (a crashed member's lease end)."""
    for interval in self.intervals:
        if interval.member == member and interval.end is None:
            interval.end = when


Timeline.stop_at = _stop_at  # type: ignore[attr-defined]
