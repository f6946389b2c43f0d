"""trio_coord: a consumer-group coordinator for partitioned logs, built on Trio.

The public API. Start a broker with :func:`open_broker`, manage topics,
groups and offsets with :func:`open_admin`, append records with
:func:`open_producer`, and consume them as a group member (or from fixed
partitions) with :func:`open_consumer`; every error a broker reports arrives
as a subclass of :class:`CoordError`, one per :class:`ErrorCode`. Each name is
imported when first used (see :mod:`._lazy`), so that a process that needs one
part, such as a Spark worker, does not import the broker.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .protocol.errors import *  # noqa: F403  (one exception class per error code)
from .protocol.errors import __all__ as _errors_all

if TYPE_CHECKING:
    from .broker import Broker as Broker
    from .broker import BrokerConfig as BrokerConfig
    from .broker import open_broker as open_broker
    from .broker.events import GroupEvent as GroupEvent
    from .client import Admin as Admin
    from .client import Consumer as Consumer
    from .client import ConsumerState as ConsumerState
    from .client import Delivery as Delivery
    from .client import PartitionLag as PartitionLag
    from .client import Producer as Producer
    from .client import RecordMetadata as RecordMetadata
    from .client import open_admin as open_admin
    from .client import open_consumer as open_consumer
    from .client import open_producer as open_producer
    from .log import LogConfig as LogConfig
    from .protocol import EARLIEST as EARLIEST
    from .protocol import LATEST as LATEST
    from .protocol import TopicPartition as TopicPartition
    from .protocol.records import ConsumerRecord as ConsumerRecord
    from .security import Acl as Acl
    from .security import Sasl as Sasl
    from .security import client_ssl_context as client_ssl_context

if not TYPE_CHECKING:  # (mypy would take every name the module lacks for an Any)
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            "Broker": ".broker",
            "BrokerConfig": ".broker",
            "open_broker": ".broker",
            "GroupEvent": ".broker.events",
            "Admin": ".client",
            "Consumer": ".client",
            "ConsumerState": ".client",
            "Delivery": ".client",
            "PartitionLag": ".client",
            "Producer": ".client",
            "RecordMetadata": ".client",
            "open_admin": ".client",
            "open_consumer": ".client",
            "open_producer": ".client",
            "LogConfig": ".log",
            "EARLIEST": ".protocol.messages",
            "LATEST": ".protocol.messages",
            "TopicPartition": ".protocol.messages",
            "ConsumerRecord": ".protocol.records",
            "Acl": ".security",
            "Sasl": ".security",
            "client_ssl_context": ".security",
        },
    )

__version__ = "0.1.0"

__all__ = [
    "EARLIEST",
    "LATEST",
    "Admin",
    "Broker",
    "BrokerConfig",
    "Consumer",
    "ConsumerRecord",
    "ConsumerState",
    "Delivery",
    "GroupEvent",
    "LogConfig",
    "PartitionLag",
    "Producer",
    "RecordMetadata",
    "TopicPartition",
    "Acl",
    "Sasl",
    "__version__",
    "client_ssl_context",
    "open_admin",
    "open_broker",
    "open_consumer",
    "open_producer",
    *_errors_all,
]
