"""What an assignor takes and gives: the shared types of the assignors.

Its one job is the assignment's vocabulary: :class:`GroupSpec` (the members,
what each subscribes to and owns, each topic's partition count and, where
known, the racks of members and partitions), :data:`Assignment` (member id ->
its partitions, made in bulk by :func:`topic_partitions`) and the
:class:`Assignor` protocol a custom assignor implements. The built-in
assignors (``core.assignors``) and the balancing algorithm (``core._sticky``)
both import it, and it imports neither, so there is no import circle. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from typing import Protocol

from ..protocol.messages import TopicPartition

__all__ = ["Assignment", "Assignor", "GroupSpec", "MemberSpec", "topic_partitions"]

Assignment = dict[str, list[TopicPartition]]
"""member id → the partitions it owns, sorted."""

_new_topic_partition: Callable[[tuple[str, int]], TopicPartition] = partial(
    tuple.__new__, TopicPartition
)


def topic_partitions(topic: str, numbers: Iterable[int]) -> list[TopicPartition]:
    """``[TopicPartition(topic, p) for p in numbers]``, made in C.

    The named tuple's own ``__new__`` is Python, a third of the time of making
    an assignment's answer: a large group's holds one per partition (100,000).
    """
    return list(map(_new_topic_partition, zip(repeat(topic), numbers)))


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """What an assignor knows of one member."""

    member_id: str
    topics: frozenset[str]
    owned: frozenset[TopicPartition] = field(default_factory=frozenset)
    user_data: bytes = b""
    """Opaque bytes the member gave in JoinGroup (for assignors of the application's own)."""
    rack: str = ""
    """The rack (availability zone) the member runs in; empty: unknown."""


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """The input of an assignor: members and the partition count of each topic.

    ``racks`` maps a topic to the rack of each of its partitions (that of the
    broker holding it; ``""``: unknown). A topic missing from it, or a
    partition beyond its list, has no known rack. Rack-aware assignors use it
    with :attr:`MemberSpec.rack` (:meth:`rack_of`); without racks they ignore it.
    """

    members: Mapping[str, MemberSpec]
    partitions: Mapping[str, int]
    racks: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def rack_of(self, topic: str, partition: int) -> str:
        """The rack of a partition (``""``: unknown)."""
        racks = self.racks.get(topic)
        return racks[partition] if racks is not None and 0 <= partition < len(racks) else ""

    def rack_aware(self) -> bool:
        """Whether some member and some partition have a rack (else racks change nothing)."""
        return any(m.rack for m in self.members.values()) and any(
            any(r) for r in self.racks.values()
        )

    def subscribers(self, topic: str) -> list[str]:
        """The sorted ids of the members subscribed to ``topic``."""
        return sorted(m.member_id for m in self.members.values() if topic in m.topics)

    def topics(self) -> list[str]:
        """Every topic some member subscribes to and that exists, sorted."""
        wanted: set[str] = set()
        for member in self.members.values():
            wanted |= member.topics
        return sorted(t for t in wanted if t in self.partitions)


class Assignor(Protocol):
    """A named, pure assignment strategy: what a custom assignor implements.

    ``name`` is what members list in their preferences (letters, digits,
    ``.``, ``_`` and ``-``; see :func:`make_registry`). ``assign`` must be a
    pure function of ``spec``: no I/O, no clock, no randomness, no ``hash()``
    of strings, and the same result whatever the order of ``spec``'s dicts
    and sets (sort what you iterate). Every coordinator that computes the
    group's assignment must get the same answer.
    """

    name: str

    def assign(self, spec: GroupSpec) -> Assignment:
        """Return every member's partitions (every member appears, maybe with none).

        Every partition of a topic that some member subscribes to and that
        exists (``range(spec.partitions[topic])``) goes to exactly one member
        that subscribes to its topic; :func:`validate_assignment` checks it.
        """
        ...
