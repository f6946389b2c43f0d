"""Metadata stores: the ZooKeeper-shaped interface and its backends.

This package is where the coordinator keeps its durable metadata (group
membership, generations, assignments, committed offsets). It re-exports the
backend-neutral interface from :mod:`trio_coord.store.base` (the
:class:`MetadataStore` ABC, its multi-op types, :class:`Stat`, the error
hierarchy and the path helpers) together with the backends that implement
it: today the embedded, single-process file store (:class:`EmbeddedStore`,
opened with :func:`open_embedded_store`); a ZooKeeper-backed one is meant to
be exported next to it.
"""

from .base import (
    BadVersionError,
    Check,
    Create,
    Delete,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Op,
    SetData,
    Stat,
    StoreClosedError,
    StoreError,
    parent_path,
    validate_path,
)
from .embedded import EmbeddedStore, open_embedded_store

__all__ = [
    "BadVersionError",
    "Check",
    "Create",
    "Delete",
    "EmbeddedStore",
    "MetadataStore",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "Op",
    "SetData",
    "Stat",
    "StoreClosedError",
    "StoreError",
    "open_embedded_store",
    "parent_path",
    "validate_path",
]
