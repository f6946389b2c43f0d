"""The metadata-store interface every backend implements.

The shape is ZooKeeper's, on purpose, so that the embedded file store and the
kazoo-backed cluster store are interchangeable: a tree of nodes addressed by
absolute slash-separated paths, each holding bytes and a version that every
write bumps; conditional writes (``version=``) and atomic multi-operations
built from :class:`Create`, :class:`SetData`, :class:`Delete` and
:class:`Check`; ephemeral nodes that vanish with the session that made them;
and watches, exposed the Trio way as async iterators of snapshots. Paths use
ZooKeeper's rules: they start with ``/``, have no empty segment and no
trailing slash (except the root ``/`` itself).

A store's session can be interrupted only where there is a network between
the store and its data (ZooKeeper): :attr:`MetadataStore.session_state` says
where the session stands (:class:`SessionState`), calls made over a lost
connection raise :class:`StoreConnectionError` (retriable) and calls after the
session expired raise :class:`SessionExpiredError` (the store is dead; open a
new one). The embedded store is always ``CONNECTED`` and raises neither.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from trio_util import AsyncValue

__all__ = [
    "BadVersionError",
    "Check",
    "Create",
    "Delete",
    "MetadataStore",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "Op",
    "SessionExpiredError",
    "SessionState",
    "SetData",
    "Stat",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "parent_path",
    "validate_path",
]


class StoreError(Exception):
    """Base class of every error a metadata store raises."""


class NoNodeError(StoreError):
    """The node (or, for ``create``, its parent) does not exist."""


class NodeExistsError(StoreError):
    """``create`` found a node already at that path."""


class BadVersionError(StoreError):
    """A conditional write or :class:`Check` saw a different version."""


class NotEmptyError(StoreError):
    """``delete`` of a node that still has children (use ``recursive=True``)."""


class StoreClosedError(StoreError):
    """The store (or its session) is closed; no further calls are possible."""


class StoreConnectionError(StoreError):
    """The connection to the store's servers was lost; retriable.

    The session may still be alive (:attr:`SessionState.SUSPENDED`): retry once
    the store is ``CONNECTED`` again. A write that raised this may or may not
    have been applied (its reply was lost), so retry it in a form that is safe
    to repeat (conditional on a version, or checking first). Never raised by
    the embedded store.
    """


class SessionExpiredError(StoreError):
    """The store's session has expired: its ephemeral nodes are gone, and the store is dead.

    Every later call raises this too. The owner must close the store and open
    a new one (a new session), then re-create its ephemeral nodes and re-check
    anything it held by virtue of the old session (leadership, leases). Never
    raised by the embedded store.
    """


class SessionState(enum.Enum):
    """Where a store's session stands; see :attr:`MetadataStore.session_state`."""

    CONNECTED = "connected"
    """The session is live and calls reach the servers."""
    SUSPENDED = "suspended"
    """The connection is lost; the session may still live. Calls raise
    :class:`StoreConnectionError` (watch iterators wait); the servers may expire
    the session meanwhile, so anything held by it (a leadership) may already
    belong to someone else."""
    EXPIRED = "expired"
    """The servers expired the session (its ephemeral nodes are gone); the store
    is dead and calls raise :class:`SessionExpiredError`. Final, until ``aclose``."""
    CLOSED = "closed"
    """``aclose`` ended the session; calls raise :class:`StoreClosedError`. Final."""


@dataclass(frozen=True, slots=True)
class Stat:
    """What a store knows about one node besides its data.

    ``version`` counts the writes to the node's data (0 after ``create``);
    ``cversion`` counts changes to its list of children; ``ephemeral_owner``
    is the id of the owning session, or 0 for a persistent node.
    """

    version: int
    cversion: int = 0
    ephemeral_owner: int = 0
    num_children: int = 0


@dataclass(frozen=True, slots=True)
class Create:
    """Multi-op: create ``path`` with ``data`` (parent must exist)."""

    path: str
    data: bytes = b""
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class SetData:
    """Multi-op: replace the data at ``path``; ``version=-1`` means any."""

    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class Delete:
    """Multi-op: delete the childless node at ``path``; ``version=-1`` means any."""

    path: str
    version: int = -1


@dataclass(frozen=True, slots=True)
class Check:
    """Multi-op: fail the whole transaction unless ``path`` is at ``version``."""

    path: str
    version: int


Op = Create | SetData | Delete | Check


