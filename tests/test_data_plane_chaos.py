"""The data plane under consumer chaos: the operator's acceptance check, automated.

A broker process (``trio-coord broker --json``), a topic of six partitions and
1500 keyed records from an in-process producer: 600 before the group starts,
the rest while it runs. A group of three consumer processes (``CONSUMER``)
processes them, a few milliseconds of work each, while a seeded schedule
kills one (SIGKILL), kills two at once, or stops one (SIGTERM), and starts a
new process in its place: six times in about eight seconds. Then consumers
run until the group's lag is 0 and every record has been processed, and stop.

Each consumer prints one JSON line per event, stamped with ``time.monotonic()``
(one system-wide clock on Linux, so stamps compare across processes):
``assigned`` (with each partition's start offset), ``revoked``, ``lost``
(with the end of the consumer's lease), and ``record`` for each record it
processed (its partition, offset and value; when it was handed out and when
its processing ended). From them, and from the admin API, the test checks:

* completeness: the processed records are exactly the produced ones (every
  (partition, offset), nothing else), each with its produced value;
* order: within one ownership of a partition by a process (from ``assigned``
  to ``revoked``/``lost``, or to the process's death), the offsets processed
  run without a gap from the offset the partition was started at;
* exclusivity: no partition is owned by two processes at once. A process's
  ownership ends at ``revoked``, at its lease end for ``lost`` (the lease
  is the member's side of the fence), or when it was killed (the moment the
  signal was sent; the process's exit for a process that exited otherwise);
  every record was handed out within its process's ownership of its
  partition, and (except after a lost lease, which cannot interrupt a record
  in hand) processed before that ownership ended;
* at least once: a partition is started at an offset below which every
  record had been processed (by someone) before the start, and start
  offsets never go back (committed offsets never do);
* the end state: lag 0, and the committed offsets are the log ends; the
  SIGTERMed consumers left and exited cleanly, and no consumer died unasked.

After a clean revoke the next owner starts right after the last record
processed (no duplicates without a crash), even when the rebalance restarted
meanwhile: the chaos test counts rewinds after a clean revoke and expects none;
``test_positions_handed_back_survive_a_rebalance_restarted_meanwhile`` makes
that case deterministic.

The schedule depends only on the seed (two are run), so a failure names the
seed that reproduces it. Timing varies by machine; nothing is asserted about
time except the overall bounds (``fail_after``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from trio_coord import TopicPartition, open_admin, open_broker, open_consumer, open_producer

CLI = [sys.executable, "-m", "trio_coord"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
PARTITIONS = 6
BEFORE, DURING = 600, 900  # records produced before the group starts, and while it runs
WORK = 0.004  # seconds of "processing" per record

CONSUMER = textwrap.dedent(
    """
    import json, logging, signal, sys, time, trio
    from trio_coord import open_consumer

    sys.stderr = open(sys.argv[3], "w", buffering=1)  # tracebacks and the library's log
    logging.basicConfig(level=logging.INFO, format="%(created).3f %(name)s %(message)s")

    def emit(event, **fields):
        print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)

    async def main(bootstrap, work):
        busy = trio.Lock()  # held while a record is processed
        stop = trio.CancelScope()

        def on_assigned(tps):
            emit("assigned", start={tp.partition: consumer.assignment[tp] for tp in tps})

        async def on_revoked(tps):
            async with busy:  # the record in hand is finished first
                emit("revoked", partitions=[tp.partition for tp in tps])

        async def on_lost(tps):
            # The end of the lease (private; the consumer keeps it on Trio's clock).
            lease_end = consumer._lease_end - trio.current_time() + time.monotonic()
            async with busy:
                emit("lost", partitions=[tp.partition for tp in tps], lease_end=lease_end)

        consumer = open_consumer(
            bootstrap, "g", ["t"], session_timeout=1.0, offset_reset="earliest",
            on_assigned=on_assigned, on_revoked=on_revoked, on_lost=on_lost,
        )
        with trio.open_signal_receiver(signal.SIGTERM) as signals:

            async def terminate():
                async for _ in signals:
                    emit("sigterm")
                    stop.cancel()  # leave the group cleanly
                    return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(terminate)
                emit("ready")
                with stop:
                    async with consumer:
                        async for record in consumer:
                            handed = time.monotonic()
                            with trio.CancelScope(shield=True):  # finish what was handed out
                                async with busy:
                                    await trio.sleep(work)
                                    emit("record", p=record.partition, o=record.offset,
                                         v=record.value.decode(), handed=handed)
                nursery.cancel_scope.cancel()
        emit("exit")

    trio.run(main, sys.argv[1], float(sys.argv[2]))
    """
)


@pytest.fixture
def broker_address(tmp_path):
    """A broker process (short minimum session timeout); yields its bootstrap address."""
    log = (tmp_path / "broker.log").open("w")
    process = subprocess.Popen(
        [*CLI, "broker", "--data-dir", str(tmp_path / "data"), "--port", "0", "--json",
         "--min-session-timeout", "0.2"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=ENV,
    )  # fmt: skip
    try:
        ready, _, _ = select.select([process.stdout], [], [], 30)
        line = process.stdout.readline() if ready else ""
        assert line, f"the broker did not start; see {tmp_path / 'broker.log'}"
        yield json.loads(line)["address"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:  # pragma: no cover - a hung broker is a bug
            process.kill()
            process.wait()
            raise
        finally:
            log.close()


# -- the consumer processes ---------------------------------------------------------------


@dataclass
class ConsumerRun:
    """One consumer process: its events as printed, and what the test did to it."""

    name: str
    process: trio.Process
    stderr: Path
    events: list[dict] = field(default_factory=list)
    ready: trio.Event = field(default_factory=trio.Event)
    exited: trio.Event = field(default_factory=trio.Event)
    killed_at: float | None = None  # when SIGKILL was sent
    terminated_at: float | None = None  # when SIGTERM was sent
    exited_at: float | None = None
    returncode: int | None = None

    async def watch(self) -> None:
        """Collect the printed events until the process exits (never leave the pipe full)."""
        assert self.process.stdout is not None
        buffer = b""
        while chunk := await self.process.stdout.receive_some():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                event = json.loads(line)
                self.events.append(event)
                if event["event"] == "ready":
                    self.ready.set()
        self.returncode = await self.process.wait()
        self.exited_at = time.monotonic()
        self.exited.set()

    def signal(self, signum: int) -> None:
        if self.process.returncode is not None:
            return
        self.process.send_signal(signum)
        # After the kill is sent: nothing the process did after this counts.
        if signum == signal.SIGKILL:
            self.killed_at = time.monotonic()
        else:
            self.terminated_at = time.monotonic()

    def tail(self, lines: int = 15) -> str:
        text = self.stderr.read_text() if self.stderr.exists() else ""
        return f"--- {self.name} stderr (last {lines} lines):\n" + "\n".join(
            text.splitlines()[-lines:]
        )


class Fleet:
    """Consumer processes in slots; a slot's process is replaced after it is signalled."""

    def __init__(self, bootstrap: str, tmp_path: Path, nursery: trio.Nursery) -> None:
        self.bootstrap = bootstrap
        self.tmp_path = tmp_path
        self.nursery = nursery
        self.runs: list[ConsumerRun] = []
        self.slots: dict[int, ConsumerRun] = {}

    async def start(self, slot: int) -> ConsumerRun:
        name = f"c{len(self.runs)}"
        stderr = self.tmp_path / f"{name}.stderr"
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", CONSUMER, self.bootstrap, str(WORK), str(stderr)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=ENV,
        )
        run = ConsumerRun(name, process, stderr)
        self.runs.append(run)
        self.slots[slot] = run
        self.nursery.start_soon(run.watch)
        return run

    def live(self) -> list[ConsumerRun]:
        return [run for run in self.runs if run.process.returncode is None]

    async def kill_all(self) -> None:
        """Whatever still runs (a failed test) is killed and reaped."""
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            for run in self.runs:
                if run.process.returncode is None:
                    run.process.kill()
                    await run.process.wait()


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the schedule starts
    slots: tuple[int, ...]
    signum: int
    restart_after: float  # seconds until the replacements start


