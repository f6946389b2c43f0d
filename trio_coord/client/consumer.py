"""The group consumer: joins a group, keeps its session, and obeys Stop/StartFetchers.

``open_consumer`` finds the group's coordinator (through the bootstrap list,
retrying with backoff), joins, and runs three kinds of task in its nursery:
the session (one connection to the coordinator, over which the coordinator
pushes StopFetchers and StartFetchers and the consumer sends heartbeats every
third of its session timeout), and a watchdog. The watchdog holds the
member's side of the lease: the partitions are kept only while a heartbeat
*sent* less than a session timeout ago was accepted, so a consumer cut off
from its coordinator drops its partitions no later than the coordinator
hands them to someone else. Then it rediscovers the coordinator and rejoins,
keeping its member id so that a restarted coordinator recognizes it.

State is ``UNJOINED`` → ``REBALANCING`` (joined; fetchers stopped) →
``STABLE`` (fetching its assignment), awaitable through :meth:`Consumer.wait_state`.
Leaving the ``async with`` block (or being cancelled) revokes the partitions,
hands the final positions to the coordinator with LeaveGroup, and closes.
"""

from __future__ import annotations

import enum
import inspect
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio
from trio_util import AsyncValue

from .._aio import unwrap_lone_exception
from ..core.group import OFFSET_RESET_POLICIES
from ..protocol.connection import Connection, RequestHandler, open_connection
from ..protocol.errors import (
    ConnectionClosedError,
    CoordError,
    GroupNotFoundError,
    IllegalGenerationError,
    RequestTimedOutError,
    UnknownMemberError,
)
from ..protocol.messages import (
    NO_OFFSET,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    RequestBody,
    ResponseBody,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
    TopicPartition,
)
from ._bootstrap import Backoff, Bootstrap

__all__ = ["Consumer", "ConsumerState", "PartitionsCallback", "open_consumer"]

log = logging.getLogger(__name__)

PartitionsCallback = Callable[[list[TopicPartition]], Any]
"""``on_assigned``/``on_revoked``/``on_lost``: called with sorted partitions; may be async."""

_LEAVE_TIMEOUT = 5.0


class ConsumerState(enum.StrEnum):
    """A consumer's view of its membership."""

    UNJOINED = "UNJOINED"
    REBALANCING = "REBALANCING"
    STABLE = "STABLE"


class _Reconnect(Exception):
    """Internal: end the current session and start a new one."""

    def __init__(self, reason: str, *, forget_member: bool = False) -> None:
        super().__init__(reason)
        self.forget_member = forget_member


