"""How long a group of N members takes to form, and what admitting them costs the broker.

``python bench/forming.py [--members 1000,5000,10000] [--rounds R] [--processes P]
[--load-kind lean,trio] [--window W] [--sources S] [--json] [--quick]`` starts,
for each size N, each kind of load and each of R rounds, a fresh broker process
(``bench/heartbeat.py``'s ``--serve-broker``) and P load processes, and waits
until the load processes say every member is started and the group is STABLE
with all N (DescribeGroup, through the admin client, at one generation for
0.3 s). In both kinds of load each member opens its own TCP connection, joins in
two steps (member id, then the join), answers its StartFetchers (and
StopFetchers, if a second generation comes) and heartbeats every third of its
session timeout, so the broker's work is the same; they differ in what the load
costs itself. ``trio`` is ``bench/heartbeat.py``'s ``--load``: a Trio task and
a ``Connection`` per member (~0.8 ms of CPU per member, more than the broker's
0.2 ms: on 2 cores that load, not the broker, set the wall time). ``lean`` (the
default) is ``bench/_swarm.py``: non-blocking sockets on one epoll loop, at
most W members connecting or awaiting their id, connections spread over S
loopback source addresses (from one, Linux's ``connect()`` stalls past ~12,000
connections: ``--sources 0`` shows it), pre-encoded answers. Per run it reports
the wall time from the load processes' start to the confirmed stable group, and
to the first DescribeGroup that saw it stable (issue #14's figure: 20,000
members in < 5 s), the **broker's CPU seconds** over that time (from ``/proc``;
accept, two JoinGroups, the first rebalance's StartFetchers and generation
record per member), per 1,000 members admitted, the load processes' CPU seconds
(and the kernel's share of them: connect, send, receive), the generations the
group went through (1 when the burst of joins made one rebalance; a second
comes when the joins paused for longer than the broker's
``initial_rebalance_delay``, 0.1 s: the lean load reports its longest pause
between two admitting joins, in each load process) and the load average.

Why the CPU column: on a shared machine either side may be what the wall
time waits for. The broker is one Trio thread; when its CPU seconds are close
to the wall time it is the bottleneck, and when the load's are, the load is.
What neither explains is waiting for a CPU: the run-queue wait of the broker
and of the (slowest) load process (``/proc/PID/schedstat``) are columns too.
Medians over the rounds, with the range.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _swarm, heartbeat
from bench._common import (
    BenchError,
    chosen_params,
    cpu_count,
    format_table,
    load_average,
    process_cpu_seconds,
    python_module,
    run_and_report,
    spawn,
)
from trio_coord import open_admin

__all__ = ["LOAD_KINDS", "QUICK", "Params", "main", "run_benchmark"]


@dataclass(frozen=True, slots=True)
class Params:
    """What one run measures; :data:`QUICK` is the CI smoke run."""

    members: tuple[int, ...] = (1000, 5000, 10000)
    rounds: int = 3
    processes: int = max(1, cpu_count() - 1)
    session_timeout: float = 30.0
    quick: bool = False
    load_kinds: tuple[str, ...] = ("lean",)
    """Which loads to run, each in turn (``lean``: ``bench/_swarm.py``; ``trio``: the Trio one)."""
    window: int = _swarm.DEFAULT_WINDOW
    """Lean load: members connecting or awaiting their member id at once, per load process."""
    sources: int = _swarm.SOURCES
    """Lean load: loopback source addresses its connections are spread over (0: one)."""


LOAD_KINDS = ("lean", "trio")
QUICK = Params(members=(20,), rounds=1, processes=1, quick=True)
"""The ``--quick`` preset (a few seconds)."""


async def form_once(
    params: Params, members: int, workdir: Path, load_kind: str = "lean"
) -> dict[str, Any]:
    """One broker, one group of ``members`` joined by the ``load_kind`` load: wall time, CPU
    seconds, generations."""
    load_average_at_start = load_average()
    data = Path(tempfile.mkdtemp(prefix=f"broker-{members}-", dir=workdir))  # (fresh each run)
    argv = python_module("bench.heartbeat", "--serve-broker", str(data), "--members", str(members))
    hb = heartbeat.Params(
        members=members,
        processes=min(params.processes, members),
        session_timeout=params.session_timeout,
    )
    ready_timeout = 60.0 + 0.05 * members
    async with spawn(argv, f"broker-{members}", workdir) as server:
        with server.within(30.0, "print its port"):
            port = int(await server.expect("port "))
        bootstrap = f"{heartbeat.HOST}:{port}"
        async with open_admin(bootstrap) as admin:
            await admin.create_topic(heartbeat.TOPIC, members)
        async with AsyncExitStack() as stack:
            cpu_before = process_cpu_seconds(server.pid)
            waited_before = _run_delay_seconds(server.pid)
            began = trio.current_time()
            loads = []
            for i, (first, count) in enumerate(hb.split()):
                spec = heartbeat._load_spec("broker", hb, port, first, count)
                spec["out"] = str(workdir / f"load-{members}-{i}.latencies")
                spec["window"] = params.window
                spec["sources"] = params.sources
                argv = (
                    python_module("bench._swarm", json.dumps(spec))
                    if load_kind == "lean"
                    else python_module("bench.heartbeat", "--load", json.dumps(spec))
                )
                loads.append(
                    await stack.enter_async_context(
                        spawn(argv, f"{load_kind}-load-{members}-{i}", workdir)
                    )
                )
            # The lean load's own account (its CPU, longest pause, stops); the Trio one says none.
            reports: list[dict[str, Any]] = []
            for load in loads:
                with load.within(ready_timeout, "get all its members started"):
                    said = await load.expect("ready")
                if said:
                    reports.append(json.loads(said))
            watch = heartbeat._StableWatch(bootstrap, members, {})
            generation = None
            with trio.move_on_after(ready_timeout):
                generation = await watch.wait()
            if generation is None:
                raise BenchError(
                    f"the group of {members} did not become stable (last seen: {watch.seen})"
                )
            wall = trio.current_time() - began
            assert watch.stable_since is not None
            stable_at = watch.stable_since - began
            cpu_after = process_cpu_seconds(server.pid)
            waited_after = _run_delay_seconds(server.pid)
            load_cpu = [process_cpu_seconds(load.pid) for load in loads]
            load_system = [_system_cpu_seconds(load.pid) for load in loads]
            load_waited = [_run_delay_seconds(load.pid) for load in loads]
            # The broker stops first, sparing it a storm of departures and rebalances; the
            # load processes then see their stdin close before "go", and exit.
            await server.stop()
    broker_cpu = (
        cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    )
    gaps = [r["longest_gap_s"] for r in reports]
    return {
        "members": members,
        "load_kind": load_kind,
        "wall_s": wall,
        "stable_at_s": stable_at,
        "broker_cpu_s": broker_cpu,
        "broker_cpu_s_per_1k": None if broker_cpu is None else broker_cpu / members * 1000,
        "broker_waited_s": None
        if waited_before is None or waited_after is None
        else waited_after - waited_before,
        "load_cpu_s": None if None in load_cpu else sum(c for c in load_cpu if c is not None),
        # (of which the kernel's: connect, send and receive; the rest is the load's Python)
        "load_waited_s": None if None in load_waited else max(w or 0.0 for w in load_waited),
        "load_system_s": None
        if None in load_system
        else sum(c for c in load_system if c is not None),
        "generation": generation,
        "longest_join_gap_s": max(gaps) if gaps else None,
        "stops": sum(r["stops"] for r in reports) if reports else None,
        "load_reports": reports,
        "load_average": load_average_at_start,
    }


def _run_delay_seconds(pid: int) -> float | None:
    """How long process ``pid`` has waited for a CPU so far (``/proc``; None where unknown):
    on a shared machine, the part of the wall time that neither side's CPU explains."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _system_cpu_seconds(pid: int) -> float | None:
    """The kernel's share of process ``pid``'s CPU time (``/proc``; None where unknown)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[12]) / os.sysconf("SC_CLK_TCK")


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of each figure over one size's rounds."""
    out: dict[str, Any] = {
        "members": runs[0]["members"],
        "load_kind": runs[0]["load_kind"],
        "rounds": len(runs),
    }
    for key in (
        "wall_s",
        "stable_at_s",
        "broker_cpu_s",
        "broker_cpu_s_per_1k",
        "broker_waited_s",
        "load_cpu_s",
        "load_system_s",
        "load_waited_s",
        "longest_join_gap_s",
        "load_average",
    ):
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            out[key] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
    out["generations"] = sorted({r["generation"] for r in runs})
    return out


