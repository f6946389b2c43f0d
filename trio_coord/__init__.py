"""trio_coord: a consumer-group coordinator for partitioned logs, built on Trio.

The public API. Start a broker with :func:`open_broker`, manage topics and
groups with :func:`open_admin`, and consume as a group member with
:func:`open_consumer`; every error a broker reports arrives as a subclass of
:class:`CoordError`, one per :class:`ErrorCode`.
"""

from .broker import Broker as Broker
from .broker import BrokerConfig as BrokerConfig
from .broker import open_broker as open_broker
from .client import Admin as Admin
from .client import Consumer as Consumer
from .client import ConsumerState as ConsumerState
from .client import open_admin as open_admin
from .client import open_consumer as open_consumer
from .protocol import TopicPartition as TopicPartition
from .protocol.errors import *  # noqa: F403  (one exception class per error code)
from .protocol.errors import __all__ as _errors_all

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "Broker",
    "BrokerConfig",
    "Consumer",
    "ConsumerState",
    "TopicPartition",
    "__version__",
    "open_admin",
    "open_broker",
    "open_consumer",
    *_errors_all,
]
