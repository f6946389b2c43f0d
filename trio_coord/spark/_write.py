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
Arrow writers): a task turns each column into a list at once (strings to
UTF-8 bytes by an Arrow cast, timestamps to milliseconds by Arrow compute),
zips them into record tuples (which msgpack-encode exactly as
``WireRecord``s do, in the format of :mod:`trio_coord.protocol.records`),
packs them into batches of about ``batchSize`` bytes per partition, appends
each batch with one Produce request through its own blocking client, and
closes the client when it is done.
Delivery is at least once, as with the producer: a task that Spark retries
writes its rows again, and so does a micro-batch that a restarted stream runs
again.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter

import msgspec
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

from ..client.producer import partition_for_key
from ..protocol.messages import TopicPartition
from ..protocol.records import COMPRESSION, Header
from ._client import BlockingClient
from ._options import OptionError, WriteOptions

__all__ = ["BatchWriter", "StreamWriter", "WriteResult", "check_columns", "write_batches"]

log = logging.getLogger(__name__)

_RECORD_OVERHEAD = 24
_Record = tuple[int, bytes | None, bytes | None, tuple[Header, ...]]
"""A record as the batch format stores it: ``[timestamp_ms, key, value, headers]`` (a
tuple encodes as the same msgpack array as a ``WireRecord``, without making one)."""
_encoder = msgspec.msgpack.Encoder()


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


def _bytes_list(column: pa.Array | None, rows: int) -> list[bytes | None]:
    """A binary or string column as bytes (strings as UTF-8), None where null or absent."""
    if column is None:
        return [None] * rows
    if not pa.types.is_binary(column.type):
        column = column.cast(pa.binary())  # string (the same bytes), or all null
    return column.to_pylist()


def _timestamps_ms(column: pa.Array | None, rows: int, now_ms: int) -> list[int]:
    """A timestamp column in whole milliseconds (the nearest), ``now_ms`` where null."""
    if column is None:
        return [now_ms] * rows
    micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    millis = pc.round(pc.divide(micros.cast(pa.float64()), 1000.0)).cast(pa.int64())
    return pc.fill_null(millis, now_ms).to_pylist()


def _sizes(key: pa.Array | None, value: pa.Array | None, rows: int) -> list[int]:
    """About what each record takes in a batch: a fixed overhead, its key and its value."""
    total = pa.repeat(pa.scalar(_RECORD_OVERHEAD, pa.int64()), rows)
    for column in (key, value):
        if column is not None:
            if not pa.types.is_binary(column.type):
                column = column.cast(pa.binary())  # string, or all null
            length = pc.fill_null(pc.binary_length(column), 0).cast(pa.int64())
            total = pc.add(total, length)
    return total.to_pylist()


def _headers_list(column: pa.Array | None, rows: int) -> list[tuple[Header, ...]]:
    if column is None:
        return [()] * rows
    return [
        tuple((h["key"], h["value"] or b"") for h in headers) if headers else ()
        for headers in column.to_pylist()
    ]


