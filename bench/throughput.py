"""Produce and consume throughput, against plain file I/O of the same bytes on the same disk.

``python bench/throughput.py [--records N] [--size S ...] [--partitions P]
[--repeat R] [--mode fsync|interval ...] [--json] [--quick]`` runs a real
broker in its own process (``--serve-broker DIR``, on a data dir in this
run's temporary directory) once per flush mode: ``fsync`` is
``flush_interval = 0`` (an append is acknowledged once an fsync covers it)
and ``interval`` is ``flush_interval = --flush-interval`` (acknowledged once
written; fsynced in the background). For each value size S and each of R
repetitions it measures, back to back and in alternating order so that the
machine's noise hits both (each after an ``os.sync()``, untimed, so that
neither pays for the writeback of the other's dirty pages):

* the system: a producer (``open_producer``, default options) enqueues N
  records of S bytes (no key, no headers) to a fresh topic of P partitions
  and flushes, i.e. waits until every record is acknowledged; then a
  consumer of those P fixed partitions (``offset_reset="earliest"``, no
  group) reads them all with ``getmany``. The producer's connection is open
  before the clock starts; the consumer's is opened inside the window.
* the baseline: the same N x S payload bytes, in the batch size the
  producer makes (``batch_size // (S + the producer's per-record estimate)``
  records of S bytes), written to a new file in the same temporary directory
  with one ``os.write`` per batch, followed by ``os.fdatasync`` per batch in
  the fsync mode (the broker syncs with fdatasync too) and by nothing in the
  interval mode; then read back with ``os.pread`` in 1 MiB chunks (what a
  consumer asks per partition per fetch). The file is then deleted. In the
  fsync mode the batches are also dealt round-robin to P files, each written
  and fdatasynced per batch by a thread of its own, all at once: that is the
  broker's pattern (one batch in flight per partition, each partition synced
  in a worker thread), and on a disk whose fsyncs overlap it is the higher
  limit.

Throughput is payload bytes (N x S, MB = 10^6 bytes) and records per second
of wall time; the figure that travels between machines is the ratio
system/baseline of each repetition (produce against the write, or the
parallel write, consume against the read), whose median is reported with
its range. CPU time per
record of the client (this process) and of the broker process tell where
the time went. With ``--profile DIR`` the broker and the client's measured
windows run under cProfile (the figures are then slower: do not quote them;
and its clock is the wall clock, so on a busy machine a system call that was
merely preempted looks expensive: read it with the CPU columns).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import logging
import os
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):  # run as a script: this checkout's `bench` and `trio_coord`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    BenchError,
    Child,
    Progress,
    add_bench_user,
    broker_security,
    chosen_params,
    client_security,
    cpu_count,
    format_table,
    load_average,
    make_certificates,
    min_p50_max,
    process_cpu_seconds,
    python_module,
    ratio,
    read_stdin_line,
    run_and_report,
    say,
    spawn,
)
from trio_coord.broker.server import BrokerConfig, open_broker
from trio_coord.client.admin import open_admin
from trio_coord.client.consumer import open_consumer
from trio_coord.client.producer import _RECORD_OVERHEAD, open_producer
from trio_coord.log import LogConfig

__all__ = ["MODES", "QUICK", "Params", "main", "render", "run_benchmark"]

HOST = "127.0.0.1"
MODES = ("fsync", "interval")
"""The broker's flush modes measured: flush_interval = 0, and flush_interval > 0."""
PHASES = ("produce", "consume")
MB = 1e6
"""Throughput is in MB/s of payload, MB = 10^6 bytes."""
_MODULE = "bench.throughput"
_READ_CHUNK = 1024 * 1024
"""The baseline reads back in chunks of what a consumer asks per partition per fetch."""
_GETMANY = 1000
_WARMUP_TOPIC = "warmup"
_WARMUP_RECORDS = 1000


