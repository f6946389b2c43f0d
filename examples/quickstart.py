"""The README's example: an embedded broker, a topic, and a consumer group.

Run it with ``python examples/quickstart.py``, then run it again. Each run
produces 8 records; two consumers share the topic's partitions, and when one
leaves, the other owns them all and reads to the end. Committed offsets are
kept by the broker (in ``./quickstart-data``), so the second run reads only
its own 8 records: it starts where the first run's group stopped.
"""

import trio

from trio_coord import open_admin, open_broker, open_consumer, open_producer


async def main() -> None:
    async with open_broker("quickstart-data") as broker:
        async with open_admin(broker.bootstrap) as admin:
            if "events" not in {t.name for t in await admin.list_topics()}:
                await admin.create_topic("events", partitions=4)
            committed = await admin.committed_offsets("my-group")
            print("the group starts at", {str(tp): o for tp, o in committed.items()} or "nothing")
        async with open_producer(broker.bootstrap) as producer:
            for i in range(8):
                await producer.enqueue("events", f"event {i}", key=f"user-{i % 4}")

        def show(name):
            return lambda partitions: print(name, "owns", [str(tp) for tp in partitions])

        options = dict(session_timeout=3.0, offset_reset="earliest")
        async with open_consumer(
            broker.bootstrap, "my-group", ["events"], on_assigned=show("a"), **options
        ) as a:
            async with open_consumer(
                broker.bootstrap, "my-group", ["events"], on_assigned=show("b"), **options
            ) as b:
                await b.wait_assigned()
            # b left the group (committing what it read): a owns every partition again
            read = 0
            with trio.move_on_after(5):
                while read == 0 or any(a.lag().values()):
                    read += len(await a.getmany())
            await a.commit()  # durably, before it returns
            print(
                "a read",
                read,
                "record(s); committed:",
                {str(tp): off for tp, off in (await a.committed()).items()},
            )


if __name__ == "__main__":
    trio.run(main)
