"""Durable files: the file-system helpers the partition log and the embedded store share.

Its one job is to say how a change to a file or a directory becomes durable,
once for the whole code base: :func:`fsync_dir` (a creation, rename or
deletion in a directory survives a crash only once the directory is
synced), :func:`fdatasync` (an append), :func:`write_file` (new contents,
synced), :func:`rename_durably` (the second half of write-then-rename),
:func:`mkdir_durably` (a directory and every parent created on the way), and
:func:`lock_directory` (two processes must never write one directory). All
block: call them from a worker thread. This module is a leaf: it imports
nothing from trio_coord.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = [
    "fdatasync",
    "fsync_dir",
    "lock_directory",
    "mkdir_durably",
    "rename_durably",
    "write_file",
]


def lock_directory(lock_path: Path) -> int:
    """Lock ``lock_path`` (created if missing) and return its descriptor; close it to unlock.

    The lock is an exclusive, non-blocking ``flock`` (released when the
    process dies, however it dies); the owner's pid is written in the file
    for people. Raises :class:`BlockingIOError` if another process holds the
    lock; the caller turns that into its own error saying what to do.
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


def fsync_dir(path: Path) -> None:
    """Make file creations, renames and deletions in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fdatasync(fd: int) -> None:
    """Make what was written to ``fd`` durable (``fdatasync``: it also flushes a changed
    file size, which is all an append needs; ``fsync`` where there is none)."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


def write_file(path: Path, data: bytes) -> None:
    """Replace the contents of ``path`` with ``data`` (created if missing) and fsync it.

    The file's directory entry is not synced: a new file needs
    :func:`fsync_dir` of its directory (or :func:`rename_durably`) too.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_durably(source: Path, target: Path) -> None:
    """Rename ``source`` over ``target`` atomically, then sync the directory.

    With :func:`write_file` of ``source`` first, this is write-then-rename: a
    crash leaves either the old contents of ``target`` or the new, whole.
    Both paths must be in one directory.
    """
    os.replace(source, target)
    fsync_dir(target.parent)


def mkdir_durably(path: Path) -> None:
    """Create directory ``path`` and any missing parents, durably.

    The parent of each directory created is synced, and so is the parent of
    ``path`` even if nothing was missing: an earlier attempt may have
    created it and crashed before syncing.
    """
    missing = [d for d in (path, *path.parents) if not d.is_dir()]
    path.mkdir(parents=True, exist_ok=True)
    for directory in reversed(missing or [path]):
        fsync_dir(directory.parent)
