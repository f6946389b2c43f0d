"""Record batches: how a producer packs records and a consumer unpacks them.

A batch is the unit a producer sends, a partition log stores and a fetch
returns. The broker decodes it once, to check it, then stores the bytes as
they came with the batch's record count and newest timestamp and assigns the
offsets (the ``i``-th record of a batch stored at ``base`` has offset
``base + i``). The bytes are one codec byte (see :data:`COMPRESSION`) followed
by the records in one of two layouts, compressed as a whole when a codec is
chosen. The row layout (the codec byte's :data:`COLUMNAR` bit clear) is a
msgpack array of ``[timestamp_ms, key, value, headers]`` records; the
columnar layout (the bit set; what :func:`encode_batch` writes) holds the
timestamps as one int64 array and the keys and the values each as int32
lengths (both byte-transposed, so that codecs shrink them), an optional
validity bitmap and the concatenated bytes, and the rare headers in a
trailing msgpack section (see :func:`read_columns` and docs/protocol.md,
"The columnar batch layout"), so that a reader in bulk (the broker's check,
the Spark source's Arrow columns) needs no Python object per record. Every
reader reads both layouts. Producers, consumers, the broker (to find an
offset by timestamp) and the Spark data source all use this one module, so
the format has exactly one definition.

Code that only reads records in bulk (the broker checking a produced batch,
the Spark source turning batches into Arrow) decodes them with
:func:`decode_untracked` into :class:`UntrackedRecord`: the same format read
into objects the cyclic garbage collector does not track (headers as a
tuple, the empty one shared), because on a heap that holds many objects, as
a broker's does, the collections that a ``WireRecord`` list per record
triggers cost about four times the decode itself.
"""

from __future__ import annotations

import lzma
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate, compress, repeat
from typing import Any, Final, TypeVar

import cramjam
import msgspec

from .errors import InvalidRecordError
from .messages import TopicPartition

__all__ = [
    "ALL_PRESENT",
    "COLUMNAR",
    "COMPRESSION",
    "MAX_BATCH_BYTES",
    "NONE_PRESENT",
    "SOME_PRESENT",
    "Column",
    "Columns",
    "ConsumerRecord",
    "Header",
    "Section",
    "Sections",
    "UntrackedRecord",
    "WireRecord",
    "assemble_columnar",
    "batch_body",
    "check_batch",
    "columnar_sections",
    "decode_batch",
    "decode_untracked",
    "encode_batch",
    "read_columns",
    "read_rows",
    "records_from",
    "unpack_batch",
]

Header = tuple[str, bytes]
"""A record header: a name and opaque bytes."""


class WireRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One record inside a batch, as encoded (its offset is implied by its place)."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] = []


class UntrackedRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One record inside a batch, as :class:`WireRecord` but with its headers as a tuple,
    so that decoding a batch allocates nothing the garbage collector tracks (no reference
    cycle can go through it, which is what ``gc=False`` requires)."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


class ConsumerRecord(msgspec.Struct, frozen=True, gc=False):
    """A record as a consumer receives it (a frozen msgspec Struct: ten times
    cheaper to build than a dataclass, which matters once per record; not
    tracked by the garbage collector, as it holds no cycle).

    ``timestamp`` is in seconds since the epoch (the producer's clock when it
    was sent, unless the producer set it); ``key`` and ``value`` are bytes or
    None; ``headers`` keeps the producer's order and may repeat a name.
    """

    topic: str
    partition: int
    offset: int
    timestamp: float
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()

    @property
    def tp(self) -> TopicPartition:
        """The partition this record belongs to."""
        return TopicPartition(self.topic, self.partition)


MAX_BATCH_BYTES: Final = 64 * 1024 * 1024
"""The most a batch may decompress to: a few compressed bytes must not be able
to make a broker or a consumer allocate gigabytes (a decompression bomb)."""


def _inflate(data: bytes, limit: int) -> bytes:
    unpacker = zlib.decompressobj()
    out = unpacker.decompress(data, limit + 1)
    if len(out) > limit or unpacker.unconsumed_tail:
        raise InvalidRecordError(f"record batch decompresses to more than {limit} bytes")
    if not unpacker.eof or unpacker.unused_data:
        raise InvalidRecordError("record batch is not one complete zlib stream")
    return out


