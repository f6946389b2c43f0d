"""Helpers of the Kafka-protocol tests: a broker process with a Kafka listener, topics,
a fake Kafka connection for handlers called in-process, and a group member in a
subprocess that a test kills.

(In a module of its own, not the conftest, so that test modules can import
it by name: ``tests/kafka`` is no package, since a package named ``kafka``
would shadow kafka-python.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class KafkaBroker:
    """A broker process: its native and Kafka bootstrap addresses, and its log file."""

    native: str
    kafka: str
    log_path: Path
    process: subprocess.Popen[str]

    def log_text(self) -> str:
        """What the broker logged so far."""
        return self.log_path.read_text()


def start_broker(directory: Path, *extra: str) -> KafkaBroker:
    """Start ``trio-coord broker --kafka-port 0`` in ``directory`` and wait until it listens."""
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "broker.log"
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
            "--json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=log_path.open("w"),
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(10)
        raise AssertionError(f"the broker did not start: {log_path.read_text()}")
    announced = json.loads(line)
    return KafkaBroker(announced["address"], announced["kafka_address"], log_path, process)


def stop_broker(broker: KafkaBroker) -> None:
    """Stop the broker (SIGTERM, then SIGKILL after 10 s)."""
    broker.process.terminate()
    try:
        broker.process.wait(10)
    except subprocess.TimeoutExpired:
        broker.process.kill()
        broker.process.wait()


def create_topic(kafka_bootstrap: str, name: str, partitions: int = 1) -> None:
    """Create a topic through the Kafka admin API (confluent-kafka)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions)]).values():
        future.result(15)


def codec_records(count: int = 100) -> list[dict[str, Any]]:
    """What a codec round trip sends, as keyword arguments of ``send()`` (kafka-python's
    and aiokafka's alike): a key on nine in ten, two headers (one empty), a timestamp
    each, alternately to partitions 0 and 1."""
    return [
        {
            "value": b"value-%d" % i,
            "key": None if i % 10 == 0 else b"key-%d" % i,
            "partition": i % 2,
            "headers": [("n", b"%d" % i), ("e", b"")],
            "timestamp_ms": 1_700_000_000_000 + i,
        }
        for i in range(count)
    ]


def check_codec_round_trip(got: list[Any], count: int = 100) -> None:
    """``got`` (kafka-python's or aiokafka's consumer records) is what
    :func:`codec_records` sent: keys, headers, timestamps, partitions and offsets exact."""
    assert len(got) == count
    for record in got:
        i = int(record.value.split(b"-")[1])
        assert record.key == (None if i % 10 == 0 else b"key-%d" % i)
        assert list(record.headers) == [("n", b"%d" % i), ("e", b"")]
        assert record.timestamp == 1_700_000_000_000 + i
        assert record.partition == i % 2
        assert record.offset == i // 2


class FakeConnection:
    """A Kafka connection as the handlers see it: closed or not, and who to tell."""

    def __init__(self) -> None:
        self.closed = False
        self._callbacks: list[Callable[[], None]] = []

    def on_close(self, callback: Callable[[], None]) -> None:
        if self.closed:
            callback()
        else:
            self._callbacks.append(callback)

    def close(self) -> None:
        self.closed = True
        for callback in self._callbacks:
            callback()


class Victim:
    """A group member in a subprocess (``script BOOTSTRAP GROUP TOPIC``, which prints
    ``ready`` once it consumes, then each key it reads); a thread collects the keys."""

    def __init__(self, script: Path, broker: KafkaBroker, group: str, topic: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(script), broker.kafka, group, topic],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"
        self.seen: set[bytes] = set()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self.seen.add(line.strip().encode())

    def kill(self) -> None:
        """SIGKILL the member (no LeaveGroup, no commit), then wait for what it printed."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.reader.join(10)
