"""Heartbeats/s and latency of the broker, against a bare Trio echo server on the same frames.

``python bench/heartbeat.py [--members N] [--processes P] [--duration S] [--json] [--quick]``
runs two targets one after the other, each in its own process: a real broker
(``--serve-broker DIR``) and a bare Trio echo server (``--serve-echo``) that
reads the same length-prefixed frames with ``FrameReader`` and answers each
with a pre-encoded ``HeartbeatResponse`` frame (only the correlation id is
spliced in, so the client's multiplexing works; nothing is decoded). P load
processes (``--load SPEC``) simulate N members between them, each on its own
``open_connection``: against the broker a member sends a real JoinGroup,
answers the coordinator's StopFetchers/StartFetchers pushes, and reports ready
once it has started fetchers; the parent then waits until the group is STABLE
with all N members (a barrier: load processes say ``ready`` on stdout and
start only when the parent writes ``go`` on their stdin). Each member then
heartbeats in a closed loop, one outstanding request at a time, and after a
warm-up the completions inside the measured window give heartbeats/s and
latency percentiles. The same load code sends the same HeartbeatRequest frames
to the echo server, so the only difference between the two rows is the
broker's work; the ratios (broker/echo) are what travel between machines.

``--open-loop [--interval S] [--step K] [--p99-limit MS]`` asks another
question: how many members can one broker hold? Members heartbeat as real
ones do, each on its own timer (every S seconds, 3 by default, with ±10%
jitter, the first at a random point of the first interval), whatever the
latency: a late answer does not delay the next heartbeat, and latency counts
from when a heartbeat was due, so a stalled broker cannot hide its stall
(no coordinated omission). The group grows by K members a step, up to
``--members``; after each step forms (and stays stable), one window of
``--duration`` seconds is measured. The ramp stops at the first step whose
p99 passes the limit (50 ms) or that has errors; the report is one row per
step and the largest group held within the limit. No echo baseline: the
limit is absolute; instead each row says how late the load processes
themselves woke for a heartbeat due (p99): on a busy machine that, not the
broker, may be most of the latency.
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: this checkout's `bench` and `trio_coord`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    BenchError,
    add_bench_user,
    broker_security,
    chosen_params,
    client_security,
    cpu_count,
    format_table,
    latency_summary,
    make_certificates,
    process_cpu_seconds,
    process_rss_bytes,
    python_module,
    ratio,
    read_stdin_line,
    run_and_report,
    say,
    spawn,
)
from trio_coord.broker._gc import CollectorKeeper
from trio_coord.broker.server import open_broker
from trio_coord.client.admin import open_admin
from trio_coord.protocol.connection import Connection, RequestHandler, open_connection, serving
from trio_coord.protocol.errors import ConnectionClosedError, CoordError, ErrorCode
from trio_coord.protocol.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    FrameCodec,
    FrameReader,
)
from trio_coord.protocol.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    RequestBody,
    Response,
    ResponseBody,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
)
from trio_coord.security.client import ClientSecurity, secure_stream

__all__ = ["Params", "main", "run_benchmark"]

HOST = "127.0.0.1"
GROUP = "bench"
TOPIC = "bench"
TARGETS = ("broker", "echo")
_MODULE = "bench.heartbeat"
_STABLE_CONFIRM = 0.3  # the group must stay STABLE at one generation this long
_STABLE_POLL = 0.05


@dataclass(frozen=True, slots=True)
class Params:
    """What one run measures; the defaults are the full run, :data:`QUICK` the CI smoke run.

    ``processes`` defaults to one load process per CPU but one: the broker is a
    single Trio thread and gets a core of its own. On a 2-core machine that is
    one load process; a second would share a core with the server and slow
    down exactly what it measures.
    """

    members: int = 100
    processes: int = max(1, cpu_count() - 1)
    duration: float = 5.0
    warmup: float = 1.0
    session_timeout: float = 30.0
    quick: bool = False
    open_loop: bool = False
    """Members heartbeat on their own timers; ramp the group up (see the module docstring)."""
    interval: float = 3.0
    """Open loop: seconds between one member's heartbeats (±10% jitter)."""
    step: int = 0
    """Open loop: members added per step (0: a fifth of ``members``)."""
    p99_limit_ms: float = 50.0
    """Open loop: the ramp stops at the first step whose p99 passes this."""
    tls: bool = False
    """Also measure a broker whose listener speaks TLS (``--tls``): the ``secure`` row."""
    sasl: bool = False
    """Also measure a broker whose connections log in with SCRAM-SHA-256 (``--sasl``)."""
    park: bool = True
    """The broker parks idle connections (``park_idle_connections``; ``--no-park``: off)."""
    compare_parking: bool = False
    """Also measure the broker with parking off (``--compare-parking``): the ``unparked`` row."""

    def steps(self) -> list[int]:
        """Open loop: the group size after each step of the ramp."""
        step = self.step or max(1, math.ceil(self.members / 5))
        return [min(n, self.members) for n in range(step, self.members + step, step)]

    def split(self) -> list[tuple[int, int]]:
        """(first member index, member count) of each load process."""
        share, extra = divmod(self.members, self.processes)
        spans, first = [], 0
        for i in range(self.processes):
            count = share + (1 if i < extra else 0)
            spans.append((first, count))
            first += count
        return spans


QUICK = Params(members=16, processes=1, duration=1.0, warmup=0.3, quick=True)
QUICK_OPEN = Params(
    members=16,
    processes=1,
    duration=1.0,
    warmup=0.0,
    quick=True,
    open_loop=True,
    interval=0.3,
    step=8,
)
"""The ``--quick`` preset: small enough for a CI smoke test (a few seconds in all)."""


