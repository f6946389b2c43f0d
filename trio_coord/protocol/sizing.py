"""How much of a frame a message's list takes, and how to cut a list into parts that fit one.

A list a message carries (a listing's page, an assignment pushed to a member,
the positions or commits a member sends, the partitions of an offsets lookup)
grows with what users create, and one message holding it all would one day
outgrow the frame of the peer that reads it: that peer refuses the frame and
closes the connection, for good, since the same list is sent again. The
broker and the clients both cut such lists here, by the bytes each item takes
encoded: :func:`page` takes the leading items within a budget and says where
the next page starts, :func:`in_parts` cuts a whole list into runs, and
:func:`list_budget` is what one message's list may take between two peers of
given frames. A client that is not told its peer's frame (a standalone
committer, the admin client, the Spark client) keeps a :class:`FrameGuess`
and sends a list by :class:`Parts`, which cuts the rest smaller after a
refusal; it is plain iteration, so the Trio clients and the blocking Spark
client share it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

import msgspec

from .framing import DEFAULT_MAX_FRAME_SIZE
from .messages import TopicPartition, fetch_partition_bytes

__all__ = [
    "FrameGuess",
    "Parts",
    "encoded_size",
    "in_parts",
    "list_budget",
    "listed_offset_bytes",
    "page",
]

T = TypeVar("T")
K = TypeVar("K")

_encode = msgspec.msgpack.Encoder().encode

SMALLEST_FRAME = 4 * 1024
"""How far a :class:`FrameGuess` is halved before a refusal is passed on."""


def encoded_size(item: object) -> int:
    """Bytes ``item`` takes as one element of an encoded list (its header included)."""
    return len(_encode(item)) + 1


def listed_offset_bytes(tp: TopicPartition) -> int:
    """What a partition adds to an offsets lookup's (ListOffsets) answer, at most: the size
    to cut such a lookup by, since an answer's entry is up to 64 bytes more than the
    request's (six times it for a short topic name)."""
    return fetch_partition_bytes(tp.topic)


def list_budget(*frames: int) -> int:
    """The bytes one message's list may take when peers of these frames read it: a quarter
    of the smallest, which leaves the rest of the frame to the message's envelope and to
    an answer larger than its request (an offsets lookup answers with offsets and their
    metadata)."""
    return min(frames) // 4


def page(
    items: Iterable[T],
    key: Callable[[T], K],
    budget: int,
    size_of: Callable[[T], int] = encoded_size,
) -> tuple[list[T], K | None]:
    """The leading items whose sizes (default: encodings) fit in ``budget`` bytes, and the
    next cursor.

    ``items`` are in cursor order; ``key`` gives an item's cursor. At least
    one item is returned (a page must make progress); the cursor is None
    when every item fit.
    """
    out: list[T] = []
    used = 0
    for item in items:
        size = size_of(item)
        if out and used + size > budget:
            return out, key(out[-1])
        out.append(item)
        used += size
    return out, None


def in_parts(
    items: Sequence[T], budget: int, size_of: Callable[[T], int] | None = None
) -> Iterator[list[T]]:
    """``items`` cut, in order, into runs whose sizes fit ``budget`` bytes (at least one).

    For a message that must carry a whole list, like a large assignment or a
    commit: each run goes in a frame of its own. An empty list is one empty
    run. An item's size is its encoding unless ``size_of`` says otherwise (what
    it adds to the answer, when that is the larger: an offsets lookup's).
    """
    if size_of is None:
        if len(_encode(items)) + len(items) <= budget:  # (the sum of encoded_size: all fit)
            yield list(items)
            return
        size_of = encoded_size
    rest = items
    while True:
        run, _ = page(rest, _no_key, budget, size_of)
        yield run
        rest = rest[len(run) :]
        if not rest:
            return


def _no_key(item: object) -> None:
    return None


class FrameGuess:
    """A broker's frame as a client that was not told takes it: the default's until a
    refusal says it is smaller."""

    def __init__(self, own_frame: int) -> None:
        self.own_frame = own_frame
        self.broker_frame = DEFAULT_MAX_FRAME_SIZE

    def budget(self) -> int:
        """What one request's list may take now."""
        return list_budget(self.own_frame, self.broker_frame)

    def halve(self) -> bool:
        """A request was refused as too large: guess a smaller frame (False: already tiny)."""
        if self.broker_frame <= SMALLEST_FRAME:
            return False
        self.broker_frame //= 2
        return True


class Parts(Generic[T]):
    """``items`` (in order) as the parts a client sends them in, each cut when it is
    due to fit ``budget()`` bytes then (an item's size as :func:`in_parts` takes it).

    Iterate, send each part, and call :meth:`refused` when the peer refused
    one as too large: the same items come again, cut by the lowered budget.
    One empty part for no items.
    """

    def __init__(
        self,
        items: Sequence[T],
        budget: Callable[[], int],
        halve: Callable[[], bool] | None = None,
        size_of: Callable[[T], int] | None = None,
    ) -> None:
        self._items = items
        self._budget = budget
        self._halve = halve
        self._size_of = size_of
        self._again = False

    def __iter__(self) -> Iterator[list[T]]:
        rest = self._items
        while True:
            # One cut of the rest, until a refusal lowers the budget (a cut per part
            # encoded all the rest to see if it fit: quadratic in a long list's parts).
            for part in in_parts(rest, self._budget(), self._size_of):
                self._again = False
                yield part
                if self._again:
                    break  # (this part and the rest, cut smaller)
                rest = rest[len(part) :]
            else:
                return

    def refused(self) -> bool:
        """The part just sent was refused as too large: True if it is to be cut smaller and
        sent again (the budget was lowered), False if the refusal stands (raise it)."""
        self._again = self._halve is not None and self._halve()
        return self._again
