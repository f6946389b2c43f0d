"""Smoke test: ``bench/offsets.py --quick --json`` runs and reports sane figures.

It runs the benchmark as a user would (in a subprocess, with a private
ZooKeeper server of its own), so that a change to the record writer or the
ZooKeeper store that breaks it fails here. It checks the shape, not the speed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_offsets_bench_quick_json() -> None:
    """The quick run reports both modes, and group commit uses fewer transactions."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "offsets.py"), "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    group, single = result["runs"]["group"][0], result["runs"]["single"][0]
    for run in (group, single):
        assert run["commits_per_s"] > 0 and 0 < run["p50"] <= run["p99"], run
        assert run["count"] == 20 * 5
    assert single["transactions"] == 100
    assert 1 <= group["transactions"] < 100
    for name in ("throughput", "p50", "p99"):
        value = result["ratio"][name]
        assert isinstance(value, float) and math.isfinite(value) and value > 0
