"""Helpers every benchmark shares: percentiles, output, CPU readings and child processes.

A benchmark here runs the system under test and its load generators in
separate processes, so that they do not share one core unfairly, and talks to
them over a tiny line protocol on their standard streams (``port 1234``,
``ready``, ``go``, ``done {...}``). :func:`spawn` starts such a child with its
stderr captured in a file (shown in the error when the child fails) and always
ends it on the way out. The rest is the arithmetic and the printing:
:func:`percentile` and :func:`latency_summary` for latencies,
:func:`format_table` for the aligned human table, :func:`emit_json` for the
machine-readable result, :func:`process_cpu_seconds` to tell who was the
bottleneck.

Children that do not speak the line protocol (a ``trio-coord consume``
process, say) are started with :func:`start_logged`, their output going to
files, and ended with :func:`kill_all`; :func:`load_average` and
:func:`min_p50_max` serve benchmarks that report few samples. A long run
tells where it is with :class:`Progress`, one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import trio

__all__ = [
    "ROOT",
    "BenchError",
    "Child",
    "Progress",
    "child_env",
    "chosen_params",
    "cpu_count",
    "emit_json",
    "format_table",
    "kill_all",
    "latency_summary",
    "load_average",
    "min_p50_max",
    "percentile",
    "process_cpu_seconds",
    "python_module",
    "ratio",
    "read_stdin_line",
    "say",
    "spawn",
    "start_logged",
    "tests_module",
]

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (children run there, so ``python -m bench.X`` finds the package)."""

_P = TypeVar("_P")

_STOP_GRACE = 5.0
_STDERR_TAIL = 4000


class BenchError(Exception):
    """The benchmark could not run (a child failed, timed out or said something unexpected)."""


# -- arithmetic ----------------------------------------------------------------------


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of already sorted samples, linearly interpolated.

    This is the "linear" method of NumPy's ``percentile``; it returns NaN for
    no samples.
    """
    if not sorted_samples:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not between 0 and 100")
    position = (len(sorted_samples) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_samples) - 1)
    fraction = position - low
    return sorted_samples[low] + (sorted_samples[high] - sorted_samples[low]) * fraction


def latency_summary(samples: Iterable[float], *, unit: float = 1e-3) -> dict[str, float]:
    """Count, mean, p50, p90, p99, p99.9 and max of latencies in seconds, expressed in ``unit``.

    With the default unit the values are milliseconds; keys are ``count``,
    ``mean``, ``p50``, ``p90``, ``p99``, ``p999`` and ``max``.
    """
    ordered = sorted(samples)
    n = len(ordered)
    summary: dict[str, float] = {"count": n}
    summary["mean"] = (math.fsum(ordered) / n / unit) if n else math.nan
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
        summary[name] = percentile(ordered, q) / unit
    summary["max"] = ordered[-1] / unit if n else math.nan
    return summary


def min_p50_max(samples: Iterable[float]) -> dict[str, float]:
    """Count, min, p50 and max of ``samples`` as they are (NaN for no samples).

    For benchmarks with a handful of samples per measure, where p99 would only
    repeat the max.
    """
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "min": ordered[0] if ordered else math.nan,
        "p50": percentile(ordered, 50),
        "max": ordered[-1] if ordered else math.nan,
    }


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, or NaN when the denominator is zero or NaN."""
    if not denominator or math.isnan(denominator):
        return math.nan
    return numerator / denominator


