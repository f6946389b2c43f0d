"""Prometheus metrics of one broker, served at ``/metrics`` (``--metrics-port``).

Its one job is to describe the broker to a scraper. Almost everything is read
at scrape time from the state the broker keeps anyway (connections, groups
and their states, members, log end offsets, committed offsets and lag), so
the request paths pay nothing; what must be counted as it happens is counted
with a plain integer or one ``prometheus_client`` call per rebalance, per
produced batch and per fetched partition. The registry is the broker's own
(not the process-global one), so several brokers in one process each export
their own. The endpoint is a small HTTP/1.1 server in a Trio task of the
broker: one request per connection, bounded in size and time.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .group import CAUSES

if TYPE_CHECKING:
    from .server import Broker

__all__ = ["BrokerMetrics"]

log = logging.getLogger(__name__)

_REQUEST_LIMIT = 8 * 1024
_REQUEST_TIMEOUT = 10.0
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class BrokerMetrics:
    """The broker's registry, what it counts as it goes, and the ``/metrics`` server."""

    def __init__(self, broker: Broker) -> None:
        self.registry = CollectorRegistry()
        histogram = functools.partial(Histogram, registry=self.registry)
        self.rebalance_seconds = histogram(
            "trio_coord_rebalance_duration_seconds",
            "Rebalances completed, by cause, and how long each took (start to stable).",
            ["cause"],
            buckets=_BUCKETS,
        )
        self.restarts = Counter(
            "trio_coord_rebalance_restarts",
            "Rebalances restarted before completing, by the cause of the restart (crash: a "
            "member failed mid-rebalance).",
            ["cause"],
            registry=self.registry,
        )
        for cause in CAUSES:  # every label present from the start, at 0
            self.rebalance_seconds.labels(cause)
            self.restarts.labels(cause)
        # (name, what it counts, buckets) of the unlabelled histograms:
        self.commit_seconds, self.commit_offsets, self.store_seconds, self.store_records = (
            histogram(name, text, buckets=buckets)
            for name, text, buckets in (
                (
                    "trio_coord_offset_commit_duration_seconds",
                    "Offset commits acknowledged (native and Kafka), and how long each took "
                    "from arrival to durable.",
                    _BUCKETS,
                ),
                (
                    "trio_coord_offset_commit_partitions",
                    "How many partitions' offsets each acknowledged commit carried.",
                    _SIZE_BUCKETS,
                ),
                (
                    "trio_coord_store_write_duration_seconds",
                    "Metadata store transactions (one per group commit of queued records), "
                    "and how long each took.",
                    _BUCKETS,
                ),
                (
                    "trio_coord_store_write_records",
                    "How many records each metadata store transaction carried.",
                    _SIZE_BUCKETS,
                ),
            )
        )
        self.gc_seconds = 0.0
        self._gc_started = 0.0
        self.registry.register(_StateCollector(broker, self))

    def rebalanced(self, seconds: float, cause: str) -> None:
        """A rebalance completed (a ``Stable`` event)."""
        self.rebalance_seconds.labels(cause).observe(seconds)

    def restarted(self, cause: str) -> None:
        """A rebalance was restarted (a ``RebalanceRestarted`` event)."""
        self.restarts.labels(cause).inc()

    def committed(self, offsets: int, seconds: float) -> None:
        """An offset commit of ``offsets`` partitions was acknowledged after ``seconds``."""
        self.commit_seconds.observe(seconds)
        self.commit_offsets.observe(offsets)

    def store_written(self, records: int, seconds: float) -> None:
        """A store transaction of ``records`` records succeeded after ``seconds``."""
        self.store_seconds.observe(seconds)
        self.store_records.observe(records)

    def _gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self.gc_seconds += time.perf_counter() - self._gc_started

    def render(self) -> bytes:
        """The exposition text, as a scrape gets it."""
        return generate_latest(self.registry)

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Answer ``GET /metrics`` on ``host:port`` until cancelled (also times the GC)."""
        gc.callbacks.append(self._gc_callback)
        try:
            await trio.serve_tcp(self._serve_one, port, host=host, task_status=task_status)
        finally:
            gc.callbacks.remove(self._gc_callback)

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(_REQUEST_TIMEOUT):
                head = b""
                while b"\r\n\r\n" not in head and len(head) <= _REQUEST_LIMIT:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    head += chunk
                if b"\r\n\r\n" not in head:
                    await _answer(stream, 431, b"request header too large\n", "text/plain")
                    return
                method, _, rest = head.partition(b" ")
                path = rest.partition(b" ")[0].partition(b"?")[0]
                if method not in (b"GET", b"HEAD"):
                    await _answer(stream, 405, b"only GET /metrics\n", "text/plain")
                elif path != b"/metrics":
                    await _answer(stream, 404, b"see /metrics\n", "text/plain")
                else:
                    body = self.render() if method == b"GET" else b""
                    await _answer(stream, 200, body, CONTENT_TYPE_LATEST)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("metrics request ended early: %s", exc)
        finally:
            await stream.aclose()


async def _answer(stream: trio.SocketStream, status: int, body: bytes, kind: str) -> None:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)


class _StateCollector(Collector):
    """What the broker's state says at scrape time."""

    def __init__(self, broker: Broker, metrics: BrokerMetrics) -> None:
        self._broker = broker
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        broker = self._broker
        yield GaugeMetricFamily(
            "trio_coord_connections", "Open native connections.", len(broker._connections)
        )
        yield GaugeMetricFamily(
            "trio_coord_parked_connections",
            "Open native connections that are idle and parked (no task of their own).",
            broker.parked_count(),
        )
        services = list(broker.coordinator.services.values())
        heartbeats = CounterMetricFamily(
            "trio_coord_heartbeats", "Heartbeats accepted (since the broker started)."
        )
        heartbeats.add_metric([], sum(s.heartbeats for s in services))
        yield heartbeats
        states = GaugeMetricFamily(
            "trio_coord_groups", "Groups this broker coordinates, by state.", labels=["state"]
        )
        members = GaugeMetricFamily(
            "trio_coord_group_members", "Members of each group.", labels=["group"]
        )
        committed = GaugeMetricFamily(
            "trio_coord_group_committed_offset",
            "A group's committed offset of a partition.",
            labels=["group", "topic", "partition"],
        )
        lag = GaugeMetricFamily(
            "trio_coord_group_lag",
            "Records between a group's committed offset and the log end (partitions this "
            "broker holds).",
            labels=["group", "topic", "partition"],
        )
        by_state: defaultdict[str, int] = defaultdict(int)
        ends = broker.partitions.log_offsets
        for service in services:
            for runner in service.runners():
                group = runner.group
                by_state[group.state.value] += 1
                members.add_metric([group.group_id], len(group.members))
                for tp, record in group.offsets.items():
                    labels = [group.group_id, tp.topic, str(tp.partition)]
                    committed.add_metric(labels, record.offset)
                    end = ends(tp)[1]
                    if end >= 0:
                        lag.add_metric(labels, max(0, end - record.offset))
        for state, count in sorted(by_state.items()):
            states.add_metric([state], count)
        yield states
        yield members
        yield committed
        yield lag
        log_end = GaugeMetricFamily(
            "trio_coord_log_end_offset",
            "The offset the next record of a partition gets (partitions this broker holds).",
            labels=["topic", "partition"],
        )
        log_start = GaugeMetricFamily(
            "trio_coord_log_start_offset",
            "The first offset still stored of a partition.",
            labels=["topic", "partition"],
        )
        produced: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
        for topic, partition in broker.logs.partitions():
            partition_log = broker.logs.get(topic, partition)
            if partition_log is not None:
                labels = [topic, str(partition)]
                log_end.add_metric(labels, partition_log.end_offset)
                log_start.add_metric(labels, partition_log.start_offset)
                counts = produced[topic]
                counts[0] += partition_log.appended[0]
                counts[1] += partition_log.appended[1]
        yield log_end
        yield log_start
        for name, help_text, source, index in (
            (
                "trio_coord_produced_bytes",
                "Record bytes appended (native and Kafka producers), by topic.",
                produced,
                0,
            ),
            ("trio_coord_produced_records", "Records appended, by topic.", produced, 1),
            (
                "trio_coord_fetched_bytes",
                "Record bytes served to fetches (native and Kafka), by topic.",
                broker.partitions.traffic,
                0,
            ),
            (
                "trio_coord_fetched_records",
                "Records served to fetches (native and Kafka), by topic.",
                broker.partitions.traffic,
                1,
            ),
        ):
            family = CounterMetricFamily(name, help_text, labels=["topic"])
            for topic, counts in sorted(source.items()):
                family.add_metric([topic], counts[index])
            yield family
        gc_time = CounterMetricFamily(
            "trio_coord_gc_seconds", "Time spent in CPython's cyclic garbage collector."
        )
        gc_time.add_metric([], self._metrics.gc_seconds)
        yield gc_time
        rss = _rss_bytes()
        if rss is not None:
            yield GaugeMetricFamily(
                "trio_coord_resident_memory_bytes", "Resident memory of the process.", rss
            )


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
