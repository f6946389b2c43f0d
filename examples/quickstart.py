"""The README's example: an embedded broker, a topic, and a consumer group.

Run it with ``python examples/quickstart.py``. Two consumers share a topic's
partitions; when one leaves, the other owns them all; committed offsets are
kept by the broker (in ``./quickstart-data``, so they survive a restart).
"""

import trio

from trio_coord import open_admin, open_broker, open_consumer


async def main() -> None:
    async with open_broker("quickstart-data") as broker:
        async with open_admin(broker.bootstrap) as admin:
            if "events" not in {t.name for t in await admin.list_topics()}:
                await admin.create_topic("events", partitions=4)

        def show(name):
            return lambda partitions: print(name, "owns", [str(tp) for tp in partitions])

        async with open_consumer(
            broker.bootstrap, "my-group", ["events"], session_timeout=3.0, on_assigned=show("a")
        ) as a:
            async with open_consumer(
                broker.bootstrap, "my-group", ["events"], session_timeout=3.0, on_assigned=show("b")
            ) as b:
                await b.wait_assigned()
                await trio.sleep(0.1)
                await b.commit()  # commit b's current positions, durably
            # b left the group: a owns every partition again
            await trio.sleep(0.1)
            print("committed:", {str(tp): off for tp, off in (await a.committed()).items()})


if __name__ == "__main__":
    trio.run(main)