# -- output --------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, left: int = 1) -> str:
    """Render rows as an aligned plain-text table.

    The first ``left`` columns are left-aligned (labels), the rest right-aligned
    (numbers). Cells are ``str()``-ed, so format numbers before passing them.
    """
    table = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(len(headers))]
    lines = []
    for row in table:
        cells = [
            cell.ljust(widths[i]) if i < left else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def chosen_params(args: Any, preset: _P, names: Iterable[str], **more: Any) -> _P:
    """The preset's parameters with those given on the command line put in.

    ``names`` are the attributes of ``args`` that map one to one onto fields
    of ``preset`` (a dataclass); an option left out (None) keeps the preset's
    value; ``more`` sets fields computed from other options.
    """
    overrides = {name: value for name in names if (value := getattr(args, name)) is not None}
    return replace(preset, **overrides, **more)


def run_and_report(
    name: str,
    run_benchmark: Callable[[Any], Awaitable[Mapping[str, Any]]],
    params: Any,
    *,
    as_json: bool,
    render: Callable[[Mapping[str, Any]], str],
) -> int:
    """Run a benchmark under Trio and print its result; return the exit status.

    A :class:`BenchError` is one clear line on stderr (status 2), Ctrl-C is
    status 130 (children are stopped by then), and the result is a table or,
    with ``as_json``, one JSON object.
    """
    try:
        result = trio.run(run_benchmark, params)
    except BenchError as exc:
        print(f"{name} bench failed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the children are stopped and temp dirs gone by now
        print(f"{name} bench interrupted", file=sys.stderr)
        return 130
    if as_json:
        emit_json(result)
    else:
        print(render(result))
    return 0


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def emit_json(result: Mapping[str, Any]) -> None:
    """Print ``result`` as one indented JSON object on stdout (NaN and inf become null)."""
    print(json.dumps(_json_safe(result), indent=2))


class Progress:
    """Where a long benchmark is, as one line on stderr (stdout stays for the result).

    On a terminal each :meth:`step` rewrites the line in place; elsewhere
    (CI logs, a captured stderr) each step is a line of its own, so that a
    run that hangs shows how far it got. Call :meth:`close` at the end (or
    use it as a context manager) to finish the line.
    """

    def __init__(self, name: str, total: int, stream: Any = None) -> None:
        self.name = name
        self.total = total
        self.done = 0
        self._stream = sys.stderr if stream is None else stream
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._width = 0

    def step(self, what: str) -> None:
        """Report that step ``what`` begins (the count is of the steps begun)."""
        self.done += 1
        line = f"{self.name}: [{self.done}/{self.total}] {what}"
        if self._tty:
            pad = max(0, self._width - len(line))
            self._stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def close(self) -> None:
        """End the line (on a terminal: erase it, so the result starts on a clean line)."""
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def say(*parts: object) -> None:
    """Print one protocol line on stdout and flush it (children talk to the parent this way)."""
    print(*parts, flush=True)


async def read_stdin_line() -> str:
    """Read one line from stdin without blocking Trio ("" at end of file: the parent is gone)."""
    return await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)


# -- the machine ---------------------------------------------------------------------


def cpu_count() -> int:
    """How many CPUs this process may run on (its affinity set where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The machine's 1-minute load average (others' work skews the figures); None if unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def process_rss_bytes(pid: int) -> int | None:
    """Resident memory of process ``pid`` in bytes (``/proc``; None where unavailable)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, in seconds) process ``pid`` has used so far.

    Read from ``/proc`` (Linux); None where that is not available or the
    process is gone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after it are plain.
    fields = stat.rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


# -- child processes -----------------------------------------------------------------


def python_module(module: str, *args: str) -> list[str]:
    """The command line running ``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def child_env() -> dict[str, str]:
    """This process's environment with the repository root first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


async def start_logged(
    argv: Sequence[str], name: str, workdir: str | os.PathLike[str]
) -> trio.Process:
    """Start ``argv`` in the repository root, stdin empty, output to files in ``workdir``.

    Its stdout goes to ``workdir/<name>.stdout`` and its stderr to
    ``workdir/<name>.stderr`` (files, not pipes: a child nobody reads from
    never blocks on a full pipe). The caller must end it, e.g. with
    :func:`kill_all` in a ``finally``.
    """
    safe = _safe_name(name)
    with (
        (Path(workdir) / f"{safe}.stdout").open("wb") as stdout,
        (Path(workdir) / f"{safe}.stderr").open("wb") as stderr,
    ):
        return await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            cwd=str(ROOT),
            env=child_env(),
        )


async def kill_all(processes: Iterable[trio.Process]) -> None:
    """SIGKILL every process still running and reap them all; shielded from cancellation.

    SIGKILL also ends a process stopped with SIGSTOP, which would hold a
    SIGTERM pending forever; it is meant for ``finally`` blocks, including on
    Ctrl-C.
    """
    with trio.CancelScope(shield=True):
        pending = [p for p in processes if p.returncode is None]
        for process in pending:
            try:
                process.send_signal(signal.SIGKILL)
            except ProcessLookupError:  # already gone (it is reaped below)
                pass
        for process in pending:
            await process.wait()


