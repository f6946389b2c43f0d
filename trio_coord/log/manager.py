"""The log manager: every partition log under one root directory, and their background tasks.

Its one job is the life cycle of a broker's partition logs:
:func:`open_log_manager` locks the root directory, recovers every partition
found under it (in parallel, in worker threads), runs the background tasks
in its own nursery (each partition's syncer, the interval flusher, the
retention check) and on exit flushes and closes everything.
:class:`LogManager` finds and creates partitions. The layout is::

    <root>/LOCK@                              flock: one process per root
    <root>/<topic>/<partition>/<base>.log     segments, base offset in 20 digits
    <root>/<topic>/<partition>/<base>.index

(``@`` cannot occur in a topic name, so no topic directory can collide with
the lock file, or with ``<topic>@deleted-<ns>``, the name a deleted topic's
directory takes while it is removed, or ``<topic>@orphaned-<ns>``, where
start-up sets aside the logs of a topic the metadata store does not know.)
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import trio

from .._aio import unwrap_lone_exception
from .._files import fsync_dir, lock_directory, mkdir_durably
from ..core.validation import validate_topic_name
from ..protocol.errors import InvalidTopicError
from .base import LogBusyError, LogConfig, LogCorruptError, LogError
from .partition import PartitionLog, recover_segments
from .segment import Segment

__all__ = ["DEFAULT_CONFIG", "LOCK_FILE", "LogManager", "open_log_manager"]

logger = logging.getLogger(__name__)

LOCK_FILE: Final = "LOCK@"
_DELETED: Final = "@deleted-"
_ORPHANED: Final = "@orphaned-"
_PARTITION: Final = re.compile(r"0|[1-9][0-9]*")

DEFAULT_CONFIG: Final = LogConfig()
"""The configuration :func:`open_log_manager` uses unless given one."""

_Key = tuple[str, int]


def _acquire_lock(root: Path) -> int:
    """Take an exclusive flock on ``root/LOCK@`` or raise a LogError saying what to do."""
    lock_path = root / LOCK_FILE
    try:
        return lock_directory(lock_path)
    except BlockingIOError:
        raise LogError(
            f"log directory {root} is in use by another process (lock file {lock_path}); "
            "stop the broker that uses it, or give this one another log directory"
        ) from None


def _scan_root(root: Path) -> list[tuple[str, int, Path]]:
    """Every partition directory under ``root``, sorted; strays are logged and left alone."""
    found: list[tuple[str, int, Path]] = []
    for topic_dir in sorted(root.iterdir()):
        if topic_dir.name == LOCK_FILE:
            continue
        if _DELETED in topic_dir.name:  # a removal cut short by a crash: finish it
            shutil.rmtree(topic_dir, ignore_errors=True)
            continue
        if _ORPHANED in topic_dir.name:
            logger.warning(
                "%s: %s holds the logs of a topic the metadata store did not know (set "
                "aside at an earlier start); remove it once you are sure they are not needed",
                root,
                topic_dir.name,
            )
            continue
        try:
            validate_topic_name(topic_dir.name)
        except InvalidTopicError:
            logger.warning("%s: ignoring %s, which is not a topic directory", root, topic_dir.name)
            continue
        if not topic_dir.is_dir():
            logger.warning("%s: ignoring %s, which is not a directory", root, topic_dir.name)
            continue
        for part_dir in sorted(topic_dir.iterdir()):
            if _PARTITION.fullmatch(part_dir.name) and part_dir.is_dir():
                found.append((topic_dir.name, int(part_dir.name), part_dir))
            else:
                logger.warning(
                    "%s: ignoring %s, which is not a partition directory", topic_dir, part_dir.name
                )
    return sorted(found)


class LogManager:
    """The partition logs of one broker, under one locked root directory.

    Open it with :func:`open_log_manager`. Partitions are found with
    :meth:`get`, made with :meth:`create`, listed with :meth:`partitions`.
    """

    def __init__(self, root: Path, config: LogConfig, *, temporary: bool = False) -> None:
        self.root = root
        self.config = config
        self._temporary = temporary
        self._logs: dict[_Key, PartitionLog] = {}
        self._limiter = trio.CapacityLimiter(config.io_threads)
        self._create_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._lock_fd = -1
        self._closed = False
        self._listeners: list[Callable[[str, int], None]] = []
        self._damaged: dict[_Key, LogCorruptError] = {}
        self._removing: dict[str, trio.Event] = {}  # topic -> set once its files are gone

    def __repr__(self) -> str:
        return f"<LogManager {self.root} with {len(self._logs)} partitions>"

    def on_advance(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(topic, partition)`` each time a partition's end offset
        advances, and when it closes or fails (as :meth:`PartitionLog.subscribe`'s
        event is set): how a broker wakes the fetches parked on any of its
        partitions, including one created after the fetch parked."""
        self._listeners.append(listener)

    def _advanced(self, log: PartitionLog) -> None:
        for listener in self._listeners:
            listener(log.topic, log.partition)

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of ``topic``/``partition``, or None if this manager has none."""
        return self._logs.get((topic, partition))

    def damage(self, topic: str, partition: int) -> LogCorruptError | None:
        """Why the partition was refused at start-up (its files are damaged), or None.

        A damaged partition has no log: it is neither served nor created
        afresh (that would give its offsets out again) until the broker is
        restarted with ``--repair`` or its directory restored.
        """
        return self._damaged.get((topic, partition))

    async def create(self, topic: str, partition: int) -> PartitionLog:
        """The log of ``topic``/``partition``, created (durably, empty) if it does not exist.

        Idempotent: an existing log is returned as it is. Raises
        :class:`~trio_coord.InvalidTopicError` for an illegal topic name,
        ValueError for a negative partition, and :class:`LogError` if the
        manager is closed or the directory cannot be made. Once its worker
        thread has run, the partition is registered even if the call is
        cancelled.
        """
        validate_topic_name(topic)
        if partition < 0:
            raise ValueError(f"partition must be 0 or more, not {partition}")
        key = (topic, partition)
        if key in self._damaged:
            raise self._damaged[key]
        while (removal := self._removing.get(topic)) is not None:
            await removal.wait()  # a topic created again starts empty, in a new directory
        async with self._create_lock:
            existing = self._logs.get(key)
            if existing is not None:
                return existing
            if self._closed or self._nursery is None:
                raise LogError(f"the log manager of {self.root} is closed")
            directory = self.root / topic / str(partition)
            try:
                segments = await trio.to_thread.run_sync(
                    self._make_partition, directory, limiter=self._limiter
                )
            except OSError as exc:
                error = LogBusyError if exc.errno in (errno.EMFILE, errno.ENFILE) else LogError
                raise error(
                    f"cannot create partition {topic}-{partition} in {directory}: {exc}"
                ) from exc
            # From here on no checkpoint: even if cancelled, the log is registered.
            return self._register(topic, partition, directory, segments)

    def partitions(self) -> list[tuple[str, int]]:
        """Every (topic, partition) this manager holds, sorted."""
        return sorted(self._logs)

    def remove_topic(self, topic: str) -> None:
        """Forget a deleted topic's partitions now; close and delete their files soon.

        Its logs leave :meth:`get` at once (produce and fetch find none, and
        a fetch parked on one is woken); in the manager's nursery they are
        closed and ``<root>/<topic>`` is deleted. :meth:`create` for the topic
        waits for that, so that a topic created again under its name starts
        empty. A failure is logged with the directory to remove by hand.
        """
        logs = self._forget(topic)
        if topic in self._removing or self._nursery is None:
            return
        done = self._removing[topic] = trio.Event()
        self._nursery.start_soon(self._remove, topic, logs, _DELETED, done)

    async def set_aside(self, known: Collection[str]) -> list[str]:
        """Move aside the logs of every topic not in ``known``; return those topics.

        Run at start-up, once the metadata store's topics are known: logs of
        a topic deleted while this broker was down (or before a crash let it
        remove them) must not come back if a topic of that name is created
        again. They are renamed ``<topic>@orphaned-<ns>``, not deleted (the
        store may be the wrong one), and a warning names them.
        """
        held = {topic for topic, _ in self._logs} | {topic for topic, _ in self._damaged}
        unknown = sorted(held - set(known))
        for topic in unknown:
            logs = self._forget(topic)
            done = self._removing[topic] = trio.Event()
            await self._remove(topic, logs, _ORPHANED, done)
            logger.warning(
                "%s: topic %s is not in the metadata store (deleted while this broker was "
                "down?); its logs are set aside as %s%s...: remove them once you are sure",
                self.root,
                topic,
                topic,
                _ORPHANED,
            )
        return unknown

    def _forget(self, topic: str) -> list[PartitionLog]:
        """Unregister every partition of ``topic`` (and any damage noted); return its logs."""
        for key in [key for key in self._damaged if key[0] == topic]:
            del self._damaged[key]
        return [self._logs.pop(key) for key in sorted(self._logs) if key[0] == topic]

    async def _remove(
        self, topic: str, logs: list[PartitionLog], suffix: str, done: trio.Event
    ) -> None:
        """Close ``logs`` and rename ``<root>/<topic>`` aside (deleting it unless orphaned)."""
        directory = self.root / topic
        try:
            with trio.CancelScope(shield=True):
                for log in logs:
                    await log._close()
                await trio.to_thread.run_sync(
                    self._rename_aside, directory, suffix, limiter=self._limiter
                )
        except (OSError, LogError) as exc:
            logger.error(
                "could not remove the logs of deleted topic %s (%s): %s; remove it by hand",
                topic,
                directory,
                exc,
            )
        finally:
            del self._removing[topic]
            done.set()

    def _rename_aside(self, directory: Path, suffix: str) -> None:
        """Rename ``directory`` to ``<name><suffix><ns>`` durably; delete it if deleted (thread)."""
        if not directory.exists():
            return
        aside = directory.with_name(f"{directory.name}{suffix}{time.time_ns()}")
        os.rename(directory, aside)
        fsync_dir(directory.parent)
        if suffix == _DELETED:
            shutil.rmtree(aside)

    async def enforce_retention(self, now: float) -> int:
        """Apply retention to every partition (see :meth:`PartitionLog.enforce_retention`).

        Returns the number of segments deleted in all. A partition that
        fails is logged and skipped. The retention task calls this every
        ``retention_check_interval`` seconds.
        """
        deleted = 0
        for key in sorted(self._logs):
            log = self._logs.get(key)
            if log is None:
                continue
            try:
                deleted += await log.enforce_retention(now)
            except (LogError, OSError) as exc:
                logger.error("retention of %s-%d failed: %s", key[0], key[1], exc)
        return deleted

    # -- internals ----------------------------------------------------------------------------

    def _make_partition(self, directory: Path) -> list[Segment]:
        mkdir_durably(directory)
        return recover_segments(directory, self.config)

    def _register(
        self, topic: str, partition: int, directory: Path, segments: list[Segment]
    ) -> PartitionLog:
        log = PartitionLog(
            topic, partition, directory, segments, self.config, self._limiter, self._advanced
        )
        self._logs[(topic, partition)] = log
        if self._nursery is not None:
            # start_soon, not start: the syncer needs no readiness report, and
            # registering must not have a checkpoint that could cancel it halfway.
            self._nursery.start_soon(log._run_syncer)
        return log

    def _lock_and_scan(self) -> list[tuple[str, int, Path]]:
        mkdir_durably(self.root)
        self._lock_fd = _acquire_lock(self.root)
        return _scan_root(self.root)

    async def _open(self) -> None:
        """Lock the root and recover every partition under it, in parallel worker threads."""
        try:
            found = await trio.to_thread.run_sync(self._lock_and_scan, limiter=self._limiter)
        except OSError as exc:
            raise LogError(f"cannot open the partition logs in {self.root}: {exc}") from exc
        recovered: dict[_Key, tuple[Path, list[Segment]]] = {}

        async def recover(topic: str, partition: int, directory: Path) -> None:
            try:
                segments = await trio.to_thread.run_sync(
                    recover_segments, directory, self.config, limiter=self._limiter
                )
            except LogCorruptError as exc:
                # This partition only: the broker serves every other one.
                logger.error("partition %s-%d is refused: %s", topic, partition, exc)
                self._damaged[(topic, partition)] = exc
                return
            except OSError as exc:
                raise LogError(f"cannot recover partition {topic}-{partition}: {exc}") from exc
            recovered[(topic, partition)] = (directory, segments)

        try:
            async with trio.open_nursery() as nursery:
                for topic, partition, directory in found:
                    nursery.start_soon(recover, topic, partition, directory)
        except BaseException:
            for _, segments in recovered.values():
                for segment in segments:
                    segment.close()
            raise
        for (topic, partition), (directory, segments) in sorted(recovered.items()):
            self._register(topic, partition, directory, segments)
        if found:
            logger.info("%s: recovered %d partitions", self.root, len(found))

    def _start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        for log in self._logs.values():
            nursery.start_soon(log._run_syncer)

    async def _run_flusher(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Interval mode: every ``flush_interval``, ask each partition with new data to fsync."""
        task_status.started()
        while True:
            await trio.sleep(self.config.flush_interval)
            for log in list(self._logs.values()):
                log._request_sync()

    async def _run_retention(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Every ``retention_check_interval``, apply retention to every partition."""
        task_status.started()
        while True:
            await trio.sleep(self.config.retention_check_interval)
            await self.enforce_retention(time.time())

    async def _close(self) -> None:
        """Flush and close every partition (in parallel); refuse new ones."""
        async with self._create_lock:  # a create in flight registers its log first
            self._closed = True
        async with trio.open_nursery() as nursery:
            for log in self._logs.values():
                nursery.start_soon(log._close)

    async def _release(self) -> None:
        """Release the root's lock; remove the root if it was a temporary directory."""
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            os.close(fd)  # drops the flock
        if self._temporary:
            await trio.to_thread.run_sync(shutil.rmtree, self.root, True)


@asynccontextmanager
async def open_log_manager(
    root: str | os.PathLike[str] | None, config: LogConfig = DEFAULT_CONFIG
) -> AsyncIterator[LogManager]:
    """Open the partition logs under ``root`` for the duration of the block.

    ``root=None`` uses a temporary directory, removed on exit (ephemeral
    brokers and tests; otherwise the same code path). On enter: validates
    ``config``, takes the root's lock (:class:`LogError` if another process
    holds it), and recovers every partition found under the root. During
    the block, its nursery runs each partition's syncer, the interval
    flusher (``flush_interval > 0``) and the retention check (if a retention
    limit is set). On exit: a final fsync of everything, files closed, lock
    released. A lone exception from the block is re-raised as is, not
    wrapped in an exception group.
    """
    config.validate()
    if root is None:
        path = Path(await trio.to_thread.run_sync(tempfile.mkdtemp, "", "trio_coord-log-"))
    else:
        path = Path(os.fspath(root))
    manager = LogManager(path, config, temporary=root is None)
    try:
        with unwrap_lone_exception():
            await manager._open()
            async with trio.open_nursery() as nursery:
                manager._start(nursery)
                if config.flush_interval > 0:
                    await nursery.start(manager._run_flusher)
                if config.retention_seconds is not None or config.retention_bytes is not None:
                    await nursery.start(manager._run_retention)
                try:
                    yield manager
                finally:
                    with trio.CancelScope(shield=True):
                        await manager._close()
                    nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await manager._release()
