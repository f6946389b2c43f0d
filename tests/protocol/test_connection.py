"""Connection: full-duplex multiplexing, errors, closing, the in-flight bound and bad frames.

Everything runs over in-memory streams with the autojump clock, so times are exact.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest
import trio
import trio.testing

from trio_coord.protocol.connection import Connection, RequestHandler, serving
from trio_coord.protocol.errors import (
    ConnectionClosedError,
    CoordError,
    CorruptMessageError,
    ErrorCode,
    FrameTooLargeError,
    UnknownMemberError,
    UnknownServerError,
    UnsupportedMessageError,
    hint,
)
from trio_coord.protocol.framing import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, FrameCodec, FrameReader
from trio_coord.protocol.messages import (
    CreateTopicRequest,
    CreateTopicResponse,
    DescribeGroupRequest,
    Goodbye,
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    Request,
    RequestBody,
    Response,
    ResponseBody,
    StartFetchersRequest,
    TopicInfo,
)


class TopicHandler(RequestHandler):
    """Answers CreateTopic(name, n) after sleeping n seconds, naming the side that answered.

    Heartbeats are answered inline. It counts the handler tasks running at once.
    """

    def __init__(self, side: str) -> None:
        self.side = side
        self.running = 0
        self.peak = 0
        self.handled: list[RequestBody] = []
        self.cancelled = 0

    def handle_now(self, body: RequestBody) -> ResponseBody | None:
        if isinstance(body, HeartbeatRequest):
            return HeartbeatResponse()
        return None

    async def handle(self, body: RequestBody) -> ResponseBody:
        self.handled.append(body)
        assert isinstance(body, CreateTopicRequest)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await trio.sleep(body.partitions)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        return CreateTopicResponse(TopicInfo(f"{self.side}:{body.name}", body.partitions))


class SpawnCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1


@asynccontextmanager
async def connected(
    handler_a: RequestHandler | None = None,
    handler_b: RequestHandler | None = None,
    **b_settings: int,
) -> AsyncIterator[tuple[Connection, Connection, trio.testing.MemoryStream]]:
    """Two served Connections over a memory stream pair, and side a's raw stream."""
    stream_a, stream_b = trio.testing.memory_stream_pair()
    a = Connection(stream_a, handler_a, name="a")
    b = Connection(stream_b, handler_b, name="b", **b_settings)
    async with serving(a), serving(b):
        yield a, b, stream_a


async def _read_frames(stream: trio.abc.ReceiveStream) -> list[object]:
    """Every frame on ``stream`` until it ends."""
    codec = FrameCodec()
    reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
    frames = []
    while (body := await reader.read_frame()) is not None:
        frames.append(codec.decode(body))
    return frames


# -- multiplexing -------------------------------------------------------------------------------


async def test_both_sides_request_concurrently_and_answers_match_out_of_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    handler_a, handler_b = TopicHandler("a"), TopicHandler("b")
    results: dict[str, tuple[str, float]] = {}

    async def ask(conn: Connection, name: str, seconds: int) -> None:
        response = await conn.request(CreateTopicRequest(name, seconds))
        assert isinstance(response, CreateTopicResponse)
        assert response.topic.partitions == seconds
        results[name] = (response.topic.name, trio.current_time())

    async with connected(handler_a, handler_b) as (a, b, _):
        async with trio.open_nursery() as nursery:
            # Sent in this order; answered in the order of their sleeps.
            for name, seconds in [("a3", 3), ("a1", 1), ("a2", 2)]:
                nursery.start_soon(ask, a, name, seconds)
            for name, seconds in [("b2", 2), ("b4", 4), ("b1", 1)]:
                nursery.start_soon(ask, b, name, seconds)
        assert trio.current_time() == 4

    # a's requests are answered by b's handler and the other way round.
    assert results == {
        "a3": ("b:a3", 3.0),
        "a1": ("b:a1", 1.0),
        "a2": ("b:a2", 2.0),
        "b2": ("a:b2", 2.0),
        "b4": ("a:b4", 4.0),
        "b1": ("a:b1", 1.0),
    }
    assert handler_a.peak == 3
    assert handler_b.peak == 3


