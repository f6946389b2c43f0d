"""What happens inside a group, as typed records: the broker's group events.

Its one job is to name and shape those events. The group task
(:class:`~trio_coord.broker.group.GroupRunner`) reports each one as a
frozen msgspec Struct with a ``kind`` tag; the broker hands it to its
metrics (rebalance durations and restarts by cause) and to
``BrokerConfig.on_event`` (tests, the demo, benchmarks, an operator's
hook). Every event carries ``group`` and ``time`` (the broker's
``trio.current_time()``, not the wall clock); partitions are spelled
``"topic-N"``. The lists of partitions (``Removed``, ``Revoking``,
``Started``, ``Stable.ownership``) cost O(partitions) to build on the group's
task, so a broker fills them only for ``BrokerConfig.on_event``: when only
its own metrics and collector listen, they are empty. An event is plain
data (``gc=False``: strings, numbers and containers of them), so
``msgspec.json.encode(event)`` logs it as one JSON object with its ``kind``,
and ``msgspec.structs.asdict(event)`` gives a dict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import msgspec

__all__ = [
    "EVENT_TYPES",
    "ComputeRequested",
    "Disconnected",
    "Empty",
    "EventCallback",
    "GroupEvent",
    "InitialDelay",
    "Joined",
    "RebalanceFailed",
    "RebalanceRestarted",
    "RebalanceSkipped",
    "RebalanceStarted",
    "Removed",
    "Resumed",
    "Revoking",
    "Stable",
    "StartDelayed",
    "Started",
    "SteppedOut",
    "decode_event",
]


class GroupEvent(
    msgspec.Struct,
    frozen=True,
    gc=False,
    kw_only=True,
    tag_field="kind",
    forbid_unknown_fields=True,
):
    """Something that happened to one group, at ``time`` (the broker's Trio clock)."""

    group: str
    time: float

    @property
    def kind(self) -> str:
        """The event's name (its tag): ``"joined"``, ``"stable"``, ..."""
        tag = self.__struct_config__.tag
        assert isinstance(tag, str)
        return tag


class Joined(GroupEvent, frozen=True, tag="joined"):
    """A member was admitted (new, or rejoining)."""

    member_id: str


class Resumed(GroupEvent, frozen=True, tag="resumed"):
    """A static member came back (same instance id) and keeps its partitions."""

    member_id: str
    instance_id: str | None


class SteppedOut(GroupEvent, frozen=True, tag="stepped_out"):
    """A static member left to restart; nobody else gets its partitions ``until`` then."""

    member_id: str
    until: float


class Disconnected(GroupEvent, frozen=True, tag="disconnected"):
    """A static member's connection ended; its partitions wait for it ``until`` then."""

    member_id: str
    until: float


class Removed(GroupEvent, frozen=True, tag="removed"):
    """A member left or was expelled, for ``reason``; what it may have owned."""

    member_id: str
    reason: str
    fenced_until: float | None
    partitions: list[str]


class Empty(GroupEvent, frozen=True, tag="empty"):
    """The group's last member went away."""


class InitialDelay(GroupEvent, frozen=True, tag="initial_delay"):
    """A group coming to life waits for more joins, at most ``until``."""

    until: float


class RebalanceStarted(GroupEvent, frozen=True, tag="rebalance_started"):
    """A rebalance began with ``members`` members (``cooperative``: only what moves stops)."""

    members: int
    cooperative: bool
    cause: str = "other"


class RebalanceSkipped(GroupEvent, frozen=True, tag="rebalance_skipped"):
    """A rebalance was asked for but would change no one's partitions: the group stays
    STABLE in its ``generation`` and nobody is stopped (``cause``: why it was asked for)."""

    generation: int
    cause: str = "other"


class Revoking(GroupEvent, frozen=True, tag="revoking"):
    """A cooperative plan: the partitions each member gives up."""

    partitions: dict[str, list[str]]


class ComputeRequested(GroupEvent, frozen=True, tag="compute_requested"):
    """The group's leader was asked for the assignment, by ``assignor``."""

    leader: str
    assignor: str


class StartDelayed(GroupEvent, frozen=True, tag="start_delayed"):
    """A member's start waits ``until`` a departed owner's lease ends."""

    member_id: str
    until: float


class Started(GroupEvent, frozen=True, tag="started"):
    """A member acknowledged starting its fetchers on ``partitions``."""

    member_id: str
    generation: int
    partitions: list[str]


class Stable(GroupEvent, frozen=True, tag="stable"):
    """A rebalance completed after ``elapsed`` seconds; who owns which partition now."""

    generation: int
    elapsed: float
    ownership: dict[str, str]
    cause: str = "other"
    """Why it ran: one of :data:`trio_coord.broker.group.CAUSES`."""


class RebalanceRestarted(GroupEvent, frozen=True, tag="rebalance_restarted"):
    """The rebalance in flight was cancelled for a newer one (``cause``: why)."""

    cause: str = "other"


class RebalanceFailed(GroupEvent, frozen=True, tag="rebalance_failed"):
    """A rebalance failed (store outage, a leader's assignor error); it is retried."""

    error: str


EVENT_TYPES: tuple[type[GroupEvent], ...] = (
    Joined,
    Resumed,
    SteppedOut,
    Disconnected,
    Removed,
    Empty,
    InitialDelay,
    RebalanceStarted,
    RebalanceSkipped,
    Revoking,
    ComputeRequested,
    StartDelayed,
    Started,
    Stable,
    RebalanceRestarted,
    RebalanceFailed,
)
"""Every kind of group event (a test checks that none is missing)."""

EventCallback = Callable[[GroupEvent], None]
"""An observer of group events (``BrokerConfig.on_event``): called on the broker's
Trio thread with each event, so it must be quick and must not raise."""

_decoder: msgspec.json.Decoder[GroupEvent] = msgspec.json.Decoder(Union[EVENT_TYPES])  # noqa: UP007


def decode_event(data: bytes) -> GroupEvent:
    """An event from its JSON (as ``msgspec.json.encode(event)`` wrote it)."""
    return _decoder.decode(data)