def _unxz(data: bytes, limit: int) -> bytes:
    unpacker = lzma.LZMADecompressor()
    out = unpacker.decompress(data, max_length=limit + 1)
    if len(out) > limit:
        raise InvalidRecordError(f"record batch decompresses to more than {limit} bytes")
    if not unpacker.eof or unpacker.unused_data:
        raise InvalidRecordError("record batch is not one complete lzma stream")
    return out


def _stored(data: bytes, limit: int) -> bytes:
    return data


# lz4 (block) and zstd batches carry their decompressed size first (4 bytes, big-endian):
# the size is checked against the limit before anything is allocated, and the codec
# writes into exactly that much (more is an error, not a bigger buffer).
_SIZE = struct.Struct(">I")


def _sized(compress: Callable[[bytes], Any]) -> Callable[[bytes], bytes]:
    return lambda data: _SIZE.pack(len(data)) + bytes(compress(data))


def _unsized(name: str, into: Callable[[bytes, bytearray], int]) -> Callable[[bytes, int], bytes]:
    def unpack(data: bytes, limit: int) -> bytes:
        if len(data) < _SIZE.size:
            raise InvalidRecordError(f"{name} record batch is shorter than its size header")
        (size,) = _SIZE.unpack_from(data)
        if size > limit:
            raise InvalidRecordError(f"record batch decompresses to more than {limit} bytes")
        out = bytearray(size)
        try:
            written = into(data[_SIZE.size :], out)
        except Exception:  # (whatever the codec makes of hostile bytes: not our crash)
            written = -1
        if written != size:
            raise InvalidRecordError(
                f"record batch is not one complete {name} block of the size it declares"
            )
        return bytes(out)

    return unpack


def _lz4_into(data: bytes, out: bytearray) -> int:
    return int(cramjam.lz4.decompress_block_into(data, out))


def _zstd_into(data: bytes, out: bytearray) -> int:
    return int(cramjam.zstd.decompress_into(data, out))


_Codec = tuple[int, Callable[[bytes], bytes], Callable[[bytes, int], bytes]]

COMPRESSION: Final[dict[str | None, _Codec]] = {
    None: (0, bytes, _stored),
    "zlib": (1, lambda b: zlib.compress(b, 1), _inflate),
    "lzma": (2, lambda b: lzma.compress(b, preset=0), _unxz),
    "lz4": (
        3,
        _sized(lambda b: cramjam.lz4.compress_block(b, store_size=False)),
        _unsized("lz4", _lz4_into),
    ),
    "zstd": (4, _sized(lambda b: cramjam.zstd.compress(b, level=3)), _unsized("zstd", _zstd_into)),
}
"""Codec name → (the id byte a batch starts with, compress, bounded decompress)."""

_BY_ID: Final = {ident: unpack for ident, _, unpack in COMPRESSION.values()}
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[WireRecord])
_untracked = msgspec.msgpack.Decoder(list[UntrackedRecord])

COLUMNAR: Final = 0x10
"""The bit of a batch's codec byte that says its records are in the columnar layout
(the codec is the byte without it: 0x10 is columnar and stored, 0x14 columnar and zstd)."""

# -- the columnar layout ----------------------------------------------------------------------
#
# After the codec byte, and decompressed, all integers little-endian, every section starting
# at a multiple of 8 bytes from the start (zero bytes pad a section to the next multiple):
#
#   header (24 bytes): u32 count, u8 key presence, u8 value presence, u16 zero,
#                      u32 key bytes, u32 value bytes, u32 header bytes, u32 zero
#   timestamps         count x i64 (milliseconds), transposed
#   key lengths        count x i32: each key's length (0 if absent), transposed; unless no
#                      key is present
#   key validity       ceil(count / 8) bytes (bit i, least significant first: key i is
#                      present), only when some keys are and some are not
#   value lengths, value validity: as for the keys
#   key bytes, value bytes: the present keys' (values') bytes, one after the other
#   headers            a msgpack array of [index, [[name, value], ...]] for the records that
#                      have headers, by increasing index (no padding after it)
#
# "Transposed" (a byte shuffle, as Blosc's): the first (least significant) byte of every
# number, then the second byte of every number, and so on. Lengths are small numbers, often
# equal, and a batch's timestamps share their high bytes, so transposed they make runs that
# every codec shrinks, where Arrow-style offsets (what the first version of this layout
# stored) are byte patterns that never repeat. A reader checks the lengths on the transposed
# bytes (the fourth bytes hold the signs; the sum is the planes' sums, weighted), puts the
# numbers back with one slice assignment per byte, and makes offsets with one cumulative sum
# (``itertools.accumulate``; ``pyarrow.compute.cumulative_sum`` in the Spark source).
#
# The batch is exactly that long. The lengths are not negative and add up to the section's
# byte count; an absent element's length is 0.

