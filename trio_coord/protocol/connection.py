"""A full-duplex, multiplexed connection: both ends send requests, matched by id.

The coordinator pushes StopFetchers and StartFetchers to members over the same
socket the members use for JoinGroup and Heartbeat, so neither side is only a
client. A :class:`Connection` owns one stream and runs one reader task
(:meth:`Connection.serve`): responses wake the :meth:`Connection.request` call
waiting on their correlation id; requests go to a :class:`RequestHandler`,
answered inline when the handler can do so at once (``handle_now``: a
heartbeat is O(1) and spawns no task) and otherwise in a handler task, at most
``max_in_flight`` at a time (the reader stops reading beyond that, which is
the per-connection memory bound). Writes are serialized by one lock.
A broker holds thousands of idle connections, so an idle one is kept small:
the broker's connections share one codec, and the write lock's parking lot,
the in-flight limit's wait and the closed event exist only once something
waits on them. Given a :class:`~._parking.Parking` service (a broker's plain
TCP connections), an idle connection goes further and gives up its reader
task: :meth:`Connection.serve` returns with the connection *parked*, the
service answers what needs no task (:meth:`Connection.wake_parked`) and
runs the reader again for the rest; the connection is the same object
throughout, and :meth:`Connection.request` works on it either way.
Optionally (a broker's connections) each request is charged its *cost* in
bytes (its frame, plus what its answer may hold: ``RequestHandler.cost``)
against a per-connection :class:`~.budget.ByteBudget` and a shared one,
from when it is read until its answer is written; the reader waits while
either is spent, so a peer that does not read its answers stops being read
(Kafka mutes such a channel) and memory stays bounded. A
protocol violation (a frame too large, truncated, undecodable or of an
unknown type) is answered with a :class:`~.messages.Goodbye` naming the error
and closes this connection only. When the connection ends, every waiting
request fails with :class:`~.errors.ConnectionClosedError` and in-flight
handler tasks are cancelled.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from .._aio import unwrap_lone_exception
from ._parking import Resume
from .budget import ByteBudget
from .errors import (
    ConnectionClosedError,
    CoordError,
    ErrorCode,
    FrameTooLargeError,
    UnknownServerError,
    UnsupportedMessageError,
    error_for,
)
from .framing import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, SMALL_FRAME, FrameCodec, FrameReader
from .messages import Goodbye, Request, RequestBody, Response, ResponseBody

if TYPE_CHECKING:
    from ._parking import Parking

__all__ = [
    "Connection",
    "RequestHandler",
    "connect_tcp",
    "open_connection",
    "os_reason",
    "serving",
]

log = logging.getLogger(__name__)

_GOODBYE_GRACE = 1.0
_RECEIVE_CHUNK = 64 * 1024
"""The most a parked connection's wake-up reads."""
_PARKED_FRAMES = 32
"""The most frames one wake-up of a parked connection answers (the rest: its reader's)."""
_PARK_LINGER = 0.1
"""How long after its last request that needed a handler task a connection with nothing
in flight waits before its reader parks it (one whose requests are all answered inline,
a member joining and heartbeating, parks at once: the parking service answers those)."""
_PARKED_ANSWER_BYTES = 64 * 1024
"""Answers one wake-up encodes before it leaves the rest to the reader, which writes each
before it reads on: a small request may have a large answer (Metadata of every topic),
and a peer that does not read them must hold one, not 32 (times every socket woken)."""


class RequestHandler:
    """Answers the requests a peer sends on a connection.

    Override :meth:`handle`, and :meth:`handle_now` for requests that can be
    answered synchronously. Raise a :class:`~.errors.CoordError` to answer
    with its code and message; any other exception is a bug, logged and
    answered with UNKNOWN_SERVER_ERROR.
    """

    def handle_now(self, body: RequestBody) -> ResponseBody | None:
        """Answer ``body`` at once, or return None to have :meth:`handle` called in a task."""
        return None

    def cost(self, body: RequestBody) -> int:
        """Bytes the answer to ``body`` may hold beyond its frame (charged while it is handled)."""
        return 0

    async def handle(self, body: RequestBody) -> ResponseBody:
        """Answer ``body``; may wait (it runs in its own task)."""
        raise UnsupportedMessageError(f"{type(body).__name__} is not accepted by this peer")

    def connection_lost(self) -> None:
        """Called once when the connection has ended, from the reader task."""


