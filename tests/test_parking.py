"""Parked connections (``park_idle_connections``): an idle member costs no task.

Over real sockets (only a plain TCP connection is parked), every guarantee a
reader task gives holds for a connection that has none: heartbeats answered
(without waking a task), a hang-up failing the member at once, partial, slow,
huge and corrupt frames handled as before (the reader is revived for them),
the broker's pushes and their answers, idle reaping, shutdown, the byte
budgets, in-order answers, and fairness when many sockets wake at once.
"""

from __future__ import annotations

import contextlib
import gc
import socket
from collections.abc import AsyncIterator

import pytest
import trio
from wire import read_goodbye, read_until_closed

from trio_coord.broker.server import Broker, open_broker
from trio_coord.protocol import _parking
from trio_coord.protocol.connection import Connection, RequestHandler, open_connection
from trio_coord.protocol.errors import CoordError, ErrorCode
from trio_coord.protocol.framing import FrameCodec
from trio_coord.protocol.messages import (
    Goodbye,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    Request,
    RequestBody,
    Response,
    ResponseBody,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
)

TIMEOUT = 20
CODEC = FrameCodec()


class Member(RequestHandler):
    """A protocol-level member: answers the coordinator's pushes at once."""

    def __init__(self) -> None:
        self.generation = -1
        self.started = trio.Event()
        self.stops = 0

    def handle_now(self, body: RequestBody) -> ResponseBody | None:
        if isinstance(body, StopFetchersRequest):
            self.stops += 1
            return StopFetchersResponse()
        if isinstance(body, StartFetchersRequest):
            self.generation = body.generation
            self.started.set()
            return StartFetchersResponse()
        return None


async def _join(conn: Connection, member: Member, name: str, session: float = 60.0) -> str:
    member_id = ""
    ms = round(session * 1000)
    for _ in range(2):  # a new member is given its id first, then joins with it
        joined = await conn.request(
            JoinGroupRequest("g", member_id, ["t"], ms, ms, ["range"], client_id=name)
        )
        assert isinstance(joined, JoinGroupResponse)
        member_id = joined.member_id
    await member.started.wait()
    return member_id


@contextlib.asynccontextmanager
async def _members(broker: Broker, count: int) -> AsyncIterator[list[tuple[Connection, Member]]]:
    """``count`` joined members, each on its own TCP connection, for the life of the block."""
    async with contextlib.AsyncExitStack() as stack:
        joined: list[tuple[Connection, Member]] = []
        for _ in range(count):
            member = Member()
            conn = await stack.enter_async_context(open_connection(*broker.address, member))
            joined.append((conn, member))
        async with trio.open_nursery() as nursery:
            for i, (conn, member) in enumerate(joined):
                nursery.start_soon(_join, conn, member, f"m{i}")
        yield joined


async def _until(condition, what: str) -> None:
    with trio.fail_after(TIMEOUT):
        while not condition():
            await trio.sleep(0.01)


async def _stable(broker: Broker, members: int) -> int:
    """Wait for the group to be STABLE with ``members`` members; its generation."""

    def stable() -> bool:
        group = broker.coordinator.describe_group("g")
        return group.state == "STABLE" and len(group.members) == members

    await _until(stable, f"a stable group of {members}")
    return broker.coordinator.describe_group("g").generation


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


async def _read_frames(stream: trio.SocketStream, count: int) -> list[object]:
    """Read ``count`` frames (decoded) from a raw stream."""
    data = bytearray()
    frames: list[object] = []
    with trio.fail_after(TIMEOUT):
        while len(frames) < count:
            while len(data) >= 4 and len(data) >= 4 + (size := int.from_bytes(data[:4], "big")):
                frames.append(CODEC.decode(bytes(data[4 : 4 + size])))
                del data[: 4 + size]
            if len(frames) >= count:
                break
            chunk = await stream.receive_some()
            assert chunk, f"closed after {len(frames)} of {count} frames"
            data += chunk
    return frames


def _heartbeat(corr_id: int, member_id: str = "nobody", generation: int = 1) -> bytes:
    return CODEC.encode(Request(corr_id, HeartbeatRequest("g", member_id, generation)))


