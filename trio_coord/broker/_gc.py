"""Keep the garbage collector off a long-lived broker's back (``BrokerConfig.tune_gc``).

A broker holds state for as long as it runs: every member's connection, the
groups, their offsets. CPython's cyclic collector walks all tracked objects
in each full collection, so with thousands of members a full collection
takes a large fraction of a second and runs every few seconds. What lives
long is moved to the permanent generation (``gc.freeze``): once loaded, a
moment after a group becomes stable (new members are long-lived state), and
every 30 s, so that collections walk only what is young; once an hour it is
unfrozen and collected in full, so that cycles among old objects are still
reclaimed. This changes the process's collector, so it is for a process
that runs a broker (``trio-coord broker`` turns it on), not for a library
embedded in someone's application, where it is off by default.
"""

from __future__ import annotations

import gc
import logging
import time

import trio

__all__ = ["CollectorKeeper"]

log = logging.getLogger(__name__)


class CollectorKeeper:
    """Freezes what survives; run :meth:`run` in a task, call :meth:`changed` freely."""

    def __init__(
        self, *, freeze_every: float = 30.0, full_every: float = 3600.0, settle: float = 1.0
    ) -> None:
        self.freeze_every = freeze_every
        """Seconds between freezes when nothing asks for one sooner."""
        self.full_every = full_every
        """Seconds between full collections of everything (unfreeze, collect, freeze)."""
        self.settle = settle
        """How long after :meth:`changed` the freeze waits (a burst of rebalances: one)."""
        self._soon = trio.Event()

    def changed(self) -> None:
        """Much new long-lived state (a group became stable): freeze soon. O(1)."""
        self._soon.set()

    async def run(self) -> None:
        """Freeze now, then whenever asked (after ``settle``) or every ``freeze_every`` s."""
        gc.collect()
        gc.freeze()
        last_full = trio.current_time()
        while True:
            with trio.move_on_after(self.freeze_every):
                await self._soon.wait()
                await trio.sleep(self.settle)
            self._soon = trio.Event()
            if trio.current_time() - last_full >= self.full_every:
                started = time.perf_counter()
                gc.unfreeze()
                found = gc.collect()
                gc.freeze()
                last_full = trio.current_time()
                log.info(
                    "full garbage collection: %d unreachable object(s) in %.0f ms; %d frozen",
                    found,
                    (time.perf_counter() - started) * 1000,
                    gc.get_freeze_count(),
                )
            else:
                gc.freeze()
