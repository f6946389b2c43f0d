"""The blocking client and the task-side reading, against a real broker process (no Spark).

The client opens nothing until its first request and says clearly when no
broker answers; produce, list offsets, fetch and commit speak the same wire
protocol as the Trio clients; a task's range comes back as Arrow batches of
exactly the schema Spark derives from the declared one, and the task's
client is closed however the task ends; commits to a group never move back.
"""

from __future__ import annotations

import logging
import socket

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from trio_coord.protocol.errors import UnknownTopicError
from trio_coord.protocol.messages import (
    EARLIEST,
    LATEST,
    FetchRequest,
    ListedOffset,
    TopicPartition,
)
from trio_coord.protocol.records import WireRecord, encode_batch
from trio_coord.spark import (
    ARROW_SCHEMA,
    SCHEMA,
    SCHEMA_WITHOUT_HEADERS,
    BlockingClient,
    BrokerUnreachableError,
    _read,
)
from trio_coord.spark._arrow import ARROW_SCHEMA_WITHOUT_HEADERS
from trio_coord.spark._client import _Socket
from trio_coord.spark._options import read_options
from trio_coord.spark._plan import OffsetRange
from trio_coord.spark._read import commit_forward, read_range, read_task

from .helpers import committed, make_topic, produce


def test_the_arrow_schema_is_exactly_what_spark_expects():
    assert ARROW_SCHEMA.equals(to_arrow_schema(SCHEMA, timezone="UTC"))
    assert ARROW_SCHEMA_WITHOUT_HEADERS.equals(
        to_arrow_schema(SCHEMA_WITHOUT_HEADERS, timezone="UTC")
    )


def test_no_socket_before_the_first_request_and_a_clear_error_without_a_broker():
    client = BlockingClient("127.0.0.1:1,127.0.0.1:2", timeout=0.3)
    assert client._sockets == {}
    with pytest.raises(BrokerUnreachableError) as caught:
        client.metadata()
    message = str(caught.value)
    assert "no broker of the bootstrap list 127.0.0.1:1,127.0.0.1:2 can be reached" in message
    assert "is the bootstrap option right?" in message


def test_a_write_task_takes_the_connection_a_task_before_it_left(bootstrap, monkeypatch):
    import pyarrow as pa

    from trio_coord.spark._options import write_options
    from trio_coord.spark._write import write_batches

    make_topic(bootstrap, "client-w", 2)
    monkeypatch.setattr(_read, "_idle", {})
    options = write_options({"bootstrap": bootstrap, "topic": "client-w"})
    rows = pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c"]})
    assert write_batches(options, iter([rows])).records == 3
    [client] = _read._idle.values()
    sockets = dict(client._sockets)
    assert sockets  # connected, and idle for the worker's next task
    assert write_batches(options, iter([rows])).records == 3
    assert list(_read._idle.values()) == [client] and client._sockets == sockets
    with BlockingClient(bootstrap) as reader:
        ends = reader.list_offsets([TopicPartition("client-w", p) for p in range(2)], LATEST)
    assert sum(o.log_end for o in ends.values()) == 6
    _read.close_idle_clients()


def test_an_idle_connection_never_serves_a_task_with_another_login(monkeypatch):
    monkeypatch.setattr(_read, "_idle", {})
    anonymous = read_options({"bootstrap": "127.0.0.1:1", "topic": "t"}, streaming=False)
    alice = read_options(
        {"bootstrap": "127.0.0.1:1", "topic": "t", "user": "alice", "password": "pw"},
        streaming=False,
    )
    with _read._task_client(anonymous) as first:
        pass
    with _read._task_client(alice) as second:
        assert second is not first  # same brokers, another login: a client of its own
    with _read._task_client(anonymous) as again:
        assert again is first
    with _read._task_client(alice) as again:
        assert again is second
    _read.close_idle_clients()


def test_the_idle_pool_is_bounded_and_closes_what_it_lets_go(monkeypatch):
    monkeypatch.setattr(_read, "_idle", {})
    closed: list[BlockingClient] = []
    real_close = BlockingClient.close
    monkeypatch.setattr(
        BlockingClient, "close", lambda self: (closed.append(self), real_close(self))[1]
    )
    made = []
    for port in range(1, _read._IDLE_LIMIT + 4):  # as many brokers' tasks, one after another
        options = read_options({"bootstrap": f"127.0.0.1:{port}", "topic": "t"}, streaming=False)
        with _read._task_client(options) as client:
            made.append(client)
    assert len(_read._idle) == _read._IDLE_LIMIT
    assert closed == made[:3]  # the oldest let go, and closed
    assert list(_read._idle.values()) == made[3:]
    _read.close_idle_clients()