_HEADER = struct.Struct("<IBBHIIII")
ALL_PRESENT: Final = 0
NONE_PRESENT: Final = 1
SOME_PRESENT: Final = 2
_PRESENCE = (ALL_PRESENT, NONE_PRESENT, SOME_PRESENT)
_LITTLE = sys.byteorder == "little"
_EMPTY = memoryview(b"")
_INT32_MAX = 2**31 - 1
_ABSENT = bytes.maketrans(b"01", b"\x01\x00")
_SMALL = bytes(range(128))
_headers_decoder = msgspec.msgpack.Decoder(list[tuple[int, tuple[tuple[str, bytes], ...]]])


def _padded(size: int) -> int:
    return size + (-size % 8)


def _transpose(data: bytes | memoryview, width: int) -> bytes:
    """``width``-byte numbers' bytes, all first bytes first (see the layout above)."""
    raw = bytes(data)
    return b"".join([raw[i::width] for i in range(width)])


def _untranspose(data: memoryview, width: int) -> bytearray:
    """Transposed ``width``-byte numbers put back (a new buffer: aligned, as malloc's are)."""
    out = bytearray(len(data))
    rows = len(data) // width
    for i in range(width):
        out[i::width] = data[i * rows : (i + 1) * rows]
    return out


class Column(msgspec.Struct, frozen=True, gc=False):
    """One bytes-or-None column of a columnar batch (checked, when :func:`read_columns`
    made it): its elements' lengths, validity and bytes."""

    presence: int
    """:data:`ALL_PRESENT`, :data:`NONE_PRESENT` or :data:`SOME_PRESENT`."""
    lengths: bytes | bytearray | memoryview
    """``count + 1`` little-endian int32: 0, then each element's length, 0 where it is
    absent (so that their cumulative sum is the Arrow offsets; empty where no element is
    present). Not transposed: that is the stored form only."""
    validity: memoryview
    """The validity bitmap (empty unless :data:`SOME_PRESENT`)."""
    data: memoryview
    """The present elements' bytes, one after the other."""

    def items(self, count: int) -> list[bytes | None]:
        """The column's elements, one Python object each."""
        if self.presence == NONE_PRESENT:
            return [None] * count
        ends = list(accumulate(_ints("i", self.lengths)))
        data = bytes(self.data)
        # (zip over a list: faster than pairwise over the array)
        out: list[bytes | None] = [data[a:b] for a, b in zip(ends, ends[1:], strict=False)]  # noqa: RUF007
        if self.presence == SOME_PRESENT:
            valid = _bits(self.validity, count)
            return [item if bit == "1" else None for bit, item in zip(valid, out, strict=True)]
        return out


def _bits(validity: memoryview, count: int) -> str:
    """A validity bitmap as a string of ``count`` "0" and "1", element 0 first."""
    return format(int.from_bytes(validity, "little"), "b").zfill(8 * len(validity))[::-1][:count]


class Columns(msgspec.Struct, frozen=True, gc=False):
    """A columnar batch's records as sections of its (decompressed) buffer, every length,
    count and timestamp checked by :func:`read_columns`."""

    count: int
    stamps: bytes | bytearray | memoryview
    """``count`` little-endian int64: each record's timestamp in milliseconds (not
    transposed: that is the stored form only)."""
    keys: Column
    values: Column
    headers: list[tuple[int, tuple[Header, ...]]]
    """``(index, headers)`` of each record that has headers, by increasing index."""

    def timestamps(self) -> array[int]:
        """The timestamps as an ``array('q')``."""
        return _ints("q", self.stamps)

    def header_lists(self) -> list[tuple[Header, ...]]:
        """Every record's headers (the shared empty tuple where it has none)."""
        out: list[tuple[Header, ...]] = [()] * self.count
        for index, headers in self.headers:
            out[index] = headers
        return out


