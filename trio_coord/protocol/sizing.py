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
given frames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import msgspec

__all__ = ["encoded_size", "in_parts", "list_budget", "page"]

T = TypeVar("T")
K = TypeVar("K")

_encode = msgspec.msgpack.Encoder().encode


def encoded_size(item: object) -> int:
    """Bytes ``item`` takes as one element of an encoded list (its header included)."""
    return len(_encode(item)) + 1


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
