"""Kafka RecordBatch v2: check a batch as a client sent it, and convert at the native boundary.

A Kafka batch is stored as the client sent it (``log.segment`` format 3),
so this module's main job is to *check* one cheaply: the 61-byte header's
lengths, magic, record count and compression codec, and the batch's
CRC-32C (computed by the native ``crc32c`` package), without decompressing
or walking its records. Records are decoded only where a conversion or a
count needs them: a native consumer reading a Kafka batch
(:func:`kafka_to_native`), a Kafka consumer reading a native batch
(:func:`native_to_kafka`, which writes an uncompressed v2 batch), and
ListOffsets by timestamp. Key, value, headers and timestamp map 1:1; a null
header value reads as empty bytes on the native side (native headers carry
bytes), and a header name that is not UTF-8 is decoded with replacement
characters. Decompression (gzip, snappy in raw or xerial framing, lz4 frame,
zstd) is bounded by :data:`~trio_coord.protocol.records.MAX_BATCH_BYTES`, so
a small bomb cannot make the broker allocate gigabytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

import cramjam
from crc32c import crc32c

from ..protocol.records import (
    MAX_BATCH_BYTES,
    UntrackedRecord,
    WireRecord,
    decode_untracked,
    encode_batch,
)

__all__ = [
    "BATCH_HEADER",
    "BatchHeader",
    "RecordBatchError",
    "check_batch",
    "decode_records",
    "encode_records",
    "kafka_to_native",
    "native_to_kafka",
    "split_records",
]

BATCH_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
"""baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount."""
_CRC_START: Final = 21  # the CRC covers the batch from its attributes on
_LENGTH_END: Final = 12  # batchLength counts the bytes after itself
CODECS: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
"""Compression codec id (attributes & 7) → name."""
TRANSACTIONAL: Final = 0x10
CONTROL: Final = 0x20
NO_PRODUCER_ID: Final = -1
_XERIAL: Final = b"\x82SNAPPY\x00"
_INT: Final = struct.Struct(">i")


class RecordBatchError(ValueError):
    """A record batch that is malformed, fails its CRC, or cannot be converted."""


class BatchHeader(NamedTuple):
    """The fields of a RecordBatch v2 header that the broker uses."""

    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int  # type: ignore[assignment]  # (the field's name shadows tuple.count)

    @property
    def codec(self) -> int:
        """The compression codec id (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)."""
        return self.attributes & 7


def check_batch(data: bytes) -> BatchHeader:
    """Check one whole RecordBatch v2 (header, lengths, CRC-32C); its records stay unread.

    Raises :class:`RecordBatchError` naming the first problem. Transactional
    and control batches are refused (no transactions on this broker).
    """
    if len(data) < BATCH_HEADER.size:
        raise RecordBatchError(f"a record batch of {len(data)} bytes is shorter than its header")
    (_base, length, _epoch, magic, crc, attributes, last_delta, base_ts, max_ts, pid, epoch,
     seq, count) = BATCH_HEADER.unpack_from(data)  # fmt: skip
    if magic != 2:
        raise RecordBatchError(f"record batch magic {magic}: only RecordBatch v2 is accepted")
    if length != len(data) - _LENGTH_END:
        raise RecordBatchError(
            f"the records hold {len(data)} bytes but the batch says {length + _LENGTH_END} "
            "(exactly one record batch per partition is accepted)"
        )
    if attributes & 7 not in CODECS:
        raise RecordBatchError(f"unknown compression codec {attributes & 7}")
    if attributes & (TRANSACTIONAL | CONTROL):
        raise RecordBatchError("transactional and control batches are not supported")
    if not 0 <= last_delta or count != last_delta + 1:
        raise RecordBatchError(
            f"the batch holds {count} record(s) but its last offset delta is {last_delta}"
        )
    if crc32c(memoryview(data)[_CRC_START:]) != crc:
        raise RecordBatchError("the record batch fails its CRC-32C check")
    return BatchHeader(attributes, last_delta, base_ts, max_ts, pid, epoch, seq, count)


# -- compression ---------------------------------------------------------------------------


def _bounded(decompress_into: object, data: bytes, limit: int) -> bytes:
    """Decompress with cramjam into buffers that grow up to ``limit`` bytes, no further."""
    size = min(limit + 1, max(64 * 1024, 8 * len(data)))
    while True:
        out = bytearray(size)
        try:
            n = decompress_into(data, out)  # type: ignore[operator]
        except cramjam.DecompressionError as exc:
            if "whole buffer" in str(exc) and size <= limit:
                size = min(limit + 1, size * 4)
                continue
            if "whole buffer" in str(exc):
                raise RecordBatchError(
                    f"a record batch decompresses to more than {limit} bytes"
                ) from None
            raise RecordBatchError(f"a record batch cannot be decompressed: {exc}") from None
        if n > limit:
            raise RecordBatchError(f"a record batch decompresses to more than {limit} bytes")
        return bytes(out[:n])


def _gunzip(data: bytes, limit: int) -> bytes:
    unpacker = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
    try:
        out = unpacker.decompress(data, limit + 1)
    except zlib.error as exc:
        raise RecordBatchError(f"a gzip record batch cannot be decompressed: {exc}") from None
    if len(out) > limit or unpacker.unconsumed_tail:
        raise RecordBatchError(f"a record batch decompresses to more than {limit} bytes")
    return out


def _snappy_raw(data: bytes | memoryview, limit: int) -> bytes:
    try:
        if cramjam.snappy.decompress_raw_len(data) > limit:
            raise RecordBatchError(f"a record batch decompresses to more than {limit} bytes")
        return bytes(cramjam.snappy.decompress_raw(data))
    except cramjam.DecompressionError as exc:
        raise RecordBatchError(f"a snappy record batch cannot be decompressed: {exc}") from None


def _unsnappy(data: bytes, limit: int) -> bytes:
    if not data.startswith(_XERIAL):
        return _snappy_raw(data, limit)
    parts: list[bytes] = []
    pos, total = 16, 0  # magic, version, compatible version
    view = memoryview(data)
    while pos < len(data):
        if pos + 4 > len(data):
            raise RecordBatchError("a xerial snappy block header is cut short")
        (size,) = _INT.unpack_from(data, pos)
        if size < 0 or pos + 4 + size > len(data):
            raise RecordBatchError("a xerial snappy block is cut short")
        part = _snappy_raw(view[pos + 4 : pos + 4 + size], limit - total)
        total += len(part)
        parts.append(part)
        pos += 4 + size
    return b"".join(parts)


def _unlz4(data: bytes, limit: int) -> bytes:
    return _bounded(cramjam.lz4.decompress_into, data, limit)


def _unzstd(data: bytes, limit: int) -> bytes:
    return _bounded(cramjam.zstd.decompress_into, data, limit)


_DECOMPRESS: Final = {1: _gunzip, 2: _unsnappy, 3: _unlz4, 4: _unzstd}


# -- records -------------------------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (up to 64 bits) at ``pos``: (value, position after it)."""
    shift = result = 0
    end = len(data)
    while True:
        if pos >= end:
            raise RecordBatchError("a record is cut short")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise RecordBatchError("a varint is longer than 10 bytes")


