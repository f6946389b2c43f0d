"""Users and ACLs in the metadata store, and the broker's cache of them.

Its one job is persistence of security metadata. Under ``/security`` the
store (embedded or ZooKeeper) holds one node per user
(``/security/users/NAME``: its SCRAM credentials, never a password) and one
per ACL (``/security/acls/KEY``); every write also rewrites ``/security``
itself, which each broker watches: :class:`SecurityCache` reloads users and
ACLs when it changes, so an ACL added through any broker, or offline on
ZooKeeper, is in force on every broker of the cluster at once. The
functions here are what ``trio-coord users``/``acls`` call, offline on a
store or inside a broker for a super user's request.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Final

import msgspec
import trio

from ..protocol.messages import SecurityAdminRequest
from ..store.base import MetadataStore, NodeExistsError, NoNodeError
from .acl import Acl, Authorizer
from .scram import MAX_ITERATIONS, MIN_ITERATIONS, SCRAM_MECHANISMS, ScramCredential

__all__ = [
    "SecurityCache",
    "add_acl",
    "add_user",
    "check_user_name",
    "delete_user",
    "list_acls",
    "list_users",
    "remove_acls",
]

log = logging.getLogger(__name__)

ROOT: Final = "/security"
USERS: Final = "/security/users"
ACLS: Final = "/security/acls"
MAX_USERS: Final = 10_000
MAX_ACLS: Final = 100_000
_USER_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,200}")


class _Credential(msgspec.Struct, frozen=True):
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


class _User(msgspec.Struct, frozen=True):
    name: str
    credentials: list[_Credential]


def _wire(c: ScramCredential) -> _Credential:
    return _Credential(c.mechanism, c.salt, c.iterations, c.stored_key, c.server_key)


def check_user_name(name: str) -> str:
    """``name``, or ValueError saying what a user name may contain."""
    if not _USER_NAME.fullmatch(name):
        raise ValueError(f"user name {name!r} must be 1 to 200 letters, digits or . _ @ + -")
    return name


async def _ensure(store: MetadataStore) -> None:
    for path in (ROOT, USERS, ACLS):
        if await store.exists(path) is None:
            try:
                await store.create(path, b"", make_parents=True)
            except NodeExistsError:
                pass


async def _changed(store: MetadataStore) -> None:
    """Rewrite ``/security`` so every broker's watch reloads."""
    await store.set(ROOT, secrets.token_hex(8).encode())


async def add_user(
    store: MetadataStore,
    name: str,
    password: str,
    mechanisms: list[str] | None = None,
    *,
    iterations: int = 8192,
) -> None:
    """Create ``name`` (or give it a new password) with credentials for ``mechanisms``."""
    check_user_name(name)
    if not password:
        raise ValueError("the password is empty")
    mechs = mechanisms or list(SCRAM_MECHANISMS)
    for mech in mechs:
        if mech not in SCRAM_MECHANISMS:
            raise ValueError(
                f"{mech!r} is not a SCRAM mechanism: use {', '.join(SCRAM_MECHANISMS)} "
                "(PLAIN logins are checked against the SCRAM-SHA-256 credential)"
            )
    creds = [ScramCredential.make(m, password, iterations=iterations) for m in mechs]
    await set_credentials(store, name, creds)


async def delete_user(store: MetadataStore, name: str) -> bool:
    """Remove ``name`` (False if there was no such user)."""
    check_user_name(name)
    try:
        await store.delete(f"{USERS}/{name}")
    except NoNodeError:
        return False
    await _changed(store)
    return True


async def _read_user(store: MetadataStore, name: str) -> _User | None:
    try:
        data, _ = await store.get(f"{USERS}/{name}")
        return msgspec.json.decode(data, type=_User)
    except (NoNodeError, msgspec.DecodeError):
        return None


async def list_users(store: MetadataStore) -> dict[str, list[str]]:
    """Every user and the mechanisms it has credentials for."""
    try:
        names = await store.children(USERS)
    except NoNodeError:
        return {}
    found: dict[str, list[str]] = {}
    for name in names:
        user = await _read_user(store, name)
        if user is not None:
            found[name] = [c.mechanism for c in user.credentials]
    return found


async def _read_credentials(store: MetadataStore) -> dict[str, dict[str, ScramCredential]]:
    found: dict[str, dict[str, ScramCredential]] = {}
    try:
        names = await store.children(USERS)
    except NoNodeError:
        return found
    for name in names:
        user = await _read_user(store, name)
        if user is not None:
            found[name] = {
                c.mechanism: ScramCredential(*msgspec.structs.astuple(c)) for c in user.credentials
            }
    return found


