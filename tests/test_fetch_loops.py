"""The consumer's fetch loops against refusing brokers: what they send, what the application hears.

Two scripted brokers over real sockets (in this process) stand for a cluster
whose metadata lags a leader move, or that refuses the client's fetches:
a leader that Metadata keeps naming although it lost the partition is asked
again after a backoff, not in a hot loop of round trips, yet a real move is
followed at once; and one cause that refuses several fetches in flight
together reaches the application once per backoff, not once per fetch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import pytest
import trio
import trio.testing

from trio_coord import TopicPartition, open_consumer
from trio_coord.client import _fetcher
from trio_coord.protocol.connection import Connection, RequestHandler
from trio_coord.protocol.errors import (
    AuthorizationError,
    InvalidRequestError,
    NotLeaderForPartitionError,
    StorageError,
)
from trio_coord.protocol.messages import (
    EARLIEST,
    BrokerInfo,
    FetchedBatch,
    FetchedPartition,
    FetchRequest,
    FetchResponse,
    ListedOffset,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    RequestBody,
    ResponseBody,
    TopicInfo,
)
from trio_coord.protocol.records import WireRecord, encode_batch

TOPIC = "t"

FetchHook = Callable[[int, FetchRequest], Awaitable[None]]


@dataclass
class Script:
    """Two brokers' shared view: who holds the topic's partitions, who Metadata names, the
    records of each partition, and every request asked (by broker and kind)."""

    partitions: int = 1
    leader: int = 1
    """The broker holding every partition; the other answers NOT_LEADER_FOR_PARTITION."""
    named: int = 1
    """The broker Metadata names as every partition's leader (stale while not ``leader``)."""
    logs: dict[int, list[bytes]] = field(default_factory=dict)
    on_fetch: FetchHook | None = None
    """Awaited before the leader answers a fetch (it may wait, or raise to refuse it)."""
    on_list: Callable[[ListOffsetsRequest], Awaitable[None]] | None = None
    """Awaited before the leader answers an offsets lookup (it may wait)."""
    omit: int = 0
    """How many offsets lookups to come are answered for none of their partitions."""
    unanswered: frozenset[int] = frozenset()
    """Partitions every fetch answer leaves out (a broker of another version, or a bug)."""
    one_record: bool = False
    """A fetch answer holds one record per partition (as if cut by ``max_bytes``)."""
    asked: list[tuple[int, str]] = field(default_factory=list)
    fetching: dict[int, int] = field(default_factory=dict)
    """Per partition, the fetches of it being answered now."""
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    appended: trio.Event = field(default_factory=trio.Event)

    def append(self, partition: int, value: bytes) -> None:
        self.logs.setdefault(partition, []).append(value)
        self.appended.set()
        self.appended = trio.Event()

    def count(self, kind: type[RequestBody], since: int = 0) -> int:
        return sum(1 for _, asked in self.asked[since:] if asked == kind.__name__)

    async def answer(self, broker: int, body: RequestBody) -> ResponseBody:
        self.asked.append((broker, type(body).__name__))
        if isinstance(body, MetadataRequest):
            leaders = [self.named] * self.partitions
            topics = [TopicInfo(TOPIC, self.partitions, leaders)]
            return MetadataResponse([self.brokers[b] for b in sorted(self.brokers)], topics)
        if isinstance(body, ListOffsetsRequest):
            self._require(broker)
            if self.on_list is not None:
                await self.on_list(body)
            if self.omit:
                self.omit -= 1
                return ListOffsetsResponse([])
            return ListOffsetsResponse(
                [
                    ListedOffset(tp.topic, tp.partition, *self._offsets(tp.partition, body))
                    for tp in body.partitions
                ]
            )
        assert isinstance(body, FetchRequest), body
        for p in body.partitions:
            self.fetching[p.partition] = self.fetching.get(p.partition, 0) + 1
        try:
            return await self._fetch(broker, body)
        finally:
            for p in body.partitions:
                self.fetching[p.partition] -= 1

    async def _fetch(self, broker: int, body: FetchRequest) -> FetchResponse:
        if broker == self.leader:
            if self.on_fetch is not None:
                await self.on_fetch(broker, body)
            with trio.move_on_after(body.max_wait_ms / 1000):
                while not any(
                    p.offset < len(self.logs.get(p.partition, [])) for p in body.partitions
                ):
                    await self.appended.wait()
        if broker != self.leader:  # (also when it moved during the long poll)
            message = f"broker {broker} does not hold {TOPIC}; broker {self.leader} does"
            code = NotLeaderForPartitionError.code
            refused = [
                FetchedPartition(p.topic, p.partition, code, message, -1, -1)
                for p in body.partitions
            ]
            return FetchResponse(refused)
        return FetchResponse(
            [
                self._fetched(p.partition, p.offset)
                for p in body.partitions
                if p.partition not in self.unanswered
            ]
        )

    def _require(self, broker: int) -> None:
        if broker != self.leader:
            raise NotLeaderForPartitionError(f"broker {broker} does not hold {TOPIC}")

    def _offsets(self, partition: int, body: ListOffsetsRequest) -> tuple[int, int, int]:
        end = len(self.logs.get(partition, []))
        return (0 if body.timestamp_ms == EARLIEST else end), 0, end

    def _fetched(self, partition: int, offset: int) -> FetchedPartition:
        log = self.logs.get(partition, [])
        batches = []
        if offset < len(log):
            values = log[offset : offset + 1] if self.one_record else log[offset:]
            records = [WireRecord(1_700_000_000_000, None, value) for value in values]
            batches = [FetchedBatch(offset, len(records), encode_batch(records))]
        return FetchedPartition(TOPIC, partition, 0, "", 0, len(log), batches)


