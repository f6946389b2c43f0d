"""Contract tests every MetadataStore backend must pass.

The tests only use the abstract interface, through the ``backend`` and
``store`` fixtures. To run them against another backend, write an async
context manager that takes the test's ``pytest.FixtureRequest`` and yields a
:class:`Backend` for it (see :func:`embedded_backend`) and add it to
``BACKENDS``. The ZooKeeper factory (:func:`zookeeper_backend`) gives each
test its own chroot on the private server that the test session starts
(the ``zookeeper_server`` fixture); it never skips (``scripts/test`` installs
ZooKeeper, and CI must run these tests).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from trio_coord.store import (
    BadVersionError,
    Check,
    Create,
    Delete,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionState,
    SetData,
    Stat,
    StoreClosedError,
    StoreError,
    open_embedded_store,
    open_zookeeper_store,
)

WAIT = 5  # seconds before a watch test gives up instead of hanging


@dataclass(frozen=True)
class Backend:
    """How the contract tests reach one backend.

    ``session()`` opens a new session on the same underlying data.
    ``concurrent_sessions`` says whether two sessions may be open at once
    (the embedded store is single-process: it locks its directory).
    """

    name: str
    session: Callable[[], AbstractAsyncContextManager[MetadataStore]]
    concurrent_sessions: bool


@asynccontextmanager
async def embedded_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """The embedded store, in a fresh directory under the test's ``tmp_path``."""
    tmp_path: Path = request.getfixturevalue("tmp_path")
    data_dir = tmp_path / "store"
    yield Backend("embedded", lambda: open_embedded_store(data_dir), concurrent_sessions=False)


@asynccontextmanager
async def zookeeper_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """The ZooKeeper store, in a fresh chroot on the test run's ZooKeeper server."""
    server = request.getfixturevalue("zookeeper_server")
    url = server.url(request.getfixturevalue("zk_chroot"))
    yield Backend("zookeeper", lambda: open_zookeeper_store(url), concurrent_sessions=True)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[Backend]]] = {
    "embedded": embedded_backend,
    "zookeeper": zookeeper_backend,
}


@pytest.fixture(params=sorted(BACKENDS))
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with BACKENDS[request.param](request) as b:
        yield b


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[MetadataStore]:
    async with backend.session() as s:
        yield s


# -- basic CRUD and versions ---------------------------------------------------


async def test_root_exists(store: MetadataStore) -> None:
    data, stat = await store.get("/")
    assert data == b""
    assert await store.exists("/") is not None
    assert stat.ephemeral_owner == 0


async def test_create_get_set_delete_with_versions(store: MetadataStore) -> None:
    assert await store.create("/a", b"one") == "/a"
    data, stat = await store.get("/a")
    assert data == b"one"
    assert stat == Stat(version=0, cversion=0, ephemeral_owner=0, num_children=0)
    assert await store.exists("/a") == stat

    stat = await store.set("/a", b"two")
    assert stat.version == 1
    stat = await store.set("/a", b"three", version=1)
    assert stat.version == 2
    assert await store.get("/a") == (b"three", stat)

    with pytest.raises(BadVersionError, match="/a"):
        await store.set("/a", b"stale", version=1)
    with pytest.raises(BadVersionError, match="/a"):
        await store.delete("/a", version=0)
    assert (await store.get("/a"))[0] == b"three"

    await store.delete("/a", version=2)
    assert await store.exists("/a") is None
    with pytest.raises(NoNodeError, match="/a"):
        await store.get("/a")


async def test_missing_nodes(store: MetadataStore) -> None:
    with pytest.raises(NoNodeError, match="/nope"):
        await store.get("/nope")
    with pytest.raises(NoNodeError, match="/nope"):
        await store.set("/nope", b"x")
    with pytest.raises(NoNodeError, match="/nope"):
        await store.delete("/nope")
    with pytest.raises(NoNodeError, match="/nope"):
        await store.children("/nope")
    assert await store.exists("/nope") is None


async def test_create_existing_raises(store: MetadataStore) -> None:
    await store.create("/a", b"1")
    with pytest.raises(NodeExistsError, match="/a"):
        await store.create("/a", b"2")
    assert (await store.get("/a"))[0] == b"1"


