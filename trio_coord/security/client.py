"""A client's side of security: TLS to the broker, and a SASL login in native frames.

Its one job is to turn a fresh TCP stream into an authenticated one.
:class:`Sasl` is what a client is given (``sasl=Sasl("alice", password)``,
mechanism SCRAM-SHA-256 by default); :func:`client_ssl_context` builds the
TLS context from a CA file (``--tls-ca``), with an optional client
certificate; :func:`secure_stream` does the TLS handshake and then the
native SASL exchange (:mod:`.server` is the other side), raising
:class:`~trio_coord.protocol.errors.SaslAuthenticationError` (not
retriable) when the broker refuses the credentials and
:class:`~trio_coord.protocol.errors.ConnectionClosedError` when TLS fails.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

import trio

from ..protocol.errors import (
    ConnectionClosedError,
    ErrorCode,
    SaslAuthenticationError,
    error_for,
)
from ..protocol.framing import FrameCodec
from ..protocol.messages import (
    Request,
    Response,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
)
from ._tls import TLSSocketStream, wrap_tls
from .scram import MECHANISMS, AuthenticationError, ScramClient, plain_message
from .server import AUTH_FRAME_SIZE, read_login_frame

__all__ = ["PASSWORD_ENV", "ClientSecurity", "Sasl", "client_ssl_context", "secure_stream"]

PASSWORD_ENV = "TRIO_COORD_PASSWORD"
"""The environment variable the CLI reads a password from."""


@dataclass(frozen=True, slots=True)
class Sasl:
    """A user's credentials for a broker that authenticates (``sasl=`` of every client)."""

    user: str
    password: str = field(repr=False)
    mechanism: str = "SCRAM-SHA-256"

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(
                f"SASL mechanism {self.mechanism!r} is not one of {', '.join(MECHANISMS)}"
            )
        if not self.user:
            raise ValueError("a SASL login needs a user name")


def client_ssl_context(
    cafile: str | os.PathLike[str] | None = None,
    *,
    certfile: str | os.PathLike[str] | None = None,
    keyfile: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A TLS context that trusts ``cafile`` (default: the system's CAs), optionally with a
    client certificate (for a broker started with ``--tls-client-ca``)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile)
    return context


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How a client connects: TLS (``ssl_context``) and/or a SASL login (``sasl``)."""

    ssl_context: ssl.SSLContext | None = None
    sasl: Sasl | None = None

    @property
    def plain(self) -> bool:
        """True when neither TLS nor SASL is used."""
        return self.ssl_context is None and self.sasl is None


async def secure_stream(
    stream: trio.abc.Stream, host: str, security: ClientSecurity
) -> trio.abc.Stream:
    """TLS (if asked) and the SASL login (if asked) on a fresh stream to ``host``."""
    if security.ssl_context is not None:
        wrapped: TLSSocketStream | trio.SSLStream[trio.abc.Stream]
        if isinstance(stream, trio.SocketStream):
            wrapped = wrap_tls(
                stream, security.ssl_context, server_side=False, server_hostname=host
            )
        else:
            wrapped = trio.SSLStream(stream, security.ssl_context, server_hostname=host)
        try:
            await wrapped.do_handshake()
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            await trio.aclose_forcefully(wrapped)
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise ConnectionClosedError(
                f"TLS with {host} failed ({cause}); check --tls-ca (the CA that signed the "
                "broker's certificate) and that the broker listens with TLS"
            ) from None
        stream = wrapped
    if security.sasl is not None:
        try:
            await _login(stream, security.sasl)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
    return stream


async def _login(stream: trio.abc.Stream, sasl: Sasl) -> None:
    codec = FrameCodec(AUTH_FRAME_SIZE)
    corr = 0

    async def ask(body: SaslHandshakeRequest | SaslAuthenticateRequest) -> object:
        nonlocal corr
        corr += 1
        try:
            await stream.send_all(codec.encode(Request(corr, body)))
            data = await read_login_frame(stream)  # (exactly: a goodbye may follow)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionClosedError(
                f"the broker closed the connection while logging in: {exc}"
            ) from None
        if data is None:
            raise ConnectionClosedError(
                "the broker closed the connection while logging in (does it use TLS? "
                "give the CA with --tls-ca / ssl_context=)"
            )
        frame = codec.decode(data)
        if not isinstance(frame, Response):
            raise SaslAuthenticationError("the broker did not answer the login")
        if frame.error != ErrorCode.NONE:
            raise error_for(frame.error, frame.message)
        return frame.body

    await ask(SaslHandshakeRequest(sasl.mechanism))
    try:
        if sasl.mechanism == "PLAIN":
            await ask(SaslAuthenticateRequest(plain_message(sasl.user, sasl.password)))
            return
        scram = ScramClient(sasl.mechanism, sasl.user, sasl.password)
        first = await ask(SaslAuthenticateRequest(scram.first()))
        assert isinstance(first, SaslAuthenticateResponse)
        last = await ask(SaslAuthenticateRequest(scram.final(first.data)))
        assert isinstance(last, SaslAuthenticateResponse)
        scram.verify(last.data)
    except AuthenticationError as exc:
        raise SaslAuthenticationError(str(exc)) from None
