"""The data plane under SIGKILL: of the broker while records stream in, and of a consumer.

* Log recovery. A broker process is killed with SIGKILL in the middle of a
  stream of produce requests, in both flush modes (fsync before every
  acknowledgement, and fsync every second). The producer's outstanding
  records fail (it does not hang), and a broker restarted on the same data
  dir holds every acknowledged record at its exact offset with its exact
  value: offsets dense from 0, in send order, every batch decodable (no
  half-written batch survives recovery). A process crash loses nothing
  acknowledged in either mode; only power loss could, in interval mode.
* At least once. A consumer that processes records slowly is killed with
  SIGKILL halfway; a second consumer of the group finishes. Together they
  processed every record; a record processed twice is at or after its
  partition's committed offset at the crash, every record below it was
  processed exactly once, and each consumer processed each partition in
  order.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import trio
from chaos import BrokerProcess

from trio_coord import (
    EARLIEST,
    ConsumerRecord,
    CoordError,
    TopicPartition,
    open_admin,
    open_consumer,
    open_producer,
)

CLI = [sys.executable, "-m", "trio_coord"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def broker_processes():
    """Make :class:`BrokerProcess` objects; whatever still runs is stopped at the end."""
    made: list[BrokerProcess] = []

    def make(data_dir: Path, *options: str) -> BrokerProcess:
        made.append(BrokerProcess(data_dir, *options))
        return made[-1]

    yield make
    for broker in made:
        broker.stop()


async def read_to_the_end(
    bootstrap: str, tps: list[TopicPartition], ends: dict[TopicPartition, int]
) -> dict[TopicPartition, list[ConsumerRecord]]:
    """Every record of ``tps`` from the log start up to ``ends``, with fixed partitions."""
    records: dict[TopicPartition, list[ConsumerRecord]] = {tp: [] for tp in tps}
    left = sum(ends.values())
    if left == 0:
        return records
    async with open_consumer(bootstrap, partitions=tps, offset_reset="earliest") as consumer:
        with trio.fail_after(30):
            async for record in consumer:
                records[record.tp].append(record)
                left -= 1
                if left == 0:
                    break
    return records


# -- log recovery --------------------------------------------------------------------------


def number(value: bytes | None) -> int:
    """The ``i`` of a record whose value is ``f"{i} xxx..."``."""
    assert value is not None
    return int(value.split()[0])


@pytest.mark.parametrize("flush_interval", ["0", "1"], ids=["fsync-each", "fsync-every-1s"])
async def test_a_killed_broker_recovers_every_acknowledged_record(
    tmp_path, broker_processes, flush_interval
):
    # Small segments: the stream rolls the logs, so recovery reads several segments each.
    broker = broker_processes(
        tmp_path / "data", "--flush-interval", flush_interval, "--segment-bytes", "20000"
    )
    bootstrap = await broker.start()
    async with open_admin(bootstrap) as admin:
        await admin.create_topic("t", 2)

    acked: list[tuple[int, int, str]] = []  # (partition, offset, value)
    failed: list[str] = []
    enqueued = 0
    killed = trio.Event()
    send, receive = trio.open_memory_channel(float("inf"))

    async def collect() -> None:
        async for value, delivery in receive:
            try:
                meta = await delivery
            except CoordError:
                failed.append(value)
            else:
                acked.append((meta.partition, meta.offset, value))

    async def kill_soon() -> None:
        await trio.sleep(random.uniform(0, 0.02))  # at no particular point of a write
        broker.kill()
        killed.set()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect)
            async with open_producer(
                bootstrap, linger=0.002, close_timeout=1.0, delivery_timeout=5.0
            ) as producer:
                # Stream until some hundreds are acknowledged, kill the broker, stream on a bit.
                i = 0
                kill_started = False
                stop_at = None
                while stop_at is None or i < stop_at:
                    value = f"{i} " + "x" * 200
                    await send.send((value, await producer.enqueue("t", value, partition=i % 2)))
                    i += 1
                    if i % 10 == 0:
                        await trio.sleep(0.001)
                    if not kill_started and len(acked) >= 400:
                        kill_started = True
                        nursery.start_soon(kill_soon)
                    if stop_at is None and killed.is_set():
                        stop_at = i + 100
                enqueued = i
            # Leaving the block took at most close_timeout: every outcome is known.
            await send.aclose()

    assert killed.is_set()
    assert len(acked) + len(failed) == enqueued
    assert len(failed) >= 100  # at least what was sent after the kill failed, clearly

    # Restart on the same data dir (a new port) and read everything back.
    bootstrap = await broker.start()
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    async with open_admin(bootstrap) as admin:
        with trio.fail_after(30):
            starts = await admin.list_offsets(tps, EARLIEST)
            ends = {tp: o.log_end for tp, o in (await admin.list_offsets(tps)).items()}
    assert {tp: o.offset for tp, o in starts.items()} == {tp: 0 for tp in tps}
    stored = await read_to_the_end(bootstrap, tps, ends)

    for tp in tps:
        offsets = [r.offset for r in stored[tp]]
        assert offsets == list(range(ends[tp])), f"{tp}: offsets not dense from 0"
        values = [number(r.value) for r in stored[tp]]
        assert values == sorted(set(values)), f"{tp}: records out of send order or twice"
        assert all(v % 2 == tp.partition for v in values)
    for partition, offset, value in acked:
        tp = TopicPartition("t", partition)
        assert offset < ends[tp], f"acknowledged {tp}@{offset} lost (log end {ends[tp]})"
        assert stored[tp][offset].value == value.encode()
    # Unacknowledged records may have been stored (the answer was lost), but nothing else.
    everything = {number(r.value) for tp in tps for r in stored[tp]}
    assert everything <= set(range(enqueued))
    assert {number(v.encode()) for _, _, v in acked} <= everything


# -- at least once across a consumer crash ---------------------------------------------------

SLOW_CONSUMER = textwrap.dedent(
    """
    import json, sys, trio
    from trio_coord import open_consumer

    async def main(bootstrap):
        async with open_consumer(
            bootstrap, "g", ["t"], session_timeout=1.0, offset_reset="earliest"
        ) as consumer:
            async for record in consumer:
                await trio.sleep(0.01)  # processing
                print(json.dumps([record.partition, record.offset, record.value.decode()]),
                      flush=True)

    trio.run(main, sys.argv[1])
    """
)


async def test_a_consumer_killed_halfway_costs_only_duplicates_after_the_commit(
    tmp_path, broker_processes
):
    n = 300
    broker = broker_processes(tmp_path / "data")
    bootstrap = await broker.start()
    async with open_admin(bootstrap) as admin:
        await admin.create_topic("t", 3)
    produced: dict[tuple[int, int], str] = {}
    async with open_producer(bootstrap) as producer:
        deliveries = [
            (await producer.enqueue("t", f"v{i}", key=f"k{i}"), f"v{i}") for i in range(n)
        ]
        for delivery, value in deliveries:
            meta = await delivery
            produced[meta.partition, meta.offset] = value
    assert len({p for p, _ in produced}) == 3

    # The first consumer, in its own process; killed once it has processed about half.
    first: list[tuple[int, int, str]] = []
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", SLOW_CONSUMER, bootstrap],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    try:
        buffer = b""
        with trio.fail_after(30):
            while len(first) < n // 2:
                chunk = await process.stdout.receive_some()
                assert chunk, "the consumer exited early"
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                first.extend(tuple(json.loads(line)) for line in lines)
        process.send_signal(signal.SIGKILL)
        with trio.fail_after(10):
            await process.wait()
            while chunk := await process.stdout.receive_some():  # printed before it died
                buffer += chunk
        first.extend(tuple(json.loads(line)) for line in buffer.split(b"\n") if line)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    async with open_admin(bootstrap) as admin:
        # The broker drops the dead member (connection lost, or its session timeout) and
        # commits the positions its heartbeats carried (within a position flush interval):
        # wait until the group is empty and its offsets have settled.
        with trio.fail_after(20):
            while (await admin.describe_group("g")).members:
                await trio.sleep(0.05)
            at_crash = await admin.committed_offsets("g")
            while True:
                await trio.sleep(1.5)
                again = await admin.committed_offsets("g")
                if again == at_crash:
                    break
                at_crash = again
        committed = {tp.partition: offset for tp, offset in at_crash.items()}
        assert sum(committed.values()) > 0, "nothing was committed before the crash"

        # The second consumer reads the rest, committing as it goes, until no lag is left.
        second: list[tuple[int, int, str]] = []
        async with open_consumer(
            bootstrap, "g", ["t"], session_timeout=1.0, offset_reset="earliest"
        ) as consumer:
            started_from = await consumer.wait_assigned()
            with trio.fail_after(30):
                while sum(row.lag for row in await admin.group_lag("g")) > 0:
                    with trio.move_on_after(0.5):
                        batch = await consumer.getmany()
                        second.extend((r.partition, r.offset, r.value.decode()) for r in batch)
                        await consumer.commit()

    # The second consumer started exactly at the offsets committed at the crash.
    assert {tp.partition: offset for tp, offset in started_from.items()} == {
        p: committed.get(p, -1) for p in range(3)
    }
    for processed in (first, second):  # what each processed is what was produced there
        for partition, offset, value in processed:
            assert produced[partition, offset] == value
    # Together they processed every record.
    assert {(p, o) for p, o, _ in first + second} == set(produced)
    times = Counter((p, o) for p, o, _ in first + second)
    for (partition, offset), count in times.items():
        if offset < committed.get(partition, 0):
            assert count == 1, f"t-{partition}@{offset} below the commit, processed {count}x"
        assert count <= 2
    # Committed means processed: everything below the commit was processed by the first.
    first_done = {(p, o) for p, o, _ in first}
    for partition, offset in committed.items():
        assert {(partition, o) for o in range(offset)} <= first_done
    # Each consumer processed each partition in order, without gaps.
    for name, processed in (("first", first), ("second", second)):
        by_partition: dict[int, list[int]] = defaultdict(list)
        for partition, offset, _ in processed:
            by_partition[partition].append(offset)
        for partition, offsets in by_partition.items():
            start = 0 if name == "first" else committed.get(partition, 0)
            assert offsets == list(range(start, start + len(offsets))), (name, partition)
