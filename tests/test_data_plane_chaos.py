"""The data plane under consumer chaos: the operator's acceptance check, automated.

A broker process (``trio-coord broker --json``), a topic of six partitions and
1500 keyed records from an in-process producer: 600 before the group starts,
the rest while it runs. A group of three consumer processes (``CONSUMER``)
processes them (``chaos.CONSUMER``), a few milliseconds of work each, while a seeded schedule
kills one (SIGKILL), kills two at once, or stops one (SIGTERM), and starts a
new process in its place: six times in about eight seconds. Then consumers
run until the group's lag is 0 and every record has been processed, and stop.

Each consumer prints one JSON line per event, stamped with ``time.monotonic()``
(one system-wide clock on Linux, so stamps compare across processes):
``assigned`` (with each partition's start offset), ``revoked``, ``lost``
(with the end of the consumer's lease), and ``record`` for each record it
processed (its partition, offset and value; when it was handed out and when
its processing ended). From them, ``chaos.check_processing`` checks
completeness, order within each ownership, exclusivity and at least once
(its docstring says how); from the admin API the test checks the end state:
lag 0, the committed offsets are the log ends, the SIGTERMed consumers left
and exited cleanly, and no consumer died unasked. After a clean revoke the
next owner starts right after the last record processed (no duplicates
without a crash), even when the rebalance restarted meanwhile:
``test_positions_handed_back_survive_a_rebalance_restarted_meanwhile`` makes
that case deterministic.

The schedule depends only on the seed (two are run), so a failure names the
seed that reproduces it. Timing varies by machine; nothing is asserted about
time except the overall bounds (``fail_after``).
"""

from __future__ import annotations

import random
import signal
import sys
from dataclasses import dataclass

import pytest
import trio
from broker_process import running_broker
from chaos import Fleet, check_processing

from trio_coord import TopicPartition, open_admin, open_broker, open_consumer, open_producer

CLI = [sys.executable, "-m", "trio_coord"]
PARTITIONS = 6
BEFORE, DURING = 600, 900  # records produced before the group starts, and while it runs
WORK = 0.004  # seconds of "processing" per record


@pytest.fixture
def broker_address(tmp_path):
    """A broker process (short minimum session timeout); yields its bootstrap address."""
    with running_broker(tmp_path / "data", "--min-session-timeout", "0.2") as address:
        yield address


# -- the schedule ------------------------------------------------------------------------


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
                fleet = Fleet(bootstrap, tmp_path, nursery, WORK)
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
