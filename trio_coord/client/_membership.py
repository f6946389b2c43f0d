"""A consumer's group membership: join, heartbeat, lease, answer the coordinator's pushes.

The Kafka consumer keeps this apart from the user API (its ConsumerCoordinator and
AbstractCoordinator, aiokafka's GroupCoordinator), and so does this package: a
:class:`~trio_coord.client.consumer.Consumer` of a group owns one
:class:`GroupMembership`, the object that speaks to the coordinator: the session task
(find the coordinator, JoinGroup, heartbeat every third of the session timeout, rejoin
after a lost connection), the watchdogs (the member's side of the lease, and
``max_poll_interval``), StopFetchers/StartFetchers/ComputeAssignment as the coordinator
pushes them, and leaving. It holds the member's id, generation, subscription, state and
assignment. What it needs of the consumer is handed to it explicitly: the group
settings (:class:`MembershipSettings`), the application's callbacks
(:class:`RebalanceListener`), the bootstrap list, and the fetcher's side of ownership
(:class:`FetchControl`: own, freeze, give up partitions, their consumed positions). What
the consumer asks of it is its public methods: state, assignment, subscribe, the poll
clock, the connection commits go over, leave. ``consumer.py`` keeps what the
application calls (records, positions, commits).
"""

from __future__ import annotations

import enum
import inspect
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
import trio
from trio_util import AsyncValue

