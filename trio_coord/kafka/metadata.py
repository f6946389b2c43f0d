"""ApiVersions, Metadata and FindCoordinator: how a Kafka client finds its way.

Its one job is to tell clients where things are. ApiVersions lists the
keys and versions the front end serves (from the dispatch table).
Metadata lists every broker's Kafka listener (in a cluster, each broker
registers its Kafka port beside its native address) and, per partition,
its leader as placed today (single replica: the leader is the only replica
and the whole ISR). Topics are never created by Metadata (Kafka 4's
``auto.create.topics.enable`` is off here): an unknown topic is
UNKNOWN_TOPIC_OR_PARTITION. FindCoordinator (v0-v3 one key, v4+ a batch)
answers with the Kafka address of the broker that coordinates the group,
by the same hashing the native protocol uses; transaction coordinators
do not exist (no transactions).
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any, Final

from .codec import KafkaCode, make, nested, response_schema
from .dispatch import Api, RequestContext
from .service import KafkaNode

__all__ = ["APIS", "TopicIds", "topic_id"]

_NO_THROTTLE: Final = datetime.timedelta(0)
_TOPIC_IDS: Final = uuid.UUID("6b0cb7e4-6a5e-4c43-9c55-3a1f1b1f0c11")
_GROUP: Final = 0


def topic_id(topics: Any, name: str) -> uuid.UUID:
    """The id of topic ``name`` as Kafka clients see it: the one persisted with the topic
    (``topics.ids``; a service without ids, or a topic not known, gets one derived from
    the name, as topics had before ids were persisted)."""
    found = getattr(topics, "ids", {}).get(name)
    return uuid.UUID(hex=found) if found else uuid.uuid5(_TOPIC_IDS, name)


class TopicIds:
    """Topic id → name, for the APIs that name topics by id (Metadata v10+, KIP-848).

    Rebuilt from the topics the broker knows when an id is not found (or names a
    topic that is gone), and only if the topics changed since the last rebuild
    (``topics.version``): a lookup is O(1) and the map costs one entry per topic.
    (Rebuilding for every unknown id let one request naming thousands of made-up ids
    cost thousands of O(topics) rebuilds on the event loop.)
    """

    def __init__(self, front: Any) -> None:
        self._front = front
        self._names: dict[uuid.UUID, str] = {}
        self._built: object = None  # the topics' version the map was built at

    def name(self, topic: uuid.UUID | None) -> str | None:
        """The name of the topic with id ``topic`` (None if no topic has it)."""
        if topic is None:
            return None
        topics = self._front.service.topics
        name = self._names.get(topic)
        if name is None or name not in topics.partitions or topic_id(topics, name) != topic:
            version = getattr(topics, "version", None)
            if version is None or version != self._built:
                self._names = {topic_id(topics, n): n for n in topics.partitions}
                self._built = version
            name = self._names.get(topic)
        return name


# -- ApiVersions ---------------------------------------------------------------------------


def _api_versions(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(18, ctx.version)
    entry = nested(schema, "ApiVersion")
    keys = tuple(
        entry(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in ctx.front.table.ranges()
    )
    return make(schema, error_code=KafkaCode.none, api_keys=keys, throttle_time=_NO_THROTTLE)


async def _api_versions_async(ctx: RequestContext, body: Any) -> Any:
    return _api_versions(ctx, body)


# -- Metadata --------------------------------------------------------------------------------


def _metadata_now(ctx: RequestContext, body: Any) -> Any | None:
    names = _requested(ctx, body)
    service = ctx.front.service
    if names and any(not isinstance(n, str) or n not in service.topics.partitions for n in names):
        return None  # (in a cluster, read the store first: the handler does)
    return _metadata(ctx, names)


async def _metadata_async(ctx: RequestContext, body: Any) -> Any:
    names = _requested(ctx, body)
    service = ctx.front.service
    if names:
        missing = [n for n in names if isinstance(n, str) and n not in service.topics.partitions]
        if missing:
            await service.read_topics(missing)
    return _metadata(ctx, names)


def _requested(ctx: RequestContext, body: Any) -> list[str | uuid.UUID] | None:
    """The topics asked for, by name (or, v10+, by id where the name is null); None: all."""
    topics = body.topics
    if topics is None or (ctx.version == 0 and not topics):
        return None
    out: list[str | uuid.UUID] = []
    ids = ctx.front.state(TopicIds)
    for t in topics:
        if t.name is not None:
            out.append(t.name)
        elif getattr(t, "topic_id", None) is not None and t.topic_id.int:
            out.append(ids.name(t.topic_id) or t.topic_id)  # (an unknown id stays an id)
    return out


def _metadata(ctx: RequestContext, names: list[str | uuid.UUID] | None) -> Any:
    service = ctx.front.service
    schema = response_schema(3, ctx.version)
    broker_cls = nested(schema, "MetadataResponseBroker")
    topic_cls = nested(schema, "MetadataResponseTopic")
    part_cls = nested(schema, "MetadataResponsePartition")
    nodes = service.kafka_nodes()
    live = {n.node_id for n in nodes}
    topics = []
    known = service.topics.partitions
    for name in sorted(known) if names is None else names:
        if isinstance(name, uuid.UUID):
            topics.append(
                make(
                    topic_cls,
                    error_code=KafkaCode.unknown_topic_id,
                    name=None,
                    topic_id=name,
                    is_internal=False,
                    partitions=(),
                )
            )
            continue
        count = known.get(name)
        if not ctx.allowed("describe", "topic", name):
            if names is None:
                continue  # (all topics: only those the principal may describe, as Kafka does)
            topics.append(
                make(
                    topic_cls,
                    error_code=KafkaCode.topic_authorization_failed,
                    name=name,
                    topic_id=uuid.UUID(int=0),
                    is_internal=False,
                    partitions=(),
                )
            )
            continue
        if count is None:
            topics.append(
                make(
                    topic_cls,
                    error_code=KafkaCode.unknown_topic_or_partition,
                    name=name,
                    topic_id=uuid.UUID(int=0),
                    is_internal=False,
                    partitions=(),
                )
            )
            continue
        parts = []
        for p in range(count):
            leader = service.topics.leader(name, p)
            leader = service.broker_id if leader is None else leader
            error = KafkaCode.none if leader in live else KafkaCode.leader_not_available
            parts.append(
                make(
                    part_cls,
                    error_code=error,
                    partition_index=p,
                    leader_id=leader if leader in live else -1,
                    leader_epoch=0,
                    replica_nodes=(leader,),
                    isr_nodes=(leader,) if leader in live else (),
                    offline_replicas=() if leader in live else (leader,),
                )
            )
        topics.append(
            make(
                topic_cls,
                error_code=KafkaCode.none,
                name=name,
                topic_id=topic_id(service.topics, name),
                is_internal=False,
                partitions=tuple(parts),
            )
        )
    return make(
        schema,
        throttle_time=_NO_THROTTLE,
        brokers=tuple(
            make(broker_cls, node_id=n.node_id, host=n.host, port=n.port, rack=n.rack or None)
            for n in nodes
        ),
        cluster_id=service.cluster_id,
        controller_id=min(live) if live else -1,
        topics=tuple(topics),
    )


# -- FindCoordinator -------------------------------------------------------------------------


def _find_coordinator(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(10, ctx.version)
    if ctx.version >= 4:
        entry = nested(schema, "Coordinator")
        coordinators = []
        for key in body.coordinator_keys:
            code, message, node = _coordinator(ctx, body.key_type, key)
            coordinators.append(
                make(
                    entry,
                    key=key,
                    node_id=node.node_id if node else -1,
                    host=node.host if node else "",
                    port=node.port if node else -1,
                    error_code=code,
                    error_message=message,
                )
            )
        return make(schema, throttle_time=_NO_THROTTLE, coordinators=tuple(coordinators))
    code, message, node = _coordinator(ctx, getattr(body, "key_type", _GROUP), body.key)
    return make(
        schema,
        throttle_time=_NO_THROTTLE,
        error_code=code,
        error_message=message,
        node_id=node.node_id if node else -1,
        host=node.host if node else "",
        port=node.port if node else -1,
    )


def _coordinator(
    ctx: RequestContext, key_type: int, key: str
) -> tuple[KafkaCode, str | None, KafkaNode | None]:
    if key_type != _GROUP:
        return (
            KafkaCode.coordinator_not_available,
            "this broker has no transaction coordinator (transactions are not supported)",
            None,
        )
    node = ctx.front.service.kafka_coordinator(key)
    if node is None:
        return (
            KafkaCode.coordinator_not_available,
            f"no broker coordinates group {key!r} right now (an election is under way)",
            None,
        )
    return KafkaCode.none, None, node


async def _find_coordinator_async(ctx: RequestContext, body: Any) -> Any:
    return _find_coordinator(ctx, body)


APIS: Final = [
    Api(18, 0, 4, _api_versions_async, now=_api_versions, authorizes=True),
    Api(3, 0, 12, _metadata_async, now=_metadata_now, authorizes=True),
    Api(10, 0, 6, _find_coordinator_async, now=_find_coordinator, authorizes=True),
]
