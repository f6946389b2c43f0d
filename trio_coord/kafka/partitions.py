"""The check every Kafka data-plane request makes before touching a partition.

Its one job is :func:`check_partition`: the topic exists, the partition is
in range, this broker holds it (leaders as placed today), and its log was
not refused as damaged at start-up, or the Kafka error code saying which
of these failed, for the client to act on (refresh metadata, retry, give up).
"""

from __future__ import annotations

from .codec import KafkaCode
from .errors import KafkaError
from .service import KafkaService

__all__ = ["check_partition"]


def check_partition(service: KafkaService, topic: str, partition: int) -> None:
    """Raise :class:`~.errors.KafkaError` unless this broker serves ``topic``-``partition``."""
    count = service.topics.partitions.get(topic)
    if count is None or not 0 <= partition < count:
        raise KafkaError(
            KafkaCode.unknown_topic_or_partition,
            f"{topic}-{partition} does not exist on this cluster",
        )
    leader = service.topics.leader(topic, partition)
    if leader is not None and leader != service.broker_id:
        raise KafkaError(
            KafkaCode.not_leader_or_follower,
            f"{topic}-{partition} is held by broker {leader}, not {service.broker_id}",
        )
    damage = service.logs.damage(topic, partition)
    if damage is not None:
        raise KafkaError(KafkaCode.kafka_storage_error, f"{topic}-{partition}: {damage}")