class _Waiter:
    __slots__ = ("done", "error", "response")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: Response | None = None
        self.error: CoordError | None = None


class _Pushed:
    """A pushed request's answer goes to a callback: no task waits (:meth:`Connection.push`)."""

    __slots__ = ("callback", "context", "corr_id")

    def __init__(self, corr_id: int, callback: Answered, context: Any) -> None:
        self.corr_id = corr_id
        self.callback = callback
        self.context = context


Answered = Callable[[Any, ResponseBody | None, CoordError | None], None]
"""Called once with a push's ``context``, then its answer body, or the error it was
answered with (a :class:`~.errors.CoordError`, ConnectionClosedError if the connection
ended)."""


class Connection:
    """One framed, multiplexed connection over a Trio stream.

    Run :meth:`serve` in a nursery (``await nursery.start(conn.serve)``), then
    call :meth:`request` from any task. ``name`` is used in logs and errors;
    ``peer`` is the remote address when known.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        handler: RequestHandler | None = None,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int = 64,
        name: str = "",
        max_bytes: int | None = None,
        shared: ByteBudget | None = None,
        codec: FrameCodec | None = None,
        parking: Parking | None = None,
    ) -> None:
        self._stream = stream
        self.handler = handler if handler is not None else RequestHandler()
        # (A codec is stateless between calls: a broker's connections share one.)
        self._codec = codec if codec is not None else FrameCodec(max_frame_size)
        self._reader = FrameReader(stream, max_frame_size, shared)
        self._sending = False  # the write lock: held while a frame is being sent
        self._send_queue: trio.lowlevel.ParkingLot | None = None  # (made when contended)
        self._max_in_flight = max_in_flight
        self._in_flight = 0  # handler tasks running
        self._slot_freed: trio.Event | None = None  # (made when the reader waits for one)
        self._idle_wait: trio.CancelScope | None = None  # (the reader's, while tasks run)
        self._last_corr_id = 0
        self._waiters: dict[int, _Waiter | _Pushed] = {}
        self._pushed: _Pushed | None = None  # (one push owed: kept here, not in _waiters)
        self._is_closed = False
        self._closed: trio.Event | None = None  # (made when someone waits for the close)
        self._close_reason: CoordError | None = None
        self.peer = _peer_name(stream)
        self.name = name or self.peer
        self._own = None if max_bytes is None else ByteBudget(max_bytes)
        self._shared = shared
        self.last_active = trio.current_time()
        """When a frame last arrived or an answer was last written (for idle timeouts)."""
        self._task_ended = -math.inf
        """When the last handler task ended (a connection in use lingers before parking)."""
        self.principal = "User:ANONYMOUS"
        """Who the peer proved to be (a broker sets it once the login is done)."""
        # Only a plain TCP socket can be parked (a TLS stream buffers bytes of its own).
        self._parking = parking if isinstance(stream, trio.SocketStream) else None
        self._parked = False  # no reader task: the parking service watches the socket
        self.on_closed: Callable[[], None] | None = None
        """Called once, after :meth:`RequestHandler.connection_lost`, when the connection
        has ended (an owner's bookkeeping; a parked connection ends without its task)."""

    @property
    def max_frame_size(self) -> int:
        """The largest frame this connection sends or accepts."""
        return self._reader.max_frame_size

    @property
    def idle(self) -> bool:
        """True when nothing is in flight either way (no request handled, none awaited)."""
        return (
            not self._waiters and self._pushed is None and (self._own is None or not self._own.used)
        )

    @property
    def receiving_since(self) -> float | None:
        """When the frame being received began to arrive (None: between frames)."""
        return self._reader.started

    @property
    def charged(self) -> int:
        """Bytes of this connection's requests being handled and answers not yet written."""
        return 0 if self._own is None else self._own.used

    def __repr__(self) -> str:
        return f"<Connection {self.name}{' closed' if self.closed else ''}>"

    @property
    def closed(self) -> bool:
        """True once the connection has ended (for any reason)."""
        return self._is_closed

    async def wait_closed(self) -> None:
        """Return when the connection has ended."""
        if self._is_closed:
            await trio.lowlevel.checkpoint()
            return
        if self._closed is None:
            self._closed = trio.Event()
        await self._closed.wait()

    # -- outgoing ----------------------------------------------------------

    async def request(self, body: RequestBody) -> ResponseBody | None:
        """Send a request and return the response body.

        Raises the typed :class:`~.errors.CoordError` for the error code the
        peer answered with, or :class:`~.errors.ConnectionClosedError` if the
        connection ends first. Bound the wait with a cancel scope
        (``trio.move_on_after``); cancellation forgets the request.
        """
        if self._close_reason is not None:
            raise type(self._close_reason)(str(self._close_reason))
        self._last_corr_id = corr_id = self._last_corr_id + 1
        waiter = _Waiter()
        self._waiters[corr_id] = waiter
        try:
            await self._send(Request(corr_id, body))
            await waiter.done.wait()
        finally:
            del self._waiters[corr_id]
            if not self._waiters:  # (an emptied dict keeps its table; an idle one has none)
                self._waiters = {}
        if waiter.error is not None:
            raise waiter.error
        response = waiter.response
        assert response is not None
        if response.error != ErrorCode.NONE:
            raise error_for(response.error, response.message)
        return response.body

    def push(
        self, body: RequestBody, on_answer: Answered, context: Any = None
    ) -> tuple[int, Callable[[], Awaitable[None]] | None]:
        """Send a request that no task waits on: ``on_answer(context, body, error)`` is
        called once.

        For a coordinator pushing to thousands of members at once (a
        rebalance's StartFetchers): a task and a waiting event per member
        would be the largest part of the cost. The frame is written at once
        with one non-blocking write when the connection is a plain socket
        that nobody else is writing to; otherwise (or if the socket took only
        part of it) the second item returned is a coroutine function the
        caller must run in a task of its own to send the rest. The first is
        the request's correlation id: :meth:`forget` it to stop waiting (the
        callback is then never called). ``on_answer`` runs in whichever task
        reads the answer (the reader, the parking service, or the one that
        found the connection closed): it must not block nor raise. One callback
        and a context per push, rather than a closure per push, keeps what a
        rebalance allocates per member small (what it frees, it fragments).
        Raises
        ConnectionClosedError if the connection has ended, and the error of
        encoding (FrameTooLargeError) before anything is sent.
        """
        if self._close_reason is not None:
            raise type(self._close_reason)(str(self._close_reason))
        corr_id = self._last_corr_id + 1
        data = self._codec.encode(Request(corr_id, body))
        self._last_corr_id = corr_id
        pushed = _Pushed(corr_id, on_answer, context)
        if self._pushed is None:
            self._pushed = pushed  # (the usual case: no dict made for one push)
        else:
            self._waiters[corr_id] = pushed
        stream = self._stream
        if self._sending or not isinstance(stream, trio.SocketStream):
            return corr_id, functools.partial(self._send_pushed, data, locked=False)
        self._sending = True
        try:
            sent = os.write(stream.socket.fileno(), data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:  # broken: as a failed send_all (the callback is told)
            self._unlock_sending()
            self._fail(ConnectionClosedError(f"connection to {self.name} lost: {exc}"))
            return corr_id, None
        if sent == len(data):
            self._unlock_sending()
            return corr_id, None
        # (The lock stays taken: the rest goes out first, before anything else.)
        rest = functools.partial(self._send_pushed, data[sent:], locked=True, begun=sent > 0)
        return corr_id, rest

    async def _send_pushed(
        self, data: bytes | bytearray, *, locked: bool, begun: bool = False
    ) -> None:
        """Send (the rest of) a pushed frame; a failure reaches its callback, not the caller.

        ``locked``: the write lock is held for it already; ``begun``: part of the
        frame is on the wire. A socket that took nothing at once (its buffer
        full: a peer slow to read) is waited for before anything is sent, so
        that a cancellation meanwhile (a rebalance restarting) leaves nothing
        of the frame on the wire and the connection whole.
        """
        if not locked:
            await self._lock_sending()  # (cancelled here: nothing was sent)
        try:
            if locked and not begun and not self._is_closed:
                assert isinstance(self._stream, trio.SocketStream)
                await trio.lowlevel.wait_writable(self._stream.socket)
            # The rest of a frame begun: cancelled now, the connection closes.
            await self._write(data, begun=begun)
        except (ConnectionClosedError, trio.ClosedResourceError):
            pass  # (the connection failed: every waiter, this one too, was told)
        finally:
            self._unlock_sending()

    def forget(self, corr_id: int) -> None:
        """Stop waiting for the answer to a pushed request (:meth:`push`)."""
        if self._pushed is not None and self._pushed.corr_id == corr_id:
            self._pushed = None
        elif self._waiters.pop(corr_id, None) is not None and not self._waiters:
            self._waiters = {}  # (an emptied dict keeps its table; an idle one has none)

    async def _send(self, frame: Request | Response | Goodbye) -> None:
        if self._sending:
            await self._lock_sending()
        else:  # (uncontended: no coroutine; cancellation is checked just below)
            self._sending = True
        try:
            await self._write(self._codec.encode(frame))
        finally:
            self._unlock_sending()

    async def _write(self, data: bytes | bytearray, *, begun: bool = False) -> None:
        """Send ``data`` whole; the caller holds the write lock.

        ``begun``: ``data`` is the rest of a frame partly sent already, so a
        cancellation even before its first byte leaves the peer half a frame
        (the connection is closed then).
        """
        # An uncontended lock lets a cancelled task through; send_all would raise
        # Cancelled before its first byte, and the handler below, unable to tell,
        # would close a healthy connection (a routine rebalance restart did so to
        # every member it was pushing to). Cancelled here is certainly clean.
        if not begun:
            await trio.lowlevel.checkpoint_if_cancelled()
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._fail(ConnectionClosedError(f"connection to {self.name} lost: {exc}"))
            raise ConnectionClosedError(f"connection to {self.name} lost") from None
        except trio.Cancelled:
            # Part of the frame may be on the wire: the peer would read garbage next.
            self._fail(ConnectionClosedError(f"a send to {self.name} was interrupted"))
            await self._close_stream()
            raise

    async def _lock_sending(self) -> None:
        """Take the write lock, first come first served (a ``trio.Lock``, made cheap).

        Uncontended (nearly always), it is a flag; a parking lot is made the
        first time a second writer must wait, and the lock is handed straight
        to the first waiter on release.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._sending:
            self._sending = True
            return
        if self._send_queue is None:
            self._send_queue = trio.lowlevel.ParkingLot()
        await self._send_queue.park()  # (woken holding the lock: see _unlock_sending)

    def _unlock_sending(self) -> None:
        if self._send_queue:
            self._send_queue.unpark()  # the lock passes to the first waiter
        else:
            self._sending = False

    # -- the reader --------------------------------------------------------

    async def serve(
        self,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        resume: Resume | None = None,
    ) -> None:
        """Read frames until the peer closes or breaks the protocol, then close.

        Returns normally when the connection ends; it never raises for the
        peer's mistakes or disconnects. With a parking service, it also
        returns when the connection is idle and was parked (:attr:`parked`):
        the service then watches the socket and runs this again, with
        ``resume`` (what it read and did not finish), when a task is needed.
        """
        parked = False  # (this task's own answer: a parked connection may be revived at once)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                try:
                    if resume is None or await self._resume(resume, nursery):
                        parked = await self._read_loop(nursery)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            if not parked:
                self._discharge((0, self._reader.taken))  # a frame cut short, or undecodable
                self._reader.taken = 0
                self._fail(ConnectionClosedError(f"connection to {self.name} closed"))
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(self._stream)
                self._ended()

    def _ended(self) -> None:
        """Tell the handler, then the owner, that the connection has ended (once)."""
        try:
            self.handler.connection_lost()
        except Exception:  # a bug in the handler must not mask the close
            log.exception("connection_lost handler failed for %s", self.name)
        on_closed, self.on_closed = self.on_closed, None
        if on_closed is not None:
            try:
                on_closed()
            except Exception:
                log.exception("closing %s: its owner's bookkeeping failed", self.name)

    @property
    def parked(self) -> bool:
        """True while the connection is idle with no reader task (see ``_parking``)."""
        return self._parked

    def _parkable(self) -> bool:
        """True when the reader may leave the socket to the parking service: no partial
        frame nor budget held for one, no handler task running, not closed."""
        return (
            self._parking is not None
            and not self._in_flight
            and not self._is_closed
            and self._reader.between_frames
        )

    async def _resume(self, resume: Resume, nursery: trio.Nursery) -> bool:
        """Finish what the parking service began: answers to send, a request to run.

        False if the connection broke meanwhile.
        """
        charge = resume.charge  # (the request's, given back here unless its task runs)
        try:
            if resume.out:
                if not resume.locked:  # (locked: the parking service kept the lock for us)
                    await self._lock_sending()
                try:
                    await self._write(resume.out)
                finally:
                    self._unlock_sending()
                self.last_active = trio.current_time()
            if resume.request is None or self._is_closed:
                return not self._is_closed
            self._in_flight += 1  # (0 before: the connection was parked)
            nursery.start_soon(self._handle_in_task, resume.request, charge)
            charge = (0, 0)  # the task gives it back
            return True
        except ConnectionClosedError:
            return False
        finally:
            self._discharge(resume.out_charge)
            self._discharge(charge)

    async def _read_loop(self, nursery: trio.Nursery) -> bool:
        """Read and dispatch frames; True if the connection was parked, False if it ended."""
        while True:
            linger = False
            if self._parkable():
                assert self._parking is not None
                # A connection in use (a producer, a fetching consumer: a request that
                # needs a task every few milliseconds) would park and be revived for each
                # one; it parks _PARK_LINGER after its last such request was answered.
                linger = trio.current_time() < self._task_ended + _PARK_LINGER
                if not linger and self._parking.park(self):
                    return True
            if self._is_closed:
                return False
            try:
                if linger or (
                    self._in_flight and self._parking is not None and self._reader.between_frames
                ):
                    # Idle but for handler tasks (the last to finish wakes this wait), or
                    # for the linger (its end does): the connection then parks without
                    # waiting for the peer's next frame.
                    with trio.CancelScope() as idle:
                        if linger:
                            idle.deadline = self._task_ended + _PARK_LINGER
                        self._idle_wait = idle
                        body = await self._reader.read_frame()
                    self._idle_wait = None
                    if idle.cancelled_caught:
                        continue  # (nothing was lost: read_frame can be taken up again)
                else:
                    body = await self._reader.read_frame()
                if body is None:
                    return False
                frame = self._codec.decode(body)
            except CoordError as exc:
                log.warning("closing %s: %s", self.name, exc)
                await self._say_goodbye(exc)
                return False
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
            self.last_active = trio.current_time()
            if not isinstance(frame, Request):
                self._discharge((0, self._reader.taken))
                self._reader.taken = 0
            if isinstance(frame, Response):
                self._answered(frame)
            elif isinstance(frame, Request):
                charge = self._charge_now(len(body), frame.body)  # (no coroutine, usually)
                if charge is None:
                    charge = await self._charge(len(body), frame.body)
                if not await self._dispatch(frame, nursery, charge):
                    return False
            else:
                reason = error_for(frame.error, frame.message)
                log.warning("%s said goodbye: %s: %s", self.name, type(reason).__name__, reason)
                self._fail(reason)
                return False
            # An idle connection waits for its next frame holding nothing of the last.
            body = frame = charge = None  # type: ignore[assignment]

    def _answered(self, response: Response) -> None:
        """Wake the request waiting for ``response`` (if it still waits)."""
        pushed = self._pushed
        if pushed is not None and pushed.corr_id == response.corr_id:
            waiter: _Waiter | _Pushed | None = pushed
        else:
            waiter = self._waiters.get(response.corr_id)
        if isinstance(waiter, _Pushed):
            self.forget(response.corr_id)
            if response.error != ErrorCode.NONE:
                self._tell(waiter, None, error_for(response.error, response.message))
            else:
                self._tell(waiter, response.body, None)
        elif waiter is not None and not waiter.done.is_set():
            waiter.response = response
            waiter.done.set()

    def _tell(self, pushed: _Pushed, body: ResponseBody | None, error: CoordError | None) -> None:
        """Hand a pushed request's answer to its callback (a bug there is logged, not raised)."""
        try:
            pushed.callback(pushed.context, body, error)
        except Exception:
            log.exception("the callback of a request pushed to %s failed", self.name)

    def _charge_now(self, size: int, body: RequestBody) -> tuple[int, int] | None:
        """:meth:`_charge` when no budget makes it wait (the common case); else None."""
        if self._own is None:
            shared, self._reader.taken = self._reader.taken, 0
            return (0, shared)
        extra = self.handler.cost(body)
        if extra > SMALL_FRAME and self._shared is not None:
            return None  # (a large answer: take its shares the long way)
        own = self._own.try_take(size + extra)
        if not own:
            return None
        shared, self._reader.taken = self._reader.taken, 0
        return (own, shared)

    async def _charge(self, size: int, body: RequestBody) -> tuple[int, int]:
        """Take a request's cost from the budgets (waiting while spent); what to give back."""
        shared, self._reader.taken = self._reader.taken, 0  # (taken for the frame itself)
        if self._own is None:
            return (0, shared)
        own = 0
        try:
            extra = self.handler.cost(body)
            own = await self._own.take(size + extra)
            # Small requests (heartbeats, commits, joins) do not wait for the shared
            # budget, so that a flood of large ones cannot expel live members; the
            # connection's own budget bounds them.
            if self._shared is not None and extra > SMALL_FRAME:
                shared += await self._shared.take(extra)
        except BaseException:  # cancelled while waiting (the connection is closing)
            self._discharge((own, shared))
            raise
        return (own, shared)

    def _discharge(self, charge: tuple[int, int]) -> None:
        own, shared = charge
        if self._own is not None and own:
            self._own.give(own)
        if self._shared is not None and shared:
            self._shared.give(shared)

    async def _dispatch(
        self, request: Request, nursery: trio.Nursery, charge: tuple[int, int]
    ) -> bool:
        """Answer inline if the handler can; else spawn. False if the connection broke."""
        try:
            try:
                body = self.handler.handle_now(request.body)
            except Exception as exc:
                return await self._reply_error(request.corr_id, exc)
            if body is None:
                while self._in_flight >= self._max_in_flight:  # (stop reading meanwhile)
                    if self._slot_freed is None:
                        self._slot_freed = trio.Event()
                    await self._slot_freed.wait()
                self._in_flight += 1
                nursery.start_soon(self._handle_in_task, request, charge)
                charge = (0, 0)  # the task gives it back
                return True
            return await self._reply(request.corr_id, body)
        finally:
            self._discharge(charge)

    async def _handle_in_task(self, request: Request, charge: tuple[int, int]) -> None:
        try:
            try:
                body = await self.handler.handle(request.body)
            except Exception as exc:
                await self._reply_error(request.corr_id, exc)
            else:
                await self._reply(request.corr_id, body)
        finally:
            self._in_flight -= 1
            self._task_ended = trio.current_time()
            if self._slot_freed is not None:
                self._slot_freed.set()
                self._slot_freed = None
            self._discharge(charge)
            if not self._in_flight and self._idle_wait is not None:
                self._idle_wait.cancel()  # the reader may park now

    async def _reply(self, corr_id: int, body: ResponseBody) -> bool:
        """Send an answer; one that cannot be encoded (too large) is answered as an error."""
        try:
            await self._send(Response(corr_id, ErrorCode.NONE, "", body))
        except ConnectionClosedError:
            return False
        except Exception as exc:  # nothing was sent; the connection is intact
            return await self._reply_error(corr_id, exc)
        self.last_active = trio.current_time()
        return True

    async def _reply_error(self, corr_id: int, exc: Exception) -> bool:
        if self._sending:
            await self._lock_sending()
        else:
            self._sending = True
        try:
            await self._write(self.encode_error(corr_id, exc))
        except ConnectionClosedError:
            return False
        finally:
            self._unlock_sending()
        return True

    def encode_error(self, corr_id: int, exc: Exception) -> bytes | bytearray:
        """The frame answering request ``corr_id`` with ``exc`` (a bug's is logged)."""
        if not isinstance(exc, CoordError):
            log.exception("handler failed on %s", self.name, exc_info=exc)
            exc = UnknownServerError(f"internal error: {type(exc).__name__}: {exc}")
        try:
            return self._codec.encode(Response(corr_id, exc.code, str(exc), None))
        except FrameTooLargeError:  # the message alone is too long: send the bare code
            return self._codec.encode(Response(corr_id, exc.code, "", None))

    def encode_answer(self, corr_id: int, body: ResponseBody) -> bytes | bytearray:
        """The frame answering request ``corr_id`` with ``body``; one that cannot be
        encoded (too large) is answered as an error."""
        try:
            return self._codec.encode(Response(corr_id, ErrorCode.NONE, "", body))
        except Exception as exc:
            return self.encode_error(corr_id, exc)

    async def _say_goodbye(self, exc: CoordError) -> None:
        self._fail(exc)
        with trio.move_on_after(_GOODBYE_GRACE):
            try:
                await self._send(Goodbye(exc.code, str(exc)))
            except ConnectionClosedError:
                pass

    def _fail(self, reason: CoordError) -> None:
        """Mark the connection ended and fail every waiting request with ``reason``."""
        if self._close_reason is None:
            self._close_reason = reason
        pushed = [] if self._pushed is None else [self._pushed.corr_id]
        for corr_id, waiter in self._waiters.items():
            if isinstance(waiter, _Pushed):
                pushed.append(corr_id)
            elif not waiter.done.is_set():
                waiter.error = type(reason)(str(reason))
                waiter.done.set()
        self._is_closed = True
        if self._closed is not None:
            self._closed.set()
        for corr_id in pushed:  # (after: a callback may look at the connection)
            owed: _Waiter | _Pushed | None
            if self._pushed is not None and self._pushed.corr_id == corr_id:
                owed, self._pushed = self._pushed, None
            else:
                owed = self._waiters.pop(corr_id, None)
            if isinstance(owed, _Pushed):
                self._tell(owed, None, type(reason)(str(reason)))

    async def close_with(self, reason: CoordError) -> None:
        """Say goodbye with ``reason`` (bounded wait), then close (for a broker's policies)."""
        log.info("closing %s: %s", self.name, reason)
        await self._say_goodbye(reason)
        await self._close_stream()

    async def aclose(self) -> None:
        """Close the connection; the reader task ends and waiting requests fail."""
        self._fail(ConnectionClosedError(f"connection to {self.name} closed locally"))
        await self._close_stream()

    async def _close_stream(self) -> None:
        """Close the stream: the reader task, if any, ends the connection; a parked
        connection, which has none, is ended here."""
        if self._parked:
            self.end_parked()
            await trio.lowlevel.checkpoint()
        else:
            await trio.aclose_forcefully(self._stream)

    def wake_parked(self) -> Resume | None:
        """The parked socket is readable: answer what needs no task, without blocking.

        One read, then whole frames in order: a response wakes its waiter; a
        request is charged and answered by ``handle_now``, the answers written
        in one non-blocking send. Returns None to stay parked (or if the
        connection ended), else what a revived reader task must finish: a
        request that needs a task, answers the socket would not take at once,
        and the rest of the bytes (a partial, large, corrupt or unusual frame,
        or more frames or answer bytes than one wake-up may hold), left in the
        frame reader.
        """
        assert isinstance(self._stream, trio.SocketStream)
        if self._is_closed:  # (failed meanwhile: a send to it broke)
            self.end_parked()
            return None
        fd = self._stream.socket.fileno()
        try:
            data = os.read(fd, _RECEIVE_CHUNK)
        except BlockingIOError:
            return None  # (woken in vain)
        except OSError:  # reset by the peer: what a reader sees as BrokenResourceError
            data = b""
        if not data:
            self.end_parked()
            return None
        now = trio.current_time()
        self.last_active = now
        resume = Resume()
        answers: list[bytes] = []
        own = shared = encoded = 0
        view = memoryview(data)
        pos, size_read, frames = 0, len(data), 0
        # (A limit set below 4 KiB is the reader's to enforce: it says goodbye.)
        small = min(SMALL_FRAME, self._reader.max_frame_size)
        while pos + HEADER_SIZE <= size_read and frames < _PARKED_FRAMES:
            size = int.from_bytes(view[pos : pos + HEADER_SIZE], "big")
            end = pos + HEADER_SIZE + size
            if size > small or end > size_read:
                break  # a large or partial frame: the reader's (budget, read timeout, limit)
            try:
                frame = self._codec.decode(view[pos + HEADER_SIZE : end])
            except CoordError:
                break  # the reader says goodbye, as for any connection
            if isinstance(frame, Response):
                self._answered(frame)
            elif isinstance(frame, Request):
                charge = self._charge_now(size, frame.body)
                if charge is None:
                    break  # a budget is spent: the reader waits for it
                try:
                    body = self.handler.handle_now(frame.body)
                except Exception as exc:
                    answers.append(self.encode_error(frame.corr_id, exc))
                else:
                    if body is None:  # it needs a task
                        resume.request, resume.charge = frame, charge
                        pos = end
                        break
                    answers.append(self.encode_answer(frame.corr_id, body))
                encoded += len(answers[-1])
                own += charge[0]
                shared += charge[1]
            else:
                break  # a Goodbye: the reader's
            pos, frames = end, frames + 1
            if encoded >= _PARKED_ANSWER_BYTES:
                break  # (the rest, read or not, one at a time by the reader)
        if pos < size_read:
            self._reader.feed(view[pos:], now)
        if answers:
            out = answers[0] if len(answers) == 1 else b"".join(answers)
            if self._sending:  # another task is mid-send: the reader sends after it
                resume.out, resume.out_charge = out, (own, shared)
            else:
                self._sending = True
                try:
                    sent = os.write(fd, out)
                except BlockingIOError:
                    sent = 0
                except OSError:  # broken: as a failed send_all
                    self._unlock_sending()
                    self._discharge((own, shared))
                    self._discharge(resume.charge)
                    self.end_parked()
                    return None
                if sent == len(out):
                    self._unlock_sending()
                    self._discharge((own, shared))
                else:  # the rest is sent by the reader, which takes over the lock
                    resume.out, resume.locked = out[sent:], True
                    resume.out_charge = (own, shared)
        if resume.out or resume.request is not None or not self._reader.between_frames:
            return resume
        return None

    def end_parked(self) -> None:
        """End a parked connection at once (its socket closed, or the service stopping)."""
        assert self._parking is not None and isinstance(self._stream, trio.SocketStream)
        self._parking.forget(self)
        self._parked = False
        self._fail(ConnectionClosedError(f"connection to {self.name} closed"))
        self._stream.socket.close()  # (what SocketStream.aclose does, minus its checkpoint)
        self._ended()


def _peer_name(stream: trio.abc.Stream) -> str:
    stream = getattr(stream, "transport_stream", stream)  # (under TLS: the socket's)
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "memory-stream"
    try:
        address = sock.getpeername()
    except OSError:
        return "socket"
    if not isinstance(address, tuple):  # a UNIX socket's peer: a path, usually empty
        return f"unix:{address}" if address else "unix-socket"
    host, port = address[:2]
    return f"{host}:{port}"


async def connect_tcp(host: str, port: int) -> trio.SocketStream:
    """Open a TCP stream, or raise :class:`~.errors.ConnectionClosedError` (retriable)."""
    try:
        return await trio.open_tcp_stream(host, port)
    except OSError as exc:
        raise ConnectionClosedError(
            f"cannot connect to {host}:{port} ({os_reason(exc)}); is a broker running there?"
        ) from None


def os_reason(exc: OSError) -> str:
    """What went wrong, in the words of the OS ("Connection refused").

    Trio reports a failed connect as an OSError naming the address, caused by
    a group of one error per address tried; the first of those says why.
    """
    cause: BaseException = exc
    while isinstance(cause.__cause__, BaseException):
        cause = cause.__cause__
    if isinstance(cause, BaseExceptionGroup) and cause.exceptions:
        cause = cause.exceptions[0]
    if isinstance(cause, OSError):
        if cause.errno and cause.errno > 0:  # (resolver errors have negative numbers)
            return os.strerror(cause.errno)
        return cause.strerror or str(cause)
    return str(cause)


@asynccontextmanager
async def serving(conn: Connection) -> AsyncIterator[Connection]:
    """Run ``conn``'s reader for the life of the block, and close it after."""
    with unwrap_lone_exception():
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            try:
                yield conn
            finally:
                await conn.aclose()
                nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_connection(
    host: str,
    port: int,
    handler: RequestHandler | None = None,
    *,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> AsyncIterator[Connection]:
    """Connect over TCP and serve the connection for the life of the block.

    Raises :class:`~.errors.ConnectionClosedError` (retriable) if the peer
    cannot be reached. Leaving the block closes the connection.
    """
    stream = await connect_tcp(host, port)
    conn = Connection(stream, handler, max_frame_size=max_frame_size, name=f"{host}:{port}")
    async with serving(conn):
        yield conn
