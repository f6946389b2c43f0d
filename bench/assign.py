"""How long the built-in assignors take for a large group, against building their answer alone.

``python bench/assign.py [--members N] [--partitions P] [--rounds R] [--json] [--quick]``
times ``range`` and ``uniform`` (the server-side default for cooperative
groups) on one topic of P partitions that all N members subscribe to, in the
three situations a coordinator meets: ``fresh`` (nothing owned: a group's
first generation), ``leave`` (one member gone, the others own what they were
given: only its partitions move) and ``join`` (one new member, the others own
theirs). The baseline, in the same run, is building the answer alone: a dict
of N lists holding P new ``TopicPartition`` structs in order, the least any
assignor must do; the ratios assignor/baseline are what travel between
machines. Each figure is the median of R rounds, in this process (the
assignors are pure functions: no broker, no I/O), with the cyclic collector
paused as a coordinator runs an assignor (``collector_paused``); the
baseline too. ``--collector`` runs them with it on instead, as an
application calling ``assign`` itself would. Issue #14's goal is 100 ms
at 10,000 members x 100,000 partitions. ``--racks K`` (default 3; 0: none)
also times the ``fresh`` and ``join`` cases with racks (KIP-881): every
member and every partition in one of K racks (partitions by a CRC of their
number), as ``fresh+racks`` and ``join+racks``, so the cost of
rack-awareness is a ratio to the rack-less case of the same run. The
``checked`` rows time the three rack-less cases as a coordinator runs them
(``Group.compute_assignment``): the assignor, then ``validate_assignment``
and every member's list sorted.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: this checkout's `bench` and `trio_coord`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    chosen_params,
    cpu_count,
    format_table,
    load_average,
    ratio,
    run_and_report,
)
from trio_coord.core.assignment import topic_partitions
from trio_coord.core.assignors import (
    Assignment,
    Assignor,
    GroupSpec,
    MemberSpec,
    RangeAssignor,
    UniformAssignor,
    collector_paused,
    validate_assignment,
)

__all__ = ["Params", "main", "run_benchmark"]

TOPIC = "t"
ASSIGNORS = (RangeAssignor(), UniformAssignor())
CASES = ("fresh", "leave", "join")
RACK_CASES = ("fresh+racks", "join+racks")


@dataclass(frozen=True, slots=True)
class Params:
    """What one run measures; the defaults are #14's size, :data:`QUICK` the CI smoke run."""

    members: int = 10_000
    partitions: int = 100_000
    rounds: int = 5
    quick: bool = False
    racks: int = 3
    """Racks for the ``+racks`` cases (0: no such cases)."""
    collector: bool = False
    """Leave the cyclic collector on while timing (a coordinator pauses it)."""


QUICK = Params(members=50, partitions=500, rounds=2, quick=True)
"""The ``--quick`` preset: small enough for a CI smoke test (well under a second)."""


def _member_ids(count: int, prefix: str = "m") -> list[str]:
    return [f"{prefix}-{i:06d}" for i in range(count)]


def _spec(
    ids: Sequence[str], partitions: int, owned: Assignment | None = None, racks: int = 0
) -> GroupSpec:
    topics = frozenset({TOPIC})
    members = {
        m: MemberSpec(
            m,
            topics,
            frozenset(owned.get(m, ())) if owned else frozenset(),
            rack=f"r{k % racks}" if racks else "",
        )
        for k, m in enumerate(ids)
    }
    if not racks:
        return GroupSpec(members, {TOPIC: partitions})
    where = [f"r{zlib.crc32(b'%d' % p) % racks}" for p in range(partitions)]
    return GroupSpec(members, {TOPIC: partitions}, {TOPIC: where})


def _baseline(ids: Sequence[str], partitions: int) -> Assignment:
    """The answer's shape with no decision in it: N lists, P structs, in order.

    The structs are made as the assignors make them (``topic_partitions``: in
    C, not through the named tuple's Python ``__new__``, which costs half again
    as much).
    """
    share, extra = divmod(partitions, len(ids))
    result: Assignment = {}
    start = 0
    for k, m in enumerate(ids):
        end = start + share + (1 if k < extra else 0)
        result[m] = topic_partitions(TOPIC, range(start, end))
        start = end
    return result


def _as_a_coordinator(assignor: Assignor, spec: GroupSpec) -> Assignment:
    """The assignment as a coordinator computes it (``Group.compute_assignment``): the
    assignor, then :func:`validate_assignment` and every member's list sorted."""
    assignment = assignor.assign(spec)
    validate_assignment(spec, assignment)
    return {m: sorted(assignment.get(m, [])) for m in sorted(spec.members)}


