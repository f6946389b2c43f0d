"""Parked connections: idle plaintext sockets watched by one task, not one task each.

A broker holds thousands of connections that are idle nearly all the time
(a member heartbeats every few seconds). A Trio task per connection costs
each one a task, its context, a chain of suspended coroutines and a nursery
(most of a member's memory), and Trio's every poll hands the kernel a buffer
sized to every waiting socket. A :class:`Parking` service instead holds the
sockets of idle connections in one ``epoll`` object of its own and waits on
*its* descriptor in one task. A connection parks itself when its reader is
between frames with nothing in flight (:meth:`~.connection.Connection.serve`
returns; the connection lives on as an object). When a parked socket becomes
readable, :meth:`~.connection.Connection.wake_parked` answers, in this task
and without blocking, the frames that need no task (heartbeats: ``handle_now``;
responses to the broker's own requests); anything else (a request that needs
a task, a partial or large or corrupt frame, a send the socket will not take
at once) *revives* the connection: its reader task runs again in this
service's nursery, handed what was read. Sockets are registered
level-triggered with ``EPOLLONESHOT``: an event disables its socket until it
is re-armed, so a socket is never handled twice at once, and one re-armed
with bytes still unread fires again at once (no wake-up is lost). One
wake-up handles at most :data:`MAX_EVENTS` sockets, each one read of at most
64 KiB, 32 frames and 64 KiB of answers, then lets other tasks run.
"""

from __future__ import annotations

import logging
import select
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from .connection import Connection
    from .messages import Request

__all__ = ["AVAILABLE", "MAX_EVENTS", "Parking", "Resume"]

log = logging.getLogger(__name__)

MAX_EVENTS = 256
"""The most parked sockets one wake-up of the service handles before it yields."""
AVAILABLE = hasattr(select, "epoll")
"""False where the OS has no epoll (macOS, Windows): connections keep their reader tasks."""
_ARMED = (select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLONESHOT) if AVAILABLE else 0


class Resume:
    """What a revived reader must finish before it reads on (see ``wake_parked``)."""

    __slots__ = ("charge", "locked", "out", "out_charge", "request")

    def __init__(self) -> None:
        self.out = b""
        """Answers written in part or not at all: the reader sends them first."""
        self.locked = False
        """True if the write lock is held for ``out`` (part of it is on the wire)."""
        self.out_charge: tuple[int, int] = (0, 0)
        """The budget charges of the requests answered in ``out``, given back once sent."""
        self.request: Request | None = None
        """A request ``handle_now`` could not answer, to run in a handler task."""
        self.charge: tuple[int, int] = (0, 0)
        """Its charge, which the handler task gives back."""


class Parking:
    """One task and one epoll object for every parked connection.

    Run :meth:`run` in a nursery (``await nursery.start(parking.run)``); give
    it to the connections that may park (``Connection(..., parking=...)``).
    Revived connections' reader tasks run in its nursery; when it stops,
    every parked connection is closed and its revived readers are cancelled.
    """

    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        self._parked: dict[int, Connection] = {}
        self._nursery: trio.Nursery | None = None
        self.revived = 0
        """How many times a parked connection needed its reader task again."""

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, conn: Connection) -> bool:
        """Watch ``conn``'s socket instead of its reader; False if the service is not
        running (the reader then keeps reading)."""
        epoll = self._epoll
        if epoll is None or self._nursery is None:
            return False
        fd = conn._stream.socket.fileno()  # type: ignore[attr-defined]
        if fd < 0:
            return False
        try:
            try:
                epoll.modify(fd, _ARMED)  # (parked before: its entry is disarmed)
            except FileNotFoundError:
                epoll.register(fd, _ARMED)
        except OSError:
            return False
        self._parked[fd] = conn
        conn._parked = True
        return True

    def forget(self, conn: Connection) -> None:
        """Stop watching a parked connection's socket (before it is closed)."""
        fd = conn._stream.socket.fileno()  # type: ignore[attr-defined]
        if self._parked.get(fd) is conn:
            del self._parked[fd]
            if self._epoll is not None:
                try:
                    self._epoll.unregister(fd)
                except (OSError, ValueError):
                    pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch parked sockets until cancelled; then close every parked connection."""
        self._epoll = epoll = select.epoll()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    await self._watch(epoll)
                finally:
                    self._nursery = None  # (no more parking: readers keep reading)
                    for conn in list(self._parked.values()):
                        conn.end_parked()
        finally:
            self._epoll = None
            epoll.close()

    async def _watch(self, epoll: select.epoll) -> None:
        parked = self._parked
        while True:
            await trio.lowlevel.wait_readable(epoll.fileno())
            for fd, _ in epoll.poll(0, MAX_EVENTS):
                conn = parked.get(fd)
                if conn is None:
                    continue
                try:
                    resume = conn.wake_parked()
                except Exception:  # a bug must cost this connection only
                    log.exception("parked connection %s failed and was closed", conn.name)
                    if conn.parked:
                        conn.end_parked()
                    continue
                if not conn.parked:
                    continue  # (it ended)
                if resume is None:
                    try:
                        epoll.modify(fd, _ARMED)
                    except OSError:
                        conn.end_parked()
                else:
                    self._revive(conn, resume)

    def _revive(self, conn: Connection, resume: Resume) -> None:
        """Give ``conn`` its reader task back (its epoll entry stays, disarmed)."""
        del self._parked[conn._stream.socket.fileno()]  # type: ignore[attr-defined]
        conn._parked = False
        self.revived += 1
        assert self._nursery is not None
        self._nursery.start_soon(self._serve, conn, resume)

    @staticmethod
    async def _serve(conn: Connection, resume: Resume) -> None:
        try:
            await conn.serve(resume=resume)
        except Exception:
            # Connection.serve raises nothing for what a peer does; should a bug let an
            # exception through anyway, it costs this connection only.
            log.exception("connection %s failed and was closed", conn.name)
