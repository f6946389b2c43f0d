"""Writes through the ``trio_coord`` format: rows become records a Trio consumer reads back.

A batch write stores every row (key, value, headers, timestamp; the key's
partition by the producer's own hash, or the row's partition), a stream
write does the same per micro-batch, and a DataFrame that cannot be written
is refused at planning with a message naming the column.
"""

from __future__ import annotations

import itertools
from datetime import datetime

import pytest
from pyspark.sql import Row

from trio_coord.client import partition_for_key
from trio_coord.protocol.messages import TopicPartition
from trio_coord.protocol.records import COLUMNAR, check_batch, decode_batch

from .helpers import consume, make_topic


def test_rows_written_are_read_back_by_a_consumer(spark, bootstrap):
    make_topic(bootstrap, "written", 3)
    rows = [
        Row(
            key=f"k{i}",
            value=f"value {i}".encode(),
            headers=[Row(key="n", value=str(i).encode())],
            timestamp=datetime.fromtimestamp(1_700_000_000 + i),
        )
        for i in range(40)
    ]
    spark.createDataFrame(rows).repartition(2).write.format("trio_coord").option(
        "bootstrap", bootstrap
    ).option("topic", "written").mode("append").save()
    records = consume(bootstrap, "written", 40)
    got = {r.key.decode(): r for r in records}
    assert sorted(got) == sorted(f"k{i}" for i in range(40))
    for i in range(40):
        record = got[f"k{i}"]
        assert record.value == f"value {i}".encode()
        assert record.headers == (("n", str(i).encode()),)
        assert record.timestamp == 1_700_000_000 + i
        assert record.partition == partition_for_key(f"k{i}".encode(), 3)


def test_partition_and_topic_columns_choose_where_rows_go(spark, bootstrap):
    make_topic(bootstrap, "routed-a", 2)
    make_topic(bootstrap, "routed-b", 2)
    df = spark.createDataFrame(
        [(("routed-a", "routed-b")[i % 2], 1, f"{i}") for i in range(10)],
        "topic string, partition int, value string",
    )
    df.write.format("trio_coord").option("bootstrap", bootstrap).mode("append").save()
    for topic in ("routed-a", "routed-b"):
        records = consume(bootstrap, topic, 5)
        assert {r.partition for r in records} == {1}


