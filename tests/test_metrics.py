"""/metrics: a real HTTP client scrapes it, prometheus_client's parser reads it.

What an operator graphs must be there and true: connections, groups by state,
members, heartbeats, rebalances by cause with their durations (a crash among
them), produced and fetched bytes per topic, log end offsets, committed
offsets and lag per group and partition, memory and GC time.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from trio_coord import GroupEvent, open_admin, open_broker, open_consumer, open_producer
from trio_coord.broker.events import Stable


def _scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _consume_with_kafka(bootstrap: str, count: int) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "metrics-reader"})
    try:
        consumer.assign([TopicPartition("orders", 0, 0)])
        got = 0
        for _ in range(200):
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                got += 1
                if got == count:
                    return
        raise AssertionError(f"read {got} of {count} records with confluent-kafka")
    finally:
        consumer.close()


def _produce_with_kafka(bootstrap: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce("orders", b"kafka %d" % i, partition=0)
    assert producer.flush(15) == 0


def _value(samples: list, name: str, **labels: str) -> float:
    (found,) = [s.value for s in samples if s.name == name and s.labels == labels]
    return found


async def test_metrics_describe_the_broker_as_it_runs(tmp_path) -> None:
    events: list[GroupEvent] = []
    settings = dict(
        metrics_port=0, kafka_port=0, initial_rebalance_delay=0.0, on_event=events.append
    )
    async with open_broker(tmp_path, **settings) as broker:  # type: ignore[arg-type]
        assert broker.metrics_address is not None
        host, port = broker.metrics_address
        url = f"http://{host}:{port}/metrics"
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("orders", 2)
        async with open_producer(broker.bootstrap) as producer:
            for i in range(10):
                await producer.send("orders", f"order {i}", partition=i % 2)
        opts = dict(offset_reset="earliest", session_timeout=1.0)
        async with open_consumer(broker.bootstrap, "billing", ["orders"], **opts) as consumer:
            seen = 0
            with trio.fail_after(10):
                while seen < 10:
                    seen += len(await consumer.getmany())
            await consumer.commit()
            async with open_consumer(broker.bootstrap, "billing", ["orders"], **opts) as other:
                await other.wait_assigned()
            with trio.fail_after(10):
                while len(consumer.assignment) != 2:
                    await trio.sleep(0.02)
            await trio.sleep(0.5)  # (a few heartbeats)
            # A Kafka producer's records count as produced too (and are lag for billing).
            assert broker.kafka_address is not None
            kafka = f"{broker.kafka_address[0]}:{broker.kafka_address[1]}"
            await trio.to_thread.run_sync(_produce_with_kafka, kafka, 4)
            # ... and a Kafka consumer's fetches count as fetched: partition 0's 5 + 4 records.
            await trio.to_thread.run_sync(_consume_with_kafka, kafka, 9)
            metrics = await trio.to_thread.run_sync(_scrape, url)

    assert _value(metrics["trio_coord_connections"], "trio_coord_connections") >= 1
    parked = _value(metrics["trio_coord_parked_connections"], "trio_coord_parked_connections")
    assert 0 <= parked <= _value(metrics["trio_coord_connections"], "trio_coord_connections")
    assert _value(metrics["trio_coord_groups"], "trio_coord_groups", state="STABLE") == 1
    members = metrics["trio_coord_group_members"]
    assert _value(members, "trio_coord_group_members", group="billing") == 1
    assert _value(metrics["trio_coord_heartbeats"], "trio_coord_heartbeats_total") > 0
    rebalances = metrics["trio_coord_rebalance_duration_seconds"]
    joins = _value(rebalances, "trio_coord_rebalance_duration_seconds_count", cause="join")
    leaves = _value(rebalances, "trio_coord_rebalance_duration_seconds_count", cause="leave")
    assert joins >= 2 and leaves >= 1
    assert _value(rebalances, "trio_coord_rebalance_duration_seconds_sum", cause="join") > 0
    # The metrics and on_event hear the same typed events: one Stable per rebalance counted.
    counted = sum(s.value for s in rebalances if s.name.endswith("_count"))
    stables = [e for e in events if isinstance(e, Stable) and e.group == "billing"]
    assert counted == len(stables) and {e.cause for e in stables} >= {"join", "leave"}
    commits = metrics["trio_coord_offset_commit_duration_seconds"]
    assert _value(commits, "trio_coord_offset_commit_duration_seconds_count") >= 1
    sizes = metrics["trio_coord_offset_commit_partitions"]
    # consumer.commit() carried both partitions (positions handed back are not commits)
    assert _value(sizes, "trio_coord_offset_commit_partitions_bucket", le="2.0") >= 1
    writes = metrics["trio_coord_store_write_duration_seconds"]
    assert _value(writes, "trio_coord_store_write_duration_seconds_count") >= 2
    records = metrics["trio_coord_store_write_records"]
    assert _value(records, "trio_coord_store_write_records_sum") >= 3  # topic, 2 offsets
    produced = metrics["trio_coord_produced_records"]
    assert _value(produced, "trio_coord_produced_records_total", topic="orders") == 14
    fetched = metrics["trio_coord_fetched_records"]
    assert _value(fetched, "trio_coord_fetched_records_total", topic="orders") >= 10 + 9
    ends = metrics["trio_coord_log_end_offset"]
    assert [
        _value(ends, "trio_coord_log_end_offset", topic="orders", partition=p) for p in "01"
    ] == [
        9,
        5,
    ]
    for p, lag in (("0", 4), ("1", 0)):
        labels = dict(group="billing", topic="orders", partition=p)
        committed = metrics["trio_coord_group_committed_offset"]
        assert _value(committed, "trio_coord_group_committed_offset", **labels) == 5
        assert _value(metrics["trio_coord_group_lag"], "trio_coord_group_lag", **labels) == lag
    assert (
        _value(metrics["trio_coord_resident_memory_bytes"], "trio_coord_resident_memory_bytes") > 0
    )
    assert "trio_coord_gc_seconds" in metrics


async def test_the_endpoint_answers_only_get_metrics_and_survives_junk(tmp_path) -> None:
    async with open_broker(tmp_path, metrics_port=0) as broker:
        host, port = broker.metrics_address  # type: ignore[misc]

        def ask(path: str) -> int:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert await trio.to_thread.run_sync(ask, "/nope") == 404
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"x" * 20_000)  # no end of header in sight: refused, not kept
        answer = await stream.receive_some(1000)
        assert answer.startswith(b"HTTP/1.1 431")
        await stream.aclose()
        assert await trio.to_thread.run_sync(ask, "/metrics") == 200


def test_a_port_in_use_for_metrics_is_named(tmp_path) -> None:
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]

    async def start() -> None:
        async with open_broker(tmp_path, metrics_port=port):
            pass

    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}.*--metrics-port"):
            trio.run(start)
    finally:
        held.close()


async def test_a_member_failing_mid_rebalance_counts_as_a_crash_restart(autojump_clock) -> None:
    # The group task's RebalanceRestarted and Stable events are what the metrics count:
    # b hangs on its StopFetchers, then its connection drops. (The exposition is read from
    # the broker's registry directly: this test runs on the virtual clock.)
    from broker.harness import (
        FakeMember,
        Recorder,
        connected,
        ephemeral_broker,
        heartbeat_forever,
    )

    rec = Recorder()
    async with ephemeral_broker(on_event=rec, metrics_port=0) as broker:
        await broker.topics.create_topic("t", 4)
        a, b, c = (FakeMember(broker, "g", ["t"], name=n) for n in "abc")
        async with connected(a), connected(b), connected(c), trio.open_nursery() as nursery:
            await a.join()
            nursery.start_soon(heartbeat_forever, a, 1.0)
            await rec.wait_for("stable", generation=1)
            await b.join()
            await rec.wait_for("stable", generation=2)
            b.hold_stop = True
            mark = rec.mark()
            await c.join()
            nursery.start_soon(heartbeat_forever, c, 1.0)
            await rec.wait_for("rebalance_started", since=mark)
            await b.crash()
            await rec.wait_for("rebalance_restarted", since=mark, cause="crash")
            await rec.wait_for("stable", since=mark)
            assert broker.metrics is not None
            text = broker.metrics.render().decode()  # (before the members go away)
            nursery.cancel_scope.cancel()
    metrics = {f.name: f.samples for f in text_string_to_metric_families(text)}
    restarts = metrics["trio_coord_rebalance_restarts"]
    assert _value(restarts, "trio_coord_rebalance_restarts_total", cause="crash") == 1
    assert _value(restarts, "trio_coord_rebalance_restarts_total", cause="join") == 0
    durations = metrics["trio_coord_rebalance_duration_seconds"]
    # Two joins completed (a, b); the third rebalance, restarted by b's crash, completed
    # as a crash rebalance once b's lease ended.
    assert _value(durations, "trio_coord_rebalance_duration_seconds_count", cause="join") == 2
    assert _value(durations, "trio_coord_rebalance_duration_seconds_count", cause="crash") == 1


async def test_without_on_event_the_metrics_get_events_without_partition_lists(
    autojump_clock, monkeypatch
) -> None:
    # Building a rebalance's partition lists is O(partitions) on the group's task: a broker
    # whose only listeners are its metrics (and collector) does not build them.
    from broker.harness import FakeMember, connected, ephemeral_broker

    from trio_coord.broker.events import Stable
    from trio_coord.broker.server import Broker

    seen: list[Stable] = []
    original = Broker._group_event

    def spy(self: Broker, event: object) -> None:
        if isinstance(event, Stable):
            seen.append(event)
        original(self, event)  # type: ignore[arg-type]

    monkeypatch.setattr(Broker, "_group_event", spy)
    async with ephemeral_broker(metrics_port=0) as broker:
        await broker.topics.create_topic("t", 4)
        member = FakeMember(broker, "g", ["t"], name="a")
        async with connected(member):
            await member.join()
            with trio.fail_after(10):
                while not seen:
                    await trio.sleep(0.01)
            assert broker.metrics is not None
            text = broker.metrics.render().decode()
    assert seen[0].ownership == {}  # (an on_event would have seen all four partitions)
    metrics = {f.name: f.samples for f in text_string_to_metric_families(text)}
    durations = metrics["trio_coord_rebalance_duration_seconds"]
    assert _value(durations, "trio_coord_rebalance_duration_seconds_count", cause="join") == 1
