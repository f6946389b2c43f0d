"""Reading topics into Spark: the schema, offset resolution, and the batch and stream readers.

Planning runs where Spark plans (the driver, in a Python worker of its own):
it asks the brokers, through :class:`~._client.BlockingClient`, which
partitions the topics have and where their logs start and end, resolves the
``startingOffsets``/``endingOffsets`` options against that, and cuts the
result into tasks: one per core, each an equal share of the records (see
:func:`~._plan.share_ranges`), when ``register`` told the source how many
cores the session has, else pieces of each partition's range. Bad options
(an unknown topic, an unreachable broker, an offset outside the log) fail
here, before any task runs. Each task then reads its ranges with the client
its Python worker kept from its previous task (or a new one), and yields
Arrow record batches whose types are exactly :data:`ARROW_SCHEMA` (the Arrow
form of :data:`SCHEMA`, built by :mod:`._arrow`); each fetch sends the next
one before its records are decoded, so that the broker reads them while the
task builds Arrow batches (one request ahead, on the same connection, with
no thread); the client goes back to the worker when the task ends, and is
closed when the task fails.

The stream reader keeps the end of what has been read per partition as its
offset (see :mod:`._plan`), discovers new partitions and, for a pattern, new
topics as it goes (they start at their earliest offset), caps each
micro-batch through Spark's read-limit API (``maxRecordsPerBatch``), supports
``Trigger.AvailableNow`` (it reads up to the log ends as of the query's start
and no further), and with a ``group`` commits the end of each finished batch
to the group as a standalone committer: never backwards, and never failing
the query over a commit, since Spark's checkpoint is the source of truth.
With ``failOnDataLoss=false``, a partition whose unread records retention
deleted resumes at its log start in the next batch (one warning naming the
lost offsets) rather than crawling through the gap in empty batches.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..protocol.errors import (
    CoordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    OffsetRegressionError,
    UnknownMemberError,
)
from ..protocol.messages import EARLIEST, LATEST, ListedOffset, TopicPartition
from ._arrow import ARROW_SCHEMA, ROWS_PER_ARROW_BATCH, Pending, Piece, RawPiece, decode_lazily
from ._client import BlockingClient
from ._options import OffsetSpec, OptionError, ReadOptions, SparkSecurity, WriteOptions
from ._plan import (
    OffsetRange,
    admit,
    offsets_from_json,
    offsets_to_json,
    share_ranges,
    split_ranges,
)

__all__ = [
    "ARROW_SCHEMA",
    "SCHEMA",
    "SCHEMA_WITHOUT_HEADERS",
    "BatchReader",
    "DataLossError",
    "StreamReader",
    "commit_forward",
    "read_range",
]

log = logging.getLogger(__name__)

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)
"""The rows a read with ``includeHeaders`` gives, one per record: Spark's Kafka source's
columns, in its order."""
SCHEMA_WITHOUT_HEADERS = StructType([f for f in SCHEMA.fields if f.name != "headers"])
"""The rows a read gives by default (without ``includeHeaders``, as for Kafka)."""


def schema_for(options: ReadOptions | None) -> StructType:
    """The schema of a read with ``options`` (None: options that do not make a read)."""
    return SCHEMA if options is not None and options.include_headers else SCHEMA_WITHOUT_HEADERS


class DataLossError(OffsetOutOfRangeError):
    """Records a read was planned to cover are no longer in the log."""


# -- planning ------------------------------------------------------------------------------


def _client(options: ReadOptions | WriteOptions) -> BlockingClient:
    return BlockingClient(options.bootstrap, timeout=options.timeout, security=options.security)


def topic_partitions(client: BlockingClient, options: ReadOptions) -> list[TopicPartition]:
    """Every partition the read covers (raises UnknownTopicError for a named topic that
    does not exist, OptionError for an assigned partition that does not)."""
    if options.assign:
        counts = client.partition_counts(options.wanted([]))
        missing = [tp for tp in options.assign if tp.partition >= counts[tp.topic]]
        if missing:
            tp = missing[0]
            raise OptionError(
                f'option "assign" names partition {tp.partition} of {tp.topic!r}, which has '
                f"partitions 0 to {counts[tp.topic] - 1}"
            )
        return list(options.assign)
    if options.pattern is None:
        counts = client.partition_counts(options.topics)
    else:
        every = client.partition_counts(None)
        counts = {t: every[t] for t in options.wanted(sorted(every))}
    return [TopicPartition(t, p) for t in sorted(counts) for p in range(counts[t])]


def resolve(
    client: BlockingClient,
    spec: OffsetSpec,
    tps: list[TopicPartition],
    options: ReadOptions,
    name: str,
) -> dict[TopicPartition, int]:
    """The offset ``spec`` means for each of ``tps``, checked against the logs."""
    if not tps:
        return {}
    logs = client.list_offsets(tps, LATEST)  # each answer has the log's start and end
    if spec.kind == "earliest":
        return {tp: logs[tp].log_start for tp in tps}
    if spec.kind == "latest":
        return {tp: logs[tp].log_end for tp in tps}
    if spec.kind == "group":
        assert options.group is not None
        committed = client.committed(options.group)
        return {tp: committed.get(tp, logs[tp].log_start) for tp in tps}
    known = set(tps)
    stray = sorted(tp for tp in spec.offsets if tp not in known)
    if stray:
        raise OptionError(
            f'option "{name}" names {", ".join(map(str, stray))}, which the read does not '
            f"cover (it reads {', '.join(sorted({tp.topic for tp in tps}))} with "
            f"{len(tps)} partitions in all)"
        )
    result = {}
    for tp in tps:
        wanted = spec.offsets.get(tp, EARLIEST if spec.default == "earliest" else LATEST)
        low, high = logs[tp].log_start, logs[tp].log_end
        if wanted == EARLIEST:
            result[tp] = low
        elif wanted == LATEST:
            result[tp] = high
        elif not low <= wanted <= high:
            raise OptionError(
                f'option "{name}": offset {wanted} of {tp} is outside its log, which holds '
                f"offsets {low} to {high} (exclusive)"
            )
        else:
            result[tp] = wanted
    return result


def plan_batch(client: BlockingClient, options: ReadOptions) -> list[OffsetRange]:
    """The ranges a batch read covers, from startingOffsets to endingOffsets.

    A ``pattern`` that matches no topic makes an empty read, with a warning
    (a job over topics that come and go may well find none on some runs).
    """
    tps = topic_partitions(client, options)
    if options.pattern is not None and not tps:
        names = sorted(client.partition_counts(None))
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        log.warning(
            "pattern %r matches no topic (the brokers have %s): the read is empty",
            options.pattern,
            shown or "no topics",
        )
    start = resolve(client, options.starting, tps, options, "startingOffsets")
    end = resolve(client, options.ending, tps, options, "endingOffsets")
    ranges = []
    for tp in tps:
        if start[tp] > end[tp]:
            raise OptionError(
                f"for {tp}, startingOffsets ({start[tp]}) is after endingOffsets ({end[tp]})"
            )
        ranges.append(OffsetRange(tp.topic, tp.partition, start[tp], end[tp]))
    return ranges


# -- reading a range (in a task) -----------------------------------------------------------


def _skip_lost(client: BlockingClient, r: OffsetRange, position: int, fail: bool) -> int:
    start = client.list_offsets([r.tp], EARLIEST)[r.tp].log_start
    if start <= position:
        raise OffsetOutOfRangeError(
            f"{r.tp} answered offset {position} out of range, yet its log starts at {start}"
        )
    if fail:
        raise DataLossError(
            f"records {position} to {min(start, r.end) - 1} of {r.tp} were deleted before "
            "they could be read (the log now starts at "
            f"{start}); set failOnDataLoss=false to skip what is lost"
        )
    log.warning(
        "%s: records %d to %d were deleted before they could be read; skipping them",
        r.tp,
        position,
        min(start, r.end) - 1,
    )
    return start


def _fetches(
    client: BlockingClient,
    r: OffsetRange,
    fetch_max_bytes: int,
    fail_on_data_loss: bool,
    include_headers: bool = True,
    ahead: bool = True,
) -> Generator[list[tuple[int, Piece | RawPiece]], None, None]:
    """The records of ``r``, decoded, one fetch's worth at a time: each a list of
    ``(offset of the first, records)`` chunks in offset order; a chunk that does not start
    where the last one ended follows records lost to retention (failOnDataLoss=false).
    With ``ahead``, each fetch sends the next one before its records are decoded
    (:meth:`BlockingClient.fetch`'s ``ahead_until``)."""
    position = r.start
    until = r.end if ahead else None
    while position < r.end:
        try:
            part = client.fetch(r.tp, position, max_bytes=fetch_max_bytes, ahead_until=until)
        except OffsetOutOfRangeError:
            position = _skip_lost(client, r, position, fail_on_data_loss)
            continue
        if not part.batches:
            if part.log_start > position:
                position = _skip_lost(client, r, position, fail_on_data_loss)
                continue
            raise DataLossError(
                f"{r.tp} ends at offset {part.log_end}, before the end of the range planned "
                f"({r.end}): the broker lost records it had (was it restored from a backup?)"
            )
        chunks = []
        for fetched in part.batches:
            if fetched.base_offset > position:  # the log's start moved past us meanwhile
                position = _skip_lost(client, r, position, fail_on_data_loss)
                break
            low = position - fetched.base_offset
            high = r.end - fetched.base_offset
            if low >= fetched.count or high <= 0:
                continue
            records = decode_lazily(fetched.records, include_headers=include_headers)
            if records.rows != fetched.count:  # (read on, offsets would shift or never end)
                raise InvalidRecordError(
                    f"{r.tp}: the batch at offset {fetched.base_offset} holds {records.rows} "
                    f"records, but the broker says {fetched.count}: its log is damaged; "
                    f"read from offset {fetched.base_offset + fetched.count} on to skip it"
                )
            if low > 0 or high < records.rows:
                records = records.slice(max(0, low), high)
            chunks.append((position, records))
            position += records.rows
            if position >= r.end:
                break
        if chunks:
            yield chunks


def read_range(
    client: BlockingClient,
    r: OffsetRange,
    *,
    fetch_max_bytes: int = 4 * 1024 * 1024,
    fail_on_data_loss: bool = True,
    rows_per_batch: int = ROWS_PER_ARROW_BATCH,
    include_headers: bool = True,
    prefetch: bool = True,
) -> Iterator[pa.RecordBatch]:
    """The records of ``r`` as Arrow batches of :data:`ARROW_SCHEMA` (without the headers
    column unless ``include_headers``), in offset order.

    Offsets are dense (a batch stored at ``base`` holds ``base``, ``base + 1``,
    ...), so the records waiting for the next Arrow batch are columns and the
    offset of their first one. With ``prefetch``, the broker reads the next
    records while this task decodes these (each fetch sends the next before
    its answer is decoded: see :meth:`BlockingClient.fetch`).
    """
    fetches = _fetches(client, r, fetch_max_bytes, fail_on_data_loss, include_headers, prefetch)
    pending = Pending(include_headers)
    first = r.start
    try:
        for position, records in (chunk for fetch in fetches for chunk in fetch):
            if pending and position != first + len(pending):  # records were lost in between
                yield pending.take(r.topic, r.partition, first, len(pending))
            if not pending:
                first = position
            pending.add(records)
            while len(pending) >= rows_per_batch:
                yield pending.take(r.topic, r.partition, first, rows_per_batch)
                first += rows_per_batch
        if pending:
            yield pending.take(r.topic, r.partition, first, len(pending))
    finally:
        client.drop_ahead()  # (a read abandoned half-way: the early answer is read out)


_IDLE_LIMIT = 8
_ClientKey = tuple[str, float, SparkSecurity]
_idle: dict[_ClientKey, BlockingClient] = {}
"""Clients that finished a task in this process, by (bootstrap, timeout, security), for the
next task.

Spark reuses its Python workers from task to task, so a worker's next task
(a read's or a write's) takes the connections of its last one instead of
opening its own. The key holds the login: a connection authenticated as one
user never serves a task that gives another's credentials."""


@contextmanager
def _task_client(options: ReadOptions | WriteOptions) -> Iterator[BlockingClient]:
    """A client for one task: this process's idle one for the same brokers and login, or a
    new one.

    It goes back to the idle pool when the task ends or is abandoned between
    batches (its connections are idle then: every request's answer is read in
    full, and a read abandoned half-way reads out the answer to the fetch it
    sent ahead: see :meth:`BlockingClient.drop_ahead`), and is closed when the
    task fails. It
    keeps its connections but not its metadata: the first request asks the
    brokers afresh, so a topic grown since, or a leader moved, is seen.
    """
    key = (options.bootstrap, options.timeout, options.security)
    client = _idle.pop(key, None)
    if client is None:
        client = _client(options)
    else:
        client.forget_metadata()
    try:
        yield client
    except GeneratorExit:
        _park(key, client)
        raise
    except BaseException:
        client.close()
        raise
    _park(key, client)


def _park(key: _ClientKey, client: BlockingClient) -> None:
    stale = _idle.pop(key, None)
    if stale is not None and stale is not client:
        stale.close()
    while len(_idle) >= _IDLE_LIMIT:
        _idle.pop(next(iter(_idle))).close()
    _idle[key] = client


def close_idle_clients() -> None:
    """Close the clients this process keeps for its next tasks."""
    while _idle:
        _idle.popitem()[1].close()


def task_ranges(partition: InputPartition) -> tuple[OffsetRange, ...]:
    """The ranges a task reads: its InputPartition holds one range or a tuple of them
    (none for Spark's placeholder task of a read without ranges)."""
    value = partition.value
    if isinstance(value, OffsetRange):
        return (value,)
    if isinstance(value, tuple) and all(isinstance(r, OffsetRange) for r in value):
        return value
    return ()


def read_task(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """One task: read the task's ranges, one after the other, with this process's idle
    client or a new one (see :func:`_task_client`)."""
    ranges = task_ranges(partition)
    if not ranges:
        return
    with _task_client(options) as client:
        for r in ranges:
            yield from read_range(
                client,
                r,
                fetch_max_bytes=options.fetch_max_bytes,
                fail_on_data_loss=options.fail_on_data_loss,
                include_headers=options.include_headers,
            )


def _tasks(ranges: list[OffsetRange], options: ReadOptions) -> list[InputPartition]:
    """The read's tasks: equal shares, one per core, when the session's cores are known and
    ``minPartitions`` is not given; otherwise pieces of each range (Kafka's way)."""
    if options.min_partitions is None and options.parallelism is not None:
        shares = share_ranges(ranges, options.parallelism, options.max_records_per_task)
        return [InputPartition(share) for share in shares]
    tasks = split_ranges(ranges, options.max_records_per_task, options.min_partitions)
    return [InputPartition(task) for task in tasks]


class BatchReader(DataSourceReader):
    """``spark.read.format("trio_coord")``: one task per range of a partition."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        """Resolve the offsets and cut them into tasks (at planning, on the driver)."""
        with _client(self.options) as client:
            return _tasks(plan_batch(client, self.options), self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one task's range (on an executor)."""
        return read_task(self.options, partition)


# -- committing a stream's progress to a group ----------------------------------------------


def commit_forward(
    client: BlockingClient, group: str, offsets: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Commit to ``group`` the offsets that move its committed ones forward; return them.

    A commit never moves an offset backwards: partitions already committed as
    far (by a newer run, or the other committer of the same stream) are left
    alone, and a race lost to a commit further ahead is not an error.
    """
    committed = client.committed(group)
    ahead = {tp: o for tp, o in offsets.items() if o > committed.get(tp, -1)}
    if not ahead:
        return {}
    try:
        client.commit(group, ahead, "spark")
    except OffsetRegressionError:
        log.debug("group %s: a concurrent commit went further; keeping it", group)
        return {}
    return ahead


def commit_quietly(
    bootstrap: str,
    group: str,
    offsets: Mapping[TopicPartition, int],
    security: SparkSecurity | None = None,
) -> bool:
    """:func:`commit_forward` with a client of its own; a failure is logged, not raised.

    Returns whether the group now holds ``offsets`` (or went further), so that
    a caller can try the same commit again after a failure.
    """
    try:
        with BlockingClient(
            bootstrap, timeout=10.0, security=security or SparkSecurity.from_env()
        ) as client:
            commit_forward(client, group, offsets)
    except UnknownMemberError as exc:
        log.warning(
            "not committing the stream's progress to group %s: %s (a group that Spark "
            "commits to should have no other consumers)",
            group,
            exc,
        )
    except (CoordError, OSError) as exc:
        log.warning("could not commit the stream's progress to group %s: %s", group, exc)
    else:
        return True
    return False


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("trio_coord")``; see the module docstring."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: BlockingClient | None = None
        self._target: dict[TopicPartition, int] | None = None
        self._initial: dict[TopicPartition, int] | None = None
        self._committed: dict[TopicPartition, int] | None = None
        self._skipped: dict[TopicPartition, int] = {}  # log starts latestOffset skipped to

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # tasks get the options, never a socket
        return state

    @property
    def client(self) -> BlockingClient:
        """The driver-side client (opened on first use, closed by :meth:`stop`)."""
        if self._client is None:
            self._client = _client(self.options)
        return self._client

    def _offset(self, offsets: Mapping[TopicPartition, int]) -> dict[str, Any]:
        group = self.options.group
        return offsets_to_json(
            offsets, group=group, bootstrap=self.options.bootstrap if group else None
        )

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts: startingOffsets, resolved now."""
        tps = topic_partitions(self.client, self.options)
        start = resolve(self.client, self.options.starting, tps, self.options, "startingOffsets")
        self._initial = start
        return self._offset(start)

    def _logs(self) -> dict[TopicPartition, ListedOffset]:
        """Each partition's log start and end offsets, now."""
        tps = topic_partitions(self.client, self.options)
        return self.client.list_offsets(tps, LATEST) if tps else {}

    def _log_ends(self) -> dict[TopicPartition, int]:
        return {tp: o.log_end for tp, o in self._logs().items()}

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the log ends as they are now, and stop there."""
        self._target = self._log_ends()

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRecordsPerBatch`` as a read limit (or no limit)."""
        cap = self.options.max_records_per_batch
        return ReadAllAvailable() if cap is None else ReadMaxRows(cap)

    def _earliest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        return {tp: o.log_start for tp, o in self.client.list_offsets(tps, EARLIEST).items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch: the log ends (or the AvailableNow target),
        capped by ``limit``; ``start`` unchanged when there is nothing new.

        Spark asks this only once the batch that ended at ``start`` is in its
        commit log (one batch at a time; a batch left unfinished by a crash is
        run again before anything new is planned), so ``start``, unless it is
        the query's initial offset, is the end of a finished batch: it is
        committed to the group here, synchronously. This is how the last batch
        of a query reaches the group before ``awaitTermination`` returns (an
        AvailableNow query, or a processing-time one, asks once more to find
        that there is nothing new); Spark's ``commit`` comes one batch later.
        """
        begin = offsets_from_json(start)
        if begin != self._initial:  # the end of a batch Spark has finished: commit it now
            self._commit_through(begin)
        logs = self._logs()
        latest = (
            self._target if self._target is not None else {t: o.log_end for t, o in logs.items()}
        )
        fresh = [tp for tp in latest if tp not in begin]
        resume = {**begin, **self._earliest(fresh)}
        if not self.options.fail_on_data_loss:
            resume = self._skip_deleted(resume, logs)
        for tp, end in latest.items():
            if end < resume[tp]:
                log.warning(
                    "%s ends at %d, before offset %d the stream has read to; "
                    "waiting for it to catch up",
                    tp,
                    end,
                    resume[tp],
                )
        ends = {tp: max(end, resume[tp]) for tp, end in latest.items()}
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        admitted = admit(resume, ends, cap)
        return self._offset({**begin, **admitted})

    def _skip_deleted(
        self, resume: dict[TopicPartition, int], logs: Mapping[TopicPartition, ListedOffset]
    ) -> dict[TopicPartition, int]:
        """``resume``, moved up to the log start where retention deleted records the stream
        had not read yet (failOnDataLoss=false), each loss warned about once, here."""
        moved = dict(resume)
        for tp, at in resume.items():
            listed = logs.get(tp)
            if listed is not None and at < listed.log_start:
                log.warning(
                    "%s: records %d to %d were deleted before the stream read them; "
                    "skipping them (failOnDataLoss=false)",
                    tp,
                    at,
                    listed.log_start - 1,
                )
                moved[tp] = listed.log_start
                self._skipped[tp] = listed.log_start
        return moved

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The log ends, for the query's progress report."""
        return self._offset(self._log_ends())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """The tasks of one micro-batch: the ranges from ``start`` to ``end``."""
        begin = offsets_from_json(start)
        stop = offsets_from_json(end)
        fresh = self._earliest([tp for tp in stop if tp not in begin])
        ranges = []
        for tp in sorted(stop):
            first = begin.get(tp, fresh.get(tp, 0))
            if first < self._skipped.get(tp, first) <= stop[tp]:  # lost, and warned about
                first = self._skipped[tp]
            ranges.append(OffsetRange(tp.topic, tp.partition, first, stop[tp]))
        return _tasks(ranges, self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one task's range (on an executor)."""
        return read_task(self.options, partition)

    def _commit_through(self, done: dict[TopicPartition, int]) -> None:
        """Commit ``done`` (the end of a finished batch) to the group, once it succeeds
        (a failed commit is tried again at Spark's next ``commit`` or batch)."""
        if self.options.group is not None and done != self._committed:
            if commit_quietly(
                self.options.bootstrap, self.options.group, done, self.options.security
            ):
                self._committed = done

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has processed everything before ``end``: commit it to the group, if any."""
        self._commit_through(offsets_from_json(end))

    def stop(self) -> None:
        """The query ended: close the driver-side client."""
        if self._client is not None:
            self._client.close()
            self._client = None
