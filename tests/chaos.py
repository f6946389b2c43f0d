"""Consumer processes under chaos, and the checker of what they printed.

Shared by the chaos tests (``test_data_plane_chaos.py``: consumers killed;
``test_hardening_chaos.py``: consumers and the broker killed, connection
floods, a damaged segment; ``test_data_plane_crash.py``: the broker
killed). :class:`BrokerProcess` runs a broker in its own process. A consumer
process (``CONSUMER``) joins group ``g`` on topic ``t`` and prints one JSON
line per event, stamped with
``time.monotonic()`` (one system-wide clock on Linux, so stamps compare
across processes): ``assigned`` (with each partition's start offset),
``revoked``, ``lost`` (with the end of the consumer's lease), and ``record``
for each record it processed (its partition, offset and value; when it was
handed out and when its processing ended).

:func:`check_processing` reads those events and checks:

* completeness: every acknowledged record was processed, with its produced
  value; anything else processed is a record whose send had no known outcome
  (stored, but its answer was lost), and one offset never carries two values
  (no offset is reused);
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
* after a clean revoke the next owner starts right after the last record
  processed (no duplicates without a crash) unless the broker was killed in
  between (positions handed back may not have become durable then).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import trio

CLI = [sys.executable, "-m", "trio_coord"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}

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
            lease_end = consumer._membership._lease_end - trio.current_time() + time.monotonic()
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
        """Send ``signum`` (a no-op once the process has exited), noting when."""
        if self.process.returncode is not None:
            return
        self.process.send_signal(signum)
        # After the kill is sent: nothing the process did after this counts.
        if signum == signal.SIGKILL:
            self.killed_at = time.monotonic()
        else:
            self.terminated_at = time.monotonic()

    def processed(self) -> set[tuple[int, int]]:
        """The (partition, offset) of every record this process finished."""
        return {(e["p"], e["o"]) for e in self.events if e["event"] == "record"}

    def tail(self, lines: int = 15) -> str:
        """The end of the process's stderr, for a failure message."""
        text = self.stderr.read_text() if self.stderr.exists() else ""
        return f"--- {self.name} stderr (last {lines} lines):\n" + "\n".join(
            text.splitlines()[-lines:]
        )


class Fleet:
    """Consumer processes in slots; a slot's process is replaced after it is signalled."""

    def __init__(self, bootstrap: str, tmp_path: Path, nursery: trio.Nursery, work: float):
        self.bootstrap = bootstrap
        self.tmp_path = tmp_path
        self.nursery = nursery
        self.work = work
        self.runs: list[ConsumerRun] = []
        self.slots: dict[int, ConsumerRun] = {}

    async def start(self, slot: int) -> ConsumerRun:
        """Start a consumer process in ``slot`` (replacing whatever ran there)."""
        name = f"c{len(self.runs)}"
        stderr = self.tmp_path / f"{name}.stderr"
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", CONSUMER, self.bootstrap, str(self.work), str(stderr)],
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
        """The processes still running."""
        return [run for run in self.runs if run.process.returncode is None]

    def processed(self) -> set[tuple[int, int]]:
        """Every (partition, offset) any process finished."""
        return set().union(*(run.processed() for run in self.runs))

    async def kill_all(self) -> None:
        """Whatever still runs (a failed test) is killed and reaped."""
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            for run in self.runs:
                if run.process.returncode is None:
                    run.process.kill()
                    await run.process.wait()


class BrokerProcess:
    """``trio-coord broker`` on a data dir, in its own process (restartable, killable).

    ``port=0`` picks a free port at every start; a fixed port lets clients
    find a restarted broker where they left it. Its stderr (the broker's log)
    is appended to ``log`` when given.
    """

    def __init__(
        self, data_dir: Path, *options: str, port: int = 0, log: Path | None = None
    ) -> None:
        self.data_dir = data_dir
        self.options = options
        self.port = port
        self.log = log
        self.process: subprocess.Popen[str] | None = None
        self.bootstrap = ""

    async def start(self, *extra: str) -> str:
        """Start it (with ``extra`` options this time only); returns its address."""
        stderr = subprocess.DEVNULL if self.log is None else self.log.open("a")
        # Popen only forks and execs; the blocking read of the first line runs in a thread.
        self.process = subprocess.Popen(  # noqa: ASYNC220
            [*CLI, "broker", "--data-dir", str(self.data_dir), "--port", str(self.port),
             "--json", *self.options, *extra],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=ENV,
        )  # fmt: skip
        if stderr is not subprocess.DEVNULL:
            stderr.close()  # (the child has its own copy)
        with trio.fail_after(30):
            line = await trio.to_thread.run_sync(self.process.stdout.readline)
        assert line, f"the broker did not start; see {self.log}"
        self.bootstrap = json.loads(line)["address"]
        return self.bootstrap

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM it (if it runs) and wait for it to exit."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a hung broker is a bug
                self.process.kill()
                raise


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
    """Every ownership of a partition by ``run``, from its events and its death."""
    found: list[Ownership] = []
    open_: dict[int, Ownership] = {}
    for event in run.events:
        if event["event"] == "assigned":
            # It names what it adds: every start of an eager rebalance follows a revoke
            # of everything, and a staged start's later stages (docs/protocol.md) add
            # what a fence held back to what the member keeps fetching.
            for p, offset in event["start"].items():
                if (owned := open_.pop(int(p), None)) is not None:
                    owned.end, owned.how = event["t"], "reassigned"
                open_[int(p)] = Ownership(run, int(p), offset, event["t"])
                found.append(open_[int(p)])
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
    runs: list[ConsumerRun],
    produced: dict[tuple[int, int], str],
    *,
    unknown: frozenset[str] = frozenset(),
    broker_kills: tuple[float, ...] = (),
) -> tuple[list[str], dict]:
    """Every check on the printed events; returns the problems found, and some numbers.

    ``produced`` maps each acknowledged record's (partition, offset) to its
    value; ``unknown`` holds the values of sends whose outcome is unknown
    (they may have been stored); ``broker_kills`` the moments the broker was
    killed (a clean revoke's positions may be lost with it).
    """
    problems: list[str] = []
    by_partition: dict[int, list[Ownership]] = defaultdict(list)
    first_done: dict[tuple[int, int], float] = {}
    times: Counter[tuple[int, int]] = Counter()
    values: dict[tuple[int, int], str] = {}
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
            expected = produced.get((p, offset))
            if expected is None and value in unknown:
                expected = values.setdefault((p, offset), value)  # one value per offset
            if expected != value:
                problems.append(
                    f"{run.name} processed t-{p}@{offset} = {value!r}, produced {expected!r} there"
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

    # Completeness: every acknowledged record (duplicates aside); nothing never sent.
    missing = sorted(set(produced) - set(times))
    if missing:
        problems.append(f"acknowledged but never processed: {missing[:20]}")

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
            late = [
                i
                for i in range(o.start)
                if (p, i) in produced and first_done.get((p, i), math.inf) >= o.begin
            ]
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
            crashed = any(a.end <= t <= b.begin for t in broker_kills)
            if a.how == "revoked" and not killed and not crashed:
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
