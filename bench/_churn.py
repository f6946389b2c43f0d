"""What a membership change stops, eager against cooperative: ``bench/rebalance.py --churn``.

``python bench/rebalance.py --churn [--members N] [--partitions P]
[--changes K] [--session-timeout S] [--child] [--json] [--quick]`` runs
a broker in this process (embedded file store in a temporary directory, so
every generation pays for its durable write) and, for each rebalance protocol in
turn, a group of N members over one topic of P partitions. The members are
protocol-level clients on real TCP connections (no fetching: what is
measured is the coordinator's choreography, not the data plane); each
records, by its own clock, when it stopped and when it started every
partition. The members share the broker's process and thread; with
``--child`` they run in a child process instead, as on other machines, so
that the broker's thread does only the broker's work (on a loaded machine
that costs a process switch, and a wait for a CPU, per round trip: see
docs/benchmarks.md). Then K times: one member joins, the group settles; the oldest
member leaves cleanly, the group settles. Both groups use the ``uniform``
assignor, so the same partitions move in both modes; only what stops differs.

Per change it reports the partitions that moved (changed owner), the
partitions stopped (named in a StopFetchers, or all of a member's in an
eager one), the *untouched* members (in the group before and after, with
the same partitions) and how long they paused: per member, the longest time
one of its partitions was stopped before it started again (0 if never
stopped); and the same over every member's *kept* partitions (those it owns
before and after), which counts the members that also gain or lose some.
The rebalance itself (broker: rebalance started → stable) is the
same-run baseline the pauses are divided by: an eager untouched member
pauses for about a whole rebalance (ratio ≈ 1), a cooperative one not at all
(the goal: 0).
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import logging
import sys
import tempfile
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import trio

from bench._common import (
    BenchError,
    Child,
    chosen_params,
    cpu_count,
    format_table,
    load_average,
    python_module,
    ratio,
    read_stdin_line,
    run_and_report,
    say,
    spawn,
)
from trio_coord.broker.events import GroupEvent
from trio_coord.broker.server import open_broker
from trio_coord.protocol import (
    Connection,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    RequestBody,
    RequestHandler,
    ResponseBody,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
    TopicPartition,
    open_connection,
)

__all__ = ["QUICK", "ChurnParams", "main", "render", "run_churn"]

HOST = "127.0.0.1"
PROTOCOLS = ("eager", "cooperative")
_MODULE = "bench._churn"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ChurnParams:
    """One churn run; the defaults are the issue's figure, :data:`QUICK` the CI smoke run."""

    members: int = 20
    partitions: int = 200
    changes: int = 5
    session_timeout: float = 10.0
    quick: bool = False
    child: bool = False
    """Run the members in a child process instead of the broker's."""


QUICK = ChurnParams(members=4, partitions=24, changes=2, quick=True)
"""The ``--churn --quick`` preset (a few seconds)."""


class _Member(RequestHandler):
    """A group member that owns what it is told and records when, by its own clock."""

    def __init__(self, name: str, group: str, topic: str, protocol: str, session: float) -> None:
        self.name = name
        self.group = group
        self.topic = topic
        self.protocol = protocol
        self.session = session
        self.member_id = ""
        self.generation = -1
        self.owned: set[TopicPartition] = set()
        self.stopped_at: dict[TopicPartition, float] = {}  # stopped, not started since
        self.pauses: list[tuple[TopicPartition, float, float]] = []  # (tp, stopped, restarted)
        self.stops: list[tuple[float, int]] = []  # (when, how many partitions)
        self.changed = trio.Event()

    async def handle(self, body: RequestBody) -> ResponseBody:
        now = trio.current_time()
        if isinstance(body, StopFetchersRequest):
            gone = set(self.owned if body.partitions is None else body.partitions) & self.owned
            self.stops.append((now, len(gone)))
            for tp in gone:
                self.stopped_at[tp] = now
            self.owned -= gone
            return StopFetchersResponse()
        if isinstance(body, StartFetchersRequest):
            self.generation = body.generation
            if body.unchanged:  # cooperative, nothing of ours moved: same partitions
                self.changed.set()
                self.changed = trio.Event()
                return StartFetchersResponse()
            wanted = {p.tp for p in body.partitions}
            for tp in wanted - self.owned:
                if tp in self.stopped_at:
                    self.pauses.append((tp, self.stopped_at.pop(tp), now))
            self.owned = wanted
            self.changed.set()
            self.changed = trio.Event()
            return StartFetchersResponse()
        return await super().handle(body)

    async def run(self, port: int, *, task_status: trio.TaskStatus[Connection]) -> None:
        async with open_connection(HOST, port, self) as conn:
            for _ in range(2):  # a new member is given its id, then joins with it
                response = await conn.request(
                    JoinGroupRequest(
                        self.group,
                        self.member_id,
                        [self.topic],
                        round(self.session * 1000),
                        round(self.session * 1000),
                        ["uniform"],
                        auto_commit=False,
                        client_id=self.name,
                        rebalance_protocol=self.protocol,
                    )
                )
                assert isinstance(response, JoinGroupResponse)
                self.member_id = response.member_id
                if not response.rejoin:
                    # Heartbeat in the generation it joined, until StartFetchers names a newer
                    # one (with -1 every heartbeat before its first start was refused).
                    self.generation = max(self.generation, response.generation)
                    break
            task_status.started(conn)
            while True:
                await trio.sleep(self.session / 3)
                await conn.request(HeartbeatRequest(self.group, self.member_id, self.generation))