def _bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    size, pos = _varint(data, pos)
    if size < 0:
        return None, pos
    end = pos + size
    if end > len(data):
        raise RecordBatchError("a record's field is cut short")
    return data[pos:end], end


def decode_records(data: bytes, header: BatchHeader | None = None) -> list[WireRecord]:
    """The records of a whole, checked batch, in native form (offsets are ``base + index``).

    Decompresses if the batch is compressed (bounded). Raises
    :class:`RecordBatchError` if a record is malformed or the offset deltas
    are not 0, 1, 2, ... (every producer writes them so).
    """
    header = header or check_batch(data)
    body = data[BATCH_HEADER.size :]
    unpack = _DECOMPRESS.get(header.codec)
    if unpack is not None:
        body = unpack(body, MAX_BATCH_BYTES)
    out: list[WireRecord] = []
    pos = 0
    base_ts = header.base_timestamp
    for index in range(header.count):
        length, pos = _varint(body, pos)
        end = pos + length
        if length < 0 or end > len(body):
            raise RecordBatchError("a record is cut short")
        pos += 1  # attributes (unused)
        ts_delta, pos = _varint(body, pos)
        offset_delta, pos = _varint(body, pos)
        if offset_delta != index:
            raise RecordBatchError(
                f"record {index} has offset delta {offset_delta}: offsets must run 0, 1, 2, ..."
            )
        key, pos = _bytes(body, pos)
        value, pos = _bytes(body, pos)
        n_headers, pos = _varint(body, pos)
        if n_headers < 0 or n_headers > length:
            raise RecordBatchError("a record's header count is invalid")
        headers: list[tuple[str, bytes]] = []
        for _ in range(n_headers):
            name, pos = _bytes(body, pos)
            hvalue, pos = _bytes(body, pos)
            if name is None:
                raise RecordBatchError("a record header has a null name")
            headers.append((name.decode(errors="replace"), hvalue or b""))
        if pos != end:
            raise RecordBatchError("a record's length does not match its fields")
        out.append(WireRecord(base_ts + ts_delta, key, value, headers))
    if pos != len(body):
        raise RecordBatchError("bytes follow the last record of the batch")
    return out


