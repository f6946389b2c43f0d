"""Writing a DataFrame to a topic: ``df.write.format("trio_coord")``, batch and stream.

The DataFrame's columns say what each record is: ``value`` (required),
``key``, ``headers`` (``array<struct<key string, value binary>>``),
``timestamp``, ``partition`` (otherwise a key picks one by the producer's
stable hash, and records without a key fill a batch of one partition, then
move on to the next), and ``topic`` (where no ``topic`` option is given).
``key`` and ``value`` may be binary or string (stored as UTF-8). Any other
column is refused when the write is planned, so that nothing is silently
dropped.

Each task opens its own blocking client, packs its rows into batches of about
``batchSize`` bytes per partition with the shared record codec, appends each
batch with one Produce request, and closes the client when it is done.
Delivery is at least once, as with the producer: a task that Spark retries
writes its rows again, and so does a micro-batch that a restarted stream runs
again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
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
from ..protocol.records import WireRecord, encode_batch
from ._client import BlockingClient
from ._options import OptionError, WriteOptions

__all__ = ["BatchWriter", "StreamWriter", "WriteResult", "check_columns", "write_rows"]

log = logging.getLogger(__name__)

_RECORD_OVERHEAD = 24


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


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)  # bytearray, memoryview


def _timestamp_ms(value: datetime | None, now_ms: int) -> int:
    return now_ms if value is None else round(value.timestamp() * 1000)


class _Batches:
    """Per-partition open batches of one task, sent when full and at the end."""

    def __init__(self, client: BlockingClient, options: WriteOptions) -> None:
        self.client = client
        self.options = options
        self.open: dict[TopicPartition, tuple[list[WireRecord], list[int]]] = {}
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
        count = self.partitions(topic)
        if key is not None:
            return partition_for_key(key, count)
        return self.sticky.setdefault(topic, self.seed % count)

    def add(self, tp: TopicPartition, record: WireRecord) -> None:
        records, size = self.open.setdefault(tp, ([], [0]))
        records.append(record)
        size[0] += (
            _RECORD_OVERHEAD
            + len(record.key or b"")
            + len(record.value or b"")
            + sum(len(k) + len(v) for k, v in record.headers)
        )
        if size[0] >= self.options.batch_size:
            self.send(tp)

    def send(self, tp: TopicPartition) -> None:
        records, _ = self.open.pop(tp)
        payload = encode_batch(records, self.options.compression)
        newest = max(r.timestamp_ms for r in records)
        self.client.produce(tp, payload, len(records), newest)
        self.records += len(records)
        self.sent += 1
        if tp.topic in self.sticky:  # records without a key move on to the next partition
            self.sticky[tp.topic] = (tp.partition + 1) % self.partitions(tp.topic)

    def flush(self) -> None:
        for tp in sorted(self.open):
            self.send(tp)


def write_rows(options: WriteOptions, rows: Iterator[Row]) -> WriteResult:
    """Produce ``rows`` (one task's) with a client of its own; what was written."""
    with BlockingClient(options.bootstrap, timeout=options.timeout) as client:
        batches = _Batches(client, options)
        now_ms = int(time.time() * 1000)
        for row in rows:
            fields = row.asDict()
            topic = options.topic or fields.get("topic")
            if not topic:
                raise OptionError("a row has no topic: give the topic option or fill the column")
            key = _bytes(fields.get("key"))
            partition = batches.choose(topic, key, fields.get("partition"))
            headers = [(h["key"], _bytes(h["value"]) or b"") for h in fields.get("headers") or ()]
            record = WireRecord(
                _timestamp_ms(fields.get("timestamp"), now_ms),
                key,
                _bytes(fields.get("value")),
                headers,
            )
            batches.add(TopicPartition(topic, partition), record)
        batches.flush()
        return WriteResult(batches.records, batches.sent)


class BatchWriter(DataSourceWriter):
    """``df.write.format("trio_coord")``: each task produces its rows."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_columns(schema, options)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriteResult:
        """Produce one task's rows (on an executor)."""
        return write_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded; their records are stored already."""
        total = sum(m.records for m in messages if isinstance(m, WriteResult))
        log.info("wrote %d records to %s", total, self.options.topic or "the rows' topics")


class StreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("trio_coord")``: each micro-batch's tasks produce their rows."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_columns(schema, options)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriteResult:
        """Produce one task's rows of a micro-batch (on an executor)."""
        return write_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch is written (its records are stored already)."""
        total = sum(m.records for m in messages if isinstance(m, WriteResult))
        log.debug("micro-batch %d: wrote %d records", batchId, total)