async def test_create_needs_parent_unless_make_parents(store: MetadataStore) -> None:
    with pytest.raises(NoNodeError, match="/x/y"):
        await store.create("/x/y/z", b"leaf")
    assert await store.exists("/x") is None

    assert await store.create("/x/y/z", b"leaf", make_parents=True) == "/x/y/z"
    assert await store.get("/x/y/z") == (b"leaf", Stat(version=0))
    for parent in ("/x", "/x/y"):
        data, stat = await store.get(parent)
        assert data == b""
        assert stat.ephemeral_owner == 0
        assert stat.num_children == 1
    # make_parents with existing parents just creates the node ...
    await store.create("/x/y/w", make_parents=True)
    # ... and still refuses to overwrite the node itself.
    with pytest.raises(NodeExistsError, match="/x/y/w"):
        await store.create("/x/y/w", make_parents=True)


async def test_data_must_be_bytes(store: MetadataStore) -> None:
    with pytest.raises(TypeError):
        await store.create("/a", "text")  # type: ignore[arg-type]


# -- children and sequential nodes --------------------------------------------


async def test_children_sorted_and_counted(store: MetadataStore) -> None:
    await store.create("/c")
    for name in ("b", "c", "a"):
        await store.create(f"/c/{name}")
    assert await store.children("/c") == ["a", "b", "c"]
    stat = await store.exists("/c")
    assert stat is not None
    assert stat.num_children == 3
    assert stat.cversion == 3
    await store.delete("/c/b")
    assert await store.children("/c") == ["a", "c"]
    stat = await store.exists("/c")
    assert stat is not None
    assert (stat.num_children, stat.cversion, stat.version) == (2, 4, 0)


async def test_sequential_names(store: MetadataStore) -> None:
    await store.create("/q")
    first = await store.create("/q/item-", b"a", sequential=True)
    second = await store.create("/q/item-", b"b", sequential=True)
    other = await store.create("/q/other-", sequential=True)
    assert first == "/q/item-0000000000"
    assert second == "/q/item-0000000001"
    # The counter belongs to the parent, shared by all its children.
    assert other == "/q/other-0000000002"
    assert await store.get(second) == (b"b", Stat(version=0))
    await store.delete(first)
    # Deleting never lets a number be reused. (How far the counter moves on a
    # delete is backend-specific: ZooKeeper derives it from the cversion.)
    third = await store.create("/q/item-", sequential=True)
    assert third.startswith("/q/item-")
    assert len(third) == len("/q/item-") + 10
    assert int(third[-10:]) > 2
    assert await store.children("/q") == ["item-0000000001", third[3:], "other-0000000002"]


async def test_sequential_ephemeral(store: MetadataStore) -> None:
    await store.create("/e")
    path = await store.create("/e/m-", ephemeral=True, sequential=True)
    assert path == "/e/m-0000000000"
    stat = await store.exists(path)
    assert stat is not None
    assert stat.ephemeral_owner == store.session_id


# -- delete -----------------------------------------------------------------------


async def test_delete_non_empty_and_recursive(store: MetadataStore) -> None:
    await store.create("/r/a/b", b"deep", make_parents=True)
    await store.create("/r/c")
    await store.create("/keep")
    with pytest.raises(NotEmptyError, match="/r"):
        await store.delete("/r")
    assert await store.children("/r") == ["a", "c"]

    with pytest.raises(BadVersionError, match="/r"):
        await store.delete("/r", version=7, recursive=True)
    assert await store.exists("/r/a/b") is not None

    await store.delete("/r", version=0, recursive=True)
    for path in ("/r", "/r/a", "/r/a/b", "/r/c"):
        assert await store.exists(path) is None
    assert await store.children("/") == ["keep"]
    with pytest.raises(NoNodeError, match="/r"):
        await store.delete("/r", recursive=True)


async def test_recursive_delete_of_leaf(store: MetadataStore) -> None:
    await store.create("/leaf")
    await store.delete("/leaf", recursive=True)
    assert await store.exists("/leaf") is None


# -- multi --------------------------------------------------------------------------


async def test_multi_failing_check_applies_nothing(store: MetadataStore) -> None:
    await store.create("/m", b"old")
    with pytest.raises(BadVersionError, match="/m"):
        await store.multi(
            [
                Create("/m/x", b"new child"),
                SetData("/m", b"new"),
                Check("/m", 5),
            ]
        )
    assert await store.get("/m") == (b"old", Stat(version=0))
    assert await store.exists("/m/x") is None
    assert await store.children("/m") == []