def validate_path(path: str) -> str:
    """Return ``path`` if it is a valid absolute node path, else raise ValueError."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"store path must be absolute (start with '/'): {path!r}")
    if path == "/":
        return path
    if path.endswith("/"):
        raise ValueError(f"store path must not end with '/': {path!r}")
    for segment in path[1:].split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"store path has an empty, '.' or '..' segment: {path!r}")
        if "\x00" in segment:
            raise ValueError(f"store path contains a NUL character: {path!r}")
    return path


def parent_path(path: str) -> str:
    """The parent of a node path (``/`` for top-level nodes)."""
    head, _, _ = path.rpartition("/")
    return head or "/"


class MetadataStore(abc.ABC):
    """An async, ZooKeeper-shaped metadata store bound to one session.

    All methods are called from the Trio thread. A write returns once it is
    durable (the embedded store has fsynced it; ZooKeeper has committed it).
    ``session_id`` identifies the session that owns this store's ephemeral
    nodes; they disappear when the session ends (``aclose`` of the store, or
    ZooKeeper expiring the session). ``session_state`` tracks that session.
    """

    _always_connected: AsyncValue | None = None

    @property
    @abc.abstractmethod
    def session_id(self) -> int:
        """The id of this store's session (the owner of its ephemeral nodes)."""

    @property
    def session_state(self) -> AsyncValue:
        """The session's :class:`SessionState`, as a ``trio_util.AsyncValue``.

        Wait on it (``await store.session_state.wait_value(SessionState.EXPIRED)``)
        to act when the session is lost: a broker steps down from everything it
        holds through ephemeral nodes on ``EXPIRED``, and should stop acting on
        them while ``SUSPENDED``. This default, for stores without a network
        between them and their data (the embedded store), is always
        ``CONNECTED``; backends that can lose their session override it.
        Only the store changes the value.
        """
        state = self._always_connected
        if state is None:
            state = self._always_connected = AsyncValue(SessionState.CONNECTED)
        return state

    @abc.abstractmethod
    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        """Create a node and return its path.

        With ``sequential=True`` a ten-digit, zero-padded counter kept by the
        parent is appended to the last segment (as ZooKeeper does) and the
        resulting path is returned. ``make_parents=True`` creates missing
        persistent ancestors with empty data. Raises :class:`NodeExistsError`
        or :class:`NoNodeError` (missing parent without ``make_parents``).
        Ephemeral nodes cannot have children.
        """

    @abc.abstractmethod
    async def get(self, path: str) -> tuple[bytes, Stat]:
        """Return the node's data and stat; :class:`NoNodeError` if absent."""

    @abc.abstractmethod
    async def exists(self, path: str) -> Stat | None:
        """Return the node's stat, or None if there is no node at ``path``."""

    @abc.abstractmethod
    async def children(self, path: str) -> list[str]:
        """Return the names (not paths) of the node's children, sorted."""

    @abc.abstractmethod
    async def set(self, path: str, data: bytes, *, version: int = -1) -> Stat:
        """Replace the node's data if its version matches (-1: any); return the new stat."""

    @abc.abstractmethod
    async def delete(self, path: str, *, version: int = -1, recursive: bool = False) -> None:
        """Delete the node (and with ``recursive=True`` its subtree)."""

    @abc.abstractmethod
    async def multi(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        """Apply ``ops`` atomically: all of them, or none and raise.

        Returns one result per op: the created path for :class:`Create`, the
        new :class:`Stat` for :class:`SetData`, and None for :class:`Delete`
        and :class:`Check`. On failure raises the error of the first failing
        op (:class:`BadVersionError`, :class:`NoNodeError`, ...) and nothing
        is applied.
        """

    @abc.abstractmethod
    def watch_data(
        self, path: str
    ) -> AbstractAsyncContextManager[AsyncIterator[tuple[bytes, Stat] | None]]:
        """Watch one node: ``async with store.watch_data(p) as it: async for snap in it``.

        The iterator first yields the current snapshot (``(data, stat)``, or
        None while the node does not exist), then a new snapshot after each
        change. Snapshots may coalesce (a slow reader sees the latest state,
        never a stale one), so the iterator is a level, not an event log.
        """

    @abc.abstractmethod
    def watch_children(self, path: str) -> AbstractAsyncContextManager[AsyncIterator[list[str]]]:
        """Watch a node's children, with the same snapshot semantics as :meth:`watch_data`.

        Yields the sorted child names (an empty list while the node does not
        exist), first at once and then after each change.
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """End the session: its ephemeral nodes are removed; further calls raise."""
