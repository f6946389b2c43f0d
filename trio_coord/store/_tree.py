"""The embedded store's in-memory tree and its transactions.

Nodes and their ZooKeeper-shaped fields, ``_apply`` (one logged operation onto the
tree: the same code for live writes and for replay), ``_apply_atomically`` (a
transaction all or nothing), and ``_Stage``, which checks a multi-op transaction
against the tree (versions, parents, sequential names) and resolves it into the
logged operations. No I/O and no Trio here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from ._wal import _LogCreate, _LogDelete, _LogMeta, _LogOp, _LogSet
from .base import (
    BadVersionError,
    Create,
    Delete,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Op,
    SetData,
    Stat,
    StoreError,
    parent_path,
)

_SEQ_DIGITS: Final = 10


# --------------------------------------------------------------------------
# The in-memory tree.


@dataclass(slots=True, eq=False)
class _Fields:
    """A node's own fields: everything but its children."""

    data: bytes
    owner: int = 0  # ephemeral owner session, 0 if persistent
    version: int = 0
    cversion: int = 0
    seq: int = 0  # next sequential-child suffix
    neph: int = 0  # how many children are ephemeral


@dataclass(slots=True, eq=False)
class _Node(_Fields):
    """A node of the in-memory tree; children are names, looked up in the flat path map."""

    children: set[str] = field(default_factory=set)

    def stat(self) -> Stat:
        """The public stat of this node."""
        return Stat(self.version, self.cversion, self.owner, len(self.children))


def _name(path: str) -> str:
    return path.rpartition("/")[2]


def _apply(nodes: dict[str, _Node], op: _LogOp) -> None:
    """Apply one resolved operation to a tree (live writes and replay alike)."""
    if isinstance(op, _LogSet):
        node = nodes[op.path]
        node.data = op.data
        node.version = op.version
    elif isinstance(op, _LogCreate):
        if op.path in nodes:
            raise ValueError(f"node {op.path!r} already exists")
        parent = nodes[parent_path(op.path)]
        nodes[op.path] = _Node(op.data, op.owner)
        parent.children.add(_name(op.path))
        parent.cversion, parent.seq, parent.neph = op.pcv, op.pseq, op.pneph
    elif isinstance(op, _LogDelete):
        if nodes[op.path].children:
            raise ValueError(f"node {op.path!r} has children")
        del nodes[op.path]
        parent = nodes[parent_path(op.path)]
        parent.children.remove(_name(op.path))
        parent.cversion, parent.seq, parent.neph = op.pcv, op.pseq, op.pneph
    else:
        node = nodes[op.path]
        node.cversion, node.seq, node.neph = op.cversion, op.seq, op.neph


def _copy_node(node: _Node) -> _Node:
    return dataclasses.replace(node, children=set(node.children))


def _apply_atomically(nodes: dict[str, _Node], ops: Sequence[_LogOp]) -> bool:
    """Apply a record's operations, all or none; False (tree unchanged) if one fails."""
    saved: dict[str, _Node | None] = {}
    try:
        for op in ops:
            for path in (op.path, parent_path(op.path) if op.path != "/" else "/"):
                if path not in saved:
                    node = nodes.get(path)
                    saved[path] = None if node is None else _copy_node(node)
            _apply(nodes, op)
    except (KeyError, ValueError):
        for path, node in saved.items():
            if node is None:
                nodes.pop(path, None)
            else:
                nodes[path] = node
        return False
    return True


@dataclass(frozen=True, slots=True)
class _CreateSequential:
    """Internal op: a :class:`Create` whose name gets the parent's sequence suffix."""

    path: str
    data: bytes
    ephemeral: bool


_InternalOp = Op | _CreateSequential


@dataclass(slots=True, eq=False)
class _Staged(_Fields):
    """A mutable copy of one node's fields, private to a transaction being validated.

    It counts the children instead of copying their names: validating a
    transaction costs nothing per child.
    """

    nchildren: int = 0

    def stat(self) -> Stat:
        return Stat(self.version, self.cversion, self.owner, self.nchildren)


def _check_version(path: str, actual: int, expected: int) -> None:
    if expected != -1 and actual != expected:
        raise BadVersionError(
            f"version mismatch at {path!r}: expected version {expected}, node is at {actual}"
        )


