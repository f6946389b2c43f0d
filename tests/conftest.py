"""Shared fixtures: brokers on real sockets, and a real ZooKeeper server, for integration tests.

Time-dependent broker tests use ``broker/harness.py`` instead: an ephemeral
broker (in-memory store) driven over in-memory streams on Trio's virtual
clock, so that they can assert exact times.

ZooKeeper: ``zookeeper_server`` is one server (``zkserver.ZooKeeperServer``)
for the whole test run, started on first use; tests isolate themselves with
``zk_chroot``, a fresh chroot each (``zookeeper_server.url(zk_chroot)``).
Tests that stop or restart a server use ``private_zookeeper`` instead, a
server of their own in ``tmp_path``. Missing Java or ZooKeeper fails these
tests (never skips): run ``scripts/test``, which installs them.

Parallel runs: ``scripts/test`` runs the suite on pytest-xdist workers with
``--dist loadgroup``: the tests that use the SparkSession run on one worker
(it starts one session), a file with a module-scoped fixture runs on one
worker, and every other test runs wherever a worker is free. Session
fixtures such as ``zookeeper_server`` start once per worker.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from zkserver import ZooKeeperServer, ZooKeeperUnavailable

from trio_coord import Broker, open_broker


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests that share an expensive fixture, for ``--dist loadgroup``.

    Tests using the ``spark`` session are one group (one worker starts one
    SparkSession); a test using a module-scoped fixture is grouped with its
    file (the fixture starts once). Every other test goes wherever a worker is
    free. Runs before xdist reads the groups; harmless without xdist.
    """
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if "spark" in info.names_closure:
            group = "spark"
        elif any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs):
            group = item.path.relative_to(config.rootpath).as_posix()
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
async def broker(tmp_path) -> AsyncIterator[Broker]:
    """A broker on 127.0.0.1 (free port) with a data dir in ``tmp_path``.

    Its minimum session timeout is lowered so that tests can use short ones.
    """
    async with open_broker(tmp_path / "data", min_session_timeout=0.05) as running:
        yield running


def _running_zookeeper(directory: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper server started in ``directory`` and stopped afterwards (fails, never
    skips, without ZooKeeper)."""
    try:
        server = ZooKeeperServer(directory)
        server.start()
    except ZooKeeperUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One private ZooKeeper server for the test run (fails, never skips, without ZooKeeper)."""
    yield from _running_zookeeper(tmp_path_factory.mktemp("zookeeper"))


@pytest.fixture
def private_zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper server of the test's own (in ``tmp_path/zookeeper``), which it may stop
    and restart."""
    yield from _running_zookeeper(tmp_path / "zookeeper")


_chroot_numbers = itertools.count()


@pytest.fixture
def zk_chroot(request: pytest.FixtureRequest) -> str:
    """A chroot no other test uses, named after the test: ``/tests/<n>-<test name>``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:80]
    return f"/tests/{next(_chroot_numbers)}-{name}"