@contextlib.asynccontextmanager
async def _broker(tmp_path, **settings) -> AsyncIterator[Broker]:
    async with open_broker(tmp_path, initial_rebalance_delay=0.0, **settings) as broker:
        async with open_connection(*broker.address) as admin:
            from trio_coord.protocol.messages import CreateTopicRequest

            await admin.request(CreateTopicRequest("t", 64))  # (every member owns some)
        await _until(lambda: broker.connection_count() == 0, "the admin gone")
        yield broker


async def test_idle_members_are_parked_and_their_heartbeats_need_no_task(tmp_path) -> None:
    async with _broker(tmp_path) as broker, _members(broker, 3) as members:
        generation = await _stable(broker, 3)
        await _until(lambda: broker.parked_count() == 3, "every member parked")
        revived = broker._parking.revived
        ids = [m.member_id for m in broker.coordinator.describe_group("g").members]
        by_client = {
            m.client_id: m.member_id for m in broker.coordinator.describe_group("g").members
        }
        assert len(ids) == 3
        for _ in range(5):
            for i, (conn, _member) in enumerate(members):
                answer = await conn.request(HeartbeatRequest("g", by_client[f"m{i}"], generation))
                assert isinstance(answer, HeartbeatResponse)
        assert broker._parking.revived == revived  # answered by the parking task itself
        assert broker.parked_count() == 3
        assert await _stable(broker, 3) == generation


async def test_a_parked_member_that_hangs_up_is_failed_at_once(tmp_path) -> None:
    # A session of 60 s: only the closed connection can remove the member in time.
    async with _broker(tmp_path) as broker, _members(broker, 2) as members:
        generation = await _stable(broker, 2)
        await _until(lambda: broker.parked_count() == 2, "both members parked")
        await members[0][0].aclose()

        def rebalanced() -> bool:  # (its partitions then wait for its lease: not STABLE yet)
            group = broker.coordinator.describe_group("g")
            return len(group.members) == 1 and group.generation > generation

        await _until(rebalanced, "a rebalance without it")
        await _until(lambda: members[1][1].generation > generation, "the other one restarted")
        await _until(lambda: broker.connection_count() == 1, "the connection counted out")


async def test_a_partial_frame_wakes_the_reader_which_finishes_it_or_times_it_out(
    tmp_path,
) -> None:
    async with _broker(tmp_path, request_read_timeout=0.5) as broker:
        whole = await trio.open_tcp_stream(*broker.address)
        torn = await trio.open_tcp_stream(*broker.address)
        await _until(lambda: broker.parked_count() == 2, "both parked")
        frame = _heartbeat(7)
        await whole.send_all(frame[:5])
        await torn.send_all(frame[:5])
        await trio.sleep(0.1)
        await whole.send_all(frame[5:])
        (answer,) = await _read_frames(whole, 1)
        assert isinstance(answer, Response) and answer.corr_id == 7
        assert answer.error != ErrorCode.NONE  # (answered: nobody is in "g")
        goodbye = await read_goodbye(torn, TIMEOUT)  # never finished: the read timeout applies
        assert goodbye is not None and goodbye.error == ErrorCode.REQUEST_TIMED_OUT
        await _until(lambda: broker.parked_count() == 1, "the whole one parked again")
        await whole.send_all(_heartbeat(8))
        (answer,) = await _read_frames(whole, 1)
        assert isinstance(answer, Response) and answer.corr_id == 8


async def test_a_slow_parked_client_is_timed_out_and_a_member_is_unaffected(tmp_path) -> None:
    async with _broker(tmp_path, request_read_timeout=0.5) as broker:
        async with _members(broker, 1) as ((conn, _member),):
            generation = await _stable(broker, 1)
            slow = await trio.open_tcp_stream(*broker.address)
            await _until(lambda: broker.parked_count() == 2, "both parked")
            frame = _heartbeat(1)

            async def drip() -> None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    for byte in frame:
                        await slow.send_all(bytes([byte]))
                        await trio.sleep(0.2)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drip)
                goodbye = await read_goodbye(slow, TIMEOUT)
                nursery.cancel_scope.cancel()
            assert goodbye is not None and goodbye.error == ErrorCode.REQUEST_TIMED_OUT
            member_id = broker.coordinator.describe_group("g").members[0].member_id
            answer = await conn.request(HeartbeatRequest("g", member_id, generation))
            assert isinstance(answer, HeartbeatResponse)


