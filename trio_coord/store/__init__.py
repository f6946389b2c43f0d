"""Metadata stores: the ZooKeeper-shaped interface and its backends.

This package is where the coordinator keeps its durable metadata (group
membership, generations, assignments, committed offsets). It re-exports the
backend-neutral interface from :mod:`trio_coord.store.base` (the
:class:`MetadataStore` ABC, its multi-op types, :class:`Stat`, the error
hierarchy and the path helpers) together with the backends that implement
it: the embedded, single-process file store (:class:`EmbeddedStore`, opened
with :func:`open_embedded_store`) and the ZooKeeper store for a cluster
(:class:`ZooKeeperStore`, opened with :func:`open_zookeeper_store` from a
``zk://host:port,.../chroot`` URL that :func:`parse_zk_url` reads). Both
report their session through :class:`SessionState`.
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
    SessionExpiredError,
    SessionState,
    SetData,
    Stat,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    parent_path,
    validate_path,
)
from .embedded import EmbeddedStore, open_embedded_store
from .zookeeper import ZooKeeperStore, open_zookeeper_store, parse_zk_url

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
    "SessionExpiredError",
    "SessionState",
    "SetData",
    "Stat",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "ZooKeeperStore",
    "open_embedded_store",
    "open_zookeeper_store",
    "parent_path",
    "parse_zk_url",
    "validate_path",
]