def test_a_stream_write_produces_each_micro_batch(spark, bootstrap, tmp_path):
    make_topic(bootstrap, "stream-in", 2)
    make_topic(bootstrap, "stream-out", 1)
    spark.createDataFrame([(f"{i}",) for i in range(15)], "value string").write.format(
        "trio_coord"
    ).option("bootstrap", bootstrap).option("topic", "stream-in").mode("append").save()
    query = (
        spark.readStream.format("trio_coord")
        .option("bootstrap", bootstrap)
        .option("topic", "stream-in")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerBatch", "4")
        .load()
        .selectExpr("key", "concat(CAST(value AS STRING), '!') AS value")
        .writeStream.format("trio_coord")
        .option("bootstrap", bootstrap)
        .option("topic", "stream-out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    records = consume(bootstrap, "stream-out", 15)
    assert sorted(r.value for r in records) == sorted(f"{i}!".encode() for i in range(15))


def test_columns_that_cannot_be_written_are_refused_at_planning(spark, bootstrap):
    make_topic(bootstrap, "refused", 1)
    df = spark.createDataFrame([(1, "x")], "id int, value string")
    with pytest.raises(Exception, match=r"cannot write column.*id.*select or rename"):
        df.write.format("trio_coord").option("bootstrap", bootstrap).option(
            "topic", "refused"
        ).mode("append").save()
    no_value = spark.createDataFrame([("x",)], "key string")
    with pytest.raises(Exception, match="needs a value column"):
        no_value.write.format("trio_coord").option("bootstrap", bootstrap).option(
            "topic", "refused"
        ).mode("append").save()
    with pytest.raises(Exception, match='the "topic" option, or a topic column'):
        spark.createDataFrame([("x",)], "value string").write.format("trio_coord").option(
            "bootstrap", bootstrap
        ).mode("append").save()


def test_a_row_for_a_partition_the_topic_lacks_fails_the_write_clearly(spark, bootstrap):
    make_topic(bootstrap, "too-few", 1)
    df = spark.createDataFrame([(5, "x")], "partition int, value string")
    with pytest.raises(Exception, match=r"topic 'too-few' has partitions 0\.\.0; partition 5 does"):
        df.write.format("trio_coord").option("bootstrap", bootstrap).option(
            "topic", "too-few"
        ).mode("append").save()


class _Recorder:
    """A client that keeps what would be produced: (partition, [(key, value)]) per batch."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[tuple[bytes | None, bytes | None]]]] = []
        self.stamps: list[int] = []

    def partition_counts(self, topics):
        return dict.fromkeys(topics, 3)

    def produce(self, tp, payload, count, max_timestamp_ms):
        assert payload[0] & COLUMNAR  # written in the layout Arrow reads
        assert check_batch(payload)[0] == count  # as the broker checks it
        records = decode_batch(payload)
        assert len(records) == count and max(r.timestamp_ms for r in records) == max_timestamp_ms
        self.sent.append((tp.partition, [(r.key, r.value) for r in records]))
        self.stamps.extend(r.timestamp_ms for r in records)
        return 0

    def produce_many(self, requests):
        assert len({(r.topic, r.partition) for r in requests}) == len(requests)
        return [
            self.produce(
                TopicPartition(r.topic, r.partition), r.records, r.count, r.max_timestamp_ms
            )
            for r in requests
        ]


@pytest.mark.parametrize(
    "keys",
    [
        [f"k{i}".encode() for i in range(40)],  # every row keyed: by partition in bulk
        [None] * 40,  # none: one partition's batch at a time
        [f"k{i}".encode() if i % 3 else None for i in range(40)],  # mixed: row by row
    ],
)
def test_rows_go_to_the_keys_partition_or_fill_one_partition_at_a_time(keys, monkeypatch):
    import pyarrow as pa

    from trio_coord.spark import _write
    from trio_coord.spark._options import write_options
    from trio_coord.spark._write import _Batches

    values = [f"value {i:03d}".encode() for i in range(40)]
    options = write_options({"bootstrap": "127.0.0.1:1", "topic": "t", "batchSize": "100"})
    client = _Recorder()
    out = _Batches(client, options)  # type: ignore[arg-type]
    batch = pa.RecordBatch.from_pydict({"key": keys, "value": values})
    out.add_arrow(batch.slice(0, 25), now_ms=5)
    monkeypatch.setattr(_write, "ENCODE_BYTES", 64)  # a batch too large is encoded in halves
    out.add_arrow(batch.slice(25), now_ms=5)
    out.flush()
    sent = [(partition, kv) for partition, batch_kv in client.sent for kv in batch_kv]
    assert sorted(kv[::-1] for _, kv in sent) == sorted(zip(values, keys, strict=True))  # once
    for partition, (key, _) in sent:
        if key is not None:
            assert partition == partition_for_key(key, 3)
    for partition in range(3):  # each partition has its rows in the DataFrame's order
        mine = [value for p, (_, value) in sent if p == partition]
        assert mine == sorted(mine)
    # A batch holds at most 100 B: a record takes 16 B (its timestamp and two lengths in
    # the columnar layout) besides its key and value.
    assert all(len(kvs) <= 7 for _, kvs in client.sent)
    assert len(client.sent) >= 40 * 15 // 100
    keyless = [(p, kvs) for p, kvs in client.sent if all(k is None for k, _ in kvs)]
    if all(k is None for k in keys):  # consecutive batches move on to the next partition
        partitions = [p for p, _ in keyless]
        assert all(b == (a + 1) % 3 for a, b in itertools.pairwise(partitions))


@pytest.mark.parametrize("keyed", ["none", "all", "some"])
def test_a_batch_holding_more_than_one_record_stays_within_batch_size(keyed):
    # batchSize is what a Produce request holds, and must stay under the brokers'
    # max_batch_bytes: a big row after small ones used to join their batch and take it
    # past batchSize by up to its own size (past the broker's limit: the write failed,
    # and its retries). A record larger than batchSize goes alone.
    import pyarrow as pa

    from trio_coord.spark._options import write_options
    from trio_coord.spark._write import _Batches

    sizes = [10, 10, 10, 80, 10, 150, 10, 10, 60, 30, 5]
    values = [bytes([65 + i]) * size for i, size in enumerate(sizes)]
    keys = {
        "none": [None] * len(sizes),
        "all": [b"k"] * len(sizes),  # one key: one partition, in order
        "some": [b"k" if i % 2 else None for i in range(len(sizes))],
    }[keyed]
    options = write_options({"bootstrap": "127.0.0.1:1", "topic": "t", "batchSize": "100"})
    client = _Recorder()
    out = _Batches(client, options)  # type: ignore[arg-type]
    out.add_arrow(pa.RecordBatch.from_pydict({"key": keys, "value": values}), now_ms=5)
    out.flush()
    for _, kvs in client.sent:
        size = sum(16 + len(k or b"") + len(v or b"") for k, v in kvs)
        assert len(kvs) == 1 or size <= 100, kvs
    assert sorted(v for _, kvs in client.sent for _, v in kvs) == sorted(values)


def test_string_columns_nulls_and_timestamps_are_written_as_given():
    import datetime as dt

    import pyarrow as pa

    from trio_coord.spark._options import write_options
    from trio_coord.spark._write import _Batches

    stamps = [dt.datetime(2024, 5, 1, 12, 0, 0, i * 1000, tzinfo=dt.UTC) for i in range(30)]
    stamps[7] = None  # written at the task's clock
    values = [None if i % 4 == 0 else "é" * i for i in range(30)]
    options = write_options({"bootstrap": "127.0.0.1:1", "topic": "t", "batchSize": "64"})
    client = _Recorder()
    out = _Batches(client, options)  # type: ignore[arg-type]
    batch = pa.RecordBatch.from_pydict(
        {
            "value": pa.array(values, pa.string()),
            "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        }
    )
    out.add_arrow(batch, now_ms=42)
    out.flush()
    got = [kv for _, kvs in client.sent for kv in kvs]
    assert got == [(None, None if v is None else v.encode()) for v in values]
    base = int(stamps[0].timestamp() * 1000)
    assert client.stamps == [42 if i == 7 else base + i for i in range(30)]


def test_a_batch_of_arrow_slices_and_rows_is_written_as_the_records_it_holds():
    # Arrow slices (not starting at 0, some keys null, strings) and rows that took the
    # per-row path, in one batch: the columnar bytes from Arrow's buffers read back as the
    # records, and as the records-first path (big-endian hosts) writes them.
    import pyarrow as pa

    from trio_coord.protocol.records import COLUMNAR, encode_batch
    from trio_coord.spark._write import _columnar_body, _rows_of

    keys = pa.array([None, "a", None, "bcd", "e"], pa.string()).slice(1)
    values = pa.array([b"x", b"", None, b"yy", b"z"]).slice(1)
    millis = pa.array([1, 2, 3, 4, 5], pa.int64()).slice(1)
    pieces = [
        (millis, keys, values),
        [(9, None, b"row", (("h", b"1"),)), (10, b"k", None, ())],
        (millis.slice(1, 2), None, values.slice(1, 2)),
    ]
    payload = bytes((COLUMNAR,)) + _columnar_body(pieces, 8)
    expected = [
        (2, b"a", b"", []),
        (3, None, None, []),
        (4, b"bcd", b"yy", []),
        (5, b"e", b"z", []),
        (9, None, b"row", [("h", b"1")]),
        (10, b"k", None, []),
        (3, None, None, []),
        (4, None, b"yy", []),
    ]
    got = [(r.timestamp_ms, r.key, r.value, r.headers) for r in decode_batch(payload)]
    assert got == expected
    assert decode_batch(encode_batch(_rows_of(pieces))) == decode_batch(payload)
