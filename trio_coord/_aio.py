"""One Trio helper every layer may import: unwrapping lone exceptions from nurseries.

Trio's nurseries wrap every exception in an ``ExceptionGroup`` (strict
exception groups). An async context manager that runs a nursery around its
``yield`` (``open_broker``, ``open_consumer``, ``open_connection``) would then
hand its caller ``ExceptionGroup([ValueError(...)])`` for a plain
``ValueError`` raised in the caller's own block. :func:`unwrap_lone_exception`
re-raises the one exception of a single-member group as itself, and leaves
real multi-error groups alone. This module is a leaf: it imports nothing from
trio_coord.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["unwrap_lone_exception"]


@contextmanager
def unwrap_lone_exception() -> Iterator[None]:
    """Re-raise ``ExceptionGroup([e])`` as ``e`` (recursively); other groups pass through."""
    try:
        yield
    except BaseExceptionGroup as group:
        lone: BaseException = group
        while isinstance(lone, BaseExceptionGroup) and len(lone.exceptions) == 1:
            lone = lone.exceptions[0]
        if lone is group:
            raise
        # Raise the very object (asynccontextmanager recognizes its own exception by
        # identity), and keep the context it had rather than the group we are in.
        context, suppress = lone.__context__, lone.__suppress_context__
        try:
            raise lone
        finally:
            lone.__context__, lone.__suppress_context__ = context, suppress
