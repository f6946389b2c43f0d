"""``trio-coord demo``: a guided tour of a consumer group, in a few seconds.

It starts a broker on a temporary data dir (in this process), a producer
sending orders all along, and consumer *processes* (``trio-coord consume
--events json``), then narrates what a newcomer should see: consumers joining
and the partitions spreading out, a new consumer arriving, one consumer
killed with SIGKILL (a real crash: no goodbye), the coordinator noticing at
once and handing the dead consumer's partitions over only once its lease has
certainly run out, and a clean shutdown after which every order was
processed (at least once) and the group's lag is zero. Every rebalance is
shown with its timing, taken from the broker's own events.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgspec
import trio

from .broker import open_broker
from .broker.events import GroupEvent, Removed, Stable
from .client import open_admin, open_producer

__all__ = ["run_demo"]

TOPIC = "orders"
GROUP = "billing"


@dataclass
class _Consumer:
    name: str
    process: trio.Process
    member_id: str = ""
    partitions: list[str] = field(default_factory=list)
    records: int = 0


@dataclass
class _Tally:
    """Which orders the consumers processed, to show at-least-once at the end."""

    produced: int = 0
    seen: set[tuple[int, int]] = field(default_factory=set)
    duplicates: int = 0
    progress: trio.Event = field(default_factory=trio.Event)

    def record(self, partition: int, offset: int) -> None:
        if (partition, offset) in self.seen:
            self.duplicates += 1
        self.seen.add((partition, offset))
        self.progress.set()
        self.progress = trio.Event()


class _Narrator:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.2f}s] {text}", flush=True)

    def step(self, title: str) -> None:
        print(f"\n== {title}", flush=True)


def _short(partitions: list[str]) -> str:
    return " ".join(partitions) if partitions else "(nothing)"


async def run_demo(*, partitions: int = 6, session_timeout: float = 1.5) -> None:
    """Run the demo; prints to stdout and cleans up after itself."""
    narrator = _Narrator()
    stable = trio.Event()
    last_stable: dict[str, Any] = {}
    removed: list[dict[str, Any]] = []
    member_removed = trio.Event()

    def on_event(event: GroupEvent) -> None:
        if isinstance(event, Stable):
            last_stable.clear()
            last_stable.update(msgspec.structs.asdict(event))
            stable.set()
        elif isinstance(event, Removed):
            removed.append(msgspec.structs.asdict(event))
            member_removed.set()

    def next_stable() -> trio.Event:
        nonlocal stable
        stable = trio.Event()
        return stable

    with tempfile.TemporaryDirectory(prefix="trio-coord-demo-") as data_dir:
        narrator.step("A broker on an embedded store (no ZooKeeper needed)")
        async with open_broker(data_dir, on_event=on_event) as broker:
            narrator.say(f"broker listening on {broker.bootstrap}, data in {data_dir}")
            async with open_admin(broker.bootstrap) as admin:
                await admin.create_topic(TOPIC, partitions)
            narrator.say(f"created topic '{TOPIC}' with {partitions} partitions")

            consumers: dict[str, _Consumer] = {}
            tally = _Tally()
            async with trio.open_nursery() as nursery:

                async def start(name: str) -> _Consumer:
                    return await nursery.start(
                        _run_consumer, name, broker.bootstrap, session_timeout, consumers, tally
                    )

                producing = trio.CancelScope()

                async def produce() -> None:
                    async with open_producer(broker.bootstrap, linger=0.01) as producer:
                        with producing:
                            while True:
                                await producer.enqueue(
                                    TOPIC,
                                    f"order {tally.produced}",
                                    key=f"customer-{tally.produced % 50}",
                                )
                                tally.produced += 1
                                await trio.sleep(0.002)

                nursery.start_soon(produce)
                narrator.say("a producer sends orders, keyed by customer, all along")

                narrator.step(f"Three consumers join group '{GROUP}'")
                for name in ("A", "B", "C"):
                    waiter = next_stable()
                    joined = await start(name)
                    await waiter.wait()
                    narrator.say(
                        f"consumer {name} joined as {joined.member_id}; generation "
                        f"{last_stable['generation']} stable after "
                        f"{last_stable['elapsed'] * 1000:.1f} ms"
                    )
                await trio.sleep(0.2)
                _show(narrator, consumers, last_stable)

                narrator.step("A fourth consumer arrives")
                waiter = next_stable()
                await start("D")
                await waiter.wait()
                await trio.sleep(0.1)
                narrator.say(
                    f"rebalanced in {last_stable['elapsed'] * 1000:.1f} ms: every member "
                    "stopped its fetchers, then the partitions were dealt again"
                )
                _show(narrator, consumers, last_stable)

                narrator.step("Consumer B crashes (SIGKILL: no goodbye)")
                victim = consumers["B"]
                waiter = next_stable()
                killed_at = trio.current_time()
                victim.process.send_signal(signal.SIGKILL)
                narrator.say(
                    f"killed B (pid {victim.process.pid}), which owned {_short(victim.partitions)}"
                )
                await member_removed.wait()
                noticed = removed[-1]
                narrator.say(
                    f"coordinator noticed {(noticed['time'] - killed_at) * 1000:.0f} ms later "
                    f"({noticed['reason']}) and restarted the rebalance at once"
                )
                if noticed.get("fenced_until"):
                    narrator.say(
                        f"B's partitions stay fenced until its lease ends, "
                        f"{noticed['fenced_until'] - noticed['time']:.2f} s later: B might only "
                        "be cut off, and it drops them itself by then (no partition is ever "
                        "owned twice)"
                    )
                await waiter.wait()
                consumers.pop("B")
                await trio.sleep(0.1)
                narrator.say(
                    f"stable again {trio.current_time() - killed_at:.2f} s after the crash "
                    f"(session timeout {session_timeout:g} s)"
                )
                _show(narrator, consumers, last_stable)

                narrator.step("The producer stops; the consumers drain the topic")
                producing.cancel()
                await trio.sleep(0.05)
                with trio.move_on_after(10):
                    while len(tally.seen) < tally.produced:
                        await tally.progress.wait()
                counts = ", ".join(f"{c.name} {c.records}" for c in consumers.values())
                narrator.say(
                    f"{tally.produced} orders sent, {len(tally.seen)} distinct processed "
                    f"(records per consumer: {counts}); {tally.duplicates} processed twice: "
                    "records B had not committed when it died, or that were in flight at a "
                    "rebalance, go to their new owner again (at least once, never lost)"
                )

                narrator.step("The others shut down cleanly (SIGTERM: they leave the group)")
                for consumer in consumers.values():
                    consumer.process.send_signal(signal.SIGTERM)
                for consumer in consumers.values():
                    await consumer.process.wait()
                async with open_admin(broker.bootstrap) as admin:
                    desc = await admin.describe_group(GROUP)
                    lag = await admin.group_lag(GROUP)
                narrator.say(
                    f"group '{GROUP}' is {desc.state} at generation {desc.generation}; "
                    f"offsets committed for {len(desc.offsets)} partitions, total lag "
                    f"{sum(row.lag for row in lag)}"
                )
        print(
            "\nNext: run your own broker with 'trio-coord broker', then "
            "'trio-coord consume TOPIC --group G' in a few terminals, "
            "'trio-coord produce TOPIC' to send lines as records, and "
            "'trio-coord groups describe G' for the group's lag.",
            flush=True,
        )


def _show(narrator: _Narrator, consumers: dict[str, _Consumer], stable: dict[str, Any]) -> None:
    owner_of = stable.get("ownership", {})
    by_member: dict[str, list[str]] = {}
    for tp, member in owner_of.items():
        by_member.setdefault(member, []).append(tp)
    for consumer in consumers.values():
        mine = sorted(by_member.get(consumer.member_id, []), key=_partition_number)
        narrator.say(f"  consumer {consumer.name} owns {_short(mine)}")
    narrator.say(f"  generation {stable.get('generation')}")


def _partition_number(tp: str) -> int:
    return int(tp.rpartition("-")[2])


async def _run_consumer(
    name: str,
    bootstrap: str,
    session_timeout: float,
    consumers: dict[str, _Consumer],
    tally: _Tally,
    *,
    task_status: trio.TaskStatus[_Consumer] = trio.TASK_STATUS_IGNORED,
) -> None:
    command = [
        sys.executable,
        "-m",
        "trio_coord",
        "consume",
        TOPIC,
        "--group",
        GROUP,
        "--bootstrap",
        bootstrap,
        "--session-timeout",
        str(session_timeout),
        "--client-id",
        f"demo-{name}",
        "--events",
        "json",
        "--offset-reset",
        "earliest",
    ]
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(
                trio.run_process,
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                check=False,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
        consumer = _Consumer(name, process)
        consumers[name] = consumer
        assert process.stdout is not None
        started = False
        async for event in _json_lines(process.stdout):
            consumer.member_id = event.get("member_id", consumer.member_id)
            if event["event"] == "record":
                consumer.records += 1
                tally.record(event["partition"], event["offset"])
            elif event["event"] == "assigned":
                consumer.partitions = [f"{t}-{p}" for t, p in event["partitions"]]
            elif event["event"] in ("revoked", "lost"):
                consumer.partitions = []
            if event["event"] == "joined" and not started:
                started = True
                task_status.started(consumer)


async def _json_lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[dict[str, Any]]:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
