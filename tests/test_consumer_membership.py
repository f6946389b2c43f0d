"""A consumer's membership as the application sees it, against a real broker.

Every state a member passes through, in order (UNJOINED -> REBALANCING ->
STABLE -> REBALANCING -> STABLE ... -> UNJOINED once closed), as
``state``/``wait_state`` expose them; a subscription changed at run time
(``subscribe``, the seed's addTopic) costs exactly one rebalance; and a
StartFetchers names where its partitions are, so a member fetches them
without asking Metadata first.
"""

from __future__ import annotations

import trio
import trio.lowlevel

from trio_coord import ConsumerState, GroupEvent, open_admin, open_broker, open_consumer
from trio_coord.broker.events import RebalanceStarted, Stable
from trio_coord.protocol import MetadataRequest

S = 3.0  # session timeout (seconds of real time; long enough for a loaded machine)
R, ST, U = ConsumerState.REBALANCING, ConsumerState.STABLE, ConsumerState.UNJOINED


async def _follow(consumer, seen: list[ConsumerState], until: trio.Event) -> None:
    """Append each state the consumer enters. Each change wakes this task at once and
    the next one is at least a network round trip later, so none is missed."""
    while not until.is_set():
        seen.append(await consumer.wait_state_change())


async def test_every_state_in_order_and_a_runtime_subscribe_is_one_rebalance(tmp_path) -> None:
    events: list[GroupEvent] = []
    async with open_broker(
        tmp_path, min_session_timeout=0.05, initial_rebalance_delay=0.0, on_event=events.append
    ) as broker:
        asked: list[list[str] | None] = []
        metadata = broker.metadata

        def counting(request: MetadataRequest):
            asked.append(request.topics)
            return metadata(request)

        broker.metadata = counting  # type: ignore[method-assign]
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 2)
            await admin.create_topic("u", 2)
        opts = dict(session_timeout=S, offset_reset="earliest")
        first = open_consumer(broker.bootstrap, "g", ["t"], **opts)
        assert first.state is U  # not yet entered
        seen = [U]
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_follow, first, seen, done)
            await trio.lowlevel.checkpoint()
            async with first:
                with trio.fail_after(10):
                    assert len(await first.wait_assigned()) == 2
                # A second member: the first is stopped, then started with less.
                async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as second:
                    with trio.fail_after(10):
                        await second.wait_assigned()
                        while len(first.assignment) != 1 or first.state is not ST:
                            await trio.sleep(0.01)
                # The second left: the first is stopped and started with everything again.
                with trio.fail_after(10):
                    while len(first.assignment) != 2:
                        await trio.sleep(0.01)
                # A subscription changed at run time: one rebalance, with the new topic.
                mark = len(events)
                await first.subscribe(["t", "u"])
                with trio.fail_after(10):
                    while len(first.assignment) != 4:
                        await trio.sleep(0.01)
                await trio.sleep(1.5)  # (would any further rebalance follow?)
                later = events[mark:]
                assert len([e for e in later if isinstance(e, RebalanceStarted)]) == 1
                (stable,) = [e for e in later if isinstance(e, Stable)]
                assert sorted(stable.ownership) == ["t-0", "t-1", "u-0", "u-1"]
                assert first.topics == ["t", "u"]
                # Dropping a topic: its partitions are revoked, one rebalance again.
                await first.subscribe(["u"])
                with trio.fail_after(10):
                    while sorted(map(str, first.assignment)) != ["u-0", "u-1"]:
                        await trio.sleep(0.01)
            await trio.sleep(0.05)
            done.set()
            nursery.cancel_scope.cancel()
        states = [s.value for s in seen]
        assert states == ["UNJOINED", "REBALANCING", "STABLE"] + [
            "REBALANCING",
            "STABLE",
        ] * 4 + ["UNJOINED"], states
        # Where "t" and "u" are came with the StartFetchers: the consumer's fetchers
        # never asked Metadata about them (only the admin's create did, if at all).
        assert not [topics for topics in asked if topics and ("t" in topics or "u" in topics)]


async def test_a_cancelled_subscribe_still_reaches_the_coordinator(tmp_path) -> None:
    # subscribe() recorded the new topics before its join was sent: cancelled then, the
    # coordinator never heard of them, and asking again was a no-op (same topics).
    async with open_broker(tmp_path, min_session_timeout=0.05, initial_rebalance_delay=0.0) as b:
        async with open_admin(b.bootstrap) as admin:
            await admin.create_topic("t", 2)
            await admin.create_topic("u", 2)
        async with open_consumer(
            b.bootstrap, "g", ["t"], session_timeout=S, offset_reset="earliest"
        ) as consumer:
            with trio.fail_after(10):
                assert len(await consumer.wait_assigned()) == 2
            with trio.CancelScope() as scope:
                scope.cancel()
                await consumer.subscribe(["t", "u"])
            await consumer.subscribe(["t", "u"])  # (what a caller would do: ask again)
            with trio.fail_after(10):
                while len(consumer.assignment) != 4:
                    await trio.sleep(0.01)