def test_a_pooled_connection_the_broker_dropped_is_not_used_again(bootstrap, monkeypatch):
    make_topic(bootstrap, "client-dropped", 1)
    produce(bootstrap, "client-dropped", [{"value": b"x"} for _ in range(5)])
    monkeypatch.setattr(_read, "_idle", {})
    options = read_options({"bootstrap": bootstrap, "topic": "client-dropped"}, streaming=False)
    from pyspark.sql.datasource import InputPartition

    task = InputPartition(OffsetRange("client-dropped", 0, 0, 5))
    assert sum(b.num_rows for b in read_task(options, task)) == 5
    [client] = _read._idle.values()
    dropped = dict(client._sockets)
    for sock in dropped.values():  # the connections die while the client is idle
        sock.sock.shutdown(socket.SHUT_RDWR)
    assert sum(b.num_rows for b in read_task(options, task)) == 5
    assert list(_read._idle.values()) == [client]  # the same client, with new connections
    assert client._sockets and not set(map(id, client._sockets.values())) & set(
        map(id, dropped.values())
    )
    _read.close_idle_clients()


def test_produce_list_offsets_and_fetch_round_trip(bootstrap):
    make_topic(bootstrap, "client-a", 2)
    tp = TopicPartition("client-a", 1)
    records = [WireRecord(1_000 + i, b"k", f"v{i}".encode(), [("h", b"x")]) for i in range(5)]
    with BlockingClient(bootstrap) as client:
        assert client.produce(tp, encode_batch(records, "zlib"), 5, 1_004) == 0
        assert client.produce(tp, encode_batch(records[:2]), 2, 1_001) == 5
        assert client.partition_counts(["client-a"]) == {"client-a": 2}
        assert client.list_offsets([tp], LATEST)[tp].log_end == 7
        assert client.list_offsets([tp], EARLIEST)[tp].log_start == 0
        batches = list(read_range(client, OffsetRange("client-a", 1, 3, 6), rows_per_batch=2))
        with pytest.raises(UnknownTopicError, match="create it first"):
            client.partition_counts(["client-missing"])
    assert [b.num_rows for b in batches] == [2, 1]
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    rows = [row for b in batches for row in b.to_pylist()]
    assert [r["offset"] for r in rows] == [3, 4, 5]
    assert [r["value"] for r in rows] == [b"v3", b"v4", b"v0"]
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}]
    assert rows[0]["timestamp"].timestamp() == 1.003
    assert client._sockets == {}


def test_a_task_leaves_its_client_to_the_next_and_closes_it_on_failure(bootstrap, monkeypatch):
    make_topic(bootstrap, "client-b", 1)
    produce(bootstrap, "client-b", [{"value": b"x"} for _ in range(30)])
    clients: list[BlockingClient] = []
    real = _read._client

    def tracked(options):
        clients.append(real(options))
        return clients[-1]

    monkeypatch.setattr(_read, "_client", tracked)
    monkeypatch.setattr(_read, "_idle", {})
    options = read_options({"bootstrap": bootstrap, "topic": "client-b"}, streaming=False)
    from pyspark.sql.datasource import InputPartition

    task = read_task(options, InputPartition(OffsetRange("client-b", 0, 0, 30)))
    first = next(task)
    assert first.num_rows == 30 and clients[0]._sockets  # connected while it reads
    task.close()  # Spark stops a task early (a limit, a failure elsewhere)
    assert list(_read._idle.values()) == clients  # idle, for the worker's next task
    sockets = dict(clients[0]._sockets)
    both = InputPartition((OffsetRange("client-b", 0, 0, 10), OffsetRange("client-b", 0, 20, 25)))
    batches = list(read_task(options, both))
    assert len(clients) == 1 and clients[0]._sockets == sockets  # the same connection
    assert [r["offset"] for b in batches for r in b.to_pylist()] == [*range(10), *range(20, 25)]
    beyond = InputPartition(OffsetRange("client-b", 0, 25, 40))  # the log ends at 30
    with pytest.raises(_read.DataLossError, match="before the end of the range planned"):
        list(read_task(options, beyond))
    assert clients[0]._sockets == {} and _read._idle == {}  # a failed task closes its client
    _read.close_idle_clients()


