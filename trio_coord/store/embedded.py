"""The embedded metadata store: the whole tree in memory, made durable in one local directory.

Its one job is to give a broker that runs without ZooKeeper a crash-safe
:class:`~trio_coord.store.base.MetadataStore`: :class:`EmbeddedStore` applies
every write to an in-memory tree, makes it durable through a checksummed,
group-committed append-only log with periodic snapshots, recovers from that
log after a crash, and keeps ephemeral nodes (which belong to this process's
session) off disk. Open it with :func:`open_embedded_store`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import struct
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import msgspec
import trio

from .._aio import unwrap_lone_exception
from .._files import fdatasync as _fdatasync
from .._files import fsync_dir as _fsync_dir  # (tests replace it to simulate crashes)
from .._files import lock_directory, mkdir_durably
from .._files import write_file as _write_durably
from ._watch import Registry, WatchIterator, notify, notify_all, registered
from .base import (
    BadVersionError,
    Check,
    Create,
    Delete,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
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
_FORMAT: Final = 1
_FRAME: Final = struct.Struct("<II")  # payload length, CRC32 of payload
_SEQ_DIGITS: Final = 10

# Store life cycle.
_NEW, _OPEN, _CLOSING, _CLOSED = "new", "open", "closing", "closed"


# --------------------------------------------------------------------------
# On-disk records. Each transaction is one ``_Record`` holding fully resolved
# operations with absolute values, so replay needs no decisions. The same
# operation types are applied to the in-memory tree for live writes, so the
# replay path is exercised by every write.


class _LogCreate(msgspec.Struct, array_like=True, frozen=True, tag="c"):
    """Create ``path``; set the parent's cversion/seq/neph to the given values."""

    path: str
    data: bytes
    owner: int  # session id for an ephemeral node (never on disk), else 0
    pcv: int
    pseq: int
    pneph: int


class _LogSet(msgspec.Struct, array_like=True, frozen=True, tag="s"):
    """Replace the data of ``path`` and set its version."""

    path: str
    data: bytes
    version: int


class _LogDelete(msgspec.Struct, array_like=True, frozen=True, tag="d"):
    """Delete the leaf ``path``; set the parent's cversion/seq/neph."""

    path: str
    pcv: int
    pseq: int
    pneph: int


class _LogMeta(msgspec.Struct, array_like=True, frozen=True, tag="m"):
    """Set a node's child bookkeeping (written instead of ephemeral creates/deletes)."""

    path: str
    cversion: int
    seq: int
    neph: int


_LogOp = _LogCreate | _LogSet | _LogDelete | _LogMeta


class _Record(msgspec.Struct, array_like=True, frozen=True):
    """One transaction in the log."""

    lsn: int
    ops: list[_LogOp]


class _SnapNode(msgspec.Struct, array_like=True, frozen=True):
    """One persistent node in a snapshot (parents always precede children)."""

    path: str
    data: bytes
    version: int
    cversion: int
    seq: int
    neph: int


class _Snapshot(msgspec.Struct, frozen=True):
    """The persistent tree as of log sequence number ``lsn``."""

    format: int
    lsn: int
    nodes: list[_SnapNode]


_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(_Record)
_snapshot_decoder = msgspec.msgpack.Decoder(_Snapshot)


def _frame(payload: bytes) -> bytes:
    """Length-prefix and checksum one payload."""
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _next_intact_record(buf: bytes, pos: int, after_lsn: int) -> int | None:
    """Where the first intact, decodable record with an lsn above ``after_lsn`` starts.

    Searched byte by byte from ``pos`` (only after a frame failed its
    checks): None means nothing intact follows, a torn tail; a position
    means damage in the middle of the log, which must not be cut.
    """
    header = _FRAME.size
    while pos + header <= len(buf):
        length, crc = _FRAME.unpack_from(buf, pos)
        end = pos + header + length
        if 0 < length and end <= len(buf) and zlib.crc32(buf[pos + header : end]) == crc:
            try:
                if _record_decoder.decode(buf[pos + header : end]).lsn > after_lsn:
                    return pos
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
        pos += 1
    return None


