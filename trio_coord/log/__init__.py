"""Partition log storage: segmented, indexed, checksummed append-only logs, one per partition.

The public names of the package, re-exported: open the logs of a broker with
:func:`open_log_manager`, which recovers every partition under its root
directory and yields a :class:`LogManager`; each partition is a
:class:`PartitionLog` that appends opaque batches under the
:class:`LogConfig` flush policy and reads them back as
:class:`StoredBatch`. Errors are :class:`LogError`, and
:class:`LogOffsetOutOfRangeError` for an offset the partition does not hold.
"""

from .base import LogBusyError as LogBusyError
from .base import LogConfig as LogConfig
from .base import LogCorruptError as LogCorruptError
from .base import LogError as LogError
from .base import LogOffsetOutOfRangeError as LogOffsetOutOfRangeError
from .base import StoredBatch as StoredBatch
from .manager import LogManager as LogManager
from .manager import open_log_manager as open_log_manager
from .partition import PartitionLog as PartitionLog
from .segment import KAFKA as KAFKA_FORMAT

__all__ = [
    "KAFKA_FORMAT",
    "LogBusyError",
    "LogConfig",
    "LogCorruptError",
    "LogError",
    "LogManager",
    "LogOffsetOutOfRangeError",
    "PartitionLog",
    "StoredBatch",
    "open_log_manager",
]
