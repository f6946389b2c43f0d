"""Kafka-protocol throughput and rebalance latency: trio-coord against librdkafka's mock cluster.

``python bench/kafka.py [--records N] [--size S] [--partitions P]
[--repeat R] [--flush-interval F] [--members N] [--rebalance-rounds K]
[--session-timeout-ms S] [--heartbeat-interval-ms H] [--json] [--quick]`` measures, with
confluent-kafka (librdkafka) clients in this process:

* produce: a Producer (``linger.ms`` 5, no compression, acks=all, the
  defaults otherwise) sends N records of S bytes round-robin to the P
  partitions of a fresh topic and flushes (every record acknowledged);
* consume: a Consumer assigned those P partitions from offset 0 (no group)
  reads all N records with ``consume(1000)``.

Targets, measured back to back and alternating in order, R times: a
trio-coord broker (its own process, ``--kafka-port 0``, an interval flush
policy of F seconds: acknowledged once written, as Kafka acknowledges
before any fsync; ``--flush-interval 0`` fsyncs every batch), and
librdkafka's built-in mock cluster (``test.mock.num.brokers`` 3, in memory,
in this process). The figures that travel between machines are the ratios
trio-coord/mock of records per second (goal: >= 0.5), medians over the
repetitions. ``--quick`` is a smoke run (few records, one repetition).

Rebalance latency (``--members N`` (3), ``--session-timeout-ms`` (6000; 3000
with ``--quick``), ``--heartbeat-interval-ms`` (500), ``--rebalance-rounds K``
(3; 1 with ``--quick``; 0 skips)): N+1 confluent-kafka consumers (classic
protocol, librdkafka's default eager assignors), each in a subprocess that
reports every on_assign/on_revoke callback to this process through a pipe
(with its ``time.monotonic()``, one clock for the machine), on a topic of as
many partitions as the mock gives a topic it creates on first use (4; the
mock has no CreateTopics). N members form the group; then, each timed from
the moment of the event until the members left own every partition exactly
once, each at least one (and no callback follows for 0.5 s):

* join: the (N+1)th member subscribes;
* leave: a member closes (LeaveGroup);
* crash: a member is SIGKILLed; ``crash_revoke`` is the time until the
  first survivor is told to revoke (the rebalance began).

The same session timeout is used on both targets. Ratios are trio-coord/mock
of the medians (lower is faster; the goal is crash < 1).

The mock keeps about 5 MB per partition and drops older records beyond
that, so N x S / P must stay below it (the default 100,000 x 100 B / 4 does).

``--kip848`` measures only rebalance latency, the classic protocol
(librdkafka's ``cooperative-sticky``, heartbeat.interval.ms 500) against
``group.protocol=consumer`` (KIP-848, the broker's assignor), consumers in
threads of this process: ``form`` is the time from N members subscribing at
once until every partition is owned exactly once, each member owning some;
``join`` the time from an (N+1)th member subscribing until that holds again
for N+1. On trio-coord the topic has P partitions (``--members 10
--partitions 1000``: KIP-848's published test had 10 members and up to 1,000
partitions, ~5 s against ~103 s classic; the goal here is under 1 s); its
broker runs with ``--consumer-heartbeat-interval`` as its
``--kafka-consumer-heartbeat-interval`` (0.5 s, the broker's default: a
member learns a revocation or an assignment at its next heartbeat). On the
mock cluster (which serves KIP-848 too) topics have 4 partitions, so min(N, 3)
members: the figure that travels is each target's
consumer/classic ratio, not trio-coord/mock.
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent


def _start_broker(
    directory: Path, flush_interval: float, *extra: str
) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_coord",
            "broker",
            "--data-dir",
            str(directory / "data"),
            "--port",
            "0",
            "--kafka-port",
            "0",
            "--flush-interval",
            str(flush_interval),
            "--json",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=(directory / "broker.log").open("w"),
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise SystemExit(f"the broker did not start: {(directory / 'broker.log').read_text()}")
    return process, json.loads(line)["kafka_address"]


def _mock_cluster() -> tuple[Producer, str]:
    """A Producer that hosts librdkafka's mock cluster, and the cluster's bootstrap list."""
    host = Producer({"test.mock.num.brokers": 3, "bootstrap.servers": "", "log_level": 3})
    brokers = host.list_topics(timeout=10).brokers.values()
    return host, ",".join(f"{b.host}:{b.port}" for b in brokers)


def _create(bootstrap: str, topic: str, partitions: int, mock: Producer | None) -> int:
    """Create ``topic``; returns its partition count (the mock creates topics on first use)."""
    if mock is not None:
        mock.produce(topic, b"warm-up", partition=0)
        mock.flush(10)
        return len(mock.list_topics(topic, timeout=10).topics[topic].partitions)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(15)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"warm-up", partition=0)
    producer.flush(10)
    return partitions


def _produce(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    producer.list_topics(topic, timeout=10)  # connected before the clock starts
    value = b"x" * size
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.001)
    left = producer.flush(120)
    elapsed = time.perf_counter() - started
    if left:
        raise SystemExit(f"{left} records were not acknowledged")
    return elapsed


def _consume(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    try:
        wanted = records + 1  # (and the warm-up record)
        got = 0
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = started + 120
        while got < wanted and time.perf_counter() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    got += 1
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if got < wanted:
        raise SystemExit(f"{bootstrap}: consumed {got} of {wanted} records of {topic}")
    return elapsed


# --- Rebalance latency -------------------------------------------------------

MEMBER = """
import json, sys, threading, time
from confluent_kafka import Consumer
bootstrap, group, topic, session, heartbeat = sys.argv[1:6]
def say(event, **fields):
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)
go, close = threading.Event(), threading.Event()
def commands():
    for line in sys.stdin:
        {"go": go, "close": close}[line.strip()].set()
    close.set()
