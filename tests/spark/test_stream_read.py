"""Stream reads: AvailableNow with admission control, group commits, restarts from the checkpoint.

A query with ``Trigger.AvailableNow`` and ``maxRecordsPerBatch`` reads every
record once, in micro-batches no larger than the cap, and commits the end of
each finished batch to its group, the last one before the query ends (even
in a driver that exits at once), so that the group's lag is zero. Restarted
from its checkpoint after more records arrive, it reads only the new ones.
Records are collected with ``foreachBatch`` on the driver, per micro-batch.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import trio

from trio_coord import open_producer

from .helpers import committed, log_ends, make_topic, produce


def wait_for_commits(bootstrap: str, group: str, expected: dict) -> dict:
    """The group's committed offsets once they equal ``expected`` (a running query commits
    its last batch at its next trigger); the last seen after 30 s."""
    deadline = time.monotonic() + 30
    seen = committed(bootstrap, group)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = committed(bootstrap, group)
    return seen


def wait_until(condition, timeout: float = 60) -> None:
    """Poll ``condition`` until it holds (a Spark query's progress is not an event here)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def produce_until(bootstrap: str, topic: str, done: threading.Event) -> list[tuple[int, int]]:
    """Send records, ten every 50 ms, until ``done`` is set, then 100 more; their
    (partition, offset) in order."""

    async def go() -> list[tuple[int, int]]:
        placed: list[tuple[int, int]] = []
        async with open_producer(bootstrap) as producer:
            extra = 100
            while extra:
                meta = await producer.send(topic, f"live{len(placed)}", key=f"k{len(placed)}")
                placed.append((meta.partition, meta.offset))
                if done.is_set():
                    extra -= 1
                if len(placed) % 10 == 0:
                    await trio.sleep(0.05)
        return placed

    return trio.run(go)


def run_available_now(spark, bootstrap: str, checkpoint: str, **options: str) -> list[list]:
    """Run one AvailableNow query to its end; the (partition, offset, value) rows per batch."""
    batches: list[list] = []

    def collect(df, batch_id: int) -> None:
        batches.append(sorted((r.partition, r.offset, bytes(r.value)) for r in df.collect()))

    reader = spark.readStream.format("trio_coord").option("bootstrap", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "the AvailableNow query did not finish"
    assert query.exception() is None, query.exception()
    return [b for b in batches if b]


def test_available_now_commits_the_group_and_a_restart_reads_only_new_records(
    spark, bootstrap, tmp_path
):
    make_topic(bootstrap, "stream-a", 3)
    first = produce(bootstrap, "stream-a", [{"value": f"a{i}".encode()} for i in range(30)])
    checkpoint = str(tmp_path / "checkpoint")
    options = {"topic": "stream-a", "group": "spark-a", "maxRecordsPerBatch": "7"}

    batches = run_available_now(spark, bootstrap, checkpoint, **options)
    read = [(p, o) for batch in batches for p, o, _ in batch]
    assert sorted(read) == sorted(first)  # everything, once
    assert all(len(batch) <= 7 for batch in batches), [len(b) for b in batches]
    assert len(batches) == 5  # 30 records, at most 7 a batch
    ends = log_ends(bootstrap, "stream-a", 3)
    assert committed(bootstrap, "spark-a") == ends  # lag 0, as the query ends

    second = produce(bootstrap, "stream-a", [{"value": f"b{i}".encode()} for i in range(12)])
    again = run_available_now(spark, bootstrap, checkpoint, **options)
    rows = [row for batch in again for row in batch]
    assert sorted((p, o) for p, o, _ in rows) == sorted(second)
    assert all(value.startswith(b"b") for _, _, value in rows)
    ends = log_ends(bootstrap, "stream-a", 3)
    assert committed(bootstrap, "spark-a") == ends


def test_a_stream_starts_from_the_groups_committed_offsets(spark, bootstrap, tmp_path):
    make_topic(bootstrap, "stream-b", 2)
    produce(bootstrap, "stream-b", [{"value": b"x", "partition": i % 2} for i in range(10)])
    run_available_now(spark, bootstrap, str(tmp_path / "one"), topic="stream-b", group="spark-b")
    ends = log_ends(bootstrap, "stream-b", 2)
    assert committed(bootstrap, "spark-b") == ends
    later = produce(bootstrap, "stream-b", [{"value": b"y", "partition": 1} for _ in range(3)])
    # A new checkpoint: the start comes from the group (startingOffsets defaults to "group").
    batches = run_available_now(
        spark, bootstrap, str(tmp_path / "two"), topic="stream-b", group="spark-b"
    )
    assert sorted((p, o) for batch in batches for p, o, _ in batch) == sorted(later)


def test_a_stream_with_batch_only_options_fails_at_start_with_our_message_last(
    spark, bootstrap, tmp_path
):
    make_topic(bootstrap, "stream-c", 1)
    with pytest.raises(Exception, match=r"endingOffsets.*applies to batch reads only") as caught:
        run_available_now(
            spark, bootstrap, str(tmp_path / "c"), topic="stream-c", endingOffsets="latest"
        )
    assert "UnboundLocalError" not in str(caught.value)


def test_a_streams_malformed_options_fail_at_load(spark, bootstrap):
    with pytest.raises(Exception, match=r'option "startingOffsets" is not valid JSON'):
        spark.readStream.format("trio_coord").option("bootstrap", bootstrap).option(
            "topic", "stream-c"
        ).option("startingOffsets", "{").load()
    with pytest.raises(Exception, match=r"unknown option\(s\) grup for a read"):
        spark.readStream.format("trio_coord").option("bootstrap", bootstrap).option(
            "topic", "stream-c"
        ).option("grup", "g").load()


def test_stopped_and_restarted_while_producing_nothing_is_lost_or_doubled(
    spark, bootstrap, tmp_path
):
    """A running query (processing-time trigger) into a file sink is stopped mid-stream and
    restarted from its checkpoint while a producer keeps sending: the sink holds every record
    exactly once, and once the producer is done the group's lag reaches zero."""
    make_topic(bootstrap, "stream-live", 3)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    sent: list = []
    restarted = threading.Event()
    producing = threading.Thread(
        target=lambda: sent.extend(produce_until(bootstrap, "stream-live", restarted)),
        daemon=True,
    )

    def start():
        return (
            spark.readStream.format("trio_coord")
            .option("bootstrap", bootstrap)
            .option("topic", "stream-live")
            .option("group", "spark-live")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerBatch", "50")
            .load()
            .select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    producing.start()
    query = start()
    wait_until(lambda: query.lastProgress is not None and query.recentProgress[-1]["numInputRows"])
    query.stop()
    time.sleep(0.5)  # records arrive while no query runs, too
    query = start()
    restarted.set()
    producing.join(60)
    assert not producing.is_alive() and len(sent) > 100
    ends = log_ends(bootstrap, "stream-live", 3)
    assert wait_for_commits(bootstrap, "spark-live", ends) == ends  # lag 0
    query.stop()
    assert query.exception() is None
    stored = [(r.partition, r.offset) for r in spark.read.parquet(out).collect()]
    assert len(stored) == len(set(stored))  # nothing twice
    assert sorted(stored) == sorted(sent)  # nothing lost


def test_a_pattern_stream_reads_new_topics_and_partitions_from_their_start(
    spark, bootstrap, tmp_path
):
    make_topic(bootstrap, "grow-1", 1)
    produce(bootstrap, "grow-1", [{"value": b"a"} for _ in range(4)])
    checkpoint = str(tmp_path / "checkpoint")
    options = {"pattern": r"grow-\d+", "startingOffsets": "latest"}
    # latest: the records already there are not read; a new topic is read from its start.
    assert run_available_now(spark, bootstrap, checkpoint, **options) == []
    make_topic(bootstrap, "grow-2", 2)
    later = produce(bootstrap, "grow-2", [{"value": b"b", "partition": i % 2} for i in range(6)])
    more = produce(bootstrap, "grow-1", [{"value": b"c"} for _ in range(3)])
    rows = [
        row for batch in run_available_now(spark, bootstrap, checkpoint, **options) for row in batch
    ]
    assert sorted(row[:2] for row in rows if row[2] == b"b") == sorted(later)
    assert sorted(row[:2] for row in rows if row[2] == b"c") == sorted(more)
    assert len(rows) == 9


DRIVER = """
import sys

from trio_coord.spark import local_session

bootstrap, topic, group, checkpoint, out, trigger = sys.argv[1:]
spark = local_session("exits-at-once", "local[1]", **{"spark.ui.showConsoleProgress": "false"})
spark.sparkContext.setLogLevel("ERROR")
query = (
    spark.readStream.format("trio_coord")
    .option("bootstrap", bootstrap)
    .option("topic", topic)
    .option("group", group)
    .option("startingOffsets", "earliest")
    .option("maxRecordsPerBatch", "40")
    .load()
    .writeStream.format("parquet")
    .option("path", out)
    .option("checkpointLocation", checkpoint)
    .trigger(**{trigger: True})
    .start()
)
query.awaitTermination()
# The driver ends here, as docs/spark.md's snippet does: no spark.stop(), no waiting.
"""


@pytest.mark.parametrize("trigger", ["availableNow", "once"])
def test_a_driver_that_exits_right_after_the_query_has_committed_the_last_batch(
    bootstrap, tmp_path, trigger
):
    """AvailableNow: the last micro-batch reaches the group before ``awaitTermination``
    returns (the reader commits it). Trigger.Once, whose one batch only the query listener
    commits: ``register``'s exit hook lets Spark's listener bus deliver it before the driver
    goes away. Either way nothing is left to a listener that a driver exiting at once would
    never run, and Spark logs no listener error."""
    topic = f"stream-exit-{trigger.lower()}"
    make_topic(bootstrap, topic, 2)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    args = [
        sys.executable,
        str(script),
        bootstrap,
        topic,
        f"spark-exit-{trigger.lower()}",
        str(tmp_path / "checkpoint"),
        str(tmp_path / "out"),
        trigger,
    ]
    for run in range(2):
        produce(bootstrap, topic, [{"value": f"{run}-{i}".encode()} for i in range(100)])
        done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        # register()'s exit hook let the listener bus drain before Python went away
        assert "threw an exception" not in done.stderr, done.stderr[-3000:]
        ends = log_ends(bootstrap, topic, 2)
        assert sum(ends.values()) == 100 * (run + 1)
        assert committed(bootstrap, f"spark-exit-{trigger.lower()}") == ends  # lag 0, at once


KILLED_DRIVER = """
import sys

from trio_coord.spark import local_session

bootstrap, topic, group, checkpoint, out = sys.argv[1:]
spark = local_session("killed", "local[1]", **{"spark.ui.showConsoleProgress": "false"})
spark.sparkContext.setLogLevel("ERROR")
query = (
    spark.readStream.format("trio_coord")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", topic)
    .option("group", group)
    .option("startingOffsets", "earliest")
    .option("maxOffsetsPerTrigger", "30")
    .load()
    .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
    .writeStream.format("parquet")
    .option("path", out)
    .option("checkpointLocation", checkpoint)
    .trigger(processingTime="100 milliseconds")
    .start()
)
print("started", flush=True)
query.awaitTermination()  # until it is killed
"""


def test_a_stream_killed_mid_way_resumes_with_nothing_lost_or_doubled(spark, bootstrap, tmp_path):
    """A driver streaming into a file sink (30 records a micro-batch, a group commit after
    each) is SIGKILLed mid-way: the group never ran ahead of the sink (every record below a
    committed offset is in it), and the query restarted from its checkpoint ends with every
    record in the sink exactly once and the group at the log ends."""
    topic, group = "stream-killed", "spark-killed"
    make_topic(bootstrap, topic, 3)
    sent = produce(bootstrap, topic, [{"value": f"r{i}".encode()} for i in range(600)])
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    script = tmp_path / "driver.py"
    script.write_text(KILLED_DRIVER)
    driver = subprocess.Popen(
        [sys.executable, str(script), bootstrap, topic, group, checkpoint, out],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline() == "started\n"
        wait_until(lambda: sum(committed(bootstrap, group).values()) >= 90, timeout=120)
    finally:
        driver.kill()  # SIGKILL: no shutdown of any kind
        driver.wait()
    at_kill = committed(bootstrap, group)
    assert sum(at_kill.values()) < len(sent), "the stream finished before it was killed"
    stored = {(r.partition, r.offset) for r in spark.read.parquet(out).collect()}
    assert all((tp[1], o) in stored for tp, end in at_kill.items() for o in range(end))

    query = (
        spark.readStream.format("trio_coord")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("group", group)
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    rows = [(r.partition, r.offset, r.value) for r in spark.read.parquet(out).collect()]
    assert len(rows) == len({row[:2] for row in rows}) == len(sent)  # nothing twice
    assert sorted(row[:2] for row in rows) == sorted(sent)  # nothing lost
    assert committed(bootstrap, group) == log_ends(bootstrap, topic, 3)  # lag 0
