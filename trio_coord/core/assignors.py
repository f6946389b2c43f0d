"""Partition assignors: pure functions from a group's subscriptions to an assignment.

An assignor sees the members (each with the topics it subscribes to) and the
partition count of every subscribed topic, and returns which partitions each
member owns. It is deterministic (the same input gives the same output,
whatever the order of the input's dicts) and complete (every partition of a
topic that some member subscribes to goes to exactly one subscriber). The
group's coordinator picks the first assignor in the members' common
preference list that it has registered (:func:`choose_assignor`).

``range`` (per topic, consecutive blocks, as Kafka's RangeAssignor): with
topic ``t`` of 5 partitions and members ``a``, ``b``: ``a`` gets t-0, t-1,
t-2 and ``b`` gets t-3, t-4. ``roundrobin`` (all partitions of all topics,
dealt one at a time to the next member that subscribes): with topics ``t``
(3 partitions) and ``u`` (2) and members ``a``, ``b``: ``a`` gets t-0, t-2,
u-1 and ``b`` gets t-1, u-0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..protocol.messages import TopicPartition

__all__ = [
    "ASSIGNORS",
    "Assignment",
    "Assignor",
    "GroupSpec",
    "MemberSpec",
    "RangeAssignor",
    "RoundRobinAssignor",
    "choose_assignor",
]

Assignment = dict[str, list[TopicPartition]]
"""member id → the partitions it owns, sorted."""


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """What an assignor knows of one member."""

    member_id: str
    topics: frozenset[str]
    owned: frozenset[TopicPartition] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """The input of an assignor: members and the partition count of each topic."""

    members: Mapping[str, MemberSpec]
    partitions: Mapping[str, int]

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
    """A named, pure assignment strategy."""

    name: str

    def assign(self, spec: GroupSpec) -> Assignment:
        """Return every member's partitions (every member appears, maybe with none)."""
        ...


def _empty(spec: GroupSpec) -> Assignment:
    return {member_id: [] for member_id in sorted(spec.members)}


class RangeAssignor:
    """Per topic, split the partitions into consecutive ranges, larger ranges first."""

    name = "range"

    def assign(self, spec: GroupSpec) -> Assignment:
        """See the module docstring."""
        result = _empty(spec)
        for topic in spec.topics():
            members = spec.subscribers(topic)
            count = spec.partitions[topic]
            quota, extra = divmod(count, len(members))
            start = 0
            for index, member_id in enumerate(members):
                size = quota + (1 if index < extra else 0)
                result[member_id].extend(
                    TopicPartition(topic, p) for p in range(start, start + size)
                )
                start += size
        return result


class RoundRobinAssignor:
    """Deal all partitions, sorted by topic then number, to subscribers in turn."""

    name = "roundrobin"

    def assign(self, spec: GroupSpec) -> Assignment:
        """See the module docstring."""
        result = _empty(spec)
        members = sorted(spec.members)
        if not members:
            return result
        turn = 0
        for topic in spec.topics():
            for partition in range(spec.partitions[topic]):
                # The next member in circular order that subscribes to the topic.
                while topic not in spec.members[members[turn % len(members)]].topics:
                    turn += 1
                result[members[turn % len(members)]].append(TopicPartition(topic, partition))
                turn += 1
        return result


ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (RangeAssignor(), RoundRobinAssignor())}
"""The assignors every broker has, by name."""


def choose_assignor(
    preferences: Iterable[Sequence[str]], available: Mapping[str, Assignor]
) -> str | None:
    """Pick the assignor for a group from its members' preference lists.

    The result is the first name in the first member's list (members' lists
    given in a deterministic order) that every member lists and the broker
    has; None if there is no such name.
    """
    lists = [list(p) for p in preferences]
    if not lists:
        return None
    common = set(lists[0]).intersection(*lists[1:])
    for name in lists[0]:
        if name in common and name in available:
            return name
    return None
