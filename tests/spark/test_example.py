"""``examples/spark_pipeline.py`` runs as a user runs it, with its own embedded broker.

Events go through Spark's windowed counts into a results topic, a Trio
consumer group reads them back, the counts match plain Python's, and the
Spark stream's group has no lag left as soon as the query has ended. Its data goes
under the temporary directory, never into the directory it is run from.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "spark_pipeline.py"


def test_the_pipeline_example_runs_and_checks_itself(tmp_path):
    cwd, temp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--master", "local[2]"],
        cwd=cwd,
        env={**os.environ, "TMPDIR": str(temp)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(cwd.iterdir()) == []  # its data is under the temporary directory, not here
    assert (temp / "trio_coord-spark-pipeline" / "spark" / "checkpoint").is_dir()
    lines = done.stdout.splitlines()
    assert "run 1: 2000 events in 25 (minute, page) windows" in lines
    assert "matches plain Python: True" in lines
    assert "lag of group spark-pipeline: 0" in lines
