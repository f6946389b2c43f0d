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
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

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
    "SetData",
    "Stat",
    "StoreClosedError",
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
    ZooKeeper expiring the session).
    """

    @property
    @abc.abstractmethod
    def session_id(self) -> int:
        """The id of this store's session (the owner of its ephemeral nodes)."""

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