def test_batches_produced_together_land_in_their_partitions_in_order(bootstrap):
    from trio_coord.protocol.messages import ProduceRequest

    make_topic(bootstrap, "client-many", 3)

    def batch(partition: int, first: int) -> ProduceRequest:
        records = [
            WireRecord(i, None, f"p{partition}-{i}".encode()) for i in range(first, first + 4)
        ]
        return ProduceRequest("client-many", partition, encode_batch(records), 4, first + 3)

    with BlockingClient(bootstrap) as client:
        assert client.produce_many([batch(p, 0) for p in range(3)]) == [0, 0, 0]
        assert client.produce_many([batch(2, 4), batch(0, 4)]) == [4, 4]
        read = {
            p: [
                r["value"]
                for b in read_range(client, OffsetRange("client-many", p, 0, n))
                for r in b.to_pylist()
            ]
            for p, n in ((0, 8), (1, 4), (2, 8))
        }
    assert read[0] == [f"p0-{i}".encode() for i in range(8)]
    assert read[1] == [f"p1-{i}".encode() for i in range(4)]
    assert read[2] == [f"p2-{i}".encode() for i in range(8)]


def _produce_20_batches_of_20(client: BlockingClient, tp: TopicPartition) -> None:
    for base in range(0, 400, 20):
        records = [WireRecord(i, None, f"v{i}".encode()) for i in range(base, base + 20)]
        client.produce(tp, encode_batch(records), 20, base + 19)


def _counting_sends(monkeypatch) -> list[object]:
    """Every request body the client's sockets send, in order."""
    sent: list[object] = []
    real = _Socket.send

    def send(self, bodies):
        sent.extend(bodies)
        return real(self, bodies)

    monkeypatch.setattr(_Socket, "send", send)
    return sent


def test_a_fetch_sends_the_next_one_before_its_records_are_decoded(bootstrap, monkeypatch):
    make_topic(bootstrap, "client-pipe", 1)
    tp = TopicPartition("client-pipe", 0)
    with BlockingClient(bootstrap) as client:
        _produce_20_batches_of_20(client, tp)
        sent = _counting_sends(monkeypatch)
        first = client.fetch(tp, 0, max_bytes=64, ahead_until=400)
        assert [b.base_offset for b in first.batches] == [0]
        fetches = [b for b in sent if isinstance(b, FetchRequest)]
        assert [f.partitions[0].offset for f in fetches] == [0, 20]  # the next one is out
        second = client.fetch(tp, 20, max_bytes=64, ahead_until=40)
        assert [b.base_offset for b in second.batches] == [20]
        # Its answer was the one sent ahead; nothing is sent past ahead_until.
        fetches = [b for b in sent if isinstance(b, FetchRequest)]
        assert [f.partitions[0].offset for f in fetches] == [0, 20]
        # A call for something else lets the early answer go; the socket stays in step.
        client.fetch(tp, 0, max_bytes=64, ahead_until=400)
        other = client.fetch(tp, 100, max_bytes=64)
        assert [b.base_offset for b in other.batches] == [100]
        # The early answer was read out first: nothing of it is in flight any more.
        assert [s for s in client._sockets.values() if s._waiting or s._early] == []
        assert client.list_offsets([tp], LATEST)[tp].log_end == 400
        assert client.fetch(tp, 20, max_bytes=64).batches[0].base_offset == 20


def test_a_read_stopped_early_leaves_the_client_usable(bootstrap):
    make_topic(bootstrap, "client-ahead", 1)
    tp = TopicPartition("client-ahead", 0)
    with BlockingClient(bootstrap) as client:
        _produce_20_batches_of_20(client, tp)
        # One stored batch per fetch, ten rows per Arrow batch: the next fetch is out.
        batches = read_range(
            client, OffsetRange("client-ahead", 0, 0, 400), rows_per_batch=10, fetch_max_bytes=64
        )
        assert next(batches).to_pylist()[0]["offset"] == 0
        batches.close()
        # Nothing is left in flight: a task abandoned here parks this client for the
        # worker's next task, and an answer left unread would hold the broker's
        # connection busy (up to fetchMaxBytes unsent) for as long as the worker idles.
        assert [s for s in client._sockets.values() if s._waiting] == []
        assert client.list_offsets([tp], LATEST)[tp].log_end == 400  # the socket is in step
        every = list(read_range(client, OffsetRange("client-ahead", 0, 5, 395), rows_per_batch=64))
    assert [r["offset"] for b in every for r in b.to_pylist()] == list(range(5, 395))


