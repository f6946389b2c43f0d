"""Hostile and odd Kafka frames cost only their own connection, and answers keep their order.

Raw sockets against the Kafka listener: an oversized or negative frame
size, a truncated body, an API key or version kio has no schema for each
close that connection (with a log line) while the broker goes on serving;
an API or version the broker does not serve is answered with
UNSUPPORTED_VERSION and the connection stays usable; ApiVersions at an
unknown version gets Kafka's v0 answer. acks=0 gets no answer, and a
long-polling Fetch's answer comes before the answers to the requests
pipelined behind it. FindCoordinator answers one key (v3) and a batch (v4).
"""

from __future__ import annotations

import io
import socket
import struct
import time
from datetime import timedelta
from typing import Any

from kafka_fixtures import KafkaBroker, create_topic
from kio.index import load_request_schema
from kio.schema.fetch.v12 import request as f12
from kio.schema.produce.v9 import request as p9
from kio.serial import entity_reader, entity_writer

from trio_coord.kafka.codec import KafkaCode, response_schema
from trio_coord.kafka.records import encode_records
from trio_coord.protocol.records import WireRecord


def connect(broker: KafkaBroker) -> socket.socket:
    host, port = broker.kafka.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def request_frame(key: int, version: int, corr: int, body: Any) -> bytes:
    schema = load_request_schema(key, version)
    out = io.BytesIO()
    header = schema.__header_schema__
    entity_writer(header)(
        out,
        header(
            request_api_key=key, request_api_version=version, correlation_id=corr, client_id="t"
        ),
    )
    entity_writer(schema)(out, body)
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def raw_frame(key: int, version: int, corr: int, rest: bytes = b"") -> bytes:
    data = struct.pack(">hhih", key, version, corr, 1) + b"t" + rest
    return struct.pack(">i", len(data)) + data


def read_frame(sock: socket.socket) -> bytes | None:
    head = recv_exactly(sock, 4)
    if head is None:
        return None
    return recv_exactly(sock, struct.unpack(">i", head)[0])


def recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def read_response(sock: socket.socket, key: int, version: int) -> tuple[int, Any]:
    frame = read_frame(sock)
    assert frame is not None, "the connection closed"
    schema = response_schema(key, version)
    header, used = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, used)
    return header.correlation_id, body


def api_versions(version: int = 3) -> Any:
    schema = load_request_schema(18, version)
    if version >= 3:
        return schema(client_software_name="t", client_software_version="1")
    return schema()


def still_serving(broker: KafkaBroker) -> None:
    """A fresh connection is answered: the broker survived."""
    with connect(broker) as sock:
        sock.sendall(request_frame(18, 3, 7, api_versions()))
        corr, body = read_response(sock, 18, 3)
        assert corr == 7 and body.error_code == KafkaCode.none


def closed_by_broker(sock: socket.socket) -> bool:
    sock.settimeout(10)
    return read_frame(sock) is None


def test_oversized_and_negative_frames_close_only_their_connection(
    kafka_broker: KafkaBroker,
) -> None:
    """A 200 MiB or negative size is refused at once (nothing allocated, nothing read)."""
    for size in (200 * 1024 * 1024, -5):
        with connect(kafka_broker) as sock:
            sock.sendall(struct.pack(">i", size))
            assert closed_by_broker(sock)
        still_serving(kafka_broker)
    assert "a frame of 209715200 bytes" in kafka_broker.log_text()


def test_malformed_and_unknown_requests_close_only_their_connection(
    kafka_broker: KafkaBroker,
) -> None:
    """A truncated body, an unknown API key and an unknown version: closed, one log line."""
    frames = [
        raw_frame(3, 12, 1, b"\x05\x00"),  # Metadata v12, its topics array cut short
        raw_frame(9999, 0, 2),  # no such API
        raw_frame(0, 99, 3),  # Produce v99 does not exist
        struct.pack(">i", 3) + b"\x00\x03\x00",  # shorter than a request header
    ]
    for frame in frames:
        with connect(kafka_broker) as sock:
            sock.sendall(frame)
            assert closed_by_broker(sock)
        still_serving(kafka_broker)
    text = kafka_broker.log_text()
    assert "API key 9999 version 0 is not a Kafka request" in text
    assert "API key 0 version 99" in text


