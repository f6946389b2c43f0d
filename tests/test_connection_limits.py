"""Invariant 6 (Bounded) for connections: how many, how idle, how slow, how much memory.

Over real sockets against a real broker, the connection limits Kafka's broker
has (``max.connections``, ``max.connections.per.ip``, ``connections.max.idle.ms``,
``queued.max.request.bytes``) and what a peer that never reads, or sends a
frame a byte at a time, can make a broker hold. Every test checks that a
well-behaved client is served meanwhile and afterwards.
"""

from __future__ import annotations

import pytest
import trio
from wire import read_goodbye

from trio_coord import open_admin, open_broker, open_producer
from trio_coord.broker.server import BrokerConfig, connection_limit
from trio_coord.protocol.errors import ErrorCode
from trio_coord.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameCodec
from trio_coord.protocol.messages import FetchPartition, FetchRequest, Request, TopicInfo

TIMEOUT = 10


async def _served(bootstrap: str, topic: str) -> None:
    async with open_admin(bootstrap) as admin:
        created = await admin.create_topic(topic, 1)
        assert created == TopicInfo(topic, 1, topic_id=created.topic_id)  # (ids are random)


@pytest.mark.parametrize("limit", ["max_connections", "max_connections_per_ip"])
async def test_connections_beyond_the_limit_are_refused_and_told_why(tmp_path, limit) -> None:
    async with open_broker(tmp_path, **{limit: 5}) as broker:
        streams = [await trio.open_tcp_stream(*broker.address) for _ in range(8)]
        with trio.fail_after(TIMEOUT):
            while broker.connection_count() < 5:
                await trio.sleep(0.01)
        refusals = []
        for stream in streams[5:]:
            goodbye = await read_goodbye(stream, TIMEOUT)
            assert goodbye is not None and goodbye.error == ErrorCode.RESOURCES_EXHAUSTED
            refusals.append(goodbye.message)
        assert all(f"({limit} 5)" in m and "too many connections" in m for m in refusals)
        assert broker.connection_count() == 5
        for stream in streams:
            await stream.aclose()
        with trio.fail_after(TIMEOUT):
            while broker.connection_count():
                await trio.sleep(0.01)
        await _served(broker.bootstrap, "after-the-flood")


def test_an_explicit_limit_the_fd_limit_cannot_hold_stops_start_up() -> None:
    with pytest.raises(ValueError, match=r"ulimit -n .* lower --max-connections"):
        connection_limit(BrokerConfig(max_connections=10**9))
    assert connection_limit(BrokerConfig()) >= 64  # the default shrinks to fit instead


