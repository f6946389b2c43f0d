"""The group's states, what moves it between them, and how each state answers requests.

Its one job is the group state machine as data: :data:`STATE_TABLE` maps
(state, trigger) to the next state, :data:`STATE_DOCS` says per state how
the coordinator answers each request then (as Kafka's group coordinator
documents its states), and :data:`TRANSITIONS` (the legal moves) is derived
from the table. :class:`~trio_coord.core.group.Group` moves only by
:meth:`~trio_coord.core.group.Group.fire` with a trigger, which looks the
next state up here; a pair not in the table is a coordinator bug
(:class:`IllegalTransitionError`). Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = [
    "REBALANCING",
    "STATE_DOCS",
    "STATE_TABLE",
    "TRANSITIONS",
    "GroupState",
    "IllegalTransitionError",
    "Trigger",
]


class GroupState(enum.StrEnum):
    """Where a group is in its life and in its rebalance."""

    EMPTY = "EMPTY"
    STOPPING = "STOPPING"
    ASSIGNING = "ASSIGNING"
    STARTING = "STARTING"
    STABLE = "STABLE"
    DEAD = "DEAD"


class Trigger(enum.StrEnum):
    """What moves a group from one state to another."""

    REBALANCE = "rebalance"
    """A rebalance begins (or restarts): a member joined, left or failed, a topic changed,
    offsets were reset. Every member's fetchers are to be stopped (eager), or the plan
    made first (cooperative)."""
    STOPPED = "stopped"
    """Every member acknowledged its stop (or was expelled) and positions are durable: the
    assignment is computed and the new generation planned."""
    PLANNED = "planned"
    """The new generation's record is durable and replayed: fetchers are started."""
    STARTED = "started"
    """Every member acknowledged its start of the new generation."""
    EMPTIED = "emptied"
    """The last member left, timed out or was expelled."""
    DELETED = "deleted"
    """The group's tombstone was written (deleted by a tool, or by retention)."""


_S, _T = GroupState, Trigger

STATE_TABLE: Mapping[tuple[GroupState, Trigger], GroupState] = {
    (_S.EMPTY, _T.REBALANCE): _S.STOPPING,
    (_S.EMPTY, _T.DELETED): _S.DEAD,
    (_S.STOPPING, _T.REBALANCE): _S.STOPPING,
    (_S.STOPPING, _T.STOPPED): _S.ASSIGNING,
    (_S.STOPPING, _T.EMPTIED): _S.EMPTY,
    (_S.ASSIGNING, _T.REBALANCE): _S.STOPPING,
    (_S.ASSIGNING, _T.PLANNED): _S.STARTING,
    (_S.ASSIGNING, _T.EMPTIED): _S.EMPTY,
    (_S.STARTING, _T.REBALANCE): _S.STOPPING,
    (_S.STARTING, _T.STARTED): _S.STABLE,
    (_S.STARTING, _T.EMPTIED): _S.EMPTY,
    (_S.STABLE, _T.REBALANCE): _S.STOPPING,
    (_S.STABLE, _T.EMPTIED): _S.EMPTY,
}
"""(state, trigger) -> next state; any pair not listed is illegal (a coordinator bug)."""

STATE_DOCS: Mapping[GroupState, str] = {
    _S.EMPTY: (
        "No members. JoinGroup admits one (a new group waits initial_rebalance_delay for "
        "more) and starts a rebalance; Heartbeat, LeaveGroup and a member's OffsetCommit get "
        "UNKNOWN_MEMBER_ID; a standalone committer's OffsetCommit is accepted; OffsetFetch "
        "and DescribeGroup answer; DeleteGroup deletes it. Removed once empty without "
        "offsets for group_retention; its offsets expire after offsets_retention."
    ),
    _S.STOPPING: (
        "Phase 1: fetchers are being stopped. JoinGroup admits (the rebalance restarts, or "
        "takes a new member in its plan); Heartbeat is accepted (a Kafka member is told "
        "REBALANCE_IN_PROGRESS: join again; a native one hears StopFetchers); OffsetCommit "
        "only for partitions the member may still be fetching (its on_revoked progress), "
        "REBALANCE_IN_PROGRESS for one it already stopped; LeaveGroup removes the member "
        "and restarts the rebalance."
    ),
    _S.ASSIGNING: (
        "Phase 2-3: positions are made durable and the assignment computed (by the broker "
        "or the leader, ComputeAssignment) and persisted. Requests are answered as in "
        "STOPPING; a membership change restarts the rebalance."
    ),
    _S.STARTING: (
        "Phase 4: StartFetchers pushed, acknowledgements awaited (fenced partitions wait "
        "for their departed owners' leases). Heartbeat accepted with the old or new "
        "generation; OffsetCommit accepted from a member once it has started the new "
        "generation (REBALANCE_IN_PROGRESS before), for its own partitions only."
    ),
    _S.STABLE: (
        "Every member fetches its partitions of the current generation. Heartbeat and "
        "OffsetCommit (current generation, own partitions) accepted; a stale generation "
        "gets ILLEGAL_GENERATION; JoinGroup, LeaveGroup, a lost member or a topic change "
        "start a rebalance (unless it would change nothing)."
    ),
    _S.DEAD: (
        "Deleted: its tombstone is durable. Every request is answered as for a group that "
        "does not exist (a JoinGroup creates a new group once the old task is gone)."
    ),
}
"""How each state answers requests, one entry per state."""

TRANSITIONS: Mapping[GroupState, frozenset[GroupState]] = {
    state: frozenset(new for (old, _), new in STATE_TABLE.items() if old is state)
    for state in GroupState
}
"""The legal state changes (derived from :data:`STATE_TABLE`)."""

REBALANCING = frozenset({_S.STOPPING, _S.ASSIGNING, _S.STARTING})
"""The states of a rebalance in flight."""


class IllegalTransitionError(RuntimeError):
    """A state change not in :data:`STATE_TABLE` was attempted (a coordinator bug)."""