@pytest.mark.parametrize(
    "data, error",
    [
        (b"\xff\xff\xff\xff", ErrorCode.FRAME_TOO_LARGE),
        (_frame(bytes(range(240, 255))), ErrorCode.CORRUPT_MESSAGE),
        (_frame(b"\x93\x01\x01\x95\x05\xa1\xff\xa1m\x01\x90"), ErrorCode.CORRUPT_MESSAGE),
    ],
    ids=["huge-header", "garbage", "invalid-utf8"],
)
async def test_a_bad_frame_on_a_parked_socket_gets_a_goodbye_and_others_are_unaffected(
    tmp_path, data, error
) -> None:
    async with _broker(tmp_path) as broker, _members(broker, 1) as ((conn, _member),):
        generation = await _stable(broker, 1)
        hostile = await trio.open_tcp_stream(*broker.address)
        await _until(lambda: broker.parked_count() == 2, "both parked")
        await hostile.send_all(_heartbeat(1) + data)  # a good frame first, then the bad
        answer, goodbye = await read_until_closed(hostile, TIMEOUT)
        assert isinstance(answer, Response) and answer.corr_id == 1
        assert isinstance(goodbye, Goodbye) and goodbye.error == error
        await _until(lambda: broker.connection_count() == 1, "the hostile one counted out")
        member_id = broker.coordinator.describe_group("g").members[0].member_id
        answer = await conn.request(HeartbeatRequest("g", member_id, generation))
        assert isinstance(answer, HeartbeatResponse)
        assert await _stable(broker, 1) == generation


async def test_a_large_frame_announced_on_a_parked_socket_waits_for_its_reader(tmp_path) -> None:
    # Larger than a heartbeat could be: the reader takes it (budget, read timeout).
    async with _broker(tmp_path, request_read_timeout=0.5) as broker:
        stream = await trio.open_tcp_stream(*broker.address)
        await _until(lambda: broker.parked_count() == 1, "parked")
        await stream.send_all((100_000).to_bytes(4, "big") + b"\x93")
        goodbye = await read_goodbye(stream, TIMEOUT)
        assert goodbye is not None and goodbye.error == ErrorCode.REQUEST_TIMED_OUT
        await _until(lambda: broker._shared_bytes.used == 0, "the shared budget given back")


async def test_a_rebalance_over_many_parked_members_completes(tmp_path) -> None:
    # Every StopFetchers/StartFetchers goes to a parked connection, and its answer comes
    # back on one: the parking task hands each to the request waiting for it.
    async with _broker(tmp_path) as broker, _members(broker, 30) as members:
        generation = await _stable(broker, 30)
        await _until(lambda: broker.parked_count() == 30, "every member parked")
        stops = sum(m.stops for _, m in members)
        async with _members(broker, 1):
            new = await _stable(broker, 31)
            assert new > generation
            assert all(m.generation == new for _, m in members)
            assert sum(m.stops for _, m in members) >= stops + 30
            await _until(lambda: broker.parked_count() == 31, "all parked again")


async def test_an_idle_parked_connection_is_reaped(tmp_path) -> None:
    async with _broker(tmp_path, connections_max_idle=0.5) as broker:
        stream = await trio.open_tcp_stream(*broker.address)
        await _until(lambda: broker.parked_count() == 1, "parked")
        assert await read_goodbye(stream, TIMEOUT) is None  # closed silently, as Kafka does
        await _until(lambda: broker.connection_count() == 0, "counted out")
        assert broker.parked_count() == 0


async def test_shutdown_closes_parked_connections(tmp_path) -> None:
    async with _broker(tmp_path) as broker:
        streams = [await trio.open_tcp_stream(*broker.address) for _ in range(3)]
        await _until(lambda: broker.parked_count() == 3, "parked")
    for stream in streams:
        assert await read_goodbye(stream, TIMEOUT) is None
    assert broker.connection_count() == 0
    assert broker.parked_count() == 0


