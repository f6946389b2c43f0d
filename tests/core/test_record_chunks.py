"""A generation record too large for one store node is cut into chunks and joined back equal."""

from __future__ import annotations

import pytest

from trio_coord.core.records import (
    GroupHead,
    GroupRecord,
    MemberRecord,
    decode_stored,
    encode_record,
    join_record,
    split_record,
)
from trio_coord.protocol.messages import TopicPartition


def _record(members: int, partitions_each: int) -> GroupRecord:
    return GroupRecord(
        "g",
        7,
        "range",
        [
            MemberRecord(
                f"client-{m}-0f0e0d0c-0b0a-0908-0706-050403020100",
                f"client-{m}",
                "/10.0.0.1",
                ["events"],
                30000,
                60000,
                [TopicPartition("events", m * partitions_each + p) for p in range(partitions_each)],
            )
            for m in range(members)
        ],
        topics={"events": members * partitions_each},
    )


def test_a_record_splits_into_bounded_chunks_and_joins_back_equal():
    record = _record(300, 20)
    head, chunks = split_record(record, chunk_bytes=4096)
    assert len(encode_record(record)) > 10 * 4096
    assert head.chunks == len(chunks) > 10
    assert all(len(chunk) <= 4096 for chunk in chunks)
    assert (head.group_id, head.generation, head.size) == ("g", 7, sum(map(len, chunks)))
    assert join_record(head, chunks) == record
    # The head is a small stored record of its own, told apart from a whole record.
    assert decode_stored(encode_record(head)) == head  # type: ignore[arg-type]
    assert decode_stored(encode_record(record)) == record


def test_a_small_record_is_one_chunk():
    record = _record(2, 3)
    head, chunks = split_record(record)
    assert head.chunks == 1 and chunks == [encode_record(record)]


def test_chunks_not_the_ones_the_head_names_are_refused():
    head, chunks = split_record(_record(100, 10), chunk_bytes=1000)
    with pytest.raises(ValueError, match="names"):
        join_record(head, chunks[:-1])  # one missing
    with pytest.raises(ValueError, match="digest"):
        join_record(head, [chunks[1], chunks[0], *chunks[2:]])  # out of order
    other, other_chunks = split_record(_record(100, 11), chunk_bytes=1000)
    with pytest.raises(ValueError):
        join_record(head, other_chunks)
    with pytest.raises(ValueError, match="positive"):
        split_record(_record(1, 1), chunk_bytes=0)
    assert isinstance(other, GroupHead)
