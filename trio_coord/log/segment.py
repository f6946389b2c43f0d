"""One segment of a partition log: a ``.log`` file of framed batches and its sparse ``.index``.

Its one job is the file format and the I/O on one segment: :class:`Segment`
appends a batch (one ``pwritev`` to the page cache), finds and reads
batches by offset or by timestamp through an in-memory copy of the sparse
index, and recovers itself at start-up: the last segment of a partition is
scanned in full and a torn tail cut off (damage followed by intact data
raises :class:`LogCorruptError` instead); an earlier segment is
trusted, its index loaded from disk (and rebuilt if missing or broken).

The ``.log`` file is a sequence of frames, each a fixed header and the
payload::

    format     u8    1 (native batch), 3 (Kafka RecordBatch v2) or 2 (gap)
    base       i64   offset of the batch's first record
    count      i32   records in the batch (>= 1)
    max_ts     i64   largest record timestamp, ms
    length     i32   payload bytes
    crc        u32   CRC32 of the 25 header bytes above and the payload
    payload    length bytes, opaque to the log

all big-endian. A frame of format :data:`GAP` (no payload) is a *gap*:
``--repair`` writes one in place of damaged bytes, covering exactly the
offsets they held, so that offsets run on and none is ever given out again;
reads skip it.

A frame of format :data:`KAFKA` holds a Kafka RecordBatch v2 exactly as the
client sent it, but for its first 8 bytes (the batch's base offset), which
the append sets to the offset the log assigned, and bytes 12 to 16 (the
partition leader epoch), set to 0. Neither is covered by the batch's own
CRC-32C, so the batch stays valid, and a fetch serves the bytes as stored.

Recovery tells a torn write from damage. A torn write is an incomplete
*last* write: nothing intact follows it. Bytes that fail their checks but
are followed by an intact frame further on (found by resynchronising on the
frame format and CRC) are damage, and cutting there would drop acknowledged
records and give their offsets out again: :class:`LogCorruptError` is
raised instead, and the partition is refused until it is repaired.

The ``.index`` file holds one 16-byte entry per
``index_interval_bytes`` of log (and always one for the first batch):
``(relative offset u32, file position u32, ts_before i64)``, where
``ts_before`` is the largest timestamp of the segment's batches before that
position (so that a search by time can binary-search it too), followed by a
CRC32 of the entries. A segment's index file is written whole, and fsynced,
when the segment stops being the active one (and when the log closes);
the active segment's index lives in memory and is rebuilt from the scan
after a restart.

The methods named for the worker thread (``create``, ``recover``, ``load``,
``sync``, ``write_index``, ``close``, ``delete``) block on the disk; the
rest only copy to or from the page cache.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from .._files import fdatasync, fsync_dir, write_file
from .base import LogCorruptError, StoredBatch

__all__ = [
    "FORMAT",
    "GAP",
    "HEADER",
    "INDEX_ENTRY",
    "KAFKA",
    "MAX_COUNT",
    "MAX_PAYLOAD",
    "MAX_RELATIVE_OFFSET",
    "NO_TIMESTAMP",
    "Segment",
    "check_batch",
    "parse_segment_name",
    "segment_name",
]

logger = logging.getLogger(__name__)

FORMAT: Final = 1
"""The frame format byte of a batch."""
GAP: Final = 2
"""The frame format byte of a gap: offsets lost to damage, no payload (see ``repair``)."""
KAFKA: Final = 3
"""The frame format byte of a Kafka RecordBatch v2 (its base offset set by the append)."""
_FORMATS: Final = (FORMAT, GAP, KAFKA)
_DATA_FORMATS: Final = frozenset((FORMAT, KAFKA))
_KAFKA_PATCH: Final = struct.Struct(">qi")  # base offset, then batchLength (kept)
_KAFKA_PREFIX: Final = 16  # base offset, batch length, partition leader epoch

_PREFIX: Final = struct.Struct(">Bqiqi")  # the header up to the CRC
_CRC: Final = struct.Struct(">I")
HEADER: Final = struct.Struct(">BqiqiI")
"""The frame header: format, base offset, count, max timestamp, payload length, CRC32."""

INDEX_ENTRY: Final = struct.Struct(">IIq")
"""One sparse index entry: relative offset, file position, largest timestamp before it."""

NO_TIMESTAMP: Final = -(2**63)
"""The ``max_timestamp`` of an empty segment, and ``ts_before`` of its first batch."""

MAX_COUNT: Final = 2**31 - 1
MAX_PAYLOAD: Final = 2**31 - 1
MAX_RELATIVE_OFFSET: Final = 2**32 - 1
"""A batch whose base is further than this from its segment's base goes to a new segment."""

