"""Smoke test: `bench/heartbeat.py --quick --json` runs and reports sane figures.

It runs the benchmark as a user would, in a subprocess (it starts a broker,
an echo server and a load process of its own), so that a change to the
protocol, the broker or the client API that breaks the benchmark fails here
instead of rotting unnoticed. It checks the shape of the JSON, not the speed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_quick(script: str, *options: str, timeout: float = 60) -> dict:
    """Run ``bench/SCRIPT --quick --json [OPTIONS]`` and return its JSON result."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", "--json", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_heartbeat_bench_quick_json() -> None:
    """The quick heartbeat benchmark completes and reports throughput, latency and ratios."""
    result = run_quick("heartbeat.py", "--compare-parking")
    for target in ("broker", "unparked", "echo"):
        figures = result[target]
        assert figures["heartbeats_per_s"] > 0, figures
        assert 0 < figures["p50_ms"] <= figures["p99_ms"], figures
        assert figures["errors"] == 0, figures
    for ratios in (result["ratio"], result["unparked_ratio"]):
        for name in ("throughput", "p50", "p99"):
            value = ratios[name]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, ratios
    assert result["params"]["quick"] is True


@pytest.mark.slow
def test_member_cost_bench_quick_json() -> None:
    """`bench/member_cost.py --quick --json`: parking off, then on, every idle member counted."""
    off, on = run_quick("member_cost.py")
    assert (off["park"], on["park"]) == (False, True)
    assert off["parked"] == 0 and on["parked"] == on["members"] == 50, (off, on)
    for figures in (off, on):
        assert figures["tracked_objects_per_member"] > 0, figures
        assert figures["traced_bytes_per_member"] > 0, figures
    # A parked member has no task, no coroutine chain, no nursery: fewer objects.
    assert on["tracked_objects_per_member"] < off["tracked_objects_per_member"], (off, on)


@pytest.mark.slow
def test_heartbeat_bench_open_loop_quick_json() -> None:
    """The open-loop ramp grows the group step by step and says how many members it held."""
    result = run_quick("heartbeat.py", "--open-loop")
    params = result["params"]
    assert params["open_loop"] is True and params["quick"] is True
    steps = result["steps"]
    sizes = [s["members"] for s in steps]
    assert sizes in ([params["step"]], [params["step"], params["members"]]), steps
    for step in steps:
        assert step["heartbeats_per_s"] > 0, step
        assert 0 < step["p50_ms"] <= step["p99_ms"], step
        assert step["errors"] == 0 and step["unanswered"] == 0, step
    # The ramp stops at the first step over the p99 limit, and holds the step before it.
    # (16 members at 0.3 s are far below it on a quiet machine; a loaded one, such as a
    # parallel test run, can pass it: latency is the bench's figure, not this test's.)
    within = [s["p99_ms"] <= params["p99_limit_ms"] for s in steps]
    assert within in ([True, True], [True, False], [False]), steps
    assert result["held"] == ([0, *sizes][within.index(False)] if False in within else sizes[-1])


def test_assign_bench_quick_json() -> None:
    """The assignment benchmark times both assignors in every case, and the baseline."""
    result = run_quick("assign.py")
    assert result["params"]["quick"] is True
    assert result["baseline_ms"] > 0
    for name in ("range", "uniform", "range checked", "uniform checked"):
        for case in ("fresh", "leave", "join"):
            assert result["ms"][name][case] > 0, result["ms"]
            assert result["cpu_ms"][name][case] >= 0, result["cpu_ms"]
            assert math.isfinite(result["ratio"][name][case]), result["ratio"]


def test_forming_bench_quick_json() -> None:
    """The forming benchmark forms a group and reports its wall time and the broker's CPU."""
    result = run_quick("forming.py")
    assert result["params"]["quick"] is True
    (summary,) = result["summary"]
    assert summary["members"] == result["params"]["members"][0]
    assert summary["wall_s"]["median"] > 0, summary
    assert summary["broker_cpu_s"]["median"] >= 0, summary
    assert summary["generations"] and min(summary["generations"]) >= 1, summary


