"""Record batches: how a producer packs records and a consumer unpacks them.

A batch is the unit a producer sends, a partition log stores and a fetch
returns. The broker decodes it once, to check it, then stores the bytes as
they came with the batch's record count and newest timestamp and assigns the
offsets (the ``i``-th record of a batch stored at ``base`` has offset
``base + i``). The bytes are one codec byte (see :data:`COMPRESSION`) followed
by a msgpack array of records, compressed as a whole when a codec is chosen;
each record is ``[timestamp_ms, key, value, headers]``. Producers, consumers,
the broker (to find an offset by timestamp) and the Spark data source all use
this one module, so the format has exactly one definition.

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
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

import cramjam
import msgspec

from .errors import InvalidRecordError
from .messages import TopicPartition

__all__ = [
    "COMPRESSION",
    "MAX_BATCH_BYTES",
    "ConsumerRecord",
    "Header",
    "UntrackedRecord",
    "WireRecord",
    "check_batch",
    "decode_batch",
    "decode_untracked",
    "encode_batch",
    "records_from",
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


def encode_batch(records: Sequence[WireRecord], compression: str | None = None) -> bytes:
    """Pack records into a batch payload, compressed with ``compression`` (None, "zlib",
    "lzma", "lz4" or "zstd")."""
    try:
        ident, pack, _ = COMPRESSION[compression]
    except KeyError:
        known = ", ".join(repr(c) for c in COMPRESSION)
        raise ValueError(f"unknown compression {compression!r}; choose one of {known}") from None
    return bytes((ident,)) + pack(_encoder.encode(records))


def decode_batch(payload: bytes, max_bytes: int = MAX_BATCH_BYTES) -> list[WireRecord]:
    """Unpack a batch payload; raises :class:`InvalidRecordError` if it is malformed
    or decompresses to more than ``max_bytes``."""
    return _decode_with(_decoder, payload, max_bytes)


def decode_untracked(
    payload: bytes | memoryview, max_bytes: int = MAX_BATCH_BYTES
) -> list[UntrackedRecord]:
    """The records of a batch payload as :class:`UntrackedRecord`; accepts and refuses
    exactly what :func:`decode_batch` does (raising :class:`InvalidRecordError`)."""
    return _decode_with(_untracked, payload, max_bytes)


def _decode_with(
    decoder: msgspec.msgpack.Decoder[Any], payload: bytes | memoryview, max_bytes: int
) -> Any:
    """Unpack a batch payload (its compression id, then the packed records) and decode it
    with ``decoder``; :class:`InvalidRecordError` for anything malformed or too large."""
    if not payload:
        raise InvalidRecordError("empty record batch")
    unpack = _BY_ID.get(payload[0])
    if unpack is None:
        raise InvalidRecordError(f"record batch uses unknown compression id {payload[0]}")
    try:
        return decoder.decode(unpack(memoryview(payload)[1:], max_bytes))
    except (msgspec.DecodeError, zlib.error, lzma.LZMAError) as exc:
        raise InvalidRecordError(f"record batch cannot be decoded: {exc}") from None


def check_batch(payload: bytes, max_bytes: int = MAX_BATCH_BYTES) -> tuple[int, int, int]:
    """A batch's record count and its oldest and newest timestamps (0 for no records),
    once it decodes (raises :class:`InvalidRecordError` as :func:`decode_batch` does)."""
    records = decode_untracked(payload, max_bytes)
    if not records:
        return 0, 0, 0
    stamps = [r.timestamp_ms for r in records]
    return len(records), min(stamps), max(stamps)


def records_from(
    topic: str, partition: int, batches: Iterable[tuple[int, bytes]], start: int = 0
) -> Iterator[ConsumerRecord]:
    """The records of ``(base_offset, payload)`` batches from offset ``start`` on.

    A fetch may return a batch that begins before the offset asked for; its
    earlier records are skipped here.
    """
    for base, payload in batches:
        for index, rec in enumerate(decode_batch(payload)):
            offset = base + index
            if offset >= start:
                yield ConsumerRecord(
                    topic,
                    partition,
                    offset,
                    rec.timestamp_ms / 1000,
                    rec.key,
                    rec.value,
                    tuple(rec.headers),
                )
