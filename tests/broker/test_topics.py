"""Topic changes are checked and written one at a time: concurrent ones cannot shrink a topic."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import trio

from trio_coord import InvalidPartitionsError, TopicAlreadyExistsError, UnknownTopicError
from trio_coord.broker.topics import subscription_patterns
from trio_coord.protocol.errors import InvalidRequestError

from .harness import ephemeral_broker


@pytest.fixture
def slow_store(monkeypatch):
    """Make every store write of the broker passed in take 0.1 s of virtual time."""

    def slow(broker):
        real_multi = broker.store.multi

        async def multi(ops):
            await trio.sleep(0.1)
            return await real_multi(ops)

        monkeypatch.setattr(broker.store, "multi", multi)

    return slow


async def test_concurrent_add_partitions_never_shrink_a_topic(autojump_clock, slow_store):
    async with ephemeral_broker() as broker:
        await broker.topics.create_topic("t", 3)
        slow_store(broker)
        outcomes: dict[int, object] = {}

        async def grow(total):
            try:
                outcomes[total] = await broker.topics.add_partitions("t", total)
            except InvalidPartitionsError as exc:
                outcomes[total] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(grow, 10)
            nursery.start_soon(grow, 5)
        # Whichever ran first, the topic ends at 10: growing to 5 either came first or
        # was refused, never applied after 10.
        assert broker.topics.partitions["t"] == 10
        assert outcomes[10].partitions == 10


async def test_concurrent_creates_of_one_topic_one_wins(autojump_clock, slow_store):
    async with ephemeral_broker() as broker:
        slow_store(broker)
        errors = []

        async def create(partitions):
            try:
                await broker.topics.create_topic("u", partitions)
            except TopicAlreadyExistsError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, 4)
            nursery.start_soon(create, 2)
        winner = broker.topics.partitions["u"]
        assert winner in (2, 4)
        assert len(errors) == 1
        assert f"exists already with {winner} partitions" in str(errors[0])


async def test_topic_errors_say_what_to_do(autojump_clock):
    async with ephemeral_broker(max_partitions=100) as broker:
        with pytest.raises(UnknownTopicError, match="create it first"):
            await broker.topics.add_partitions("missing", 2)
        await broker.topics.create_topic("t", 2)
        with pytest.raises(InvalidPartitionsError, match="never removed"):
            await broker.topics.add_partitions("t", 1)
        with pytest.raises(InvalidPartitionsError, match="between 1 and 100"):
            await broker.topics.create_topic("big", 101)


def test_a_subscription_pattern_is_re2_and_cannot_stall_the_broker():
    # With Python's backtracking re, this pattern over this name takes longer than
    # the age of the universe, on the broker's one event-loop thread. Run in a child
    # so that a regression fails here instead of hanging the suite.
    script = textwrap.dedent(
        """
        from trio_coord.broker.topics import subscription_patterns
        (pattern,) = subscription_patterns([r"re:(\\w+)*-events"])
        print(pattern.fullmatch("payments_ledger_shard_01" * 8 + "-logs") is None)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "True"


def test_a_pattern_re2_cannot_run_is_refused_with_what_to_write():
    with pytest.raises(InvalidRequestError, match=r"RE2 .*no backreferences"):
        subscription_patterns([r"re:(orders)-\1"])
    with pytest.raises(InvalidRequestError, match="longer than 1000"):
        subscription_patterns(["re:" + "a" * 1001])
    (pattern,) = subscription_patterns(["re:orders-.*"])
    assert pattern.fullmatch("orders-eu") and not pattern.fullmatch("my-orders-eu")


async def test_topic_ids_persist_and_a_recreated_topic_gets_a_new_one(tmp_path):
    """A topic's id is random, kept across growth and restarts, new when it is recreated."""
    from trio_coord import open_broker

    async with open_broker(tmp_path / "data") as broker:
        first = (await broker.topics.create_topic("t", 2)).topic_id
        assert len(first) == 32 and int(first, 16)
        assert (await broker.topics.add_partitions("t", 3)).topic_id == first
    async with open_broker(tmp_path / "data") as broker:
        assert broker.topics.info("t").topic_id == first
        await broker.topics.delete_topic("t")
        again = (await broker.topics.create_topic("t", 1)).topic_id
        assert again not in ("", first)


def test_a_topic_record_from_before_topic_ids_reads_and_keeps_a_derived_id():
    """Old data dirs hold topic records without an id: they decode, the topic gets the id
    derived from its name (what Kafka clients were told before), and keeps it."""
    import msgspec

    from trio_coord.broker.topics import TopicManager
    from trio_coord.core.records import TopicRecord, decode_record, topic_id_of

    old = decode_record(msgspec.msgpack.encode(["topic", "t", 2, []]))
    assert old == TopicRecord("t", 2, [], "")
    manager = TopicManager(None)  # type: ignore[arg-type]  (replay writes nothing)
    manager.replay(old)
    derived = manager.ids["t"]
    assert derived == topic_id_of(old) and len(derived) == 32
    manager.replay(TopicRecord("t", 4, [], ""))
    assert (manager.partitions["t"], manager.ids["t"]) == (4, derived)
    assert manager.current("t") == TopicRecord("t", 4, [], derived)