def _scan_frames(buf: bytes) -> tuple[list[bytes], int]:
    """Split ``buf`` into framed payloads.

    Returns the payloads of the leading run of intact frames and the offset
    where that run ends; after it is a torn tail, or damage (see ``_next_intact_record``).
    """
    payloads: list[bytes] = []
    pos = 0
    header = _FRAME.size
    while pos + header <= len(buf):
        length, crc = _FRAME.unpack_from(buf, pos)
        end = pos + header + length
        if length == 0 or end > len(buf):  # zero-filled or cut short
            break
        payload = buf[pos + header : end]
        if zlib.crc32(payload) != crc:
            break
        payloads.append(payload)
        pos = end
    return payloads, pos


# --------------------------------------------------------------------------
# The in-memory tree.


@dataclass(slots=True, eq=False)
class _Fields:
    """A node's own fields: everything but its children."""

    data: bytes
    owner: int = 0  # ephemeral owner session, 0 if persistent
    version: int = 0
    cversion: int = 0
    seq: int = 0  # next sequential-child suffix
    neph: int = 0  # how many children are ephemeral


@dataclass(slots=True, eq=False)
class _Node(_Fields):
    """A node of the in-memory tree; children are names, looked up in the flat path map."""

    children: set[str] = field(default_factory=set)

    def stat(self) -> Stat:
        """The public stat of this node."""
        return Stat(self.version, self.cversion, self.owner, len(self.children))


def _name(path: str) -> str:
    return path.rpartition("/")[2]


def _apply(nodes: dict[str, _Node], op: _LogOp) -> None:
    """Apply one resolved operation to a tree (live writes and replay alike)."""
    if isinstance(op, _LogSet):
        node = nodes[op.path]
        node.data = op.data
        node.version = op.version
    elif isinstance(op, _LogCreate):
        if op.path in nodes:
            raise ValueError(f"node {op.path!r} already exists")
        parent = nodes[parent_path(op.path)]
        nodes[op.path] = _Node(op.data, op.owner)
        parent.children.add(_name(op.path))
        parent.cversion, parent.seq, parent.neph = op.pcv, op.pseq, op.pneph
    elif isinstance(op, _LogDelete):
        if nodes[op.path].children:
            raise ValueError(f"node {op.path!r} has children")
        del nodes[op.path]
        parent = nodes[parent_path(op.path)]
        parent.children.remove(_name(op.path))
        parent.cversion, parent.seq, parent.neph = op.pcv, op.pseq, op.pneph
    else:
        node = nodes[op.path]
        node.cversion, node.seq, node.neph = op.cversion, op.seq, op.neph


class _SnapshotNotWritten(Exception):
    """A snapshot could not be written, and nothing on disk changed (see ``__cause__``)."""


def _copy_node(node: _Node) -> _Node:
    return dataclasses.replace(node, children=set(node.children))


def _apply_atomically(nodes: dict[str, _Node], ops: Sequence[_LogOp]) -> bool:
    """Apply a record's operations, all or none; False (tree unchanged) if one fails."""
    saved: dict[str, _Node | None] = {}
    try:
        for op in ops:
            for path in (op.path, parent_path(op.path) if op.path != "/" else "/"):
                if path not in saved:
                    node = nodes.get(path)
                    saved[path] = None if node is None else _copy_node(node)
            _apply(nodes, op)
    except (KeyError, ValueError):
        for path, node in saved.items():
            if node is None:
                nodes.pop(path, None)
            else:
                nodes[path] = node
        return False
    return True


@dataclass(frozen=True, slots=True)
class _CreateSequential:
    """Internal op: a :class:`Create` whose name gets the parent's sequence suffix."""

    path: str
    data: bytes
    ephemeral: bool


_InternalOp = Op | _CreateSequential


@dataclass(slots=True, eq=False)
class _Staged(_Fields):
    """A mutable copy of one node's fields, private to a transaction being validated.

    It counts the children instead of copying their names: validating a
    transaction costs nothing per child.
    """

    nchildren: int = 0

    def stat(self) -> Stat:
        return Stat(self.version, self.cversion, self.owner, self.nchildren)


def _check_version(path: str, actual: int, expected: int) -> None:
    if expected != -1 and actual != expected:
        raise BadVersionError(
            f"version mismatch at {path!r}: expected version {expected}, node is at {actual}"
        )


