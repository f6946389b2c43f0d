"""A lean load for forming: N group members on non-blocking sockets, one epoll loop, no Trio.

``python -m bench._swarm SPEC`` (SPEC: the JSON of ``bench/heartbeat.py``'s
``--load``, of which it reads host, port, first, count and
session_timeout_ms, plus optional ``window`` and ``sources``) is what
``bench/forming.py --load-kind lean`` starts instead of the Trio load. Each
member still does what a real member does, so the broker's work is the
same: its own TCP connection, the two-step join (JoinGroup without a member
id, answered with ``rejoin`` and an id, then JoinGroup with it), an answer
to every StopFetchers and StartFetchers the coordinator pushes (whatever the
generation), and a heartbeat every third of its session timeout once
started. What it does not have is a Trio task, cancel scope, connection
object and codec per member: one ``select.epoll`` drives every socket,
connects are started a bounded number at a time (``window`` members whose
first JoinGroup is not answered yet; a bigger burst would only overflow the
broker's accept queue, and a dropped SYN is retried after a second, which
stalls the joins for longer than the broker's ``initial_rebalance_delay``),
from ``sources`` loopback addresses (from one, Linux's ``connect()`` stalls
past ~12,000 connections), frames are read in bulk and decoded with one
msgspec decoder, and the answers are one shared pre-encoded frame with the
push's correlation id spliced in. It prints ``ready {json}`` once every
member is started (its CPU seconds, when the last member was given its id,
admitted and started, the longest pause between two admissions and the
first ones longer than 0.1 s, the StopFetchers seen) and keeps answering
until stdin closes.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import select
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BenchError, say
from trio_coord.protocol.errors import ErrorCode
from trio_coord.protocol.framing import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE
from trio_coord.protocol.messages import (
    Frame,
    Goodbye,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    Request,
    Response,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
)

__all__ = ["DEFAULT_WINDOW", "run_swarm"]

GROUP = "bench"
TOPIC = "bench"
DEFAULT_WINDOW = 2048
"""Members connecting or waiting for their member id at once (a connect is not an accept).

