"""A rebalance's pushes with no task per member, and joins answered inline (issue #14).

StopFetchers and StartFetchers are pushed to native members and their
answers awaited under one deadline at a time (``GroupRunner._await_answers``);
a JoinGroup into a running group is answered by ``handle_now``. These tests
hold the promises the tasks and cancel scopes per member used to keep: a
silent member is expelled at its own rebalance timeout and the rebalance
restarts at once; a member that hangs up while its answer is owed is removed
and its pending push dropped without an error; and while thousands of answers
are owed the broker runs no task for any of them.
"""

from __future__ import annotations

import logging
import os

import trio
import trio.testing

from trio_coord.broker.server import open_broker
from trio_coord.protocol import Connection, RequestHandler
from trio_coord.protocol.errors import ConnectionClosedError, ErrorCode
from trio_coord.protocol.framing import FrameCodec, FrameReader
from trio_coord.protocol.messages import (
    CreateTopicRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    Request,
    Response,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
)

from .harness import (
    FakeMember,
    Recorder,
    Timeline,
    connected,
    ephemeral_broker,
    heartbeat_forever,
)

S = 30.0


def _fake(broker, timeline, name: str, rebalance_timeout: float) -> FakeMember:
    return FakeMember(
        broker,
        "g",
        ["t"],
        session_timeout=S,
        rebalance_timeout=rebalance_timeout,
        timeline=timeline,
        name=name,
    )


async def test_silent_members_are_expelled_each_at_its_own_rebalance_timeout(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 3)
        a = _fake(broker, timeline, "a", 2.0)
        b = _fake(broker, timeline, "b", 5.0)
        c = _fake(broker, timeline, "c", 5.0)
        async with connected(a), connected(b), connected(c):
            await c.join()
            await rec.wait_for("stable")
            a.hold_start = b.hold_start = True  # they join, then never acknowledge a start
            mark = rec.mark()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.join)
                nursery.start_soon(b.join)
            first = await rec.wait_for("removed", since=mark, member_id=a.member_id)
            pushed = [t for t, what in a.pushes if what == "start"][-1]
            assert first["time"] == pushed + 2.0
            assert first["reason"] == "did not answer within its rebalance timeout (2s)"
            second = await rec.wait_for("removed", since=mark, member_id=b.member_id)
            # The rebalance restarted at once without a, and pushed to b anew: b is
            # expelled at its own timeout, counted from that push.
            again = [t for t, what in b.pushes if what == "start"][-1]
            assert again == first["time"]
            assert second["time"] == again + 5.0
            # (b may be fetching what it was told to start: c gets that when b's lease
            # ends, a staged start, which runs in a task of its own as before.)
            assert rec.all("rebalance_failed", since=mark) == []
            assert timeline.overlaps() == []


