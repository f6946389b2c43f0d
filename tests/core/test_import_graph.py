"""The modules of the pure core import each other in one direction: no import circle.

A circle (core/_sticky.py and core/assignors.py had one, hidden behind
TYPE_CHECKING) makes modules impossible to load or change one at a time;
shared types live in a module both sides import (core/assignment.py).
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import trio_coord.core

CORE = Path(trio_coord.core.__file__).parent


def _imports(path: Path) -> set[str]:
    """The sibling core modules ``path`` imports (at run time or for type checking)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_the_core_modules_form_no_import_circle() -> None:
    graph = {p.stem: _imports(p) for p in CORE.glob("*.py") if p.stem != "__init__"}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:  # pragma: no cover - the failure being guarded against
        raise AssertionError(f"import circle in trio_coord/core: {exc.args[1]}") from None
    assert order.index("assignment") < order.index("_sticky") < order.index("assignors")