class _Batches:
    """Per-partition open batches of one task, sent when full and at the end."""

    def __init__(self, client: BlockingClient, options: WriteOptions) -> None:
        self.client = client
        self.options = options
        self.ident, self.pack, _ = COMPRESSION[options.compression]
        self.open: dict[TopicPartition, tuple[list[_Record], list[int]]] = {}
        self.counts: dict[str, int] = {}
        self.sticky: dict[str, int] = {}
        self.records = 0
        self.sent = 0
        context = TaskContext.get()
        self.seed = context.partitionId() if context is not None else 0

    def partitions(self, topic: str) -> int:
        count = self.counts.get(topic)
        if count is None:
            count = self.counts[topic] = self.client.partition_counts([topic])[topic]
        return count

    def choose(self, topic: str, key: bytes | None, partition: int | None) -> int:
        if partition is not None:  # the client refuses one the topic does not have
            return partition
        if key is not None:
            return partition_for_key(key, self.partitions(topic))
        sticky = self.sticky.get(topic)
        if sticky is None:
            sticky = self.sticky[topic] = self.seed % self.partitions(topic)
        return sticky

    def add(self, tp: TopicPartition, record: _Record, size: int) -> None:
        """Add one record of ``size`` bytes to ``tp``'s open batch; send it once full."""
        batch = self.open.get(tp)
        if batch is None:
            batch = self.open[tp] = ([], [0])
        batch[0].append(record)
        batch[1][0] += size
        if batch[1][0] >= self.options.batch_size:
            self.send(tp)

    def extend(self, tp: TopicPartition, records: list[_Record], sizes: list[int]) -> None:
        """Add ``records`` to ``tp``'s open batch in order, sending each batch once full
        (one running sum per record; the records move in slices)."""
        batch = self.open.get(tp)
        total = 0 if batch is None else batch[1][0]
        limit = self.options.batch_size
        start = 0
        for index, size in enumerate(sizes):
            total += size
            if total >= limit:
                self._put(tp, records[start : index + 1], total)
                self.send(tp)
                start, total = index + 1, 0
        if start < len(records):
            self._put(tp, records[start:], total)

    def _put(self, tp: TopicPartition, records: list[_Record], total: int) -> None:
        batch = self.open.get(tp)
        if batch is None:
            self.open[tp] = (records, [total])
        else:
            batch[0].extend(records)
            batch[1][0] = total

    def stick(self, topic: str, records: list[_Record], sizes: list[int]) -> None:
        """Add keyless records to ``topic``: they fill the batch of one partition, then
        move on to the next, as the producer does."""
        start = 0
        while start < len(records):
            tp = TopicPartition(topic, self.choose(topic, None, None))
            batch = self.open.get(tp)
            total = 0 if batch is None else batch[1][0]
            end = start
            while end < len(records) and total < self.options.batch_size:
                total += sizes[end]
                end += 1
            self._put(tp, records[start:end], total)
            if total >= self.options.batch_size:
                self.send(tp)  # the next records go to the next partition
            start = end

    def add_arrow(self, batch: pa.RecordBatch, now_ms: int) -> None:
        """Add the rows of one Arrow batch (columns as :func:`check_columns` allows).

        The usual shapes (one topic, no partition column, every row keyed or
        none) go by partition in bulk; any other row by row.
        """
        rows = batch.num_rows
        if not rows:
            return
        key_column = _column(batch, "key")
        value_column = _column(batch, "value")
        headers_column = _column(batch, "headers")
        keys = _bytes_list(key_column, rows)
        values = _bytes_list(value_column, rows)
        headers = _headers_list(headers_column, rows)
        stamps = _timestamps_ms(_column(batch, "timestamp"), rows, now_ms)
        records = list(zip(stamps, keys, values, headers, strict=True))
        sizes = _sizes(key_column, value_column, rows)
        if headers_column is not None:
            sizes = [
                n + sum(len(k) + len(v) for k, v in h) for n, h in zip(sizes, headers, strict=True)
            ]
        topic_column = _column(batch, "topic")
        partition_column = _column(batch, "partition")
        topic = self.options.topic
        if topic_column is None and partition_column is None and topic is not None:
            if key_column is None or key_column.null_count == rows:
                self.stick(topic, records, sizes)
                return
            if key_column.null_count == 0:
                count = self.partitions(topic)
                crc32 = zlib.crc32
                chosen = [crc32(k) % count for k in keys]  # type: ignore[arg-type]
                by_partition: dict[int, tuple[list[_Record], list[int]]] = {}
                for partition, record, size in zip(chosen, records, sizes, strict=True):
                    bucket = by_partition.get(partition)
                    if bucket is None:
                        bucket = by_partition[partition] = ([], [])
                    bucket[0].append(record)
                    bucket[1].append(size)
                for partition in sorted(by_partition):
                    bucket = by_partition[partition]
                    self.extend(TopicPartition(topic, partition), bucket[0], bucket[1])
                return
        topics = [topic] * rows if topic_column is None else topic_column.to_pylist()
        partitions = [None] * rows if partition_column is None else partition_column.to_pylist()
        for row_topic, partition, key, record, size in zip(
            topics, partitions, keys, records, sizes, strict=True
        ):
            if not row_topic:
                raise OptionError("a row has no topic: give the topic option or fill the column")
            self.add(
                TopicPartition(row_topic, self.choose(row_topic, key, partition)), record, size
            )

    def send(self, tp: TopicPartition) -> None:
        records, _ = self.open.pop(tp)
        payload = bytes((self.ident,)) + self.pack(_encoder.encode(records))
        newest = max(map(itemgetter(0), records))
        self.client.produce(tp, payload, len(records), newest)
        self.records += len(records)
        self.sent += 1
        if tp.topic in self.sticky:  # records without a key move on to the next partition
            self.sticky[tp.topic] = (tp.partition + 1) % self.partitions(tp.topic)

    def flush(self) -> None:
        for tp in sorted(self.open):
            self.send(tp)


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteResult:
    """Produce the rows of ``batches`` (one task's) with a client of its own; what was
    written."""
    with BlockingClient(
        options.bootstrap, timeout=options.timeout, security=options.security
    ) as client:
        out = _Batches(client, options)
        now_ms = int(time.time() * 1000)
        for batch in batches:
            out.add_arrow(batch, now_ms)
        out.flush()
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
