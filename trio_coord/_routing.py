"""Where requests and records go, without Trio: bootstrap lists to addresses, keys to partitions.

Both the Trio clients and Spark's blocking client need these two rules, and
Spark's Python workers must not import Trio or the Trio clients to get them
(see :mod:`trio_coord._lazy`), so they live here; :mod:`trio_coord.client`
re-exports them.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

__all__ = ["Address", "parse_bootstrap", "partition_for_key"]

Address = tuple[str, int]


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[Address]:
    """Parse ``"h1:p1,h2:p2"`` (or a list of ``"h:p"``) into addresses.

    Raises ValueError with the offending entry if one is not ``host:port``.
    """
    entries = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses: list[Address] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"bootstrap entry {entry!r} is not host:port (for example 127.0.0.1:9092)"
            )
        addresses.append((host.strip("[]"), int(port)))
    if not addresses:
        raise ValueError("the bootstrap list is empty; give at least one broker as host:port")
    return addresses


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition a keyed record goes to: CRC-32 of the key modulo the partition count."""
    return zlib.crc32(key) % partitions
