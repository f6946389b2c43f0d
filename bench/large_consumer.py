"""One consumer of many partitions: how its steps grow with the partitions it owns.

``python bench/large_consumer.py [--partitions N] [--name-length L] [--idle S]
[--json] [--quick]`` starts a broker in this process (an ephemeral one: its
logs in a temporary directory) and, twice, a topic of N/10 partitions then
one of N (a topic name of L characters: long names make every list a consumer
sends longer), and times a group member owning them all, step by step:

* ``assigned``: from entering ``open_consumer`` to owning every partition
  (a join, and a StartFetchers cut into parts of the member's frame);
* ``first records``: from entering ``open_consumer`` to reading one record
  from each of ten partitions spread over the topic (the assignment, the
  offsets lookups, then fetches, each cut to what a broker takes);
* ``idle``: the CPU this process (consumer and broker) spends per second
  while nothing is produced (every caught-up partition is long-polled in
  turn), over S seconds;
* ``commit``: a ``commit()`` of every partition's offset (cut into parts);
* ``rebalance``: a second member joins and the two own every partition
  (the first hands its positions back, the overflow as commits);
* ``lag``: ``Admin.group_lag`` of the group after both closed (a
  ListOffsets and an offsets lookup of every partition, in parts).

The figures that travel are the ratios of each step at N to the same step
at N/10 in the same run: 10 is linear growth, 100 quadratic. A fetch loop
that scanned every partition at each of its decisions made an idle
consumer of 50,000 partitions take 74% of a core with its broker, and one of
100,000 read its first records after 21 s (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: this checkout's `bench` and `trio_coord`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Progress,
    chosen_params,
    cpu_count,
    format_table,
    load_average,
    ratio,
    run_and_report,
)
from trio_coord import open_admin, open_consumer, open_producer
from trio_coord.broker.server import open_broker

__all__ = ["Params", "main", "run_benchmark"]

STEPS = ("assigned", "first records", "idle", "commit", "rebalance", "lag")
SPREAD = 10
"""Partitions that get a record each, spread over the topic."""


@dataclass(frozen=True)
class Params:
    """What to run: the partitions of the large consumer, its topic name's length, and
    how long it idles."""

    partitions: int = 20_000
    name_length: int = 100
    idle: float = 3.0
    quick: bool = False


QUICK = Params(partitions=2_000, name_length=20, idle=0.5, quick=True)


async def _one_size(partitions: int, params: Params, progress: Progress) -> dict[str, float]:
    """Seconds of each step (CPU share for ``idle``) for a consumer of ``partitions``."""
    topic = f"{partitions:x}".rjust(params.name_length, "t")
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="trio-coord-large-consumer-") as logs:
        async with open_broker(Path(logs), max_partitions=partitions) as broker:
            async with open_admin(broker.bootstrap) as admin:
                await admin.create_topic(topic, partitions)
            async with open_producer(broker.bootstrap, linger=0.01) as producer:
                for p in range(0, partitions, max(1, partitions // SPREAD)):
                    await producer.send(topic, b"x", partition=p)
            progress.step(f"{partitions:,} partitions: assigned")
            start = time.perf_counter()
            async with open_consumer(
                broker.bootstrap, "large", [topic], offset_reset="earliest", auto_commit=False
            ) as consumer:
                while len(consumer.assignment) < partitions:  # noqa: ASYNC110 (no event for it)
                    await trio.sleep(0.01)
                times["assigned"] = time.perf_counter() - start
                progress.step(f"{partitions:,} partitions: first records")
                got = 0
                while got < SPREAD:
                    got += len(await consumer.getmany())
                times["first records"] = time.perf_counter() - start
                progress.step(f"{partitions:,} partitions: idle")
                cpu, wall = time.process_time(), time.perf_counter()
                with trio.move_on_after(params.idle):
                    await consumer.getmany()
                times["idle"] = (time.process_time() - cpu) / (time.perf_counter() - wall)
                progress.step(f"{partitions:,} partitions: commit")
                start = time.perf_counter()
                positions = {tp: consumer.position(tp) for tp in consumer.assignment}
                await consumer.commit({tp: at for tp, at in positions.items() if at is not None})
                times["commit"] = time.perf_counter() - start
                progress.step(f"{partitions:,} partitions: rebalance")
                start = time.perf_counter()
                async with open_consumer(
                    broker.bootstrap, "large", [topic], auto_commit=False
                ) as second:
                    while not second.assignment or (  # noqa: ASYNC110 (no event for it)
                        len(consumer.assignment) + len(second.assignment) < partitions
                    ):
                        await trio.sleep(0.01)
                    times["rebalance"] = time.perf_counter() - start
            progress.step(f"{partitions:,} partitions: lag")
            start = time.perf_counter()
            async with open_admin(broker.bootstrap) as admin:
                rows = await admin.group_lag("large")
            times["lag"] = time.perf_counter() - start
            if len(rows) != partitions:
                raise RuntimeError(f"group_lag gave {len(rows)} rows for {partitions} partitions")
    return times


async def run_benchmark(params: Params) -> dict[str, Any]:
    """Both sizes, the smaller first; returns their figures and the ratios."""
    sizes = (max(1, params.partitions // 10), params.partitions)
    results: dict[int, dict[str, float]] = {}
    with Progress("large_consumer", len(STEPS) * len(sizes)) as progress:
        for size in sizes:
            results[size] = await _one_size(size, params, progress)
    small, large = (results[size] for size in sizes)
    return {
        "params": asdict(params),
        "cpus": cpu_count(),
        "load_average": load_average(),
        "sizes": list(sizes),
        "small": small,
        "large": large,
        "growth": {step: ratio(large[step], small[step]) for step in STEPS},
    }


def render(result: Mapping[str, Any]) -> str:
    """The result as a table: each step at both sizes, and their ratio."""
    small_n, large_n = result["sizes"]
    p = result["params"]
    head = (
        f"large_consumer: one member of {small_n:,} then {large_n:,} partitions "
        f"(a {p['name_length']}-character topic name); {result['cpus']} CPUs, "
        f"load average {result['load_average']}"
    )

    def cell(step: str, value: float) -> str:
        return f"{value * 100:.1f}% CPU" if step == "idle" else f"{value:.3f} s"

    rows = [
        (
            step,
            cell(step, result["small"][step]),
            cell(step, result["large"][step]),
            f"{result['growth'][step]:.1f}",
        )
        for step in STEPS
    ]
    table = format_table(("step", f"{small_n:,}", f"{large_n:,}", "growth"), rows)
    return f"{head}\n\n{table}\n\n(growth 10 is linear in the partitions, 100 quadratic)"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/large_consumer.py",
        description="How a consumer's join, fetches, commits, rebalance and lag query grow "
        "with the partitions it owns: each step at N/10 and at N partitions, and their ratio.",
    )
    parser.add_argument(
        "--partitions", type=int, help=f"the large consumer's partitions ({Params.partitions})"
    )
    parser.add_argument(
        "--name-length",
        type=int,
        dest="name_length",
        help=f"characters of the topic name, 10 to 249 ({Params.name_length})",
    )
    parser.add_argument(
        "--idle", type=float, help=f"seconds the idle CPU is measured over ({Params.idle})"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="a small run (2,000 partitions) for a smoke test"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 if the parameters are out of range)."""
    args = _parse(argv)
    params = chosen_params(
        args, QUICK if args.quick else Params(), ("partitions", "name_length", "idle")
    )
    if params.partitions < 10 or not 10 <= params.name_length <= 249 or params.idle <= 0:
        print(
            "partitions must be at least 10, name-length 10 to 249, idle positive",
            file=sys.stderr,
        )
        return 2
    return run_and_report("large_consumer", run_benchmark, params, as_json=args.json, render=render)


if __name__ == "__main__":
    sys.exit(main())
