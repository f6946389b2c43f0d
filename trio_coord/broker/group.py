"""The group task: one Trio task tree per consumer group, driving the pure group state.

A :class:`GroupRunner` owns one :class:`~trio_coord.core.group.Group` and is
its only writer. Its nursery holds, per member, a liveness task whose cancel
scope deadline *is* the session deadline (a heartbeat moves it: O(1), no
allocation, no store write), the rebalance loop, and the flusher of positions
that heartbeats carry. Each rebalance runs in
its own cancel scope through the phases of the stop/start design::

    stop fetchers (all members, in parallel)  →  commit their positions
      →  assign (pure core) and persist the generation  →  start fetchers, await acks

Each member's answer in a phase is awaited under that member's rebalance
timeout; one that does not answer in time is expelled at that very moment.
A native member's request is pushed with no task of its own, and the phase's
answers are awaited by the rebalance's task under one deadline at a time
(:class:`_Answers`); a member that cannot be pushed to runs in a task.
Any membership change (join, leave, session expiry, lost connection,
expulsion) or a topic growing cancels the in-flight rebalance scope at once
and the loop starts the next one: nothing waits for a timeout to learn what
is already known. This is where cancel scopes replace Kafka's purgatories.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio

from ..core.assignors import KAFKA_ASSIGNOR_PREFIX, Assignment, Assignor
from ..core.fencing import check_commit, check_heartbeat, check_offset_metadata, check_offsets
from ..core.group import AssignmentInput, Group, GroupLimits, GroupState, Member, StartPlan
from ..core.records import OffsetRecord, OffsetTombstone, Record
from ..core.validation import PATTERN_PREFIX
from ..protocol.errors import (
    AuthorizationError,
    ConnectionClosedError,
    CoordError,
    CoordinatorNotAvailableError,
    FencedInstanceIdError,
    FrameTooLargeError,
    GroupSubscribedToTopicError,
    InconsistentAssignorError,
    InvalidRequestError,
    UnknownMemberError,
    UnknownTopicError,
)
from ..protocol.framing import DEFAULT_MAX_FRAME_SIZE
from ..protocol.messages import (
    BrokerInfo,
    ComputeAssignmentRequest,
    ComputeAssignmentResponse,
    GroupDescription,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberDescription,
    MemberSubscription,
    OffsetCommitRequest,
    PartitionOffset,
    RequestBody,
    ResponseBody,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
    TopicPartition,
)
from ..protocol.sizing import encoded_size, in_parts
from ..security.acl import ANONYMOUS
from ..store.base import StoreError
from . import events as ev
from .events import EventCallback
from .liveness import Liveness

if TYPE_CHECKING:
    from .persistence import RecordWriter
    from .topics import TopicManager

__all__ = [
    "PENDING_JOIN_TIMEOUT",
    "EventCallback",
    "GroupRunner",
    "LeaderAssignmentError",
    "MemberLink",
]

log = logging.getLogger(__name__)

MIN_MEMBER_FRAME = 64 * 1024
"""The smallest frame a member's join may say it reads (a consumer's least
``fetch_max_bytes``): a smaller one would cut its assignment into a push per partition."""
_ENVELOPE_BYTES = 64
"""Room for a pushed request's envelope (its type and correlation id) around its body."""
PENDING_JOIN_TIMEOUT = 30.0
"""The longest a member id handed out by a first-step join waits for its second step."""
FAILURE_REPEAT_LOG_INTERVAL = 600.0
"""A rebalance failing again for the cause last logged is logged at DEBUG, and at WARNING
at most once per this many seconds: a group waiting for a member that computes its
assignor retries every 30 s (``rebalance_retry_backoff_max``) for as long as it waits."""

LogOffsets = Callable[[TopicPartition], tuple[int, int]]
"""A partition's (log start, log end) offsets, as the partition log knows them."""

Locate = Callable[[list[TopicPartition]], tuple[list[BrokerInfo], list[int]]]
"""The brokers holding some partitions: their addresses, and per partition the id of its
broker (what a StartFetchers tells a member, so that it fetches without a Metadata call)."""


CAUSES = ("join", "leave", "crash", "topic", "reset", "other")
"""Why a rebalance runs, as metrics label it: a member joined, left cleanly, failed
(session expiry, lost connection, no answer in time), a subscribed topic changed,
offsets were reset; or anything else."""


def _cause_of(reason: str) -> str:
    """The :data:`CAUSES` entry of a rebalance request's reason text."""
    if reason.startswith("topic "):
        return "topic"
    if reason.startswith("offsets reset"):
        return "reset"
    if reason.endswith(" joined"):
        return "join"
    if " left the group" in reason:
        return "leave"
    if reason.startswith("member "):
        return "crash"
    return "other"


def _wall_clock_ms() -> int:
    """Commit timestamps are for people: wall-clock time, unlike every deadline here."""
    return time.time_ns() // 1_000_000


class MemberLink(Protocol):
    """How the group engine reaches a member: what it pushes, and whether it is still there.

    A native :class:`~trio_coord.protocol.connection.Connection` is one (the
    pushes travel as frames); a front end for another wire protocol gives
    each member an object of its own that turns the pushes (StopFetchers,
    StartFetchers, ComputeAssignment) into answers to that member's pending
    requests (``trio_coord.kafka.groups.KafkaMemberLink``). The coordinator
    keeps, per link, the members it carries, for ``connection_lost``.
    """

    @property
    def peer(self) -> str:
        """Where the member is (shown as its host)."""
        ...

    @property
    def closed(self) -> bool:
        """True once the member can no longer be reached this way."""
        ...

    @property
    def max_frame_size(self) -> int:
        """The largest push the link carries (a longer assignment is sent in parts)."""
        ...

    async def request(self, body: RequestBody) -> ResponseBody | None:
        """Push ``body`` to the member and return its answer (ConnectionClosedError if gone)."""
        ...


class LeaderAssignmentError(Exception):
    """The group's leader could not compute the assignment (its assignor raised).

    It fails the rebalance, as a store outage does: the leader is not
    expelled (it is alive, and a consumer whose assignor raised leaves by
    itself), and the group task retries after a backoff, or at once when
    the membership changes.
    """


class _Reset:
    """Offsets a ResetOffsets request waits to see durable."""

    def __init__(self, records: list[OffsetRecord]) -> None:
        self.records = records
        self.done = trio.Event()
        self.error: StoreError | None = None


def _all(member: Member) -> None:
    """What a member stops in an eager rebalance: everything (None)."""
    return None


def _check_started(response: ResponseBody | None) -> None:
    """InvalidRequestError (the member is expelled) unless ``response`` acknowledges a
    StartFetchers: a member that answers something else may not be fetching anything."""
    if not isinstance(response, StartFetchersResponse):
        raise InvalidRequestError(f"answered StartFetchers with {type(response).__name__}")


def _forget_push(conn: MemberLink, corr_id: int) -> None:
    """Stop ``conn`` waiting for the answer to push ``corr_id``: a push owed keeps its
    connection from being idle (``connections_max_idle``) and holds its phase."""
    forget = getattr(conn, "forget", None)
    if forget is not None:
        forget(corr_id)