threading.Thread(target=commands, daemon=True).start()
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
              "session.timeout.ms": int(session), "heartbeat.interval.ms": int(heartbeat),
              "log_level": 0})
say("ready")
go.wait()
c.subscribe([topic],
            on_assign=lambda _, ps: say("assign", partitions=[p.partition for p in ps]),
            on_revoke=lambda _, ps: say("revoke", partitions=[p.partition for p in ps]))
while not close.is_set():
    c.poll(0.02)
c.close()
say("closed")
"""


class _Member:
    """A confluent-kafka group member in a subprocess, reporting its (re)assignments.

    A thread reads the member's reports (a JSON line per on_assign/on_revoke
    callback, with the member's ``time.monotonic()``: one clock for every
    process of the machine) and queues them as ``(member, report)``.
    """

    def __init__(self, index: int, argv: list[str], events: queue.Queue[Any]) -> None:
        self.index = index
        self.owned: set[int] = set()
        self.process = subprocess.Popen(
            [sys.executable, "-c", MEMBER, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events = events

    def wait_ready(self) -> None:
        """Wait until the member's consumer exists, then start reading its reports."""
        assert self.process.stdout is not None
        if not self.process.stdout.readline():
            raise SystemExit("a group member did not start")
        threading.Thread(target=self._read, args=(self.events,), daemon=True).start()

    def _read(self, events: queue.Queue[Any]) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            events.put((self, json.loads(line)))

    def send(self, command: str) -> float:
        """Send ``go`` or ``close``; returns the moment it was sent."""
        assert self.process.stdin is not None
        at = time.monotonic()
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return at

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.send("close")
                self.process.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def _settle(
    events: queue.Queue[Any], survivors: list[_Member], partitions: int, since: float
) -> float:
    """Seconds from ``since`` until ``survivors`` own every partition exactly once, each some,
    and until the first survivor was told to revoke (the rebalance began).

    Reports are applied as they come; the moment is that of the report that
    completed the assignment, once no other report followed for 0.5 s (an
    eager rebalance revokes everything before it assigns anew, so a
    complete-looking mix of old and new generations would be undone at once).
    """
    done_at: float | None = None
    revoked_at = math.inf
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            member, report = events.get(timeout=0.5)
        except queue.Empty:
            if done_at is not None:
                return done_at - since, revoked_at - since
            continue
        if report["event"] == "assign":
            member.owned |= set(report["partitions"])
        elif report["event"] == "revoke":
            member.owned -= set(report["partitions"])
            if member in survivors:
                revoked_at = min(revoked_at, report["t"])
        owned = [p for m in survivors for p in m.owned]
        complete = sorted(owned) == list(range(partitions)) and all(m.owned for m in survivors)
        if not complete:
            done_at = None
        elif done_at is None:
            done_at = report["t"]
    raise SystemExit(f"no complete assignment in 60 s: {[sorted(m.owned) for m in survivors]}")


