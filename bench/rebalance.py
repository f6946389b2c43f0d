"""How fast a group rebalances after a join, a clean leave, a crash and a silent failure.

(``--churn`` measures something else: what a membership change stops, eager
against cooperative; see ``bench/_churn.py``.)

``python bench/rebalance.py [--members N] [--partitions P] [--session-timeout S]
[--rounds K] [--json] [--quick]`` runs a broker in this process, on the
embedded file store in a temporary directory (so every rebalance pays for its
durable writes, as in production), and observes its group events through
``BrokerConfig.on_event``: every timestamp is the broker's own
``trio.current_time()``, on the clock this script also reads right before it
signals a consumer. The consumers are real ``trio-coord consume`` processes
(``python -m trio_coord consume T --group G --session-timeout S --events json
-b ADDR``), each with its own client id, so that the broker's member id tells
which process it is. Once N of them form a stable group, each of K rounds
makes three failures, each followed by a fresh consumer that replaces the
victim (and gives a join sample):

* join: the broker receives the new consumer's JoinGroup ("joined") → the
  group is stable with it ("stable");
* clean leave: SIGTERM → the consumer leaves ("removed", reason "left the
  group...") → stable; the consumer stops its fetchers before it says so;
* crash: SIGKILL → the broker sees the connection close ("removed", reason
  "lost its connection") → stable. The crashed member may still be fetching
  until its lease ends (its last heartbeat the broker received + S), so its
  partitions start elsewhere only then: handover is bounded by the lease, not
  by detection. Both are reported, with the lease left at the kill and how
  long after the lease's end the group was stable;
* silent failure: SIGSTOP (the connection stays open) → the session deadline
  passes ("removed", reason "session timeout expired") → stable; then
  SIGKILL. The deadline is the last heartbeat the broker received + S, and a
  consumer heartbeats every S/3, so detection since the SIGSTOP lies in
  [2/3 S, S] plus timer slack. The bench reads the member's last heartbeat
  from the broker's group state (same process) and reports the slack itself:
  detection - (S - time since the last heartbeat at the SIGSTOP).

The session timeout is the limit measured against: every figure is also
given as a ratio to S, and those travel between machines.
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio

if __package__ in (None, ""):  # run as a script: this checkout's `bench` and `trio_coord`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    BenchError,
    chosen_params,
    cpu_count,
    format_table,
    kill_all,
    load_average,
    min_p50_max,
    python_module,
    ratio,
    run_and_report,
    start_logged,
)
from trio_coord.broker.events import GroupEvent
from trio_coord.broker.server import Broker, open_broker
from trio_coord.client.admin import open_admin
from trio_coord.core.group import Member

__all__ = ["MEASURES", "QUICK", "Params", "main", "render", "run_benchmark"]

HOST = "127.0.0.1"
GROUP = "rebalance-bench"
TOPIC = "rebalance-bench"
_SETTLE = 0.1  # after a stable group, before the next fault: let consumers print their events
_EXIT_WAIT = 10.0  # a consumer given SIGTERM must have exited by then

MEASURES: dict[str, str] = {
    "join": "join: JoinGroup -> stable",
    "leave": "leave: LeaveGroup -> stable",
    "leave_signal": "leave: SIGTERM -> stable",
    "crash_detection": "crash: SIGKILL -> removed",
    "crash_handover": "crash: SIGKILL -> stable",
    "crash_lease_left": "crash: SIGKILL -> lease end",
    "crash_after_lease": "crash: lease end -> stable",
    "silent_detection": "silent: SIGSTOP -> removed",
    "silent_lease_left": "silent: SIGSTOP -> deadline",
    "silent_slack": "silent: deadline -> removed",
    "silent_handover": "silent: SIGSTOP -> stable",
}
"""Every measure the bench reports, with its label in the table (keys are the JSON's)."""

_RATIO_ROWS = {
    "crash_handover",
    "crash_lease_left",
    "silent_detection",
    "silent_lease_left",
    "silent_handover",
}
"""The measures bounded by the session timeout: the table shows their ratios to S."""


@dataclass(frozen=True, slots=True)
class Params:
    """What one run measures; the defaults are the full run, :data:`QUICK` the CI smoke run.

    ``members`` must be at least 2 (a group left empty by its victim never
    becomes stable again, and stable is what is measured); ``partitions``
    must be at least ``members``, so that every member owns a partition and every
    crash exercises the lease.
    """

    members: int = 4
    partitions: int = 12
    session_timeout: float = 3.0
    rounds: int = 5
    quick: bool = False


QUICK = Params(members=2, partitions=4, session_timeout=1.5, rounds=2, quick=True)
"""The ``--quick`` preset: two rounds at S = 1.5 s, for a CI smoke test (~10 s)."""


# -- what the broker reports ------------------------------------------------------------


@dataclass(slots=True)
class _Event:
    what: str
    details: dict[str, Any]

    @property
    def time(self) -> float:
        return float(self.details["time"])

    @property
    def owners(self) -> set[str]:
        return set(self.details.get("ownership", {}).values())


class _EventLog:
    """The broker's events for the bench group, in order; ``on_event`` of the broker."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.events: list[_Event] = []
        self._changed = trio.Event()

    def __call__(self, event: GroupEvent) -> None:
        if event.group != self.group:
            return
        self.events.append(_Event(event.kind, msgspec.structs.asdict(event)))
        self._changed.set()
        self._changed = trio.Event()

    def mark(self) -> int:
        """Where the next event will be: pass it as ``since``."""
        return len(self.events)

    async def wait_for(self, since: int, match: Callable[[_Event], bool]) -> tuple[int, _Event]:
        """The first event at or after index ``since`` that matches, and its index."""
        while True:
            for i in range(since, len(self.events)):
                if match(self.events[i]):
                    return i, self.events[i]
            since = len(self.events)
            await self._changed.wait()

    def tail(self, n: int = 8) -> str:
        """The last events, one a line, for error messages."""
        lines = []
        for e in self.events[-n:]:
            brief = {k: v for k, v in e.details.items() if k not in ("group", "ownership")}
            if e.what == "stable":
                brief["owners"] = sorted(e.owners)
            lines.append(f"  {e.what} {brief}")
        return "\n".join(lines) or "  (none)"


# -- the consumer processes --------------------------------------------------------------


@dataclass(slots=True)
class _Consumer:
    name: str
    process: trio.Process
    member_id: str = ""

    @property
    def prefix(self) -> str:
        """The start of its member id: the broker makes it ``<client id>-<hex>``."""
        return f"{self.name}-"


@dataclass(slots=True)
class _Run:
    """One run's state: the broker, its events, the live consumers, the samples."""

    params: Params
    broker: Broker
    events: _EventLog
    workdir: Path
    processes: list[trio.Process]
    live: list[_Consumer] = field(default_factory=list)
    spawned: int = 0
    samples: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MEASURES})
    notes: list[str] = field(default_factory=list)
    held_back: list[dict[str, int]] = field(default_factory=list)
    victims: set[str] = field(default_factory=set)

    @property
    def s(self) -> float:
        return self.params.session_timeout

    @contextmanager
    def within(self, seconds: float, what: str) -> Iterator[None]:
        """Give the block ``seconds``; past that, raise BenchError with the recent events."""
        with trio.move_on_after(seconds) as scope:
            yield
        if scope.cancelled_caught:
            raise BenchError(
                f"{what} did not happen within {seconds:g} s; the broker's last events:\n"
                f"{self.events.tail()}\n{self._stderr_tails()}"
            )

    def _stderr_tails(self) -> str:
        parts = []
        for c in self.live:
            try:
                text = (self.workdir / f"{c.name}.stderr").read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                parts.append(f"{c.name} stderr:\n{text[-1500:]}")
        return "\n".join(parts)

    def add(self, measure: str, seconds: float) -> None:
        self.samples[measure].append(seconds)

    async def spawn_consumer(self) -> _Consumer:
        self.spawned += 1
        name = f"rb{self.spawned:03d}"
        argv = python_module(
            "trio_coord",
            "consume",
            TOPIC,
            "--group",
            GROUP,
            "--session-timeout",
            f"{self.s:g}",
            "--events",
            "json",
            "--client-id",
            name,
            "-b",
            self.broker.bootstrap,
        )
        process = await start_logged(argv, name, self.workdir)
        self.processes.append(process)
        consumer = _Consumer(name, process)
        self.live.append(consumer)
        return consumer

    def _member(self, member_id: str) -> Member | None:
        runner = self.broker.coordinator.runner(GROUP)
        return None if runner is None else runner.group.members.get(member_id)

    # -- the steps ---------------------------------------------------------------------------

    async def join_one(self) -> None:
        """Start a consumer; sample JoinGroup → stable with it as an owner."""
        since = self.events.mark()
        consumer = await self.spawn_consumer()
        with self.within(30.0, f"the JoinGroup of {consumer.name}"):
            at, joined = await self.events.wait_for(
                since,
                lambda e: (
                    e.what == "joined" and str(e.details["member_id"]).startswith(consumer.prefix)
                ),
            )
        consumer.member_id = str(joined.details["member_id"])
        with self.within(10.0 + self.s, f"a stable group with {consumer.name}"):
            _, stable = await self.events.wait_for(
                at, lambda e: e.what == "stable" and consumer.member_id in e.owners
            )
        self.add("join", stable.time - joined.time)
        await trio.sleep(_SETTLE)

    async def _removed_then_stable(
        self, victim: _Consumer, since: int, reason: str, limit: float
    ) -> tuple[_Event, _Event, list[_Event]]:
        """The victim's "removed", the next "stable" without it, and the events in between."""
        self.victims.add(victim.member_id)
        with self.within(limit, f"the removal of {victim.name}"):
            at, removed = await self.events.wait_for(
                since,
                lambda e: e.what == "removed" and e.details["member_id"] == victim.member_id,
            )
        got = str(removed.details["reason"])
        if not got.startswith(reason):
            self.notes.append(f"{victim.name} was removed for {got!r}, expected {reason!r}")
        with self.within(limit, f"a stable group without {victim.name}"):
            end, stable = await self.events.wait_for(
                at, lambda e: e.what == "stable" and victim.member_id not in e.owners
            )
        self.live.remove(victim)
        return removed, stable, self.events.events[at + 1 : end]

    async def leave_one(self) -> None:
        """SIGTERM the oldest consumer; sample LeaveGroup → stable and SIGTERM → stable."""
        victim = self.live[0]
        since = self.events.mark()
        sent = trio.current_time()
        victim.process.send_signal(signal.SIGTERM)
        removed, stable, _ = await self._removed_then_stable(
            victim, since, "left the group", 10.0 + self.s
        )
        self.add("leave", stable.time - removed.time)
        self.add("leave_signal", stable.time - sent)
        with trio.move_on_after(_EXIT_WAIT):
            await victim.process.wait()
        if victim.process.returncode != 0:
            status = victim.process.returncode
            self.notes.append(f"{victim.name} exited with {status} after SIGTERM (expected 0)")
        await trio.sleep(_SETTLE)

    async def crash_one(self) -> None:
        """SIGKILL the oldest consumer; sample detection, handover and the lease left."""
        victim = self.live[0]
        since = self.events.mark()
        killed = trio.current_time()
        victim.process.send_signal(signal.SIGKILL)
        removed, stable, between = await self._removed_then_stable(
            victim, since, "lost its connection", 10.0 + 2 * self.s
        )
        await victim.process.wait()
        self._count_held_back(removed, between)
        self.add("crash_detection", removed.time - killed)
        self.add("crash_handover", stable.time - killed)
        lease_end = removed.details.get("fenced_until")
        if lease_end is None:
            self.notes.append(f"{victim.name} crashed but its partitions were not fenced")
        else:
            self.add("crash_lease_left", float(lease_end) - killed)
            self.add("crash_after_lease", stable.time - float(lease_end))
        await trio.sleep(_SETTLE)

    def _count_held_back(self, removed: _Event, between: list[_Event]) -> None:
        """Count the members, and the partitions not the victim's, that waited for its lease.

        The broker delays a member's whole start until every fenced partition
        in its new assignment is free, so the member's other partitions wait
        for the lease too.
        """
        fenced = set(removed.details.get("partitions", []))
        delayed = {str(e.details["member_id"]) for e in between if e.what == "start_delayed"}
        others = set()
        for e in between:
            if e.what == "started" and e.details["member_id"] in delayed:
                others |= {str(tp) for tp in e.details["partitions"]} - fenced
        self.held_back.append(
            {
                "members_delayed": len(delayed),
                "fenced_partitions": len(fenced),
                "other_partitions_delayed": len(others),
            }
        )

    async def stop_one(self) -> None:
        """SIGSTOP the oldest consumer; sample detection against its deadline, then SIGKILL it."""
        victim = self.live[0]
        member = self._member(victim.member_id)
        if member is None:
            raise BenchError(f"{victim.name} ({victim.member_id}) is not in the group")
        since = self.events.mark()
        stopped = trio.current_time()
        victim.process.send_signal(signal.SIGSTOP)
        try:
            removed, stable, _ = await self._removed_then_stable(
                victim, since, "session timeout expired", 10.0 + 2 * self.s
            )
        finally:
            victim.process.send_signal(signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await victim.process.wait()
        # The Member object outlives its removal; its last heartbeat is the broker's own.
        deadline = member.lease_end
        self.add("silent_detection", removed.time - stopped)
        self.add("silent_lease_left", deadline - stopped)
        self.add("silent_slack", removed.time - deadline)
        self.add("silent_handover", stable.time - stopped)
        await trio.sleep(_SETTLE)


# -- the run -----------------------------------------------------------------------------------


def _consumer_notes(workdir: Path, names: list[str]) -> list[str]:
    """What the consumers' own event streams say that they should not (a partition lost)."""
    notes = []
    for name in names:
        path = workdir / f"{name}.stdout"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        lost = sum(1 for line in lines if '"event": "lost"' in line)
        if lost:
            notes.append(f"{name} reported {lost} 'lost' event(s) (partitions dropped unrevoked)")
    return notes


async def _measure(params: Params, workdir: Path) -> _Run:
    """Run the broker, the consumers and the rounds; the run holds the samples and notes."""
    events = _EventLog(GROUP)
    processes: list[trio.Process] = []
    data_dir = workdir / "broker-data"
    data_dir.mkdir()
    async with open_broker(
        data_dir, HOST, 0, min_session_timeout=0.1, on_event=events, shutdown_grace=1.0
    ) as broker:
        run = _Run(params, broker, events, workdir, processes)
        rounds_began = rounds_ended = 0
        try:
            async with open_admin(broker.bootstrap) as admin:
                await admin.create_topic(TOPIC, params.partitions)
            for _ in range(params.members):
                await run.spawn_consumer()
            with run.within(30.0 + 2 * params.members, f"a stable group of {params.members}"):
                # Every member owns a partition (P >= N), so N owners means all have joined.
                await events.wait_for(
                    0, lambda e: e.what == "stable" and len(e.owners) == params.members
                )
            for c, member_id in zip(run.live, _member_ids(events, run.live), strict=True):
                c.member_id = member_id
            await trio.sleep(_SETTLE)
            rounds_began = events.mark()
            for _ in range(params.rounds):
                for fault in (run.leave_one, run.crash_one, run.stop_one):
                    await fault()
                    await run.join_one()
            rounds_ended = events.mark()
        finally:
            await kill_all(processes)
        measured = events.events[rounds_began:rounds_ended]
        notes = run.notes
        notes += [
            f"removal of a member that was not a victim: {e.details['member_id']} "
            f"({e.details['reason']})"
            for e in measured
            if e.what == "removed" and e.details["member_id"] not in run.victims
        ]
        for what in ("rebalance_failed", "rebalance_restarted"):
            if n := sum(1 for e in measured if e.what == what):
                notes.append(f"{n} {what} event(s) during the measured rounds")
        notes += _consumer_notes(workdir, [f"rb{i:03d}" for i in range(1, run.spawned + 1)])
        return run


def _member_ids(events: _EventLog, consumers: list[_Consumer]) -> list[str]:
    """Each consumer's member id, from the broker's "joined" events (by client id)."""
    ids = []
    for c in consumers:
        found = [
            str(e.details["member_id"])
            for e in events.events
            if e.what == "joined" and str(e.details["member_id"]).startswith(c.prefix)
        ]
        if len(found) != 1:
            raise BenchError(f"{c.name} joined {len(found)} times before the rounds began")
        ids.append(found[0])
    return ids


async def run_benchmark(params: Params) -> dict[str, Any]:
    """Run the rounds; return the JSON-ready result (seconds turned into ms and ratios to S)."""
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="trio-coord-rebalance-") as tmp:
        run = await _measure(params, Path(tmp))
    s = params.session_timeout
    measures = {}
    for name, values in run.samples.items():
        stats = min_p50_max(values)
        measures[name] = {
            "count": stats["count"],
            "min_ms": stats["min"] * 1e3,
            "p50_ms": stats["p50"] * 1e3,
            "max_ms": stats["max"] * 1e3,
            "min_ratio": ratio(stats["min"], s),
            "p50_ratio": ratio(stats["p50"], s),
            "max_ratio": ratio(stats["max"], s),
            "samples_ms": [round(v * 1e3, 3) for v in values],
        }
    return {
        "bench": "rebalance",
        "params": {**asdict(params), "cpus": cpu_count(), "load_average": load},
        "measures": measures,
        "bounds": {
            "crash_handover_max_ratio": measures["crash_handover"]["max_ratio"],
            "silent_detection_min_ratio": measures["silent_detection"]["min_ratio"],
            "silent_detection_max_ratio": measures["silent_detection"]["max_ratio"],
        },
        "crash_held_back": run.held_back,
        "notes": run.notes,
    }


