"""Trio clients: the producer, the consumer and the admin client.

``open_producer`` appends records to topic partitions; ``open_consumer``
joins a group, obeys its coordinator and fetches the partitions it owns (or
reads fixed partitions); ``open_admin`` manages topics, groups and offsets.
All find brokers through a bootstrap list and retry with backoff while none
answers, up to a deadline, after which the error names every address they
could not reach and why.
"""

from .admin import Admin, PartitionLag, PlannedOffset, open_admin
from .consumer import Consumer, ConsumerState, PartitionsCallback, open_consumer
from .producer import Delivery, Producer, RecordMetadata, open_producer, partition_for_key

__all__ = [
    "Admin",
    "Consumer",
    "ConsumerState",
    "Delivery",
    "PartitionLag",
    "PartitionsCallback",
    "PlannedOffset",
    "Producer",
    "RecordMetadata",
    "open_admin",
    "open_consumer",
    "open_producer",
    "partition_for_key",
]
