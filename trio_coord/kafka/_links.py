"""A Kafka member's link to the engine, as it lives on a connection and ends with it.

Its one job is the part of a member link that both front ends share:
:class:`LinkBase` (the connection the member talks on, and what its end
does: the engine hears of it, a dynamic member's link is forgotten) and
:class:`ConnectionWatch`. A member link (a classic member's,
:mod:`.groups`, or a KIP-848 member's, :mod:`.consumer_groups`) ends with
the connection it talks on. Registering a close callback per link would let a
client that joins again and again on one connection (refused each time, or
leaving each time) grow that connection's callback list, and keep every link
alive, until the connection ends; the watch registers one callback per
connection and tells the links bound to it then.
"""

from __future__ import annotations

from typing import Any, Final, Generic, Protocol, TypeVar

from ..protocol.errors import CoordError
from ..protocol.messages import RequestBody, ResponseBody
from .dispatch import ClientConnection, FrontEnd

__all__ = ["ConnectionWatch", "LinkBase"]


class _Link(Protocol):
    def _conn_closed(self, conn: ClientConnection) -> None: ...


L = TypeVar("L", bound=_Link)


class ConnectionWatch(Generic[L]):
    """The links bound to each live connection; each is told when its connection ends."""

    def __init__(self) -> None:
        self._on_conn: dict[ClientConnection, set[L]] = {}

    def move(self, link: L, old: ClientConnection | None, conn: ClientConnection) -> None:
        """``link`` now lives on ``conn`` (no longer on ``old``): tell it when ``conn`` ends."""
        if old is not None:
            self.forget(link, old)
        links = self._on_conn.get(conn)
        if links is not None:
            links.add(link)
            return
        self._on_conn[conn] = {link}
        conn.on_close(lambda: self._ended(conn))  # (at once if it has ended)

    def forget(self, link: L, conn: ClientConnection | None) -> None:
        """``link`` no longer needs to hear of ``conn``'s end (it left, or was dropped)."""
        links = self._on_conn.get(conn) if conn is not None else None
        if links is not None:
            links.discard(link)  # (the entry stays while its callback is registered)

    def bound(self) -> int:
        """How many links are watched, over all connections (for tests and tools)."""
        return sum(len(links) for links in self._on_conn.values())

    def _ended(self, conn: ClientConnection) -> None:
        for link in list(self._on_conn.pop(conn, ())):
            link._conn_closed(conn)


class _Groups(Protocol):
    """What a link needs of its front end's member tables."""

    front: FrontEnd
    conns: ConnectionWatch[Any]

    def drop(self, link: Any) -> None: ...


class LinkBase:
    """A member link's connection and end, shared by the classic and the KIP-848 link.

    A subclass sets ``instance_id`` and says, in :attr:`engine_member_id`,
    which engine member it carries, and what waking its waiters means
    (:meth:`_wake`).
    """

    max_frame_size: Final = 1 << 30
    """An answer to a Kafka member carries any assignment: the engine never splits one."""
    instance_id: str

    def __init__(self, groups: _Groups, group_id: str) -> None:
        self._groups = groups
        self.group_id = group_id
        self.conn: ClientConnection | None = None
        self.peer = ""
        self.dropped = False

    @property
    def engine_member_id(self) -> str:
        """The id the engine knows the member by ("" before it joined)."""
        raise NotImplementedError

    def detach(self) -> None:
        """The member is gone from this link: wake what waits on it, stop watching its
        connection (its front end then forgets it in its tables)."""
        self.dropped = True
        self._wake()
        self._groups.conns.forget(self, self.conn)

    @property
    def closed(self) -> bool:
        """True once the member left, or the connection it talks on ended."""
        return self.dropped or self.conn is None or self.conn.closed

    def bind(self, conn: ClientConnection | None, peer: str) -> None:
        """The member now talks on ``conn``: its end is the member's end."""
        if conn is None or conn is self.conn:
            return
        old, self.conn, self.peer = self.conn, conn, peer
        self._groups.conns.move(self, old, conn)

    def _conn_closed(self, conn: ClientConnection) -> None:
        if conn is not self.conn or self.dropped:
            return
        self._wake()
        try:
            self._groups.front.service.coordinator.connection_lost(self)
        except CoordError:
            pass  # (not the coordinator any more: nothing to tell)
        if not self.instance_id:
            self._groups.drop(self)

    def released(self, member_id: str) -> None:
        """The engine no longer reaches its member ``member_id`` through this link (removed:
        its session ended, it left, it was fenced; or a static member stepped out, was
        disconnected or replaced). A dynamic member's link is forgotten then, so that
        members that go silent on an open connection do not stay in the tables; a static
        one's is kept for its successor."""
        if member_id and member_id == self.engine_member_id and not self.instance_id:
            self._groups.drop(self)

    async def request(self, body: RequestBody) -> ResponseBody | None:
        """An engine push (StopFetchers, StartFetchers, ComputeAssignment) to the member."""
        raise NotImplementedError

    def _wake(self) -> None:
        """Wake every engine push and request waiting on the member (it is gone)."""
        raise NotImplementedError