class _Answers:
    """What one phase of a rebalance awaits of its members, with no task per member.

    Each member's request is pushed (:meth:`Connection.push
    <trio_coord.protocol.connection.Connection.push>`) and its answer comes
    back through a callback; the rebalance's task waits for them all under
    one deadline at a time (the earliest of the members still owing an
    answer), and expels whoever is overdue at that moment, as a task and
    cancel scope per member used to (``_answer_in_time``). Deadlines are kept
    per rebalance timeout, each in push order, so the earliest is found
    without a scan and expiry pops from the front. Every push of a phase shares
    one callback (:meth:`answered`, with the member as its context) and one
    function applying an answer (``apply``): what a phase allocates per member
    is its entries here and the request's frame.
    """

    __slots__ = ("apply", "bug", "by_timeout", "callback", "done", "failures", "pending")

    def __init__(self, apply: Callable[[Member, Any, ResponseBody | None], None]) -> None:
        self.apply = apply
        """Applies one member's answer, given what was pushed to it (``extra``); a
        CoordError it raises (an answer that makes no sense) expels the member."""
        self.callback = self.answered  # (one bound method for every push)
        self.pending: dict[str, tuple[Member, MemberLink, int, Any]] = {}
        """Member id → (the member, its link, the pushed request's correlation id, what
        ``apply`` needs to know of what was pushed)."""
        self.by_timeout: dict[float, dict[str, float]] = {}
        """Rebalance timeout → member id → its deadline (in push order, so deadline order)."""
        self.failures: list[tuple[Member, str]] = []
        """Members whose answer was an error (or whose connection ended): expelled next."""
        self.done = trio.Event()
        """Set when nothing is pending any more, or a failure is to be handled."""
        self.bug: Exception | None = None
        """What applying an answer raised that is not a peer's mistake: the rebalance fails."""

    def add(self, member: Member, conn: MemberLink, extra: Any, now: float) -> None:
        """``member`` owes an answer within its rebalance timeout."""
        self.pending[member.member_id] = (member, conn, 0, extra)
        timeout = member.rebalance_timeout
        self.by_timeout.setdefault(timeout, {})[member.member_id] = now + timeout

    def settle(self, member: Member) -> bool:
        """``member`` answered (or failed): no longer owed; False if it was not pending."""
        entry = self.pending.pop(member.member_id, None)
        if entry is None or entry[0] is not member:
            if entry is not None:  # (another member of that id: keep its entry)
                self.pending[member.member_id] = entry
            return False
        # (.get: a member that joined again meanwhile may have another timeout now; its
        # old deadline entry is then skipped by overdue() when it comes up.)
        self.by_timeout.get(member.rebalance_timeout, {}).pop(member.member_id, None)
        if not self.pending:
            self.done.set()
        return True

    def answered(self, member: Member, body: ResponseBody | None, error: CoordError | None) -> None:
        """A pushed request's answer (the callback of every push of the phase)."""
        entry = self.pending.get(member.member_id)
        if entry is None or entry[0] is not member:
            return  # (expelled as overdue meanwhile, or no longer awaited)
        if error is None:
            try:
                self.apply(member, entry[3], body)
            except CoordError as exc:
                error = exc
            except Exception as exc:  # a bug: it fails the rebalance, in its task
                self.bug = exc
                self.done.set()
                return
            else:
                self.settle(member)
                return
        if isinstance(error, ConnectionClosedError):
            self.fail(member, "lost its connection")
        else:
            self.fail(member, f"refused the rebalance: {error}")

    def fail(self, member: Member, reason: str) -> None:
        """``member`` answered with an error: it is expelled by the waiting task."""
        if self.settle(member):
            self.failures.append((member, reason))
            self.done.set()

    def earliest(self) -> float:
        """The first deadline among the members still owing an answer."""
        return min(next(iter(d.values())) for d in self.by_timeout.values() if d)

    def overdue(self, now: float) -> list[Member]:
        """The members whose deadline has passed, taken off the pending list."""
        late = []
        for deadlines in self.by_timeout.values():
            while deadlines:
                first = next(iter(deadlines))
                if deadlines[first] > now:
                    break
                del deadlines[first]
                entry = self.pending.pop(first, None)
                if entry is not None:
                    late.append(entry[0])
                    _forget_push(entry[1], entry[2])  # (else its link keeps it owed)
        if not self.pending:
            self.done.set()
        return late

    def forget(self) -> None:
        """Stop waiting for every answer still owed (the phase ended or was cancelled)."""
        for _, conn, corr_id, _ in self.pending.values():
            _forget_push(conn, corr_id)
        self.pending.clear()
        self.by_timeout.clear()