def _rebalance_round(
    bootstrap: str, topic: str, partitions: int, group: str, params: dict[str, Any]
) -> dict[str, float]:
    """One group of N members, then a join, a clean leave and a SIGKILL: seconds each."""
    n = params["members"]
    events: queue.Queue[Any] = queue.Queue()
    argv = [bootstrap, group, topic, str(params["session_timeout_ms"])]
    argv.append(str(params["heartbeat_interval_ms"]))
    members = [_Member(i, argv, events) for i in range(n + 1)]
    try:
        for m in members:
            m.wait_ready()
        started = min(m.send("go") for m in members[:n])
        _settle(events, members[:n], partitions, started)
        join, _ = _settle(events, members, partitions, members[n].send("go"))
        leave, _ = _settle(events, members[1:], partitions, members[0].send("close"))
        killed = time.monotonic()
        members[1].process.kill()  # SIGKILL: no LeaveGroup, the sockets just close
        crash, crash_revoke = _settle(events, members[2:], partitions, killed)
    finally:
        for m in members:
            m.stop()
    return {"join": join, "leave": leave, "crash": crash, "crash_revoke": crash_revoke}


def run_rebalance(
    params: dict[str, Any], trio_bootstrap: str, mock: Producer, mock_bootstrap: str
) -> dict[str, Any]:
    """Rebalance latency, alternating targets, ``params["rebalance_rounds"]`` times."""
    samples: dict[str, dict[str, list[float]]] = {
        t: {"join": [], "leave": [], "crash": [], "crash_revoke": []}
        for t in ("trio_coord", "mock")
    }
    # The mock creates topics on first use only (no CreateTopics), with its default
    # partition count: trio-coord's topic gets as many.
    partitions = 0
    for rep in range(params["rebalance_rounds"]):
        order = ["trio_coord", "mock"] if rep % 2 == 0 else ["mock", "trio_coord"]
        for target in order:
            topic = f"rebalance-{rep}-{target}"
            if target == "mock":
                partitions = _create(mock_bootstrap, topic, 0, mock)
                bootstrap = mock_bootstrap
            else:
                partitions = partitions or _create(mock_bootstrap, f"probe-{rep}", 0, mock)
                _create(trio_bootstrap, topic, partitions, None)
                bootstrap = trio_bootstrap
            if partitions <= params["members"]:
                raise SystemExit(f"{partitions} partitions for {params['members']} + 1 members")
            figures = _rebalance_round(bootstrap, topic, partitions, f"g-{topic}", params)
            for what, seconds in figures.items():
                samples[target][what].append(seconds * 1000)
    result: dict[str, Any] = {"partitions": partitions, "samples_ms": samples}
    for target, figures in samples.items():
        result[target] = {f"{what}_ms": statistics.median(v) for what, v in figures.items()}
    result["ratio"] = {
        what: result["trio_coord"][f"{what}_ms"] / result["mock"][f"{what}_ms"]
        for what in ("join", "leave", "crash", "crash_revoke")
    }
    return result


