"""The ZooKeeper metadata store: :class:`MetadataStore` on a ZooKeeper ensemble, through kazoo.

Its one job is to give brokers that form a cluster a shared
:class:`~trio_coord.store.base.MetadataStore` with the same semantics as the
embedded store: :class:`ZooKeeperStore` maps every call to ZooKeeper requests
(atomic multi-ops where the interface promises atomicity), ZooKeeper's
errors to the store's, kazoo's one-shot watches to level-triggered snapshot
iterators, and kazoo's connection states to :attr:`ZooKeeperStore.session_state`.
Open it with :func:`open_zookeeper_store`; :func:`parse_zk_url` reads
``zk://host:port,host:port/chroot``. Every crossing of kazoo's threads goes
through :mod:`trio_coord.store._kazoo_bridge`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import trio
from kazoo import exceptions as kz
from kazoo.security import OPEN_ACL_UNSAFE
from trio_util import AsyncValue

from .._aio import unwrap_lone_exception
from ._kazoo_bridge import KazooBridge, Pending, StateChange
from ._watch import Registry, WatchIterator, notify, notify_all, registered
from .base import (
    BadVersionError,
    Check,
    Create,
    Delete,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Op,
    SessionExpiredError,
    SessionState,
    SetData,
    Stat,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    parent_path,
    validate_path,
)

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_PORT",
    "ZooKeeperStore",
    "open_zookeeper_store",
    "parse_zk_url",
    "require_zk_url",
]

logger = logging.getLogger(__name__)

DEFAULT_PORT: Final = 2181
"""The port :func:`parse_zk_url` assumes for a host given without one."""

DEFAULT_MAX_REQUEST_BYTES: Final = 1024 * 1024 - 1
"""ZooKeeper's default ``jute.maxbuffer``: a server drops the connection of a
client that sends a larger request, so the store refuses such requests itself."""

_SEQ_DIGITS: Final = 10
_MASK64: Final = (1 << 64) - 1
_OP_OVERHEAD: Final = 64  # bytes per op besides path and data (header, ACL, version)
_RETRIES: Final = 20  # optimistic retries of make_parents / recursive delete under contention
_UNSET: Final = 0


def parse_zk_url(url_or_hosts: str) -> tuple[str, str]:
    """Split ``zk://h1:2181,h2:2181/chroot`` (or ``h1:2181,h2/chroot``) into hosts and chroot.

    Returns ``(hosts, chroot)``: ``hosts`` is the comma-separated
    ``host:port`` list kazoo takes, every host with its port (default
    :data:`DEFAULT_PORT`; IPv6 hosts in brackets, ``[::1]:2181``); ``chroot``
    is the path every store path lives under (``""`` for none, the ``/`` of
    the URL alone also meaning none). Raises ValueError, naming the problem,
    for another scheme, a missing or empty host, a bad port, or a chroot that
    is not a valid node path.
    """
    if not isinstance(url_or_hosts, str):
        raise ValueError(f"ZooKeeper address must be a string, not {type(url_or_hosts).__name__}")
    text = url_or_hosts.strip()
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme.lower() != "zk":
            raise ValueError(
                f"unsupported scheme {scheme!r} in ZooKeeper URL {url_or_hosts!r} "
                "(expected zk://host:port,host:port/chroot)"
            )
    else:
        rest = text
    if any(c in rest for c in "?#@ "):
        raise ValueError(
            f"ZooKeeper URL {url_or_hosts!r} may hold only hosts and a chroot "
            "(no user, query, fragment or spaces)"
        )
    netloc, slash, path = rest.partition("/")
    chroot = ""
    if slash and path:
        chroot = "/" + path
        try:
            validate_path(chroot)
        except ValueError as exc:
            raise ValueError(f"bad chroot in ZooKeeper URL {url_or_hosts!r}: {exc}") from None
    if not netloc:
        raise ValueError(f"no ZooKeeper host in {url_or_hosts!r} (expected host:port[,host:port])")
    hosts = []
    for entry in netloc.split(","):
        hosts.append(_parse_host(entry, url_or_hosts))
    return ",".join(hosts), chroot


def require_zk_url(store: str) -> str:
    """``store`` itself if it is a ``zk://`` URL :func:`parse_zk_url` accepts; else ValueError.

    Where an argument may name other stores too (a broker's ``--store``),
    only the ``zk://`` form is a ZooKeeper address, so every command that
    takes one insists on the scheme, with the same message.
    """
    scheme, sep, _rest = store.partition("://")
    if not sep or scheme.lower() != "zk":
        raise ValueError(
            f"store {store!r} is not a ZooKeeper URL: give zk://host:port[,host:port...]/chroot"
        )
    parse_zk_url(store)
    return store


def _parse_host(entry: str, url: str) -> str:
    if not entry:
        raise ValueError(f"empty host in ZooKeeper address {url!r}")
    if entry.startswith("["):
        host, bracket, port_text = entry[1:].partition("]")
        if not bracket or not host:
            raise ValueError(f"bad IPv6 host {entry!r} in ZooKeeper address {url!r}")
        if port_text and not port_text.startswith(":"):
            raise ValueError(f"bad host {entry!r} in ZooKeeper address {url!r}")
        port_text = port_text[1:]
        host = f"[{host}]"
    else:
        host, _, port_text = entry.partition(":")
        if not host or ":" in port_text:
            raise ValueError(
                f"bad host {entry!r} in ZooKeeper address {url!r} "
                "(write IPv6 addresses in brackets: [::1]:2181)"
            )
    if not port_text:
        return f"{host}:{DEFAULT_PORT}"
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port {port_text!r} for host {host} in ZooKeeper address {url!r}")
    return f"{host}:{int(port_text)}"


def _as_bytes(data: object, path: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"node data for {path!r} must be bytes, not {type(data).__name__}")


def _stat(zstat: Any) -> Stat:
    """The store's :class:`Stat` for kazoo's ``ZnodeStat`` (owner ids as unsigned 64-bit)."""
    return Stat(
        zstat.version,
        zstat.cversion,
        zstat.ephemeralOwner & _MASK64,
        zstat.numChildren,
    )


_T = TypeVar("_T")

_VERB: Final[dict[type, str]] = {Create: "create", SetData: "set", Delete: "delete", Check: "check"}


# --------------------------------------------------------------------------
# The store.


class ZooKeeperStore(MetadataStore):
    """A :class:`MetadataStore` on a ZooKeeper ensemble, bound to one ZooKeeper session.

    Open it with :func:`open_zookeeper_store`. Store paths live under the
    URL's chroot (created if missing): the store's ``/`` is the chroot node,
    and without a chroot ZooKeeper's own ``/zookeeper`` node is visible at the
    root. ``session_id`` is the ZooKeeper session id (as an unsigned 64-bit
    number, like every ``Stat.ephemeral_owner`` this store reports).

    Semantics, where ZooKeeper alone would differ from the interface:

    - ``create(make_parents=True)`` creates the missing ancestors and the node
      in one transaction (kazoo's ``makepath`` is not atomic);
    - ``delete(recursive=True)`` reads the subtree, then deletes it in one
      transaction that first checks the root's version, and raises
      :class:`NoNodeError` for a missing node (kazoo returns quietly). It
      retries if the subtree changes under it. A subtree too large for one
      request (see ``max_request_bytes``) is deleted in several transactions,
      each checking the root's version: then a failure can leave part of it
      deleted;
    - ``multi`` is one ZooKeeper transaction; the error of the first failing
      op is raised, with that op's path;
    - a request larger than ``max_request_bytes`` raises :class:`StoreError`
      instead of being sent (ZooKeeper would drop the whole connection).

    Session and connection (``session_state``, a ``trio_util.AsyncValue`` of
    :class:`SessionState`):

    - ``CONNECTED``: calls go to ZooKeeper.
    - ``SUSPENDED``: the connection is lost and kazoo reconnects in the
      background; the session lives on if it reconnects within the session
      timeout. Calls made now raise :class:`StoreConnectionError` at once;
      calls in flight when the connection dropped raise it too (a write may
      or may not have been applied). Retry once ``CONNECTED`` again
      (``await store.session_state.wait_value(SessionState.CONNECTED)``).
      Watch iterators just wait, then read the state afresh.
    - ``EXPIRED``: ZooKeeper expired the session (it learns this when it
      reconnects): its ephemeral nodes are gone, and this store object is
      dead: every call and watch iterator raises :class:`SessionExpiredError`.
      kazoo would silently open a new session; this store never does. The
      owner must leave the ``open_zookeeper_store`` block and open a new
      store, then re-create its ephemeral nodes. A broker steps down here.
    - ``CLOSED``: after ``aclose``: calls raise :class:`StoreClosedError`.

    ZooKeeper cannot expire a session while the servers are unreachable (it
    only tells the client so when it reconnects), and a restarted ensemble
    keeps its sessions, so ``SUSPENDED`` can last as long as an outage: treat
    anything held through ephemeral nodes as uncertain while it lasts.
    """

    def __init__(
        self,
        hosts: str,
        chroot: str = "",
        *,
        session_timeout: float = 10.0,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        auth: str | None = None,
    ) -> None:
        """Set up an unconnected store; :func:`open_zookeeper_store` connects it.

        Must be called on the Trio thread (it makes the kazoo bridge).
        """
        if session_timeout <= 0:
            raise ValueError(f"session_timeout must be positive, not {session_timeout!r}")
        if max_request_bytes <= 0:
            raise ValueError(f"max_request_bytes must be positive, not {max_request_bytes!r}")
        if chroot:
            validate_path(chroot)
        self.hosts = hosts
        """The ``host:port,...`` list this store connects to."""
        self.chroot = "" if chroot == "/" else chroot
        """The ZooKeeper path under which the store's tree lives (``""`` for none)."""
        self.session_timeout = session_timeout
        """The session timeout asked for, in seconds (ZooKeeper may clamp it)."""
        self.max_request_bytes = max_request_bytes
        self._bridge = KazooBridge(hosts, session_timeout=session_timeout, auth=auth)
        self._client = self._bridge.client
        self._state = AsyncValue(SessionState.SUSPENDED)  # not yet connected
        self._session_id = _UNSET
        self._closing = False
        self._closed = trio.Event()
        self._data_watches: Registry = {}
        self._child_watches: Registry = {}
        # One kazoo callback each, made once: kazoo keeps one registration per
        # path and callback, so re-arming a watch never piles up callbacks.
        self._data_cb = self._bridge.callback(self._on_data_event)
        self._child_cb = self._bridge.callback(self._on_child_event)

    def _where(self) -> str:
        return f"ZooKeeper {self.hosts}{self.chroot}"

    @property
    def session_id(self) -> int:
        """The ZooKeeper session id (unsigned 64-bit), owner of this store's ephemeral nodes."""
        return self._session_id

    @property
    def session_state(self) -> AsyncValue:
        """The session's :class:`SessionState` (see the class docstring for each state)."""
        return self._state

    # -- paths ------------------------------------------------------------------

    def _full(self, path: str) -> str:
        """The ZooKeeper path of store path ``path``."""
        if path == "/":
            return self.chroot or "/"
        return self.chroot + path

    def _rel(self, full: str) -> str:
        """The store path of ZooKeeper path ``full`` (which lies under the chroot)."""
        if not self.chroot:
            return full
        return full[len(self.chroot) :] or "/"

    # -- session ----------------------------------------------------------------

    def _check_usable(self, what: str, path: str, *, suspended_ok: bool = False) -> None:
        state = self._state.value
        if state is SessionState.CONNECTED:
            return
        if state is SessionState.SUSPENDED:
            if suspended_ok:
                return
            raise StoreConnectionError(
                f"cannot {what} {path!r}: the connection to {self._where()} is lost "
                "(the session may still be alive; retry once session_state is CONNECTED)"
            )
        if state is SessionState.EXPIRED:
            raise SessionExpiredError(
                f"cannot {what} {path!r}: ZooKeeper session 0x{self._session_id:x} on "
                f"{self._where()} has expired; this store is dead, open a new one"
            )
        raise StoreClosedError(f"cannot {what} {path!r}: the store on {self._where()} is closed")

    def _set_state(self, state: SessionState) -> None:
        if self._state.value is not state:
            logger.log(
                logging.WARNING if state is SessionState.EXPIRED else logging.INFO,
                "%s: session 0x%x is %s",
                self._where(),
                self._session_id,
                state.value,
            )
            self._state.value = state
        self._notify_all_watches()

    async def _run_session(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Follow kazoo's connection states (one task, for the store's lifetime)."""
        task_status.started()
        async for change in self._bridge.state_changes:
            self._on_state_change(change)
            if self._state.value is SessionState.EXPIRED and not self._closing:
                # Make sure kazoo does not linger with a new session of its own.
                with trio.CancelScope(shield=True):
                    await self._bridge.stop()

    def _on_state_change(self, change: StateChange) -> None:
        current = self._state.value
        if self._closing or current in (SessionState.EXPIRED, SessionState.CLOSED):
            return  # final states
        if change.state == "CONNECTED":
            session_id = (change.session_id or 0) & _MASK64
            if self._session_id == _UNSET:
                self._session_id = session_id
            elif session_id != self._session_id:
                # A new session: the old one expired (kazoo reports LOST first;
                # this is a second line of defence).
                self._set_state(SessionState.EXPIRED)
                return
            self._set_state(SessionState.CONNECTED)
        elif change.state == "SUSPENDED":
            if self._session_id != _UNSET:
                self._set_state(SessionState.SUSPENDED)
        elif change.state == "LOST":
            if self._session_id != _UNSET:
                self._set_state(SessionState.EXPIRED)

    async def _connect(self, connect_timeout: float) -> None:
        """Connect, wait for the session, and create the chroot if missing."""
        await self._bridge.start()
        with trio.move_on_after(connect_timeout):
            await self._state.wait_value(SessionState.CONNECTED)
        if self._state.value is not SessionState.CONNECTED:
            raise StoreConnectionError(
                f"could not connect to {self._where()} within {connect_timeout} s "
                "(is ZooKeeper running there?)"
            )
        if self.chroot:
            ancestors = []
            node = self.chroot
            while node != "/":
                ancestors.append(node)
                node = parent_path(node)
            for full in reversed(ancestors):
                # The chroot's ancestors may be shared with other clusters (or tests): they
                # stay open; the digest ACL (--zk-auth) closes the chroot and what is in it.
                acl = OPEN_ACL_UNSAFE if full != self.chroot else None
                with contextlib.suppress(NodeExistsError):
                    if (
                        await self._request("check chroot", full, self._client.exists_async, full)
                        is not None
                    ):
                        continue
                    await self._request(
                        "create chroot", full, self._client.create_async, full, b"", acl
                    )

    async def aclose(self) -> None:
        """End the session: ZooKeeper removes its ephemeral nodes; further calls raise.

        Idempotent; also after the session expired. Watch iterators raise
        :class:`StoreClosedError` afterwards.
        """
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            self._set_state(SessionState.CLOSED)
            with trio.CancelScope(shield=True):
                await self._bridge.stop()
        finally:
            self._closed.set()

    # -- requests ----------------------------------------------------------------

    async def _kazoo(
        self, what: str, path: str, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Issue one kazoo request for a store call and return its reply.

        Raises the store's errors for an unusable store and kazoo's for the
        request (the caller maps them, knowing what it asked for).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._check_usable(what, path)
            pending = self._bridge.submit(method, *args, **kwargs)
        except (StoreError, kz.KazooException):
            await trio.lowlevel.cancel_shielded_checkpoint()
            raise
        return await pending.result()

    def _error(
        self, exc: BaseException, what: str, path: str, *, version: int = -1
    ) -> BaseException:
        """The store error for kazoo's ``exc`` from ``what`` on store path ``path``."""
        if isinstance(exc, StoreError | ValueError | TypeError):
            return exc
        if isinstance(exc, kz.NoNodeError):
            if what == "create":
                return NoNodeError(
                    f"cannot create {path!r}: parent node {parent_path(path)!r} does not exist"
                )
            return NoNodeError(f"cannot {what} {path!r}: no node at that path")
        if isinstance(exc, kz.NodeExistsError):
            return NodeExistsError(f"cannot {what} {path!r}: node already exists")
        if isinstance(exc, kz.BadVersionError):
            return BadVersionError(
                f"cannot {what} {path!r}: version mismatch (expected version {version})"
            )
        if isinstance(exc, kz.NotEmptyError):
            return NotEmptyError(
                f"cannot {what} {path!r}: it has children "
                "(delete them first or pass recursive=True)"
            )
        if isinstance(exc, kz.NoChildrenForEphemeralsError):
            return StoreError(
                f"cannot {what} {path!r}: parent {parent_path(path)!r} is an ephemeral node, "
                "and ephemeral nodes cannot have children"
            )
        if isinstance(exc, kz.SessionExpiredError | kz.ConnectionClosedError):
            if self._closing:
                return StoreClosedError(
                    f"cannot {what} {path!r}: the store on {self._where()} is closed"
                )
            if isinstance(exc, kz.SessionExpiredError) or self._bridge.lost:
                return SessionExpiredError(
                    f"cannot {what} {path!r}: ZooKeeper session 0x{self._session_id:x} on "
                    f"{self._where()} has expired; this store is dead, open a new one"
                )
        if isinstance(exc, kz.ConnectionLoss | kz.ConnectionClosedError | kz.OperationTimeoutError):
            return StoreConnectionError(
                f"cannot {what} {path!r}: lost the connection to {self._where()}; "
                "the call may or may not have taken effect"
            )
        if isinstance(exc, kz.BadArgumentsError):
            return ValueError(f"ZooKeeper rejected the path or arguments of {what} {path!r}")
        return StoreError(
            f"cannot {what} {path!r}: ZooKeeper error {type(exc).__name__}: {exc}".rstrip(": ")
        )

    async def _request(
        self,
        what: str,
        path: str,
        method: Callable[..., Any],
        *args: Any,
        version: int = -1,
        **kwargs: Any,
    ) -> Any:
        """:meth:`_kazoo`, with kazoo's errors mapped to the store's."""
        try:
            return await self._kazoo(what, path, method, *args, **kwargs)
        except kz.KazooException as exc:
            raise self._error(exc, what, path, version=version) from exc

    def _check_size(self, what: str, path: str, nbytes: int) -> None:
        if nbytes > self.max_request_bytes:
            raise StoreError(
                f"cannot {what} {path!r}: the request would be about {nbytes} bytes, more than "
                f"ZooKeeper accepts ({self.max_request_bytes} bytes, jute.maxbuffer)"
            )

    @staticmethod
    def _op_bytes(path: str, data: bytes = b"") -> int:
        return len(path.encode()) + len(data) + _OP_OVERHEAD

    async def _transaction(
        self, what: str, path: str, ops: Sequence[tuple[Op, bool]]
    ) -> list[str | Stat | None]:
        """Run ``(op, sequential)`` pairs as one ZooKeeper transaction.

        Raises the store error of the first failing op (the ops were already
        validated).
        """
        self._check_size(
            what,
            path,
            _OP_OVERHEAD + sum(self._op_bytes(op.path, getattr(op, "data", b"")) for op, _ in ops),
        )
        tx = self._client.transaction()
        for op, sequential in ops:
            full = self.chroot + op.path if sequential else self._full(op.path)
            if isinstance(op, Create):
                tx.create(full, op.data, ephemeral=op.ephemeral, sequence=sequential)
            elif isinstance(op, SetData):
                tx.set_data(full, op.data, op.version)
            elif isinstance(op, Delete):
                tx.delete(full, op.version)
            else:
                tx.check(full, op.version)
        results = await self._request(what, path, tx.commit_async)
        if len(results) != len(ops):
            raise StoreError(
                f"cannot {what} {path!r}: ZooKeeper answered {len(results)} results "
                f"for {len(ops)} operations"
            )
        failures = [
            (index, result)
            for index, result in enumerate(results)
            if isinstance(result, Exception)
            and not isinstance(result, kz.RolledBackError | kz.RuntimeInconsistency)
        ]
        if failures:
            index, exc = failures[0]
            op = ops[index][0]
            raise _TransactionFailed(
                index,
                self._error(exc, _VERB[type(op)], op.path, version=getattr(op, "version", -1)),
            )
        if any(isinstance(result, Exception) for result in results):
            raise StoreError(f"cannot {what} {path!r}: ZooKeeper rolled the transaction back")
        out: list[str | Stat | None] = []
        for (op, _), result in zip(ops, results, strict=True):
            if isinstance(op, Create):
                out.append(self._rel(result))
            elif isinstance(op, SetData):
                out.append(_stat(result))
            else:
                out.append(None)
        return out

    # -- public API -------------------------------------------------------------

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        """Create a node and return its path (see :meth:`MetadataStore.create`).

        With ``make_parents=True`` the missing ancestors and the node are
        created in one transaction.
        """
        if sequential:
            try:
                validate_path(path + "0" * _SEQ_DIGITS)
            except ValueError:
                raise ValueError(f"invalid sequential node path prefix: {path!r}") from None
        else:
            validate_path(path)
        data = _as_bytes(data, path)
        if path == "/" and not sequential:
            await trio.lowlevel.checkpoint()
            self._check_usable("create", path)
            raise NodeExistsError("cannot create '/': node already exists")
        self._check_size("create", path, self._op_bytes(self._full(path), data))
        full = self.chroot + path if sequential else self._full(path)
        try:
            created = await self._kazoo(
                "create",
                path,
                self._client.create_async,
                full,
                data,
                ephemeral=ephemeral,
                sequence=sequential,
            )
        except kz.NoNodeError as exc:
            if not make_parents:
                raise self._error(exc, "create", path) from exc
        except kz.KazooException as exc:
            raise self._error(exc, "create", path) from exc
        else:
            return self._rel(created)
        return await self._create_with_parents(path, data, ephemeral, sequential)

    async def _create_with_parents(
        self, path: str, data: bytes, ephemeral: bool, sequential: bool
    ) -> str:
        """Create the missing ancestors of ``path`` and the node, in one transaction."""
        ancestors = []
        node = parent_path(path)
        while node != "/":
            ancestors.append(node)
            node = parent_path(node)
        ancestors.reverse()  # top-down
        error: BaseException | None = None
        for _ in range(_RETRIES):
            # Which ancestors exist? Ask about all of them at once (pipelined).
            pendings = await self._submit_all(
                "create", path, [(self._client.exists_async, self._full(a)) for a in ancestors]
            )
            exist = [await self._reply("create", path, p) is not None for p in pendings]
            # Everything below the deepest existing ancestor must be created.
            deepest = max((i for i, there in enumerate(exist) if there), default=-1)
            missing = ancestors[deepest + 1 :]
            ops: list[tuple[Op, bool]] = [(Create(a), False) for a in missing]
            ops.append((Create(path, data, ephemeral), sequential))
            try:
                results = await self._transaction("create", path, ops)
            except _TransactionFailed as failed:
                if failed.index == len(ops) - 1:
                    raise failed.error from None
                # An ancestor appeared or vanished under us: look again.
                error = failed.error
                continue
            created = results[-1]
            assert isinstance(created, str)
            return created
        assert error is not None
        raise error

    async def _submit_all(
        self, what: str, path: str, calls: Sequence[tuple[Callable[..., Any], str]]
    ) -> list[Pending]:
        """Issue several one-path kazoo requests at once (pipelined); await each with _reply."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._check_usable(what, path)
            return [self._bridge.submit(method, full) for method, full in calls]
        except kz.KazooException as exc:
            await trio.lowlevel.cancel_shielded_checkpoint()
            raise self._error(exc, what, path) from exc
        except StoreError:
            await trio.lowlevel.cancel_shielded_checkpoint()
            raise

    async def _reply(self, what: str, path: str, pending: Pending) -> Any:
        try:
            return await pending.result()
        except kz.KazooException as exc:
            raise self._error(exc, what, path) from exc

    async def get(self, path: str) -> tuple[bytes, Stat]:
        """Return the node's data and stat; :class:`NoNodeError` if absent."""
        validate_path(path)
        data, zstat = await self._request("get", path, self._client.get_async, self._full(path))
        return data or b"", _stat(zstat)

    async def exists(self, path: str) -> Stat | None:
        """Return the node's stat, or None if there is no node at ``path``."""
        validate_path(path)
        zstat = await self._request(
            "check existence of", path, self._client.exists_async, self._full(path)
        )
        return None if zstat is None else _stat(zstat)

    async def children(self, path: str) -> list[str]:
        """Return the sorted names of the node's children; :class:`NoNodeError` if absent."""
        validate_path(path)
        names = await self._request(
            "list children of", path, self._client.get_children_async, self._full(path)
        )
        return sorted(names)

    async def set(self, path: str, data: bytes, *, version: int = -1) -> Stat:
        """Replace the node's data if its version matches (-1: any); return the new stat."""
        validate_path(path)
        data = _as_bytes(data, path)
        self._check_size("set", path, self._op_bytes(self._full(path), data))
        zstat = await self._request(
            "set", path, self._client.set_async, self._full(path), data, version, version=version
        )
        return _stat(zstat)

    async def delete(self, path: str, *, version: int = -1, recursive: bool = False) -> None:
        """Delete the node, or with ``recursive=True`` its subtree (see the class docstring)."""
        validate_path(path)
        if path == "/":
            await trio.lowlevel.checkpoint()
            self._check_usable("delete", path)
            raise StoreError("cannot delete the root node '/'")
        if not recursive:
            await self._request(
                "delete",
                path,
                self._client.delete_async,
                self._full(path),
                version,
                version=version,
            )
            return
        error: BaseException | None = None
        for _ in range(_RETRIES):
            subtree = await self._subtree(path)
            try:
                await self._delete_subtree(path, version, subtree)
            except _TransactionFailed as failed:
                if failed.index == 0:  # the check of the root itself
                    raise failed.error from None
                error = failed.error  # the subtree changed under us: look again
                continue
            return
        assert error is not None
        raise error

    async def _subtree(self, path: str) -> list[str]:
        """The store paths of ``path``'s subtree, children before parents.

        Reads one level at a time, all of a level's nodes at once. Raises
        :class:`NoNodeError` if ``path`` itself does not exist.
        """
        order = [path]
        level = [path]
        while level:
            pendings = await self._submit_all(
                "delete", path, [(self._client.get_children_async, self._full(p)) for p in level]
            )
            below: list[str] = []
            for parent, pending in zip(level, pendings, strict=True):
                try:
                    names = await self._reply("delete", parent, pending)
                except NoNodeError:
                    if parent == path:
                        raise
                    continue  # deleted meanwhile: the transaction will notice
                prefix = parent + "/"
                below.extend(prefix + name for name in names)
            order.extend(below)
            level = below
        order.reverse()
        return order

    async def _delete_subtree(self, path: str, version: int, subtree: list[str]) -> None:
        """Delete ``subtree`` (children first) in as few transactions as fit a request."""
        check = (Check(path, version), False)
        budget = self.max_request_bytes - 2 * _OP_OVERHEAD - self._op_bytes(self._full(path))
        batch: list[tuple[Op, bool]] = [check]
        size = 0
        for node in subtree:
            cost = self._op_bytes(self._full(node))
            if len(batch) > 1 and size + cost > budget:
                await self._transaction("delete", path, batch)
                batch, size = [check], 0
            batch.append((Delete(node), False))
            size += cost
        await self._transaction("delete", path, batch)

    async def multi(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        """Apply ``ops`` atomically in one ZooKeeper transaction (see MetadataStore.multi)."""
        checked: list[tuple[Op, bool]] = []
        for op in ops:
            if not isinstance(op, Create | SetData | Delete | Check):
                raise TypeError(f"not a store operation: {op!r}")
            validate_path(op.path)
            if isinstance(op, Create | SetData):
                data = _as_bytes(op.data, op.path)
                if data is not op.data:
                    op = (
                        Create(op.path, data, op.ephemeral)
                        if isinstance(op, Create)
                        else SetData(op.path, data, op.version)
                    )
            checked.append((op, False))
        first = checked[0][0].path if checked else "/"
        what = "run a multi-op starting at"
        for op, _ in checked:
            if op.path == "/" and isinstance(op, Delete):
                await trio.lowlevel.checkpoint()
                self._check_usable(what, first)
                raise StoreError("cannot delete the root node '/'")
        if not checked:
            await trio.lowlevel.checkpoint()
            self._check_usable(what, first)
            return []
        try:
            return await self._transaction(what, first, checked)
        except _TransactionFailed as failed:
            raise failed.error from None

    # -- watches ----------------------------------------------------------------

    def _on_data_event(self, event: Any) -> None:
        """A kazoo data watch fired (on the Trio thread, through the bridge)."""
        if event.path is not None:  # None: a disconnect, handled by the session task
            notify(self._data_watches, event.path)

    def _on_child_event(self, event: Any) -> None:
        """A kazoo child (or parent-existence) watch fired (on the Trio thread)."""
        if event.path is not None:
            notify(self._child_watches, event.path)

    def _notify_all_watches(self) -> None:
        notify_all(self._data_watches, self._child_watches)

    async def _read_data(self, what: str, path: str) -> tuple[bytes, Stat] | None:
        """Read the node with a data watch armed (or, if absent, an existence watch)."""
        full = self._full(path)
        while True:
            try:
                data, zstat = await self._kazoo(
                    what, path, self._client.get_async, full, watch=self._data_cb
                )
            except kz.NoNodeError:
                pass
            except kz.KazooException as exc:
                raise self._error(exc, what, path) from exc
            else:
                return data or b"", _stat(zstat)
            zstat = await self._request(
                what, path, self._client.exists_async, full, watch=self._data_cb
            )
            if zstat is None:
                return None
            # Created between the two reads: read it.

    async def _read_children(self, what: str, path: str) -> list[str]:
        """Read the children with a child watch armed (or, if absent, an existence watch)."""
        full = self._full(path)
        while True:
            try:
                names = await self._kazoo(
                    what, path, self._client.get_children_async, full, watch=self._child_cb
                )
            except kz.NoNodeError:
                pass
            except kz.KazooException as exc:
                raise self._error(exc, what, path) from exc
            else:
                return sorted(names)
            zstat = await self._request(
                what, path, self._client.exists_async, full, watch=self._child_cb
            )
            if zstat is None:
                return []

    @asynccontextmanager
    async def _watch(
        self,
        registry: Registry,
        what: str,
        path: str,
        read: Callable[[str, str], Awaitable[_T]],
    ) -> AsyncIterator[WatchIterator[_T]]:
        """A snapshot iterator over ``read``; waits while suspended, re-reads after a reconnect."""
        validate_path(path)
        await trio.lowlevel.checkpoint()
        self._check_usable(what, path, suspended_ok=True)

        async def gate() -> None:
            while True:
                self._check_usable(what, path, suspended_ok=True)
                if self._state.value is not SessionState.SUSPENDED:
                    return
                await self._state.wait_value(lambda s: s is not SessionState.SUSPENDED)

        async def read_through_drops() -> _T:
            failures = 0
            while True:
                try:
                    return await read(what, path)
                except StoreConnectionError:
                    # The connection dropped under the read: read again once it is back.
                    failures += 1
                    await trio.sleep(min(0.005 * 2**failures, 0.5))
                    await gate()

        with registered(registry, self._full(path)) as watch:
            yield WatchIterator(watch, read_through_drops, gate)

    def watch_data(
        self, path: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[tuple[bytes, Stat] | None]]:
        """Watch one node's data (see :meth:`MetadataStore.watch_data`).

        Each snapshot is read from ZooKeeper with a one-shot watch armed; the
        watch firing (creation, a write, deletion) makes the next snapshot due.
        Equal consecutive snapshots are skipped. Raises :class:`StoreClosedError`
        once the store closes and :class:`SessionExpiredError` once the
        session expired; waits while the connection is lost.
        """
        return self._watch(self._data_watches, "watch data of", path, self._read_data)

    def watch_children(
        self, path: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[list[str]]]:
        """Watch a node's sorted child names (see :meth:`MetadataStore.watch_children`).

        Same snapshot rules as :meth:`watch_data`; woken when a child is
        created or deleted, or the node itself is created or deleted.
        """
        return self._watch(self._child_watches, "watch children of", path, self._read_children)


class _TransactionFailed(Exception):
    """Internal: op ``index`` of a transaction failed with the store error ``error``."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


@asynccontextmanager
async def open_zookeeper_store(
    url_or_hosts: str,
    *,
    session_timeout: float = 10.0,
    connect_timeout: float = 10.0,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    auth: str | None = None,
) -> AsyncIterator[ZooKeeperStore]:
    """Connect to ZooKeeper and yield a :class:`ZooKeeperStore` for the duration of the block.

    ``url_or_hosts`` is ``zk://host:port[,host:port...][/chroot]`` or the same
    without ``zk://`` (see :func:`parse_zk_url`); the chroot is created if
    missing. ``session_timeout`` (seconds) is asked of ZooKeeper, which clamps
    it to its configured bounds (by default 2 to 20 ticks). Raises
    :class:`StoreConnectionError` if no server answers within
    ``connect_timeout`` seconds. On exit the session is closed, so its
    ephemeral nodes vanish at once. A lone exception from the block is
    re-raised as is, not wrapped in an exception group.

    After :class:`SessionExpiredError` (``session_state`` is ``EXPIRED``) the
    store is dead: leave the block and open a new store. ``auth``
    (``user:password``) logs in with ZooKeeper's digest scheme, and every node
    the store creates is readable and writable by that user only.
    """
    hosts, chroot = parse_zk_url(url_or_hosts)
    if connect_timeout <= 0:
        raise ValueError(f"connect_timeout must be positive, not {connect_timeout!r}")
    store = ZooKeeperStore(
        hosts,
        chroot,
        session_timeout=session_timeout,
        max_request_bytes=max_request_bytes,
        auth=auth,
    )
    with unwrap_lone_exception():
        async with trio.open_nursery() as nursery:
            await nursery.start(store._run_session)
            try:
                await store._connect(connect_timeout)
                yield store
            finally:
                with trio.CancelScope(shield=True):
                    await store.aclose()
                nursery.cancel_scope.cancel()