class _Members:
    """One group's members, in this process: add, remove, and tally a change by their clocks."""

    def __init__(self, spec: dict[str, Any], nursery: trio.Nursery) -> None:
        self.spec = spec
        self.nursery = nursery
        self.members: list[tuple[_Member, trio.CancelScope, Connection]] = []
        self.names = itertools.count()
        self._before: dict[str, frozenset[TopicPartition]] = {}
        self._marks: dict[str, tuple[int, int]] = {}

    async def add(self) -> None:
        """One more member, joined (its first JoinGroup answered without ``rejoin``)."""
        spec = self.spec
        member = _Member(
            f"{spec['protocol']}-{next(self.names):03d}",
            spec["group"],
            spec["topic"],
            spec["protocol"],
            spec["session_timeout"],
        )
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[Connection]) -> None:
            with scope:
                await member.run(spec["port"], task_status=task_status)

        conn = await self.nursery.start(run)
        self.members.append((member, scope, conn))

    async def remove_oldest(self) -> None:
        """The oldest member leaves cleanly (LeaveGroup), then disconnects."""
        member, scope, conn = self.members.pop(0)
        await conn.request(LeaveGroupRequest(member.group, member.member_id, [], "churn"))
        scope.cancel()

    def mark(self) -> dict[str, list[int]]:
        """Before a change: who owns what (partition numbers by member id), remembered."""
        self._before = {m.member_id: frozenset(m.owned) for m, _, _ in self.members}
        self._marks = {m.member_id: (len(m.stops), len(m.pauses)) for m, _, _ in self.members}
        return {m: sorted(tp.partition for tp in tps) for m, tps in self._before.items()}

    def tally(self) -> dict[str, Any]:
        """After a change: what was stopped since :meth:`mark`, and the longest pauses."""
        before = self._before
        stopped = 0
        untouched = []  # the longest pause of each member whose partitions did not change
        kept = []  # the same, for every member, over the partitions it kept
        for member, _, _ in self.members:
            stops, pause_mark = self._marks.get(member.member_id, (0, 0))
            stopped += sum(n for _, n in member.stops[stops:])
            after = frozenset(member.owned)
            mine = before.get(member.member_id, frozenset()) & after
            if not mine:
                continue
            longest = max(
                (end - begin for tp, begin, end in member.pauses[pause_mark:] if tp in mine),
                default=0.0,
            )
            kept.append(longest)
            if before[member.member_id] == after:
                untouched.append(longest)
        return {
            "stopped": stopped,
            "untouched": len(untouched),
            "pause_max_ms": max(untouched, default=0.0) * 1e3,
            "kept_pause_max_ms": max(kept, default=0.0) * 1e3,
            "kept_pause_mean_ms": (sum(kept) / len(kept) if kept else 0.0) * 1e3,
        }


class _RemoteMembers:
    """:class:`_Members` in a child process (``python -m bench._churn --serve-members``).

    Members are on other machines in production: in the broker's process
    their 1,000 handlers share its one thread, and every rebalance waits for
    their CPU as well as the broker's.
    """

    def __init__(self, child: Child) -> None:
        self.child = child

    async def _ask(self, command: str, answer: str) -> str:
        await self.child.send_line(command)
        with self.child.within(60.0, f"answer {command!r}"):
            return await self.child.expect(answer)

    async def add(self) -> None:
        await self._ask("add", "added")

    async def remove_oldest(self) -> None:
        await self._ask("leave", "left")

    async def mark(self) -> dict[str, list[int]]:
        return json.loads(await self._ask("mark", "marked "))  # type: ignore[no-any-return]

    async def tally(self) -> dict[str, Any]:
        return json.loads(await self._ask("tally", "tallied "))  # type: ignore[no-any-return]


