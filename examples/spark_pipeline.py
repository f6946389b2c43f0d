"""The data pipeline on Spark: events → windowed counts → a results topic → a Trio consumer group.

Run it with ``python examples/spark_pipeline.py`` (after ``pip install
trio_coord[spark]``; Spark needs Java 17+). It starts an embedded broker of
its own (data under ``--data-dir``, by default ``trio_coord-spark-pipeline`` in
the system's temporary directory), produces page-view events with
event times spread over five minutes, and runs a Spark structured-streaming
query that reads them from the ``events`` topic (committing its progress to
the group ``spark-pipeline``), counts views per page per minute, and writes
each updated count to the ``page-counts`` topic. A Trio consumer group then
reads the results and keeps the latest count per (minute, page), which is
checked against the same counts computed in plain Python. Run it again: the
stream resumes from its checkpoint and counts only the new events.

``--bootstrap host:port`` runs against brokers of your own instead, and
``--master`` chooses the Spark master (default ``local[*]``).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import trio

from trio_coord import open_admin, open_consumer, open_producer
from trio_coord.spark import background_broker, local_session  # before pyspark: sets its Python

from pyspark.sql import DataFrame  # isort: skip
from pyspark.sql import functions as F  # isort: skip

PAGES = ["/", "/docs", "/pricing", "/blog", "/about"]
T0 = 1_700_000_040  # a whole minute, in seconds since the epoch
EVENTS = 2_000


async def setup(bootstrap: str) -> None:
    """Create the topics once."""
    async with open_admin(bootstrap) as admin:
        existing = {t.name for t in await admin.list_topics()}
        for name, partitions in (("events", 4), ("page-counts", 2)):
            if name not in existing:
                await admin.create_topic(name, partitions)


def events(seed: int) -> list[tuple[str, str, float]]:
    """Run ``seed``'s page views: (user, page, event time), the same on every run."""
    rng = random.Random(seed)
    return [
        (f"user{rng.randrange(50)}", rng.choice(PAGES), T0 + rng.uniform(0, 300))
        for _ in range(EVENTS)
    ]


def plain_python_counts(runs: int) -> dict[tuple[int, str], int]:
    """Views per (minute, page) of the first ``runs`` runs' events, counted without Spark."""
    counts: Counter[tuple[int, str]] = Counter()
    for seed in range(runs):
        counts.update((int(at) // 60 * 60, page) for _, page, at in events(seed))
    return dict(counts)


async def produce_events(bootstrap: str, seed: int) -> None:
    """Send run ``seed``'s page views, keyed by user, stamped with their event time."""
    async with open_producer(bootstrap) as producer:
        for user, page, at in events(seed):
            value = json.dumps({"page": page}).encode()
            await producer.enqueue("events", value, key=user, timestamp=at)


def run_spark_job(bootstrap: str, checkpoint: str, master: str) -> int:
    """Windowed counts of the events topic into the page-counts topic (all that is there now);
    the lag the group spark-pipeline is left with."""
    spark = local_session("trio_coord pipeline", master, **{"spark.sql.shuffle.partitions": "4"})
    spark.sparkContext.setLogLevel("ERROR")
    counts = (
        spark.readStream.format("trio_coord")
        .option("bootstrap", bootstrap)
        .option("topic", "events")
        .option("group", "spark-pipeline")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerBatch", "1000")
        .load()
        .selectExpr("timestamp", "get_json_object(CAST(value AS STRING), '$.page') AS page")
        .groupBy("page", F.window("timestamp", "1 minute"))
        .count()
        .selectExpr(
            "concat(CAST(unix_seconds(window.start) AS STRING), ' ', page) AS key",
            "to_json(named_struct('minute', unix_seconds(window.start), 'page', page, "
            "'count', count)) AS value",
        )
    )

    def write_counts(updated: DataFrame, batch_id: int) -> None:
        # A Python sink takes appends only; each micro-batch's updated counts are a batch write.
        updated.write.format("trio_coord").option("bootstrap", bootstrap).option(
            "topic", "page-counts"
        ).mode("append").save()

    query = (
        counts.writeStream.foreachBatch(write_counts)
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()  # the last micro-batch is committed to the group by now
    try:
        return trio.run(group_lag, bootstrap, "spark-pipeline")
    finally:
        spark.stop()


async def dashboard(bootstrap: str, state: dict[str, int]) -> None:
    """The consumer group ``dashboard``: read the new count updates (to the topic's end) into
    ``state``, the latest count per "minute page", and commit."""
    async with open_admin(bootstrap) as admin:
        partitions = await admin.topic_partitions(["page-counts"])
        ends = {tp: o.log_end for tp, o in (await admin.list_offsets(partitions)).items()}
    async with open_consumer(
        bootstrap, "dashboard", ["page-counts"], offset_reset="earliest"
    ) as consumer:
        await consumer.wait_assigned()
        while any((consumer.position(tp) or 0) < end for tp, end in ends.items()):
            for record in await consumer.getmany():
                row = json.loads(record.value or b"{}")
                state[f"{row['minute']} {row['page']}"] = row["count"]
        await consumer.commit()


async def group_lag(bootstrap: str, group: str) -> int:
    """The group's total lag: what the Spark stream has not processed yet."""
    async with open_admin(bootstrap) as admin:
        return sum(row.lag for row in await admin.group_lag(group))


def pipeline(bootstrap: str, workdir: Path, master: str) -> None:
    """Produce, count on Spark, read the counts back, and check them."""
    workdir.mkdir(parents=True, exist_ok=True)
    trio.run(setup, bootstrap)
    runs = len(list(workdir.glob("run-*")))
    (workdir / f"run-{runs}").mkdir()
    trio.run(produce_events, bootstrap, runs)
    lag = run_spark_job(bootstrap, str(workdir / "checkpoint"), master)
    # The dashboard's state is a file, its position in the results topic the group's offsets.
    state_file = workdir / "dashboard.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    trio.run(dashboard, bootstrap, state)
    state_file.write_text(json.dumps(state))
    counts = {(int(k.split()[0]), k.split()[1]): v for k, v in state.items()}
    for (minute, page), count in sorted(counts.items()):
        print(f"{time.strftime('%H:%M', time.gmtime(minute))} UTC  {page:10} {count:5}")
    print(f"run {runs + 1}: {sum(counts.values())} events in {len(counts)} (minute, page) windows")
    print("matches plain Python:", plain_python_counts(runs + 1) == counts)
    print("lag of group spark-pipeline:", lag)


def main() -> None:
    """Parse the arguments and run the pipeline (on an embedded broker unless told)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="brokers to use instead of an embedded one")
    parser.add_argument("--master", default="local[*]", help="the Spark master URL")
    parser.add_argument(
        "--data-dir",
        "--data",
        type=Path,
        default=Path(tempfile.gettempdir()) / "trio_coord-spark-pipeline",
        help="where the broker's log, the checkpoint and the dashboard's state live "
        "(default: %(default)s; delete it to start over)",
    )
    args = parser.parse_args()
    workdir = args.data_dir.absolute()
    if args.bootstrap:
        pipeline(args.bootstrap, workdir / "spark", args.master)
    else:
        with background_broker(workdir / "broker") as bootstrap:
            pipeline(bootstrap, workdir / "spark", args.master)


if __name__ == "__main__":
    main()
