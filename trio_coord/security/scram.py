"""SCRAM (RFC 5802, RFC 7677) and PLAIN: credentials, the server's and the client's side.

Its one job is the exchange of SASL messages that proves a password. A
:class:`ScramCredential` is what the store keeps per user and mechanism:
salt, iteration count, ``StoredKey`` and ``ServerKey`` (never the password,
nor anything that logs in without it). :class:`ScramServer` and
:class:`ScramClient` are sans-IO state machines (bytes in, bytes out), the
same for the native protocol and Kafka's SaslAuthenticate; the messages are
Kafka's (``ScramSaslServer``): ``n,,n=user,r=nonce`` / ``r=..,s=..,i=..`` /
``c=biws,r=..,p=..`` / ``v=..``. PLAIN (RFC 4616) is checked against the
SCRAM-SHA-256 credential by deriving the keys again from the password sent.
Only ``hashlib``, ``hmac`` and ``secrets``: no cryptography of our own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MECHANISMS",
    "SCRAM_MECHANISMS",
    "AuthenticationError",
    "PlainServer",
    "ScramClient",
    "ScramCredential",
    "ScramServer",
    "plain_message",
]

SCRAM_MECHANISMS: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
"""Each SCRAM mechanism and the hashlib name of its hash."""
MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
"""Every SASL mechanism a broker can offer."""
DEFAULT_ITERATIONS: Final = 8192
MIN_ITERATIONS: Final = 4096
"""Kafka's minimum (and RFC 7677's recommendation) for SCRAM-SHA-256."""
MAX_ITERATIONS: Final = 16384
"""Kafka's maximum: a PLAIN login derives the keys again, and must stay cheap."""
MAX_MESSAGE: Final = 4096
"""The longest SASL message accepted (a user name and nonces fit many times over)."""


