"""Every client operation ends by its deadline against a broker that is not there.

A dead address is a port bound and closed again (connection refused); a
silent broker is an in-memory stream nobody answers on (``silent_network``).
Each test runs on the virtual clock and checks the exact time at which the
operation gave up, and that the error names every address it could not
reach, why, and what to check. The last test runs ``trio-coord produce``
and ``consume`` as a user does against a dead address.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import trio
import trio.testing

from trio_coord import RequestTimedOutError, open_admin, open_consumer, open_producer
from trio_coord.client._bootstrap import Answer, Bootstrap
from trio_coord.protocol.messages import BrokerInfo, MetadataRequest, MetadataResponse, TopicInfo

CHECK = "check that a broker is running at these addresses and reachable from here"


@pytest.fixture
def dead() -> str:
    """``127.0.0.1:<port>`` where nothing listens: a port bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
def silent_network(monkeypatch: pytest.MonkeyPatch) -> list[trio.abc.Stream]:
    """Every TCP connect succeeds at once, to a peer that never reads or answers."""
    peers: list[trio.abc.Stream] = []  # kept open: no EOF either

    async def open_tcp_stream(host: str, port: int, **_: object) -> trio.abc.Stream:
        client, server = trio.testing.memory_stream_pair()
        peers.append(server)
        return client

    monkeypatch.setattr(trio, "open_tcp_stream", open_tcp_stream)
    return peers


async def test_metadata_gives_up_at_its_deadline_naming_the_address_and_why(autojump_clock, dead):
    bootstrap = Bootstrap(dead)
    start = trio.current_time()
    with pytest.raises(RequestTimedOutError) as info:
        with bootstrap.fail_after(2.0, "no broker answered", "max_block"):
            await bootstrap.metadata(MetadataRequest(topics=[]))
    assert trio.current_time() - start == 2.0
    assert str(info.value) == (
        f"no broker answered within 2s (max_block): {dead} — connection refused; {CHECK} "
        "(or allow more time)"
    )


async def test_each_attempt_is_bounded_by_request_timeout(autojump_clock, silent_network):
    bootstrap = Bootstrap("127.0.0.1:1,127.0.0.1:2", request_timeout=1.0)
    start = trio.current_time()
    with pytest.raises(RequestTimedOutError) as info:
        with bootstrap.fail_after(5.0, "no broker answered"):
            await bootstrap.metadata(MetadataRequest(topics=[]))
    assert trio.current_time() - start == 5.0
    assert str(info.value).startswith(
        "no broker answered within 5s: "
        "127.0.0.1:1 — no answer within request_timeout (1s), "
        "127.0.0.1:2 — no answer within request_timeout (1s); "
    )
    # Both addresses were asked (1 s each), then again after a jittered backoff.
    assert len(silent_network) >= 4


async def test_a_connect_that_hangs_is_bounded_by_request_timeout(autojump_clock, monkeypatch):
    async def hang(host: str, port: int, **_: object) -> trio.abc.Stream:
        await trio.sleep_forever()
        raise AssertionError

    monkeypatch.setattr(trio, "open_tcp_stream", hang)
    start = trio.current_time()
    with pytest.raises(RequestTimedOutError) as info:
        async with open_admin("10.9.9.9:9192", api_timeout=7.0, request_timeout=3.0):
            pass
    assert trio.current_time() - start == 7.0
    assert str(info.value).startswith(
        "no broker accepted a connection within 7s (api_timeout): "
        "10.9.9.9:9192 — no connection within request_timeout (3s); "
    )


async def test_open_admin_gives_up_at_api_timeout(autojump_clock, dead):
    start = trio.current_time()
    with pytest.raises(RequestTimedOutError) as info:
        async with open_admin(dead, api_timeout=4.0):
            pass
    assert trio.current_time() - start == 4.0
    assert str(info.value) == (
        f"no broker accepted a connection within 4s (api_timeout): {dead} — connection "
        f"refused; {CHECK} (or allow more time)"
    )