def test_the_default_fits_a_low_file_descriptor_limit(monkeypatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    monkeypatch.setattr(resource, "setrlimit", lambda *_: None)
    assert connection_limit(BrokerConfig()) == 768  # a quarter kept for files
    assert connection_limit(BrokerConfig(max_connections=500)) == 500
    with pytest.raises(ValueError, match=r"needs 1256 file descriptors \(256 kept"):
        connection_limit(BrokerConfig(max_connections=1000))


async def test_a_frame_sent_too_slowly_closes_its_connection(tmp_path) -> None:
    async with open_broker(tmp_path, request_read_timeout=0.3) as broker:
        slow = await trio.open_tcp_stream(*broker.address)
        await slow.send_all((1000).to_bytes(4, "big") + b"\x93\x01")  # and nothing more
        started = trio.current_time()
        goodbye = await read_goodbye(slow, TIMEOUT)
        assert goodbye is not None and goodbye.error == ErrorCode.REQUEST_TIMED_OUT
        assert "request_read_timeout" in goodbye.message
        assert trio.current_time() - started < 0.3 + 5 * 0.075 + 2  # (reaped within a scan)
        await _served(broker.bootstrap, "after-slowloris")


async def test_an_idle_connection_is_closed_a_busy_one_is_not(tmp_path) -> None:
    async with open_broker(tmp_path, connections_max_idle=0.4) as broker:
        idle = await trio.open_tcp_stream(*broker.address)
        async with open_admin(broker.bootstrap) as busy:
            for i in range(6):  # 1.2 s of activity, every 0.2 s
                await busy.create_topic(f"t{i}", 1)
                await trio.sleep(0.2)
            assert await read_goodbye(idle, TIMEOUT) is None  # closed, silently (as Kafka does)
            assert len(await busy.list_topics()) == 6


async def test_a_peer_that_never_reads_its_answers_is_muted_with_bounded_memory(tmp_path) -> None:
    """64 fetches of a full frame each, answers never read: the broker used to hold them
    all (~50 MB per connection). Now the connection's budget bounds what it holds, its
    reader stops reading, and everyone else is served."""
    budget = 3 * DEFAULT_MAX_FRAME_SIZE
    async with open_broker(tmp_path, max_connection_bytes=budget) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("big", 4)
        async with open_producer(broker.bootstrap) as producer:
            for i in range(600):
                await producer.enqueue("big", "x" * 8000, partition=i % 4)
        codec = FrameCodec()
        hog = await trio.open_tcp_stream(*broker.address)
        fetch = FetchRequest([FetchPartition("big", p, 0) for p in range(4)], max_wait_ms=0)
        await hog.send_all(b"".join(codec.encode(Request(n, fetch)) for n in range(1, 65)))
        (conn,) = [
            c for c in broker._connections if c.peer.endswith(str(hog.socket.getsockname()[1]))
        ]
        with trio.fail_after(TIMEOUT):
            while not conn.charged:
                await trio.sleep(0.01)
        for _ in range(20):  # it stays bounded while the peer does not read
            assert conn.charged <= budget
            assert broker._shared_bytes.used <= broker._shared_bytes.total
            await trio.sleep(0.05)
        assert conn.charged > DEFAULT_MAX_FRAME_SIZE, "answers are held: the reader is muted"
        await _served(broker.bootstrap, "beside-the-hog")
        await hog.aclose()
        with trio.fail_after(TIMEOUT):
            while broker._shared_bytes.used:
                await trio.sleep(0.01)


async def test_half_sent_frames_take_from_the_shared_budget_and_give_it_back(tmp_path) -> None:
    total = 4 * DEFAULT_MAX_FRAME_SIZE
    async with open_broker(
        tmp_path, queued_max_request_bytes=total, request_read_timeout=0.5
    ) as broker:
        streams = []
        for _ in range(8):  # 8 frames announcing 1 MiB each: 4 fit, the rest wait
            stream = await trio.open_tcp_stream(*broker.address)
            await stream.send_all(DEFAULT_MAX_FRAME_SIZE.to_bytes(4, "big") + b"\x93")
            streams.append(stream)
        with trio.fail_after(TIMEOUT):
            while broker._shared_bytes.used < total:
                await trio.sleep(0.01)
        assert broker._shared_bytes.used == total
        await _served(broker.bootstrap, "small-frames-still-go")  # heartbeats, joins...
        for stream in streams:
            await read_goodbye(stream, TIMEOUT)  # each is closed at its read timeout
        with trio.fail_after(TIMEOUT):
            while broker._shared_bytes.used:
                await trio.sleep(0.01)


async def test_a_connection_closed_while_muted_gives_back_everything(tmp_path) -> None:
    """A peer hangs up while its reader waits for budget (muted behind a long poll):
    once the poll ends, everything the connection took is given back, and it goes."""
    async with open_broker(tmp_path, max_connection_bytes=DEFAULT_MAX_FRAME_SIZE) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("big", 1)
        hog = await trio.open_tcp_stream(*broker.address)
        fetch = FetchRequest([FetchPartition("big", 0, 0)], max_wait_ms=500, min_bytes=10**9)
        codec = FrameCodec()
        big = FetchRequest([FetchPartition("big", 0, 0, max_bytes=8000)] * 1500, max_wait_ms=0)
        # A long poll holds the budget; a large request then waits for it, holding shared bytes.
        await hog.send_all(codec.encode(Request(1, fetch)) + codec.encode(Request(2, big)))
        with trio.fail_after(TIMEOUT):
            while not broker._shared_bytes.used:
                await trio.sleep(0.01)
        await hog.aclose()
        with trio.fail_after(TIMEOUT):
            while broker._shared_bytes.used or broker.connection_count():
                await trio.sleep(0.01)


async def test_a_refused_stream_is_closed_even_if_the_refusal_is_cancelled(tmp_path) -> None:
    # (trio.serve_tcp closed every stream it accepted; the broker's own accept loop leaves
    # that to serve_stream, whose refusal may be cancelled: a shutdown meanwhile.)
    async with open_broker(tmp_path, max_connections=1) as broker:
        held = await trio.open_tcp_stream(*broker.address)
        with trio.fail_after(TIMEOUT):
            while broker.connection_count() < 1:
                await trio.sleep(0.01)
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        theirs = await trio.open_tcp_stream(*listener.socket.getsockname()[:2])
        stream = await listener.accept()
        with trio.CancelScope() as scope:
            scope.cancel()
            await broker.serve_stream(stream)
        assert stream.socket.fileno() == -1  # closed, not left to the garbage collector
        for resource in (theirs, listener, held):
            await resource.aclose()


async def test_serve_stream_takes_a_unix_socket(tmp_path) -> None:
    # (serve_stream's promise to an embedding application: any Trio stream, UNIX sockets
    # too, whose peer has no IP address to count and no port to name.)
    from trio_coord.protocol.connection import Connection, serving
    from trio_coord.protocol.messages import MetadataRequest, MetadataResponse

    async with open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        ours, theirs = trio.socket.socketpair()
        nursery.start_soon(broker.serve_stream, trio.SocketStream(theirs))
        async with serving(Connection(trio.SocketStream(ours))) as conn:
            with trio.fail_after(TIMEOUT):
                answer = await conn.request(MetadataRequest([]))
        assert isinstance(answer, MetadataResponse) and answer.brokers


async def test_accept_out_of_descriptors_is_retried_and_said_once_per_interval(
    autojump_clock, caplog
) -> None:
    # Out of file descriptors, accept() fails until some close; the broker keeps
    # accepting (as trio.serve_tcp did), says why at most every 10 s, not every 0.1 s.
    import errno
    from types import SimpleNamespace

    from trio_coord.broker.server import Broker

    failures = 300  # 30 s of EMFILE at one retry per 0.1 s
    served: list[object] = []

    class Listener:
        handed = False

        async def accept(self):
            nonlocal failures
            await trio.lowlevel.checkpoint()
            if failures:
                failures -= 1
                raise OSError(errno.EMFILE, "Too many open files")
            if self.handed:
                await trio.sleep_forever()
            self.handed = True
            return "a stream"

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return None

    async def serve_stream(stream):
        served.append(stream)

    broker = SimpleNamespace(serve_stream=serve_stream)
    with caplog.at_level("ERROR", logger="trio_coord.broker.server"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Broker._accept, broker, Listener(), nursery)
            await trio.sleep(31)
            nursery.cancel_scope.cancel()
    assert served == ["a stream"]
    said = [r for r in caplog.records if "accepting connections" in r.getMessage()]
    assert 3 <= len(said) <= 4, [r.getMessage() for r in said]
    assert "too many open files" in said[0].getMessage().lower()
    assert "ulimit -n" in said[0].getMessage()
