"""A broker's membership of a cluster on ZooKeeper: registration, slot elections, failover.

:class:`ClusterMember` keeps one ZooKeeper session for its broker and, within
it, registers the broker, follows the live brokers and the holders of the
coordinator slots, learns of topics made or grown by other brokers, and wins,
serves and gives up slots. The store layout (under the cluster's chroot)::

    /cluster              {"slots": N}: every broker must agree on N
    /brokers/<id>         ephemeral: the broker's address (BrokerInfo)
    /coordinators/<slot>  ephemeral: the id of the broker holding the slot
    /slots/<slot>         persistent; its data version is the slot's epoch

Winning slot *s* is one atomic multi: create ``/coordinators/s`` (fails if
held), bump ``/slots/s`` (its new version is the epoch won) and touch
``/coordinators`` (so that every broker's data watch sees the handover).
Every later write for the slot's groups opens with ``Check(/slots/s,
epoch)``, so once another broker has won the slot (which bumps the epoch) a
deposed holder's write fails whole and it steps down. The winner loads the
slot's groups and offsets after bumping, so it sees every write the old
holder made.

Slots are spread evenly: a vacant slot is claimed by the live broker holding
the fewest (ties: the lowest id), which every broker computes from the same
view; if that broker does not claim it within ``claim_grace``, any broker
may. While some broker holds at least two slots more than another, the one
holding the most (ties: the lowest id) gives one up, after the view has
been still for ``claim_grace``; the broker holding the fewest claims it. So
a broker joining takes over a share one slot at a time, each slot moving at
most once, without churn at start-up; the counts end at most one apart.
(Were every broker above the fewest to shed at once, the slots given up
could outnumber the joiner's share, and a shedder win one back: a group
would pay a handover for nothing.) :func:`claimants` and :func:`shedder`
are these rules, computed by every broker from the same view.

A broker id belongs to one broker. A broker starting while its id is
registered by another session asks the address in that registration: if a
broker answers there, the id is taken and start-up fails, naming that
broker; if none does, the registration is this broker's own from before a
restart, and it waits for that session to expire.

On session expiry everything held through the session is gone: the member
drops every slot, opens a new session, registers again and re-elects.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import msgspec
import trio

from ..core.records import TopicRecord, TopicTombstone, decode_record
from ..protocol.connection import open_connection
from ..protocol.errors import ConnectionClosedError, CoordError
from ..protocol.messages import BrokerInfo, MetadataRequest
from ..store.base import (
    BadVersionError,
    Check,
    Create,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    SessionState,
    SetData,
    Stat,
    StoreConnectionError,
    StoreError,
)
from ..store.zookeeper import open_zookeeper_store
from .coordinator import CoordinatorService, slot_of
from .persistence import GROUPS, TOPICS, RecordWriter, load_records, topic_path

if TYPE_CHECKING:
    from ..log import LogManager
    from .coordinator import Coordinators
    from .topics import TopicManager


class ClusterHost(Protocol):
    """What a broker's cluster membership uses of the broker (``Broker`` is one).

    ``ClusterMember`` depends on this, not on ``server``: the broker's
    identity and address, its services (topics, logs, coordinator slots) and
    the store and writer it swaps for a new ZooKeeper session.
    """

    store: MetadataStore
    writer: RecordWriter

    @property
    def broker_id(self) -> int:
        """This broker's id."""
        ...

    @property
    def address(self) -> tuple[str, int]:
        """Where its native listener listens."""
        ...

    @property
    def bootstrap(self) -> str:
        """``host:port`` of its native listener."""
        ...

    @property
    def info(self) -> BrokerInfo:
        """This broker as Metadata (and its registration) describes it."""
        ...

    @property
    def topics(self) -> TopicManager:
        """Its topics."""
        ...

    @property
    def logs(self) -> LogManager:
        """Its partition logs."""
        ...

    @property
    def coordinator(self) -> Coordinators:
        """The coordinator services of the slots it holds."""
        ...

    def new_coordinator_service(self, writer: RecordWriter) -> CoordinatorService:
        """A coordinator service writing through ``writer`` (one per slot held)."""
        ...


