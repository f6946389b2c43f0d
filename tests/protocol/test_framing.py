"""FrameReader and FrameCodec: reassembly, size limits, truncation, EOF and decode errors."""

from __future__ import annotations

import msgspec
import pytest
import trio
import trio.testing

from trio_coord.protocol.errors import (
    CorruptMessageError,
    ErrorCode,
    FrameTooLargeError,
    UnsupportedMessageError,
)
from trio_coord.protocol.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    FrameCodec,
    FrameReader,
    TruncatedFrameError,
)
from trio_coord.protocol.messages import (
    CreateTopicRequest,
    Goodbye,
    HeartbeatRequest,
    PartitionOffset,
    Request,
    Response,
)

FRAMES = [
    Request(1, CreateTopicRequest("orders", 12)),
    Response(1, ErrorCode.TOPIC_ALREADY_EXISTS, "orders exists", None),
    Request(
        2,
        HeartbeatRequest("g", "m-1", 3, [PartitionOffset("orders", p, p * 10) for p in range(20)]),
    ),
    Goodbye(ErrorCode.CORRUPT_MESSAGE, "bye"),
]


def _header(size: int) -> bytes:
    return size.to_bytes(HEADER_SIZE, "big")


def _wire(frames: list[object] = FRAMES) -> bytes:
    codec = FrameCodec()
    return b"".join(codec.encode(f) for f in frames)


class CountingReceiveStream(trio.abc.ReceiveStream):
    """Wraps a receive stream and records the size of every chunk it returned."""

    def __init__(self, inner: trio.abc.ReceiveStream) -> None:
        self.inner = inner
        self.chunks: list[int] = []

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self.chunks.append(len(data))
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _read_all(reader: FrameReader, codec: FrameCodec) -> list[object]:
    frames = []
    while (body := await reader.read_frame()) is not None:
        frames.append(codec.decode(body))
    return frames


# -- reassembly -------------------------------------------------------------------------------


async def test_frames_sent_one_byte_at_a_time_reassemble() -> None:
    # A lockstep stream hands each send_all to exactly one receive_some, so one-byte sends
    # reach the reader as one-byte chunks.
    send, receive = trio.testing.lockstep_stream_pair()
    counting = CountingReceiveStream(receive)
    reader = FrameReader(counting, DEFAULT_MAX_FRAME_SIZE)
    wire = _wire()

    async def trickle() -> None:
        for i in range(len(wire)):
            await send.send_all(wire[i : i + 1])
        await send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        frames = await _read_all(reader, FrameCodec())

    assert frames == FRAMES
    assert counting.chunks[:-1] == [1] * len(wire)
    assert counting.chunks[-1] == 0  # the clean end of stream


async def test_frames_in_uneven_chunks_across_boundaries_reassemble() -> None:
    # Chunks of 3, 5 and 7 bytes so that headers and bodies are split at every offset.
    stream = trio.testing.MemoryReceiveStream()
    wire = _wire()
    sizes = [3, 5, 7]
    pos, i = 0, 0
    pieces = []
    while pos < len(wire):
        pieces.append(wire[pos : pos + sizes[i % 3]])
        pos += sizes[i % 3]
        i += 1
    queue = list(pieces)

    async def one_piece_per_receive() -> None:
        if queue:
            stream.put_data(queue.pop(0))
        else:
            stream.put_eof()

    stream.receive_some_hook = one_piece_per_receive
    reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
    assert await _read_all(reader, FrameCodec()) == FRAMES
    assert not queue


async def test_many_frames_in_one_chunk_are_read_one_by_one() -> None:
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(_wire())
    stream.put_eof()
    reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
    codec = FrameCodec()
    for expected in FRAMES:
        body = await reader.read_frame()
        assert body is not None
        assert codec.decode(body) == expected
    assert await reader.read_frame() is None


async def test_frames_over_memory_stream_pair() -> None:
    a, b = trio.testing.memory_stream_pair()
    codec = FrameCodec()
    for frame in FRAMES:
        await a.send_all(codec.encode(frame))
    await a.send_eof()
    assert await _read_all(FrameReader(b, DEFAULT_MAX_FRAME_SIZE), codec) == FRAMES


async def test_empty_frame_body_is_returned_and_then_corrupt_to_decode() -> None:
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(_header(0))
    stream.put_eof()
    reader = FrameReader(stream, 16)
    assert await reader.read_frame() == b""
    assert await reader.read_frame() is None
    with pytest.raises(CorruptMessageError):
        FrameCodec().decode(b"")