def _median_seconds(
    call: Callable[[], object], rounds: int, collector: bool
) -> tuple[float, float]:
    """Median wall time and median CPU time of this process, in seconds, over ``rounds``.

    On a shared machine the wall time also counts the time the process waited
    for a CPU; the CPU time (``time.process_time``) does not.
    """
    walls, cpus = [], []
    for _ in range(rounds):
        with contextlib.nullcontext() if collector else collector_paused():
            cpu = time.process_time()
            started = time.perf_counter()
            call()
            walls.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def measure(params: Params) -> dict[str, Any]:
    """Time every assignor in every case, and the baseline; the JSON-ready result."""
    ids = _member_ids(params.members)
    fresh = _spec(ids, params.partitions)
    baseline, baseline_cpu = _median_seconds(
        lambda: _baseline(ids, params.partitions), params.rounds, params.collector
    )
    figures: dict[str, dict[str, float]] = {}
    cpu_figures: dict[str, dict[str, float]] = {}
    for assignor in ASSIGNORS:
        first = assignor.assign(fresh)
        specs = {
            "fresh": fresh,
            "leave": _spec(ids[1:], params.partitions, first),
            "join": _spec([*ids, "n-000000"], params.partitions, first),
        }
        if params.racks:
            racked = _spec(ids, params.partitions, racks=params.racks)
            specs["fresh+racks"] = racked
            specs["join+racks"] = _spec(
                [*ids, "n-000000"], params.partitions, assignor.assign(racked), params.racks
            )
        calls: dict[str, dict[str, Callable[[], object]]] = {
            assignor.name: {case: partial(assignor.assign, spec) for case, spec in specs.items()},
            f"{assignor.name} checked": {
                case: partial(_as_a_coordinator, assignor, specs[case]) for case in CASES
            },
        }
        for name, cases in calls.items():
            timed = {
                case: _median_seconds(call, params.rounds, params.collector)
                for case, call in cases.items()
            }
            figures[name] = {case: wall * 1000 for case, (wall, _) in timed.items()}
            cpu_figures[name] = {case: cpu * 1000 for case, (_, cpu) in timed.items()}
    return {
        "bench": "assign",
        "params": {**asdict(params), "cpus": cpu_count(), "load_average": load_average()},
        "baseline_ms": baseline * 1000,
        "baseline_cpu_ms": baseline_cpu * 1000,
        "ms": figures,
        "cpu_ms": cpu_figures,
        "ratio": {
            name: {case: ratio(ms, baseline * 1000) for case, ms in cases.items()}
            for name, cases in figures.items()
        },
    }


async def run_benchmark(params: Params) -> dict[str, Any]:
    """:func:`measure`, as :func:`~bench._common.run_and_report` calls it."""
    return measure(params)


def render(result: dict[str, Any]) -> str:
    """The result as a header line and one row per assignor, wall time then CPU time."""
    p = result["params"]
    lines = [
        f"assign: {p['members']:,} members x {p['partitions']:,} partitions (one topic), "
        f"median of {p['rounds']}, collector {'on' if p['collector'] else 'paused'}; "
        f"{p['cpus']} CPUs, load average {p['load_average']}",
        f"baseline (building the answer alone): {result['baseline_ms']:.1f} ms "
        f"({result['baseline_cpu_ms']:.1f} ms of CPU)",
        "",
    ]
    cases = [c for c in (*CASES, *RACK_CASES) if c in next(iter(result["ms"].values()))]
    rows = [
        [
            name,
            *(
                f"{figures[c]:.1f} ({result['ratio'][name][c]:.1f}x)" if c in figures else "-"
                for c in cases
            ),
        ]
        for name, figures in result["ms"].items()
    ]
    lines.append(format_table(["assignor", *(f"{c} ms (x baseline)" for c in cases)], rows))
    lines += ["", "CPU time of this process (what waiting for a shared CPU does not inflate):"]
    rows = [
        [name, *(f"{figures[c]:.1f}" if c in figures else "-" for c in cases)]
        for name, figures in result["cpu_ms"].items()
    ]
    lines.append(format_table(["assignor", *(f"{c} CPU ms" for c in cases)], rows))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 if the benchmark could not run)."""
    parser = argparse.ArgumentParser(
        prog="python bench/assign.py",
        description="Time the range and uniform assignors on a large group.",
    )
    defaults = Params()
    parser.add_argument("--members", type=int, help=f"members (default {defaults.members:,})")
    parser.add_argument(
        "--partitions", type=int, help=f"partitions of the topic (default {defaults.partitions:,})"
    )
    parser.add_argument(
        "--rounds", type=int, help=f"timed rounds per figure (default {defaults.rounds})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI smoke preset: {QUICK.members} x {QUICK.partitions}",
    )
    parser.add_argument(
        "--collector",
        action="store_true",
        help="leave the cyclic garbage collector on while timing (a coordinator pauses it)",
    )
    parser.add_argument(
        "--racks",
        type=int,
        help=f"racks for the +racks cases (default {defaults.racks}; 0: no such cases)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    params = chosen_params(
        args,
        QUICK if args.quick else Params(),
        ("members", "partitions", "rounds", "racks"),
        collector=args.collector,
    )
    if params.members < 2 or params.partitions < 1 or params.rounds < 1 or params.racks < 0:
        print("members must be >= 2, partitions and rounds >= 1, racks >= 0", file=sys.stderr)
        return 2
    return run_and_report("assign", run_benchmark, params, as_json=args.json, render=render)


if __name__ == "__main__":
    sys.exit(main())