async def test_a_member_that_hangs_up_while_its_start_is_owed_is_removed_cleanly(
    autojump_clock, caplog
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        a = _fake(broker, timeline, "a", 10.0)
        b = _fake(broker, timeline, "b", 10.0)
        async with connected(a), connected(b), trio.open_nursery() as nursery:
            await a.join()
            await rec.wait_for("stable")
            nursery.start_soon(heartbeat_forever, a, 1.0)
            b.hold_start = True
            mark = rec.mark()
            await b.join()
            while not any(what == "start" for _, what in b.pushes):
                await trio.sleep(0.01)
            await trio.sleep(1.0)
            with caplog.at_level(logging.WARNING):
                await b.crash()
                removed = await rec.wait_for("removed", since=mark, member_id=b.member_id)
                stable = await rec.wait_for("stable", since=mark)
            assert removed["reason"] == "lost its connection"
            assert removed["time"] < 10.0  # at once, not at the rebalance timeout
            # (b was told to start t-1: a gets it when b's lease ends, S after it joined.)
            assert stable["time"] == S
            assert set(stable["ownership"].values()) == {a.member_id}
            assert rec.all("rebalance_failed", since=mark) == []
            assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
            nursery.cancel_scope.cancel()


def _broker_tasks() -> dict[str, int]:
    """Every task of this run, by its coroutine's name."""
    counts: dict[str, int] = {}
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        counts[task.name] = counts.get(task.name, 0) + 1
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return counts


async def test_no_task_runs_per_member_while_the_answers_are_owed(tmp_path):
    # Members on raw sockets (no task of their own in this process): they join in two
    # steps, and then leave their StartFetchers unanswered for a while.
    codec = FrameCodec()
    members = 40
    # (The first rebalance waits for the burst of joins to end: it has every member.)
    async with open_broker(tmp_path, initial_rebalance_delay=0.5) as broker:
        async with trio.open_nursery() as nursery:
            admin = Connection(await trio.open_tcp_stream(*broker.address), RequestHandler())
            nursery.start_soon(admin.serve)
            await admin.request(CreateTopicRequest("t", members))
            await admin.aclose()
        before = _broker_tasks()
        revived = broker._parking.revived
        socks = []
        for _ in range(members):
            stream = await trio.open_tcp_stream(*broker.address)
            socks.append((stream, FrameReader(stream, 1 << 20)))
            member_id = ""
            for corr in (1, 2):
                request = JoinGroupRequest("g", member_id, ["t"], 60_000, 60_000, ["range"])
                await stream.send_all(codec.encode(Request(corr, request)))
                response = codec.decode(await socks[-1][1].read_frame())
                assert isinstance(response, Response) and response.error == ErrorCode.NONE
                assert isinstance(response.body, JoinGroupResponse)
                member_id = response.body.member_id
        pushes = []
        with trio.fail_after(20):
            for stream, reader in socks:
                while True:
                    frame = codec.decode(await reader.read_frame())
                    assert isinstance(frame, Request)
                    if isinstance(frame.body, StopFetchersRequest):  # (an earlier rebalance)
                        answer = Response(frame.corr_id, ErrorCode.NONE, "", StopFetchersResponse())
                        await stream.send_all(codec.encode(answer))
                        continue
                    assert isinstance(frame.body, StartFetchersRequest)
                    pushes.append(frame)
                    break
        runner = broker.coordinator.runner("g")
        assert runner is not None and len(runner.group.members) == members
        # Each connection parked at once (it never needed a task) and its joins were
        # answered inline by the parking service: only the first join, which made the
        # group, needed a task (the group's task was not up yet).
        assert broker.parked_count() == members
        assert broker._parking.revived - revived <= 1
        # Every member owes its answer now: the broker waits for 40 answers with the
        # tasks it ran before any member came, plus the group's own (one each), and no
        # task per member (no reader, join, start or answer task).
        during = _broker_tasks()
        grown = {name: n - before.get(name, 0) for name, n in during.items()}
        assert {name: n for name, n in grown.items() if n > 0} == {
            "trio_coord.broker.group.GroupRunner.run": 1,
            "trio_coord.broker.group.GroupRunner._rebalance_loop": 1,
            "trio_coord.broker.group.GroupRunner._position_flusher": 1,
            "trio_coord.broker.liveness.Liveness.run": 1,
        }
        for (stream, _), frame in zip(socks, pushes, strict=True):
            answer = Response(frame.corr_id, ErrorCode.NONE, "", StartFetchersResponse())
            await stream.send_all(codec.encode(answer))
        with trio.fail_after(20):
            while runner.group.state.name != "STABLE" or runner.rebalances == 0:
                await trio.sleep(0.01)
        for stream, _ in socks:
            await stream.aclose()


async def test_a_push_answered_closed_or_forgotten_reaches_its_callback_once(tmp_path):
    # Connection.push over a real socket: the answer (or the end) goes to the callback.
    got: list[tuple[object, object]] = []

    class Peer(RequestHandler):
        def handle_now(self, body):
            return StopFetchersResponse() if isinstance(body, StopFetchersRequest) else None

    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    async with trio.open_nursery() as nursery:
        accepted = trio.Event()
        peers: list[Connection] = []

        async def serve_peer(stream):
            peer = Connection(stream, Peer())
            peers.append(peer)
            accepted.set()
            await peer.serve()

        nursery.start_soon(trio.serve_listeners, serve_peer, [listener])
        stream = await trio.open_tcp_stream(*listener.socket.getsockname()[:2])
        conn = Connection(stream)
        nursery.start_soon(conn.serve)
        await accepted.wait()
        _, rest = conn.push(
            StopFetchersRequest("g", "m", 1), lambda ctx, b, e: got.append((ctx, b, e)), "first"
        )
        assert rest is None  # (a small frame on an idle socket: written at once)
        while not got:
            await trio.sleep(0.01)
        assert got == [("first", StopFetchersResponse(), None)]
        forgotten, _ = conn.push(StopFetchersRequest("g", "m", 1), lambda ctx, b, e: got.append(b))
        conn.forget(forgotten)
        await trio.sleep(0.2)
        assert len(got) == 1  # a forgotten push is never answered to anyone
        await peers[0].aclose()  # the peer hangs up: a push still owed fails, once
        await conn.wait_closed()
        closed: list[object] = []
        try:
            conn.push(StopFetchersRequest("g", "m", 1), lambda ctx, b, e: closed.append(e))
        except ConnectionClosedError:
            closed.append("raised")
        assert closed == ["raised"]
        nursery.cancel_scope.cancel()


async def test_a_member_expelled_as_overdue_leaves_its_connection_idle(autojump_clock):
    # A member that never answers its StartFetchers is expelled at its rebalance
    # timeout; its connection stays open (it may join again on it), but nothing is
    # owed on it any more: it is idle, and connections_max_idle closes it in time.
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, connections_max_idle=10.0) as broker:
        await broker.topics.create_topic("t", 1)
        a = _fake(broker, Timeline(), "a", 2.0)
        async with connected(a):
            a.hold_start = True
            await a.join()
            removed = await rec.wait_for("removed", member_id=a.member_id)
            assert removed["reason"] == "did not answer within its rebalance timeout (2s)"
            (conn,) = broker._connections
            assert conn.idle
            with trio.fail_after(60):
                await a.conn.wait_closed()


