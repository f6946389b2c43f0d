"""The one place where kazoo's threads meet Trio.

kazoo runs a connection thread and two callback threads of its own. Nothing
of trio_coord may run on them, and nothing on the Trio thread may block on
them, so every crossing goes through :class:`KazooBridge`:

- requests: :meth:`KazooBridge.submit` issues a kazoo ``*_async`` call from
  the Trio thread (it only queues the request) and returns a :class:`Pending`;
  kazoo completes it on its thread, the completion is handed to the Trio
  thread with ``TrioToken.run_sync_soon``, and ``await pending.result()``
  returns the value or raises kazoo's exception. Submitting many requests
  before awaiting any pipelines them on the one connection.
- watches: :meth:`KazooBridge.callback` wraps a function of the Trio thread as
  a kazoo watch callback; kazoo's thread only schedules it.
- connection states: kazoo's listener (called on its connection thread) puts
  each :class:`StateChange` into a memory channel, :attr:`KazooBridge.state_changes`,
  in order.
- blocking calls (starting the client, stopping and closing it) run in
  ``trio.to_thread.run_sync``.

The bridge also fences a dead session: kazoo silently opens a *new* session
after the old one expired, and a request queued at that moment would run on
it. The listener sets a flag under a lock when the session is lost, and
:meth:`KazooBridge.submit` checks it under the same lock while it queues the
request, so no request is ever queued after the loss (those queued before it
are failed by kazoo with ``SessionExpiredError``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import SessionExpiredError
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

__all__ = ["KazooBridge", "Pending", "StateChange"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StateChange:
    """One connection-state change of the kazoo client, as its listener saw it.

    ``state`` is kazoo's ``KazooState`` value (``"CONNECTED"``, ``"SUSPENDED"``
    or ``"LOST"``); ``session_id`` is the session's id for ``CONNECTED``, else
    None.
    """

    state: str
    session_id: int | None = None


class Pending:
    """A kazoo request in flight; ``await result()`` for its outcome on the Trio thread."""

    __slots__ = ("_done", "_outcome")

    def __init__(self) -> None:
        """An incomplete request; :class:`KazooBridge` completes it."""
        self._done = trio.Event()
        self._outcome: Any = None

    def _complete(self, async_result: Any) -> None:
        """Record kazoo's finished ``IAsyncResult`` (runs on the Trio thread)."""
        self._outcome = async_result
        self._done.set()

    async def result(self) -> Any:
        """Wait for the reply; return its value or raise kazoo's exception.

        Cancelling the wait abandons the reply, not the request: ZooKeeper may
        still apply it.
        """
        await self._done.wait()
        exc = self._outcome.exception
        if exc is not None:
            # kazoo fails every queued request with the same exception object
            # on a disconnect; raise a copy so tracebacks do not get mixed up.
            try:
                fresh = type(exc)(*exc.args)
            except Exception:  # pragma: no cover - an exception with a strange __init__
                fresh = exc
            raise fresh
        return self._outcome.value


