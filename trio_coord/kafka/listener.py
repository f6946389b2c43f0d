"""The Kafka listener: accepts connections and serves each as Kafka clients expect.

Its one job is the life of a Kafka connection. Frames are size-prefixed
(4-byte big-endian length); a length above ``max_request_bytes`` (or
negative) is refused before anything is allocated for it. Per connection
one reader task reads frames, decodes the header and body with kio, and
hands each request to its handler (inline for the synchronous fast paths,
in a task otherwise); one writer task writes the answers **strictly in
request order** (librdkafka pipelines many requests and matches them by
order as well as by correlation id), so a long-polling Fetch delays the
answers behind it but never reorders them. Produce requests take turns: each appends its
batches only once the previous one's are in the log (their offsets
assigned; the waits for durability overlap), so batches reach a partition in
the order they were sent, as Kafka's one-request-at-a-time channel
guarantees. At most ``max_in_flight``
requests are in flight per connection, and their bytes (frame plus what
the answer may hold) are charged against a per-connection and a shared
:class:`~trio_coord.protocol.budget.ByteBudget`: beyond either, the reader
stops reading. A request of an API or version this broker does not serve
is answered with kio's schema of that API and UNSUPPORTED_VERSION
(ApiVersions: a v0 answer listing what is served, as Kafka does); one that
kio has no schema for, or a frame that does not decode, closes that
connection with one log line and costs nothing else.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import math
import ssl
import struct
from collections.abc import Callable
from typing import Any

import trio

from .._aio import unwrap_lone_exception
from ..protocol.budget import ByteBudget
from ..security.acl import ANONYMOUS
from .codec import (
    API_VERSIONS,
    KafkaCode,
    decode_request,
    encode_response,
    error_response,
    make,
    nested,
    peek_head,
    request_schema,
    response_schema,
)
from .dispatch import Api, FrontEnd, RequestContext
from .errors import kafka_code

__all__ = ["KafkaListener", "MalformedRequest", "api_versions_v0_error"]

log = logging.getLogger(__name__)
_DEBUG = functools.partial(log.isEnabledFor, logging.DEBUG)

_SIZE = struct.Struct(">i")
_RECEIVE_CHUNK = 256 * 1024
_REFUSAL_LOG_INTERVAL = 10.0
_BEFORE_LOGIN = frozenset({API_VERSIONS, 17, 36})
"""ApiVersions, SaslHandshake, SaslAuthenticate: all a client may send before its login."""


class MalformedRequest(Exception):
    """A frame that cannot be a Kafka request: its connection is closed."""


class _Slot:
    """One request's place in the answer order: the answer once ready (None: no answer)."""

    __slots__ = ("charge", "data", "ready")

    def __init__(self, charge: int) -> None:
        self.ready = trio.Event()
        self.data: bytes | None = None
        self.charge = charge

    def set(self, data: bytes | None) -> None:
        self.data = data
        self.ready.set()


