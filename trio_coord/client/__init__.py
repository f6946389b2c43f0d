"""Trio clients: the producer, the consumer and the admin client.

``open_producer`` appends records to topic partitions; ``open_consumer``
joins a group, obeys its coordinator and fetches the partitions it owns (or
reads fixed partitions); ``open_admin`` manages topics, groups and offsets.
All find brokers through a bootstrap list and retry with backoff while none
answers, up to a deadline, after which the error names every address they
could not reach and why.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .admin import Admin as Admin
    from .admin import PartitionLag as PartitionLag
    from .admin import PlannedOffset as PlannedOffset
    from .admin import open_admin as open_admin
    from .consumer import Consumer as Consumer
    from .consumer import ConsumerState as ConsumerState
    from .consumer import PartitionsCallback as PartitionsCallback
    from .consumer import open_consumer as open_consumer
    from .producer import Delivery as Delivery
    from .producer import Producer as Producer
    from .producer import RecordMetadata as RecordMetadata
    from .producer import open_producer as open_producer
    from .producer import partition_for_key as partition_for_key

if not TYPE_CHECKING:  # (mypy would take every name the module lacks for an Any)
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            "Admin": ".admin",
            "PartitionLag": ".admin",
            "PlannedOffset": ".admin",
            "open_admin": ".admin",
            "Consumer": ".consumer",
            "ConsumerState": ".consumer",
            "PartitionsCallback": ".consumer",
            "open_consumer": ".consumer",
            "Delivery": ".producer",
            "Producer": ".producer",
            "RecordMetadata": ".producer",
            "open_producer": ".producer",
            "partition_for_key": ".producer",
        },
    )

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