async def test_multi_failing_op_in_middle_applies_nothing(store: MetadataStore) -> None:
    await store.create("/m")
    with pytest.raises(NoNodeError, match="/missing"):
        await store.multi([Create("/m/a"), Delete("/missing"), Create("/m/b")])
    with pytest.raises(NodeExistsError, match="/m/a"):
        await store.multi([Create("/m/a"), Create("/m/a")])
    assert await store.children("/m") == []


async def test_multi_ops_see_earlier_ops(store: MetadataStore) -> None:
    results = await store.multi(
        [
            Create("/n", b"parent"),
            Create("/n/child", b"c"),
            SetData("/n/child", b"d", version=0),
            Check("/n/child", 1),
            Create("/n/tmp"),
            Delete("/n/tmp", version=0),
        ]
    )
    assert results[:2] == ["/n", "/n/child"]
    stat = results[2]
    assert isinstance(stat, Stat)
    assert stat.version == 1
    assert results[3:] == [None, "/n/tmp", None]
    assert await store.get("/n/child") == (b"d", Stat(version=1))
    assert await store.children("/n") == ["child"]


async def test_multi_delete_then_recreate(store: MetadataStore) -> None:
    await store.create("/d", b"v1")
    await store.set("/d", b"v1b")
    await store.multi([Delete("/d", version=1), Create("/d", b"v2")])
    assert await store.get("/d") == (b"v2", Stat(version=0))


async def test_empty_multi(store: MetadataStore) -> None:
    assert await store.multi([]) == []


async def test_conditional_increments_are_linearizable(store: MetadataStore) -> None:
    await store.create("/counter", b"0")

    async def bump(times: int) -> None:
        done = 0
        while done < times:
            data, stat = await store.get("/counter")
            try:
                await store.set("/counter", str(int(data) + 1).encode(), version=stat.version)
            except BadVersionError:
                continue
            done += 1

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(bump, 5)
    data, stat = await store.get("/counter")
    assert int(data) == 50
    assert stat.version == 50


# -- ephemeral nodes and sessions ----------------------------------------------------


async def test_ephemeral_nodes_vanish_with_their_session(backend: Backend) -> None:
    async with backend.session() as first:
        await first.create("/members", b"persistent")
        await first.create("/members/me", b"alive", ephemeral=True)
        stat = await first.exists("/members/me")
        assert stat is not None
        assert stat.ephemeral_owner == first.session_id != 0
        assert first.session_id > 0
        if backend.concurrent_sessions:
            async with backend.session() as other:
                assert other.session_id != first.session_id
                assert await other.children("/members") == ["me"]
    async with backend.session() as later:
        assert await later.exists("/members/me") is None
        assert await later.get("/members") == (b"persistent", await later.exists("/members"))
        assert await later.children("/members") == []


async def test_ephemeral_nodes_cannot_have_children(store: MetadataStore) -> None:
    await store.create("/eph", ephemeral=True)
    with pytest.raises(StoreError, match="/eph") as info:
        await store.create("/eph/child")
    assert not isinstance(info.value, NoNodeError | NodeExistsError)
    with pytest.raises(StoreError, match="/eph"):
        await store.create("/eph/child", make_parents=True)


async def test_session_state_is_connected_while_open(store: MetadataStore) -> None:
    # The broker watches it to step down on expiry; every backend provides it.
    state = store.session_state
    assert state.value is SessionState.CONNECTED
    assert store.session_state is state  # one value per store, not a new one each time
    with trio.fail_after(WAIT):
        await state.wait_value(SessionState.CONNECTED)


async def test_closed_store_refuses_calls(backend: Backend) -> None:
    async with backend.session() as s:
        await s.create("/a")
        await s.aclose()
        with pytest.raises(StoreClosedError, match="/a"):
            await s.get("/a")
        with pytest.raises(StoreClosedError, match="/b"):
            await s.create("/b")
        await s.aclose()  # idempotent


# -- watches -----------------------------------------------------------------------------