async def test_a_push_cancelled_before_its_first_byte_leaves_the_connection_open():
    # The peer is slow to read: its socket buffer is full, so a push writes nothing at
    # once and hands back the sending to a task. If that task is cancelled before it
    # sends a byte (a rebalance restarting: routine), nothing of the frame is on the
    # wire, and the connection must stay open and whole, as a cancelled request does.
    codec = FrameCodec()
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    async with trio.open_nursery() as nursery:
        stream = await trio.open_tcp_stream(*listener.socket.getsockname()[:2])
        peer = await listener.accept()
        conn = Connection(stream)
        nursery.start_soon(conn.serve)
        junk = 0  # (bytes the peer will skip: they fill the socket's buffers)
        while True:
            try:
                junk += os.write(stream.socket.fileno(), bytes(65536))
            except BlockingIOError:
                break
        got: list[object] = []
        corr_id, rest = conn.push(StopFetchersRequest("g", "m", 1), lambda ctx, b, e: got.append(e))
        assert rest is not None  # (nothing could be written at once)
        with trio.CancelScope() as scope:
            scope.cancel()
            await rest()
        conn.forget(corr_id)
        assert not conn.closed and got == []
        # Nor if it is cancelled while it waits for the peer to read.
        corr_id, rest = conn.push(StopFetchersRequest("g", "m", 1), lambda ctx, b, e: None)
        assert rest is not None
        async with trio.open_nursery() as sending:
            sending.start_soon(rest)
            await trio.testing.wait_all_tasks_blocked()
            sending.cancel_scope.cancel()
        conn.forget(corr_id)
        assert not conn.closed
        # The stream is intact: the next push arrives whole after the skipped bytes.
        _, rest = conn.push(StopFetchersRequest("g", "m2", 2), lambda ctx, b, e: None)
        if rest is not None:
            nursery.start_soon(rest)
        data = bytearray()
        with trio.fail_after(10):
            while len(data) < junk + 4 or len(data) < junk + 4 + int.from_bytes(
                data[junk : junk + 4], "big"
            ):
                data.extend(await peer.receive_some(1 << 20))
        frame = codec.decode(bytes(data[junk + 4 :]))
        assert isinstance(frame, Request) and frame.body == StopFetchersRequest("g", "m2", 2)
        assert not conn.closed
        await peer.aclose()
        nursery.cancel_scope.cancel()


class _WrongStart(FakeMember):
    """Answers StartFetchers with the wrong message (a confused or hostile client)."""

    async def handle(self, body):
        if isinstance(body, StartFetchersRequest):
            self.pushes.append((trio.current_time(), "start"))
            return StopFetchersResponse()
        return await super().handle(body)


async def test_a_member_answering_a_start_with_the_wrong_message_is_expelled(autojump_clock):
    # As one answering a stop with the wrong message: it has not said it fetches what it
    # was given, so the group is not stable with it counted as the owner.
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 2)
        a = _fake(broker, timeline, "a", 10.0)
        b = _WrongStart(broker, "g", ["t"], session_timeout=S, rebalance_timeout=10.0, name="b")
        async with connected(a), connected(b), trio.open_nursery() as nursery:
            await a.join()
            await rec.wait_for("stable")
            nursery.start_soon(heartbeat_forever, a, 1.0)
            mark = rec.mark()
            await b.join()
            removed = await rec.wait_for("removed", since=mark, member_id=b.member_id)
            assert removed["reason"].endswith("answered StartFetchers with StopFetchersResponse")
            assert removed["time"] < 10.0  # at once, not at its rebalance timeout
            assert [
                e for e in rec.all("started", since=mark) if e["member_id"] == b.member_id
            ] == []
            stable = await rec.wait_for("stable", since=mark)
            assert set(stable["ownership"].values()) == {a.member_id}
            assert rec.all("rebalance_failed", since=mark) == []
            nursery.cancel_scope.cancel()