class _Handler(RequestHandler):
    def __init__(self, script: Script, broker_id: int) -> None:
        self._script = script
        self._broker_id = broker_id

    async def handle(self, body: RequestBody) -> ResponseBody:
        return await self._script.answer(self._broker_id, body)


async def _serve(script: Script, broker_id: int, stream: trio.SocketStream) -> None:
    await Connection(stream, _Handler(script, broker_id), name=f"broker {broker_id}").serve()


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    """Brokers 1 and 2 answering as ``script`` says; yields the bootstrap (broker 1)."""
    async with trio.open_nursery() as nursery:
        for broker_id in (1, 2):
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = listeners[0].socket.getsockname()[1]
            script.brokers[broker_id] = BrokerInfo(broker_id, "127.0.0.1", port)
            nursery.start_soon(trio.serve_listeners, partial(_serve, script, broker_id), listeners)
        yield script.brokers[1].address
        nursery.cancel_scope.cancel()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await trio.sleep(0.005)


@pytest.mark.parametrize("placed", [True, False], ids=["fetch", "offsets-lookup"])
async def test_a_leader_metadata_keeps_naming_after_it_moved_is_not_asked_in_a_hot_loop(placed):
    # Broker 2 holds the partition, but Metadata still names broker 1 (ZooKeeper watches
    # lag; a broker that lost the partition answers from its stale view). Each NOT_LEADER
    # restarted the fetch loops, which asked Metadata and broker 1 again at once: a hot
    # loop of round trips for as long as the cluster took to converge.
    script = Script(leader=2, named=1)
    script.append(0, b"r0")
    tp = TopicPartition(TOPIC, 0)
    async with scripted(script) as bootstrap:
        async with open_consumer(bootstrap, partitions=[tp], offset_reset="earliest") as consumer:
            if placed:  # (fetched at once; not placed: the offsets lookup is refused first)
                consumer.seek(tp, 0)
            with trio.fail_after(10):  # a hang guard
                await _until(lambda: (1, "MetadataRequest") in script.asked[1:])
            before = len(script.asked)
            await trio.sleep(1.0)
            stale = script.asked[before:]
            # The metadata converges: broker 2 is named, and the record is read from it.
            converged = len(script.asked)
            script.named = 2
            with trio.fail_after(10):  # a hang guard (the longest backoff is 1.2 s)
                record = await consumer.getone()
    refused = "FetchRequest" if placed else "ListOffsetsRequest"
    asked_stale = sum(1 for broker, kind in stale if (broker, kind) == (1, refused))
    lookups = sum(1 for _, kind in stale if kind == "MetadataRequest")
    # A second of it, backing off 0.1, 0.2, 0.4, 0.8 s (±20%): at most 5 of each (it was
    # about a thousand), and at least one (the partition is looked up again all along).
    assert 1 <= asked_stale <= 6, (asked_stale, lookups)
    assert 1 <= lookups <= 6, (asked_stale, lookups)
    assert (record.offset, record.value) == (0, b"r0")
    # Once the metadata names the real leader, one lookup finds it (two if one was sent
    # just before the change).
    assert script.count(MetadataRequest, converged) <= 2, script.asked[converged:]