class AuthenticationError(Exception):
    """The peer did not prove who it is (wrong password, unknown user, bad message)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a store keeps to verify one user's password with one SCRAM mechanism."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def make(
        cls, mechanism: str, password: str, *, iterations: int = DEFAULT_ITERATIONS
    ) -> ScramCredential:
        """A new credential for ``password`` with a random salt (ValueError: bad mechanism)."""
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(
                f"{mechanism!r} is not a SCRAM mechanism; use one of {', '.join(SCRAM_MECHANISMS)}"
            )
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ValueError(f"iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS}")
        salt = secrets.token_bytes(24)
        stored, server = _keys(SCRAM_MECHANISMS[mechanism], password, salt, iterations)
        return cls(mechanism, salt, iterations, stored, server)

    def verify_password(self, password: str) -> bool:
        """True if ``password`` is the one this credential was made from (constant time)."""
        stored, _ = _keys(SCRAM_MECHANISMS[self.mechanism], password, self.salt, self.iterations)
        return hmac.compare_digest(stored, self.stored_key)


def _keys(hash_name: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    salted = hashlib.pbkdf2_hmac(hash_name, _saslprep(password), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hash_name).digest()
    server_key = hmac.new(salted, b"Server Key", hash_name).digest()
    return hashlib.new(hash_name, client_key).digest(), server_key


def _saslprep(text: str) -> bytes:
    # (Kafka's ScramFormatter normalizes nothing either: the UTF-8 bytes are the password.)
    return text.encode("utf-8")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise AuthenticationError(f"invalid base64 in a SCRAM message: {exc}") from None


def _attributes(message: str) -> dict[str, str]:
    """``a=1,b=2`` → ``{"a": "1", "b": "2"}`` (AuthenticationError for anything else)."""
    found: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise AuthenticationError(f"malformed SCRAM attribute {part[:40]!r}")
        found.setdefault(key, value)
    return found


def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape(name: str) -> str:
    if "=" in name.replace("=3D", "").replace("=2C", ""):
        raise AuthenticationError("a user name with a bare '=' (RFC 5802 escapes it as =3D)")
    return name.replace("=2C", ",").replace("=3D", "=")


def _decode(data: bytes) -> str:
    if len(data) > MAX_MESSAGE:
        raise AuthenticationError(f"a SASL message of {len(data)} bytes (at most {MAX_MESSAGE})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationError("a SASL message that is not UTF-8") from None


Lookup = Callable[[str, str], ScramCredential | None]
"""(user, mechanism) → the stored credential, or None for an unknown user."""


class ScramServer:
    """The server's side of one SCRAM exchange: :meth:`step` each client message.

    The first step returns the server-first message; the second verifies the
    proof and returns the server-final message, after which ``user`` is the
    authenticated user. Any failure raises :class:`AuthenticationError`
    (an unknown user fails the same way as a wrong password, only later).
    """

    costly = False
    """Each step is a few HMACs: cheap enough for the event loop."""

    def __init__(self, mechanism: str, lookup: Lookup) -> None:
        self.mechanism = mechanism
        self._hash = SCRAM_MECHANISMS[mechanism]
        self._lookup = lookup
        self._state = 0
        self._credential: ScramCredential | None = None
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._claimed = ""
        self.user: str | None = None
        """The authenticated user once :attr:`done`."""

    @property
    def done(self) -> bool:
        """True once the client proved its password."""
        return self.user is not None

    def step(self, data: bytes) -> bytes:
        """Take the client's next message, return the server's answer."""
        text = _decode(data)
        if self._state == 0:
            self._state = 1
            return self._first(text)
        if self._state == 1:
            self._state = 2
            return self._final(text)
        raise AuthenticationError("the SCRAM exchange is over; nothing more is expected")

    def _first(self, text: str) -> bytes:
        gs2, sep, bare = text.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y"):
            raise AuthenticationError("the SCRAM client-first message lacks its 'n,,' header")
        if authzid and not authzid.startswith("a="):
            raise AuthenticationError("malformed authorization id in the SCRAM client-first")
        attrs = _attributes(bare)
        if "m" in attrs:
            raise AuthenticationError("SCRAM extensions (m=) are not supported")
        user = _unescape(attrs.get("n", ""))
        client_nonce = attrs.get("r", "")
        if not user or not client_nonce:
            raise AuthenticationError("the SCRAM client-first message has no user or nonce")
        if authzid and _unescape(authzid[2:]) != user:
            raise AuthenticationError("an authorization id other than the user is not allowed")
        self._claimed = user
        self._credential = self._lookup(user, self.mechanism)
        credential = self._credential
        if credential is None:  # answer like for a real user; fail on the proof
            salt, iterations = hashlib.sha256(user.encode()).digest()[:24], DEFAULT_ITERATIONS
        else:
            salt, iterations = credential.salt, credential.iterations
        self._first_bare = bare
        self._nonce = client_nonce + secrets.token_urlsafe(24)
        self._server_first = f"r={self._nonce},s={_b64(salt)},i={iterations}"
        return self._server_first.encode()

    def _final(self, text: str) -> bytes:
        without_proof, sep, proof_attr = text.rpartition(",p=")
        if not sep:
            raise AuthenticationError("the SCRAM client-final message has no proof")
        attrs = _attributes(without_proof)
        if attrs.get("r") != self._nonce:
            raise AuthenticationError("the SCRAM nonce does not match")
        if attrs.get("c") not in ("biws", "eSws"):  # base64 of "n,," and "y,,"
            raise AuthenticationError("SCRAM channel binding is not supported")
        proof = _unb64(proof_attr)
        credential = self._credential
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        if credential is None:
            raise AuthenticationError(f"authentication of user {self._claimed!r} failed")
        signature = hmac.new(credential.stored_key, auth_message, self._hash).digest()
        if len(proof) != len(signature):
            raise AuthenticationError(f"authentication of user {self._claimed!r} failed")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(
            hashlib.new(self._hash, client_key).digest(), credential.stored_key
        ):
            raise AuthenticationError(f"authentication of user {self._claimed!r} failed")
        self.user = self._claimed
        server_signature = hmac.new(credential.server_key, auth_message, self._hash).digest()
        return f"v={_b64(server_signature)}".encode()


class PlainServer:
    """The server's side of PLAIN (RFC 4616): one message, ``authzid NUL user NUL password``.

    Checking it derives the SCRAM keys from the password (thousands of hash
    rounds): ``costly`` tells callers to run :meth:`step` in a worker thread,
    so that logins never hold up the event loop.
    """

    mechanism = "PLAIN"
    costly = True

    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup
        self.user: str | None = None

    @property
    def done(self) -> bool:
        """True once the password was checked."""
        return self.user is not None

    def step(self, data: bytes) -> bytes:
        """Check the one PLAIN message; return the (empty) answer."""
        if self.user is not None:
            raise AuthenticationError("the PLAIN exchange is over")
        parts = _decode(data).split("\x00")
        if len(parts) != 3 or not parts[1]:
            raise AuthenticationError("a PLAIN message is authzid NUL user NUL password")
        authzid, user, password = parts
        if authzid and authzid != user:
            raise AuthenticationError("an authorization id other than the user is not allowed")
        credential = self._lookup(user, "SCRAM-SHA-256") or self._lookup(user, "SCRAM-SHA-512")
        if credential is None or not credential.verify_password(password):
            raise AuthenticationError(f"authentication of user {user!r} failed")
        self.user = user
        return b""


def plain_message(user: str, password: str) -> bytes:
    """The client's one PLAIN message."""
    return f"\x00{user}\x00{password}".encode()


class ScramClient:
    """The client's side of one SCRAM exchange (for our clients and tests)."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"{mechanism!r} is not a SCRAM mechanism")
        self._hash = SCRAM_MECHANISMS[mechanism]
        self._user = user
        self._password = password
        self._nonce = secrets.token_urlsafe(24)
        self._first_bare = f"n={_escape(user)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        """The client-first message."""
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """The client-final message (with the proof), from the server-first message."""
        text = _decode(server_first)
        attrs = _attributes(text)
        nonce, salt, iterations = attrs.get("r", ""), _unb64(attrs.get("s", "")), attrs.get("i")
        if not nonce.startswith(self._nonce) or iterations is None or not iterations.isdigit():
            raise AuthenticationError("the server's SCRAM first message is malformed")
        count = int(iterations)
        if not MIN_ITERATIONS <= count <= MAX_ITERATIONS:
            raise AuthenticationError(f"the server asks for {count} SCRAM iterations")
        salted = hashlib.pbkdf2_hmac(self._hash, _saslprep(self._password), salt, count)
        client_key = hmac.new(salted, b"Client Key", self._hash).digest()
        stored = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = hmac.new(stored, auth_message, self._hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", self._hash).digest()
        self._server_signature = hmac.new(server_key, auth_message, self._hash).digest()
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check the server's signature (AuthenticationError: not the server we trust)."""
        attrs = _attributes(_decode(server_final))
        if "e" in attrs:
            raise AuthenticationError(f"the server refused: {attrs['e']}")
        if not hmac.compare_digest(_unb64(attrs.get("v", "")), self._server_signature):
            raise AuthenticationError("the server's SCRAM signature is wrong (not our broker?)")