async def test_watch_data_snapshots(store: MetadataStore) -> None:
    async with store.watch_data("/w") as snapshots:
        with trio.fail_after(WAIT):
            assert await anext(snapshots) is None
            await store.create("/w", b"1")
            assert await anext(snapshots) == (b"1", Stat(version=0))
            await store.set("/w", b"2")
            assert await anext(snapshots) == (b"2", Stat(version=1))
            await store.delete("/w")
            assert await anext(snapshots) is None


async def test_watch_data_initial_snapshot_of_existing_node(store: MetadataStore) -> None:
    await store.create("/w", b"here")
    async with store.watch_data("/w") as snapshots:
        with trio.fail_after(WAIT):
            assert await anext(snapshots) == (b"here", Stat(version=0))


async def test_watch_wakes_a_waiting_reader(store: MetadataStore) -> None:
    await store.create("/w", b"0")

    async def writer() -> None:
        await trio.sleep(0.01)
        await store.set("/w", b"1")

    async with store.watch_data("/w") as snapshots, trio.open_nursery() as nursery:
        with trio.fail_after(WAIT):
            assert await anext(snapshots) == (b"0", Stat(version=0))
            nursery.start_soon(writer)
            assert await anext(snapshots) == (b"1", Stat(version=1))


async def test_watch_coalesces_to_latest_state(store: MetadataStore) -> None:
    async with store.watch_data("/w") as snapshots:
        with trio.fail_after(WAIT):
            assert await anext(snapshots) is None
            await store.create("/w", b"1")
            await store.set("/w", b"2")
            await store.set("/w", b"3")
            # A slow reader gets the latest state, not the history.
            assert await anext(snapshots) == (b"3", Stat(version=2))


async def test_watch_children(store: MetadataStore) -> None:
    async with store.watch_children("/p") as snapshots:
        with trio.fail_after(WAIT):
            assert await anext(snapshots) == []
            await store.create("/p")
            await store.create("/p/b")
            assert await anext(snapshots) == ["b"]
            await store.create("/p/a")
            assert await anext(snapshots) == ["a", "b"]
            await store.set("/p/a", b"data changes do not matter here")
            await store.delete("/p/b")
            assert await anext(snapshots) == ["a"]
            await store.create("/p/c")
            await store.create("/p/d")
            await store.delete("/p/a")
            assert await anext(snapshots) == ["c", "d"]


async def test_concurrent_watches_of_same_path(store: MetadataStore) -> None:
    async with store.watch_data("/w") as two:
        async with store.watch_data("/w") as one:
            with trio.fail_after(WAIT):
                assert await anext(one) is None
                assert await anext(two) is None
                await store.create("/w", b"x")
                assert await anext(one) == (b"x", Stat(version=0))
        # Leaving one watch does not disturb the other.
        with trio.fail_after(WAIT):
            assert await anext(two) == (b"x", Stat(version=0))
            await store.set("/w", b"y")
            assert await anext(two) == (b"y", Stat(version=1))


# -- paths -----------------------------------------------------------------------------

BAD_PATHS = ["", "a", "a/b", "/a/", "//a", "/a//b", "/a/./b", "/a/../b", "/a\x00b"]


@pytest.mark.parametrize("bad", BAD_PATHS)
async def test_invalid_paths_are_rejected(store: MetadataStore, bad: str) -> None:
    with pytest.raises(ValueError):
        await store.create(bad)
    with pytest.raises(ValueError):
        await store.get(bad)
    with pytest.raises(ValueError):
        await store.exists(bad)
    with pytest.raises(ValueError):
        await store.children(bad)
    with pytest.raises(ValueError):
        await store.set(bad, b"")
    with pytest.raises(ValueError):
        await store.delete(bad)
    with pytest.raises(ValueError):
        await store.multi([Create(bad)])
    with pytest.raises(ValueError):
        async with store.watch_data(bad):
            pass  # pragma: no cover
    with pytest.raises(ValueError):
        async with store.watch_children(bad):
            pass  # pragma: no cover


async def test_root_cannot_be_created_or_deleted(store: MetadataStore) -> None:
    with pytest.raises(NodeExistsError):
        await store.create("/")
    with pytest.raises(StoreError):
        await store.delete("/")


async def test_large_values_roundtrip(store: MetadataStore) -> None:
    blob = bytes(range(256)) * 1024  # 256 KiB, all byte values
    await store.create("/blob", blob)
    assert (await store.get("/blob"))[0] == blob
