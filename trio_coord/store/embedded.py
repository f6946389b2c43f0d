"""The embedded metadata store: the whole tree in memory, made durable in one local directory.

Its one job is to give a broker that runs without ZooKeeper a crash-safe
:class:`~trio_coord.store.base.MetadataStore`: :class:`EmbeddedStore` applies
every write to an in-memory tree, makes it durable through a checksummed,
group-committed append-only log with periodic snapshots, recovers from that
log after a crash, and keeps ephemeral nodes (which belong to this process's
session) off disk. Open it with :func:`open_embedded_store`. The log's format is
``_wal.py`` and the tree with its transactions ``_tree.py``; this module keeps the
durable files (log, snapshot, lock), recovery, the flusher and the store's API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final, TypeVar

import msgspec
import trio

from .._aio import unwrap_lone_exception
from .._files import fdatasync as _fdatasync
from .._files import fsync_dir as _fsync_dir  # (tests replace it to simulate crashes)
from .._files import lock_directory, mkdir_durably
from .._files import write_file as _write_durably
from ._tree import (
    _SEQ_DIGITS,
    _apply,
    _apply_atomically,
    _copy_node,
    _CreateSequential,
    _InternalOp,
    _name,
    _Node,
    _Stage,
)
from ._wal import (
    _FORMAT,
    _encoder,
    _frame,
    _LogCreate,
    _LogMeta,
    _LogOp,
    _LogSet,
    _next_intact_record,
    _Record,
    _record_decoder,
    _scan_frames,
    _SnapNode,
    _Snapshot,
    _snapshot_decoder,
)
from ._watch import Registry, WatchIterator, notify, notify_all, registered
from .base import (
    Check,
    Create,
    Delete,
    MetadataStore,
    NoNodeError,
    Op,
    SetData,
    Stat,
    StoreClosedError,
    StoreError,
    parent_path,
    validate_path,
)

__all__ = [
    "DEFAULT_COMPACT_BYTES",
    "DEFAULT_COMPACT_RECORDS",
    "EmbeddedStore",
    "open_embedded_store",
]

logger = logging.getLogger(__name__)

DEFAULT_COMPACT_BYTES: Final = 4 * 1024 * 1024
"""Compact (snapshot + fresh log) once the log holds this many bytes."""

DEFAULT_COMPACT_RECORDS: Final = 50_000
"""... or once it holds this many records, whichever comes first."""

LOCK_FILE: Final = "LOCK"
LOG_FILE: Final = "log"
SNAPSHOT_FILE: Final = "snapshot"
_SNAPSHOT_TMP: Final = "snapshot.tmp"

# Store life cycle.
_NEW, _OPEN, _CLOSING, _CLOSED = "new", "open", "closing", "closed"


class _SnapshotNotWritten(Exception):
    """A snapshot could not be written, and nothing on disk changed (see ``__cause__``)."""


_T = TypeVar("_T")


# --------------------------------------------------------------------------
# The store.


class EmbeddedStore(MetadataStore):
    """A :class:`MetadataStore` kept in memory and persisted in ``data_dir``.

    Create it with :func:`open_embedded_store`, which locks and loads the
    directory, runs the background flusher and closes the store on exit.

    Writes are validated and applied to the in-memory tree at once, in call
    order on the Trio thread (so conditional writes are linearizable), and
    each transaction appends one length-prefixed, CRC32-checked msgpack
    record to ``data_dir/log``. The call then waits for durability: a flusher
    task writes and fsyncs everything appended since its last flush in one
    worker-thread call (group commit) and wakes the waiters; if that fails
    the store fails stop (waiters get :class:`StoreError`, later calls
    :class:`StoreClosedError`). Once the log holds ``compact_bytes`` bytes or
    ``compact_records`` records the flusher writes ``data_dir/snapshot``
    (temp file, fsync, ``os.replace``, directory fsync) and empties the log.
    On open the snapshot is loaded, the log replayed and a torn
    tail cut off with a warning.

    Ephemeral nodes are never written to disk; only their parents'
    bookkeeping (child-list version, sequence counter, count of ephemeral
    children) is, so sequence numbers are never reused and a parent's
    ``cversion`` still moves when a crash makes its ephemeral children vanish.

    Reads and watch snapshots (and the errors a call reports, such as
    :class:`NoNodeError` or :class:`BadVersionError`) reflect every write
    issued before them and are returned only once those writes are durable,
    so no caller acts on state a crash could take back. Watches are *woken*
    as soon as a change is applied in memory (before it is fsynced), but the
    snapshot they then yield waits for the same durability point.

    A writer cancelled while it waits for durability still has its write
    applied (as with a ZooKeeper request whose reply was lost): the write is
    logged and becomes durable with the next flush.

    ``flush_count`` counts group commits (worker-thread write+fsync calls) and
    ``compaction_count`` snapshots written, for tests and metrics.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None,
        *,
        compact_bytes: int = DEFAULT_COMPACT_BYTES,
        compact_records: int = DEFAULT_COMPACT_RECORDS,
        repair: bool = False,
    ) -> None:
        """Set up an unopened store; no I/O happens until :func:`open_embedded_store`."""
        if compact_bytes <= 0 or compact_records <= 0:
            raise ValueError("compact_bytes and compact_records must be positive")
        self.data_dir = Path(os.fspath(data_dir)) if data_dir is not None else None
        """Where the tree is persisted; None for an in-memory store (nothing survives)."""
        self.compact_bytes = compact_bytes
        self.compact_records = compact_records
        self.repair = repair
        """Repair a damaged log when opening (``--repair``), instead of refusing to open."""
        self._compact_after = 0  # records in the log before compaction is tried again
        self.flush_count = 0
        self.compaction_count = 0
        self._session_id = secrets.randbits(63) or 1
        self._state = _NEW
        self._nodes: dict[str, _Node] = {"/": _Node(b"")}
        self._ephemerals: set[str] = set()
        self._data_watches: Registry = {}
        self._child_watches: Registry = {}
        # Durability bookkeeping: records get consecutive log sequence numbers.
        self._appended_lsn = 0
        self._durable_lsn = 0
        self._durable_event = trio.Event()
        self._pending: list[tuple[int, bytes]] = []
        self._wakeup = trio.Event()
        self._stopping = False
        self._closed_event = trio.Event()
        self._failure: BaseException | None = None
        self._log_bytes = 0
        self._log_records = 0
        self._lock_fd = -1
        self._log_fd = -1
        # The store's own worker thread, so busy to_thread users elsewhere in
        # the process can never delay a flush.
        self._io_limiter = trio.CapacityLimiter(1)

    @property
    def _log_path(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / LOG_FILE

    @property
    def session_id(self) -> int:
        """This open's random positive 63-bit session id (owner of its ephemeral nodes)."""
        return self._session_id

    # -- opening and closing ------------------------------------------------

    async def _open(self) -> None:
        if self._state != _NEW:
            raise StoreError(f"store in {self.data_dir} was already opened")
        if self.data_dir is None:  # in memory: nothing to load, no thread
            self._state = _OPEN
            await trio.lowlevel.checkpoint()
            return
        try:
            await trio.to_thread.run_sync(self._load, limiter=self._io_limiter)
        except OSError as exc:
            raise StoreError(f"cannot open the metadata store in {self.data_dir}: {exc}") from exc
        self._state = _OPEN

    def _load(self) -> None:
        """Lock the directory, load snapshot and log (runs in a worker thread)."""
        data_dir = self.data_dir
        assert data_dir is not None
        # Every directory entry on the way to the log made durable: each one created
        # now, and data_dir's own (an earlier open may have crashed before syncing it).
        mkdir_durably(data_dir)
        self._lock_fd = _acquire_lock(data_dir)
        try:
            self._load_locked()
        except BaseException:
            self._release()
            raise

    def _load_locked(self) -> None:
        data_dir = self.data_dir
        assert data_dir is not None
        (data_dir / _SNAPSHOT_TMP).unlink(missing_ok=True)
        snap_lsn = self._load_snapshot(data_dir / SNAPSHOT_FILE)

        log_path = self._log_path
        created = not log_path.exists()
        buf = b"" if created else log_path.read_bytes()
        payloads, end = _scan_frames(buf)
        if end < len(buf):
            last = max([snap_lsn, *(_record_decoder.decode(p).lsn for p in payloads[-1:])])
            if _next_intact_record(buf, end + 1, last) is not None:
                if not self.repair:
                    raise StoreError(
                        f"the metadata store's log {log_path} is damaged at byte {end} of "
                        f"{len(buf)} (after record {last}) and intact records follow, so it "
                        "is no torn write; the store is not opened rather than cut there, "
                        "which would silently drop the topics, groups and offsets recorded "
                        "after it. Restore the data directory from a backup, or start the "
                        "broker with --repair to keep every intact record and move the "
                        "damaged log aside (what the damaged bytes held is lost)"
                    )
                payloads, buf = self._repair_log(buf, end, snap_lsn)
                end = len(buf)
        self._log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if end < len(buf):
            # After a crash the tail is the last, unacknowledged batch, torn: nothing
            # intact follows it. Keep the bytes for a post-mortem, then cut.
            kept = data_dir / f"{LOG_FILE}.cut-{end}"
            _write_durably(kept, buf[end:])
            logger.warning(
                "%s: cut a torn tail of %d bytes at offset %d (%d intact "
                "records kept; the cut bytes are in %s)",
                log_path,
                len(buf) - end,
                end,
                len(payloads),
                kept,
            )
            os.ftruncate(self._log_fd, end)
            os.fsync(self._log_fd)
        # Always, not only when the log was just created: a log created or a
        # snapshot renamed by a session that crashed before its directory
        # fsync is visible now, but power loss could still undo it under the
        # records this session is about to acknowledge.
        _fsync_dir(data_dir)

        lsn = snap_lsn
        for payload in payloads:
            try:
                record = _record_decoder.decode(payload)
            except msgspec.DecodeError as exc:
                raise StoreError(f"{log_path}: undecodable record after lsn {lsn}: {exc}") from exc
            if record.lsn <= snap_lsn:
                continue  # already in the snapshot (crash during compaction)
            if record.lsn != lsn + 1:
                raise StoreError(
                    f"{log_path}: log is not contiguous: record {record.lsn} follows {lsn}"
                )
            try:
                for op in record.ops:
                    _apply(self._nodes, op)
            except (KeyError, ValueError) as exc:
                raise StoreError(
                    f"{log_path}: record {record.lsn} does not apply to the tree: {exc!r}"
                ) from exc
            lsn = record.lsn
        self._appended_lsn = self._durable_lsn = lsn
        self._log_bytes = end
        self._log_records = len(payloads)

        # The ephemeral nodes of the previous session are gone: count their
        # removal in the parents' child-list versions, as ZooKeeper would.
        metas: list[_LogOp] = [
            _LogMeta(path, node.cversion + node.neph, node.seq, 0)
            for path, node in self._nodes.items()
            if node.neph
        ]
        if metas:
            for op in metas:
                _apply(self._nodes, op)
            self._appended_lsn = self._durable_lsn = lsn + 1
            data = _frame(_encoder.encode(_Record(lsn + 1, metas)))
            self._write_log(data)
            self._log_bytes += len(data)
            self._log_records += 1

    def _repair_log(self, buf: bytes, end: int, snap_lsn: int) -> tuple[list[bytes], bytes]:
        """Keep every intact record of a damaged log, renumbered; move the original aside.

        The records before the damage and every intact run after it (found
        by resynchronising) are kept if they still apply in order, on top of
        the snapshot; one that depended on what the damage took is dropped,
        and said so. Returns the records kept and the new log's bytes,
        written in place of the old log (kept as ``log.damaged-<position>``).
        """
        data_dir = self.data_dir
        assert data_dir is not None
        records = [_record_decoder.decode(p) for p in _scan_frames(buf)[0]]
        damaged: list[tuple[int, int]] = []
        pos = end
        while pos < len(buf):
            last = max([snap_lsn, *(r.lsn for r in records[-1:])])
            found = _next_intact_record(buf, pos + 1, last)
            if found is None:
                damaged.append((pos, len(buf)))
                break
            damaged.append((pos, found))
            more, run = _scan_frames(buf[found:])
            records.extend(_record_decoder.decode(p) for p in more)
            pos = found + run
        scratch = {path: _copy_node(node) for path, node in self._nodes.items()}
        kept: list[_Record] = []
        dropped: list[int] = []
        for record in records:
            if record.lsn <= snap_lsn:
                continue  # in the snapshot already
            if _apply_atomically(scratch, record.ops):
                kept.append(_Record(snap_lsn + 1 + len(kept), record.ops))
            else:
                dropped.append(record.lsn)
        new = b"".join(_frame(_encoder.encode(r)) for r in kept)
        log_path = self._log_path
        aside = data_dir / f"{LOG_FILE}.damaged-{end}"
        os.replace(log_path, aside)
        _write_durably(log_path, new)
        _fsync_dir(data_dir)
        logger.error(
            "%s: repaired: damaged bytes %s moved aside with the whole log (kept as %s); "
            "%d intact record(s) kept%s",
            log_path,
            ", ".join(f"[{a}, {b})" for a, b in damaged),
            aside,
            len(kept),
            f", {len(dropped)} dropped that depended on what was lost (lsn {dropped})"
            if dropped
            else "",
        )
        return [_encoder.encode(r) for r in kept], new

    def _load_snapshot(self, path: Path) -> int:
        try:
            buf = path.read_bytes()
        except FileNotFoundError:
            return 0
        # A snapshot replaced the log it was made from: nothing can rebuild it.
        fix = (
            "; restore the data directory from a backup (the snapshot replaced the log it was "
            "made from, so --repair cannot rebuild it)"
        )
        payloads, end = _scan_frames(buf)
        if len(payloads) != 1 or end != len(buf):
            raise StoreError(f"snapshot {path} is damaged (bad length or checksum){fix}")
        try:
            snap = _snapshot_decoder.decode(payloads[0])
        except msgspec.DecodeError as exc:
            raise StoreError(f"snapshot {path} is undecodable: {exc}{fix}") from exc
        if snap.format != _FORMAT:
            raise StoreError(f"snapshot {path} has unsupported format {snap.format}")
        nodes = self._nodes
        for entry in snap.nodes:
            node = _Node(entry.data, 0, entry.version, entry.cversion, entry.seq, entry.neph)
            if entry.path == "/":
                nodes["/"] = node
                continue
            parent = nodes.get(parent_path(entry.path))
            if parent is None or entry.path in nodes:
                raise StoreError(f"snapshot {path} is inconsistent at {entry.path!r}")
            nodes[entry.path] = node
            parent.children.add(_name(entry.path))
        return snap.lsn

    def _release(self) -> None:
        """Close the log and release the directory lock."""
        for attr in ("_log_fd", "_lock_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                os.close(fd)  # closing the lock fd drops the flock

    async def aclose(self) -> None:
        """End the session: remove its ephemeral nodes, flush, and refuse further calls.

        Idempotent. Watch iterators raise :class:`StoreClosedError` afterwards.
        """
        if self._state == _CLOSING:
            await self._closed_event.wait()
            return
        if self._state != _OPEN:
            self._state = _CLOSED
            await trio.lowlevel.checkpoint()
            return
        self._state = _CLOSING
        try:
            if self._ephemerals:
                self._commit([Delete(path) for path in sorted(self._ephemerals)])
            try:
                await self._wait_durable(self._appended_lsn)
            except StoreError as exc:
                logger.warning("closing %s: final flush failed: %s", self.data_dir, exc)
        finally:
            self._state = _CLOSED
            self._stop_flusher()
            self._notify_all_watches()
            self._closed_event.set()

    # -- durability -----------------------------------------------------------

    def _append(self, ops: list[_LogOp]) -> None:
        """Queue one transaction record for the flusher (in memory: durable at once)."""
        self._appended_lsn += 1
        if self.data_dir is None:
            self._mark_durable(self._appended_lsn)
            return
        data = _frame(_encoder.encode(_Record(self._appended_lsn, ops)))
        self._pending.append((self._appended_lsn, data))
        self._wakeup.set()

    async def _wait_durable(self, lsn: int) -> None:
        """Return once every record up to ``lsn`` is on disk (always a checkpoint)."""
        if self._durable_lsn >= lsn:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        while self._durable_lsn < lsn:
            if self._failure is not None:
                raise StoreError(
                    f"could not make a write durable in {self._log_path}: {self._failure}; "
                    "the store is closed (fail-stop)"
                ) from self._failure
            await self._durable_event.wait()

    def _mark_durable(self, lsn: int) -> None:
        if lsn > self._durable_lsn:
            self._durable_lsn = lsn
            self._durable_event.set()
            self._durable_event = trio.Event()

    def _fail(self, exc: BaseException) -> None:
        """Fail-stop: wake every waiter with an error and close the store."""
        logger.error("metadata store %s failed, closing it: %r", self.data_dir, exc)
        self._failure = exc
        self._state = _CLOSED
        self._pending.clear()
        self._durable_event.set()
        self._durable_event = trio.Event()
        self._notify_all_watches()
        self._closed_event.set()

    def _stop_flusher(self) -> None:
        self._stopping = True
        self._wakeup.set()

    async def _run_flusher(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Group-commit loop: write and fsync all pending records in one thread call.

        Shielded from outside cancellation so that ``aclose`` can still drain
        during shutdown; it returns once stopped and drained, or after a
        failure.
        """
        with trio.CancelScope(shield=True):
            task_status.started()
            while self._failure is None:
                if not self._pending:
                    if self._stopping:
                        return
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    continue
                batch, self._pending = self._pending, []
                data = b"".join(chunk for _, chunk in batch)
                try:
                    await trio.to_thread.run_sync(self._write_log, data, limiter=self._io_limiter)
                    self.flush_count += 1
                    self._log_bytes += len(data)
                    self._log_records += len(batch)
                    self._mark_durable(batch[-1][0])
                    if (
                        self._log_bytes >= self.compact_bytes
                        or self._log_records >= self.compact_records
                    ) and self._log_records >= self._compact_after:
                        try:
                            await self._compact()
                        except _SnapshotNotWritten as exc:
                            # Nothing changed on disk: the log stays, compaction waits.
                            self._compact_after = self._log_records + 1000
                            logger.warning(
                                "%s: could not write a snapshot (%s); will try again after "
                                "1000 more records",
                                self.data_dir,
                                exc.__cause__,
                            )
                except OSError as exc:
                    self._fail(exc)
                except BaseException as exc:
                    self._fail(exc)
                    raise

    async def _compact(self) -> None:
        """Snapshot the persistent tree and start a fresh log.

        The tree is encoded on the Trio thread (one O(nodes) pass, so that the
        snapshot is a consistent cut); the file work happens in the worker.
        """
        lsn = self._appended_lsn
        snap = _Snapshot(
            _FORMAT,
            lsn,
            [
                _SnapNode(path, n.data, n.version, n.cversion, n.seq, n.neph)
                for path, n in self._nodes.items()
                if not n.owner
            ],
        )
        data = _frame(_encoder.encode(snap))
        await trio.to_thread.run_sync(self._write_snapshot, data, limiter=self._io_limiter)
        self.compaction_count += 1
        self._log_bytes = 0
        self._log_records = 0
        # Records the snapshot already covers need not reach the new log.
        self._pending = [item for item in self._pending if item[0] > lsn]
        self._mark_durable(lsn)

    def _write_log(self, data: bytes) -> None:
        """Append ``data`` to the log and fsync it (worker thread)."""
        view = memoryview(data)
        while view:
            written = os.write(self._log_fd, view)
            view = view[written:]
        _fdatasync(self._log_fd)

    def _write_snapshot(self, data: bytes) -> None:
        """Atomically replace the snapshot, then empty the log (worker thread).

        A failure before the new snapshot replaces the old one (too many
        open files, a full disk) changes nothing that matters: it raises
        :class:`_SnapshotNotWritten` and the store goes on with its log.
        """
        assert self.data_dir is not None
        tmp = self.data_dir / _SNAPSHOT_TMP
        try:
            _write_durably(tmp, data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise _SnapshotNotWritten() from exc
        os.replace(tmp, self.data_dir / SNAPSHOT_FILE)
        _fsync_dir(self.data_dir)
        # A crash before this truncation is harmless: replay skips records
        # whose lsn the snapshot already covers.
        os.ftruncate(self._log_fd, 0)
        os.fsync(self._log_fd)

    # -- transactions ---------------------------------------------------------

    def _check_open(self, what: str, path: str) -> None:
        if self._state == _OPEN:
            return
        if self._state == _NEW:
            reason = "has not been opened (use open_embedded_store)"
        elif self._failure is not None:
            reason = f"is closed after failing to write {self._log_path}: {self._failure}"
        else:
            reason = "is closed"
        raise StoreClosedError(f"cannot {what} {path!r}: the store in {self.data_dir} {reason}")

    def _commit(self, ops: Sequence[_InternalOp]) -> list[str | Stat | None]:
        """Validate ``ops`` on a staged view, then apply, log and notify (synchronous)."""
        stage = _Stage(self._nodes, self._session_id)
        results = [stage.run(op) for op in ops]
        nodes = self._nodes
        for op in stage.mem_ops:
            _apply(nodes, op)
            if isinstance(op, _LogSet):
                notify(self._data_watches, op.path)
                continue
            if isinstance(op, _LogCreate):
                if op.owner:
                    self._ephemerals.add(op.path)
            else:
                self._ephemerals.discard(op.path)
            notify(self._data_watches, op.path)
            notify(self._child_watches, parent_path(op.path))
        if stage.disk_ops:
            self._append(stage.disk_ops)
        return results

    async def _transact(
        self, what: str, path: str, ops: Sequence[_InternalOp]
    ) -> list[str | Stat | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._check_open(what, path)
        except StoreClosedError:
            await trio.lowlevel.cancel_shielded_checkpoint()
            raise
        try:
            results = self._commit(ops)
        except StoreError:
            # The failure was decided against the in-memory tree: like a read,
            # report it only once that tree is durable.
            await self._wait_durable(self._appended_lsn)
            raise
        await self._wait_durable(self._appended_lsn)
        return results

    async def _read(self, what: str, path: str) -> _Node | None:
        """Look up ``path`` for a read; the caller must not await before using the node."""
        validate_path(path)
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._check_open(what, path)
        except StoreClosedError:
            await trio.lowlevel.cancel_shielded_checkpoint()
            raise
        return self._nodes.get(path)

    # -- public API -----------------------------------------------------------

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        """Create a node and return its path (see :meth:`MetadataStore.create`)."""
        if sequential:
            try:
                validate_path(path + "0" * _SEQ_DIGITS)
            except ValueError:
                raise ValueError(f"invalid sequential node path prefix: {path!r}") from None
        else:
            validate_path(path)
        data = _as_bytes(data, path)
        ops: list[_InternalOp] = []
        if make_parents:
            missing: list[str] = []
            ancestor = parent_path(path)
            while ancestor not in self._nodes:
                missing.append(ancestor)
                ancestor = parent_path(ancestor)
            ops.extend(Create(p) for p in reversed(missing))
        if sequential:
            ops.append(_CreateSequential(path, data, ephemeral))
        else:
            ops.append(Create(path, data, ephemeral))
        results = await self._transact("create", path, ops)
        created = results[-1]
        assert isinstance(created, str)
        return created

    async def get(self, path: str) -> tuple[bytes, Stat]:
        """Return the node's data and stat; :class:`NoNodeError` if absent."""
        node = await self._read("get", path)
        if node is None:
            await self._wait_durable(self._appended_lsn)  # absence is state too
            raise NoNodeError(f"cannot get {path!r}: no node at that path")
        result = (node.data, node.stat())
        await self._wait_durable(self._appended_lsn)
        return result

    async def exists(self, path: str) -> Stat | None:
        """Return the node's stat, or None if there is no node at ``path``."""
        node = await self._read("check existence of", path)
        result = None if node is None else node.stat()
        await self._wait_durable(self._appended_lsn)
        return result

    async def children(self, path: str) -> list[str]:
        """Return the sorted names of the node's children; :class:`NoNodeError` if absent."""
        node = await self._read("list children of", path)
        if node is None:
            await self._wait_durable(self._appended_lsn)  # absence is state too
            raise NoNodeError(f"cannot list children of {path!r}: no node at that path")
        result = sorted(node.children)
        await self._wait_durable(self._appended_lsn)
        return result

    async def set(self, path: str, data: bytes, *, version: int = -1) -> Stat:
        """Replace the node's data if its version matches (-1: any); return the new stat."""
        validate_path(path)
        data = _as_bytes(data, path)
        (stat,) = await self._transact("set", path, [SetData(path, data, version)])
        assert isinstance(stat, Stat)
        return stat

    async def delete(self, path: str, *, version: int = -1, recursive: bool = False) -> None:
        """Delete the node, or with ``recursive=True`` its whole subtree in one transaction."""
        validate_path(path)
        ops: list[_InternalOp] = []
        if recursive and path in self._nodes:
            # Check the root's version first, then delete children before parents.
            ops.append(Check(path, version))
            ops.extend(Delete(p) for p in self._postorder(path))
        else:
            ops.append(Delete(path, version))
        await self._transact("delete", path, ops)

    def _postorder(self, root: str) -> list[str]:
        """Paths of the subtree under ``root`` (inclusive), children before parents."""
        out: list[str] = []
        stack = [root]
        nodes = self._nodes
        while stack:
            path = stack.pop()
            out.append(path)
            prefix = path if path.endswith("/") else path + "/"
            stack.extend(prefix + name for name in nodes[path].children)
        out.reverse()
        return out

    async def multi(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        """Apply ``ops`` atomically as one logged transaction (see :meth:`MetadataStore.multi`)."""
        checked: list[_InternalOp] = []
        for op in ops:
            if not isinstance(op, Create | SetData | Delete | Check):
                raise TypeError(f"not a store operation: {op!r}")
            validate_path(op.path)
            if isinstance(op, Create | SetData):
                data = _as_bytes(op.data, op.path)
                if data is not op.data:
                    op = (
                        Create(op.path, data, op.ephemeral)
                        if isinstance(op, Create)
                        else SetData(op.path, data, op.version)
                    )
            checked.append(op)
        first = checked[0].path if checked else "/"
        return await self._transact("run a multi-op starting at", first, checked)

    # -- watches --------------------------------------------------------------

    def _data_snapshot(self, path: str) -> tuple[bytes, Stat] | None:
        node = self._nodes.get(path)
        return None if node is None else (node.data, node.stat())

    def _children_snapshot(self, path: str) -> list[str]:
        node = self._nodes.get(path)
        return [] if node is None else sorted(node.children)

    def _notify_all_watches(self) -> None:
        notify_all(self._data_watches, self._child_watches)

    @asynccontextmanager
    async def _watch(
        self, registry: Registry, what: str, path: str, snapshot: Callable[[str], _T]
    ) -> AsyncIterator[WatchIterator[_T]]:
        """A snapshot iterator; each snapshot is yielded only once it is durable."""
        validate_path(path)
        await trio.lowlevel.checkpoint()
        self._check_open(what, path)

        async def gate() -> None:
            self._check_open(what, path)

        async def read() -> _T:
            snap = snapshot(path)
            await self._wait_durable(self._appended_lsn)
            return snap

        with registered(registry, path) as watch:
            yield WatchIterator(watch, read, gate)

    def watch_data(
        self, path: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[tuple[bytes, Stat] | None]]:
        """Watch one node's data (see :meth:`MetadataStore.watch_data`).

        Woken when the node is created, set or deleted; each snapshot is
        yielded only once it is durable, and equal consecutive snapshots are
        skipped. Raises :class:`StoreClosedError` once the store closes.
        """
        return self._watch(self._data_watches, "watch data of", path, self._data_snapshot)

    def watch_children(
        self, path: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[list[str]]]:
        """Watch a node's sorted child names (see :meth:`MetadataStore.watch_children`).

        Woken when a child is created or deleted; same snapshot rules as
        :meth:`watch_data`.
        """
        return self._watch(self._child_watches, "watch children of", path, self._children_snapshot)


# --------------------------------------------------------------------------
# Helpers.


def _as_bytes(data: object, path: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"node data for {path!r} must be bytes, not {type(data).__name__}")


def _acquire_lock(data_dir: Path) -> int:
    """Take an exclusive flock on ``data_dir/LOCK`` or raise a helpful StoreError."""
    lock_path = data_dir / LOCK_FILE
    try:
        return lock_directory(lock_path)
    except BlockingIOError:
        raise StoreError(
            f"data dir {data_dir} is in use by another process (lock file {lock_path}); "
            "stop that broker or choose another --data-dir"
        ) from None


@asynccontextmanager
async def open_embedded_store(
    data_dir: str | os.PathLike[str] | None,
    *,
    compact_bytes: int = DEFAULT_COMPACT_BYTES,
    compact_records: int = DEFAULT_COMPACT_RECORDS,
    repair: bool = False,
) -> AsyncIterator[EmbeddedStore]:
    """Open (creating if needed) the store in ``data_dir`` for the duration of the block.

    ``data_dir=None`` gives an in-memory store with the same semantics and no
    persistence, no files and no worker threads (ephemeral brokers, and tests
    on Trio's virtual clock).

    Takes the directory's lock (:class:`StoreError` if another process holds
    it), recovers the persisted tree (a damaged log is a :class:`StoreError`
    naming it, unless ``repair``), and runs the group-commit flusher in a
    nursery. On exit the session ends: ephemeral nodes are removed, pending
    writes flushed and the lock released. A lone exception from the block is
    re-raised as is, not wrapped in an exception group.
    """
    store = EmbeddedStore(
        data_dir, compact_bytes=compact_bytes, compact_records=compact_records, repair=repair
    )
    await store._open()
    try:
        with unwrap_lone_exception():
            async with trio.open_nursery() as nursery:
                await nursery.start(store._run_flusher)
                try:
                    yield store
                finally:
                    with trio.CancelScope(shield=True):
                        await store.aclose()
    finally:
        store._release()
