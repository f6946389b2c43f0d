"""A broker's side of security: TLS on its listeners, SASL logins, and its authorizer.

Its one job is to turn an accepted stream into an authenticated one.
:class:`ServerSecurity` holds the server's TLS context (``--tls-cert``,
``--tls-key``; ``--tls-client-ca`` requires client certificates, whose CN
is then the principal), the SASL mechanisms offered, the
:class:`~.acl.Authorizer` and the :class:`~.store.SecurityCache` of users and
ACLs. :meth:`ServerSecurity.accept_native` runs in the connection's own task
under one deadline (``auth_timeout``): the TLS handshake, then, with SASL on,
the native exchange (SaslHandshake, then SaslAuthenticate until done) in
ordinary frames, before the connection's reader starts; a slow or hostile
client costs only its own task. The Kafka listener uses :meth:`sasl_server`
for its SaslHandshake/SaslAuthenticate APIs.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections import Counter
from collections.abc import Iterable
from typing import Final

import trio

from ..protocol.errors import (
    CoordError,
    ErrorCode,
    FrameTooLargeError,
    SaslAuthenticationError,
)
from ..protocol.framing import HEADER_SIZE, FrameCodec
from ..protocol.messages import (
    Request,
    Response,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from ..store.base import MetadataStore
from ._tls import TLSSocketStream, wrap_tls
from .acl import ANONYMOUS, Authorizer
from .quota import Quotas
from .scram import MECHANISMS, AuthenticationError, PlainServer, ScramServer
from .store import SecurityCache

__all__ = ["AUTH_FRAME_SIZE", "ServerSecurity", "check_settings", "server_ssl_context"]

log = logging.getLogger(__name__)

AUTH_FRAME_SIZE: Final = 16 * 1024
"""The largest frame accepted before a connection has authenticated."""
MAX_SASL_STEPS: Final = 4


def server_ssl_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The TLS context of a broker's listeners (TLS 1.2 or newer; client certs if ``client_ca``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        if client_ca:
            context.load_verify_locations(client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"cannot load the TLS certificate {cert!r}, key {key!r}"
            f"{f' or client CA {client_ca!r}' if client_ca else ''}: {exc}; "
            "give PEM files the broker can read"
        ) from None
    return context


def check_settings(
    *,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    sasl_mechanisms: Iterable[str],
    allow_plain_without_tls: bool,
) -> None:
    """Raise ValueError naming the first security setting that makes no sense."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("--tls-cert and --tls-key go together: give both PEM files, or neither")
    if tls_client_ca and not tls_cert:
        raise ValueError("--tls-client-ca needs TLS: give --tls-cert and --tls-key too")
    mechanisms = list(sasl_mechanisms)
    for mech in mechanisms:
        if mech not in MECHANISMS:
            raise ValueError(
                f"SASL mechanism {mech!r} is not offered; choose from {', '.join(MECHANISMS)}"
            )
    if "PLAIN" in mechanisms and not tls_cert and not allow_plain_without_tls:
        raise ValueError(
            "PLAIN sends passwords in the clear without TLS: give --tls-cert/--tls-key, or "
            "--allow-plain-without-tls if the network is trusted"
        )


async def read_login_frame(stream: trio.abc.Stream) -> bytes | None:
    """One frame's body, read exactly: nothing after it is taken from the stream.

    The login runs before the connection's own reader exists; a buffered
    read here could swallow the first frame that follows the login (a
    request, or a broker's goodbye), so every read asks for no more than
    the frame still needs. None: the peer closed between frames.
    """
    header = await _read_exactly(stream, HEADER_SIZE, allow_eof=True)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > AUTH_FRAME_SIZE:
        raise FrameTooLargeError(
            f"a frame of {size} bytes during the login (at most {AUTH_FRAME_SIZE})"
        )
    body = await _read_exactly(stream, size, allow_eof=False)
    assert body is not None
    return body


async def _read_exactly(stream: trio.abc.Stream, size: int, *, allow_eof: bool) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            if allow_eof and not data:
                return None
            raise trio.BrokenResourceError("the connection ended inside a frame")
        data += chunk
    return bytes(data)