# -- output and the command line ---------------------------------------------------------------


def _ms(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


def _r(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f}"


def render(result: dict[str, Any]) -> str:
    """The result as a short header line, an aligned table, and any notes."""
    p = result["params"]
    lines = [
        f"rebalance: {p['members']} members (a new one replaces each victim), {p['partitions']} "
        f"partitions, session timeout S = {p['session_timeout']:g} s, {p['rounds']} round(s); "
        f"{p['cpus']} CPUs, load average {p['load_average']}",
        "",
    ]
    rows = []
    for name, label in MEASURES.items():
        m = result["measures"][name]
        show = name in _RATIO_ROWS
        rows.append(
            [
                label,
                m["count"],
                _ms(m["min_ms"]),
                _ms(m["p50_ms"]),
                _ms(m["max_ms"]),
                _r(m["min_ratio"]) if show else "",
                _r(m["p50_ratio"]) if show else "",
                _r(m["max_ratio"]) if show else "",
            ]
        )
    headers = ["measure", "n", "min ms", "p50 ms", "max ms", "min/S", "p50/S", "max/S"]
    lines.append(format_table(headers, rows))
    lines.append("")
    lines.append(
        "crash handover is bounded by the lease (last heartbeat + S), so max/S <= 1 plus the "
        "rebalance; silent detection lies in [2/3, 1] x S plus the slack shown."
    )
    held = result["crash_held_back"]
    if held:
        lines.append(
            "crash: members whose start waited for the lease, per crash: "
            f"{' '.join(str(h['members_delayed']) for h in held)}; partitions of theirs not "
            f"the victim's that waited with them: "
            f"{' '.join(str(h['other_partitions_delayed']) for h in held)}"
        )
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/rebalance.py",
        description="Rebalance latency after a join, a clean leave, a crash and a silent "
        "failure, with real consumer processes, as ratios to the session timeout.",
    )
    d = Params()
    parser.add_argument("--members", type=int, help=f"consumers in the group (default {d.members})")
    parser.add_argument(
        "--partitions", type=int, help=f"partitions of the topic (default {d.partitions})"
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        help=f"consumers' session timeout S in s (default {d.session_timeout:g})",
    )
    parser.add_argument(
        "--rounds", type=int, help=f"rounds of leave, crash and silent failure (default {d.rounds})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI smoke preset: {QUICK.members} members, S = {QUICK.session_timeout:g} s, "
        f"{QUICK.rounds} round(s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 if the benchmark could not run).

    With ``--churn`` it runs the eager-against-cooperative churn benchmark
    instead (``bench/_churn.py``).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if "--churn" in arguments:
        from bench import _churn

        arguments.remove("--churn")
        return _churn.main(arguments)
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    params = chosen_params(
        args,
        QUICK if args.quick else Params(),
        ("members", "partitions", "session_timeout", "rounds"),
    )
    if params.members < 2 or params.rounds < 1 or params.session_timeout < 0.3:
        # With one member, a victim leaves an empty group, which never becomes stable.
        print("members must be >= 2, rounds >= 1 and the session timeout >= 0.3 s", file=sys.stderr)
        return 2
    if params.partitions < params.members:
        print("partitions must be >= members (every victim must own one)", file=sys.stderr)
        return 2
    return run_and_report("rebalance", run_benchmark, params, as_json=args.json, render=render)


if __name__ == "__main__":
    sys.exit(main())