_MAX_TIMESTAMP: Final = 2**63 - 1
_DIGITS: Final = 20
_NAME: Final = re.compile(r"([0-9]{20})(\.log|\.index)")
_SCAN_READAHEAD: Final = 1 << 20
_MIN_READAHEAD: Final = 64 << 10
_MAX_READAHEAD: Final = 4 << 20


def segment_name(base_offset: int) -> str:
    """The file name stem of the segment starting at ``base_offset`` (20 digits)."""
    return f"{base_offset:0{_DIGITS}d}"


def parse_segment_name(filename: str, suffix: str = ".log") -> int | None:
    """The base offset in a segment file name ending in ``suffix``, or None if it is none."""
    match = _NAME.fullmatch(filename)
    return int(match.group(1)) if match and match.group(2) == suffix else None


def _pread_full(fd: int, size: int, pos: int) -> bytes:
    """Read ``size`` bytes at ``pos``, fewer only at the end of the file."""
    data = os.pread(fd, size, pos)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, pos + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _pwrite_all(fd: int, parts: Sequence[bytes | memoryview], pos: int) -> None:
    """Write every byte of ``parts`` at ``pos`` (one ``pwritev`` unless it comes up short)."""
    views = [memoryview(part).cast("B") for part in parts if len(part)]
    while views:
        written = os.pwritev(fd, views, pos)
        if written <= 0:
            raise OSError(f"pwritev wrote {written} bytes")
        pos += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if written:
            views[0] = views[0][written:]


class _Cursor:
    """Reads a segment file front to back in chunks, so that each frame is not two syscalls.

    With ``scratch`` (:func:`_scratch`: one reused buffer per thread) the chunks are read
    into it, and a view :meth:`get` returns is valid only until the next call; without,
    each chunk is a new bytes object and a view stays valid.
    """

    __slots__ = ("_buf", "_fd", "_limit", "_readahead", "_scratch", "_size", "_start")

    def __init__(
        self, fd: int, limit: int, readahead: int, scratch: bytearray | None = None
    ) -> None:
        self._fd = fd
        self._limit = limit
        self._readahead = readahead
        self._buf: bytes | bytearray = b""
        self._size = 0
        self._start = 0
        self._scratch = scratch

    def get(self, pos: int, size: int) -> memoryview | None:
        """``size`` bytes at ``pos``, or None if the file (up to its limit) holds fewer."""
        if pos + size > self._limit:
            return None
        off = pos - self._start
        if off < 0 or off + size > self._size:
            want = max(size, min(self._readahead, self._limit - pos))
            scratch = self._scratch
            if scratch is not None and want <= len(scratch):
                self._buf, self._size = scratch, _preadv_full(self._fd, scratch, want, pos)
            else:
                self._buf = _pread_full(self._fd, want, pos)
                self._size = len(self._buf)
            self._start, off = pos, 0
            if self._size < size:
                return None
        return memoryview(self._buf)[off : off + size]


_scratches = threading.local()


def _scratch() -> bytearray:
    """This thread's buffer for a fetch's read-ahead (:data:`_MAX_READAHEAD` and a header).

    A fetch reads up to 4 MiB of a segment at a time. Read into a new bytes
    object each time, and then copied out batch by batch, that cost the
    broker 4.4 ms per 4 MiB, where reading into one buffer kept for the next
    read costs 0.6: a new buffer of that size is fresh pages from the kernel
    every time, and so were the copies' after it was freed.
    """
    buf: bytearray | None = getattr(_scratches, "buf", None)
    if buf is None:
        buf = _scratches.buf = bytearray(_MAX_READAHEAD + HEADER.size)
    return buf


def _preadv_full(fd: int, buf: bytearray, size: int, pos: int) -> int:
    """Read ``size`` bytes at ``pos`` into the start of ``buf``; how many (fewer only at the
    end of the file)."""
    view = memoryview(buf)
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:size]], pos + got)
        if not n:
            break
        got += n
    return got


