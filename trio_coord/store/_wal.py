"""The embedded store's write-ahead log format: its records, its snapshot, their framing.

Each transaction is one :class:`_Record` of fully resolved operations (so replay
decides nothing), framed as payload length + CRC32 + payload; ``_scan_frames`` reads
the intact prefix of a log back and ``_next_intact_record`` finds where a damaged log
goes on. No I/O here: ``embedded.py`` writes and reads the files.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

import msgspec

_FORMAT: Final = 1
_FRAME: Final = struct.Struct("<II")  # payload length, CRC32 of payload
# --------------------------------------------------------------------------
# On-disk records. Each transaction is one ``_Record`` holding fully resolved
# operations with absolute values, so replay needs no decisions. The same
# operation types are applied to the in-memory tree for live writes, so the
# replay path is exercised by every write.


class _LogCreate(msgspec.Struct, array_like=True, frozen=True, tag="c"):
    """Create ``path``; set the parent's cversion/seq/neph to the given values."""

    path: str
    data: bytes
    owner: int  # session id for an ephemeral node (never on disk), else 0
    pcv: int
    pseq: int
    pneph: int


class _LogSet(msgspec.Struct, array_like=True, frozen=True, tag="s"):
    """Replace the data of ``path`` and set its version."""

    path: str
    data: bytes
    version: int


class _LogDelete(msgspec.Struct, array_like=True, frozen=True, tag="d"):
    """Delete the leaf ``path``; set the parent's cversion/seq/neph."""

    path: str
    pcv: int
    pseq: int
    pneph: int


class _LogMeta(msgspec.Struct, array_like=True, frozen=True, tag="m"):
    """Set a node's child bookkeeping (written instead of ephemeral creates/deletes)."""

    path: str
    cversion: int
    seq: int
    neph: int


_LogOp = _LogCreate | _LogSet | _LogDelete | _LogMeta


class _Record(msgspec.Struct, array_like=True, frozen=True):
    """One transaction in the log."""

    lsn: int
    ops: list[_LogOp]


class _SnapNode(msgspec.Struct, array_like=True, frozen=True):
    """One persistent node in a snapshot (parents always precede children)."""

    path: str
    data: bytes
    version: int
    cversion: int
    seq: int
    neph: int


class _Snapshot(msgspec.Struct, frozen=True):
    """The persistent tree as of log sequence number ``lsn``."""

    format: int
    lsn: int
    nodes: list[_SnapNode]


_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(_Record)
_snapshot_decoder = msgspec.msgpack.Decoder(_Snapshot)


def _frame(payload: bytes) -> bytes:
    """Length-prefix and checksum one payload."""
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _next_intact_record(buf: bytes, pos: int, after_lsn: int) -> int | None:
    """Where the first intact, decodable record with an lsn above ``after_lsn`` starts.

    Searched byte by byte from ``pos`` (only after a frame failed its
    checks): None means nothing intact follows, a torn tail; a position
    means damage in the middle of the log, which must not be cut.
    """
    header = _FRAME.size
    while pos + header <= len(buf):
        length, crc = _FRAME.unpack_from(buf, pos)
        end = pos + header + length
        if 0 < length and end <= len(buf) and zlib.crc32(buf[pos + header : end]) == crc:
            try:
                if _record_decoder.decode(buf[pos + header : end]).lsn > after_lsn:
                    return pos
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
        pos += 1
    return None


def _scan_frames(buf: bytes) -> tuple[list[bytes], int]:
    """Split ``buf`` into framed payloads.

    Returns the payloads of the leading run of intact frames and the offset
    where that run ends; after it is a torn tail, or damage (see ``_next_intact_record``).
    """
    payloads: list[bytes] = []
    pos = 0
    header = _FRAME.size
    while pos + header <= len(buf):
        length, crc = _FRAME.unpack_from(buf, pos)
        end = pos + header + length
        if length == 0 or end > len(buf):  # zero-filled or cut short
            break
        payload = buf[pos + header : end]
        if zlib.crc32(payload) != crc:
            break
        payloads.append(payload)
        pos = end
    return payloads, pos