def chaos_schedule(seed: int) -> list[Step]:
    """Six steps about 1.2 s apart: two single kills, two double kills, one SIGTERM, one any."""
    rng = random.Random(seed)
    kinds = ["kill", "kill", "kill2", "kill2", "term", rng.choice(["kill", "kill2", "term"])]
    rng.shuffle(kinds)
    steps, at = [], 0.5
    for kind in kinds:
        at += rng.uniform(0.9, 1.5)
        slots = tuple(rng.sample(range(3), 2 if kind == "kill2" else 1))
        signum = signal.SIGTERM if kind == "term" else signal.SIGKILL
        steps.append(Step(round(at, 3), slots, signum, round(rng.uniform(0.0, 0.6), 3)))
    return steps


async def run_schedule(fleet: Fleet, steps: list[Step]) -> None:
    began = trio.current_time()
    for step in steps:
        await trio.sleep_until(began + step.at)
        victims = [fleet.slots[slot] for slot in step.slots]
        if step.signum == signal.SIGTERM:
            with trio.fail_after(30):  # before its handler is in place SIGTERM would kill it
                for victim in victims:
                    await victim.ready.wait()
        for victim in victims:
            victim.signal(step.signum)
        await trio.sleep(step.restart_after)
        for slot in step.slots:
            await fleet.start(slot)


