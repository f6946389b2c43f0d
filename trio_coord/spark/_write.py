"""Writing a DataFrame to a topic: ``df.write.format("trio_coord")``, batch and stream.

The DataFrame's columns say what each record is: ``value`` (required),
``key``, ``headers`` (``array<struct<key string, value binary>>``),
``timestamp``, ``partition`` (otherwise a key picks one by the producer's
stable hash, and records without a key fill a batch of one partition, then
move on to the next), and ``topic`` (where no ``topic`` option is given).
``key`` and ``value`` may be binary or string (stored as UTF-8). Any other
column is refused when the write is planned, so that nothing is silently
dropped.

Spark hands each task its rows as Arrow record batches (the writers are
Arrow writers), and a batch is written in the columnar layout
(:func:`~trio_coord.protocol.records.assemble_columnar`), whose sections are
what Arrow arrays are made of. For the usual shapes (one topic, every row
keyed or none, no ``partition`` or ``headers`` column) the rows stay Arrow
arrays: keyed rows are hashed once per distinct key and sorted by partition
with a stable sort, each partition's rows are sliced into batches cut at
``batchSize`` bytes by bisecting their cumulative sizes, and a closed batch's
timestamps, keys and values are its slices concatenated, whose buffers give
the batch's sections (the lengths with one Arrow call): no Python object per
row. Other rows are kept as
tuples ``(timestamp_ms, key, value, headers)`` and made into the same arrays
when their batch closes. Closed batches are produced :data:`IN_FLIGHT` at a
time, one per partition in flight together
(:meth:`~._client.BlockingClient.produce_many`), each round sent from a
thread while the task encodes the next rows; a round waits for the one
before it, so a partition's batches are stored in the order of its rows.
Delivery is at least once, as with the producer: a task that Spark retries
writes its rows again, and so does a micro-batch that a restarted stream runs
again.
"""

from __future__ import annotations

import array
import logging
import sys
import time
import zlib
from bisect import bisect_right
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from .._routing import partition_for_key
from ..protocol.messages import ProduceRequest, TopicPartition
from ..protocol.records import (
    ALL_PRESENT,
    COLUMNAR,
    COMPRESSION,
    NONE_PRESENT,
    SOME_PRESENT,
    Column,
    Header,
    UntrackedRecord,
    assemble_columnar,
    encode_batch,
)
from ._client import BlockingClient
from ._options import OptionError, WriteOptions
from ._read import _task_client

__all__ = ["BatchWriter", "StreamWriter", "WriteResult", "check_columns", "write_batches"]

log = logging.getLogger(__name__)

_Record = tuple[int, bytes | None, bytes | None, tuple[Header, ...]]
"""A record taken row by row: ``(timestamp_ms, key, value, headers)``."""
_EMPTY: Final = memoryview(b"")
IN_FLIGHT: Final = 8
"""Closed batches a task queues before producing them together (one per partition in
flight at a time). A round is in flight while the next one queues, so closed batches take
up to twice this many batch sizes of memory, besides each partition's open batch."""
ENCODE_BYTES: Final = 256 * 1024 * 1024
"""The most bytes of rows encoded at once; a larger Arrow batch is encoded in halves
(the encoded records of one piece share a buffer of 32-bit offsets)."""


@dataclass(frozen=True)
class WriteResult(WriterCommitMessage):
    """What one task wrote: how many records, in how many Produce requests."""

    records: int
    batches: int


def _kind(data_type: DataType, *allowed: type[DataType]) -> bool:
    return isinstance(data_type, allowed)


def check_columns(schema: StructType, options: WriteOptions) -> None:
    """Refuse a DataFrame whose columns cannot be written as records (at planning)."""
    columns = {f.name: f.dataType for f in schema.fields}
    text_or_bytes = (BinaryType, StringType)
    rules: dict[str, tuple[tuple[type[DataType], ...], str]] = {
        "value": (text_or_bytes, "binary or string"),
        "key": (text_or_bytes, "binary or string"),
        "topic": ((StringType,), "string"),
        "partition": ((IntegerType, LongType, ShortType), "int"),
        "timestamp": ((TimestampType,), "timestamp"),
        "headers": ((ArrayType,), "array<struct<key string, value binary>>"),
    }
    unknown = sorted(set(columns) - set(rules))
    if unknown:
        raise OptionError(
            f"cannot write column(s) {', '.join(unknown)}: a record has only "
            f"{', '.join(rules)}; select or rename the columns to write"
        )
    if "value" not in columns:
        raise OptionError(
            "the DataFrame to write needs a value column (binary or string); "
            'e.g. df.selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")'
        )
    for name, data_type in columns.items():
        kinds, words = rules[name]
        if not _kind(data_type, *kinds):
            raise OptionError(f"column {name} is {data_type.simpleString()}; it must be {words}")
    headers = columns.get("headers")
    if isinstance(headers, ArrayType):
        element = headers.elementType
        names = [f.name for f in element.fields] if isinstance(element, StructType) else []
        if names != ["key", "value"]:
            raise OptionError(
                "column headers must be array<struct<key string, value binary>>, "
                f"not {headers.simpleString()}"
            )
    if options.topic is None and "topic" not in columns:
        raise OptionError(
            'say which topic to write to: the "topic" option, or a topic column in the DataFrame'
        )


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def _as_binary(column: pa.Array) -> pa.Array:
    """A binary or string column as binary (strings: the same UTF-8 bytes)."""
    return column if pa.types.is_binary(column.type) else column.cast(pa.binary())