__all__ = [
    "ClusterConfigError",
    "ClusterHost",
    "ClusterMember",
    "ClusterStatus",
    "SlotHolder",
    "claimants",
    "read_status",
    "shedder",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

CLUSTER = "/cluster"
BROKERS = "/brokers"
COORDINATORS = "/coordinators"
SLOTS = "/slots"


PROBE_TIMEOUT = 2.0
"""How long a starting broker waits for an answer at its id's registered address."""


class ClusterConfigError(ValueError):
    """This broker's settings contradict the cluster's (a different slot count, a taken id)."""


class _ClusterConfig(msgspec.Struct, frozen=True):
    slots: int


def coordinator_path(slot: int) -> str:
    """The ephemeral node of a slot's holder."""
    return f"{COORDINATORS}/{slot}"


def epoch_path(slot: int) -> str:
    """The node whose data version is a slot's epoch."""
    return f"{SLOTS}/{slot}"


def _slot_counts(brokers: Iterable[int], holders: Mapping[int, int]) -> dict[int, int]:
    """How many slots each live broker holds."""
    counts = dict.fromkeys(brokers, 0)
    for holder in holders.values():
        if holder in counts:
            counts[holder] += 1
    return counts


def claimants(brokers: Iterable[int], holders: Mapping[int, int], slots: int) -> dict[int, int]:
    """Who should claim each vacant slot: the live broker holding fewest (ties: lowest id).

    ``holders`` maps each held slot to its broker; the vacant slots are given
    out in slot order, each counting towards its claimant's share.
    """
    counts = _slot_counts(brokers, holders)
    claims: dict[int, int] = {}
    for slot in range(slots):
        if slot in holders or not counts:
            continue
        chosen = min(counts, key=lambda b: (counts[b], b))
        claims[slot] = chosen
        counts[chosen] += 1
    return claims


def shedder(brokers: Iterable[int], holders: Mapping[int, int], slots: int) -> int | None:
    """The one broker that should give up a slot now, or None if none should.

    While every slot is held and some live broker holds at least two more
    than another, it is the broker holding the most (ties: the lowest id):
    one broker, one slot at a time, so that no more slots move than evening
    the counts needs.
    """
    counts = _slot_counts(brokers, holders)
    if len(holders) < slots or not counts:
        return None  # slots are being elected: claims come first
    most = min(counts, key=lambda b: (-counts[b], b))
    return most if counts[most] >= min(counts.values()) + 2 else None


@dataclass(slots=True)
class SlotHolder:
    """A slot this broker won: its epoch and, once loaded, its coordinator service."""

    slot: int
    epoch: int
    scope: trio.CancelScope
    service: CoordinatorService | None = None
    writer: RecordWriter | None = None


class ClusterMember:
    """One broker's life in a cluster; see the module docstring."""

    def __init__(
        self,
        broker: ClusterHost,
        url: str,
        *,
        slots: int,
        session_timeout: float,
        claim_grace: float = 1.0,
        zk_auth: str | None = None,
    ) -> None:
        self._broker = broker
        self._url = url
        self._zk_auth = zk_auth
        self.slots = slots
        self._session_timeout = session_timeout
        self._claim_grace = claim_grace
        self.brokers: dict[int, BrokerInfo] = {}
        """The live brokers, by id (as ZooKeeper last said)."""
        self.holders: dict[int, int] = {}
        """slot → the id of the broker holding it (as ZooKeeper last said)."""
        self.held: dict[int, SlotHolder] = {}
        """The slots this broker holds, loaded or loading."""
        self.sessions = 0
        """How many ZooKeeper sessions this member has had (for tests and logs)."""
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None

    @property
    def broker_id(self) -> int:
        """This broker's id."""
        return self._broker.broker_id

    def coordinator_of(self, slot: int) -> BrokerInfo | None:
        """The live broker holding ``slot`` (None while none does)."""
        holder = self.holders.get(slot)
        return None if holder is None else self.brokers.get(holder)

    def _view_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- sessions ----------------------------------------------------------------------

    async def run(
        self, first: MetadataStore, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the cluster through ``first``, then through a new session after each expiry."""
        store: MetadataStore | None = first
        status = task_status
        while True:
            async with contextlib.AsyncExitStack() as stack:
                if store is None:
                    store = await self._open(stack)
                await self._serve_session(store, status)
                status = trio.TASK_STATUS_IGNORED
                if store.session_state.value is SessionState.CLOSED:
                    return  # closed on purpose (the broker is stopping), not expired
            store = None
            log.warning(
                "broker %d: ZooKeeper session expired; every slot was dropped; "
                "registering again with a new session",
                self.broker_id,
            )

    async def _open(self, stack: contextlib.AsyncExitStack) -> MetadataStore:
        delay = 0.1
        while True:
            try:
                return await stack.enter_async_context(
                    open_zookeeper_store(
                        self._url,
                        session_timeout=self._session_timeout,
                        auth=self._zk_auth,
                    )
                )
            except StoreConnectionError as exc:
                log.warning("broker %d: %s; retrying", self.broker_id, exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _serve_session(
        self, store: MetadataStore, task_status: trio.TaskStatus[None]
    ) -> None:
        """Everything one session holds; returns once the session expired."""
        self.sessions += 1
        broker = self._broker
        broker.store = store
        broker.writer.store = store
        try:
            await _retrying(store, lambda: self._prepare(store))
            broker.writer.add_existing_paths({TOPICS})
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._follow_session, store)
                await nursery.start(self._follow_brokers, store)
                await nursery.start(self._follow_holders, store)
                await nursery.start(self._follow_topics, store)
                await _retrying(store, lambda: self._register(store))
                nursery.start_soon(self._balance, store)
                task_status.started()
                await store.session_state.wait_value(
                    lambda s: s in (SessionState.EXPIRED, SessionState.CLOSED)
                )
                nursery.cancel_scope.cancel()
        except* StoreError:
            if store.session_state.value not in (SessionState.EXPIRED, SessionState.CLOSED):
                raise
        finally:
            self._nursery = None
            broker.coordinator.suspended = False
            for holder in list(self.held.values()):
                self._drop(holder)
            self.brokers.clear()
            self.holders.clear()

    async def _prepare(self, store: MetadataStore) -> None:
        """Create the cluster's nodes if missing and check this broker agrees on the slots."""
        config = msgspec.msgpack.encode(_ClusterConfig(self.slots))
        for path in (BROKERS, COORDINATORS, SLOTS, TOPICS):
            with contextlib.suppress(NodeExistsError):
                await store.create(path, make_parents=True)
        with contextlib.suppress(NodeExistsError):
            await store.create(CLUSTER, config)
        data, _ = await store.get(CLUSTER)
        theirs = msgspec.msgpack.decode(data, type=_ClusterConfig)
        if theirs.slots != self.slots:
            raise ClusterConfigError(
                f"this cluster has {theirs.slots} coordinator slots but broker "
                f"{self.broker_id} was started with {self.slots}; start it with "
                f"--coordinator-slots {theirs.slots} (the count is fixed when a cluster is made)"
            )
        for slot in range(self.slots):
            if await store.exists(epoch_path(slot)) is None:
                with contextlib.suppress(NodeExistsError):
                    await store.create(epoch_path(slot))

    async def _register(self, store: MetadataStore) -> None:
        """Create this broker's ephemeral node (waiting out a previous session's).

        At start-up, an id registered by a live broker is refused with
        :class:`ClusterConfigError` (see the module docstring).
        """
        path = f"{BROKERS}/{self.broker_id}"
        data = msgspec.msgpack.encode(self._broker.info)
        warned = False
        while True:
            try:
                # (touching /brokers: see _changes)
                await store.multi([Create(path, data, ephemeral=True), SetData(BROKERS, b"")])
                log.info("broker %d registered at %s", self.broker_id, self._broker.bootstrap)
                return
            except NodeExistsError:
                stat = await store.exists(path)
                if stat is not None and stat.ephemeral_owner == store.session_id:
                    return  # (a retry after a lost reply: it is ours)
            if not warned:
                warned = True
                other = await self._registration(store, path)
                # (After an expiry this broker serves already: it waits rather than stop.)
                if other is not None and self.sessions == 1 and await self._answers(other):
                    raise ClusterConfigError(
                        f"broker id {self.broker_id} is taken: the broker at {other.address} "
                        f"is registered with it and answers; give every broker of a cluster "
                        f"its own --broker-id"
                    )
                log.warning(
                    "broker id %d is registered by another ZooKeeper session at %s, where no "
                    "broker answers (this broker's previous session, not yet expired); waiting",
                    self.broker_id,
                    "?" if other is None else other.address,
                )
            async with store.watch_data(path) as snapshots:
                async for snap in snapshots:
                    if snap is None:
                        break

    async def _registration(self, store: MetadataStore, path: str) -> BrokerInfo | None:
        """The broker registered at ``path`` (None if gone, or not a registration)."""
        try:
            data, _stat = await store.get(path)
            return msgspec.msgpack.decode(data, type=BrokerInfo)
        except (NoNodeError, msgspec.DecodeError):
            return None

    async def _answers(self, other: BrokerInfo) -> bool:
        """Whether a broker answers at ``other``'s address (within :data:`PROBE_TIMEOUT`).

        This broker's own address cannot be another's (it is bound here):
        a registration there is an old session of this broker. One stopped
        (SIGSTOP) does not answer: its session expires like a dead one's.
        """
        if (other.host, other.port) == tuple(self._broker.address):
            return False
        security = getattr(self._broker, "security", None)
        if security is not None and security.ssl_context is not None:
            return await _answers_tls(other)
        with trio.move_on_after(PROBE_TIMEOUT):
            try:
                async with open_connection(other.host, other.port) as conn:
                    await conn.request(MetadataRequest([]))
            except ConnectionClosedError:
                return False  # nothing listens there (or it hung up)
            except CoordError:
                return True  # a broker refusing Metadata (cut off from ZooKeeper) lives too
            return True
        return False

    # -- following ZooKeeper ------------------------------------------------------------

    async def _follow_session(self, store: MetadataStore) -> None:
        """Stop renewing members' leases while the connection to ZooKeeper is lost.

        While suspended this broker cannot know whether its session (and so
        its slots) still lives; if it expires, another broker loads the
        groups and fences their partitions for a member session from then.
        A member whose heartbeats go unanswered here drops its partitions one
        member session after its last accepted heartbeat, which is before
        that fence ends: ownership stays exclusive even when this broker is
        cut off from ZooKeeper but not from its members.
        """
        coordinators = self._broker.coordinator
        state = store.session_state
        while True:
            await state.wait_value(SessionState.SUSPENDED)
            coordinators.suspended = True
            log.warning(
                "broker %d: connection to ZooKeeper lost; refusing heartbeats until it is back",
                self.broker_id,
            )
            await state.wait_value(lambda s: s is not SessionState.SUSPENDED)
            coordinators.suspended = False
            if state.value is SessionState.CONNECTED:
                log.info("broker %d: connection to ZooKeeper is back", self.broker_id)

    async def _follow_brokers(
        self, store: MetadataStore, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Reread the live brokers whenever ``/brokers`` changes."""
        async with _changes(store, BROKERS) as next_children:
            while True:
                names = await next_children()
                live: dict[int, BrokerInfo] = {}
                for name in names:
                    with contextlib.suppress(NoNodeError):
                        data, _ = await _get(store, f"{BROKERS}/{name}")
                        try:
                            live[int(name)] = msgspec.msgpack.decode(data, type=BrokerInfo)
                        except (ValueError, msgspec.DecodeError):
                            log.warning("ignoring %s/%s: not a broker registration", BROKERS, name)
                if live != self.brokers:
                    log.info("broker %d: live brokers %s", self.broker_id, sorted(live))
                self.brokers = live
                self._view_changed()
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED

    async def _follow_holders(
        self, store: MetadataStore, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Reread who holds each slot whenever ``/coordinators`` changes."""
        async with _changes(store, COORDINATORS) as next_children:
            while True:
                names = await next_children()
                holders: dict[int, int] = {}
                for name in names:
                    with contextlib.suppress(NoNodeError, ValueError):  # (not ours: ignored)
                        data, _ = await _get(store, coordinator_path(int(name)))
                        holders[int(name)] = int(data)
                self.holders = holders
                for slot, holder in list(self.held.items()):
                    if holders.get(slot, self.broker_id) != self.broker_id:
                        log.warning(
                            "broker %d: slot %d is held by broker %d now; stepping down",
                            self.broker_id,
                            slot,
                            holders[slot],
                        )
                        self._drop(holder)
                self._view_changed()
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED

    async def _follow_topics(
        self, store: MetadataStore, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Replay topics made or grown anywhere (every topic write touches the topics root)."""
        topics = self._broker.topics
        first = True
        async with store.watch_data(TOPICS) as snapshots:
            async for _ in snapshots:
                names = await _children(store, TOPICS)
                for name in names:
                    try:
                        data, _stat = await _get(store, topic_path(name))
                    except NoNodeError:  # deleted meanwhile: the next snapshot says so
                        continue
                    self._replay_topic(name, data)
                for name in sorted(set(topics.partitions) - set(names)):  # deleted
                    self._broker.writer.forget_paths({topic_path(name)})
                    topics.replay(TopicTombstone(name))
                if first:  # every topic there is known: the logs of any other are stale
                    await self._broker.logs.set_aside(topics.partitions)
                    first = False
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED

    async def read_topics(self, names: list[str]) -> None:
        """Read topics from the store now, ahead of the watch (those that exist)."""
        broker = self._broker
        for name in names:
            try:
                data, _stat = await broker.store.get(topic_path(name))
            except (NoNodeError, ValueError):  # (no such topic; or a name no path can have)
                continue
            except StoreError as exc:
                log.info("broker %d: could not read topic %s: %s", self.broker_id, name, exc)
                return
            self._replay_topic(name, data)

    def _replay_topic(self, name: str, data: bytes) -> None:
        """Replay a topic's node as read from ZooKeeper; log (and skip) one that is not a topic.

        A node no broker of this version wrote (a newer broker's, or damaged
        by hand) must not stop this broker from following the others.
        """
        try:
            record = decode_record(data)
        except msgspec.DecodeError as exc:
            log.error(
                "broker %d: skipping %s: not a topic record this broker can read (%s)",
                self.broker_id,
                topic_path(name),
                exc,
            )
            return
        if isinstance(record, TopicRecord):
            self._broker.writer.add_existing_paths({topic_path(name)})
            self._broker.topics.replay(record)

    # -- slots ----------------------------------------------------------------------------

    async def _balance(self, store: MetadataStore) -> None:
        """Claim the vacant slots this broker should, and give up slots beyond its share."""
        vacant_since: dict[int, float] = {}
        while True:
            changed = self._changed
            now = trio.current_time()
            vacant_since = {
                s: vacant_since.get(s, now) for s in range(self.slots) if s not in self.holders
            }
            wake = math.inf
            for slot, holder_id in list(self.holders.items()):
                if holder_id == self.broker_id and slot not in self.held:
                    # Ours in ZooKeeper but served by no task (a load or a release that
                    # failed): give it up so that it is elected again. (A node of an old
                    # session of this broker id is left to expire with it.)
                    await _retrying(store, functools.partial(self._release, store, slot))
            if self.broker_id in self.brokers:
                for slot, claimant in claimants(self.brokers, self.holders, self.slots).items():
                    # (A slot may have fallen vacant during a release above: since now.)
                    overdue = vacant_since.setdefault(slot, now) + self._claim_grace
                    if claimant == self.broker_id or now >= overdue:
                        await self._claim(store, slot)
                    else:
                        wake = min(wake, overdue)
                wake = min(wake, await self._shed(store, changed))
            with trio.move_on_at(wake):
                await changed.wait()

    async def _shed(self, store: MetadataStore, changed: trio.Event) -> float:
        """Give up one slot if this broker is the :func:`shedder`; when to look again."""
        if shedder(self.brokers, self.holders, self.slots) != self.broker_id:
            return math.inf  # as even as it gets, or another broker's turn
        with trio.move_on_after(self._claim_grace):
            await changed.wait()
            return trio.current_time()  # the view moved: look again
        mine = sorted(s for s, b in self.holders.items() if b == self.broker_id)
        holder = self.held.get(mine[-1])
        if holder is not None and holder.service is not None:
            log.info(
                "broker %d: giving up slot %d (holding %d of %d slots with %d brokers)",
                self.broker_id,
                holder.slot,
                len(mine),
                self.slots,
                len(self.brokers),
            )
            self._drop(holder)
            await _retrying(store, lambda: self._release(store, holder.slot))
        return trio.current_time()

    async def _claim(self, store: MetadataStore, slot: int) -> None:
        me = str(self.broker_id).encode()
        try:
            results = await store.multi(
                [
                    Create(coordinator_path(slot), me, ephemeral=True),
                    SetData(epoch_path(slot), me),
                    SetData(COORDINATORS, b""),  # (see _changes)
                ]
            )
        except NodeExistsError:
            return  # another broker was quicker
        except StoreConnectionError as exc:
            # The claim may have been applied and only its answer lost: look.
            log.info("broker %d: claiming slot %d: %s", self.broker_id, slot, exc)
            epoch = await _retrying(store, lambda: self._won_meanwhile(store, slot))
            if epoch is None:
                return
        else:
            stat = results[1]
            assert isinstance(stat, Stat)
            epoch = stat.version
        self.holders[slot] = self.broker_id
        holder = SlotHolder(slot, epoch, trio.CancelScope())
        self.held[slot] = holder
        self._broker.coordinator.loading.add(slot)
        assert self._nursery is not None
        self._nursery.start_soon(self._serve_slot, store, holder)

    async def _won_meanwhile(self, store: MetadataStore, slot: int) -> int | None:
        """The epoch of ``slot`` if this session holds it, else None."""
        await _until_connected(store)
        stat = await store.exists(coordinator_path(slot))
        if stat is None or stat.ephemeral_owner != store.session_id:
            return None
        _data, epoch = await store.get(epoch_path(slot))  # (no one else can bump it now)
        return epoch.version

    async def _serve_slot(self, store: MetadataStore, holder: SlotHolder) -> None:
        """Load a won slot's groups (the replay of start-up), serve them until deposed."""
        broker = self._broker
        slot = holder.slot
        try:
            with holder.scope:
                writer = RecordWriter(
                    store,
                    existing_paths=set(),
                    replay=lambda record: service.replay(record),
                    current=lambda record: service.current(record),
                    guard=[Check(epoch_path(slot), holder.epoch)],
                )
                service = broker.new_coordinator_service(writer)
                try:
                    records, paths = await _retrying(
                        store,
                        lambda: load_records(
                            store,
                            topics=False,
                            groups=lambda g: broker.coordinator.slot_of(g) == slot,
                        ),
                    )
                    writer.add_existing_paths(paths)
                    for record in records:
                        service.replay(record, loading=True)
                    log.info(
                        "broker %d: coordinator of slot %d (epoch %d), %d group(s) loaded",
                        self.broker_id,
                        slot,
                        holder.epoch,
                        len(service.list_groups()),
                    )
                    async with trio.open_nursery() as nursery:
                        await nursery.start(writer.run)
                        await nursery.start(service.run)
                        holder.service, holder.writer = service, writer
                        broker.coordinator.services[slot] = service
                        broker.coordinator.loading.discard(slot)
                        await writer.fenced.wait()
                        log.warning(
                            "broker %d: a write for slot %d was fenced (another broker won it); "
                            "stepping down",
                            self.broker_id,
                            slot,
                        )
                        nursery.cancel_scope.cancel()
                    await _retrying(store, lambda: self._release(store, slot))
                finally:
                    service.detach()
        except StoreError as exc:
            log.warning("broker %d: lost slot %d: %s", self.broker_id, slot, exc)
        finally:
            self._drop(holder)

    async def _release(self, store: MetadataStore, slot: int) -> None:
        """Delete this session's node of ``slot`` if it still exists, so the slot is re-elected."""
        path = coordinator_path(slot)
        with contextlib.suppress(NoNodeError, BadVersionError):
            _data, stat = await store.get(path)
            if stat.ephemeral_owner == store.session_id:
                await store.delete(path, version=stat.version)

    def _drop(self, holder: SlotHolder) -> None:
        """Stop serving a slot at once (its groups' requests get NOT_COORDINATOR)."""
        coordinators = self._broker.coordinator
        if self.held.get(holder.slot) is holder:
            del self.held[holder.slot]
            if coordinators.services.get(holder.slot) is holder.service:
                coordinators.services.pop(holder.slot, None)
            coordinators.loading.discard(holder.slot)
            self._view_changed()  # (the balancer gives the slot up if its node is still ours)
        holder.scope.cancel()


@asynccontextmanager
async def _changes(
    store: MetadataStore, path: str
) -> AsyncIterator[Callable[[], Awaitable[list[str]]]]:
    """``next_children()``: the children of ``path``, at once and after each change since.

    A watch of the children alone can miss a handover: a node deleted and
    created again (a slot given up and won by another broker, a broker
    restarted with its id at another address) between two reads leaves the
    same names. Whoever creates a node here therefore also touches the
    parent's data in the same transaction, and this follows both watches.
    Changes coalesce; each call reads the children afresh.
    """
    changed = trio.Event()

    async def follow(watch: AbstractAsyncContextManager[AsyncIterator[object]]) -> None:
        async with watch as snapshots:
            async for _ in snapshots:
                changed.set()

    async def next_children() -> list[str]:
        nonlocal changed
        await changed.wait()
        changed = trio.Event()
        return await _children(store, path)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow, store.watch_children(path))
        nursery.start_soon(follow, store.watch_data(path))
        yield next_children
        nursery.cancel_scope.cancel()


async def _until_connected(store: MetadataStore) -> None:
    """Wait out a lost connection (an expired session raises at the next call instead)."""
    await store.session_state.wait_value(lambda s: s is not SessionState.SUSPENDED)
    await trio.sleep(0.05)


async def _retrying(store: MetadataStore, call: Callable[[], Awaitable[_T]]) -> _T:
    """``call()`` again after each lost connection (it must be safe to repeat)."""
    while True:
        try:
            return await call()
        except StoreConnectionError:
            await _until_connected(store)


async def _get(store: MetadataStore, path: str) -> tuple[bytes, Stat]:
    """``store.get`` that waits out a lost connection instead of raising."""
    while True:
        try:
            return await store.get(path)
        except StoreConnectionError:
            await _until_connected(store)


async def _children(store: MetadataStore, path: str) -> list[str]:
    """``store.children`` that waits out a lost connection instead of raising."""
    while True:
        try:
            return await store.children(path)
        except StoreConnectionError:
            await _until_connected(store)


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """A cluster as ZooKeeper has it (``trio-coord cluster status``)."""

    slots: int
    """How many coordinator slots groups hash onto."""
    brokers: list[BrokerInfo]
    """The live brokers, by id."""
    holders: dict[int, int]
    """slot → the id of the broker holding it (a vacant slot is missing)."""
    groups: dict[int | None, list[str]]
    """broker id → the groups it coordinates (None: those of vacant slots)."""

    def to_json(self) -> dict[str, object]:
        """``{"slots", "brokers": [{"broker_id", "address"}], "holders", "groups"}``.

        JSON keys are strings: groups of vacant slots are under ``"none"``.
        """
        return {
            "slots": self.slots,
            "brokers": [{"broker_id": b.broker_id, "address": b.address} for b in self.brokers],
            "holders": self.holders,
            "groups": {"none" if b is None else str(b): g for b, g in self.groups.items()},
        }


async def read_status(store: MetadataStore) -> ClusterStatus:
    """Read the live brokers, who holds each slot, and the groups of each holder."""
    data, _ = await store.get(CLUSTER)
    slots = msgspec.msgpack.decode(data, type=_ClusterConfig).slots
    brokers: list[BrokerInfo] = []
    for name in sorted(await store.children(BROKERS), key=int):
        with contextlib.suppress(NoNodeError):
            data, _ = await store.get(f"{BROKERS}/{name}")
            brokers.append(msgspec.msgpack.decode(data, type=BrokerInfo))
    holders: dict[int, int] = {}
    for name in await store.children(COORDINATORS):
        with contextlib.suppress(NoNodeError):
            data, _ = await store.get(coordinator_path(int(name)))
            holders[int(name)] = int(data)
    groups: dict[int | None, list[str]] = {}
    names = await store.children(GROUPS) if await store.exists(GROUPS) else []
    for group in names:
        groups.setdefault(holders.get(slot_of(group, slots)), []).append(group)
    return ClusterStatus(
        slots,
        brokers,
        dict(sorted(holders.items())),
        dict(sorted(groups.items(), key=lambda item: (item[0] is None, item[0] or 0))),
    )


def placement(member: ClusterMember) -> Callable[[], list[int]]:
    """The ids of the live brokers, for the topic manager to place partitions on."""
    return lambda: sorted(member.brokers)


async def _answers_tls(other: BrokerInfo) -> bool:
    """Whether a TLS listener answers a handshake at ``other``'s address (any answer: a
    broker that then wants a client certificate lives too; one SIGSTOPped says nothing)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with trio.move_on_after(PROBE_TIMEOUT):
        try:
            stream = await trio.open_tcp_stream(other.host, other.port)
        except OSError:
            return False  # nothing listens there
        wrapped = trio.SSLStream(stream, context, server_hostname=other.host)
        try:
            await wrapped.do_handshake()
        except trio.BrokenResourceError as exc:
            return isinstance(exc.__cause__, ssl.SSLError)  # (an alert: a TLS server spoke)
        finally:
            await trio.aclose_forcefully(wrapped)
        return True
    return False
