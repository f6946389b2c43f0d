"""The broker: its configuration, its nursery tree, and ``open_broker``.

``open_broker`` builds the tree of the design and tears it down gracefully::

    broker nursery
    ├── store session (the embedded store in the data dir, or ZooKeeper)
    ├── partition logs (background flush and retention)
    ├── record writer (group commit of every durable record)
    ├── coordinator service → one group task per group
    ├── parking → one task for every idle connection, and revived readers
    └── listener → one reader task per connection (until it is idle: parked)

On start it loads every record from the store and replays it (topics, group
generations, offsets), so a restarted broker continues where it stopped. On
exit it stops accepting connections, refuses new work with
BROKER_SHUTTING_DOWN, lets queued writes become durable (bounded by
``shutdown_grace``), then cancels the rest. A broker of a cluster on
ZooKeeper also runs its :class:`~.cluster.ClusterMember` (registration,
slot elections, the coordinator services of the slots it holds).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import resource
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from .._aio import unwrap_lone_exception
from ..core.assignors import Assignor, make_registry
from ..core.group import GroupLimits
from ..core.records import Record, TopicRecord, TopicTombstone
from ..core.validation import MAX_NAME_LENGTH as MAX_RACK_LENGTH
from ..kafka.service import KafkaLimits, KafkaNode
from ..log import LogConfig, LogManager, open_log_manager
from ..protocol._parking import AVAILABLE as PARKING_AVAILABLE
from ..protocol._parking import Parking
from ..protocol.budget import ByteBudget
from ..protocol.connection import Connection, os_reason
from ..protocol.errors import CoordinatorNotAvailableError, ErrorCode, RequestTimedOutError
from ..protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameCodec
from ..protocol.messages import (
    BrokerInfo,
    Goodbye,
    MetadataRequest,
    MetadataResponse,
    TopicInfo,
    TopicPartition,
)
from ..protocol.sizing import page
from ..security.acl import ANONYMOUS
from ..security.quota import Quotas
from ..security.server import ServerSecurity
from ..security.server import check_settings as check_security_settings
from ..store import open_embedded_store, open_zookeeper_store
from ..store.base import MetadataStore, SetData
from ..store.zookeeper import require_zk_url
from ._gc import CollectorKeeper
from .cluster import ClusterMember, placement
from .coordinator import CoordinatorConfig, Coordinators, CoordinatorService
from .events import EventCallback, GroupEvent, RebalanceRestarted, Stable
from .handler import BrokerHandler
from .partitions import PartitionService
from .persistence import TOPICS, RecordWriter, load_records
from .topics import TopicManager

if TYPE_CHECKING:
    from ..kafka.listener import KafkaListener
    from .metrics import BrokerMetrics

__all__ = ["Broker", "BrokerConfig", "connection_limit", "open_broker"]

log = logging.getLogger(__name__)

_DEFAULT_MAX_CONNECTIONS = 10_000
_MIN_CONNECTIONS = 64
"""The default limit shrinks to fit ``ulimit -n``, but not below this."""
_RESERVED_FDS = 1024
"""File descriptors kept for everything but connections: logs, the store, listeners."""
_REFUSAL_GRACE = 1.0
_REFUSAL_LOG_INTERVAL = 10.0
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""accept() errors that mean "not now" (out of descriptors or memory): retried."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything a broker can be told; every field has a sane default.

    Times are in seconds. ``min_session_timeout``/``max_session_timeout``
    bound what consumers may ask for; ``group_retention`` is how long an
    empty group without offsets is kept; ``position_flush_interval`` is how
    often positions carried by heartbeats (auto-commit) are made durable;
    ``max_in_flight`` bounds concurrent requests per connection and so,
    with ``max_frame_size``, its memory. ``max_batch_bytes`` is the largest
    record batch a producer may send (default: 512 KiB, or half of
    ``max_frame_size`` if that is less) and ``max_fetch_bytes`` the most one
    fetch answer carries (both within ``max_frame_size``); ``log`` holds the
    partition log's settings (segments, flush policy, retention);
    ``assignors`` adds assignors (see ``docs/assignment.md``) that members
    may name in their preference lists.
    """

    host: str = "127.0.0.1"
    port: int = 0
    broker_id: int = 0
    min_session_timeout: float = 1.0
    max_session_timeout: float = 300.0
    max_rebalance_timeout: float = 300.0
    """The longest rebalance timeout a member may ask for (Kafka has no bound; one rogue
    member that never answers would hold its group that long)."""
    offset_metadata_max_bytes: int = 4096
    """The most metadata one committed offset may carry (Kafka's offset.metadata.max.bytes)."""
    max_group_size: int = 1000
    initial_rebalance_delay: float = 0.1
    """A new group's first rebalance waits this long for more joins (each join re-arms it)."""
    max_partitions: int = 10_000
    group_retention: float = 600.0
    position_flush_interval: float = 1.0
    offsets_retention: float | None = 7 * 24 * 3600.0
    """How long an empty group's committed offsets are kept, counted from when it became
    empty (and from each offset's commit): Kafka's offsets.retention.minutes. None: kept
    until the group or its topic is deleted."""
    rebalance_retry_backoff: float = 1.0
    """A rebalance that failed (store outage, a leader's assignor error) is retried after
    this long, doubling per failure in a row up to ``rebalance_retry_backoff_max`` (a
    membership change retries at once)."""
    rebalance_retry_backoff_max: float = 30.0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_in_flight: int = 64
    max_connections: int | None = None
    """Connections at once; more are refused (RESOURCES_EXHAUSTED). None: 10,000, or
    fewer if the process's file-descriptor limit (``ulimit -n``) cannot hold that many."""
    max_connections_per_ip: int = 1000
    """Connections at once from one address; more are refused (RESOURCES_EXHAUSTED)."""
    connections_max_idle: float = 600.0
    """A connection with nothing in flight that sent nothing for this long is closed."""
    park_idle_connections: bool = True
    """An idle plaintext native connection gives up its task: one parking task watches
    every such socket and answers heartbeats itself (docs/architecture.md, "What a
    member costs"). False: a reader task per connection, always (so on an OS without
    epoll, such as macOS, whatever this says)."""
    request_read_timeout: float = 30.0
    """A frame must arrive whole within this long of its first byte, or its connection
    is closed (a slowloris peer holding half-sent frames)."""
    max_connection_bytes: int = 4 * DEFAULT_MAX_FRAME_SIZE
    """Bytes one connection's requests may hold while handled, answers included (a fetch
    counts its largest answer); its reader waits beyond that (the connection is muted)."""
    queued_max_request_bytes: int = 256 * DEFAULT_MAX_FRAME_SIZE
    """The same for all connections together (Kafka's queued.max.request.bytes)."""
    max_batch_bytes: int | None = None
    max_fetch_bytes: int = 16 * 1024 * 1024
    rack: str = ""
    """The rack (availability zone) this broker runs in ("": none). Kafka Metadata
    tells clients; the rack of a partition is its broker's, and the server
    assignors prefer giving members partitions of their own rack (KIP-881)."""
    kafka_port: int | None = None
    """The port of the Kafka listener (0: a free one; None: no Kafka listener). See
    docs/kafka.md."""
    kafka_max_request_bytes: int = 100 * 1024 * 1024
    """A Kafka request frame larger than this closes its connection before it is read
    (Kafka's socket.request.max.bytes)."""
    kafka_max_batch_bytes: int = 1024 * 1024 + 12
    """The largest record batch a Kafka producer may send (Kafka's message.max.bytes)."""
    kafka_consumer_session_timeout: float = 45.0
    """The session timeout of a Kafka consumer-protocol (KIP-848) member: the broker's,
    as Kafka's group.consumer.session.timeout.ms (the client does not choose it); held
    within ``min_session_timeout`` and ``max_session_timeout``."""
    kafka_consumer_heartbeat_interval: float = 0.5
    """How often a KIP-848 member heartbeats (Kafka's group.consumer.heartbeat.interval.ms,
    5 s there): a member learns a revocation or a new assignment at its next heartbeat,
    so this bounds how long a rebalance waits for each member."""
    shutdown_grace: float = 5.0
    log: LogConfig = field(default_factory=LogConfig)
    assignors: tuple[Assignor, ...] = ()
    """Assignors of the application's own, registered by name beside the built-in ones."""
    on_event: EventCallback | None = field(default=None, repr=False)
    """Observer of group events: typed structs (``trio_coord.broker.events``: Joined,
    Removed, Stable, ...), each with its ``kind``, ``group`` and ``time``."""
    coordinator_slots: int = 16
    """Cluster only: how many coordinator slots groups hash onto (fixed per cluster)."""
    zk_session_timeout: float = 6.0
    """Cluster only: the ZooKeeper session timeout asked for; a dead broker's slots are
    re-elected this long after it died."""
    repair: bool = False
    """Repair damaged partition segments and a damaged embedded-store log while starting
    (``--repair``): the damaged bytes are moved aside, every intact batch or record is
    kept, no offset is given out again (docs/operations.md, "Corruption and recovery")."""
    claim_grace: float = 1.0
    """Cluster only: how long a vacant slot waits for the broker chosen to claim it
    before any broker may, and how still the view must be before a broker sheds a slot."""
    metrics_port: int | None = None
    """Serve Prometheus metrics at ``http://HOST:PORT/metrics`` (0: a free port; None: no
    metrics endpoint). See docs/operations.md, "Metrics"."""
    tls_cert: str | None = None
    """PEM certificate (chain) of both listeners; with ``tls_key`` they speak TLS only."""
    tls_key: str | None = None
    """PEM private key of ``tls_cert``."""
    tls_client_ca: str | None = None
    """Require client certificates signed by this CA (PEM); the principal is then the
    certificate's CN, and authorization is on (deny by default). See docs/security.md."""
    sasl_mechanisms: tuple[str, ...] = ()
    """SASL mechanisms offered (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN); any: every connection
    must log in before anything else, and authorization is on (deny by default)."""
    super_users: tuple[str, ...] = ()
    """Principals (``alice`` or ``User:alice``) that bypass ACLs."""
    allow_plain_without_tls: bool = False
    """Offer PLAIN (passwords in the clear) on a listener without TLS."""
    auth_timeout: float = 10.0
    max_connections_per_principal: int | None = None
    """Connections at once of one principal (a user, or anonymous); more are refused."""
    quota_produce_bytes: float | None = None
    """Bytes per second one principal may produce; answers beyond it are delayed (a
    throttle, as Kafka's quotas). None: no quota."""
    quota_fetch_bytes: float | None = None
    """Bytes per second one principal may fetch; answers beyond it are delayed."""
    quota_requests: float | None = None
    """Requests per second one principal may send; answers beyond it are delayed (heartbeats
    too: keep it well above what the principal's consumers need). None: no quota."""
    max_groups_per_principal: int | None = None
    """Groups one principal may have members in on this broker; a join beyond is refused
    (RESOURCES_EXHAUSTED). None: no limit."""
    zk_auth: str | None = field(default=None, repr=False)
    """Cluster only: ZooKeeper digest credentials (``user:password``); the nodes the brokers
    create are then readable and writable by that user only (``--zk-auth``)."""
    """A new connection must finish its TLS handshake and its login within this long."""
    tune_gc: bool = False
    """Keep long-lived state out of the garbage collector's walks (``gc.freeze`` after
    loading and every 30 s, a full collection hourly): for a process that runs a broker
    (``trio-coord broker`` sets it); it changes the whole process's collector."""

    @property
    def batch_limit(self) -> int:
        """The largest batch a producer may send, in bytes."""
        if self.max_batch_bytes is not None:
            return self.max_batch_bytes
        return min(512 * 1024, self.max_frame_size // 2)

    def validate(self) -> None:
        """Raise ValueError naming the first setting that makes no sense."""
        if not 0 < self.min_session_timeout <= self.max_session_timeout < math.inf:
            raise ValueError(
                "min_session_timeout must be positive and not above max_session_timeout, "
                "which must be finite (a member's partitions are fenced that long after it "
                f"vanishes); got {self.min_session_timeout:g} and {self.max_session_timeout:g}"
            )
        if not 0 < self.max_rebalance_timeout < math.inf:
            raise ValueError(
                "max_rebalance_timeout (--max-rebalance-timeout) must be a positive, finite "
                f"number of seconds; got {self.max_rebalance_timeout:g}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not between 0 and 65535")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port {self.metrics_port} is not between 0 and 65535")
        if self.kafka_port is not None and not 0 <= self.kafka_port <= 65535:
            raise ValueError(f"kafka_port {self.kafka_port} is not between 0 and 65535")
        if len(self.rack) > MAX_RACK_LENGTH or not self.rack.isprintable():
            raise ValueError(
                f"rack (--rack) must be at most {MAX_RACK_LENGTH} printable characters; "
                f"got {self.rack[:40]!r}"
            )
        if not 0 < self.kafka_consumer_heartbeat_interval < self.kafka_consumer_session_timeout:
            raise ValueError(
                "kafka_consumer_heartbeat_interval "
                f"({self.kafka_consumer_heartbeat_interval:g}s) must be positive and shorter "
                f"than kafka_consumer_session_timeout ({self.kafka_consumer_session_timeout:g}s)"
            )
        if not 1 <= self.kafka_max_batch_bytes <= self.kafka_max_request_bytes:
            raise ValueError(
                f"kafka_max_batch_bytes ({self.kafka_max_batch_bytes}) must be positive and "
                f"at most kafka_max_request_bytes ({self.kafka_max_request_bytes})"
            )
        for name in (
            "max_group_size",
            "max_partitions",
            "max_frame_size",
            "max_in_flight",
            "max_fetch_bytes",
            "offset_metadata_max_bytes",
            "max_connections_per_ip",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_batch_bytes is not None and not 0 < self.max_batch_bytes <= (
            self.max_frame_size // 2
        ):
            raise ValueError(
                f"max_batch_bytes ({self.max_batch_bytes}) must be positive and at most half "
                f"of max_frame_size ({self.max_frame_size}), so that a batch fits in any frame"
            )
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        for name in ("connections_max_idle", "request_read_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive (seconds)")
        for name in ("max_connection_bytes", "queued_max_request_bytes"):
            if getattr(self, name) < self.max_frame_size:
                raise ValueError(
                    f"{name} ({getattr(self, name)}) must be at least max_frame_size "
                    f"({self.max_frame_size}), so that any one request can be received"
                )
        check_security_settings(
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            tls_client_ca=self.tls_client_ca,
            sasl_mechanisms=self.sasl_mechanisms,
            allow_plain_without_tls=self.allow_plain_without_tls,
        )
        if not self.auth_timeout > 0:
            raise ValueError("auth_timeout must be positive (seconds)")
        for name in (
            "quota_produce_bytes",
            "quota_fetch_bytes",
            "quota_requests",
            "max_connections_per_principal",
            "max_groups_per_principal",
        ):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive (or None: no limit)")
        self.log.validate()
        make_registry(self.assignors)  # (raises ValueError for a bad or clashing name)
        if self.coordinator_slots < 1:
            raise ValueError("coordinator_slots must be at least 1")
        if self.zk_session_timeout <= 0:
            raise ValueError("zk_session_timeout must be positive")
        for name in (
            "group_retention",
            "position_flush_interval",
            "shutdown_grace",
            "initial_rebalance_delay",
            "claim_grace",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.offsets_retention is not None and not self.offsets_retention > 0:
            raise ValueError("offsets_retention must be positive (seconds), or None: keep")
        if not 0 < self.rebalance_retry_backoff <= self.rebalance_retry_backoff_max:
            raise ValueError(
                f"rebalance_retry_backoff ({self.rebalance_retry_backoff}) must be positive and "
                f"at most rebalance_retry_backoff_max ({self.rebalance_retry_backoff_max})"
            )


class Broker:
    """A running broker, as ``open_broker`` yields it.

    ``address`` is the (host, port) it listens on (the real port when 0 was
    asked for) and ``bootstrap`` the same as ``"host:port"``, ready for
    clients. ``topics``, ``partitions`` and ``coordinator`` are its services
    (for embedding applications and tests). ``max_connections`` is the
    connection limit in force for both listeners (``open_broker`` passes what
    fits the file-descriptor limit).
    """

    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        logs: LogManager,
        *,
        cluster_url: str | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.logs = logs
        self.gc_keeper = CollectorKeeper() if config.tune_gc else None
        self.security = ServerSecurity(
            store,
            tls_cert=config.tls_cert,
            tls_key=config.tls_key,
            tls_client_ca=config.tls_client_ca,
            sasl_mechanisms=config.sasl_mechanisms,
            super_users=config.super_users,
            auth_timeout=config.auth_timeout,
            quotas=Quotas(
                produce_bytes_per_s=config.quota_produce_bytes,
                fetch_bytes_per_s=config.quota_fetch_bytes,
                requests_per_s=config.quota_requests,
            ),
            max_connections_per_principal=config.max_connections_per_principal,
        )
        """TLS, logins, the authorizer and quotas of both listeners (docs/security.md)."""
        self._handshaking = 0
        """Keeps long-lived state out of the collector's walks (``config.tune_gc``)."""
        self.metrics: BrokerMetrics | None = None
        """Its Prometheus metrics (None without ``config.metrics_port``)."""
        self.metrics_address: tuple[str, int] | None = None
        """Where ``/metrics`` is served (the real port once listening)."""
        self.writer = RecordWriter(
            store,
            existing_paths=set(),
            replay=self._replay,
            current=self._current,
            # In a cluster every topic write touches the topics root, which all brokers watch.
            guard=[SetData(TOPICS, b"")] if cluster_url else (),
        )
        self.writer.on_flush = self._store_written
        self.cluster: ClusterMember | None = None
        """This broker's ClusterMember: its registration, elections and view of the cluster
        (None: a single broker). Named ``cluster`` so that "member" means a group member."""
        if cluster_url is not None:
            self.cluster = ClusterMember(
                self,
                cluster_url,
                slots=config.coordinator_slots,
                session_timeout=config.zk_session_timeout,
                claim_grace=config.claim_grace,
                zk_auth=config.zk_auth,
            )
        self.topics: TopicManager = TopicManager(
            self.writer,
            max_partitions=config.max_partitions,
            placement=None if self.cluster is None else placement(self.cluster),
            rack_of=self.rack_of,
        )
        self.topics.add_listener(self._topic_changed)
        self.partitions: PartitionService = PartitionService(
            logs,
            self.topics,
            max_batch_bytes=config.batch_limit,
            max_fetch_bytes=config.max_fetch_bytes,
            broker_id=config.broker_id if self.cluster is not None else 0,
        )
        self.coordinator: Coordinators = Coordinators(
            1 if self.cluster is None else config.coordinator_slots,
            elected=self.cluster is not None,
        )
        """The coordinator services of the slots this broker holds, behind one router."""
        self.coordinator.max_groups_per_principal = config.max_groups_per_principal
        if self.cluster is None:
            self.coordinator.services[0] = self.new_coordinator_service(self.writer)
        self.address: tuple[str, int] = (config.host, config.port)
        self.shutting_down = False
        self._connections: set[Connection] = set()
        self._per_ip: Counter[str] = Counter()
        self._shared_bytes = ByteBudget(config.queued_max_request_bytes)
        self.max_connections = max_connections or config.max_connections or _DEFAULT_MAX_CONNECTIONS
        """The connection limit in force (``config.max_connections``, or what fits the
        file-descriptor limit: see :func:`connection_limit`)."""
        self._codec = FrameCodec(config.max_frame_size)  # (refusals, and every connection's)
        parking = config.park_idle_connections and PARKING_AVAILABLE
        self._parking = Parking() if parking else None
        """Idle plaintext connections' one watcher (None: off, or no epoll on this OS: a
        reader task each)."""
        self._refused = 0
        self._refusals_logged = -math.inf
        self._services = trio.CancelScope()
        self._listening = trio.CancelScope()
        self._kafka_listening = trio.CancelScope()
        self.kafka: KafkaListener | None = None
        """The Kafka listener (None without ``config.kafka_port``)."""
        self.kafka_address: tuple[str, int] | None = None
        """Where the Kafka listener listens (the real port once listening)."""
        if config.kafka_port is not None:
            # (imported here: a broker without a Kafka listener never loads kio)
            from ..kafka.dispatch import FrontEnd
            from ..kafka.listener import KafkaListener

            self.kafka = KafkaListener(
                FrontEnd(self, _kafka_limits(config, self.max_connections)), self._shared_bytes
            )

    def new_coordinator_service(self, writer: RecordWriter) -> CoordinatorService:
        """A coordinator service writing through ``writer`` (one per slot held)."""
        config = self.config
        writer.on_flush = self._store_written
        service = CoordinatorService(
            writer,
            self.topics,
            CoordinatorConfig(
                limits=GroupLimits(
                    config.min_session_timeout,
                    config.max_session_timeout,
                    config.max_group_size,
                    config.initial_rebalance_delay,
                    config.max_rebalance_timeout,
                    config.offset_metadata_max_bytes,
                ),
                group_retention=config.group_retention,
                position_flush_interval=config.position_flush_interval,
                offsets_retention=config.offsets_retention,
                rebalance_retry_backoff=config.rebalance_retry_backoff,
                rebalance_retry_backoff_max=config.rebalance_retry_backoff_max,
            ),
            log_offsets=self.partitions.log_offsets,
            assignors=make_registry(config.assignors),
            on_event=self._group_event if self._observes_groups else None,
            event_detail=self.config.on_event is not None,  # (metrics need no lists)
            locate=self.locate,
        )
        service.on_commit = self._committed
        return service

    def locate(self, tps: list[TopicPartition]) -> tuple[list[BrokerInfo], list[int]]:
        """The live brokers holding ``tps``, and per partition its broker's id.

        What a StartFetchers carries. A partition whose broker is not live
        (between ZooKeeper sessions) gets -1: the member asks Metadata for it.
        """
        if self.cluster is None:
            return [self.info], [self.broker_id] * len(tps)
        live = self.cluster.brokers
        leaders = []
        for tp in tps:
            leader = self.topics.leader(tp.topic, tp.partition)
            leaders.append(leader if leader is not None and leader in live else -1)
        return [live[b] for b in sorted(set(leaders)) if b >= 0], leaders

    def _committed(self, offsets: int, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.committed(offsets, seconds)

    def _store_written(self, records: int, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.store_written(records, seconds)

    @property
    def _observes_groups(self) -> bool:
        """Whether anyone here wants group events (else the group tasks build none)."""
        config = self.config
        return config.on_event is not None or config.tune_gc or config.metrics_port is not None

    def _group_event(self, event: GroupEvent) -> None:
        """One group event, to the collector keeper, the metrics and ``config.on_event``."""
        if isinstance(event, Stable):
            if self.gc_keeper is not None:
                self.gc_keeper.changed()
            if self.metrics is not None:
                self.metrics.rebalanced(event.elapsed, event.cause)
        elif isinstance(event, RebalanceRestarted) and self.metrics is not None:
            self.metrics.restarted(event.cause)
        if self.config.on_event is not None:
            self.config.on_event(event)

    def metadata(self, request: MetadataRequest) -> MetadataResponse:
        """Live brokers, the topics asked for and the coordinator of the group asked about.

        All topics (``topics=None``) come a page at a time, from ``after`` on.
        """
        following = ""
        if request.topics is None:
            names = (n for n in sorted(self.topics.partitions) if n > request.after)
            infos = (self.topics.info(n) for n in names)
            if request.configs:
                infos = (self._with_configs(info) for info in infos)
            topics, cursor = page(infos, _topic_name, self.page_bytes)
            following = cursor or ""
        else:
            topics = self.topics.describe(request.topics)
            if request.configs:
                topics = [self._with_configs(info) for info in topics]
        if self.cluster is None:
            info = self.info
            return MetadataResponse([info], topics, info if request.group else None, following)
        if self.coordinator.suspended:
            # Its view may be stale, and its slots gone: send the client to another broker.
            raise CoordinatorNotAvailableError(
                f"broker {self.config.broker_id} lost its connection to ZooKeeper and cannot "
                "say who coordinates what; ask another broker"
            )
        if self.config.broker_id not in self.cluster.brokers:
            # Starting, or between ZooKeeper sessions: its view is not (yet) the cluster's.
            raise CoordinatorNotAvailableError(
                f"broker {self.config.broker_id} is not registered in its cluster yet "
                "(starting, or between ZooKeeper sessions); ask another broker"
            )
        brokers = [self.cluster.brokers[b] for b in sorted(self.cluster.brokers)]
        coordinator = None
        if request.group:
            coordinator = self.cluster.coordinator_of(self.coordinator.slot_of(request.group))
        return MetadataResponse(brokers, topics, coordinator, following)

    def _with_configs(self, info: TopicInfo) -> TopicInfo:
        """``info`` with the settings its log follows (the broker's: no per-topic ones)."""
        return msgspec.structs.replace(info, configs=dict(topic_configs(self.config)))

    @property
    def clustered(self) -> bool:
        """True for a broker of a cluster on ZooKeeper."""
        return self.cluster is not None

    @property
    def max_frame_size(self) -> int:
        """The largest frame (``config.max_frame_size``)."""
        return self.config.max_frame_size

    @property
    def max_fetch_bytes(self) -> int:
        """The most one fetch answer carries (``config.max_fetch_bytes``)."""
        return self.config.max_fetch_bytes

    @property
    def page_bytes(self) -> int:
        """How much of a frame one page of a listing may fill (the rest is its envelope):
        half the smaller of this broker's frame and the default one clients read. A
        broker given a larger frame (for large batches) answered listings with pages
        its clients refused: ``Admin.committed_offsets`` of 10,000 partitions of a long
        topic name failed on a broker of an 8 MiB frame."""
        return min(self.config.max_frame_size, DEFAULT_MAX_FRAME_SIZE) // 2

    @property
    def bootstrap(self) -> str:
        """``host:port`` of this broker, for a client's bootstrap list."""
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def info(self) -> BrokerInfo:
        """This broker as Metadata describes it."""
        kafka_port = 0 if self.kafka_address is None else self.kafka_address[1]
        return BrokerInfo(
            self.config.broker_id, self.address[0], self.address[1], kafka_port, self.config.rack
        )

    # -- what the Kafka front end uses (trio_coord.kafka.service.KafkaService) -------------

    @property
    def broker_id(self) -> int:
        """This broker's id."""
        return self.config.broker_id

    @property
    def cluster_id(self) -> str:
        """The cluster id Kafka clients are told."""
        return "trio-coord"

    def rack_of(self, broker_id: int | None) -> str:
        """The rack of a broker (None: this one); "" if it has none or is not known."""
        if broker_id is None or broker_id == self.config.broker_id:
            return self.config.rack
        info = None if self.cluster is None else self.cluster.brokers.get(broker_id)
        return "" if info is None else info.rack

    def count_fetched(self, topic: str, nbytes: int, records: int) -> None:
        """Count record bytes and records served to a Kafka fetch (the fetched metrics)."""
        self.partitions.count_fetched(topic, nbytes, records)

    def kafka_nodes(self) -> list[KafkaNode]:
        """Every live broker with a Kafka listener, as Kafka Metadata lists them."""
        if self.cluster is None:
            if self.kafka_address is None:
                return []
            return [
                KafkaNode(self.broker_id, self.config.host, self.kafka_address[1], self.config.rack)
            ]
        return [
            KafkaNode(b.broker_id, b.host, b.kafka_port, b.rack)
            for _, b in sorted(self.cluster.brokers.items())
            if b.kafka_port
        ]

    def kafka_coordinator(self, group: str) -> KafkaNode | None:
        """The Kafka address of the broker coordinating ``group`` (None: none right now)."""
        if self.cluster is None:
            nodes = self.kafka_nodes()
            return nodes[0] if nodes else None
        if self.coordinator.suspended:
            return None
        info = self.cluster.coordinator_of(self.coordinator.slot_of(group))
        if info is None or not info.kafka_port:
            return None
        return KafkaNode(info.broker_id, info.host, info.kafka_port, info.rack)

    async def read_topics(self, names: list[str]) -> None:
        """In a cluster, read topics another broker just made (a no-op on a single broker)."""
        if self.cluster is not None and names:
            await self.cluster.read_topics(names)

    def _current(self, record: Record) -> Record | None:
        if isinstance(record, TopicRecord | TopicTombstone):
            return self.topics.current(record.name)
        return self.coordinator.services[0].current(record)  # (a single broker's slot)

    def _replay(self, record: Record, *, loading: bool = False) -> None:
        if isinstance(record, TopicRecord | TopicTombstone):
            self.topics.replay(record)
        else:
            self.coordinator.services[0].replay(record, loading=loading)

    def _topic_changed(self, topic: str) -> None:
        if topic not in self.topics.partitions:  # deleted: its logs go too
            self.logs.remove_topic(topic)

    async def _load(self) -> None:
        if self.cluster is not None:
            return  # topics arrive through the cluster's watch, groups with their slots
        records, paths = await load_records(self.store)
        self.writer.add_existing_paths(paths)
        for record in records:
            self._replay(record, loading=True)
        await self.logs.set_aside(self.topics.partitions)
        log.info(
            "loaded %d topic(s) and %d group(s) from the store",
            len(self.topics.partitions),
            len(self.coordinator.list_groups()),
        )

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one client connection over any Trio stream until it closes.

        The TCP listener calls this for every accepted socket; an embedding
        application can hand it other streams (TLS, UNIX sockets), and tests
        hand it in-memory streams so that they can run on a virtual clock.
        """
        ip = _peer_ip(stream)
        config = self.config
        refusal = None
        if len(self._connections) + self._handshaking >= self.max_connections:
            refusal = f"{len(self._connections)} open (max_connections {self.max_connections})"
        elif ip is not None and self._per_ip[ip] >= config.max_connections_per_ip:
            limit = config.max_connections_per_ip
            refusal = f"{self._per_ip[ip]} open from {ip} (max_connections_per_ip {limit})"
        if refusal is not None:
            try:
                await self._refuse(stream, refusal)
            finally:  # (also when cancelled: trio.serve_tcp closed every stream it accepted)
                await trio.aclose_forcefully(stream)
            return
        conn: Connection | None = None
        counted: str | None = None
        serving = False
        if ip is not None:
            self._per_ip[ip] += 1
        try:
            principal = ANONYMOUS
            if self.security.ssl_context is not None or self.security.sasl:
                # (in this connection's task, under auth_timeout: the accept loop goes on)
                self._handshaking += 1
                try:
                    secured = await self.security.accept_native(stream)
                finally:
                    self._handshaking -= 1
                if secured is None:
                    return
                stream, principal = secured
            if not self.security.admit(principal):
                most = self.security.max_connections_per_principal
                await self._refuse(
                    stream, f"{principal} has {most} open (max_connections_per_principal)"
                )
                return
            counted = principal
            conn = Connection(
                stream,
                max_frame_size=config.max_frame_size,
                max_in_flight=config.max_in_flight,
                max_bytes=config.max_connection_bytes,
                shared=self._shared_bytes,
                codec=self._codec,
                parking=self._parking,
            )
            conn.principal = principal
            conn.handler = BrokerHandler(self, conn)
            # Counted out when the connection ends, which a parked one does without this
            # task: the bookkeeping goes with the connection.
            conn.on_closed = _Forget(self, conn, ip, counted)
            self._connections.add(conn)
            ip = counted = None
            serving = True
            await conn.serve()
        except Exception:
            # Connection.serve raises nothing for what a peer does; should a bug let an
            # exception through anyway, it costs this connection only: the handler
            # nursery of every connection is the broker's services nursery.
            log.exception(
                "connection %s failed and was closed", conn.name if conn else _peer_ip(stream)
            )
        finally:
            self._forget(None, ip, counted)
            if not serving:  # (a connection closes its stream itself, parked or not)
                await trio.aclose_forcefully(stream)

    def _forget(self, conn: Connection | None, ip: str | None, principal: str | None) -> None:
        """Count a connection out of the limits it was counted in."""
        if principal is not None:
            self.security.release(principal)
        if conn is not None:
            self._connections.discard(conn)
        if ip is not None:
            self._per_ip[ip] -= 1
            if not self._per_ip[ip]:
                del self._per_ip[ip]

    async def _refuse(self, stream: trio.abc.Stream, why: str) -> None:
        """Tell a connection beyond the limits why it is closed (bounded wait), and log it
        at most every 10 s (a flood must not flood the log too)."""
        self._refused += 1
        now = trio.current_time()
        if now - self._refusals_logged >= _REFUSAL_LOG_INTERVAL:
            log.warning("refusing connections: %s (%d refused)", why, self._refused)
            self._refusals_logged, self._refused = now, 0
        refusal = Goodbye(
            ErrorCode.RESOURCES_EXHAUSTED,
            f"too many connections: {why}; retry later, or raise the limit on the broker",
        )
        with trio.move_on_after(_REFUSAL_GRACE):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(self._codec.encode(refusal))

    async def _reap_connections(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Close idle connections and those sending a frame too slowly (one task, one scan).

        One periodic scan of all connections instead of a deadline per
        connection and per frame: receiving a heartbeat costs nothing extra.
        """
        config = self.config
        idle, slow = config.connections_max_idle, config.request_read_timeout
        task_status.started()
        if math.isinf(idle) and math.isinf(slow):
            return  # (both off: nothing to reap)
        period = min(max(min(idle, slow) / 4, 0.01), 5.0)
        async with trio.open_nursery() as closing:
            while True:
                await trio.sleep(period)
                now = trio.current_time()
                for conn in list(self._connections):
                    if conn.closed:
                        continue
                    started = conn.receiving_since
                    if started is not None and now - started > slow:
                        closing.start_soon(
                            conn.close_with,
                            RequestTimedOutError(
                                f"a frame did not arrive whole within {slow:g}s "
                                "(request_read_timeout)"
                            ),
                        )
                    elif conn.idle and now - conn.last_active > idle:
                        log.info("closing %s: idle for %gs (connections_max_idle)", conn.name, idle)
                        closing.start_soon(conn.aclose)

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the broker's services; shielded once listening, stopped by :meth:`_shutdown`.

        The shield makes shutdown orderly even when the embedding block is
        cancelled: the record writer must still be there to drain.
        """
        with self._services:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.writer.run)
                await nursery.start(self._reap_connections)
                if self._parking is not None:
                    await nursery.start(self._parking.run)
                if self.security.needs_cache:
                    await nursery.start(self.security.cache.run)
                if self.gc_keeper is not None:
                    nursery.start_soon(self.gc_keeper.run)
                if self.config.metrics_port is not None:
                    await self._serve_metrics(nursery)
                for service in self.coordinator.services.values():
                    await nursery.start(service.run)
                listeners = await nursery.start(self._listen, nursery)
                self.address = listeners[0].socket.getsockname()[:2]
                log.info("broker %d listening on %s", self.config.broker_id, self.bootstrap)
                if self.kafka is not None:
                    kafka = await nursery.start(self._listen_kafka, self.kafka, nursery)
                    self.kafka_address = kafka[0].socket.getsockname()[:2]
                    log.info(
                        "broker %d: Kafka listener on %s:%d",
                        self.config.broker_id,
                        *self.kafka_address,
                    )
                if self.cluster is not None:
                    await nursery.start(self.cluster.run, self.store)
                self._services.shield = True
                task_status.started()

    async def _listen(
        self,
        handler_nursery: trio.Nursery,
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with self._listening, _naming_the_address(self.config.host, self.config.port, "--port"):
            listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
            async with trio.open_nursery() as nursery:
                for listener in listeners:
                    nursery.start_soon(self._accept, listener, handler_nursery)
                task_status.started(listeners)

    async def _accept(self, listener: trio.SocketListener, handler_nursery: trio.Nursery) -> None:
        """Accept connections for ``serve_stream`` (``trio.serve_listeners``, except that
        a connection's stream is closed by the connection: a parked one outlives its task)."""
        logged = -math.inf
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    if trio.current_time() - logged >= _REFUSAL_LOG_INTERVAL:
                        logged = trio.current_time()
                        log.error(
                            "accepting connections: %s; retrying every 0.1 s (said at most "
                            "every %g s); raise `ulimit -n` or lower --max-connections",
                            os_reason(exc),
                            _REFUSAL_LOG_INTERVAL,
                        )
                    await trio.sleep(0.1)
                else:
                    handler_nursery.start_soon(self.serve_stream, stream)

    async def _serve_metrics(self, nursery: trio.Nursery) -> None:
        """Start ``/metrics`` (prometheus_client is imported only when it is asked for)."""
        from .metrics import BrokerMetrics

        self.metrics = BrokerMetrics(self)
        port = self.config.metrics_port or 0
        with _naming_the_address(self.config.host, port, "--metrics-port"):
            listeners = await nursery.start(self.metrics.serve, self.config.host, port)
        self.metrics_address = listeners[0].socket.getsockname()[:2]
        log.info(
            "broker %d: metrics at http://%s:%d/metrics", self.broker_id, *self.metrics_address
        )

    async def _listen_kafka(
        self,
        kafka: KafkaListener,
        handler_nursery: trio.Nursery,
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        port = self.config.kafka_port or 0
        with self._kafka_listening, _naming_the_address(self.config.host, port, "--kafka-port"):
            await kafka.listen(
                self.config.host,
                self.config.kafka_port or 0,
                handler_nursery,
                task_status=task_status,
            )

    async def _shutdown(self) -> None:
        """Stop accepting, refuse new work, let queued writes land (bounded), then stop."""
        self.shutting_down = True
        self._listening.cancel()
        self._kafka_listening.cancel()
        with trio.move_on_after(self.config.shutdown_grace) as grace:
            grace.shield = True
            await self.writer.drain()
            for holder in list(self.cluster.held.values()) if self.cluster else []:
                if holder.writer is not None:
                    await holder.writer.drain()
        if grace.cancelled_caught:
            log.warning("shutdown: writes still pending after %gs", self.config.shutdown_grace)
        self._services.cancel()

    def connection_count(self) -> int:
        """How many client connections are open."""
        return len(self._connections)

    def parked_count(self) -> int:
        """How many of them are parked (idle, with no task: ``park_idle_connections``)."""
        return 0 if self._parking is None else len(self._parking)


def connection_limit(config: BrokerConfig) -> int:
    """The connection limit a broker can keep within the process's file-descriptor limit.

    Raises the soft limit toward the hard one if that is what it takes. A
    ``max_connections`` that was asked for and cannot be kept is a
    ValueError naming ``ulimit -n``; the default (10,000) shrinks to fit,
    with a log line.
    """
    wanted = config.max_connections or _DEFAULT_MAX_CONNECTIONS
    need = wanted + _RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    # Under a low limit (1024 is common), keep a quarter for files rather than 1024.
    reserve = min(_RESERVED_FDS, soft // 4)
    room = soft - reserve
    if wanted <= room:
        return wanted
    if config.max_connections is None and room >= _MIN_CONNECTIONS:
        log.info(
            "max_connections is %d, not %d: this process may open %d files (ulimit -n); "
            "raise that limit to admit more",
            room,
            wanted,
            soft,
        )
        return room
    raise ValueError(
        f"max_connections {wanted} needs {wanted + reserve} file descriptors ({reserve} kept "
        f"for logs and the store), but this process may open only {soft} (ulimit -n; hard "
        f"limit {hard}); raise the limit (ulimit -n {need}) or lower --max-connections"
    )


@contextlib.contextmanager
def _naming_the_address(host: str, port: int, flag: str) -> Iterator[None]:
    """An OSError while listening says on which address, and what to do about it."""
    try:
        yield
    except OSError as exc:
        hint = (
            f"another process listens there: stop it, or choose another {flag}"
            if exc.errno == errno.EADDRINUSE
            else f"check the host, or choose another {flag}"
        )
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}; {hint}") from exc


def _retention_ms(log_config: LogConfig) -> int:
    seconds = log_config.retention_seconds
    return -1 if seconds is None else int(seconds * 1000)


def topic_configs(config: BrokerConfig) -> tuple[tuple[str, str], ...]:
    """The settings every topic's log follows, by their Kafka names (there are no per-topic
    ones): what Kafka's DescribeConfigs and ``trio-coord topics describe`` report."""
    log_config = config.log
    retention_bytes = -1 if log_config.retention_bytes is None else log_config.retention_bytes
    return (
        ("cleanup.policy", "delete"),
        ("compression.type", "producer"),
        ("max.message.bytes", str(config.kafka_max_batch_bytes)),
        ("message.timestamp.type", "CreateTime"),
        ("min.insync.replicas", "1"),
        ("retention.bytes", str(retention_bytes)),
        ("retention.ms", str(_retention_ms(log_config))),
        ("segment.bytes", str(log_config.segment_bytes)),
    )


def _kafka_limits(config: BrokerConfig, max_connections: int) -> KafkaLimits:
    """The Kafka front end's bounds and reported settings, from the broker's config."""
    log_config = config.log
    retention_ms = _retention_ms(log_config)
    topic = topic_configs(config)
    broker = (
        ("auto.create.topics.enable", "false"),
        ("broker.id", str(config.broker_id)),
        ("default.replication.factor", "1"),
        ("log.retention.ms", str(retention_ms)),
        ("log.segment.bytes", str(log_config.segment_bytes)),
        ("message.max.bytes", str(config.kafka_max_batch_bytes)),
        ("num.partitions", "1"),
        ("socket.request.max.bytes", str(config.kafka_max_request_bytes)),
    )
    return KafkaLimits(
        max_request_bytes=config.kafka_max_request_bytes,
        max_in_flight=config.max_in_flight,
        max_connection_bytes=config.max_connection_bytes,
        max_batch_bytes=config.kafka_max_batch_bytes,
        max_fetch_bytes=config.max_fetch_bytes,
        max_connections=max_connections,
        connections_max_idle=config.connections_max_idle,
        request_read_timeout=config.request_read_timeout,
        topic_configs=topic,
        broker_configs=broker,
        # (within the broker's session limits, which every member's timeout must respect)
        consumer_session_timeout=min(
            max(config.kafka_consumer_session_timeout, config.min_session_timeout),
            config.max_session_timeout,
        ),
        consumer_heartbeat_interval=config.kafka_consumer_heartbeat_interval,
        max_rebalance_timeout=config.max_rebalance_timeout,
    )


def _topic_name(info: TopicInfo) -> str:
    return info.name


class _Forget:
    """A connection's ``on_closed``: count it out (``Broker._forget``). A slotted object,
    not a ``functools.partial`` (which is that, a tuple and a dict: ~270 bytes a
    connection, kept for its whole life)."""

    __slots__ = ("broker", "conn", "ip", "principal")

    def __init__(
        self, broker: Broker, conn: Connection, ip: str | None, principal: str | None
    ) -> None:
        self.broker = broker
        self.conn = conn
        self.ip = ip
        self.principal = principal

    def __call__(self) -> None:
        self.broker._forget(self.conn, self.ip, self.principal)


def _peer_ip(stream: trio.abc.Stream) -> str | None:
    stream = getattr(stream, "transport_stream", stream)
    sock = getattr(stream, "socket", None)
    if sock is None:
        return None
    try:
        address = sock.getpeername()
    except OSError:
        return None
    # (A UNIX socket's peer is a path, usually empty: no address to count per IP.)
    # Interned: the connections from one address share one string, kept while they live.
    return sys.intern(str(address[0])) if isinstance(address, tuple) else None


@asynccontextmanager
async def _open_store(
    store: str | MetadataStore | None, root: Path | None, config: BrokerConfig
) -> AsyncIterator[tuple[MetadataStore, str | None]]:
    """The store a broker runs on, and its cluster's URL if it is ZooKeeper."""
    if isinstance(store, MetadataStore):
        yield store, None
    elif store is None:
        async with open_embedded_store(root, repair=config.repair) as embedded:
            yield embedded, None
    else:
        require_zk_url(store)  # (a path is no store: the embedded one is the default)
        async with open_zookeeper_store(
            store, session_timeout=config.zk_session_timeout, auth=config.zk_auth
        ) as zk:
            yield zk, store


@asynccontextmanager
async def open_broker(
    data_dir: str | os.PathLike[str] | None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    config: BrokerConfig | None = None,
    store: str | MetadataStore | None = None,
    **settings: Any,
) -> AsyncIterator[Broker]:
    """Run a broker for the life of the block.

    By default the metadata store is the embedded one in ``data_dir``;
    ``store="zk://host:port,.../chroot"`` joins the cluster of brokers on
    that ZooKeeper chroot instead (give each broker its own ``broker_id``),
    and a :class:`~trio_coord.store.MetadataStore` object runs a single
    broker on that store. The partition logs live in ``data_dir/partitions``.
    ``data_dir=None`` runs an ephemeral broker: its embedded store lives in
    memory and its logs in a temporary directory, and nothing survives it
    (for tests and throw-away demos).

    ``settings`` override fields of ``config`` (or of the defaults), e.g.
    ``open_broker(d, min_session_timeout=0.1)``. The block is entered once
    the broker has loaded its state and listens (in a cluster: once it is
    registered); ``broker.bootstrap`` is its address. Raises ``StoreError``
    if the data dir is in use by another broker or ZooKeeper cannot be
    reached, and ``OSError`` if the address cannot be bound.
    """
    config = replace(config or BrokerConfig(), host=host, port=port, **settings)
    config.validate()
    max_connections = connection_limit(config)
    root = None if data_dir is None else Path(data_dir)
    with unwrap_lone_exception():
        async with (
            _open_store(store, root, config) as (metadata, cluster_url),
            open_log_manager(
                None if root is None else root / "partitions",
                replace(config.log, repair=config.repair or config.log.repair),
            ) as logs,
        ):
            broker = Broker(
                config, metadata, logs, cluster_url=cluster_url, max_connections=max_connections
            )
            await broker._load()
            async with trio.open_nursery() as nursery:
                await nursery.start(broker._serve)
                try:
                    yield broker
                finally:
                    await broker._shutdown()