# -- size limit -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0xFFFFFFFF, 2**31, 65])
async def test_oversized_length_fails_before_the_body(size: int, autojump_clock: object) -> None:
    # Only the header is ever sent and the stream stays open: had the reader waited for
    # the body, fail_after would fire (virtual time would advance).
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(_header(size))
    reader = FrameReader(stream, 64)
    with trio.fail_after(10):
        with pytest.raises(FrameTooLargeError, match=f"frame of {size} bytes") as info:
            await reader.read_frame()
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert trio.current_time() == 0


async def test_max_plus_one_fails_and_exactly_max_is_read(autojump_clock: object) -> None:
    limit = 64
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(_header(limit) + b"x" * limit)
    reader = FrameReader(stream, limit)
    assert await reader.read_frame() == b"x" * limit

    stream.put_data(_header(limit + 1))
    with trio.fail_after(10):
        with pytest.raises(
            FrameTooLargeError, match="65 bytes exceeds the maximum frame size of 64"
        ):
            await reader.read_frame()
    assert trio.current_time() == 0


async def test_default_limit_refuses_four_gigabytes(autojump_clock: object) -> None:
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(b"\xff\xff\xff\xff")
    with trio.fail_after(10), pytest.raises(FrameTooLargeError):
        await FrameReader(stream, DEFAULT_MAX_FRAME_SIZE).read_frame()
    assert trio.current_time() == 0


# -- truncation and EOF -------------------------------------------------------------------------


@pytest.mark.parametrize("header_bytes", [1, 2, 3])
async def test_stream_ending_inside_the_header_is_truncated(header_bytes: int) -> None:
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(_header(10)[:header_bytes])
    stream.put_eof()
    with pytest.raises(
        TruncatedFrameError, match=f"header \\({header_bytes} of 4 bytes\\)"
    ) as info:
        await FrameReader(stream, 64).read_frame()
    assert info.value.code is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("body_bytes", [0, 1, 9])
async def test_stream_ending_inside_the_body_is_truncated(body_bytes: int) -> None:
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(_header(10) + b"y" * body_bytes)
    stream.put_eof()
    with pytest.raises(TruncatedFrameError, match=f"\\({body_bytes} of 10 bytes\\)"):
        await FrameReader(stream, 64).read_frame()


async def test_truncation_after_whole_frames() -> None:
    stream = trio.testing.MemoryReceiveStream()
    wire = _wire()
    stream.put_data(wire[:-1])
    stream.put_eof()
    reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
    codec = FrameCodec()
    for expected in FRAMES[:-1]:
        body = await reader.read_frame()
        assert body is not None
        assert codec.decode(body) == expected
    with pytest.raises(TruncatedFrameError):
        await reader.read_frame()


async def test_clean_eof_between_frames_returns_none() -> None:
    stream = trio.testing.MemoryReceiveStream()
    codec = FrameCodec()
    stream.put_data(codec.encode(FRAMES[0]))
    stream.put_eof()
    reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
    body = await reader.read_frame()
    assert body is not None
    assert codec.decode(body) == FRAMES[0]
    assert await reader.read_frame() is None


async def test_clean_eof_on_an_empty_stream_returns_none() -> None:
    stream = trio.testing.MemoryReceiveStream()
    stream.put_eof()
    assert await FrameReader(stream, 64).read_frame() is None


# -- decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # a reserved msgpack opcode
        b"\x93\x01",  # an array of 3 with only one element
        b"\xa5ab",  # a str of 5 with 2 bytes
        msgspec.msgpack.encode([1, 2, [2, "orders", 3]]) + b"\x00",  # trailing bytes
        msgspec.msgpack.encode("not a frame"),
        msgspec.msgpack.encode([]),
        msgspec.msgpack.encode([1, "corr-id", [2, "orders", 3]]),
        msgspec.msgpack.encode([1, 2, [2, "orders", "three"]]),
    ],
    ids=[
        "reserved-opcode",
        "short-array",
        "short-str",
        "trailing",
        "str",
        "empty",
        "bad-corr-id",
        "bad-field",
    ],
)
def test_malformed_body_is_corrupt(body: bytes) -> None:
    with pytest.raises(CorruptMessageError) as info:
        FrameCodec().decode(body)
    assert type(info.value) is CorruptMessageError
    assert info.value.code is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize(
    "frame",
    [
        [9, 1, 2],  # unknown frame type
        [1, 7, [99, "x"]],  # a request of an unknown type
        [2, 7, 0, "", [99]],  # a response of an unknown type
    ],
    ids=["frame", "request-body", "response-body"],
)
def test_unknown_tag_is_unsupported(frame: list[object]) -> None:
    with pytest.raises(UnsupportedMessageError, match="unknown message type") as info:
        FrameCodec().decode(msgspec.msgpack.encode(frame))
    assert info.value.code is ErrorCode.UNSUPPORTED_MESSAGE