def api_versions_v0_error(front: FrontEnd, correlation_id: int) -> bytes:
    """Kafka's answer to an ApiVersions version it does not know: v0, UNSUPPORTED_VERSION."""
    schema = response_schema(API_VERSIONS, 0)
    entry = nested(schema, "ApiVersion")
    response = make(
        schema,
        error_code=KafkaCode.unsupported_version,
        api_keys=tuple(
            entry(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in front.table.ranges()
        ),
    )
    return encode_response(correlation_id, response)


class KafkaListener:
    """Serves Kafka connections for one broker's :class:`~.dispatch.FrontEnd`."""

    def __init__(self, front: FrontEnd, shared: ByteBudget | None = None) -> None:
        self.front = front
        self._shared = shared
        self.connections = 0
        """Kafka connections open now."""
        self.malformed = 0
        """Connections closed for a malformed or unanswerable request (for tests)."""
        self._refused = 0
        self._refusals_logged = -math.inf

    async def listen(
        self,
        host: str,
        port: int,
        handler_nursery: trio.Nursery,
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections on ``host:port`` (0: a free port) until cancelled."""
        await trio.serve_tcp(
            self.serve_stream,
            port,
            host=host,
            handler_nursery=handler_nursery,
            task_status=task_status,
        )

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one Kafka connection until it closes (any Trio stream: tests use memory ones)."""
        limits = self.front.limits
        if self.connections >= limits.max_connections:
            self._refused += 1
            now = trio.current_time()
            if now - self._refusals_logged >= _REFUSAL_LOG_INTERVAL:
                log.warning(
                    "refusing Kafka connections: %d open (max_connections); %d refused",
                    self.connections,
                    self._refused,
                )
                self._refusals_logged, self._refused = now, 0
            await stream.aclose()
            return
        self.connections += 1
        peer = _peer_name(stream)
        security = self.front.security
        try:
            principal = ANONYMOUS
            if security is not None and security.ssl_context is not None:
                # (in this connection's task, under auth_timeout: the accept loop goes on)
                secured = None
                with trio.move_on_after(security.auth_timeout):
                    secured = await security.tls_handshake(stream)
                if secured is None:
                    log.info("Kafka connection from %s: no TLS handshake in time", peer)
                    return
                stream, principal = secured
            conn = _Connection(self, stream, peer)
            conn.principal = principal
            conn.principal_known = security is None or not security.sasl
            if conn.principal_known and security is not None:
                # (anonymous or a certificate's principal: counted now; a login's once it
                # succeeds, in trio_coord.kafka.sasl)
                if not security.admit(principal):
                    return
                conn.on_close(lambda: security.release(principal))
            await conn.serve()
        except MalformedRequest as exc:
            self.malformed += 1
            log.warning("closing Kafka connection from %s: %s", peer, exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away (or its TLS handshake failed)
        except ssl.SSLError as exc:
            log.info("TLS with Kafka client %s failed: %s", peer, exc)
        except Exception:
            log.exception("Kafka connection from %s failed and was closed", peer)
        finally:
            self.connections -= 1
            await trio.aclose_forcefully(stream)


class _Connection:
    """One Kafka connection: the reader (this task), the writer, the handler tasks."""

    def __init__(self, listener: KafkaListener, stream: trio.abc.Stream, peer: str) -> None:
        self._listener = listener
        self._front = listener.front
        self._stream = stream
        self._peer = peer
        limits = self._front.limits
        self._budget = ByteBudget(limits.max_connection_bytes)
        self._shared = listener._shared
        self._buffer = bytearray()
        self._in_flight = 0
        self._turn = trio.Event()  # the end of the last ordered request's turn
        self._turn.set()
        send, receive = trio.open_memory_channel[_Slot](max(0, limits.max_in_flight - 1))
        self._send = send
        self._receive = receive
        self.closed = False
        """True once the client closed (or the connection failed): its group members are gone."""
        self._on_close: list[Callable[[], None]] | None = None
        self.principal = ANONYMOUS
        """Who the client is: its login's user, its certificate's CN, or anonymous."""
        self.principal_known = True
        """False until a broker that requires SASL has seen this client log in."""
        self.sasl_server: Any = None
        """The login in progress (``trio_coord.kafka.sasl``)."""
        self.login_failed = False
        """A login was refused: its answer is written, then the connection closes."""

    def logged_in(self, principal: str) -> None:
        """The SASL login succeeded: requests are served as ``principal`` from now on."""
        self.principal, self.principal_known, self.sasl_server = principal, True, None

    @property
    def peer(self) -> str:
        """The client's address."""
        return self._peer

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the connection ends (at once if it has)."""
        if self.closed:
            callback()
            return
        if self._on_close is None:
            self._on_close = []
        self._on_close.append(callback)

    def _ended(self) -> None:
        if self.closed:
            return
        self.closed = True
        callbacks, self._on_close = self._on_close or [], None
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a close callback of the Kafka connection from %s failed", self._peer)

    async def serve(self) -> None:
        with unwrap_lone_exception():
            await self._serve()

    async def _serve(self) -> None:
        try:
            await self._serve_all()
        finally:
            self._ended()

    async def _login_deadline(self, scope: trio.CancelScope, seconds: float) -> None:
        await trio.sleep(seconds)
        if not self.principal_known:
            log.info("closing Kafka connection from %s: no login within %gs", self._peer, seconds)
            scope.cancel()

    async def _serve_all(self) -> None:
        async with trio.open_nursery() as nursery:
            security = self._front.security
            if not self.principal_known and security is not None:
                nursery.start_soon(
                    self._login_deadline, nursery.cancel_scope, security.auth_timeout
                )
            nursery.start_soon(self._write_loop, nursery.cancel_scope)
            try:
                await self._read_loop(nursery)
            finally:
                # Ended by the client (or a malformed request): its group members are gone
                # now, not once the answers still pending (a JoinGroup waiting) are written.
                self._ended()
                self._send.close()

    # -- reading ---------------------------------------------------------------------------

    async def _receive_some(self) -> bool:
        data = await self._stream.receive_some(_RECEIVE_CHUNK)
        if not data:
            return False
        self._buffer += data
        return True

    async def _read_exactly(self, size: int) -> bytes | None:
        while len(self._buffer) < size:
            if not await self._receive_some():
                if self._buffer:
                    raise MalformedRequest(
                        f"the connection ended inside a frame ({len(self._buffer)} of {size} bytes)"
                    )
                return None
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        limits = self._front.limits
        while True:
            idle = limits.connections_max_idle if self._in_flight == 0 else math.inf
            with trio.move_on_after(idle) as waited:
                prefix = await self._read_exactly(4)
            if waited.cancelled_caught:
                log.info("closing idle Kafka connection from %s", self._peer)
                return
            if prefix is None:
                return  # the client closed
            (size,) = _SIZE.unpack(prefix)
            if not 0 <= size <= limits.max_request_bytes:
                raise MalformedRequest(
                    f"a frame of {size} bytes (max_request_bytes {limits.max_request_bytes})"
                )
            charge = await self._take(size)
            try:
                with trio.fail_after(limits.request_read_timeout):
                    frame = await self._read_exactly(size)
            except trio.TooSlowError:
                raise MalformedRequest(
                    f"a frame of {size} bytes did not arrive within "
                    f"{limits.request_read_timeout:g}s (request_read_timeout)"
                ) from None
            if frame is None:
                raise MalformedRequest("the connection ended inside a frame")
            await self._dispatch(frame, charge, nursery)

    async def _take(self, size: int) -> int:
        taken = await self._budget.take(size)
        if self._shared is not None:
            try:
                await self._shared.take(size)
            except BaseException:
                self._budget.give(taken)
                raise
        return taken

    def _give(self, charge: int) -> None:
        self._budget.give(charge)
        if self._shared is not None:
            self._shared.give(charge)

    async def _dispatch(self, frame: bytes, charge: int, nursery: trio.Nursery) -> None:
        try:
            head = peek_head(frame)
        except ValueError as exc:
            raise MalformedRequest(str(exc)) from None
        if _DEBUG():
            log.debug("%s: API %d v%d", self._peer, head.api_key, head.api_version)
        if self.login_failed:
            raise MalformedRequest("a request after a refused login")
        if not self.principal_known and head.api_key not in _BEFORE_LOGIN:
            raise MalformedRequest(
                f"API key {head.api_key} before the SASL login this broker requires"
            )
        api = self._front.table.get(head.api_key)
        served = api is not None and api.min_version <= head.api_version <= api.max_version
        schema = request_schema(head.api_key, head.api_version)
        if not served and head.api_key == API_VERSIONS:
            (await self._queue(_Slot(charge)))(
                api_versions_v0_error(self._front, head.correlation_id)
            )
            return
        if schema is None:
            raise MalformedRequest(
                f"API key {head.api_key} version {head.api_version} is not a Kafka request "
                "this broker can read"
            )
        try:
            header, body = decode_request(frame, schema)
        except ValueError as exc:
            raise MalformedRequest(str(exc)) from None
        del frame
        if not served:
            answer = error_response(head.api_key, head.api_version, KafkaCode.unsupported_version)
            (await self._queue(_Slot(charge)))(encode_response(head.correlation_id, answer))
            return
        assert api is not None
        authorizer = self._front.authorizer
        if (
            not api.authorizes
            and authorizer is not None
            and not authorizer.is_super(self.principal)
        ):
            log.info(
                "refused API %d to %s: it checks no ACLs (super users only)", api.key, self._peer
            )
            answer = error_response(
                head.api_key, head.api_version, KafkaCode.cluster_authorization_failed
            )
            (await self._queue(_Slot(charge)))(encode_response(head.correlation_id, answer))
            return
        extra = api.cost(self._front, body) if api.cost is not None else 0
        # The frame's charge and the answer's, together at most a whole budget (a request
        # never waits for bytes it holds itself).
        extra = min(extra, self._budget.total - charge)
        if self._shared is not None:
            extra = min(extra, self._shared.total - charge)
        if extra > 0:
            charge += await self._take(extra)
        slot = _Slot(charge)
        finish = await self._queue(slot)
        ctx = RequestContext(
            self._front, head, header.client_id, self._peer, conn=self, principal=self.principal
        )
        if api.ordered:
            ctx.after, ctx.turn = self._turn, trio.Event()
            self._turn = ctx.turn
        delay = 0.0
        security = self._front.security
        if security is not None and security.quotas.requests and self.principal_known:
            now = trio.current_time()
            delay = security.quotas.record(self.principal, "request", 1, now)
            if delay > 0:  # over the request-rate quota: answered late, in a task
                nursery.start_soon(self._handle, api, ctx, body, finish, delay)
                return
        if api.now is not None:
            try:
                response = api.now(ctx, body)
            except Exception as exc:
                response = self._failed(ctx, api, exc)
            if response is not None:
                finish(encode_response(head.correlation_id, response))
                return
        nursery.start_soon(self._handle, api, ctx, body, finish)

    async def _queue(self, slot: _Slot) -> Any:
        """Put ``slot`` in the answer order (waits while max_in_flight are in flight)."""
        self._in_flight += 1
        await self._send.send(slot)
        return slot.set

    async def _handle(
        self, api: Api, ctx: RequestContext, body: Any, finish: Any, delay: float = 0.0
    ) -> None:
        try:
            if delay > 0:
                await trio.sleep(delay)
            response = await api.handler(ctx, body)
            if delay > 0 and response is not None and hasattr(response, "throttle_time"):
                throttle = max(response.throttle_time, datetime.timedelta(seconds=delay))
                response = dataclasses.replace(response, throttle_time=throttle)
        except Exception as exc:
            response = self._failed(ctx, api, exc)
        finally:
            ctx.end_turn()
        finish(None if response is None else encode_response(ctx.head.correlation_id, response))

    def _failed(self, ctx: RequestContext, api: Api, exc: Exception) -> Any:
        code = kafka_code(exc)
        if code is KafkaCode.unknown_server_error:
            log.exception(
                "Kafka API %d v%d from %s failed", api.key, ctx.version, self._peer, exc_info=exc
            )
        return error_response(api.key, ctx.version, code)

    # -- writing ---------------------------------------------------------------------------

    async def _write_loop(self, scope: trio.CancelScope) -> None:
        """Write the answers in request order; the connection ends when this does."""
        try:
            async for slot in self._receive:
                await slot.ready.wait()
                try:
                    if slot.data is not None:
                        await self._stream.send_all(slot.data)
                finally:
                    slot.data = None
                    self._in_flight -= 1
                    self._give(slot.charge)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()  # the reader and handlers stop with the writer


def _peer_name(stream: trio.abc.Stream) -> str:
    stream = getattr(stream, "transport_stream", stream)  # (under TLS: the socket's)
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "(stream)"
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "(closed)"