async def test_a_real_move_after_a_quiet_spell_is_followed_at_once(monkeypatch):
    # The backoff must not delay the first lookup after a real move: the new leader is
    # found at once, each time the last move was confirmed by a fetch. (A backoff of 30 s
    # here: waiting for it would fail the hang guard.)
    monkeypatch.setattr(_fetcher, "_MOVE_BACKOFF", (30.0, 30.0))
    script = Script(leader=1, named=1)
    tp = TopicPartition(TOPIC, 0)
    async with scripted(script) as bootstrap:
        async with open_consumer(bootstrap, partitions=[tp], offset_reset="earliest") as consumer:
            read = []
            for i, leader in enumerate([1, 2, 1, 2]):
                script.leader = script.named = leader
                script.append(0, f"r{i}".encode())
                with trio.fail_after(10):  # (a hang guard, far under the 30 s backoff)
                    read.append(await consumer.getone())
    assert [(r.offset, r.value) for r in read] == [(i, f"r{i}".encode()) for i in range(4)]
    fetched_from = [broker for broker, kind in script.asked if kind == "FetchRequest"]
    assert {1, 2} <= set(fetched_from)


_AUTH = AuthorizationError(f"not authorized to read topic {TOPIC!r}; ask for the Read ACL")
_STORAGE = StorageError("the broker's log directory is not writable; see its logs")


@pytest.mark.parametrize(
    ("rounds", "told"),
    [
        ([[_AUTH] * 3], ["AuthorizationError"]),
        ([[_AUTH] * 3, [_AUTH] * 3], ["AuthorizationError", "AuthorizationError"]),
        ([[_STORAGE, _AUTH, _AUTH]], ["AuthorizationError", "StorageError"]),
    ],
    ids=["once", "persisting", "distinct"],
)
async def test_one_cause_refusing_several_fetches_in_flight_is_told_once_per_backoff(rounds, told):
    # Three partitions, each drained (and fetched) in turn: three fetches in flight, which
    # the broker refuses together (in each round, once it has been asked for all three
    # partitions; each partition's fetch with the error given for it). Each refused fetch
    # was told to the application: the same error three times in a row. Now a cause is
    # told once per backoff: again if it persists past the backoff (a second round), and
    # distinct causes each.
    script = Script(leader=1, named=1, partitions=3, one_record=True)
    for p in range(3):
        for i in range(3):
            script.append(p, f"p{p}-r{i}".encode())
    pending = [list(errors) for errors in rounds]
    held: set[int] = set()
    ever_held: set[int] = set()
    released = trio.Event()

    async def refuse(broker: int, body: FetchRequest) -> None:
        nonlocal released
        if not pending or all(p.offset == 0 for p in body.partitions):
            return  # (the first fetch, and those after the last round, are answered)
        errors = pending[0]
        held.update(p.partition for p in body.partitions)
        ever_held.update(held)
        if held == {0, 1, 2}:
            pending.pop(0)
            held.clear()
            released.set()
        round_released = released
        await round_released.wait()
        if round_released is released:
            released = trio.Event()  # (the next round's)
        raise errors[body.partitions[0].partition]

    script.on_fetch = refuse
    tps = [TopicPartition(TOPIC, p) for p in range(3)]
    got = []
    raised = []
    async with scripted(script) as bootstrap:
        async with open_consumer(bootstrap, partitions=tps, offset_reset="earliest") as consumer:
            with trio.fail_after(10):  # a hang guard
                for _ in range(3):  # (each drained, and so fetched, on its own)
                    (record,) = await consumer.getmany(max_records=1)
                    got.append(record)
                    await _until(lambda record=record: record.partition in ever_held)
                while len(got) < 9:
                    try:
                        got += await consumer.getmany(max_records=1)
                    except (AuthorizationError, StorageError) as exc:
                        raised.append(exc)
    assert sorted(type(exc).__name__ for exc in raised) == told
    assert {str(exc) for exc in raised} == {str(e) for errors in rounds for e in errors}
    # Every record, in order per partition: nothing is skipped for the refusals.
    for p in range(3):
        assert [r.value for r in got if r.partition == p] == [
            f"p{p}-r{i}".encode() for i in range(3)
        ]


