"""The pure planning arithmetic and the options parser, without Spark or a broker.

Stream offsets serialize canonically (equal offsets, equal JSON); admission
control caps a micro-batch exactly at maxRecordsPerBatch, shares it by
backlog and serves every partition with a backlog in turn; task splitting
covers every offset once, contiguously, within the per-task cap, and so do
the equal shares a read makes per core (a share may span partitions); and each
malformed option is refused with a message that says what to write instead.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_coord.protocol.messages import TopicPartition as TP
from trio_coord.spark._options import OptionError, read_options, write_options
from trio_coord.spark._plan import (
    OffsetRange,
    admit,
    offsets_from_json,
    offsets_to_json,
    share_ranges,
    split_ranges,
)


def test_stream_offsets_are_sorted_json_whatever_the_insertion_order():
    a = {TP("b", 10): 1, TP("a", 2): 5, TP("b", 2): 7}
    b = dict(reversed(list(a.items())))
    assert json.dumps(offsets_to_json(a)) == json.dumps(offsets_to_json(b))
    assert json.dumps(offsets_to_json(a)) == (
        '{"partitions": {"a": {"2": 5}, "b": {"2": 7, "10": 1}}}'
    )
    with_group = offsets_to_json(a, group="g", bootstrap="h:1")
    assert list(with_group) == ["bootstrap", "group", "partitions"]
    assert offsets_from_json(json.loads(json.dumps(with_group))) == a
    with pytest.raises(ValueError, match="not a trio_coord stream offset"):
        offsets_from_json({"i": 3})


def test_admission_shares_the_cap_by_backlog():
    start = {TP("t", 0): 0, TP("t", 1): 10, TP("t", 2): 5}
    latest = {TP("t", 0): 90, TP("t", 1): 20, TP("t", 2): 5}
    assert admit(start, latest, None) == latest
    assert admit(start, latest, 1000) == latest
    # backlogs 90 and 10 share 20 records: 18 and 2
    assert admit(start, latest, 20) == {TP("t", 0): 18, TP("t", 1): 12, TP("t", 2): 5}
    # a new partition (not in start) has nothing to read
    assert admit(start, {**latest, TP("t", 3): 4}, 20)[TP("t", 3)] == 4


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 200)), min_size=1, max_size=6),
    st.integers(1, 300),
)
def test_admission_takes_exactly_the_cap_and_never_goes_back(spans, cap):
    start = {TP("t", p): s for p, (s, _) in enumerate(spans)}
    latest = {TP("t", p): s + n for p, (s, n) in enumerate(spans)}
    end = admit(start, latest, cap)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in latest)
    taken = sum(end[tp] - start[tp] for tp in latest)
    assert taken == min(cap, sum(n for _, n in spans))


def test_a_quiet_partition_next_to_a_busy_one_is_not_starved():
    busy, quiet = TP("t", 0), TP("t", 1)
    assert admit({busy: 0, quiet: 0}, {busy: 1000, quiet: 1}, 10) == {busy: 9, quiet: 1}
    at = {busy: 0, quiet: 0}
    for _ in range(3):  # the busy partition's backlog stays at 1000; the cap is 1
        at = admit(at, {busy: at[busy] + 1000, quiet: 1}, 1)
    assert at[quiet] == 1


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 2000)), min_size=1, max_size=8),
    st.integers(1, 20),
)
def test_admission_serves_every_partition_with_a_backlog_in_turn(spans, cap):
    """With backlogs that never shrink (producers keep up with the stream), each batch
    takes the cap and no more, nothing beyond a backlog, one record or more from every
    waiting partition when the cap allows, and every waiting partition within
    ceil(waiting / cap) batches."""
    start = {TP("t", p): s for p, (s, _) in enumerate(spans)}
    lags = {TP("t", p): n for p, (_, n) in enumerate(spans)}
    waiting = [tp for tp, lag in lags.items() if lag]
    served: set[TP] = set()
    for _ in range(max(1, -(-len(waiting) // cap))):
        latest = {tp: start[tp] + lags[tp] for tp in start}
        end = admit(start, latest, cap)
        taken = {tp: end[tp] - start[tp] for tp in start}
        assert all(0 <= taken[tp] <= lags[tp] for tp in start)
        assert sum(taken.values()) == min(cap, sum(lags.values()))
        if cap >= len(waiting):
            assert all(taken[tp] >= 1 for tp in waiting)
        served |= {tp for tp in waiting if taken[tp]}
        start = end
    assert served == set(waiting)


@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 500)), max_size=5),
    st.integers(1, 100),
    st.one_of(st.none(), st.integers(1, 40)),
)
def test_tasks_cover_every_offset_once_within_the_cap(spans, per_task, min_tasks):
    ranges = [OffsetRange("t", p, s, s + n) for p, (s, n) in enumerate(spans)]
    tasks = split_ranges(ranges, per_task, min_tasks)
    for r in ranges:
        mine = sorted((t.start, t.end) for t in tasks if t.partition == r.partition)
        if r.size == 0:
            assert mine == []
            continue
        assert mine[0][0] == r.start and mine[-1][1] == r.end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))
    assert all(0 < t.size <= per_task for t in tasks)
    total = sum(r.size for r in ranges)
    if min_tasks is not None:
        assert len(tasks) >= min(min_tasks, total)


@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 500)), max_size=6),
    st.integers(1, 8),
    st.integers(1, 300),
)
def test_shares_cover_every_offset_once_in_equal_parts(spans, tasks, per_task):
    ranges = [OffsetRange("t", p, s, s + n) for p, (s, n) in enumerate(spans)]
    shares = share_ranges(ranges, tasks, per_task)
    total = sum(r.size for r in ranges)
    pieces = [piece for share in shares for piece in share]
    assert pieces == sorted(pieces)  # the ranges' order, each range's pieces contiguous
    for r in ranges:
        mine = [(p.start, p.end) for p in pieces if p.partition == r.partition]
        if r.size == 0:
            assert mine == []
            continue
        assert (mine[0][0], mine[-1][1]) == (r.start, r.end)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))
    sizes = [sum(p.size for p in share) for share in shares]
    assert sum(sizes) == total and all(p.size > 0 for p in pieces)
    if total:
        assert len(shares) == min(total, max(tasks, -(-total // per_task)))
        assert max(sizes) - min(sizes) <= 1 and max(sizes) <= per_task


def test_shares_span_partitions_to_give_each_core_as_much():
    ranges = [OffsetRange("a", 0, 0, 30), OffsetRange("a", 1, 5, 15), OffsetRange("b", 0, 0, 0)]
    assert share_ranges(ranges, 2, 1_000) == [
        (OffsetRange("a", 0, 0, 20),),
        (OffsetRange("a", 0, 20, 30), OffsetRange("a", 1, 5, 15)),
    ]
    assert len(share_ranges(ranges, 2, 7)) == 6  # 40 records, at most 7 a task
    with pytest.raises(ValueError, match="must be positive"):
        share_ranges(ranges, 0, 10)


def test_split_ranges_cuts_into_near_equal_pieces():
    assert split_ranges([OffsetRange("t", 0, 0, 25)], 7) == [
        OffsetRange("t", 0, 0, 7),
        OffsetRange("t", 0, 7, 13),
        OffsetRange("t", 0, 13, 19),
        OffsetRange("t", 0, 19, 25),
    ]


BOOT = {"bootstrap": "127.0.0.1:9092"}


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        (
            {"topic": "t"},
            False,
            'the "bootstrap" option (alias "kafka.bootstrap.servers") is required',
        ),
        ({**BOOT}, False, 'exactly one of the options "topic"'),
        ({**BOOT, "topic": "a", "pattern": "b"}, False, "got topic, pattern"),
        ({**BOOT, "topic": "bad name"}, False, "may only contain letters"),
        ({**BOOT, "pattern": "("}, False, 'option "pattern" is not a valid regular expression'),
        ({**BOOT, "topic": "t", "startingOffsets": "{"}, False, "is not valid JSON"),
        ({**BOOT, "topic": "t", "startingOffsets": "[1]"}, False, "must be a JSON object"),
        (
            {**BOOT, "topic": "t", "startingOffsets": '{"t": {"x": 1}}'},
            False,
            "'x' in topic 't' is not a partition number",
        ),
        (
            {**BOOT, "topic": "t", "startingOffsets": '{"t": {"0": -3}}'},
            False,
            "must be a whole number >= 0, or -2 (earliest) or -1 (latest)",
        ),
        ({**BOOT, "topic": "t", "startingOffsets": "group"}, False, 'needs the "group" option'),
        ({**BOOT, "topic": "t", "endingOffsets": "group"}, False, "give one of earliest, latest"),
        ({**BOOT, "topic": "t", "maxRecordsPerBatch": "5"}, False, "stream reads only"),
        ({**BOOT, "topic": "t", "maxRecordsPerBatch": "0"}, True, "positive whole number"),
        ({**BOOT, "topic": "t", "endingOffsets": "latest"}, True, "batch reads only"),
        ({**BOOT, "topic": "t", "failOnDataLoss": "yes"}, False, "must be true or false"),
        ({**BOOT, "topic": "t", "timeout": "-1"}, False, "positive number of seconds"),
        ({**BOOT, "topic": "t", "group": "g"}, False, "a batch read commits nothing"),
        ({**BOOT, "topic": "t", "grup": "g"}, True, "unknown option(s) grup"),
        ({**BOOT, "subscribe": "a", "topics": "b"}, False, "mean the same and disagree"),
        ({**BOOT, "subscribe": " "}, False, 'exactly one of the options "topic"'),
        ({**BOOT, "subscribe": ","}, False, 'option "subscribe" names no topic'),
        ({**BOOT, "subscribePattern": "("}, False, 'option "subscribePattern" is not a valid'),
        ({**BOOT, "assign": "[0]"}, False, 'option "assign" must be a JSON object'),
        ({**BOOT, "assign": "{"}, False, 'option "assign" is not valid JSON'),
        ({**BOOT, "assign": '{"t": []}'}, False, "must have a non-empty list of partition"),
        ({**BOOT, "assign": '{"t": [-1]}'}, False, "-1 in topic 't' is not a partition number"),
        ({**BOOT, "assign": '{"t": [true]}'}, False, "True in topic 't' is not a partition"),
        ({**BOOT, "assign": '{"t": [0]}', "topic": "t"}, False, "got topic, assign"),
        ({**BOOT, "topic": "t", "maxOffsetsPerTrigger": "x"}, True, '"maxOffsetsPerTrigger" must'),
        ({**BOOT, "topic": "t", "maxOffsetsPerTrigger": "5"}, False, '"maxOffsetsPerTrigger" app'),
        ({**BOOT, "topic": "t", "includeHeaders": "1"}, False, '"includeHeaders" must be true'),
        ({**BOOT, "topic": "t", "startingTimestamp": "1"}, False, "give startingOffsets as"),
        ({**BOOT, "topic": "t", "kafka.group.id": "g"}, True, 'with the "group" option'),
        ({**BOOT, "topic": "t", "kafka.security.protocol": "SSL"}, False, "take no Kafka client"),
        ({"kafka.bootstrap.servers": "x", "topic": "t"}, False, '"kafka.bootstrap.servers": '),
        ({"topic": "t"}, False, 'alias "kafka.bootstrap.servers"'),
    ],
)
def test_each_read_option_mistake_says_what_to_do(options, streaming, message):
    with pytest.raises(OptionError) as caught:
        read_options(options, streaming=streaming)
    assert message in str(caught.value)
    assert str(caught.value).startswith("trio_coord data source: ")


def test_defaults_of_batch_and_stream_reads():
    batch = read_options({**BOOT, "TOPICS": "a, b,a"}, streaming=False)
    assert batch.topics == ("a", "b")
    assert (batch.starting.kind, batch.ending.kind) == ("earliest", "latest")
    stream = read_options({**BOOT, "topic": "a", "checkpointLocation": "/x"}, streaming=True)
    assert stream.starting.kind == "latest"
    grouped = read_options({**BOOT, "topic": "a", "group": "g"}, streaming=True)
    assert grouped.starting.kind == "group"
    spec = read_options(
        {**BOOT, "topic": "a", "startingOffsets": '{"a": {"1": 7, "0": -1}}'}, streaming=True
    ).starting
    assert spec.kind == "json" and spec.offsets == {TP("a", 1): 7, TP("a", 0): -1}


def test_the_kafka_sources_names_mean_the_same_here():
    kafka = read_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "subscribe": "a,b",
            "maxOffsetsPerTrigger": "7",
            "maxRecordsPerPartition": "9",
            "includeHeaders": "TRUE",
        },
        streaming=True,
    )
    ours = read_options(
        {
            **BOOT,
            "topics": "a,b",
            "maxRecordsPerBatch": "7",
            "maxRecordsPerTask": "9",
            "includeHeaders": "true",
        },
        streaming=True,
    )
    assert kafka == ours and kafka.include_headers
    pattern = read_options({**BOOT, "subscribePattern": "a.*"}, streaming=False)
    assert pattern.pattern == "a.*"
    same = read_options(
        {**BOOT, "kafka.bootstrap.servers": BOOT["bootstrap"], "topic": "t"}, streaming=False
    )
    assert same.bootstrap == BOOT["bootstrap"]  # an alias may repeat the same value
    assigned = read_options({**BOOT, "assign": '{"b": [2, 0, 2], "a": [1]}'}, streaming=False)
    assert assigned.assign == (TP("a", 1), TP("b", 0), TP("b", 2))
    assert assigned.wanted(["a", "b", "c"]) == ["a", "b"]


def test_write_options():
    assert write_options({**BOOT, "topic": "t", "path": "ignored"}).topic == "t"
    with pytest.raises(OptionError, match="choose one of zlib, lzma, lz4, zstd"):
        write_options({**BOOT, "compression": "snappy"})
    assert write_options({**BOOT, "topic": "t", "compression": "zstd"}).compression == "zstd"
    with pytest.raises(OptionError, match="positive whole number"):
        write_options({**BOOT, "batchSize": "-5"})


def test_options_checked_for_either_kind_of_read_leave_out_what_only_one_refuses():
    for one_kind_only in ({"endingOffsets": "latest"}, {"maxRecordsPerBatch": "5"}):
        read_options({**BOOT, "topic": "t", **one_kind_only}, streaming=None)
    with pytest.raises(OptionError, match=r"unknown option\(s\) grup for a read;"):
        read_options({**BOOT, "topic": "t", "grup": "g"}, streaming=None)
