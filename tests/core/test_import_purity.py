"""The core is pure (sans-IO): no module under trio_coord/core imports I/O, threads or a clock.

DESIGN.md ("Layers"): ``core/`` imports no trio, no socket, no kazoo, no clock.
Its functions take the time as an argument, so the same code runs in the
broker, in replay after a failover, and in these tests with a fake clock.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trio_coord.core

CORE_DIR = Path(trio_coord.core.__file__).parent
FORBIDDEN = frozenset(
    {"trio", "trio_util", "socket", "kazoo", "time", "asyncio", "threading", "random", "os"}
)
MODULES = sorted(CORE_DIR.rglob("*.py"))


def forbidden_imports(source: str, filename: str) -> list[str]:
    """Every import in ``source`` of a forbidden top-level package, as written."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module.split(".")[0] in FORBIDDEN:
                names = ", ".join(a.name for a in node.names)
                found.append(f"line {node.lineno}: from {node.module} import {names}")
    return found


def test_the_scan_covers_every_core_module() -> None:
    names = {p.name for p in MODULES}
    assert {"assignors.py", "group.py", "fencing.py", "records.py", "validation.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(CORE_DIR).as_posix())
def test_core_module_imports_nothing_impure(path: Path) -> None:
    bad = forbidden_imports(path.read_text(encoding="utf-8"), str(path))
    module = "trio_coord.core." + path.relative_to(CORE_DIR).with_suffix("").as_posix().replace(
        "/", "."
    )
    assert not bad, f"{module} is not pure: {'; '.join(bad)}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import trio", ["line 1: import trio"]),
        ("import os.path", ["line 1: import os.path"]),
        ("from time import monotonic", ["line 1: from time import monotonic"]),
        ("from trio_util import AsyncValue", ["line 1: from trio_util import AsyncValue"]),
        (
            "import msgspec\nfrom kazoo.client import KazooClient",
            ["line 2: from kazoo.client import KazooClient"],
        ),
        ("def f():\n    import socket", ["line 2: import socket"]),
        ("import trio_coord\nimport timeit\nfrom . import time", []),
        ("from ..protocol.messages import TopicPartition", []),
    ],
)
def test_the_scanner_catches_forbidden_imports(source: str, expected: list[str]) -> None:
    # The check above is only as good as this scanner: nested imports, dotted
    # modules and `from x import y` are caught; look-alike names and relative
    # imports of sibling modules are not false positives.
    assert forbidden_imports(source, "<test>") == expected
