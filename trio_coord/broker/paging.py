"""Cut a listing into pages that fit a frame: how no answer's size is bound by the frame.

A listing (all topics, all groups, a group's committed offsets) grows with
what users create, and one answer holding it all would one day outgrow the
frame, failing that request for everyone, for good. :func:`page` takes the
items after a cursor, in order, while their encoded size stays within a
budget, and says where the next page starts; the client asks again until
there is no next page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import msgspec

__all__ = ["page"]

T = TypeVar("T")
K = TypeVar("K")

_encode = msgspec.msgpack.Encoder().encode


def page(items: Iterable[T], key: Callable[[T], K], budget: int) -> tuple[list[T], K | None]:
    """The leading items whose encodings fit in ``budget`` bytes, and the next cursor.

    ``items`` are in cursor order; ``key`` gives an item's cursor. At least
    one item is returned (a page must make progress); the cursor is None
    when every item fit.
    """
    out: list[T] = []
    used = 0
    for item in items:
        size = len(_encode(item)) + 1
        if out and used + size > budget:
            return out, key(out[-1])
        out.append(item)
        used += size
    return out, None
