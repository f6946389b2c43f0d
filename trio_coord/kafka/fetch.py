"""Fetch and ListOffsets: Kafka consumers read the partition logs.

Its one job is the read path. Fetch (v4-v12, by topic name; no fetch
sessions: every answer says session 0, so clients send full fetches) reads
each partition from its offset, within the partition's ``partition_max_bytes``
and the request's ``max_bytes`` (capped by the broker's ``max_fetch_bytes``).
Batches are whole: the batch that straddles a limit is returned whole, and
the first batch of an answer is returned whatever its size, so a consumer
always progresses. Kafka batches are served as stored (the log rewrote their
base offsets); native batches are converted to uncompressed RecordBatch v2
on the way (``records.native_to_kafka``: a decode and an encode per batch,
paid on every fetch of it). An answer with fewer than ``min_bytes`` waits, up
to ``max_wait`` (capped by ``max_wait_ms``), parked on one event per
request that an append to any partition it reads sets: Kafka's fetch
purgatory as a Trio event and a deadline. read_committed reads the same as
read_uncommitted (there are no transactions).

ListOffsets (v1-v6) answers the earliest (-2) and latest (-1) offsets and
the first offset whose record is at or after a timestamp (decoding, and
for a compressed Kafka batch decompressing, the one batch that holds it).
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from typing import Any, Final

import trio

from ..log import KAFKA_FORMAT, LogError, PartitionLog, StoredBatch
from ..protocol.records import decode_batch
from .codec import KafkaCode, make, ms, nested, response_schema
from .dispatch import Api, FrontEnd, RequestContext
from .errors import KafkaError, kafka_code
from .partitions import check_partition
from .records import RecordBatchError, decode_records, native_to_kafka

__all__ = ["APIS", "FetchWaiters"]

_NO_THROTTLE: Final = datetime.timedelta(0)
_LATEST: Final = -1
_EARLIEST: Final = -2


class FetchWaiters:
    """Long-polling fetches, parked per partition, woken when its log end advances."""

    def __init__(self, front: FrontEnd) -> None:
        self._waiters: defaultdict[tuple[str, int], set[trio.Event]] = defaultdict(set)
        front.service.logs.on_advance(self._wake)

    def _wake(self, topic: str, partition: int) -> None:
        for event in self._waiters.pop((topic, partition), ()):
            event.set()

    async def wait(self, partitions: list[tuple[str, int]], deadline: float) -> None:
        """Return when any of ``partitions`` advances, or at ``deadline``."""
        event = trio.Event()
        for tp in partitions:
            self._waiters[tp].add(event)
        try:
            with trio.move_on_at(deadline):
                await event.wait()
        finally:
            for tp in partitions:
                waiting = self._waiters.get(tp)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiters[tp]


def _fetch_cost(front: FrontEnd, body: Any) -> int:
    """What the answer may hold: the request's max_bytes within the broker's limit."""
    return min(max(body.max_bytes, 0), front.limits.max_fetch_bytes) + front.limits.max_batch_bytes


async def _fetch(ctx: RequestContext, body: Any) -> Any:
    front = ctx.front
    limits = front.limits
    schema = response_schema(1, ctx.version)
    if getattr(body, "session_epoch", -1) > 0 or getattr(body, "session_id", 0) != 0:
        return make(
            schema,
            throttle_time=_NO_THROTTLE,
            error_code=KafkaCode.fetch_session_id_not_found,
            session_id=0,
            responses=(),
        )
    wanted = [(t.topic, p) for t in body.topics for p in t.partitions]
    limit = min(max(body.max_bytes, 1), limits.max_fetch_bytes)
    wait_ms = min(max(ms(body.max_wait), 0), limits.max_wait_ms)
    deadline = trio.current_time() + wait_ms / 1000
    parked = [(topic, p.partition) for topic, p in wanted]
    waiters = front.state(FetchWaiters)
    while True:
        parts, size, failed = _read(ctx, wanted, limit)
        if size >= body.min_bytes or failed or trio.current_time() >= deadline:
            break
        if front.service.shutting_down:
            break
        await waiters.wait(parked, deadline)
    topic_cls = nested(schema, "FetchableTopicResponse")
    by_topic: dict[str, list[Any]] = {}
    for (topic, _), part in zip(wanted, parts, strict=True):
        by_topic.setdefault(topic, []).append(part)
    throttle = await ctx.throttle("fetch", size)
    return make(
        schema,
        throttle_time=throttle,
        error_code=KafkaCode.none,
        session_id=0,
        responses=tuple(
            make(topic_cls, topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()
        ),
    )


def _read(
    ctx: RequestContext, wanted: list[tuple[str, Any]], limit: int
) -> tuple[list[Any], int, bool]:
    """Read every partition once: (their answers, record bytes, whether any failed)."""
    service = ctx.front.service
    part_cls = nested(response_schema(1, ctx.version), "PartitionData")
    answers = []
    total = 0
    failed = False
    for topic, p in wanted:
        try:
            if not ctx.allowed("read", "topic", topic):
                raise KafkaError(KafkaCode.topic_authorization_failed, f"no READ on {topic}")
            check_partition(service, topic, p.partition)
            log = service.logs.get(topic, p.partition)
            if log is None:
                if p.fetch_offset != 0:
                    raise KafkaError(
                        KafkaCode.offset_out_of_range,
                        f"{topic}-{p.partition} holds no records; offset {p.fetch_offset}",
                    )
                start = end = count = 0
                records = b""
            else:
                start, end = log.start_offset, log.end_offset
                room = min(max(p.partition_max_bytes, 1), limit - total)
                records, count = _read_partition(log, p.fetch_offset, room, first=total == 0)
        except (KafkaError, LogError, RecordBatchError) as exc:
            failed = True
            answers.append(
                make(
                    part_cls,
                    partition_index=p.partition,
                    error_code=kafka_code(exc),
                    high_watermark=-1,
                    last_stable_offset=-1,
                    log_start_offset=-1,
                    aborted_transactions=None,
                    records=None,
                )
            )
            continue
        total += len(records)
        if count:
            service.count_fetched(topic, len(records), count)
        answers.append(
            make(
                part_cls,
                partition_index=p.partition,
                error_code=KafkaCode.none,
                high_watermark=end,
                last_stable_offset=end,
                log_start_offset=start,
                aborted_transactions=None,
                records=records,
            )
        )
    return answers, total, failed


def _read_partition(log: PartitionLog, offset: int, room: int, *, first: bool) -> tuple[bytes, int]:
    """The whole batches from ``offset`` within ``room`` bytes, plus the one straddling it,
    as Kafka record batches; and how many records they hold.

    With room left, the first batch is returned whatever its size (it straddles
    the limit, or the answer would make no progress). Raises
    :class:`~trio_coord.log.LogOffsetOutOfRangeError` outside the log.
    """
    if room <= 0 and not first:
        return b"", 0
    batches = log.read(offset, max(room, 1))
    used = sum(len(b.payload) for b in batches)
    if batches and used < room:
        following = batches[-1].next_offset
        if following < log.end_offset:
            more = log.read(following, 1)[:1]  # the straddling batch, whole
            batches.extend(more)
    return b"".join(_as_kafka(b) for b in batches), sum(b.count for b in batches)


def _as_kafka(batch: StoredBatch) -> bytes:
    if batch.format == KAFKA_FORMAT:
        return batch.payload
    return native_to_kafka(batch.base_offset, batch.payload)


# -- ListOffsets -----------------------------------------------------------------------------


async def _list_offsets(ctx: RequestContext, body: Any) -> Any:
    service = ctx.front.service
    missing = [t.name for t in body.topics if t.name not in service.topics.partitions]
    if missing:
        await service.read_topics(missing)
    return _list_offsets_now(ctx, body)


def _list_offsets_now(ctx: RequestContext, body: Any) -> Any:
    service = ctx.front.service
    schema = response_schema(2, ctx.version)
    topic_cls = nested(schema, "ListOffsetsTopicResponse")
    part_cls = nested(schema, "ListOffsetsPartitionResponse")
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            try:
                if not ctx.allowed("describe", "topic", t.name):
                    raise KafkaError(KafkaCode.topic_authorization_failed, "no DESCRIBE")
                check_partition(service, t.name, p.partition_index)
                offset, timestamp = _offset_for(
                    service.logs.get(t.name, p.partition_index), p.timestamp
                )
                code = KafkaCode.none
            except Exception as exc:
                offset, timestamp, code = -1, -1, kafka_code(exc)
            parts.append(
                make(
                    part_cls,
                    partition_index=p.partition_index,
                    error_code=code,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=0 if code is KafkaCode.none else -1,
                )
            )
        topics.append(make(topic_cls, name=t.name, partitions=tuple(parts)))
    return make(schema, throttle_time=_NO_THROTTLE, topics=tuple(topics))


def _offset_for(log: PartitionLog | None, when: int) -> tuple[int, int]:
    """(offset, timestamp) for ``when``: -2 earliest, -1 latest, else a time in ms."""
    if when == _EARLIEST:
        return (0 if log is None else log.start_offset), -1
    if when == _LATEST:
        return (0 if log is None else log.end_offset), -1
    if when < 0:
        raise KafkaError(KafkaCode.invalid_request, f"timestamp {when} is not supported")
    if log is None:
        return -1, -1
    batch = log.batch_at_time(when)
    if batch is None:
        return -1, -1
    if batch.format == KAFKA_FORMAT:
        records = decode_records(batch.payload)
    else:
        records = decode_batch(batch.payload)
    for index, record in enumerate(records):
        if record.timestamp_ms >= when:
            return max(batch.base_offset + index, log.start_offset), record.timestamp_ms
    return -1, -1


def _list_offsets_fast(ctx: RequestContext, body: Any) -> Any | None:
    service = ctx.front.service
    if any(t.name not in service.topics.partitions for t in body.topics):
        return None
    return _list_offsets_now(ctx, body)


APIS: Final = [
    Api(1, 4, 12, _fetch, cost=_fetch_cost, authorizes=True),
    Api(2, 1, 6, _list_offsets, now=_list_offsets_fast, authorizes=True),
]