class _PushHandler(RequestHandler):
    """Answers what the coordinator pushes: StopFetchers and StartFetchers."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    async def handle(self, body: RequestBody) -> ResponseBody:
        consumer = self._consumer
        if isinstance(body, StopFetchersRequest | StartFetchersRequest):
            await consumer._member_ready.wait()  # a push may overtake our JoinGroup answer
            if body.member_id != consumer.member_id or body.group != consumer.group_id:
                raise UnknownMemberError(
                    f"this consumer is member {consumer.member_id!r} of {consumer.group_id!r}, "
                    f"not {body.member_id!r} of {body.group!r}"
                )
            # One push at a time: a restarted rebalance may send a second StopFetchers
            # while on_revoked still runs for the first; it then finds nothing to revoke.
            async with consumer._push_lock:
                if consumer._left:
                    raise UnknownMemberError(f"member {body.member_id!r} has left the group")
                if isinstance(body, StopFetchersRequest):
                    return StopFetchersResponse(await consumer._stop_fetchers())
                await consumer._start_fetchers(body)
                return StartFetchersResponse()
        return await super().handle(body)


class Consumer:
    """A member of a consumer group; create it with :func:`open_consumer`."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        group_id: str,
        topics: Iterable[str],
        *,
        session_timeout: float = 10.0,
        rebalance_timeout: float = 30.0,
        auto_commit: bool = True,
        offset_reset: str = "latest",
        assignors: Sequence[str] = ("range", "roundrobin"),
        on_assigned: PartitionsCallback | None = None,
        on_revoked: PartitionsCallback | None = None,
        on_lost: PartitionsCallback | None = None,
        client_id: str = "trio-coord",
    ) -> None:
        self.topics = sorted(set(topics))
        if not self.topics:
            raise ValueError("subscribe to at least one topic")
        if not group_id:
            raise ValueError("a group id is required")
        if session_timeout <= 0 or rebalance_timeout <= 0:
            raise ValueError("session_timeout and rebalance_timeout must be positive (seconds)")
        if offset_reset not in OFFSET_RESET_POLICIES:
            raise ValueError(
                f"offset_reset must be one of {', '.join(OFFSET_RESET_POLICIES)}, "
                f"not {offset_reset!r}"
            )
        if not assignors:
            raise ValueError("name at least one assignor (for example 'range')")
        self.group_id = group_id
        self.session_timeout = session_timeout
        self._granted_session = session_timeout
        self.rebalance_timeout = rebalance_timeout
        self.auto_commit = auto_commit
        self.offset_reset = offset_reset
        self.assignors = list(assignors)
        self.client_id = client_id
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._on_lost = on_lost
        self._bootstrap = Bootstrap(bootstrap)
        self.member_id = ""
        self.generation = -1
        self._state = AsyncValue(ConsumerState.UNJOINED)
        self._assignment: dict[TopicPartition, int] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._dirty: set[TopicPartition] = set()
        self._lease_end = -math.inf
        self._lease_moved = trio.Event()
        self._member_ready = trio.Event()
        self._conn: Connection | None = None
        self._session_scope: trio.CancelScope | None = None
        self._handler = _PushHandler(self)
        self._push_lock = trio.Lock()
        self._left = False
        self._backoff = Backoff(initial=0.05, maximum=min(2.0, session_timeout / 3))
        self._started = False
        self._tasks = trio.CancelScope()
        self._lifetime: AbstractAsyncContextManager[Consumer] | None = None

    def __repr__(self) -> str:
        return f"<Consumer {self.group_id}/{self.member_id or '?'} {self.state}>"

    async def __aenter__(self) -> Consumer:
        if self._lifetime is not None:
            raise RuntimeError("a Consumer can be entered only once")
        self._lifetime = self._run_for_block()
        return await self._lifetime.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._lifetime is not None
        return await self._lifetime.__aexit__(*exc_info)

    @asynccontextmanager
    async def _run_for_block(self) -> AsyncIterator[Consumer]:
        with unwrap_lone_exception():
            async with trio.open_nursery() as nursery:
                await nursery.start(self._run)
                try:
                    yield self
                finally:
                    # The session survives a cancelled block (it is shielded once
                    # joined), so the goodbye goes out on a live connection.
                    with trio.move_on_after(_LEAVE_TIMEOUT) as scope:
                        scope.shield = True
                        await self._leave()
                    self._left = True
                    self._tasks.cancel()

    # -- what the application reads ----------------------------------------------------

    @property
    def state(self) -> ConsumerState:
        """UNJOINED, REBALANCING or STABLE."""
        return self._state.value

    async def wait_state(self, state: ConsumerState) -> None:
        """Return once the consumer is in ``state`` (at once if it is already)."""
        await self._state.wait_value(state)

    @property
    def assignment(self) -> dict[TopicPartition, int]:
        """The partitions this consumer owns, with the offset each started from."""
        return dict(self._assignment)

    async def wait_assigned(self) -> dict[TopicPartition, int]:
        """Wait until the consumer is STABLE and return its assignment."""
        await self.wait_state(ConsumerState.STABLE)
        return self.assignment

    def position(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """The next offset to consume on an owned partition (None: none known yet)."""
        tp = TopicPartition(*tp)
        self._require_owned(tp)
        return self._positions.get(tp)

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        """Set the next offset to consume on an owned partition (auto-commit reports it)."""
        tp = TopicPartition(*tp)
        self._require_owned(tp)
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        self._positions[tp] = offset
        self._dirty.add(tp)

    def _require_owned(self, tp: TopicPartition) -> None:
        if tp not in self._assignment:
            raise ValueError(f"{tp} is not assigned to this consumer")

    # -- commits -------------------------------------------------------------------------

    def _coordinator(self) -> Connection:
        if self._lifetime is None or self._left:
            raise UnknownMemberError(
                "the consumer has left its group (or has not joined it yet): use it inside "
                "its async with block"
            )
        conn = self._conn
        if conn is None or conn.closed or not self.member_id:
            raise ConnectionClosedError(
                "the consumer is not connected to its coordinator right now; retry shortly"
            )
        return conn

    async def commit(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int] | None = None,
        *,
        allow_regression: bool = False,
    ) -> None:
        """Durably commit offsets (default: the current positions of owned partitions).

        Returns once the offsets are durable on the coordinator. Raises
        :class:`~trio_coord.RebalanceInProgressError` while a partition is
        being moved, :class:`~trio_coord.PartitionNotOwnedError` for a
        partition this consumer does not own, and
        :class:`~trio_coord.OffsetRegressionError` for a rewind without
        ``allow_regression=True``, :class:`~trio_coord.ConnectionClosedError`
        (retriable) while the consumer reconnects to its coordinator, and
        :class:`~trio_coord.UnknownMemberError` outside its ``async with`` block.
        """
        if offsets is None:
            items = [(tp, pos) for tp, pos in self._positions.items() if tp in self._assignment]
        else:
            items = [(TopicPartition(*tp), off) for tp, off in offsets.items()]
        if not items:
            return
        await self._coordinator().request(
            OffsetCommitRequest(
                self.group_id,
                self.member_id,
                self.generation,
                [PartitionOffset(tp.topic, tp.partition, off) for tp, off in sorted(items)],
                allow_regression,
            )
        )

    async def committed(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets (default: for this consumer's assignment)."""
        wanted = sorted(TopicPartition(*tp) for tp in (partitions or self._assignment))
        response = await self._coordinator().request(OffsetFetchRequest(self.group_id, wanted))
        assert isinstance(response, OffsetFetchResponse)
        return {o.tp: o.offset for o in response.offsets}

    # -- answering the coordinator -----------------------------------------------------------

    async def _call(self, callback: PartitionsCallback | None, partitions: list[TopicPartition]):
        if callback is None:
            return
        try:
            result = callback(partitions)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("rebalance callback %r failed", callback)

    async def _stop_fetchers(self) -> list[PartitionOffset]:
        self._state.value = ConsumerState.REBALANCING
        return await self._revoke()

    async def _revoke(self) -> list[PartitionOffset]:
        """Give up every partition cleanly: ``on_revoked`` (which may still commit),
        then the positions to hand back (with auto-commit)."""
        revoked = sorted(self._assignment)
        if revoked:
            await self._call(self._on_revoked, revoked)
        positions = self._current_positions(revoked) if self.auto_commit else []
        self._drop()
        return positions

    def _drop(self) -> list[TopicPartition]:
        """Forget every partition, its position and unsent progress; return what was owned."""
        owned = sorted(self._assignment)
        self._assignment.clear()
        self._positions.clear()
        self._dirty.clear()
        return owned

    async def _start_fetchers(self, request: StartFetchersRequest) -> None:
        if trio.current_time() >= self._lease_end:
            # The lease ran out while we owned nothing, so the watchdog has nothing to
            # drop: the coordinator may have declared us dead and handed these over.
            raise RequestTimedOutError(
                f"member {self.member_id!r} has no lease: no heartbeat it sent within "
                f"its session timeout ({self._granted_session:g}s) was accepted"
            )
        self.generation = request.generation
        self._assignment = {p.tp: p.offset for p in request.partitions}
        self._positions = {p.tp: p.offset for p in request.partitions if p.offset != NO_OFFSET}
        self._dirty.clear()
        self._state.value = ConsumerState.STABLE
        await self._call(self._on_assigned, sorted(self._assignment))

    async def _lose(self, reason: str) -> None:
        """Drop every partition without a clean revoke (the lease ran out, or we were expelled).

        Serialized with the pushes: a StopFetchers whose ``on_revoked`` is
        running finishes first, and then there is nothing left to lose twice.
        """
        async with self._push_lock:
            lost = self._drop()
            self._state.value = ConsumerState.UNJOINED
            if lost:
                log.warning(
                    "consumer %s lost %d partition(s): %s", self.member_id, len(lost), reason
                )
                await self._call(self._on_lost or self._on_revoked, lost)

    def _current_positions(self, partitions: Iterable[TopicPartition]) -> list[PartitionOffset]:
        return [
            PartitionOffset(tp.topic, tp.partition, self._positions[tp])
            for tp in partitions
            if tp in self._positions
        ]

    def _renew_lease(self, sent_at: float) -> None:
        # The lease is the session the broker granted (what its fences are measured
        # with), counted from when the accepted request was *sent*.
        if sent_at + self._granted_session > self._lease_end:
            self._lease_end = sent_at + self._granted_session
            self._lease_moved.set()

    # -- the tasks -------------------------------------------------------------------------

    async def _run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a session with the coordinator until stopped; reconnect when it breaks.

        Runs in :attr:`_tasks`, which is shielded once the first join succeeds:
        cancelling the application's block must not cut the connection before
        the consumer has left the group; ``_run_for_block`` cancels it after.
        """
        with self._tasks, unwrap_lone_exception():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watchdog)
                while True:
                    with trio.CancelScope() as self._session_scope:
                        try:
                            await self._session(task_status)
                        except _Reconnect as exc:
                            log.info("consumer %s: %s; rejoining", self.member_id or "?", exc)
                            if exc.forget_member:
                                await self._lose(str(exc))
                                self.member_id = ""
                        except CoordError as exc:
                            if not exc.retriable:
                                raise  # a setting the broker refuses: tell the application
                            log.info("consumer %s: %s; reconnecting", self.member_id or "?", exc)
                    self._conn = None
                    self._member_ready = trio.Event()
                    await self._backoff.sleep()

    async def _session(self, task_status: trio.TaskStatus[None]) -> None:
        """One connection to the coordinator: join, then heartbeat until it breaks."""
        coordinator = await self._bootstrap.find_coordinator(self.group_id)
        with unwrap_lone_exception():
            async with open_connection(coordinator.host, coordinator.port, self._handler) as conn:
                self._conn = conn
                await self._join(conn)
                if not self._started:
                    self._started = True
                    self._tasks.shield = True
                    task_status.started()
                await self._heartbeat(conn)

    async def _join(self, conn: Connection) -> None:
        sent_at = trio.current_time()
        try:
            response = await conn.request(
                JoinGroupRequest(
                    self.group_id,
                    self.member_id,
                    self.topics,
                    round(self.session_timeout * 1000),
                    round(self.rebalance_timeout * 1000),
                    self.assignors,
                    self.auto_commit,
                    self.offset_reset,
                    self.client_id,
                )
            )
        except UnknownMemberError as exc:
            raise _Reconnect(str(exc), forget_member=True) from None
        assert isinstance(response, JoinGroupResponse)
        self.member_id = response.member_id
        self.generation = response.generation
        self._granted_session = response.session_timeout_ms / 1000
        self._renew_lease(sent_at)
        if not self._assignment:
            self._state.value = ConsumerState.REBALANCING
        self._member_ready.set()
        self._backoff.reset()
        log.info("consumer joined %s as %s", self.group_id, self.member_id)

    async def _heartbeat(self, conn: Connection) -> None:
        """Heartbeat every third of the session timeout until the connection ends."""
        interval = self.session_timeout / 3
        while True:
            sent_at = trio.current_time()
            generation = self.generation
            dirty = self._dirty if self.auto_commit else set()
            positions = self._current_positions(sorted(dirty & self._assignment.keys()))
            self._dirty = set()
            with trio.move_on_after(interval):
                try:
                    await conn.request(
                        HeartbeatRequest(self.group_id, self.member_id, generation, positions)
                    )
                except IllegalGenerationError as exc:
                    if generation >= self.generation:  # not an answer overtaken by a new start
                        raise _Reconnect(str(exc)) from None
                except (UnknownMemberError, GroupNotFoundError) as exc:
                    raise _Reconnect(str(exc), forget_member=True) from None
                else:
                    self._renew_lease(sent_at)
                    positions = []
            self._dirty.update(p.tp for p in positions)  # not delivered: send them again
            with trio.move_on_at(sent_at + interval):
                await conn.wait_closed()
                raise _Reconnect("the connection to the coordinator closed")

    async def _watchdog(self) -> None:
        """Drop the partitions once no heartbeat sent within a session timeout was accepted."""
        while True:
            await trio.sleep_until(self._lease_end)
            if trio.current_time() < self._lease_end:
                continue  # the lease moved while we slept
            self._lease_moved = trio.Event()  # before on_lost: it may be renewed meanwhile
            if self._assignment:
                await self._lose("no heartbeat was accepted for a session timeout")
                if self._session_scope is not None:
                    self._session_scope.cancel()
            await self._lease_moved.wait()

    async def _leave(self) -> None:
        conn = self._conn
        if conn is None or conn.closed or not self.member_id:
            return
        # Like a push: a StopFetchers arriving meanwhile would revoke these partitions
        # again, and a StartFetchers would hand new ones to a consumer that is leaving.
        async with self._push_lock:
            positions = await self._revoke()
            self._left = True  # (after on_revoked, which may still commit)
            try:
                await conn.request(
                    LeaveGroupRequest(self.group_id, self.member_id, positions, "consumer closed")
                )
            except CoordError as exc:
                log.info("consumer %s: leave not acknowledged: %s", self.member_id, exc)
            self._state.value = ConsumerState.UNJOINED


def open_consumer(
    bootstrap: str | Sequence[str],
    group_id: str,
    topics: Iterable[str],
    **options: Any,
) -> Consumer:
    """Join ``group_id`` as a consumer of ``topics``: ``async with open_consumer(...) as c``.

    ``bootstrap`` is ``"host:port[,host:port...]"``. Options (with defaults):
    ``session_timeout=10.0`` and ``rebalance_timeout=30.0`` seconds,
    ``auto_commit=True``, ``offset_reset="latest"`` (or ``"earliest"``,
    ``"none"``), ``assignors=("range", "roundrobin")`` in order of
    preference, ``client_id``, and the callbacks ``on_assigned``,
    ``on_revoked`` and ``on_lost`` (each called with a sorted list of
    partitions; plain or async functions).

    The block is entered once the consumer has joined (use
    :meth:`Consumer.wait_assigned` for its partitions); while no broker is
    reachable it keeps retrying, so bound it with ``trio.fail_after`` if you
    must. A setting the broker refuses (say, a session timeout outside its
    limits) raises the typed error at once. Leaving the block leaves the
    group cleanly. (The :class:`Consumer` this returns is itself the async
    context manager, so callbacks can refer to it before it is entered.)
    """
    return Consumer(bootstrap, group_id, topics, **options)
