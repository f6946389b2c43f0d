"""Assignors an application registers on its broker (``BrokerConfig.assignors``).

A group whose members prefer a registered assignor gets that assignor's
assignment; an assignor that returns a broken assignment fails the rebalance
with a message naming it (the broker and the group carry on, retrying); a
name that clashes with a built-in is refused when the broker starts.
"""

from __future__ import annotations

import pytest
import trio

from trio_coord import TopicPartition, open_admin, open_broker, open_consumer
from trio_coord.broker.events import RebalanceFailed
from trio_coord.core.assignors import Assignment, GroupSpec

S = 0.6


class EverythingToTheFirst:
    """Gives every partition to the member with the smallest id."""

    name = "first-takes-all"

    def assign(self, spec: GroupSpec) -> Assignment:
        members = sorted(spec.members)
        result: Assignment = {m: [] for m in members}
        for topic in spec.topics():
            result[members[0]] += [TopicPartition(topic, p) for p in range(spec.partitions[topic])]
        return result


class Forgetful:
    """Forgets the last partition: an incomplete assignment."""

    name = "forgetful"

    def assign(self, spec: GroupSpec) -> Assignment:
        result = EverythingToTheFirst().assign(spec)
        for partitions in result.values():
            if partitions:
                partitions.pop()
        return result


async def test_a_registered_assignor_assigns_groups_that_prefer_it(tmp_path):
    async with open_broker(
        tmp_path, min_session_timeout=0.05, assignors=(EverythingToTheFirst(),)
    ) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 4)
        opts = dict(session_timeout=S, assignors=["first-takes-all", "range"])
        async with (
            open_consumer(broker.bootstrap, "g", ["t"], **opts) as a,
            open_consumer(broker.bootstrap, "g", ["t"], **opts) as b,
        ):
            with trio.fail_after(5):
                while sorted([len(a.assignment), len(b.assignment)]) != [0, 4]:
                    await trio.sleep(0.01)
            async with open_admin(broker.bootstrap) as admin:
                assert (await admin.describe_group("g")).assignor == "first-takes-all"


async def test_a_broken_assignor_fails_the_rebalance_and_says_which(tmp_path):
    failures: list[str] = []

    def on_event(event):
        if isinstance(event, RebalanceFailed):
            failures.append(event.error)

    async with open_broker(
        tmp_path, min_session_timeout=0.05, assignors=(Forgetful(),), on_event=on_event
    ) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 3)
        async with open_consumer(
            broker.bootstrap, "g", ["t"], session_timeout=S, assignors=["forgetful"]
        ) as consumer:
            with trio.fail_after(5):
                while not failures:
                    await trio.sleep(0.01)
            assert "assignor 'forgetful' returned a bad assignment" in failures[0]
            assert "t-2" in failures[0]
            assert consumer.assignment == {}  # nothing was started with it
            async with open_admin(broker.bootstrap) as admin:
                assert [t.name for t in await admin.list_topics()] == ["t"]  # broker serves on


async def test_a_registered_name_may_not_shadow_a_built_in(tmp_path):
    class Impostor(EverythingToTheFirst):
        name = "range"

    with pytest.raises(ValueError, match="range"):
        async with open_broker(tmp_path, assignors=(Impostor(),)):
            pass  # pragma: no cover
