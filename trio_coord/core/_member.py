"""One member of a group as its coordinator sees it, and the fence a departed member leaves.

:class:`Member` is what a join told the coordinator (subscription, timeouts, assignors,
protocol) and what the group has since decided for it (generation, assignment, what it
may still be fetching); :class:`Fence` keeps a removed member's partitions from a new
owner until its session has certainly expired. Shared by ``group.py`` (membership) and
``_planning.py`` (assignment planning); re-exported by ``group.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..protocol.messages import TopicPartition

__all__ = ["Fence", "Member"]


@dataclass(slots=True)
class Member:
    """A live member of the group, as its coordinator sees it."""

    member_id: str
    client_id: str
    host: str
    topics: frozenset[str]
    session_timeout: float
    rebalance_timeout: float
    assignors: tuple[str, ...]
    auto_commit: bool
    offset_reset: str
    last_heartbeat: float
    generation: int
    """The last generation this member joined in or acknowledged."""
    assignment: frozenset[TopicPartition] = frozenset()
    """Its partitions in the group's current generation."""
    may_own: set[TopicPartition] = field(default_factory=set)
    """Partitions it may be fetching: started and not yet acknowledged as stopped."""
    started_in: int = -1
    """The generation of the last StartFetchers it acknowledged (-1: none since it joined).

    Only a member started in the group's current generation is known to fetch
    exactly its assignment: ``may_own`` is what it *may* fetch, a bound for
    fencing, not a fact. A member that rejoins may have dropped everything
    (its lease ran out), and one planned into a generation whose start never
    reached it (the rebalance restarted) fetches none of that assignment."""
    protocol: str = "eager"
    """The rebalance protocol it asked for (:data:`~trio_coord.core.group.REBALANCE_PROTOCOLS`)."""
    instance_id: str = ""
    """A static member's stable identity across restarts (empty: dynamic)."""
    user_data: bytes = b""
    """Opaque bytes it gave for a leader-side assignor."""
    client_assignors: tuple[str, ...] = ()
    """The assignors it can compute itself, as the group's leader."""
    rack: str = ""
    """The rack it runs in ("": none), for rack-aware assignors."""

    @property
    def lease_end(self) -> float:
        """When this member certainly stops fetching if it hears nothing more."""
        return self.last_heartbeat + self.session_timeout


@dataclass(frozen=True, slots=True)
class Fence:
    """Partitions a departed member may still fetch, until ``until``.

    ``session_timeout`` is that member's: how long to fence again after a
    restart, when ``until`` (a reading of a clock that is gone) means nothing.
    """

    partitions: frozenset[TopicPartition]
    until: float
    session_timeout: float = field(default=0.0, compare=False)
