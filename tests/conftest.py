"""Shared fixtures: brokers on real sockets for integration tests.

Time-dependent broker tests use ``broker/harness.py`` instead: an ephemeral
broker (in-memory store) driven over in-memory streams on Trio's virtual
clock, so that they can assert exact times.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from trio_coord import Broker, open_broker


@pytest.fixture
async def broker(tmp_path) -> AsyncIterator[Broker]:
    """A broker on 127.0.0.1 (free port) with a data dir in ``tmp_path``.

    Its minimum session timeout is lowered so that tests can use short ones.
    """
    async with open_broker(tmp_path / "data", min_session_timeout=0.05) as running:
        yield running
