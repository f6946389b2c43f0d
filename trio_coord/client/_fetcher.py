"""The consumer's fetching engine: positions, fetch loops and the records handed to the application.

A :class:`Fetcher` holds, per owned partition, three offsets: the *fetch
offset* (the next offset to ask a broker for), the *position* (the next
record to hand to the application) and the *consumed* offset (after the last
record the application has finished with: it came back for more, or
committed). Auto-commit and the positions handed back to the coordinator use
the consumed offset, so a record the application was still processing when
its consumer crashed or gave the partition up is delivered again (at least
once), never skipped.

One fetch loop per broker fetches each partition that broker holds as soon as
the application has drained its buffer, a partition in one fetch at a time,
so memory per partition is bounded by one fetch: partitions with records left
on the broker at once (a few fetches may be in flight), those caught up in one
long poll at a time, which never holds up the others; more partitions than one
request holds in further fetches, the longest waiting first. Records are
handed out round-robin over partitions, in offset order within each. Every
change of a partition (assigned, sought, revoked) bumps its epoch, and a fetch
answer for an older epoch is dropped: no record of a revoked partition, or
from before a seek, is ever handed out. A partition whose broker says it moved
is not asked there again: the loops restart to look it up, at once after a
quiet spell, then backing off while the metadata still names the old leader.
A broker refusing whole fetches is retried after a backoff, and its error told
to the application once per cause and backoff, not once per refused fetch.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio

from .._routing import Action, classify
from ..protocol.errors import (
    CoordError,
    FrameTooLargeError,
    InvalidRequestError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownTopicError,
    error_for,
)
from ..protocol.framing import DEFAULT_MAX_FRAME_SIZE
from ..protocol.messages import (
    EARLIEST,
    FETCH_ENVELOPE_BYTES,
    LATEST,
    NO_OFFSET,
    BrokerInfo,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    PartitionOffset,
    ResponseBody,
    TopicPartition,
    fetch_partition_bytes,
)
from ..protocol.records import ConsumerRecord, records_from
from ..protocol.sizing import in_parts, listed_offset_bytes
from ._bootstrap import Backoff
from ._cluster import ClusterView

__all__ = ["FetchSettings", "Fetcher"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """How a consumer fetches: long-poll wait and size limits, and the reset policy."""

    offset_reset: str = "latest"
    max_wait: float = 0.5
    min_bytes: int = 1
    max_partition_bytes: int = 1024 * 1024
    request_timeout: float = 30.0


@dataclass(slots=True)
class _Partition:
    """What the fetcher keeps for one owned partition."""

    fetch_offset: int
    position: int
    consumed: int
    epoch: int = 0
    paused: bool = False
    failed: bool = False  # an error was raised to the application; a seek clears it
    buffer: deque[ConsumerRecord] = field(default_factory=deque)
    log_end: int | None = None
    unanswered: bool = False
    """A fetch without a wait, sent to learn ``log_end``, was answered without it (the
    answer left the partition out): its fetches wait as any other's, not in a hot loop."""

    @property
    def resolved(self) -> bool:
        return self.fetch_offset != NO_OFFSET


_MAX_REQUEST_PARTITION_BYTES = DEFAULT_MAX_FRAME_SIZE // 4 - FETCH_ENVELOPE_BYTES
"""What a fetch's partitions may take at first: what a broker of the default frame takes
(a quarter of it, less the answer's envelope). A broker of a smaller frame refuses more,
and the loop halves it until one is taken. An offsets lookup (ListOffsets) is cut by the
same estimate, which is more than a partition takes in its request or its answer."""


