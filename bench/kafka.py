"""Kafka-protocol produce and consume throughput: trio-coord against librdkafka's mock cluster.

``python bench/kafka.py [--records N] [--size S] [--partitions P]
[--repeat R] [--flush-interval F] [--json] [--quick]`` measures, with
confluent-kafka (librdkafka) clients in this process:

* produce: a Producer (``linger.ms`` 5, no compression, acks=all, the
  defaults otherwise) sends N records of S bytes round-robin to the P
  partitions of a fresh topic and flushes (every record acknowledged);
* consume: a Consumer assigned those P partitions from offset 0 (no group)
  reads all N records with ``consume(1000)``.

Targets, measured back to back and alternating in order, R times: a
trio-coord broker (its own process, ``--kafka-port 0``, an interval flush
policy of F seconds: acknowledged once written, as Kafka acknowledges
before any fsync; ``--flush-interval 0`` fsyncs every batch), and
librdkafka's built-in mock cluster (``test.mock.num.brokers`` 3, in memory,
in this process). The figures that travel between machines are the ratios
trio-coord/mock of records per second (goal: >= 0.5), medians over the
repetitions. ``--quick`` is a smoke run (few records, one repetition).

The mock keeps about 5 MB per partition and drops older records beyond
that, so N x S / P must stay below it (the default 100,000 x 100 B / 4 does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent


def _start_broker(directory: Path, flush_interval: float) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_coord",
            "broker",
            "--data-dir",
            str(directory / "data"),
            "--port",
            "0",
            "--kafka-port",
            "0",
            "--flush-interval",
            str(flush_interval),
            "--json",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=(directory / "broker.log").open("w"),
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise SystemExit(f"the broker did not start: {(directory / 'broker.log').read_text()}")
    return process, json.loads(line)["kafka_address"]


def _mock_cluster() -> tuple[Producer, str]:
    """A Producer that hosts librdkafka's mock cluster, and the cluster's bootstrap list."""
    host = Producer({"test.mock.num.brokers": 3, "bootstrap.servers": "", "log_level": 3})
    brokers = host.list_topics(timeout=10).brokers.values()
    return host, ",".join(f"{b.host}:{b.port}" for b in brokers)


def _create(bootstrap: str, topic: str, partitions: int, mock: Producer | None) -> int:
    """Create ``topic``; returns its partition count (the mock creates topics on first use)."""
    if mock is not None:
        mock.produce(topic, b"warm-up", partition=0)
        mock.flush(10)
        return len(mock.list_topics(topic, timeout=10).topics[topic].partitions)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(15)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"warm-up", partition=0)
    producer.flush(10)
    return partitions


def _produce(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    producer.list_topics(topic, timeout=10)  # connected before the clock starts
    value = b"x" * size
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.001)
    left = producer.flush(120)
    elapsed = time.perf_counter() - started
    if left:
        raise SystemExit(f"{left} records were not acknowledged")
    return elapsed


def _consume(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    try:
        wanted = records + 1  # (and the warm-up record)
        got = 0
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = started + 120
        while got < wanted and time.perf_counter() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    got += 1
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if got < wanted:
        raise SystemExit(f"{bootstrap}: consumed {got} of {wanted} records of {topic}")
    return elapsed


def run(params: dict[str, Any]) -> dict[str, Any]:
    """Run the benchmark with ``params``; the result as a JSON-able dict."""
    records, size = params["records"], params["size"]
    samples: dict[str, dict[str, list[float]]] = {
        t: {"produce": [], "consume": []} for t in ("trio_coord", "mock")
    }
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        process, trio_bootstrap = _start_broker(Path(tmp), params["flush_interval"])
        mock, mock_bootstrap = _mock_cluster()
        try:
            for rep in range(params["repeat"]):
                order = ["trio_coord", "mock"] if rep % 2 == 0 else ["mock", "trio_coord"]
                for target in order:
                    bootstrap = trio_bootstrap if target == "trio_coord" else mock_bootstrap
                    topic = f"bench-{rep}-{target}"
                    parts = _create(
                        bootstrap, topic, params["partitions"], mock if target == "mock" else None
                    )
                    produce = _produce(bootstrap, topic, parts, records, size)
                    consume = _consume(bootstrap, topic, parts, records)
                    samples[target]["produce"].append(records / produce)
                    samples[target]["consume"].append(records / consume)
        finally:
            process.terminate()
            process.wait(10)
            del mock
    result: dict[str, Any] = {"params": params}
    for target, figures in samples.items():
        result[target] = {
            f"{what}_records_per_s": statistics.median(values) for what, values in figures.items()
        }
        result[target]["produce_mb_per_s"] = result[target]["produce_records_per_s"] * size / 1e6
    result["ratio"] = {
        what: statistics.median(
            t / m for t, m in zip(samples["trio_coord"][what], samples["mock"][what], strict=True)
        )
        for what in ("produce", "consume")
    }
    return result


def render(result: dict[str, Any]) -> str:
    """The result as a small table for people."""
    p = result["params"]
    lines = [
        f"{p['records']:,} records of {p['size']} bytes, {p['partitions']} partitions, "
        f"{p['repeat']} repetition(s), trio-coord flush interval {p['flush_interval']}s",
        f"{'target':<12}{'produce rec/s':>16}{'consume rec/s':>16}",
    ]
    for target in ("trio_coord", "mock"):
        figures = result[target]
        lines.append(
            f"{target:<12}{figures['produce_records_per_s']:>16,.0f}"
            f"{figures['consume_records_per_s']:>16,.0f}"
        )
    ratio = result["ratio"]
    lines.append(
        f"ratio trio-coord/mock: produce {ratio['produce']:.2f}x, consume {ratio['consume']:.2f}x "
        "(goal >= 0.5x)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run, print a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=None, help="records per run (100,000)")
    parser.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 3)")
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=1.0,
        help="trio-coord's flush interval; 0 fsyncs every batch (default 1.0)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: few records, once")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    params = {
        "records": args.records or (3000 if args.quick else 100_000),
        "size": args.size,
        "partitions": args.partitions,
        "repeat": args.repeat or (1 if args.quick else 3),
        "flush_interval": args.flush_interval,
        "quick": args.quick,
    }
    result = run(params)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