def _ints(code: str, view: bytes | bytearray | memoryview) -> array[int]:
    out = array(code)
    out.frombytes(view)
    if not _LITTLE:
        out.byteswap()
    return out


def _le(numbers: array[int]) -> bytes:
    """An array's bytes, little-endian."""
    if not _LITTLE:
        numbers = array(numbers.typecode, numbers)
        numbers.byteswap()
    return numbers.tobytes()


def _encode_column(items: list[bytes | None], count: int) -> Column:
    """A key or value column's sections, from one Python object per element."""
    missing = items.count(None)
    if missing == count:
        return Column(NONE_PRESENT, _EMPTY, _EMPTY, _EMPTY)
    filled = [b"" if item is None else item for item in items] if missing else items
    try:
        lengths = array("i", map(len, filled))  # type: ignore[arg-type]
    except OverflowError:
        lengths = array("q", [_INT32_MAX + 1])  # (refused just below)
    if sum(lengths) > _INT32_MAX:
        raise ValueError(f"a batch holds at most {MAX_BATCH_BYTES} bytes")
    validity = _EMPTY
    if missing:
        bits = "".join(["0" if item is None else "1" for item in reversed(items)])
        validity = memoryview(int(bits, 2).to_bytes((count + 7) // 8, "little"))
    return Column(
        SOME_PRESENT if missing else ALL_PRESENT,
        _ZERO4 + _le(lengths),
        validity,
        memoryview(b"".join(filled)),  # type: ignore[arg-type]
    )


_ZEROS = bytes(8)
_ZERO4 = bytes(4)


def assemble_columnar(
    count: int,
    stamps: bytes | memoryview,
    keys: Column,
    values: Column,
    headers: Sequence[tuple[int, Sequence[Header]]] = (),
) -> bytes:
    """A columnar batch's bytes (before compression) from its sections: ``count`` records'
    timestamps (``count`` little-endian int64, not transposed), key and value columns as
    :class:`Column` (validity only where some elements are absent; nothing where none is
    present), and the ``(index, headers)`` of the records that have any, by increasing
    index. The one writer of the layout that :func:`read_columns` reads."""
    packed = _encoder.encode(headers) if headers else b""
    parts: list[bytes | memoryview] = [
        _HEADER.pack(
            count,
            keys.presence,
            values.presence,
            0,
            len(keys.data),
            len(values.data),
            len(packed),
            0,
        ),
        _transpose(stamps, 8),
    ]
    for section in (
        _transpose(memoryview(keys.lengths)[4:], 4) if keys.lengths else _EMPTY,
        keys.validity,
        _transpose(memoryview(values.lengths)[4:], 4) if values.lengths else _EMPTY,
        values.validity,
        keys.data,
        values.data,
    ):
        parts.append(section)
        parts.append(_ZEROS[: -len(section) % 8])
    parts.append(packed)
    return b"".join(parts)


def _encode_columnar(records: Sequence[WireRecord | UntrackedRecord]) -> bytes:
    count = len(records)
    try:
        stamps = array("q", [r.timestamp_ms for r in records])
    except OverflowError:
        raise ValueError("a record's timestamp_ms must fit a signed 64-bit integer") from None
    return assemble_columnar(
        count,
        _le(stamps),
        _encode_column([r.key for r in records], count),
        _encode_column([r.value for r in records], count),
        [(i, r.headers) for i, r in enumerate(records) if r.headers],
    )


def _checked_lengths(stored: memoryview, size: int, what: str, put_back: bool = True) -> bytearray:
    """``count`` transposed int32 lengths (``stored``), checked: none negative (no fourth
    byte with its high bit set), adding up to ``size`` (the planes' sums, weighted: exact,
    as Python's ints do not overflow), with C loops over bytes and no Python object per
    length; put back after a 0: the ``count + 1`` little-endian int32 whose cumulative sum
    is the Arrow offsets (a new buffer, aligned as malloc's are)."""
    rows = len(stored) // 4
    raw = bytes(stored)
    if raw[3 * rows :].translate(None, _SMALL):
        raise InvalidRecordError(f"columnar record batch: a {what} length is negative")
    total = 0
    for plane in range(4):
        at = plane * rows
        if raw.count(0, at, at + rows) != rows:  # (the high planes are mostly zeros)
            total += sum(raw[at : at + rows]) << (8 * plane)
    if total != size:
        raise InvalidRecordError(
            f"columnar record batch: the {what} lengths do not add up to its bytes"
        )
    if not put_back:
        return bytearray()
    out = bytearray(4 * rows + 4)
    for plane in range(4):
        out[4 + plane :: 4] = raw[plane * rows : (plane + 1) * rows]
    return out


def _check_absent(column: Column, count: int, what: str) -> None:
    """An absent element's length is 0."""
    absent = _bits(column.validity, count).encode().translate(_ABSENT)
    if any(compress(_ints("i", memoryview(column.lengths)[4:]), absent)):
        raise InvalidRecordError(f"columnar record batch: an absent {what} has bytes")


class Section(msgspec.Struct, gc=False):
    """A key or value column of a columnar batch as :func:`columnar_sections` found it:
    its presence, its lengths as stored (transposed; empty unless some element is present),
    its validity bitmap (empty unless :data:`SOME_PRESENT`) and its bytes. Nothing in it
    is checked but its bounds."""

    presence: int
    lengths: memoryview
    validity: memoryview
    data: memoryview


class Sections(msgspec.Struct, frozen=True, gc=False):
    """A columnar batch's sections, bounds checked and nothing else (see
    :func:`columnar_sections`): ``stamps`` and each column's lengths still transposed."""

    count: int
    stamps: memoryview
    keys: Section
    values: Section
    headers: memoryview


def columnar_sections(body: bytes | memoryview) -> Sections:
    """A columnar batch's sections (``body``: its bytes after the codec byte, decompressed),
    read from its header: :class:`InvalidRecordError` unless the header is one this version
    knows and the sections add up to exactly ``body``'s length. The lengths and headers
    are not checked: :func:`read_columns` does that (and the Spark source, in bulk over
    many batches)."""
    view = memoryview(body)
    if len(view) < _HEADER.size:
        raise InvalidRecordError("columnar record batch is shorter than its header")
    count, key_presence, value_presence, zero, key_bytes, value_bytes, header_bytes, zero2 = (
        _HEADER.unpack_from(view)
    )
    if zero or zero2 or key_presence not in _PRESENCE or value_presence not in _PRESENCE:
        raise InvalidRecordError("columnar record batch has an unknown header")
    if (key_presence == NONE_PRESENT and key_bytes) or (
        value_presence == NONE_PRESENT and value_bytes
    ):
        raise InvalidRecordError("columnar record batch has bytes for a column it says is empty")
    # Every size is below 2**35 and Python's ints do not overflow: the end of the last section
    # is compared with the batch's real length before any section is read.
    position = _HEADER.size + 8 * count
    stamps = view[_HEADER.size : position]
    keys, position = _section(view, position, count, key_presence)
    values, position = _section(view, position, count, value_presence)
    keys.data = view[position : position + key_bytes]
    position += key_bytes + (-key_bytes % 8)
    values.data = view[position : position + value_bytes]
    position += value_bytes + (-value_bytes % 8)
    if position + header_bytes != len(view):
        raise InvalidRecordError(
            f"columnar record batch is {len(view)} bytes, but its header "
            f"({count} records) says {position + header_bytes}"
        )
    return Sections(count, stamps, keys, values, view[position:])


def _section(view: memoryview, position: int, count: int, presence: int) -> tuple[Section, int]:
    """A column's lengths and validity at ``position`` (its bytes are set by the caller), and
    the position after them."""
    if presence == NONE_PRESENT:
        return Section(presence, _EMPTY, _EMPTY, _EMPTY), position
    used = 4 * count
    lengths = view[position : position + used]
    position += used + (-used % 8)
    if presence == ALL_PRESENT:
        return Section(presence, lengths, _EMPTY, _EMPTY), position
    bitmap = (count + 7) // 8
    validity = view[position : position + bitmap]
    return Section(presence, lengths, validity, _EMPTY), position + bitmap + (-bitmap % 8)


def read_columns(body: bytes | memoryview, *, lengths: bool = True) -> Columns:
    """A columnar batch's sections (``body``: its bytes after the codec byte, decompressed),
    every count and length checked: :class:`InvalidRecordError` unless the sections add up
    to exactly ``body``'s length, each column's lengths are not negative and add up to its
    byte count (an absent element's being 0), and the headers section decodes and names
    each record at most once, in order. With ``lengths=False`` (a check, which reads only
    the count and the timestamps), the lengths are checked but not put back: a column
    whose elements are all present then has empty ``lengths``."""
    sections = columnar_sections(body)
    count, stamps, header_view = sections.count, sections.stamps, sections.headers
    columns = []
    for section, what in ((sections.keys, "key"), (sections.values, "value")):
        presence, stored, validity, data = (
            section.presence,
            section.lengths,
            section.validity,
            section.data,
        )
        if presence == NONE_PRESENT:
            columns.append(Column(presence, _EMPTY, _EMPTY, _EMPTY))
            continue
        put_back = lengths or presence == SOME_PRESENT  # (an absent one's is checked)
        column = Column(
            presence, _checked_lengths(stored, len(data), what, put_back), validity, data
        )
        if presence == SOME_PRESENT:
            _check_absent(column, count, what)
        columns.append(column)
    headers: list[tuple[int, tuple[Header, ...]]] = []
    if header_view:
        try:
            headers = _headers_decoder.decode(header_view)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # (a name not UTF-8)
            raise InvalidRecordError(f"columnar record batch's headers: {exc}") from None
        last = -1
        for index, listed in headers:
            if not last < index < count or not listed:
                raise InvalidRecordError(
                    "columnar record batch's headers must name records in order, "
                    "each once, each with at least one header"
                )
            last = index
    return Columns(count, _untranspose(stamps, 8), columns[0], columns[1], headers)


def batch_body(
    payload: bytes | memoryview, max_bytes: int = MAX_BATCH_BYTES
) -> tuple[bool, bytes | memoryview]:
    """Whether a batch payload is columnar, and its bytes after the codec byte, decompressed
    (:class:`InvalidRecordError` if it cannot be, or would be more than ``max_bytes``)."""
    if not payload:
        raise InvalidRecordError("empty record batch")
    unpack = _BY_ID.get(payload[0] & ~COLUMNAR)
    if unpack is None:
        raise InvalidRecordError(f"record batch uses unknown compression id {payload[0]}")
    try:
        body = unpack(memoryview(payload)[1:], max_bytes)
    except (zlib.error, lzma.LZMAError) as exc:
        raise InvalidRecordError(f"record batch cannot be decoded: {exc}") from None
    if len(body) > max_bytes:  # (the stored codec does not bound what it returns)
        raise InvalidRecordError(f"record batch is more than {max_bytes} bytes")
    return bool(payload[0] & COLUMNAR), body


def unpack_batch(
    payload: bytes | memoryview, max_bytes: int = MAX_BATCH_BYTES
) -> Columns | list[UntrackedRecord]:
    """A batch payload read as cheaply as its layout allows: a columnar batch's checked
    :class:`Columns`, or a row batch's :class:`UntrackedRecord` list
    (:class:`InvalidRecordError` for anything malformed or too large)."""
    columnar, body = batch_body(payload, max_bytes)
    if columnar:
        return read_columns(body)
    return read_rows(body)


def read_rows(body: bytes | memoryview) -> list[UntrackedRecord]:
    """A row batch's records (``body``: its bytes after the codec byte, decompressed) as
    :class:`UntrackedRecord` (:class:`InvalidRecordError` if they do not decode)."""
    records: list[UntrackedRecord] = _decode_rows(_untracked, body)
    return records


def encode_batch(
    records: Sequence[WireRecord | UntrackedRecord],
    compression: str | None = None,
    *,
    columnar: bool = True,
) -> bytes:
    """Pack records into a batch payload, compressed with ``compression`` (None, "zlib",
    "lzma", "lz4" or "zstd"), in the columnar layout (or, with ``columnar=False``, the row
    layout every version of this format reads)."""
    try:
        ident, pack, _ = COMPRESSION[compression]
    except KeyError:
        known = ", ".join(repr(c) for c in COMPRESSION)
        raise ValueError(f"unknown compression {compression!r}; choose one of {known}") from None
    if columnar:
        return bytes((ident | COLUMNAR,)) + pack(_encode_columnar(records))
    return bytes((ident,)) + pack(_encoder.encode(records))


def decode_batch(payload: bytes, max_bytes: int = MAX_BATCH_BYTES) -> list[WireRecord]:
    """Unpack a batch payload (either layout); raises :class:`InvalidRecordError` if it is
    malformed or decompresses to more than ``max_bytes``."""
    columnar, body = batch_body(payload, max_bytes)
    if not columnar:
        return _decode_rows(_decoder, body)
    columns = read_columns(body)
    if columns.headers:
        headers: Iterable[list[Header]] = [list(h) for h in columns.header_lists()]
    else:
        headers = ([] for _ in range(columns.count))
    return _columnar_records(WireRecord, columns, headers)


def decode_untracked(
    payload: bytes | memoryview, max_bytes: int = MAX_BATCH_BYTES
) -> list[UntrackedRecord]:
    """The records of a batch payload as :class:`UntrackedRecord`; accepts and refuses
    exactly what :func:`decode_batch` does (raising :class:`InvalidRecordError`)."""
    columnar, body = batch_body(payload, max_bytes)
    if not columnar:
        return _decode_rows(_untracked, body)
    columns = read_columns(body)
    return _columnar_records(UntrackedRecord, columns, columns.header_lists())


_R = TypeVar("_R", WireRecord, UntrackedRecord)


def _columnar_records(
    make: Callable[..., _R], columns: Columns, headers: Iterable[Any]
) -> list[_R]:
    """A columnar batch's records as ``make(timestamp, key, value, headers)`` each."""
    n = columns.count
    return list(
        map(make, columns.timestamps(), columns.keys.items(n), columns.values.items(n), headers)
    )


def _decode_rows(decoder: msgspec.msgpack.Decoder[Any], body: bytes | memoryview) -> Any:
    """A row batch's records, decoded with ``decoder``."""
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # (a name not UTF-8)
        raise InvalidRecordError(f"record batch cannot be decoded: {exc}") from None


def check_batch(payload: bytes, max_bytes: int = MAX_BATCH_BYTES) -> tuple[int, int, int]:
    """A batch's record count and its oldest and newest timestamps (0 for no records),
    once it decodes (raises :class:`InvalidRecordError` as :func:`decode_batch` does).
    A columnar batch is checked without a Python object per record."""
    columnar, body = batch_body(payload, max_bytes)
    unpacked = read_columns(body, lengths=False) if columnar else read_rows(body)
    if isinstance(unpacked, Columns):
        if not unpacked.count:
            return 0, 0, 0
        stamps = unpacked.timestamps()
        return unpacked.count, min(stamps), max(stamps)
    if not unpacked:
        return 0, 0, 0
    stamps_list = [r.timestamp_ms for r in unpacked]
    return len(unpacked), min(stamps_list), max(stamps_list)


def records_from(
    topic: str, partition: int, batches: Iterable[tuple[int, bytes]], start: int = 0
) -> Iterator[ConsumerRecord]:
    """The records of ``(base_offset, payload)`` batches from offset ``start`` on.

    A fetch may return a batch that begins before the offset asked for; its
    earlier records are skipped here. A columnar batch's records are made
    column by column, with no intermediate record object.
    """
    for base, payload in batches:
        unpacked = unpack_batch(payload)
        skip = max(0, start - base)
        if not isinstance(unpacked, Columns):
            for index, rec in enumerate(unpacked[skip:], skip):
                yield ConsumerRecord(
                    topic,
                    partition,
                    base + index,
                    rec.timestamp_ms / 1000,
                    rec.key,
                    rec.value,
                    rec.headers,
                )
            continue
        count = unpacked.count
        if skip >= count:
            continue
        yield from map(
            ConsumerRecord,
            repeat(topic, count - skip),
            repeat(partition),
            range(base + skip, base + count),
            [stamp / 1000 for stamp in unpacked.timestamps()[skip:]],
            unpacked.keys.items(count)[skip:],
            unpacked.values.items(count)[skip:],
            unpacked.header_lists()[skip:],
        )
