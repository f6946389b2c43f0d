"""The producer: batches records per partition and appends them to the brokers holding them.

``open_producer(bootstrap)`` gives a :class:`Producer`. ``await
producer.send(topic, value, key=...)`` returns the record's
:class:`RecordMetadata` once the broker has stored it; ``await
producer.enqueue(...)`` returns a :class:`Delivery` at once (after waiting
for buffer space), to be awaited later, which is how a loop sends many
records without a round trip each. Records wait in their partition's open
batch until it holds ``batch_size`` bytes or is ``linger`` seconds old; each
partition has one sender task and at most one batch in flight, so records of
a partition are stored in the order they were sent, retries included, while
many partitions (on one connection per broker) are in flight at once. A
record with a key goes to a partition by a stable hash of the key (CRC-32,
the same in every process and run); records without a key stick to one
partition per topic until a batch of that topic is closed (full, or past its
linger), then move to the next: fewer, fuller batches, spread evenly over
many batches but not within one.

Delivery is at least once: a batch whose answer is lost with its connection
is sent again, so a broker may store it twice.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Generator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import trio

from .._aio import EnterOnce, unwrap_lone_exception
from .._routing import Action, classify, partition_for_key
from ..protocol.errors import (
    ConnectionClosedError,
    CoordError,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownTopicError,
)
from ..protocol.messages import ProduceRequest, ProduceResponse, TopicPartition
from ..protocol.records import COMPRESSION, Header, WireRecord, encode_batch
from ..security.client import ClientSecurity, Sasl
from ._bootstrap import Backoff, Bootstrap
from ._cluster import ClusterView

__all__ = ["Compression", "Delivery", "Producer", "RecordMetadata", "open_producer"]

Compression = Literal["zlib", "lzma", "lz4", "zstd"]
"""How a producer may compress its batches (None: not at all)."""

log = logging.getLogger(__name__)

_RECORD_OVERHEAD = 24
"""Bytes a record costs in a batch besides its key, value and headers (at most 16 in the
columnar layout, its timestamp and two lengths, and two bits of validity)."""
_HEADER_OVERHEAD = 11
"""Bytes a header costs besides its name and value, at most (msgpack: a 2-array, the
name's and the value's lengths); a record with headers costs 8 more (its index)."""
_BATCH_OVERHEAD = 72
"""Bytes a batch costs besides its records, at most (the codec byte, the columnar
layout's 24-byte header, the padding of its sections, the headers' array): kept free of
records, so that a batch the producer fills is never over the broker's max_batch_bytes."""


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record was stored: its partition and offset, and its timestamp (seconds)."""

    topic: str
    partition: int
    offset: int
    timestamp: float

    @property
    def tp(self) -> TopicPartition:
        """The partition the record was stored in."""
        return TopicPartition(self.topic, self.partition)


class _Outcome:
    """A batch's outcome, shared by its records' deliveries: one event per batch, not per record.

    Apart from the batch, so that a delivery kept by its caller does not keep
    the batch's records alive.
    """

    __slots__ = ("base", "done", "error", "traceback")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.base = -1
        self.error: BaseException | None = None
        self.traceback: TracebackType | None = None  # the error's, as it failed the batch

    def resolve(self, base: int) -> None:
        self.base = base
        self.done.set()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.traceback = error.__traceback__
            self.done.set()


class Delivery:
    """The outcome of one enqueued record; ``await delivery`` gives its :class:`RecordMetadata`.

    Awaiting raises the typed error if the record could not be stored.
    Several tasks may await the same delivery.
    """

    __slots__ = ("_index", "_outcome", "timestamp_ms", "tp")

    def __init__(
        self, tp: TopicPartition, timestamp_ms: int, outcome: _Outcome, index: int
    ) -> None:
        self.tp = tp
        self.timestamp_ms = timestamp_ms
        self._outcome = outcome
        self._index = index

    @property
    def done(self) -> bool:
        """True once the record was stored or failed."""
        return self._outcome.done.is_set()

    async def wait(self) -> RecordMetadata:
        """Wait for the outcome: the record's metadata, or its error raised."""
        outcome = self._outcome
        await outcome.done.wait()
        if outcome.error is not None:
            # One exception object for the whole batch, and raising it again extends
            # its traceback: each await raises it from the traceback it failed with,
            # not from that plus the frames of every await before (asyncio does so too).
            raise outcome.error.with_traceback(outcome.traceback)
        return RecordMetadata(
            self.tp.topic, self.tp.partition, outcome.base + self._index, self.timestamp_ms / 1000
        )

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        return self.wait().__await__()