def _cn(peer: dict[str, object] | None) -> str | None:
    if not peer:
        return None
    for rdn in peer.get("subject", ()):  # type: ignore[attr-defined]
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class ServerSecurity:
    """What a broker knows to authenticate and authorize (see the module docstring)."""

    def __init__(
        self,
        store: MetadataStore,
        *,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        sasl_mechanisms: Iterable[str] = (),
        super_users: Iterable[str] = (),
        auth_timeout: float = 10.0,
        quotas: Quotas | None = None,
        max_connections_per_principal: int | None = None,
    ) -> None:
        self.ssl_context = (
            server_ssl_context(tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None
        )
        self.client_certs = bool(tls_client_ca)
        self.mechanisms = tuple(sasl_mechanisms)
        self.auth_timeout = auth_timeout
        self.authorizer = Authorizer(
            enabled=bool(self.mechanisms) or self.client_certs, super_users=super_users
        )
        self.cache = SecurityCache(store, self.authorizer)
        self.failed_logins = 0
        """Logins refused since the start (for metrics and tests)."""
        self.quotas = quotas or Quotas()
        """Produce and fetch byte rates per principal (docs/security.md, "Quotas")."""
        self.max_connections_per_principal = max_connections_per_principal
        self._per_principal: Counter[str] = Counter()

    def admit(self, principal: str) -> bool:
        """Count a connection of ``principal``; False (not counted) beyond its limit."""
        limit = self.max_connections_per_principal
        if limit is not None and self._per_principal[principal] >= limit:
            log.warning(
                "refusing a connection of %s: %d open (max_connections_per_principal)",
                principal,
                limit,
            )
            return False
        self._per_principal[principal] += 1
        return True

    def release(self, principal: str) -> None:
        """A connection :meth:`admit` counted has ended."""
        self._per_principal[principal] -= 1
        if self._per_principal[principal] <= 0:
            del self._per_principal[principal]

    @property
    def sasl(self) -> bool:
        """True when every connection must authenticate with SASL."""
        return bool(self.mechanisms)

    @property
    def needs_cache(self) -> bool:
        """True when users or ACLs are used (a store watch keeps them current)."""
        return self.sasl or self.authorizer.enabled

    def sasl_server(self, mechanism: str) -> ScramServer | PlainServer:
        """A server for one login with ``mechanism`` (SaslAuthenticationError if not offered)."""
        if mechanism not in self.mechanisms:
            raise SaslAuthenticationError(
                f"SASL mechanism {mechanism!r} is not offered by this broker; "
                f"it offers {', '.join(self.mechanisms) or 'none'}"
            )
        if mechanism == "PLAIN":
            return PlainServer(self.cache.lookup)
        return ScramServer(mechanism, self.cache.lookup)

    async def tls_handshake(self, stream: trio.abc.Stream) -> tuple[trio.abc.Stream, str]:
        """Wrap ``stream`` in TLS (if on) and do the handshake; the principal of its cert."""
        if self.ssl_context is None:
            return stream, ANONYMOUS
        wrapped: TLSSocketStream | trio.SSLStream[trio.abc.Stream]
        if isinstance(stream, trio.SocketStream):
            wrapped = wrap_tls(stream, self.ssl_context, server_side=True)
        else:  # (another kind of stream: Trio's TLS over it)
            wrapped = trio.SSLStream(stream, self.ssl_context, server_side=True)
        try:
            await wrapped.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(wrapped)
            raise
        cn = _cn(wrapped.getpeercert()) if self.client_certs else None
        return wrapped, f"User:{cn}" if cn else ANONYMOUS

    async def accept_native(self, stream: trio.abc.Stream) -> tuple[trio.abc.Stream, str] | None:
        """TLS and SASL for one native connection, within ``auth_timeout``.

        Returns the stream to serve and its principal, or None if the client
        failed (it was told why when possible; the caller closes the stream).
        """
        secured = stream
        with trio.move_on_after(self.auth_timeout) as deadline:
            try:
                secured, principal = await self.tls_handshake(stream)
                if not self.sasl:
                    return secured, principal
                user = await self._native_sasl(secured)
                if user is not None:
                    return secured, f"User:{user}"
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
                log.info("TLS with %s failed: %s", _peer(stream), exc)
            except CoordError as exc:  # (a frame too large, undecodable)
                log.info("refused a connection from %s: %s", _peer(stream), exc)
        if deadline.cancelled_caught:
            log.info("closing %s: not authenticated within %gs", _peer(stream), self.auth_timeout)
        if secured is not stream:  # (TLS took the socket: close it here, the caller cannot)
            await trio.aclose_forcefully(secured)
        return None

    async def _native_sasl(self, stream: trio.abc.Stream) -> str | None:
        codec = FrameCodec(AUTH_FRAME_SIZE)
        server: ScramServer | PlainServer | None = None
        for _ in range(MAX_SASL_STEPS + 1):
            body = await read_login_frame(stream)
            if body is None:
                return None
            frame = codec.decode(body)
            if not isinstance(frame, Request):
                return None
            request = frame.body
            try:
                if server is None:
                    if not isinstance(request, SaslHandshakeRequest):
                        raise SaslAuthenticationError(
                            "this broker requires SASL authentication before any request: "
                            "give the client a user and password (sasl=, --user)"
                        )
                    server = self.sasl_server(request.mechanism)
                    answer: object = SaslHandshakeResponse(list(self.mechanisms))
                else:
                    if not isinstance(request, SaslAuthenticateRequest):
                        raise SaslAuthenticationError("expected SaslAuthenticate")
                    try:
                        if server.costly:  # (PLAIN: hash rounds, off the event loop)
                            out = await trio.to_thread.run_sync(server.step, request.data)
                        else:
                            out = server.step(request.data)
                        answer = SaslAuthenticateResponse(out)
                    except AuthenticationError as exc:
                        self.failed_logins += 1
                        raise SaslAuthenticationError(str(exc)) from None
            except SaslAuthenticationError as exc:
                log.info("refused a login from %s: %s", _peer(stream), exc)
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(
                        codec.encode(Response(frame.corr_id, exc.code, str(exc), None))
                    )
                return None
            await stream.send_all(
                codec.encode(Response(frame.corr_id, ErrorCode.NONE, "", answer))  # type: ignore[arg-type]
            )
            if server is not None and server.done:
                return server.user
        return None


def _peer(stream: trio.abc.Stream) -> str:
    inner = getattr(stream, "transport_stream", stream)  # (trio.SSLStream's socket stream)
    sock = getattr(inner, "socket", None)
    if sock is None:
        return "a client"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "a client"
    return f"{host}:{port}"