async def serve_members(spec: dict[str, Any]) -> None:
    """The child's side of :class:`_RemoteMembers`: one command a line on stdin.

    ``add`` → ``added``, ``leave`` → ``left``, ``mark`` → ``marked {json}``,
    ``tally`` → ``tallied {json}``; the end of stdin ends the members.
    """
    async with trio.open_nursery() as nursery:
        members = _Members(spec, nursery)
        while command := (await read_stdin_line()).strip():
            if command == "add":
                await members.add()
                say("added")
            elif command == "leave":
                await members.remove_oldest()
                say("left")
            elif command == "mark":
                say("marked", json.dumps(members.mark()))
            elif command == "tally":
                say("tallied", json.dumps(members.tally()))
            else:
                raise BenchError(f"unknown command {command!r}")
        nursery.cancel_scope.cancel()


@dataclass(slots=True)
class _Group:
    """One protocol's group in a run: its members, and the broker's events for it."""

    protocol: str
    params: ChurnParams
    members: _Members | _RemoteMembers
    size: int = 0
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    @property
    def group(self) -> str:
        return _group_name(self.protocol)

    def on_event(self, event: GroupEvent) -> None:
        if event.group == self.group:
            self.events.append((event.kind, msgspec.structs.asdict(event)))
            self.changed.set()
            self.changed = trio.Event()

    async def stable_with(self, count: int, since: int) -> dict[str, Any]:
        """The first "stable" event since index ``since`` with ``count`` owners."""
        with trio.move_on_after(30 + self.params.session_timeout) as scope:
            while True:
                for what, details in self.events[since:]:
                    if what == "stable" and len(set(details["ownership"].values())) == count:
                        return details
                await self.changed.wait()
        assert scope.cancelled_caught
        tail = "\n".join(f"  {w} {d}" for w, d in self.events[-6:])
        raise BenchError(f"group {self.group} did not settle with {count} members:\n{tail}")

    async def add(self) -> None:
        await _maybe(self.members.add())
        self.size += 1

    async def remove_oldest(self) -> None:
        await _maybe(self.members.remove_oldest())
        self.size -= 1


def _group_name(protocol: str) -> str:
    return f"churn-{protocol}"


async def _maybe(value: Awaitable[T] | T) -> T:
    """``value``, awaited if it must be (the pools answer in-process or over a pipe)."""
    if inspect.isawaitable(value):
        return await value  # type: ignore[no-any-return]
    return value


async def _change(group: _Group, kind: str) -> dict[str, Any]:
    before = await _maybe(group.members.mark())
    since = len(group.events)
    if kind == "join":
        await group.add()
    else:
        await group.remove_oldest()
    stable = await group.stable_with(group.size, since)
    owner_before = {p: m for m, ps in before.items() for p in ps}
    moved = sum(
        1 for tp, m in stable["ownership"].items() if owner_before.get(_tp(tp).partition) != m
    )
    return {
        "change": kind,
        "moved": moved,
        **(await _maybe(group.members.tally())),
        # The broker's own measure (started -> stable), taken before it builds the event's
        # ownership listing, which only a listener like this one asks for.
        "rebalance_ms": stable["elapsed"] * 1e3,
    }


def _tp(text: str) -> TopicPartition:
    topic, _, partition = text.rpartition("-")
    return TopicPartition(topic, int(partition))


async def _measure(params: ChurnParams, workdir: Path) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, _Group] = {}

    def on_event(event: GroupEvent) -> None:
        for group in groups.values():
            group.on_event(event)

    results: dict[str, list[dict[str, Any]]] = {}
    settings: dict[str, Any] = {
        "min_session_timeout": 0.1,
        "on_event": on_event,
        "max_group_size": max(1000, params.members + 1),  # (each join adds one at a time)
        "max_connections_per_ip": params.members + 100,  # every member is on 127.0.0.1
        # As `trio-coord broker` runs: a server's collector (its members share this
        # process, and so the collector's walks, with the broker).
        "tune_gc": True,
    }
    async with open_broker(workdir, HOST, 0, **settings) as broker:
        await broker.topics.create_topic("churn", params.partitions)
        for protocol in PROTOCOLS:
            spec = {
                "port": broker.address[1],
                "group": _group_name(protocol),
                "topic": "churn",
                "protocol": protocol,
                "session_timeout": params.session_timeout,
            }
            async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
                members: _Members | _RemoteMembers
                if not params.child:
                    members = _Members(spec, nursery)
                else:
                    argv = python_module(_MODULE, "--serve-members", json.dumps(spec))
                    child = await stack.enter_async_context(
                        spawn(argv, f"members-{protocol}", workdir)
                    )
                    members = _RemoteMembers(child)
                group = _Group(protocol, params, members)
                groups[protocol] = group
                for _ in range(params.members):
                    await group.add()
                await group.stable_with(params.members, 0)
                changes = []
                for _ in range(params.changes):
                    changes.append(await _change(group, "join"))
                    changes.append(await _change(group, "leave"))
                results[protocol] = changes
                nursery.cancel_scope.cancel()
            del groups[protocol]
    return results