@dataclass(frozen=True, slots=True)
class Params:
    """What one run measures; the defaults are the full run, :data:`QUICK` the CI smoke run."""

    records: int = 100_000
    sizes: tuple[int, ...] = (100, 1024)
    partitions: int = 4
    repeat: int = 5
    modes: tuple[str, ...] = MODES
    flush_interval: float = 1.0
    """The broker's ``flush_interval`` in the interval mode (seconds)."""
    batch_size: int = 64 * 1024
    """The producer's ``batch_size`` (its default), which also sizes the baseline's writes."""
    quick: bool = False
    profile: str | None = None
    tls: bool = False
    """Also run every mode against a broker with TLS (``--tls``), and report the ratio."""
    sasl: bool = False
    """Also run every mode against a broker whose clients log in with SCRAM (``--sasl``)."""

    def batch_records(self, size: int) -> int:
        """Records of ``size`` bytes in a full producer batch: what one baseline write holds.

        The producer closes a batch before a record would take its estimated
        size past ``batch_size``; it estimates a record as its key, value and
        headers plus a fixed overhead.
        """
        return max(1, self.batch_size // (size + _RECORD_OVERHEAD))

    def flush_interval_of(self, mode: str) -> float:
        """The broker's ``flush_interval`` in ``mode``."""
        return 0.0 if mode == "fsync" else self.flush_interval


QUICK = Params(records=2000, partitions=2, repeat=2, quick=True)
"""The ``--quick`` preset: 2000 records per run, two repetitions (a few seconds), for CI."""


# -- the broker process --------------------------------------------------------------------


async def serve_broker(
    data_dir: str,
    flush_interval: float,
    certs: str | None = None,
    tls: bool = False,
    sasl: bool = False,
) -> None:
    """Run a broker on ``data_dir`` with this flush policy (and TLS/SASL from ``certs``);
    print ``port N``; run until EOF."""
    config = BrokerConfig(
        log=LogConfig(flush_interval=flush_interval), **broker_security(certs, tls, sasl)
    )
    async with open_broker(data_dir, HOST, 0, config=config) as broker:
        if sasl:
            await add_bench_user(broker)
        say("port", broker.address[1])
        while await read_stdin_line():
            pass


# -- the baseline ----------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


_fdatasync = getattr(os, "fdatasync", os.fsync)  # as the broker's log does (fsync on macOS)


def _chunks(value: bytes, records: int, per_batch: int) -> list[bytes]:
    """The run's payload as the producer batches it: full batches of ``per_batch``, then a rest."""
    full, rest = divmod(records, per_batch)
    batch = value * per_batch
    return [batch] * full + ([value * rest] if rest else [])


def _write_file(path: Path, chunks: Sequence[bytes], sync: bool) -> None:
    """Write ``chunks`` to a new file, one ``os.write`` each (then fdatasync, if ``sync``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in chunks:
            _write_all(fd, chunk)
            if sync:
                _fdatasync(fd)
    finally:
        os.close(fd)


def baseline_write(path: Path, chunks: Sequence[bytes], sync: bool) -> float:
    """Seconds to write ``chunks`` to a new file at ``path`` (fdatasync after each if ``sync``)."""
    start = time.perf_counter()
    _write_file(path, chunks, sync)
    return time.perf_counter() - start


def baseline_read(path: Path, total: int) -> float:
    """Seconds to read the ``total`` bytes of ``path`` back with ``pread`` in 1 MiB chunks."""
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < total:
            chunk = os.pread(fd, _READ_CHUNK, pos)
            if not chunk:
                raise BenchError(f"the baseline file {path} ended at {pos} of {total} bytes")
            pos += len(chunk)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def baseline_parallel_write(paths: Sequence[Path], chunks: Sequence[bytes]) -> float:
    """Seconds for one thread per path to write its share of ``chunks``, fdatasync after each.

    The chunks are dealt round-robin, as the producer's sticky partitioner
    deals batches to partitions; each thread syncs its own file, as the
    broker syncs each partition's segment in a worker thread.
    """
    errors: list[BaseException] = []

    def write(path: Path, share: Sequence[bytes]) -> None:
        try:
            _write_file(path, share, sync=True)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    n = len(paths)
    threads = [
        threading.Thread(target=write, args=(path, chunks[i::n]), daemon=True)
        for i, path in enumerate(paths)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


# -- the system ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Samples:
    """Every repetition's measurements for one (mode, value size)."""

    seconds: dict[str, list[float]] = field(
        default_factory=lambda: {k: [] for k in ("write", "write_parallel", "read", *PHASES)}
    )
    client_cpu: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in PHASES})
    broker_cpu: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in PHASES})
    batches: list[int] = field(default_factory=list)
    disk_bytes: list[int] = field(default_factory=list)


