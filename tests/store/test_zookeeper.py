"""Behaviour specific to the ZooKeeper store: URLs, sessions, connection loss, restarts.

The contract suite (``test_contract.py``) already runs every interface test
on ZooKeeper. These tests cover what only a networked store has: a session
that can be suspended, expire or be shared by two clients, a server that
restarts, and ZooKeeper's own limits. They use a real server in real time
(short session timeouts, generous ``trio.fail_after`` bounds for a noisy
machine); faults are injected with a TCP proxy (``zkserver.TcpProxy``) that
can cut clients off a running server, or by restarting a private server.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import zkserver
from kazoo.client import KazooClient
from zkserver import ZooKeeperServer, ZooKeeperUnavailable, free_port, open_tcp_proxy

from trio_coord.store import (
    BadVersionError,
    Create,
    NoNodeError,
    SessionExpiredError,
    SessionState,
    SetData,
    Stat,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    ZooKeeperStore,
    open_zookeeper_store,
    parse_zk_url,
)
from trio_coord.store.zookeeper import DEFAULT_MAX_REQUEST_BYTES

WAIT = 30  # seconds: bounds for anything involving reconnects or expiry, never reached normally
SHORT_SESSION = 1.0  # seconds; the test server grants down to 0.4


@pytest.fixture
async def store(zookeeper_server: ZooKeeperServer, zk_chroot: str) -> AsyncIterator[ZooKeeperStore]:
    async with open_zookeeper_store(zookeeper_server.url(zk_chroot)) as s:
        yield s


# -- URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "hosts", "chroot"),
    [
        ("zk://h1:2181,h2:2182/app/coord", "h1:2181,h2:2182", "/app/coord"),
        ("ZK://h1:2181", "h1:2181", ""),
        ("zk://h1:2181/", "h1:2181", ""),
        ("h1,h2:3000", "h1:2181,h2:3000", ""),
        ("127.0.0.1:2181/x", "127.0.0.1:2181", "/x"),
        ("zk://[::1]:2181,[fe80::1]/c", "[::1]:2181,[fe80::1]:2181", "/c"),
    ],
)
def test_parse_zk_url(url: str, hosts: str, chroot: str) -> None:
    assert parse_zk_url(url) == (hosts, chroot)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("http://h1:2181", "unsupported scheme 'http'"),
        ("zk://", "no ZooKeeper host"),
        ("zk:///chroot", "no ZooKeeper host"),
        ("zk://h1,,h2", "empty host"),
        ("zk://h1:port", "bad port 'port'"),
        ("zk://h1:0", "bad port '0'"),
        ("zk://h1:65536", "bad port '65536'"),
        ("zk://::1:2181", "IPv6 addresses in brackets"),
        ("zk://[::1", "bad IPv6 host"),
        ("zk://h1:2181/a//b", "bad chroot"),
        ("zk://h1:2181/a/", "bad chroot"),
        ("zk://user@h1:2181", "only hosts and a chroot"),
        ("zk://h1:2181/a?x=1", "only hosts and a chroot"),
    ],
)
def test_parse_zk_url_rejects(url: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=re.escape(complaint)):
        parse_zk_url(url)


# -- opening ---------------------------------------------------------------------------


async def test_chroot_is_created_and_isolates(
    zookeeper_server: ZooKeeperServer, zk_chroot: str
) -> None:
    deep = f"{zk_chroot}/deep/er"
    async with open_zookeeper_store(zookeeper_server.url(deep)) as store:
        assert store.chroot == deep
        assert await store.create("/node", b"x") == "/node"
        assert await store.children("/") == ["node"]
        seq = await store.create("/node/s-", sequential=True)
        assert seq == "/node/s-0000000000"  # returned paths are store paths
        assert await store.multi([Create("/m")]) == ["/m"]
    async with open_zookeeper_store(zookeeper_server.url()) as root:
        assert root.chroot == ""
        assert await root.get(f"{deep}/node") == (b"x", Stat(version=0, cversion=1, num_children=1))
        # Without a chroot the store sees ZooKeeper's own node at the root.
        assert "zookeeper" in await root.children("/")


async def test_connect_timeout() -> None:
    port = free_port()  # nothing listens there
    with trio.fail_after(WAIT):
        start = trio.current_time()
        with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{port}/x within 0.5 s"):
            async with open_zookeeper_store(f"zk://127.0.0.1:{port}/x", connect_timeout=0.5):
                pytest.fail("connected to nothing")  # pragma: no cover
        assert trio.current_time() - start < 0.5 + 5  # and the kazoo client stopped promptly


async def test_bad_arguments(zookeeper_server: ZooKeeperServer) -> None:
    with pytest.raises(ValueError, match="session_timeout"):
        async with open_zookeeper_store(zookeeper_server.url(), session_timeout=0):
            pass  # pragma: no cover
    with pytest.raises(ValueError, match="connect_timeout"):
        async with open_zookeeper_store(zookeeper_server.url(), connect_timeout=-1):
            pass  # pragma: no cover
    with pytest.raises(ValueError, match="scheme"):
        async with open_zookeeper_store("zookeeper://h"):
            pass  # pragma: no cover


# -- what ZooKeeper adds or limits --------------------------------------------------------


async def test_session_id_is_zookeepers(store: ZooKeeperStore) -> None:
    session_id, _password = store._client.client_id
    assert store.session_id == session_id & (2**64 - 1) > 0
    assert store.session_state.value is SessionState.CONNECTED
    stat = await store.exists(await store.create("/e", ephemeral=True))
    assert stat is not None
    assert stat.ephemeral_owner == store.session_id


async def test_oversized_request_is_refused_without_losing_the_connection(
    store: ZooKeeperStore,
) -> None:
    big = b"x" * DEFAULT_MAX_REQUEST_BYTES
    with pytest.raises(StoreError, match=r"jute\.maxbuffer"):
        await store.create("/big", big)
    await store.create("/small")
    with pytest.raises(StoreError, match="/small"):
        await store.set("/small", big)
    with pytest.raises(StoreError, match=r"jute\.maxbuffer"):
        await store.multi(
            [SetData("/small", big[: len(big) // 2]), Create("/b", big[: len(big) // 2])]
        )
    assert store.session_state.value is SessionState.CONNECTED
    assert await store.get("/small") == (b"", Stat(version=0))


async def test_recursive_delete_of_a_subtree_larger_than_one_request(
    zookeeper_server: ZooKeeperServer, zk_chroot: str
) -> None:
    async with open_zookeeper_store(
        zookeeper_server.url(zk_chroot), max_request_bytes=2000
    ) as store:
        for i in range(30):
            await store.create(f"/tree/branch-{i // 10}/leaf-{i:02d}", make_parents=True)
        stat = await store.exists("/tree")
        assert stat is not None
        with pytest.raises(BadVersionError, match="/tree"):
            await store.delete("/tree", version=stat.version + 1, recursive=True)
        assert len(await store.children("/tree/branch-0")) == 10
        await store.delete("/tree", version=stat.version, recursive=True)
        assert await store.exists("/tree") is None
        assert await store.children("/") == []


async def test_make_parents_is_one_transaction_even_when_racing(store: ZooKeeperStore) -> None:
    async def make(i: int) -> None:
        await store.create(f"/a/b/c/n{i}", make_parents=True)

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(make, i)
    assert await store.children("/a/b/c") == [f"n{i}" for i in range(10)]


async def test_rewatching_a_path_keeps_one_kazoo_registration(store: ZooKeeperStore) -> None:
    await store.create("/w", b"1")
    for _ in range(20):
        async with store.watch_data("/w") as snaps, store.watch_children("/w") as kids:
            with trio.fail_after(WAIT):
                assert await anext(snaps) == (b"1", Stat(version=0))
                assert await anext(kids) == []
    full = store._full("/w")
    assert len(store._client._data_watchers[full]) == 1
    assert len(store._client._child_watchers[full]) == 1


async def test_a_cancelled_call_leaves_the_store_usable(store: ZooKeeperStore) -> None:
    await store.create("/c", b"0")
    for delay in (0, 0.0001, 0.001):
        with trio.move_on_after(delay):
            await store.set("/c", b"1")
    data, stat = await store.get("/c")
    assert stat.version in (0, 1, 2, 3)
    assert data in (b"0", b"1")


async def test_watch_iterator_raises_once_closed(store: ZooKeeperStore) -> None:
    async with store.watch_children("/") as kids:
        with trio.fail_after(WAIT):
            assert await anext(kids) == []
            await store.aclose()
            with pytest.raises(StoreClosedError, match="watch children of '/'"):
                await anext(kids)
    assert store.session_state.value is SessionState.CLOSED


# -- two sessions ----------------------------------------------------------------------------


async def test_two_sessions_see_each_others_writes_and_ephemerals(
    zookeeper_server: ZooKeeperServer, zk_chroot: str
) -> None:
    url = zookeeper_server.url(zk_chroot)
    async with open_zookeeper_store(url) as one, open_zookeeper_store(url) as two:
        assert one.session_id != two.session_id
        await one.create("/members")
        async with two.watch_children("/members") as members, two.watch_data("/cfg") as cfg:
            with trio.fail_after(WAIT):
                assert await anext(members) == []
                assert await anext(cfg) is None
                mine = await one.create("/members/m-", ephemeral=True, sequential=True)
                assert await anext(members) == [mine.rpartition("/")[2]]
                stat = await two.exists(mine)
                assert stat is not None
                assert stat.ephemeral_owner == one.session_id
                await one.create("/cfg", b"v1")
                assert await anext(cfg) == (b"v1", Stat(version=0))
                # Conditional writes across sessions.
                await two.set("/cfg", b"v2", version=0)
                with pytest.raises(BadVersionError, match="/cfg"):
                    await one.set("/cfg", b"stale", version=0)
                assert await anext(cfg) == (b"v2", Stat(version=1))
                # Closing a session removes its ephemerals for everyone.
                await one.aclose()
                assert await anext(members) == []
                assert await two.exists(mine) is None


# -- connection loss, restarts, expiry ---------------------------------------------------------


def _state_log(caplog: pytest.LogCaptureFixture, session_id: int) -> list[str]:
    """The states the store logged for one session, in order."""
    prefix = f"session 0x{session_id:x} is "
    return [
        r.getMessage().rpartition(prefix)[2]
        for r in caplog.records
        if r.name == "trio_coord.store.zookeeper" and prefix in r.getMessage()
    ]


async def test_connection_loss_suspends_and_the_session_survives(
    zookeeper_server: ZooKeeperServer, zk_chroot: str
) -> None:
    async with (
        open_tcp_proxy(zookeeper_server.port or 0) as proxy,
        open_zookeeper_store(zookeeper_server.url(zk_chroot)) as other,
        open_zookeeper_store(proxy.url(zk_chroot), session_timeout=10.0) as store,
    ):
        session = store.session_id
        member = await store.create("/member", ephemeral=True)
        await store.create("/w", b"before")
        await other.create("/kids")
        async with store.watch_data("/w") as snaps, store.watch_children("/kids") as kids:
            with trio.fail_after(WAIT):
                assert await anext(snaps) == (b"before", Stat(version=0))
                assert await anext(kids) == []
                proxy.block()
                await store.session_state.wait_value(SessionState.SUSPENDED)
                with pytest.raises(StoreConnectionError, match="/w"):
                    await store.get("/w")
                with pytest.raises(StoreConnectionError, match="/x"):
                    await store.create("/x")
                # Changes while this store is cut off: its kazoo watches are gone,
                # so only the re-read after the reconnect can see them.
                await other.set("/w", b"during")
                await other.create("/kids/k")
                proxy.unblock()
                await store.session_state.wait_value(SessionState.CONNECTED)
                assert await anext(snaps) == (b"during", Stat(version=1))
                assert await anext(kids) == ["k"]
                assert store.session_id == session
                assert (await store.exists(member)) is not None  # the session lived on
                # Watches are armed again.
                await other.set("/w", b"after")
                assert await anext(snaps) == (b"after", Stat(version=2))
                # A cut without a block: kazoo reconnects at once.
                proxy.cut()
                await other.delete("/kids/k")
                assert await anext(kids) == []
                await store.session_state.wait_value(SessionState.CONNECTED)
                assert await store.get("/w") == (b"after", Stat(version=2))
        assert store.session_id == session


async def test_server_restart_suspends_then_reconnects(
    private_zookeeper: ZooKeeperServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_coord.store.zookeeper")
    async with open_tcp_proxy(private_zookeeper.port or 0) as gate:
        # The store reaches the server through a gate that stays shut while the
        # server starts: ZooKeeper 3.8.0 can leave a connection that arrives
        # while it loads its data hanging (see zkserver), for as long as the
        # session timeout, and the session would expire meanwhile.
        async with open_zookeeper_store(gate.url("/app"), session_timeout=10.0) as store:
            session = store.session_id
            await store.create("/durable", b"1")
            member = await store.create("/member", ephemeral=True)
            async with store.watch_data("/durable") as snaps:
                with trio.fail_after(WAIT):
                    assert await anext(snaps) == (b"1", Stat(version=0))
                    await trio.to_thread.run_sync(private_zookeeper.stop)
                    await store.session_state.wait_value(SessionState.SUSPENDED)
                    gate.block()
                    await trio.to_thread.run_sync(private_zookeeper.start)
                    gate.unblock()
                    await store.session_state.wait_value(SessionState.CONNECTED)
                    assert store.session_id == session
                    assert await store.get("/durable") == (b"1", Stat(version=0))
                    assert await store.exists(member) is not None
                    async with open_zookeeper_store(private_zookeeper.url("/app")) as other:
                        await other.set("/durable", b"2")
                    assert await anext(snaps) == (b"2", Stat(version=1))
    assert _state_log(caplog, session) == ["connected", "suspended", "connected", "closed"]


async def test_session_expiry_after_a_partition(
    zookeeper_server: ZooKeeperServer, zk_chroot: str
) -> None:
    async with (
        open_tcp_proxy(zookeeper_server.port or 0) as proxy,
        open_zookeeper_store(zookeeper_server.url(zk_chroot)) as observer,
    ):
        async with open_zookeeper_store(
            proxy.url(zk_chroot), session_timeout=SHORT_SESSION
        ) as store:
            session = store.session_id
            await store.create("/leader", b"me", ephemeral=True)
            async with store.watch_data("/leader") as snaps:
                with trio.fail_after(WAIT):
                    snap = await anext(snaps)
                    assert snap is not None
                    proxy.block()
                    await store.session_state.wait_value(SessionState.SUSPENDED)
                    # The server expires the unreachable session: its ephemeral goes.
                    while await observer.exists("/leader") is not None:
                        await trio.sleep(0.05)
                    assert store.session_state.value is SessionState.SUSPENDED  # not known yet
                    proxy.unblock()
                    await store.session_state.wait_value(SessionState.EXPIRED)
                    with pytest.raises(SessionExpiredError, match="watch data of '/leader'"):
                        await anext(snaps)
            # The store is dead: every call says so; it does not use a new session.
            with pytest.raises(SessionExpiredError, match=f"0x{session:x}.*open a new one"):
                await store.get("/leader")
            with pytest.raises(SessionExpiredError, match="/leader"):
                await store.create("/leader", ephemeral=True)
            with pytest.raises(SessionExpiredError):
                async with store.watch_data("/leader"):
                    pass  # pragma: no cover
            assert store.session_state.value is SessionState.EXPIRED
            assert store.session_id == session
        assert store.session_state.value is SessionState.CLOSED
        with pytest.raises(StoreClosedError, match="/leader"):
            await store.get("/leader")
        assert await observer.exists("/leader") is None
        # The owner opens a new store: a new session.
        async with open_zookeeper_store(proxy.url(zk_chroot)) as again:
            assert again.session_id != session
            await again.create("/leader", b"me again", ephemeral=True)


async def test_session_closed_by_another_client_expires_the_store(
    zookeeper_server: ZooKeeperServer, zk_chroot: str
) -> None:
    """kazoo's own way to force an expiry: open the session elsewhere and close it."""
    async with open_zookeeper_store(zookeeper_server.url(zk_chroot), session_timeout=2.0) as store:
        await store.create("/e", ephemeral=True)
        client_id = store._client.client_id

        def close_session_elsewhere() -> None:
            other = KazooClient(zookeeper_server.hosts, client_id=client_id, timeout=2.0)
            other.start(timeout=WAIT)
            other.stop()
            other.close()

        await trio.to_thread.run_sync(close_session_elsewhere)
        with trio.fail_after(WAIT):
            await store.session_state.wait_value(SessionState.EXPIRED)
        with pytest.raises(SessionExpiredError):
            await store.exists("/e")
        with pytest.raises(SessionExpiredError):
            await store.multi([Create("/x")])
    async with open_zookeeper_store(zookeeper_server.url(zk_chroot)) as later:
        assert await later.exists("/e") is None
        with pytest.raises(NoNodeError):
            await later.get("/x")


# -- the test server helper itself ---------------------------------------------------------


def test_missing_zookeeper_fails_with_a_pointer_to_scripts_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zkserver, "ZOOKEEPER_JAR", tmp_path / "no-zookeeper.jar")
    with pytest.raises(ZooKeeperUnavailable, match="run scripts/test"):
        ZooKeeperServer(tmp_path)


def test_missing_java_fails_with_a_pointer_to_scripts_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ZooKeeperUnavailable, match=r"no 'java'.*run scripts/test"):
        ZooKeeperServer(tmp_path)