async def test_pipelined_heartbeats_are_answered_in_order_and_their_budget_given_back(
    tmp_path,
) -> None:
    # A peer that sends 3,000 heartbeats and reads nothing for a while: the parked
    # connection answers what the socket takes, its reader is revived for the rest and
    # stops reading while the answers wait (their charges held), then all is answered
    # in order and every byte of the budgets is given back.
    count = 3000
    async with _broker(tmp_path) as broker:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(broker.address)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(client))
        await _until(lambda: broker.parked_count() == 1, "parked")
        (conn,) = broker._connections
        conn._stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        revived = broker._parking.revived
        data = b"".join(_heartbeat(i) for i in range(1, count + 1))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, data)
            await trio.sleep(0.5)  # the broker's answers back up meanwhile
            assert conn.charged > 0  # (held until the answers are written)
            frames = await _read_frames(stream, count)
        assert [f.corr_id for f in frames] == list(range(1, count + 1))  # type: ignore[attr-defined]
        assert broker._parking.revived > revived
        await _until(lambda: broker.parked_count() == 1, "parked again")
        assert conn.charged == 0 and broker._shared_bytes.used == 0
        await stream.aclose()


async def test_many_sockets_waking_at_once_do_not_starve_other_tasks(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_parking, "MAX_EVENTS", 2)
    async with _broker(tmp_path) as broker:
        clients = [socket.create_connection(broker.address) for _ in range(10)]
        try:
            await _until(lambda: broker.parked_count() == 10, "parked")
            active = {conn: conn.last_active for conn in broker._connections}

            def answered() -> int:
                return sum(conn.last_active != t for conn, t in active.items())

            for i, client in enumerate(clients):  # (no checkpoint: all readable at once)
                client.sendall(_heartbeat(i))
            seen = []
            with trio.fail_after(TIMEOUT):
                while (done := answered()) < 10:
                    seen.append(done)
                    await trio.lowlevel.checkpoint()
            # This task ran between the parking task's wake-ups, which handle 2 sockets each.
            assert any(0 < n < 10 for n in seen), seen
        finally:
            for client in clients:
                client.close()


async def test_parked_members_hold_fewer_objects(tmp_path) -> None:
    # Broker and members in one process: the members' side is the same either way, so
    # the difference is the broker's (a reader task, its coroutines and nursery each).
    per_member = {}
    for park in (False, True):
        async with _broker(tmp_path / str(park), park_idle_connections=park) as broker:
            gc.collect()
            before = len(gc.get_objects())
            async with _members(broker, 50):
                await _stable(broker, 50)
                parked = 50 if park else 0
                await _until(lambda: broker.parked_count() == parked, "parked")  # noqa: B023
                await trio.sleep(0.2)
                gc.collect()
                per_member[park] = (len(gc.get_objects()) - before) / 50
    # ~127 and ~96 (the member's side, with its own reader task, is most of it; the
    # broker's side of a parked member is ~19: bench/member_cost.py): a regression guard.
    assert per_member[True] < per_member[False] - 20, per_member
    assert per_member[True] < 110, per_member


async def test_requests_on_a_parked_connection_fail_cleanly_when_it_breaks(tmp_path) -> None:
    # The broker's own request (a push) on a parked connection whose peer vanished.
    async with _broker(tmp_path) as broker:
        stream = await trio.open_tcp_stream(*broker.address)
        await _until(lambda: broker.parked_count() == 1, "parked")
        (conn,) = broker._connections
        await stream.aclose()
        with pytest.raises(CoordError):
            with trio.fail_after(TIMEOUT):
                await conn.request(StopFetchersRequest("g", "m", 1))
        await _until(lambda: broker.connection_count() == 0, "counted out")


async def test_a_tls_connection_is_never_parked(tmp_path) -> None:
    # An SSLStream holds decrypted bytes its socket does not show: its reader stays.
    from certs import make_certificates

    from trio_coord import open_admin
    from trio_coord.security import client_ssl_context

    certs = make_certificates(tmp_path)
    async with open_broker(
        tmp_path / "data", tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key")
    ) as broker:
        context = client_ssl_context(certs / "ca.pem")
        async with open_admin(broker.bootstrap, ssl_context=context) as admin:
            await admin.create_topic("t", 1)
            await trio.sleep(0.2)
            assert [t.name for t in await admin.describe_topics(["t"])] == ["t"]
            assert broker.connection_count() >= 1
            assert broker.parked_count() == 0


async def test_a_parked_socket_keeps_a_max_frame_size_below_4_kib(tmp_path) -> None:
    # The parking task answers small frames itself; "small" must not exceed the limit.
    async with _broker(tmp_path, max_frame_size=1024) as broker:
        stream = await trio.open_tcp_stream(*broker.address)
        await _until(lambda: broker.parked_count() == 1, "parked")
        frame = CODEC.encode(Request(1, HeartbeatRequest("g" * 2000, "m", 1)))
        assert 1024 < len(frame) < 4096
        await stream.send_all(frame)
        (goodbye,) = await _read_frames(stream, 1)
        assert isinstance(goodbye, Goodbye) and goodbye.error == ErrorCode.FRAME_TOO_LARGE