async def run_churn(params: ChurnParams) -> dict[str, Any]:
    """Run both protocols; return the JSON-ready result."""
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="trio-coord-churn-") as tmp:
        results = await _measure(params, Path(tmp))
    summary = {}
    for protocol, changes in results.items():
        rebalance = sum(c["rebalance_ms"] for c in changes) / len(changes)
        worst = max(c["pause_max_ms"] for c in changes)
        kept = max(c["kept_pause_max_ms"] for c in changes)
        summary[protocol] = {
            "moved_total": sum(c["moved"] for c in changes),
            "stopped_total": sum(c["stopped"] for c in changes),
            "pause_max_ms": worst,
            "kept_pause_max_ms": kept,
            "rebalance_mean_ms": rebalance,
            "pause_max_over_rebalance": ratio(worst, rebalance),
            "kept_pause_max_over_rebalance": ratio(kept, rebalance),
        }
    return {
        "bench": "rebalance-churn",
        "params": {**asdict(params), "cpus": cpu_count(), "load_average": load},
        "changes": results,
        "summary": summary,
    }


def render(result: dict[str, Any]) -> str:
    """Both protocols side by side, one row per change, then the totals."""
    p = result["params"]
    lines = [
        f"rebalance churn: {p['members']} members over {p['partitions']} partitions, "
        f"{p['changes']} x (join, leave), assignor uniform, members "
        f"{'in a child process' if p.get('child') else 'in the broker process'}; "
        f"{p['cpus']} CPUs, load average {p['load_average']}",
        "",
    ]
    eager, coop = result["changes"]["eager"], result["changes"]["cooperative"]
    rows = []
    for i, (e, c) in enumerate(zip(eager, coop, strict=True), start=1):
        rows.append(
            [
                f"{i} {e['change']}",
                f"{e['moved']}/{c['moved']}",
                e["stopped"],
                c["stopped"],
                e["untouched"],
                f"{e['pause_max_ms']:.1f}",
                f"{c['pause_max_ms']:.1f}",
                f"{e['kept_pause_max_ms']:.1f}",
                f"{c['kept_pause_max_ms']:.1f}",
                f"{e['rebalance_ms']:.1f}",
                f"{c['rebalance_ms']:.1f}",
            ]
        )
    headers = [
        "change",
        "moved e/c",
        "stopped eager",
        "stopped coop",
        "untouched",
        "untouched pause eager ms",
        "untouched pause coop ms",
        "kept pause eager ms",
        "kept pause coop ms",
        "rebalance eager ms",
        "rebalance coop ms",
    ]
    lines.append(format_table(headers, rows))
    lines.append("")
    for protocol, s in result["summary"].items():
        lines.append(
            f"{protocol}: {s['moved_total']} partitions moved, {s['stopped_total']} stopped; "
            f"untouched members paused at most {s['pause_max_ms']:.1f} ms "
            f"({s['pause_max_over_rebalance']:.3f} x the mean rebalance of "
            f"{s['rebalance_mean_ms']:.1f} ms), kept partitions at most "
            f"{s['kept_pause_max_ms']:.1f} ms ({s['kept_pause_max_over_rebalance']:.3f} x)"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``bench/rebalance.py --churn ...``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python bench/rebalance.py --churn",
        description="Partitions stopped and pauses of untouched members per membership "
        "change, eager against cooperative.",
    )
    d = ChurnParams()
    parser.add_argument("--members", type=int, help=f"members (default {d.members})")
    parser.add_argument("--partitions", type=int, help=f"partitions (default {d.partitions})")
    parser.add_argument("--changes", type=int, help=f"join+leave pairs (default {d.changes})")
    parser.add_argument(
        "--session-timeout",
        type=float,
        help=f"members' session timeout (default {d.session_timeout:g})",
    )
    parser.add_argument(
        "--child",
        action="store_true",
        help="run the members in a child process (by default they share the broker's thread)",
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke preset")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve-members", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.serve_members:  # (the child of a run with --child)
        trio.run(serve_members, json.loads(args.serve_members))
        return 0
    params = chosen_params(
        args,
        QUICK if args.quick else ChurnParams(),
        ("members", "partitions", "changes", "session_timeout"),
        child=args.child,
    )
    if params.members < 2 or params.changes < 1 or params.partitions < params.members:
        print("members must be >= 2, changes >= 1 and partitions >= members", file=sys.stderr)
        return 2
    return run_and_report("rebalance churn", run_churn, params, as_json=args.json, render=render)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
