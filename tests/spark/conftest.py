"""Fixtures for the Spark tests: one local SparkSession and one broker process for the run.

Spark runs the data source's code in Python worker processes, so the broker
must be reachable over TCP: it runs as ``python -m trio_coord broker`` on
127.0.0.1, port 0, and the tests read its address from its first line of
JSON. The session is local[2], without UI, with two shuffle partitions
(starting one costs seconds: there is one per test run). Missing Java or
pyspark fails these tests (never skips): run ``scripts/test``.

``helpers.py`` has the functions tests call to make topics, produce and
consume records and read what a group has committed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from broker_process import running_broker

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
    with running_broker(tmp_path_factory.mktemp("spark-broker") / "data") as address:
        yield address