def _bytes_list(column: pa.Array | None, rows: int) -> list[bytes | None]:
    """A binary or string column as bytes (strings as UTF-8), None where null or absent."""
    if column is None:
        return [None] * rows
    return _as_binary(column).to_pylist()


def _millis(column: pa.Array | None, rows: int, now_ms: int) -> pa.Array:
    """A timestamp column in whole milliseconds (the nearest), ``now_ms`` where null or
    absent, as int64."""
    if column is None:
        return pa.repeat(pa.scalar(now_ms, pa.int64()), rows)
    micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    millis = pc.round(pc.divide(micros.cast(pa.float64()), 1000.0)).cast(pa.int64())
    return pc.fill_null(millis, now_ms)


def _headers_list(column: pa.Array | None, rows: int) -> list[tuple[Header, ...]]:
    if column is None:
        return [()] * rows
    return [
        tuple((h["key"], h["value"] or b"") for h in headers) if headers else ()
        for headers in column.to_pylist()
    ]


# -- records kept as Arrow arrays -----------------------------------------------------------
#
# A partition's open batch is a list of pieces, in row order: slices of a task's Arrow
# columns (timestamps in milliseconds, keys, values), or tuples of rows that took the
# per-row path. A record's size toward ``batchSize`` is its bytes in the columnar layout:
# 8 for its timestamp, 4 for each length, and its key's and value's bytes.

_RECORD_OVERHEAD: Final = 16


def _sizes(key: pa.Array | None, value: pa.Array | None, rows: int) -> array.array[int]:
    """The cumulative columnar sizes of ``rows`` records (``rows + 1`` ends, from 0)."""
    size = pa.repeat(pa.scalar(_RECORD_OVERHEAD, pa.int64()), rows)
    for column in (key, value):
        if column is not None and column.null_count < len(column):
            lengths = pc.fill_null(pc.binary_length(_as_binary(column)), 0).cast(pa.int64())
            size = pc.add(size, lengths)
    ends = array.array("q", [0])
    if rows:
        total = pc.cumulative_sum(size)
        start = total.offset * 8
        ends.frombytes(memoryview(total.buffers()[1]).cast("B")[start : start + 8 * rows])
    return ends


def _buffer_bytes(numbers: pa.Array, width: int) -> memoryview:
    """A fixed-width array's values as its (native-endian) bytes."""
    start = numbers.offset * width
    return memoryview(numbers.buffers()[1]).cast("B")[start : start + width * len(numbers)]


