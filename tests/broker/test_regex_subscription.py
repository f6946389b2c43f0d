"""A regex subscription gets every matching topic, whenever the topic is made.

On Trio's virtual clock with fake members: a topic made while a new group
waits out its initial rebalance delay (the group is still EMPTY, with
members) is in its first generation; one made later rebalances the group.
"""

from __future__ import annotations

from trio_coord.broker.coordinator import PATTERN_PREFIX
from trio_coord.protocol import TopicPartition

from .harness import FakeMember, Recorder, connected, ephemeral_broker


def partitions(topics: dict[str, int]) -> list[TopicPartition]:
    return sorted(TopicPartition(t, p) for t, n in topics.items() for p in range(n))


async def test_a_topic_made_before_the_first_generation_is_in_it(autojump_clock):
    rec = Recorder()
    async with ephemeral_broker(on_event=rec, initial_rebalance_delay=1.0) as broker:
        await broker.topics.create_topic("orders-a", 2)
        member = FakeMember(broker, "g", [f"{PATTERN_PREFIX}orders-.*"], name="m")
        async with connected(member):
            await member.join()  # the group is EMPTY until its first rebalance, at 1.0
            await broker.topics.create_topic("orders-b", 2)
            await broker.topics.create_topic("billing", 1)  # does not match
            stable = await rec.wait_for("stable")
            assert stable["generation"] == 1
            assert sorted(member.owned) == partitions({"orders-a": 2, "orders-b": 2})
            # ... and a topic made later rebalances the living group.
            mark = rec.mark()
            await broker.topics.create_topic("orders-c", 1)
            assert (await rec.wait_for("stable", since=mark))["generation"] == 2
            assert sorted(member.owned) == partitions({"orders-a": 2, "orders-b": 2, "orders-c": 1})
            (described,) = broker.coordinator.describe_group("g").members
            assert set(described.topics) == {"re:orders-.*", "orders-a", "orders-b", "orders-c"}
