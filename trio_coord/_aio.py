"""The Trio helpers every layer may import: lone exceptions out of nurseries, and enter-once CMs.

Trio's nurseries wrap every exception in an ``ExceptionGroup`` (strict
exception groups). An async context manager that runs a nursery around its
``yield`` (``open_broker``, ``open_consumer``, ``open_connection``) would then
hand its caller ``ExceptionGroup([ValueError(...)])`` for a plain
``ValueError`` raised in the caller's own block. :func:`unwrap_lone_exception`
re-raises the one exception of a single-member group as itself, and leaves
real multi-error groups alone. :class:`EnterOnce` is the base of the clients
that are their own async context manager (a consumer, a producer). This
module is a leaf: it imports nothing from trio_coord.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, Self

__all__ = ["EnterOnce", "unwrap_lone_exception"]


class EnterOnce:
    """An object that is its own async context manager, for one block only.

    ``open_consumer(...)`` and ``open_producer(...)`` return such objects, so
    that callbacks given at construction can refer to them before the block
    starts. A subclass implements :meth:`_run_for_block` (usually an
    ``@asynccontextmanager`` method yielding ``self``).
    """

    _lifetime: AbstractAsyncContextManager[Any] | None = None

    def _run_for_block(self) -> AbstractAsyncContextManager[Self]:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        if self._lifetime is not None:
            raise RuntimeError(f"a {type(self).__name__} can be entered only once")
        lifetime = self._lifetime = self._run_for_block()
        return await lifetime.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._lifetime is not None
        return await self._lifetime.__aexit__(*exc_info)


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