async def test_a_paused_partition_first_in_line_does_not_keep_caught_up_ones_from_their_poll():
    # A fetch loop queues the partitions with records left (to fetch at once) ahead of the
    # caught-up ones (to long-poll), and drops from the queue one paused since it was
    # queued. Partition 0 was queued with records left, then paused while the loop looked
    # up where partition 1 (resumed) starts; partition 1 then waited, caught up, with no
    # fetch in flight: the loop found nothing to fetch in the first queue and slept
    # without looking at the second, and partition 1's records never came.
    script = Script(partitions=2, one_record=True)
    for value in (b"a0", b"a1", b"a2"):
        script.append(0, value)
    tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    looked_up = trio.Event()
    release = trio.Event()
    holding = False

    async def hold(body: ListOffsetsRequest) -> None:
        if holding:
            looked_up.set()
            await release.wait()

    script.on_list = hold
    async with scripted(script) as bootstrap:
        async with open_consumer(
            bootstrap, partitions=[tp0, tp1], offset_reset="earliest", fetch_max_wait=0.1
        ) as consumer:
            consumer.pause(tp1)  # (not placed while paused)
            with trio.fail_after(10):  # a hang guard
                assert (await consumer.getone()).value == b"a0"
                await _until(lambda: not script.fetching.get(0) and not script.fetching.get(1))
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)  # (a1 buffered)
            holding = True
            # Partition 0 drained (records left on the broker) and partition 1 resumed, at
            # once: the loop queues the one and looks up where the other starts (held).
            assert (await consumer.getone()).value == b"a1"
            consumer.seek_to_beginning(tp1)  # (if it was placed before the pause)
            consumer.resume(tp1)
            with trio.fail_after(10):
                await looked_up.wait()
            consumer.pause(tp0)
            release.set()
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            script.append(1, b"b0")
            with trio.fail_after(10):  # a hang guard (fetch_max_wait is 0.1 s)
                record = await consumer.getone()
    assert (record.partition, record.value) == (1, b"b0")


async def test_a_caught_up_partition_is_polled_while_a_backlog_keeps_every_fetch_busy():
    # A broker of a small frame takes one partition per fetch: four partitions with a
    # backlog keep the loop's three fetches busy, each drained and fetched again at once.
    # The caught-up partition must still be asked, its records not held back until the
    # backlog is read: the partitions wait their turn, the longest waiting first, as they
    # did before the loop kept those with records left in a queue of their own.
    backlog = 300
    script = Script(partitions=5, one_record=True)
    for p in range(4):
        for i in range(backlog):
            script.append(p, f"p{p}-r{i}".encode())

    async def one_at_a_time(broker: int, body: FetchRequest) -> None:
        if len(body.partitions) > 1:
            raise InvalidRequestError("fetch fewer partitions per request")

    script.on_fetch = one_at_a_time
    tps = [TopicPartition(TOPIC, p) for p in range(5)]
    read_before = None
    read = appended = 0
    async with scripted(script) as bootstrap:
        async with open_consumer(
            bootstrap, partitions=tps, offset_reset="earliest", fetch_max_wait=0.05
        ) as consumer:
            with trio.fail_after(20):  # a hang guard
                while read < 20 or script.fetching.get(4):
                    read += len(await consumer.getmany(max_records=1))
                script.append(4, b"caught-up")  # (not in a poll now: waiting its turn)
                appended = read
                while read_before is None:
                    for record in await consumer.getmany(max_records=1):
                        if record.partition == 4:
                            read_before = read
                        read += 1
    # Read within a few turns of the five partitions (one record a fetch), not after the
    # backlog (hundreds of records later).
    assert read_before is not None and read_before - appended < 20, (appended, read_before)


