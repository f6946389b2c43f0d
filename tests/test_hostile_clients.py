"""A healthy group keeps consuming while hostile clients do their worst, one connection each.

One broker, one consumer group of two members consuming a topic. Then, each
on its own connection: the frames that once ended a broker (nested 1,000
deep, strings that are not UTF-8), garbage, a length of 4 GiB, a torn frame,
an unknown message type, a request the broker refuses, a frame sent a byte
at a time past the read timeout, more connections than the broker admits,
a peer that sends fetches and never reads the answers, and a JoinGroup with
an absurd rebalance timeout. Afterwards the group is still STABLE in the
same generation and consumes every record produced after the attack.
"""

from __future__ import annotations

import trio

from trio_coord import (
    InvalidRebalanceTimeoutError,
    TopicPartition,
    open_admin,
    open_broker,
    open_consumer,
    open_producer,
)
from trio_coord.protocol.connection import open_connection
from trio_coord.protocol.framing import FrameCodec
from trio_coord.protocol.messages import (
    FetchPartition,
    FetchRequest,
    JoinGroupRequest,
    Request,
    StartFetchersRequest,
)

TIMEOUT = 20


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


HEARTBEAT = b"\x96\x05\xa1g\xa1m\x01\x90"  # a heartbeat with one extra field: the nest goes there
HOSTILE = {
    "nested-1000-deep": _frame(b"\x93\x01\x01" + HEARTBEAT + b"\x91" * 1000 + b"\xc0"),
    "invalid-utf8": _frame(b"\x93\x01\x01\x95\x05\xa1\xff\xa1m\x01\x90"),
    "garbage": _frame(bytes(range(240, 255))),
    "4GiB": b"\xff\xff\xff\xff",
    "torn": _frame(b"\x93\x01\x01\x95\x05\xa1g")[:-3],
    "unknown-tag": _frame(b"\x93\x01\x01\x92\x63\xa1x"),
    "refused-request": FrameCodec().encode(Request(1, StartFetchersRequest("g", "m", 1, []))),
}


async def _send_and_hang_up(address: tuple[str, int], data: bytes) -> None:
    stream = await trio.open_tcp_stream(*address)
    await stream.send_all(data)
    with trio.move_on_after(1):  # read whatever the broker says, until it closes
        try:
            while await stream.receive_some():
                pass
        except trio.BrokenResourceError:
            pass
    await stream.aclose()


async def test_a_stable_group_keeps_consuming_through_every_hostile_input(tmp_path) -> None:
    async with open_broker(
        tmp_path,
        min_session_timeout=0.5,
        max_connections=40,
        request_read_timeout=0.5,
        max_rebalance_timeout=60.0,
    ) as broker:
        bootstrap, address = broker.bootstrap, broker.address
        async with open_admin(bootstrap) as admin:
            await admin.create_topic("t", 4)
        received: list[str] = []
        async with (
            open_consumer(bootstrap, "g", ["t"], session_timeout=1.0) as a,
            open_consumer(bootstrap, "g", ["t"], session_timeout=1.0) as b,
            trio.open_nursery() as nursery,
        ):

            async def consume(consumer) -> None:
                async for record in consumer:
                    received.append(record.value.decode())

            with trio.fail_after(TIMEOUT):
                while not (a.assignment and b.assignment and a.state == b.state == "STABLE"):
                    await trio.sleep(0.05)
            generation = a.generation
            nursery.start_soon(consume, a)
            nursery.start_soon(consume, b)

            with trio.fail_after(TIMEOUT):
                for data in HOSTILE.values():
                    await _send_and_hang_up(address, data)
                # A frame a byte at a time: closed at the read timeout.
                slow = await trio.open_tcp_stream(*address)
                closed = False
                try:
                    for byte in _frame(b"\x93\x01\x01\x92\x09\x90" + b"\xc0" * 20):
                        await slow.send_all(bytes([byte]))
                        await trio.sleep(0.1)
                except trio.BrokenResourceError:
                    closed = True
                assert closed, "the slow frame's connection was closed at the read timeout"
                # A member asking to be waited for 292 million years is refused.
                async with open_connection(*address) as conn:
                    try:
                        await conn.request(
                            JoinGroupRequest("g", "", ["t"], 1000, 2**63 - 1, ["range"])
                        )
                    except InvalidRebalanceTimeoutError:
                        pass
                    else:  # pragma: no cover
                        raise AssertionError("an absurd rebalance timeout was admitted")
                # More connections than the broker admits; then a reader that never reads.
                flood = [await trio.open_tcp_stream(*address) for _ in range(60)]
                hog = flood[0]
                fetch = FetchRequest([FetchPartition("t", p, 0) for p in range(4)], max_wait_ms=0)
                codec = FrameCodec()
                await hog.send_all(b"".join(codec.encode(Request(n, fetch)) for n in range(1, 65)))
                for stream in [*flood, slow]:
                    await stream.aclose()

            async with open_producer(bootstrap) as producer:
                for i in range(200):
                    await producer.enqueue("t", f"after-{i}", key=str(i))
            with trio.fail_after(TIMEOUT):
                while len({v for v in received if v.startswith("after-")}) < 200:
                    await trio.sleep(0.05)
            assert a.generation == b.generation == generation, "no rebalance happened"
            assert a.state == b.state == "STABLE"
            owned = sorted(a.assignment) + sorted(b.assignment)
            assert sorted(owned) == [TopicPartition("t", p) for p in range(4)]
            nursery.cancel_scope.cancel()
