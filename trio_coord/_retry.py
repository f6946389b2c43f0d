"""The one retry policy of every client: jittered exponential backoff, with no clock and no I/O.

The Trio clients (``client/_bootstrap.Backoff``, which adds an async ``sleep``) and the
blocking Spark client (``spark/_client``, which sleeps with ``time.sleep``) both take their
delays from :class:`RetryPolicy`, so a change to how clients back off is made once: start
at ``initial`` seconds, double after each failure up to ``maximum``, spread each delay by
±20% so that clients refused together do not come back together, and start again after a
success.
"""

from __future__ import annotations

import random

__all__ = ["RetryPolicy"]

JITTER = 0.2
"""Each delay is the current one times a random factor in [1 - JITTER, 1 + JITTER]."""


class RetryPolicy:
    """Jittered exponential backoff: ``initial``, doubling up to ``maximum``."""

    def __init__(self, initial: float = 0.05, maximum: float = 2.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    @property
    def current(self) -> float:
        """The delay the next failure waits, before jitter (to check it against a deadline)."""
        return self._next

    def reset(self) -> None:
        """Start again from the initial delay (after a success)."""
        self._next = self.initial

    def next_delay(self) -> float:
        """The delay to wait now (the current one, jittered); the one after is doubled."""
        delay = self._next * random.uniform(1 - JITTER, 1 + JITTER)
        self._next = min(self._next * 2, self.maximum)
        return delay