from .._aio import unwrap_lone_exception
from ..core.assignors import Assignor, GroupSpec, MemberSpec
from ..protocol.connection import Connection, RequestHandler, serving
from ..protocol.errors import (
    ConnectionClosedError,
    CoordError,
    FencedInstanceIdError,
    GroupNotFoundError,
    IllegalGenerationError,
    InvalidRequestError,
    RequestTimedOutError,
    UnknownMemberError,
    UnknownServerError,
)
from ..protocol.framing import DEFAULT_MAX_FRAME_SIZE
from ..protocol.messages import (
    ComputeAssignmentRequest,
    ComputeAssignmentResponse,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberAssignment,
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
from ..protocol.sizing import encoded_size, in_parts, list_budget
from ._bootstrap import Backoff, Bootstrap
from ._cluster import ClusterView

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
_HAND_BACK_COMMITS = 8
"""How many OffsetCommits of a hand-back too long for one message are in flight at once."""


class ConsumerState(enum.StrEnum):
    """A consumer's view of its membership."""

    UNJOINED = "UNJOINED"
    REBALANCING = "REBALANCING"
    STABLE = "STABLE"


@dataclass(frozen=True, slots=True)
class MembershipSettings:
    """What a member tells its coordinator, and how it keeps its session: the consumer's
    options that concern its group (checked by the consumer)."""

    group_id: str
    client_id: str
    instance_id: str
    session_timeout: float
    rebalance_timeout: float
    max_poll_interval: float
    request_timeout: float
    api_timeout: float
    auto_commit: bool
    offset_reset: OffsetReset
    rebalance_protocol: RebalanceProtocol
    assignors: list[str]
    user_data: bytes = b""
    rack: str = ""
    local_assignors: Mapping[str, Assignor] = field(default_factory=dict)
    """The application's own assignors, by name: computed here when this member leads."""


@dataclass(frozen=True, slots=True)
class RebalanceListener:
    """The application's rebalance callbacks (Kafka's ConsumerRebalanceListener).

    Each is called with a sorted list of partitions and may be a plain or an
    async function; one that raises is logged, and the rebalance goes on.
    """

    on_assigned: PartitionsCallback | None = None
    on_revoked: PartitionsCallback | None = None
    on_lost: PartitionsCallback | None = None

    async def assigned(self, partitions: list[TopicPartition]) -> None:
        """Tell the application these partitions are its own now."""
        await _call(self.on_assigned, partitions)

    async def revoked(self, partitions: list[TopicPartition]) -> None:
        """Tell the application it gives these up cleanly (it may still commit them)."""
        await _call(self.on_revoked, partitions)

    async def lost(self, partitions: list[TopicPartition]) -> None:
        """Tell the application these are gone without a clean revoke (``on_lost``, or
        ``on_revoked`` if it has none)."""
        await _call(self.on_lost or self.on_revoked, partitions)


async def _call(callback: PartitionsCallback | None, partitions: list[TopicPartition]) -> None:
    if callback is None:
        return
    try:
        result = callback(partitions)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("rebalance callback %r failed", callback)


class FetchControl(Protocol):
    """What a membership needs of its consumer's fetcher (``_fetcher.Fetcher`` is one):
    to own, freeze and give up partitions, and the positions consumed on them."""

    @property
    def cluster(self) -> ClusterView:
        """Where partitions' leaders are learnt (the consumer's cluster view)."""
        ...

    def add(self, offsets: dict[TopicPartition, int]) -> None:
        """Own these partitions too."""
        ...

    def remove(self, tps: Iterable[TopicPartition]) -> None:
        """Forget these partitions."""
        ...

    def freeze(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Stop handing out these partitions' records (default: all); a revoke begins."""
        ...

    def drop(self) -> list[TopicPartition]:
        """Forget every partition; return what was owned."""
        ...

    def consumed(self, tps: Iterable[TopicPartition] | None = None) -> list[PartitionOffset]:
        """The consumed offsets of ``tps`` (default: all owned) that are known."""
        ...

    def take_dirty(self) -> list[PartitionOffset]:
        """Consumed offsets that moved since the last call (for auto-commit)."""
        ...

    def return_dirty(self, positions: Iterable[PartitionOffset]) -> None:
        """Report these again next time."""
        ...

    def wake(self) -> None:
        """Wake the application tasks waiting for records, to look again."""
        ...


async def request_in_time(
    conn: Connection, body: RequestBody, request_timeout: float
) -> ResponseBody | None:
    """``conn.request(body)``, waiting at most ``request_timeout`` for the answer."""
    with trio.move_on_after(request_timeout):
        return await conn.request(body)
    raise RequestTimedOutError(
        f"{conn.name} did not answer {type(body).__name__} within request_timeout "
        f"({request_timeout:g}s); retry, and see the broker's log if it persists"
    )


def _time_left() -> float:
    """Seconds until the enclosing deadline (inf if none): a leave runs within one, and the
    LeaveGroup must still go once what comes before it is done."""
    return max(0.0, trio.current_effective_deadline() - trio.current_time())


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

    def __init__(self, membership: GroupMembership) -> None:
        self._membership = membership

    async def handle(self, body: RequestBody) -> ResponseBody:
        if isinstance(body, ComputeAssignmentRequest | StopFetchersRequest | StartFetchersRequest):
            return await self._membership._answer_push(body)
        return await super().handle(body)


class GroupMembership:
    """A consumer's membership of its group: see the module doc.

    ``member_id`` and ``generation`` are the membership's (the consumer reads
    them for its commits); so are the subscription (:attr:`topics`), the
    state and the assignment.
    """

    def __init__(
        self,
        settings: MembershipSettings,
        topics: list[str],
        *,
        listener: RebalanceListener,
        bootstrap: Bootstrap,
        fetcher: FetchControl,
    ) -> None:
        self._settings = settings
        self._topics = topics
        self._listener = listener
        self._bootstrap = bootstrap
        self._fetcher = fetcher
        self.member_id = ""
        self.generation = -1
        self._state = AsyncValue(ConsumerState.UNJOINED)
        self._assignment: dict[TopicPartition, int] = {}
        # The positions of the last clean revoke, until the next start: the answer that
        # carried them may have been dropped by a rebalance restarted meanwhile.
        self._handed_back: list[PartitionOffset] = []
        self._granted_session = settings.session_timeout
        self._lease_end = -math.inf
        self._lease_moved = trio.Event()
        self._member_ready = trio.Event()
        self._conn: Connection | None = None
        self._coordinator_frame = DEFAULT_MAX_FRAME_SIZE  # (what its last JoinGroup answer said)
        self._session_scope: trio.CancelScope | None = None
        self._handler = _PushHandler(self)
        self._push_lock = trio.Lock()
        self._start_parts: list[StartFetchersRequest] = []
        self._left = False
        self._fenced_since: float | None = None  # refused as a twin since (FENCED_INSTANCE_ID)
        self._assignor_failure: Exception | None = None  # what our assignor raised as leader
        self._assignor_failed = trio.Event()
        self._backoff = Backoff(initial=0.05, maximum=min(2.0, settings.session_timeout / 3))
        self._started = False
        self._tasks = trio.CancelScope()
        # The poll clock (max_poll_interval): while no application task is asking for
        # records, it must ask again by _poll_deadline, or the consumer leaves the group.
        self._asking = 0  # application calls waiting for records right now
        self._poll_deadline = math.inf
        self._poll_moved = trio.Event()
        self._poll_left = False  # left for the poll interval; rejoins when asked again
        self._asked_again = trio.Event()

    # -- what the consumer asks ------------------------------------------------------------

    @property
    def topics(self) -> list[str]:
        """The subscription (sorted), as last given."""
        return self._topics

    @property
    def state(self) -> ConsumerState:
        """UNJOINED, REBALANCING or STABLE."""
        return self._state.value

    async def wait_state(self, state: ConsumerState) -> None:
        """Return once the membership is in ``state`` (at once if it is already)."""
        await self._state.wait_value(state)

    async def wait_state_change(self) -> ConsumerState:
        """Wait for :attr:`state` to change and return the new state."""
        new, _old = await self._state.wait_transition()
        return new

    @property
    def assignment(self) -> Mapping[TopicPartition, int]:
        """The partitions owned, with the offset each started from (a live view)."""
        return self._assignment

    @property
    def left(self) -> bool:
        """True once the member left (closing, or for ``max_poll_interval``)."""
        return self._left

    def holds_lease(self) -> bool:
        """True while a heartbeat sent less than a session timeout ago was accepted:
        only then may records be handed out."""
        return trio.current_time() < self._lease_end

    async def subscribe(self, topics: list[str]) -> None:
        """Take ``topics`` (sorted, checked by the consumer) as the subscription, and tell
        the coordinator now if connected (a JoinGroup with the same member id); else the
        next join carries them."""
        if topics == self._topics:
            return
        self._topics = topics
        conn = self._conn
        if conn is None or conn.closed or not self._member_ready.is_set() or self._left:
            return  # the next join carries the new topics
        try:
            await self._join(conn)
        except (_Reconnect, CoordError) as exc:
            # The session will rejoin (with the new topics) once its connection is gone.
            log.info("consumer %s: resubscribing failed: %s; rejoining", self.member_id, exc)
            await conn.aclose()
        except BaseException:
            # Cancelled with the join maybe on its way: whether the coordinator has the new
            # topics is unknown (and asking again with them would be a no-op), so the
            # session rejoins with them, as above. (aclose works under cancellation.)
            await conn.aclose()
            raise

    def start_poll_clock(self) -> None:
        """The block is entered: from now on the application must ask for records within
        ``max_poll_interval`` (while none of its tasks is asking)."""
        self._move_poll_deadline(trio.current_time() + self._settings.max_poll_interval)

    @contextmanager
    def asking(self) -> Iterator[None]:
        """Around each wait of the application for records: the poll clock stands still
        meanwhile, and restarts when no task asks any more. Asking again after the member
        left for ``max_poll_interval`` makes it rejoin."""
        if self._poll_left and not self._asked_again.is_set():
            log.info(
                "consumer of %s: the application asks for records again; rejoining the group",
                self._settings.group_id,
            )
            self._asked_again.set()
        self._asking += 1
        self._move_poll_deadline(math.inf)
        try:
            yield
        finally:
            self._asking -= 1
            if not self._asking:
                self.start_poll_clock()

    def _move_poll_deadline(self, when: float) -> None:
        self._poll_deadline = when
        self._poll_moved.set()
        self._poll_moved = trio.Event()

    def check_poll_membership(self) -> None:
        """Commits after leaving for ``max_poll_interval`` fail, saying so (as Kafka's do)."""
        if self._poll_left and self._left:
            raise UnknownMemberError(
                f"this consumer left group {self._settings.group_id!r} because the application "
                "did not ask for records within max_poll_interval "
                f"({self._settings.max_poll_interval:g}s): its partitions may belong to "
                "another member now, which delivers the records not handed back again. Ask "
                "for records to rejoin; to stay in the group, process each batch faster, "
                "lower the batch (getmany(max_records=...)) or raise max_poll_interval"
            )

    def coordinator(self) -> Connection:
        """The connection to the coordinator, for commits; raises what the application
        should hear if there is none (left, or reconnecting: retriable)."""
        self.check_poll_membership()
        if self._left:
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

    def list_budget(self) -> int:
        """What one message's list (positions, a commit's offsets) may take: a quarter of the
        smaller frame of this member's connection and of its coordinator's."""
        conn = self._conn
        return list_budget(
            DEFAULT_MAX_FRAME_SIZE if conn is None else conn.max_frame_size, self._coordinator_frame
        )

    def close(self) -> None:
        """After :meth:`leave`: the member is gone for good; its session tasks end."""
        self._left = True
        self._tasks.cancel()

    # -- answering the coordinator -----------------------------------------------------------

    async def _answer_push(
        self, body: ComputeAssignmentRequest | StopFetchersRequest | StartFetchersRequest
    ) -> ResponseBody:
        if isinstance(body, ComputeAssignmentRequest):
            await self._member_ready.wait()
            return self._compute_assignment(body)
        await self._member_ready.wait()  # a push may overtake our JoinGroup answer
        if body.member_id != self.member_id or body.group != self._settings.group_id:
            raise UnknownMemberError(
                f"this consumer is member {self.member_id!r} of {self._settings.group_id!r}, "
                f"not {body.member_id!r} of {body.group!r}"
            )
        # One push at a time: a restarted rebalance may send a second StopFetchers
        # while on_revoked still runs for the first; it then finds nothing to revoke.
        async with self._push_lock:
            if self._left:
                raise UnknownMemberError(f"member {body.member_id!r} has left the group")
            if isinstance(body, StopFetchersRequest):
                self._start_parts.clear()  # (a restarted rebalance voids them)
                if body.partitions is not None:
                    revoked = await self._revoke_some(body.partitions)
                else:
                    revoked = await self._stop_fetchers()
                # (within half the time the coordinator waits for this answer)
                within = self._settings.rebalance_timeout / 2
                return StopFetchersResponse(await self._hand_back(revoked, within))
            whole = self._collect_part(body)
            if whole is None:  # more parts of this assignment follow
                return StartFetchersResponse()
            if whole.unchanged:
                self._keep_assignment(whole)
            else:
                await self._start_fetchers(whole)
            return StartFetchersResponse()

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
        engine = self._fetcher
        engine.freeze()
        await self._give_up(revoked)
        positions = engine.consumed(revoked) if self._settings.auto_commit else []
        self._drop()
        self._handed_back = positions
        return positions

    async def _hand_back(
        self, positions: list[PartitionOffset], within: float
    ) -> list[PartitionOffset]:
        """The positions a stop answer or a leave carries: all of them if they fit one
        message, else the first part, the others committed ahead of it.

        A consumer of 10,000 partitions of a long topic name hands back more than
        a default frame holds: the coordinator refused the answer and closed the
        connection, every time. Each commit is durable before the answer goes,
        as the positions it carries are made durable before any partition
        starts elsewhere. The commits go together (a few at a time) and are
        waited for at most ``within`` seconds (and ``request_timeout``): one
        after the other, a slow store would hold a stop answer past the
        member's rebalance timeout, or a leave past its time, so that it is
        never sent. A part not committed (refused: an offset behind the
        committed one, which the answer's positions would have skipped, or a
        rebalance that moved on; or not answered in time) is logged, not
        raised: its partitions' next owner starts from the offsets committed
        before, so records are read again, not lost. What was committed is
        durable, so it is not said again to a restarted rebalance.
        """
        conn = self._conn
        parts = list(in_parts(positions, self.list_budget()))
        if len(parts) == 1 or conn is None:
            return positions
        wait = min(within, self._settings.request_timeout)
        why_not: dict[int, str] = {}  # part index → why it was not committed ("": it was)
        limiter = trio.CapacityLimiter(_HAND_BACK_COMMITS)

        async def commit(index: int, part: list[PartitionOffset]) -> None:
            request = OffsetCommitRequest(
                self._settings.group_id, self.member_id, self.generation, part
            )
            async with limiter:
                try:
                    await conn.request(request)
                except CoordError as exc:
                    why_not[index] = f"{type(exc).__name__}: {exc}"
                else:
                    why_not[index] = ""

        with trio.move_on_after(wait):
            async with trio.open_nursery() as nursery:
                for index in range(1, len(parts)):
                    nursery.start_soon(commit, index, parts[index])
        committed: set[TopicPartition] = set()
        for index in range(1, len(parts)):
            why = why_not.get(index, f"no answer within {wait:g}s")
            if not why:
                committed.update(p.tp for p in parts[index])
                continue
            log.warning(
                "consumer %s: %d of the positions it hands back could not be committed "
                "(%s); their partitions' next owner starts from the offsets committed before",
                self.member_id,
                len(parts[index]),
                why,
            )
        self._handed_back = [p for p in self._handed_back if p.tp not in committed]
        return parts[0]

    async def _give_up(self, partitions: list[TopicPartition]) -> None:
        """Tell the application it no longer owns ``partitions``: ``on_revoked`` while
        the lease holds, else ``on_lost``.

        A stop (or a close) that finds the lease run out comes after the moment
        the coordinator may have handed these partitions to another member (a
        process stalled past its session, whose watchdog has not run yet). A
        clean revoke would invite the application to commit and to count the
        partitions as its own until now; Kafka calls ``onPartitionsLost`` for
        the same reason.
        """
        if self.holds_lease():
            await self._listener.revoked(partitions)
        else:
            await self._listener.lost(partitions)

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
            engine = self._fetcher
            engine.freeze(owned)
            await self._give_up(owned)
            positions = engine.consumed(owned) if self._settings.auto_commit else []
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
            self._fetcher.cluster.learn(
                request.brokers,
                {p.tp: b for p, b in zip(request.partitions, request.leaders, strict=True)},
            )

    def _keep_assignment(self, request: StartFetchersRequest) -> None:
        """Cooperative, nothing of ours moved: the same partitions, in the new generation."""
        self._check_lease()
        self.generation = request.generation
        self._handed_back = []
        self._state.value = ConsumerState.STABLE

    async def _start_fetchers(self, request: StartFetchersRequest) -> None:
        """Own ``request.partitions``, keeping those already fetched as they are.

        ``on_assigned`` hears only of the partitions that are new here. A
        partition owned but not in the request was taken without a revoke
        and is lost. Cooperative starts (``incremental``) keep what the member
        fetches by design; an eager start finds nothing owned after the stop
        before it, except when that stop never came: the coordinator that
        would have sent it died, and the member kept its partitions through
        the rejoin, within its lease. Those it keeps fetching from where they
        are: ``on_assigned`` twice for one partition, with no revoke between,
        would tell the application of a second owner (the cluster failover
        test saw it once in CI).
        """
        self._check_lease()
        self.generation = request.generation
        self._handed_back = []
        self._learn_leaders(request)
        wanted = {p.tp: p.offset for p in request.partitions}
        gone = sorted(self._assignment.keys() - wanted.keys())
        added = {tp: off for tp, off in wanted.items() if tp not in self._assignment}
        engine = self._fetcher
        if gone:
            engine.remove(gone)
            for tp in gone:
                del self._assignment[tp]
            await self._listener.lost(gone)
        engine.add(added)
        self._assignment.update(added)
        self._state.value = ConsumerState.STABLE
        if added:
            await self._listener.assigned(sorted(added))

    def _compute_assignment(self, request: ComputeAssignmentRequest) -> ComputeAssignmentResponse:
        """As the group's leader: run the application's assignor on the group's subscriptions.

        It runs right here, on the consumer's event loop (an assignor is a
        pure function, usually quick; see docs/assignment.md). If it raises,
        the coordinator is told so (the rebalance fails, naming this member
        and the error), and the consumer leaves the group and raises that
        exception from its ``async with``: an assignor that fails on this
        group fails the same way every time it is asked.
        """
        if request.member_id != self.member_id or request.group != self._settings.group_id:
            raise UnknownMemberError(
                f"this consumer is member {self.member_id!r} of {self._settings.group_id!r}, "
                f"not {request.member_id!r} of {request.group!r}"
            )
        assignor = self._settings.local_assignors.get(request.assignor)
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
                f"{self._settings.group_id!r} on its leader, member {self.member_id!r} "
                "(which leaves the group)"
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
        self._fetcher.drop()
        return owned

    def _check_lease(self) -> None:
        if trio.current_time() >= self._lease_end:
            # The lease ran out while we owned nothing, so the watchdog has nothing to
            # drop: the coordinator may have declared us dead and handed these over.
            raise RequestTimedOutError(
                f"member {self.member_id!r} has no lease: no heartbeat it sent within "
                f"its session timeout ({self._granted_session:g}s) was accepted"
            )

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
                await self._listener.lost(lost)

    def _renew_lease(self, sent_at: float) -> None:
        # The lease is the session the broker granted (what its fences are measured
        # with), counted from when the accepted request was *sent*.
        if sent_at + self._granted_session > self._lease_end:
            expired = not self.holds_lease()
            self._lease_end = sent_at + self._granted_session
            self._lease_moved.set()
            if expired:  # records held back while it had run out may go again
                self._fetcher.wake()

    # -- the tasks -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a session with the coordinator until stopped; reconnect when it breaks.

        Runs in :attr:`_tasks`, which is shielded once the first join succeeds:
        cancelling the application's block must not cut the connection before
        the consumer has left the group; :meth:`close` cancels it after.
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
                            if now - self._fenced_since >= self._settings.session_timeout:
                                raise
                            log.info("consumer %s: %s; retrying", self._settings.instance_id, exc)
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
        what = f"no coordinator of group {self._settings.group_id!r} was found"
        with self._bootstrap.fail_after(self._settings.api_timeout, what, "api_timeout"):
            coordinator = await self._bootstrap.find_coordinator(self._settings.group_id)
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
                    await self.leave(reason="its assignor failed")
                assert self._assignor_failure is not None
                raise _AssignorFailed(self._assignor_failure)

    async def _join(self, conn: Connection) -> None:
        while True:
            if self._assignment and not self.holds_lease():
                # The lease ran out and the watchdog has not run yet (a stalled
                # process). The coordinator may have expelled us and given these
                # partitions away: they are lost, not carried into the new session by
                # the lease this join renews (nor said to be owned in it).
                await self._lose("the lease ran out before the consumer rejoined")
            sent_at = trio.current_time()
            topics = self._topics
            owned = sorted(self._assignment) if self.member_id else None
            if owned and encoded_size(owned) > self.list_budget():
                owned = None  # (not said: a rebalance follows, as for a member that cannot say)
            try:
                response = await request_in_time(
                    conn,
                    JoinGroupRequest(
                        self._settings.group_id,
                        self.member_id,
                        topics,
                        round(self._settings.session_timeout * 1000),
                        round(self._settings.rebalance_timeout * 1000),
                        self._settings.assignors,
                        self._settings.auto_commit,
                        self._settings.offset_reset,
                        self._settings.client_id,
                        self._settings.rebalance_protocol,
                        self._settings.instance_id,
                        self._settings.user_data,
                        sorted(self._settings.local_assignors),
                        self._settings.rack,
                        owned,
                        max_frame_size=conn.max_frame_size,
                    ),
                    self._settings.request_timeout,
                )
            except UnknownMemberError as exc:
                raise _Reconnect(str(exc), forget_member=True) from None
            assert isinstance(response, JoinGroupResponse)
            if not response.rejoin and topics == self._topics:
                break
            # The first step (join again with the member id handed out), or subscribe()
            # changed the topics while this join was on its way: join again with them.
            self.member_id = response.member_id
        self.member_id = response.member_id
        self._coordinator_frame = response.max_frame_size
        self._fenced_since = None
        self.generation = response.generation
        self._granted_session = response.session_timeout_ms / 1000
        self._renew_lease(sent_at)
        if not self._assignment:
            self._state.value = ConsumerState.REBALANCING
        self._member_ready.set()
        self._backoff.reset()
        log.info("consumer joined %s as %s", self._settings.group_id, self.member_id)

    async def _heartbeat(self, conn: Connection) -> None:
        """Heartbeat every third of the session timeout until the connection ends."""
        interval = self._settings.session_timeout / 3
        while True:
            sent_at = trio.current_time()
            generation = self.generation
            positions = self._fetcher.take_dirty() if self._settings.auto_commit else []
            # More positions than one heartbeat holds go in more heartbeats, back to back.
            parts = list(in_parts(positions, self.list_budget()))
            try:
                with trio.move_on_after(interval):
                    while parts:
                        await conn.request(
                            HeartbeatRequest(
                                self._settings.group_id, self.member_id, generation, parts[0]
                            )
                        )
                        self._renew_lease(sent_at)
                        del parts[0]
            except IllegalGenerationError as exc:
                if generation >= self.generation:  # not an answer overtaken by a new start
                    raise _Reconnect(str(exc)) from None
            except (UnknownMemberError, GroupNotFoundError) as exc:
                raise _Reconnect(str(exc), forget_member=True) from None
            finally:
                # Not delivered (late, refused, or the session ends): send them again, or
                # a consumer that has read all there is never says them (its lag stays).
                self._fetcher.return_dirty(p for part in parts for p in part)
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
            self._settings.group_id,
            self._settings.max_poll_interval,
            len(self._assignment),
        )
        self._asked_again = trio.Event()
        self._poll_left = True
        with trio.move_on_after(_LEAVE_TIMEOUT):
            await self.leave(
                reason="the application did not ask for records within max_poll_interval "
                f"({self._settings.max_poll_interval:g}s)"
            )
        self._left = True
        if self._assignment:  # not connected, so not left cleanly: what it had is lost
            await self._lose("the application did not ask for records within max_poll_interval")
        if self._session_scope is not None:
            self._session_scope.cancel()

    async def leave(self, *, reason: str = "") -> None:
        """Revoke, hand the positions back and leave the group (a static member, closing,
        steps out instead; with a ``reason`` it leaves for good)."""
        conn = self._conn
        if conn is None or conn.closed or not self.member_id:
            return
        # Like a push: a StopFetchers arriving meanwhile would revoke these partitions
        # again, and a StartFetchers would hand new ones to a consumer that is leaving.
        async with self._push_lock:
            if self._settings.instance_id and not reason:
                await self._step_out(conn)
                return
            positions = await self._hand_back(await self._revoke(), _time_left() / 2)
            self._left = True  # (after on_revoked, which may still commit)
            try:
                await conn.request(
                    LeaveGroupRequest(
                        self._settings.group_id,
                        self.member_id,
                        positions,
                        reason or "consumer closed",
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
        positions = await self._hand_back(await self._revoke(), _time_left() / 2)
        self._left = True
        self._state.value = ConsumerState.UNJOINED
        try:
            await conn.request(
                LeaveGroupRequest(
                    self._settings.group_id, self.member_id, positions, "consumer closed", stay=True
                )
            )
        except CoordError as exc:
            log.info("consumer %s: step-out not acknowledged: %s", self.member_id, exc)
