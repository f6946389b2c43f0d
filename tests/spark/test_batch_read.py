"""Batch reads through the ``trio_coord`` format: exact records, offsets options, planning errors.

A batch read returns exactly the records produced (every partition, offset,
timestamp, key, value and, when asked, header), in Spark's Kafka source's
columns and types; a job written with the Kafka source's options runs as it
is; startingOffsets/endingOffsets select what they say; and each user
mistake fails when the read is planned, with a message that says what to do.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from trio_coord.spark import SCHEMA, SCHEMA_WITHOUT_HEADERS

from .helpers import make_topic, produce

T0 = 1_700_000_000.0


def fill(bootstrap: str, topic: str, partitions: int, count: int) -> list[dict]:
    """Produce ``count`` records spread over the partitions; the expected rows."""
    make_topic(bootstrap, topic, partitions)
    records = []
    for i in range(count):
        record: dict = {
            "value": f"v{i}".encode(),
            "partition": i % partitions,
            "timestamp": T0 + i + 0.5,
        }
        if i % 3:
            record["key"] = f"k{i}".encode()
        if i % 4 == 0:
            record["headers"] = [("h", str(i).encode()), ("h", b"again")]
        records.append(record)
    placed = produce(bootstrap, topic, records)
    return [
        {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            # PySpark hands timestamps back as naive datetimes in local time
            "timestamp": datetime.fromtimestamp(r["timestamp"]),
            "key": r.get("key"),
            "value": r["value"],
            "timestampType": 0,
            "headers": [{"key": k, "value": v} for k, v in r.get("headers", [])],
        }
        for r, (partition, offset) in zip(records, placed, strict=True)
    ]


def rows(df) -> list[dict]:
    out = []
    for row in df.collect():
        d = row.asDict(recursive=True)
        d["key"] = None if d["key"] is None else bytes(d["key"])
        d["value"] = bytes(d["value"])
        if "headers" in d:
            d["headers"] = [{"key": h["key"], "value": bytes(h["value"])} for h in d["headers"]]
        out.append(d)
    return sorted(out, key=lambda d: (d["partition"], d["offset"]))


def reader(spark, bootstrap: str, **options: str):
    r = spark.read.format("trio_coord").option("bootstrap", bootstrap)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def test_a_batch_read_returns_exactly_the_records_produced(spark, bootstrap):
    expected = fill(bootstrap, "batch-all", 3, 60)
    df = reader(spark, bootstrap, topic="batch-all", includeHeaders="true")
    assert df.schema == SCHEMA
    assert df.columns == [
        *("key", "value", "topic", "partition", "offset", "timestamp", "timestampType"),
        "headers",
    ]  # Spark's Kafka source's, in its order
    assert rows(df) == sorted(expected, key=lambda d: (d["partition"], d["offset"]))
    plain = reader(spark, bootstrap, topic="batch-all")  # as Kafka: headers when asked
    assert plain.schema == SCHEMA_WITHOUT_HEADERS
    without = [{k: v for k, v in row.items() if k != "headers"} for row in expected]
    assert rows(plain) == sorted(without, key=lambda d: (d["partition"], d["offset"]))


def test_a_job_written_for_the_kafka_source_runs_with_the_format_name_changed(spark, bootstrap):
    fill(bootstrap, "kafka-a", 3, 30)
    fill(bootstrap, "kafka-b", 1, 4)

    def kafka_style(**options: str):
        r = spark.read.format("trio_coord").option("kafka.bootstrap.servers", bootstrap)
        for key, value in options.items():
            r = r.option(key, value)
        return r.load().selectExpr("CAST(value AS STRING)", "topic", "partition", "offset")

    assert kafka_style(subscribe="kafka-a,kafka-b").count() == 34
    assert kafka_style(subscribePattern="kafka-.").count() == 34
    picked = kafka_style(
        assign=json.dumps({"kafka-a": [0, 2]}),
        startingOffsets=json.dumps({"kafka-a": {"0": 2, "2": -2}}),
        endingOffsets=json.dumps({"kafka-a": {"0": -1, "2": 3}}),
        failOnDataLoss="false",
        maxRecordsPerPartition="4",
    )
    got = sorted((r.partition, r.offset) for r in picked.collect())
    assert got == [(0, o) for o in range(2, 10)] + [(2, o) for o in range(3)]
    assert picked.rdd.getNumPartitions() == 3  # 11 records, at most 4 a task
    message = planning_error(spark, bootstrap, assign=json.dumps({"kafka-b": [0, 1]}))
    assert "option \"assign\" names partition 1 of 'kafka-b', which has partitions 0 to 0" in (
        message
    )


def test_large_ranges_are_split_over_tasks_and_still_read_once(spark, bootstrap):
    expected = fill(bootstrap, "batch-split", 2, 50)
    df = reader(spark, bootstrap, topic="batch-split", maxRecordsPerTask="7", includeHeaders="true")
    assert df.rdd.getNumPartitions() == 8  # 25 records per partition: 4 tasks of <= 7 each
    assert rows(df) == sorted(expected, key=lambda d: (d["partition"], d["offset"]))
    more = reader(spark, bootstrap, topic="batch-split", minPartitions="10")
    assert more.rdd.getNumPartitions() == 10
    assert more.count() == 50


def test_a_read_makes_one_task_per_core_with_equal_shares(spark, bootstrap):
    expected = fill(bootstrap, "batch-cores", 3, 31)
    df = reader(spark, bootstrap, topic="batch-cores", includeHeaders="true")
    assert df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism == 2
    sizes = df.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
    assert sorted(sizes) == [15, 16]
    assert rows(df) == sorted(expected, key=lambda d: (d["partition"], d["offset"]))


def test_starting_and_ending_offsets_select_a_slice(spark, bootstrap):
    fill(bootstrap, "batch-slice", 2, 20)  # offsets 0..9 in each partition
    df = reader(
        spark,
        bootstrap,
        topic="batch-slice",
        startingOffsets=json.dumps({"batch-slice": {"0": 3, "1": -2}}),
        endingOffsets=json.dumps({"batch-slice": {"0": 5}}),
    )
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, 3), (0, 4)] + [(1, o) for o in range(10)]
    latest = reader(spark, bootstrap, topic="batch-slice", startingOffsets="latest")
    assert latest.count() == 0


def test_topics_and_pattern_choose_what_to_read(spark, bootstrap):
    fill(bootstrap, "pick-a", 1, 3)
    fill(bootstrap, "pick-b", 2, 4)
    fill(bootstrap, "other-c", 1, 5)
    both = reader(spark, bootstrap, topics="pick-a,pick-b")
    assert sorted(r.topic for r in both.select("topic").distinct().collect()) == [
        "pick-a",
        "pick-b",
    ]
    assert both.count() == 7
    assert reader(spark, bootstrap, pattern=r"pick-.*").count() == 7
    assert reader(spark, bootstrap, pattern=r"nothing-matches-.*").count() == 0


def test_a_batch_aggregation_matches_plain_python(spark, bootstrap):
    expected = fill(bootstrap, "batch-agg", 3, 90)
    df = reader(spark, bootstrap, topic="batch-agg")
    counts = {r.partition: r["count"] for r in df.groupBy("partition").count().collect()}
    plain: dict[int, int] = {}
    for row in expected:
        plain[row["partition"]] = plain.get(row["partition"], 0) + 1
    assert counts == plain


def planning_error(spark, bootstrap: str, **options: str) -> str:
    with pytest.raises(Exception) as caught:
        reader(spark, bootstrap, **options).count()
    return str(caught.value)


def test_mistakes_fail_at_planning_with_a_clear_message(spark, bootstrap):
    fill(bootstrap, "batch-errors", 2, 4)
    assert "topic 'no-such-topic' does not exist; create it first" in planning_error(
        spark, bootstrap, topic="no-such-topic"
    )
    message = planning_error(spark, "127.0.0.1:1", topic="batch-errors", timeout="0.5")
    assert "cannot reach a trio_coord broker at 127.0.0.1:1" in message
    assert "is the bootstrap option right?" in message
    message = planning_error(
        spark, bootstrap, topic="batch-errors", startingOffsets='{"batch-errors": {"0": 1'
    )
    assert 'option "startingOffsets" is not valid JSON' in message
    message = planning_error(spark, bootstrap, topic="batch-errors", startingOffsets="first")
    assert "give one of earliest, latest, group, or JSON per partition" in message
    message = planning_error(
        spark, bootstrap, topic="batch-errors", startingOffsets='{"batch-errors": {"0": 99}}'
    )
    assert "offset 99 of batch-errors-0 is outside its log, which holds offsets 0 to 2" in message
    message = planning_error(
        spark, bootstrap, topic="batch-errors", endingOffsets='{"elsewhere": {"0": 1}}'
    )
    assert 'option "endingOffsets" names elsewhere-0, which the read does not cover' in message
    assert "exactly one of the options" in planning_error(spark, bootstrap)
    assert "bootstrap entry 'nowhere' is not host:port" in planning_error(
        spark, "nowhere", topic="batch-errors"
    )
    assert "unknown option(s) startingoffset" in planning_error(
        spark, bootstrap, topic="batch-errors", startingOffset="earliest"
    )


def test_a_topic_holding_batches_of_both_layouts_reads_as_one(spark, bootstrap):
    # Batches written before the columnar layout (msgpack rows) stay readable next to
    # columnar ones, in one partition and in one Arrow batch handed to Spark.
    from trio_coord.protocol.messages import TopicPartition
    from trio_coord.protocol.records import WireRecord, encode_batch
    from trio_coord.spark._client import BlockingClient

    make_topic(bootstrap, "batch-layouts", 1)
    tp = TopicPartition("batch-layouts", 0)
    expected = []
    with BlockingClient(bootstrap) as client:
        for n, (columnar, codec) in enumerate(
            [(False, None), (True, None), (False, "zstd"), (True, "lz4"), (True, None)]
        ):
            records = [
                WireRecord(
                    1_700_000_000_000 + 10 * n + i,
                    None if i % 2 else f"k{n}.{i}".encode(),
                    f"v{n}.{i}".encode() * i,
                    [("h", b"%d" % i)] if i == 1 else [],
                )
                for i in range(4)
            ]
            client.produce(
                tp,
                encode_batch(records, codec, columnar=columnar),
                4,
                max(r.timestamp_ms for r in records),
            )
            expected += [
                (r.key, r.value, [{"key": k, "value": v} for k, v in r.headers], r.timestamp_ms)
                for r in records
            ]
    df = reader(spark, bootstrap, topic="batch-layouts", includeHeaders="true")
    got = rows(df)
    assert [r["offset"] for r in got] == list(range(20))
    assert [
        (r["key"], r["value"], r["headers"], round(r["timestamp"].timestamp() * 1000)) for r in got
    ] == expected