_Frame = tuple[int, int, int, int, int]  # position, base offset, count, max timestamp, length


def _next_intact_frame(cursor: _Cursor, pos: int, min_base: int) -> _Frame | None:
    """The first intact frame at or after ``pos`` holding offsets from ``min_base`` on.

    Resynchronises byte by byte on the format byte, then the header's
    sanity and the CRC; used only after a frame failed its checks, to tell
    a torn tail (None: nothing intact follows) from damage in the middle.
    """
    size = HEADER.size
    while True:
        chunk = cursor.get(pos, size)
        if chunk is None:
            return None
        data = bytes(chunk)
        found = [at for at in (data.find(bytes([f])) for f in _DATA_FORMATS) if at >= 0]
        if not found:
            pos += size
            continue
        pos += min(found)
        header = cursor.get(pos, size)
        if header is None:
            return None
        fmt, base, count, max_ts, length, crc = HEADER.unpack(header)
        if fmt in _DATA_FORMATS and base >= min_base and 1 <= count and length >= 0:
            payload = cursor.get(pos + size, length)
            if payload is not None and (
                zlib.crc32(payload, zlib.crc32(header[: _PREFIX.size])) == crc
            ):
                return pos, base, count, max_ts, length
        pos += 1


def _gap_frame(base: int, count: int, max_timestamp: int) -> bytes:
    """A frame with no payload standing for ``count`` offsets lost from ``base`` on."""
    prefix = _PREFIX.pack(GAP, base, count, max_timestamp, 0)
    return prefix + _CRC.pack(zlib.crc32(prefix))


def _valid_frames(cursor: _Cursor, pos: int, expected_base: int) -> Iterator[_Frame]:
    """The leading run of intact frames from ``pos``, each starting where the last one ended.

    A frame is intact if its header is complete and well formed, its
    payload fits in the file, its base offset follows the previous frame's
    records (the first one's is ``expected_base``) and its CRC matches. The
    run ends at the first frame that is not (a torn tail, or damage).
    """
    size = HEADER.size
    while True:
        header = cursor.get(pos, size)
        if header is None:
            return
        fmt, base, count, max_ts, length, crc = HEADER.unpack(header)
        if fmt not in _FORMATS or base != expected_base or count < 1 or length < 0:
            return
        if fmt == GAP and length:
            return
        payload = cursor.get(pos + size, length)
        if payload is None:
            return
        if zlib.crc32(payload, zlib.crc32(header[: _PREFIX.size])) != crc:
            return
        yield pos, base, count, max_ts, length
        pos += size + length
        expected_base = base + count