class _Profiles:
    """cProfile of the client's measured windows, one profile per phase (``--profile``)."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self._profiles = {phase: cProfile.Profile() for phase in PHASES} if directory else {}

    def start(self, phase: str) -> None:
        if phase in self._profiles:
            self._profiles[phase].enable()

    def stop(self, phase: str) -> None:
        if phase in self._profiles:
            self._profiles[phase].disable()

    def dump(self) -> None:
        for phase, profile in self._profiles.items():
            assert self.directory is not None
            profile.dump_stats(os.path.join(self.directory, f"client-{phase}.prof"))


@dataclass(slots=True)
class _Target:
    """The broker process of one flush mode and what the system runs need from it."""

    params: Params
    server: Child
    bootstrap: str
    data_dir: Path
    profiles: _Profiles
    security: dict[str, Any] = field(default_factory=dict)
    """``ssl_context=``/``sasl=`` of every client (the secured runs)."""

    def phase_limit(self, size: int) -> float:
        """Seconds a produce or consume phase may take before the bench gives up."""
        return 60.0 + self.params.records * (size + 100) / MB  # 1 MB/s would be absurdly slow

    def broker_cpu(self) -> float:
        cpu = process_cpu_seconds(self.server.pid)
        return float("nan") if cpu is None else cpu

    def fail(self, what: str, limit: float) -> BenchError:
        tail = self.server.stderr_tail().strip() or "(nothing)"
        return BenchError(f"{what} did not finish within {limit:g} s; broker stderr:\n{tail}")

    async def create_topic(self, topic: str, partitions: int) -> None:
        async with open_admin(self.bootstrap, **self.security) as admin:
            await admin.create_topic(topic, partitions)

    async def stored(self, topic: str) -> int:
        """Records the broker holds in ``topic`` (the sum of its partitions' log ends)."""
        async with open_admin(self.bootstrap, **self.security) as admin:
            ends = await admin.list_offsets([(topic, p) for p in range(self.params.partitions)])
        return sum(listed.offset for listed in ends.values())

    def disk_bytes(self, topic: str) -> int:
        """Bytes of the topic's segment files (frames: header, msgpack batch)."""
        return sum(f.stat().st_size for f in (self.data_dir / "partitions" / topic).glob("*/*.log"))

    async def produce(self, topic: str, value: bytes, records: int, samples: _Samples) -> None:
        """Enqueue ``records`` values to ``topic`` and flush; sample time, CPU and batches."""
        limit = self.phase_limit(len(value))
        with trio.move_on_after(limit) as scope:
            async with open_producer(
                self.bootstrap, batch_size=self.params.batch_size, **self.security
            ) as producer:
                await producer.send(_WARMUP_TOPIC, b"")  # connected before the clock starts
                batches = producer.batches_sent
                enqueue = producer.enqueue
                self.profiles.start("produce")
                broker_cpu, client_cpu = self.broker_cpu(), time.process_time()
                start = time.perf_counter()
                for _ in range(records):
                    await enqueue(topic, value)
                await producer.flush()
                elapsed = time.perf_counter() - start
                client_cpu = time.process_time() - client_cpu
                broker_cpu = self.broker_cpu() - broker_cpu
                self.profiles.stop("produce")
                batches = producer.batches_sent - batches
        if scope.cancelled_caught:
            raise self.fail(f"producing {records} records", limit)
        stored = await self.stored(topic)
        if stored != records:
            raise BenchError(f"the broker stored {stored} records of {topic}, not {records}")
        samples.seconds["produce"].append(elapsed)
        samples.client_cpu["produce"].append(client_cpu)
        samples.broker_cpu["produce"].append(broker_cpu)
        samples.batches.append(batches)
        samples.disk_bytes.append(self.disk_bytes(topic))

    async def consume(self, topic: str, size: int, records: int, samples: _Samples) -> None:
        """Read the topic's ``records`` records from the beginning; sample time and CPU."""
        limit = self.phase_limit(size)
        partitions = [(topic, p) for p in range(self.params.partitions)]
        got = 0
        with trio.move_on_after(limit) as scope:
            self.profiles.start("consume")
            broker_cpu, client_cpu = self.broker_cpu(), time.process_time()
            start = time.perf_counter()
            async with open_consumer(
                self.bootstrap, partitions=partitions, offset_reset="earliest", **self.security
            ) as consumer:
                while got < records:
                    got += len(await consumer.getmany(_GETMANY))
                elapsed = time.perf_counter() - start
                client_cpu = time.process_time() - client_cpu
                broker_cpu = self.broker_cpu() - broker_cpu
                self.profiles.stop("consume")
        if scope.cancelled_caught:
            raise self.fail(f"consuming {records} records ({got} read)", limit)
        if got != records:
            raise BenchError(f"the consumer read {got} records of {topic}, not {records}")
        samples.seconds["consume"].append(elapsed)
        samples.client_cpu["consume"].append(client_cpu)
        samples.broker_cpu["consume"].append(broker_cpu)

    async def warm_up(self, value: bytes) -> None:
        """Create the warm-up topic and send a few records through (unmeasured)."""
        await self.create_topic(_WARMUP_TOPIC, 1)
        async with open_producer(self.bootstrap, **self.security) as producer:
            for _ in range(_WARMUP_RECORDS):
                await producer.enqueue(_WARMUP_TOPIC, value)
            await producer.flush()
        async with open_consumer(
            self.bootstrap,
            partitions=[(_WARMUP_TOPIC, 0)],
            offset_reset="earliest",
            **self.security,
        ) as consumer:
            got = 0
            while got < _WARMUP_RECORDS:
                got += len(await consumer.getmany(_GETMANY))


def _plain(path: Path, value: bytes, params: Params, mode: str, samples: _Samples) -> None:
    """One baseline repetition: write and read back the run's payload with plain file I/O.

    In the fsync mode the payload is also written to one file per partition
    by as many threads at once (then the files are deleted).
    """
    chunks = _chunks(value, params.records, params.batch_records(len(value)))
    sync = mode == "fsync"
    try:
        samples.seconds["write"].append(baseline_write(path, chunks, sync))
        samples.seconds["read"].append(baseline_read(path, params.records * len(value)))
    finally:
        path.unlink(missing_ok=True)
    if sync:
        paths = [path.with_suffix(f".{i}") for i in range(params.partitions)]
        try:
            samples.seconds["write_parallel"].append(baseline_parallel_write(paths, chunks))
        finally:
            for each in paths:
                each.unlink(missing_ok=True)


def _settle() -> None:
    """Write back every dirty page of the machine (untimed), so that no run pays for the last."""
    if hasattr(os, "sync"):
        os.sync()


async def _measure_mode(
    mode: str,
    params: Params,
    workdir: Path,
    progress: Progress,
    profiles: _Profiles,
    secure: bool = False,
) -> dict[int, _Samples]:
    """Start the mode's broker; run every size's repetitions, baseline and system alternating.

    ``secure``: the broker and clients use TLS and/or SCRAM (``--tls``, ``--sasl``).
    """
    name = f"{mode}-secure" if secure else mode
    progress.step(f"{name}: starting the broker")
    data_dir = workdir / f"broker-{name}"
    data_dir.mkdir()
    argv = python_module(
        _MODULE,
        "--serve-broker",
        str(data_dir),
        "--flush-interval",
        repr(params.flush_interval_of(mode)),
    )
    security: dict[str, Any] = {}
    if secure:
        certs = make_certificates(workdir / "certs")
        argv += ["--certs", certs] + (["--tls"] if params.tls else [])
        argv += ["--sasl"] if params.sasl else []
        security = client_security(certs, params.tls, params.sasl)
    if params.profile:
        argv += ["--profile-out", os.path.join(params.profile, f"broker-{name}.prof")]
    results: dict[int, _Samples] = {}
    async with spawn(argv, f"broker-{name}", workdir, stop_grace=30.0) as server:
        with server.within(30.0, "print its port"):
            port = int(await server.expect("port "))
        target = _Target(params, server, f"{HOST}:{port}", data_dir, profiles, security)
        await target.warm_up(b"w" * 100)
        for size in params.sizes:
            samples = results[size] = _Samples()
            value = os.urandom(size)
            for rep in range(params.repeat):
                label = f"{name}, {size} B, repetition {rep + 1}/{params.repeat}"
                topic = f"bench-{name}-{size}-{rep}"
                path = workdir / f"baseline-{name}-{size}-{rep}.dat"
                for turn in (0, 1) if rep % 2 == 0 else (1, 0):  # alternate who goes first
                    # Start from a clean slate: no dirty pages of the last run (the broker's,
                    # in the interval mode) being written back under this one.
                    _settle()
                    if turn == 0:
                        progress.step(f"{label}: plain file I/O")
                        _plain(path, value, params, mode, samples)
                    else:
                        progress.step(f"{label}: producer and consumer")
                        await target.create_topic(topic, params.partitions)
                        await target.produce(topic, value, params.records, samples)
                        await target.consume(topic, size, params.records, samples)
    return results


# -- the result ------------------------------------------------------------------------------


def _rates(seconds: list[float], records: int, payload: int) -> dict[str, Any]:
    stats = min_p50_max(seconds)
    median = stats["p50"]
    return {
        "records_per_s": ratio(records, median),
        "mb_per_s": ratio(payload, median) / MB,
        "median_s": median,
        "samples_s": [round(s, 6) for s in seconds],
    }


def _per_record_us(cpu: list[float], records: int) -> float:
    return min_p50_max(cpu)["p50"] / records * 1e6


def _summarize(mode: str, size: int, params: Params, s: _Samples) -> dict[str, Any]:
    n = params.records
    payload = n * size
    entry: dict[str, Any] = {
        "mode": mode,
        "flush_interval": params.flush_interval_of(mode),
        "value_bytes": size,
        "records": n,
        "payload_bytes": payload,
        "baseline_batch_records": params.batch_records(size),
        "producer_batches": min_p50_max(s.batches)["p50"],
        "disk_bytes": min_p50_max(s.disk_bytes)["p50"],
        "baseline": {
            "write": {**_rates(s.seconds["write"], n, payload), "fdatasync": mode == "fsync"},
            "read": _rates(s.seconds["read"], n, payload),
        },
    }
    entry["disk_per_payload"] = ratio(entry["disk_bytes"], payload)
    entry["ratio"] = {}
    pairs = [("produce", "produce", "write"), ("consume", "consume", "read")]
    if s.seconds["write_parallel"]:
        entry["baseline"]["write_parallel"] = {
            **_rates(s.seconds["write_parallel"], n, payload),
            "fdatasync": True,
            "files": params.partitions,
        }
        pairs.insert(1, ("produce_parallel", "produce", "write_parallel"))
    for phase in PHASES:
        entry[phase] = {
            **_rates(s.seconds[phase], n, payload),
            "client_cpu_us_per_record": _per_record_us(s.client_cpu[phase], n),
            "broker_cpu_us_per_record": _per_record_us(s.broker_cpu[phase], n),
        }
    for name, phase, base in pairs:
        # Each repetition's ratio pairs runs made moments apart; their median is the figure.
        ratios = min_p50_max(
            ratio(b, t) for b, t in zip(s.seconds[base], s.seconds[phase], strict=True)
        )
        entry["ratio"][name] = ratios["p50"]
        entry["ratio"][f"{name}_min"] = ratios["min"]
        entry["ratio"][f"{name}_max"] = ratios["max"]
    return entry


async def run_benchmark(params: Params) -> dict[str, Any]:
    """Measure every mode (one broker process each); return the JSON-ready result."""
    load = load_average()
    profiles = _Profiles(params.profile)
    steps = len(params.modes) * (1 + 2 * len(params.sizes) * params.repeat)
    steps *= 2 if params.tls or params.sasl else 1
    runs = []
    with (
        Progress("throughput", steps) as progress,
        tempfile.TemporaryDirectory(prefix="trio-coord-throughput-") as tmp,
    ):
        for mode in params.modes:
            for secure in (False, True) if params.tls or params.sasl else (False,):
                measured = await _measure_mode(mode, params, Path(tmp), progress, profiles, secure)
                runs += [
                    {**_summarize(mode, size, params, s), "secure": secure}
                    for size, s in measured.items()
                ]
    profiles.dump()
    secure_vs_plain = [
        {
            "mode": plain["mode"],
            "value_bytes": plain["value_bytes"],
            "produce": ratio(
                secured["produce"]["records_per_s"], plain["produce"]["records_per_s"]
            ),
            "consume": ratio(
                secured["consume"]["records_per_s"], plain["consume"]["records_per_s"]
            ),
        }
        for plain in runs
        if not plain["secure"]
        for secured in runs
        if secured["secure"]
        and (secured["mode"], secured["value_bytes"]) == (plain["mode"], plain["value_bytes"])
    ]
    return {
        "secure_vs_plain": secure_vs_plain,
        "bench": "throughput",
        "params": {
            **asdict(params),
            "cpus": cpu_count(),
            "load_average": load,
            "broker": "own process",
        },
        "runs": runs,
    }


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def render(result: dict[str, Any]) -> str:
    """The result as a header line, one table row per (mode, size, phase), and a legend."""
    p = result["params"]
    lines = [
        f"throughput: {p['records']:,} records per run, {p['partitions']} partitions, "
        f"{p['repeat']} repetition(s), medians; broker in its own process; "
        f"{p['cpus']} CPUs, load average {p['load_average']}",
        "",
    ]
    rows = []
    for run in result["runs"]:
        q = run["ratio"]
        sync = run["baseline"]["write"]["fdatasync"]
        rows_of_run = [
            ("produce", "produce", "write", "1 file, fdatasync" if sync else "1 file, no sync"),
            ("", "produce_parallel", "write_parallel", f"{p['partitions']} files, threads"),
            ("consume", "consume", "read", "pread 1 MiB"),
        ]
        for phase, name, base, label in rows_of_run:
            if base not in run["baseline"]:
                continue
            r = run[phase] if phase else None
            rows.append(
                [
                    (run["mode"] + (" +tls/sasl" if run.get("secure") else "")) if phase else "",
                    f"{run['value_bytes']} B" if phase else "",
                    phase,
                    _num(r["records_per_s"], ",.0f") if r else "",
                    _num(r["mb_per_s"], ".1f") if r else "",
                    label,
                    _num(run["baseline"][base]["mb_per_s"], ".1f"),
                    _num(q[name], ".3f"),
                    f"{_num(q[f'{name}_min'], '.3f')}-{_num(q[f'{name}_max'], '.3f')}",
                    _num(r["client_cpu_us_per_record"], ".2f") if r else "",
                    _num(r["broker_cpu_us_per_record"], ".2f") if r else "",
                ]
            )
    headers = [
        "mode",
        "value",
        "phase",
        "records/s",
        "MB/s",
        "baseline",
        "file MB/s",
        "ratio",
        "range",
        "client us/rec",
        "broker us/rec",
    ]
    lines.append(format_table(headers, rows, left=3))
    lines.append("")
    interval = f"flush_interval = {p['flush_interval']:g} s"
    legend = (
        "file MB/s: the same payload bytes with plain file I/O on the same disk, moments apart: "
        "produce against one os.write per producer batch to one file, plus fdatasync per batch "
        f"in the fsync mode (flush_interval = 0) and nothing more in the interval mode "
        f"({interval}); in the fsync mode also against {p['partitions']} files written by as "
        "many threads at once (the broker syncs each partition in a worker thread); consume "
        "against pread in 1 MiB chunks. ratio: system / file throughput, the median of the "
        "repetitions' ratios (range: min-max). us/rec: CPU time per record of this process "
        "(client) and of the broker process."
    )
    lines += textwrap.wrap(legend, 100)
    for run in result["runs"]:
        lines.append(
            f"{run['mode']}, {run['value_bytes']} B: {run['producer_batches']:g} producer batches "
            f"(baseline writes {run['baseline_batch_records']} records each); "
            f"{run['disk_per_payload']:.2f} bytes on disk per payload byte"
        )
    for q in result.get("secure_vs_plain", []):
        what = "+".join(n for n in ("tls", "sasl") if p.get(n))
        lines.append(
            f"{q['mode']}, {q['value_bytes']} B with {what}: produce {q['produce']:.2f}x, "
            f"consume {q['consume']:.2f}x the records/s of plaintext (same run)"
        )
    if p.get("profile"):
        lines.append(f"profiles in {p['profile']} (figures taken under cProfile: do not quote)")
    return "\n".join(lines)


# -- the command line ------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/throughput.py",
        description="Produce and consume throughput of a broker, against plain file I/O of "
        "the same bytes on the same disk in the same run.",
    )
    d = Params()
    parser.add_argument("--records", type=int, help=f"records per run (default {d.records:,})")
    parser.add_argument(
        "--size",
        type=int,
        nargs="+",
        metavar="BYTES",
        help=f"value sizes (default {' '.join(map(str, d.sizes))})",
    )
    parser.add_argument(
        "--partitions", type=int, help=f"partitions of each topic (default {d.partitions})"
    )
    parser.add_argument(
        "--repeat", type=int, help=f"repetitions of each measure (default {d.repeat})"
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        nargs="+",
        help="flush modes: fsync (flush_interval 0) and/or interval (default both)",
    )
    parser.add_argument(
        "--flush-interval",
        type=float,
        help=f"the broker's flush_interval in the interval mode (default {d.flush_interval:g} s)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="write cProfile stats of the broker and the client's measured windows to DIR",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI smoke preset: {QUICK.records} records, {QUICK.partitions} partitions, "
        f"{QUICK.repeat} repetitions",
    )
    parser.add_argument(
        "--tls", action="store_true", help="also run each mode against a broker with TLS"
    )
    parser.add_argument(
        "--sasl",
        action="store_true",
        help="also run each mode against a broker whose clients log in with SCRAM-SHA-256",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    internal = argparse.SUPPRESS
    parser.add_argument("--serve-broker", metavar="DIR", help=internal)
    parser.add_argument("--certs", help=internal)
    parser.add_argument("--profile-out", metavar="FILE", help=internal)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 if the benchmark could not run)."""
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.serve_broker:
        run = functools.partial(
            serve_broker,
            args.serve_broker,
            args.flush_interval or 0.0,
            args.certs,
            args.tls,
            args.sasl,
        )
        if args.profile_out:
            profile = cProfile.Profile()
            try:
                profile.runcall(trio.run, run)
            finally:
                profile.dump_stats(args.profile_out)
        else:
            trio.run(run)
        return 0
    more: dict[str, Any] = {}
    if args.size:
        more["sizes"] = tuple(dict.fromkeys(args.size))
    if args.mode:
        more["modes"] = tuple(m for m in MODES if m in args.mode)
    params = chosen_params(
        args,
        QUICK if args.quick else Params(),
        ("records", "partitions", "repeat", "flush_interval", "profile"),
        tls=args.tls,
        sasl=args.sasl,
        **more,
    )
    if params.records < 1 or params.partitions < 1 or params.repeat < 1:
        print("records, partitions and repeat must be >= 1", file=sys.stderr)
        return 2
    if not all(1 <= s <= 256 * 1024 for s in params.sizes):
        print("value sizes must be between 1 and 262144 bytes", file=sys.stderr)
        return 2
    if not params.flush_interval > 0:
        print(
            "--flush-interval must be positive (the fsync mode is flush_interval 0)",
            file=sys.stderr,
        )
        return 2
    if params.profile:
        os.makedirs(params.profile, exist_ok=True)
        params = replace(params, profile=os.path.abspath(params.profile))
    return run_and_report("throughput", run_benchmark, params, as_json=args.json, render=render)


if __name__ == "__main__":
    sys.exit(main())
