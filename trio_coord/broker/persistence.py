"""Making records durable: the one writer between the coordinator and the metadata store.

Every record the broker keeps (topics, group generations, offsets, group
deletions) goes through :class:`RecordWriter`. Callers ``await
writer.write(records)``; a single flusher task takes everything queued since
its last write and makes it durable in **one** atomic store ``multi``
(group commit: a thousand members auto-committing cost one write, not a
thousand; a transaction carries at most ``max_batch_records`` records and
about ``max_batch_bytes`` bytes, under ZooKeeper's request limit), then
replays the records, in the order they were queued, into the in-memory
state, and only then wakes the callers. So an acknowledged record is
durable, and the in-memory state always equals what a restart would load
(:func:`load_records` reads it back; the broker replays it the same way).

The store layout::

    /topics/<topic>                        TopicRecord (a TopicTombstone deletes the node)
    /groups/<group>                        GroupRecord, or the GroupHead of a split one
                                           (empty data: only a parent of offsets)
    /groups/<group>/offsets/<topic>~<p>    OffsetRecord
    /groups/<group>/chunks/<gen>.<digest>.<i>  piece i of a split GroupRecord

A generation record longer than ``CHUNK_BYTES`` (thousands of members) is
written in two phases: its chunks first, in transactions of their own (no
store node, and no transaction, may exceed ZooKeeper's ``jute.maxbuffer``),
then, in the batch's transaction, a small :class:`GroupHead` naming them in
the group's node, which makes the generation current, together with the
deletion of the chunks of every older generation. Loading follows the head
and joins the chunks it names. A crash between the phases leaves chunks no
head names: loading ignores them (the previous generation loads) and the
group's next generation write deletes them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import trio

from ..core.records import (
    CHUNK_BYTES,
    GroupHead,
    GroupRecord,
    GroupTombstone,
    OffsetRecord,
    OffsetTombstone,
    Record,
    TopicRecord,
    TopicTombstone,
    decode_record,
    decode_stored,
    encode_record,
    join_record,
    split_record,
    supersedes,
)
from ..protocol.messages import TopicPartition
from ..store.base import (
    BadVersionError,
    Create,
    Delete,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    Op,
    SetData,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
)

__all__ = [
    "RecordWriter",
    "chunk_dir",
    "group_path",
    "load_records",
    "offset_path",
    "record_path",
    "topic_path",
]

log = logging.getLogger(__name__)

TOPICS = "/topics"
GROUPS = "/groups"


def topic_path(topic: str) -> str:
    """Where a topic's record lives."""
    return f"{TOPICS}/{topic}"


def group_path(group_id: str) -> str:
    """Where a group's generation record lives (the root of its subtree)."""
    return f"{GROUPS}/{group_id}"


def chunk_dir(group_id: str) -> str:
    """Where the chunks of a group's split generation records live."""
    return f"{GROUPS}/{group_id}/chunks"


def chunk_paths(head: GroupHead) -> list[str]:
    """The paths of the chunks ``head`` names, in order (named by generation and digest, so
    that the chunks of two different records never share a path)."""
    base = chunk_dir(head.group_id)
    return [f"{base}/{head.generation}.{head.digest[:16]}.{i}" for i in range(head.chunks)]


def _chunk_dir_of(path: str) -> str | None:
    """The chunk directory ``path`` is a chunk in, or None."""
    if "/chunks/" not in path or not path.startswith(GROUPS + "/"):
        return None
    parent, _, _ = path.rpartition("/")
    return parent if parent.endswith("/chunks") and parent.count("/") == 3 else None


def offset_path(group_id: str, tp: TopicPartition) -> str:
    """Where one committed offset lives ('~' cannot occur in topic names)."""
    return f"{GROUPS}/{group_id}/offsets/{tp.topic}~{tp.partition}"