Deep enough that the broker has ~0.4 s of joins queued (at ~0.2 ms each): on a
shared machine this process may wait that long for a CPU, and a broker that
runs out of joins for 0.1 s starts the first rebalance with part of the
group; shallow enough to stay under the accept queue (``somaxconn``, 4,096)."""
SOURCES = 16
"""Loopback source addresses (127.0.0.2, ...) the members' connections are spread over
(``sources`` in the spec; 0: every connection from the kernel's choice, 127.0.0.1)."""
LONG_GAP = 0.1
"""A pause between two admitting joins longer than this (the broker's default
``initial_rebalance_delay``) lets the first rebalance start with part of the group."""
_RECEIVE = 64 * 1024
_BIND_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # (Linux)
_CONNECTING, _JOINING, _ADMITTING, _JOINED = range(4)
_FIRST_JOIN, _SECOND_JOIN = 1, 2  # the correlation ids of a member's two JoinGroups
_IN = select.EPOLLIN
_OUT = select.EPOLLOUT


def _answer_parts(body: Any) -> tuple[bytes, bytes]:
    """A Response(``body``) frame body cut around its correlation id (encoded as 0)."""
    frame = msgspec.msgpack.encode(Response(0, ErrorCode.NONE, "", body))
    # [fixarray, tag 2, corr id 0 (positive fixint 0x00), error, message, body]
    if frame[1] != 0x02 or frame[2] != 0x00:
        raise AssertionError(f"unexpected Response encoding {frame.hex()}")
    return frame[:2], frame[3:]


_ANSWERS: dict[type, tuple[bytes, bytes]] = {
    StartFetchersRequest: _answer_parts(StartFetchersResponse()),
    StopFetchersRequest: _answer_parts(StopFetchersResponse()),
}


def _answer(kind: type, corr_id: int) -> bytes:
    """The framed answer to a push of ``kind``, its correlation id spliced in."""
    head, tail = _ANSWERS[kind]
    corr = msgspec.msgpack.encode(corr_id)
    size = len(head) + len(corr) + len(tail)
    return b"".join((size.to_bytes(HEADER_SIZE, "big"), head, corr, tail))


class _RunDelay:
    """How long this process has waited for a CPU so far (``/proc/self/schedstat``, Linux):
    whether a pause was this process not running, or the broker not answering."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> float:
        if self._fd is None:
            return 0.0
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0


class _Member:
    """One member's socket and where it is in joining; the loop does the rest."""

    __slots__ = (
        "client_id",
        "generation",
        "inbox",
        "member_id",
        "next_corr",
        "outbox",
        "sock",
        "started",
        "state",
    )

    def __init__(self, index: int, sock: socket.socket) -> None:
        self.client_id = f"bench-{index:05d}"
        self.sock = sock
        self.state = _CONNECTING
        self.member_id = ""
        self.generation = -1
        self.started = False
        self.inbox = b""
        self.outbox = b""
        self.next_corr = _SECOND_JOIN + 1  # heartbeats


class _Swarm:
    """Every member of one load process, and the one loop that drives them."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.address = (spec["host"], int(spec["port"]))
        self.first = int(spec["first"])
        self.count = int(spec["count"])
        self.window = max(1, int(spec.get("window") or DEFAULT_WINDOW))
        self.session_ms = int(spec["session_timeout_ms"])
        self.heartbeat_every = self.session_ms / 3000
        self.epoll = select.epoll()
        # One source address has 28,232 ephemeral ports (32768-60999), and Linux's connect()
        # searches them for a free one, one parity first: past ~12,000 connections to one
        # address connects stalled for up to a second (seconds of system CPU in all). On
        # loopback, spread the members over several source addresses; the broker sees
        # the same connections, from other addresses.
        loopback = self.address[0].startswith("127.")
        sources = int(spec.get("sources", SOURCES)) if loopback else 0
        self.sources = [f"127.0.0.{2 + i}" for i in range(min(sources, 250))]
        self.members: dict[int, _Member] = {}  # by file descriptor
        self.next_index = 0
        self.in_window = 0
        self.started = 0
        self.stops = 0
        self.heartbeats: deque[tuple[float, _Member]] = deque()  # due times only increase
        self.ready = False
        self.began = time.monotonic()
        self.cpu_began = time.process_time()
        self.last_admitted: float | None = None
        self.longest_gap = 0.0
        self.gap_at = (0.0, 0)  # (seconds since the start, members admitted before it)
        # The first pauses longer than the broker's initial_rebalance_delay: what starts
        # a rebalance before every member is in (seconds since the start, members, length).
        self.long_gaps: list[tuple[float, int, float, float]] = []
        self.run_delay = _RunDelay()
        self.delay_at_last = 0.0
        self.first_stop: float | None = None
        self.admitting = 0
        self.joined = 0
        self.marks: dict[str, float] = {}  # when the last id was given, the last join answered
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(Frame)

    # -- sending ---------------------------------------------------------------------------

    def _join(self, member: _Member, corr_id: int) -> bytes:
        body = JoinGroupRequest(
            GROUP,
            member.member_id,
            [TOPIC],
            self.session_ms,
            self.session_ms,
            ["range"],
            auto_commit=False,
            client_id=member.client_id,
        )
        return self._frame(Request(corr_id, body))

    def _frame(self, frame: Any) -> bytes:
        body = self.encoder.encode(frame)
        return len(body).to_bytes(HEADER_SIZE, "big") + body

    def _send(self, fd: int, member: _Member, data: bytes) -> None:
        if member.outbox:  # (already waiting to write: keep the order)
            member.outbox += data
            return
        try:
            sent = member.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._lost(fd, member, exc)
            return
        if sent < len(data):
            member.outbox = data[sent:]
            self.epoll.modify(fd, _IN | _OUT)

    def _flush(self, fd: int, member: _Member) -> None:
        try:
            sent = member.sock.send(member.outbox)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(fd, member, exc)
            return
        member.outbox = member.outbox[sent:]
        if not member.outbox:
            self.epoll.modify(fd, _IN)

    # -- connecting ------------------------------------------------------------------------

    def _connect_more(self) -> None:
        while self.in_window < self.window and self.next_index < self.count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.sources:
                # The port is picked at connect (not at bind), for this source address.
                sock.setsockopt(socket.IPPROTO_IP, _BIND_NO_PORT, 1)
                sock.bind((self.sources[self.next_index % len(self.sources)], 0))
            code = sock.connect_ex(self.address)
            if code not in (0, errno.EINPROGRESS):
                sock.close()
                raise BenchError(
                    f"member {self.first + self.next_index} could not connect to "
                    f"{self.address}: {os.strerror(code)}"
                )
            member = _Member(self.first + self.next_index, sock)
            self.next_index += 1
            self.in_window += 1
            fd = sock.fileno()
            self.members[fd] = member
            self.epoll.register(fd, _OUT)

    def _connected(self, fd: int, member: _Member) -> None:
        code = member.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise BenchError(f"{member.client_id} could not connect: {os.strerror(code)}")
        member.state = _JOINING
        self.epoll.modify(fd, _IN)
        self._send(fd, member, self._join(member, _FIRST_JOIN))

    # -- receiving -------------------------------------------------------------------------

    def _receive(self, fd: int, member: _Member) -> None:
        try:
            data = member.sock.recv(_RECEIVE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(fd, member, exc)
            return
        if not data:
            self._lost(fd, member, None)
            return
        buf = member.inbox + data if member.inbox else data
        pos, end = 0, len(buf)
        while end - pos >= HEADER_SIZE:
            size = int.from_bytes(buf[pos : pos + HEADER_SIZE], "big")
            if size > DEFAULT_MAX_FRAME_SIZE:
                raise BenchError(f"{member.client_id}: a frame of {size} bytes from the broker")
            stop = pos + HEADER_SIZE + size
            if stop > end:
                break
            self._frame_in(fd, member, self.decoder.decode(buf[pos + HEADER_SIZE : stop]))
            pos = stop
        member.inbox = buf[pos:] if pos < end else b""

    def _frame_in(self, fd: int, member: _Member, frame: Any) -> None:
        if isinstance(frame, Request):
            body = frame.body
            kind = type(body)
            if isinstance(body, StartFetchersRequest):
                member.generation = max(member.generation, body.generation)
                if not body.more and not member.started:
                    member.started = True
                    self.started += 1
                    self.heartbeats.append((time.monotonic() + self.heartbeat_every, member))
            elif isinstance(body, StopFetchersRequest):
                self.stops += 1
                if self.first_stop is None:
                    self.first_stop = time.monotonic() - self.began
            else:
                raise BenchError(f"{member.client_id}: unexpected push {body!r}")
            self._send(fd, member, _answer(kind, frame.corr_id))
        elif isinstance(frame, Response):
            self._response(fd, member, frame)
        elif isinstance(frame, Goodbye):
            raise BenchError(f"{member.client_id}: the broker said goodbye: {frame.message}")

    def _response(self, fd: int, member: _Member, frame: Response) -> None:
        corr = frame.corr_id
        if corr > _SECOND_JOIN:
            return  # a heartbeat's answer (an error during a rebalance is a member's normal)
        if frame.error:
            raise BenchError(
                f"{member.client_id}: JoinGroup refused ({ErrorCode(frame.error).name}: "
                f"{frame.message})"
            )
        joined = frame.body
        assert isinstance(joined, JoinGroupResponse)
        member.member_id = joined.member_id
        if corr == _FIRST_JOIN:
            self.in_window -= 1
            # As the Trio load: a member joins twice (given its id, then admitted).
            member.state = _ADMITTING
            self.admitting += 1
            if self.admitting == self.count:
                self.marks["ids_s"] = time.monotonic() - self.began
            self._send(fd, member, self._join(member, _SECOND_JOIN))
        else:
            # Admitted (the broker answers a join into a forming group at once): each
            # admission restarts the broker's initial_rebalance_delay, so the pauses
            # between two are what decide whether the first generation has everyone.
            member.state = _JOINED
            member.generation = max(member.generation, joined.generation)
            now = time.monotonic()
            delay = self.run_delay()
            if self.last_admitted is not None:
                gap = now - self.last_admitted
                if gap > self.longest_gap:
                    self.longest_gap = gap
                    self.gap_at = (self.last_admitted - self.began, self.joined)
                if gap > LONG_GAP and len(self.long_gaps) < 5:
                    at = self.last_admitted - self.began
                    self.long_gaps.append((at, self.joined, gap, delay - self.delay_at_last))
            self.last_admitted = now
            self.delay_at_last = delay
            self.joined += 1
            if self.joined == self.count:
                self.marks["joined_s"] = now - self.began

    def _lost(self, fd: int, member: _Member, exc: OSError | None) -> None:
        """The connection ended: a failure until every member is started; after, the
        parent stopping the broker first (then every connection ends), so just close."""
        if not self.ready:
            why = "the broker closed its connection" if exc is None else str(exc)
            raise BenchError(f"{member.client_id}: {why} before the group formed")
        self._drop(fd, member)

    def _drop(self, fd: int, member: _Member) -> None:
        if self.members.get(fd) is not member:
            return  # (dropped already, while its last frames were handled)
        self.epoll.unregister(fd)
        member.sock.close()
        del self.members[fd]

    # -- the loop --------------------------------------------------------------------------

    def _heartbeat(self, now: float) -> None:
        due = self.heartbeats
        while due and due[0][0] <= now:
            _, member = due.popleft()
            if member.sock.fileno() < 0:
                continue
            corr, member.next_corr = member.next_corr, member.next_corr + 1
            frame = self._frame(
                Request(corr, HeartbeatRequest(GROUP, member.member_id, member.generation))
            )
            self._send(member.sock.fileno(), member, frame)
            due.append((now + self.heartbeat_every, member))

    def _report(self) -> dict[str, Any]:
        return {
            "members": self.count,
            "formed_s": time.monotonic() - self.began,
            "cpu_s": time.process_time() - self.cpu_began,
            "longest_gap_s": self.longest_gap,
            "longest_gap_after": {"s": self.gap_at[0], "members": self.gap_at[1]},
            # (load_waited_s: of the pause, how long this process waited for a CPU)
            "long_gaps": [
                {"s": s, "members": n, "gap_s": g, "load_waited_s": w}
                for s, n, g, w in self.long_gaps
            ],
            "waited_for_cpu_s": self.run_delay(),
            "first_stop_s": self.first_stop,
            **self.marks,
            "stops": self.stops,
        }

    def run(self) -> None:
        """Join every member, say ``ready``, and answer the broker until stdin closes."""
        stdin = sys.stdin.fileno()
        os.set_blocking(stdin, False)
        self.epoll.register(stdin, _IN)
        self._connect_more()
        members = self.members
        while True:
            timeout = 1.0
            if self.heartbeats:
                timeout = max(0.0, min(timeout, self.heartbeats[0][0] - time.monotonic()))
            for fd, events in self.epoll.poll(timeout, 4096):
                if fd == stdin:
                    try:
                        if not os.read(stdin, 4096):
                            return  # the parent is done (or gone)
                    except BlockingIOError:
                        pass
                    continue
                member = members.get(fd)
                if member is None:
                    continue
                if member.state == _CONNECTING:
                    self._connected(fd, member)
                    continue
                if events & _OUT and member.outbox:
                    self._flush(fd, member)
                    if fd not in members:
                        continue
                if events & (_IN | select.EPOLLHUP | select.EPOLLERR):
                    self._receive(fd, member)
            self._connect_more()
            if self.heartbeats:
                self._heartbeat(time.monotonic())
            if not self.ready and self.started == self.count:
                self.ready = True
                say("ready", json.dumps(self._report()))


def run_swarm(spec: dict[str, Any]) -> None:
    """One lean load process: ``spec["count"]`` members from index ``spec["first"]``.

    Prints ``ready {json}`` once every member has been started, keeps
    answering the coordinator (a later generation's StopFetchers and
    StartFetchers, heartbeats) until stdin closes, then exits.
    """
    # A member is a few objects without cycles, created once: the collector would only
    # walk them again and again as the group grows.
    gc.disable()
    _Swarm(spec).run()


if __name__ == "__main__":
    try:
        run_swarm(json.loads(sys.argv[1]))
    except BenchError as exc:  # (the parent quotes this stderr in its own error)
        print(f"lean load: {exc}", file=sys.stderr)
        sys.exit(2)
