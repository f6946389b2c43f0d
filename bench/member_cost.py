"""What one idle member costs the broker, in Python objects and bytes, parking on and off.

``python bench/member_cost.py [--members N] [--parked-only] [--json] [--quick]`` runs a
broker *in this process*
(with ``tune_gc`` off, so that nothing is frozen away from the count) and, for
each setting of ``park_idle_connections``, starts one load process of
``bench/heartbeat.py`` that opens N TCP connections, joins N members to one
group and keeps them alive with a heartbeat every 10 s. Once the group is
stable it counts, on the broker's side only, what the N members added: the
objects the garbage collector tracks (``gc.get_objects()``), the bytes
tracemalloc sees allocated by Python, and the process's RSS, each divided by
N; and how many connections are parked. The members live in another process,
so nothing of theirs is counted. No timing: these are counts. ``--parked-only``
skips the run with parking off (at 10,000 members and more it is the slow half).
Above 10,000 members the broker's connection limit is raised as
``bench/heartbeat.py`` raises it. The RSS column here includes tracemalloc's
own bookkeeping and the in-process admin client that watches the group form:
``bench/heartbeat.py``'s RSS column (the broker in its own process) is the
RSS figure; this bench's are the object counts and traced bytes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import format_table, process_rss_bytes, python_module, spawn
from bench.heartbeat import GROUP, HOST, TOPIC, Params, _load_spec, _StableWatch
from trio_coord.broker.server import open_broker
from trio_coord.client.admin import open_admin

__all__ = ["main", "measure"]


async def measure(members: int, park: bool, workdir: Path) -> dict[str, Any]:
    """The broker-side cost per member of ``members`` idle members, parking on or off."""
    async with open_broker(
        None,
        HOST,
        0,
        max_group_size=1_000_000,
        max_partitions=1_000_000,
        max_connections_per_ip=1_000_000,
        # (None: what fits ulimit -n, at most 10,000; beyond, ask for what the run needs)
        max_connections=members + 100 if members + 100 > 10_000 else None,
        park_idle_connections=park,
    ) as broker:
        bootstrap = broker.bootstrap
        async with open_admin(bootstrap) as admin:
            await admin.create_topic(TOPIC, members)
        params = Params(members=members, processes=1, session_timeout=30.0)
        spec = _load_spec("broker", params, broker.address[1], 0, members)
        spec["out"] = str(workdir / "latencies")
        await trio.sleep(0.2)
        gc.collect()
        objects_before = len(gc.get_objects())
        traced_before = tracemalloc.get_traced_memory()[0]
        rss_before = process_rss_bytes(os.getpid())
        argv = python_module("bench.heartbeat", "--load", json.dumps(spec))
        async with spawn(argv, f"load-{park}", workdir) as load:
            with load.within(60.0 + 0.05 * members, "get its members ready"):
                await load.expect("ready")
            with trio.fail_after(60.0 + 0.05 * members):
                await _StableWatch(bootstrap, members, {}).wait()
            await trio.sleep(1.0)  # (the last answers written, the readers idle again)
            gc.collect()
            objects = (len(gc.get_objects()) - objects_before) / members
            traced = (tracemalloc.get_traced_memory()[0] - traced_before) / members
            rss_after = process_rss_bytes(os.getpid())
            parked = 0 if broker._parking is None else len(broker._parking)
            described = broker.coordinator.describe_group(GROUP)
            assert len(described.members) == members, described
    rss = None
    if rss_before is not None and rss_after is not None:
        rss = (rss_after - rss_before) / members
    return {
        "park": park,
        "members": members,
        "parked": parked,
        "tracked_objects_per_member": objects,
        "traced_bytes_per_member": traced,
        "rss_bytes_per_member": rss,
    }


async def _main(members: int, as_json: bool, parked_only: bool = False) -> None:
    tracemalloc.start(1)
    results = []
    with tempfile.TemporaryDirectory(prefix="trio-coord-bench-") as tmp:
        for park in (True,) if parked_only else (False, True):
            results.append(await measure(members, park, Path(tmp)))
    if as_json:
        print(json.dumps(results))
        return
    rows = [
        [
            "on" if r["park"] else "off",
            f"{r['members']:,}",
            f"{r['parked']:,}",
            f"{r['tracked_objects_per_member']:.1f}",
            f"{r['traced_bytes_per_member'] / 1024:.2f}",
            "-" if r["rss_bytes_per_member"] is None else f"{r['rss_bytes_per_member'] / 1024:.2f}",
        ]
        for r in results
    ]
    headers = ["parking", "members", "parked", "gc objects/member", "traced KiB", "RSS KiB"]
    print(format_table(headers, rows))


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python bench/member_cost.py", description=__doc__)
    parser.add_argument("--members", type=int, help="idle members (default 1000)")
    parser.add_argument("--quick", action="store_true", help="CI smoke preset: 50 members")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--parked-only", action="store_true", help="measure with parking on only")
    args = parser.parse_args(argv)
    members = args.members or (50 if args.quick else 1000)
    if members < 1:
        print("members must be >= 1", file=sys.stderr)
        return 2
    trio.run(_main, members, args.json, args.parked_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
