"""Produce and InitProducerId: Kafka batches into the partition log, idempotently.

Its one job is the write path. Each partition's RecordBatch v2 is checked
(:func:`~.records.check_batch`: lengths, CRC-32C, count; no decompression)
and appended as a Kafka frame (``log.segment`` format 3), the log rewriting
its base offset. The Produce requests of one connection take turns until
their batches have offsets (so a partition gets them in the order they were
sent); their waits for durability overlap. acks=1 and acks=all mean the same
on a single replica: the answer comes once the log's flush policy
acknowledged the batch; acks=0 gets no answer at all (the work is still
done). The partitions of one request are appended concurrently, so that they
share fsyncs (group commit) rather than wait for one after another.

**Idempotent producers.** InitProducerId hands out a random 62-bit producer
id (unique across brokers and restarts without coordination) with epoch 0,
or bumps the epoch of the id a client gives back (KIP-360). Per partition
and producer, :class:`ProducerStates` keeps the epoch and the last five
batches (first and last sequence, base offset), as Kafka does: an older
epoch is INVALID_PRODUCER_EPOCH; a batch equal to one of the five is a
duplicate and is answered with the original's offset, without a second
append (a retry of a batch still being written waits for it); any other
batch must continue the sequence, or it is OUT_OF_ORDER_SEQUENCE_NUMBER. A
producer the broker knows nothing of (first contact, evicted, or before a
restart) is accepted at any sequence, as Kafka accepts one whose state
expired. The state lives in memory only: a retry that crosses a broker
restart can be stored twice (Kafka rebuilds it from the log; see
``docs/kafka.md``). At most ``MAX_PRODUCERS`` producers are remembered per
partition, least recently used evicted first.
"""

from __future__ import annotations

import datetime
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Final

import trio

from ..log import KAFKA_FORMAT, LogBusyError, PartitionLog
from .codec import KafkaCode, make, ms, nested, response_schema
from .dispatch import Api, FrontEnd, RequestContext
from .errors import KafkaError, kafka_code
from .partitions import check_partition
from .records import RecordBatchError, check_batch

__all__ = ["APIS", "MAX_PRODUCERS", "ProducerStates"]

MAX_PRODUCERS: Final = 1000
"""Producers remembered per partition (the least recently used is forgotten first)."""
_KEPT_BATCHES: Final = 5  # Kafka keeps the metadata of the last five batches per producer
_MAX_EPOCH: Final = 32767
_SEQ_MODULO: Final = 2**31
_NO_THROTTLE: Final = datetime.timedelta(0)


class _Batch:
    """One batch of an idempotent producer: its sequences and, once written, its offset."""

    __slots__ = ("base", "first", "last", "settled")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last
        self.base: int | None = None
        self.settled = trio.Event()  # set once written (base known) or failed (dropped)