async def run_benchmark(params: Params) -> dict[str, Any]:
    """Every size with every load, ``rounds`` times, interleaved (so that the machine's load,
    which drifts, falls on all of them alike); the JSON-ready result."""
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {
        (n, kind): [] for n in params.members for kind in params.load_kinds
    }
    with tempfile.TemporaryDirectory(prefix="trio-coord-forming-") as tmp:
        for _ in range(params.rounds):
            for members in params.members:
                for kind in params.load_kinds:
                    runs[members, kind].append(await form_once(params, members, Path(tmp), kind))
    return {
        "bench": "forming",
        "params": {**asdict(params), "cpus": cpu_count(), "load_average": load_average()},
        "runs": {f"{n} {kind}": r for (n, kind), r in runs.items()},
        "summary": [_summary(r) for r in runs.values()],
    }


def _range(figure: dict[str, float] | None, fmt: str) -> str:
    if figure is None:
        return "unknown"
    return (
        f"{figure['median']:{fmt}} ({figure['min']:{fmt}}-{figure['max']:{fmt}})"
        if figure["min"] != figure["max"]
        else f"{figure['median']:{fmt}}"
    )


def render(result: dict[str, Any]) -> str:
    """One row per group size: medians, with the range over the rounds."""
    p = result["params"]
    lines = [
        f"forming: median of {p['rounds']} (range), {p['processes']} load process(es), "
        f"{p['cpus']} CPUs, load average {p['load_average']} at the end",
        "",
    ]
    rows = [
        [
            f"{s['members']:,}",
            s["load_kind"],
            _range(s.get("wall_s"), ".1f"),
            _range(s.get("stable_at_s"), ".1f"),
            _range(s.get("broker_cpu_s"), ".2f"),
            _range(s.get("broker_cpu_s_per_1k"), ".2f"),
            _range(s.get("broker_waited_s"), ".2f"),
            _range(s.get("load_cpu_s"), ".2f"),
            _range(s.get("load_system_s"), ".2f"),
            _range(s.get("load_waited_s"), ".2f"),
            ",".join(map(str, s["generations"])),
            _range(_scaled(s.get("longest_join_gap_s"), 1000), ".0f"),
            _range(s.get("load_average"), ".1f"),
        ]
        for s in result["summary"]
    ]
    headers = [
        "members",
        "load",
        "formed in s",
        "stable seen at s",
        "broker CPU s",
        "broker CPU s / 1k members",
        "broker waited for a CPU s",
        "load CPU s",
        "of which system s",
        "load waited for a CPU s",
        "generations",
        "longest join pause ms",
        "load average",
    ]
    lines.append(format_table(headers, rows))
    return "\n".join(lines)