class Segment:
    """One segment: its files, its extent (size, offsets, newest timestamp) and its sparse index.

    Created by :meth:`create` (an empty new segment), :meth:`recover` (the
    last segment of a partition, scanned in full) or :meth:`load` (an
    earlier one, trusted). Not thread-safe: the owning partition log makes
    sure that at most one worker thread touches a segment, and only while
    the Trio thread leaves that segment alone or merely reads it.
    """

    __slots__ = (
        "_fd",
        "_idx_pos",
        "_idx_rel",
        "_idx_ts",
        "_last_indexed",
        "base_offset",
        "directory",
        "index_path",
        "log_path",
        "max_timestamp",
        "next_offset",
        "size",
    )

    def __init__(self, directory: Path, base_offset: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        stem = segment_name(base_offset)
        self.log_path = directory / f"{stem}.log"
        self.index_path = directory / f"{stem}.index"
        self.size = 0
        """Bytes of intact frames in the log file (written, not necessarily fsynced)."""
        self.next_offset = base_offset
        """The offset just after this segment's last batch."""
        self.max_timestamp = NO_TIMESTAMP
        """The largest ``max_timestamp`` of this segment's batches."""
        self._fd = -1
        self._idx_rel: array[int] = array("I")
        self._idx_pos: array[int] = array("I")
        self._idx_ts: array[int] = array("q")
        self._last_indexed = 0

    def __repr__(self) -> str:
        return (
            f"<Segment {self.log_path} offsets [{self.base_offset}, {self.next_offset}) "
            f"{self.size} bytes>"
        )

    @property
    def index_entries(self) -> int:
        """How many sparse index entries this segment has (in memory)."""
        return len(self._idx_pos)

    # -- life cycle (worker thread) ---------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> Segment:
        """Create an empty segment's log file (replacing any leftover) and open it for appends.

        The caller fsyncs the directory, so that the new file survives a power loss.
        """
        segment = cls(directory, base_offset)
        segment._fd = os.open(segment.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        segment.index_path.unlink(missing_ok=True)
        return segment

    @classmethod
    def recover(cls, directory: Path, base_offset: int, index_interval: int) -> Segment:
        """Open the last segment of a partition for appends after validating all of it.

        Every frame is checked (format, length, CRC, contiguous offsets). A
        torn tail is cut off: its bytes are kept beside the log as
        ``<name>.log.cut-<position>`` for a post-mortem, then the log is
        truncated, with a warning. Damage followed by intact frames raises
        :class:`LogCorruptError` (see the module docstring). The index is
        rebuilt from the scan. The file is fsynced before returning, since
        its batches become visible to readers.
        """
        segment = cls(directory, base_offset)
        fd = os.open(segment.log_path, os.O_RDWR)
        segment._fd = fd
        try:
            file_size = os.fstat(fd).st_size
            cursor = _Cursor(fd, file_size, _SCAN_READAHEAD)
            end = segment._scan(cursor, 0, index_interval)
            if end < file_size and _next_intact_frame(cursor, end + 1, segment.next_offset):
                raise segment._damaged(end, file_size, "intact data follows")
            if end < file_size:
                kept = segment.log_path.with_name(f"{segment.log_path.name}.cut-{end}")
                write_file(kept, _pread_full(fd, file_size - end, end))
                logger.warning(
                    "%s: cut a torn tail of %d bytes at position %d; %d bytes "
                    "of intact batches kept, offsets [%d, %d) (the cut bytes are in %s)",
                    segment.log_path,
                    file_size - end,
                    end,
                    end,
                    base_offset,
                    segment.next_offset,
                    kept,
                )
                os.ftruncate(fd, end)
            fdatasync(fd)
        except BaseException:
            segment.close()
            raise
        return segment

    @classmethod
    def load(cls, directory: Path, base_offset: int, index_interval: int) -> Segment:
        """Load an earlier (not the last) segment of a partition, trusting its contents.

        Its index file is read and checked (CRC and ordering); the frames
        after the last index entry are validated to find where the segment
        ends. A missing or broken index is rebuilt by a full scan and
        written back. Raises :class:`LogError` if the log itself is corrupt:
        a segment that was followed by another one was fsynced in full
        before that one was created, so damage there is no torn write.
        The log file is not kept open (reads open it when they need it).
        """
        segment = cls(directory, base_offset)
        fd = os.open(segment.log_path, os.O_RDONLY)
        try:
            file_size = os.fstat(fd).st_size
            cursor = _Cursor(fd, file_size, _SCAN_READAHEAD)
            if segment._load_index(file_size):
                # The frames after the last entry tell where this segment ends.
                i = len(segment._idx_pos) - 1
                if i < 0:
                    end = 0
                else:
                    segment.next_offset = base_offset + segment._idx_rel[i]
                    segment.max_timestamp = segment._idx_ts[i]
                    end = segment._scan(cursor, segment._idx_pos[i], index_interval)
                if end == file_size:
                    return segment
                logger.warning(
                    "%s does not match %s; rebuilding it", segment.index_path, segment.log_path
                )
            elif segment.index_path.exists():
                logger.warning("%s is broken; rebuilding it", segment.index_path)
            else:
                logger.warning("%s is missing; rebuilding it", segment.index_path)
            segment._reset_extent()
            end = segment._scan(cursor, 0, index_interval)
            if end != file_size:
                # Not the last segment: it was fsynced whole before the next one was
                # made, so damage anywhere in it is no torn write.
                raise segment._damaged(end, file_size, "it is not the last segment")
            segment.write_index()
            return segment
        finally:
            os.close(fd)

    @classmethod
    def repair(
        cls, directory: Path, base_offset: int, index_interval: int, next_base: int | None
    ) -> tuple[Segment, list[tuple[int, int]]]:
        """Rewrite a damaged segment without its damage; returns it and the offsets lost.

        Every intact frame is kept, before and after each damaged stretch,
        and each stretch becomes a gap frame covering exactly the offsets
        between the intact frames around it (for a stretch at the end of a
        segment that is not the last, up to ``next_base``; at the end of the
        last segment nothing follows, so that is a torn tail and is cut). The
        original file is kept as ``<name>.log.damaged-<position>`` (never
        deleted), the new one replaces it atomically, and its index is
        rewritten. Returns the lost offset ranges ``[(first, end), ...)``.
        The caller opens the result as usual (:meth:`load` or :meth:`recover`).
        """
        segment = cls(directory, base_offset)
        fd = os.open(segment.log_path, os.O_RDONLY)
        try:
            file_size = os.fstat(fd).st_size
            cursor = _Cursor(fd, file_size, _SCAN_READAHEAD)
            parts: list[bytes] = []
            lost: list[tuple[int, int]] = []
            pos, expected, max_ts, first_damage = 0, base_offset, NO_TIMESTAMP, -1
            while pos < file_size:
                for at, base, count, ts, length in _valid_frames(cursor, pos, expected):
                    parts.append(bytes(cursor.get(at, HEADER.size + length) or b""))
                    pos, expected, max_ts = at + HEADER.size + length, base + count, max(max_ts, ts)
                if pos >= file_size:
                    break
                first_damage = pos if first_damage < 0 else first_damage
                found = _next_intact_frame(cursor, pos + 1, expected)
                resume = found[1] if found is not None else next_base
                if resume is not None and resume > expected:
                    parts.append(_gap_frame(expected, resume - expected, max_ts))
                    lost.append((expected, resume))
                    expected = resume
                if found is None:
                    break
                pos = found[0]
        finally:
            os.close(fd)
        if first_damage < 0:
            return cls.load(directory, base_offset, index_interval), []
        kept = segment.log_path.with_name(f"{segment.log_path.name}.damaged-{first_damage}")
        os.replace(segment.log_path, kept)
        write_file(segment.log_path, b"".join(parts))
        segment.index_path.unlink(missing_ok=True)
        fsync_dir(directory)
        logger.error(
            "%s: repaired: the damaged original is kept as %s; offsets lost: %s",
            segment.log_path,
            kept,
            ", ".join(f"[{a}, {b})" for a, b in lost) or "none (a torn tail was cut)",
        )
        return segment, lost

    def _damaged(self, position: int, file_size: int, why: str) -> LogCorruptError:
        """The error for damage at ``position`` that no torn write can explain (``why``)."""
        return LogCorruptError(
            f"segment {self.log_path} is damaged at byte {position} of {file_size} (offset "
            f"{self.next_offset} on; {self.next_offset - self.base_offset} intact record(s) "
            f"before it) and {why}, so it is no torn write: the partition is "
            "refused rather than cut there, which would lose acknowledged records and give "
            "their offsets out again. Restore the partition directory from a backup, or "
            "restart the broker with --repair to move the damaged bytes aside and keep every "
            "intact batch (the records in the damaged bytes are lost)",
            self.log_path,
            position,
            self.next_offset,
        )

    def sync(self) -> None:
        """Make every byte written to the log durable: fdatasync (worker thread)."""
        fdatasync(self._fd)

    def write_index(self) -> None:
        """Write the whole sparse index to the ``.index`` file and fsync it (worker thread)."""
        body = b"".join(
            INDEX_ENTRY.pack(rel, pos, ts)
            for rel, pos, ts in zip(self._idx_rel, self._idx_pos, self._idx_ts, strict=True)
        )
        write_file(self.index_path, body + _CRC.pack(zlib.crc32(body)))

    def close(self) -> None:
        """Close the log file if it is open (reads reopen it)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def delete(self) -> None:
        """Remove the segment's files, log first (it defines the segment), then close it."""
        try:
            self.log_path.unlink(missing_ok=True)
            self.index_path.unlink(missing_ok=True)
        finally:
            self.close()

    # -- scanning ------------------------------------------------------------------------

    def _reset_extent(self) -> None:
        self.size = 0
        self.next_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        del self._idx_rel[:], self._idx_pos[:], self._idx_ts[:]
        self._last_indexed = 0

    def _note(
        self, pos: int, base: int, count: int, max_ts: int, frame: int, interval: int
    ) -> None:
        """Account for the intact frame at ``pos``: index entry if due, extent."""
        last = self._last_indexed
        if not self._idx_pos or (pos > last and pos - last >= interval):
            self._idx_rel.append(base - self.base_offset)
            self._idx_pos.append(pos)
            self._idx_ts.append(self.max_timestamp)
            self._last_indexed = pos
        self.size = pos + frame
        self.next_offset = base + count
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts

    def _scan(self, cursor: _Cursor, pos: int, interval: int) -> int:
        """Validate the frames from ``pos`` on and account for them; return where they end.

        The first frame must hold offset ``self.next_offset`` (the caller
        sets the extent up to ``pos``).
        """
        self.size = pos
        for at, base, count, max_ts, length in _valid_frames(cursor, pos, self.next_offset):
            self._note(at, base, count, max_ts, HEADER.size + length, interval)
        return self.size

    def _load_index(self, file_size: int) -> bool:
        """Load the index file into memory if it is intact and fits the log; else False."""
        try:
            data = self.index_path.read_bytes()
        except FileNotFoundError:
            return False
        entry = INDEX_ENTRY.size
        if len(data) < _CRC.size or (len(data) - _CRC.size) % entry:
            return False
        body = data[: -_CRC.size]
        if zlib.crc32(body) != _CRC.unpack_from(data, len(body))[0]:
            return False
        rels, poss, tss = array("I"), array("I"), array("q")
        prev: tuple[int, int, int] | None = None
        for rel, pos, ts in INDEX_ENTRY.iter_unpack(body):
            if prev is None:
                if (rel, pos, ts) != (0, 0, NO_TIMESTAMP):
                    return False
            elif not (rel > prev[0] and pos > prev[1] and ts >= prev[2]):
                return False
            rels.append(rel)
            poss.append(pos)
            tss.append(ts)
            prev = (rel, pos, ts)
        if (prev is None) != (file_size == 0) or (prev is not None and prev[1] >= file_size):
            return False
        self._idx_rel, self._idx_pos, self._idx_ts = rels, poss, tss
        self._last_indexed = poss[-1] if poss else 0
        return True

    # -- appending and reading (Trio thread: page cache only) ---------------------------------

    def _read_fd(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.log_path, os.O_RDONLY)
        return self._fd

    def append(
        self,
        base_offset: int,
        count: int,
        max_timestamp: int,
        payload: bytes,
        interval: int,
        fmt: int = FORMAT,
    ) -> None:
        """Write one batch at the end of the log (page cache; no fsync) and index it if due.

        ``fmt`` is the frame format: :data:`FORMAT` (opaque payload) or
        :data:`KAFKA` (a RecordBatch v2 whose base offset and partition
        leader epoch are rewritten on the way, without copying the payload).
        On an OSError nothing is accounted for: the segment's size and
        offsets are as before, though the file may hold a partial frame past
        ``size`` that the caller must truncate.
        """
        prefix = _PREFIX.pack(fmt, base_offset, count, max_timestamp, len(payload))
        parts: list[bytes | memoryview]
        if fmt == KAFKA:
            (length,) = struct.unpack_from(">i", payload, 8)
            head = _KAFKA_PATCH.pack(base_offset, length) + bytes(4)
            body = memoryview(payload)[_KAFKA_PREFIX:]
            crc = zlib.crc32(body, zlib.crc32(head, zlib.crc32(prefix)))
            parts = [prefix + _CRC.pack(crc), head, body]
        elif fmt == FORMAT:
            crc = zlib.crc32(payload, zlib.crc32(prefix))
            parts = [prefix + _CRC.pack(crc), payload]
        else:
            raise ValueError(f"frame format {fmt} cannot be appended")
        pos = self.size
        _pwrite_all(self._fd, parts, pos)
        self._note(pos, base_offset, count, max_timestamp, HEADER.size + len(payload), interval)

    def truncate_to_size(self) -> None:
        """Cut whatever a failed append left past ``size`` (page cache; no fsync)."""
        os.ftruncate(self._fd, self.size)

    def _position_for(self, offset: int) -> int:
        """The position of the last indexed batch starting at or below ``offset``."""
        i = bisect_right(self._idx_rel, offset - self.base_offset) - 1
        return self._idx_pos[i] if i >= 0 else 0

    def read(
        self, offset: int, end_offset: int, max_bytes: int, out: list[StoredBatch], used: int
    ) -> tuple[int, bool]:
        """Append to ``out`` the batches holding offsets ``offset`` up to ``end_offset``.

        Batches are added in order while the payload bytes in ``out`` stay
        within ``max_bytes`` (``used`` is what ``out`` holds already); the
        first batch of ``out`` is added whatever its size. The first batch
        may start below ``offset``. Returns the payload bytes now in ``out``
        and whether the caller should go on with the next segment (False
        once ``max_bytes`` or ``end_offset`` stopped the read). Raises
        :class:`LogError` if a batch read fails its CRC.
        """
        if offset >= self.next_offset:
            return used, True
        pos = self._position_for(offset)
        room = max_bytes - used
        readahead = min(max(room + HEADER.size, _MIN_READAHEAD), _MAX_READAHEAD)
        cursor = _Cursor(self._read_fd(), self.size, readahead, _scratch())
        size = HEADER.size
        while pos < self.size:
            header = cursor.get(pos, size)
            if header is None:
                raise self._corrupt(pos, "a header is cut short")
            _fmt, base, count, max_ts, length, crc = HEADER.unpack(header)
            if base >= end_offset:
                return used, False
            if _fmt == GAP:  # offsets lost to damage (see repair): nothing to read
                pos += size
                continue
            if base + count > offset:
                if out and used + length > max_bytes:
                    return used, False
                head_crc = zlib.crc32(header[: _PREFIX.size])  # (before the next get)
                payload = cursor.get(pos + size, length)
                if payload is None:
                    raise self._corrupt(pos, "a payload is cut short")
                if zlib.crc32(payload, head_crc) != crc:
                    raise self._corrupt(pos, "a batch fails its CRC check")
                out.append(StoredBatch(base, count, max_ts, bytes(payload), _fmt))
                used += length
            pos += size + length
        return used, True

    def find_time(self, timestamp: int, end_offset: int) -> StoredBatch | None:
        """The first batch below ``end_offset`` whose ``max_timestamp >= timestamp``, if any."""
        if self.max_timestamp < timestamp:
            return None
        # Entries whose ts_before < timestamp: every batch before them is too old.
        i = bisect_left(self._idx_ts, timestamp) - 1
        pos = self._idx_pos[i] if i >= 0 else 0
        cursor = _Cursor(self._read_fd(), self.size, _MIN_READAHEAD)
        size = HEADER.size
        while pos < self.size:
            header = cursor.get(pos, size)
            if header is None:
                raise self._corrupt(pos, "a header is cut short")
            fmt, base, count, max_ts, length, _crc = HEADER.unpack(header)
            if base >= end_offset:
                return None
            if max_ts >= timestamp and fmt != GAP:
                payload = cursor.get(pos + size, length)
                if payload is None:
                    raise self._corrupt(pos, "a payload is cut short")
                return StoredBatch(base, count, max_ts, bytes(payload), fmt)
            pos += size + length
        return None

    def _corrupt(self, pos: int, what: str) -> LogCorruptError:
        return LogCorruptError(
            f"segment {self.log_path} is damaged at byte {pos}: {what}; stop the broker and "
            "restart it with --repair to move the damaged bytes aside (their records are "
            "lost), or restore the partition directory from a backup",
            self.log_path,
            pos,
            -1,
        )


def check_batch(payload: bytes, count: int, max_timestamp: int, fmt: int = FORMAT) -> None:
    """Raise ValueError unless ``payload``, ``count`` and ``max_timestamp`` fit a frame
    of format ``fmt``."""
    if fmt not in _DATA_FORMATS:
        raise ValueError(f"frame format {fmt} cannot be appended")
    if fmt == KAFKA and len(payload) < _KAFKA_PREFIX:
        raise ValueError("a Kafka record batch holds at least its 16-byte prefix")
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"a batch must hold 1 to {MAX_COUNT} records, not {count}")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a batch payload may hold at most {MAX_PAYLOAD} bytes")
    if not NO_TIMESTAMP < max_timestamp <= _MAX_TIMESTAMP:
        raise ValueError(
            f"max_timestamp {max_timestamp} must be above -2**63 and fit a signed 64-bit integer"
        )
