"""Fixtures for the Spark tests: one local SparkSession and one broker process for the run.

Spark runs the data source's code in Python worker processes, so the broker
must be reachable over TCP: it runs as ``python -m trio_coord broker`` on
127.0.0.1, port 0, and the tests read its address from its first line of
JSON. The session is local[2], without UI, with two shuffle partitions
(starting one costs seconds: there is one per test run). Missing Java or
pyspark fails these tests (never skips): run ``scripts/test``.

Helpers run the Trio library in this process (``trio.run``) to make topics,
produce records and read what the group has committed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio

from trio_coord import open_admin, open_consumer, open_producer
from trio_coord.spark import local_session

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
BROKER = [sys.executable, "-m", "trio_coord", "broker"]


@pytest.fixture(scope="session")
def spark():
    """The test run's local SparkSession, with the trio_coord format registered."""
    session = local_session(
        "trio_coord-tests",
        "local[2]",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.ui.showConsoleProgress": "false",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One broker process for the Spark tests; yields its host:port."""
    data = tmp_path_factory.mktemp("spark-broker") / "data"
    process = subprocess.Popen(
        [*BROKER, "--data-dir", str(data), "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ENV,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, "the broker did not start"
        yield json.loads(line)["address"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a hung broker is a bug
            process.kill()
            raise


def make_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create a topic."""

    async def go() -> None:
        with trio.fail_after(10):
            async with open_admin(bootstrap) as admin:
                await admin.create_topic(name, partitions)

    trio.run(go)


def produce(bootstrap: str, topic: str, records: list[dict]) -> list[tuple[int, int]]:
    """Send records (dicts of producer.send's keyword arguments plus value); their
    (partition, offset) in order."""

    async def go() -> list[tuple[int, int]]:
        with trio.fail_after(20):
            async with open_producer(bootstrap) as producer:
                deliveries = [await producer.enqueue(topic, **r) for r in records]
                return [((m := await d).partition, m.offset) for d in deliveries]

    return trio.run(go)


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets."""

    async def go() -> dict[tuple[str, int], int]:
        with trio.fail_after(10):
            async with open_admin(bootstrap) as admin:
                return {tuple(tp): o for tp, o in (await admin.committed_offsets(group)).items()}

    return trio.run(go)


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    """Each partition's log end offset."""

    async def go() -> dict[tuple[str, int], int]:
        with trio.fail_after(10):
            async with open_admin(bootstrap) as admin:
                listed = await admin.list_offsets([(topic, p) for p in range(partitions)])
                return {tuple(tp): o.log_end for tp, o in listed.items()}

    return trio.run(go)


def consume(bootstrap: str, topic: str, count: int, group: str | None = None) -> list:
    """Read ``count`` records of ``topic`` as a member of ``group`` (default: its own group)."""

    async def go() -> list:
        records = []
        with trio.fail_after(30):
            async with open_consumer(
                bootstrap, group or f"reader-{topic}", [topic], offset_reset="earliest"
            ) as c:
                async for record in c:
                    records.append(record)
                    if len(records) == count:
                        break
        return records

    return trio.run(go)
