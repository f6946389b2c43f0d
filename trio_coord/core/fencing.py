"""Fencing: which heartbeats and offset commits a group accepts.

A request from a member the coordinator does not know (never joined, expelled,
timed out, or known only to a coordinator that has since restarted), or from
a generation the group has left behind, is refused with a code that tells the
client what to do: UNKNOWN_MEMBER_ID (rejoin with no member id),
ILLEGAL_GENERATION (rejoin), REBALANCE_IN_PROGRESS (retry once stable),
PARTITION_NOT_OWNED (the partition moved), OFFSET_REGRESSION (pass
``allow_regression`` to rewind on purpose). These are pure checks: they raise
or return, and change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..protocol.errors import (
    IllegalGenerationError,
    InvalidPartitionsError,
    InvalidRequestError,
    OffsetMetadataTooLargeError,
    OffsetRegressionError,
    PartitionNotOwnedError,
    RebalanceInProgressError,
    UnknownMemberError,
    UnknownTopicError,
)
from ..protocol.messages import PartitionOffset
from .group import Group, GroupState, Member

__all__ = [
    "MAX_OFFSET",
    "STANDALONE_GENERATION",
    "check_commit",
    "check_heartbeat",
    "check_member",
    "check_offset_metadata",
    "check_offsets",
]

MAX_OFFSET = 2**63 - 1
"""The largest offset (Kafka's: a signed 64-bit integer)."""

STANDALONE_GENERATION = -1
"""The generation a standalone committer (not a group member) sends, with member id ""."""


def check_member(group: Group, member_id: str) -> Member:
    """Return the live member ``member_id`` or raise UNKNOWN_MEMBER_ID."""
    member = group.members.get(member_id)
    if member is None:
        raise UnknownMemberError(
            f"member {member_id!r} is not in group {group.group_id} (it left, timed out, was "
            "expelled, or the coordinator restarted); rejoin the group"
        )
    return member


def check_heartbeat(group: Group, member_id: str, generation: int) -> Member:
    """Return the member if a heartbeat from it in ``generation`` is current, else raise.

    A heartbeat may carry any generation from the one the member last
    acknowledged to the group's current one: a StartFetchers and a heartbeat
    may cross on the wire, and a member may have started a generation whose
    acknowledgement a restarted rebalance never collected. A heartbeat only
    proves liveness; commits are fenced strictly (:func:`check_commit`).
    """
    member = check_member(group, member_id)
    if not member.generation <= generation <= group.generation:
        raise IllegalGenerationError(
            f"generation {generation} is stale: group {group.group_id} is at generation "
            f"{group.generation}; rejoin the group"
        )
    return member


def check_commit(
    group: Group,
    member_id: str,
    generation: int,
    offsets: Sequence[PartitionOffset],
    *,
    allow_regression: bool,
    partitions: Mapping[str, int],
) -> None:
    """Raise unless this commit may be made durable as it is.

    The rules, in the order they are checked:

    * A standalone committer (member id ``""``, generation
      :data:`STANDALONE_GENERATION`) may commit only to a group without
      members (UNKNOWN_MEMBER_ID otherwise).
    * Any other committer must be a live member (UNKNOWN_MEMBER_ID).
    * In a cooperative group, a member that commits only partitions it may
      still be fetching (``member.may_own``: a partition that moves is taken
      out of it by the stop acknowledgement, before anyone else starts it)
      is accepted with the generation it last acknowledged or the current
      one, in any state: it keeps fetching them through the rebalance.
      Otherwise the rules below apply.
    * The member must send the group's current generation (ILLEGAL_GENERATION).
    * While fetchers are being stopped or the assignment computed (STOPPING,
      ASSIGNING), a member may commit only partitions it may still be
      fetching (``member.may_own``): this is how it commits its progress in
      ``on_revoked``, before it acknowledges the stop. A partition it has
      already stopped gets REBALANCE_IN_PROGRESS (its position travelled with
      the stop acknowledgement); one it does not own at all gets
      PARTITION_NOT_OWNED.
    * Otherwise (STABLE, STARTING) the member must have acknowledged the
      current generation (``member.generation == generation ==
      group.generation``; REBALANCE_IN_PROGRESS until it has) and may commit
      only partitions of its assignment in it (PARTITION_NOT_OWNED).
    * Every offset must be for an existing partition (``partitions`` maps a
      topic to its count; UNKNOWN_TOPIC, INVALID_PARTITIONS), which also
      bounds a group's offsets by the topics that exist, must be
      non-negative (INVALID_REQUEST) and, unless ``allow_regression``, not
      behind the committed one (OFFSET_REGRESSION).
    """
    if member_id == "" and generation == STANDALONE_GENERATION:
        if group.members:
            raise UnknownMemberError(
                f"group {group.group_id} has {len(group.members)} active member(s); a "
                "standalone committer may only commit to a group without members"
            )
    else:
        member = check_member(group, member_id)
        if (
            group.cooperative
            and generation in (member.generation, group.generation)
            and all(offset.tp in member.may_own for offset in offsets)
        ):
            pass  # fetching these through a cooperative rebalance: see above
        elif generation != group.generation:
            raise IllegalGenerationError(
                f"commit for generation {generation} is stale: group {group.group_id} is at "
                f"generation {group.generation}; its partitions may have moved"
            )
        if group.state in (GroupState.STOPPING, GroupState.ASSIGNING):
            for offset in offsets:
                if offset.tp in member.may_own:
                    continue
                if offset.tp in member.assignment:
                    raise RebalanceInProgressError(
                        f"group {group.group_id} is rebalancing and member {member_id!r} has "
                        f"already stopped {offset.tp}; its position was collected with the "
                        "stop, commit again once the member has its new assignment"
                    )
                raise PartitionNotOwnedError(
                    f"member {member_id!r} does not own {offset.tp} in generation {generation}"
                )
        else:
            if member.generation != generation:
                raise RebalanceInProgressError(
                    f"group {group.group_id} is rebalancing; commit again once the member has "
                    "its new assignment (positions are collected by the rebalance itself)"
                )
            for offset in offsets:
                if offset.tp not in member.assignment:
                    raise PartitionNotOwnedError(
                        f"member {member_id!r} does not own {offset.tp} in generation {generation}"
                    )
    for offset in offsets:
        count = partitions.get(offset.topic)
        if count is None:
            raise UnknownTopicError(
                f"cannot commit to {offset.tp}: topic {offset.topic!r} does not exist"
            )
        if not 0 <= offset.partition < count:
            raise InvalidPartitionsError(
                f"cannot commit to {offset.tp}: topic {offset.topic!r} has partitions "
                f"0 to {count - 1}"
            )
        check_offsets([offset])
        current = group.offsets.get(offset.tp)
        if not allow_regression and current is not None and offset.offset < current.offset:
            raise OffsetRegressionError(
                f"committing {offset.offset} for {offset.tp} would move the group's offset "
                f"back from {current.offset}; pass allow_regression=True to rewind on purpose"
            )


def check_offsets(offsets: Sequence[PartitionOffset]) -> None:
    """Raise INVALID_REQUEST for an offset no log can have: negative, or past 2**63 - 1.

    Checked wherever offsets enter a group (commits, resets, and the
    positions heartbeats, leaves and stop acknowledgements carry). As in
    Kafka, an offset past the log end is accepted: a tool may restore
    offsets before the records arrive; a wrong one is undone by a reset.
    """
    for o in offsets:
        if o.offset < 0:
            raise InvalidRequestError(
                f"offset {o.offset} for {o.topic}-{o.partition} is negative; commit the offset "
                "of the next record to consume"
            )
        if o.offset > MAX_OFFSET:
            raise InvalidRequestError(
                f"offset {o.offset} for {o.topic}-{o.partition} is beyond the largest offset "
                f"({MAX_OFFSET}); commit the offset of the next record to consume"
            )


def check_offset_metadata(offsets: Sequence[PartitionOffset], limit: int) -> None:
    """Raise OFFSET_METADATA_TOO_LARGE if an offset carries more than ``limit`` bytes.

    Metadata is kept with the committed offset and returned in every
    OffsetFetch and DescribeGroup, so it is bounded like Kafka's
    ``offset.metadata.max.bytes``. Checked wherever offsets enter a group:
    commits, resets, and the positions heartbeats, leaves and stop
    acknowledgements carry. O(len(offsets)); nothing for an empty list.
    """
    for o in offsets:
        if len(o.metadata) * 4 > limit and len(o.metadata.encode()) > limit:
            raise OffsetMetadataTooLargeError(
                f"the metadata of the offset for {o.topic}-{o.partition} is "
                f"{len(o.metadata.encode())} bytes, more than this broker's limit of {limit} "
                "(--offset-metadata-max-bytes); keep offset metadata short"
            )