async def add_acl(store: MetadataStore, acl: Acl) -> bool:
    """Store ``acl`` (False if it was there already)."""
    acl.check()
    await _ensure(store)
    if len(await store.children(ACLS)) >= MAX_ACLS:
        raise ValueError(f"the store holds {MAX_ACLS} ACLs already (the limit)")
    try:
        await store.create(f"{ACLS}/{acl.key()}", msgspec.json.encode(acl))
    except NodeExistsError:
        return False
    await _changed(store)
    return True


async def list_acls(store: MetadataStore) -> list[Acl]:
    """Every ACL, sorted by principal, resource and operation."""
    try:
        keys = await store.children(ACLS)
    except NoNodeError:
        return []
    acls = []
    for key in keys:
        try:
            data, _ = await store.get(f"{ACLS}/{key}")
            acls.append(msgspec.json.decode(data, type=Acl))
        except (NoNodeError, msgspec.DecodeError):
            continue
    return sorted(
        acls, key=lambda a: (a.principal, a.resource_type, a.name, a.prefixed, a.operation)
    )


async def remove_acls(store: MetadataStore, acl: Acl) -> int:
    """Remove the ACL equal to ``acl`` (with operation ``all``: every operation); how many."""
    removed = 0
    for found in await list_acls(store):
        same = (
            found.principal == acl.principal
            and found.resource_type == acl.resource_type
            and found.name == acl.name
            and found.prefixed == acl.prefixed
            and (acl.operation == "all" or found.operation == acl.operation)
        )
        if same:
            try:
                await store.delete(f"{ACLS}/{found.key()}")
                removed += 1
            except NoNodeError:
                pass
    if removed:
        await _changed(store)
    return removed


class SecurityCache:
    """A broker's copy of the users and ACLs, reloaded whenever ``/security`` changes."""

    def __init__(self, store: MetadataStore, authorizer: Authorizer) -> None:
        self._store = store
        self.authorizer = authorizer
        self.credentials: dict[str, dict[str, ScramCredential]] = {}
        self.loaded = trio.Event()

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        """The credential of ``user`` for ``mechanism`` (None: no such user or mechanism)."""
        return self.credentials.get(user, {}).get(mechanism)

    async def reload(self) -> None:
        """Read every user and ACL again."""
        self.credentials = await _read_credentials(self._store)
        self.authorizer.replace(await list_acls(self._store))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the cache current until cancelled (started once it has loaded)."""
        async with self._store.watch_data(ROOT) as changes:
            started = False
            async for _ in changes:
                try:
                    await self.reload()
                except Exception:
                    log.exception("reading users and ACLs failed; the previous ones stay")
                if not started:
                    started = True
                    self.loaded.set()
                    task_status.started()


async def set_credentials(
    store: MetadataStore, name: str, credentials: list[ScramCredential]
) -> None:
    """Create ``name`` (or replace its credentials) with credentials derived elsewhere."""
    check_user_name(name)
    if not credentials:
        raise ValueError("a user needs at least one credential")
    for c in credentials:
        if c.mechanism not in SCRAM_MECHANISMS or not (
            MIN_ITERATIONS <= c.iterations <= MAX_ITERATIONS
        ):
            raise ValueError(f"a credential for {c.mechanism!r} with {c.iterations} iterations")
    await _ensure(store)
    data = msgspec.json.encode(_User(name, [_wire(c) for c in credentials]))
    path = f"{USERS}/{name}"
    if await store.exists(path) is None:
        if len(await store.children(USERS)) >= MAX_USERS:
            raise ValueError(f"the store holds {MAX_USERS} users already (the limit)")
        await store.create(path, data)
    else:
        await store.set(path, data)
    await _changed(store)


def encode_credentials(credentials: list[ScramCredential]) -> bytes:
    """The JSON a client sends to have a broker store these credentials."""
    return msgspec.json.encode([_wire(c) for c in credentials])


async def security_admin(store: MetadataStore, request: SecurityAdminRequest) -> tuple[bytes, int]:
    """Carry out a super user's SecurityAdminRequest on ``store``: (JSON data, count changed)."""
    action = request.action
    try:
        if action == "list-users":
            return msgspec.json.encode(await list_users(store)), 0
        if action == "list-acls":
            return msgspec.json.encode(await list_acls(store)), 0
        if action == "add-user":
            creds = msgspec.json.decode(request.credentials, type=list[_Credential])
            await set_credentials(
                store,
                request.user,
                [ScramCredential(*msgspec.structs.astuple(c)) for c in creds],
            )
            return b"", 1
        if action == "delete-user":
            return b"", int(await delete_user(store, request.user))
        acl = msgspec.json.decode(request.acl, type=Acl).check() if request.acl else None
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed security request: {exc}") from None
    if action == "add-acl" and acl is not None:
        return b"", int(await add_acl(store, acl))
    if action == "remove-acl" and acl is not None:
        return b"", await remove_acls(store, acl)
    raise ValueError(
        f"unknown security action {action!r} (add-user, delete-user, list-users, add-acl, "
        "remove-acl, list-acls)"
    )
