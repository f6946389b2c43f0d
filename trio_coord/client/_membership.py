"""A consumer's group membership: join, heartbeat, lease, answer the coordinator's pushes.

The Kafka consumer keeps this apart from the user API (its ConsumerCoordinator and
AbstractCoordinator, aiokafka's GroupCoordinator); here :class:`GroupMembership` holds
the half of :class:`~trio_coord.client.consumer.Consumer` that speaks to the coordinator:
the session task (find the coordinator, JoinGroup, heartbeat every third of the session
timeout, rejoin after a lost connection), the watchdogs (the member's side of the lease,
and ``max_poll_interval``), StopFetchers/StartFetchers/ComputeAssignment as the
coordinator pushes them, and leaving. ``consumer.py`` keeps what the application calls
(records, positions, commits, subscribe) and inherits this.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import trio
from trio_util import AsyncValue

from .._aio import unwrap_lone_exception
from ..core.assignors import Assignor, GroupSpec, MemberSpec
from ..protocol.connection import Connection, RequestHandler, serving
from ..protocol.errors import (
    CoordError,
    FencedInstanceIdError,
    GroupNotFoundError,
    IllegalGenerationError,
    InvalidRequestError,
    RequestTimedOutError,
    UnknownMemberError,
    UnknownServerError,
)
from ..protocol.messages import (
    ComputeAssignmentRequest,
    ComputeAssignmentResponse,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberAssignment,
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
from ._fetcher import Fetcher

# (The consumer's logger: what a user configures for the consumer covers its membership.)
log = logging.getLogger("trio_coord.client.consumer")

PartitionsCallback = Callable[[list[TopicPartition]], Any]
"""``on_assigned``/``on_revoked``/``on_lost``: called with sorted partitions; may be async."""

OffsetReset = Literal["earliest", "latest", "none"]
"""Where a member starts on a partition its group has no committed offset for (Kafka's
auto.offset.reset): the log start, the log end, or nowhere (NoOffsetError)."""

RebalanceProtocol = Literal["eager", "cooperative"]
"""How a member wants rebalances run: stop everything, or only what moves."""

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


class _AssignorFailed(Exception):
    """Internal: this consumer's assignor raised as the group's leader; ``error`` is what."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _PushHandler(RequestHandler):
    """Answers what the coordinator pushes: StopFetchers and StartFetchers."""

    def __init__(self, consumer: GroupMembership) -> None:
        self._consumer = consumer

    async def handle(self, body: RequestBody) -> ResponseBody:
        consumer = self._consumer
        if isinstance(body, ComputeAssignmentRequest):
            await consumer._member_ready.wait()
            return consumer._compute_assignment(body)
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
                    consumer._start_parts.clear()  # (a restarted rebalance voids them)
                    if body.partitions is not None:
                        return StopFetchersResponse(await consumer._revoke_some(body.partitions))
                    return StopFetchersResponse(await consumer._stop_fetchers())
                whole = consumer._collect_part(body)
                if whole is None:  # more parts of this assignment follow
                    return StartFetchersResponse()
                if whole.unchanged:
                    consumer._keep_assignment(whole)
                elif whole.incremental:
                    await consumer._start_incremental(whole)
                else:
                    await consumer._start_fetchers(whole)
                return StartFetchersResponse()
        return await super().handle(body)


