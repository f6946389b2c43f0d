"""Offset commits on ZooKeeper: group commit into multi writes, against one write per commit.

``python bench/offsets.py [--committers C] [--commits N] [--repeat R]
[--stored S] [--zk zk://host:port] [--json] [--quick]`` measures how fast a cluster
coordinator makes offset commits durable in ZooKeeper. C committer tasks
(members committing at once) each make N commits of one offset, one after
the other, in two ways, back to back and in alternating order so that the
machine's noise hits both:

* ``group``: through the broker's :class:`~trio_coord.broker.persistence.RecordWriter`,
  which gathers every commit queued while its previous write was in flight
  into one ZooKeeper ``multi`` (the coordinator's real path, fencing check
  included: each transaction opens with ``Check`` of a slot epoch);
* ``single``: every commit is its own ``multi`` (the same check and the
  offset's ``SetData``), all C committers' requests in flight at once (kazoo
  pipelines them on the session's one connection): the baseline.

Throughput is commits per second of wall time; latency is from a commit's
call to its acknowledgement. The figures that travel between machines are
the ratios group/single of throughput and of p50/p99 latency in the same
run (median over R repetitions). Without ``--zk`` the benchmark starts a
private ZooKeeper server (Debian's ``zookeeper`` package, as the tests do;
``forceSync=no``) in a temporary directory. The client and its kazoo thread
share this process.

``--stored S`` first stores S other committed offsets (of other groups, in
ZooKeeper and in the writer's set of known paths, as a coordinator holding
them would), so that both modes run against a store of S+C offset nodes:
#14 asks for 30,000 commits/s with a p99 under 20 ms at a million.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: this checkout's `bench` and `trio_coord`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    BenchError,
    chosen_params,
    cpu_count,
    format_table,
    latency_summary,
    load_average,
    ratio,
    run_and_report,
    tests_module,
)
from trio_coord.broker.persistence import RecordWriter, load_records, offset_path
from trio_coord.core.records import OffsetRecord, Record, encode_record
from trio_coord.protocol.messages import TopicPartition
from trio_coord.store import Check, Create, MetadataStore, SetData, open_zookeeper_store

__all__ = ["Params", "main", "run_benchmark"]

GROUP = "bench"
EPOCH = "/epoch"
MODES = ("group", "single")


@dataclass(frozen=True)
class Params:
    """What to run: committers, commits each, repetitions, and where ZooKeeper is."""

    committers: int = 200
    commits: int = 20
    repeat: int = 3
    zk: str | None = None
    quick: bool = False
    stored: int = 0


QUICK = Params(committers=20, commits=5, repeat=1, quick=True)


@contextmanager
def _private_zookeeper(base: Path, heap: str = "256m") -> Any:
    """A private ZooKeeper server for the run (the tests' helper, in ``tests/zkserver.py``)."""
    zkserver = tests_module("zkserver")
    try:
        server = zkserver.ZooKeeperServer(base, heap=heap, fixed_heap=heap != "256m")
        server.start()
    except zkserver.ZooKeeperUnavailable as exc:
        raise BenchError(f"{exc} (or pass --zk zk://host:port)") from None
    try:
        yield server
    finally:
        server.stop()


Committer = Callable[[int, int], Awaitable[None]]


async def _measure(params: Params, commit: Committer) -> dict[str, Any]:
    """Run C committers of N commits each through ``commit``; throughput and latency."""
    latencies: list[float] = []

    async def committer(index: int) -> None:
        for n in range(params.commits):
            start = time.perf_counter()
            await commit(index, n)
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index in range(params.committers):
            nursery.start_soon(committer, index)
    elapsed = time.perf_counter() - began
    total = params.committers * params.commits
    return {"commits_per_s": total / elapsed, "seconds": elapsed, **latency_summary(latencies)}


async def _run_group(
    store: MetadataStore, params: Params, epoch: int, stored: set[str]
) -> dict[str, Any]:
    current: dict[TopicPartition, Record] = {}

    def replay(record: Record) -> None:
        assert isinstance(record, OffsetRecord)
        current[record.tp] = record

    def committed(record: Record) -> Record | None:
        assert isinstance(record, OffsetRecord)
        return current.get(record.tp)

    writer = RecordWriter(
        store,
        existing_paths=set(),
        replay=replay,
        current=committed,
        guard=[Check(EPOCH, epoch)],
    )
    _, paths = await load_records(store, topics=False, groups=lambda group: group == GROUP)
    writer.add_existing_paths(paths | stored)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writes_before = writer.writes

        async def commit(index: int, n: int) -> None:
            await writer.write([OffsetRecord(GROUP, "t", index, n + 1)])

        result = await _measure(params, commit)
        result["transactions"] = writer.writes - writes_before
        nursery.cancel_scope.cancel()
    return result


async def _run_single(
    store: MetadataStore, params: Params, epoch: int, stored: set[str]
) -> dict[str, Any]:
    async def commit(index: int, n: int) -> None:
        record = OffsetRecord(GROUP, "t", index, n + 1)
        await store.multi(
            [Check(EPOCH, epoch), SetData(offset_path(GROUP, record.tp), encode_record(record))]
        )

    result = await _measure(params, commit)
    result["transactions"] = params.committers * params.commits
    return result


async def _prepare(store: MetadataStore, params: Params) -> int:
    """The offset nodes both modes overwrite, and the epoch node their checks read."""
    await store.create(EPOCH, b"")
    for index in range(params.committers):
        record = OffsetRecord(GROUP, "t", index, 0)
        await store.create(offset_path(GROUP, record.tp), encode_record(record), make_parents=True)
    _data, stat = await store.get(EPOCH)
    return stat.version


STORED_PER_GROUP = 10_000
_PRELOAD_PER_TRANSACTION = 2_000  # (about 150 KiB of creates: under the request limit)


async def _preload(store: MetadataStore, count: int) -> tuple[set[str], float]:
    """Store ``count`` offsets of other groups (10,000 per group); their paths and the
    seconds it took. Transactions of 2,000 creates, eight in flight at once."""
    paths: set[str] = set()
    records = (
        OffsetRecord(f"stored-{n // STORED_PER_GROUP}", "t", n % STORED_PER_GROUP, n)
        for n in range(count)
    )
    began = time.perf_counter()
    for first in range(0, count, STORED_PER_GROUP):
        group = f"stored-{first // STORED_PER_GROUP}"
        await store.create(f"/groups/{group}/offsets", make_parents=True)
        paths |= {f"/groups/{group}", f"/groups/{group}/offsets"}
    send, receive = trio.open_memory_channel[list[OffsetRecord]](0)

    async def writer() -> None:
        async for batch in receive:
            await store.multi(
                [Create(offset_path(r.group_id, r.tp), encode_record(r)) for r in batch]
            )

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(writer)
        async with send:
            batch: list[OffsetRecord] = []
            for record in records:
                batch.append(record)
                paths.add(offset_path(record.group_id, record.tp))
                if len(batch) == _PRELOAD_PER_TRANSACTION:
                    await send.send(batch)
                    batch = []
            if batch:
                await send.send(batch)
    return paths, time.perf_counter() - began


async def run_benchmark(params: Params) -> dict[str, Any]:
    """Run both modes R times, alternating; return every sample and the median ratios."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # (its goodbye when the server stops)
    async with AsyncExitStack() as stack:
        url = params.zk
        if url is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-zk-")))
            heap = f"{256 + params.stored * 5 // 2000}m"  # (~0.8 KiB live per node, and room)
            server = stack.enter_context(_private_zookeeper(base, heap))
            url = server.url()
        chroot = f"/bench-offsets-{int(time.time() * 1000)}"
        store = await stack.enter_async_context(open_zookeeper_store(url + chroot))
        epoch = await _prepare(store, params)
        stored, preload_s = await _preload(store, params.stored) if params.stored else (set(), 0.0)
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for repetition in range(params.repeat):
            order = MODES if repetition % 2 == 0 else MODES[::-1]
            for mode in order:
                run = _run_group if mode == "group" else _run_single
                runs[mode].append(await run(store, params, epoch, stored))
        if params.zk is not None:  # (leave an empty chroot behind; a private server just goes)
            for path in ("/groups", "/topics", EPOCH):
                if await store.exists(path) is not None:
                    await store.delete(path, recursive=True)
    ratios = {
        name: statistics.median(
            ratio(g[key], s[key]) for g, s in zip(runs["group"], runs["single"], strict=True)
        )
        for name, key in (("throughput", "commits_per_s"), ("p50", "p50"), ("p99", "p99"))
    }
    return {
        "params": asdict(replace(params, zk=params.zk or "private")),
        "cpus": cpu_count(),
        "load_average": load_average(),
        "runs": runs,
        "ratio": ratios,
        "preload_seconds": preload_s,
    }


def render(result: Mapping[str, Any]) -> str:
    """The human table: per mode the median figures, then the ratios."""
    params = result["params"]
    rows = []
    for mode in MODES:
        runs = result["runs"][mode]
        rows.append(
            [
                mode,
                f"{statistics.median(r['commits_per_s'] for r in runs):,.0f}",
                f"{statistics.median(r['p50'] for r in runs):.2f}",
                f"{statistics.median(r['p99'] for r in runs):.2f}",
                f"{statistics.median(r['transactions'] for r in runs):,.0f}",
            ]
        )
    r = result["ratio"]
    return "\n".join(
        [
            f"offset commits on ZooKeeper: {params['committers']} committers x "
            f"{params['commits']} commits, {params['repeat']} repetition(s), "
            f"{params['stored']:,} other offsets stored "
            f"(in {result['preload_seconds']:.0f} s); "
            f"{result['cpus']} CPUs, load {result['load_average']}",
            format_table(["mode", "commits/s", "p50 ms", "p99 ms", "transactions"], rows),
            f"group/single: throughput x{r['throughput']:.2f}, p50 x{r['p50']:.2f}, "
            f"p99 x{r['p99']:.2f}",
        ]
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--committers", type=int, help=f"default {Params.committers}")
    parser.add_argument("--commits", type=int, help=f"commits per committer ({Params.commits})")
    parser.add_argument("--repeat", type=int, help=f"repetitions ({Params.repeat})")
    parser.add_argument(
        "--zk", help="zk://host:port of a ZooKeeper to use (default: a private one)"
    )
    parser.add_argument(
        "--stored", type=int, help="other offsets stored first, e.g. 1000000 (default 0)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a small run (for smoke tests)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 if the benchmark could not run)."""
    args = _parse(argv)
    params = chosen_params(
        args, QUICK if args.quick else Params(), ("committers", "commits", "repeat", "stored", "zk")
    )
    if params.committers < 1 or params.commits < 1 or params.repeat < 1 or params.stored < 0:
        print(
            "committers, commits and repeat must be at least 1, stored at least 0",
            file=sys.stderr,
        )
        return 2
    return run_and_report("offsets", run_benchmark, params, as_json=args.json, render=render)


if __name__ == "__main__":
    sys.exit(main())
