"""Which member links live on which Kafka connection: one close callback per connection.

Its one job is :class:`ConnectionWatch`. A member link (a classic member's,
:mod:`.groups`, or a KIP-848 member's, :mod:`.consumer_groups`) ends with
the connection it talks on. Registering a close callback per link would let a
client that joins again and again on one connection (refused each time, or
leaving each time) grow that connection's callback list, and keep every link
alive, until the connection ends; the watch registers one callback per
connection and tells the links bound to it then.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from .dispatch import ClientConnection

__all__ = ["ConnectionWatch"]


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