class KazooBridge:
    """A kazoo client, and the only ways to use it from Trio (see the module docstring).

    Create it on the Trio thread. ``client`` is the :class:`KazooClient` for
    building requests (``bridge.submit(bridge.client.get_async, path)``) and
    transactions; never call its blocking methods, nor pass it a callback
    that :meth:`callback` did not wrap.
    """

    def __init__(
        self,
        hosts: str,
        *,
        session_timeout: float,
        max_reconnect_delay: float = 1.0,
        auth: str | None = None,
    ) -> None:
        """Make (not start) a client for ``hosts`` asking for ``session_timeout`` seconds.

        The client reconnects forever, waiting at most ``max_reconnect_delay``
        seconds between attempts. ``auth`` (``user:password``) logs the session in
        with ZooKeeper's digest scheme and gives every node it creates an ACL
        that lets only that user read or write it.
        """
        self._token = trio.lowlevel.current_trio_token()
        secured: dict[str, object] = {}
        if auth is not None:
            user, sep, password = auth.partition(":")
            if not sep or not user or not password:
                raise ValueError("ZooKeeper auth must be user:password (--zk-auth)")
            secured = {
                "auth_data": [("digest", auth)],
                "default_acl": [make_digest_acl(user, password, all=True)],
            }
        self.client = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, backoff=2, max_jitter=0.3, max_delay=max_reconnect_delay
            ),
            **secured,
        )
        send, receive = trio.open_memory_channel[StateChange](math.inf)
        self._state_send = send
        self.state_changes: trio.MemoryReceiveChannel[StateChange] = receive
        """Every connection-state change, in order (read by one task)."""
        self._lock = threading.Lock()
        self._lost = False
        self._stopped: trio.Event | None = None
        self.client.add_listener(self._listener)

    # -- kazoo's threads -> Trio ---------------------------------------------------

    def _soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the Trio thread soon (callable from any thread)."""
        try:
            self._token.run_sync_soon(self._guarded, fn, args)
        except trio.RunFinishedError:
            pass  # Trio is gone: nobody is waiting any more

    @staticmethod
    def _guarded(fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        # An exception escaping a run_sync_soon callback would crash the Trio run.
        try:
            fn(*args)
        except Exception:
            logger.exception("kazoo bridge: callback %r failed", fn)

    def _listener(self, state: str) -> None:
        """kazoo's state listener (runs on kazoo's connection thread; must not block)."""
        session_id = None
        if state == KazooState.LOST:
            with self._lock:
                self._lost = True
        elif state == KazooState.CONNECTED:
            client_id = self.client.client_id
            session_id = client_id[0] if client_id else None
        self._soon(self._deliver_state, StateChange(state, session_id))

    def _deliver_state(self, change: StateChange) -> None:
        try:
            self._state_send.send_nowait(change)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the reader has finished: the store is closed

    def callback(self, fn: Callable[[Any], None]) -> Callable[[Any], None]:
        """Wrap ``fn`` (a function of the Trio thread) as a kazoo watch callback.

        The wrapper only schedules ``fn(event)`` on the Trio thread. Make it
        once and reuse it: kazoo keeps one registration per path and callback.
        """

        def on_kazoo_thread(event: Any) -> None:
            self._soon(fn, event)

        return on_kazoo_thread

    # -- Trio -> kazoo -------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """Whether the session has been lost (expired, or the client stopped)."""
        return self._lost

    def submit(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Pending:
        """Issue ``method(*args, **kwargs)``, a kazoo ``*_async`` call, without waiting.

        Raises kazoo's ``SessionExpiredError`` if the session is already lost,
        and whatever kazoo raises at once for bad arguments.
        """
        pending = Pending()
        with self._lock:
            if self._lost:
                raise SessionExpiredError("the ZooKeeper session is lost")
            async_result = method(*args, **kwargs)

        def on_done(result: Any) -> None:
            self._soon(pending._complete, result)

        async_result.rawlink(on_done)
        return pending

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Issue a kazoo ``*_async`` call and wait for its outcome (see :meth:`submit`)."""
        return await self.submit(method, *args, **kwargs).result()

    # -- life cycle (blocking kazoo calls, in a worker thread) ---------------------

    async def start(self) -> None:
        """Start connecting; :attr:`state_changes` reports ``CONNECTED`` once connected."""
        await trio.to_thread.run_sync(self.client.start_async)

    async def stop(self) -> None:
        """Close the session (its ephemeral nodes go) and free the client; idempotent.

        Waits for kazoo's threads to finish (a few seconds at most when the
        servers are unreachable). Concurrent callers all wait for the one stop.
        """
        if self._stopped is not None:
            await self._stopped.wait()
            return
        self._stopped = trio.Event()
        try:
            await trio.to_thread.run_sync(self._stop_blocking)
        finally:
            self._stopped.set()

    def _stop_blocking(self) -> None:
        for step in (self.client.stop, self.client.close):
            try:
                step()
            except Exception:
                logger.warning("stopping the kazoo client: %s failed", step.__name__, exc_info=True)
