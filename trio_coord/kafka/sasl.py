"""SaslHandshake and SaslAuthenticate: Kafka clients log in as they do with Kafka.

Its one job is the login of a Kafka connection on a broker started with
``--sasl-mechanisms``. A client sends ApiVersions, SaslHandshake v1 (the
mechanism; the answer lists those offered) and then SaslAuthenticate frames
carrying the SASL messages (:mod:`trio_coord.security.scram`). Until the
login succeeds the listener serves nothing else (and closes a connection
that tries, as Kafka does); a failed login is answered with
SASL_AUTHENTICATION_FAILED and its message, and the connection is closed
after that answer. Both APIs are synchronous fast paths (so handled in the order
they arrive), but for a PLAIN check, which derives keys in a worker thread.
"""

from __future__ import annotations

import datetime
from typing import Any, Final

import trio

from ..protocol.errors import CoordError
from ..security.scram import AuthenticationError
from .codec import KafkaCode, make, response_schema
from .dispatch import Api, RequestContext

__all__ = ["APIS"]

_NO_SESSION: Final = datetime.timedelta(0)


def _handshake(ctx: RequestContext, body: Any) -> Any:
    schema = response_schema(17, ctx.version)
    security = ctx.front.security
    offered = tuple(security.mechanisms) if security is not None else ()
    conn: Any = ctx.conn
    code = KafkaCode.none
    if security is None or not security.sasl or conn is None:
        code = KafkaCode.illegal_sasl_state
    elif conn.principal_known:
        code = KafkaCode.illegal_sasl_state
    else:
        try:
            conn.sasl_server = security.sasl_server(body.mechanism)
        except CoordError:
            code = KafkaCode.unsupported_sasl_mechanism
            conn.login_failed = True
    return make(schema, error_code=code, mechanisms=offered)


def _authenticate_now(ctx: RequestContext, body: Any) -> Any | None:
    server = getattr(ctx.conn, "sasl_server", None)
    if server is not None and server.costly:
        return None  # (PLAIN: hash rounds, in a worker thread: the async handler)
    return _authenticate(ctx, body)


def _authenticate(
    ctx: RequestContext, body: Any, stepped: bytes | AuthenticationError | None = None
) -> Any:
    """Take one SASL message (``stepped``: the step's result or failure, already computed)."""
    schema = response_schema(36, ctx.version)
    conn: Any = ctx.conn
    server = getattr(conn, "sasl_server", None)
    fields: dict[str, Any] = {}
    if ctx.version >= 1:
        fields["session_lifetime"] = _NO_SESSION
    if server is None or conn.principal_known:
        return make(
            schema,
            error_code=KafkaCode.illegal_sasl_state,
            error_message="send SaslHandshake first",
            auth_bytes=b"",
            **fields,
        )
    try:
        if isinstance(stepped, AuthenticationError):
            raise stepped
        answer = server.step(bytes(body.auth_bytes)) if stepped is None else stepped
    except AuthenticationError as exc:
        conn.login_failed = True
        security = ctx.front.security
        if security is not None:
            security.failed_logins += 1
        return make(
            schema,
            error_code=KafkaCode.sasl_authentication_failed,
            error_message=f"Authentication failed: {exc}",
            auth_bytes=b"",
            **fields,
        )
    if server.done:
        principal = f"User:{server.user}"
        security = ctx.front.security
        if security is not None and not security.admit(principal):
            conn.login_failed = True
            return make(
                schema,
                error_code=KafkaCode.sasl_authentication_failed,
                error_message=f"too many connections of {principal} "
                f"(max_connections_per_principal {security.max_connections_per_principal})",
                auth_bytes=b"",
                **fields,
            )
        conn.logged_in(principal)
        conn.on_close(lambda: security.release(principal) if security is not None else None)
    return make(schema, error_code=KafkaCode.none, error_message=None, auth_bytes=answer, **fields)


async def _handshake_async(ctx: RequestContext, body: Any) -> Any:
    return _handshake(ctx, body)


async def _authenticate_async(ctx: RequestContext, body: Any) -> Any:
    server = getattr(ctx.conn, "sasl_server", None)
    if server is None or not server.costly:
        return _authenticate(ctx, body)
    stepped: bytes | AuthenticationError
    try:
        stepped = await trio.to_thread.run_sync(server.step, bytes(body.auth_bytes))
    except AuthenticationError as exc:
        stepped = exc
    return _authenticate(ctx, body, stepped)


APIS = [
    Api(17, 1, 1, _handshake_async, now=_handshake, authorizes=True),
    Api(36, 0, 2, _authenticate_async, now=_authenticate_now, authorizes=True),
]
