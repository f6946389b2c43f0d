"""Records/s read into Spark by the data source, against Spark reading the same records from files.

``python bench/spark_read.py [--records N] [--size S] [--partitions P]
[--repeat R] [--master URL] [--linger SECONDS] [--json] [--quick]`` starts a
broker in a background thread (an ephemeral one: its logs in a temporary
directory), produces N records with values of S bytes to a topic of P
partitions (with the producer's default linger of 5 ms, which stores them
in batches of about 85 records here, the producer sharing this process and
its interpreter lock with the broker; ``--linger`` changes it, and the
header line says how many records a stored batch holds), and
writes the same records (topic, partition, offset, timestamp, key, value) as
JSON lines to P files in the same temporary directory, one per partition. In
one local Spark session it then runs, R times and each going first in turn
so that the machine's noise hits all three:

* the system: ``spark.read.format("trio_coord")`` of the topic;
* a baseline: ``spark.read.json`` of the files, with the schema given
  (no inference pass), so that Spark parses every line;
* another: ``spark.read.parquet`` of the same rows, which Spark wrote from
  the JSON files before the timing (columnar, binary: Spark's fastest reader);
* the floor of any Python data source: one whose tasks (as many as the
  system's) yield one precomputed Arrow batch of the same schema over and
  over, N rows in all, so that it costs what Spark itself spends on a Python
  data source's tasks and Arrow batches, and nothing else.

Each run computes the same aggregate (count, the sum of the values'
lengths, the largest offset), which makes Spark materialize the value and
offset of every record, and checks that all agree (the floor's offsets are
not the records', so for it the count and the lengths). Throughput is records
per second of wall time for the aggregate; the figures that travel are the
ratios system/baseline of each repetition, whose medians are reported with
their ranges. The first query of each kind is run once untimed first (the
JVM's and the Python workers' warm-up).
"""

from __future__ import annotations

import argparse
import json
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
from trio_coord import open_admin, open_producer
from trio_coord.protocol.messages import TopicPartition
from trio_coord.spark import BlockingClient, background_broker, local_session


@dataclass(frozen=True)
class Params:
    """What one run measures."""

    records: int = 200_000
    size: int = 100
    partitions: int = 4
    repeat: int = 3
    master: str = "local[2]"
    quick: bool = False
    linger: float = 0.005


QUICK = Params(records=5_000, repeat=1, quick=True)
TOPIC = "bench-spark"
T0_MS = 1_700_000_000_000


