"""Every Python example in docs/ runs (the README's is checked in test_cli.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLES = [
    pytest.param(code, id=f"{path.name}-{index}")
    for path in sorted(DOCS.glob("*.md"))
    for index, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs(code, tmp_path):
    # A bound for a hung example, not a speed test: the Spark ones start a JVM, which
    # takes seconds on a quiet machine and minutes beside a busy parallel suite.
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
