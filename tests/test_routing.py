"""The routing policy both clients share: where a request goes, and what an error means next.

Pure (no sockets, no clock): a :class:`Routing` is fed Metadata answers and
asked where partitions live; :func:`classify` is asked what each error means.
The Trio and Spark clients' own tests (tests/test_bootstrap.py,
tests/spark/test_client_failover.py) check that they follow these answers.
"""

from __future__ import annotations

import pytest

from trio_coord._routing import Action, Routing, classify, coordinator_of
from trio_coord.protocol.errors import (
    BrokerShuttingDownError,
    ConnectionClosedError,
    CoordError,
    CoordinatorNotAvailableError,
    InvalidGroupIdError,
    NotCoordinatorError,
    NotLeaderForPartitionError,
    RebalanceInProgressError,
    RequestTimedOutError,
    ResourcesExhaustedError,
    UnknownServerError,
    UnknownTopicError,
    error_for,
)
from trio_coord.protocol.messages import BrokerInfo, MetadataResponse, TopicInfo, TopicPartition

B1 = BrokerInfo(1, "10.0.0.1", 9092)
B2 = BrokerInfo(2, "10.0.0.2", 9092)
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def _routing(*responses: MetadataResponse) -> Routing:
    routing = Routing()
    for response in responses:
        routing.learn(response)
    return routing


def test_a_moved_leader_is_forgotten_and_found_where_fresh_metadata_says():
    routing = _routing(MetadataResponse([B1, B2], [TopicInfo("t", 2, [1, 2])]))
    assert routing.leader_of(T0) == B1
    assert routing.leader_of(T1) == B2

    refused = NotLeaderForPartitionError("broker 1 no longer leads t-0")
    assert classify(refused) is Action.MOVED
    routing.forget("t")
    unknown = routing.leader_of(T0)
    assert isinstance(unknown, UnknownTopicError)  # (returned: ask Metadata, then look again)

    routing.learn(MetadataResponse([B1, B2], [TopicInfo("t", 2, [2, 2])]))
    assert routing.leader_of(T0) == B2
    assert routing.group_by_leader([T1, T0, T0]) == ({B2: [T0, T1]}, {})


def test_a_leader_not_among_the_live_brokers_yet_is_a_retriable_error_not_a_guess():
    # A cluster broker between ZooKeeper sessions names leader 2 but lists only broker 1.
    routing = _routing(MetadataResponse([B1], [TopicInfo("t", 2, [1, 2])]))
    found = routing.leader_of(T1)
    assert isinstance(found, NotLeaderForPartitionError)
    assert found.retriable and classify(found) is Action.MOVED
    assert str(found) == (
        "the leader of t-1 (broker 2) is not among the live brokers the metadata lists yet; retry"
    )
    grouped, unknown = routing.group_by_leader([T0, T1])
    assert grouped == {B1: [T0]} and list(unknown) == [T1]

    routing.learn(MetadataResponse([B1, B2], [TopicInfo("t", 2, [1, 2])]))
    assert routing.leader_of(T1) == B2


def test_no_leader_named_means_the_broker_that_answered_at_the_address_it_answered_at():
    # A single broker names no leaders (it holds every partition) and advertises the
    # address it is bound to, which may be a wildcard no client can reach.
    bound = BrokerInfo(1, "0.0.0.0", 9092)
    routing = Routing()
    routing.learn(MetadataResponse([bound], [TopicInfo("t", 2, [])]), ("broker.example", 9092))
    reached = BrokerInfo(1, "broker.example", 9092)
    assert routing.leader_of(T0) == reached == routing.leader_of(T1)
    assert routing.brokers == {1: reached}

    # Not knowing where the answer came from, the broker is taken as it advertises itself.
    alone = _routing(MetadataResponse([B1], [TopicInfo("t", 1, [])]))
    assert alone.leader_of(T0) == B1


def test_metadata_listing_no_live_broker_is_a_retriable_error_until_one_is_listed():
    routing = Routing()
    routing.learn(MetadataResponse([], [TopicInfo("t", 1, [])]), ("10.0.0.1", 9092))
    found = routing.leader_of(T0)
    assert isinstance(found, CoordinatorNotAvailableError) and found.retriable
    assert "knows no live brokers yet" in str(found)
    routing.learn(MetadataResponse([B1], [TopicInfo("t", 1, [])]))
    assert routing.leader_of(T0) == B1


