"""Every module says its one job, and every public function and class says what it does."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trio_coord"


def _undocumented(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    missing = [] if ast.get_docstring(tree) else ["module docstring"]

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                private = child.name.startswith("_")  # includes dunders
                if not private and not ast.get_docstring(child):
                    missing.append(f"line {child.lineno}: {prefix}{child.name}")
                if isinstance(child, ast.ClassDef) and not private:
                    visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return missing


def test_every_module_and_public_definition_has_a_docstring():
    problems = {
        str(path.relative_to(PACKAGE.parent)): missing
        for path in sorted(PACKAGE.rglob("*.py"))
        if (missing := _undocumented(path))
    }
    assert problems == {}