# -- producing ------------------------------------------------------------------------------


async def produce(producer, numbers: range, produced: dict[tuple[int, int], str]) -> None:
    """Send records ``numbers`` (keyed) and note where each landed."""
    deliveries = []
    for i in numbers:
        value = f"v{i}"
        deliveries.append((value, await producer.enqueue("t", value, key=f"key-{i % 101}")))
    for value, delivery in deliveries:
        meta = await delivery
        assert (meta.partition, meta.offset) not in produced
        produced[meta.partition, meta.offset] = value


async def produce_steadily(producer, produced: dict[tuple[int, int], str], done: trio.Event):
    """The rest of the records, in small batches over about seven seconds."""
    for first in range(BEFORE, BEFORE + DURING, 15):
        await produce(producer, range(first, min(first + 15, BEFORE + DURING)), produced)
        await trio.sleep(0.11)
    done.set()


# -- what the events say ------------------------------------------------------------------


@dataclass
class Ownership:
    """One process owning one partition: from ``assigned`` until ``how`` ended it."""

    run: ConsumerRun
    partition: int
    start: int  # the offset it was started at
    begin: float
    end: float = math.inf
    how: str = ""  # revoked, lost, reassigned, killed, exited
    offsets: list[int] = field(default_factory=list)  # processed, in order

    def __str__(self) -> str:
        return (
            f"{self.run.name} owned t-{self.partition} from {self.begin:.3f} "
            f"(at offset {self.start}) to {self.end:.3f} ({self.how})"
        )


def ownerships(run: ConsumerRun) -> list[Ownership]:
    found: list[Ownership] = []
    open_: dict[int, Ownership] = {}
    for event in run.events:
        if event["event"] == "assigned":
            for owned in open_.values():
                owned.end, owned.how = event["t"], "reassigned"
            open_ = {
                int(p): Ownership(run, int(p), offset, event["t"])
                for p, offset in event["start"].items()
            }
            found.extend(open_.values())
        elif event["event"] in ("revoked", "lost"):
            end = event["t"]
            if event["event"] == "lost":
                end = min(end, event["lease_end"])
            for p in event["partitions"]:
                if (owned := open_.pop(p, None)) is not None:
                    owned.end, owned.how = end, event["event"]
    # Still owned when the process died: until it was killed, or until it exited.
    assert run.exited_at is not None
    death = run.killed_at if run.killed_at is not None else run.exited_at
    for owned in open_.values():
        owned.end, owned.how = death, "killed" if run.killed_at is not None else "exited"
    return found