def test_forming_bench_both_loads() -> None:
    """The lean load (one epoll loop) and the Trio one both form the group, and the lean one
    accounts for itself: every member joined in one generation, its CPU and longest pause."""
    result = run_quick("forming.py", "--load-kind", "lean,trio")
    rows = {s["load_kind"]: s for s in result["summary"]}
    assert set(rows) == {"lean", "trio"}, rows
    for summary in rows.values():
        assert summary["wall_s"]["median"] > summary["stable_at_s"]["median"] > 0, summary
        assert min(summary["generations"]) >= 1, summary
    members = result["params"]["members"][0]
    (run,) = result["runs"][f"{members} lean"]
    (report,) = run["load_reports"]
    assert report["members"] == members, report
    assert report["cpu_s"] > 0 and report["longest_gap_s"] >= 0, report
    assert run["load_cpu_s"] is not None and run["load_cpu_s"] > 0, run


@pytest.mark.slow
def test_rebalance_bench_quick() -> None:
    """The quick rebalance benchmark reports every measure, within sanity bounds of S.

    The bounds are loose on purpose (this is not a performance claim): a
    crashed member's partitions move once its lease (last heartbeat + S)
    ends, so the handover cannot take much more than S; a silent member is
    declared dead at its last heartbeat + S, at least 2/3 S after it fell
    silent, since members heartbeat every S/3.
    """
    result = run_quick("rebalance.py")
    assert result["params"]["quick"] is True
    rounds = result["params"]["rounds"]
    measures = result["measures"]
    expected = {
        "join",
        "leave",
        "leave_signal",
        "crash_detection",
        "crash_handover",
        "crash_lease_left",
        "crash_after_lease",
        "silent_detection",
        "silent_lease_left",
        "silent_slack",
        "silent_handover",
    }
    assert expected <= measures.keys(), sorted(measures)
    for name in expected:
        figures = measures[name]
        assert figures["count"] >= rounds, (name, figures)
        for key in ("min_ms", "p50_ms", "max_ms"):
            value = figures[key]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, figures)
    assert measures["crash_handover"]["max_ratio"] <= 1.2, measures["crash_handover"]
    assert measures["silent_detection"]["min_ratio"] >= 0.5, measures["silent_detection"]


@pytest.mark.slow
def test_throughput_bench_quick_json() -> None:
    """The quick throughput benchmark reports rates and ratios for every mode, size and phase.

    Only the shape and the signs are checked: every figure is positive and
    finite, and each phase has its ratio to the plain-file baseline.
    """
    result = run_quick("throughput.py")
    params = result["params"]
    assert params["quick"] is True
    runs = result["runs"]
    expected = {(mode, size) for mode in ("fsync", "interval") for size in params["sizes"]}
    assert {(run["mode"], run["value_bytes"]) for run in runs} == expected
    for run in runs:
        assert run["records"] == params["records"], run
        assert run["producer_batches"] >= 1, run
        for phase, base in (("produce", "write"), ("consume", "read")):
            for figures in (run[phase], run["baseline"][base]):
                assert len(figures["samples_s"]) == params["repeat"], figures
                for key in ("records_per_s", "mb_per_s"):
                    value = figures[key]
                    assert isinstance(value, float) and math.isfinite(value), (phase, figures)
                    assert value > 0, (phase, figures)
        ratios = ["produce", "consume"] + (["produce_parallel"] if run["mode"] == "fsync" else [])
        for name in ratios:
            for key in (name, f"{name}_min", f"{name}_max"):
                value = run["ratio"][key]
                assert isinstance(value, float) and math.isfinite(value) and value > 0, run["ratio"]


