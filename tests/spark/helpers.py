"""What the Spark tests do besides Spark: make topics, produce, consume, read offsets.

They run the Trio library in this process (``trio.run``), against the
broker process of ``conftest.bootstrap``.
"""

from __future__ import annotations

import trio

from trio_coord import open_admin, open_consumer, open_producer


def make_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create a topic."""

    async def go() -> None:
        with trio.fail_after(10):
            async with open_admin(bootstrap) as admin:
                await admin.create_topic(name, partitions)

    trio.run(go)


def produce(bootstrap: str, topic: str, records: list[dict]) -> list[tuple[int, int]]:
    """Send records (dicts of producer.send's keyword arguments plus value); their
    (partition, offset) in order."""

    async def go() -> list[tuple[int, int]]:
        with trio.fail_after(20):
            async with open_producer(bootstrap) as producer:
                deliveries = [await producer.enqueue(topic, **r) for r in records]
                return [((m := await d).partition, m.offset) for d in deliveries]

    return trio.run(go)


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets."""

    async def go() -> dict[tuple[str, int], int]:
        with trio.fail_after(10):
            async with open_admin(bootstrap) as admin:
                return {tuple(tp): o for tp, o in (await admin.committed_offsets(group)).items()}

    return trio.run(go)


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    """Each partition's log end offset."""

    async def go() -> dict[tuple[str, int], int]:
        with trio.fail_after(10):
            async with open_admin(bootstrap) as admin:
                listed = await admin.list_offsets([(topic, p) for p in range(partitions)])
                return {tuple(tp): o.log_end for tp, o in listed.items()}

    return trio.run(go)


def consume(bootstrap: str, topic: str, count: int, group: str | None = None) -> list:
    """Read ``count`` records of ``topic`` as a member of ``group`` (default: its own group)."""

    async def go() -> list:
        records = []
        with trio.fail_after(30):
            async with open_consumer(
                bootstrap, group or f"reader-{topic}", [topic], offset_reset="earliest"
            ) as c:
                async for record in c:
                    records.append(record)
                    if len(records) == count:
                        break
        return records

    return trio.run(go)