class _Producer:
    """What a partition remembers of one producer id."""

    __slots__ = ("batches", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: deque[_Batch] = deque(maxlen=_KEPT_BATCHES)


class ProducerStates:
    """Per partition, the idempotent producers' epochs and recent batches (in memory)."""

    def __init__(self, front: FrontEnd) -> None:
        self._partitions: dict[tuple[str, int], OrderedDict[int, _Producer]] = {}

    def check(
        self, tp: tuple[str, int], pid: int, epoch: int, first: int, count: int
    ) -> tuple[_Batch | None, bool]:
        """(the batch's record, whether it is a duplicate of one remembered).

        Raises :class:`~.errors.KafkaError` for a fenced epoch or a sequence
        out of order. For a new batch the record is registered (pending) and
        must be settled by :meth:`written` or :meth:`failed`.
        """
        last = (first + count - 1) % _SEQ_MODULO
        producers = self._partitions.setdefault(tp, OrderedDict())
        state = producers.get(pid)
        if state is not None:
            producers.move_to_end(pid)
            if epoch < state.epoch:
                raise KafkaError(
                    KafkaCode.invalid_producer_epoch,
                    f"producer {pid} epoch {epoch} is older than its current {state.epoch}",
                )
            if epoch > state.epoch:
                if first != 0:
                    raise KafkaError(
                        KafkaCode.out_of_order_sequence_number,
                        f"producer {pid} starts epoch {epoch} at sequence {first}, not 0",
                    )
                state.epoch = epoch
                state.batches.clear()
            else:
                for batch in state.batches:
                    if batch.first == first and batch.last == last:
                        return batch, True
                if state.batches:
                    expected = (state.batches[-1].last + 1) % _SEQ_MODULO
                    if first != expected:
                        raise KafkaError(
                            KafkaCode.out_of_order_sequence_number,
                            f"producer {pid} sent sequence {first}; expected {expected}",
                        )
        else:
            state = producers[pid] = _Producer(epoch)
            if len(producers) > MAX_PRODUCERS:
                producers.popitem(last=False)
        batch = _Batch(first, last)
        state.batches.append(batch)
        return batch, False

    def failed(self, tp: tuple[str, int], pid: int, batch: _Batch) -> None:
        """Forget a batch that was not written (its retry must be accepted, not deduplicated)."""
        producers = self._partitions.get(tp)
        state = None if producers is None else producers.get(pid)
        if state is not None and batch in state.batches:
            state.batches.remove(batch)
        batch.settled.set()


# -- Produce ---------------------------------------------------------------------------------


async def _produce(ctx: RequestContext, body: Any) -> Any | None:
    acks = body.acks
    deadline = trio.current_time() + max(0.0, min(ms(body.timeout) / 1000, 300.0))
    schema = response_schema(0, ctx.version)
    topic_cls = nested(schema, "TopicProduceResponse")
    part_cls = nested(schema, "PartitionProduceResponse")
    jobs: list[tuple[str, Any]] = [(t.name, p) for t in body.topic_data for p in t.partition_data]
    results: list[tuple[KafkaCode, int, int, str | None]] = [(KafkaCode.none, -1, -1, None)] * len(
        jobs
    )

    # Take this connection's turn: the batches of the requests sent before this one must
    # be in their logs first. The turn ends once every partition's batch has its offset
    # (or failed); the waits for durability then overlap with the next request's.
    await ctx.wait_turn()
    unsettled = len(jobs)

    def settled() -> None:
        nonlocal unsettled
        unsettled -= 1
        if unsettled <= 0:
            ctx.end_turn()

    async def one(i: int, topic: str, part: Any) -> None:
        once = _Once(settled)
        try:
            if body.transactional_id is not None:
                raise KafkaError(
                    KafkaCode.transactional_id_authorization_failed,
                    "transactions are not supported by this broker",
                )
            if not ctx.allowed("write", "topic", topic):
                raise KafkaError(
                    KafkaCode.topic_authorization_failed,
                    f"{ctx.principal} may not WRITE topic {topic!r}",
                )
            if acks not in (0, 1, -1):
                raise KafkaError(KafkaCode.invalid_required_acks, f"acks {acks} is not 0, 1, -1")
            base, start = await _append(ctx, topic, part.index, part.records, deadline, once)
            results[i] = (KafkaCode.none, base, start, None)
        except Exception as exc:
            results[i] = (kafka_code(exc), -1, -1, str(exc))
        finally:
            once()

    if not jobs:
        ctx.end_turn()
    elif len(jobs) == 1:
        await one(0, *jobs[0])
    else:
        async with trio.open_nursery() as nursery:
            for i, (topic, part) in enumerate(jobs):
                nursery.start_soon(one, i, topic, part)
    throttle = await ctx.throttle("produce", sum(len(part.records or b"") for _, part in jobs))
    if acks == 0:
        return None
    by_topic: dict[str, list[Any]] = {}
    for (topic, part), (code, base, start, message) in zip(jobs, results, strict=True):
        by_topic.setdefault(topic, []).append(
            make(
                part_cls,
                index=part.index,
                error_code=code,
                base_offset=base,
                log_append_time=None,
                log_start_offset=start,
                record_errors=(),
                error_message=message if code is not KafkaCode.none else None,
            )
        )
    return make(
        schema,
        responses=tuple(
            make(topic_cls, name=name, partition_responses=tuple(parts))
            for name, parts in by_topic.items()
        ),
        throttle_time=throttle,
    )


class _Once:
    """Calls ``action`` the first time it is called, never again."""

    __slots__ = ("_action",)

    def __init__(self, action: Callable[[], None]) -> None:
        self._action: Callable[[], None] | None = action

    def __call__(self) -> None:
        action, self._action = self._action, None
        if action is not None:
            action()


async def _append(
    ctx: RequestContext,
    topic: str,
    partition: int,
    records: bytes | None,
    deadline: float,
    settled: Callable[[], None],
) -> tuple[int, int]:
    """Check and append one partition's batch; (base offset, log start offset).

    ``settled()`` is called once the batch has its offset in the log (or is
    a duplicate, or was refused): the next request's batches may follow.
    """
    front = ctx.front
    service = front.service
    if service.shutting_down:
        raise KafkaError(KafkaCode.not_leader_or_follower, "the broker is shutting down")
    if topic not in service.topics.partitions:
        await service.read_topics([topic])
    check_partition(service, topic, partition)
    if not records:
        raise KafkaError(KafkaCode.invalid_record, "a produce request without records")
    if len(records) > front.limits.max_batch_bytes:
        raise KafkaError(
            KafkaCode.message_too_large,
            f"a batch of {len(records)} bytes is more than this broker's "
            f"{front.limits.max_batch_bytes} (max batch bytes)",
        )
    try:
        header = check_batch(records)
    except RecordBatchError as exc:
        raise KafkaError(KafkaCode.corrupt_message, str(exc)) from None
    tp = (topic, partition)
    log = service.logs.get(topic, partition) or await service.logs.create(topic, partition)
    max_ts = max(header.max_timestamp, -1)
    if header.producer_id < 0:
        return await _write(log, records, header.count, max_ts, None, settled), log.start_offset
    states = front.state(ProducerStates)
    batch, duplicate = states.check(
        tp, header.producer_id, header.producer_epoch, header.base_sequence, header.count
    )
    assert batch is not None
    if duplicate:
        settled()
        return await _original(log, batch, header.count, deadline), log.start_offset
    try:
        base = await _write(log, records, header.count, max_ts, batch, settled)
    except BaseException:
        if batch.base is None:
            states.failed(tp, header.producer_id, batch)
        raise
    return base, log.start_offset


async def _write(
    log: PartitionLog,
    records: bytes,
    count: int,
    max_ts: int,
    batch: _Batch | None,
    settled: Callable[[], None],
) -> int:
    def assigned(base: int) -> None:
        if batch is not None:
            batch.base = base
            batch.settled.set()
        settled()

    try:
        return await log.append(records, count, max_ts, fmt=KAFKA_FORMAT, assigned=assigned)
    except LogBusyError as exc:
        raise KafkaError(KafkaCode.request_timed_out, str(exc)) from None


async def _original(log: PartitionLog, batch: _Batch, count: int, deadline: float) -> int:
    """The offset of the batch a duplicate repeats, once it is acknowledged (by ``deadline``)."""
    with trio.move_on_at(deadline):
        await batch.settled.wait()
        if batch.base is None:
            raise KafkaError(
                KafkaCode.request_timed_out, "the original of this retried batch failed; retry"
            )
        while log.end_offset < batch.base + count:
            await log.subscribe().wait()
        return batch.base
    raise KafkaError(
        KafkaCode.request_timed_out, "the original of this retried batch is not stored yet"
    )


# -- InitProducerId --------------------------------------------------------------------------


async def _init_producer_id(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(22, ctx.version)
    if body.transactional_id is not None:
        return make(
            schema,
            throttle_time=_NO_THROTTLE,
            error_code=KafkaCode.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
    authorizer = ctx.front.authorizer
    if authorizer is not None and not authorizer.allowed_any(ctx.principal, "write", "topic"):
        # (Kafka: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic)
        return make(
            schema,
            throttle_time=_NO_THROTTLE,
            error_code=KafkaCode.cluster_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
    pid = getattr(body, "producer_id", -1)
    epoch = getattr(body, "producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < _MAX_EPOCH:
        pid, epoch = pid, epoch + 1
    else:
        pid, epoch = secrets.randbits(62), 0
    return make(
        schema,
        throttle_time=_NO_THROTTLE,
        error_code=KafkaCode.none,
        producer_id=pid,
        producer_epoch=epoch,
    )


APIS: Final = [
    Api(0, 3, 11, _produce, ordered=True, authorizes=True),
    Api(22, 0, 5, _init_producer_id, authorizes=True),
]