async def test_many_requests_with_the_same_body_get_their_own_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    handler = TopicHandler("b")
    async with connected(None, handler) as (a, _, _):
        finished: list[tuple[int, float]] = []

        async def ask(i: int) -> None:
            response = await a.request(CreateTopicRequest(f"t{i}", 10 - i))
            assert isinstance(response, CreateTopicResponse)
            assert response.topic.name == f"b:t{i}"
            finished.append((i, trio.current_time()))

        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(ask, i)
    assert sorted(finished, key=lambda x: x[1]) == [(i, 10.0 - i) for i in reversed(range(10))]


async def test_handle_now_answers_inline_without_a_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    handler = TopicHandler("b")
    async with connected(None, handler) as (a, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.request, CreateTopicRequest("slow", 5))
            await trio.testing.wait_all_tasks_blocked()
            assert handler.running == 1

            counter = SpawnCounter()
            trio.lowlevel.add_instrument(counter)
            try:
                assert await a.request(HeartbeatRequest("g", "m", 1)) == HeartbeatResponse()
                inline_spawns = counter.spawned
                await a.request(CreateTopicRequest("quick", 0))
                task_spawns = counter.spawned - inline_spawns
            finally:
                trio.lowlevel.remove_instrument(counter)
            # Answered while the slow request is still running, at time 0, in no task.
            assert trio.current_time() == 0
            assert inline_spawns == 0
            assert task_spawns == 1
            assert [type(b).__name__ for b in handler.handled] == ["CreateTopicRequest"] * 2
        assert trio.current_time() == 5


# -- errors from handlers -----------------------------------------------------------------------


class FailingHandler(RequestHandler):
    """Raises what the request names: inline for heartbeats, in a task otherwise."""

    def handle_now(self, body: RequestBody) -> ResponseBody | None:
        if isinstance(body, HeartbeatRequest):
            if body.member_id == "plain":
                raise RuntimeError("inline boom")
            raise UnknownMemberError(f"member {body.member_id} is unknown; rejoin the group")
        return None

    async def handle(self, body: RequestBody) -> ResponseBody:
        assert isinstance(body, CreateTopicRequest)
        await trio.sleep(1)
        if body.name == "plain":
            raise ValueError("task boom")
        if body.name == "ok":
            return CreateTopicResponse(TopicInfo("ok", 1))
        raise UnknownMemberError(f"no member named {body.name}")


async def test_coord_error_from_a_handler_reaches_the_peer_typed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(None, FailingHandler()) as (a, _, _):
        with pytest.raises(UnknownMemberError) as info:
            await a.request(CreateTopicRequest("m-7", 1))
        assert str(info.value) == "no member named m-7"
        assert info.value.code is ErrorCode.UNKNOWN_MEMBER_ID
        assert trio.current_time() == 1

        with pytest.raises(UnknownMemberError, match=r"^member m-8 is unknown; rejoin the group$"):
            await a.request(HeartbeatRequest("g", "m-8", 1))
        assert trio.current_time() == 1
        assert not a.closed