async def test_a_partition_an_offsets_lookup_left_out_is_looked_up_again():
    # A broker answering an offsets lookup without one of its partitions (a broker of
    # another version, or a bug) left it with no position; the loop asked again only
    # when something else woke it, and a consumer of that one partition never did.
    script = Script(omit=1)
    script.append(0, b"r0")
    tp = TopicPartition(TOPIC, 0)
    async with scripted(script) as bootstrap:
        async with open_consumer(bootstrap, partitions=[tp], offset_reset="earliest") as consumer:
            with trio.fail_after(10):  # a hang guard (the first backoff is 50 ms)
                record = await consumer.getone()
    assert (record.offset, record.value) == (0, b"r0")
    assert script.count(ListOffsetsRequest) == 2


async def test_a_partition_a_fetch_answer_leaves_out_is_not_fetched_in_a_hot_loop():
    # A partition placed where it was left (a seek, a group's committed offset) has no
    # known log end, and its first fetch goes without a wait, so that the broker says at
    # once where its log ends. An answer that left it out (a broker of another version,
    # or a bug) left it unknown: every fetch of it went without a wait, answered at once,
    # thousands a second for as long as the broker did so.
    script = Script(partitions=2, unanswered=frozenset({1}))
    script.append(0, b"r0")
    tps = [TopicPartition(TOPIC, p) for p in (0, 1)]
    async with scripted(script) as bootstrap:
        async with open_consumer(
            bootstrap, partitions=tps, offset_reset="earliest", fetch_max_wait=0.2
        ) as consumer:
            for tp in tps:
                consumer.seek(tp, 0)
            with trio.fail_after(10):  # a hang guard
                record = await consumer.getone()
            before = script.count(FetchRequest)
            await trio.sleep(1.0)
            fetches = script.count(FetchRequest) - before
    assert (record.partition, record.value) == (0, b"r0")
    # Each fetch now waits fetch_max_wait (0.2 s): about five a second; a hot loop asked
    # hundreds.
    assert fetches <= 20, fetches


async def test_only_a_partitions_first_fetch_goes_without_a_wait():
    # A partition placed where it was left is fetched at once, to learn where its log
    # ends; from then on every fetch waits (fetch_max_wait, or fetch_min_bytes of records
    # on the broker), as a consumer batching with fetch_min_bytes relies on.
    waits: list[int] = []

    async def waited(broker: int, body: FetchRequest) -> None:
        waits.append(body.max_wait_ms)

    script = Script(partitions=2, on_fetch=waited)
    tps = [TopicPartition(TOPIC, p) for p in (0, 1)]
    async with scripted(script) as bootstrap:
        async with open_consumer(
            bootstrap, partitions=tps, fetch_max_wait=0.05, fetch_min_bytes=10_000
        ) as consumer:
            for tp in tps:
                consumer.seek(tp, 0)
            with trio.fail_after(10):  # a hang guard
                for i in range(6):
                    script.append(i % 2, b"r%d" % i)
                    await consumer.getone()
                    await trio.sleep(0.06)
    assert waits[0] == 0 and len(waits) > 6
    assert waits[1:] == [50] * (len(waits) - 1)
