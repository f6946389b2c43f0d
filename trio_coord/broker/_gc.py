"""Keep the garbage collector off a long-lived broker's back (``BrokerConfig.tune_gc``).

A broker holds state for as long as it runs: every member's connection, the
groups, their offsets. CPython's cyclic collector walks all tracked objects
in each full collection, so with thousands of members a full collection
takes a large fraction of a second and runs every few seconds. What lives
long is moved to the permanent generation (``gc.freeze``) once loaded and
then periodically, so that collections walk only what is young; once an
hour (or as asked) it is unfrozen and collected in full, so that cycles
among old objects are still reclaimed. This changes the process's
collector, so it is for a process that runs a broker (``trio-coord
broker`` turns it on), not for a library embedded in someone's
application, where it is off by default.
"""

from __future__ import annotations

import gc
import logging
import time

import trio

__all__ = ["keep_collector_young"]

log = logging.getLogger(__name__)

FREEZE_EVERY = 30.0
"""Seconds between freezes of what survived (new members, groups, offsets)."""
FULL_EVERY = 3600.0
"""Seconds between full collections of everything (unfreeze, collect, freeze)."""


async def keep_collector_young(
    *, freeze_every: float = FREEZE_EVERY, full_every: float = FULL_EVERY
) -> None:
    """Freeze what survives every ``freeze_every`` s, collect all every ``full_every`` s."""
    gc.collect()
    gc.freeze()
    last_full = trio.current_time()
    while True:
        await trio.sleep(freeze_every)
        if trio.current_time() - last_full >= full_every:
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
