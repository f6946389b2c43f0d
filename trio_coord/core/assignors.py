"""Partition assignors: pure functions from a group's subscriptions to an assignment.

An assignor sees the members (each with the topics it subscribes to and the
partitions it owned in the previous generation) and the partition count of
every topic, and returns which partitions each member owns. Every built-in
assignor is deterministic (the same input gives the same output, whatever the
order of the input's dicts and sets), complete and exclusive (every partition
of a topic that some member subscribes to goes to exactly one subscriber). The
group's coordinator picks the first assignor in the members' common
preference list that it has registered, or that a member can compute
itself (:func:`choose_assignor`); a broker's registry is :data:`ASSIGNORS`
plus any assignors of its own (:func:`make_registry`). An assignor only the
members have runs on the group's leader, which gets the same
:class:`GroupSpec` (with each member's opaque ``user_data``) over the wire;
:func:`validate_assignment` checks what a plugged-in assignor returns,
wherever it ran.

``range`` (per topic, consecutive blocks, as Kafka's RangeAssignor): with
topic ``t`` of 5 partitions and members ``a``, ``b``: ``a`` gets t-0, t-1,
t-2 and ``b`` gets t-3, t-4. With racks (below) each member first takes, up
to that same count, the lowest-numbered partitions of its own rack, and the
partitions left fill the members in order. ``roundrobin`` (all partitions of all topics,
dealt one at a time to the next member that subscribes): with topics ``t``
(3 partitions) and ``u`` (2) and members ``a``, ``b``: ``a`` gets t-0, t-2,
u-1 and ``b`` gets t-1, u-0. Neither looks at what members owned.

``sticky`` and ``uniform`` are balanced first, then sticky. *Balanced*: no
member could take a partition of a topic it subscribes to from a member that
has at least two more partitions than it (with identical subscriptions: the
members' counts differ by at most one). *Sticky*: a member's ``owned``
partitions count if it still subscribes to the topic and the partition
exists; a partition claimed by several members counts for the first of them
in member-id order. With identical subscriptions the result keeps the largest
number of owned (member, partition) pairs of any balanced assignment: when a
member joins a balanced group only the partitions it gets move, taken from
the members with the most; when one leaves only its partitions move. With
mixed subscriptions it is sticky locally: no partition can go back to a member
that owned it, alone or in exchange for one of the new holder's that member
holds, without unbalancing the assignment. An assignment fed back as
``owned`` comes back unchanged.

``uniform`` (meant as the server-side default for cooperative groups)
promises all of that and in addition evens out each topic over its
subscribers as far as balance and stickiness allow: no hand-over of one
partition and no exchange of two between two members lowers the sum over
members and topics of (partitions of that topic the member holds) ** 2 while
keeping the assignment balanced and at least as many owned partitions in
place. So with identical subscriptions and nothing owned, every topic's
partitions differ by at most one between members; per-topic balance yields
to overall balance and to stickiness.

*Racks* (Kafka's KIP-881): when some member has a rack (:attr:`MemberSpec.rack`)
and some partition has one (:attr:`GroupSpec.racks`, the rack of the broker
holding it), ``range``, ``sticky`` and ``uniform`` prefer giving a member
partitions of its own rack, never at the price of balance: each member gets
exactly as many partitions of each topic as without racks. ``sticky`` and
``uniform`` exchange two partitions of one topic between two members while
that gives more partitions to a member of their rack, moving only partitions
that are not kept in place (on the mixed path, only partitions nobody owned),
so balance, per-topic counts and the owned partitions kept are as without
racks. Without racks every assignor gives exactly what it gave before racks.
``roundrobin`` ignores racks.
docs/assignment.md explains the choices, with worked examples.

An assignment of a large group builds tens of thousands of containers, all
alive until it returns: CPython's cyclic collector, triggered every 700 of
them, walks them again and again for nothing (at 10,000 members x 100,000
partitions it doubled the time). A coordinator runs assignors
:func:`collector_paused`.
"""

from __future__ import annotations

import gc
import re
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from ..protocol.messages import TopicPartition
from ._sticky import balanced_assignment
from .assignment import Assignment, Assignor, GroupSpec, MemberSpec, topic_partitions

__all__ = [
    "ASSIGNORS",
    "BUILTIN_ASSIGNORS",
    "KAFKA_ASSIGNOR_PREFIX",
    "Assignment",
    "Assignor",
    "GroupSpec",
    "MemberSpec",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "UniformAssignor",
    "choose_assignor",
    "collector_paused",
    "make_registry",
    "validate_assignment",
]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with CPython's cyclic garbage collector off (as it was, after).

    For a bounded computation that allocates much and frees nothing until
    it ends, such as an assignment: no collection could find garbage in it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _empty(spec: GroupSpec) -> Assignment:
    return {member_id: [] for member_id in sorted(spec.members)}