def test_a_partition_the_topic_does_not_have_is_not_retriable_and_says_which_exist():
    routing = _routing(MetadataResponse([B1], [TopicInfo("two", 2, [1, 1])]))
    found = routing.leader_of(TopicPartition("two", 7))
    assert isinstance(found, UnknownTopicError)
    assert classify(found) is Action.FAIL
    assert str(found) == "topic 'two' has partitions 0..1; partition 7 does not exist"
    # The topic may have grown since: fresh metadata is believed.
    routing.learn(MetadataResponse([B1], [TopicInfo("two", 8, [1] * 8)]))
    assert routing.leader_of(TopicPartition("two", 7)) == B1


def test_leaders_a_start_fetchers_named_need_no_metadata_until_fresher_metadata_comes():
    routing = Routing()
    routing.learn_leaders([B1, B2], {T0: 2, T1: -1})
    assert routing.leader_of(T0) == B2  # no Metadata asked: the topic is not even known
    assert isinstance(routing.leader_of(T1), UnknownTopicError)  # -1: not live, ask Metadata
    routing.learn(MetadataResponse([B1, B2], [TopicInfo("t", 2, [1, 1])]))
    assert routing.leader_of(T0) == B1  # the metadata is fresher than the hint
    routing.learn_leaders([B2], {T0: 2})
    routing.forget("t")
    assert isinstance(routing.leader_of(T0), UnknownTopicError)  # forgotten, hints too


def test_a_broker_that_cannot_be_reached_forgets_every_topic():
    routing = _routing(MetadataResponse([B1], [TopicInfo("a", 1, [1]), TopicInfo("b", 1, [1])]))
    assert routing.topics == ["a", "b"]
    assert classify(ConnectionClosedError("lost the connection")) is Action.RECONNECT
    routing.forget_all()
    assert routing.topics == []
    assert routing.topic("a") is None


def test_a_moved_coordinator_is_found_where_the_metadata_says():
    refused = NotCoordinatorError("broker 1 was deposed; ask Metadata again")
    assert classify(refused) is Action.MOVED
    moved = MetadataResponse([B1, B2], [], coordinator=B2)
    assert coordinator_of(moved, "g", ("10.0.0.1", 9092)) == B2  # several: as advertised

    electing = MetadataResponse([B1, B2], [])
    none = coordinator_of(electing, "g")
    assert isinstance(none, CoordinatorNotAvailableError) and none.retriable
    assert classify(none) is Action.MOVED
    assert str(none) == (
        "the brokers that answered named no coordinator of group 'g' yet "
        "(is one being elected? see the brokers' logs)"
    )

    bound = BrokerInfo(1, "0.0.0.0", 7000)
    single = MetadataResponse([bound], [], coordinator=bound)
    assert coordinator_of(single, "g", ("broker.example", 7000)) == BrokerInfo(
        1, "broker.example", 7000
    )
    assert coordinator_of(single, "g") == bound


@pytest.mark.parametrize(
    ("error", "action"),
    [
        (NotLeaderForPartitionError(), Action.MOVED),
        (NotCoordinatorError(), Action.MOVED),
        (CoordinatorNotAvailableError(), Action.MOVED),
        (BrokerShuttingDownError(), Action.MOVED),  # its partitions and groups move away
        (ConnectionClosedError(), Action.RECONNECT),
        (RequestTimedOutError(), Action.RETRY),
        (RebalanceInProgressError(), Action.RETRY),
        (ResourcesExhaustedError(), Action.RETRY),
        (UnknownTopicError(), Action.FAIL),
        (InvalidGroupIdError(), Action.FAIL),
        (UnknownServerError(), Action.FAIL),
        (error_for(9999, "from a newer broker"), Action.FAIL),  # a code we do not know
        (ValueError("not a broker's answer"), Action.FAIL),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value.value,
)
def test_each_error_means_one_thing_for_the_next_try(error, action):
    assert classify(error) is action
    if isinstance(error, CoordError):
        assert (action is Action.FAIL) == (not error.retriable)
