"""Lazy re-exports (PEP 562): a package names what it offers without importing it all.

``trio_coord`` re-exports the broker, the clients and the log, which together
take a few hundred milliseconds to import. A program that needs one part
(Spark's Python workers need the blocking client and the record format,
never the broker) should not pay for the rest: a package lists its exports
as ``{name: submodule}`` and :func:`lazy_exports` gives it the module-level
``__getattr__`` and ``__dir__`` that import a submodule when one of its names
is first asked for (then the name is cached in the package). A package
imports the same names under ``if TYPE_CHECKING:`` for type checkers, and
assigns the ``__getattr__`` under ``if not TYPE_CHECKING:``: a module
``__getattr__`` that mypy sees makes it type every missing name as ``Any``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose globals are ``namespace``:
    ``exports`` maps each name to the module (relative to the package) that defines it."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        try:
            module = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