class GroupMembership:
    """The group-membership half of a Consumer (which inherits it): see the module doc."""

    # State that Consumer.__init__ sets: the membership reads and moves it.
    topics: list[str]
    static_partitions: list[TopicPartition] | None
    group_id: str
    member_id: str
    generation: int
    instance_id: str
    client_id: str
    session_timeout: float
    rebalance_timeout: float
    max_poll_interval: float
    api_timeout: float
    auto_commit: bool
    offset_reset: OffsetReset
    rebalance_protocol: RebalanceProtocol
    assignors: list[str]
    user_data: bytes
    rack: str
    _local_assignors: dict[str, Assignor]
    _on_assigned: PartitionsCallback | None
    _on_revoked: PartitionsCallback | None
    _on_lost: PartitionsCallback | None
    _bootstrap: Bootstrap
    _backoff: Backoff
    _fetcher: Fetcher
    _handler: _PushHandler
    _conn: Connection | None
    _state: AsyncValue[ConsumerState]
    _assignment: dict[TopicPartition, int]
    _handed_back: list[PartitionOffset]
    _start_parts: list[StartFetchersRequest]
    _member_ready: trio.Event
    _push_lock: trio.Lock
    _left: bool
    _started: bool
    _tasks: trio.CancelScope
    _session_scope: trio.CancelScope | None
    _granted_session: float
    _lease_end: float
    _lease_moved: trio.Event
    _fenced_since: float | None
    _poll_deadline: float
    _poll_left: bool
    _poll_moved: trio.Event
    _asked_again: trio.Event
    _assignor_failed: trio.Event
    _assignor_failure: Exception | None

    if TYPE_CHECKING:  # the Consumer's own, which the membership calls

        def _engine(self) -> Fetcher: ...

        async def _request(self, conn: Connection, body: RequestBody) -> ResponseBody | None: ...

        async def commit(
            self,
            offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int] | None = None,
            *,
            allow_regression: bool = False,
        ) -> None: ...

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
        """Give up every partition cleanly: stop handing records out, ``on_revoked``
        (which may still commit), then the consumed positions to hand back (with
        auto-commit)."""
        revoked = sorted(self._assignment)
        if not revoked:
            # Already stopped. A rebalance that restarted while our answer was on its
            # way forgot it, so say the same again: committing a position twice is
            # harmless, losing it makes the next owner repeat records.
            return list(self._handed_back)
        engine = self._engine()
        engine.freeze()
        await self._call(self._on_revoked, revoked)
        positions = engine.consumed(revoked) if self.auto_commit else []
        self._drop()
        self._handed_back = positions
        return positions

    async def _revoke_some(self, partitions: list[TopicPartition]) -> list[PartitionOffset]:
        """Cooperative: give up just ``partitions`` cleanly, and keep fetching the rest.

        The positions of any of them given up already (an answer a restarted
        rebalance dropped) are said again.
        """
        wanted = set(partitions)
        owned = sorted(wanted & self._assignment.keys())
        again = [p for p in self._handed_back if p.tp in wanted and p.tp not in owned]
        positions: list[PartitionOffset] = []
        if owned:
            engine = self._engine()
            engine.freeze(owned)
            await self._call(self._on_revoked, owned)
            positions = engine.consumed(owned) if self.auto_commit else []
            engine.remove(owned)
            for tp in owned:
                del self._assignment[tp]
            self._handed_back = [p for p in self._handed_back if p.tp not in wanted] + positions
        return sorted(again + positions, key=lambda p: p.tp)

    def _collect_part(self, part: StartFetchersRequest) -> StartFetchersRequest | None:
        """An assignment too large for one frame comes in parts: the whole once all are here."""
        held = self._start_parts
        if held and held[0].generation != part.generation:
            held.clear()  # the parts of an older generation's start never finished
        held.append(part)
        if part.more:
            return None
        self._start_parts = []
        if len(held) == 1:
            return part
        joined = [p for each in held for p in each.partitions]
        brokers = {b.broker_id: b for each in held for b in each.brokers}
        return msgspec.structs.replace(
            part,
            partitions=joined,
            brokers=list(brokers.values()),
            leaders=[b for each in held for b in each.leaders]
            if all(len(e.leaders) == len(e.partitions) for e in held)
            else [],
        )

    def _learn_leaders(self, request: StartFetchersRequest) -> None:
        """Where the partitions of a start are: the coordinator said, no Metadata needed."""
        if request.brokers and len(request.leaders) == len(request.partitions):
            self._engine().cluster.learn(
                request.brokers,
                {p.tp: b for p, b in zip(request.partitions, request.leaders, strict=True)},
            )

    def _keep_assignment(self, request: StartFetchersRequest) -> None:
        """Cooperative, nothing of ours moved: the same partitions, in the new generation."""
        self._check_lease()
        self.generation = request.generation
        self._handed_back = []
        self._state.value = ConsumerState.STABLE

    async def _start_incremental(self, request: StartFetchersRequest) -> None:
        """Cooperative: own ``request.partitions``, keeping those already fetched as they are.

        ``on_assigned`` hears only of the partitions that are new here. A
        partition owned but not in the request was taken without a revoke
        (it should not happen: the coordinator revokes first) and is lost.
        """
        self._check_lease()
        self.generation = request.generation
        self._handed_back = []
        self._learn_leaders(request)
        wanted = {p.tp: p.offset for p in request.partitions}
        gone = sorted(self._assignment.keys() - wanted.keys())
        added = {tp: off for tp, off in wanted.items() if tp not in self._assignment}
        engine = self._engine()
        if gone:
            engine.remove(gone)
            for tp in gone:
                del self._assignment[tp]
            await self._call(self._on_lost or self._on_revoked, gone)
        engine.add(added)
        self._assignment.update(added)
        self._state.value = ConsumerState.STABLE
        if added:
            await self._call(self._on_assigned, sorted(added))

    def _compute_assignment(self, request: ComputeAssignmentRequest) -> ComputeAssignmentResponse:
        """As the group's leader: run the application's assignor on the group's subscriptions.

        It runs right here, on the consumer's event loop (an assignor is a
        pure function, usually quick; see docs/assignment.md). If it raises,
        the coordinator is told so (the rebalance fails, naming this member
        and the error), and the consumer leaves the group and raises that
        exception from its ``async with``: an assignor that fails on this
        group fails the same way every time it is asked.
        """
        if request.member_id != self.member_id or request.group != self.group_id:
            raise UnknownMemberError(
                f"this consumer is member {self.member_id!r} of {self.group_id!r}, "
                f"not {request.member_id!r} of {request.group!r}"
            )
        assignor = self._local_assignors.get(request.assignor)
        if assignor is None:
            raise InvalidRequestError(
                f"this consumer has no assignor {request.assignor!r} of its own to compute with"
            )
        spec = GroupSpec(
            members={
                m.member_id: MemberSpec(
                    m.member_id, frozenset(m.topics), frozenset(m.owned), m.user_data
                )
                for m in request.members
            },
            partitions=dict(request.partitions),
        )
        try:
            assignment = assignor.assign(spec)
            return ComputeAssignmentResponse(
                [MemberAssignment(m, sorted(tps)) for m, tps in sorted(assignment.items())]
            )
        except Exception as exc:
            exc.add_note(
                f"raised by assignor {request.assignor!r} computing the assignment of group "
                f"{self.group_id!r} on its leader, member {self.member_id!r} (which leaves "
                "the group)"
            )
            if self._assignor_failure is None:
                self._assignor_failure = exc
                self._assignor_failed.set()
            raise UnknownServerError(
                f"assignor {request.assignor!r} raised {type(exc).__name__}: {exc}; "
                f"member {self.member_id!r} leaves the group"
            ) from exc

    def _drop(self) -> list[TopicPartition]:
        """Forget every partition, its position and unsent progress; return what was owned."""
        owned = sorted(self._assignment)
        self._assignment.clear()
        self._engine().drop()
        return owned

    def _check_lease(self) -> None:
        if trio.current_time() >= self._lease_end:
            # The lease ran out while we owned nothing, so the watchdog has nothing to
            # drop: the coordinator may have declared us dead and handed these over.
            raise RequestTimedOutError(
                f"member {self.member_id!r} has no lease: no heartbeat it sent within "
                f"its session timeout ({self._granted_session:g}s) was accepted"
            )

    async def _start_fetchers(self, request: StartFetchersRequest) -> None:
        self._check_lease()
        self.generation = request.generation
        self._handed_back = []
        self._learn_leaders(request)
        self._assignment = {p.tp: p.offset for p in request.partitions}
        self._engine().assign(dict(self._assignment))
        self._state.value = ConsumerState.STABLE
        await self._call(self._on_assigned, sorted(self._assignment))

    async def _lose(self, reason: str) -> None:
        """Drop every partition without a clean revoke (the lease ran out, or we were expelled).

        Serialized with the pushes: a StopFetchers whose ``on_revoked`` is
        running finishes first, and then there is nothing left to lose twice.
        """
        async with self._push_lock:
            lost = self._drop()
            self._handed_back = []  # others may own (and have moved) these by now
            self._state.value = ConsumerState.UNJOINED
            if lost:
                log.warning(
                    "consumer %s lost %d partition(s): %s", self.member_id, len(lost), reason
                )
                await self._call(self._on_lost or self._on_revoked, lost)

    def _holds_lease(self) -> bool:
        return trio.current_time() < self._lease_end

    def _renew_lease(self, sent_at: float) -> None:
        # The lease is the session the broker granted (what its fences are measured
        # with), counted from when the accepted request was *sent*.
        if sent_at + self._granted_session > self._lease_end:
            expired = not self._holds_lease()
            self._lease_end = sent_at + self._granted_session
            self._lease_moved.set()
            if expired:  # records held back while it had run out may go again
                self._fetcher.wake()

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
                nursery.start_soon(self._poll_watchdog)
                while True:
                    if self._assignor_failure is not None:  # (left, or lost the connection)
                        raise self._assignor_failure
                    if self._poll_left:  # left for max_poll_interval: rejoin once asked again
                        await self._asked_again.wait()
                        self._poll_left = self._left = False
                        self.member_id = ""
                    with trio.CancelScope() as self._session_scope:
                        try:
                            await self._session(task_status)
                        except _AssignorFailed as exc:
                            raise exc.error from None
                        except _Reconnect as exc:
                            self._bootstrap.saw(exc)
                            log.info("consumer %s: %s; rejoining", self.member_id or "?", exc)
                            if exc.forget_member:
                                await self._lose(str(exc))
                                self.member_id = ""
                        except FencedInstanceIdError as exc:
                            # Our own former process, not yet seen gone by the broker,
                            # or a real twin: wait one session timeout to tell them apart.
                            now = trio.current_time()
                            if self._fenced_since is None:
                                self._fenced_since = now
                            if now - self._fenced_since >= self.session_timeout:
                                raise
                            log.info("consumer %s: %s; retrying", self.instance_id, exc)
                        except CoordError as exc:
                            if not exc.retriable:
                                raise  # a setting the broker refuses: tell the application
                            self._bootstrap.saw(exc)
                            log.info("consumer %s: %s; reconnecting", self.member_id or "?", exc)
                    self._conn = None
                    self._member_ready = trio.Event()
                    await self._backoff.sleep()

    async def _session(self, task_status: trio.TaskStatus[None]) -> None:
        """One connection to the coordinator: join, then heartbeat until it breaks."""
        what = f"no coordinator of group {self.group_id!r} was found"
        with self._bootstrap.fail_after(self.api_timeout, what, "api_timeout"):
            coordinator = await self._bootstrap.find_coordinator(self.group_id)
        stream = await self._bootstrap.connect((coordinator.host, coordinator.port))
        conn = Connection(stream, self._handler, name=coordinator.address)
        with unwrap_lone_exception():
            async with serving(conn):
                self._conn = conn
                await self._join(conn)
                if not self._started:
                    self._started = True
                    self._tasks.shield = True
                    task_status.started()
                with unwrap_lone_exception():
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._heartbeat, conn)
                        await self._assignor_failed.wait()
                        nursery.cancel_scope.cancel()
                # Our assignor raised as the leader: leave (for good, even a static
                # member: the group must go on without this assignor), then tell the app.
                with trio.move_on_after(_LEAVE_TIMEOUT):
                    await self._leave(reason="its assignor failed")
                assert self._assignor_failure is not None
                raise _AssignorFailed(self._assignor_failure)

    async def _join(self, conn: Connection) -> None:
        while True:
            sent_at = trio.current_time()
            topics = self.topics
            try:
                response = await self._request(
                    conn,
                    JoinGroupRequest(
                        self.group_id,
                        self.member_id,
                        topics,
                        round(self.session_timeout * 1000),
                        round(self.rebalance_timeout * 1000),
                        self.assignors,
                        self.auto_commit,
                        self.offset_reset,
                        self.client_id,
                        self.rebalance_protocol,
                        self.instance_id,
                        self.user_data,
                        sorted(self._local_assignors),
                        self.rack,
                    ),
                )
            except UnknownMemberError as exc:
                raise _Reconnect(str(exc), forget_member=True) from None
            assert isinstance(response, JoinGroupResponse)
            if not response.rejoin and topics == self.topics:
                break
            # The first step (join again with the member id handed out), or subscribe()
            # changed the topics while this join was on its way: join again with them.
            self.member_id = response.member_id
        self.member_id = response.member_id
        self._fenced_since = None
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
            positions = self._engine().take_dirty() if self.auto_commit else []
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
            self._engine().return_dirty(positions)  # not delivered: send them again
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

    async def _poll_watchdog(self) -> None:
        """Leave the group once the application has not asked for records within
        ``max_poll_interval`` (Kafka's ``max.poll.interval.ms``).

        Heartbeats run on their own task, so without this an application that
        stopped reading (stuck, or processing one batch for too long) would
        keep its partitions, and no one would consume them. The consumer
        revokes them cleanly (``on_revoked``; the positions consumed so far
        are handed back), leaves with a reason that says why, so the group
        rebalances at once, and rejoins when the application asks again.
        """
        while True:
            moved = self._poll_moved
            with trio.move_on_at(self._poll_deadline):
                await moved.wait()
                continue
            await self._leave_for_poll_interval()
            await self._asked_again.wait()

    async def _leave_for_poll_interval(self) -> None:
        log.warning(
            "consumer %s of group %s: the application has not asked for records for %gs "
            "(max_poll_interval); leaving the group so that its %d partition(s) go to other "
            "members. It rejoins when the application asks for records again. If processing "
            "a batch takes this long, process faster, lower the batch "
            "(getmany(max_records=...)) or raise max_poll_interval",
            self.member_id or "?",
            self.group_id,
            self.max_poll_interval,
            len(self._assignment),
        )
        self._asked_again = trio.Event()
        self._poll_left = True
        with trio.move_on_after(_LEAVE_TIMEOUT):
            await self._leave(
                reason="the application did not ask for records within max_poll_interval "
                f"({self.max_poll_interval:g}s)"
            )
        self._left = True
        if self._assignment:  # not connected, so not left cleanly: what it had is lost
            await self._lose("the application did not ask for records within max_poll_interval")
        if self._session_scope is not None:
            self._session_scope.cancel()

    async def _leave(self, *, reason: str = "") -> None:
        """Revoke, hand the positions back and leave the group (a static member, closing,
        steps out instead; with a ``reason`` it leaves for good)."""
        if self.static_partitions is not None:
            if self.group_id and self.auto_commit and self._assignment:
                try:
                    await self.commit()
                except (CoordError, ValueError) as exc:
                    log.info("consumer: final commit of %s failed: %s", self.group_id, exc)
            self._drop()
            return
        conn = self._conn
        if conn is None or conn.closed or not self.member_id:
            return
        # Like a push: a StopFetchers arriving meanwhile would revoke these partitions
        # again, and a StartFetchers would hand new ones to a consumer that is leaving.
        async with self._push_lock:
            if self.instance_id and not reason:
                await self._step_out(conn)
                return
            positions = await self._revoke()
            self._left = True  # (after on_revoked, which may still commit)
            try:
                await conn.request(
                    LeaveGroupRequest(
                        self.group_id, self.member_id, positions, reason or "consumer closed"
                    )
                )
            except CoordError as exc:
                log.info("consumer %s: leave not acknowledged: %s", self.member_id, exc)
            self._state.value = ConsumerState.UNJOINED

    async def _step_out(self, conn: Connection) -> None:
        """A static member closes without leaving the group: it stops, hands back its
        positions, and asks the coordinator to keep its place (LeaveGroup ``stay``).

        The coordinator keeps its partitions for it (fetched by no one) until
        its session expires; a consumer with the same ``instance_id`` that
        joins before then gets them back at once, without a rebalance of the
        others.
        """
        positions = await self._revoke()
        self._left = True
        self._state.value = ConsumerState.UNJOINED
        try:
            await conn.request(
                LeaveGroupRequest(
                    self.group_id, self.member_id, positions, "consumer closed", stay=True
                )
            )
        except CoordError as exc:
            log.info("consumer %s: step-out not acknowledged: %s", self.member_id, exc)
