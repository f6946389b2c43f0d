"""Send a broker a long list a part at a time, each within the smaller frame of the two ends.

A commit or a lookup of committed offsets names thousands of partitions for a
consumer of a large topic: 10,000 partitions of a 120-character name take
1.3 MB, more than a default broker reads in one frame, which it refuses by
closing the connection. :func:`send_in_parts` cuts the list by
:func:`~trio_coord.protocol.sizing.in_parts` and sends the parts in order.
A group member knows its coordinator's frame from its join; a client that
does not (a standalone committer, the admin client) keeps a
:class:`FrameGuess`, which starts from the default frame and is halved each
time a part is refused as too large (the next part opens a new connection).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..protocol.errors import FrameTooLargeError
from ..protocol.messages import DEFAULT_FRAME
from ..protocol.sizing import in_parts, list_budget

__all__ = ["FrameGuess", "send_in_parts"]

T = TypeVar("T")

SMALLEST_FRAME = 4 * 1024
"""How far a :class:`FrameGuess` is halved before a refusal is passed on."""


class FrameGuess:
    """A broker's frame as a client that was not told takes it: the default's until a
    refusal says it is smaller."""

    def __init__(self, own_frame: int) -> None:
        self.own_frame = own_frame
        self.broker_frame = DEFAULT_FRAME

    def budget(self) -> int:
        """What one request's list may take now."""
        return list_budget(self.own_frame, self.broker_frame)

    def halve(self) -> bool:
        """A request was refused as too large: guess a smaller frame (False: already tiny)."""
        if self.broker_frame <= SMALLEST_FRAME:
            return False
        self.broker_frame //= 2
        return True


async def send_in_parts(
    items: Sequence[T],
    send: Callable[[list[T]], Awaitable[None]],
    budget: Callable[[], int],
    halve: Callable[[], bool] | None = None,
    size_of: Callable[[T], int] | None = None,
) -> None:
    """``send`` ``items`` in order, a part of at most ``budget()`` bytes at a time (one
    empty part for no items; an item's size as :func:`in_parts` takes it). A part
    refused with FrameTooLargeError is sent again, smaller, while ``halve()`` lowers
    the budget; else the error is raised, the parts before it having been sent."""
    rest = items
    while True:
        part = next(in_parts(rest, budget(), size_of))
        try:
            await send(part)
        except FrameTooLargeError:
            if halve is None or not halve():
                raise
            continue
        rest = rest[len(part) :]
        if not rest:
            return
