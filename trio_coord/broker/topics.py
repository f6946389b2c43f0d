"""The topic manager: which topics exist and how many partitions each has.

It validates and persists CreateTopic, AddPartitions and DeleteTopic
(through the record writer, so a change is acknowledged only once durable),
answers what the coordinator needs to assign (partition counts), and tells
its listeners when a topic appears, grows or goes, so that the groups
subscribed to it rebalance, and the logs of a deleted topic are removed.

In a cluster every partition is placed on one live broker when it is
created (spread round the brokers from a point that depends on the topic's
name) and stays there: its records live on that broker's disk. Topics
created, grown or deleted by other brokers arrive through :meth:`replay` too
(the broker watches the store).

A subscription entry ``re:PATTERN`` is a regular expression over topic
names; :meth:`TopicManager.matching` says which existing topics a
subscription's patterns match. Patterns are RE2 expressions (Google's
engine, without backreferences or lookaround): matching takes time linear in
a name's length, so no client's pattern can stall the broker's event loop, as
a backtracking one (``(a+)*b``) does with Python's ``re``.
"""

from __future__ import annotations

import functools
import uuid
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import re2
import trio

from ..core.records import TopicRecord, TopicTombstone, supersedes, topic_id_of
from ..core.validation import PATTERN_PREFIX, validate_topic_name
from ..protocol.errors import (
    CoordinatorNotAvailableError,
    InvalidPartitionsError,
    InvalidRequestError,
    TopicAlreadyExistsError,
    UnknownTopicError,
)
from ..protocol.messages import TopicInfo
from ..store.base import NodeExistsError
from .persistence import RecordWriter

__all__ = ["PATTERN_PREFIX", "TopicManager", "subscription_patterns"]


MAX_PATTERN_LENGTH = 1000
"""The longest ``re:`` pattern a subscription may carry."""


def subscription_patterns(entries: Iterable[str]) -> list[Any]:
    """The compiled ``re:`` entries of a subscription; INVALID_REQUEST for a bad one."""
    patterns = []
    for entry in entries:
        if entry.startswith(PATTERN_PREFIX):
            pattern = entry[len(PATTERN_PREFIX) :]
            if len(pattern) > MAX_PATTERN_LENGTH:
                raise InvalidRequestError(
                    f"subscription pattern of {len(pattern)} characters is longer than "
                    f"{MAX_PATTERN_LENGTH}; subscribe with a shorter pattern"
                )
            try:
                patterns.append(_compile(pattern))
            except re2.error as exc:
                reason = (
                    exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
                )
                raise InvalidRequestError(
                    f"subscription {entry!r} is not a valid regular expression ({reason}); "
                    "write re:PATTERN with an RE2 regular expression (no backreferences or "
                    "lookaround) matching whole topic names"
                ) from None
    return patterns


def _reason(exc: Exception) -> str:
    """RE2's message (it comes as bytes)."""
    message = exc.args[0] if exc.args else exc
    return message.decode(errors="replace") if isinstance(message, bytes) else str(message)


_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a client's bad pattern is its error, answered, not logged


@functools.lru_cache(maxsize=1024)
def _compile(pattern: str) -> Any:
    return re2.compile(pattern, options=_OPTIONS)