class _Stage:
    """A copy-on-write view of the tree that a transaction is validated against.

    Each op sees the effects of the earlier ops of the same transaction. The
    live tree is not touched; validation produces the resolved operations to
    apply in memory (``mem_ops``) and to log (``disk_ops``, which leave out
    ephemeral nodes and keep only their parents' bookkeeping).
    """

    def __init__(self, nodes: dict[str, _Node], session_id: int) -> None:
        self._nodes = nodes
        self._session_id = session_id
        self._over: dict[str, _Staged | None] = {}
        self.mem_ops: list[_LogOp] = []
        self.disk_ops: list[_LogOp] = []

    def _get(self, path: str) -> _Staged | None:
        try:
            return self._over[path]
        except KeyError:
            pass
        node = self._nodes.get(path)
        staged = None
        if node is not None:
            staged = _Staged(
                node.data,
                node.owner,
                node.version,
                node.cversion,
                node.seq,
                node.neph,
                nchildren=len(node.children),
            )
        self._over[path] = staged
        return staged

    def run(self, op: _InternalOp) -> str | Stat | None:
        """Validate and stage one op; return its multi result or raise."""
        if isinstance(op, Create):
            return self._create(op.path, op.data, op.ephemeral, sequential=False)
        if isinstance(op, _CreateSequential):
            return self._create(op.path, op.data, op.ephemeral, sequential=True)
        if isinstance(op, SetData):
            return self._set(op.path, op.data, op.version)
        if isinstance(op, Delete):
            self._delete(op.path, op.version)
            return None
        self._check(op.path, op.version)
        return None

    def _create(self, path: str, data: bytes, ephemeral: bool, *, sequential: bool) -> str:
        if path == "/" and not sequential:
            raise NodeExistsError("cannot create '/': node already exists")
        parent = parent_path(path)
        p = self._get(parent)
        if p is None:
            raise NoNodeError(f"cannot create {path!r}: parent node {parent!r} does not exist")
        if p.owner:
            raise StoreError(
                f"cannot create {path!r}: parent {parent!r} is an ephemeral node, "
                "and ephemeral nodes cannot have children"
            )
        if sequential:
            path = f"{path}{p.seq:0{_SEQ_DIGITS}d}"
            p.seq += 1
        if self._get(path) is not None:
            raise NodeExistsError(f"cannot create {path!r}: node already exists")
        owner = self._session_id if ephemeral else 0
        p.cversion += 1
        p.nchildren += 1
        if owner:
            p.neph += 1
        self._over[path] = _Staged(data, owner)
        op = _LogCreate(path, data, owner, p.cversion, p.seq, p.neph)
        self.mem_ops.append(op)
        if owner:
            self.disk_ops.append(_LogMeta(parent, p.cversion, p.seq, p.neph))
        else:
            self.disk_ops.append(op)
        return path

    def _set(self, path: str, data: bytes, version: int) -> Stat:
        s = self._get(path)
        if s is None:
            raise NoNodeError(f"cannot set {path!r}: no node at that path")
        _check_version(path, s.version, version)
        s.data = data
        s.version += 1
        op = _LogSet(path, data, s.version)
        self.mem_ops.append(op)
        if not s.owner:
            self.disk_ops.append(op)
        return s.stat()

    def _delete(self, path: str, version: int) -> None:
        if path == "/":
            raise StoreError("cannot delete the root node '/'")
        s = self._get(path)
        if s is None:
            raise NoNodeError(f"cannot delete {path!r}: no node at that path")
        _check_version(path, s.version, version)
        if s.nchildren:
            raise NotEmptyError(
                f"cannot delete {path!r}: it has {s.nchildren} children "
                "(delete them first or pass recursive=True)"
            )
        parent = parent_path(path)
        p = self._get(parent)
        assert p is not None  # a node's parent always exists
        p.cversion += 1
        p.nchildren -= 1
        if s.owner:
            p.neph -= 1
        self._over[path] = None
        op = _LogDelete(path, p.cversion, p.seq, p.neph)
        self.mem_ops.append(op)
        if s.owner:
            self.disk_ops.append(_LogMeta(parent, p.cversion, p.seq, p.neph))
        else:
            self.disk_ops.append(op)

    def _check(self, path: str, version: int) -> None:
        s = self._get(path)
        if s is None:
            raise NoNodeError(f"check of {path!r} failed: no node at that path")
        _check_version(path, s.version, version)
