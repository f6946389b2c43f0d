"""A broker in a background thread, for Spark programs that want one without a separate process.

Spark's Python workers are processes of their own, so they reach a broker
over TCP whatever runs it. ``with background_broker() as bootstrap:`` runs
:func:`trio_coord.open_broker` under ``trio.run`` in a daemon thread,
returns once it listens, and stops it (gracefully, through its Trio token) on
the way out; an error inside the broker thread is raised there too. It is
what the example pipeline, the docs and the benchmark use.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from ..broker import open_broker

__all__ = ["background_broker"]


@contextmanager
def background_broker(
    data_dir: str | os.PathLike[str] | None = None, **settings: Any
) -> Iterator[str]:
    """Run a broker on 127.0.0.1 (a free port) in a thread; yields its ``host:port``.

    ``data_dir=None`` keeps nothing after it stops; ``settings`` are
    :class:`~trio_coord.BrokerConfig` fields, as for ``open_broker``.
    """
    started: queue.Queue[tuple[str, trio.lowlevel.TrioToken, trio.Event] | BaseException] = (
        queue.Queue()
    )
    failure: list[BaseException] = []

    async def serve() -> None:
        stop = trio.Event()
        try:
            async with open_broker(data_dir, **settings) as broker:
                started.put((broker.bootstrap, trio.lowlevel.current_trio_token(), stop))
                await stop.wait()
        except BaseException as exc:
            started.put(exc)
            raise

    def run() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="trio_coord broker", daemon=True)
    thread.start()
    first = started.get()
    if isinstance(first, BaseException):
        thread.join()
        raise first
    bootstrap, token, stop = first
    try:
        yield bootstrap
    finally:
        try:
            trio.from_thread.run_sync(stop.set, trio_token=token)
        except trio.RunFinishedError:
            pass
        thread.join()
    if failure:
        raise failure[0]