@pytest.mark.slow
def test_spark_read_bench_quick_json() -> None:
    """The quick Spark read benchmark reads every record both ways and reports their ratio."""
    # Its own SparkSession starts in ~5 s on a quiet machine, much later beside a busy suite.
    result = run_quick("spark_read.py", timeout=180)
    assert result["params"]["quick"] is True
    # Every record is in some stored batch, and no batch is empty.
    assert result["params"]["partitions"] <= result["stored_batches"] <= result["params"]["records"]
    for name in ("source", "json"):
        figures = result[name]
        assert len(figures["samples_s"]) == result["params"]["repeat"], figures
        value = figures["records_per_s"]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, figures
    for key in ("median", "min", "max"):
        value = result["ratio"][key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, result["ratio"]


@pytest.mark.slow
@pytest.mark.parametrize("where", [[], ["--child"]], ids=["in-process", "child"])
def test_rebalance_churn_bench_quick(where: list[str]) -> None:
    """`bench/rebalance.py --churn --quick --json`: both protocols move the same partitions,
    and the cooperative group stops only those (its members never pause what they keep),
    with the members in the broker's process or in a child process."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "rebalance.py"),
            "--churn",
            "--quick",
            "--json",
            *where,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    eager, coop = result["summary"]["eager"], result["summary"]["cooperative"]
    assert eager["moved_total"] == coop["moved_total"] > 0
    assert coop["stopped_total"] <= coop["moved_total"] < eager["stopped_total"]
    assert coop["kept_pause_max_ms"] == 0.0 and coop["pause_max_ms"] == 0.0
    assert eager["kept_pause_max_ms"] > 0.0
    assert len(result["changes"]["eager"]) == 2 * result["params"]["changes"]
    assert result["params"]["child"] is bool(where)


@pytest.mark.slow
def test_kafka_bench_quick_json() -> None:
    """The quick Kafka benchmark measures trio-coord and librdkafka's mock cluster, with ratios:
    throughput, and the rebalance latency of a join, a clean leave and a SIGKILL.

    Bounds are loose (no performance claim), but one holds by construction: a
    crashed member's partitions wait for its session to end on both targets,
    and the mock then waits up to a whole session more for the survivors to
    rejoin, so trio-coord's crash figure is the smaller one.
    """
    result = run_quick("kafka.py", timeout=150)
    for target in ("trio_coord", "mock"):
        figures = result[target]
        assert figures["produce_records_per_s"] > 0, figures
        assert figures["consume_records_per_s"] > 0, figures
    for name in ("produce", "consume"):
        value = result["ratio"][name]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, result["ratio"]
    assert result["params"]["quick"] is True
    rebalance = result["rebalance"]
    for target in ("trio_coord", "mock"):
        figures = rebalance[target]
        for name in ("join", "leave", "crash", "crash_revoke"):
            value = figures[f"{name}_ms"]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, figures)
    for name in ("join", "leave", "crash", "crash_revoke"):
        value = rebalance["ratio"][name]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, rebalance["ratio"]
    assert rebalance["ratio"]["crash"] < 1, rebalance


def test_batch_layout_bench_quick_json() -> None:
    """`bench/batch_layout.py --quick --json`: sizes in both layouts, and read-cost ratios."""
    result = run_quick("batch_layout.py")
    assert {(row["data"], row["codec"]) for row in result["sizes"]} == {
        (data, codec)
        for data in ("json-like", "equal", "random")
        for codec in ("none", "zlib", "lz4", "zstd")
    }
    for row in result["sizes"]:
        assert row["rows"] > 0 and row["columnar"] > 0, row
    for name, figures in result["timings"].items():
        assert figures["columnar"] > 0 and figures["rows"] > 0, name
        low, high = figures["ratio_range"]
        assert 0 < low <= figures["ratio"] <= high, (name, figures)


@pytest.mark.slow
def test_large_consumer_bench_quick_json() -> None:
    """`bench/large_consumer.py --quick --json`: every step at both sizes, and their ratios."""
    result = run_quick("large_consumer.py")
    assert result["sizes"] == [200, 2000]
    for size in ("small", "large"):
        figures = result[size]
        assert set(figures) == set(result["growth"]), figures
        assert all(value > 0 for value in figures.values()), figures
    assert all(math.isfinite(value) and value > 0 for value in result["growth"].values())
