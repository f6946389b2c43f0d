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
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]

_importing = threading.RLock()
"""Held while a lazy name's module is imported, so that one thread at a time does it.

The submodules import one another in circles (the broker, the clients and
the core), which one thread resolves. When the package imported them all at
once, the package's own import lock made that one thread; lazily, two
threads asking for two names first (``trio_coord.Broker`` and
``trio_coord.Consumer``) would import the circle from two ends at once, and
Python's import system then fails one of them (``_DeadlockError``, or an
ImportError naming a partly initialised module). Reentrant: a lazy name may
lead to another (``trio_coord.Sasl`` to ``trio_coord.security.Sasl``).
"""


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
        with _importing:
            value = getattr(importlib.import_module(module, package), name)
            namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