def check_processing(
    runs: list[ConsumerRun], produced: dict[tuple[int, int], str]
) -> tuple[list[str], dict]:
    """Every check on the printed events; returns the problems found, and some numbers."""
    problems: list[str] = []
    by_partition: dict[int, list[Ownership]] = defaultdict(list)
    first_done: dict[tuple[int, int], float] = {}
    times: Counter[tuple[int, int]] = Counter()
    rewound = 0
    for run in runs:
        owned = ownerships(run)
        for o in owned:
            by_partition[o.partition].append(o)
        for event in run.events:
            if event["event"] != "record":
                continue
            p, offset, value, handed, done = (event[k] for k in ("p", "o", "v", "handed", "t"))
            times[p, offset] += 1
            first_done[p, offset] = min(done, first_done.get((p, offset), math.inf))
            if produced.get((p, offset)) != value:
                problems.append(
                    f"{run.name} processed t-{p}@{offset} = {value!r}, "
                    f"produced {produced.get((p, offset))!r}"
                )
            home = [o for o in owned if o.partition == p and o.begin <= handed < o.end]
            if not home:
                problems.append(
                    f"{run.name} was handed t-{p}@{offset} at {handed:.3f}, not owning t-{p}: "
                    + "; ".join(str(o) for o in owned if o.partition == p)
                )
                continue
            if done > home[0].end and home[0].how != "lost":
                problems.append(f"{run.name} finished t-{p}@{offset} at {done:.3f}: {home[0]}")
            home[0].offsets.append(offset)

    # Completeness: exactly the produced records (duplicates aside).
    missing = sorted(set(produced) - set(times))
    extra = sorted(set(times) - set(produced))
    if missing or extra:
        problems.append(f"never processed: {missing[:20]}; not produced: {extra[:20]}")

    for p, owned in sorted(by_partition.items()):
        owned.sort(key=lambda o: (o.begin, o.end))
        for o in owned:
            # Order: from the start offset, no gap, nothing twice.
            wrong = [i for i, offset in enumerate(o.offsets) if offset != o.start + i]
            if wrong:
                k = wrong[0]
                problems.append(
                    f"{o}: processed ...{o.offsets[max(0, k - 3) : k + 3]}..., "
                    f"not {o.start + k} after {o.offsets[k - 1] if k else 'the start'}"
                )
            # At least once: everything below the start offset was processed before it.
            late = [i for i in range(o.start) if first_done.get((p, i), math.inf) >= o.begin]
            if late:
                problems.append(f"{o}, but t-{p}@{late[:5]} had not been processed by then")
        # Exclusivity: no two processes own the partition at once.
        for i, a in enumerate(owned):
            for b in owned[i + 1 :]:
                if a.run is not b.run and max(a.begin, b.begin) < min(a.end, b.end):
                    problems.append(f"two owners at once: {a} / {b}")
        for a, b in itertools.pairwise(owned):
            # Committed offsets never go back, so neither do start offsets.
            if b.start < a.start:
                problems.append(f"start offset went back: {a} / then {b}")
            # A clean handoff starts the next owner right after the last record
            # processed, even if the rebalance restarted meanwhile (see the test below).
            killed = a.run.killed_at is not None and a.run.killed_at < b.begin
            if a.how == "revoked" and not killed:
                handed_back = a.offsets[-1] + 1 if a.offsets else a.start
                if b.start != handed_back:
                    rewound += 1
                    problems.append(f"{b} after a clean revoke at {handed_back}: {a}")
    stats = {
        "processes": len(runs),
        "ownerships": sum(len(o) for o in by_partition.values()),
        "processed": sum(times.values()),
        "duplicates": sum(n - 1 for n in times.values()),
        "lost": sum(o.how == "lost" for owned in by_partition.values() for o in owned),
        "rewound after a clean revoke": rewound,
    }
    return problems, stats


