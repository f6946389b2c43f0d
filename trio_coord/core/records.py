"""Records: everything the coordinator persists, and their encoding.

A handler in the core never writes state it must keep; it returns records.
The broker makes them durable in the metadata store and then applies them
with the same ``replay`` that loading runs after a restart or a failover
(:meth:`trio_coord.core.group.Group.replay` for a group's records), so the
state after a restart is, by construction, the state before it. Records are
msgspec Structs tagged by a short name and encoded as msgpack; like wire
messages, their fields are only ever appended, with defaults.
"""

from __future__ import annotations

import hashlib
import uuid

import msgspec

from ..protocol.messages import TopicPartition

__all__ = [
    "CHUNK_BYTES",
    "GroupHead",
    "GroupRecord",
    "GroupTombstone",
    "MemberRecord",
    "OffsetRecord",
    "OffsetTombstone",
    "Record",
    "TopicRecord",
    "TopicTombstone",
    "decode_record",
    "decode_stored",
    "encode_record",
    "join_record",
    "split_record",
    "supersedes",
    "topic_id_of",
]


class _Rec(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Base of every record (untracked by the garbage collector: records hold no cycles)."""


class TopicRecord(_Rec, tag="topic"):
    """A topic exists with ``partitions`` partitions.

    ``leaders`` names, per partition, the broker of a cluster that holds it
    (empty on a single broker, which holds them all).
    """

    name: str
    partitions: int
    leaders: list[int] = []
    topic_id: str = ""
    """The topic's id (a random UUID, 32 hex digits) given when it was created, so that a
    topic deleted and created again under its name has a new one (Kafka's topic ids).
    ``""`` in records written before topic ids existed: :func:`topic_id_of` derives one
    from the name, which the topic keeps (the next record of it persists it)."""


_LEGACY_TOPIC_IDS = uuid.UUID("6b0cb7e4-6a5e-4c43-9c55-3a1f1b1f0c11")


def topic_id_of(record: TopicRecord) -> str:
    """The id of the topic ``record`` describes: its own, or for a record from before topic
    ids, the one derived from its name (what Kafka clients were told before, too)."""
    return record.topic_id or uuid.uuid5(_LEGACY_TOPIC_IDS, record.name).hex


class TopicTombstone(_Rec, tag="topic-deleted"):
    """The topic is deleted: its partitions' logs go, and groups forget its offsets.

    A topic created again under the same name is a new topic: its
    partitions start empty, at offset 0.
    """

    name: str


class MemberRecord(_Rec):
    """A member of a group's generation, as persisted with the generation."""

    member_id: str
    client_id: str
    host: str
    topics: list[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    partitions: list[TopicPartition]


class GroupRecord(_Rec, tag="group"):
    """A group's generation: its number, assignor and members with their partitions.

    ``departed`` lists the members gone without acknowledging a stop whose
    partitions were still fenced when the generation was planned, so that a
    coordinator loading it after a restart fences them too. ``topics`` maps
    every topic the group has subscribed to (in this generation or before)
    to the partitions it had when the group first subscribed to it (0 if it
    did not exist then): a partition numbered at or above that, with no
    committed offset, was created after the group subscribed, and starts at
    its log start whatever the reset policy. The group's ``re:`` entries are
    listed too, with 0, to tell the topics they match only later.
    """

    group_id: str
    generation: int
    assignor: str
    members: list[MemberRecord]
    departed: list[MemberRecord] = []
    topics: dict[str, int] = {}


class OffsetRecord(_Rec, tag="offset"):
    """A committed offset. ``reset`` marks an explicit rewind, the only kind that may go back."""

    group_id: str
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    commit_time_ms: int = 0
    reset: bool = False

    @property
    def tp(self) -> TopicPartition:
        """The partition this offset is for."""
        return TopicPartition(self.topic, self.partition)


class OffsetTombstone(_Rec, tag="offset-deleted"):
    """A group's committed offset for one partition is deleted."""

    group_id: str
    topic: str
    partition: int

    @property
    def tp(self) -> TopicPartition:
        """The partition whose offset is deleted."""
        return TopicPartition(self.topic, self.partition)


class GroupTombstone(_Rec, tag="group-deleted"):
    """The group and all its offsets are deleted."""

    group_id: str


Record = (
    TopicRecord | TopicTombstone | GroupRecord | OffsetRecord | OffsetTombstone | GroupTombstone
)


def supersedes(new: Record, old: Record | None) -> bool:
    """Whether replaying ``new`` over ``old`` (the record in the same place) replaces it.

    Offsets, generations and partition counts only move forward: an offset
    below the current one is ignored unless it is an explicit reset, and so
    are an older generation and a smaller partition count. Replay and the
    record writer both follow this rule, which keeps the store and memory
    equal.
    """
    if old is None:
        return True
    if isinstance(new, OffsetRecord) and isinstance(old, OffsetRecord):
        return new.reset or new.offset >= old.offset
    if isinstance(new, GroupRecord) and isinstance(old, GroupRecord):
        return new.generation >= old.generation
    if isinstance(new, TopicRecord) and isinstance(old, TopicRecord):
        return new.partitions >= old.partitions
    return True


class GroupHead(_Rec, tag="group-head"):
    """The stored head of a generation record too large for one store node.

    The record's encoding is cut into ``chunks`` pieces, stored beside the
    head (see ``broker.persistence``) and written *before* it, so that the
    head, written last and atomically, is what makes the generation current.
    ``digest`` (SHA-256 of the whole encoding, hex) names the chunks and lets a
    reader tell that it joined the pieces the head wrote. It is never
    replayed: loading turns it back into its :class:`GroupRecord`.
    """

    group_id: str
    generation: int
    chunks: int
    size: int
    digest: str


CHUNK_BYTES = 256 * 1024
"""The largest piece of a generation record one store node holds. A record whose
encoding is longer is split (ZooKeeper refuses nodes, and whole transactions, beyond
``jute.maxbuffer``, 1 MiB by default; #14 bounds every node at 512 KB)."""


def split_record(
    record: GroupRecord, chunk_bytes: int = CHUNK_BYTES, *, encoded: bytes | None = None
) -> tuple[GroupHead, list[bytes]]:
    """The head and the pieces of ``record``'s encoding, each at most ``chunk_bytes`` long.

    A record that fits in one piece has one chunk; callers store such a
    record whole instead (see :func:`encode_record`). ``encoded``, if given,
    is ``encode_record(record)`` already made (3 MB at 20,000 members).
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
    data = encode_record(record) if encoded is None else encoded
    chunks = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]
    head = GroupHead(
        record.group_id,
        record.generation,
        len(chunks),
        len(data),
        hashlib.sha256(data).hexdigest(),
    )
    return head, chunks


def join_record(head: GroupHead, chunks: list[bytes]) -> GroupRecord:
    """The generation record ``head`` names, from its ``chunks`` in order.

    Raises ValueError if the pieces are not the ones the head was written
    with (missing, extra, or other bytes): the store was changed behind the
    coordinator's back, and loading such a group must not guess.
    """
    data = b"".join(chunks)
    if len(chunks) != head.chunks or len(data) != head.size:
        raise ValueError(
            f"group {head.group_id!r} generation {head.generation}: {len(chunks)} chunk(s) of "
            f"{len(data)} bytes found, but its head names {head.chunks} of {head.size} bytes"
        )
    if hashlib.sha256(data).hexdigest() != head.digest:
        raise ValueError(
            f"group {head.group_id!r} generation {head.generation}: its chunks do not match "
            "the digest in its head (the store was altered)"
        )
    record = decode_record(data)
    if not isinstance(record, GroupRecord) or record.group_id != head.group_id:
        raise ValueError(f"group {head.group_id!r}: its chunks hold another record")
    return record


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)
_stored_decoder = msgspec.msgpack.Decoder(Record | GroupHead)


def encode_record(record: Record) -> bytes:
    """Encode a record for the metadata store."""
    return _encoder.encode(record)


def decode_record(data: bytes) -> Record:
    """Decode a record written by :func:`encode_record` (raises msgspec.DecodeError)."""
    return _decoder.decode(data)


def decode_stored(data: bytes) -> Record | GroupHead:
    """Decode a store node's data: a record, or the head of a split generation record."""
    return _stored_decoder.decode(data)
