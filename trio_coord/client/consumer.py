"""The consumer: joins a group (or takes fixed partitions), keeps its session, and fetches.

``open_consumer`` finds the group's coordinator (through the bootstrap list,
retrying with backoff), joins, and runs its tasks in its nursery: the
session (one connection to the coordinator, over which the coordinator
pushes StopFetchers and StartFetchers and the consumer sends heartbeats every
third of its session timeout), the fetcher (``_fetcher.Fetcher``: one long
poll per broker holding owned partitions), and a watchdog. The watchdog holds the
member's side of the lease: the partitions are kept only while a heartbeat
*sent* less than a session timeout ago was accepted, so a consumer cut off
from its coordinator drops its partitions no later than the coordinator
hands them to someone else. Then it rediscovers the coordinator and rejoins,
keeping its member id so that a restarted coordinator recognizes it.

State is ``UNJOINED`` → ``REBALANCING`` (joined; fetchers stopped) →
``STABLE`` (fetching its assignment), awaitable through :meth:`Consumer.wait_state`.
The application reads records with ``async for record in consumer`` or
:meth:`Consumer.getmany`. A StopFetchers first stops handing out records of
the partitions (none is handed out after ``on_revoked`` returns), then calls
``on_revoked``, then hands back what the application has *consumed* (see
``_fetcher``). An application that has not asked for records within
``max_poll_interval`` loses its place the same way, cleanly: the consumer
revokes, leaves the group saying why, and rejoins when it is asked again.
Joining when the block is entered gives up after ``api_timeout``. In a
cooperative group a StopFetchers names just the
partitions that move away and the rest keep flowing, and an incremental
StartFetchers adds partitions (``on_assigned`` hears only of those). A
consumer may bring assignors of its own: it computes the group's
assignment with them when the coordinator asks it as the leader
(ComputeAssignment); if such an assignor raises, the consumer leaves the
group and raises that exception from its ``async with``. A static
consumer (``instance_id``) closes without leaving, so that its successor
takes its partitions back without a rebalance. Leaving the
``async with`` block (or being cancelled) revokes the partitions, hands
the final positions to the coordinator with LeaveGroup, and closes.

The group membership (the session, joining, heartbeats, the lease and its
watchdogs, the coordinator's pushes, leaving) is a :class:`._membership.GroupMembership`
that a group's ``Consumer`` owns (as Kafka's KafkaConsumer owns a ConsumerCoordinator,
aiokafka's consumer a coordinator): the consumer hands it its group settings, the
application's callbacks and the fetcher, and asks it for state, assignment, the
connection commits go over and leaving. This module keeps what the application calls.

With ``partitions=[...]`` instead of topics the consumer joins no group: it
fetches exactly those partitions, from the group's committed offsets if a
group is named (committing to it as a standalone committer) or else by its
reset policy.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar

import trio
from trio_util import AsyncValue

from .._aio import EnterOnce, unwrap_lone_exception
from ..core.assignors import Assignor, make_registry
from ..core.group import OFFSET_RESET_POLICIES, REBALANCE_PROTOCOLS
from ..protocol.connection import Connection
from ..protocol.errors import (
    CoordError,
    OffsetRegressionError,
    UnknownMemberError,
)
from ..protocol.framing import DEFAULT_MAX_FRAME_SIZE
from ..protocol.messages import (
    EARLIEST,
    LATEST,
    NO_OFFSET,
    OffsetCommitRequest,
    PartitionOffset,
    RequestBody,
    ResponseBody,
    TopicPartition,
)
from ..protocol.records import ConsumerRecord
from ..security.client import ClientSecurity, Sasl
from ._bootstrap import Bootstrap
from ._cluster import ClusterView
from ._fetcher import Fetcher, FetchSettings
from ._membership import (
    _LEAVE_TIMEOUT,
    ConsumerState,
    GroupMembership,
    MembershipSettings,
    OffsetReset,
    PartitionsCallback,
    RebalanceListener,
    RebalanceProtocol,
    request_in_time,
)
from ._parts import FrameGuess, look_up_committed, send_in_parts

__all__ = [
    "Consumer",
    "ConsumerState",
    "OffsetReset",
    "PartitionsCallback",
    "RebalanceProtocol",
    "open_consumer",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


_DEFAULT_ASSIGNORS: dict[str, tuple[str, ...]] = {
    "eager": ("range", "roundrobin"),
    "cooperative": ("uniform", "sticky", "range", "roundrobin"),
}
"""The assignors a consumer accepts unless told otherwise, per rebalance protocol: a
cooperative group pays for every move with a stop, so it prefers the sticky ones."""


_MIN_FETCH_MAX_BYTES = 64 * 1024
_MAX_FETCH_MAX_BYTES = 512 * 1024 * 1024
"""The range of ``fetch_max_bytes``: it is also the largest frame the consumer's
connections read (metadata and group answers included), and what one answer may hold
in memory."""


class Consumer(EnterOnce):
    """A member of a consumer group; create it with :func:`open_consumer`.

    A group's consumer owns a :class:`~trio_coord.client._membership.GroupMembership`
    (``_membership``; None for ``partitions=[...]``); see the module doc.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        group_id: str | None = None,
        topics: Iterable[str] = (),
        *,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        session_timeout: float = 10.0,
        rebalance_timeout: float = 30.0,
        auto_commit: bool = True,
        offset_reset: OffsetReset = "latest",
        assignors: Sequence[str | Assignor] | None = None,
        rebalance_protocol: RebalanceProtocol = "eager",
        instance_id: str | None = None,
        user_data: bytes = b"",
        rack: str = "",
        on_assigned: PartitionsCallback | None = None,
        on_revoked: PartitionsCallback | None = None,
        on_lost: PartitionsCallback | None = None,
        client_id: str = "trio-coord",
        fetch_max_wait: float = 0.5,
        fetch_min_bytes: int = 1,
        max_partition_fetch_bytes: int = 1024 * 1024,
        fetch_max_bytes: int = DEFAULT_MAX_FRAME_SIZE,
        max_poll_interval: float = 300.0,
        request_timeout: float = 30.0,
        api_timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        sasl: Sasl | None = None,
    ) -> None:
        subscription = sorted(set([topics] if isinstance(topics, str) else topics))
        self.static_partitions = (
            None if partitions is None else sorted({TopicPartition(*tp) for tp in partitions})
        )
        if self.static_partitions is None:
            if not subscription:
                raise ValueError("subscribe to at least one topic (or give partitions=[...])")
            if not group_id:
                raise ValueError("a group id is required to subscribe to topics")
        elif subscription:
            raise ValueError("give either topics (group membership) or partitions, not both")
        elif not self.static_partitions:
            raise ValueError("partitions=[...] must name at least one (topic, partition)")
        if fetch_max_wait < 0 or fetch_min_bytes < 1 or max_partition_fetch_bytes < 1:
            raise ValueError(
                "fetch_max_wait must not be negative; fetch_min_bytes and "
                "max_partition_fetch_bytes must be at least 1"
            )
        if not _MIN_FETCH_MAX_BYTES <= fetch_max_bytes <= _MAX_FETCH_MAX_BYTES:
            raise ValueError(
                f"fetch_max_bytes must be {_MIN_FETCH_MAX_BYTES} to {_MAX_FETCH_MAX_BYTES} "
                f"(the most one fetch answer, and so one stored batch, may take), not "
                f"{fetch_max_bytes}"
            )
        if session_timeout <= 0 or rebalance_timeout <= 0:
            raise ValueError("session_timeout and rebalance_timeout must be positive (seconds)")
        for name, value in (
            ("max_poll_interval", max_poll_interval),
            ("request_timeout", request_timeout),
            ("api_timeout", api_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be positive (seconds), not {value}")
        if offset_reset not in OFFSET_RESET_POLICIES:
            raise ValueError(
                f"offset_reset must be one of {', '.join(OFFSET_RESET_POLICIES)}, "
                f"not {offset_reset!r}"
            )
        if rebalance_protocol not in REBALANCE_PROTOCOLS:
            raise ValueError(
                f"rebalance_protocol must be one of {', '.join(REBALANCE_PROTOCOLS)}, "
                f"not {rebalance_protocol!r}"
            )
        if assignors is None:
            assignors = _DEFAULT_ASSIGNORS[rebalance_protocol]
        if not assignors:
            raise ValueError("name at least one assignor (for example 'range')")
        local = [a for a in assignors if not isinstance(a, str)]
        make_registry(local)  # raises ValueError for a bad name or a clash with a built-in
        local_assignors: dict[str, Assignor] = {a.name: a for a in local}
        if instance_id is not None and not instance_id:
            raise ValueError("instance_id must not be empty (or leave it out: a dynamic member)")
        self.group_id = group_id or ""
        self.session_timeout = session_timeout
        self.rebalance_timeout = rebalance_timeout
        self.auto_commit = auto_commit
        self.offset_reset = offset_reset
        self.assignors = [a if isinstance(a, str) else a.name for a in assignors]
        self.rebalance_protocol = rebalance_protocol
        self.instance_id = instance_id or ""
        self.user_data = user_data
        self.rack = rack
        self.client_id = client_id
        self.max_poll_interval = max_poll_interval
        self.request_timeout = request_timeout
        self.api_timeout = api_timeout
        self.fetch_max_bytes = fetch_max_bytes
        self._bootstrap = Bootstrap(
            bootstrap,
            request_timeout=request_timeout,
            security=ClientSecurity(ssl_context, sasl),
        )
        self._fetch_settings = FetchSettings(
            offset_reset,
            fetch_max_wait,
            fetch_min_bytes,
            max_partition_fetch_bytes,
            request_timeout,
        )
        self._fetcher = Fetcher(self._fetch_settings)
        self._membership: GroupMembership | None = None
        self._frame_guess = FrameGuess(fetch_max_bytes)  # (a standalone committer's)
        if self.static_partitions is None:
            self._membership = GroupMembership(
                MembershipSettings(
                    group_id=self.group_id,
                    client_id=client_id,
                    instance_id=self.instance_id,
                    session_timeout=session_timeout,
                    rebalance_timeout=rebalance_timeout,
                    max_poll_interval=max_poll_interval,
                    request_timeout=request_timeout,
                    api_timeout=api_timeout,
                    auto_commit=auto_commit,
                    offset_reset=offset_reset,
                    rebalance_protocol=rebalance_protocol,
                    assignors=list(self.assignors),
                    user_data=user_data,
                    rack=rack,
                    local_assignors=local_assignors,
                ),
                subscription,
                listener=RebalanceListener(on_assigned, on_revoked, on_lost),
                bootstrap=self._bootstrap,
                fetcher=self._fetcher,
            )
            # A member hands records out only while its lease holds.
            self._fetcher.may_hand_out = self._membership.holds_lease
        # A consumer of fixed partitions (partitions=[...]) keeps these itself.
        self._fixed_state = AsyncValue(ConsumerState.UNJOINED)
        self._fixed: dict[TopicPartition, int] = {}
        self._commit_conn: Connection | None = None  # (its own, to commit to group_id)
        self._closed = False

    def __repr__(self) -> str:
        return f"<Consumer {self.group_id}/{self.member_id or '?'} {self.state}>"

    @asynccontextmanager
    async def _run_for_block(self) -> AsyncIterator[Consumer]:
        with unwrap_lone_exception():
            async with trio.open_nursery() as nursery:
                cluster = ClusterView(
                    self._bootstrap,
                    nursery,
                    max_frame_size=self.fetch_max_bytes,
                    name=self.client_id,
                    timeout=self.api_timeout,
                    timeout_setting="api_timeout",
                )
                self._fetcher.attach(cluster)
                nursery.start_soon(self._fetcher.run)
                membership = self._membership
                if membership is None:
                    await self._start_static()
                    if self.group_id and self.auto_commit:
                        nursery.start_soon(self._auto_commit_standalone)
                else:
                    what = f"the consumer could not join group {self.group_id!r}"
                    with self._bootstrap.fail_after(self.api_timeout, what, "api_timeout"):
                        await nursery.start(membership.run)
                    membership.start_poll_clock()
                clean = False
                try:
                    yield self
                    clean = True
                finally:
                    if clean:  # the last records handed out were processed
                        self._fetcher.mark_consumed()
                    # The session survives a cancelled block (it is shielded once
                    # joined), so the goodbye goes out on a live connection.
                    with trio.move_on_after(_LEAVE_TIMEOUT) as scope:
                        scope.shield = True
                        if membership is None:
                            await self._final_commit()
                        else:
                            await membership.leave()
                    if membership is not None:
                        membership.close()
                    self._closed = True
                    nursery.cancel_scope.cancel()
                    with trio.CancelScope(shield=True):
                        await cluster.aclose()

    async def _auto_commit_standalone(self) -> None:
        """Without a group session, commit what was consumed every third of a session timeout."""
        while True:
            await trio.sleep(self.session_timeout / 3)
            positions = self._fetcher.take_dirty()
            if not positions:
                continue
            try:
                await self.commit({p.tp: p.offset for p in positions})
            except OffsetRegressionError:
                log.info("consumer: auto-commit does not move %s's offsets back", self.group_id)
            except CoordError as exc:
                log.warning("consumer: auto-commit to %s failed: %s", self.group_id, exc)
                self._fetcher.return_dirty(positions)

    async def _start_static(self) -> None:
        """Own the fixed partitions: from the group's committed offsets, or by the policy."""
        assert self.static_partitions is not None
        committed: dict[TopicPartition, int] = {}
        if self.group_id:
            committed = await self.committed(self.static_partitions)
        offsets = {tp: committed.get(tp, NO_OFFSET) for tp in self.static_partitions}
        self._fixed = dict(offsets)
        self._fetcher.assign(offsets)
        self._fixed_state.value = ConsumerState.STABLE

    async def _final_commit(self) -> None:
        """Closing with fixed partitions: commit what was consumed (with a group and
        auto-commit), then own nothing."""
        if self.group_id and self.auto_commit and self._fixed:
            try:
                await self.commit()
            except (CoordError, ValueError) as exc:
                log.info("consumer: final commit of %s failed: %s", self.group_id, exc)
        self._fixed.clear()
        self._fetcher.drop()

    # -- what the application reads ----------------------------------------------------

    @property
    def topics(self) -> list[str]:
        """The subscription, sorted (empty for a consumer of fixed partitions)."""
        return [] if self._membership is None else list(self._membership.topics)

    @property
    def member_id(self) -> str:
        """The member id the coordinator gave this consumer ("" before it joined, and for a
        consumer of fixed partitions)."""
        return "" if self._membership is None else self._membership.member_id

    @property
    def generation(self) -> int:
        """The generation of the group this consumer last joined or was started in (-1:
        none)."""
        return -1 if self._membership is None else self._membership.generation

    @property
    def state(self) -> ConsumerState:
        """UNJOINED, REBALANCING or STABLE."""
        if self._membership is None:
            return self._fixed_state.value
        return self._membership.state

    async def wait_state(self, state: ConsumerState) -> None:
        """Return once the consumer is in ``state`` (at once if it is already)."""
        if self._membership is None:
            await self._fixed_state.wait_value(state)
        else:
            await self._membership.wait_state(state)

    async def wait_state_change(self) -> ConsumerState:
        """Wait for :attr:`state` to change and return the new state (a change that
        happens while the caller is not waiting here is not reported later)."""
        if self._membership is None:
            new, _old = await self._fixed_state.wait_transition()
            return new
        return await self._membership.wait_state_change()

    async def subscribe(self, topics: Iterable[str]) -> None:
        """Change what this member consumes, at run time (the seed's addTopic).

        The new subscription reaches the coordinator at once (a JoinGroup
        with the same member id), which rebalances the group once: the
        partitions of topics dropped are revoked (``on_revoked``) and those of
        topics added assigned (``on_assigned``). Returns once the coordinator
        has the new subscription, not once it is assigned (``wait_assigned``,
        or ``wait_state``, for that). If the connection to the coordinator is
        down (or this call is cancelled before the coordinator answered), the
        rejoin that follows carries it. ``re:`` entries may be
        given, as to :func:`open_consumer`.
        """
        wanted = sorted(set([topics] if isinstance(topics, str) else topics))
        if self.static_partitions is not None:
            raise ValueError(
                "a consumer of fixed partitions=[...] has no subscription to change; "
                "open another consumer for other partitions"
            )
        if not wanted:
            raise ValueError("subscribe to at least one topic (to stop consuming, close)")
        if self._lifetime is None:
            raise UnknownMemberError("use the consumer inside its async with block")
        assert self._membership is not None  # (a consumer without fixed partitions has one)
        await self._membership.subscribe(wanted)

    @property
    def assignment(self) -> dict[TopicPartition, int]:
        """The partitions this consumer owns, with the offset each started from."""
        return dict(self._owned())

    def _owned(self) -> Mapping[TopicPartition, int]:
        return self._fixed if self._membership is None else self._membership.assignment

    async def wait_assigned(self) -> dict[TopicPartition, int]:
        """Wait until the consumer is STABLE and return its assignment."""
        await self.wait_state(ConsumerState.STABLE)
        return self.assignment

    def position(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """The offset of the next record to hand out on an owned partition (None: not known yet).

        Raises ValueError for a partition this consumer does not own.
        """
        return self._fetcher.position(TopicPartition(*tp))

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        """Hand out an owned partition's records from ``offset`` on.

        Auto-commit reports the new position; a position behind the committed
        offset is not made durable that way (committed offsets never go back
        implicitly): ``await consumer.commit(allow_regression=True)`` does it.
        """
        self._fetcher.seek(TopicPartition(*tp), offset)

    def seek_to_beginning(self, *tps: TopicPartition | tuple[str, int]) -> None:
        """Continue the given owned partitions (default: all) from their log start."""
        self._fetcher.reset(self._chosen(tps), EARLIEST)

    def seek_to_end(self, *tps: TopicPartition | tuple[str, int]) -> None:
        """Continue the given owned partitions (default: all) from their log end."""
        self._fetcher.reset(self._chosen(tps), LATEST)

    def pause(self, *tps: TopicPartition | tuple[str, int]) -> None:
        """Stop handing out (and fetching) records of these owned partitions (default: all)."""
        self._fetcher.pause(self._chosen(tps))

    def resume(self, *tps: TopicPartition | tuple[str, int]) -> None:
        """Undo :meth:`pause` for these partitions (default: all)."""
        self._fetcher.resume(self._chosen(tps))

    def paused(self) -> list[TopicPartition]:
        """The paused partitions."""
        return self._fetcher.paused()

    def lag(self) -> dict[TopicPartition, int]:
        """Per owned partition, how many records lie between its position and the log end
        (as of the last fetch)."""
        return self._fetcher.lag()

    def _chosen(self, tps: tuple[TopicPartition | tuple[str, int], ...]) -> list[TopicPartition]:
        return [TopicPartition(*tp) for tp in tps] if tps else self._fetcher.owned

    # -- reading records -----------------------------------------------------------------

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        """The next record of an owned partition (waits for one).

        Coming back for the next record marks the previous one consumed: it
        is what auto-commit, :meth:`commit` and a rebalance hand on.
        """
        return (await self._records(1))[0]

    async def getone(self) -> ConsumerRecord:
        """The next record (the same as ``await anext(consumer)``)."""
        return await self.__anext__()

    async def getmany(self, max_records: int = 500) -> list[ConsumerRecord]:
        """Up to ``max_records`` records, as soon as at least one is there.

        The records handed out by the previous call count as consumed. To
        wait a bounded time, wrap it: ``with trio.move_on_after(1): ...``.
        """
        if max_records < 1:
            raise ValueError("max_records must be at least 1")
        return await self._records(max_records)

    async def _records(self, limit: int) -> list[ConsumerRecord]:
        """Every way of reading records comes here: it keeps the poll clock.

        While an application task waits in here the clock stands still; once
        none does, the application must ask again within ``max_poll_interval``
        (the membership's ``_poll_watchdog``). Asking again after the consumer left for
        that reason makes it rejoin; this call then waits for records of its
        new assignment, as it would after any rebalance.
        """
        if self._membership is None:
            return await self._fetcher.next_records(limit)
        with self._membership.asking():
            return await self._fetcher.next_records(limit)

    async def batches(self, max_records: int = 500) -> AsyncIterator[list[ConsumerRecord]]:
        """``async for batch in consumer.batches()``: :meth:`getmany` in a loop."""
        while True:
            yield await self.getmany(max_records)

    # -- commits -------------------------------------------------------------------------

    async def _committer(self) -> Connection:
        """The connection commits go over: the session's, or (standalone) one of its own."""
        if self._membership is not None:
            if self._lifetime is None:
                raise UnknownMemberError(
                    "the consumer has not joined its group yet: use it inside its async with block"
                )
            return self._membership.coordinator()
        if not self.group_id:
            raise ValueError("this consumer has no group to commit to: pass group_id")
        if self._lifetime is None or self._closed:
            raise UnknownMemberError("use the consumer inside its async with block")
        if self._commit_conn is None or self._commit_conn.closed:
            what = f"no coordinator of group {self.group_id!r} was found"
            with self._bootstrap.fail_after(self.api_timeout, what, "api_timeout"):
                coordinator = await self._bootstrap.find_coordinator(self.group_id)
            # A standalone committer: member id "" and generation -1.
            self._commit_conn = await self._fetcher.cluster.connection(coordinator)
        return self._commit_conn

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int] | None = None,
        *,
        allow_regression: bool = False,
    ) -> None:
        """Durably commit offsets (default: the current positions of owned partitions).

        Returns once the offsets are durable on the coordinator. More offsets
        than one request holds (thousands of partitions) are committed in
        parts, one after the other; if one fails, the parts before it stay
        committed. Raises
        :class:`~trio_coord.RebalanceInProgressError` while a partition is
        being moved, :class:`~trio_coord.PartitionNotOwnedError` for a
        partition this consumer does not own, and
        :class:`~trio_coord.OffsetRegressionError` for a rewind without
        ``allow_regression=True`` (the positions this consumer hands back
        later, on a rebalance or when it leaves, move it forward again unless
        it also seeks there), :class:`~trio_coord.ConnectionClosedError`
        (retriable) while the consumer reconnects to its coordinator, and
        :class:`~trio_coord.UnknownMemberError` outside its ``async with`` block.
        """
        self._check_poll_membership()
        if offsets is None:
            engine = self._fetcher
            engine.mark_consumed()
            items = [(p.tp, p.offset) for p in engine.consumed()]
        else:
            items = [(TopicPartition(*tp), off) for tp, off in offsets.items()]
        if not items:
            return
        positions = [PartitionOffset(tp.topic, tp.partition, off) for tp, off in sorted(items)]

        async def commit_part(conn: Connection, part: list[PartitionOffset]) -> None:
            request = OffsetCommitRequest(
                self.group_id, self.member_id, self.generation, part, allow_regression
            )
            await self._request(conn, request)

        await self._in_parts(positions, commit_part)

    async def committed(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets (default: for this consumer's assignment)."""
        wanted = sorted(TopicPartition(*tp) for tp in (partitions or self._owned()))
        found: dict[TopicPartition, int] = {}

        async def look_up(conn: Connection, part: list[TopicPartition]) -> None:
            ask = functools.partial(self._request, conn)
            await look_up_committed(self.group_id, part, ask, found)

        await self._in_parts(wanted, look_up)
        return found

    async def _in_parts(
        self, items: list[_T], send: Callable[[Connection, list[_T]], Awaitable[None]]
    ) -> None:
        """``send`` the coordinator ``items`` a part at a time (see :mod:`._parts`): a
        member knows its coordinator's frame, a standalone committer learns it."""

        async def send_part(part: list[_T]) -> None:
            await send(await self._committer(), part)

        if self._membership is not None:
            await send_in_parts(items, send_part, self._membership.list_budget)
        else:
            guess = self._frame_guess
            await send_in_parts(items, send_part, guess.budget, guess.halve)

    async def _request(self, conn: Connection, body: RequestBody) -> ResponseBody | None:
        """``conn.request(body)``, waiting at most ``request_timeout`` for the answer."""
        return await request_in_time(conn, body, self.request_timeout)

    def _check_poll_membership(self) -> None:
        """Commits after leaving for ``max_poll_interval`` fail, saying so (as Kafka's do)."""
        if self._membership is not None:
            self._membership.check_poll_membership()


def open_consumer(
    bootstrap: str | Sequence[str],
    group_id: str | None = None,
    topics: Iterable[str] = (),
    *,
    partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
    session_timeout: float = 10.0,
    rebalance_timeout: float = 30.0,
    auto_commit: bool = True,
    offset_reset: OffsetReset = "latest",
    assignors: Sequence[str | Assignor] | None = None,
    rebalance_protocol: RebalanceProtocol = "eager",
    instance_id: str | None = None,
    user_data: bytes = b"",
    rack: str = "",
    on_assigned: PartitionsCallback | None = None,
    on_revoked: PartitionsCallback | None = None,
    on_lost: PartitionsCallback | None = None,
    client_id: str = "trio-coord",
    fetch_max_wait: float = 0.5,
    fetch_min_bytes: int = 1,
    max_partition_fetch_bytes: int = 1024 * 1024,
    fetch_max_bytes: int = DEFAULT_MAX_FRAME_SIZE,
    max_poll_interval: float = 300.0,
    request_timeout: float = 30.0,
    api_timeout: float = 60.0,
    ssl_context: ssl.SSLContext | None = None,
    sasl: Sasl | None = None,
) -> Consumer:
    """Join ``group_id`` as a consumer of ``topics``: ``async with open_consumer(...) as c``.

    Then ``async for record in c`` reads records of the partitions it owns
    (or ``await c.getmany()`` for batches). With ``partitions=[("t", 0),
    ...]`` instead of topics it joins no group and reads exactly those
    partitions; with a ``group_id`` too, it starts from the group's committed
    offsets and commits to the group as a standalone committer (accepted only
    while the group has no members).

    ``bootstrap`` is ``"host:port[,host:port...]"``. Options (with defaults):
    ``session_timeout=10.0`` and ``rebalance_timeout=30.0`` seconds,
    ``max_poll_interval=300.0`` seconds (Kafka's ``max.poll.interval.ms``:
    if the application has not asked for records for this long, not
    counting the time it waits inside a call, the consumer revokes its
    partitions, calling ``on_revoked``, and leaves the group so that they go
    to other members at once; the next request for records rejoins, and
    until then :meth:`Consumer.commit` raises UnknownMemberError saying so),
    ``request_timeout=30.0`` seconds (the longest wait for one answer) and
    ``api_timeout=60.0`` seconds (Kafka's ``default.api.timeout.ms``: the
    longest the join on entering the block, or finding the coordinator for
    a commit, may take; then RequestTimedOutError names every broker
    address that could not be reached and why),
    ``auto_commit=True``, ``offset_reset="latest"`` (or ``"earliest"``,
    ``"none"``), ``rebalance_protocol="eager"`` (or ``"cooperative"``:
    rebalances stop only the partitions that move, and the callbacks hear
    only of those), ``assignors`` in order of preference (names of the
    broker's assignors, or assignor objects of the application's own, which
    this consumer runs if it becomes the group's leader; default ``("range",
    "roundrobin")``, or ``("uniform", "sticky", "range", "roundrobin")`` when
    cooperative), ``user_data`` (bytes handed to such an assignor),
    ``rack`` (the rack this consumer runs in: the broker's assignors prefer
    giving it partitions held by brokers of that rack, their ``--rack``),
    ``instance_id`` (a static member: see docs/assignment.md), ``client_id``,
    and the callbacks ``on_assigned``, ``on_revoked`` and ``on_lost`` (each
    called with a sorted list of partitions; plain or async functions);
    ``fetch_max_wait=0.5`` seconds a fetch waits for data, ``fetch_min_bytes=1``,
    ``max_partition_fetch_bytes=1048576`` and ``fetch_max_bytes=1048576`` (Kafka's
    ``fetch.max.bytes``: the most one fetch answer may take, and so the largest
    stored batch this consumer reads; raise it for a broker whose batches are
    larger, within the broker's ``max_frame_size``); ``ssl_context`` (a broker speaking TLS:
    :func:`~trio_coord.client_ssl_context`) and ``sasl`` (a :class:`~trio_coord.Sasl`
    login; docs/security.md).

    The block is entered once the consumer has joined (use
    :meth:`Consumer.wait_assigned` for its partitions); while no broker is
    reachable it keeps retrying, for at most ``api_timeout``. Once in the
    block, a consumer whose coordinator becomes unreachable keeps trying to
    rejoin until the block ends (its partitions are dropped when its lease
    runs out). A setting the broker refuses (say, a session timeout outside
    its limits) raises the typed error at once. Leaving the block leaves the
    group cleanly. (The :class:`Consumer` this returns is itself the async
    context manager, so callbacks can refer to it before it is entered.)
    """
    return Consumer(
        bootstrap,
        group_id,
        topics,
        partitions=partitions,
        session_timeout=session_timeout,
        rebalance_timeout=rebalance_timeout,
        auto_commit=auto_commit,
        offset_reset=offset_reset,
        assignors=assignors,
        rebalance_protocol=rebalance_protocol,
        instance_id=instance_id,
        user_data=user_data,
        rack=rack,
        on_assigned=on_assigned,
        on_revoked=on_revoked,
        on_lost=on_lost,
        client_id=client_id,
        fetch_max_wait=fetch_max_wait,
        fetch_min_bytes=fetch_min_bytes,
        max_partition_fetch_bytes=max_partition_fetch_bytes,
        fetch_max_bytes=fetch_max_bytes,
        max_poll_interval=max_poll_interval,
        request_timeout=request_timeout,
        api_timeout=api_timeout,
        ssl_context=ssl_context,
        sasl=sasl,
    )
