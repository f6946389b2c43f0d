"""From stored record batches to Arrow record batches, without a Python object per record.

A stored batch in the columnar layout (see :mod:`trio_coord.protocol.records`)
holds nearly what an Arrow column is made of: its timestamps are an int64
array, its keys and values int32 lengths, a validity bitmap and the bytes.
:func:`decode_records` checks its sections once
(:func:`~trio_coord.protocol.records.read_columns`: lengths, count), wraps its
timestamps with ``pa.Array.from_buffers`` and keeps its keys and values as
their lengths and bytes (the timestamps and lengths put back from their
transposed bytes into new, aligned, buffers; the bytes and bitmaps read in
place). :class:`Pending` keeps a partition's pieces, one per stored batch, and
:meth:`Pending.take` joins them into the Arrow batches handed to Spark: the
timestamps with one ``concat_arrays``, the keys and the values each with one
``cumulative_sum`` of all their lengths (the offsets) and one join of their
bytes. The usual stored batch (no headers, each of its key and value columns
all present or all absent) is not even checked alone: :func:`decode_lazily`
keeps it as a :class:`RawPiece`, its sections found and bounds checked, and
:meth:`Pending.take` puts back the timestamps and lengths of all such batches
of an Arrow batch with one join and one slice assignment per byte of a number,
and checks their lengths with one test of the sign bytes, one checked
cumulative sum and one comparison of the offsets at each batch's end with its
bytes: a few calls per stored batch instead of dozens, which halved a task's
work on 50-record batches. The other columns cost one call each: the offsets
(dense: a batch stored at ``base`` holds ``base``, ``base + 1``, ...) a cached
0..n-1 array plus the first offset, the timestamps one multiplication, the
topic and partition one repeated scalar each, and the headers, when no record
has any (the common case), an all-empty list array made from offsets alone. A
batch in the row layout (msgpack records, as older producers wrote them) is
decoded into :class:`~trio_coord.protocol.records.UntrackedRecord` (no object
the garbage collector tracks) and made into the same arrays from lists.
"""

from __future__ import annotations

import functools
import sys
from collections import deque
from collections.abc import Sequence
from itertools import accumulate, groupby
from typing import Final, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from ..protocol.errors import InvalidRecordError
from ..protocol.records import (
    ALL_PRESENT,
    MAX_BATCH_BYTES,
    NONE_PRESENT,
    SOME_PRESENT,
    Column,
    Section,
    Sections,
    batch_body,
    columnar_sections,
    decode_untracked,
    read_columns,
    read_rows,
)