class GroupRunner:
    """Runs one group: liveness deadlines, the rebalance loop, requests; see the module doc."""

    def __init__(
        self,
        group: Group,
        *,
        writer: RecordWriter,
        topics: TopicManager,
        log_offsets: LogOffsets,
        assignors: dict[str, Assignor],
        limits: GroupLimits,
        position_flush_interval: float,
        store_retry_backoff: float = 1.0,
        store_retry_backoff_max: float = 30.0,
        on_event: EventCallback | None = None,
        event_detail: bool = True,
        locate: Locate | None = None,
        bind_connection: Callable[[MemberLink, str, str | None], None],
    ) -> None:
        self.group = group
        self._writer = writer
        self._topics = topics
        self._log_offsets = log_offsets
        self._assignors = assignors
        self._limits = limits
        self._flush_interval = position_flush_interval
        self._retry_backoff = store_retry_backoff
        self._retry_backoff_max = max(store_retry_backoff, store_retry_backoff_max)
        self._failures = 0  # rebalances failed in a row (each backoff doubles)
        self._failed: tuple[str, float, float] | None = None
        """The cause of the failures in a row (its message), when it was first logged, and
        when it was last logged above DEBUG (:meth:`_log_failure`)."""
        self._on_event = on_event
        self._detail = on_event is not None and event_detail
        """Whether events carry their partition lists (O(partitions) each: see .events)."""
        self._locate = locate
        self._cause = ""  # why the rebalance in flight (or the next one) runs: CAUSES
        self._bind = bind_connection
        self._conns: dict[str, MemberLink] = {}
        self._frames: dict[str, int] = {}
        """Member id → the largest frame it reads (its join says), for cutting pushes."""
        self._owners: dict[str, str] = {}
        """Member id → the principal that joined with it (only it may act as that member)."""
        self._liveness = Liveness(self._session_expired)
        self._kick = trio.Event()
        self._rebalance_scope: trio.CancelScope | None = None
        self._late_joins: set[str] = set()  # new members that joined during the rebalance
        self._burst = False  # new members joined while the last rebalance ran
        self._last_join = -math.inf  # when a member last joined
        self._positions_dirty = trio.Event()
        self._resets: list[_Reset] = []
        self._nursery: trio.Nursery | None = None
        self._pending_ids: dict[str, float] = {}  # member ids handed out → until when
        self.ready = trio.Event()
        """Set once the group task runs and can admit members."""
        self.deleting = False
        """True while the group's tombstone is being written: joins must wait."""
        self.rebalances = 0
        """How many rebalances completed (for tests and benchmarks)."""

    @property
    def group_id(self) -> str:
        """The id of the group this runner drives."""
        return self.group.group_id

    def _emit(self, kind: type[ev.GroupEvent], **fields: object) -> None:
        """Report an event (:mod:`.events`) of this group, now; built only if someone listens."""
        if self._on_event is not None:
            self._on_event(kind(group=self.group_id, time=trio.current_time(), **fields))

    # -- lifetime --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The group task: runs until cancelled (group deleted, or broker shutdown)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._rebalance_loop)
            nursery.start_soon(self._position_flusher)
            nursery.start_soon(self._liveness.run)
            self.ready.set()
            task_status.started()

    def close(self) -> None:
        """Stop the group task (after the group was deleted)."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- membership --------------------------------------------------------------

    def join(self, request: JoinGroupRequest, conn: MemberLink) -> JoinGroupResponse:
        """Admit a member (a new one, a live one rejoining, or one known from before a restart).

        A join without a member id (and without an instance id) is not
        admitted: it is given a member id to join again with, which is
        remembered briefly (:meth:`_member_id_required`), so that a client
        retrying joins fills no group. A static member (``instance_id``)
        coming back while its former self is still in the group,
        disconnected, takes its place and partitions without a rebalance
        if it asks for what it had (:meth:`_resume_static`; what the former
        process may still fetch stays fenced until its lease ends); while
        its former self is connected, it is refused (fenced) and the former
        one keeps running.
        """
        group = self.group
        member_id = request.member_id
        frame = conn.max_frame_size
        if self.deleting:
            raise CoordinatorNotAvailableError(
                f"group {self.group_id} is being deleted; join again in a moment"
            )
        static = group.member_by_instance(request.instance_id)
        if static is not None:
            old_conn = self._conns.get(static.member_id)
            if member_id != static.member_id and old_conn is not None and not old_conn.closed:
                raise FencedInstanceIdError(
                    f"instance id {request.instance_id!r} is in use by live member "
                    f"{static.member_id!r} of group {self.group_id}; give every consumer its "
                    "own instance_id (this one is refused, the other keeps running)"
                )
            member_id = static.member_id
        elif self._pending_ids.pop(member_id, -math.inf) > trio.current_time():
            pass  # the second step of a new member's join
        elif (
            member_id
            and member_id not in group.members
            and not group.knows_former_member(member_id)
        ):
            raise UnknownMemberError(
                f"member {member_id!r} is not known to group {self.group_id}; rejoin with an "
                "empty member id to get a new one"
            )
        session_timeout = request.session_timeout_ms / 1000
        group.validate_join(
            member_id=member_id,
            topics=request.topics,
            session_timeout=session_timeout,
            rebalance_timeout=request.rebalance_timeout_ms / 1000,
            assignors=request.assignors,
            offset_reset=request.offset_reset,
            limits=self._limits,
            available=self._assignors,
            protocol=request.rebalance_protocol,
            client_assignors=request.client_assignors,
            user_data=request.user_data,
            client_id=request.client_id,
            instance_id=request.instance_id,
            rack=request.rack,
        )
        if not member_id:
            prefix = request.instance_id or request.client_id or "member"
            member_id = f"{prefix}-{uuid.uuid4().hex[:12]}"
            if not request.instance_id:
                return self._member_id_required(member_id, request, frame)
        if static is not None and request.member_id != static.member_id:
            # A new process (it does not know the member id): the old one may be cut off
            # rather than dead, and its partitions stay fenced until its lease ends.
            group.replace_process(trio.current_time(), static.member_id)
        new = member_id not in group.members and not group.knows_former_member(member_id)
        principal = getattr(conn, "principal", ANONYMOUS)
        if member_id in group.members:
            self.check_owner(member_id, principal)
        self._owners[member_id] = principal
        old_conn = self._conns.get(member_id)
        if old_conn is not None and old_conn is not conn:
            self._bind(old_conn, member_id, None)
        if static is not None and self._resume_static(static, request, conn):
            return JoinGroupResponse(
                member_id, group.generation, request.session_timeout_ms, max_frame_size=frame
            )
        group.add_member(
            trio.current_time(),
            member_id=member_id,
            client_id=request.client_id,
            host=conn.peer,
            topics=request.topics,
            session_timeout=session_timeout,
            rebalance_timeout=request.rebalance_timeout_ms / 1000,
            assignors=request.assignors,
            auto_commit=request.auto_commit,
            offset_reset=request.offset_reset,
            protocol=request.rebalance_protocol,
            instance_id=request.instance_id,
            user_data=request.user_data,
            client_assignors=request.client_assignors,
            rack=request.rack,
            owned=request.owned,
        )
        self._conns[member_id] = conn
        self._frames[member_id] = max(request.max_frame_size, MIN_MEMBER_FRAME)
        self._bind(conn, member_id, self.group_id)
        self._liveness.watch(member_id, session_timeout)
        self._emit(ev.Joined, member_id=member_id)
        self._last_join = trio.current_time()
        if new and self._rebalance_scope is not None:
            # A rebalance runs: it is not restarted (a new member owns nothing to stop, and
            # a burst of joins would restart it for each). The member is in its plan if the
            # plan is not made yet, else the rebalance that follows takes it in.
            self._late_joins.add(member_id)
            self._cause = self._cause or "join"
            self._kick.set()
        else:
            self.request_rebalance(f"member {member_id} joined")
        return JoinGroupResponse(
            member_id, group.generation, request.session_timeout_ms, max_frame_size=frame
        )

    def _member_id_required(
        self, member_id: str, request: JoinGroupRequest, frame: int
    ) -> JoinGroupResponse:
        """Hand out a member id to join again with, remembered for a short while.

        A client joins again with it at once, so it is kept no longer than
        :data:`PENDING_JOIN_TIMEOUT` (or the client's session or rebalance
        timeout, if shorter). The ids waiting for their second step are at
        most ``max_group_size``: past that the oldest is forgotten (its
        client, if it ever comes back, is told to start over), so a client
        that retries first steps can neither fill memory nor lock anyone out.
        Ids are handed out in time order, so expired ones are dropped from
        the front (one kept shorter behind a longer one waits its turn: the
        size bound holds regardless).
        """
        now = trio.current_time()
        pending = self._pending_ids
        while pending and pending[oldest := next(iter(pending))] <= now:
            del pending[oldest]  # expired from the front: O(1) per id, never a scan
        while len(self._pending_ids) >= self._limits.max_group_size:
            del self._pending_ids[next(iter(self._pending_ids))]  # the oldest (insertion order)
        keep = min(
            request.session_timeout_ms / 1000,
            request.rebalance_timeout_ms / 1000,
            PENDING_JOIN_TIMEOUT,
        )
        self._pending_ids[member_id] = now + keep
        return JoinGroupResponse(
            member_id,
            self.group.generation,
            request.session_timeout_ms,
            rejoin=True,
            max_frame_size=frame,
        )

    def _resume_static(self, member: Member, request: JoinGroupRequest, conn: MemberLink) -> bool:
        """A static member is back: hand it its partitions again, without a rebalance.

        Only in a stable group, and only if it asks for what it had (topics,
        assignors, protocol, session and rebalance timeouts): anything else
        needs a rebalance. Returns False then, and the join proceeds as any
        other. The timeouts matter because a resume writes no generation
        record: a coordinator taking over fences the member's partitions for
        the session timeout in the last record, and a longer one granted here
        would outlast that fence. If its former process did
        not step out cleanly it may still be fetching, cut off rather than
        dead: the partitions then start once that process's lease has ended
        (the fence :meth:`Group.replace_process` left), and a rebalance that
        supersedes this start keeps that fence for whoever gets them.
        """
        group = self.group
        if (
            group.state is not GroupState.STABLE
            or member.topics != frozenset(request.topics)
            or member.assignors != tuple(request.assignors)
            or member.protocol != request.rebalance_protocol
            or member.client_assignors != tuple(request.client_assignors)
            or member.session_timeout != request.session_timeout_ms / 1000
            or member.rebalance_timeout != request.rebalance_timeout_ms / 1000
        ):
            return False
        now = trio.current_time()
        member.last_heartbeat = now
        member.user_data = request.user_data
        self._conns[member.member_id] = conn
        self._frames[member.member_id] = max(request.max_frame_size, MIN_MEMBER_FRAME)
        self._bind(conn, member.member_id, self.group_id)
        self._liveness.watch(member.member_id, member.session_timeout)
        plan = group.planning.resume_plan(now, member.member_id, self._log_offsets)
        generation = group.generation
        self._emit(ev.Resumed, member_id=member.member_id, instance_id=member.instance_id)

        async def resume(m: Member) -> None:
            # A rebalance that began before this task ran decides for itself (it may
            # have moved these partitions): start only in the generation planned for.
            if group.state is GroupState.STABLE and group.generation == generation:
                await self._start_member(m, plan, generation)

        assert self._nursery is not None
        self._nursery.start_soon(self._answer_in_time, member, resume, plan.not_before)
        return True

    def _session_expired(self, member_id: str) -> None:
        self.remove_member(member_id, "session timeout expired", stopped=False)

    def heartbeat(self, request: HeartbeatRequest) -> None:
        """Accept a heartbeat (O(1): moves the member's deadline) or raise the fencing error."""
        member = check_heartbeat(self.group, request.member_id, request.generation)
        positions = self._accepted(request.positions) if request.positions else []
        now = trio.current_time()
        self.group.heartbeat(now, member, positions, request.generation)
        self._liveness.renew(member.member_id)
        if request.positions and self.group.positions and not self._positions_dirty.is_set():
            self._positions_dirty.set()

    async def leave(self, request: LeaveGroupRequest) -> None:
        """A member leaves after stopping its fetchers; its final positions are committed.

        A static member that asks to ``stay`` (a restart) steps out instead:
        it has stopped, so a successor with its instance id may start at
        once, and until its session expires nobody else gets its partitions.
        """
        member = self.group.members.get(request.member_id)
        if member is None:
            raise UnknownMemberError(
                f"member {request.member_id!r} is not in group {self.group_id}"
            )
        positions = self._accepted(request.positions)
        self.group.member_stopped(member.member_id, positions)
        if request.stay and member.instance_id and self.group.state is GroupState.STABLE:
            conn = self._conns.pop(member.member_id, None)
            if conn is not None:
                self._bind(conn, member.member_id, None)
            self._emit(ev.SteppedOut, member_id=member.member_id, until=member.lease_end)
        else:
            reason = f"left the group{': ' + request.reason if request.reason else ''}"
            self.remove_member(member.member_id, reason, stopped=True)
        await self._commit_positions()

    def remove_member(self, member_id: str, reason: str, *, stopped: bool) -> None:
        """Remove a member for ``reason`` and restart the rebalance without it, at once."""
        if member_id not in self.group.members:
            return
        now = trio.current_time()
        member = self.group.remove_member(now, member_id, stopped=stopped)
        self._liveness.forget(member_id)
        self._owners.pop(member_id, None)
        self._frames.pop(member_id, None)
        conn = self._conns.pop(member_id, None)
        if conn is not None:
            self._bind(conn, member_id, None)
        log.info("group %s: member %s removed: %s", self.group_id, member_id, reason)
        fence = self.group.fences.get(member_id)
        self._emit(
            ev.Removed,
            member_id=member_id,
            reason=reason,
            fenced_until=fence.until if fence else None,
            partitions=[str(tp) for tp in sorted(member.may_own)] if self._detail else [],
        )
        if not self.group.members:
            self._emit(ev.Empty)
        self.request_rebalance(f"member {member_id} {reason}")

    def has_owner(self, principal: str) -> bool:
        """True if a member of this group was joined by ``principal``."""
        return principal in self._owners.values()

    def check_owner(self, member_id: str, principal: str) -> None:
        """Raise AuthorizationError unless ``principal`` joined as ``member_id`` (or nobody did).

        A member id is a capability only for the principal that joined with
        it: another one cannot take it over (JoinGroup with that id), keep it
        alive (Heartbeat), commit, or make it leave.
        """
        owner = self._owners.get(member_id)
        if owner is not None and owner != principal:
            raise AuthorizationError(
                f"{principal} may not act as member {member_id!r} of group {self.group_id}: "
                f"it was joined by {owner}; join with an empty member id to get one of your own"
            )

    def connection_lost(self, member_id: str) -> None:
        """The member's connection ended without a LeaveGroup.

        A static member of a stable group stays (disconnected, its partitions
        kept for it) until its session expires, in case it comes back.
        """
        member = self.group.members.get(member_id)
        if member is not None and member.instance_id and self.group.state is GroupState.STABLE:
            conn = self._conns.pop(member_id, None)
            if conn is not None:
                self._bind(conn, member_id, None)
            self._emit(ev.Disconnected, member_id=member_id, until=member.lease_end)
            return
        self.remove_member(member_id, "lost its connection", stopped=False)

    def _conn_of(self, member: Member) -> MemberLink:
        conn = self._conns.get(member.member_id)
        if conn is None:
            raise ConnectionClosedError(f"static member {member.member_id} is disconnected")
        return conn

    def request_rebalance(self, reason: str) -> None:
        """Start a rebalance soon; cancel the one in flight, which is now out of date."""
        log.debug("group %s: rebalance requested: %s", self.group_id, reason)
        self._cause = _cause_of(reason)
        self._kick.set()
        if self._rebalance_scope is not None:
            self._rebalance_scope.cancel()

    # -- offsets -----------------------------------------------------------------------

    async def commit(self, request: OffsetCommitRequest) -> None:
        """Validate and durably commit offsets (acknowledged only once durable)."""
        check_offset_metadata(request.offsets, self._limits.offset_metadata_max_bytes)
        check_commit(
            self.group,
            request.member_id,
            request.generation,
            request.offsets,
            allow_regression=request.allow_regression,
            partitions=self._topics.partitions,
        )
        now_ms = _wall_clock_ms()
        records: list[Record] = [
            OffsetRecord(
                self.group_id,
                o.topic,
                o.partition,
                o.offset,
                o.metadata,
                now_ms,
                request.allow_regression,
            )
            for o in request.offsets
        ]
        await self._writer.write(records)

    def _accepted(self, positions: list[PartitionOffset]) -> list[PartitionOffset]:
        """The positions a heartbeat, leave or stop answer carries, checked as commits are
        (metadata size, offset range), without those of partitions that no longer exist
        (a deleted topic's: a member may report them until the next rebalance)."""
        check_offset_metadata(positions, self._limits.offset_metadata_max_bytes)
        counts = self._topics.partitions
        if not all(o.partition < counts.get(o.topic, 0) for o in positions):
            positions = [o for o in positions if o.partition < counts.get(o.topic, 0)]
        check_offsets(positions)
        return positions

    async def forget_topic(self, topic: str) -> None:
        """The topic was deleted: delete the group's committed offsets of it (logged on failure)."""
        doomed = [
            OffsetTombstone(self.group_id, tp.topic, tp.partition)
            for tp in sorted(self.group.offsets)
            if tp.topic == topic
        ]
        if doomed:
            try:
                await self._writer.write(doomed)
            except StoreError as exc:
                log.error(
                    "group %s: could not delete its offsets of deleted topic %s: %s ; delete "
                    "them with: trio-coord groups delete-offsets",
                    self.group_id,
                    topic,
                    exc,
                )

    async def _commit_positions(self) -> None:
        records = self.group.drain_positions(_wall_clock_ms())
        if records:
            try:
                await self._writer.write(list(records))
            except BaseException:
                # Failed, or abandoned (cancelled, or past the store deadline): the next
                # commit retries them. Recommitting a value that did land is harmless.
                self.group.requeue_positions(records)
                raise

    async def _position_flusher(self) -> None:
        """Commit the positions heartbeats carried, at most once per flush interval."""
        while True:
            await self._positions_dirty.wait()
            await trio.sleep(self._flush_interval)
            self._positions_dirty = trio.Event()
            try:
                await self._commit_positions()
            except StoreError:
                log.warning("group %s: could not commit positions; will retry", self.group_id)
                self._positions_dirty.set()

    async def reset_offsets(self, offsets: list[PartitionOffset]) -> None:
        """Move committed offsets (backwards too); a running group restarts from them.

        With members, the reset is applied by a rebalance, between phase 2
        (the positions the members hand back are committed) and the plan: so
        no position from before the reset can overwrite it, and every owner
        is restarted at the new offsets. Returns once the offsets are durable.
        """
        check_offset_metadata(offsets, self._limits.offset_metadata_max_bytes)
        records = []
        now_ms = _wall_clock_ms()
        for o in offsets:
            count = self._topics.require(o.topic)
            if not 0 <= o.partition < count:
                raise UnknownTopicError(
                    f"topic {o.topic!r} has partitions 0..{count - 1}, not {o.partition}"
                )
            check_offsets([o])
            records.append(
                OffsetRecord(
                    self.group_id, o.topic, o.partition, o.offset, o.metadata, now_ms, True
                )
            )
        if not records:
            return
        reset = _Reset(records)
        self._resets.append(reset)
        self.request_rebalance(f"offsets reset for {len(records)} partition(s)")
        await reset.done.wait()
        if reset.error is not None:
            raise reset.error

    async def _apply_resets(self) -> None:
        """Make the queued resets durable and wake their requesters."""
        resets, self._resets = self._resets, []
        if not resets:
            return
        try:
            await self._writer.write([r for reset in resets for r in reset.records])
        except StoreError as exc:
            for reset in resets:
                reset.error = exc
            raise
        except BaseException:
            self._resets[:0] = resets  # cancelled: the next rebalance writes them
            raise
        finally:
            for reset in resets:
                if reset.error is not None or reset not in self._resets:
                    reset.done.set()
        log.info("group %s: offsets reset for %d request(s)", self.group_id, len(resets))

    async def expire_offsets(self, retention: float) -> int:
        """Delete the offsets expired by ``retention`` (:meth:`Group.expired_offsets`).

        Returns how many were deleted; a store failure is raised (the sweeper retries).
        """
        expired = self.group.expired_offsets(trio.current_time(), _wall_clock_ms(), retention)
        if expired:
            # A commit written but not yet replayed is newer than what memory shows: its
            # partition is not expired. (No await from here to the write: a commit made
            # later is queued after the tombstones.)
            fresh = {
                r.tp
                for r in self._writer.pending()
                if isinstance(r, OffsetRecord) and r.group_id == self.group_id
            }
            expired = [tp for tp in expired if tp not in fresh]
        if expired:
            await self._writer.write(
                [OffsetTombstone(self.group_id, tp.topic, tp.partition) for tp in expired]
            )
        return len(expired)

    async def delete_offsets(self, partitions: list[TopicPartition]) -> None:
        """Forget committed offsets of partitions that no live member subscribes to."""
        consumed = sorted(
            tp
            for tp in partitions
            if any(tp.topic in m.topics for m in self.group.members.values())
        )
        if consumed:
            raise GroupSubscribedToTopicError(
                f"members of group {self.group_id} consume {', '.join(map(str, consumed))}; "
                "stop them (or change their subscription) before deleting these offsets"
            )
        await self._writer.write(
            [OffsetTombstone(self.group_id, tp.topic, tp.partition) for tp in partitions]
        )

    # -- the rebalance -------------------------------------------------------------------

    async def _rebalance_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick = trio.Event()
            self._late_joins.clear()  # this rebalance plans with everyone there now
            if self.group.members and (self.group.state is GroupState.EMPTY or self._joins_go_on()):
                await self._debounce_joins()
            self._burst = False
            if not self.group.members:
                if self._resets:  # nobody to stop: the resets apply at once
                    with contextlib.suppress(StoreError):
                        await self._apply_resets()
                continue
            try:
                with trio.CancelScope() as scope:
                    self._rebalance_scope = scope
                    try:
                        await self._rebalance()
                    finally:
                        self._rebalance_scope = None
            except Exception as exc:
                # Caught outside the rebalance's scope, which has absorbed its own
                # Cancelled by now: a failure raised while the rebalance was being
                # cancelled arrives here as a plain exception (group), not mixed with
                # Cancelled. A store outage or a bug stays within this group, which
                # retries; the broker and every other group carry on.
                self._log_failure(exc)
                self._emit(ev.RebalanceFailed, error=repr(exc))
                backoff = min(self._retry_backoff * 2**self._failures, self._retry_backoff_max)
                self._failures += 1
                with trio.move_on_after(backoff):
                    await self._kick.wait()  # a membership change ends the backoff early
                self._kick.set()
                continue
            if scope.cancelled_caught:
                self._emit(ev.RebalanceRestarted, cause=self._cause or "other")

    def _log_failure(self, exc: Exception) -> None:
        """Log why a rebalance failed: at ERROR the first time in a row for that cause, then
        at DEBUG, and at WARNING once per ``FAILURE_REPEAT_LOG_INTERVAL`` while it lasts.

        A group may fail for one cause for hours (its members wait for one that
        computes their assignor, a leader's assignor is broken, the store is out):
        it retries at each backoff, and the same ERROR at each, 120 an hour, hid
        everything else in the log.
        """
        bug = False
        if isinstance(exc, LeaderAssignmentError | InconsistentAssignorError):
            what = f"rebalance failed: {exc}"
        elif isinstance(exc, StoreError | trio.TooSlowError):
            what = f"rebalance could not persist: {exc!r}"
        else:
            what, bug = f"rebalance failed (a bug): {exc!r}", True
        now = trio.current_time()
        if self._failed is None or self._failed[0] != what:
            self._failed = (what, now, now)
            if bug:  # (with its traceback)
                log.exception("group %s: rebalance failed (a bug)", self.group_id)
            else:
                log.error("group %s: %s", self.group_id, what)
            return
        _, since, told = self._failed
        if now - told < FAILURE_REPEAT_LOG_INTERVAL:
            log.debug("group %s: %s (again: %d in a row)", self.group_id, what, self._failures + 1)
            return
        self._failed = (what, since, now)
        log.warning(
            "group %s: %s (still: %d failures in a row over %.0f minutes; retried within %g s "
            "each time, and at once when a member joins or leaves)",
            self.group_id,
            what,
            self._failures + 1,
            (now - since) / 60,
            self._retry_backoff_max,
        )

    def _joins_go_on(self) -> bool:
        """A burst of joins is still arriving: new members joined while the last rebalance
        ran, and the last of all joined within ``initial_rebalance_delay``."""
        delay = self._limits.initial_rebalance_delay
        return self._burst and trio.current_time() - self._last_join <= delay

    async def _debounce_joins(self) -> None:
        """A group coming to life waits for the burst of joins to end before its first rebalance.

        Each join within ``initial_rebalance_delay`` of the previous one waits
        another delay, but no longer in all than the largest rebalance timeout
        of the members: then the first generation has everyone who started
        together, instead of one rebalance per arrival. A living group waits
        the same way while a burst goes on (:meth:`_joins_go_on`: new members
        joined while its last rebalance ran, and the latest join is recent),
        so that a fleet whose joins paused once makes one more generation, not
        one eager rebalance of everyone per rebalance its joins overlap. A
        single join into a quiet group is not delayed, nor is anything once the
        joins have stopped for a delay.
        """
        delay = self._limits.initial_rebalance_delay
        if delay <= 0:
            return
        now = trio.current_time()
        limit = now + max(m.rebalance_timeout for m in self.group.members.values())
        self._emit(ev.InitialDelay, until=min(now + delay, limit))
        while self.group.members:
            with trio.move_on_at(min(trio.current_time() + delay, limit)):
                await self._kick.wait()
                self._kick = trio.Event()
                continue
            break

    async def _rebalance(self) -> None:
        group = self.group
        started = trio.current_time()
        if not self._resets and not group.cooperative and self._assignment_unchanged():
            self._emit(
                ev.RebalanceSkipped, generation=group.generation, cause=self._cause or "other"
            )
            if not self._kick.is_set():
                self._cause = ""
            return
        members = group.begin_rebalance()
        # Offsets being reset must restart every owner: a reset makes the rebalance eager.
        cooperative = group.cooperative and not self._resets
        self._emit(
            ev.RebalanceStarted,
            members=len(members),
            cooperative=cooperative,
            cause=self._cause or "other",
        )
        computed = None
        if cooperative:
            # Plan first, from what everyone is fetching; then only what moves stops:
            # phase 1 reaches just the members that give partitions up.
            computed = await self._compute_assignment(cooperative=True)
            revoke = group.planning.revocations(computed[1])
            self._emit(
                ev.Revoking,
                partitions={m: [str(tp) for tp in r] for m, r in revoke.items()}
                if self._detail
                else {},
            )
            await self._in_parallel(
                [group.members[m] for m in sorted(revoke)],
                lambda m: self._stop_member(m, revoke[m.member_id]),
                lambda m: revoke[m.member_id],
            )
        else:
            # Phase 1: every member stops all its fetchers and hands back its positions;
            # a member that may be fetching nothing (new, or stopped already by a
            # rebalance this one restarts) is not asked: with members leaving one by one
            # (a fleet restarting), each restart would stop everyone again, O(N^2).
            await self._in_parallel([m for m in members if m.may_own], self._stop_member, _all)
        # A member removed in a phase cancels this scope, but a nursery whose tasks
        # all ended need not checkpoint: make sure an outdated rebalance stops here.
        await trio.lowlevel.checkpoint_if_cancelled()
        # The store phases are bounded too: a store that hangs fails this rebalance
        # (TooSlowError), and the loop retries it after a backoff.
        store_deadline = max(m.rebalance_timeout for m in members)
        # Phase 2: the positions collected become durable offsets, and so does every
        # commit still in flight (a member may commit in on_revoked): the plan must
        # start new owners from them.
        with trio.fail_after(store_deadline):
            await self._commit_positions()
            await self._writer.drain()
            # Resets after the positions handed back: a reset wins over them.
            await self._apply_resets()
        await trio.lowlevel.checkpoint_if_cancelled()
        # Phase 3: the new generation's assignment, durable before anyone hears of it.
        if computed is None:
            computed = await self._compute_assignment(cooperative=False)
        plan = group.plan_assignment(
            trio.current_time(),
            partitions=self._subscribed_partitions(),
            available=self._assignors,
            log_offsets=self._log_offsets,
            computed=computed,
            cooperative=cooperative,
            created_since=self._created_since(),
        )
        with trio.CancelScope(shield=True), trio.fail_after(store_deadline):
            # Shielded from the rebalance's cancellation: a generation that reaches the
            # store is replayed, so let the write finish rather than have the next
            # rebalance plan the same number meanwhile. (If the store deadline passes,
            # a late replay of this record is harmless: replay is forward-only and in
            # queue order, and no member was started with it.)
            await self._writer.write([plan.record])
        await trio.lowlevel.checkpoint_if_cancelled()
        group.begin_starting()
        # Phase 4: start fetchers, each partition once it is certainly free: a member
        # starts what is free at once, and what a fence keeps when that fence ends.
        # A member whose start is one StartFetchers, due now, gets it pushed with no task
        # of its own (_Answers); a staged or multi-part start runs in a task, as before.
        answers = _Answers(self._on_started)
        generation = plan.record.generation
        try:
            async with trio.open_nursery() as nursery:
                for member_id, stages in plan.stages().items():
                    member = group.members[member_id]
                    if not self._push_start(answers, nursery, member, stages, generation):
                        nursery.start_soon(self._start_in_stages, member, stages, generation)
                await self._await_answers(answers)
        finally:
            answers.forget()
        await trio.lowlevel.checkpoint_if_cancelled()
        group.complete_rebalance()
        self._burst = bool(self._late_joins)  # (see _joins_go_on)
        if self._late_joins and self._late_joins <= computed[0].spec.members.keys():
            self._kick = trio.Event()  # every late joiner made it into this plan: no rerun
        self._late_joins.clear()
        self.rebalances += 1
        self._failures = 0
        self._failed = None  # (a failure after this one is logged at ERROR again)
        cause = self._cause or "other"
        if not self._kick.is_set():
            self._cause = ""
        elapsed = trio.current_time() - started
        log.info(
            "group %s: generation %d stable with %d member(s) after %.1f ms",
            self.group_id,
            group.generation,
            len(group.members),
            elapsed * 1000,
        )
        self._emit(
            ev.Stable,
            generation=group.generation,
            elapsed=elapsed,
            ownership={str(tp): m for tp, m in sorted(group.ownership().items())}
            if self._detail
            else {},
            cause=cause,
        )

    def _assignment_unchanged(self) -> bool:
        """Whether an eager rebalance now would change nothing (seed 000, section 9 step 3).

        Only a broker-side assignor is asked (a leader's runs in its client,
        which expects a new generation); see :meth:`AssignmentPlanner.unchanged_by`.
        """
        planning = self.group.planning
        if not planning.may_be_unchanged():  # (a join, a leave: no assignor run to learn it)
            return False
        self._match_patterns()
        partitions = self._subscribed_partitions()
        input = planning.assignment_input(
            partitions=partitions,
            available=self._assignors,
            cooperative=False,
            racks=self._partition_racks(partitions),
        )
        if input.leader is not None:
            return False
        now = trio.current_time()
        self.group.expire_fences(now)
        return planning.unchanged_by(
            now,
            planning.compute_assignment(input, self._assignors),
            assignor=input.assignor,
            partitions=partitions,
            created_since=self._created_since(),
        )

    async def _compute_assignment(self, *, cooperative: bool) -> tuple[AssignmentInput, Assignment]:
        """The next assignment: by a broker-side assignor, or by the group's leader.

        The leader answers within its rebalance timeout or is expelled, and
        its death (by any means) restarts the rebalance with the next leader
        at once, like any membership change. A leader that answers with an
        error (its assignor raised) fails this rebalance with
        :class:`LeaderAssignmentError`, naming it and the error.
        """
        group = self.group
        planning = group.planning
        self._match_patterns()
        partitions = self._subscribed_partitions()
        input = planning.assignment_input(
            partitions=partitions,
            available=self._assignors,
            cooperative=cooperative,
            racks=self._partition_racks(partitions),
        )
        if input.leader is None:
            return input, planning.compute_assignment(input, self._assignors)
        leader = group.members[input.leader]
        answers: list[ComputeAssignmentResponse] = []
        refusals: list[CoordError] = []

        async def ask(member: Member) -> None:
            try:
                response = await self._ask_leader(member, input)
            except (ConnectionClosedError, UnknownMemberError):
                raise  # gone, or not that member any more: expelled
            except CoordError as exc:
                refusals.append(exc)
                return
            answers.append(response)

        self._emit(ev.ComputeRequested, leader=leader.member_id, assignor=input.assignor)
        await self._answer_in_time(leader, ask, 0.0)
        await trio.lowlevel.checkpoint_if_cancelled()  # the leader went away: restarted
        if refusals:
            raise LeaderAssignmentError(
                f"leader {leader.member_id} of group {self.group_id} could not compute "
                f"assignor {input.assignor!r}: {refusals[0]}"
            )
        if not answers:
            raise trio.TooSlowError(f"leader {leader.member_id} gave no assignment")
        given: dict[str, list[TopicPartition]] = {}
        for entry in answers[0].assignment:
            given.setdefault(entry.member_id, []).extend(entry.partitions)
        # A Kafka client's assignor ("kafka:NAME", computed by the Kafka leader) may leave
        # partitions unassigned for a round (cooperative-sticky holds back what it revokes).
        complete = not input.assignor.startswith(KAFKA_ASSIGNOR_PREFIX)
        try:
            return input, planning.check_assignment(input, given, complete=complete)
        except ValueError as exc:  # a leader's mistake (or a hostile one), not a bug here
            raise LeaderAssignmentError(str(exc)) from None

    async def _ask_leader(
        self, leader: Member, input: AssignmentInput
    ) -> ComputeAssignmentResponse:
        group = self.group
        request = ComputeAssignmentRequest(
            self.group_id,
            leader.member_id,
            group.generation,
            input.assignor,
            [
                MemberSubscription(m.member_id, sorted(m.topics), sorted(m.owned), m.user_data)
                for m in sorted(input.spec.members.values(), key=lambda m: m.member_id)
            ],
            dict(input.spec.partitions),
        )
        conn = self._conn_of(leader)
        reads = self._frames.get(leader.member_id, DEFAULT_MAX_FRAME_SIZE)
        if reads < conn.max_frame_size and encoded_size(request) + _ENVELOPE_BYTES > reads:
            # Pushed, the leader would refuse the frame and close its connection: it
            # would be expelled, and the next leader after it.
            raise FrameTooLargeError(
                f"the group's {len(request.members)} subscriptions and owned partitions do "
                f"not fit the {reads}-byte frame its leader reads; use an assignor that runs "
                "on the broker"
            )
        try:
            response = await conn.request(request)
        except FrameTooLargeError as exc:  # (raised before anything is sent)
            raise FrameTooLargeError(
                f"the group's {len(request.members)} subscriptions and owned partitions do "
                f"not fit one frame to its leader ({exc}); use an assignor that runs on the "
                "broker, or raise the broker's --max-frame-size"
            ) from exc
        if not isinstance(response, ComputeAssignmentResponse):
            raise InvalidRequestError(f"answered ComputeAssignment with {type(response).__name__}")
        return response

    def _created_since(self) -> set[str]:
        """Topics that ``re:`` entries of the group's last generation match only now.

        The last generation's record lists every topic its patterns matched
        then (:meth:`AssignmentPlanner._topics_seen`): a topic they match now that is not
        listed was created since, after the group subscribed to it.
        """
        record = self.group.record
        if record is None:
            return set()
        patterns = [entry for entry in record.topics if entry.startswith(PATTERN_PREFIX)]
        if not patterns:
            return set()
        return {t for t in self._topics.matching(patterns) if t not in record.topics}

    def _match_patterns(self) -> None:
        """Subscribe each member to the topics its ``re:`` entries match now.

        Topics made since a member joined reach a living group through the
        coordinator's topic listener, but a group waiting for its first
        generation is EMPTY and has nothing to redo: the plan picks them up here.
        """
        for member in self.group.members.values():
            matched = self._topics.matching(member.topics)
            if not matched <= member.topics:
                member.topics = member.topics | matched

    def _partition_racks(self, partitions: Mapping[str, int]) -> dict[str, list[str]]:
        """The rack of each partition of ``partitions``' topics (its broker's), if some
        member has a rack; else nothing (racks would change no assignment)."""
        if not any(m.rack for m in self.group.members.values()):
            return {}
        return {t: self._topics.partition_racks(t) for t in sorted(partitions)}

    def _subscribed_partitions(self) -> dict[str, int]:
        topics: set[str] = set()
        for member in self.group.members.values():
            topics |= member.topics
        return {t: self._topics.partitions[t] for t in topics if t in self._topics.partitions}

    async def _in_parallel(
        self,
        members: list[Member],
        call: Callable[[Member], Awaitable[None]],
        stopping: Callable[[Member], list[TopicPartition] | None],
    ) -> None:
        """Phase 1: stop ``members`` (each what ``stopping`` says: None is everything).

        A member on a link that can push (a native connection) is sent its
        StopFetchers with no task of its own and awaited under the phase's
        deadlines (:class:`_Answers`); any other runs ``call`` in a task.
        """
        answers = _Answers(self._on_stopped)
        try:
            async with trio.open_nursery() as nursery:
                for member in members:
                    partitions = stopping(member)
                    request = StopFetchersRequest(
                        self.group_id, member.member_id, self.group.generation, partitions
                    )
                    conn = self._push_link(member)
                    if conn is None:
                        nursery.start_soon(self._answer_in_time, member, call, 0.0)
                    else:
                        self._push(answers, nursery, member, conn, request, partitions)
                await self._await_answers(answers)
        finally:
            answers.forget()

    def _push_link(self, member: Member) -> Any:
        """The link of ``member`` if a request can be pushed on it (a native connection:
        it has ``push``) and the member is current; None if it needs a task instead."""
        conn = self._conns.get(member.member_id)
        if getattr(conn, "push", None) is None or not self._is_current(member):
            return None
        return conn

    def _push(
        self,
        answers: _Answers,
        nursery: trio.Nursery,
        member: Member,
        conn: Any,
        request: RequestBody,
        extra: object,
    ) -> None:
        """Push ``request`` to ``member`` on ``conn`` (its :meth:`_push_link`), its answer
        owed to ``answers`` (and applied with ``extra``)."""
        answers.add(member, conn, extra, trio.current_time())  # (before: it may fail at once)
        try:
            corr_id, rest = conn.push(request, answers.callback, member)
        except ConnectionClosedError:
            answers.fail(member, "lost its connection")
            return
        except CoordError as exc:  # (could not be encoded: nothing was sent)
            answers.fail(member, f"refused the rebalance: {exc}")
            return
        if member.member_id in answers.pending:
            answers.pending[member.member_id] = (member, conn, corr_id, extra)
        if rest is not None:
            nursery.start_soon(rest)

    async def _await_answers(self, answers: _Answers) -> None:
        """Wait for every answer ``answers`` is owed; expel a member that fails or is late.

        One wait at a time, until the earliest deadline still pending: no
        task nor cancel scope per member. Expelling a member restarts the
        rebalance (this task is cancelled at its next checkpoint), as before.
        """
        while True:
            if answers.bug is not None:
                raise answers.bug
            failures, answers.failures = answers.failures, []
            for member, reason in failures:
                if self._is_current(member):
                    self.remove_member(member.member_id, reason, stopped=False)
            await trio.lowlevel.checkpoint_if_cancelled()
            if not answers.pending:
                return
            if answers.done.is_set():
                answers.done = trio.Event()
            with trio.move_on_at(answers.earliest()):
                await answers.done.wait()
            for member in answers.overdue(trio.current_time()):
                if self._is_current(member):
                    reason = (
                        "did not answer within its rebalance timeout "
                        f"({member.rebalance_timeout:g}s)"
                    )
                    self.remove_member(member.member_id, reason, stopped=False)

    async def _answer_in_time(
        self, member: Member, call: Callable[[Member], Awaitable[None]], start_at: float
    ) -> None:
        """Run one member's part of a phase; expel it if it does not answer in time.

        Waiting until ``start_at`` (a departed owner's lease) is not the
        member's fault: its rebalance timeout starts after that.

        A member that went away cancels the rebalance, but its task may
        still run one step (its first, or the one its answer wakes): then
        it must touch neither the group nor a member that rejoined with
        the same id.
        """
        if start_at > trio.current_time():
            self._emit(ev.StartDelayed, member_id=member.member_id, until=start_at)
            await trio.sleep_until(start_at)
        if not self._is_current(member):
            return
        failure = None
        with trio.move_on_after(member.rebalance_timeout) as deadline:
            try:
                await call(member)
            except ConnectionClosedError:
                failure = "lost its connection"
            except CoordError as exc:
                failure = f"refused the rebalance: {exc}"
        if deadline.cancelled_caught:
            failure = f"did not answer within its rebalance timeout ({member.rebalance_timeout:g}s)"
        if failure is not None and self._is_current(member):
            self.remove_member(member.member_id, failure, stopped=False)

    def _is_current(self, member: Member) -> bool:
        return self.group.members.get(member.member_id) is member

    async def _stop_member(
        self, member: Member, partitions: list[TopicPartition] | None = None
    ) -> None:
        """Phase 1 for one member: stop everything, or (cooperative) just ``partitions``."""
        response = await self._conn_of(member).request(
            StopFetchersRequest(self.group_id, member.member_id, self.group.generation, partitions)
        )
        self._on_stopped(member, partitions, response)

    def _on_stopped(
        self,
        member: Member,
        partitions: list[TopicPartition] | None,
        response: ResponseBody | None,
    ) -> None:
        """A member answered StopFetchers: keep the positions it handed back."""
        if not isinstance(response, StopFetchersResponse):
            raise InvalidRequestError(f"answered StopFetchers with {type(response).__name__}")
        positions = self._accepted(response.positions)
        if self._is_current(member):
            self.group.member_stopped(member.member_id, positions, partitions)

    async def _start_in_stages(
        self, member: Member, stages: list[StartPlan], generation: int
    ) -> None:
        """Phase 4 for one member: its StartFetchers in order, each not before its time.

        Each stage is answered within the member's rebalance timeout, counted
        from that stage's ``not_before``.
        """
        for stage in stages:
            await self._answer_in_time(
                member,
                functools.partial(self._start_member, plan=stage, generation=generation),
                stage.not_before,
            )
            if not self._is_current(member):
                return

    def _push_start(
        self,
        answers: _Answers,
        nursery: trio.Nursery,
        member: Member,
        stages: list[StartPlan],
        generation: int,
    ) -> bool:
        """Phase 4 for one member with no task: its one StartFetchers, due now, pushed.

        False (a task is needed) for a staged start, one not due yet, one in
        several parts, or a member whose link cannot push.
        """
        if len(stages) != 1 or stages[0].not_before > trio.current_time():
            return False
        conn = self._push_link(member)
        if conn is None:
            return False
        plan = stages[0]
        parts = list(in_parts(plan.partitions, self._push_bytes(member, conn)))
        if len(parts) != 1:
            return False
        tps = [p.tp for p in plan.partitions]
        self.group.member_starting(member.member_id, tps)
        (request,) = self._start_requests(member, plan, generation, parts, tps)
        self._push(answers, nursery, member, conn, request, plan)
        return True

    def _push_bytes(self, member: Member, conn: MemberLink) -> int:
        """What one push's partitions may take: half the smaller frame of the link and of
        the member (the rest is its brokers and leaders)."""
        frame = self._frames.get(member.member_id, DEFAULT_MAX_FRAME_SIZE)
        return min(conn.max_frame_size, frame) // 2

    def _start_requests(
        self,
        member: Member,
        plan: StartPlan,
        generation: int,
        parts: list[list[PartitionOffset]],
        tps: list[TopicPartition],
    ) -> list[StartFetchersRequest]:
        """The StartFetchers of ``plan``, one per part of its partitions."""
        requests = []
        at = 0
        for number, part in enumerate(parts, 1):
            mine, at = tps[at : at + len(part)], at + len(part)
            brokers, leaders = self._locate(mine) if self._locate else ([], [])
            requests.append(
                StartFetchersRequest(
                    self.group_id,
                    member.member_id,
                    generation,
                    part,
                    brokers,
                    incremental=plan.incremental,
                    more=number < len(parts),
                    unchanged=plan.unchanged,
                    leaders=leaders,
                )
            )
        return requests

    async def _start_member(self, member: Member, plan: StartPlan, generation: int) -> None:
        conn = self._conn_of(member)
        tps = [p.tp for p in plan.partitions]
        self.group.member_starting(member.member_id, tps)
        parts = list(in_parts(plan.partitions, self._push_bytes(member, conn)))
        response = None
        for request in self._start_requests(member, plan, generation, parts, tps):
            response = await conn.request(request)
            _check_started(response)
        if self.group.generation != generation:
            # (A static member's resumed start, answered after a rebalance made the next
            # generation durable: it acknowledges nothing of that one, which starts it.)
            return
        self._on_started(member, plan, response)

    def _on_started(self, member: Member, plan: StartPlan, response: ResponseBody | None) -> None:
        """A member acknowledged its (last) StartFetchers of ``plan``."""
        _check_started(response)
        if not self._is_current(member):
            return
        self.group.member_started(member.member_id)
        self._emit(
            ev.Started,
            member_id=member.member_id,
            generation=self.group.generation,
            partitions=[f"{p.topic}-{p.partition}" for p in plan.partitions]
            if self._detail
            else [],
        )

    # -- views ---------------------------------------------------------------------------

    def describe(self) -> GroupDescription:
        """The group as DescribeGroup shows it, with each member's ``member_epoch``.

        The one hook for front ends: a member link with a ``member_epoch``
        attribute (a Kafka KIP-848 member's) has it shown; others show -1.
        """
        desc = self.group.describe()
        epochs = {
            m.member_id: epoch
            for m in desc.members
            if (epoch := getattr(self._conns.get(m.member_id), "member_epoch", -1)) != -1
        }
        if not epochs:
            return desc
        members = [
            msgspec.structs.replace(m, member_epoch=epochs[m.member_id])
            if m.member_id in epochs
            else m
            for m in desc.members
        ]
        return msgspec.structs.replace(desc, members=members)

    def describe_page(
        self, start: str | None, after: TopicPartition | None
    ) -> tuple[GroupDescription, Iterator[MemberDescription], Iterator[PartitionOffset]]:
        """:meth:`describe` for one page: the group without its members or offsets, its
        members from id ``start`` on (None: none), and its committed offsets after
        ``after`` (None: all), each described as they are iterated."""
        desc = self.group.describe(members=False, offsets=False)
        offsets = self.group.offsets_after(after)
        if start is None:
            return desc, iter(()), offsets
        return desc, map(self._with_epoch, self.group.describe_members(start)), offsets

    def _with_epoch(self, member: MemberDescription) -> MemberDescription:
        epoch = getattr(self._conns.get(member.member_id), "member_epoch", -1)
        return member if epoch == -1 else msgspec.structs.replace(member, member_epoch=epoch)

    def is_removable(self, now: float, retention: float) -> bool:
        """True if the group is empty, has no offsets, and has been so for ``retention``."""
        g = self.group
        return (
            g.state is GroupState.EMPTY
            and not g.offsets
            and g.empty_since is not None
            and now - g.empty_since >= retention
        )
