"""Ownership timelines recorded from consumers' callbacks, and the check that they never overlap.

Every consumer of a test runs in the test's process, so their
``on_assigned``/``on_revoked``/``on_lost`` callbacks happen in one order: a
partition assigned to a member while another still owns it shows up as an
``assigned`` before the other's ``revoked``/``lost``. The recorded interval of
ownership lies within the real one (fetching starts before ``on_assigned``
and stops after ``on_revoked``), so any recorded overlap is a real one.
One :class:`Ownership` records the members of one group (each group owns
every partition once).
"""

from __future__ import annotations

from collections.abc import Callable

from trio_coord.protocol.messages import TopicPartition

Callback = Callable[[list[TopicPartition]], None]


class Ownership:
    """The timeline of who owned which partition, in the order it happened."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, TopicPartition]] = []  # (member, event, partition)

    def callbacks(self, member: str) -> dict[str, Callback]:
        """``on_assigned``/``on_revoked``/``on_lost`` for ``open_consumer(**...)``."""

        def recorder(event: str) -> Callback:
            def record(partitions: list[TopicPartition]) -> None:
                self.events.extend((member, event, tp) for tp in partitions)

            return record

        return {
            "on_assigned": recorder("assigned"),
            "on_revoked": recorder("revoked"),
            "on_lost": recorder("lost"),
        }

    def check_exclusive(self) -> None:
        """Fail if a partition was ever assigned while another member owned it."""
        owner: dict[TopicPartition, str] = {}
        for member, event, tp in self.events:
            if event == "assigned":
                assert tp not in owner, f"{tp} given to {member} while {owner[tp]} owns it"
                owner[tp] = member
            else:
                assert owner.get(tp) == member, (member, event, tp, owner.get(tp))
                del owner[tp]

    def count(self, event: str) -> int:
        """How many partitions went through ``event``."""
        return sum(1 for _, e, _ in self.events if e == event)