def test_without_epoll_the_package_imports_and_a_broker_serves_unparked(tmp_path) -> None:
    # macOS and Windows have no epoll: parking is Linux's, the package (clients, Spark's
    # workers, a broker) everyone's. Simulated: trio_coord is imported with a select
    # module that lacks epoll (Trio itself keeps the real one).
    import subprocess
    import sys

    script = """
import select, sys, types, pathlib
import trio
fake = types.ModuleType("select")
for name in dir(select):
    if not name.upper().startswith("EPOLL"):
        setattr(fake, name, getattr(select, name))
sys.modules["select"] = fake
import trio_coord.protocol
from trio_coord.broker.server import open_broker
from trio_coord.protocol.messages import MetadataRequest, MetadataResponse
sys.modules["select"] = select

async def main():
    async with open_broker(pathlib.Path(sys.argv[1])) as broker:
        async with trio_coord.protocol.open_connection(*broker.address) as conn:
            assert isinstance(await conn.request(MetadataRequest([])), MetadataResponse)
            await trio.sleep(0.1)
            assert broker.connection_count() == 1 and broker.parked_count() == 0
    print("served")

trio.run(main)
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "served" in done.stdout, done.stderr[-2000:]


async def test_a_parked_peer_that_does_not_read_large_inline_answers_is_not_answered_ahead(
    tmp_path,
) -> None:
    # A reader answers inline requests one at a time, each written before the next frame
    # is read: a peer that pipelines cheap requests with large answers (Metadata of
    # every topic, a big group described) and never reads them holds one answer. The
    # parking task must not encode a wake-up's 32 at once (x 256 sockets per wake-up).
    from trio_coord.protocol.messages import MetadataRequest, MetadataResponse, TopicInfo

    big = MetadataResponse([], [TopicInfo(f"{i:04d}" + "x" * 200, 1) for i in range(600)])
    answered: list[int] = []

    class Lister(RequestHandler):
        def handle_now(self, body: RequestBody) -> ResponseBody | None:
            answered.append(1)
            return big

    parking = _parking.Parking()
    async with trio.open_nursery() as nursery:
        await nursery.start(parking.run)
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        peer = await trio.open_tcp_stream(*listener.socket.getsockname()[:2])
        stream = await listener.accept()
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # (no autotuning)
        conn = Connection(stream, Lister(), parking=parking, max_bytes=1 << 20)
        nursery.start_soon(conn.serve)
        await _until(lambda: len(parking) == 1, "parked")
        requests = [CODEC.encode(Request(i, MetadataRequest(None))) for i in range(1, 33)]
        await peer.send_all(b"".join(requests))  # (one read's worth, all small; each answer
        # ~126 KB, about what the socket buffers hold: the second cannot be written)
        await _until(lambda: answered, "the first answered")
        assert len(answered) <= 2  # (a wake-up answers in one go: 32 here without a bound)
        frames = await _read_frames(peer, 32)  # (read now: every one answered, in order)
        assert [f.corr_id for f in frames] == list(range(1, 33))  # type: ignore[attr-defined]
        assert len(answered) == 32
        await _until(lambda: len(parking) == 1, "parked again")
        await peer.aclose()
        await listener.aclose()
        nursery.cancel_scope.cancel()


async def test_a_busy_connection_is_not_parked_between_its_requests(tmp_path) -> None:
    # A producer sends a request that needs a task every few milliseconds: parking it
    # after each answer and reviving it for the next would cost the broker a task, a
    # nursery and two epoll calls per request. It parks once it has been quiet.
    from trio_coord import open_producer

    async with _broker(tmp_path) as broker:
        revived = broker._parking.revived
        async with open_producer(f"{broker.address[0]}:{broker.address[1]}") as producer:
            for i in range(40):  # one at a time: each Produce runs in a handler task
                await producer.send("t", f"record {i}".encode(), partition=0)
                await producer.flush()
            assert broker._parking.revived - revived <= 2  # (not one per Produce)
            assert broker.parked_count() == 0  # still in use
            await _until(lambda: broker.parked_count() == 1, "parked once quiet")
