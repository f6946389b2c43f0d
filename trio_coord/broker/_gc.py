"""Keep the garbage collector off a long-lived broker's back (``BrokerConfig.tune_gc``).

A broker holds state for as long as it runs: every member's connection, the
groups, their offsets. CPython's cyclic collector walks all tracked objects
in each full collection, so with thousands of members a full collection
takes a large fraction of a second and runs every few seconds. What lives
long is moved to the permanent generation (``gc.freeze``): once loaded, a
moment after a group becomes stable (new members are long-lived state), and
every 30 s, so that collections walk only what is young; once an hour it is
unfrozen and collected in full, so that cycles among old objects are still
reclaimed. And the collector's thresholds are a server's: the youngest
generation is collected after 50,000 net allocations, not 700. A young
collection walks every young object still alive, and with thousands of
members that is every waiting connection's freshly made chain of coroutines
(each read makes a new one), while a single poll of the sockets allocates a
tuple per ready socket: at 700, a broker of 5,000 closed-loop members spent a
third of its CPU in young collections. This changes the process's collector, so it is for a process
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
        self,
        *,
        freeze_every: float = 30.0,
        full_every: float = 3600.0,
        settle: float = 1.0,
        thresholds: tuple[int, int, int] = (50_000, 20, 100),
    ) -> None:
        self.freeze_every = freeze_every
        """Seconds between freezes when nothing asks for one sooner."""
        self.full_every = full_every
        """Seconds between full collections of everything (unfreeze, collect, freeze)."""
        self.settle = settle
        """How long after :meth:`changed` the freeze waits (a burst of rebalances: one)."""
        self.thresholds = thresholds
        """The collector's thresholds while :meth:`run` runs (``gc.set_threshold``)."""
        self._soon = trio.Event()

    def changed(self) -> None:
        """Much new long-lived state (a group became stable): freeze soon. O(1)."""
        self._soon.set()

    async def run(self) -> None:
        """Freeze now, then whenever asked (after ``settle``) or every ``freeze_every`` s.

        The collector's thresholds are :attr:`thresholds` until it returns.
        """
        before = gc.get_threshold()
        gc.set_threshold(*self.thresholds)
        try:
            await self._keep()
        finally:
            gc.set_threshold(*before)

    async def _keep(self) -> None:
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
