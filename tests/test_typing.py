"""The code is clean: mypy and ruff (configured in pyproject.toml) find nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_mypy_finds_no_type_errors(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=" ".join)
def test_ruff_finds_nothing(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_still_reports_a_misspelt_name_of_a_lazily_exported_package(tmp_path):
    """The packages import their exports lazily (trio_coord._lazy): mypy must still see
    each name with its type, and still report a name a package does not export, as it
    did when the names were imported eagerly (a module ``__getattr__`` that mypy sees
    would make every misspelt name an ``Any``)."""
    program = tmp_path / "uses_trio_coord.py"
    program.write_text(
        "import trio_coord\n"
        "import trio_coord.client\n"
        "import trio_coord.security\n"
        "import trio_coord.spark\n"
        "a: type[trio_coord.Consumer] = trio_coord.Consumer\n"
        "b: type[trio_coord.security.Sasl] = trio_coord.security.Sasl\n"
        "c = trio_coord.client.open_admin\n"
        "d = trio_coord.spark.background_broker\n"
        "e: int = trio_coord.Consumer\n"
        "f = trio_coord.Consumr\n"
        "g = trio_coord.client.Admn\n"
        "h = trio_coord.security.Sasll\n"
        "i = trio_coord.spark.background_brokr\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    errors = sorted(
        int(line.split(":")[1]) for line in result.stdout.splitlines() if ": error:" in line
    )
    assert errors == [9, 10, 11, 12, 13], result.stdout + result.stderr
    assert 'Module has no attribute "Consumr"' in result.stdout