def test_codec_decodes_memoryview_and_bytearray() -> None:
    codec = FrameCodec()
    body = codec.encode(FRAMES[0])[HEADER_SIZE:]
    assert codec.decode(memoryview(body)) == FRAMES[0]
    assert codec.decode(bytearray(body)) == FRAMES[0]


# -- encoding ----------------------------------------------------------------------------------


def test_encode_refuses_a_frame_over_the_max_and_keeps_working() -> None:
    codec = FrameCodec(max_frame_size=64)
    small = Request(1, CreateTopicRequest("orders", 3))
    big = Request(2, CreateTopicRequest("o" * 100, 3))
    with pytest.raises(FrameTooLargeError, match="exceeds the maximum frame size of 64 bytes"):
        codec.encode(big)
    wire = codec.encode(small)
    assert int.from_bytes(wire[:HEADER_SIZE], "big") == len(wire) - HEADER_SIZE
    assert codec.decode(wire[HEADER_SIZE:]) == small


def test_encode_accepts_exactly_max_and_refuses_one_more() -> None:
    base = len(FrameCodec().encode(Request(1, CreateTopicRequest("", 3)))) - HEADER_SIZE
    limit = base + 20  # a 20-character name fits exactly (str8 header from 32 chars on)
    codec = FrameCodec(max_frame_size=limit)
    exact = codec.encode(Request(1, CreateTopicRequest("n" * 20, 3)))
    assert len(exact) == HEADER_SIZE + limit
    with pytest.raises(FrameTooLargeError, match=f"frame of {limit + 1} bytes"):
        codec.encode(Request(1, CreateTopicRequest("n" * 21, 3)))


def test_a_large_encoded_frame_is_the_caller_s_and_later_encodes_leave_it_alone() -> None:
    # A frame over 64 KiB is handed over, not copied: the codec (one per broker, shared by
    # every connection) must not write into it again while it waits to be sent.
    codec = FrameCodec(max_frame_size=1 << 20)
    first = Request(1, CreateTopicRequest("a" * 100_000, 3))
    wire = codec.encode(first)
    kept = bytes(wire)
    for frame in (Request(2, CreateTopicRequest("b" * 200_000, 3)), *FRAMES):
        again = codec.encode(frame)
        assert again is not wire
        assert codec.decode(again[HEADER_SIZE:]) == frame
    assert wire == kept
    assert codec.decode(wire[HEADER_SIZE:]) == first


async def test_encoded_frames_are_refused_by_a_reader_with_a_smaller_limit() -> None:
    wire = FrameCodec().encode(FRAMES[2])
    stream = trio.testing.MemoryReceiveStream()
    stream.put_data(wire)
    with pytest.raises(FrameTooLargeError):
        await FrameReader(stream, len(wire) - HEADER_SIZE - 1).read_frame()


async def test_a_tcp_reader_waits_for_readability_and_reports_a_closed_socket() -> None:
    # Between frames a reader on TCP waits for the socket before it receives (a broker's
    # idle connections suspend less that way). A frame arriving in two pieces is read
    # whole; a stream closed locally before the next read is ClosedResourceError, as
    # receive_some says it, not an error of the wait.
    frame = FrameCodec().encode(Request(1, HeartbeatRequest("g", "m", 1)))
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, _send_in_two_pieces(frame), 0)
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
        assert await reader.read_frame() == frame[HEADER_SIZE:]
        await stream.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await reader.read_frame()
        nursery.cancel_scope.cancel()


def _send_in_two_pieces(frame: bytes):  # (the handler trio.serve_tcp runs per connection)
    async def serve(stream: trio.SocketStream) -> None:
        await stream.send_all(frame[:3])
        await trio.sleep(0.05)
        await stream.send_all(frame[3:])
        await trio.sleep_forever()

    return serve
