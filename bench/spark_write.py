"""Records/s written by a Spark job through the data source, against Spark writing the same rows
as JSON files.

``python bench/spark_write.py [--records N] [--size S] [--partitions P]
[--repeat R] [--master URL] [--json] [--quick]`` starts a broker in a
background thread (an ephemeral one), creates a topic of P partitions, and
in one local Spark session builds a DataFrame of N rows (``key`` a short
string, ``value`` S ASCII bytes) cached in memory, in as many partitions as
the session has cores. It then writes it R times, each going first in turn
so that the machine's noise hits both:

* the system: ``df.write.format("trio_coord")`` to the topic (the key picks
  the partition, as the producer's hash does);
* the baseline: ``df.write.json`` to a directory in the temporary directory
  (overwritten each time), the cheapest text sink Spark has;
* the floor of any Python data source writer: one whose tasks take Spark's
  Arrow batches and drop them, so that it costs what Spark itself spends on
  a Python data source's write (its planning, tasks and Arrow stream).

Spark's JSON writer leaves its files in the page cache (no fsync), so by
default the broker does too (its log's ``flush_interval`` 1 s: appends are
acknowledged before their background fsync); ``--fsync`` runs it with its
default policy instead, an fsync before each append is acknowledged.

The first write of each kind runs once untimed (the JVM's and the Python
workers' warm-up), and the topic's log must grow by N records per write.
The figure that travels is the ratio system/baseline of records per second
of each repetition, whose median is reported with its range.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load_average, spark_bench_main, spark_render, spark_result
from trio_coord import LogConfig, open_admin
from trio_coord.protocol.messages import LATEST, TopicPartition
from trio_coord.spark import BlockingClient, background_broker, local_session


@dataclass(frozen=True)
class Params:
    """What one run measures."""

    records: int = 200_000
    size: int = 100
    partitions: int = 4
    repeat: int = 3
    master: str = "local[2]"
    fsync: bool = False
    quick: bool = False


QUICK = Params(records=5_000, repeat=1, quick=True)
TOPIC = "bench-spark-write"
LABELS = {
    "source": "trio_coord data source",
    "json": "df.write.json, same rows",
    "floor": "Python data source floor",
}
RATIOS = {"ratio": "json", "ratio_floor": "floor"}


def floor_sink() -> type:
    """The floor's data source class (made here, so that Spark pickles it by value): format
    ``bench_write_floor``, whose tasks read every Arrow batch Spark hands them and keep
    nothing."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class FloorWriter(DataSourceArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _batch in iterator:
                pass
            return WriterCommitMessage()

    class FloorSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_write_floor"

        def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
            return FloorWriter()

    return FloorSink


async def create_topic(bootstrap: str, partitions: int) -> None:
    """Create the topic the writes go to."""
    async with open_admin(bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions)


def stored(bootstrap: str, partitions: int) -> int:
    """How many records the topic holds."""
    with BlockingClient(bootstrap) as client:
        listed = client.list_offsets([TopicPartition(TOPIC, p) for p in range(partitions)], LATEST)
    return sum(o.log_end for o in listed.values())


def measure(params: Params) -> dict[str, Any]:
    """Run the benchmark; the figures as a JSON-ready mapping."""
    load = load_average()
    with (
        tempfile.TemporaryDirectory(prefix="bench-spark-w-") as tmp,
        background_broker(None, log=LogConfig(flush_interval=0.0 if params.fsync else 1.0)) as boot,
    ):
        trio.run(create_topic, boot, params.partitions)
        spark = local_session(
            "bench spark_write", params.master, **{"spark.ui.showConsoleProgress": "false"}
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            cores = spark.sparkContext.defaultParallelism
            df = (
                spark.range(0, params.records, 1, cores)
                .selectExpr(
                    "concat('k', CAST(id % 1000 AS STRING)) AS key",
                    f"substring(repeat(lpad(CAST(id AS STRING), 10, '0'), {params.size // 10 + 1})"
                    f", 1, {params.size}) AS value",
                )
                .cache()
            )
            assert df.count() == params.records

            def write_source() -> None:
                df.write.format("trio_coord").option("bootstrap", boot).option("topic", TOPIC).mode(
                    "append"
                ).save()

            def write_json() -> None:
                df.write.mode("overwrite").json(str(Path(tmp) / "json"))

            spark.dataSource.register(floor_sink())

            def write_floor() -> None:
                df.write.format("bench_write_floor").mode("append").save()

            writes = {"source": write_source, "json": write_json, "floor": write_floor}
            for write in writes.values():  # warm-up, untimed
                write()
            samples: dict[str, list[float]] = {name: [] for name in writes}
            names = list(writes)
            for rep in range(params.repeat):
                turn = rep % len(names)
                for name in names[turn:] + names[:turn]:
                    started = time.perf_counter()
                    writes[name]()
                    samples[name].append(time.perf_counter() - started)
            expected = params.records * (params.repeat + 1)
            if stored(boot, params.partitions) != expected:
                raise SystemExit(
                    f"the topic holds {stored(boot, params.partitions)}, not {expected}"
                )
        finally:
            spark.stop()

    return spark_result(params, load, samples, RATIOS)


def render(result: Mapping[str, Any]) -> str:
    """The human table."""
    p = result["params"]
    machine = result["machine"]
    load = machine["load_average"]
    head = (
        f"spark_write: {p['records']:,} rows of {p['size']} B to {p['partitions']} partitions, "
        f"{p['repeat']} repetition(s), medians; broker fsync per append: "
        f"{'yes' if p['fsync'] else 'no'}; Spark {p['master']}; {machine['cpus']} CPUs, "
        f"load average {load if load is not None else 'n/a'}"
    )
    return spark_render(head, result, "write", LABELS, RATIOS)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 for bad arguments)."""

    def fsync(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--fsync",
            action="store_true",
            help="the broker fsyncs before acknowledging each append",
        )

    return spark_bench_main(
        argv,
        description=__doc__.split("\n\n")[0],
        defaults=Params(),
        quick=QUICK,
        what="rows",
        measure=measure,
        render=render,
        extra=fsync,
        fields=("fsync",),
    )


if __name__ == "__main__":
    sys.exit(main())