def record_path(
    record: TopicRecord | TopicTombstone | GroupRecord | OffsetRecord | OffsetTombstone,
) -> str:
    """Where a record lives in the store (a tombstone: the node it deletes)."""
    if isinstance(record, TopicRecord | TopicTombstone):
        return topic_path(record.name)
    if isinstance(record, GroupRecord):
        return group_path(record.group_id)
    return offset_path(record.group_id, record.tp)


async def load_records(
    store: MetadataStore,
    *,
    topics: bool = True,
    groups: Callable[[str], bool] | None = None,
) -> tuple[list[Record], set[str]]:
    """Read records back from the store, and the set of paths they occupy.

    Topics come first (unless ``topics=False``), then each group's record
    followed by its offsets, the order in which replay needs them. ``groups``
    picks the groups to read (default: all; a cluster coordinator reads the
    groups of one slot). A split generation record is joined from the chunks
    its head names; chunks no head names (left by a crash between the two
    phases of a write) are not read; those beside a head have their paths
    returned, so that the writer deletes them (the writer looks for those of
    a group whose record is whole when it first splits one of its records).
    Raises ValueError if a head's chunks are missing or altered.
    """
    records: list[Record] = []
    paths: set[str] = set()
    for root in (TOPICS, GROUPS):
        if await store.exists(root) is None:
            with contextlib.suppress(NodeExistsError):  # (another broker made it meanwhile)
                await store.create(root, make_parents=True)
        paths.add(root)
    if topics:
        names = await store.children(TOPICS)
        found = await _read_all(store, [topic_path(n) for n in names])
        for name, data in zip(names, found, strict=True):
            if data is not None:  # (None: deleted meanwhile)
                records.append(decode_record(data))
                paths.add(topic_path(name))
    # Every read of a level is in flight at once: a coordinator loading a slot after a
    # failover waits for this, and one ZooKeeper round trip per node in turn adds up.
    wanted = [g for g in await store.children(GROUPS) if groups is None or groups(g)]
    bases = [group_path(g) for g in wanted]
    group_data = await _read_all(store, bases)
    offset_names = await _read_all(store, [f"{b}/offsets" for b in bases], children=True)
    offset_paths = {
        base: [f"{base}/offsets/{name}" for name in names]
        for base, names in zip(bases, offset_names, strict=True)
        if names is not None
    }
    flat = [path for group in offset_paths.values() for path in group]
    offset_data = dict(zip(flat, await _read_all(store, flat), strict=True))
    stored = [decode_stored(data) if data else None for data in group_data]
    heads = [head for head in stored if isinstance(head, GroupHead)]
    chunk_names = await _read_all(store, [chunk_dir(h.group_id) for h in heads], children=True)
    named = [path for head in heads for path in chunk_paths(head)]
    chunk_data = dict(zip(named, await _read_all(store, named), strict=True))
    for head, listed in zip(heads, chunk_names, strict=True):
        base = chunk_dir(head.group_id)
        paths.add(base)  # (it exists: the head's chunks were written first)
        paths.update(f"{base}/{name}" for name in listed or ())
    for base, data, record in zip(bases, group_data, stored, strict=True):
        if data is None:  # deleted by its coordinator meanwhile
            continue
        paths.add(base)
        if isinstance(record, GroupHead):
            pieces = [chunk_data[path] for path in chunk_paths(record)]
            if any(piece is None for piece in pieces):
                raise ValueError(
                    f"group {record.group_id!r} generation {record.generation}: a chunk its "
                    f"head names is missing under {chunk_dir(record.group_id)} (the store was "
                    "altered); restore the store from a backup, or delete the group"
                )
            records.append(join_record(record, [p for p in pieces if p is not None]))
        elif record is not None:
            records.append(record)
        if base not in offset_paths:
            continue
        paths.add(f"{base}/offsets")
        for path in offset_paths[base]:
            offset = offset_data[path]
            if offset is not None:
                records.append(decode_record(offset))
                paths.add(path)
    return records, paths


_READS_IN_FLIGHT = 64


@overload
async def _read_all(
    store: MetadataStore, paths: list[str], *, children: Literal[False] = False
) -> list[bytes | None]: ...


