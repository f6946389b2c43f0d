"""Records written to a partition added after a group subscribed reach that group.

With ``offset_reset="latest"`` (the default), partitions added to a topic a
group consumes used to start at their log end when first assigned: what a
producer wrote to them in between was never delivered. A partition created
after the group subscribed to its topic now starts at its log start (seed
000's rule), across a broker restart too, while a brand-new group still
starts every partition at its end.
"""

from __future__ import annotations

import trio

from trio_coord import TopicPartition, open_admin, open_broker, open_consumer, open_producer

TIMEOUT = 20


async def _produce(bootstrap: str, partitions: range, tag: str) -> set[str]:
    values = set()
    async with open_producer(bootstrap) as producer:
        for p in partitions:
            for i in range(5):
                value = f"{tag}-{p}-{i}"
                await producer.enqueue("t", value, partition=p)
                values.add(value)
    return values


async def _consume_until(consumer, wanted: set[str]) -> set[str]:
    got: set[str] = set()
    with trio.fail_after(TIMEOUT):
        while not wanted <= got:
            got.update(r.value.decode() for r in await consumer.getmany())
    return got


async def test_partitions_added_while_a_group_consumes_start_at_their_log_start(tmp_path):
    async with open_broker(tmp_path / "data", min_session_timeout=0.1) as broker:
        early: set[str] = set()

        async def on_revoked(tps) -> None:
            # The rebalance that adding partitions causes: records reach the new
            # partitions before they are assigned to anyone.
            if not early:
                early.update(await _produce(broker.bootstrap, range(2, 4), "early"))

        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 2)
            async with open_consumer(
                broker.bootstrap, "g", ["t"], session_timeout=1.0, on_revoked=on_revoked
            ) as c:
                await c.wait_assigned()
                await admin.add_partitions("t", 4)
                with trio.fail_after(TIMEOUT):
                    while len(c.assignment) < 4:
                        await trio.sleep(0.05)
                assert len(early) == 10
                assert {c.assignment[TopicPartition("t", p)] for p in (2, 3)} == {0}
                assert early <= await _consume_until(c, early)


async def test_the_rule_survives_a_restart_and_a_new_group_still_starts_at_the_end(tmp_path):
    data = tmp_path / "data"
    async with open_broker(data, min_session_timeout=0.1) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 2)
        async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=1.0) as c:
            await c.wait_assigned()
    async with open_broker(data, min_session_timeout=0.1) as broker:  # restarted
        async with open_admin(broker.bootstrap) as admin:
            await admin.add_partitions("t", 4)
        before = await _produce(broker.bootstrap, range(4), "before")
        async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=1.0) as c:
            await c.wait_assigned()
            # The old partitions resume where the group was (their log end then: 0); the
            # new ones from their log start: everything written to them is delivered.
            new = {v for v in before if v.split("-")[1] in ("2", "3")}
            assert new <= await _consume_until(c, new)
            # The old partitions come once the fence over the group's member from before
            # the restart ends (its session); the new ones did not wait for it.
            with trio.fail_after(TIMEOUT):
                while len(c.assignment) < 4:
                    await trio.sleep(0.05)
            assert {tp.partition for tp in c.assignment} == {0, 1, 2, 3}
        async with open_consumer(broker.bootstrap, "fresh", ["t"], session_timeout=1.0) as f:
            starts = await f.wait_assigned()
            ends = {tp: 5 for tp in starts}
            assert starts == ends, "a new group's partitions start at their end (latest)"


async def test_a_new_partition_stays_new_until_the_group_commits_it(tmp_path):
    """Its first owner goes without committing there (auto-commit off): the next owner
    starts it at its log start again, not at its end, after a restart too."""
    data = tmp_path / "data"
    async with open_broker(data, min_session_timeout=0.1) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 2)
        async with open_consumer(
            broker.bootstrap, "g", ["t"], session_timeout=1.0, auto_commit=False
        ) as c:
            await c.wait_assigned()
            async with open_admin(broker.bootstrap) as admin:
                await admin.add_partitions("t", 4)
            await _produce(broker.bootstrap, range(2, 4), "early")
            with trio.fail_after(TIMEOUT):
                while len(c.assignment) < 4:
                    await trio.sleep(0.05)
        async with open_consumer(
            broker.bootstrap, "g", ["t"], session_timeout=1.0, auto_commit=False
        ) as first:
            starts = await first.wait_assigned()
            assert {starts[TopicPartition("t", p)] for p in (2, 3)} == {0}
    async with open_broker(data, min_session_timeout=0.1) as broker:  # restarted
        async with open_consumer(broker.bootstrap, "g", ["t"], session_timeout=1.0) as second:
            starts = await second.wait_assigned()
            assert {starts[TopicPartition("t", p)] for p in (2, 3)} == {0}


async def test_a_topic_created_after_the_group_subscribed_starts_at_its_log_start(tmp_path):
    """By name or by pattern: what was written to it before its first assignment is
    delivered, with offset_reset='latest'."""
    async with open_broker(tmp_path / "data", min_session_timeout=0.1) as broker:
        created: list[str] = []
        wanted: set[str] = set()

        async def on_revoked(tps) -> None:
            # The rebalance a topic's creation causes: records reach it before it is
            # assigned to anyone.
            while created:
                topic = created.pop()
                async with open_producer(broker.bootstrap) as producer:
                    for i in range(3):
                        await producer.enqueue(topic, f"{topic}-{i}", partition=0)
                        wanted.add(f"{topic}-{i}")

        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 1)
            async with open_consumer(
                broker.bootstrap,
                "g",
                ["t", "u", "re:v.*"],
                session_timeout=1.0,
                on_revoked=on_revoked,
            ) as c:
                await c.wait_assigned()
                for topic in ("u", "v1"):
                    created.append(topic)
                    await admin.create_topic(topic, 1)
                    with trio.fail_after(TIMEOUT):
                        while TopicPartition(topic, 0) not in c.assignment:
                            await trio.sleep(0.05)
                assert len(wanted) == 6
                assert wanted <= await _consume_until(c, wanted)