__all__ = [
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITHOUT_HEADERS",
    "CREATE_TIME",
    "HEADERS",
    "ROWS_PER_ARROW_BATCH",
    "TIMESTAMP",
    "Pending",
    "Piece",
    "RawPiece",
    "arrow_batch",
    "decode_lazily",
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
_LITTLE: Final = sys.byteorder == "little"


class _Lazy:
    """A checked key or value column of one stored columnar batch, kept as its lengths and
    bytes until the Arrow batch it goes into is built (:func:`_binary`: one cumulative sum
    for all the stored batches it holds)."""

    __slots__ = ("column", "count")

    def __init__(self, column: Column, count: int) -> None:
        self.column, self.count = column, count

    def __len__(self) -> int:
        return self.count

    def array(self) -> pa.Array:
        """This column alone as an Arrow binary array."""
        column, count = self.column, self.count
        if column.presence == NONE_PRESENT:
            return pa.nulls(count, pa.binary())
        # 0 and the lengths, checked: none negative, adding up to the bytes (below 2**31)
        lengths = pa.Array.from_buffers(pa.int32(), count + 1, [None, pa.py_buffer(column.lengths)])
        offsets = pc.cumulative_sum(lengths).buffers()[1]
        validity = pa.py_buffer(column.validity) if column.presence == SOME_PRESENT else None
        return pa.Array.from_buffers(
            pa.binary(), count, [validity, offsets, pa.py_buffer(column.data)]
        )

    def slice(self, low: int, rows: int) -> pa.Array:
        """Elements ``low`` to ``low + rows - 1`` as an Arrow binary array (a slice)."""
        return self.array().slice(low, rows)


_Binary: TypeAlias = "pa.Array | _Lazy"
"""A key or value column of a :class:`Piece`: an Arrow binary array, or :class:`_Lazy`."""
_INT32_MAX: Final = 2**31 - 1
_ZERO: Final = bytes(4)


def _binary(parts: list[_Binary]) -> pa.Array:
    """Consecutive parts of one column as one Arrow binary array. Each run of stored columnar
    batches' columns with every element present (the usual case) is one cumulative sum of
    all their lengths and one join of all their bytes; other parts are made alone; the
    runs and parts are then concatenated (``concat_arrays``)."""
    arrays: list[pa.Array] = []
    run: list[Column] = []
    for part in parts:
        if isinstance(part, _Lazy) and part.column.presence == ALL_PRESENT:
            run.append(part.column)
            continue
        if run:
            arrays.extend(_joined(run))
            run = []
        arrays.append(part.array() if isinstance(part, _Lazy) else part)
    if run:
        arrays.extend(_joined(run))
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _joined(columns: list[Column]) -> list[pa.Array]:
    """Columns with every element present, one after the other, as one binary array (or, if
    their bytes are more than 32-bit offsets reach, one each: concat_arrays then refuses
    them as it would any)."""
    if sum(len(c.data) for c in columns) > _INT32_MAX:
        return [_Lazy(c, len(c.lengths) // 4 - 1).array() for c in columns]
    count = sum(len(c.lengths) // 4 - 1 for c in columns)
    lengths = b"".join([_ZERO, *(memoryview(c.lengths)[4:] for c in columns)])
    offsets = pc.cumulative_sum(
        pa.Array.from_buffers(pa.int32(), count + 1, [None, pa.py_buffer(lengths)])
    ).buffers()[1]
    data = pa.py_buffer(b"".join([c.data for c in columns]))
    return [pa.Array.from_buffers(pa.binary(), count, [None, offsets, data])]


class Piece:
    """The records of one stored batch (or a slice of it) as Arrow arrays: timestamps in
    milliseconds (int64), keys and values (binary, or :class:`_Lazy` until they are
    concatenated), and headers (:data:`HEADERS`), None when no record has any or they are
    not wanted."""

    __slots__ = ("headers", "keys", "rows", "stamps", "values")

    def __init__(
        self, stamps: pa.Array, keys: _Binary, values: _Binary, headers: pa.Array | None
    ) -> None:
        self.stamps, self.keys, self.values, self.headers = stamps, keys, values, headers
        self.rows = len(stamps)  # (an attribute: the hot paths read it per stored batch)

    def __len__(self) -> int:
        return self.rows

    def slice(self, low: int, high: int) -> Piece:
        """Records ``low`` to ``high - 1`` (zero-copy, once the keys and values are arrays)."""
        rows = max(0, min(high, self.rows) - low)
        return Piece(
            self.stamps.slice(low, rows),
            self.keys.slice(low, rows),
            self.values.slice(low, rows),
            None if self.headers is None else self.headers.slice(low, rows),
        )


def decode_records(
    payload: bytes | memoryview, max_bytes: int = MAX_BATCH_BYTES, include_headers: bool = True
) -> Piece:
    """The records of one stored batch payload, in either layout, as a :class:`Piece`
    (raises InvalidRecordError if it is malformed, or decompresses to more than
    ``max_bytes``, exactly as ``decode_batch`` does)."""
    columnar, body = batch_body(payload, max_bytes)
    return _piece(payload, columnar, body, max_bytes, include_headers)


def _piece(
    payload: bytes | memoryview,
    columnar: bool,
    body: bytes | memoryview,
    max_bytes: int,
    include_headers: bool,
) -> Piece:
    """:func:`decode_records` of ``payload``, whose ``batch_body`` was read already."""
    if not columnar or not _LITTLE:  # (Arrow's buffers are native, the layout little-endian)
        records = read_rows(body) if not columnar else decode_untracked(payload, max_bytes)
        return Piece(
            pa.array([r.timestamp_ms for r in records], pa.int64()),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            _headers([r.headers for r in records]) if include_headers else None,
        )
    return _columnar_piece(body, include_headers)


def _columnar_piece(body: bytes | memoryview, include_headers: bool) -> Piece:
    # The timestamps and the lengths are put back into new buffers (aligned, as malloc's
    # are), the bytes and bitmaps read in place (at any alignment).
    columns = read_columns(body)
    count = columns.count
    return Piece(
        pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(columns.stamps)]),
        _Lazy(columns.keys, count),
        _Lazy(columns.values, count),
        _headers(columns.header_lists()) if include_headers and columns.headers else None,
    )


class RawPiece:
    """The records of one whole stored columnar batch of at least one record, with no
    headers and each of its key and value columns all present or all absent (the usual
    batch), kept as its sections, bounds checked and nothing else: :meth:`Pending.take`
    checks and puts back the lengths and timestamps of every such batch of an Arrow batch
    at once (:func:`_raw_columns`), which costs a few calls per stored batch where
    :func:`decode_records` costs dozens."""

    __slots__ = ("body", "rows", "sections")
    headers: Final = None

    def __init__(self, body: bytes | memoryview, sections: Sections) -> None:
        self.body, self.sections, self.rows = body, sections, sections.count

    def __len__(self) -> int:
        return self.rows

    @property
    def nbytes(self) -> int:
        """The bytes of its keys and values."""
        return len(self.sections.keys.data) + len(self.sections.values.data)

    def slice(self, low: int, high: int) -> Piece:
        """Records ``low`` to ``high - 1``, as a :class:`Piece` (this batch checked alone:
        a range's first and last batches, and the one an Arrow batch ends in, are split)."""
        return _columnar_piece(self.body, include_headers=False).slice(low, high)


_BULK: Final = (ALL_PRESENT, NONE_PRESENT)


def decode_lazily(
    payload: bytes | memoryview, max_bytes: int = MAX_BATCH_BYTES, include_headers: bool = True
) -> Piece | RawPiece:
    """The records of one stored batch payload: a :class:`RawPiece` when it is one (checked
    when taken), else a :class:`Piece` as :func:`decode_records` makes it (checked now: a
    batch of no records too, which :class:`Pending` drops without taking it)."""
    columnar, body = batch_body(payload, max_bytes)
    if columnar and _LITTLE:
        sections = columnar_sections(body)
        if (
            sections.count  # (one of none is checked now: Pending drops it unread)
            and not sections.headers
            and sections.keys.presence in _BULK
            and sections.values.presence in _BULK
        ):
            return RawPiece(body, sections)
    return _piece(payload, columnar, body, max_bytes, include_headers)  # (not decompressed again)


def _headers(headers: list[tuple[tuple[str, bytes], ...]]) -> pa.Array | None:
    return None if headers.count(()) == len(headers) else pa.array(headers, HEADERS)


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


def _concat(arrays: list[pa.Array]) -> pa.Array:
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


_SMALL: Final = bytes(range(128))


def _put_back(views: list[memoryview], counts: list[int], width: int, lead: int) -> bytearray:
    """The transposed ``width``-byte numbers of several stored batches (``views``, of
    ``counts`` numbers each) put back, one batch after the other, after ``lead`` zero
    bytes: one join and one slice assignment per byte of a number, for all the batches."""
    rows = sum(counts)
    out = bytearray(lead + width * rows)
    for plane in range(width):
        out[lead + plane :: width] = b"".join(
            [
                view[plane * count : (plane + 1) * count]
                for view, count in zip(views, counts, strict=True)
            ]
        )
    return out


def _bulk_binary(columns: list[Section], counts: list[int], what: str) -> pa.Array:
    """The keys or values of consecutive :class:`RawPiece` (``columns``, all present or all
    absent alike) as one Arrow binary array, checked as :func:`read_columns` checks each
    batch's: no length negative, and each batch's adding up to its bytes (the offsets at
    each batch's end are its bytes and all the batches' before it)."""
    rows = sum(counts)
    if columns[0].presence == NONE_PRESENT:
        return pa.nulls(rows, pa.binary())
    sizes = [len(c.data) for c in columns]
    lengths = _put_back([c.lengths for c in columns], counts, 4, 4)
    if lengths[7::4].translate(None, _SMALL):  # (the fourth bytes hold the signs)
        raise InvalidRecordError(f"columnar record batch: a {what} length is negative")
    try:
        offsets = pc.cumulative_sum_checked(
            pa.Array.from_buffers(pa.int32(), rows + 1, [None, pa.py_buffer(lengths)])
        )
        ends = offsets.take(pa.array(list(accumulate(counts)), pa.int64())).to_pylist()
    except pa.ArrowInvalid:  # (past 2**31 - 1: they add up to more than the batches hold)
        ends = None
    if ends != list(accumulate(sizes)):
        raise InvalidRecordError(
            f"columnar record batch: the {what} lengths do not add up to its bytes"
        )
    data = pa.py_buffer(b"".join([c.data for c in columns]))
    return pa.Array.from_buffers(pa.binary(), rows, [None, offsets.buffers()[1], data])


def _raw_columns(pieces: list[RawPiece]) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Consecutive :class:`RawPiece` as their timestamps (milliseconds), keys and values,
    each one Arrow array (a key or value column that is present in some of them and absent
    in others is made per run of equals and concatenated)."""
    sections = [p.sections for p in pieces]
    counts = [s.count for s in sections]
    stamps = _put_back([s.stamps for s in sections], counts, 8, 0)
    columns = []
    for what in ("key", "value"):
        runs = []
        picked = [s.keys for s in sections] if what == "key" else [s.values for s in sections]
        for _, run in groupby(zip(picked, counts, strict=True), key=lambda pair: pair[0].presence):
            listed = list(run)
            runs.append(_bulk_binary([c for c, _ in listed], [n for _, n in listed], what))
        columns.append(_concat(runs))
    rows = len(stamps) // 8
    return pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(stamps)]), *columns


class Pending:
    """Records of one partition waiting to become an Arrow batch, kept as the
    :class:`Piece` or :class:`RawPiece` of each stored batch they came in (no Python
    object per record)."""

    __slots__ = ("include_headers", "pieces", "rows")

    def __init__(self, include_headers: bool = True) -> None:
        self.include_headers = include_headers
        self.pieces: deque[Piece | RawPiece] = deque()
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def add(self, piece: Piece | RawPiece) -> None:
        """Append ``piece``'s records (the next offsets)."""
        if piece.rows:
            self.pieces.append(piece)
            self.rows += piece.rows

    def take(self, topic: str, partition: int, first: int, rows: int) -> pa.RecordBatch:
        """The first ``rows`` records (offsets ``first``, ``first + 1``, ...) as one Arrow
        batch of :data:`ARROW_SCHEMA` (without its headers column unless the records were
        kept with theirs), removed from here."""
        taken: list[Piece | RawPiece] = []
        wanted = min(rows, self.rows)
        self.rows -= wanted
        while wanted:
            piece = self.pieces[0]
            if piece.rows <= wanted:
                taken.append(self.pieces.popleft())
                wanted -= piece.rows
            else:
                if isinstance(piece, RawPiece):  # (checked and put back once, then cut)
                    piece = piece.slice(0, piece.rows)
                taken.append(piece.slice(0, wanted))
                self.pieces[0] = piece.slice(wanted, piece.rows)
                wanted = 0
        stamps: list[pa.Array] = []
        keys: list[pa.Array] = []
        values: list[pa.Array] = []
        for raw, run in groupby(taken, key=lambda p: isinstance(p, RawPiece)):
            listed = list(run)
            if raw and sum(p.nbytes for p in listed) <= _INT32_MAX:  # type: ignore[union-attr,misc]
                run_stamps, run_keys, run_values = _raw_columns(listed)  # type: ignore[arg-type]
                stamps.append(run_stamps)
                keys.append(run_keys)
                values.append(run_values)
            else:  # (more bytes than 32-bit offsets reach: each alone, as concat_arrays takes)
                pieces = [p.slice(0, p.rows) if isinstance(p, RawPiece) else p for p in listed]
                stamps.extend(p.stamps for p in pieces)
                keys.append(_binary([p.keys for p in pieces]))
                values.append(_binary([p.values for p in pieces]))
        headers = None
        if self.include_headers:
            headers = (
                _concat([_no_headers(len(p)) if p.headers is None else p.headers for p in taken])
                if any(p.headers is not None for p in taken)
                else _no_headers(sum(len(p) for p in taken))
            )
        return arrow_batch(
            topic, partition, first, _concat(stamps), _concat(keys), _concat(values), headers
        )


def _micros(topic: str, partition: int, first: int, millis: pa.Array) -> pa.Array:
    """Timestamps in milliseconds as Spark's (microseconds, UTC); InvalidRecordError naming
    the first record whose timestamp they cannot hold (past 2**63 // 1000 ms)."""
    try:
        return pc.multiply_checked(millis, _THOUSAND).cast(TIMESTAMP)
    except pa.ArrowInvalid:
        past = pc.or_(pc.greater(millis, _MAX_MILLIS), pc.less(millis, -_MAX_MILLIS))
        bad = pc.index(past, True).as_py()
        stamp = millis[bad].as_py()
        raise InvalidRecordError(
            f"{topic}-{partition} at offset {first + bad}: timestamp {stamp} ms is past what "
            "Spark's timestamps (microseconds) hold; read from a later offset"
        ) from None


_MAX_MILLIS: Final = 2**63 // 1000
_THOUSAND: Final = pa.scalar(1000, pa.int64())
"""(A scalar made once: given a Python int, pyarrow converts it on every call, trying to
import modules it may not find, 30 µs an Arrow batch.)"""


@functools.lru_cache(maxsize=16)
def _repeated(topic: str, partition: int, rows: int) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The topic, partition and timestampType columns of ``rows`` records: the same for
    every full Arrow batch of a partition, so made once (40 µs a batch otherwise)."""
    return (
        pa.repeat(pa.scalar(topic, pa.string()), rows),
        pa.repeat(pa.scalar(partition, pa.int32()), rows),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), rows),
    )


def arrow_batch(
    topic: str,
    partition: int,
    first: int,
    stamps: pa.Array | Sequence[int],
    keys: pa.Array | Sequence[bytes | None],
    values: pa.Array | Sequence[bytes | None],
    headers: pa.Array | Sequence[tuple[tuple[str, bytes], ...]] | None,
) -> pa.RecordBatch:
    """Records of ``topic``/``partition``, whose offsets are ``first``, ``first + 1``, ...,
    given column by column (Arrow arrays or Python sequences; timestamps in milliseconds),
    as one Arrow batch of :data:`ARROW_SCHEMA` (without its headers column when
    ``headers`` is None)."""
    rows = len(stamps)
    topics, partitions, types = _repeated(topic, partition, rows)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        topics,
        partitions,
        _offsets(first, rows),
        _micros(topic, partition, first, pa.array(stamps, pa.int64())),
        types,
    ]
    if headers is None:
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA_WITHOUT_HEADERS)
    if not isinstance(headers, pa.Array):
        headers = (
            _no_headers(rows) if list(headers).count(()) == rows else pa.array(headers, HEADERS)
        )
    columns.append(headers)
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
