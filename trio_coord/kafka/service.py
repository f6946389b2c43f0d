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
from typing import TYPE_CHECKING, Protocol

from ..log import LogCorruptError, PartitionLog
from ..protocol.messages import (
    DeleteOffsetsRequest,
    GroupDescription,
    GroupSummary,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    OffsetCommitRequest,
    PartitionOffset,
    TopicInfo,
    TopicPartition,
)

if TYPE_CHECKING:
    from ..broker.group import GroupRunner, MemberLink

__all__ = ["GroupCoordination", "KafkaLimits", "KafkaNode", "KafkaService", "Logs", "Topics"]


@dataclass(frozen=True, slots=True)
class KafkaNode:
    """A broker as Kafka clients see it: its id and its Kafka listener's address."""

    node_id: int
    host: str
    port: int
    rack: str = ""
    """Its ``--rack`` ("": none; Metadata then says null)."""


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
    consumer_session_timeout: float = 45.0
    """A KIP-848 member's session timeout (the broker's, as in Kafka)."""
    consumer_heartbeat_interval: float = 0.5
    """A KIP-848 member's heartbeat interval (told in every heartbeat answer)."""
    max_rebalance_timeout: float = 300.0
    """A KIP-848 member's rebalance timeout (its max.poll.interval.ms) is capped at this."""


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


class GroupCoordination(Protocol):
    """The group engine's coordinators (``broker.coordinator.Coordinators`` satisfies it).

    Each call is routed to the coordinator of the group, and raises
    NOT_COORDINATOR (or COORDINATOR_NOT_AVAILABLE) where this broker is not it.
    """

    async def join(self, request: JoinGroupRequest, conn: MemberLink) -> JoinGroupResponse:
        """Admit a member reached through ``conn`` (a per-member link for Kafka members)."""
        ...

    def heartbeat(self, request: HeartbeatRequest) -> None:
        """Accept a heartbeat or raise the fencing error."""
        ...

    async def leave(self, request: LeaveGroupRequest) -> None:
        """A member leaves."""
        ...

    async def commit(self, request: OffsetCommitRequest) -> None:
        """Durably commit offsets."""
        ...

    async def delete_offsets(self, request: DeleteOffsetsRequest) -> None:
        """Forget offsets of partitions no member consumes."""
        ...

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> list[PartitionOffset]:
        """Committed offsets (those that exist)."""
        ...

    def list_groups(self) -> list[GroupSummary]:
        """The groups this broker coordinates."""
        ...

    def describe_group(self, group_id: str) -> GroupDescription:
        """One group (GROUP_ID_NOT_FOUND if none)."""
        ...

    async def delete_group(self, group_id: str) -> None:
        """Delete an empty group and its offsets."""
        ...

    def runner(self, group_id: str) -> GroupRunner | None:
        """The engine of a group coordinated here (None: none here)."""
        ...

    def check_owner(self, group_id: str, member_id: str, principal: str) -> None:
        """AuthorizationError unless ``principal`` joined as ``member_id``."""
        ...

    def connection_lost(self, conn: MemberLink) -> None:
        """Remove the members reached through ``conn`` (a failure, not a leave)."""
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

    def count_fetched(self, topic: str, nbytes: int, records: int) -> None:
        """Count record bytes and records served to a Kafka fetch (the broker's metrics)."""
        ...

    def kafka_coordinator(self, group: str) -> KafkaNode | None:
        """The broker coordinating ``group``, or None while no broker does."""
        ...

    @property
    def coordinator(self) -> GroupCoordination:
        """The group engine (the consumer-group APIs)."""
        ...

    async def read_topics(self, names: list[str]) -> None:
        """Make sure topics just created by another broker of the cluster are known here."""
        ...