class RangeAssignor:
    """Per topic, split the partitions into consecutive ranges, larger ranges first."""

    name = "range"

    def assign(self, spec: GroupSpec) -> Assignment:
        """See the module docstring."""
        result = _empty(spec)
        aware = spec.rack_aware()
        for topic in spec.topics():
            members = spec.subscribers(topic)
            count = spec.partitions[topic]
            quota, extra = divmod(count, len(members))
            sizes = [quota + (1 if index < extra else 0) for index in range(len(members))]
            if aware and any(spec.racks.get(topic, ())):
                for member_id, share in zip(
                    members, _racked_ranges(spec, topic, members, sizes), strict=True
                ):
                    result[member_id].extend(topic_partitions(topic, share))
                continue
            start = 0
            for member_id, size in zip(members, sizes, strict=True):
                result[member_id].extend(topic_partitions(topic, range(start, start + size)))
                start += size
        return result


def _racked_ranges(
    spec: GroupSpec, topic: str, members: list[str], sizes: list[int]
) -> list[list[int]]:
    """``range`` with racks (as Kafka's KIP-881): each member, in order, first takes the
    lowest-numbered partitions of its own rack, up to its size; then the partitions
    left are dealt in order to the members in order, each up to its size. The sizes
    are those without racks, so the balance is the same."""
    by_rack: dict[str, list[int]] = {}
    for p in range(spec.partitions[topic] - 1, -1, -1):  # (descending: pop() is the lowest)
        rack = spec.rack_of(topic, p)
        if rack:
            by_rack.setdefault(rack, []).append(p)
    shares: list[list[int]] = [[] for _ in members]
    taken: set[int] = set()
    for share, member_id, size in zip(shares, members, sizes, strict=True):
        rack = spec.members[member_id].rack
        pool = by_rack.get(rack) if rack else None
        while pool and len(share) < size:
            share.append(pool.pop())
            taken.add(share[-1])
    left = (p for p in range(spec.partitions[topic]) if p not in taken)
    for share, size in zip(shares, sizes, strict=True):
        while len(share) < size:
            share.append(next(left))
        share.sort()
    return shares


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


class StickyAssignor:
    """Balanced first, then keep as many owned partitions as possible (module docstring)."""

    name = "sticky"

    def assign(self, spec: GroupSpec) -> Assignment:
        """See the module docstring and docs/assignment.md."""
        return balanced_assignment(spec, spread=False)


class UniformAssignor:
    """``sticky``, and each topic spread over its subscribers as evenly as that allows."""

    name = "uniform"

    def assign(self, spec: GroupSpec) -> Assignment:
        """See the module docstring and docs/assignment.md."""
        return balanced_assignment(spec, spread=True)


BUILTIN_ASSIGNORS: tuple[Assignor, ...] = (
    RangeAssignor(),
    RoundRobinAssignor(),
    StickyAssignor(),
    UniformAssignor(),
)
"""The assignors that ship with trio_coord."""

ASSIGNORS: dict[str, Assignor] = {a.name: a for a in BUILTIN_ASSIGNORS}
"""The assignors every broker has, by name."""

_NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")


def make_registry(
    extra: Iterable[Assignor] = (), *, replace_builtins: bool = False
) -> dict[str, Assignor]:
    """The built-in assignors plus ``extra``, by name: what a broker is given to choose from.

    Raises ValueError if an extra assignor has no ``assign`` method, if its
    name is not a string of 1 to 255 letters, digits, ``.``, ``_`` or ``-``
    (names travel in JoinGroup), if two extra assignors share a name, or if
    one takes a built-in's name and ``replace_builtins`` is false. The
    result is a new dict; :data:`ASSIGNORS` is left alone.
    """
    registry: dict[str, Assignor] = dict(ASSIGNORS)
    seen: set[str] = set()
    for assignor in extra:
        name = getattr(assignor, "name", None)
        if not isinstance(name, str):
            raise ValueError(f"assignor {assignor!r} has no name (a str attribute 'name')")
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"assignor name {name!r} is not 1 to 255 letters, digits, '.', '_' or '-'"
            )
        if not callable(getattr(assignor, "assign", None)):
            raise ValueError(f"assignor {name!r} has no assign(spec) method")
        if name in seen:
            raise ValueError(f"two assignors are named {name!r}")
        if name in ASSIGNORS and not replace_builtins:
            raise ValueError(
                f"assignor name {name!r} is a built-in assignor's; pick another name, "
                f"or pass replace_builtins=True to replace the built-in"
            )
        seen.add(name)
        registry[name] = assignor
    return registry


