"""Deleting a topic: its records, its logs and every group's offsets of it go; a topic made
again under its name is new and empty, also after a restart.

And the logs of a topic the store does not know (deleted while the broker was
down, or before a crash let it remove them) never come back as a new topic's
records: they are set aside at start-up, with a warning.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from trio_coord import (
    TopicPartition,
    UnknownTopicError,
    open_admin,
    open_broker,
    open_consumer,
    open_producer,
)

S = 1.0  # session timeout (real seconds)


async def _until(predicate, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.02)


async def test_a_deleted_topic_goes_with_its_offsets_and_comes_back_new(tmp_path: Path) -> None:
    logs = tmp_path / "partitions"
    async with open_broker(tmp_path, initial_rebalance_delay=0.0) as broker:
        boot = broker.bootstrap
        async with open_admin(boot) as admin:
            await admin.create_topic("t", 3)
            await admin.create_topic("keep", 1)
            async with open_producer(boot) as producer:
                for i in range(30):
                    await producer.send("t", f"old-{i}".encode(), key=str(i).encode())
                await producer.send("keep", b"k")
            seen = []
            async with open_consumer(
                boot, "g", ["t", "keep"], offset_reset="earliest", session_timeout=S
            ) as consumer:
                with trio.fail_after(10):
                    while len(seen) < 31:
                        seen += await consumer.getmany()
                await consumer.commit()
                assert {tp.topic for tp in await admin.committed_offsets("g")} == {"t", "keep"}

                await admin.delete_topic("t")
                # The running group rebalances without it, and forgets its offsets.
                with trio.fail_after(10):
                    while {tp.topic for tp in consumer.assignment} != {"keep"}:
                        await trio.sleep(0.02)

                async def forgotten() -> bool:
                    return set(await admin.committed_offsets("g")) == {TopicPartition("keep", 0)}

                await _until(forgotten)
                await _until(lambda: _gone(logs / "t"))
                assert "t" not in {t.name for t in await admin.list_topics()}
                with pytest.raises(UnknownTopicError):
                    await admin.delete_topic("t")
                async with open_producer(boot, delivery_timeout=2.0) as producer:
                    with pytest.raises(UnknownTopicError):
                        await producer.send("t", b"nowhere")

                # Made again: new and empty; the group, subscribed by name, reads it from
                # its start (it was created after the group subscribed), old records never.
                await admin.create_topic("t", 2)
                ends = await admin.list_offsets([("t", 0), ("t", 1)])
                assert [o.log_end for o in ends.values()] == [0, 0]
                async with open_producer(boot) as producer:
                    await producer.send("t", b"new", partition=1)
                fresh = []
                with trio.fail_after(10):
                    while not fresh:
                        fresh += [r for r in await consumer.getmany() if r.topic == "t"]
                assert [(r.partition, r.offset, r.value) for r in fresh] == [(1, 0, b"new")]

    # After a restart: still the new topic, and nothing of the old one.
    async with open_broker(tmp_path) as broker, open_admin(broker.bootstrap) as admin:
        assert {t.name: t.partitions for t in await admin.list_topics()} == {"t": 2, "keep": 1}
        ends = await admin.list_offsets([("t", 0), ("t", 1)])
        assert [ends[TopicPartition("t", p)].log_end for p in (0, 1)] == [0, 1]
    assert sorted(p.name for p in logs.iterdir() if "@" in p.name) == ["LOCK@"]


async def _gone(path: Path) -> bool:
    return not await trio.Path(path).exists()


async def test_logs_the_store_does_not_know_are_set_aside_at_start(tmp_path: Path, caplog) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    async with open_broker(old) as broker, open_admin(broker.bootstrap) as admin:
        await admin.create_topic("x", 1)
        async with open_producer(broker.bootstrap) as producer:
            for _ in range(5):
                await producer.send("x", b"stale")
    # A data dir whose store never heard of "x" holds its logs (as after a deletion the
    # broker missed), and the half-removed directory of a deletion cut short by a crash.
    (new / "partitions").mkdir(parents=True)
    shutil.copytree(old / "partitions" / "x", new / "partitions" / "x")
    shutil.copytree(old / "partitions" / "x", new / "partitions" / "y@deleted-123")
    async with open_broker(new) as broker, open_admin(broker.bootstrap) as admin:
        assert "topic x is not in the metadata store" in caplog.text
        await admin.create_topic("x", 1)
        ends = await admin.list_offsets([("x", 0)])
        assert ends[TopicPartition("x", 0)].log_end == 0  # the stale records stay away
    names = sorted(p.name for p in (new / "partitions").iterdir())
    # (the half-removed one is gone; the new "x" has no directory until its first record)
    assert len(names) == 2 and names[0] == "LOCK@" and names[1].startswith("x@orphaned-")
    assert sorted(os.listdir(new / "partitions" / names[1] / "0"))  # kept, not deleted


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_coord", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_the_cli_asks_before_deleting_and_says_what_it_deleted(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker, open_admin(broker.bootstrap) as admin:
        await admin.create_topic("a", 2)
        await admin.create_topic("b", 1)
        boot = ["--bootstrap", broker.bootstrap]

        refused = await trio.to_thread.run_sync(lambda: _cli("topics", "delete", "a", *boot))
        assert refused.returncode != 0
        assert "add --yes" in refused.stderr and "a (2 partitions)" in refused.stderr
        missing = await trio.to_thread.run_sync(
            lambda: _cli("topics", "delete", "a", "nope", "--yes", *boot)
        )
        assert missing.returncode != 0 and "nope" in missing.stderr
        assert {t.name for t in await admin.list_topics()} == {"a", "b"}  # nothing deleted

        done = await trio.to_thread.run_sync(
            lambda: _cli("topics", "delete", "a", "b", "--yes", "--json", *boot)
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [
            {"topic": "a", "partitions": 2},
            {"topic": "b", "partitions": 1},
        ]
        assert await admin.list_topics() == []
