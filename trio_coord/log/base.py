"""The partition log's shared vocabulary: its configuration, a stored batch, and its errors.

Its one job is to define the types that every other module of the package
(and its callers) speak: :class:`LogConfig` (segment size, index density,
flush policy, retention), :class:`StoredBatch` (one batch as read back, with
the offsets the log assigned it) and the exceptions :class:`LogError`,
:class:`LogOffsetOutOfRangeError`, :class:`LogBusyError` and
:class:`LogCorruptError`. It does no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

__all__ = [
    "MAX_SEGMENT_BYTES",
    "LogConfig",
    "LogError",
    "LogOffsetOutOfRangeError",
    "StoredBatch",
]

MAX_SEGMENT_BYTES: Final = 2**31 - 1
"""The largest ``segment_bytes``: file positions in the sparse index are 32-bit."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How partition logs are laid out, made durable and trimmed; every field has a default.

    ``segment_bytes``: a partition rolls to a new segment file when the next
    batch would take the active one past this size (a single larger batch
    gets a segment of its own). ``index_interval_bytes``: one sparse index
    entry per this many bytes of log (0: one per batch).

    ``flush_interval`` is the flush policy. ``0`` (the default): an append is
    acknowledged only once an fsync covers it; concurrent appends share one
    fsync (group commit), run in a worker thread. Readers see only fsynced
    batches. ``> 0``: an append is acknowledged once written to the page
    cache and is visible at once; every partition with unsynced data is
    fsynced every ``flush_interval`` seconds in the background. A process
    crash loses nothing acknowledged in either mode; power loss can lose the
    last interval in interval mode.

    ``retention_seconds``: whole non-active segments whose newest record
    (largest ``max_timestamp``) is older than this are deleted.
    ``retention_bytes``: the oldest non-active segments are deleted while the
    partition is bigger than this. ``None`` turns either rule off. Retention
    is checked every ``retention_check_interval`` seconds.

    ``io_threads`` bounds the worker threads a log manager uses at once for
    fsyncs, deletions and recovery (its own limiter, so that other users of
    Trio's default thread pool cannot delay an acknowledgement).
    """

    segment_bytes: int = 64 * 1024 * 1024
    index_interval_bytes: int = 4096
    flush_interval: float = 0.0
    retention_seconds: float | None = 7 * 86400
    retention_bytes: int | None = None
    retention_check_interval: float = 60.0
    io_threads: int = 8
    repair: bool = False
    """Repair damaged segments when opening (``--repair``): move the damaged bytes aside
    and keep every intact batch before and after them; see :meth:`Segment.repair`."""

    def validate(self) -> None:
        """Raise ValueError naming the first setting that makes no sense."""
        if not 1 <= self.segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(
                f"segment_bytes must be between 1 and {MAX_SEGMENT_BYTES}, not {self.segment_bytes}"
            )
        if self.index_interval_bytes < 0:
            raise ValueError(
                f"index_interval_bytes must be 0 or more, not {self.index_interval_bytes}"
            )
        if not (math.isfinite(self.flush_interval) and self.flush_interval >= 0):
            raise ValueError(
                f"flush_interval must be 0 (fsync every append) or a positive number of "
                f"seconds, not {self.flush_interval}"
            )
        if self.retention_seconds is not None and not (
            math.isfinite(self.retention_seconds) and self.retention_seconds >= 0
        ):
            raise ValueError(
                f"retention_seconds must be None or 0 or more, not {self.retention_seconds}"
            )
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise ValueError(
                f"retention_bytes must be None or 0 or more, not {self.retention_bytes}"
            )
        if not (math.isfinite(self.retention_check_interval) and self.retention_check_interval > 0):
            raise ValueError(
                f"retention_check_interval must be a positive number of seconds, "
                f"not {self.retention_check_interval}"
            )
        if self.io_threads < 1:
            raise ValueError(f"io_threads must be 1 or more, not {self.io_threads}")


class StoredBatch(NamedTuple):
    """One batch as the log holds it: the offsets it was given, and its opaque payload.

    The batch holds the ``count`` records with offsets ``base_offset`` to
    ``next_offset - 1``; ``max_timestamp`` is the largest record timestamp
    in it (milliseconds), as the producer reported it. ``format`` says which
    encoding the payload is in (the log itself never looks inside).
    """

    base_offset: int
    count: int  # type: ignore[assignment]  # the spec'd name shadows tuple.count
    max_timestamp: int
    payload: bytes
    format: int = 1
    """The frame format: 1 a native batch, 3 a Kafka RecordBatch v2 (``log.segment``)."""

    @property
    def next_offset(self) -> int:
        """The offset just after this batch's last record."""
        return self.base_offset + self.count


class LogError(Exception):
    """Something went wrong in the partition log storage (the base of its errors)."""


class LogBusyError(LogError):
    """A transient lack of resources (too many open files): nothing was written; retry.

    Unlike a failed write or fsync of data, after which the state of a file
    is unknown and the partition stops taking appends, this leaves the log
    exactly as it was.
    """


class LogCorruptError(LogError):
    """A segment's bytes are damaged where a torn write cannot explain it.

    ``path`` is the segment file and ``position`` the byte where the damage
    starts; ``offset`` is the first offset the damage may have taken. The
    message says what to do: repair (``--repair``) or restore a backup.
    """

    def __init__(self, message: str, path: Path, position: int, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.position = position
        self.offset = offset


class LogOffsetOutOfRangeError(LogError):
    """An offset outside what a partition holds; the message says the valid range.

    ``offset`` is the offset asked for, ``start`` and ``end`` the partition's
    ``start_offset`` and ``end_offset`` at that moment (both valid to ask
    for; reading at ``end`` returns nothing yet).
    """

    def __init__(self, offset: int, start: int, end: int, where: str) -> None:
        super().__init__(
            f"offset {offset} is out of range for {where}: valid offsets are [{start}, {end}]"
        )
        self.offset = offset
        self.start = start
        self.end = end