# -- the test -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2], ids=lambda s: f"seed{s}")
async def test_a_group_under_kills_and_restarts_processes_everything_exclusively(
    broker_address, tmp_path, seed
):
    bootstrap = broker_address
    steps = chaos_schedule(seed)
    async with open_admin(bootstrap) as admin:
        await admin.create_topic("t", PARTITIONS)
        produced: dict[tuple[int, int], str] = {}
        tps = [TopicPartition("t", p) for p in range(PARTITIONS)]
        async with open_producer(bootstrap, linger=0.005) as producer:
            await produce(producer, range(BEFORE), produced)
            async with trio.open_nursery() as nursery:
                fleet = Fleet(bootstrap, tmp_path, nursery)
                try:
                    for slot in range(3):
                        await fleet.start(slot)
                    with trio.fail_after(30):
                        for run in fleet.runs:
                            await run.ready.wait()
                    produced_all = trio.Event()
                    nursery.start_soon(produce_steadily, producer, produced, produced_all)
                    with trio.fail_after(60):
                        await run_schedule(fleet, steps)
                        await produced_all.wait()

                    # Consumers run until every record is processed and committed.
                    with trio.move_on_after(40) as waited:
                        while True:
                            processed = {
                                (e["p"], e["o"])
                                for run in fleet.runs
                                for e in run.events
                                if e["event"] == "record"
                            }
                            lag = await admin.group_lag("g")
                            if processed >= set(produced) and sum(r.lag for r in lag) == 0:
                                break
                            await trio.sleep(0.25)
                    if waited.cancelled_caught:
                        pytest.fail(
                            f"seed {seed}: no convergence within 40 s; "
                            f"{len(set(produced) - processed)} records never processed; lag "
                            f"{[(r.partition, r.committed, r.log_end, r.owner) for r in lag]}\n"
                            + "\n".join(run.tail() for run in fleet.live())
                        )
                    with trio.fail_after(30):
                        for run in fleet.live():
                            await run.ready.wait()
                            run.signal(signal.SIGTERM)
                        for run in fleet.runs:
                            await run.exited.wait()
                finally:
                    await fleet.kill_all()

        assert len(produced) == BEFORE + DURING
        ends = {tp: o.log_end for tp, o in (await admin.list_offsets(tps)).items()}
        assert sum(ends.values()) == len(produced) and all(ends.values())
        with trio.fail_after(10):
            group = await admin.describe_group("g")
            committed = await admin.committed_offsets("g")
            lag = await admin.group_lag("g")
    assert group.members == [], "the consumers left; the group is empty"
    assert committed == ends, "the committed offsets are the log ends"
    assert [(r.partition, r.lag) for r in lag] == [(p, 0) for p in range(PARTITIONS)]

    # Each process died as it was told to: SIGKILL, or SIGTERM and a clean exit.
    for run in fleet.runs:
        if run.killed_at is not None:
            assert run.returncode == -signal.SIGKILL, run.tail()
        else:
            assert run.terminated_at is not None, f"{run.name} died unasked\n{run.tail()}"
            assert run.returncode == 0, f"{run.name} after SIGTERM\n{run.tail()}"
            assert run.events[-1]["event"] == "exit", run.tail()

    problems, stats = check_processing(fleet.runs, produced)
    print(f"seed {seed}: {stats}; schedule {steps}")
    assert not problems, f"seed {seed}: {len(problems)} problem(s):\n" + "\n".join(problems[:30])


async def test_positions_handed_back_survive_a_rebalance_restarted_meanwhile(tmp_path):
    """What the chaos test counts as "rewound after a clean revoke", made deterministic.

    A consumes offsets 0..8 of a partition (9 is handed out, not yet consumed)
    under a long session, so that no heartbeat carries its position: only its
    StopFetchers answer does. B joins; while A is in ``on_revoked`` C joins,
    which restarts the rebalance and drops A's answer. Whoever owns the
    partition next starts at 9, where A stopped: A says its positions again
    when the restarted rebalance asks it to stop.
    """
    async with open_broker(tmp_path / "data", min_session_timeout=0.05) as broker:
        await _positions_after_a_restarted_rebalance(broker.bootstrap)


async def _positions_after_a_restarted_rebalance(bootstrap: str) -> None:
    tp = TopicPartition("t", 0)
    async with open_admin(bootstrap) as admin:
        await admin.create_topic("t", 1)
    async with open_producer(bootstrap) as producer:
        for i in range(20):
            await producer.send("t", f"v{i}", partition=0)
    revoking, c_joined, done = trio.Event(), trio.Event(), trio.Event()
    consumers = {}

    async def on_revoked(tps):
        revoking.set()
        with trio.move_on_after(10):
            await c_joined.wait()  # the restart happens while A revokes

    async def member(name: str, joined: trio.Event) -> None:
        async with open_consumer(
            bootstrap, "g", ["t"], session_timeout=1.0, offset_reset="earliest"
        ) as consumer:
            consumers[name] = consumer
            joined.set()
            await done.wait()

    async with open_consumer(
        bootstrap, "g", ["t"], session_timeout=30.0, offset_reset="earliest",
        on_revoked=on_revoked,
    ) as a:  # fmt: skip
        consumers["A"] = a
        assert await a.wait_assigned() == {tp: 0}
        assert [(await a.getone()).offset for _ in range(10)] == list(range(10))
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(member, "B", trio.Event())
                await revoking.wait()
                nursery.start_soon(member, "C", c_joined)
                while len(consumers) < 3 or not all(
                    c.state == "STABLE" for c in consumers.values()
                ):
                    await trio.sleep(0.02)
                owners = {n: c.assignment[tp] for n, c in consumers.items() if c.assignment}
                done.set()
    assert list(owners.values()) == [9], f"the next owner started at {owners}, not 9"
