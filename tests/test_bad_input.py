"""Invariant 6 (Bounded) against a real broker: bad input costs only its own connection.

Each test opens a real broker on 127.0.0.1 and a well-behaved admin client, then misbehaves
on a raw socket. The broker must answer the bad connection (a Goodbye, or an error Response
where the frame itself was valid), close only that one, and keep serving the bystander that
was connected all along and a client that connects afterwards. Real sockets: no autojump
clock; every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_coord.broker.server import Broker, open_broker
from trio_coord.client.admin import Admin, open_admin
from trio_coord.client.consumer import open_consumer
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.errors import (
    ErrorCode,
    FrameTooLargeError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTopicError,
    OffsetMetadataTooLargeError,
)
from trio_coord.protocol.framing import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, FrameCodec, FrameReader
from trio_coord.protocol.messages import (
    Goodbye,
    HeartbeatRequest,
    JoinGroupRequest,
    ListOffsetsRequest,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    ProduceRequest,
    Request,
    ResetOffsetsRequest,
    Response,
    StartFetchersRequest,
    TopicInfo,
    TopicPartition,
)
from trio_coord.protocol.records import (
    COMPRESSION,
    MAX_BATCH_BYTES,
    WireRecord,
    check_batch,
    decode_batch,
    decode_untracked,
    encode_batch,
)

TIMEOUT = 5


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(HEADER_SIZE, "big") + payload


async def _read_until_closed(stream: trio.SocketStream) -> list[object]:
    """Every frame the broker sends until it closes the connection."""
    codec = FrameCodec()
    reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
    frames = []
    while (body := await reader.read_frame()) is not None:
        frames.append(codec.decode(body))
    return frames


async def _read_one(reader: FrameReader) -> object:
    body = await reader.read_frame()
    assert body is not None, "the broker closed the connection"
    return FrameCodec().decode(body)


async def _wait_connections(broker: Broker, count: int) -> None:
    # The broker exposes only a count (no event to wait on), so poll; callers bound it.
    while broker.connection_count() != count:
        await trio.sleep(0.01)


async def _still_served(broker: Broker, bystander: Admin, topic: str) -> None:
    """The bystander connected all along, and a brand-new client, are both served."""

    def bare(infos: list[TopicInfo]) -> list[TopicInfo]:
        return [msgspec.structs.replace(t, topic_id="") for t in infos]  # (ids are random)

    assert bare([await bystander.create_topic(topic, 2)]) == [TopicInfo(topic, 2)]
    assert TopicInfo(topic, 2) in bare(await bystander.list_topics())
    async with open_admin(broker.bootstrap) as fresh:
        assert TopicInfo(topic, 2) in bare(await fresh.list_topics())
        fresh_one = await fresh.create_topic(f"{topic}-fresh", 1)
        assert bare([fresh_one]) == [TopicInfo(f"{topic}-fresh", 1)]
    assert TopicInfo(f"{topic}-fresh", 1) in bare(await bystander.list_topics())


GOODBYE_CASES = [
    pytest.param(b"\xff\xff\xff\xff", ErrorCode.FRAME_TOO_LARGE, "4294967295 bytes", id="4GiB"),
    pytest.param(
        (DEFAULT_MAX_FRAME_SIZE + 1).to_bytes(HEADER_SIZE, "big"),
        ErrorCode.FRAME_TOO_LARGE,
        f"{DEFAULT_MAX_FRAME_SIZE + 1} bytes exceeds the maximum frame size",
        id="max+1",
    ),
    pytest.param(_frame(b"\xc1\xc1\xc1"), ErrorCode.CORRUPT_MESSAGE, "malformed", id="bad-msgpack"),
    pytest.param(
        _frame(msgspec.msgpack.encode({"corr_id": 1})),
        ErrorCode.CORRUPT_MESSAGE,
        "invalid message",
        id="not-an-array",
    ),
    pytest.param(
        _frame(msgspec.msgpack.encode([77, 1, "?"])),
        ErrorCode.UNSUPPORTED_MESSAGE,
        "unknown message type",
        id="unknown-frame-tag",
    ),
    pytest.param(
        # A heartbeat with a trailing field nested 1,000 deep (msgspec skips unknown
        # trailing fields, and skipping recurses): this one frame used to end the broker.
        _frame(b"\x93\x01\x01\x96\x05\xa1g\xa1m\x01\x90" + b"\x91" * 1000 + b"\xc0"),
        ErrorCode.CORRUPT_MESSAGE,
        "RecursionError",
        id="nested-1000-deep",
    ),
    pytest.param(
        _frame(b"\x93\x01\x01\x95\x05\xa1\xff\xa1m\x01\x90"),  # a group id not UTF-8
        ErrorCode.CORRUPT_MESSAGE,
        "UnicodeDecodeError",
        id="invalid-utf8",
    ),
    pytest.param(
        _frame(msgspec.msgpack.encode([1, 1, [99, "x"]])),
        ErrorCode.UNSUPPORTED_MESSAGE,
        "unknown message type",
        id="unknown-request-tag",
    ),
]


@pytest.mark.parametrize(("data", "code", "message"), GOODBYE_CASES)
async def test_bad_frame_gets_a_goodbye_and_costs_only_its_connection(
    tmp_path: Path, data: bytes, code: ErrorCode, message: str
) -> None:
    async with open_broker(tmp_path, port=0) as broker, open_admin(broker.bootstrap) as bystander:
        with trio.fail_after(TIMEOUT):
            await _wait_connections(broker, 1)
            stream = await trio.open_tcp_stream(*broker.address)
            await _wait_connections(broker, 2)
            # Only this is ever sent (for an oversized length: no body at all), and our side
            # stays open: the broker must answer and close on what it has.
            await stream.send_all(data)
            frames = await _read_until_closed(stream)
            assert len(frames) == 1, frames
            goodbye = frames[0]
            assert isinstance(goodbye, Goodbye)
            assert goodbye.error == code
            assert message in goodbye.message
            await _wait_connections(broker, 1)
            await stream.aclose()
            await _still_served(broker, bystander, "after-goodbye")


@pytest.mark.parametrize(
    "data",
    [b"\x00\x00", _frame(msgspec.msgpack.encode([1, 1, [1]]))[:-1]],
    ids=["inside-header", "inside-body"],
)
async def test_truncated_frame_then_half_close_gets_a_goodbye(tmp_path: Path, data: bytes) -> None:
    async with open_broker(tmp_path, port=0) as broker, open_admin(broker.bootstrap) as bystander:
        with trio.fail_after(TIMEOUT):
            stream = await trio.open_tcp_stream(*broker.address)
            await stream.send_all(data)
            await stream.send_eof()
            frames = await _read_until_closed(stream)
            assert len(frames) == 1, frames
            assert isinstance(frames[0], Goodbye)
            assert frames[0].error == ErrorCode.CORRUPT_MESSAGE
            assert "stream ended inside a frame" in frames[0].message
            await _wait_connections(broker, 1)
            await stream.aclose()
            await _still_served(broker, bystander, "after-truncation")


async def test_truncated_frame_then_close_costs_only_its_connection(tmp_path: Path) -> None:
    async with open_broker(tmp_path, port=0) as broker, open_admin(broker.bootstrap) as bystander:
        with trio.fail_after(TIMEOUT):
            await _wait_connections(broker, 1)
            stream = await trio.open_tcp_stream(*broker.address)
            await _wait_connections(broker, 2)
            await stream.send_all(b"\x00\x00\x01\x00" + b"\x93" + b"\x01" * 10)
            await stream.aclose()
            await _wait_connections(broker, 1)
            await _still_served(broker, bystander, "after-close")


async def test_request_the_broker_does_not_accept_gets_an_error_response(tmp_path: Path) -> None:
    # StartFetchers is valid on the wire but only a coordinator sends it: the broker answers
    # that request with UNSUPPORTED_MESSAGE and the connection stays usable.
    codec = FrameCodec()
    async with open_broker(tmp_path, port=0) as broker, open_admin(broker.bootstrap) as bystander:
        with trio.fail_after(TIMEOUT):
            stream = await trio.open_tcp_stream(*broker.address)
            reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
            await _wait_connections(broker, 2)
            partitions = [PartitionOffset("orders", 0, 5)]
            await stream.send_all(
                codec.encode(Request(41, StartFetchersRequest("g", "m-1", 3, partitions)))
            )
            answer = await _read_one(reader)
            assert isinstance(answer, Response)
            assert answer.corr_id == 41
            assert answer.error == ErrorCode.UNSUPPORTED_MESSAGE
            assert "does not accept StartFetchersRequest" in answer.message
            assert answer.body is None

            # The same connection is still served.
            await stream.send_all(codec.encode(Request(42, MetadataRequest())))
            answer = await _read_one(reader)
            assert isinstance(answer, Response)
            assert (answer.corr_id, answer.error) == (42, ErrorCode.NONE)
            assert isinstance(answer.body, MetadataResponse)
            assert broker.connection_count() == 2

            await _still_served(broker, bystander, "after-unsupported")
            await stream.aclose()
            await _wait_connections(broker, 1)


async def test_answer_too_large_for_a_frame_is_an_error_not_a_broker_crash(
    tmp_path: Path,
) -> None:
    # Regression: each commit fits in a frame, but an OffsetFetch answer naming all of
    # them does not. The asker must get FRAME_TOO_LARGE; the broker must keep running
    # (the error used to escape the connection's reader into the broker's nursery).
    # Offsets are paged now, named or not; an answer that is not paged (ListOffsets of
    # one partition named again and again) still gets the error.
    async with (
        open_broker(tmp_path, port=0, max_frame_size=2048) as broker,
        open_admin(broker.bootstrap) as bystander,
    ):
        with trio.fail_after(TIMEOUT):
            await bystander.create_topic("wide", 3)
            async with open_connection(*broker.address) as conn:
                for p in range(3):
                    offset = PartitionOffset("wide", p, 10 + p, "m" * 1000)
                    await conn.request(OffsetCommitRequest("g", "", -1, [offset]))
                with pytest.raises(FrameTooLargeError):
                    await conn.request(ListOffsetsRequest([TopicPartition("wide", 0)] * 230))
                every = [TopicPartition("wide", p) for p in range(3)]
                for named in (None, every):
                    first = await conn.request(OffsetFetchRequest("g", named))
                    assert isinstance(first, OffsetFetchResponse) and first.next is not None
                    assert len(first.offsets) < 3
                answer = await conn.request(OffsetFetchRequest("g", [TopicPartition("wide", 1)]))
                assert isinstance(answer, OffsetFetchResponse)
                assert [(o.partition, o.offset) for o in answer.offsets] == [(1, 11)]
            await _still_served(broker, bystander, "after-too-large")


async def test_compressed_batch_that_inflates_past_the_limit_is_refused(tmp_path: Path) -> None:
    # A decompression bomb: 64 KiB on the wire, 65 MiB of records once inflated. The broker
    # must refuse it as INVALID_RECORD without inflating it whole, and keep serving.
    inflated = msgspec.msgpack.encode([WireRecord(0, None, bytes(MAX_BATCH_BYTES + 2**20))])
    bomb = bytes((COMPRESSION["zlib"][0],)) + zlib.compress(inflated, 9)
    assert len(bomb) < 128 * 1024
    async with (
        open_broker(tmp_path, port=0) as broker,
        open_admin(broker.bootstrap) as bystander,
    ):
        with trio.fail_after(TIMEOUT):
            await bystander.create_topic("t", 1)
            async with open_connection(*broker.address) as conn:
                with pytest.raises(InvalidRecordError, match="more than"):
                    await conn.request(ProduceRequest("t", 0, bomb, 1, 0))
            await _still_served(broker, bystander, "after-bomb")


async def test_hostile_columnar_batches_are_refused_and_the_broker_keeps_serving(
    tmp_path: Path,
) -> None:
    # The broker's check of a produced columnar batch: a count that lies (in the batch or
    # in the request), lengths past the bytes or negative, a batch cut short, a bomb; each is
    # INVALID_RECORD for that request alone, and nothing is stored.
    records = [WireRecord(i, b"k%d" % i, b"v" * i) for i in range(1, 6)]
    good = bytearray(encode_batch(records))
    lying = bytearray(good)
    lying[1:5] = (6).to_bytes(4, "little")
    lengths = 1 + 24 + 8 * 5  # the key lengths, transposed: 5 low bytes, ..., 5 high bytes
    outside = bytearray(good)
    outside[lengths] = 0xFF  # the first key's length: 255 bytes, more than there are
    negative = bytearray(good)
    negative[lengths + 15] = 0x80  # its high byte: a negative length
    inflated = encode_batch([WireRecord(0, None, bytes(MAX_BATCH_BYTES + 2**20))])
    bomb = bytes((inflated[0] | COMPRESSION["zlib"][0],)) + zlib.compress(inflated[1:], 9)
    async with (
        open_broker(tmp_path, port=0) as broker,
        open_admin(broker.bootstrap) as bystander,
    ):
        with trio.fail_after(TIMEOUT):
            await bystander.create_topic("t", 1)
            async with open_connection(*broker.address) as conn:
                for payload, count, match in [
                    (lying, 5, "header .* says"),
                    (outside, 5, "lengths do not add up"),
                    (negative, 5, "negative"),
                    (good[:-3], 5, "says"),
                    (bomb, 1, "more than"),
                    (good, 4, "holds 5 record"),
                ]:
                    with pytest.raises(InvalidRecordError, match=match):
                        await conn.request(ProduceRequest("t", 0, bytes(payload), count, 5))
                stored = await conn.request(ProduceRequest("t", 0, bytes(good), 5, 5))
                assert stored.base_offset == 0  # the refused batches took no offsets
            await _still_served(broker, bystander, "after-columnar")


@pytest.mark.parametrize("decode", [decode_batch, decode_untracked])
def test_batch_decoding_refuses_truncated_and_oversized_payloads(decode) -> None:
    # decode_untracked (the broker's check, the Spark source) accepts and refuses exactly
    # what decode_batch does.
    records = [WireRecord(1, b"k", b"v" * 1000, [("h", b"x")])] * 10
    for codec in ("zlib", "lzma", "lz4", "zstd"):
        batch = encode_batch(records, codec)
        got = decode(batch)
        assert [(r.timestamp_ms, r.key, r.value, list(r.headers)) for r in got] == [
            (1, b"k", b"v" * 1000, [("h", b"x")])
        ] * 10
        with pytest.raises(InvalidRecordError, match="more than 5000 bytes"):
            decode(batch, max_bytes=5000)
        with pytest.raises(InvalidRecordError, match=f"complete {codec} (stream|block)"):
            decode(batch[:-4])
        with pytest.raises(InvalidRecordError, match=f"complete {codec} (stream|block)"):
            decode(batch + b"trailing")
    for codec in ("lz4", "zstd"):  # a size that lies is refused before anything is allocated
        batch = bytearray(encode_batch(records, codec))
        batch[1:5] = (2**31).to_bytes(4, "big")
        with pytest.raises(InvalidRecordError, match="more than"):
            decode(bytes(batch))
        batch[1:5] = (100).to_bytes(4, "big")  # too small for what the block holds
        with pytest.raises(InvalidRecordError, match=f"complete {codec} block"):
            decode(bytes(batch))
    for bad in (
        b"",
        b"\x09" + msgspec.msgpack.encode([]),
        b"\x00" + msgspec.msgpack.encode([[1, 2]]),
    ):
        with pytest.raises(InvalidRecordError):
            decode(bad)


def test_a_batch_check_gives_its_count_and_timestamp_range() -> None:
    stamps = [5, 3, 9, 4]
    batch = encode_batch([WireRecord(t, None, b"v") for t in stamps], "lz4")
    assert check_batch(batch) == (4, 3, 9)
    assert check_batch(encode_batch([])) == (0, 0, 0)


async def test_offset_metadata_is_capped_wherever_offsets_enter_a_group(tmp_path: Path) -> None:
    # 900 KB of metadata per partition used to be kept, and then made OffsetFetch and
    # DescribeGroup too large to answer for everyone. Now Kafka's 4 KiB limit holds for
    # commits, resets and the positions a heartbeat carries.
    async with (
        open_broker(tmp_path, port=0) as broker,
        open_admin(broker.bootstrap) as bystander,
    ):
        with trio.fail_after(TIMEOUT):
            await bystander.create_topic("t", 2)
            async with open_connection(*broker.address) as conn:
                ok = PartitionOffset("t", 0, 5, "é" * 2048)  # 4096 bytes: at the limit
                await conn.request(OffsetCommitRequest("g", "", -1, [ok]))
                big = PartitionOffset("t", 1, 7, "m" * 900_000)
                with pytest.raises(OffsetMetadataTooLargeError, match=r"t-1 is 900000 bytes.*4096"):
                    await conn.request(OffsetCommitRequest("g", "", -1, [big]))
                with pytest.raises(OffsetMetadataTooLargeError):
                    await conn.request(ResetOffsetsRequest("g", [big]))
                with pytest.raises(OffsetMetadataTooLargeError):
                    await conn.request(
                        ResetOffsetsRequest("g", [PartitionOffset("t", 1, 7, "é" * 2049)])
                    )
                answer = await conn.request(OffsetFetchRequest("g"))
                assert isinstance(answer, OffsetFetchResponse)
                assert [(o.partition, o.offset) for o in answer.offsets] == [(0, 5)]
            async with open_consumer(
                broker.bootstrap, "live", ["t"], session_timeout=1.0, offset_reset="earliest"
            ) as consumer:
                await consumer.wait_assigned()
                member, generation = consumer.member_id, consumer.generation
                async with open_connection(*broker.address) as conn:
                    with pytest.raises(OffsetMetadataTooLargeError):
                        await conn.request(HeartbeatRequest("live", member, generation, [big]))
            await _still_served(broker, bystander, "after-metadata")


@pytest.mark.parametrize("entry", ["", "a" * 250, "bad/name", ".."])
async def test_a_subscription_to_a_name_no_topic_can_have_is_refused(
    tmp_path: Path, entry: str
) -> None:
    async with open_broker(tmp_path, port=0) as broker, open_connection(*broker.address) as conn:
        with trio.fail_after(TIMEOUT), pytest.raises(InvalidTopicError, match="subscription"):
            await conn.request(JoinGroupRequest("g", "", ["ok", entry], 10_000, 30_000, ["range"]))


async def test_a_subscription_of_more_than_a_thousand_entries_is_refused(tmp_path: Path) -> None:
    # 1,000 names of 249 characters still fit a page of DescribeGroup; 1,001 are refused.
    names = [f"{i:04d}" + "t" * 245 for i in range(1001)]
    async with open_broker(tmp_path, port=0) as broker, open_connection(*broker.address) as conn:
        with trio.fail_after(TIMEOUT), pytest.raises(InvalidTopicError, match="1001 entries"):
            await conn.request(JoinGroupRequest("g", "", names, 10_000, 30_000, ["range"]))
        with trio.fail_after(TIMEOUT):
            joined = await conn.request(
                JoinGroupRequest("g", "", names[:1000], 10_000, 30_000, ["range"])
            )
        assert joined.member_id


async def test_offsets_no_log_can_have_are_refused_wherever_they_enter(tmp_path: Path) -> None:
    # 2**63 used to be accepted (and then every later commit was a regression); a negative
    # position in a heartbeat was kept. Both are refused, and the group keeps its offsets.
    async with (
        open_broker(tmp_path, port=0) as broker,
        open_admin(broker.bootstrap) as bystander,
    ):
        with trio.fail_after(TIMEOUT):
            await bystander.create_topic("t", 1)
            async with open_connection(*broker.address) as conn:
                for bad in (2**63, -1):
                    offset = PartitionOffset("t", 0, bad)
                    with pytest.raises(InvalidRequestError, match="commit the offset of the next"):
                        await conn.request(OffsetCommitRequest("g", "", -1, [offset]))
                    with pytest.raises(InvalidRequestError):
                        await conn.request(ResetOffsetsRequest("g", [offset]))
                await conn.request(OffsetCommitRequest("g", "", -1, [PartitionOffset("t", 0, 2)]))
            async with open_consumer(
                broker.bootstrap, "live", ["t"], session_timeout=1.0, offset_reset="earliest"
            ) as consumer:
                await consumer.wait_assigned()
                member, generation = consumer.member_id, consumer.generation
                async with open_connection(*broker.address) as conn:
                    for bad in (2**63, -3):
                        positions = [PartitionOffset("t", 0, bad)]
                        with pytest.raises(InvalidRequestError):
                            await conn.request(
                                HeartbeatRequest("live", member, generation, positions)
                            )
            assert await bystander.committed_offsets("g") == {TopicPartition("t", 0): 2}
            await _still_served(broker, bystander, "after-offsets")


@settings(max_examples=300, deadline=None)
@given(codec=st.sampled_from([3, 4]), size=st.integers(0, 2**32 - 1), body=st.binary(max_size=200))
def test_random_lz4_and_zstd_batches_only_ever_give_invalid_record(codec, size, body) -> None:
    payload = bytes((codec,)) + size.to_bytes(4, "big") + body
    try:
        decode_batch(payload, max_bytes=64 * 1024)
    except InvalidRecordError:
        pass
