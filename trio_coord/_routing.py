"""The routing policy of every client: where a request goes, what an error means; no I/O.

The Trio clients (``client/_cluster.ClusterView``, ``client/_bootstrap.Bootstrap``)
and the blocking Spark client (``spark/_client.BlockingClient``) both keep a
:class:`Routing`: what Metadata said about brokers and topics, and the leaders
a StartFetchers named. A lookup (:meth:`Routing.leader_of`,
:meth:`Routing.group_by_leader`, :func:`coordinator_of`) answers from what is
known, or returns (does not raise) the retriable error that says why it cannot
yet: the client then asks Metadata once, looks again, and raises that error if
the fresh answer does not say either (its caller backs off and retries).
:func:`classify` says what an error answer means for the next try, and every
error a user may see about routing is worded here, once. Each client does its
own I/O (async or blocking sockets); the decisions are made here. The two
rules of where a client starts and where a keyed record goes
(:func:`parse_bootstrap`, :func:`partition_for_key`) live here too: Spark's
Python workers need them and must not import Trio or the Trio clients to get
them (see :mod:`trio_coord._lazy`); :mod:`trio_coord.client` re-exports them.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Iterable, Sequence

import msgspec

from .protocol.errors import (
    BrokerShuttingDownError,
    ConnectionClosedError,
    CoordError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    NotLeaderForPartitionError,
    UnknownTopicError,
)
from .protocol.messages import BrokerInfo, MetadataResponse, TopicInfo, TopicPartition

__all__ = [
    "Action",
    "Address",
    "Routing",
    "classify",
    "coordinator_of",
    "parse_bootstrap",
    "partition_for_key",
]

Address = tuple[str, int]


class Action(enum.Enum):
    """What a client does after an error answer (or a failed request), before trying again."""

    FAIL = "fail"
    """Not retriable: raise it to the caller, whose input or setting it is about."""
    MOVED = "moved"
    """The leader or coordinator asked is not (or no longer) the one: forget where the request
    went (the topic's leaders; a coordinator is looked up afresh anyway), back off, look it up
    again and send it there."""
    RECONNECT = "reconnect"
    """The connection is gone: back off and connect again to the same broker; if that broker
    cannot be reached, ask Metadata again (it may have died, or come back at another address)."""
    RETRY = "retry"
    """Retriable where it is (a request timed out, a rebalance, a full broker): back off and
    send it again to the same broker."""


_MOVED = (
    NotLeaderForPartitionError,
    NotCoordinatorError,
    CoordinatorNotAvailableError,
    BrokerShuttingDownError,
)


def classify(error: BaseException) -> Action:
    """What to do about ``error`` (a :class:`CoordError`; anything else fails)."""
    if not isinstance(error, CoordError) or not error.retriable:
        return Action.FAIL
    if isinstance(error, _MOVED):
        return Action.MOVED
    if isinstance(error, ConnectionClosedError):
        return Action.RECONNECT
    return Action.RETRY


def _reached(broker: BrokerInfo, answered: Address | None) -> BrokerInfo:
    """``broker`` at ``answered``, the address the client reached it at, if known."""
    if answered is None or (broker.host, broker.port) == answered:
        return broker
    return msgspec.structs.replace(broker, host=answered[0], port=answered[1])


def coordinator_of(
    response: MetadataResponse, group: str, answered: Address | None = None
) -> BrokerInfo | CoordinatorNotAvailableError:
    """The coordinator of ``group`` that a Metadata ``response`` (asked with ``group``) names,
    or the retriable error to raise if it names none.

    ``answered`` is the address the client reached the answering broker at:
    a response that lists one broker comes from that broker, so a
    coordinator it names as itself is reached there (not at the address it
    advertises, which may be a wildcard such as 0.0.0.0).
    """
    coordinator = response.coordinator
    if coordinator is None:
        return CoordinatorNotAvailableError(
            f"the brokers that answered named no coordinator of group {group!r} yet "
            "(is one being elected? see the brokers' logs)"
        )
    if [b.broker_id for b in response.brokers] == [coordinator.broker_id]:
        return _reached(coordinator, answered)
    return coordinator


class Routing:
    """Known brokers, topics and partition leaders, and where a request goes; see the module
    docstring."""

    def __init__(self) -> None:
        self.brokers: dict[int, BrokerInfo] = {}
        """The live brokers the last Metadata listed (and those a StartFetchers named), by id."""
        self._topics: dict[str, TopicInfo] = {}
        self._hints: dict[TopicPartition, int] = {}  # leaders a StartFetchers named
        self._answerer: BrokerInfo | None = None  # the broker that answered Metadata

    # -- learning and forgetting -----------------------------------------------------------

    def learn(self, response: MetadataResponse, answered: Address | None = None) -> None:
        """Take in a Metadata ``response``, answered by the broker at ``answered`` (if known).

        The live brokers are replaced, the topics it lists are updated, and
        the StartFetchers leaders of those topics dropped (the metadata is
        fresher). A response that lists one broker comes from it: that
        broker is reached at ``answered``, where the client reached it.
        """
        brokers = response.brokers
        if len(brokers) == 1:
            brokers = [_reached(brokers[0], answered)]
            self._answerer = brokers[0]
        elif brokers:  # (a cluster, which names every leader)
            self._answerer = brokers[0] if answered is None else BrokerInfo(-1, *answered)
        else:  # no live broker known: nothing to send to, however it answered
            self._answerer = None
        self.brokers = {b.broker_id: b for b in brokers}
        for info in response.topics:
            self._topics[info.name] = info
        if self._hints:
            named = {info.name for info in response.topics}
            self._hints = {tp: b for tp, b in self._hints.items() if tp.topic not in named}

    def learn_leaders(
        self, brokers: Iterable[BrokerInfo], leaders: dict[TopicPartition, int]
    ) -> None:
        """Leaders (and their brokers) a StartFetchers named: a lookup of them needs no
        Metadata call until a refresh of their topic or :meth:`forget` replaces them.
        A leader of -1 (not live when the coordinator looked) is not taken."""
        for broker in brokers:
            self.brokers.setdefault(broker.broker_id, broker)
        self._hints.update((tp, b) for tp, b in leaders.items() if b >= 0)

    def forget(self, topic: str) -> None:
        """Drop what is known about ``topic``: its next lookup asks Metadata again."""
        self._topics.pop(topic, None)
        if self._hints:
            self._hints = {tp: b for tp, b in self._hints.items() if tp.topic != topic}

    def forget_all(self) -> None:
        """Drop what is known about every topic (a broker could not be reached: the leaders
        it held, and its address, may have moved)."""
        self._topics.clear()
        self._hints.clear()

    # -- looking up ----------------------------------------------------------------------------

    def topic(self, name: str) -> TopicInfo | None:
        """What Metadata last said about topic ``name`` (None: not asked yet, or forgotten)."""
        return self._topics.get(name)

    @property
    def topics(self) -> list[str]:
        """The topics known, sorted (what a refresh of everything asks about)."""
        return sorted(self._topics)

    def leader_of(self, tp: TopicPartition) -> BrokerInfo | CoordError:
        """The broker holding ``tp``, or the error (returned, not raised) saying why it is not
        known: ask Metadata about ``tp.topic`` and look again; raise the error if it stays.

        - the topic is not known: UnknownTopicError (Metadata raises the real one,
          UNKNOWN_TOPIC, if it does not exist);
        - ``tp.partition`` is not one of the topic's: UnknownTopicError (it may have grown);
        - the leader named is not among the live brokers (a broker between
          ZooKeeper sessions): NotLeaderForPartitionError, retriable;
        - no leader named (every partition is on the broker that answered), and no
          broker answered with live brokers: CoordinatorNotAvailableError, retriable.
        """
        hinted = self._hints.get(tp)
        if hinted is not None and hinted in self.brokers:
            return self.brokers[hinted]
        info = self._topics.get(tp.topic)
        if info is None:
            return UnknownTopicError(f"topic {tp.topic!r} is not known to this client yet")
        if not 0 <= tp.partition < info.partitions:
            return UnknownTopicError(
                f"topic {tp.topic!r} has partitions 0..{info.partitions - 1}; "
                f"partition {tp.partition} does not exist"
            )
        if info.leaders and tp.partition < len(info.leaders):
            leader = info.leaders[tp.partition]
            broker = self.brokers.get(leader)
            if broker is None:
                return NotLeaderForPartitionError(
                    f"the leader of {tp} (broker {leader}) is not among the live brokers "
                    "the metadata lists yet; retry"
                )
            return broker
        if self._answerer is None:
            return CoordinatorNotAvailableError(
                "the broker that answered Metadata knows no live brokers yet "
                "(a cluster broker between ZooKeeper sessions); retry"
            )
        return self._answerer

    def group_by_leader(
        self, tps: Iterable[TopicPartition]
    ) -> tuple[dict[BrokerInfo, list[TopicPartition]], dict[TopicPartition, CoordError]]:
        """``tps`` (sorted, once each) by the broker holding them, and those whose leader is
        not known with the error :meth:`leader_of` gave (ask Metadata about their topics,
        then group again)."""
        grouped: dict[BrokerInfo, list[TopicPartition]] = {}
        unknown: dict[TopicPartition, CoordError] = {}
        for tp in sorted(set(tps)):
            found = self.leader_of(tp)
            if isinstance(found, CoordError):
                unknown[tp] = found
            else:
                grouped.setdefault(found, []).append(tp)
        return grouped, unknown


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[Address]:
    """Parse ``"h1:p1,h2:p2"`` (or a list of ``"h:p"``) into addresses.

    Raises ValueError with the offending entry if one is not ``host:port``.
    """
    entries = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses: list[Address] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"bootstrap entry {entry!r} is not host:port (for example 127.0.0.1:9092)"
            )
        addresses.append((host.strip("[]"), int(port)))
    if not addresses:
        raise ValueError("the bootstrap list is empty; give at least one broker as host:port")
    return addresses


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition a keyed record goes to: CRC-32 of the key modulo the partition count."""
    return zlib.crc32(key) % partitions
