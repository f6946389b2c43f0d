"""Cut a group's members into pages that fit a frame, cutting inside a member if need be.

A listing (all topics, all groups, a group's members or committed offsets)
grows with what users create, and one answer holding it all would one day
outgrow the frame, failing that request for everyone, for good. Most
listings are cut by :func:`~trio_coord.protocol.sizing.page`, shared with the
clients; :func:`page_members` does the same for a group's members, cutting
inside a member whose partitions alone outgrow a page, and says where the
next page starts; the client asks again until there is no next page.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from ..protocol.messages import MemberCursor, MemberDescription, TopicPartition
from ..protocol.sizing import encoded_size

__all__ = ["page_members"]

_ARRAY_HEADER = 5
"""The most bytes msgpack spends on an array's length (a page is one array)."""


def page_members(
    members: Iterable[MemberDescription], after: MemberCursor | None, budget: int
) -> tuple[list[MemberDescription], MemberCursor | None, int]:
    """The members after ``after`` that fit in ``budget`` bytes, the next cursor, bytes used.

    ``members`` are sorted by id, each one's partitions sorted. A member
    that does not fit whole in the room left is cut after its last
    partition that does, and the cursor points inside it; at least the
    member's description and one partition are returned, so every page
    makes progress (a member without partitions is never larger than a page:
    what it may bring is bounded at join).
    """
    out: list[MemberDescription] = []
    used = _ARRAY_HEADER
    for member in members:
        partitions = member.partitions
        if after is not None:
            if member.member_id < after.member_id:
                continue
            if member.member_id == after.member_id:
                if after.partition is None:
                    continue
                cut = after.partition
                partitions = [tp for tp in partitions if tp > cut]
                member = msgspec.structs.replace(member, owned=[], owned_more=0)  # (page 1 had it)
        whole = _with(member, partitions)
        size = encoded_size(whole)
        if used + size <= budget:
            out.append(whole)
            used += size
            continue
        bare = encoded_size(_with(member, [])) + _ARRAY_HEADER
        taken = _fitting(partitions, budget - used - bare, at_least_one=not out)
        if not taken and out:  # not even one of its partitions: the page ends before it
            return out, MemberCursor(out[-1].member_id), used
        out.append(_with(member, partitions[:taken]))
        used += bare + sum(encoded_size(tp) for tp in partitions[:taken])
        last = None if taken == len(partitions) else partitions[taken - 1]
        return out, MemberCursor(member.member_id, last), used
    return out, None, used


def _with(member: MemberDescription, partitions: list[TopicPartition]) -> MemberDescription:
    return msgspec.structs.replace(member, partitions=partitions)


def _fitting(partitions: Sequence[TopicPartition], room: int, *, at_least_one: bool) -> int:
    """How many leading ``partitions`` fit in ``room`` bytes."""
    used = 0
    for count, tp in enumerate(partitions):
        used += encoded_size(tp)
        if used > room:
            return max(count, 1 if at_least_one else 0)
    return len(partitions)