@overload
async def _read_all(
    store: MetadataStore, paths: list[str], *, children: Literal[True]
) -> list[list[str] | None]: ...


async def _read_all(
    store: MetadataStore, paths: list[str], *, children: bool = False
) -> list[bytes | None] | list[list[str] | None]:
    """The data (or children) of every path, None where there is no node.

    ``_READS_IN_FLIGHT`` workers take the paths in turn, so that reads overlap
    (pipelined on a ZooKeeper session) without a task per node. The first
    StoreError stops the others and is raised as itself, as one read would
    raise it (not as a group of every worker's copy of a lost connection,
    which callers retrying on ``StoreConnectionError`` would not recognize).
    """
    results: list[Any] = [None] * len(paths)
    todo = iter(enumerate(paths))
    failure: StoreError | None = None

    async def worker(cancel_scope: trio.CancelScope) -> None:
        nonlocal failure
        try:
            for index, path in todo:
                with contextlib.suppress(NoNodeError):
                    if children:
                        results[index] = await store.children(path)
                    else:
                        results[index] = (await store.get(path))[0]
        except StoreError as exc:
            failure = failure or exc
            cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for _ in range(min(_READS_IN_FLIGHT, len(paths))):
            nursery.start_soon(worker, nursery.cancel_scope)
    if failure is not None:
        raise failure
    return results


DEFAULT_MAX_BATCH_BYTES = 512 * 1024
"""How many bytes of records one store transaction carries at most (estimated; a
single caller's records always go together). ZooKeeper refuses requests beyond its
``jute.maxbuffer`` (1 MiB by default); this leaves room for the paths of parents
created on the way and for the transaction's framing."""

_OP_BYTES = 64  # per operation besides its path and data (header, version, ACL)


def _estimate(records: Sequence[Record]) -> int:
    """The bytes a transaction writing ``records`` roughly takes."""
    total = 0
    for record in records:
        if isinstance(record, GroupTombstone):
            total += _OP_BYTES + len(group_path(record.group_id))
        else:
            total += _OP_BYTES + len(record_path(record))
            if not isinstance(record, OffsetTombstone | TopicTombstone):
                total += len(encode_record(record))
    return total


@dataclass(slots=True)
class _Batch:
    records: list[Record] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
    error: StoreError | None = None
    nbytes: int = 0


