"""The log of one partition: its ordered segments, appends under a flush policy, reads, retention.

Its one job is :class:`PartitionLog`: it assigns offsets to appended
batches, rolls to a new segment when the active one is full, serves reads
by offset and by time, makes appends durable by its flush policy (group
commit), wakes long-poll readers when the end of the log advances, and
deletes old segments for retention. :func:`recover_segments` opens a
partition's directory at start-up. A :class:`~trio_coord.log.LogManager`
creates the logs and runs their background tasks.

**Where the blocking I/O runs.** Appends write to the page cache with
``pwritev`` and reads copy from it with ``pread``, inline on the Trio
thread. Both are memory copies (microseconds for the batch sizes a broker
handles), cheaper than the ~50-100 µs a hand-off to a worker thread costs,
and doing them synchronously is what makes the bookkeeping simple: an
append assigns its offset and writes its bytes without a checkpoint in
between, so offsets follow call order and a reader never sees a half-written
batch. Everything that waits for the disk runs in a worker thread
(``trio.to_thread.run_sync``, on the manager's own limiter): every fsync,
the roll to a new segment (which fsyncs the old one), the deletion of
segments by retention, and the recovery scan at start-up. Two costs remain
on the Trio thread and are accepted: a read of data no longer in the page
cache waits for the disk (a consumer far behind on a cold partition), and a
write may be throttled by the kernel when dirty pages pile up (a disk much
slower than the producers). A log never runs two worker-thread calls at
once (``_io_lock``), so an fsync, a roll, a deletion and the final close
never overlap on the same files.

**Flush policy.** With ``flush_interval == 0`` an append returns once an
fsync covers its batch. The append only asks the partition's syncer task
for an fsync; the syncer fsyncs everything written so far in one worker
thread call, so concurrent appends share one fsync (group commit), and
marks it durable in offset order. ``end_offset``, what readers see, is the
fsynced end: a reader never sees a batch that could still vanish. With
``flush_interval > 0`` an append returns once written, ``end_offset`` moves
at once, and the manager asks every partition with unsynced data for an
fsync every interval. A roll fsyncs the old segment before the new one is
created, in both modes: a segment followed by another one is always
complete on disk, so recovery only needs to distrust the last one.

**Cancellation.** An append cancelled while it waits for the append lock
(behind a roll) has done nothing. An append cancelled while waiting for
its fsync has still consumed its offset: the batch is written and the
fsync it asked for goes ahead in the syncer, so the batch becomes durable
and visible to readers moments later, unless the process dies first. The
caller cannot know which, exactly as when a reply is lost: a cancelled
append may or may not be in the log. Nothing else ever needs cleaning up.

**Failure.** If an fsync or a roll fails, the partition fails stop: after a
failed fsync the kernel may have dropped the dirty pages, so nothing
written since the last good fsync can be trusted. Waiting and later appends
raise :class:`~trio_coord.log.LogError`; reads of the data that was durable
go on. A restart recovers the partition from what the disk holds.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import NoReturn

import trio

from .._files import fsync_dir
from .base import (
    LogBusyError,
    LogConfig,
    LogCorruptError,
    LogError,
    LogOffsetOutOfRangeError,
    StoredBatch,
)
from .segment import (
    FORMAT,
    HEADER,
    MAX_RELATIVE_OFFSET,
    Segment,
    check_batch,
    parse_segment_name,
)

__all__ = ["PartitionLog", "recover_segments"]

logger = logging.getLogger(__name__)


def recover_segments(directory: Path, config: LogConfig) -> list[Segment]:
    """Open the segments of the partition in ``directory`` after a start or crash (worker thread).

    Every segment but the last is loaded as trusted (index rebuilt if
    missing or broken); the last is validated in full and its torn
    tail cut. Index files without a log are removed. The offsets must run
    on from one segment to the next. A directory without segments gets an
    empty one at offset 0. Raises :class:`LogCorruptError` for damage (or,
    with ``config.repair``, repairs it: :meth:`Segment.repair`), and
    :class:`LogError` if the partition cannot be served as it is on disk.
    """
    interval = config.index_interval_bytes
    names = os.listdir(directory)
    bases = sorted(base for name in names if (base := parse_segment_name(name)) is not None)
    known = set(bases)
    for name in names:
        base = parse_segment_name(name, ".index")
        if base is not None and base not in known:
            logger.info("%s: removing index file %s, which has no log", directory, name)
            (directory / name).unlink(missing_ok=True)
    if not bases:
        segment = Segment.create(directory, 0)
        try:
            fsync_dir(directory)
        except BaseException:
            segment.close()
            raise
        return [segment]
    segments: list[Segment] = []
    try:
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            opener = Segment.recover if last else Segment.load
            try:
                segments.append(opener(directory, base, interval))
            except LogCorruptError:
                if not config.repair:
                    raise
                Segment.repair(directory, base, interval, None if last else bases[i + 1])
                segments.append(opener(directory, base, interval))
        for before, after in pairwise(segments):
            if before.next_offset != after.base_offset:
                raise LogCorruptError(
                    f"segments {before.log_path.name} and {after.log_path.name} in {directory} "
                    f"do not follow each other: the first ends at offset {before.next_offset}, "
                    f"the second starts at {after.base_offset} (a segment file is missing or "
                    "was altered). Restore the partition directory from a backup (--repair "
                    "cannot bring back a missing file)",
                    after.log_path,
                    0,
                    before.next_offset,
                )
        fsync_dir(directory)  # a truncation, a cut file or an index rewritten above
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments


class _RollUndone(Exception):
    """A roll failed after the old segment's data was durable, and was undone."""


