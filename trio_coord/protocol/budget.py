"""A byte budget: memory that requests take while they are received and handled.

One :class:`ByteBudget` per connection bounds what one peer can make its
side hold (the requests it sent and the answers to them not yet written),
and one per broker bounds all connections together (Kafka's
``queued.max.request.bytes``). A taker waits while the budget is spent;
the connection's reader is the taker, so a peer whose requests cannot be
afforded is simply not read from (Kafka "mutes" such a channel) until
earlier ones are answered and their bytes given back. A single charge
larger than the whole budget is let through alone, so that no request
waits for ever.
"""

from __future__ import annotations

import trio

__all__ = ["ByteBudget"]


class ByteBudget:
    """``total`` bytes that tasks take (waiting while they are spent) and give back."""

    __slots__ = ("_freed", "total", "used")

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("a byte budget must be at least 1 byte")
        self.total = total
        self.used = 0
        self._freed: trio.Event | None = None

    def __repr__(self) -> str:
        return f"<ByteBudget {self.used}/{self.total}>"

    @property
    def spent(self) -> bool:
        """True while nothing more can be taken without waiting."""
        return self.used >= self.total

    def try_take(self, size: int) -> int:
        """Take ``size`` bytes (at most the whole budget) if free now; 0 if not (no wait)."""
        size = min(size, self.total)
        if self.used and self.used + size > self.total:
            return 0
        self.used += size
        return size

    async def take(self, size: int) -> int:
        """Take ``size`` bytes (at most the whole budget), waiting until they are free.

        Returns what was taken, to give back with :meth:`give`.
        """
        size = min(size, self.total)
        while self.used and self.used + size > self.total:
            if self._freed is None:
                self._freed = trio.Event()
            await self._freed.wait()
        self.used += size
        return size

    def give(self, size: int) -> None:
        """Give back ``size`` bytes taken earlier; wakes the takers waiting."""
        self.used -= size
        if self._freed is not None:
            self._freed.set()
            self._freed = None