class _Stage:
    """A copy-on-write view of the tree that a transaction is validated against.

    Each op sees the effects of the earlier ops of the same transaction. The
    live tree is not touched; validation produces the resolved operations to
    apply in memory (``mem_ops``) and to log (``disk_ops``, which leave out
    ephemeral nodes and keep only their parents' bookkeeping).
    """

    def __init__(self, nodes: dict[str, _Node], session_id: int) -> None:
        self._nodes = nodes
        self._session_id = session_id
        self._over: dict[str, _Staged | None] = {}
        self.mem_ops: list[_LogOp] = []
        self.disk_ops: list[_LogOp] = []

    def _get(self, path: str) -> _Staged | None:
        try:
            return self._over[path]
        except KeyError:
            pass
        node = self._nodes.get(path)
        staged = None
        if node is not None:
            staged = _Staged(
                node.data,
                node.owner,
                node.version,
                node.cversion,
                node.seq,
                node.neph,
                nchildren=len(node.children),
            )
        self._over[path] = staged
        return staged

    def run(self, op: _InternalOp) -> str | Stat | None:
        """Validate and stage one op; return its multi result or raise."""
        if isinstance(op, Create):
            return self._create(op.path, op.data, op.ephemeral, sequential=False)
        if isinstance(op, _CreateSequential):
            return self._create(op.path, op.data, op.ephemeral, sequential=True)
        if isinstance(op, SetData):
            return self._set(op.path, op.data, op.version)
        if isinstance(op, Delete):
            self._delete(op.path, op.version)
            return None
        self._check(op.path, op.version)
        return None

    def _create(self, path: str, data: bytes, ephemeral: bool, *, sequential: bool) -> str:
        if path == "/" and not sequential:
            raise NodeExistsError("cannot create '/': node already exists")
        parent = parent_path(path)
        p = self._get(parent)
        if p is None:
            raise NoNodeError(f"cannot create {path!r}: parent node {parent!r} does not exist")
        if p.owner:
            raise StoreError(
                f"cannot create {path!r}: parent {parent!r} is an ephemeral node, "
                "and ephemeral nodes cannot have children"
            )
        if sequential:
            path = f"{path}{p.seq:0{_SEQ_DIGITS}d}"
            p.seq += 1
        if self._get(path) is not None:
            raise NodeExistsError(f"cannot create {path!r}: node already exists")
        owner = self._session_id if ephemeral else 0
        p.cversion += 1
        p.nchildren += 1
        if owner:
            p.neph += 1
        self._over[path] = _Staged(data, owner)
        op = _LogCreate(path, data, owner, p.cversion, p.seq, p.neph)
        self.mem_ops.append(op)
        if owner:
            self.disk_ops.append(_LogMeta(parent, p.cversion, p.seq, p.neph))
        else:
            self.disk_ops.append(op)
        return path

    def _set(self, path: str, data: bytes, version: int) -> Stat:
        s = self._get(path)
        if s is None:
            raise NoNodeError(f"cannot set {path!r}: no node at that path")
        _check_version(path, s.version, version)
        s.data = data
        s.version += 1
        op = _LogSet(path, data, s.version)
        self.mem_ops.append(op)
        if not s.owner:
            self.disk_ops.append(op)
        return s.stat()

    def _delete(self, path: str, version: int) -> None:
        if path == "/":
            raise StoreError("cannot delete the root node '/'")
        s = self._get(path)
        if s is None:
            raise NoNodeError(f"cannot delete {path!r}: no node at that path")
        _check_version(path, s.version, version)
        if s.nchildren:
            raise NotEmptyError(
                f"cannot delete {path!r}: it has {s.nchildren} children "
                "(delete them first or pass recursive=True)"
            )
        parent = parent_path(path)
        p = self._get(parent)
        assert p is not None  # a node's parent always exists
        p.cversion += 1
        p.nchildren -= 1
        if s.owner:
            p.neph -= 1
        self._over[path] = None
        op = _LogDelete(path, p.cversion, p.seq, p.neph)
        self.mem_ops.append(op)
        if s.owner:
            self.disk_ops.append(_LogMeta(parent, p.cversion, p.seq, p.neph))
        else:
            self.disk_ops.append(op)

    def _check(self, path: str, version: int) -> None:
        s = self._get(path)
        if s is None:
            raise NoNodeError(f"check of {path!r} failed: no node at that path")
        _check_version(path, s.version, version)


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