def _delete_segments(segments: list[Segment]) -> None:
    """Delete segments oldest first (worker thread): a crash leaves a contiguous log."""
    try:
        for segment in segments:
            segment.delete()
    finally:
        for segment in segments:
            segment.close()


class PartitionLog:
    """The log of one partition: append batches, read them back by offset or time.

    Created by :class:`~trio_coord.log.LogManager` (which also runs its
    syncer task); see the module docstring for the flush policy,
    cancellation and failure semantics. All methods must be called from the
    Trio thread that runs the manager.

    ``fsync_count`` counts the fsyncs of log data this partition made
    (group commits and rolls), for tests and benchmarks.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        directory: Path,
        segments: list[Segment],
        config: LogConfig,
        limiter: trio.CapacityLimiter,
        on_advance: Callable[[PartitionLog], None] | None = None,
    ) -> None:
        if not segments:
            raise ValueError("a partition log has at least one segment")
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self.fsync_count = 0
        self.appended = [0, 0]
        """Payload bytes and records appended since the log was opened (by either front
        end: what the metrics count as produced)."""
        self._config = config
        self._limiter = limiter
        self._fsync_mode = config.flush_interval == 0
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        end = segments[-1].next_offset
        self._written = end  # the offset the next batch gets
        self._synced = end  # everything below is fsynced
        self._visible = end  # end_offset: everything below may be read
        self._append_lock = trio.Lock()  # appends in call order, across a roll
        self._io_lock = trio.Lock()  # one worker-thread call at a time
        self._synced_event = trio.Event()
        self._advanced = trio.Event()
        self._on_advance = on_advance
        self._sync_wanted = trio.Event()
        self._stopping = False
        self._closed = False
        self._files_closed = False
        self._failure: BaseException | None = None

    def __repr__(self) -> str:
        return (
            f"<PartitionLog {self.topic}-{self.partition} offsets "
            f"[{self.start_offset}, {self.end_offset}) in {len(self._segments)} segments>"
        )

    @property
    def _where(self) -> str:
        return f"partition {self.topic}-{self.partition} ({self.directory})"

    # -- the public interface ---------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """The first offset the log still holds (advances with retention)."""
        return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        """The offset the next record gets, as far as readers may see.

        With ``flush_interval == 0`` this is the fsynced end: readers never
        see a batch that was not acknowledged. In interval mode it is the
        written end (batches are acknowledged once written).
        """
        return self._visible

    @property
    def segment_count(self) -> int:
        """How many segments the log has now."""
        return len(self._segments)

    async def append(
        self,
        payload: bytes,
        count: int,
        max_timestamp: int,
        *,
        fmt: int = FORMAT,
        assigned: Callable[[int], None] | None = None,
    ) -> int:
        """Append one batch; returns its base offset once acknowledged per the flush policy.

        ``fmt`` is the frame format (``log.segment``: 1 native, 3 Kafka
        RecordBatch v2, whose base offset the append rewrites).
        ``assigned(base)`` is called, synchronously, as soon as the batch is
        written with its offset, before the wait for durability: the
        idempotent producer's state must know a batch's offset even if this
        call is then cancelled.

        Appends are serialized per partition (offsets in call order). The
        batch holds ``count`` records (at least 1) whose largest timestamp
        is ``max_timestamp`` (ms). Raises ValueError for a batch that does
        not fit the format, and :class:`LogError` if the log is closed or
        has failed, or if the write fails (then nothing was appended). See
        the module docstring for what a cancelled append means.
        """
        check_batch(payload, count, max_timestamp, fmt)
        self._check_writable()
        async with self._append_lock:
            self._check_writable()  # it may have closed or failed meanwhile
            segment = self._segments[-1]
            base = self._written
            if segment.size and (
                segment.size + HEADER.size + len(payload) > self._config.segment_bytes
                or base - segment.base_offset > MAX_RELATIVE_OFFSET
            ):
                await self._roll()
                segment = self._segments[-1]
            try:
                segment.append(
                    base, count, max_timestamp, payload, self._config.index_interval_bytes, fmt
                )
            except OSError as exc:
                self._undo_write(segment, exc)
            self._written = base + count
            self.appended[0] += len(payload)
            self.appended[1] += count
            if assigned is not None:
                assigned(base)
            if not self._fsync_mode:
                self._advance(self._written)
                return base
            self._sync_wanted.set()
        await self._wait_synced(base + count)
        return base

    def read(self, offset: int, max_bytes: int) -> list[StoredBatch]:
        """Batches holding offsets >= ``offset``, in order, up to ``max_bytes`` of payload in total.

        The first batch is returned whatever its size (if one exists), so
        that a consumer can get past a batch larger than ``max_bytes``; it
        may start before ``offset`` (the reader skips the records below
        it). Empty list when ``offset == end_offset``. Raises
        :class:`LogOffsetOutOfRangeError` when ``offset < start_offset`` or
        ``offset > end_offset``, and :class:`LogError` if the log is closed
        or a batch read back fails its CRC check.
        """
        self._check_readable()
        start, end = self.start_offset, self._visible
        if not start <= offset <= end:
            raise LogOffsetOutOfRangeError(
                offset, start, end, f"partition {self.topic}-{self.partition}"
            )
        out: list[StoredBatch] = []
        if offset == end:
            return out
        segments = self._segments
        used = 0
        try:
            for i in range(bisect_right(self._bases, offset) - 1, len(segments)):
                used, more = segments[i].read(offset, end, max_bytes, out, used)
                if not more:
                    break
        except OSError as exc:
            raise LogError(f"cannot read {self._where}: {exc}") from exc
        return out

    def subscribe(self) -> trio.Event:
        """An event set the next time ``end_offset`` advances (a fresh event after each advance).

        For long-poll fetches: subscribe, read, and if there was nothing
        new, wait for the event (under a deadline). It is also set when the
        log closes or fails, so that no waiter is left behind.
        """
        return self._advanced

    def batch_at_time(self, timestamp: int) -> StoredBatch | None:
        """The first batch whose ``max_timestamp >= timestamp`` (None: no such batch).

        The caller decodes it to find the exact record. Only batches below
        ``end_offset`` are considered.
        """
        self._check_readable()
        end = self._visible
        try:
            for segment in self._segments:
                if segment.base_offset >= end:
                    break
                if segment.max_timestamp >= timestamp:
                    # The first such batch is in this segment, or is not visible yet.
                    return segment.find_time(timestamp, end)
        except OSError as exc:
            raise LogError(f"cannot read {self._where}: {exc}") from exc
        return None

    def size_bytes(self) -> int:
        """The bytes of the partition's ``.log`` files (written, fsynced or not)."""
        return sum(segment.size for segment in self._segments)

    async def flush(self) -> None:
        """Fsync everything written so far; return once it is durable."""
        self._check_writable()
        await self._sync_to(self._written)

    async def enforce_retention(self, now: float) -> int:
        """Delete old segments by the retention settings; return how many were deleted.

        ``now`` is ``time.time()`` in seconds. Deletes a prefix of the
        non-active segments: each one whose newest record is older than
        ``retention_seconds``, or while the partition is bigger than
        ``retention_bytes``. Never the active (last) segment. ``start_offset``
        advances at once; the files are deleted in a worker thread (a
        failure there is logged, and the files are deleted again after the
        next restart).
        """
        config = self._config
        if self._closed or (config.retention_seconds is None and config.retention_bytes is None):
            await trio.lowlevel.checkpoint()
            return 0
        async with self._io_lock:
            if self._closed:
                return 0
            segments = self._segments
            cutoff = None
            if config.retention_seconds is not None:
                cutoff = (now - config.retention_seconds) * 1000
            size = self.size_bytes()
            n = 0
            while n < len(segments) - 1:
                expired = cutoff is not None and segments[n].max_timestamp < cutoff
                too_big = config.retention_bytes is not None and size > config.retention_bytes
                if not (expired or too_big):
                    break
                size -= segments[n].size
                n += 1
            if not n:
                return 0
            victims = segments[:n]
            del segments[:n], self._bases[:n]
            logger.info(
                "%s: retention deletes %d segments, offsets [%d, %d)",
                self._where,
                n,
                victims[0].base_offset,
                self.start_offset,
            )
            try:
                await trio.to_thread.run_sync(_delete_segments, victims, limiter=self._limiter)
            except OSError as exc:
                logger.error("%s: could not delete old segments: %s", self._where, exc)
            return n

    # -- durability ---------------------------------------------------------------------------

    def _request_sync(self) -> None:
        """Ask the syncer for an fsync if anything written is not durable yet."""
        if self._written > self._synced:
            self._sync_wanted.set()

    async def _run_syncer(self) -> None:
        """Fsync on request until the log closes or fails (runs in the manager's nursery).

        Shielded, so that a closing manager still gets its final fsyncs:
        it returns only once :meth:`_close` has asked it to stop.
        """
        with trio.CancelScope(shield=True):
            while True:
                await self._sync_wanted.wait()
                self._sync_wanted = trio.Event()
                if self._stopping or self._failure is not None:
                    return
                try:
                    await self._sync_to(self._written)
                except LogError:
                    return  # failed: _fail woke every waiter

    async def _sync_to(self, target: int) -> None:
        """Make everything below ``target`` durable; one fsync covers all written so far."""
        async with self._io_lock:
            if self._synced >= target:
                return
            if self._failure is not None:
                raise self._failed_error()
            if self._files_closed:  # pragma: no cover - closing syncs first, or has failed
                raise LogError(f"{self._where} is closed")
            # Every segment but the active one was fsynced by its roll.
            target = self._written
            segment = self._segments[-1]
            try:
                await trio.to_thread.run_sync(segment.sync, limiter=self._limiter)
            except OSError as exc:
                self._fail(exc)
                raise self._failed_error() from exc
            self.fsync_count += 1
            self._mark_synced(target)

    async def _wait_synced(self, target: int) -> None:
        while self._synced < target:
            if self._failure is not None:
                raise self._failed_error()
            await self._synced_event.wait()

    async def _roll(self) -> None:
        """Start a new active segment at the written end (called under the append lock).

        In one worker-thread call: fsync the old segment and write its
        index, then create the new segment and fsync the directory. So a
        segment that has a successor is complete on disk. A failed fsync of
        the old segment's data fails the partition (its state on disk is
        unknown); anything failing after it (too many open files, most
        often) only undoes the roll: :class:`LogBusyError`, and the next
        append tries again.
        """
        async with self._io_lock:
            if self._failure is not None:
                raise self._failed_error()
            old, base = self._segments[-1], self._written
            try:
                new = await trio.to_thread.run_sync(
                    self._roll_files, old, base, limiter=self._limiter
                )
            except _RollUndone as undone:
                self.fsync_count += 1
                self._mark_synced(base)
                logger.warning("%s: could not roll to a new segment: %s", self._where, undone)
                raise LogBusyError(
                    f"{self._where} could not start a new segment ({undone}); nothing was "
                    "written, retry"
                ) from undone
            except OSError as exc:
                self._fail(exc)
                raise self._failed_error() from exc
            self.fsync_count += 1
            self._segments.append(new)
            self._bases.append(base)
            self._mark_synced(base)

    def _roll_files(self, old: Segment, base: int) -> Segment:
        """The file work of a roll (worker thread); :class:`_RollUndone` if only undone."""
        old.sync()  # (a failure here is a data failure: it propagates as OSError)
        new: Segment | None = None
        try:
            old.write_index()
            new = Segment.create(self.directory, base)
            fsync_dir(self.directory)
        except OSError as exc:
            # The old segment stays the active one; a new file must not outlive this
            # (a restart would take it for the last segment, after the old one).
            try:
                if new is not None:
                    new.close()
                    new.log_path.unlink(missing_ok=True)
                old.index_path.unlink(missing_ok=True)
            except OSError as cleanup:
                raise cleanup from exc
            raise _RollUndone(exc) from exc
        return new

    def _undo_write(self, segment: Segment, exc: OSError) -> NoReturn:
        """After a failed write: cut what it may have left, then raise LogError."""
        try:
            segment.truncate_to_size()
        except OSError as cut_exc:
            self._fail(cut_exc)
            raise self._failed_error() from exc
        raise LogError(f"could not append to {self._where}: {exc}") from exc

    def _mark_synced(self, offset: int) -> None:
        if offset > self._synced:
            self._synced = offset
            event, self._synced_event = self._synced_event, trio.Event()
            event.set()
            if self._fsync_mode:
                self._advance(offset)

    def _advance(self, offset: int) -> None:
        if offset > self._visible:
            self._visible = offset
            self._wake_readers()

    def _wake_readers(self) -> None:
        event, self._advanced = self._advanced, trio.Event()
        event.set()
        if self._on_advance is not None:
            self._on_advance(self)

    def _fail(self, exc: BaseException) -> None:
        """Fail stop: refuse appends from now on and wake every waiter with the error."""
        if self._failure is None:
            logger.error(
                "%s: could not make data durable, the partition refuses appends until the "
                "broker restarts: %r",
                self._where,
                exc,
            )
            self._failure = exc
        event, self._synced_event = self._synced_event, trio.Event()
        event.set()
        self._sync_wanted.set()
        self._wake_readers()

    def _failed_error(self) -> LogError:
        return LogError(
            f"{self._where} failed to make data durable ({self._failure!r}); it refuses "
            "appends until the broker restarts and recovers it from disk"
        )

    def _check_writable(self) -> None:
        if self._closed:
            raise LogError(f"{self._where} is closed")
        if self._failure is not None:
            raise self._failed_error()

    def _check_readable(self) -> None:
        if self._closed:
            raise LogError(f"{self._where} is closed")

    # -- closing ----------------------------------------------------------------------------

    async def _close(self) -> None:
        """Refuse new appends, fsync what was written, stop the syncer, close the files.

        Appends already writing or waiting for their fsync complete first.
        Idempotent; the caller shields it.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        async with self._append_lock:  # let an append that is writing or rolling finish
            self._closed = True
        try:
            await self._sync_to(self._written)
        except LogError as exc:
            logger.warning("closing %s: final flush failed: %s", self._where, exc)
        self._stopping = True
        self._sync_wanted.set()
        async with self._io_lock:
            self._files_closed = True
            try:
                await trio.to_thread.run_sync(self._close_files, limiter=self._limiter)
            except OSError as exc:
                logger.warning("closing %s: %s", self._where, exc)
        event, self._synced_event = self._synced_event, trio.Event()
        event.set()
        self._wake_readers()

    def _close_files(self) -> None:
        """Write the active segment's index and close every file (worker thread)."""
        try:
            if self._failure is None:
                self._segments[-1].write_index()
        finally:
            for segment in self._segments:
                segment.close()
