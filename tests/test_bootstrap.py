"""Finding brokers: bootstrap parsing, connection errors, telling the user while retrying,
and partition leaders that metadata does not (yet) place on a live broker."""

from __future__ import annotations

import logging

import pytest
import trio

from trio_coord import ConnectionClosedError
from trio_coord.client._bootstrap import Answer, Bootstrap, parse_bootstrap
from trio_coord.client._cluster import ClusterView
from trio_coord.protocol import MetadataRequest
from trio_coord.protocol.connection import connect_tcp
from trio_coord.protocol.errors import (
    CoordinatorNotAvailableError,
    NotLeaderForPartitionError,
    UnknownTopicError,
)
from trio_coord.protocol.messages import BrokerInfo, MetadataResponse, TopicInfo, TopicPartition


def test_bootstrap_lists_parse_and_refuse_what_is_not_host_port():
    assert parse_bootstrap("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap(["[::1]:9192"]) == [("::1", 9192)]
    for bad in ("", "host", "host:", ":1", "host:port", "host:70000"):
        with pytest.raises(ValueError, match=r"host:port|empty"):
            parse_bootstrap(bad)


async def test_a_refused_connection_says_why_and_what_to_check():
    with pytest.raises(ConnectionClosedError) as info:
        await connect_tcp("127.0.0.1", 1)
    assert str(info.value) == (
        "cannot connect to 127.0.0.1:1 (Connection refused); is a broker running there?"
    )


async def test_retrying_without_a_broker_warns_then_keeps_trying(autojump_clock, caplog):
    caplog.set_level(logging.WARNING, logger="trio_coord.client._bootstrap")
    with trio.move_on_after(40.0):
        await Bootstrap("127.0.0.1:1").metadata(MetadataRequest(topics=[]))
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings, "a user waiting on a missing broker must be told"
    assert warnings[0].startswith("no broker has answered for ")
    assert "(127.0.0.1:1 — connection refused)" in warnings[0]
    assert "still trying" in warnings[0]
    assert len(warnings) == 2  # then once every 30 s, not at every retry


class _ScriptedBootstrap(Bootstrap):
    """Answers Metadata with the given responses in turn (the last one from then on)."""

    def __init__(self, *answers: MetadataResponse) -> None:
        super().__init__("127.0.0.1:1")
        self.answers = list(answers)
        self.asked = 0
        self.at: tuple[str, int] | None = None  # where the answers come from, if known

    async def metadata_once(self, request: MetadataRequest) -> Answer:
        self.asked += 1
        return Answer(self.answers.pop(0) if len(self.answers) > 1 else self.answers[0], self.at)


B1, B2 = BrokerInfo(1, "127.0.0.1", 9001), BrokerInfo(2, "127.0.0.1", 9002)


async def test_a_leader_missing_from_the_live_brokers_is_retriable_then_found():
    # A cluster broker between ZooKeeper sessions lists the topic's leaders but no brokers.
    between = MetadataResponse([], [TopicInfo("t", 2, [1, 2])])
    back = MetadataResponse([B1, B2], [TopicInfo("t", 2, [1, 2])])
    bootstrap = _ScriptedBootstrap(between, back)
    async with trio.open_nursery() as nursery:
        view = ClusterView(bootstrap, nursery)
        with pytest.raises(NotLeaderForPartitionError, match=r"2\) is not among the live") as e:
            await view.leader(TopicPartition("t", 1))
        assert e.value.retriable
        # Asked once (the topic was not known): an answer that is fresh and still does not
        # place the leader goes to the caller, who backs off before asking again.
        assert bootstrap.asked == 1
        assert await view.leader(TopicPartition("t", 1)) == B2
        assert await view.leader(TopicPartition("t", 0)) == B1


async def test_metadata_listing_no_live_broker_is_retriable_not_a_stop_iteration():
    nobody = MetadataResponse([], [TopicInfo("t", 1, [])])
    bootstrap = _ScriptedBootstrap(nobody)
    async with trio.open_nursery() as nursery:
        view = ClusterView(bootstrap, nursery)
        with pytest.raises(CoordinatorNotAvailableError, match="knows no live brokers") as e:
            await view.leader(TopicPartition("t", 0))
        assert e.value.retriable
        bootstrap.answers = [MetadataResponse([B1], [TopicInfo("t", 1, [])])]
        assert await view.leader(TopicPartition("t", 0)) == B1


async def test_partitions_grouped_by_leader_ask_metadata_once_for_every_unknown_topic():
    answer = MetadataResponse([B1, B2], [TopicInfo("a", 2, [1, 2]), TopicInfo("b", 1, [2])])
    bootstrap = _ScriptedBootstrap(answer)
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    async with trio.open_nursery() as nursery:
        view = ClusterView(bootstrap, nursery)
        asked_for = (tp for tp in [b0, a1, a0, a0])  # (a generator: Admin passes one)
        assert await view.by_leader(asked_for) == {B1: [a0], B2: [a1, b0]}
        assert bootstrap.asked == 1
        with pytest.raises(UnknownTopicError, match="partition 5 does not exist"):
            await view.by_leader([a0, TopicPartition("a", 5)])


async def test_a_single_broker_is_reached_where_it_answered_not_where_it_is_bound():
    # A lone broker bound to a wildcard address advertises it; its clients reach it where
    # the bootstrap list found it, for its partitions and as the coordinator of its groups.
    bound = BrokerInfo(1, "0.0.0.0", 9001)
    bootstrap = _ScriptedBootstrap(
        MetadataResponse([bound], [TopicInfo("t", 1, [])], coordinator=bound)
    )
    bootstrap.at = ("127.0.0.1", 9001)
    async with trio.open_nursery() as nursery:
        view = ClusterView(bootstrap, nursery)
        assert await view.leader(TopicPartition("t", 0)) == B1
        assert await bootstrap.find_coordinator("g") == B1


def test_the_retry_policy_doubles_to_its_maximum_with_jitter_and_starts_again_after_success():
    """One policy for the Trio and the Spark clients: 0.05 s, doubling, capped, ±20%."""
    from trio_coord._retry import RetryPolicy

    policy = RetryPolicy(initial=0.05, maximum=0.3)
    currents, delays = [], []
    for _ in range(5):
        currents.append(policy.current)
        delays.append(policy.next_delay())
    assert currents == [0.05, 0.1, 0.2, 0.3, 0.3]
    assert all(0.8 * c <= d <= 1.2 * c for c, d in zip(currents, delays, strict=True))
    policy.reset()
    assert policy.current == 0.05
