"""Finding brokers: bootstrap parsing, connection errors, and telling the user while retrying."""

from __future__ import annotations

import logging

import pytest
import trio

from trio_coord import ConnectionClosedError
from trio_coord.client._bootstrap import Bootstrap, parse_bootstrap
from trio_coord.protocol import MetadataRequest
from trio_coord.protocol.connection import connect_tcp


def test_bootstrap_lists_parse_and_refuse_what_is_not_host_port():
    assert parse_bootstrap("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap(["[::1]:9192"]) == [("::1", 9192)]
    for bad in ("", "host", "host:", ":1", "host:port", "host:70000"):
        with pytest.raises(ValueError, match=r"host:port|empty"):
            parse_bootstrap(bad)


async def test_a_refused_connection_says_why_and_what_to_check():
    with pytest.raises(ConnectionClosedError) as info:
        await connect_tcp("127.0.0.1", 1)
    assert str(info.value) == (
        "cannot connect to 127.0.0.1:1 (Connection refused); is a broker running there?"
    )


async def test_retrying_without_a_broker_warns_then_keeps_trying(autojump_clock, caplog):
    caplog.set_level(logging.WARNING, logger="trio_coord.client._bootstrap")
    with trio.move_on_after(40.0):
        await Bootstrap("127.0.0.1:1").metadata(MetadataRequest(topics=[]))
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings, "a user waiting on a missing broker must be told"
    assert warnings[0].startswith("no broker at 127.0.0.1:1 has answered for ")
    assert "still trying" in warnings[0]
    assert len(warnings) == 2  # then once every 30 s, not at every retry
