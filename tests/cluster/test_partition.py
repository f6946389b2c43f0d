"""A coordinator cut off from ZooKeeper but not from its members (a network partition).

Broker 1 reaches ZooKeeper through a TCP proxy the test can block; broker 2
directly. The members of a group that broker 1 coordinates stay connected
to it. When the proxy blocks, broker 1 cannot know whether it still holds
the group, so it stops renewing the members' leases (heartbeats are refused
with COORDINATOR_NOT_AVAILABLE); its session expires, broker 2 wins the
slot, loads the group and fences its partitions for a member session. The
members drop their partitions when their leases run out and rejoin on
broker 2: the group is stable there, and no partition was owned twice. When
the proxy lets broker 1 through again, it finds its session expired and
registers with a new one.
"""

from __future__ import annotations

import contextlib

import trio
from zkserver import open_tcp_proxy

from trio_coord import ConsumerState, open_admin, open_broker, open_consumer
from trio_coord.protocol.errors import CoordinatorNotAvailableError
from trio_coord.protocol.messages import HeartbeatRequest

from .ownership import Ownership
from .test_cluster import SETTINGS, coordinator_broker, settled


async def test_a_coordinator_cut_off_from_zookeeper_stops_renewing_leases(
    zookeeper_server, zk_chroot, tmp_path
):
    url = zookeeper_server.url(zk_chroot)
    ownership = Ownership()
    async with open_tcp_proxy(zookeeper_server.port or 0) as proxy:
        async with contextlib.AsyncExitStack() as stack:
            cut_off = await stack.enter_async_context(
                open_broker(tmp_path / "b1", store=proxy.url(zk_chroot), broker_id=1, **SETTINGS)
            )
            other = await stack.enter_async_context(
                open_broker(tmp_path / "b2", store=url, broker_id=2, **SETTINGS)
            )
            brokers = [cut_off, other]
            await settled(brokers)
            group = next(
                f"p{n}" for n in range(1000) if coordinator_broker(brokers, f"p{n}") is cut_off
            )
            async with open_admin(other.bootstrap) as admin:
                await admin.create_topic("t", 4)
            bootstrap = f"{cut_off.bootstrap},{other.bootstrap}"
            consumers = [
                await stack.enter_async_context(
                    open_consumer(
                        bootstrap,
                        group,
                        ["t"],
                        client_id=f"c{i}",
                        session_timeout=1.0,
                        **ownership.callbacks(f"c{i}"),
                    )
                )
                for i in range(2)
            ]

            def stable_generation() -> int | None:
                gens = {c.generation for c in consumers}
                owned = sorted(tp for c in consumers for tp in c.assignment)
                if (
                    len(gens) == 1
                    and all(c.state is ConsumerState.STABLE for c in consumers)
                    and len(owned) == len(set(owned)) == 4
                ):
                    return gens.pop()
                return None

            with trio.fail_after(20):
                while stable_generation() is None:
                    await trio.sleep(0.02)
            before = stable_generation()
            assert before is not None
            sessions = cut_off.cluster.sessions  # type: ignore[union-attr]

            proxy.block()
            with trio.fail_after(20):
                while not cut_off.coordinator.suspended:
                    await trio.sleep(0.02)
            try:
                cut_off.coordinator.heartbeat(HeartbeatRequest(group, "m", before))
            except CoordinatorNotAvailableError as exc:
                assert "lost its connection to ZooKeeper" in str(exc)
            else:
                raise AssertionError("a suspended coordinator accepted a heartbeat")

            with trio.fail_after(30):
                while True:
                    generation = stable_generation()
                    if generation is not None and generation > before:
                        break
                    await trio.sleep(0.02)
            # (broker 1 still thinks it holds the slot: it cannot know until it reconnects)
            assert other.coordinator.slot_of(group) in other.coordinator.services
            ownership.check_exclusive()
            assert ownership.count("lost") > 0  # the members dropped them: no clean stop

            proxy.unblock()
            with trio.fail_after(30):
                while cut_off.cluster.sessions == sessions:  # type: ignore[union-attr]
                    await trio.sleep(0.05)
            await settled(brokers)