def test_a_malformed_stored_batch_is_an_invalid_record_error():
    from trio_coord.protocol.errors import InvalidRecordError
    from trio_coord.spark._arrow import _binary, decode_records

    with pytest.raises(InvalidRecordError, match="unknown compression id 9"):
        decode_records(b"\x09abc")
    with pytest.raises(InvalidRecordError, match="cannot be decoded"):
        decode_records(b"\x00\x91\x92\x01")  # a record of two fields, not four
    with pytest.raises(InvalidRecordError, match="empty record batch"):
        decode_records(b"")
    records = [WireRecord(5, None, b"v", [("a", b"1")]), WireRecord(6, b"k", None)]
    for columnar in (True, False):
        piece = decode_records(encode_batch(records, "lzma", columnar=columnar))
        assert piece.stamps.to_pylist() == [5, 6]
        assert _binary([piece.keys]).to_pylist() == [None, b"k"]
        assert _binary([piece.values]).to_pylist() == [b"v", None]
        assert piece.headers is not None
        assert piece.headers.to_pylist() == [[{"key": "a", "value": b"1"}], []]


def test_commits_never_move_backwards(bootstrap):
    make_topic(bootstrap, "client-c", 2)
    produce(bootstrap, "client-c", [{"value": b"x", "partition": i % 2} for i in range(20)])
    tp0, tp1 = TopicPartition("client-c", 0), TopicPartition("client-c", 1)
    with BlockingClient(bootstrap) as client:
        assert commit_forward(client, "client-g", {tp0: 8, tp1: 3}) == {tp0: 8, tp1: 3}
        assert commit_forward(client, "client-g", {tp0: 5, tp1: 6}) == {tp1: 6}
        assert commit_forward(client, "client-g", {tp0: 8, tp1: 6}) == {}
    assert committed(bootstrap, "client-g") == {("client-c", 0): 8, ("client-c", 1): 6}


class _Scripted:
    """A stand-in for BlockingClient whose fetches a test scripts (none is sent ahead)."""

    def drop_ahead(self) -> None:
        pass


class _TrimmedLog(_Scripted):
    """A client whose partition lost offsets 0..4 to retention and holds 5..9."""

    def __init__(self) -> None:
        from trio_coord.protocol.messages import FetchedBatch, FetchedPartition, ListedOffset

        payload = encode_batch([WireRecord(0, None, f"v{i}".encode()) for i in range(5, 10)])
        self._answer = FetchedPartition("t", 0, 0, "", 5, 10, [FetchedBatch(5, 5, payload)])
        self._listed = ListedOffset("t", 0, 5, 5, 10)

    def fetch(self, tp, offset, *, max_bytes, max_wait_ms=0, ahead_until=None):
        from trio_coord.protocol.errors import OffsetOutOfRangeError

        if offset < 5:
            raise OffsetOutOfRangeError(f"offset {offset} is out of range")
        return self._answer

    def list_offsets(self, partitions, timestamp_ms):
        return {TopicPartition("t", 0): self._listed}


def test_records_lost_to_retention_fail_the_read_unless_told_to_skip():
    from trio_coord.spark import DataLossError

    lost = OffsetRange("t", 0, 2, 8)
    with pytest.raises(DataLossError) as caught:
        list(read_range(_TrimmedLog(), lost))
    assert "records 2 to 4 of t-0 were deleted before they could be read" in str(caught.value)
    assert "set failOnDataLoss=false to skip what is lost" in str(caught.value)
    batches = list(read_range(_TrimmedLog(), lost, fail_on_data_loss=False))
    assert [r["offset"] for b in batches for r in b.to_pylist()] == [5, 6, 7]


