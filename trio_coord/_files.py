"""One file-system helper shared by the stores of the broker: locking a directory.

The embedded metadata store and the partition log each own a directory that
two processes must never write at once. :func:`lock_directory` takes an
exclusive, non-blocking ``flock`` on a lock file inside it (released when the
process dies, however it dies) and writes the owner's pid there for people.
This module is a leaf: it imports nothing from trio_coord.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["lock_directory"]


def lock_directory(lock_path: Path) -> int:
    """Lock ``lock_path`` (created if missing) and return its descriptor; close it to unlock.

    Raises :class:`BlockingIOError` if another process holds the lock; the
    caller turns that into its own error saying what to do.
    """
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return fd