def test_unserved_versions_and_apis_get_an_error_answer(kafka_broker: KafkaBroker) -> None:
    """EndTxn and Produce v13: UNSUPPORTED_VERSION answers, and the connection lives on."""
    with connect(kafka_broker) as sock:
        # ApiVersions at a version nobody knows: Kafka's v0 answer with the list.
        sock.sendall(raw_frame(18, 99, 1))
        corr, body = read_response(sock, 18, 0)
        assert corr == 1 and body.error_code == KafkaCode.unsupported_version
        served = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        assert served[0] == (3, 11) and served[1] == (4, 12)
        end_txn = load_request_schema(26, 3)
        sock.sendall(
            request_frame(
                26,
                3,
                2,
                end_txn(transactional_id="x", producer_id=1, producer_epoch=0, committed=True),
            )
        )
        corr, body = read_response(sock, 26, 3)
        assert corr == 2 and body.error_code == KafkaCode.unsupported_version
        produce = load_request_schema(0, 13)
        sock.sendall(
            request_frame(0, 13, 4, produce(acks=1, timeout=timedelta(seconds=1), topic_data=()))
        )
        corr, body = read_response(sock, 0, 13)
        assert corr == 4 and body.responses == ()
        sock.sendall(request_frame(18, 3, 3, api_versions()))
        corr, body = read_response(sock, 18, 3)
        assert corr == 3 and body.error_code == KafkaCode.none


def test_acks_zero_gets_no_answer_and_order_is_kept(kafka_broker: KafkaBroker, topic: str) -> None:
    """acks=0 is not answered; a long-polling Fetch is answered before what follows it."""
    create_topic(kafka_broker.kafka, topic)
    batch = encode_records(0, [WireRecord(1_700_000_000_000, b"k", b"v", [])])

    body = p9.ProduceRequest(
        acks=0,
        timeout=timedelta(seconds=5),
        topic_data=(
            p9.TopicProduceData(
                name=topic, partition_data=(p9.PartitionProduceData(index=0, records=batch),)
            ),
        ),
    )
    fetch = f12.FetchRequest(
        max_wait=timedelta(milliseconds=700),
        min_bytes=10**6,
        topics=(
            f12.FetchTopic(
                topic=topic,
                partitions=(
                    f12.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=10**6),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    with connect(kafka_broker) as sock:
        started = time.monotonic()
        sock.sendall(
            request_frame(0, 9, 1, body)
            + request_frame(1, 12, 2, fetch)
            + request_frame(18, 3, 3, api_versions())
        )
        corr, answer = read_response(sock, 1, 12)
        assert corr == 2  # (no answer to 1: acks=0)
        assert time.monotonic() - started >= 0.6  # it waited for min_bytes until max_wait
        records = answer.responses[0].partitions[0].records
        assert records and len(records) == len(batch)
        corr, _ = read_response(sock, 18, 3)
        assert corr == 3


def test_find_coordinator_one_key_and_batched(kafka_broker: KafkaBroker) -> None:
    """v3 names the broker's Kafka listener for a group; v4 does so for each key of a batch."""
    host, port = kafka_broker.kafka.rsplit(":", 1)
    with connect(kafka_broker) as sock:
        v3 = load_request_schema(10, 3)
        sock.sendall(request_frame(10, 3, 1, v3(key="g", key_type=0)))
        corr, body = read_response(sock, 10, 3)
        assert corr == 1 and body.error_code == KafkaCode.none
        assert (body.host, body.port) == (host, int(port))
        v4 = load_request_schema(10, 4)
        sock.sendall(request_frame(10, 4, 2, v4(key_type=0, coordinator_keys=("a", "b", "c"))))
        corr, body = read_response(sock, 10, 4)
        assert corr == 2
        assert [(c.key, c.error_code, c.host, c.port) for c in body.coordinators] == [
            (k, KafkaCode.none, host, int(port)) for k in ("a", "b", "c")
        ]
        sock.sendall(request_frame(10, 4, 3, v4(key_type=1, coordinator_keys=("txn",))))
        corr, body = read_response(sock, 10, 4)
        assert body.coordinators[0].error_code == KafkaCode.coordinator_not_available


def test_pipelined_produce_requests_reach_the_log_in_order(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """Fifty Produce requests sent at once to one partition get offsets in request order."""
    create_topic(kafka_broker.kafka, topic)
    frames = b"".join(
        request_frame(
            0,
            9,
            100 + i,
            p9.ProduceRequest(
                acks=1,
                timeout=timedelta(seconds=10),
                topic_data=(
                    p9.TopicProduceData(
                        name=topic,
                        partition_data=(
                            p9.PartitionProduceData(
                                index=0,
                                records=encode_records(
                                    0, [WireRecord(1_700_000_000_000, None, b"%d" % i, [])]
                                ),
                            ),
                        ),
                    ),
                ),
            ),
        )
        for i in range(50)
    )
    with connect(kafka_broker) as sock:
        sock.sendall(frames)
        answers = [read_response(sock, 0, 9) for _ in range(50)]
    assert [corr for corr, _ in answers] == [100 + i for i in range(50)]
    offsets = [body.responses[0].partition_responses[0].base_offset for _, body in answers]
    assert offsets == list(range(50))
