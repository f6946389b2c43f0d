"""The data plane of a broker: Produce, Fetch (a long poll) and ListOffsets over the partition log.

:class:`PartitionService` checks each request against the topics the
:class:`~trio_coord.broker.topics.TopicManager` knows, appends batches to
(and reads them from) the :class:`~trio_coord.log.LogManager`, and answers
the coordinator's question "where does this partition start and end?". A
fetch that finds less than it asked for waits in a cancel scope whose
deadline is its ``max_wait``, parked on one event that every partition it
reads wakes when a batch is appended: the Trio shape of Kafka's fetch
purgatory (``min_bytes=0`` answers at once). Produce validates a batch (it
decodes, its count and newest timestamp match the header) before storing
it, so a bad producer cannot poison the consumers of a partition; the check
(:func:`~trio_coord.protocol.records.check_batch`) reads a columnar batch's
section sizes and lengths with no object per record, and decodes a row batch into
objects the garbage collector does not track, a quarter of the cost of a
``WireRecord`` decode on a broker's heap.

A partition may also hold Kafka batches (RecordBatch v2, produced through
the Kafka listener, ``trio_coord.kafka``): a fetch converts them to native
batches at this boundary (decompressing them if need be: the cost is a
decode and an encode per batch, paid on every native fetch of it), and a
search by time decodes the one batch that holds the answer.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator

import trio

from ..kafka.records import RecordBatchError, decode_records, split_records
from ..log import (
    KAFKA_FORMAT,
    LogBusyError,
    LogCorruptError,
    LogError,
    LogManager,
    LogOffsetOutOfRangeError,
    PartitionLog,
    StoredBatch,
)
from ..protocol.errors import (
    CoordError,
    ErrorCode,
    InvalidRecordError,
    InvalidRequestError,
    NotLeaderForPartitionError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    ResourcesExhaustedError,
    StorageError,
    UnknownServerError,
    UnknownTopicError,
)
from ..protocol.messages import (
    EARLIEST,
    FETCH_ENVELOPE_BYTES,
    LATEST,
    NO_OFFSET,
    FetchedBatch,
    FetchedPartition,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ListedOffset,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    ProduceResponse,
    TopicPartition,
    fetch_partition_bytes,
)
from ..protocol.records import check_batch, decode_batch, encode_batch
from .topics import TopicManager

__all__ = ["PartitionService"]

logger = logging.getLogger(__name__)

# A fetch answer must fit the frame it is sent in, so it is sized by what it encodes to,
# not by its payload alone: msgpack adds a few bytes around every batch and partition
# (many small batches once made an answer outgrow the frame, and the consumer stalled
# for good at that offset). These are upper bounds (a test checks them against the real
# encoder at the largest value of every field), so an answer built within them fits.
# The headers' bounds (FETCH_ENVELOPE_BYTES, fetch_partition_bytes) are the protocol's,
# since a client cuts its fetches by them too.
_BATCH_BYTES = 24
"""A FetchedBatch but its payload (at most 24 bytes)."""
_MAX_MESSAGE_BYTES = 1024
"""An error message of one partition is cut to this many bytes, or to the room left."""


class PartitionService:
    """Produce, fetch and list offsets for the partitions this broker holds."""

    def __init__(
        self,
        logs: LogManager,
        topics: TopicManager,
        *,
        max_batch_bytes: int,
        max_fetch_bytes: int,
        broker_id: int = 0,
    ) -> None:
        self._logs = logs
        self._broker_id = broker_id
        self._topics = topics
        self._max_batch_bytes = max_batch_bytes
        self._max_fetch_bytes = max_fetch_bytes
        # Long-polling fetches, parked per partition; woken when that partition's log
        # end advances (whichever request's append made it visible, even one cancelled
        # while it waited for its fsync), or when the log closes or fails.
        self._waiters: defaultdict[TopicPartition, set[trio.Event]] = defaultdict(set)
        self._reported: set[tuple[object, int]] = set()  # damage logged already
        self.traffic: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
        """Per topic: bytes and records fetched, by native requests and (through
        ``Broker.count_fetched``) Kafka ones, for metrics; what is produced, by either front
        end, each partition log counts: ``PartitionLog.appended``."""
        logs.on_advance(self._wake)

    def count_fetched(self, topic: str, nbytes: int, records: int) -> None:
        """Count record bytes and records served to a fetch, native or Kafka (:attr:`traffic`)."""
        counts = self.traffic[topic]
        counts[0] += nbytes
        counts[1] += records

    def _wake(self, topic: str, partition: int) -> None:
        for waiter in self._waiters.pop(TopicPartition(topic, partition), ()):
            waiter.set()

    def _require(self, topic: str, partition: int) -> None:
        count = self._topics.require(topic)
        if not 0 <= partition < count:
            raise UnknownTopicError(
                f"topic {topic!r} has partitions 0..{count - 1}; partition {partition} "
                "does not exist"
            )
        leader = self._topics.leader(topic, partition)
        if leader is not None and leader != self._broker_id:
            raise NotLeaderForPartitionError(
                f"partition {topic}-{partition} is held by broker {leader}, not by broker "
                f"{self._broker_id}; refresh metadata and ask that broker"
            )
        damage = self._logs.damage(topic, partition)
        if damage is not None:
            raise StorageError(f"partition {topic}-{partition} is refused by the broker: {damage}")

    def log_offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """A partition's (log start, log end) offsets; (0, 0) before its first record.

        For a partition another broker of the cluster holds, (NO_OFFSET,
        NO_OFFSET): the member that gets it finds its start itself (by its
        reset policy, from that broker).
        """
        leader = self._topics.leader(tp.topic, tp.partition)
        if leader is not None and leader != self._broker_id:
            return (NO_OFFSET, NO_OFFSET)
        log = self._logs.get(tp.topic, tp.partition)
        return (0, 0) if log is None else (log.start_offset, log.end_offset)

    # -- produce -------------------------------------------------------------------------

    async def produce(self, request: ProduceRequest) -> ProduceResponse:
        """Validate and append one batch; answer once it is stored per the flush policy."""
        self._require(request.topic, request.partition)
        size = len(request.records)
        if size > self._max_batch_bytes:
            raise RecordTooLargeError(
                f"a batch of {size} bytes exceeds this broker's limit of "
                f"{self._max_batch_bytes} bytes; lower the producer's batch_size"
            )
        count, oldest, newest = check_batch(request.records)
        if count != request.count or not count:
            raise InvalidRecordError(
                f"the batch holds {count} record(s) but its header says {request.count}"
            )
        if newest != request.max_timestamp_ms or oldest < 0:
            raise InvalidRecordError(
                "the batch's max_timestamp_ms does not match its records "
                "(or a record has a negative timestamp)"
            )
        tp = TopicPartition(request.topic, request.partition)
        try:
            log = self._logs.get(tp.topic, tp.partition) or await self._logs.create(*tp)
            base = await log.append(request.records, request.count, newest)
        except LogBusyError as exc:
            raise ResourcesExhaustedError(f"{tp.topic}-{tp.partition}: {exc}") from None
        return ProduceResponse(base)

    # -- fetch -----------------------------------------------------------------------------

    async def fetch(self, request: FetchRequest, max_frame_size: int) -> FetchResponse:
        """Answer once ``min_bytes`` are there, or at ``max_wait`` with what there is.

        The answer always fits a frame of ``max_frame_size`` and the request's
        ``max_bytes`` (the client's frame): every batch and partition is counted
        with its encoding. Records up to ``max_bytes`` (of the request, of each
        partition, of the broker) are returned, but the first batch of an answer
        is returned whole even when it is larger than a partition's or the
        broker's, as Kafka does, so that a consumer always makes progress; one
        larger than the request's is refused (RECORD_TOO_LARGE), not sent.
        """
        headers = FETCH_ENVELOPE_BYTES + sum(
            fetch_partition_bytes(p.topic) for p in request.partitions
        )
        if headers > max_frame_size // 4:
            raise InvalidRequestError(
                f"a fetch of {len(request.partitions)} partitions cannot fit in one answer "
                f"with room for records; fetch fewer partitions per request"
            )
        if 0 < request.max_bytes < headers:
            raise InvalidRequestError(
                f"an answer to a fetch of {len(request.partitions)} partitions takes more than "
                f"its max_bytes ({request.max_bytes}) before any record; fetch fewer partitions "
                "per request, or ask for a larger max_bytes"
            )
        room = max_frame_size - headers
        limit = self._max_fetch_bytes
        ceiling = max_frame_size  # the most the whole answer may take, first batch included
        if request.max_bytes > 0:  # (the whole answer, so a client's frame bounds it)
            limit = min(limit, max(1, request.max_bytes - headers))
            ceiling = min(ceiling, request.max_bytes)
        deadline = trio.current_time() + max(0, request.max_wait_ms) / 1000
        while True:
            answer, size, failed, full = self._read(
                request.partitions, limit, room, ceiling - headers, ceiling
            )
            # (an answer that holds records and no more of them than it has: waiting
            # would not add any, so min_bytes larger than max_bytes allows is not waited for)
            ready = size >= request.min_bytes or failed or (full and size > 0)
            if ready or trio.current_time() >= deadline:
                for part in answer.partitions:  # (what is sent: a read waited over is not)
                    if part.batches:
                        nbytes = sum(len(batch.records) for batch in part.batches)
                        self.count_fetched(
                            part.topic, nbytes, sum(batch.count for batch in part.batches)
                        )
                return answer
            woken = trio.Event()
            parked = [TopicPartition(p.topic, p.partition) for p in request.partitions]
            for tp in parked:
                self._waiters[tp].add(woken)
            try:
                with trio.move_on_at(deadline):
                    await woken.wait()
            finally:
                for tp in parked:
                    waiters = self._waiters.get(tp)
                    if waiters is not None:
                        waiters.discard(woken)
                        if not waiters:
                            del self._waiters[tp]

    def _read(
        self, partitions: list[FetchPartition], limit: int, room: int, most: int, ceiling: int
    ) -> tuple[FetchResponse, int, bool, bool]:
        """Read every partition once: (answer, payload bytes, whether any partition failed,
        whether the answer is full: a partition has records left that its room did not take).

        ``limit`` bounds what batches and error messages add to the partitions'
        headers as the request asked (encoded, as ``room`` does), ``room`` what they
        may add without outgrowing the frame, and ``most`` what a first batch taken
        whole may add without outgrowing either the frame or the request's max_bytes
        (``ceiling``, less the headers).
        """
        answers: list[FetchedPartition] = []
        total = 0  # payload bytes
        used = 0  # encoded bytes of batches and messages
        failed = full = False
        bound = min(limit, room)
        # Kafka batches are cut to fit what was asked for, not the broker's frame alone:
        # a piece of a quarter of an 8 MiB frame, first in an answer and so sent whole,
        # was more than a consumer's 1 MiB frame reads, at that offset on every fetch.
        piece = max(bound // 4, 1)
        for part in partitions:
            try:
                self._require(part.topic, part.partition)
                log = self._logs.get(part.topic, part.partition)
                alone = ceiling - FETCH_ENVELOPE_BYTES - fetch_partition_bytes(part.topic)
                left = bound - used  # (binds unless the partition's own max_bytes does)
                batches = self._read_one(
                    log, part, left, first=used == 0, most=most, alone=alone, piece=piece
                )
            except CoordError as exc:
                failed = True
                # (within what was asked for too: max_bytes may be the client's frame)
                message = _cut(str(exc), min(_MAX_MESSAGE_BYTES, bound - used))
                used += len(message.encode())
                answers.append(
                    FetchedPartition(part.topic, part.partition, exc.code, message, -1, -1)
                )
                continue
            start, end = (0, 0) if log is None else (log.start_offset, log.end_offset)
            nbytes = sum(len(batch.records) for batch in batches)
            total += nbytes
            used += nbytes + _BATCH_BYTES * len(batches)
            following = batches[-1].base_offset + batches[-1].count if batches else part.offset
            if following < end and left < max(1, part.max_bytes) + _BATCH_BYTES:
                full = True
            answers.append(
                FetchedPartition(
                    part.topic, part.partition, ErrorCode.NONE, "", start, end, batches
                )
            )
        return FetchResponse(answers), total, failed, full

    def _read_one(
        self,
        log: PartitionLog | None,
        part: FetchPartition,
        budget: int,
        *,
        first: bool,
        most: int,
        alone: int,
        piece: int,
    ) -> list[FetchedBatch]:
        """The batches of one partition within ``budget`` encoded bytes.

        When nothing is in the answer yet (``first``), its first batch is taken
        whole whatever the budgets, if the answer then fits both the frame and
        the request's max_bytes (``most``, what the batches may add to the
        headers). One that would not fit even alone in an answer (``alone``) is refused
        with RecordTooLargeError: the client could never read it (sent anyway,
        it broke the client's connection at that offset on every fetch). A
        Kafka batch is returned as native batches of at most ``piece`` bytes.
        """
        if log is None:
            if part.offset != 0:
                raise OffsetOutOfRangeError(
                    f"offset {part.offset} is out of range for {part.topic}-{part.partition}, "
                    "which holds no records yet (valid: 0)"
                )
            return []
        budget = min(budget, max(1, part.max_bytes) + _BATCH_BYTES)
        if budget <= _BATCH_BYTES and not first:
            return []
        try:
            stored = log.read(part.offset, max(1, budget - _BATCH_BYTES))
        except LogOffsetOutOfRangeError as exc:
            raise OffsetOutOfRangeError(
                f"offset {exc.offset} is out of range for {part.topic}-{part.partition}: valid "
                f"offsets are [{exc.start}, {exc.end}]; seek to a valid offset (the consumer's "
                "reset policy does so)"
            ) from None
        except LogCorruptError as exc:
            # Every reader of this batch is told; the broker's log says it once.
            if (exc.path, exc.position) not in self._reported:
                self._reported.add((exc.path, exc.position))
                logger.error("reading %s-%s failed: %s", part.topic, part.partition, exc)
            raise StorageError(
                f"{part.topic}-{part.partition} cannot be read at offset {part.offset}: {exc}"
            ) from None
        except LogError as exc:
            logger.error("reading %s-%s failed: %s", part.topic, part.partition, exc)
            raise UnknownServerError(
                f"{part.topic}-{part.partition} cannot be read at offset {part.offset}: its "
                "log is damaged on the broker (see the broker's log)"
            ) from None
        batches: list[FetchedBatch] = []
        used = 0
        for batch in self._native(stored, part, piece):
            size = len(batch.records) + _BATCH_BYTES
            fits = used + size <= budget or (first and not batches and size <= most)
            if not fits:
                if first and not batches:
                    self._too_large(part, batch, size, alone)
                break
            used += size
            batches.append(batch)
        return batches

    @staticmethod
    def _too_large(part: FetchPartition, batch: FetchedBatch, size: int, alone: int) -> None:
        """Refuse the first batch of an answer that it does not fit, if it fits no answer.

        ``alone`` is what the batches may take of an answer of this partition
        only; within it, the batch is left for a later fetch of fewer partitions
        (smaller headers), as any batch past the budget is.
        """
        if size <= alone:
            return
        following = batch.base_offset + batch.count
        raise RecordTooLargeError(
            f"the batch at offset {batch.base_offset} of {part.topic}-{part.partition} is "
            f"{len(batch.records)} bytes, more than an answer to this client can hold "
            f"({alone} bytes of records: its frame, sent as the fetch's max_bytes, or the "
            f"broker's max_frame_size): seek past it, to offset {following}, to read on; a "
            "client of a larger frame reads it (a consumer's fetch_max_bytes), and smaller "
            "batches (the producer's batch_size, Spark's batchSize) avoid it"
        )

    def _native(
        self, stored: list[StoredBatch], part: FetchPartition, piece: int
    ) -> Iterator[FetchedBatch]:
        """The stored batches as native batches: Kafka batches converted at this boundary.

        A Kafka batch (RecordBatch v2, maybe compressed) is decoded and
        re-encoded as native batches of at most ``piece`` bytes each (a
        quarter of what the answer may hold: a compressed batch may hold far
        more than a frame), skipping the pieces wholly below the offset asked
        for.
        """
        for batch in stored:
            if batch.format != KAFKA_FORMAT:
                yield FetchedBatch(batch.base_offset, batch.count, batch.payload)
                continue
            try:
                records = decode_records(batch.payload)
            except RecordBatchError as exc:
                raise StorageError(
                    f"{part.topic}-{part.partition}: the Kafka batch at offset "
                    f"{batch.base_offset} cannot be read: {exc}"
                ) from None
            for base, cut in split_records(batch.base_offset, records, piece):
                if base + len(cut) > part.offset:
                    # (the row layout: msgspec encodes it in C, and this is the broker)
                    yield FetchedBatch(base, len(cut), encode_batch(cut, columnar=False))

    # -- list offsets ----------------------------------------------------------------------------

    def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        """The earliest, latest, or first-at-a-time offset of each partition."""
        when = request.timestamp_ms
        if when < EARLIEST:
            raise InvalidRequestError(
                f"timestamp_ms {when} is not valid: use -2 (earliest), -1 (latest) or a time "
                "in milliseconds since the epoch"
            )
        answers = []
        for tp in request.partitions:
            self._require(tp.topic, tp.partition)
            log = self._logs.get(tp.topic, tp.partition)
            start, end = (0, 0) if log is None else (log.start_offset, log.end_offset)
            if when == EARLIEST:
                offset = start
            elif when == LATEST or log is None:
                offset = end
            else:
                offset = self._offset_at_time(log, when)
            answers.append(ListedOffset(tp.topic, tp.partition, offset, start, end))
        return ListOffsetsResponse(answers)

    @staticmethod
    def _offset_at_time(log: PartitionLog, timestamp_ms: int) -> int:
        """The first offset whose record is at or after ``timestamp_ms`` (else the log end)."""
        try:
            batch = log.batch_at_time(timestamp_ms)
        except LogCorruptError as exc:
            raise StorageError(f"{log.topic}-{log.partition} cannot be searched: {exc}") from None
        if batch is None:
            return log.end_offset
        try:
            if batch.format == KAFKA_FORMAT:
                records = decode_records(batch.payload)
            else:
                records = decode_batch(batch.payload)
        except RecordBatchError as exc:
            raise StorageError(f"{log.topic}-{log.partition} cannot be searched: {exc}") from None
        for index, record in enumerate(records):
            if record.timestamp_ms >= timestamp_ms:
                return max(batch.base_offset + index, log.start_offset)
        return batch.next_offset  # (the batch's newest record is that new; not reached)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (whole characters only)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: max(0, limit)].decode(errors="ignore")