def value_of(i: int, size: int) -> str:
    """Record ``i``'s value: ``size`` ASCII bytes (so JSON holds it as it is)."""
    stem = f"{i:010d}"
    return (stem * (size // len(stem) + 1))[:size]


async def produce(bootstrap: str, params: Params) -> list[list[dict[str, Any]]]:
    """Produce the records; the same records per partition, as the JSON files hold them."""
    async with open_admin(bootstrap) as admin:
        await admin.create_topic(TOPIC, params.partitions)
    rows: list[list[dict[str, Any]]] = [[] for _ in range(params.partitions)]
    async with open_producer(bootstrap, linger=params.linger) as producer:
        deliveries = []
        for i in range(params.records):
            partition = i % params.partitions
            value = value_of(i, params.size)
            key = f"k{i % 1000}"
            deliveries.append(
                (
                    await producer.enqueue(
                        TOPIC, value, key=key, partition=partition, timestamp=(T0_MS + i) / 1000
                    ),
                    key,
                    value,
                )
            )
        for delivery, key, value in deliveries:
            meta = await delivery
            rows[meta.partition].append(
                {
                    "topic": TOPIC,
                    "partition": meta.partition,
                    "offset": meta.offset,
                    "timestamp": meta.timestamp,
                    "key": key,
                    "value": value,
                }
            )
    return rows


def write_json_lines(rows: list[list[dict[str, Any]]], directory: Path) -> None:
    """One JSON-lines file per partition."""
    directory.mkdir()
    for partition, records in enumerate(rows):
        with open(directory / f"part-{partition}.json", "w") as out:
            for row in records:
                out.write(json.dumps(row) + "\n")


JSON_SCHEMA = "topic string, partition int, offset long, timestamp double, key string, value string"


BASELINES = ("json", "parquet", "floor")
"""The reads the data source is compared with, besides itself (``source``)."""


def floor_source(size: int) -> type:
    """The floor's data source class (made here, so that Spark pickles it by value): format
    ``bench_floor``, option ``records``, ``tasks`` tasks yielding one precomputed 8,192-row
    batch of the data source's Arrow schema (values of ``size`` bytes) until they have
    yielded ``records`` rows."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from trio_coord.spark import SCHEMA_WITHOUT_HEADERS

    class FloorReader(DataSourceReader):
        def __init__(self, records: int, tasks: int) -> None:
            self.records, self.tasks = records, tasks

        def partitions(self) -> list[InputPartition]:
            share, extra = divmod(self.records, self.tasks)
            return [InputPartition(share + (i < extra)) for i in range(self.tasks)]

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            rows = 8192
            batch = pa.RecordBatch.from_pydict(
                {
                    "key": [b"k%d" % (i % 1000) for i in range(rows)],
                    "value": [b"v" * size] * rows,
                    "topic": [TOPIC] * rows,
                    "partition": [0] * rows,
                    "offset": list(range(rows)),
                    "timestamp": [T0_MS * 1000] * rows,
                    "timestampType": [0] * rows,
                },
                schema=pa.schema(
                    [
                        ("key", pa.binary()),
                        ("value", pa.binary()),
                        ("topic", pa.string()),
                        ("partition", pa.int32()),
                        ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")),
                        ("timestampType", pa.int32()),
                    ]
                ),
            )
            left = partition.value
            while left > 0:
                yield batch if left >= rows else batch.slice(0, left)
                left -= rows

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_floor"

        def schema(self) -> Any:
            return SCHEMA_WITHOUT_HEADERS

        def reader(self, schema: Any) -> DataSourceReader:
            return FloorReader(int(self.options["records"]), int(self.options["tasks"]))

    return FloorSource


def stored_batches(bootstrap: str, partitions: int) -> int:
    """How many batches the topic's records are stored in."""
    count = 0
    with BlockingClient(bootstrap) as client:
        for partition in range(partitions):
            tp, offset = TopicPartition(TOPIC, partition), 0
            while True:
                batches = client.fetch(tp, offset, max_bytes=4 << 20).batches
                if not batches:
                    break
                count += len(batches)
                offset = batches[-1].base_offset + batches[-1].count
    return count


def measure(params: Params) -> dict[str, Any]:
    """Run the benchmark; the figures as a JSON-ready mapping."""
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp, background_broker(None) as boot:
        rows = trio.run(produce, boot, params)
        batches = stored_batches(boot, params.partitions)
        files = Path(tmp) / "json"
        write_json_lines(rows, files)
        spark = local_session(
            "bench spark_read",
            params.master,
            **{
                "spark.sql.shuffle.partitions": str(params.partitions),
                "spark.ui.showConsoleProgress": "false",
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            reads = {
                "source": spark.read.format("trio_coord")
                .option("bootstrap", boot)
                .option("topic", TOPIC)
                .load(),
                "json": spark.read.schema(JSON_SCHEMA).json(str(files)),
            }
            # The same rows as Parquet, one file per partition (written untimed).
            reads["json"].write.parquet(str(Path(tmp) / "parquet"))
            reads["parquet"] = spark.read.parquet(str(Path(tmp) / "parquet"))
            spark.dataSource.register(floor_source(params.size))
            reads["floor"] = (
                spark.read.format("bench_floor")
                .option("records", str(params.records))
                .option("tasks", str(spark.sparkContext.defaultParallelism))
                .load()
            )
            aggregate = "count(*) AS n", "sum(length(value)) AS bytes", "max(offset) AS last"

            def timed(df: Any) -> tuple[float, tuple[int, int, int]]:
                started = time.perf_counter()
                row = df.selectExpr(*aggregate).collect()[0]
                return time.perf_counter() - started, (row.n, row.bytes, row.last)

            def same(name: str, got: tuple[int, int, int], expected: tuple[int, int, int]) -> bool:
                return got[:2] == expected[:2] if name == "floor" else got == expected

            expected = timed(reads["source"])[1]  # warm-up, untimed
            for name in BASELINES:
                got = timed(reads[name])[1]
                if not same(name, got, expected):
                    raise SystemExit(f"the reads disagree: {name} {got} != source {expected}")
            if expected[0] != params.records:
                raise SystemExit(f"read {expected[0]} records, produced {params.records}")
            samples: dict[str, list[float]] = {name: [] for name in reads}
            names = list(reads)
            for rep in range(params.repeat):
                turn = rep % len(names)  # each read goes first in turn
                for name in names[turn:] + names[:turn]:
                    seconds, got = timed(reads[name])
                    if not same(name, got, expected):
                        raise SystemExit(f"{name} read {got}, expected {expected}")
                    samples[name].append(seconds)
        finally:
            spark.stop()

    result = spark_result(params, load, samples, RATIOS)
    result["stored_batches"] = batches
    return result


LABELS = {
    "source": "trio_coord data source",
    "json": "spark.read.json, same records",
    "parquet": "spark.read.parquet, same records",
    "floor": "Python data source floor",
}
RATIOS = {"ratio": "json", "ratio_parquet": "parquet", "ratio_floor": "floor"}


def render(result: Mapping[str, Any]) -> str:
    """The human table."""
    p = result["params"]
    machine = result["machine"]
    load = machine["load_average"]
    per_batch = p["records"] / max(1, result["stored_batches"])
    head = (
        f"spark_read: {p['records']:,} records of {p['size']} B in {p['partitions']} partitions, "
        f"stored in batches of {per_batch:,.0f} on average (producer linger "
        f"{p['linger'] * 1000:g} ms), "
        f"{p['repeat']} repetition(s), medians; Spark {p['master']}; {machine['cpus']} CPUs, "
        f"load average {load if load is not None else 'n/a'}"
    )
    return spark_render(head, result, "read", LABELS, RATIOS)


def _seconds(text: str) -> float:
    """A linger given on the command line: seconds, from 0 to 10."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"the linger must be 0 to 10 seconds, not {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 for bad arguments)."""

    def linger(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--linger",
            type=_seconds,
            help="the producer's linger in seconds (default 0.005, the producer's own): how "
            "long it waits to fill a batch, so how many records a stored batch holds",
        )

    return spark_bench_main(
        argv,
        description=__doc__.split("\n\n")[0],
        defaults=Params(),
        quick=QUICK,
        what="records",
        measure=measure,
        render=render,
        extra=linger,
        fields=("linger",),
    )


if __name__ == "__main__":
    sys.exit(main())