@dataclass(slots=True)
class _LoopState:
    """A fetch loop's fetches in flight: how many, the epoch each busy partition is fetched
    at, how many are long polls (of caught-up partitions only), and how large a fetch may
    be; and its partitions by what they wait for, each looked at again only once touched
    (a drain, a seek, a fetch ended: :meth:`Fetcher._touch`), so that a decision costs
    what changed, not every partition the loop fetches."""

    busy: dict[TopicPartition, int] = field(default_factory=dict)
    polls: int = 0  # long polls in flight
    fetches: int = 0
    budget: int = _MAX_REQUEST_PARTITION_BYTES  # the most a fetch's partitions may take
    flying: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per request in flight (fetch or ListOffsets, by id): its size, and the budget then."""
    touched: set[TopicPartition] = field(default_factory=set)  # to look at again
    unplaced: set[TopicPartition] = field(default_factory=set)  # no position: look it up
    # (OrderedDicts, not dicts: taking from the front of a dict is O(entries taken before),
    # since its iteration walks the slots they left.)
    hot: OrderedDict[TopicPartition, int] = field(default_factory=OrderedDict)
    """Fetchable with records left on the broker, longest waiting first: fetched at once.
    (Each with its turn: when it was queued.)"""
    idle: OrderedDict[TopicPartition, int] = field(default_factory=OrderedDict)
    """Fetchable and caught up, longest waiting first: long-polled in turn."""
    turn: int = 0  # the last turn given
    again: bool = False  # a lookup left partitions out: the loop is woken to ask again


_MIN_POLL_WAIT = 0.05
"""The shortest wait of a long poll that shares ``max_wait`` with the others of its turn
(seconds): polls of one partition each, against a broker of a tiny frame, do not spin."""

_MAX_FETCHES = 3
"""Fetches in flight per broker at most (a partition is in one at a time, so this bounds
requests, not memory). A broker charges a fetch what its answer may hold (the consumer's
frame, 1 MiB) against a budget per connection (``max_connection_bytes``, 4 MiB) until it
is answered, and stops reading the connection while that is spent: with four in flight
it would, and the offsets lookups and a standalone committer's commits on the connection
would wait behind them; with three, a frame is left for them. (A group member's
heartbeats and commits go over its session's own connection, not this one.)"""


_MOVE_BACKOFF = (0.1, 1.0)
"""How the restarts of the fetch loops for a moved leader back off, first and longest delay
(seconds; Kafka's ``retry.backoff.ms``, 100 ms, and ``retry.backoff.max.ms``, 1 s): the
first one at once, the next, while the partitions looked up again have not been fetched
since, after 0.1 s, then 0.2, 0.4, ... 1 s (±20%)."""

_MOVES_QUIET = 10.0
"""Seconds without a restart for a moved leader after which the next one is at once again,
even if a partition moved before was not fetched since (it was paused, or its topic gone)."""


def _always() -> bool:
    return True


def _moved_away(exc: CoordError) -> bool:
    """Whether ``exc`` says the partitions asked are not (or no longer) where they were sought:
    a moved leader, a broker leaving, or a topic gone or re-created."""
    return classify(exc) is Action.MOVED or isinstance(exc, UnknownTopicError)


class Fetcher:
    """Fetches owned partitions and hands their records out; see the module docstring."""

    def __init__(self, settings: FetchSettings) -> None:
        self._cluster_view: ClusterView | None = None
        self._settings = settings
        self._parts: dict[TopicPartition, _Partition] = {}
        self._ready: deque[TopicPartition] = deque()  # partitions with buffered records
        self._outstanding: dict[TopicPartition, int] = {}  # handed out, not yet consumed
        self._dirty: set[TopicPartition] = set()  # consumed moved; auto-commit reports it
        self._errors: list[CoordError] = []
        self._records_ready = trio.Event()  # set (and replaced) by _records_arrived
        self._wanted = trio.Event()  # by _fetch_wanted: a buffer drained, a seek, a resume
        self._layout_changed = trio.Event()  # the partitions (or their leaders) changed
        self._moved = trio.Event()  # a leader moved: restart the loops, after the backoff
        self._stale: set[TopicPartition] = set()  # moved since the loops started: not asked
        self._unconfirmed: set[TopicPartition] = set()  # looked up after a move, not fetched since
        self._move_backoff = Backoff(*_MOVE_BACKOFF)
        self._last_move = -math.inf  # when the loops last restarted for a move
        self._told: dict[tuple[int, str], float] = {}  # a refusal's cause: told until then
        self._epochs = 0
        self._pending_reset: dict[TopicPartition, int] = {}  # seek_to_beginning/end
        self._budgets: dict[str, int] = {}  # per broker address: a budget it made smaller
        self._loops: dict[TopicPartition, _LoopState] = {}  # the fetch loop of each partition
        self.may_hand_out: Callable[[], bool] = _always
        """Whether records may be handed out now: a group member's lease must hold (its
        watchdog drops the partitions a moment after it ends; nothing is handed out
        in between). Waiters are woken by :meth:`wake` when it may again."""

    @property
    def cluster(self) -> ClusterView:
        """The cluster view the fetcher's connections come from (shared with its consumer)."""
        if self._cluster_view is None:
            raise RuntimeError("use the consumer inside its async with block")
        return self._cluster_view

    def attach(self, cluster: ClusterView) -> None:
        """Fetch through ``cluster`` (once the consumer's nursery exists)."""
        self._cluster_view = cluster

    # -- ownership (called by the consumer) --------------------------------------------------

    def assign(self, offsets: dict[TopicPartition, int]) -> None:
        """Own exactly these partitions from these offsets (NO_OFFSET: per the reset policy)."""
        self._parts = {}
        self._ready.clear()
        self._outstanding.clear()
        self._dirty.clear()
        for tp, offset in sorted(offsets.items()):
            self._parts[tp] = _Partition(offset, offset, offset, self._next_epoch())
        self._layout_changed.set()

    def add(self, offsets: dict[TopicPartition, int]) -> None:
        """Own these partitions too, from these offsets; the others carry on untouched."""
        for tp, offset in sorted(offsets.items()):
            self._parts[tp] = _Partition(offset, offset, offset, self._next_epoch())
        if offsets:
            self._layout_changed.set()

    def remove(self, tps: Iterable[TopicPartition]) -> None:
        """Forget these partitions (their offsets and unsent progress); the others carry on."""
        gone = set(tps) & self._parts.keys()
        for tp in gone:
            del self._parts[tp]
            self._outstanding.pop(tp, None)
            self._pending_reset.pop(tp, None)
        self._dirty -= gone
        if gone:
            self._ready = deque(tp for tp in self._ready if tp not in gone)
            self._layout_changed.set()

    def freeze(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Stop handing out and fetching these partitions (default: all), keeping their
        offsets (a revoke begins)."""
        frozen = set(self._parts if tps is None else tps) & self._parts.keys()
        for tp in frozen:
            part = self._parts[tp]
            part.buffer.clear()
            part.paused = True
            part.epoch = self._next_epoch()
        self._ready = deque(tp for tp in self._ready if tp not in frozen)
        self._layout_changed.set()

    def drop(self) -> list[TopicPartition]:
        """Forget every partition and its offsets; return what was owned."""
        owned = sorted(self._parts)
        self.assign({})
        return owned

    def _records_arrived(self) -> None:
        self._records_ready.set()
        self._records_ready = trio.Event()

    def _fetch_wanted(self) -> None:
        self._wanted.set()
        self._wanted = trio.Event()

    def _touch(self, tp: TopicPartition) -> None:
        """``tp`` may be fetchable now, or differently: its loop looks at it again (its
        next decision, which :meth:`_fetch_wanted` wakes it for)."""
        state = self._loops.get(tp)
        if state is not None:
            state.touched.add(tp)

    def _next_epoch(self) -> int:
        self._epochs += 1
        return self._epochs

    @property
    def owned(self) -> list[TopicPartition]:
        """The partitions owned, sorted."""
        return sorted(self._parts)

    def _part(self, tp: TopicPartition) -> _Partition:
        part = self._parts.get(tp)
        if part is None:
            raise ValueError(f"{tp} is not assigned to this consumer")
        return part

    # -- offsets -----------------------------------------------------------------------------

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record to hand out (None: not known yet)."""
        part = self._part(tp)
        return part.position if part.resolved else None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Hand out ``tp``'s records from ``offset`` on (buffered records are dropped)."""
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        part = self._part(tp)
        part.fetch_offset = part.position = part.consumed = offset
        part.failed = False
        part.buffer.clear()
        part.epoch = self._next_epoch()
        self._outstanding.pop(tp, None)
        self._dirty.add(tp)
        self._touch(tp)
        self._fetch_wanted()

    def reset(self, tps: Iterable[TopicPartition], where: int) -> None:
        """Make ``tps`` resolve their position again by EARLIEST or LATEST (seek_to_*)."""
        for tp in tps:
            part = self._part(tp)
            part.fetch_offset = part.position = NO_OFFSET
            part.failed = False
            part.buffer.clear()
            part.epoch = self._next_epoch()
            self._outstanding.pop(tp, None)
            self._pending_reset[tp] = where
            self._touch(tp)
        self._fetch_wanted()

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Hand out and fetch nothing more from ``tps`` until :meth:`resume`."""
        for tp in tps:
            self._part(tp).paused = True

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        """Undo :meth:`pause`."""
        for tp in tps:
            part = self._part(tp)
            if part.paused:
                part.paused = False
                self._touch(tp)
                if part.buffer:
                    self._ready.append(tp)
                    self._records_arrived()
        self._fetch_wanted()

    def paused(self) -> list[TopicPartition]:
        """The paused partitions, sorted."""
        return sorted(tp for tp, p in self._parts.items() if p.paused)

    def mark_consumed(self) -> None:
        """The records handed out so far are done with: their offsets count as consumed."""
        for tp, offset in self._outstanding.items():
            part = self._parts.get(tp)
            if part is not None and offset > part.consumed:
                part.consumed = offset
                self._dirty.add(tp)
        self._outstanding.clear()

    def consumed(self, tps: Iterable[TopicPartition] | None = None) -> list[PartitionOffset]:
        """The consumed offsets (of ``tps``, default all owned) that are known."""
        wanted = self._parts if tps is None else tps
        return [
            PartitionOffset(tp.topic, tp.partition, part.consumed)
            for tp in sorted(wanted)
            if (part := self._parts.get(tp)) is not None and part.consumed != NO_OFFSET
        ]

    def take_dirty(self) -> list[PartitionOffset]:
        """Consumed offsets that moved since the last call (for auto-commit)."""
        dirty, self._dirty = self._dirty, set()
        return self.consumed(dirty & self._parts.keys())

    def return_dirty(self, positions: Iterable[PartitionOffset]) -> None:
        """Report these again next time (their heartbeat was not delivered)."""
        self._dirty.update(p.tp for p in positions)

    def lag(self) -> dict[TopicPartition, int]:
        """Per owned partition, records between the position and the log end last seen."""
        return {
            tp: max(0, part.log_end - part.position)
            for tp, part in sorted(self._parts.items())
            if part.log_end is not None and part.resolved
        }

    # -- handing records out ----------------------------------------------------------------

    async def next_records(self, limit: int) -> list[ConsumerRecord]:
        """Wait for records and hand out up to ``limit`` (those handed out before are consumed)."""
        self.mark_consumed()
        while True:
            taken = self._take(limit)
            if taken:
                return taken
            if self._errors:
                raise self._errors.pop(0)
            await self._records_ready.wait()

    def wake(self) -> None:
        """Wake the application tasks waiting for records, to look again."""
        self._records_arrived()

    def _take(self, limit: int) -> list[ConsumerRecord]:
        taken: list[ConsumerRecord] = []
        if not self.may_hand_out():
            return taken
        while self._ready and len(taken) < limit:
            tp = self._ready.popleft()
            part = self._parts.get(tp)
            if part is None or part.paused or not part.buffer:
                continue
            while part.buffer and len(taken) < limit:
                record = part.buffer.popleft()
                taken.append(record)
                part.position = record.offset + 1
                self._outstanding[tp] = record.offset + 1
            if part.buffer:
                self._ready.append(tp)
            else:
                self._touch(tp)
                self._fetch_wanted()
        return taken

    # -- fetching -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Fetch forever: one loop per broker holding owned partitions, restarted on change
        (at once when the partitions change, after a backoff when leaders move)."""
        backoff = Backoff(initial=0.05, maximum=1.0)
        while True:
            self._layout_changed = trio.Event()
            self._moved = trio.Event()
            # The partitions that moved are looked up now, and fetched from where the
            # answer says: until one of them is fetched, a further move backs off.
            self._unconfirmed |= self._stale
            self._stale = set()
            try:
                by_broker = await self.cluster.by_leader(self._parts)
            except CoordError as exc:
                if not exc.retriable:
                    self._fail(exc)
                    await self._layout_changed.wait()
                else:
                    await backoff.sleep()
                continue
            backoff.reset()
            async with trio.open_nursery() as nursery:
                for broker, tps in by_broker.items():
                    nursery.start_soon(self._fetch_loop, broker, tps)
                nursery.start_soon(self._restart_after_move)
                await self._layout_changed.wait()
                nursery.cancel_scope.cancel()

    async def _restart_after_move(self) -> None:
        """Once a fetch answer says a leader moved, restart the loops (to look it up again):
        at once after a quiet spell, after the backoff (``_MOVE_BACKOFF``) while the
        partitions looked up after the last move have not been fetched since.

        Metadata may still name the old leader (ZooKeeper watches lag; a broker that
        lost a partition answers from its stale view): restarting at each NOT_LEADER was
        a hot loop of Metadata and fetch round trips, about a thousand of each a second,
        for as long as the cluster took to converge.
        """
        await self._moved.wait()
        now = trio.current_time()
        self._unconfirmed &= self._parts.keys()
        if not self._unconfirmed or now - self._last_move >= _MOVES_QUIET:
            self._move_backoff.reset()
            delay = 0.0
        else:
            delay = self._move_backoff.next_delay()
            log.info("a leader moved again; looking it up in %.2fs", delay)
        self._last_move = now + delay
        await trio.sleep(delay)
        self._layout_changed.set()

    def _leader_moved(self, tps: Iterable[TopicPartition]) -> None:
        """A broker said ``tps`` are not its (or their topic is unknown): forget where their
        topics are, fetch them no more until the loops restart (``_restart_after_move``)."""
        tps = list(tps)
        for topic in {tp.topic for tp in tps}:
            self.cluster.forget(topic)
        self._stale.update(tps)
        self._moved.set()

    def _fail(self, error: CoordError) -> None:
        """Raise ``error`` from the application's next read (once: one already waiting to be
        raised is not queued again)."""
        cause = (error.code, str(error))
        if len(self._errors) < 16 and all((e.code, str(e)) != cause for e in self._errors):
            self._errors.append(error)  # (bounded: an application not reading must not grow it)
        self._records_arrived()

    async def _fetch_loop(self, broker: BrokerInfo, tps: list[TopicPartition]) -> None:
        """Fetch ``tps`` from ``broker``: each drained partition as soon as it is drained.

        A partition is in at most one fetch at a time (per epoch: one sought
        while in a fetch is fetched again at once, the old answer dropped).
        Partitions with records left on the broker are fetched at once, in a
        fetch of their own if need be, since the broker answers it at once;
        those caught up wait in one long poll at a time. With one fetch per
        broker, as before, a long poll of caught-up partitions held up for
        ``max_wait`` the partitions that drained meanwhile, records waiting
        on the broker: a consumer of a backlog stalled half a second each
        time one of its partitions caught up.
        """
        # (A budget a broker made smaller is kept across restarts of the loop: learning it
        # again costs refused requests, and a request larger than its frame, the connection.)
        state = _LoopState(budget=self._budgets.get(broker.address, _MAX_REQUEST_PARTITION_BYTES))
        state.touched.update(tps)
        for tp in tps:
            self._loops[tp] = state
        backoff = Backoff(initial=0.05, maximum=1.0)
        again = Backoff(initial=0.05, maximum=1.0)  # (its own: a fetch resets the other)
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    wake = self._wanted  # taken before looking, so no wake-up is missed
                    self._look_again(state)
                    if state.unplaced:
                        try:
                            left_out = await self._resolve(broker, state)
                        except CoordError as exc:
                            await self._fetch_failed(broker, sorted(state.unplaced), exc, backoff)
                            continue
                        if not left_out:
                            again.reset()
                        elif not state.again:
                            state.again = True
                            nursery.start_soon(self._look_up_again, state, again)
                        self._look_again(state)
                    if state.fetches >= _MAX_FETCHES:
                        await wake.wait()  # (a fetch in flight ends, and wakes this loop)
                        continue
                    wanted, size, polls, wait = self._next_fetch(state)
                    if not wanted:
                        await wake.wait()
                        continue
                    state.polls += polls
                    state.fetches += 1
                    # The request and its epochs are taken now, not when the task first
                    # runs: the application may seek (or reset) a partition in between,
                    # and the task would then fetch it as nobody decided to (a reset one
                    # at offset -1, out of range: its reset policy overrode the seek).
                    epochs = {tp: part.epoch for tp, part in wanted}
                    state.busy.update(epochs)
                    request = self._fetch_request(wanted, wait)
                    state.flying[id(request)] = (size, state.budget)
                    nursery.start_soon(
                        self._fetch_some, broker, request, epochs, polls, state, backoff
                    )
        finally:
            for tp in tps:
                if self._loops.get(tp) is state:
                    del self._loops[tp]

    def _look_again(self, state: _LoopState) -> None:
        """Sort the partitions touched since the loop last looked: to place, to fetch at
        once (records left on the broker), to long-poll (caught up), or none of these (a
        buffer not drained, a fetch in flight, paused, failed, moved: a drain, the fetch's
        end, a resume or a seek touches it again)."""
        touched, state.touched = state.touched, set()
        # (Every caught-up partition passes here once per poll: the names are local.)
        hot, idle, unplaced, busy = state.hot, state.idle, state.unplaced, state.busy
        parts, stale, caught_up = self._parts, self._stale, self._caught_up
        turn = state.turn
        for tp in touched:
            hot.pop(tp, None)
            idle.pop(tp, None)
            unplaced.discard(tp)
            part = parts.get(tp)
            if part is None or part.paused or part.failed or tp in stale:
                continue
            if not part.resolved:
                unplaced.add(tp)
            elif not part.buffer and busy.get(tp) != part.epoch:
                turn += 1
                (idle if caught_up(part) else hot)[tp] = turn
        state.turn = turn

    def _next_fetch(
        self, state: _LoopState
    ) -> tuple[list[tuple[TopicPartition, _Partition]], int, bool, float]:
        """The partitions of the next fetch, what they take of it (``fetch_partition_bytes``),
        whether it is a long poll, and its wait.

        Partitions with records left go at once; caught-up ones wait in one
        long poll at a time. While none is in flight, both go, the longest
        waiting first: a fetch of the caught-up ones alone is a long poll,
        and one with any that has records left is answered at once (taking
        those with records left first starved the caught-up ones while a
        backlog kept every fetch busy). More caught-up partitions than one
        poll holds are polled in turn, and the polls of a turn share
        ``max_wait``: a partition is asked again within it (each poll took
        all of it, and a record waited for the turn: 7 polls for 10,000
        partitions of a long topic name).
        """
        wait = self._settings.max_wait
        if state.polls or not state.idle:
            # (Empty if every one queued was paused since: a poll in flight, if any,
            # wakes the loop when it ends.)
            wanted, size, _ = self._take_from(state, state.hot)
            polls = False
        else:
            waiting = len(state.idle)
            wanted, size, polls = self._take_from(state, state.hot, state.idle)
            if polls and 0 < len(wanted) < waiting:
                wait = max(wait * len(wanted) / waiting, min(wait, _MIN_POLL_WAIT))
        if not polls and any(part.log_end is None and not part.unanswered for _, part in wanted):
            # Placed where the group left them, not known to have records: the broker
            # answers at once, and says where each log ends. Waiting ``max_wait`` for
            # those with none held every partition of a large assignment behind them:
            # 100,000 took 70 fetches of 0.5 s, three at a time, before the last was read.
            # (Once: an answer that leaves one out does not make it a hot loop.)
            wait = 0.0
        return wanted, size, polls, wait

    def _take_from(
        self,
        state: _LoopState,
        first: OrderedDict[TopicPartition, int],
        second: OrderedDict[TopicPartition, int] | None = None,
    ) -> tuple[list[tuple[TopicPartition, _Partition]], int, bool]:
        """As many partitions as one fetch holds (``state.budget``, at least one) from
        the fronts of ``first`` and ``second``, the longest waiting first, each still
        fetchable (one that is not any more, paused or moved since it was queued, is
        dropped: what makes it fetchable again touches it); what they take of the fetch,
        and whether all came from ``second``."""
        wanted: list[tuple[TopicPartition, _Partition]] = []
        used = 0
        only_second = True
        topic, size = "", 0  # (the size of the last topic's partitions: they come in runs)
        while True:
            if second and (not first or next(iter(second.values())) < next(iter(first.values()))):
                queue = second
            elif first:
                queue = first
            else:
                return wanted, used, only_second
            tp, turn = queue.popitem(last=False)
            if tp.topic != topic:
                topic, size = tp.topic, fetch_partition_bytes(tp.topic)
            if wanted and used + size > state.budget:
                queue[tp] = turn
                queue.move_to_end(tp, last=False)  # (its turn is next)
                return wanted, used, only_second
            part = self._parts.get(tp)
            if (
                part is None
                or not part.resolved
                or part.paused
                or part.failed
                or part.buffer
                or tp in self._stale
                or state.busy.get(tp) == part.epoch
            ):
                continue
            wanted.append((tp, part))
            used += size
            only_second = only_second and queue is second

    @staticmethod
    def _caught_up(part: _Partition) -> bool:
        """Whether the broker had no record past the fetch offset when last heard of."""
        return part.log_end is not None and part.fetch_offset >= part.log_end

    async def _fetch_some(
        self,
        broker: BrokerInfo,
        request: FetchRequest,
        epochs: dict[TopicPartition, int],
        polls: bool,
        state: _LoopState,
        backoff: Backoff,
    ) -> None:
        """One fetch (a long poll if ``polls``) of partitions at ``epochs``; its records
        buffered, or its error handled as the loop handles one, then the loop woken to send
        the next."""
        try:
            response = await self._request(broker, request)
            assert isinstance(response, FetchResponse)
            backoff.reset()
            self._absorb(response, epochs)
            if not request.max_wait_ms:
                self._left_out(broker, epochs)
        except CoordError as exc:
            if not self._fewer(broker, request, len(epochs), exc, state):
                await self._fetch_failed(broker, list(epochs), exc, backoff)
        finally:
            state.flying.pop(id(request), None)
            for tp, epoch in epochs.items():
                if state.busy.get(tp) == epoch:
                    del state.busy[tp]
                state.touched.add(tp)
            state.polls -= polls
            state.fetches -= 1
            self._fetch_wanted()

    def _fewer(
        self,
        broker: BrokerInfo,
        request: FetchRequest | ListOffsetsRequest,
        count: int,
        exc: CoordError,
        state: _LoopState,
    ) -> bool:
        """Whether ``exc`` refused ``request`` (of ``count`` partitions, in
        ``state.flying``) for its size: then the budget is smaller, and its partitions
        are asked for again at once, fewer at a time.

        A broker of a smaller frame than the default refuses a fetch of more
        than a quarter of it ("fetch fewer partitions per request"): the
        budget becomes half that fetch. It answers a ListOffsets larger than
        its frame with FRAME_TOO_LARGE, and closes the connection on a request
        larger than its frame, saying so; that fails every request on the
        connection, so the budget is halved once per failure, from the largest
        request then in flight: a request sent before the budget was lowered
        is only sent again. Until one is taken, or a partition is refused on
        its own: that is the application's to hear, after a backoff.
        """
        if count < 2 or not isinstance(exc, (InvalidRequestError, FrameTooLargeError)):
            return False
        size, sent = state.flying[id(request)]
        if isinstance(exc, InvalidRequestError):
            budget = size // 2
        elif state.budget < sent:
            return True  # (lowered since it was sent: by this failure, or a later one)
        else:
            budget = max(flying for flying, _ in state.flying.values()) // 2
        state.budget = self._budgets[broker.address] = min(state.budget, budget)
        log.info(
            "requesting from %s: %s; asking for fewer partitions at a time", broker.address, exc
        )
        return True

    async def _fetch_failed(
        self, broker: BrokerInfo, tps: list[TopicPartition], exc: CoordError, backoff: Backoff
    ) -> None:
        """A fetch (or the offsets lookup before one) failed: act on it, then back off.

        A moved leader (or a topic gone or re-created) is looked up again, after the
        fetcher's own backoff (``_restart_after_move``); the rest is retried (classify:
        RECONNECT, RETRY) or told to the application, once per cause and backoff: up to
        ``_MAX_FETCHES`` fetches in flight may be refused for one cause (an authorization
        the broker no longer grants) at once, and each told it, so the application read
        the same error three times in a row. The fetches refused for a cause already told
        wait with the one that told it, and are sent again together.
        """
        if _moved_away(exc):
            self._leader_moved(tps)
            return
        if exc.retriable:
            log.info("fetching from %s: %s; retrying", broker.address, exc)
            await backoff.sleep()
            return
        cause = (exc.code, str(exc))
        now = trio.current_time()
        until = self._told.get(cause, -math.inf)
        if now < until:
            await trio.sleep_until(until)
            return
        delay = backoff.next_delay()
        self._told = {told: end for told, end in self._told.items() if end > now}
        self._told[cause] = now + delay
        # The broker refused the whole fetch: tell the application, keep trying.
        log.warning("fetching from %s failed: %s", broker.address, exc)
        self._fail(exc)
        await trio.sleep(delay)

    def _fetch_request(
        self, wanted: list[tuple[TopicPartition, _Partition]], wait: float
    ) -> FetchRequest:
        s = self._settings
        return FetchRequest(
            [
                FetchPartition(tp.topic, tp.partition, p.fetch_offset, s.max_partition_bytes)
                for tp, p in wanted
            ],
            max_wait_ms=round(wait * 1000),
            min_bytes=s.min_bytes,
            # The whole answer within this client's frame: a broker of a larger frame
            # would otherwise answer with more than the connection reads (FRAME_TOO_LARGE).
            max_bytes=self.cluster.max_frame_size,
        )

    async def _request(
        self, broker: BrokerInfo, request: FetchRequest | ListOffsetsRequest
    ) -> ResponseBody | None:
        conn = await self.cluster.connection(broker)
        timeout = self._settings.request_timeout + self._settings.max_wait
        with trio.move_on_after(timeout):
            return await conn.request(request)
        await conn.aclose()  # a broker that hangs: reconnect rather than pile up requests
        raise RequestTimedOutError(f"{broker.address} did not answer within {timeout:g}s")

    def _absorb(self, response: FetchResponse, epochs: dict[TopicPartition, int]) -> None:
        """Buffer what a fetch brought, unless its partition changed while it was in flight."""
        arrived = False
        for answer in response.partitions:
            tp = TopicPartition(answer.topic, answer.partition)
            part = self._parts.get(tp)
            if part is None or part.epoch != epochs.get(tp):
                continue
            if answer.error:
                self._partition_error(tp, part, error_for(answer.error, answer.message))
                continue
            if self._unconfirmed:
                self._unconfirmed.discard(tp)  # (found where the lookup after a move said)
            part.log_end = answer.log_end
            if not answer.batches:
                continue  # (a caught-up partition's answer, in every poll)
            records = list(
                records_from(
                    tp.topic,
                    tp.partition,
                    ((b.base_offset, b.records) for b in answer.batches),
                    part.fetch_offset,
                )
            )
            if records:
                part.buffer.extend(records)
                part.fetch_offset = records[-1].offset + 1
                self._ready.append(tp)
                arrived = True
        if arrived:
            self._records_arrived()

    def _left_out(self, broker: BrokerInfo, epochs: dict[TopicPartition, int]) -> None:
        """Mark the partitions a fetch without a wait still knows no log end of (its answer
        left them out: a broker of another version, or a bug; ours answers each, or fails
        the fetch): fetched without a wait again, each was answered at once again, a hot
        loop of thousands of fetches a second. They wait as the others do."""
        left = 0
        for tp, epoch in epochs.items():
            part = self._parts.get(tp)
            if (
                part is not None
                and part.epoch == epoch
                and part.log_end is None
                and not part.failed  # (its answer was an error: told to the application)
                and tp not in self._stale  # (its answer said it moved)
            ):
                left += not part.unanswered
                part.unanswered = True
        if left:
            log.warning(
                "%s answered a fetch without %d of its partitions; fetching them again",
                broker.address,
                left,
            )

    def _partition_error(self, tp: TopicPartition, part: _Partition, error: CoordError) -> None:
        if isinstance(error, OffsetOutOfRangeError) and self._settings.offset_reset != "none":
            log.warning("%s; resetting to the %s offset", error, self._settings.offset_reset)
            self.reset([tp], EARLIEST if self._settings.offset_reset == "earliest" else LATEST)
        elif _moved_away(error):
            self._leader_moved([tp])
        else:
            part.failed = True  # until the application seeks
            self._fail(error)

    async def _look_up_again(self, state: _LoopState, backoff: Backoff) -> None:
        """Wake the loop after ``backoff`` to look up again the positions an answer left out
        (they are still in ``state.unplaced``; nothing else may wake the loop for them)."""
        await backoff.sleep()
        state.again = False
        self._fetch_wanted()

    async def _resolve(self, broker: BrokerInfo, state: _LoopState) -> bool:
        """Find a position for the loop's partitions that have none (``state.unplaced``), by
        their reset (or the policy); each placed is touched, to be fetched.

        The lookups hold at most ``state.budget`` of partitions each, as a fetch does:
        one of 10,000 partitions of a long topic name is larger than a frame. Returns
        whether an answer left out a partition asked (a broker of another version, or a
        bug): the loop asks again after a backoff.
        """
        todo: dict[int, list[TopicPartition]] = {}
        for tp in sorted(state.unplaced):
            part = self._parts.get(tp)
            if part is None or part.resolved or part.paused or part.failed or tp in self._stale:
                state.unplaced.discard(tp)  # (a seek, a resume or a restart touches it again)
                continue
            where = self._pending_reset.get(tp)
            if where is None:
                policy = self._settings.offset_reset
                if policy == "none":
                    part.failed = True
                    state.unplaced.discard(tp)
                    self._fail(
                        NoOffsetForPartitionError(
                            f"{tp} has no committed offset and offset_reset is 'none': "
                            "seek to an offset, or use offset_reset='earliest' or 'latest'"
                        )
                    )
                    continue
                where = EARLIEST if policy == "earliest" else LATEST
            todo.setdefault(where, []).append(tp)
        # Each partition's epoch as asked, all taken before the first request: one removed
        # while an earlier lookup is in flight is then dropped from the answer, not a KeyError.
        epochs = {tp: self._parts[tp].epoch for asked in todo.values() for tp in asked}
        for where, asked in todo.items():
            while asked:
                some = next(in_parts(asked, state.budget, listed_offset_bytes))
                request = ListOffsetsRequest(some, where)
                size = sum(map(listed_offset_bytes, some))
                state.flying[id(request)] = (size, state.budget)
                try:
                    response = await self._request(broker, request)
                except CoordError as exc:
                    if self._fewer(broker, request, len(some), exc, state):
                        continue  # (the same partitions, fewer at a time)
                    if not _moved_away(exc):
                        raise
                    self._leader_moved(some)  # (the others are still asked here)
                    asked = asked[len(some) :]
                    continue
                finally:
                    state.flying.pop(id(request), None)
                asked = asked[len(some) :]
                self._positioned(response, epochs)
        left_out = [
            tp
            for tp, epoch in epochs.items()
            if (part := self._parts.get(tp)) is not None
            and part.epoch == epoch
            and not part.resolved
            and not part.paused
            and tp not in self._stale
        ]
        if left_out:
            log.warning(
                "%s gave no offset for %d of the partitions asked (%s first); asking again",
                broker.address,
                len(left_out),
                left_out[0],
            )
        return bool(left_out)

    def _positioned(self, response: ResponseBody | None, epochs: dict[TopicPartition, int]) -> None:
        """Place the partitions a ListOffsets answer gives offsets for (unless changed since)."""
        assert isinstance(response, ListOffsetsResponse)
        for listed in response.offsets:
            part = self._parts.get(listed.tp)
            if part is None or part.epoch != epochs.get(listed.tp):
                continue
            part.fetch_offset = part.position = part.consumed = listed.offset
            part.log_end = listed.log_end
            self._pending_reset.pop(listed.tp, None)
            self._dirty.add(listed.tp)
            self._touch(listed.tp)
