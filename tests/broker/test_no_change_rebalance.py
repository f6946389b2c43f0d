"""An eager rebalance that would change nothing is not run (seed 000, section 9 step 3).

Before stopping anyone, the coordinator computes the assignment the group
would get; if every member would keep exactly what it fetches, with the
same subscription and settings, it bumps no generation and stops no one.
Anything that does change the plan (a subscription, a partition count, a
member) still rebalances as before.
"""

from __future__ import annotations

import trio

from .harness import FakeMember, Recorder, Timeline, connected, ephemeral_broker


async def test_a_rejoin_that_changes_nothing_stops_no_one(autojump_clock) -> None:
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a = FakeMember(broker, "g", ["t"], timeline=timeline, name="a")
        b = FakeMember(broker, "g", ["t"], timeline=timeline, name="b")
        async with connected(a), connected(b):
            await a.join()
            await rec.wait_for("stable", generation=1)
            await b.join()
            stable = await rec.wait_for("stable", generation=2)
            pushes = len(a.pushes), len(b.pushes)
            mark = rec.mark()
            # b joins again, as it was: the plan is the one in force.
            await b.join()
            skipped = await rec.wait_for("rebalance_skipped", since=mark)
            assert skipped["generation"] == 2 and skipped["cause"] == "join"
            await trio.sleep(2)  # (well within the session timeout)
            assert rec.all("rebalance_started", since=mark) == []
            assert (len(a.pushes), len(b.pushes)) == pushes  # nobody stopped or started
            runner = broker.coordinator.runner("g")
            assert runner is not None
            assert runner.group.state.value == "STABLE" and runner.group.generation == 2
            assert {str(tp): m for tp, m in runner.group.ownership().items()} == stable["ownership"]
            # Heartbeats in generation 2 are still good (nothing was bumped).
            await a.heartbeat()
            await b.heartbeat()

            # A rejoin that does change the plan (b now also reads "u") rebalances.
            await broker.topics.create_topic("u", 2)
            mark = rec.mark()
            b.topics = ["t", "u"]
            await b.join()
            third = await rec.wait_for("stable", since=mark)
            assert third["generation"] == 3
            assert any(p.startswith("u-") for p in third["ownership"])
            assert not timeline.overlaps()
