"""The topic manager: which topics exist and how many partitions each has.

It validates and persists CreateTopic and AddPartitions (through the record
writer, so a topic is acknowledged only once durable), answers what the
coordinator needs to assign (partition counts), and tells its listeners when
a topic appears or grows so that the groups subscribed to it rebalance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import trio

from ..core.records import TopicRecord, supersedes
from ..core.validation import validate_topic_name
from ..protocol.errors import InvalidPartitionsError, TopicAlreadyExistsError, UnknownTopicError
from ..protocol.messages import TopicInfo
from .persistence import RecordWriter

__all__ = ["TopicManager"]


class TopicManager:
    """Topics and their partition counts; see the module docstring."""

    def __init__(self, writer: RecordWriter, *, max_partitions: int = 10_000) -> None:
        self._writer = writer
        self._max_partitions = max_partitions
        self.partitions: dict[str, int] = {}
        """topic → partition count (the durable, replayed state)."""
        self._listeners: list[Callable[[str], None]] = []
        # Check-then-write must not interleave: two AddPartitions could shrink a topic.
        self._changing = trio.Lock()

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(topic)`` whenever a topic is created or grows."""
        self._listeners.append(listener)

    def current(self, name: str) -> TopicRecord | None:
        """The durable record of topic ``name`` (None if there is no such topic)."""
        count = self.partitions.get(name)
        return None if count is None else TopicRecord(name, count)

    def replay(self, record: TopicRecord) -> None:
        """Apply a durable topic record and tell the listeners (counts never shrink)."""
        if not supersedes(record, self.current(record.name)):
            return
        self.partitions[record.name] = record.partitions
        for listener in self._listeners:
            listener(record.name)

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
            await self._writer.write([TopicRecord(name, partitions)])
            return TopicInfo(name, self.partitions[name])

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
            await self._writer.write([TopicRecord(name, total)])
            return TopicInfo(name, self.partitions[name])

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
        return [TopicInfo(name, self.require(name)) for name in wanted]
