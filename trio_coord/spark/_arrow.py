"""From stored record batches to Arrow record batches, with as little per-record Python as can be.

A task's time goes to two things per record: decoding the msgpack of each
fetched batch into Python objects, and building Arrow columns from them.
Both are kept small here. The records decode into
:class:`~trio_coord.protocol.records.UntrackedRecord`, a msgspec Struct made
with ``gc=False`` and headers as a tuple (an empty tuple is a shared
constant), so that decoding a batch of 8,192 records allocates no object the
cyclic garbage collector tracks: with ``WireRecord`` (a list per record) the
collections that the allocations trigger cost most of the decode. The
columns are then built one list comprehension or one Arrow compute call
each: the offsets (dense: a batch stored at ``base`` holds ``base``,
``base + 1``, ...) are a cached 0..n-1 array plus the first
offset, the timestamps one multiplication, the topic and partition one
repeated scalar each, and records without headers (the common case) an
all-empty list array made from offsets alone. The format itself (a codec
byte, then a msgpack array of ``[timestamp_ms, key, value, headers]``) is
defined once, in :mod:`trio_coord.protocol.records`; this module reads it
with that module's codecs and its bound on what a batch may decompress to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from ..protocol.records import MAX_BATCH_BYTES, UntrackedRecord, decode_untracked

__all__ = [
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITHOUT_HEADERS",
    "CREATE_TIME",
    "HEADERS",
    "ROWS_PER_ARROW_BATCH",
    "TIMESTAMP",
    "Pending",
    "arrow_batch",
    "decode_records",
]

HEADERS: Final = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)
TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA: Final = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", TIMESTAMP),
        ("timestampType", pa.int32()),
        ("headers", HEADERS),
    ]
)
"""The rows of a read with ``includeHeaders`` as Arrow types (what Spark expects of a
batch, exactly): the columns of Spark's Kafka source, in its order."""
ARROW_SCHEMA_WITHOUT_HEADERS: Final = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("headers"))
"""The rows of a read without ``includeHeaders`` (the default, as for Kafka)."""
CREATE_TIME: Final = 0
"""The ``timestampType`` of every record (Kafka's CreateTime: the producer's timestamp)."""

ROWS_PER_ARROW_BATCH: Final = 8192
"""Rows per Arrow batch handed to Spark."""


_Record = UntrackedRecord


def decode_records(payload: bytes | memoryview, max_bytes: int = MAX_BATCH_BYTES) -> list[_Record]:
    """The records of one stored batch payload (raises InvalidRecordError if it is malformed,
    or decompresses to more than ``max_bytes``), exactly as ``decode_batch`` reads it."""
    return decode_untracked(payload, max_bytes)


_ranks = pa.array(range(ROWS_PER_ARROW_BATCH), pa.int64())


def _offsets(first: int, rows: int) -> pa.Array:
    global _ranks
    if rows > len(_ranks):
        _ranks = pa.array(range(rows), pa.int64())
    return pc.add_checked(_ranks.slice(0, rows), pa.scalar(first, pa.int64()))


def _no_headers(rows: int) -> pa.Array:
    return pa.ListArray.from_arrays(
        pa.repeat(pa.scalar(0, pa.int32()), rows + 1),
        pa.array([], HEADERS.value_type),
        type=HEADERS,
    )


class Pending:
    """Records of one partition waiting to become an Arrow batch, kept as columns: each
    fetched batch's records are taken apart as they come (one list comprehension per
    column), so no record object outlives the batch it was decoded from."""

    __slots__ = ("headers", "include_headers", "keys", "stamps", "values")

    def __init__(self, include_headers: bool = True) -> None:
        self.include_headers = include_headers
        self.stamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[tuple[tuple[str, bytes], ...]] = []

    def __len__(self) -> int:
        return len(self.stamps)

    def add(self, records: Sequence[_Record]) -> None:
        """Append ``records`` (the next offsets)."""
        self.stamps.extend([r.timestamp_ms for r in records])
        self.keys.extend([r.key for r in records])
        self.values.extend([r.value for r in records])
        if self.include_headers:
            self.headers.extend([r.headers for r in records])

    def take(self, topic: str, partition: int, first: int, rows: int) -> pa.RecordBatch:
        """The first ``rows`` records (offsets ``first``, ``first + 1``, ...) as one Arrow
        batch of :data:`ARROW_SCHEMA` (without its headers column unless the records were
        kept with theirs), removed from here."""
        stamps, keys, values, headers = self.stamps, self.keys, self.values, self.headers
        if rows >= len(stamps):
            self.stamps, self.keys, self.values, self.headers = [], [], [], []
        else:
            stamps, keys, values, headers = (
                stamps[:rows],
                keys[:rows],
                values[:rows],
                headers[:rows],
            )
            del self.stamps[:rows], self.keys[:rows], self.values[:rows], self.headers[:rows]
        return arrow_batch(
            topic,
            partition,
            first,
            stamps,
            keys,
            values,
            headers if self.include_headers else None,
        )


def arrow_batch(
    topic: str,
    partition: int,
    first: int,
    stamps: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[tuple[tuple[str, bytes], ...]] | None,
) -> pa.RecordBatch:
    """Records of ``topic``/``partition``, whose offsets are ``first``, ``first + 1``, ...,
    given column by column, as one Arrow batch of :data:`ARROW_SCHEMA` (without its headers
    column when ``headers`` is None)."""
    rows = len(stamps)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), rows),
        pa.repeat(pa.scalar(partition, pa.int32()), rows),
        _offsets(first, rows),
        pc.multiply_checked(pa.array(stamps, pa.int64()), 1000).cast(TIMESTAMP),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), rows),
    ]
    if headers is None:
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA_WITHOUT_HEADERS)
    columns.append(_no_headers(rows) if headers.count(()) == rows else pa.array(headers, HEADERS))
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
