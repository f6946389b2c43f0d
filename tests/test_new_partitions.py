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
            assignment = await c.wait_assigned()
            # The old partitions resume where the group was (their log end then: 0); the
            # new ones from their log start: everything written to them is delivered.
            new = {v for v in before if v.split("-")[1] in ("2", "3")}
            assert new <= await _consume_until(c, new)
            assert {tp.partition for tp in assignment} == {0, 1, 2, 3}
        async with open_consumer(broker.bootstrap, "fresh", ["t"], session_timeout=1.0) as f:
            starts = await f.wait_assigned()
            ends = {tp: 5 for tp in starts}
            assert starts == ends, "a new group's partitions start at their end (latest)"