class _Batch:
    __slots__ = ("created", "outcome", "records", "size")

    def __init__(self, now: float) -> None:
        self.records: list[WireRecord] = []
        self.outcome = _Outcome()
        self.size = 0
        self.created = now


class _PartitionQueue:
    """One partition's open batch, its closed batches, and whether its sender runs."""

    __slots__ = ("closed", "open", "sending", "wake")

    def __init__(self) -> None:
        self.open: _Batch | None = None
        self.closed: deque[_Batch] = deque()
        self.sending = False
        self.wake = trio.Event()


def _as_bytes(value: bytes | bytearray | memoryview | str | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a record's {what} must be bytes, str or None, not {type(value).__name__}")


class Producer(EnterOnce):
    """Sends records to topic partitions; create it with :func:`open_producer`."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        linger: float = 0.005,
        batch_size: int = 64 * 1024,
        max_batch_bytes: int = 512 * 1024,
        buffer_bytes: int = 32 * 1024 * 1024,
        max_in_flight: int = 16,
        compression: Compression | None = None,
        delivery_timeout: float = 120.0,
        request_timeout: float = 30.0,
        max_block: float = 60.0,
        close_timeout: float = 30.0,
        client_id: str = "trio-coord-producer",
        ssl_context: ssl.SSLContext | None = None,
        sasl: Sasl | None = None,
    ) -> None:
        if linger < 0:
            raise ValueError("linger must not be negative (seconds)")
        if not 0 < batch_size <= max_batch_bytes:
            raise ValueError("batch_size must be positive and at most max_batch_bytes")
        if buffer_bytes < max_batch_bytes:
            raise ValueError("buffer_bytes must hold at least one batch (max_batch_bytes)")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if compression not in COMPRESSION:
            known = ", ".join(repr(c) for c in COMPRESSION)
            raise ValueError(f"unknown compression {compression!r}; choose one of {known}")
        for name, value in (
            ("delivery_timeout", delivery_timeout),
            ("request_timeout", request_timeout),
            ("max_block", max_block),
            ("close_timeout", close_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be positive (seconds), not {value}")
        self.linger = linger
        self.batch_size = batch_size
        self._batch_limit = min(batch_size, max_batch_bytes - _BATCH_OVERHEAD)
        self.max_batch_bytes = max_batch_bytes
        self.buffer_bytes = buffer_bytes
        self.max_in_flight = max_in_flight
        self.compression = compression
        self.delivery_timeout = delivery_timeout
        self.request_timeout = request_timeout
        self.max_block = max_block
        self.close_timeout = close_timeout
        self.client_id = client_id
        self._bootstrap = Bootstrap(
            bootstrap,
            request_timeout=request_timeout,
            security=ClientSecurity(ssl_context, sasl),
        )
        self._cluster: ClusterView | None = None
        self._nursery: trio.Nursery | None = None
        self._queues: dict[TopicPartition, _PartitionQueue] = {}
        self._sticky: dict[str, int] = {}
        self._buffered = 0
        self._space = trio.Event()
        self._pending = 0
        self._idle = trio.Event()
        self._idle.set()
        self._flush_requested = 0
        self._slots: dict[tuple[str, int], trio.Semaphore] = {}
        self._closed = False
        self.batches_sent = 0
        """How many batches were stored (for tests and benchmarks)."""

    def __repr__(self) -> str:
        return f"<Producer {self.client_id} pending={self._pending}>"

    @asynccontextmanager
    async def _run_for_block(self) -> AsyncIterator[Producer]:
        try:
            with unwrap_lone_exception():
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self._cluster = ClusterView(
                        self._bootstrap,
                        nursery,
                        name=self.client_id,
                        timeout=self.max_block,
                        timeout_setting="max_block",
                    )
                    try:
                        yield self
                    finally:
                        await self._drain_before_close()
                        self._closed = True
                        nursery.cancel_scope.cancel()
                        with trio.CancelScope(shield=True):
                            await self._cluster.aclose()
        finally:  # however the block ended, no Delivery is left waiting forever
            self._fail_everything(
                RequestTimedOutError("the producer closed before the record was stored")
            )

    async def _drain_before_close(self) -> None:
        """Wait up to ``close_timeout`` for what is queued, unless the block was cancelled.

        A cancelled block has cancelled the senders too (they run in the
        producer's nursery, inside it): nothing more would be sent, and a
        flush would only wait out ``close_timeout``. Then what is unsent fails
        at once (:meth:`_fail_everything`), as the cancellation asks.
        """
        if trio.current_effective_deadline() == -math.inf:
            if self._pending:
                log.info("producer cancelled with %d record(s) not yet stored", self._pending)
            return
        with trio.move_on_after(self.close_timeout) as grace:
            grace.shield = True
            await self.flush()
        if grace.cancelled_caught:
            log.warning(
                "producer closed with %d record(s) undelivered after %gs",
                self._pending,
                self.close_timeout,
            )

    # -- sending -------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes | str | None,
        *,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes | str]] | None = None,
        timestamp: float | None = None,
    ) -> RecordMetadata:
        """Send one record and return where it was stored, once the broker has it.

        ``value`` and ``key`` are bytes (str is UTF-8 encoded) or None;
        ``partition`` overrides the partitioner; ``timestamp`` (seconds since
        the epoch) defaults to now. Raises UnknownTopicError,
        RecordTooLargeError, the broker's typed error, or RequestTimedOutError
        if the record could not be stored within ``delivery_timeout``.
        """
        delivery = await self.enqueue(
            topic, value, key=key, partition=partition, headers=headers, timestamp=timestamp
        )
        return await delivery

    async def enqueue(
        self,
        topic: str,
        value: bytes | str | None,
        *,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes | str]] | None = None,
        timestamp: float | None = None,
    ) -> Delivery:
        """Add a record to its partition's batch and return its :class:`Delivery` at once.

        Waits only for the topic's metadata (the first time) and while the
        producer's buffer (``buffer_bytes``) is full, each at most
        ``max_block`` seconds (then RequestTimedOutError: not enqueued), and,
        like every Trio call, lets other tasks run.
        Arguments are as for :meth:`send`; errors about the record itself
        (unknown topic or partition, too large) are raised here.
        """
        if self._nursery is None or self._closed:
            raise RuntimeError("use the producer inside its async with block")
        # Trio's rule for a cancellable operation: Cancelled means it did not happen.
        # So check here, and never after the record is in its batch (see the end).
        await trio.lowlevel.checkpoint_if_cancelled()
        key_b = _as_bytes(key, "key")
        value_b = _as_bytes(value, "value")
        hdrs: list[Header] = (
            [(str(name), _as_bytes(v, "header value") or b"") for name, v in headers]
            if headers
            else []
        )
        size = _RECORD_OVERHEAD + len(key_b or b"") + len(value_b or b"")
        if hdrs:
            size += 8 + sum(len(n) + len(v) + _HEADER_OVERHEAD for n, v in hdrs)
        if size + _BATCH_OVERHEAD > self.max_batch_bytes:
            raise RecordTooLargeError(
                f"a record of about {size} bytes exceeds max_batch_bytes "
                f"({self.max_batch_bytes}); raise it (within the broker's max_batch_bytes)"
            )
        tp = TopicPartition(topic, await self._choose_partition(topic, key_b, partition))
        ts_ms = round((time.time() if timestamp is None else timestamp) * 1000)
        if ts_ms < 0:
            raise ValueError(f"timestamp {timestamp} is before the epoch")
        if self._buffered + size > self.buffer_bytes and self._buffered > 0:
            await self._wait_for_space(size)
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = _PartitionQueue()
        batch = queue.open
        if batch is not None and batch.size + size > self._batch_limit and batch.records:
            self._close_open(tp, queue)
            batch = None
        if batch is None:
            batch = queue.open = _Batch(trio.current_time())
        delivery = Delivery(tp, ts_ms, batch.outcome, len(batch.records))
        batch.records.append(WireRecord(ts_ms, key_b, value_b, hdrs))
        batch.size += size
        self._buffered += size
        self._pending += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        if batch.size >= self._batch_limit:
            self._close_open(tp, queue)
        if not queue.sending:
            queue.sending = True
            self._nursery.start_soon(self._sender, tp, queue)
        # Always a checkpoint (Trio's rule): a loop of enqueues must let the senders,
        # and everything else, run. Shielded: the record is queued and will be sent,
        # so raising Cancelled now would tell the caller it was not (a caller counting
        # what it enqueued then counted one record too few).
        await trio.lowlevel.cancel_shielded_checkpoint()
        return delivery

    async def _wait_for_space(self, size: int) -> None:
        """Wait (at most ``max_block``) until the buffer has room for ``size`` more bytes.

        Apart from enqueue's fast path: a cancel scope with a deadline per
        record cost a third of a tight enqueue loop's time, when the buffer
        is almost never full.
        """
        with trio.move_on_after(self.max_block) as waiting:
            while self._buffered + size > self.buffer_bytes and self._buffered > 0:
                self._space = trio.Event() if self._space.is_set() else self._space
                await self._space.wait()
        if waiting.cancelled_caught:
            raise RequestTimedOutError(
                f"the producer's buffer (buffer_bytes={self.buffer_bytes}) stayed full for "
                f"max_block ({self.max_block:g}s): records are enqueued faster than the "
                "brokers store them; await deliveries (or flush) before enqueuing more, or "
                "raise buffer_bytes or max_block"
            )

    async def _choose_partition(self, topic: str, key: bytes | None, partition: int | None) -> int:
        assert self._cluster is not None
        count = self._cluster.cached_partition_count(topic)
        if count is None:
            count = await self._cluster.partition_count(topic)
        if partition is not None:
            if not 0 <= partition < count:
                raise UnknownTopicError(
                    f"topic {topic!r} has partitions 0..{count - 1}; "
                    f"partition {partition} does not exist"
                )
            return partition
        if key is not None:
            return partition_for_key(key, count)
        return self._sticky.setdefault(topic, len(self._sticky) % count) % count

    def _close_open(self, tp: TopicPartition, queue: _PartitionQueue) -> None:
        """Move the open batch to the queue of batches ready to send."""
        if queue.open is None:
            return
        queue.closed.append(queue.open)
        queue.open = None
        if tp.topic in self._sticky:  # keyless records move on to the next partition
            self._sticky[tp.topic] += 1
        queue.wake.set()

    async def flush(self) -> None:
        """Send every record enqueued so far now (no lingering) and wait for all outcomes."""
        self._flush_requested += 1
        try:
            for tp, queue in self._queues.items():
                self._close_open(tp, queue)
            await self._idle.wait()
        finally:
            self._flush_requested -= 1

    # -- the sender tasks --------------------------------------------------------------------

    async def _sender(self, tp: TopicPartition, queue: _PartitionQueue) -> None:
        """Send one partition's batches, one at a time, until it has none."""
        try:
            while True:
                if not queue.closed:
                    if queue.open is None:
                        return
                    deadline = queue.open.created + self.linger
                    with trio.move_on_at(deadline):
                        while not queue.closed and not self._flush_requested:
                            queue.wake = trio.Event()
                            await queue.wake.wait()
                    self._close_open(tp, queue)
                    continue
                batch = queue.closed.popleft()
                try:
                    await self._deliver(tp, batch)
                except BaseException:  # cancelled: the producer is closing
                    self._resolve_failed(
                        batch,
                        RequestTimedOutError("the producer closed before the record was stored"),
                    )
                    raise
        finally:
            queue.sending = False

    async def _deliver(self, tp: TopicPartition, batch: _Batch) -> None:
        """Send a batch until it is stored or its delivery timeout passes; resolve its records."""
        assert self._cluster is not None
        payload = encode_batch(batch.records, self.compression)
        if self.compression and len(payload) > self.max_batch_bytes:  # incompressible
            payload = encode_batch(batch.records)  # (within the limit, counted above)
        request = ProduceRequest(
            tp.topic,
            tp.partition,
            payload,
            len(batch.records),
            max(r.timestamp_ms for r in batch.records),
        )
        backoff = Backoff(initial=0.05, maximum=1.0)
        error: BaseException | None = None
        with trio.move_on_at(batch.created + self.delivery_timeout) as deadline:
            while True:
                try:
                    base = await self._send_once(tp, request)
                except CoordError as exc:
                    error = exc
                    if not exc.retriable:
                        break
                    if classify(exc) is Action.MOVED:  # ask where the leader is now
                        self._cluster.forget(tp.topic)
                    log.info("producer: retrying a batch for %s: %s", tp, exc)
                    await backoff.sleep()
                    continue
                batch.outcome.resolve(base)
                error = None
                self.batches_sent += 1
                break
        if deadline.cancelled_caught:  # (a retriable error is only the last of many)
            error = self._bootstrap.deadline_error(
                f"{len(batch.records)} record(s) for {tp} were not stored",
                self.delivery_timeout,
                "delivery_timeout",
                error,
            )
        if error is not None:
            self._resolve_failed(batch, error)
        else:
            self._settle(batch)

    def _resolve_failed(self, batch: _Batch, error: BaseException) -> None:
        batch.outcome.fail(error)
        self._settle(batch)

    async def _send_once(self, tp: TopicPartition, request: ProduceRequest) -> int:
        assert self._cluster is not None
        broker = await self._cluster.leader(tp)
        address = (broker.host, broker.port)
        slots = self._slots.get(address)
        if slots is None:
            slots = self._slots[address] = trio.Semaphore(self.max_in_flight)
        async with slots:
            conn = await self._cluster.connection(broker)
            with trio.move_on_after(self.request_timeout):
                try:
                    response = await conn.request(request)
                except ConnectionClosedError as exc:
                    self._bootstrap.failed(address, str(exc))
                    raise
                assert isinstance(response, ProduceResponse)
                self._bootstrap.answered(address)
                return response.base_offset
        # The answer may yet arrive; not knowing, the batch is sent again (at least once).
        await conn.aclose()
        why = f"no answer to a produce within request_timeout ({self.request_timeout:g}s)"
        self._bootstrap.failed(address, why)
        raise RequestTimedOutError(f"{broker.address} gave {why}")

    def _settle(self, batch: _Batch) -> None:
        self._buffered -= batch.size
        self._pending -= len(batch.records)
        self._space.set()
        if self._pending == 0:
            self._idle.set()

    def _fail_everything(self, error: BaseException) -> None:
        """Fail what is still queued when the producer closes."""
        for queue in self._queues.values():
            batches = list(queue.closed) + ([queue.open] if queue.open else [])
            queue.closed.clear()
            queue.open = None
            for batch in batches:
                self._resolve_failed(batch, error)


def open_producer(
    bootstrap: str | Sequence[str],
    *,
    linger: float = 0.005,
    batch_size: int = 64 * 1024,
    max_batch_bytes: int = 512 * 1024,
    buffer_bytes: int = 32 * 1024 * 1024,
    max_in_flight: int = 16,
    compression: Compression | None = None,
    delivery_timeout: float = 120.0,
    request_timeout: float = 30.0,
    max_block: float = 60.0,
    close_timeout: float = 30.0,
    client_id: str = "trio-coord-producer",
    ssl_context: ssl.SSLContext | None = None,
    sasl: Sasl | None = None,
) -> Producer:
    """A producer for the brokers of ``bootstrap``: ``async with open_producer(b) as p``.

    Options (defaults): ``linger=0.005`` s and ``batch_size=65536`` bytes
    (a partition's batch is sent when either is reached), ``max_batch_bytes``
    (the largest batch, hence record, 524288), ``buffer_bytes`` (records
    waiting to be stored, 32 MiB: :meth:`Producer.enqueue` waits while it is
    full), ``max_in_flight=16`` requests per broker, ``compression`` (None,
    ``"zlib"``, ``"lzma"``, ``"lz4"`` or ``"zstd"``), ``delivery_timeout=120`` s,
    ``request_timeout=30`` s, ``close_timeout=30`` s (how long leaving the
    block waits for records still in flight), ``client_id``, and ``ssl_context``
    and ``sasl`` for a secured broker (docs/security.md).

    Deadlines (Kafka's ``delivery.timeout.ms``, ``request.timeout.ms`` and
    ``max.block.ms``): a record not stored within ``delivery_timeout`` of
    being enqueued (retries included) fails its :class:`Delivery` with
    :class:`~trio_coord.RequestTimedOutError`, naming every broker address
    that could not be reached and why; each produce request (and each
    connect) waits at most ``request_timeout`` for its answer, then is sent
    again; :meth:`Producer.enqueue` and :meth:`Producer.send` wait at most
    ``max_block=60`` s for the topic's metadata and for buffer space, then
    raise RequestTimedOutError (the record was not enqueued).
    """
    return Producer(
        bootstrap,
        linger=linger,
        batch_size=batch_size,
        max_batch_bytes=max_batch_bytes,
        buffer_bytes=buffer_bytes,
        max_in_flight=max_in_flight,
        compression=compression,
        delivery_timeout=delivery_timeout,
        request_timeout=request_timeout,
        max_block=max_block,
        close_timeout=close_timeout,
        client_id=client_id,
        ssl_context=ssl_context,
        sasl=sasl,
    )