def run(params: dict[str, Any]) -> dict[str, Any]:
    """Run the benchmark with ``params``; the result as a JSON-able dict."""
    records, size = params["records"], params["size"]
    samples: dict[str, dict[str, list[float]]] = {
        t: {"produce": [], "consume": []} for t in ("trio_coord", "mock")
    }
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        process, trio_bootstrap = _start_broker(Path(tmp), params["flush_interval"])
        mock, mock_bootstrap = _mock_cluster()
        try:
            for rep in range(params["repeat"]):
                order = ["trio_coord", "mock"] if rep % 2 == 0 else ["mock", "trio_coord"]
                for target in order:
                    bootstrap = trio_bootstrap if target == "trio_coord" else mock_bootstrap
                    topic = f"bench-{rep}-{target}"
                    parts = _create(
                        bootstrap, topic, params["partitions"], mock if target == "mock" else None
                    )
                    produce = _produce(bootstrap, topic, parts, records, size)
                    consume = _consume(bootstrap, topic, parts, records)
                    samples[target]["produce"].append(records / produce)
                    samples[target]["consume"].append(records / consume)
            rebalance = None
            if params["rebalance_rounds"]:
                rebalance = run_rebalance(params, trio_bootstrap, mock, mock_bootstrap)
        finally:
            process.terminate()
            process.wait(10)
            del mock
    result: dict[str, Any] = {"params": params}
    for target, figures in samples.items():
        result[target] = {
            f"{what}_records_per_s": statistics.median(values) for what, values in figures.items()
        }
        result[target]["produce_mb_per_s"] = result[target]["produce_records_per_s"] * size / 1e6
    result["ratio"] = {
        what: statistics.median(
            t / m for t, m in zip(samples["trio_coord"][what], samples["mock"][what], strict=True)
        )
        for what in ("produce", "consume")
    }
    if rebalance is not None:
        result["rebalance"] = rebalance
    return result


# -- KIP-848: rebalance latency, classic vs group.protocol=consumer --------------------------


