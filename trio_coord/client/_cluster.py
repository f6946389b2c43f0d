"""The data clients' view of the cluster: topic metadata, partition leaders, and pooled connections.

A :class:`ClusterView` lives in a client's nursery. It keeps what Metadata
said about topics (partition counts, the broker holding each partition) in
the routing policy every client shares (:class:`trio_coord._routing.Routing`,
which decides where a request goes and when to ask Metadata again), asking
Metadata when the policy cannot say; and it keeps one multiplexed connection
per broker, opened on first use and reopened after it breaks, so that a
producer or a consumer's fetchers share it however many partitions they talk
to.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

import trio

from .._routing import Routing
from ..protocol.connection import Connection
from ..protocol.errors import (
    ConnectionClosedError,
    CoordError,
    RequestTimedOutError,
    UnknownTopicError,
)
from ..protocol.framing import DEFAULT_MAX_FRAME_SIZE
from ..protocol.messages import BrokerInfo, MetadataRequest, TopicInfo, TopicPartition
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
        self._routing = Routing()  # what is known of brokers, topics and leaders
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
            self._routing.learn(*await self._bootstrap.metadata(request))

    @property
    def max_frame_size(self) -> int:
        """The largest frame this client's connections read (answers included)."""
        return self._max_frame_size

    def learn(self, brokers: list[BrokerInfo], leaders: dict[TopicPartition, int]) -> None:
        """Leaders (and their brokers' addresses) a StartFetchers named: fetching them needs
        no Metadata call. A NotLeaderForPartition or a refresh replaces them."""
        self._routing.learn_leaders(brokers, leaders)

    def forget(self, topic: str) -> None:
        """Drop what is cached about ``topic`` (the next lookup asks again)."""
        self._routing.forget(topic)

    async def topic(self, name: str) -> TopicInfo:
        """The topic's metadata (from the cache, or asked for); UnknownTopicError if none."""
        info = self._routing.topic(name)
        if info is None:
            await self.refresh([name])
            info = self._routing.topic(name)
            if info is None:  # pragma: no cover - Metadata answers UNKNOWN_TOPIC first
                raise UnknownTopicError(f"topic {name!r} does not exist")
        return info

    def cached_partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, if known without asking (the hot path)."""
        info = self._routing.topic(topic)
        return None if info is None else info.partitions

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has."""
        return (await self.topic(topic)).partitions

    async def leader(self, tp: TopicPartition) -> BrokerInfo:
        """The broker holding ``tp``, as the routing policy (``_routing.Routing.leader_of``)
        finds it.

        What is not known from the cache (a topic not asked about, a partition
        it did not have, a leader not among the live brokers, no live broker
        at all) is asked of Metadata once; if the fresh answer does not say
        either, the policy's error is raised: UnknownTopicError, or a
        retriable one (NotLeaderForPartition, CoordinatorNotAvailable) for
        the caller to retry, rather than sending to a broker that does not
        hold ``tp``.
        """
        found = self._routing.leader_of(tp)
        if isinstance(found, CoordError):
            await self.refresh([tp.topic])
            found = self._routing.leader_of(tp)
            if isinstance(found, CoordError):
                raise found
        return found

    async def by_leader(
        self, tps: Iterable[TopicPartition]
    ) -> dict[BrokerInfo, list[TopicPartition]]:
        """``tps`` (sorted, once each) by the broker holding them; like :meth:`leader`, asks
        Metadata once about the topics not known from the cache, then raises the first
        partition's error if a leader is still not known."""
        tps = set(tps)  # (looked through twice)
        grouped, unknown = self._routing.group_by_leader(tps)
        if unknown:
            await self.refresh(sorted({tp.topic for tp in unknown}))
            grouped, unknown = self._routing.group_by_leader(tps)
            if unknown:
                raise next(iter(unknown.values()))
        return grouped

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
                request = MetadataRequest(self._routing.topics)
                self._routing.learn(*await self._bootstrap.metadata_once(request))
            moved = self._routing.brokers.get(broker.broker_id)
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