class Child:
    """A child process that speaks lines on stdin/stdout; create it with :func:`spawn`."""

    def __init__(self, name: str, process: trio.Process, stderr_path: Path) -> None:
        self.name = name
        self.process = process
        self.stderr_path = stderr_path
        self._buffer = bytearray()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    def stderr_tail(self, limit: int = _STDERR_TAIL) -> str:
        """The end of what the child wrote on stderr so far."""
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-limit:]

    def _failure(self, problem: str) -> BenchError:
        code = self.process.poll()
        status = "still running" if code is None else f"exit code {code}"
        tail = self.stderr_tail().strip() or "(nothing)"
        return BenchError(f"{self.name} {problem} ({status}); its stderr:\n{tail}")

    async def readline(self, what: str = "a line") -> str:
        """The next line the child prints (without the newline).

        Raises :class:`BenchError`, with the child's stderr, if the child ends
        its output first. Bound the wait with :meth:`within`.
        """
        stdout = self.process.stdout
        assert stdout is not None
        while (end := self._buffer.find(b"\n")) < 0:
            chunk = await stdout.receive_some()
            if not chunk:
                with trio.move_on_after(1.0):  # let it finish exiting, for the exit code
                    await self.process.wait()
                raise self._failure(f"exited before printing {what}")
            self._buffer += chunk
        line = self._buffer[:end].decode(errors="replace")
        del self._buffer[: end + 1]
        return line.rstrip("\r")

    async def expect(self, prefix: str) -> str:
        """Wait for a line starting with ``prefix``; return the rest of it, stripped.

        Lines with other beginnings are skipped (a child may print more).
        """
        while True:
            line = await self.readline(repr(prefix))
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    @contextmanager
    def within(self, seconds: float, what: str) -> Iterator[None]:
        """Give the block ``seconds``; past that, raise :class:`BenchError` with the stderr.

        ``what`` completes "<name> did not ... within N s", e.g. ``"print its port"``.
        """
        with trio.move_on_after(seconds) as scope:
            yield
        if scope.cancelled_caught:
            raise self._failure(f"did not {what} within {seconds:g} s")

    async def send_line(self, text: str) -> None:
        """Write one line to the child's stdin."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            await stdin.send_all(text.encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._failure(f"did not accept {text!r} on stdin") from None

    async def stop(self, grace: float = _STOP_GRACE) -> None:
        """End the child: close its stdin (asking it to exit), then terminate, then kill."""
        with trio.CancelScope(shield=True):
            if self.process.stdin is not None:
                await self.process.stdin.aclose()
            with trio.move_on_after(grace):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.terminate()
                with trio.move_on_after(grace):
                    await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
            if self.process.stdout is not None:
                await self.process.stdout.aclose()


@asynccontextmanager
async def spawn(
    argv: Sequence[str],
    name: str,
    workdir: str | os.PathLike[str],
    *,
    stop_grace: float = _STOP_GRACE,
) -> AsyncIterator[Child]:
    """Start ``argv`` in the repository root with piped stdin/stdout, for the life of the block.

    Its stderr goes to ``workdir/<name>.stderr`` (quoted in every
    :class:`BenchError` about it). Leaving the block, normally or not, closes
    its stdin (a child should take that as "exit"), then terminates and at
    last kills it: no child outlives the block.
    """
    stderr_path = Path(workdir) / f"{_safe_name(name)}.stderr"
    env = child_env()
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=str(ROOT),
            env=env,
        )
    child = Child(name, process, stderr_path)
    try:
        yield child
    finally:
        await child.stop(stop_grace)


def spark_result(
    params: Any, load: float | None, samples: Mapping[str, list[float]], ratios: Mapping[str, str]
) -> dict[str, Any]:
    """What a Spark bench reports: its params, the machine, each way's samples (seconds per
    repetition) and records/s at the median, and under each key of ``ratios`` the data
    source's throughput over that baseline's, repetition by repetition (median, min, max).
    """

    def over(baseline: str) -> dict[str, float]:
        each = [
            ratio(params.records / s, params.records / b)
            for s, b in zip(samples["source"], samples[baseline], strict=True)
        ]
        return {"median": statistics.median(each), "min": min(each), "max": max(each)}

    return {
        "params": asdict(params),
        "machine": {"cpus": cpu_count(), "load_average": load},
        **{
            name: {"samples_s": times, "records_per_s": params.records / statistics.median(times)}
            for name, times in samples.items()
        },
        **{key: over(baseline) for key, baseline in ratios.items()},
    }


def spark_render(
    head: str,
    result: Mapping[str, Any],
    column: str,
    labels: Mapping[str, str],
    ratios: Mapping[str, str],
) -> str:
    """A Spark bench's human table: ``head``, each way (``labels``: name -> label) with its
    records/s and median seconds, then the ratios (``ratios`` as for :func:`spark_result`)."""
    table = format_table(
        [column, "records/s", "seconds (median)"],
        [
            [
                label,
                f"{result[name]['records_per_s']:,.0f}",
                f"{statistics.median(result[name]['samples_s']):.2f}",
            ]
            for name, label in labels.items()
        ],
    )
    lines = [head, "", table, ""]
    for key, baseline in ratios.items():
        r = result[key]
        lines.append(
            f"ratio source/{baseline}: {r['median']:.2f} (range {r['min']:.2f}-{r['max']:.2f})"
        )
    return "\n".join(lines)


def spark_bench_main(
    argv: Sequence[str] | None,
    *,
    description: str,
    defaults: Any,
    quick: Any,
    what: str,
    measure: Callable[[Any], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
    fields: Sequence[str] = (),
) -> int:
    """The command line the Spark benches share: sizes, repetitions, master, --quick, --json.

    ``defaults`` and ``quick`` are the bench's Params (records, size,
    partitions, repeat, master, ...); ``what`` names a record in the help
    (records, rows); ``extra`` adds the bench's own options, named in
    ``fields``. Returns the exit status (2 for bad arguments).
    """
    d = defaults
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--records", type=int, help=f"{what} (default {d.records:,})")
    parser.add_argument("--size", type=int, help=f"value bytes (default {d.size})")
    parser.add_argument("--partitions", type=int, help=f"partitions (default {d.partitions})")
    parser.add_argument("--repeat", type=int, help=f"repetitions (default {d.repeat})")
    parser.add_argument("--master", help=f"Spark master (default {d.master})")
    parser.add_argument("--quick", action="store_true", help=f"5,000 {what}, one repetition")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    params = chosen_params(
        args,
        quick if args.quick else defaults,
        ("records", "size", "partitions", "repeat", "master", *fields),
    )
    if params.records < 1 or params.partitions < 1 or params.repeat < 1 or params.size < 10:
        print("records, partitions and repeat must be >= 1, size >= 10", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    result = measure(params)
    if args.json:
        emit_json(result)
    else:
        print(render(result))
    return 0


# -- TLS and SASL for the --tls/--sasl runs ------------------------------------------------

BENCH_USER = "bench"
BENCH_PASSWORD = "bench-password"


def tests_module(name: str) -> ModuleType:
    """The test suite's helper module ``tests/NAME.py`` (a ZooKeeper server, certificates).

    The benches run from a checkout (``python bench/X.py`` or ``python -m
    bench.X``, both beside ``tests/``), so they share these helpers with the
    tests instead of keeping copies; ``tests/`` is on the path only while the
    module is imported.
    """
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def make_certificates(directory: str | os.PathLike[str]) -> str:
    """A CA and a server certificate for 127.0.0.1 in ``directory`` (made if missing), by
    the tests' ``tests/certs.py``; returns the directory."""
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    return str(tests_module("certs").make_certificates(where))


