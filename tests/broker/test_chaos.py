"""Chaos on the virtual clock: the invariants hold through a real broker under faults.

Each run drives an ephemeral broker with fake members doing random things:
join, leave cleanly, crash (connection dropped without a word), hang on a
StopFetchers or StartFetchers (to be expelled at its rebalance timeout), go silent (to be
declared dead at its session timeout), and grow the topic. Every member
records when it owned what; a crashed or silent member is assumed to keep
fetching until its lease ends, since the coordinator cannot tell it from one
that is merely cut off. Every run is made twice: with eager members and
with cooperative ones (where most members are never stopped). After the run:

* invariant 1, exclusive ownership: no partition was owned by two members at
  any moment;
* invariant 2, completeness: every time the group was stable, each partition
  had exactly one owner among the live members;
* invariant 5, liveness: once the faults stop, the group becomes stable with
  exactly the surviving members, within a rebalance timeout (to expel a hung
  member) plus a session timeout (its lease) plus one rebalance.
"""

from __future__ import annotations

import random

import pytest
import trio

from .harness import FakeMember, Recorder, Timeline, connected, ephemeral_broker

S = 4.0  # session timeout
R = 2.0  # rebalance timeout
HEARTBEAT = S / 4
ASSIGNORS = {"eager": ["range"], "cooperative": ["uniform"]}


async def _member_life(member: FakeMember, script: list[tuple[float, str]]) -> None:
    """Join, heartbeat, and at the scripted times do what the script says."""
    async with connected(member):
        await member.join()
        next_beat = trio.current_time() + HEARTBEAT
        for at, action in script:
            while next_beat < at:
                await trio.sleep_until(next_beat)
                await _beat(member)
                next_beat += HEARTBEAT
            await trio.sleep_until(at)
            if action == "leave":
                await member.leave()
                return
            if action == "crash":
                await member.crash()
                return
            if action == "silence":
                member.dead = True  # stops heartbeating, keeps its connection
                await trio.sleep_forever()
            if action == "hang":  # on its next push (a cooperative member may get no stop)
                member.hold_stop = member.hold_start = True
        while True:
            await trio.sleep_until(next_beat)
            await _beat(member)
            next_beat += HEARTBEAT


async def _join_late(member: FakeMember, at: float) -> None:
    await trio.sleep_until(at)
    await _member_life(member, [])


async def _beat(member: FakeMember) -> None:
    try:
        await member.heartbeat()
    except Exception:
        # Expelled or timed out: a real client would drop its partitions (its lease
        # already ran out or does so now) and rejoin. Here it just stops.
        member.dead = True
        await trio.sleep_forever()


@pytest.mark.parametrize("protocol", ["eager", "cooperative"])
@pytest.mark.parametrize("seed", range(40))
async def test_invariants_hold_under_random_faults(seed, protocol, autojump_clock):
    rng = random.Random(seed)
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        partitions = rng.randint(3, 9)
        await broker.topics.create_topic("t", partitions)
        fakes: list[FakeMember] = []
        fates: dict[str, str] = {}
        async with trio.open_nursery() as nursery:
            for i in range(rng.randint(4, 8)):
                start = rng.uniform(0, 20)
                fate = rng.choice(["stay", "stay", "leave", "crash", "silence", "hang"])
                script = [] if fate == "stay" else [(start + rng.uniform(1, 25), fate)]
                fake = FakeMember(
                    broker,
                    "g",
                    ["t"],
                    session_timeout=S,
                    rebalance_timeout=R,
                    timeline=timeline,
                    name=f"m{i}",
                    protocol=protocol,
                    assignors=ASSIGNORS[protocol],
                )
                fakes.append(fake)

                async def life(fake=fake, start=start, script=script):
                    await trio.sleep_until(start)
                    await _member_life(fake, script)

                nursery.start_soon(life)
                fates[fake.name] = fate
            grow_at = rng.uniform(5, 40)

            async def grow():
                await trio.sleep_until(grow_at)
                await broker.topics.add_partitions("t", partitions + 2)

            nursery.start_soon(grow)
            # All faults happen before t=50. A last member joins then: the rebalance it
            # causes asks everyone to stop, so a member hanging since its last rebalance
            # is expelled at R; its partitions move when its lease ends (within S).
            late = FakeMember(
                broker,
                "g",
                ["t"],
                session_timeout=S,
                rebalance_timeout=R,
                timeline=timeline,
                protocol=protocol,
                assignors=ASSIGNORS[protocol],
            )
            fakes.append(late)
            fates[late.name] = "stay"
            nursery.start_soon(_join_late, late, 50.0)
            await trio.sleep_until(50.0 + R + S + R)
            runner = broker.coordinator.runner("g")
            survivors = {f.member_id for f in fakes if fates[f.name] == "stay"}
            group = runner.group
            if survivors:
                assert group.state.value == "STABLE"
                assert set(group.members) == survivors
                owners = group.ownership()
                assert sorted(owners) == [("t", p) for p in range(partitions + 2)]
                assert set(owners.values()) <= survivors
            nursery.cancel_scope.cancel()

    assert rec.all("rebalance_failed") == []
    # Members that vanished without a clean stop may have fetched until their lease
    # ended: the fence, or the removal itself when the lease had already run out.
    for removed in rec.all("removed"):
        timeline.stop_at(removed["member_id"], removed["fenced_until"] or removed["time"])
    assert timeline.overlaps() == []
    # Completeness whenever the group was stable: every partition of the topic as it
    # was then (before or after it grew) has exactly one owner.
    for stable in rec.all("stable"):
        count = partitions + 2 if stable["time"] >= grow_at else partitions
        owned = set(stable["ownership"])
        assert owned in (
            {f"t-{p}" for p in range(count)},
            {f"t-{p}" for p in range(partitions + 2)},
        )
