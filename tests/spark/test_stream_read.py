"""Stream reads: AvailableNow with admission control, group commits, restarts from the checkpoint.

A query with ``Trigger.AvailableNow`` and ``maxRecordsPerBatch`` reads every
record once, in micro-batches no larger than the cap, and commits the end of
each finished batch to its group (the last one through the query listener),
so that the group's lag reaches zero. Restarted from its checkpoint after
more records arrive, it reads only the new ones. Records are collected with
``foreachBatch`` on the driver, per micro-batch.
"""

from __future__ import annotations

import time

import pytest
from conftest import committed, log_ends, make_topic, produce


def wait_for_commits(bootstrap: str, group: str, expected: dict) -> dict:
    """The group's committed offsets once they equal ``expected`` (the listener commits the
    last batch asynchronously, after the query ends); the last seen after 30 s."""
    deadline = time.monotonic() + 30
    seen = committed(bootstrap, group)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = committed(bootstrap, group)
    return seen


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
    assert wait_for_commits(bootstrap, "spark-a", ends) == ends  # lag 0

    second = produce(bootstrap, "stream-a", [{"value": f"b{i}".encode()} for i in range(12)])
    again = run_available_now(spark, bootstrap, checkpoint, **options)
    rows = [row for batch in again for row in batch]
    assert sorted((p, o) for p, o, _ in rows) == sorted(second)
    assert all(value.startswith(b"b") for _, _, value in rows)
    ends = log_ends(bootstrap, "stream-a", 3)
    assert wait_for_commits(bootstrap, "spark-a", ends) == ends


def test_a_stream_starts_from_the_groups_committed_offsets(spark, bootstrap, tmp_path):
    make_topic(bootstrap, "stream-b", 2)
    produce(bootstrap, "stream-b", [{"value": b"x", "partition": i % 2} for i in range(10)])
    run_available_now(spark, bootstrap, str(tmp_path / "one"), topic="stream-b", group="spark-b")
    ends = log_ends(bootstrap, "stream-b", 2)
    assert wait_for_commits(bootstrap, "spark-b", ends) == ends
    later = produce(bootstrap, "stream-b", [{"value": b"y", "partition": 1} for _ in range(3)])
    # A new checkpoint: the start comes from the group (startingOffsets defaults to "group").
    batches = run_available_now(
        spark, bootstrap, str(tmp_path / "two"), topic="stream-b", group="spark-b"
    )
    assert sorted((p, o) for batch in batches for p, o, _ in batch) == sorted(later)


def test_a_stream_with_batch_only_options_fails_at_start(spark, bootstrap, tmp_path):
    make_topic(bootstrap, "stream-c", 1)
    with pytest.raises(Exception, match=r"endingOffsets.*applies to batch reads only"):
        run_available_now(
            spark, bootstrap, str(tmp_path / "c"), topic="stream-c", endingOffsets="latest"
        )