async def test_plain_exception_becomes_unknown_server_error_and_connection_lives(
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    caplog.set_level(logging.ERROR, logger="trio_coord.protocol.connection")
    async with connected(None, FailingHandler()) as (a, b, _):
        with pytest.raises(UnknownServerError, match="ValueError: task boom"):
            await a.request(CreateTopicRequest("plain", 1))
        with pytest.raises(UnknownServerError, match="RuntimeError: inline boom"):
            await a.request(HeartbeatRequest("g", "plain", 1))
        # Both connections carry on.
        response = await a.request(CreateTopicRequest("ok", 1))
        assert response == CreateTopicResponse(TopicInfo("ok", 1))
        assert not a.closed
        assert not b.closed
        assert trio.current_time() == 2
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(logged) == 2
    assert all(r.exc_info is not None for r in logged)


async def test_default_handler_refuses_every_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected() as (a, _, _):
        with pytest.raises(UnsupportedMessageError, match="CreateTopicRequest is not accepted"):
            await a.request(CreateTopicRequest("t", 1))
        assert not a.closed


class OversizedHandler(RequestHandler):
    """Answers with a body too large for a frame, inline or in a task; or fails verbosely."""

    BIG = OffsetFetchResponse([PartitionOffset("t", p, p, "m" * 100) for p in range(20)])

    def handle_now(self, body: RequestBody) -> ResponseBody | None:
        return self.BIG if isinstance(body, OffsetFetchRequest) else None

    async def handle(self, body: RequestBody) -> ResponseBody:
        if isinstance(body, DescribeGroupRequest):
            raise UnknownMemberError(f"no member in {body.group!r}; known: " + "m, " * 1000)
        if isinstance(body, HeartbeatRequest):
            return HeartbeatResponse()
        return self.BIG


async def test_answer_too_large_for_a_frame_is_an_error_not_a_crash(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The answering side must not let FrameTooLargeError escape its reader or handler
    # task (on a broker that would take down every connection): the asker gets the error.
    async with connected(None, OversizedHandler(), max_frame_size=1024) as (a, b, _):
        with pytest.raises(FrameTooLargeError, match="exceeds the maximum frame size of 1024"):
            await a.request(OffsetFetchRequest("g"))  # inline
        with pytest.raises(FrameTooLargeError, match="exceeds the maximum frame size of 1024"):
            await a.request(StartFetchersRequest("g", "m", 1, []))  # in a task
        # An error whose message alone is too large still reaches the asker, by its code.
        with pytest.raises(UnknownMemberError) as info:
            await a.request(DescribeGroupRequest("g"))
        assert str(info.value) == hint(ErrorCode.UNKNOWN_MEMBER_ID)
        assert await a.request(HeartbeatRequest("g", "m", 1)) == HeartbeatResponse()
        assert not a.closed
        assert not b.closed


async def test_request_too_large_for_a_frame_fails_locally(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(None, TopicHandler("b")) as (a, _, _):
        a._codec.max_frame_size = 64
        with pytest.raises(FrameTooLargeError):
            await a.request(CreateTopicRequest("t" * 100, 1))
        response = await a.request(CreateTopicRequest("t", 1))
        assert isinstance(response, CreateTopicResponse)
        assert not a.closed


async def test_unknown_error_code_from_a_newer_peer_is_a_plain_coord_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream_a, raw = trio.testing.memory_stream_pair()
    a = Connection(stream_a, name="a")
    codec = FrameCodec()
    reader = FrameReader(raw, DEFAULT_MAX_FRAME_SIZE)

    async def newer_peer() -> None:
        for answer in (
            lambda corr: [2, corr, 4242, "a code from the future"],
            lambda corr: [2, corr, 0, "", [5]],
        ):
            body = await reader.read_frame()
            assert body is not None
            request = codec.decode(body)
            assert isinstance(request, Request)
            data = msgspec.msgpack.encode(answer(request.corr_id))
            await raw.send_all(len(data).to_bytes(HEADER_SIZE, "big") + data)

    async with serving(a), trio.open_nursery() as nursery:
        nursery.start_soon(newer_peer)
        with pytest.raises(CoordError) as info:
            await a.request(HeartbeatRequest("g", "m", 1))
        assert type(info.value) is CoordError
        assert str(info.value) == "a code from the future"
        assert await a.request(HeartbeatRequest("g", "m", 1)) == HeartbeatResponse()
        assert not a.closed


# -- closing ----------------------------------------------------------------------------------


async def test_close_fails_the_peers_pending_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    handler_b = TopicHandler("b")
    async with connected(None, handler_b) as (a, b, _):
        errors: list[BaseException] = []

        async def ask(seconds: int) -> None:
            with pytest.raises(ConnectionClosedError) as info:
                await a.request(CreateTopicRequest("never", seconds))
            errors.append(info.value)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, 100)
            nursery.start_soon(ask, 200)
            await trio.sleep(3)
            assert handler_b.running == 2
            await b.aclose()
            with trio.fail_after(1):
                await a.wait_closed()
                await b.wait_closed()
        assert len(errors) == 2
        assert trio.current_time() == 3
        assert a.closed
        assert b.closed
        # b's in-flight handler tasks were cancelled, not left running.
        await trio.testing.wait_all_tasks_blocked()
        assert handler_b.cancelled == 2
        assert handler_b.running == 0
        # Requests after the close fail at once.
        with pytest.raises(ConnectionClosedError):
            await a.request(HeartbeatRequest("g", "m", 1))
        with pytest.raises(ConnectionClosedError):
            await b.request(HeartbeatRequest("g", "m", 1))


async def test_serve_returns_normally_when_the_peer_disconnects(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream_a, raw = trio.testing.memory_stream_pair()
    lost: list[float] = []

    class Handler(RequestHandler):
        def connection_lost(self) -> None:
            lost.append(trio.current_time())

    a = Connection(stream_a, Handler(), name="a")

    async def pending() -> None:
        with pytest.raises(ConnectionClosedError, match="connection to a closed"):
            await a.request(HeartbeatRequest("g", "m", 1))

    # The nursery exits without error: serve returns normally on the peer's disconnect.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.serve)
        nursery.start_soon(pending)
        await trio.sleep(2)
        await raw.aclose()
    assert lost == [2.0]
    assert a.closed
    assert trio.current_time() == 2


# -- the in-flight bound ---------------------------------------------------------------------------


async def test_max_in_flight_bounds_concurrent_handler_tasks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    handler = TopicHandler("b")
    finished: list[float] = []

    async def ask(i: int) -> None:
        await a.request(CreateTopicRequest(f"t{i}", 1))
        finished.append(trio.current_time())

    async with connected(None, handler, max_in_flight=3) as (a, _, _):
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(ask, i)
            await trio.testing.wait_all_tasks_blocked()
            assert handler.running == 3
    assert handler.peak == 3
    assert len(handler.handled) == 10
    assert finished == [1.0] * 3 + [2.0] * 3 + [3.0] * 3 + [4.0]


# -- protocol violations ----------------------------------------------------------------------


async def test_garbage_frame_gets_a_goodbye_and_fails_the_peers_pending_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    handler_b = TopicHandler("b")
    async with connected(None, handler_b) as (a, b, stream_a):
        async with trio.open_nursery() as nursery:

            async def pending() -> None:
                with pytest.raises(CorruptMessageError, match="undecodable frame") as info:
                    await a.request(CreateTopicRequest("waits", 100))
                assert info.value.code is ErrorCode.CORRUPT_MESSAGE
                assert trio.current_time() == 1

            nursery.start_soon(pending)
            await trio.sleep(1)
            # Bypass a's codec: a frame of one reserved msgpack byte.
            await stream_a.send_all(b"\x00\x00\x00\x01\xc1")
            with trio.fail_after(1):
                await b.wait_closed()
                await a.wait_closed()
        assert handler_b.cancelled == 1
        with pytest.raises(CorruptMessageError):
            await a.request(HeartbeatRequest("g", "m", 1))


@pytest.mark.parametrize(
    ("data", "code", "message"),
    [
        (b"\x00\x00\x00\x01\xc1", ErrorCode.CORRUPT_MESSAGE, "undecodable frame"),
        (b"\x00\x00\x00\x02\x91\x01", ErrorCode.CORRUPT_MESSAGE, "invalid message"),
        (b"\xff\xff\xff\xff", ErrorCode.FRAME_TOO_LARGE, "4294967295 bytes exceeds"),
        (b"\x00\x10\x00\x01", ErrorCode.FRAME_TOO_LARGE, "1048577 bytes exceeds"),
        (b"\x00\x00\x00\x02\x91\x09", ErrorCode.UNSUPPORTED_MESSAGE, "unknown message type"),
        (b"\x00\x00\x00\x03\x92\x01\x01", ErrorCode.CORRUPT_MESSAGE, "invalid message"),
        # What a hostile broker could answer a client: a response with a trailing field
        # nested 1,000 deep, and one whose message is not UTF-8.
        (
            (1006).to_bytes(4, "big") + b"\x96\x02\x01\x00\xa0\xc0" + b"\x91" * 1000 + b"\xc0",
            ErrorCode.CORRUPT_MESSAGE,
            "RecursionError",
        ),
        (b"\x00\x00\x00\x06\x94\x02\x01\x00\xa1\xff", ErrorCode.CORRUPT_MESSAGE, "UnicodeDecode"),
    ],
    ids=[
        "bad-msgpack",
        "short-frame",
        "4GiB",
        "max+1",
        "unknown-tag",
        "missing-body",
        "nested-1000-deep",
        "invalid-utf8",
    ],
)
async def test_protocol_violation_is_answered_by_one_goodbye_then_close(
    data: bytes, code: ErrorCode, message: str, autojump_clock: trio.testing.MockClock
) -> None:
    stream, raw = trio.testing.memory_stream_pair()
    conn = Connection(stream, TopicHandler("b"), name="b")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.serve)
        await raw.send_all(data)  # never followed by a body: the stream stays open
        with trio.fail_after(5):
            frames = await _read_frames(raw)
        await conn.wait_closed()
    assert len(frames) == 1
    goodbye = frames[0]
    assert isinstance(goodbye, Goodbye)
    assert goodbye.error == code
    assert message in goodbye.message
    assert trio.current_time() == 0


async def test_truncated_frame_then_eof_is_answered_by_a_goodbye(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream, raw = trio.testing.memory_stream_pair()
    conn = Connection(stream, name="b")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.serve)
        await raw.send_all(b"\x00\x00\x00\x10abc")
        await raw.send_eof()
        with trio.fail_after(5):
            frames = await _read_frames(raw)
    assert frames == [Goodbye(ErrorCode.CORRUPT_MESSAGE, frames[0].message)]
    assert "stream ended inside a frame (3 of 16 bytes)" in frames[0].message


async def test_goodbye_from_the_peer_fails_pending_requests_with_its_code(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream_a, raw = trio.testing.memory_stream_pair()
    a = Connection(stream_a, name="a")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.serve)

        async def pending() -> None:
            with pytest.raises(UnsupportedMessageError, match=r"^go away$"):
                await a.request(HeartbeatRequest("g", "m", 1))

        nursery.start_soon(pending)
        await trio.sleep(1)
        await raw.send_all(FrameCodec().encode(Goodbye(ErrorCode.UNSUPPORTED_MESSAGE, "go away")))
        with trio.fail_after(1):
            await a.wait_closed()
    assert a.closed


async def test_response_to_an_unknown_correlation_id_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream_a, raw = trio.testing.memory_stream_pair()
    a = Connection(stream_a, name="a")
    codec = FrameCodec()
    async with serving(a), trio.open_nursery() as nursery:

        async def peer() -> None:
            reader = FrameReader(raw, DEFAULT_MAX_FRAME_SIZE)
            body = await reader.read_frame()
            assert body is not None
            request = codec.decode(body)
            assert isinstance(request, Request)
            stray = Response(request.corr_id + 1000, ErrorCode.NONE, "", HeartbeatResponse())
            await raw.send_all(codec.encode(stray))
            await trio.sleep(1)
            await raw.send_all(
                codec.encode(Response(request.corr_id, ErrorCode.NONE, "", HeartbeatResponse()))
            )

        nursery.start_soon(peer)
        assert await a.request(HeartbeatRequest("g", "m", 1)) == HeartbeatResponse()
        assert trio.current_time() == 1
        assert not a.closed


async def test_a_send_interrupted_mid_frame_closes_the_connection(autojump_clock):
    # Lockstep: send_all blocks until the peer reads, and the peer never does.
    ours, _theirs = trio.testing.lockstep_stream_pair()
    conn = Connection(ours, name="stuck")
    with trio.move_on_after(1.0):
        await conn.request(HeartbeatRequest("g", "m", 1))
    # Part of that frame may be on the wire: the connection must not carry another.
    assert conn.closed
    with pytest.raises(ConnectionClosedError, match="interrupted"):
        await conn.request(HeartbeatRequest("g", "m", 1))


async def test_a_request_cancelled_before_its_first_byte_leaves_the_connection_open():
    # A rebalance restart cancels the pushes it had in flight. A push handed the
    # write lock, then cancelled before it ran again, has sent nothing: it must not
    # cost the member its connection (it did, to every member being pushed to).
    async with connected(handler_b=TopicHandler("b")) as (a, _b, _raw):
        scope = trio.CancelScope()

        async def push() -> None:
            with scope:
                await a.request(HeartbeatRequest("g", "m", 1))

        async with trio.open_nursery() as nursery:
            await a._lock_sending()
            nursery.start_soon(push)
            await trio.testing.wait_all_tasks_blocked()  # push waits for the lock
            a._unlock_sending()
            scope.cancel()  # the lock is already push's, it has not run since
        assert scope.cancelled_caught
        assert not a.closed
        assert await a.request(HeartbeatRequest("g", "m", 1)) == HeartbeatResponse()
