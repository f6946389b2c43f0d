"""Shared fixtures: brokers on real sockets, and a real ZooKeeper server, for integration tests.

Time-dependent broker tests use ``broker/harness.py`` instead: an ephemeral
broker (in-memory store) driven over in-memory streams on Trio's virtual
clock, so that they can assert exact times.

ZooKeeper: ``zookeeper_server`` is one server (``zkserver.ZooKeeperServer``)
for the whole test run, started on first use; tests isolate themselves with
``zk_chroot``, a fresh chroot each (``zookeeper_server.url(zk_chroot)``).
Tests that stop or restart a server make their own ``ZooKeeperServer`` in
``tmp_path`` instead. Missing Java or ZooKeeper fails these tests (never
skips): run ``scripts/test``, which installs them.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator, Iterator

import pytest
from zkserver import ZooKeeperServer, ZooKeeperUnavailable

from trio_coord import Broker, open_broker


@pytest.fixture
async def broker(tmp_path) -> AsyncIterator[Broker]:
    """A broker on 127.0.0.1 (free port) with a data dir in ``tmp_path``.

    Its minimum session timeout is lowered so that tests can use short ones.
    """
    async with open_broker(tmp_path / "data", min_session_timeout=0.05) as running:
        yield running


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One private ZooKeeper server for the test run (fails, never skips, without ZooKeeper)."""
    try:
        server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
        server.start()
    except ZooKeeperUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


_chroot_numbers = itertools.count()


@pytest.fixture
def zk_chroot(request: pytest.FixtureRequest) -> str:
    """A chroot no other test uses, named after the test: ``/tests/<n>-<test name>``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:80]
    return f"/tests/{next(_chroot_numbers)}-{name}"
