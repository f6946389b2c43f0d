"""What the Kafka front end needs from a broker: one small interface (a typing.Protocol).

Its one job is to name the broker services the Kafka handlers use, so that
they depend on this interface and not on :class:`~trio_coord.broker.Broker`
(a test double, or another embedding, plugs in without the rest of the
broker): the topics (:class:`Topics`), the partition logs (:class:`Logs`),
the broker's identity and limits, the Kafka listeners of the cluster's
brokers and the coordinator of a group. The broker satisfies it
structurally; nothing here imports the broker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..log import LogCorruptError, PartitionLog
from ..protocol.messages import TopicInfo

__all__ = ["KafkaLimits", "KafkaNode", "KafkaService", "Logs", "Topics"]


@dataclass(frozen=True, slots=True)
class KafkaNode:
    """A broker as Kafka clients see it: its id and its Kafka listener's address."""

    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class KafkaLimits:
    """Every bound the Kafka front end enforces (see ``docs/kafka.md``)."""

    max_request_bytes: int = 100 * 1024 * 1024
    """A request frame larger than this closes its connection before it is read."""
    max_in_flight: int = 64
    """Requests one connection may have in flight (the reader waits beyond)."""
    max_connection_bytes: int = 256 * 1024 * 1024
    """Bytes one connection's requests (and fetch answers) may hold while handled."""
    max_batch_bytes: int = 1024 * 1024
    """The largest record batch a producer may send (Kafka's message.max.bytes)."""
    max_fetch_bytes: int = 50 * 1024 * 1024
    """The most one fetch answer carries (Kafka's fetch.max.bytes)."""
    max_connections: int = 10_000
    connections_max_idle: float = 600.0
    """A connection with nothing in flight that sent nothing for this long is closed."""
    request_read_timeout: float = 30.0
    """A frame must arrive whole within this long of its first byte."""
    max_wait_ms: int = 30_000
    """The longest a fetch may long-poll, whatever it asks for."""
    topic_configs: tuple[tuple[str, str], ...] = ()
    """What DescribeConfigs reports for every topic (read-only: the broker's settings)."""
    broker_configs: tuple[tuple[str, str], ...] = ()
    """What DescribeConfigs reports for the broker."""


class Topics(Protocol):
    """The topics of the broker (``broker.topics.TopicManager`` satisfies it)."""

    partitions: dict[str, int]

    def leader(self, topic: str, partition: int) -> int | None:
        """The broker holding a partition (None: this one, on a single broker)."""
        ...

    async def create_topic(self, name: str, partitions: int) -> TopicInfo:
        """Create a topic (raises a CoordError with the reason)."""
        ...

    async def add_partitions(self, name: str, total: int) -> TopicInfo:
        """Grow a topic to ``total`` partitions."""
        ...

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and its logs."""
        ...


class Logs(Protocol):
    """The partition logs (``log.LogManager`` satisfies it)."""

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of a partition, if it has one yet."""
        ...

    async def create(self, topic: str, partition: int) -> PartitionLog:
        """The log of a partition, created if needed."""
        ...

    def damage(self, topic: str, partition: int) -> LogCorruptError | None:
        """Why a partition was refused at start-up, or None."""
        ...

    def on_advance(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(topic, partition)`` whenever a log's end advances."""
        ...


class KafkaService(Protocol):
    """The broker, as the Kafka handlers use it."""

    @property
    def broker_id(self) -> int:
        """This broker's id (the Kafka node id)."""
        ...

    @property
    def cluster_id(self) -> str:
        """The id Metadata and DescribeCluster report."""
        ...

    @property
    def topics(self) -> Topics:
        """The topics."""
        ...

    @property
    def logs(self) -> Logs:
        """The partition logs."""
        ...

    @property
    def shutting_down(self) -> bool:
        """True once the broker refuses new work."""
        ...

    def kafka_nodes(self) -> list[KafkaNode]:
        """Every live broker with a Kafka listener (in a cluster: as ZooKeeper last said)."""
        ...

    def kafka_coordinator(self, group: str) -> KafkaNode | None:
        """The broker coordinating ``group``, or None while no broker does."""
        ...

    async def read_topics(self, names: list[str]) -> None:
        """Make sure topics just created by another broker of the cluster are known here."""
        ...