# -- the servers (each runs in its own process) ------------------------------------------


async def _until_stdin_closes() -> None:
    while await read_stdin_line():
        pass


async def serve_broker(
    data_dir: str,
    members: int = 0,
    certs: str | None = None,
    tls: bool = False,
    sasl: bool = False,
    park: bool = True,
) -> None:
    """Run a broker on ``data_dir`` for ``members`` members, print ``port N``, and run until
    stdin closes (with TLS from ``certs`` and/or SCRAM logins for the ``secure`` row; with
    ``park`` false, idle connections keep their reader tasks: the ``unparked`` row)."""
    await trio.Path(data_dir).mkdir(parents=True, exist_ok=True)
    limits = dict(
        max_group_size=1_000_000,
        max_partitions=1_000_000,
        max_connections_per_ip=1_000_000,  # every simulated member is on 127.0.0.1
        # (None: what fits ulimit -n, at most 10,000; beyond, ask for what the run needs)
        max_connections=members + 100 if members + 100 > 10_000 else None,
        tune_gc=True,  # as `trio-coord broker` runs
        park_idle_connections=park,
        **broker_security(certs, tls, sasl),
    )
    async with open_broker(data_dir, HOST, 0, **limits) as broker:
        if sasl:
            await add_bench_user(broker)
        say("port", broker.address[1])
        await _until_stdin_closes()


def _echo_response_parts() -> tuple[bytes, bytes]:
    """The encoded Response(HeartbeatResponse) frame body around its correlation id."""
    frame = FrameCodec().encode(Response(0, ErrorCode.NONE, "", HeartbeatResponse()))
    body = frame[HEADER_SIZE:]
    # [array header, tag 2, corr id 0 (positive fixint 0x00), error, message, body]
    if body[1] != 0x02 or body[2] != 0x00:
        raise AssertionError(f"unexpected Response encoding {body.hex()}")
    return body[:2], body[3:]


_RESPONSE_HEAD, _RESPONSE_TAIL = _echo_response_parts()
# The length of a msgpack unsigned int by its first byte: fixint, uint8/16/32/64.
_UINT_LENGTH = {0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9}


def _corr_id_bytes(body: bytes) -> bytes:
    """The msgpack-encoded correlation id of a Request frame body, sliced, not decoded."""
    # A Request is [tag 1, corr id, body]: a fixarray of 3, then the tag.
    if len(body) < 3 or body[0] != 0x93 or body[1] != 0x01:
        raise ValueError("not a Request frame")
    first = body[2]
    size = 1 if first < 0x80 else _UINT_LENGTH.get(first, 0)
    if not size:
        raise ValueError("the correlation id is not an unsigned int")
    return body[2 : 2 + size]