def _arrow_column(column: pa.Array) -> Column:
    """A binary array (offset 0, as concatenated) as a columnar batch's column."""
    rows = len(column)
    if column.null_count == rows:
        return Column(NONE_PRESENT, _EMPTY, _EMPTY, _EMPTY)
    validity = _EMPTY
    if column.null_count:  # an absent element's length must be 0
        validity = memoryview(pc.is_valid(column).buffers()[1])[: (rows + 7) // 8]
        column = pc.fill_null(column, b"")
    if column.offset:
        column = pa.concat_arrays([column])
    _, offsets, data = column.buffers()
    ends = memoryview(offsets).cast("B")[: 4 * (rows + 1)]
    if ends[:4] != b"\0\0\0\0":  # (fill_null may keep a slice's offsets)
        column = pa.concat_arrays([column])
        _, offsets, data = column.buffers()
        ends = memoryview(offsets).cast("B")[: 4 * (rows + 1)]
    size = int.from_bytes(ends[-4:], sys.byteorder)
    body = memoryview(data).cast("B")[:size] if data is not None else _EMPTY
    lengths = b"\0\0\0\0" + bytes(_buffer_bytes(pc.binary_length(column), 4))
    return Column(SOME_PRESENT if len(validity) else ALL_PRESENT, lengths, validity, body)


_Piece = tuple[pa.Array, pa.Array | None, pa.Array | None] | list[_Record]


def _rows_of(pieces: list[_Piece]) -> list[UntrackedRecord]:
    """A batch's pieces as records, one object each (for big-endian hosts)."""
    out: list[UntrackedRecord] = []
    for piece in pieces:
        if isinstance(piece, list):
            out.extend(UntrackedRecord(*r) for r in piece)
            continue
        millis, key, value = piece
        rows = len(millis)
        keys = [None] * rows if key is None else _as_binary(key).to_pylist()
        values = [None] * rows if value is None else _as_binary(value).to_pylist()
        out.extend(map(UntrackedRecord, millis.to_pylist(), keys, values))
    return out


def _columnar_body(pieces: list[_Piece], count: int) -> bytes:
    """The columnar bytes of a batch's pieces (Arrow slices and tuples of rows, in order)."""
    stamps: list[pa.Array] = []
    keys: list[pa.Array] = []
    values: list[pa.Array] = []
    headers: list[tuple[int, tuple[Header, ...]]] = []
    at = 0
    for piece in pieces:
        if isinstance(piece, list):
            stamps.append(pa.array([r[0] for r in piece], pa.int64()))
            keys.append(pa.array([r[1] for r in piece], pa.binary()))
            values.append(pa.array([r[2] for r in piece], pa.binary()))
            headers.extend((at + i, r[3]) for i, r in enumerate(piece) if r[3])
            at += len(piece)
            continue
        millis, key, value = piece
        rows = len(millis)
        stamps.append(millis)
        keys.append(pa.nulls(rows, pa.binary()) if key is None else _as_binary(key))
        values.append(pa.nulls(rows, pa.binary()) if value is None else _as_binary(value))
        at += rows
    timestamps = pa.concat_arrays(stamps)
    return assemble_columnar(
        count,
        _buffer_bytes(timestamps, 8),
        _arrow_column(pa.concat_arrays(keys)),
        _arrow_column(pa.concat_arrays(values)),
        headers,
    )


class _Open:
    """One partition's open batch: its records, in pieces (see above)."""

    __slots__ = ("count", "newest", "pieces", "size")

    def __init__(self) -> None:
        self.pieces: list[_Piece] = []
        self.count = 0
        self.size = 0
        self.newest = -(2**63)


class _Batches:
    """Per-partition open batches of one task, closed when full and at the end, and produced
    :data:`IN_FLIGHT` at a time (see :meth:`drain`)."""

    def __init__(
        self, client: BlockingClient, options: WriteOptions, pool: Executor | None = None
    ) -> None:
        self.client = client
        self.options = options
        self.pool = pool
        self.flying: Future[list[int]] | None = None
        self.ident, self.pack, _ = COMPRESSION[options.compression]
        self.open: dict[TopicPartition, _Open] = {}
        self.ready: list[ProduceRequest] = []
        self.counts: dict[str, int] = {}
        self.sticky: dict[str, int] = {}
        self.records = 0
        self.sent = 0
        context = TaskContext.get()
        self.seed = context.partitionId() if context is not None else 0

    def partitions(self, topic: str) -> int:
        count = self.counts.get(topic)
        if count is None:
            self.wait()  # the client answers one caller at a time
            count = self.counts[topic] = self.client.partition_counts([topic])[topic]
        return count

    def choose(self, topic: str, key: bytes | None, partition: int | None) -> int:
        if partition is not None:  # the client refuses one the topic does not have
            return partition
        if key is not None:
            return partition_for_key(key, self.partitions(topic))
        return self._sticky(topic)

    def _sticky(self, topic: str) -> int:
        sticky = self.sticky.get(topic)
        if sticky is None:
            sticky = self.sticky[topic] = self.seed % self.partitions(topic)
        return sticky

    def add(self, tp: TopicPartition, record: _Record) -> None:
        """Add one record to ``tp``'s open batch, closing the batch first if the record
        would take it past ``batchSize`` (a record larger than that goes alone), and after
        it once full."""
        size = _RECORD_OVERHEAD + len(record[1] or b"") + len(record[2] or b"")
        size += sum(8 + len(name) + len(value) for name, value in record[3])
        batch = self.open.get(tp)
        if batch is not None and batch.count and batch.size + size > self.options.batch_size:
            self.send(tp)
            batch = None
        if batch is None:
            batch = self.open[tp] = _Open()
        if not batch.pieces or not isinstance(batch.pieces[-1], list):
            batch.pieces.append([])
        rows = batch.pieces[-1]
        assert isinstance(rows, list)
        rows.append(record)
        batch.count += 1
        batch.size += size
        batch.newest = max(batch.newest, record[0])
        if batch.size >= self.options.batch_size:
            self.send(tp)

    def extend(
        self,
        tp: TopicPartition,
        millis: pa.Array,
        key: pa.Array | None,
        value: pa.Array | None,
        *,
        fill: bool = False,
    ) -> None:
        """Add the records whose columns are ``millis``, ``key`` and ``value`` (None: absent)
        to ``tp``'s open batch in order, closing each batch before the record that would
        take it past ``batchSize`` (a record larger than that goes alone) or once full:
        the cuts come from the records' cumulative sizes, bisected. With ``fill``, the
        records move on to the topic's next partition each time a batch closes (records
        without a key, as the producer does), and ``tp`` is where they start."""
        rows = len(millis)
        ends = _sizes(key, value, rows)
        limit = self.options.batch_size
        start = 0
        while start < rows:
            batch = self.open.get(tp)
            if batch is None:
                batch = self.open[tp] = _Open()
            # The records that keep the open batch within the limit join it.
            cut = bisect_right(ends, ends[start] - batch.size + limit, start, rows + 1) - 1
            if cut <= start and batch.count:  # the next record does not fit: close first
                self.send(tp)
                if fill:
                    tp = TopicPartition(tp.topic, self._sticky(tp.topic))
                continue
            cut = max(cut, start + 1)  # (a record larger than the limit, alone)
            length = cut - start
            batch.pieces.append(
                (
                    millis.slice(start, length),
                    None if key is None else key.slice(start, length),
                    None if value is None else value.slice(start, length),
                )
            )
            batch.count += length
            batch.size += ends[cut] - ends[start]
            newest = pc.max(millis.slice(start, length)).as_py()
            batch.newest = max(batch.newest, newest)
            start = cut
            if batch.size >= limit or start < rows:  # full, or the next record does not fit
                self.send(tp)
                if fill:
                    tp = TopicPartition(tp.topic, self._sticky(tp.topic))

    def _by_key(self, topic: str, batch: pa.RecordBatch, keys: pa.Array, millis: pa.Array) -> None:
        """Rows that all have a key, to the partitions their keys pick: the hash is computed
        once per distinct key, the rows sorted by partition in Arrow (a stable sort: each
        partition keeps the rows' order), so each partition's records are one slice."""
        count = self.partitions(topic)
        crc32 = zlib.crc32
        distinct = pc.dictionary_encode(keys)
        picks = pa.array([crc32(k) % count for k in distinct.dictionary.to_pylist()], pa.int32())
        chosen = picks.take(distinct.indices)
        order = pc.sort_indices(chosen)
        runs = pc.run_end_encode(chosen.take(order))
        value = _column(batch, "value")
        millis = millis.take(order)
        keys = keys.take(order)
        value = None if value is None else value.take(order)
        start = 0
        for partition, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
            length = end - start
            self.extend(
                TopicPartition(topic, partition),
                millis.slice(start, length),
                keys.slice(start, length),
                None if value is None else value.slice(start, length),
            )
            start = end

    def add_arrow(self, batch: pa.RecordBatch, now_ms: int) -> None:
        """Add the rows of one Arrow batch (columns as :func:`check_columns` allows).

        The usual shapes (one topic, no partition or headers column, every row
        keyed or none) are encoded by Arrow and go by partition in bulk; any
        other row by row.
        """
        rows = batch.num_rows
        if not rows:
            return
        if rows > 1 and batch.nbytes > ENCODE_BYTES:  # Arrow's binary offsets are 32-bit
            half = rows // 2
            self.add_arrow(batch.slice(0, half), now_ms)
            self.add_arrow(batch.slice(half), now_ms)
            return
        key_column = _column(batch, "key")
        millis = _millis(_column(batch, "timestamp"), rows, now_ms)
        topic = self.options.topic
        bulk = topic is not None and all(
            _column(batch, name) is None for name in ("topic", "partition", "headers")
        )
        if bulk and (key_column is None or key_column.null_count == rows):
            assert topic is not None
            self.extend(
                TopicPartition(topic, self._sticky(topic)),
                millis,
                None,
                _column(batch, "value"),
                fill=True,
            )
            return
        if bulk and key_column is not None and key_column.null_count == 0:
            assert topic is not None
            self._by_key(topic, batch, _as_binary(key_column), millis)
            return
        self._row_by_row(batch, millis)

    def _row_by_row(self, batch: pa.RecordBatch, millis: pa.Array) -> None:
        rows = batch.num_rows
        keys = _bytes_list(_column(batch, "key"), rows)
        values = _bytes_list(_column(batch, "value"), rows)
        headers = _headers_list(_column(batch, "headers"), rows)
        records = list(zip(millis.to_pylist(), keys, values, headers, strict=True))
        topic_column = _column(batch, "topic")
        partition_column = _column(batch, "partition")
        topic = self.options.topic
        topics = [topic] * rows if topic_column is None else topic_column.to_pylist()
        partitions = [None] * rows if partition_column is None else partition_column.to_pylist()
        for row_topic, partition, key, record in zip(
            topics, partitions, keys, records, strict=True
        ):
            if not row_topic:
                raise OptionError("a row has no topic: give the topic option or fill the column")
            self.add(TopicPartition(row_topic, self.choose(row_topic, key, partition)), record)

    def send(self, tp: TopicPartition) -> None:
        """Close ``tp``'s open batch: encode it and queue it for :meth:`drain`, which runs
        once :data:`IN_FLIGHT` batches wait."""
        batch = self.open.pop(tp)
        if sys.byteorder == "little":
            payload = bytes((self.ident | COLUMNAR,)) + self.pack(
                _columnar_body(batch.pieces, batch.count)
            )
        else:  # Arrow's buffers are native-endian, the layout little-endian
            payload = encode_batch(_rows_of(batch.pieces), self.options.compression)
        self.ready.append(
            ProduceRequest(tp.topic, tp.partition, payload, batch.count, batch.newest)
        )
        self.records += batch.count
        self.sent += 1
        if tp.topic in self.sticky:  # records without a key move on to the next partition
            self.sticky[tp.topic] = (tp.partition + 1) % self.partitions(tp.topic)
        if len(self.ready) >= IN_FLIGHT:
            self.drain()

    def drain(self) -> None:
        """Produce the queued batches, in rounds of at most one per partition (a round's
        requests in flight together; a partition's batches in the order they were closed).

        With a ``pool`` (one thread), the last round is left in flight while the
        task encodes its next rows: a round is sent only once the one before it
        is answered, so a partition never has two batches in flight.
        """
        while self.ready:
            round_: list[ProduceRequest] = []
            later: list[ProduceRequest] = []
            taken: set[tuple[str, int]] = set()
            for request in self.ready:
                where = (request.topic, request.partition)
                (later if where in taken else round_).append(request)
                taken.add(where)
            self.ready = later
            self.wait()
            if self.pool is None:
                self.client.produce_many(round_)
            else:
                self.flying = self.pool.submit(self.client.produce_many, round_)

    def wait(self) -> None:
        """Wait for the round in flight, if any (raising its error)."""
        flying, self.flying = self.flying, None
        if flying is not None:
            flying.result()

    def flush(self) -> None:
        """Close every open batch and produce everything queued."""
        for tp in sorted(self.open):
            self.send(tp)
        self.drain()
        self.wait()


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteResult:
    """Produce the rows of ``batches`` (one task's) with this process's idle client or a new
    one (as a read's task does: see ``_read._task_client``), each round of requests sent from
    a thread while the next rows are encoded; what was written."""
    with (
        _task_client(options) as client,
        ThreadPoolExecutor(1, thread_name_prefix="trio_coord produce") as pool,
    ):
        out = _Batches(client, options, pool)
        try:
            now_ms = int(time.time() * 1000)
            for batch in batches:
                out.add_arrow(batch, now_ms)
            out.flush()
        finally:
            if out.flying is not None:  # failing: let the round end before the client closes
                wait([out.flying])
        return WriteResult(out.records, out.sent)


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("trio_coord")``: each task produces its rows, which Spark hands it
    as Arrow batches."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_columns(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        """Produce one task's rows (on an executor)."""
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded; their records are stored already."""
        total = sum(m.records for m in messages if isinstance(m, WriteResult))
        log.info("wrote %d records to %s", total, self.options.topic or "the rows' topics")


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("trio_coord")``: each micro-batch's tasks produce their rows."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_columns(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        """Produce one task's rows of a micro-batch (on an executor)."""
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch is written (its records are stored already)."""
        total = sum(m.records for m in messages if isinstance(m, WriteResult))
        log.debug("micro-batch %d: wrote %d records", batchId, total)