class _Miscounted(_Scripted):
    """A client whose broker says its batch at offset 0 holds 5 records, but the batch holds
    ``held`` (a damaged log, or a hostile broker); offsets 5..9 follow in another batch."""

    def __init__(self, held: int) -> None:
        from trio_coord.protocol.messages import FetchedBatch, FetchedPartition

        wrong = encode_batch([WireRecord(0, None, f"a{i}".encode()) for i in range(held)])
        right = encode_batch([WireRecord(0, None, f"b{i}".encode()) for i in range(5, 10)])
        self._answer = FetchedPartition(
            "t", 0, 0, "", 0, 10, [FetchedBatch(0, 5, wrong), FetchedBatch(5, 5, right)]
        )
        self.fetches = 0

    def fetch(self, tp, offset, *, max_bytes, max_wait_ms=0, ahead_until=None):
        self.fetches += 1
        assert self.fetches < 50, f"still fetching offset {offset} after 50 fetches"
        return self._answer


@pytest.mark.parametrize("held", [0, 3, 7])
def test_a_stored_batch_holding_other_than_its_count_of_records_is_refused(held):
    # Read on as they were, its records would take other records' offsets (7), or the
    # task would fetch the offsets it lacks again and again, for ever (0, 3).
    from trio_coord.protocol.errors import InvalidRecordError

    for r in (OffsetRange("t", 0, 0, 10), OffsetRange("t", 0, 0, 4), OffsetRange("t", 0, 1, 10)):
        with pytest.raises(InvalidRecordError, match=f"holds {held} records, but"):
            list(read_range(_Miscounted(held), r, prefetch=False))


def test_a_stream_reader_pickles_without_its_driver_side_client(bootstrap):
    import pickle

    from trio_coord.spark._read import StreamReader

    make_topic(bootstrap, "client-d", 1)
    options = read_options({"bootstrap": bootstrap, "topic": "client-d"}, streaming=True)
    reader = StreamReader(options)
    assert reader.initialOffset() == {"partitions": {"client-d": {"0": 0}}}
    assert reader.client._sockets  # the driver side keeps its connection between calls
    copy = pickle.loads(pickle.dumps(reader))  # what Spark ships to the tasks
    assert copy._client is None and copy.options == reader.options
    reader.stop()
    assert reader._client is None


def test_a_lost_task_range_is_warned_about_as_far_as_the_task_reaches(caplog):
    with caplog.at_level(logging.WARNING, logger="trio_coord.spark._read"):
        assert (
            list(read_range(_TrimmedLog(), OffsetRange("t", 0, 1, 3), fail_on_data_loss=False))
            == []
        )
    assert [r.getMessage() for r in caplog.records] == [
        "t-0: records 1 to 2 were deleted before they could be read; skipping them"
    ]


class _TrimmedStream:
    """The driver-side client of a stream over topic t, one partition, whose records 0 to 999
    retention deleted: its log holds 1000 to 1009."""

    def partition_counts(self, topics):
        return {"t": 1}

    def list_offsets(self, partitions, timestamp_ms):
        return {TopicPartition("t", 0): ListedOffset("t", 0, 1000, 1000, 1010)}

    def close(self) -> None:
        pass


def test_a_stream_allowed_to_lose_data_skips_to_the_log_start_in_one_batch(caplog):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from trio_coord.spark._read import StreamReader

    options = read_options(
        {"bootstrap": "127.0.0.1:1", "topic": "t", "failOnDataLoss": "false"}, streaming=True
    )
    reader = StreamReader(options)
    reader._client = _TrimmedStream()
    start = {"partitions": {"t": {"0": 0}}}
    with caplog.at_level(logging.WARNING, logger="trio_coord.spark._read"):
        end = reader.latestOffset(start, ReadMaxRows(4))
    assert end == {"partitions": {"t": {"0": 1004}}}  # not 4: no empty batches through the gap
    assert [r.getMessage() for r in caplog.records] == [
        "t-0: records 0 to 999 were deleted before the stream read them; "
        "skipping them (failOnDataLoss=false)"
    ]
    assert [task.value for task in reader.partitions(start, end)] == [
        OffsetRange("t", 0, 1000, 1004)
    ]


def test_a_batch_pattern_matching_no_topic_reads_nothing_with_a_warning(bootstrap, caplog):
    make_topic(bootstrap, "client-pattern", 1)
    options = read_options({"bootstrap": bootstrap, "pattern": r"clint-.*"}, streaming=False)
    with BlockingClient(bootstrap) as client, caplog.at_level(logging.WARNING):
        assert _read.plan_batch(client, options) == []
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("pattern 'clint-.*' matches no topic (the brokers have ")
    assert warning.endswith("): the read is empty")
