"""``examples/spark_pipeline.py`` runs as a user runs it, with its own embedded broker.

Events go through Spark's windowed counts into a results topic, a Trio
consumer group reads them back, the counts match plain Python's, and the
Spark stream's group has no lag left.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "spark_pipeline.py"


def test_the_pipeline_example_runs_and_checks_itself(tmp_path):
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--master", "local[2]"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "run 1: 2000 events in 25 (minute, page) windows" in lines
    assert "matches plain Python: True" in lines
    assert "lag of group spark-pipeline: 0" in lines