class RecordWriter:
    """Batches records into atomic store writes, then replays them; see the module doc.

    ``replay`` applies one durable record to the in-memory state;
    ``current`` returns the durable record in the same place as a given one
    (the committed offset, the group's generation), so that a batch never
    writes what replay would ignore (see ``core.records.supersedes``): store
    and memory stay equal.

    ``guard`` operations open every transaction. A cluster coordinator
    passes ``Check(<its slot's epoch node>, <the epoch it won>)``: once
    another broker has won the slot, the check fails, nothing of the batch
    is written, and :attr:`fenced` is set so that the coordinator steps
    down. The topic writer passes a ``SetData`` of the topics root, which
    every broker watches to learn of new and grown topics.
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        existing_paths: set[str],
        replay: Callable[[Record], None],
        current: Callable[[Record], Record | None],
        max_batch_records: int = 5000,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        guard: Sequence[Op] = (),
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.store = store
        """The store written to (a cluster broker swaps it after a new ZooKeeper session)."""
        self._guard = list(guard)
        self.fenced = trio.Event()
        """Set when a guarded write failed its check: this writer may never write again."""
        self._paths = existing_paths
        self._chunks: dict[str, set[str]] = {}  # chunk directory -> its chunks in _paths
        self._index(existing_paths, present=True)
        self._replay = replay
        self._current = current
        self._max_batch = max_batch_records
        self._max_bytes = max_batch_bytes
        self._chunk_bytes = chunk_bytes
        self._queue: deque[_Batch] = deque()
        self._in_flight: list[_Batch] = []
        self._stopped: StoreError | None = None
        self._uncertain: set[str] = set()  # paths a write with a lost answer created or deleted
        self._wakeup = trio.Event()
        self.writes = 0
        """How many store transactions the writer has made (for tests and benchmarks)."""
        self.on_flush: Callable[[int, float], None] | None = None
        """Told of each store transaction that succeeded: (records, seconds) (metrics)."""

    async def write(self, records: Sequence[Record]) -> None:
        """Return once ``records`` are durable and replayed; StoreError if the write failed."""
        if not records:
            return
        if self._stopped is not None:
            raise self._stopped
        batch = _Batch(list(records), nbytes=_estimate(records))
        self._queue.append(batch)
        self._wakeup.set()
        await batch.done.wait()
        if batch.error is not None:
            raise batch.error

    def pending(self) -> Iterator[Record]:
        """The records written but not yet durable and replayed, oldest first.

        A record is either here or already replayed (replay happens before a
        batch leaves the in-flight list), so together with the in-memory
        state this is everything written so far.
        """
        for batch in [*self._in_flight, *self._queue]:
            yield from batch.records

    def add_existing_paths(self, paths: set[str]) -> None:
        """Tell the writer which store paths exist already (after loading)."""
        self._paths |= paths
        self._index(paths, present=True)

    def forget_paths(self, paths: set[str]) -> None:
        """Tell the writer that these paths are gone (another broker deleted them)."""
        self._paths -= paths
        self._index(paths, present=False)

    def _index(self, paths: set[str], *, present: bool) -> None:
        """Keep ``_chunks`` (the chunk paths among ``_paths``, by directory) in step."""
        for path in paths:
            directory = _chunk_dir_of(path)
            if directory is None:
                continue
            if present:
                self._chunks.setdefault(directory, set()).add(path)
            else:
                self._chunks.get(directory, set()).discard(path)

    async def drain(self) -> None:
        """Return once every record queued before this call is durable (or failed)."""
        if self._stopped is not None:
            return  # nothing is queued: everything before has failed
        batch = _Batch()
        self._queue.append(batch)
        self._wakeup.set()
        await batch.done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The flusher task: write queued batches together, until it is cancelled.

        A cancelled writer (its slot moved, or the broker is stopping) fails
        what it was writing and what was queued, and every later write, with
        :class:`StoreClosedError`: their callers (a commit, a rebalance) are
        not in its cancel scope and would otherwise wait for ever. A write
        cut short may or may not have reached the store; its caller retries
        (on another coordinator), as after a lost connection.
        """
        task_status.started()
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                while self._queue:
                    batches: list[_Batch] = []
                    count = nbytes = 0
                    while self._queue and (
                        not batches
                        or (
                            count + len(self._queue[0].records) <= self._max_batch
                            and nbytes + self._queue[0].nbytes <= self._max_bytes
                        )
                    ):
                        count += len(self._queue[0].records)
                        nbytes += self._queue[0].nbytes
                        batches.append(self._queue.popleft())
                    self._in_flight = batches
                    await self._flush(batches)
                    self._in_flight = []
        finally:
            self._stop(
                StoreClosedError(
                    "the coordinator stopped writing for this group (its slot moved to "
                    "another broker, or the broker is stopping); find the coordinator again"
                )
            )

    def _stop(self, error: StoreError) -> None:
        """Fail every batch not yet done, and every later write, with ``error``."""
        self._stopped = error
        for batch in [*self._in_flight, *self._queue]:
            if not batch.done.is_set():
                batch.error = error
                batch.done.set()
        self._in_flight = []
        self._queue.clear()

    async def _flush(self, batches: list[_Batch]) -> None:
        records = [r for b in batches for r in b.records]
        error: StoreError | None = None
        for segment in _segments(records, self._chunk_bytes):
            error = await self._flush_records(segment)
            if error is not None:
                break
        for batch in batches:
            batch.error = error
            batch.done.set()

    async def _flush_records(self, records: list[Record]) -> StoreError | None:
        """Make ``records`` durable (chunks of split generations first), then replay them."""
        error: StoreError | None = None
        created: set[str] = set()
        deleted: set[str] = set()
        try:
            await self._settle_uncertain()
            await self._look_for_chunks(records)
            chunks, ops, created, deleted = self._ops(records)
            if self.fenced.is_set():
                raise BadVersionError("this coordinator was deposed; its writes are fenced")
            await self._write_chunks(chunks)
            created -= {op.path for op in chunks}
            if ops:
                began = time.perf_counter()
                await self.store.multi([*self._guard, *ops])
                self.writes += 1
                if self.on_flush is not None:
                    self.on_flush(len(records), time.perf_counter() - began)
        except BadVersionError as exc:
            if not self._guard:
                log.error("metadata store write of %d record(s) failed: %s", len(records), exc)
            else:
                log.warning("write of %d record(s) fenced: %s", len(records), exc)
                self.fenced.set()
            error = exc
        except StoreError as exc:
            log.error("metadata store write of %d record(s) failed: %s", len(records), exc)
            error = exc
            if isinstance(exc, StoreConnectionError):
                # The answer was lost, not necessarily the write: until we look, the
                # paths it created or deleted may or may not exist.
                self._uncertain |= created | deleted
        else:
            self._paths -= deleted
            self._paths |= created
            self._index(deleted, present=False)
            self._index(created, present=True)
            for record in records:
                self._replay(record)
        return error

    async def _look_for_chunks(self, records: list[Record]) -> None:
        """Learn which chunks exist for each group a split record of ``records`` is for.

        Loading lists the chunk directories of groups with a split record only;
        a crash in the first split write of a group leaves chunks beside a
        whole record, which this finds before the group's next split write
        (once per group and writer).
        """
        for record in records:
            if not isinstance(record, GroupRecord):
                continue
            directory = chunk_dir(record.group_id)
            if directory in self._paths or len(encode_record(record)) <= self._chunk_bytes:
                continue
            with contextlib.suppress(NoNodeError):
                names = await self.store.children(directory)
                found = {directory, *(f"{directory}/{name}" for name in names)}
                self._paths |= found
                self._index(found, present=True)

    async def _write_chunks(self, chunks: list[Create]) -> None:
        """Phase one: create ``chunks`` (and their parents) in transactions of their own.

        Each transaction is guarded like the batch's and carries about
        ``max_batch_bytes`` at most. What each creates is durable at once,
        whatever becomes of the rest: a failure leaves chunks that no head
        names, which the group's next generation write deletes.
        """
        pending: list[Create] = []
        nbytes = 0
        for op in [*chunks, None]:
            size = 0 if op is None else _OP_BYTES + len(op.path) + len(op.data)
            if pending and (op is None or nbytes + size > self._max_bytes):
                paths = {p.path for p in pending}
                try:
                    await self.store.multi([*self._guard, *pending])
                except StoreConnectionError:
                    self._uncertain |= paths
                    raise
                self.writes += 1
                self._paths |= paths
                self._index(paths, present=True)
                pending, nbytes = [], 0
            if op is not None:
                pending.append(op)
                nbytes += size

    async def _settle_uncertain(self) -> None:
        """Learn whether the paths of a write whose answer was lost exist.

        Without this, the next write would create a node that exists (or
        delete one that does not) and fail, and so would every write after
        it. This writer is its slot's only writer, so what it reads stays
        true until it writes again. (The records of that write were not
        replayed: their callers got an error and send them again.)
        """
        for path in sorted(self._uncertain):
            if await self.store.exists(path) is None:
                self._paths.discard(path)
                self._index({path}, present=False)
            else:
                self._paths.add(path)
                self._index({path}, present=True)
            self._uncertain.discard(path)

    def _ops(self, records: list[Record]) -> tuple[list[Create], list[Op], set[str], set[str]]:
        """The store operations that leave the store as replaying ``records`` leaves memory.

        Returns the chunks to create first (phase one, with the parents they
        need), the operations of the batch's transaction, the paths both
        create and the paths they delete. A generation record longer than
        ``CHUNK_BYTES`` is written as chunks and a head; the transaction that
        writes a group's generation deletes the chunks of its older ones. A
        group tombstone deletes its group's existing subtree first; what later
        records in the batch write for that group is then created anew. An
        offset tombstone deletes one offset node unless a later record in the
        batch writes it again; so does a topic tombstone its topic's node.
        """
        writes: dict[str, Record] = {}  # path -> the record replay will leave there
        doomed: set[str] = set()  # existing paths that a tombstone deletes
        fresh: set[str] = set()  # groups tombstoned in this batch: nothing durable is left
        erased: set[str] = set()  # paths deleted in this batch (unless written again)
        for record in records:
            if isinstance(record, OffsetTombstone | TopicTombstone):
                path = record_path(record)
                writes.pop(path, None)
                erased.add(path)
                continue
            if isinstance(record, GroupTombstone):
                base = group_path(record.group_id)
                for path in [p for p in writes if _under(p, base)]:
                    del writes[path]
                doomed |= {p for p in self._paths if _under(p, base)}
                fresh.add(record.group_id)
                continue
            path = record_path(record)
            if path in writes:
                old: Record | None = writes[path]
            elif path in erased or (
                isinstance(record, OffsetRecord | GroupRecord) and record.group_id in fresh
            ):
                old = None
            else:
                old = self._current(record)
            if supersedes(record, old):
                writes[path] = record
        doomed |= {p for p in erased if p in self._paths and p not in writes}
        ops: list[Op] = [Delete(p) for p in sorted(doomed, key=len, reverse=True)]
        known = self._paths  # (not copied: a batch costs its own records, not the store's size)
        created: set[str] = set()
        chunks: list[Create] = []
        for path, record in writes.items():
            data = encode_record(record)
            if isinstance(record, GroupRecord):
                directory = chunk_dir(record.group_id)
                keep: set[str] = set()
                if len(data) > self._chunk_bytes:
                    head, pieces = split_record(record, self._chunk_bytes, encoded=data)
                    data = encode_record(head)  # type: ignore[arg-type]
                    for chunk, piece in zip(chunk_paths(head), pieces, strict=True):
                        keep.add(chunk)
                        if chunk in known and chunk not in doomed:
                            continue  # (written by a write that failed after: same bytes)
                        for parent in _ancestors(chunk):
                            if parent not in created and (parent not in known or parent in doomed):
                                chunks.append(Create(parent))
                                created.add(parent)
                        chunks.append(Create(chunk, piece))
                        created.add(chunk)
                stale = self._chunks.get(directory, set()) - keep - doomed
                ops.extend(Delete(chunk) for chunk in sorted(stale))
                doomed |= stale
            for parent in _ancestors(path):
                if parent not in created and (parent not in known or parent in doomed):
                    ops.append(Create(parent))
                    created.add(parent)
            if path in created or (path in known and path not in doomed):
                ops.append(SetData(path, data))
            else:
                ops.append(Create(path, data))
                created.add(path)
        return chunks, ops, created, doomed


def _segments(records: list[Record], chunk_bytes: int) -> list[list[Record]]:
    """``records`` cut after a group tombstone followed by a split record of that group.

    The chunks of a split generation are written before the transaction
    that would delete the group's old subtree, so a group deleted and
    written again in one batch takes two transactions, in order.
    """
    segments: list[list[Record]] = []
    current: list[Record] = []
    tombstoned: set[str] = set()
    for record in records:
        group = getattr(record, "group_id", None)
        if (
            group in tombstoned
            and isinstance(record, GroupRecord)
            and len(encode_record(record)) > chunk_bytes
        ):
            segments.append(current)
            current, tombstoned = [], set()
        current.append(record)
        if isinstance(record, GroupTombstone):
            tombstoned.add(record.group_id)
    segments.append(current)
    return segments


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base + "/")


def _ancestors(path: str) -> list[str]:
    """The proper ancestors of ``path`` below the root, outermost first."""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]