def broker_security(certs: str | None, tls: bool, sasl: bool) -> dict[str, Any]:
    """``open_broker`` settings for a secured run (TLS from ``certs``; SCRAM-SHA-256)."""
    settings: dict[str, Any] = {}
    if tls and certs:
        settings["tls_cert"] = f"{certs}/server.pem"
        settings["tls_key"] = f"{certs}/server.key"
    if sasl:
        settings["sasl_mechanisms"] = ("SCRAM-SHA-256",)
        settings["super_users"] = (BENCH_USER,)
    return settings


async def add_bench_user(broker: Any) -> None:
    """Create the bench's super user in a running broker's store (SASL runs)."""
    from trio_coord.security import store as security_store

    await security_store.add_user(broker.store, BENCH_USER, BENCH_PASSWORD, iterations=4096)
    await broker.security.cache.reload()


def client_security(certs: str | None, tls: bool, sasl: bool) -> dict[str, Any]:
    """``ssl_context=`` and ``sasl=`` of a client for a secured run."""
    from trio_coord.security import Sasl, client_ssl_context

    options: dict[str, Any] = {}
    if tls and certs:
        options["ssl_context"] = client_ssl_context(f"{certs}/ca.pem")
    if sasl:
        options["sasl"] = Sasl(BENCH_USER, BENCH_PASSWORD)
    return options