async def test_open_consumer_gives_up_joining_at_api_timeout(autojump_clock, dead):
    start = trio.current_time()
    with pytest.raises(RequestTimedOutError) as info:
        async with open_consumer(dead, "g", ["t"], api_timeout=7.0):
            pass
    assert trio.current_time() - start == 7.0
    assert str(info.value) == (
        f"the consumer could not join group 'g' within 7s (api_timeout): {dead} — "
        f"connection refused; {CHECK} (or allow more time)"
    )


async def test_send_gives_up_at_max_block_when_no_broker_answers(autojump_clock, dead):
    async with open_producer(dead, max_block=5.0) as producer:
        start = trio.current_time()
        with pytest.raises(RequestTimedOutError) as info:
            await producer.send("t", b"never sent")
        assert trio.current_time() - start == 5.0
    assert str(info.value) == (
        f"no broker answered within 5s (max_block): {dead} — connection refused; {CHECK} "
        "(or allow more time)"
    )


class _LeaderAt(Bootstrap):
    """Metadata says: topic ``t`` (one partition) is on the broker at ``leader``."""

    def __init__(self, leader: str, **options: float) -> None:
        super().__init__(leader, **options)
        host, port = self.addresses[0]
        broker = BrokerInfo(1, host, port)
        self.answer = MetadataResponse([broker], [TopicInfo("t", 1, [1])])

    async def metadata_once(self, request: MetadataRequest) -> Answer:
        return Answer(self.answer, self.addresses[0])


async def test_a_record_fails_at_delivery_timeout_when_its_leader_is_down(autojump_clock, dead):
    producer = open_producer(dead, delivery_timeout=10.0)
    producer._bootstrap = _LeaderAt(dead)
    async with producer:
        start = trio.current_time()
        delivery = await producer.enqueue("t", b"lost")
        with pytest.raises(RequestTimedOutError) as info:
            await delivery
        assert trio.current_time() - start == 10.0
    assert str(info.value) == (
        f"1 record(s) for t-0 were not stored within 10s (delivery_timeout): {dead} — "
        f"connection refused; {CHECK} (or allow more time)"
    )


async def test_a_produce_nobody_answers_is_resent_each_request_timeout(
    autojump_clock, silent_network
):
    producer = open_producer("127.0.0.1:7", delivery_timeout=10.0, request_timeout=3.0)
    producer._bootstrap = _LeaderAt("127.0.0.1:7", request_timeout=3.0)
    async with producer:
        start = trio.current_time()
        delivery = await producer.enqueue("t", b"unanswered")
        with pytest.raises(RequestTimedOutError) as info:
            await delivery
        assert trio.current_time() - start == 10.0
    assert str(info.value).startswith(
        "1 record(s) for t-0 were not stored within 10s (delivery_timeout): 127.0.0.1:7 — "
        "no answer to a produce within request_timeout (3s); "
    )
    assert len(silent_network) == 4  # sent at 0, ~3, ~6 and ~9 s: a new connection each time


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_coord", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,  # (the bound on real time: the commands give up after 2 s)
        check=False,
    )


def test_produce_and_consume_with_a_timeout_exit_with_one_line_naming_the_address(dead):
    result = _cli("produce", "t", "--timeout", "2", "-b", dead, stdin="hello\n")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"error: no broker answered within 2s (max_block): {dead} — connection refused; "
        f"{CHECK} (or allow more time)\n"
    )
    result = _cli("consume", "t", "-g", "g", "--timeout", "2", "-b", dead)
    assert result.returncode == 1
    assert result.stderr == (
        f"error: the consumer could not join group 'g' within 2s (api_timeout): {dead} — "
        f"connection refused; {CHECK} (or allow more time)\n"
    )
    result = _cli("produce", "t", "--timeout", "0", "-b", dead)
    assert result.returncode == 2 and "must be more than 0 seconds" in result.stderr