def _listing(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"


KAFKA_ASSIGNOR_PREFIX = "kafka:"
"""The prefix of the assignor names the Kafka front end gives its members' protocols:
computed by the group's Kafka leader only, never by a broker-side assignor of that name."""


def validate_assignment(
    spec: GroupSpec, assignment: Mapping[str, Iterable[TopicPartition]], *, complete: bool = True
) -> None:
    """Raise ValueError, saying what is wrong, unless ``assignment`` is valid for ``spec``.

    Valid: every key is a member of ``spec``; every value holds only
    TopicPartitions that exist (``0 <= partition < spec.partitions[topic]``)
    of topics that member subscribes to; no partition is given twice (to two
    members, or twice to one); every partition of every topic some member
    subscribes to is given (unless ``complete`` is False: a Kafka client's
    cooperative assignor leaves what it revokes unassigned for one round).
    A member missing from ``assignment`` owns
    nothing. Balance is not checked: that is each assignor's own promise.
    """
    if not isinstance(assignment, Mapping):
        raise ValueError(f"invalid assignment: {type(assignment).__name__}, not a mapping")
    if complete and _plainly_valid(spec, assignment):
        return
    problems: list[str] = []
    unknown = sorted(repr(m) for m in assignment if m not in spec.members)
    if unknown:
        problems.append(f"unknown member(s) {_listing(unknown)}")
    seen: Counter[TopicPartition] = Counter()
    bad: list[str] = []
    for member_id in sorted(m for m in assignment if m in spec.members):
        topics = spec.members[member_id].topics
        given = assignment[member_id]
        if isinstance(given, str | bytes) or not isinstance(given, Iterable):
            bad.append(f"{member_id!r} got {given!r}, not a list of TopicPartitions")
            continue
        for tp in given:
            if not (
                isinstance(tp, TopicPartition)
                and isinstance(tp.topic, str)
                and isinstance(tp.partition, int)
            ):
                bad.append(f"{member_id!r} got {tp!r}, not a TopicPartition")
                continue
            count = spec.partitions.get(tp.topic, 0)
            if not 0 <= tp.partition < count:
                bad.append(f"{member_id!r} got {tp}: no such partition ({tp.topic!r} has {count})")
            elif tp.topic not in topics:
                bad.append(f"{member_id!r} got {tp} but does not subscribe to {tp.topic!r}")
            seen[tp] += 1
    problems.extend(bad[:5])
    if len(bad) > 5:
        problems.append(f"{len(bad) - 5} more such partition(s)")
    twice = sorted(tp for tp, n in seen.items() if n > 1)
    if twice:
        problems.append(f"assigned more than once: {_listing([str(tp) for tp in twice])}")
    missing = (
        []
        if not complete
        else [
            TopicPartition(topic, p)
            for topic in spec.topics()
            for p in range(spec.partitions[topic])
            if TopicPartition(topic, p) not in seen
        ]
    )
    if missing:
        problems.append(f"assigned to no member: {_listing([str(tp) for tp in missing])}")
    if problems:
        raise ValueError("invalid assignment: " + "; ".join(problems))


def _plainly_valid(spec: GroupSpec, assignment: Mapping[str, object]) -> bool:
    """True if ``assignment`` is certainly a valid, complete assignment for ``spec``.

    The fast check of :func:`validate_assignment` (a coordinator checks every
    assignment it gets, 100,000 partitions in a large group): lists of exact
    ``TopicPartition`` with ``str`` topics and ``int`` partitions, each
    counted in its topic's row; valid when every row is all ones. Anything
    it does not expect (another type, a partition out of range or of a
    topic the member does not subscribe to, given twice or never) makes it
    answer False, and the detailed check then says what is wrong. Never True when that check
    would find a problem.
    """
    members = spec.members
    rows = {topic: [0] * spec.partitions[topic] for topic in spec.topics()}
    views: dict[frozenset[str], dict[str, list[int]]] = {}  # by subscription: its rows
    for member_id, given in assignment.items():
        member = members.get(member_id)
        if member is None or given.__class__ is not list:
            return False
        topics = frozenset(member.topics)
        view = views.get(topics)
        if view is None:
            view = views[topics] = {t: row for t, row in rows.items() if t in topics}
        for tp in given:
            if tp.__class__ is not TopicPartition:
                return False
            topic, p = tp
            if topic.__class__ is not str:  # (an unhashable one would raise TypeError here)
                return False
            row = view.get(topic)
            if row is None or p.__class__ is not int or not 0 <= p < len(row):
                return False
            row[p] += 1
    return all(row.count(1) == len(row) for row in rows.values())


def choose_assignor(preferences: Iterable[Sequence[str]], available: Collection[str]) -> str | None:
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
