"""The data clients' view of the cluster: topic metadata, partition leaders, and pooled connections.

A :class:`ClusterView` lives in a client's nursery. It caches what Metadata
said about topics (partition counts, the broker holding each partition) and
refreshes it when a broker answers UNKNOWN_TOPIC or NOT_LEADER_FOR_PARTITION;
and it keeps one multiplexed connection per broker, opened on first use and
reopened after it breaks, so that a producer or a consumer's fetchers share
it however many partitions they talk to.
"""

from __future__ import annotations

import contextlib
import logging

import trio

from ..protocol.connection import Connection
from ..protocol.errors import (
    ConnectionClosedError,
    CoordError,
    CoordinatorNotAvailableError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
    UnknownTopicError,
)
from ..protocol.framing import DEFAULT_MAX_FRAME_SIZE
from ..protocol.messages import (
    BrokerInfo,
    MetadataRequest,
    MetadataResponse,
    TopicInfo,
    TopicPartition,
)
from ._bootstrap import Bootstrap

__all__ = ["ClusterView"]

log = logging.getLogger(__name__)

_REFRESH_TIMEOUT = 5.0
"""How long a failed connection waits for fresh metadata before it reports the failure."""


class ClusterView:
    """Topic metadata and broker connections for one client; see the module docstring."""

    def __init__(
        self,
        bootstrap: Bootstrap,
        nursery: trio.Nursery,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        name: str = "client",
        timeout: float = 60.0,
        timeout_setting: str = "",
    ) -> None:
        self._bootstrap = bootstrap
        self._timeout = timeout  # how long one metadata lookup may retry
        self._timeout_setting = timeout_setting  # the option that set it, for the error
        self._nursery = nursery
        self._max_frame_size = max_frame_size
        self._name = name
        self._topics: dict[str, TopicInfo] = {}
        self._brokers: dict[int, BrokerInfo] = {}
        self._hints: dict[TopicPartition, int] = {}  # leaders a StartFetchers named
        self._conns: dict[tuple[str, int], Connection] = {}
        self._connecting: dict[tuple[str, int], trio.Lock] = {}

    # -- metadata ----------------------------------------------------------------------

    async def refresh(self, topics: list[str]) -> None:
        """Ask for fresh metadata about ``topics`` (retrying while no broker answers).

        Raises RequestTimedOutError, naming the brokers it could not reach,
        once no broker has answered for the view's ``timeout``.
        """
        request = MetadataRequest(sorted(set(topics)))
        with self._bootstrap.fail_after(self._timeout, "no broker answered", self._timeout_setting):
            self._update(await self._bootstrap.metadata(request))

    def _update(self, response: MetadataResponse) -> None:
        self._brokers = {b.broker_id: b for b in response.brokers}
        for info in response.topics:
            self._topics[info.name] = info
        if self._hints:  # the metadata is fresher than what a StartFetchers said
            named = {info.name for info in response.topics}
            self._hints = {tp: b for tp, b in self._hints.items() if tp.topic not in named}

    def learn(self, brokers: list[BrokerInfo], leaders: dict[TopicPartition, int]) -> None:
        """Leaders (and their brokers' addresses) a StartFetchers named: fetching them needs
        no Metadata call. A NotLeaderForPartition or a refresh replaces them."""
        for broker in brokers:
            self._brokers.setdefault(broker.broker_id, broker)
        self._hints.update((tp, b) for tp, b in leaders.items() if b >= 0)

    def forget(self, topic: str) -> None:
        """Drop what is cached about ``topic`` (the next lookup asks again)."""
        self._topics.pop(topic, None)
        if self._hints:
            self._hints = {tp: b for tp, b in self._hints.items() if tp.topic != topic}

    async def topic(self, name: str) -> TopicInfo:
        """The topic's metadata (from the cache, or asked for); UnknownTopicError if none."""
        info = self._topics.get(name)
        if info is None:
            await self.refresh([name])
            info = self._topics.get(name)
            if info is None:  # pragma: no cover - Metadata answers UNKNOWN_TOPIC first
                raise UnknownTopicError(f"topic {name!r} does not exist")
        return info

    def cached_partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, if known without asking (the hot path)."""
        info = self._topics.get(topic)
        return None if info is None else info.partitions

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has."""
        return (await self.topic(topic)).partitions

    async def leader(self, tp: TopicPartition) -> BrokerInfo:
        """The broker holding ``tp``.

        If the metadata names a leader that is not among its live brokers (or
        lists no live brokers at all, as a cluster broker between ZooKeeper
        sessions does), it is asked for again once; if it still does not say,
        a retriable error (NotLeaderForPartition, CoordinatorNotAvailable) is
        raised for the caller to retry, rather than sending to a broker that
        does not hold ``tp``.
        """
        hinted = self._hints.get(tp)
        if hinted is not None and hinted in self._brokers:
            return self._brokers[hinted]
        broker = await self._known_leader(tp)
        if broker is None:
            await self.refresh([tp.topic])
            broker = await self._known_leader(tp)
        if broker is not None:
            return broker
        info = await self.topic(tp.topic)
        if info.leaders and tp.partition < len(info.leaders):
            raise NotLeaderForPartitionError(
                f"the leader of {tp} (broker {info.leaders[tp.partition]}) is not among the "
                "live brokers the metadata lists yet; retry"
            )
        raise CoordinatorNotAvailableError(
            "the broker that answered Metadata knows no live brokers yet "
            "(a cluster broker between ZooKeeper sessions); retry"
        )

    async def _known_leader(self, tp: TopicPartition) -> BrokerInfo | None:
        info = await self.topic(tp.topic)
        if not 0 <= tp.partition < info.partitions:
            await self.refresh([tp.topic])  # it may have grown since we asked
            info = await self.topic(tp.topic)
            if not 0 <= tp.partition < info.partitions:
                raise UnknownTopicError(
                    f"topic {tp.topic!r} has partitions 0..{info.partitions - 1}; "
                    f"partition {tp.partition} does not exist"
                )
        if info.leaders and tp.partition < len(info.leaders):
            return self._brokers.get(info.leaders[tp.partition])
        # No leader named: every partition is on the broker that answered (one broker).
        return next(iter(self._brokers.values()), None)

    # -- connections -------------------------------------------------------------------

    async def connection(self, broker: BrokerInfo) -> Connection:
        """The open connection to ``broker``, connecting (once) if there is none.

        If the broker cannot be reached, the metadata is refreshed (one pass
        over the bootstrap brokers), and if it now gives that broker id
        another address (a broker of a cluster restarted elsewhere), that
        address is tried; otherwise the error is raised for the caller to
        retry.
        """
        try:
            return await self._connect(broker)
        except (ConnectionClosedError, RequestTimedOutError):
            with contextlib.suppress(CoordError), trio.move_on_after(_REFRESH_TIMEOUT):
                self._update(
                    await self._bootstrap.metadata_once(MetadataRequest(sorted(self._topics)))
                )
            moved = self._brokers.get(broker.broker_id)
            if moved is None or (moved.host, moved.port) == (broker.host, broker.port):
                raise
        return await self._connect(moved)

    async def _connect(self, broker: BrokerInfo) -> Connection:
        address = (broker.host, broker.port)
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        lock = self._connecting.setdefault(address, trio.Lock())
        async with lock:
            conn = self._conns.get(address)
            if conn is not None and not conn.closed:
                return conn
            stream = await self._bootstrap.connect(address)  # (within request_timeout)
            conn = Connection(
                stream,
                max_frame_size=self._max_frame_size,
                name=f"{self._name}→{broker.address}",
            )
            await self._nursery.start(conn.serve)
            self._conns[address] = conn
            return conn

    async def aclose(self) -> None:
        """Close every connection."""
        for conn in list(self._conns.values()):
            await conn.aclose()
        self._conns.clear()
