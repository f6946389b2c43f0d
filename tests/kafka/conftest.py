"""Fixtures for the Kafka-protocol tests: one broker process per test module.

The broker runs as ``trio-coord broker --kafka-port 0`` in a subprocess (the
Kafka clients under test are blocking libraries, or asyncio in aiokafka's
case, so the tests are plain functions); it is shared by the tests of a
module, each of which uses topics of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from kafka_fixtures import KafkaBroker, start_broker, stop_broker

_names = itertools.count()


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One broker with a Kafka listener for the whole test module."""
    broker = start_broker(tmp_path_factory.mktemp("kafka-broker"))
    try:
        yield broker
    finally:
        stop_broker(broker)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return f"t{next(_names)}-{request.node.name[:40]}".replace("[", "-").replace("]", "")
