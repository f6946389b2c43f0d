"""Send a broker a long list a part at a time, each within the smaller frame of the two ends.

A commit or a lookup of offsets names thousands of partitions for a consumer
of a large topic: 10,000 partitions of a 120-character name take 1.3 MB,
more than a default broker reads in one frame, which it refuses by closing
the connection. :func:`send_in_parts` sends such a list by
:class:`~trio_coord.protocol.sizing.Parts`, in order. A group member knows
its coordinator's frame from its join; a client that does not (a standalone
committer, the admin client) keeps a
:class:`~trio_coord.protocol.sizing.FrameGuess`, which starts from the
default frame and is halved each time a part is refused as too large (the
next part opens a new connection). The blocking Spark client cuts its lists
by the same two classes. An offsets lookup, whole or in parts, is answered
a page at a time (each offset's metadata can make an answer outgrow a frame
its request fit): :func:`look_up_committed` asks until the last page.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..protocol.errors import CorruptMessageError, FrameTooLargeError
from ..protocol.messages import OffsetFetchRequest, OffsetFetchResponse, TopicPartition
from ..protocol.sizing import FrameGuess, Parts

__all__ = ["FrameGuess", "look_up_committed", "send_in_parts"]

T = TypeVar("T")


async def send_in_parts(
    items: Sequence[T],
    send: Callable[[list[T]], Awaitable[None]],
    budget: Callable[[], int],
    halve: Callable[[], bool] | None = None,
    size_of: Callable[[T], int] | None = None,
) -> None:
    """``send`` ``items`` in order, a part of at most ``budget()`` bytes at a time (one
    empty part for no items; an item's size as :func:`~trio_coord.protocol.sizing.in_parts`
    takes it). A part refused with FrameTooLargeError is sent again, smaller, while
    ``halve()`` lowers the budget; else the error is raised, the parts before it having
    been sent."""
    parts = Parts(items, budget, halve, size_of)
    for part in parts:
        try:
            await send(part)
        except FrameTooLargeError:
            if not parts.refused():
                raise


async def look_up_committed(
    group: str,
    partitions: list[TopicPartition] | None,
    ask: Callable[[OffsetFetchRequest], Awaitable[object]],
    found: dict[TopicPartition, int],
) -> None:
    """Add to ``found`` the committed offsets of ``partitions`` (None: every one of the
    group's), asking the coordinator with ``ask`` a page at a time."""
    request = OffsetFetchRequest(group, partitions)
    while True:
        response = await ask(request)
        if not isinstance(response, OffsetFetchResponse):
            raise CorruptMessageError(f"answered OffsetFetch with {type(response).__name__}")
        found.update((o.tp, o.offset) for o in response.offsets)
        if response.next is None:
            return
        request = OffsetFetchRequest(group, partitions, response.next)
