"""Level-triggered watches shared by the store backends: change flags and snapshot iterators.

Both backends expose a watch the same way: a :class:`Watch` flag registered
under a path is marked dirty by every change there, and a
:class:`WatchIterator` reads a fresh snapshot whenever its flag is dirty,
yielding it only if it differs from the last one yielded. Changes coalesce
(a slow reader sees the latest state, never a queue of stale ones). What
differs between backends, how to read a snapshot and when the store can be
read at all, is passed in as two callables.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Final, Generic, TypeAlias, TypeVar

import trio

__all__ = ["Registry", "Watch", "WatchIterator", "notify", "notify_all", "registered"]

_T = TypeVar("_T")


class Watch:
    """Level-triggered change flag for one registered watch."""

    __slots__ = ("dirty", "event")

    def __init__(self) -> None:
        self.dirty = True  # the first snapshot is due at once
        self.event = trio.Event()

    def notify(self) -> None:
        """Mark the watch dirty and wake its reader."""
        self.dirty = True
        self.event.set()


# Watches registered per path (a backend's own key: the full ZooKeeper path, or the store path).
Registry: TypeAlias = dict[str, set[Watch]]


def notify(registry: Registry, key: str) -> None:
    """Mark every watch registered under ``key`` dirty."""
    watches = registry.get(key)
    if watches:
        for watch in watches:
            watch.notify()


def notify_all(*registries: Registry) -> None:
    """Mark every watch in ``registries`` dirty (after a reconnect: anything may have changed)."""
    for registry in registries:
        for watches in registry.values():
            for watch in watches:
                watch.notify()


@contextmanager
def registered(registry: Registry, key: str) -> Iterator[Watch]:
    """A new :class:`Watch` registered under ``key`` for the life of the block."""
    watch = Watch()
    registry.setdefault(key, set()).add(watch)
    try:
        yield watch
    finally:
        watches = registry[key]
        watches.discard(watch)
        if not watches:
            del registry[key]


_NOTHING: Final = object()  # "no snapshot yielded yet"


class WatchIterator(Generic[_T]):
    """Async iterator of snapshots for one watch; coalesces changes, never queues them.

    ``gate`` is awaited before each look at the flag: it raises if the store
    can no longer be read (closed, expired) and waits while it cannot be read
    yet (a lost connection). ``read`` takes a snapshot (re-arming whatever
    marks the flag dirty). A read that raises leaves the flag dirty, so the
    next call reads again and misses nothing.
    """

    def __init__(
        self,
        watch: Watch,
        read: Callable[[], Awaitable[_T]],
        gate: Callable[[], Awaitable[None]],
    ) -> None:
        self._watch = watch
        self._read = read
        self._gate = gate
        self._last: _T | object = _NOTHING

    def __aiter__(self) -> WatchIterator[_T]:
        return self

    async def __anext__(self) -> _T:
        watch = self._watch
        while True:
            await self._gate()
            if not watch.dirty:
                await watch.event.wait()
                continue
            watch.dirty = False
            watch.event = trio.Event()
            try:
                snap = await self._read()
            except BaseException:
                watch.dirty = True  # not delivered: the next call must not miss it
                raise
            if snap != self._last:
                self._last = snap
                return snap