class _Members:
    """Consumers polled by one thread each; each one's assignment as its own thread saw it
    (Consumer.assignment() from another thread can deadlock with a rebalance callback)."""

    def __init__(self) -> None:
        self.assigned: dict[int, frozenset[int]] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, index: int, config: dict[str, Any], topic: str) -> None:
        def run() -> None:
            c = Consumer(config)
            c.subscribe([topic])
            try:
                while not self.stop.is_set():
                    msg = c.poll(0.01)
                    if msg is not None and msg.error() and len(self.errors) < 5:
                        self.errors.append(str(msg.error()))
                    self.assigned[index] = frozenset(tp.partition for tp in c.assignment())
            finally:
                c.close()

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()

    def exact(self, partitions: int, members: int) -> bool:
        """Every partition owned exactly once, by ``members`` members that each own some."""
        owned = [self.assigned.get(i, frozenset()) for i in range(members)]
        each = all(owned) or partitions < members  # (4 mock partitions: not all get one)
        return each and sum(map(len, owned)) == partitions == len(frozenset().union(*owned))

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def _kip848_round(
    bootstrap: str, topic: str, partitions: int, members: int, protocol: str, limit: float
) -> dict[str, float | None]:
    """Form a group of ``members`` at once, then one more joins; ms until exact each time."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"g-{topic}-{protocol}",
        "auto.offset.reset": "earliest",
        "log_level": 3,
    }
    if protocol == "consumer":
        config["group.protocol"] = "consumer"
    else:
        config.update(
            {
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
    group = _Members()
    figures: dict[str, float | None] = {"form_ms": None, "join_ms": None}
    try:
        started = time.monotonic()
        for i in range(members):
            group.start(i, config, topic)
        deadline = started + limit
        while time.monotonic() < deadline and not group.exact(partitions, members):
            time.sleep(0.002)
        if not group.exact(partitions, members):
            return figures
        figures["form_ms"] = (time.monotonic() - started) * 1000
        started = time.monotonic()
        group.start(members, config, topic)
        deadline = started + limit
        while time.monotonic() < deadline and not group.exact(partitions, members + 1):
            time.sleep(0.002)
        if group.exact(partitions, members + 1):
            figures["join_ms"] = (time.monotonic() - started) * 1000
        return figures
    finally:
        group.close()


def run_kip848(params: dict[str, Any]) -> dict[str, Any]:
    """Rebalance latency, classic (cooperative-sticky) vs ``group.protocol=consumer``, on
    trio-coord (``params["partitions"]``) and on the mock cluster (its 4-partition topics),
    alternating, ``params["rounds"]`` times; medians."""
    samples: dict[str, dict[str, list[float | None]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        process, trio_bootstrap = _start_broker(
            Path(tmp),
            1.0,
            "--kafka-consumer-heartbeat-interval",
            str(params["consumer_heartbeat_interval"]),
        )
        try:
            mock, mock_bootstrap = _mock_cluster()
            for rep in range(params["rounds"]):
                for target in ("trio_coord", "mock"):
                    for protocol in ("classic", "consumer"):
                        topic = f"kip848-{rep}-{target}-{protocol}"
                        members = params["members"]
                        if target == "mock":
                            partitions = _create(mock_bootstrap, topic, 0, mock)
                            bootstrap = mock_bootstrap
                            # (its topics have 4 partitions: fewer members, so that the one
                            # joining takes a partition from someone)
                            members = max(1, min(members, partitions - 1))
                        else:
                            partitions = params["partitions"]
                            _create(trio_bootstrap, topic, partitions, None)
                            bootstrap = trio_bootstrap
                        got = _kip848_round(bootstrap, topic, partitions, members, protocol, 30.0)
                        key = f"{target}/{protocol}"
                        entry = samples.setdefault(key, {"form_ms": [], "join_ms": []})
                        entry["partitions"] = [partitions]
                        entry["members"] = [members]
                        for what, value in got.items():
                            entry[what].append(value)
            del mock
        finally:
            process.terminate()
            process.wait(15)

    def median(values: list[float | None]) -> float | None:
        done = [v for v in values if v is not None]
        return statistics.median(done) if len(done) == len(values) and done else None

    result: dict[str, Any] = {"params": params}
    for key, entry in samples.items():
        result[key] = {
            "members": entry["members"][0],
            "partitions": entry["partitions"][0],
            "form_ms": median(entry["form_ms"]),
            "join_ms": median(entry["join_ms"]),
        }
    ratios = {}
    for target in ("trio_coord", "mock"):
        classic, consumer = result[f"{target}/classic"], result[f"{target}/consumer"]
        for what in ("form_ms", "join_ms"):
            if classic[what] and consumer[what]:
                ratios[f"{target} {what[:-3]} consumer/classic"] = consumer[what] / classic[what]
    # (No trio-coord/mock ratio: the mock's topics have 4 partitions, so the two targets
    # do not run the same group; each target's consumer/classic ratio is the figure.)
    result["ratio"] = ratios
    return result


def render_kip848(result: dict[str, Any]) -> str:
    """The KIP-848 result as a small table for people."""
    p = result["params"]
    lines = [
        f"{p['members']} members form a group, then one more joins; {p['rounds']} round(s), "
        f"medians; trio-coord's KIP-848 heartbeat interval {p['consumer_heartbeat_interval']}s",
        f"{'target/protocol':<22}{'members':>8}{'partitions':>11}{'form ms':>10}{'join ms':>10}",
    ]
    for key in ("trio_coord/classic", "trio_coord/consumer", "mock/classic", "mock/consumer"):
        f = result[key]

        def cell(v: float | None) -> str:
            return f"{v:>10,.0f}" if v is not None else f"{'failed':>10}"

        lines.append(
            f"{key:<22}{f['members']:>8}{f['partitions']:>11}{cell(f['form_ms'])}"
            f"{cell(f['join_ms'])}"
        )
    for name, value in result["ratio"].items():
        lines.append(f"ratio {name}: {value:.2f}x")
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    """The result as a small table for people."""
    p = result["params"]
    lines = [
        f"{p['records']:,} records of {p['size']} bytes, {p['partitions']} partitions, "
        f"{p['repeat']} repetition(s), trio-coord flush interval {p['flush_interval']}s",
        f"{'target':<12}{'produce rec/s':>16}{'consume rec/s':>16}",
    ]
    for target in ("trio_coord", "mock"):
        figures = result[target]
        lines.append(
            f"{target:<12}{figures['produce_records_per_s']:>16,.0f}"
            f"{figures['consume_records_per_s']:>16,.0f}"
        )
    ratio = result["ratio"]
    lines.append(
        f"ratio trio-coord/mock: produce {ratio['produce']:.2f}x, consume {ratio['consume']:.2f}x "
        "(goal >= 0.5x)"
    )
    rebalance = result.get("rebalance")
    if rebalance is not None:
        lines += [
            "",
            f"rebalance: {p['members']} members (+1 joining) on {rebalance['partitions']} "
            f"partitions, session.timeout.ms {p['session_timeout_ms']}, heartbeat.interval.ms "
            f"{p['heartbeat_interval_ms']}, {p['rebalance_rounds']} round(s), medians",
            f"{'target':<12}{'join ms':>10}{'leave ms':>10}{'crash ms':>10}"
            f"{'crash: revoke ms':>18}",
        ]
        for target in ("trio_coord", "mock"):
            f = rebalance[target]
            lines.append(
                f"{target:<12}{f['join_ms']:>10,.0f}{f['leave_ms']:>10,.0f}{f['crash_ms']:>10,.0f}"
                f"{f['crash_revoke_ms']:>18,.0f}"
            )
        r = rebalance["ratio"]
        lines.append(
            f"ratio trio-coord/mock (lower is faster): join {r['join']:.2f}x, "
            f"leave {r['leave']:.2f}x, crash {r['crash']:.2f}x (goal: crash < 1x), "
            f"crash: revoke {r['crash_revoke']:.2f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run, print a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=None, help="records per run (100,000)")
    parser.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 3)")
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=1.0,
        help="trio-coord's flush interval; 0 fsyncs every batch (default 1.0)",
    )
    parser.add_argument(
        "--members", type=int, default=3, help="group members before one joins (default 3)"
    )
    parser.add_argument(
        "--rebalance-rounds",
        type=int,
        default=None,
        help="rebalance rounds per target (default 3; 0 skips the rebalance measures)",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=None,
        help="session.timeout.ms of every member (default 6000; 3000 with --quick)",
    )
    parser.add_argument(
        "--heartbeat-interval-ms",
        type=int,
        default=500,
        help="heartbeat.interval.ms (default 500)",
    )
    parser.add_argument(
        "--kip848",
        action="store_true",
        help="measure only rebalance latency, classic vs group.protocol=consumer (KIP-848): "
        "--members (use 10) members on --partitions (use 1000) on trio-coord",
    )
    parser.add_argument(
        "--consumer-heartbeat-interval",
        type=float,
        default=0.5,
        help="with --kip848: trio-coord's --kafka-consumer-heartbeat-interval (default 0.5, "
        "the broker's default)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: few records, once")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    params = {
        "records": args.records or (3000 if args.quick else 100_000),
        "size": args.size,
        "partitions": args.partitions,
        "repeat": args.repeat or (1 if args.quick else 3),
        "flush_interval": args.flush_interval,
        "members": args.members,
        "rebalance_rounds": (
            args.rebalance_rounds if args.rebalance_rounds is not None else (1 if args.quick else 3)
        ),
        "session_timeout_ms": args.session_timeout_ms or (3000 if args.quick else 6000),
        "heartbeat_interval_ms": args.heartbeat_interval_ms,
        "quick": args.quick,
    }
    if args.kip848:
        kip848 = run_kip848(
            {
                "members": args.members,
                "partitions": args.partitions,
                "rounds": args.repeat or (1 if args.quick else 3),
                "consumer_heartbeat_interval": args.consumer_heartbeat_interval,
            }
        )
        print(json.dumps(kip848, indent=2) if args.json else render_kip848(kip848))
        return 0
    result = run(params)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