def _scaled(figure: dict[str, float] | None, factor: float) -> dict[str, float] | None:
    return None if figure is None else {k: v * factor for k, v in figure.items()}


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(part.strip() for part in text.split(",")))
    unknown = [k for k in kinds if k not in LOAD_KINDS]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(
            f"load kinds are {' and '.join(LOAD_KINDS)}, comma-separated (not {text!r})"
        )
    return kinds


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of sizes: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be >= 1")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 if the benchmark could not run)."""
    parser = argparse.ArgumentParser(
        prog="python bench/forming.py",
        description="How long a group of N takes to form, and the broker's CPU for it.",
    )
    defaults = Params()
    parser.add_argument(
        "--members",
        type=_sizes,
        help="group sizes, comma-separated (default "
        + ",".join(map(str, defaults.members))
        + "; past ~18,900 a broker runs out of file descriptors where ulimit -Hn is 20,000)",
    )
    parser.add_argument("--rounds", type=int, help=f"runs per size (default {defaults.rounds})")
    parser.add_argument(
        "--processes",
        type=int,
        help=f"load processes (default: CPUs - 1, here {defaults.processes})",
    )
    parser.add_argument(
        "--load-kind",
        dest="load_kinds",
        type=_kinds,
        help="the load(s) that join the members, comma-separated, each run in turn: "
        "lean (bench/_swarm.py: one epoll loop, the default) and/or trio "
        "(bench/heartbeat.py --load: a Trio task per member, ~4x the broker's CPU)",
    )
    parser.add_argument(
        "--window",
        type=int,
        help="lean load: members connecting or awaiting their id at once, per load process "
        f"(default {defaults.window})",
    )
    parser.add_argument(
        "--sources",
        type=int,
        help="lean load: loopback source addresses (127.0.0.2, ...) to spread its "
        "connections over; 0: all from 127.0.0.1, where past ~12,000 connections Linux's "
        f"connect() searches long for a free port (default {defaults.sources})",
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke preset")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    params = chosen_params(
        args,
        QUICK if args.quick else Params(),
        ("members", "rounds", "processes", "load_kinds", "window", "sources"),
    )
    if params.rounds < 1 or params.processes < 1 or params.window < 1 or params.sources < 0:
        print("rounds, processes and window must be >= 1, sources >= 0", file=sys.stderr)
        return 2
    return run_and_report("forming", run_benchmark, params, as_json=args.json, render=render)


if __name__ == "__main__":
    sys.exit(main())