class TopicManager:
    """Topics and their partition counts; see the module docstring."""

    def __init__(
        self,
        writer: RecordWriter,
        *,
        max_partitions: int = 10_000,
        placement: Callable[[], list[int]] | None = None,
        rack_of: Callable[[int | None], str] | None = None,
    ) -> None:
        self._writer = writer
        self._max_partitions = max_partitions
        self._placement = placement
        self._rack_of = rack_of
        self.partitions: dict[str, int] = {}
        """topic → partition count (the durable, replayed state)."""
        self.leaders: dict[str, list[int]] = {}
        """topic → the broker holding each partition (empty lists on a single broker)."""
        self.ids: dict[str, str] = {}
        """topic → its id (32 hex digits; see :class:`~trio_coord.core.records.TopicRecord`)."""
        self.version = 0
        """Counts replayed records: views built from the topics (the Kafka front end's id →
        name map) are stale only once it moved."""
        self._listeners: list[Callable[[str], None]] = []
        # Check-then-write must not interleave: two AddPartitions could shrink a topic.
        self._changing = trio.Lock()

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(topic)`` whenever a topic is created, grows or is deleted
        (then it is no longer in :attr:`partitions`)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener`` (a coordinator that gave up its slot)."""
        self._listeners.remove(listener)

    def matching(self, entries: Iterable[str]) -> set[str]:
        """The existing topics whose whole name a ``re:`` entry of ``entries`` matches."""
        patterns = subscription_patterns(entries)
        if not patterns:
            return set()
        return {t for t in self.partitions if any(p.fullmatch(t) for p in patterns)}

    def current(self, name: str) -> TopicRecord | None:
        """The durable record of topic ``name`` (None if there is no such topic)."""
        count = self.partitions.get(name)
        if count is None:
            return None
        return TopicRecord(name, count, self.leaders.get(name, []), self.ids.get(name, ""))

    def replay(self, record: TopicRecord | TopicTombstone) -> None:
        """Apply a durable topic record and tell the listeners (counts never shrink)."""
        self.version += 1
        old = self.current(record.name)
        if isinstance(record, TopicTombstone):
            if old is not None:
                del self.partitions[record.name]
                self.leaders.pop(record.name, None)
                self.ids.pop(record.name, None)
                for listener in list(self._listeners):
                    listener(record.name)
            return
        if old is None or not old.topic_id or record.topic_id:
            # (a topic keeps its id: a record from before topic ids does not take it away)
            self.ids[record.name] = topic_id_of(record)
        if not supersedes(record, old) or (
            old is not None
            and record.partitions == old.partitions
            and list(record.leaders) == list(old.leaders)
        ):
            return
        self.partitions[record.name] = record.partitions
        self.leaders[record.name] = list(record.leaders)
        for listener in list(self._listeners):
            listener(record.name)

    def leader(self, topic: str, partition: int) -> int | None:
        """The id of the broker holding a partition (None: this one, on a single broker)."""
        leaders = self.leaders.get(topic)
        return leaders[partition] if leaders and partition < len(leaders) else None

    def partition_racks(self, topic: str) -> list[str]:
        """The rack of each partition of ``topic``: its broker's ("": none, or no such
        topic). One replica per partition, so a partition's racks are its leader's."""
        count = self.partitions.get(topic, 0)
        if self._rack_of is None:
            return [""] * count
        racks: dict[int | None, str] = {}
        out = []
        for p in range(count):
            leader = self.leader(topic, p)
            if leader not in racks:
                racks[leader] = self._rack_of(leader)
            out.append(racks[leader])
        return out

    def _place(self, name: str, old: list[int], total: int) -> list[int]:
        """Leaders for partitions ``len(old)..total-1`` on the live brokers, round-robin."""
        if self._placement is None:
            return []
        brokers = sorted(self._placement())
        if not brokers:
            raise CoordinatorNotAvailableError(
                "this broker has not joined its cluster yet, so no broker can be chosen to "
                "hold the partitions; retry shortly"
            )
        first = zlib.crc32(name.encode()) % len(brokers)
        return old + [brokers[(first + p) % len(brokers)] for p in range(len(old), total)]

    def _check_count(self, count: int) -> None:
        if not 1 <= count <= self._max_partitions:
            raise InvalidPartitionsError(
                f"partition count {count} must be between 1 and {self._max_partitions}"
            )

    async def create_topic(self, name: str, partitions: int) -> TopicInfo:
        """Create a topic; raises INVALID_TOPIC, INVALID_PARTITIONS, TOPIC_ALREADY_EXISTS."""
        validate_topic_name(name)
        self._check_count(partitions)
        async with self._changing:
            if name in self.partitions:
                raise TopicAlreadyExistsError(
                    f"topic {name!r} exists already with {self.partitions[name]} partitions"
                )
            leaders = self._place(name, [], partitions)
            try:
                await self._writer.write([TopicRecord(name, partitions, leaders, uuid.uuid4().hex)])
            except NodeExistsError:  # another broker of the cluster made it meanwhile
                raise TopicAlreadyExistsError(
                    f"topic {name!r} was just created by another broker"
                ) from None
            return self.info(name)

    async def add_partitions(self, name: str, total: int) -> TopicInfo:
        """Grow a topic to ``total`` partitions; the count never shrinks."""
        self._check_count(total)
        async with self._changing:
            current = self.require(name)
            if total <= current:
                raise InvalidPartitionsError(
                    f"topic {name!r} has {current} partitions; the new total must be larger "
                    "(partitions can be added, never removed)"
                )
            leaders = self._place(name, self.leaders.get(name, []), total)
            await self._writer.write([TopicRecord(name, total, leaders, self.ids.get(name, ""))])
            return self.info(name)

    async def delete_topic(self, name: str) -> None:
        """Delete a topic: its logs are removed and groups forget its offsets (UNKNOWN_TOPIC
        if there is no such topic). Groups subscribed to it rebalance without it."""
        async with self._changing:
            self.require(name)
            await self._writer.write([TopicTombstone(name)])

    def require(self, name: str) -> int:
        """The partition count of ``name``; raises UNKNOWN_TOPIC if it does not exist."""
        try:
            return self.partitions[name]
        except KeyError:
            raise UnknownTopicError(
                f"topic {name!r} does not exist; create it first "
                f"(trio-coord topics create {name} --partitions N)"
            ) from None

    def describe(self, names: Iterable[str] | None = None) -> list[TopicInfo]:
        """The topics asked for (None: all), sorted; raises UNKNOWN_TOPIC for a missing one."""
        wanted = sorted(self.partitions) if names is None else list(names)
        return [self.info(name) for name in wanted]

    def info(self, name: str) -> TopicInfo:
        """One topic as Metadata describes it; raises UNKNOWN_TOPIC if it does not exist."""
        return TopicInfo(
            name, self.require(name), list(self.leaders.get(name, [])), self.ids.get(name, "")
        )
