"""Session deadlines of a group's members: one structure and one task per group.

A member is alive while heartbeats keep arriving within its session timeout.
Members of a group share a handful of session timeouts, so members are kept
in one insertion-ordered dict per timeout, ordered by deadline: a heartbeat
moves its member to the end (O(1)), and the earliest deadline of the group is
at the front of one of them. One watcher task sleeps until that deadline and
expires whoever is overdue. So a member costs two dict entries, not a task,
a coroutine chain and a cancel scope (which, at 20,000 members, were most of
what the garbage collector had to walk).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

__all__ = ["Liveness"]


class Liveness:
    """Members' session deadlines; ``expire(member_id)`` is called for each that passes.

    Run :meth:`run` in a task. :meth:`watch` starts (or restarts) a member's
    session, :meth:`renew` moves its deadline on a heartbeat, :meth:`forget`
    drops it. ``expire`` is called from the watcher task, once per overdue
    member, after the member was forgotten.
    """

    def __init__(self, expire: Callable[[str], None]) -> None:
        self._expire = expire
        self._by_timeout: dict[float, dict[str, float]] = {}  # timeout -> member -> deadline
        self._timeout_of: dict[str, float] = {}
        self._target = math.inf  # when the watcher wakes next
        self._wake = trio.Event()

    def __contains__(self, member_id: str) -> bool:
        return member_id in self._timeout_of

    def __len__(self) -> int:
        return len(self._timeout_of)

    def watch(self, member_id: str, session_timeout: float) -> None:
        """Start ``member_id``'s session now: it expires unless renewed within the timeout."""
        self.forget(member_id)
        deadline = trio.current_time() + session_timeout
        self._by_timeout.setdefault(session_timeout, {})[member_id] = deadline
        self._timeout_of[member_id] = session_timeout
        if deadline < self._target:
            self._wake.set()

    def renew(self, member_id: str) -> None:
        """A heartbeat: the member's deadline is a session timeout from now (O(1))."""
        timeout = self._timeout_of[member_id]
        members = self._by_timeout[timeout]
        del members[member_id]  # to the end: the latest deadline of its timeout
        members[member_id] = trio.current_time() + timeout

    def forget(self, member_id: str) -> None:
        """Stop watching ``member_id`` (it left or was removed); nothing if not watched."""
        timeout = self._timeout_of.pop(member_id, None)
        if timeout is not None:
            members = self._by_timeout[timeout]
            del members[member_id]
            if not members:
                del self._by_timeout[timeout]

    def deadline(self, member_id: str) -> float:
        """When ``member_id``'s session expires unless renewed (KeyError if not watched)."""
        return self._by_timeout[self._timeout_of[member_id]][member_id]

    def _earliest(self) -> float:
        return min(
            (next(iter(members.values())) for members in self._by_timeout.values()),
            default=math.inf,
        )

    async def run(self) -> None:
        """The watcher: expire overdue members as their deadlines pass, until cancelled."""
        while True:
            self._target = self._earliest()
            self._wake = trio.Event()
            with trio.move_on_at(self._target):
                await self._wake.wait()
            now = trio.current_time()
            for members in list(self._by_timeout.values()):
                while members:
                    member_id, deadline = next(iter(members.items()))
                    if deadline > now:
                        break
                    self.forget(member_id)
                    self._expire(member_id)