async def _echo_connection(stream: trio.SocketStream) -> None:
    reader = FrameReader(stream, DEFAULT_MAX_FRAME_SIZE)
    head, tail = _RESPONSE_HEAD, _RESPONSE_TAIL
    try:
        while (body := await reader.read_frame()) is not None:
            corr = _corr_id_bytes(body)
            size = len(head) + len(corr) + len(tail)
            await stream.send_all(b"".join((size.to_bytes(HEADER_SIZE, "big"), head, corr, tail)))
    except (trio.BrokenResourceError, trio.ClosedResourceError, CoordError, ValueError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def serve_echo() -> None:
    """Run the baseline echo server, print ``port N``, and run until stdin closes.

    Its collector is kept as the broker's is (``tune_gc``: a server's
    thresholds, long-lived objects frozen): with CPython's defaults the echo
    server pays young collections that grow with the number of connections
    (each waiting reader's fresh coroutines), and the ratio would flatter
    the broker.
    """
    async with trio.open_nursery() as nursery:
        nursery.start_soon(CollectorKeeper(settle=0.0, freeze_every=1.0).run)
        listeners = await nursery.start(partial(trio.serve_tcp, _echo_connection, 0, host=HOST))
        say("port", listeners[0].socket.getsockname()[1])
        await _until_stdin_closes()
        nursery.cancel_scope.cancel()


# -- the load process --------------------------------------------------------------------

_STOPPED = StopFetchersResponse()
_STARTED = StartFetchersResponse()


class _MemberHandler(RequestHandler):
    """Answers the coordinator's pushes as a consumer without fetchers would, at once."""

    def __init__(self, load: _Load) -> None:
        self.load = load
        self.generation = -1
        self.started = trio.Event()

    def handle_now(self, body: RequestBody) -> ResponseBody | None:
        """Answer StopFetchers and StartFetchers (remembering the generation)."""
        start, end = self.load.window
        if start <= time.perf_counter() < end:
            self.load.pushes += 1  # a rebalance in the window: the figures are suspect
        if isinstance(body, StopFetchersRequest):
            return _STOPPED
        if isinstance(body, StartFetchersRequest):
            self.generation = body.generation
            self.started.set()
            return _STARTED
        return None  # anything else: refused by RequestHandler.handle


class _Load:
    """What the members of one load process share: the barriers, the window, the samples."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.ready = 0
        self.all_ready = trio.Event()
        self.go = trio.Event()
        self.finished = 0
        self.all_finished = trio.Event()
        self.release = trio.Event()  # members keep their connections open until this
        self.window = (0.0, 0.0)  # time.perf_counter() values: [start, end)
        self.samples = array.array("d")
        self.errors = 0
        self.lost = 0
        self.pushes = 0

    def member_ready(self) -> None:
        self.ready += 1
        if self.ready == self.spec["count"]:
            self.all_ready.set()

    def member_finished(self) -> None:
        self.finished += 1
        if self.finished == self.spec["count"]:
            self.all_finished.set()

    def start(self) -> None:
        start = time.perf_counter() + self.spec["warmup"]
        self.window = (start, start + self.spec["duration"])
        self.go.set()


async def _join_group(
    conn: Connection, spec: dict[str, Any], client_id: str, handler: _MemberHandler
) -> str:
    """Join the bench group as a new member; return its id once its fetchers are started."""
    member_id = ""
    for _ in range(2):  # a new member is given its id first, then joins with it
        joined = await conn.request(
            JoinGroupRequest(
                GROUP,
                member_id,
                [TOPIC],
                spec["session_timeout_ms"],
                spec["session_timeout_ms"],
                ["range"],
                auto_commit=False,
                client_id=client_id,
            )
        )
        assert isinstance(joined, JoinGroupResponse)
        member_id = joined.member_id
    await handler.started.wait()
    return member_id


async def _member(load: _Load, index: int) -> None:
    spec = load.spec
    broker = spec["mode"] in ("broker", "secure")
    client_id = f"bench-{index:05d}"
    handler = _MemberHandler(load)
    async with _open(spec, handler) as conn:
        if broker:
            member_id = await _join_group(conn, spec, client_id, handler)
        else:  # the same shape of id the broker hands out, so the frames are the same size
            member_id = f"{client_id}-{uuid.uuid4().hex[:12]}"
            handler.generation = 1
        load.member_ready()
        keepalive = spec["session_timeout_ms"] / 3000
        while not load.go.is_set():  # keep the session alive while the others join
            with trio.move_on_after(keepalive):
                await load.go.wait()
            if broker and not load.go.is_set():
                try:
                    await conn.request(HeartbeatRequest(GROUP, member_id, handler.generation))
                except CoordError:
                    pass
        await _heartbeat_loop(load, conn.request, member_id, handler)
        load.member_finished()
        await load.release.wait()


@asynccontextmanager
async def _open(spec: dict[str, Any], handler: RequestHandler) -> AsyncIterator[Connection]:
    """A member's connection: plain, or with the TLS and login of the ``secure`` row."""
    security = client_security(spec.get("certs"), spec.get("tls", False), spec.get("sasl", False))
    if not security:
        async with open_connection(spec["host"], spec["port"], handler) as conn:
            yield conn
        return
    tcp = await trio.open_tcp_stream(spec["host"], spec["port"])
    stream = await secure_stream(
        tcp, spec["host"], ClientSecurity(security.get("ssl_context"), security.get("sasl"))
    )
    async with serving(Connection(stream, handler)) as conn:
        yield conn


async def _heartbeat_loop(
    load: _Load, request: Any, member_id: str, handler: _MemberHandler
) -> None:
    """Heartbeat back to back until the window ends; record completions inside it."""
    start, end = load.window
    samples = load.samples
    clock = time.perf_counter
    heartbeat = HeartbeatRequest(GROUP, member_id, handler.generation)
    while (sent := clock()) < end:
        if heartbeat.generation != handler.generation:
            heartbeat = HeartbeatRequest(GROUP, member_id, handler.generation)
        try:
            await request(heartbeat)
        except ConnectionClosedError:
            load.lost += 1
            return
        except CoordError:
            if start <= clock() < end:
                load.errors += 1
            continue
        done = clock()
        if start <= done < end:
            samples.append(done - sent)


async def run_load(spec: dict[str, Any]) -> None:
    """One load process: ``spec["count"]`` members, ready → (stdin ``go``) → measure → done.

    Prints ``ready`` once every member is connected (and, against the broker,
    joined and started), heartbeats on ``go``, writes its latency samples
    (float seconds) to ``spec["out"]`` and prints ``done {json}``. The
    members keep their connections until stdin closes, so that the parent can
    stop the server first and spare it a storm of departures (and rebalances)
    after the measurement. Exits early if stdin closes before ``go``.
    """
    load = _Load(spec)
    _tune_gc()
    async with trio.open_nursery() as nursery:
        for i in range(spec["count"]):
            nursery.start_soon(_member, load, spec["first"] + i)
        await load.all_ready.wait()
        _freeze()
        say("ready")
        if (await read_stdin_line()).strip() != "go":
            nursery.cancel_scope.cancel()
            return
        load.start()
        await trio.sleep(spec["warmup"])
        cpu = time.process_time()
        await trio.sleep(spec["duration"])
        cpu = time.process_time() - cpu
        await load.all_finished.wait()
        await trio.Path(spec["out"]).write_bytes(load.samples.tobytes())
        report = {
            "requests": len(load.samples),
            "errors": load.errors,
            "lost": load.lost,
            "cpu": cpu / spec["duration"],
            "pushes": load.pushes,
        }
        say("done", json.dumps(report))
        await _until_stdin_closes()
        load.release.set()


def _tune_gc() -> None:
    """A load process holds thousands of members: collect as the broker does (tune_gc).

    Otherwise its own full collections (a quarter of a second at a few
    thousand members) stall every member at once, and the latency measured
    is the load's, not the broker's.
    """
    gc.set_threshold(50_000, 20, 100)


def _freeze() -> None:
    """Every member is ready: what they hold lives until the end (out of the collector's walks)."""
    gc.collect()
    gc.freeze()


# -- the open-loop load process -----------------------------------------------------------

_JITTER = 0.1  # a member's interval varies by this fraction either way


class _OpenLoad(_Load):
    """An open-loop load process: members added on command, heartbeating on their own timers."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.wanted = 0  # members asked for so far
        self.in_window = 0  # heartbeats due in the window (answered or not)
        self.lags = array.array("d")  # how late the load itself woke for a heartbeat due

    def member_ready(self) -> None:
        self.ready += 1
        if self.ready == self.wanted:
            self.all_ready.set()

    def add(self, count: int) -> None:
        self.wanted += count
        self.all_ready = trio.Event()


async def _open_member(load: _OpenLoad, index: int) -> None:
    """One member: join, then heartbeat every interval (jittered) until the process ends.

    A heartbeat's latency counts from when it was due, not from when it was
    sent: a member that fell behind (its previous answer came late) sends at
    once, and its lateness is measured.
    """
    spec = load.spec
    interval = spec["interval"]
    rng = random.Random(index)
    handler = _MemberHandler(load)
    async with open_connection(spec["host"], spec["port"], handler) as conn:
        member_id = await _join_group(conn, spec, f"bench-{index:05d}", handler)
        load.member_ready()
        clock = time.perf_counter
        due = clock() + rng.uniform(0, interval)
        while True:
            await trio.sleep(max(0.0, due - clock()))
            start, end = load.window
            counted = start <= due < end
            if counted:
                load.in_window += 1
                load.lags.append(clock() - due)
            heartbeat = HeartbeatRequest(GROUP, member_id, handler.generation)
            try:
                await conn.request(heartbeat)
            except ConnectionClosedError:
                load.lost += 1
                return
            except CoordError:  # (a rebalance under way: the next heartbeat says more)
                if counted:
                    load.errors += 1
            else:
                if counted:
                    load.samples.append(clock() - due)
            due += interval * rng.uniform(1 - _JITTER, 1 + _JITTER)


async def run_open_load(spec: dict[str, Any]) -> None:
    """One open-loop load process, driven by lines on stdin until stdin closes.

    ``add FIRST COUNT``: start members FIRST.. (COUNT of them); prints
    ``ready`` once all members so far are started. ``measure SECONDS``: the
    heartbeats due in the next SECONDS are the window; once they are
    answered (or after a grace), writes their latencies to ``spec["out"]``
    and prints ``measured {json}``.
    """
    load = _OpenLoad(spec)
    _tune_gc()
    async with trio.open_nursery() as nursery:
        while line := (await read_stdin_line()).strip():
            command, *args = line.split()
            if command == "add":
                first, count = int(args[0]), int(args[1])
                load.add(count)
                for index in range(first, first + count):
                    nursery.start_soon(_open_member, load, index)
                await load.all_ready.wait()
                _freeze()
                say("ready")
            elif command == "measure":
                duration = float(args[0])
                load.samples, load.lags = array.array("d"), array.array("d")
                load.errors = load.lost = load.pushes = load.in_window = 0
                start = time.perf_counter()
                load.window = (start, start + duration)
                cpu = time.process_time()
                await trio.sleep(duration)
                cpu = time.process_time() - cpu
                # Heartbeats due in the window may still be on their way: wait for them
                # (bounded: one still unanswered is counted late).
                grace_end = time.perf_counter() + max(1.0, spec["interval"])
                while time.perf_counter() < grace_end:
                    if len(load.samples) + load.errors + load.lost >= load.in_window:
                        break
                    await trio.sleep(0.05)
                unanswered = load.in_window - len(load.samples) - load.errors
                await trio.Path(spec["out"]).write_bytes(load.samples.tobytes())
                report = {
                    "requests": len(load.samples),
                    "due": load.in_window,
                    "errors": load.errors,
                    "unanswered": max(0, unanswered),
                    "lost": load.lost,
                    "cpu": cpu / duration,
                    "pushes": load.pushes,
                    "wake_lag_p99_ms": latency_summary(load.lags)["p99"],
                }
                say("measured", json.dumps(report))
        nursery.cancel_scope.cancel()


# -- the parent ----------------------------------------------------------------------------


class _StableWatch:
    """Polls DescribeGroup until the bench group is STABLE with every member, for a while."""

    def __init__(self, bootstrap: str, members: int, security: dict[str, Any]) -> None:
        self.bootstrap = bootstrap
        self.members = members
        self.security = security
        self.seen = "nothing yet"
        self.stable_since: float | None = None
        """When (``trio.current_time()``) the generation returned was first seen STABLE."""

    async def wait(self) -> int:
        """Return the group's generation once it stayed STABLE with all members."""
        async with open_admin(self.bootstrap, **self.security) as admin:
            since: tuple[int, float] | None = None  # (generation, first seen stable)
            while True:
                group = await admin.describe_group(GROUP)
                self.seen = (
                    f"{group.state} at generation {group.generation} "
                    f"with {len(group.members)} members"
                )
                if group.state == "STABLE" and len(group.members) == self.members:
                    now = trio.current_time()
                    if since is None or since[0] != group.generation:
                        since = (group.generation, now)
                    elif now - since[1] >= _STABLE_CONFIRM:
                        self.stable_since = since[1]
                        return group.generation
                else:
                    since = None
                await trio.sleep(_STABLE_POLL)


def _load_spec(
    target: str, params: Params, port: int, first: int, count: int, certs: str | None = None
) -> dict[str, Any]:
    """What one load process is told (as JSON on its command line); see :func:`run_load`."""
    secure = target == "secure"
    return {
        "certs": certs,
        "tls": secure and params.tls,
        "sasl": secure and params.sasl,
        "mode": "broker" if target == "unparked" else target,
        "host": HOST,
        "port": port,
        "first": first,
        "count": count,
        "session_timeout_ms": round(params.session_timeout * 1000),
        "warmup": params.warmup,
        "duration": params.duration,
    }


async def _measure(target: str, params: Params, workdir: Path) -> dict[str, Any]:
    """Run one target (``broker`` or ``echo``) with its own server and load processes."""
    certs = None
    security: dict[str, Any] = {}
    if target in ("broker", "secure", "unparked"):
        server_argv = python_module(
            _MODULE,
            "--serve-broker",
            str(workdir / f"{target}-data"),
            "--members",
            str(params.members),
        )
        if target == "unparked" or not params.park:
            server_argv.append("--no-park")
        if target == "secure":
            certs = make_certificates(workdir / "certs")
            server_argv += ["--certs", certs]
            server_argv += ["--tls"] if params.tls else []
            server_argv += ["--sasl"] if params.sasl else []
            security = client_security(certs, params.tls, params.sasl)
    else:
        server_argv = python_module(_MODULE, "--serve-echo")
    ready_timeout = 30.0 + 0.05 * params.members
    generation = None
    async with spawn(server_argv, f"{target}-server", workdir) as server:
        with server.within(30.0, "print its port"):
            port = int(await server.expect("port "))
        bootstrap = f"{HOST}:{port}"
        if target != "echo":
            async with open_admin(bootstrap, **security) as admin:
                await admin.create_topic(TOPIC, params.members)
        rss_before, joins_began = process_rss_bytes(server.pid), trio.current_time()
        cpu_began = process_cpu_seconds(server.pid)
        async with AsyncExitStack() as stack:
            loads = []
            for i, (first, count) in enumerate(params.split()):
                spec = _load_spec(target, params, port, first, count, certs)
                spec["out"] = str(workdir / f"{target}-load-{i}.latencies")
                argv = python_module(_MODULE, "--load", json.dumps(spec))
                loads.append(
                    (
                        spec,
                        await stack.enter_async_context(spawn(argv, f"{target}-load-{i}", workdir)),
                    )
                )
            for _, load in loads:
                try:
                    with load.within(ready_timeout, "get all its members ready"):
                        await load.expect("ready")
                except BenchError as exc:  # the server's side of the story helps most
                    tail = server.stderr_tail().strip() or "(nothing)"
                    raise BenchError(f"{exc}\n{target} server's stderr:\n{tail}") from None
            if target != "echo":
                watch = _StableWatch(bootstrap, params.members, security)
                with trio.move_on_after(ready_timeout):
                    generation = await watch.wait()
                if generation is None:
                    raise BenchError(
                        f"the group did not become stable with {params.members} members in "
                        f"{ready_timeout:g} s (last seen: {watch.seen}); broker stderr:\n"
                        f"{server.stderr_tail() or '(nothing)'}"
                    )
            formed_s = trio.current_time() - joins_began  # (load processes' start included)
            cpu_formed = process_cpu_seconds(server.pid)
            load_cpu_formed = [process_cpu_seconds(load.pid) for _, load in loads]
            rss_after = process_rss_bytes(server.pid)
            for _, load in loads:
                await load.send_line("go")
            await trio.sleep(params.warmup)
            cpu_before, t_before = process_cpu_seconds(server.pid), trio.current_time()
            await trio.sleep(params.duration)
            cpu_after, t_after = process_cpu_seconds(server.pid), trio.current_time()
            reports = []
            for _, load in loads:
                with load.within(30.0, "report its results"):
                    reports.append(json.loads(await load.expect("done ")))
            await server.stop()  # first, while the members are still connected: see run_load
    samples = array.array("d")
    for spec, _ in loads:
        samples.frombytes(await trio.Path(spec["out"]).read_bytes())
    latency = latency_summary(samples)
    server_cpu = server_us = None
    if cpu_before is not None and cpu_after is not None:
        server_cpu = (cpu_after - cpu_before) / (t_after - t_before)
        server_us = server_cpu / (len(samples) / params.duration) * 1e6 if samples else None
    result = {
        "heartbeats_per_s": len(samples) / params.duration,
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        "latency_ms": latency,
        "requests": len(samples),
        "errors": sum(r["errors"] for r in reports),
        "lost_connections": sum(r["lost"] for r in reports),
        "pushes_in_window": sum(r["pushes"] for r in reports),
        "server_cpu": server_cpu,
        "server_cpu_us_per_heartbeat": server_us,
        "load_cpu": [r["cpu"] for r in reports],
    }
    if generation is not None:
        result["generation"] = generation
        result["group_formed_s"] = formed_s
        # CPU seconds spent while the group formed: the server's (accepting, joining,
        # the first rebalance) and the load processes' (their start included), apart
        # from the wall time, which either side may dominate.
        if cpu_began is not None and cpu_formed is not None:
            result["formed_server_cpu_s"] = cpu_formed - cpu_began
        if None not in load_cpu_formed:
            result["formed_load_cpu_s"] = sum(c for c in load_cpu_formed if c is not None)
        if rss_before is not None and rss_after is not None:
            result["rss_per_member_bytes"] = (rss_after - rss_before) / params.members
    if not samples:
        raise BenchError(f"no {target} heartbeat completed in the {params.duration:g} s window")
    return result


async def run_benchmark(params: Params) -> dict[str, Any]:
    """Measure the broker, then the echo baseline; return the JSON-ready result."""
    load_before = _load_average()
    with tempfile.TemporaryDirectory(prefix="trio-coord-bench-") as tmp:
        results = {target: await _measure(target, params, Path(tmp)) for target in _targets(params)}
    broker, echo = results["broker"], results["echo"]
    secure = results.get("secure")
    extra: dict[str, Any] = {}
    unparked = results.get("unparked")
    if unparked is not None:
        extra["unparked"] = unparked
        extra["unparked_ratio"] = {
            "throughput": ratio(unparked["heartbeats_per_s"], echo["heartbeats_per_s"]),
            "p50": ratio(unparked["p50_ms"], echo["p50_ms"]),
            "p99": ratio(unparked["p99_ms"], echo["p99_ms"]),
            "server_cpu_per_heartbeat": ratio(
                unparked["server_cpu_us_per_heartbeat"] or math.nan,
                echo["server_cpu_us_per_heartbeat"] or math.nan,
            ),
        }
    if secure is not None:
        extra["secure"] = secure
        extra["secure_vs_plain"] = {
            "throughput": ratio(secure["heartbeats_per_s"], broker["heartbeats_per_s"]),
            "p50": ratio(secure["p50_ms"], broker["p50_ms"]),
            "p99": ratio(secure["p99_ms"], broker["p99_ms"]),
        }
    return {
        **extra,
        "bench": "heartbeat",
        "params": {**asdict(params), "cpus": cpu_count(), "load_average": load_before},
        "broker": broker,
        "echo": echo,
        "ratio": {
            "throughput": ratio(broker["heartbeats_per_s"], echo["heartbeats_per_s"]),
            "p50": ratio(broker["p50_ms"], echo["p50_ms"]),
            "p99": ratio(broker["p99_ms"], echo["p99_ms"]),
            "server_cpu_per_heartbeat": ratio(
                broker["server_cpu_us_per_heartbeat"] or math.nan,
                echo["server_cpu_us_per_heartbeat"] or math.nan,
            ),
        },
    }


async def run_open_loop(params: Params) -> dict[str, Any]:
    """Ramp an open-loop group up step by step until p99 passes the limit; the JSON result."""
    load_before = _load_average()
    steps: list[dict[str, Any]] = []
    stopped = f"reaching --members ({params.members})"
    with tempfile.TemporaryDirectory(prefix="trio-coord-bench-") as tmp:
        workdir = Path(tmp)
        server_argv = python_module(
            _MODULE,
            "--serve-broker",
            str(workdir / "broker-data"),
            "--members",
            str(params.members),
            *([] if params.park else ["--no-park"]),
        )
        async with spawn(server_argv, "broker-server", workdir) as server:
            with server.within(30.0, "print its port"):
                port = int(await server.expect("port "))
            bootstrap = f"{HOST}:{port}"
            async with open_admin(bootstrap) as admin:
                await admin.create_topic(TOPIC, params.members)
            spec = _load_spec("broker", params, port, 0, 0)
            spec["interval"] = params.interval
            loads = []
            async with AsyncExitStack() as stack:
                for i in range(params.processes):
                    out = str(workdir / f"open-load-{i}.latencies")
                    argv = python_module(_MODULE, "--open-load", json.dumps({**spec, "out": out}))
                    child = await stack.enter_async_context(spawn(argv, f"open-load-{i}", workdir))
                    loads.append((out, child))
                rss_before = process_rss_bytes(server.pid)
                held = 0
                for size in params.steps():
                    row = await _open_step(params, server, bootstrap, loads, size, held)
                    rss = process_rss_bytes(server.pid)
                    if rss is not None and rss_before is not None:
                        row["rss_per_member_bytes"] = (rss - rss_before) / size
                    steps.append(row)
                    if row["p99_ms"] > params.p99_limit_ms or row["errors"] or row["unanswered"]:
                        stopped = f"p99 or errors at {size} members"
                        break
                    held = size
                await server.stop()
    return {
        "bench": "heartbeat-open-loop",
        "params": {**asdict(params), "cpus": cpu_count(), "load_average": load_before},
        "steps": steps,
        "held": held,
        "stopped_by": stopped,
    }


async def _open_step(
    params: Params, server: Any, bootstrap: str, loads: list[Any], size: int, before: int
) -> dict[str, Any]:
    """Grow the open-loop group from ``before`` to ``size`` members and measure one window."""
    began = trio.current_time()
    share, extra = divmod(size - before, len(loads))
    first = before
    for i, (_, load) in enumerate(loads):
        count = share + (1 if i < extra else 0)
        await load.send_line(f"add {first} {count}")
        first += count
    ready_timeout = 30.0 + 0.05 * size
    for _, load in loads:
        with load.within(ready_timeout, f"get its members of {size} started"):
            await load.expect("ready")
    watch = _StableWatch(bootstrap, size, {})  # (the open loop runs no secured broker)
    generation = None
    with trio.move_on_after(ready_timeout):
        generation = await watch.wait()
    if generation is None:
        raise BenchError(
            f"the group did not become stable with {size} members in {ready_timeout:g} s "
            f"(last seen: {watch.seen}); broker stderr:\n{server.stderr_tail() or '(nothing)'}"
        )
    formed_s = trio.current_time() - began
    await trio.sleep(params.interval)  # every member's timer is past its random start
    cpu_before, t_before = process_cpu_seconds(server.pid), trio.current_time()
    for _, load in loads:
        await load.send_line(f"measure {params.duration}")
    reports = []
    for _, load in loads:
        with load.within(params.duration + params.interval + 30.0, "report its window"):
            reports.append(json.loads(await load.expect("measured ")))
    cpu_after, t_after = process_cpu_seconds(server.pid), trio.current_time()
    samples = array.array("d")
    for out, _ in loads:
        samples.frombytes(await trio.Path(out).read_bytes())
    latency = latency_summary(samples)
    server_cpu = None
    if cpu_before is not None and cpu_after is not None:
        server_cpu = (cpu_after - cpu_before) / (t_after - t_before)
    return {
        "members": size,
        "formed_s": formed_s,
        "generation": generation,
        "heartbeats_per_s": len(samples) / params.duration,
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"] if samples else math.inf,
        "latency_ms": latency,
        "errors": sum(r["errors"] for r in reports),
        "unanswered": sum(r["unanswered"] for r in reports),
        "lost_connections": sum(r["lost"] for r in reports),
        "pushes_in_window": sum(r["pushes"] for r in reports),
        "server_cpu": server_cpu,
        "load_cpu": [r["cpu"] for r in reports],
        # The load's own lateness: a heartbeat due at t was sent this late (p99, worst load
        # process). When it is near p99_ms, the machine, not the broker, set the latency.
        "load_wake_lag_p99_ms": max(r["wake_lag_p99_ms"] for r in reports),
    }


def render_open(result: dict[str, Any]) -> str:
    """The open-loop result: one row per step, then the largest group held within the limit."""
    p = result["params"]
    lines = [
        f"heartbeat, open loop: each member every {p['interval']:g} s (±{_JITTER:.0%}); "
        f"{p['processes']} load process(es), {p['cpus']} CPUs, load average "
        f"{p['load_average']}; {p['duration']:g} s window per step",
        "",
    ]
    rows = [
        [
            f"{r['members']:,}",
            f"{r['formed_s']:.1f}",
            f"{r['heartbeats_per_s']:,.0f}",
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
            _percent(r["server_cpu"]),
            "-"
            if r.get("rss_per_member_bytes") is None
            else f"{r['rss_per_member_bytes'] / 1024:.1f}",
            " ".join(_percent(c) for c in r["load_cpu"]),
            f"{r['load_wake_lag_p99_ms']:.2f}",
            r["errors"] + r["unanswered"],
        ]
        for r in result["steps"]
    ]
    headers = [
        "members",
        "formed s",
        "heartbeats/s",
        "p50 ms",
        "p99 ms",
        "broker CPU",
        "KiB/member",
        "load CPU",
        "load lag p99 ms",
        "errors",
    ]
    lines.append(format_table(headers, rows))
    lines.append(
        f"held {result['held']:,} members with p99 <= {p['p99_limit_ms']:g} ms "
        f"(stopped by {result['stopped_by']})"
    )
    return "\n".join(lines)


def _targets(params: Params) -> tuple[str, ...]:
    """The rows measured: the broker, the echo baseline, and the secured broker and the
    broker with parking off if asked."""
    targets = ("broker", "unparked", "echo") if params.compare_parking else TARGETS
    return (*targets, "secure") if params.tls or params.sasl else targets


def _load_average() -> float | None:
    """The machine's 1-minute load average before the run (others' work skews the figures)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _micros(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def render(result: dict[str, Any]) -> str:
    """The result as a short header line, an aligned table, and any warnings."""
    p = result["params"]
    members = "member" if p["members"] == 1 else "members"
    loads = "load process" if p["processes"] == 1 else "load processes"
    lines = [
        f"heartbeat: {p['members']} {members}, {p['processes']} {loads}, "
        f"{p['cpus']} CPUs, load average {p['load_average']}; "
        f"{p['duration']:g} s window after {p['warmup']:g} s warm-up",
        "",
    ]
    rows = []
    for target in (t for t in ("broker", "unparked", "echo", "secure") if t in result):
        r = result[target]
        rows.append(
            [
                target,
                f"{r['heartbeats_per_s']:,.0f}",
                f"{r['p50_ms']:.3f}",
                f"{r['p99_ms']:.3f}",
                _percent(r["server_cpu"]),
                _micros(r["server_cpu_us_per_heartbeat"]),
                " ".join(_percent(c) for c in r["load_cpu"]),
                r["errors"],
            ]
        )
    q = result["ratio"]
    rows.append(
        [
            "broker/echo",
            f"{q['throughput']:.2f}x",
            f"{q['p50']:.2f}x",
            f"{q['p99']:.2f}x",
            "",
            f"{q['server_cpu_per_heartbeat']:.2f}x",
        ]
    )
    unparked = result.get("unparked_ratio")
    if unparked is not None:
        rows.append(
            [
                "unparked/echo",
                f"{unparked['throughput']:.2f}x",
                f"{unparked['p50']:.2f}x",
                f"{unparked['p99']:.2f}x",
                "",
                f"{unparked['server_cpu_per_heartbeat']:.2f}x",
            ]
        )
    secure = result.get("secure_vs_plain")
    if secure is not None:
        what = "+".join(n for n in ("tls", "sasl") if p.get(n))
        rows.append(
            [
                f"secure({what})/broker",
                f"{secure['throughput']:.2f}x",
                f"{secure['p50']:.2f}x",
                f"{secure['p99']:.2f}x",
                "",
                "",
            ]
        )
    headers = [
        "target",
        "heartbeats/s",
        "p50 ms",
        "p99 ms",
        "server CPU",
        "server us/hb",
        "load CPU",
        "errors",
    ]
    lines.append(format_table(headers, rows))
    for target in ("broker", "unparked"):
        broker = result.get(target)
        if broker is None or "group_formed_s" not in broker:
            continue
        per_member = broker.get("rss_per_member_bytes")
        lines.append(
            f"{target}: the group of {p['members']} formed in {broker['group_formed_s']:.1f} s "
            "(load processes starting included); broker memory per member: "
            + ("unknown" if per_member is None else f"{per_member / 1024:.1f} KiB (RSS)")
        )
        if "formed_server_cpu_s" in broker:
            server_cpu = broker["formed_server_cpu_s"]
            load_cpu = broker.get("formed_load_cpu_s")
            lines.append(
                f"while it formed: broker CPU {server_cpu:.2f} s "
                f"({server_cpu / p['members'] * 1e6:.0f} us per member admitted), load CPU "
                + ("unknown" if load_cpu is None else f"{load_cpu:.2f} s")
            )
    for target in TARGETS:
        r = result[target]
        if r["errors"] or r["lost_connections"] or r["pushes_in_window"]:
            lines.append(
                f"warning: {target}: {r['errors']} error(s), {r['lost_connections']} lost "
                f"connection(s), {r['pushes_in_window']} rebalance push(es) in the window"
            )
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/heartbeat.py",
        description="Heartbeats/s and latency of the broker against a bare Trio echo server.",
    )
    defaults = Params()
    parser.add_argument(
        "--members", type=int, help=f"simulated members (default {defaults.members})"
    )
    parser.add_argument(
        "--processes",
        type=int,
        help=f"load processes (default: CPUs - 1, here {defaults.processes})",
    )
    parser.add_argument(
        "--duration", type=float, help=f"measured seconds (default {defaults.duration:g})"
    )
    parser.add_argument(
        "--warmup", type=float, help=f"unmeasured seconds first (default {defaults.warmup:g})"
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        help=f"members' session timeout in s (default {defaults.session_timeout:g})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI smoke preset: {QUICK.members} members, {QUICK.duration:g} s",
    )
    parser.add_argument(
        "--open-loop",
        action="store_true",
        help="members heartbeat on their own timers; ramp the group up until p99 passes "
        "--p99-limit (how many members one broker holds)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        help=f"open loop: seconds between a member's heartbeats (default {defaults.interval:g})",
    )
    parser.add_argument(
        "--step", type=int, help="open loop: members added per step (default: members / 5)"
    )
    parser.add_argument(
        "--p99-limit",
        dest="p99_limit_ms",
        type=float,
        help=f"open loop: the p99 in ms that ends the ramp (default {defaults.p99_limit_ms:g})",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also measure a broker with TLS (the 'secure' row, and its ratio to plaintext)",
    )
    parser.add_argument(
        "--sasl",
        action="store_true",
        help="also measure a broker whose members log in with SCRAM-SHA-256",
    )
    parser.add_argument(
        "--compare-parking",
        action="store_true",
        help="also measure the broker with parking off (the 'unparked' row, and its ratio "
        "to the echo server)",
    )
    parser.add_argument(
        "--no-park",
        action="store_true",
        help="run the broker with parking off (park_idle_connections=False)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    internal = argparse.SUPPRESS
    parser.add_argument("--certs", help=internal)
    parser.add_argument("--serve-broker", metavar="DIR", help=internal)
    parser.add_argument("--serve-echo", action="store_true", help=internal)
    parser.add_argument("--load", metavar="SPEC", help=internal)
    parser.add_argument("--open-load", metavar="SPEC", help=internal)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 if the benchmark could not run)."""
    args = _parse(argv)
    if args.serve_broker or args.serve_echo or args.load or args.open_load:
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
        if args.serve_broker:
            trio.run(
                serve_broker,
                args.serve_broker,
                args.members,
                args.certs,
                args.tls,
                args.sasl,
                not args.no_park,
            )
        elif args.serve_echo:
            trio.run(serve_echo)
        elif args.open_load:
            trio.run(run_open_load, json.loads(args.open_load))
        else:
            trio.run(run_load, json.loads(args.load))
        return 0
    preset = Params()
    if args.quick:
        preset = QUICK_OPEN if args.open_loop else QUICK
    params = chosen_params(
        args,
        preset,
        (
            "members",
            "processes",
            "duration",
            "warmup",
            "session_timeout",
            "interval",
            "step",
            "p99_limit_ms",
        ),
        open_loop=args.open_loop,
        tls=args.tls,
        sasl=args.sasl,
        park=not args.no_park,
        compare_parking=args.compare_parking,
    )
    if params.members < 1 or params.processes < 1 or params.duration <= 0 or params.warmup < 0:
        print("members and processes must be >= 1, duration > 0, warmup >= 0", file=sys.stderr)
        return 2
    if params.interval <= 0 or params.step < 0 or params.p99_limit_ms <= 0:
        print("interval and p99 limit must be > 0, step >= 0", file=sys.stderr)
        return 2
    params = replace(params, processes=min(params.processes, params.members))
    if params.open_loop:
        return run_and_report(
            "heartbeat", run_open_loop, params, as_json=args.json, render=render_open
        )
    return run_and_report("heartbeat", run_benchmark, params, as_json=args.json, render=render)


if __name__ == "__main__":
    sys.exit(main())