def _put_varint(out: bytearray, value: int) -> None:
    value = (value << 1) ^ (value >> 63)
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out.append(1)  # zigzag(-1)
    else:
        _put_varint(out, len(value))
        out += value


def encode_records(base_offset: int, records: Sequence[WireRecord | UntrackedRecord]) -> bytes:
    """An uncompressed RecordBatch v2 of ``records`` at ``base_offset`` (no producer id)."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    base_ts = records[0].timestamp_ms
    max_ts = max(r.timestamp_ms for r in records)
    body = bytearray()
    rec = bytearray()
    for index, record in enumerate(records):
        rec.clear()
        rec.append(0)
        _put_varint(rec, record.timestamp_ms - base_ts)
        _put_varint(rec, index)
        _put_bytes(rec, record.key)
        _put_bytes(rec, record.value)
        _put_varint(rec, len(record.headers))
        for name, hvalue in record.headers:
            _put_bytes(rec, name.encode())
            _put_bytes(rec, hvalue)
        _put_varint(body, len(rec))
        body += rec
    count = len(records)
    tail = struct.pack(">hiqqqhii", 0, count - 1, base_ts, max_ts, -1, -1, -1, count) + body
    crc = crc32c(tail)
    head = struct.pack(">qiibI", base_offset, len(tail) + 9, 0, 2, crc)
    return head + tail


def split_records(
    base_offset: int, records: list[WireRecord], max_bytes: int
) -> Iterator[tuple[int, list[WireRecord]]]:
    """``records`` (offsets from ``base_offset``) cut into runs of about ``max_bytes`` each.

    Each run holds at least one record; the sizes are estimates (key, value
    and headers), enough to keep a converted batch within a frame.
    """
    start, size = 0, 0
    for index, record in enumerate(records):
        weight = 16 + len(record.key or b"") + len(record.value or b"")
        weight += sum(len(name) + len(value) + 8 for name, value in record.headers)
        if index > start and size + weight > max_bytes:
            yield base_offset + start, records[start:index]
            start, size = index, 0
        size += weight
    if start < len(records):
        yield base_offset + start, records[start:]


def native_to_kafka(base_offset: int, payload: bytes) -> bytes:
    """A native batch (``protocol.records``) as an uncompressed Kafka RecordBatch v2."""
    try:
        return encode_records(base_offset, decode_untracked(payload))
    except ValueError as exc:
        raise RecordBatchError(f"a native batch cannot be converted: {exc}") from None


def kafka_to_native(payload: bytes) -> bytes:
    """A stored Kafka RecordBatch v2 as a native batch payload (uncompressed, in the row
    layout: msgspec encodes it in C, several times faster than the columnar one in Python,
    and this runs on the broker)."""
    return encode_batch(decode_records(payload), columnar=False)
