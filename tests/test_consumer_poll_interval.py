"""``max_poll_interval``: an application that stops asking for records gives its partitions up.

Real consumers and a real broker in this process, connected by in-memory
streams (``memory_network``) so that the whole exchange runs on Trio's
virtual clock and the test can check the exact time the stalled member
leaves: ``max_poll_interval`` after its application last got records. (As
in ``broker/test_fetch_longpoll.py``, the log is kept off worker threads
while the clock matters, which autojump would otherwise jump across: writes
are acknowledged without waiting for an fsync, and the partitions' logs are
created before the consumers start.) The
other member takes the partitions at once (not a session timeout later) and
gets the record the stalled one was still processing again; a commit from
the stalled member fails, saying why; asking for records again rejoins.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from broker.harness import Recorder, _WholeSends, ephemeral_broker

from trio_coord import (
    Broker,
    ConsumerState,
    TopicPartition,
    UnknownMemberError,
    open_admin,
    open_consumer,
    open_producer,
)
from trio_coord.log import LogConfig
from trio_coord.protocol.records import ConsumerRecord


@asynccontextmanager
async def memory_network(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """Route the clients' TCP connects to ``broker`` over in-memory streams."""
    async with trio.open_nursery() as nursery:

        async def open_tcp_stream(host: str, port: int, **_: object) -> trio.abc.Stream:
            if (host, port) != tuple(broker.address):
                raise OSError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
            client, server = trio.testing.memory_stream_pair()
            nursery.start_soon(broker.serve_stream, _WholeSends(server))
            return _WholeSends(client)

        monkeypatch.setattr(trio, "open_tcp_stream", open_tcp_stream)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def ephemeral_broker_on(
    partitions: int, monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> AsyncIterator[Broker]:
    """An ephemeral broker on the memory network, with topic ``t`` and its (empty) logs."""
    async with (
        ephemeral_broker(
            log=LogConfig(flush_interval=3600, retention_seconds=None), **settings
        ) as broker,
        memory_network(broker, monkeypatch),
    ):
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", partitions)
        for partition in range(partitions):
            await broker.logs.create("t", partition)  # (a worker thread: before any timer)
        yield broker


async def wait_until(predicate, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def owns_everything(consumers, partitions: int) -> bool:
    owners = Counter(tp for c in consumers for tp in c.assignment)
    return all(c.state is ConsumerState.STABLE for c in consumers) and owners == Counter(
        TopicPartition("t", p) for p in range(partitions)
    )


async def test_a_stalled_application_leaves_at_max_poll_interval_and_rejoins_when_it_asks(
    autojump_clock, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="trio_coord.client.consumer")
    events = Recorder()
    revoked: list[tuple[float, list[TopicPartition]]] = []
    opts = dict(session_timeout=3.0, max_poll_interval=10.0, offset_reset="earliest")
    async with ephemeral_broker_on(2, monkeypatch, on_event=events) as broker:
        bootstrap = broker.bootstrap
        async with (
            open_producer(bootstrap) as producer,
            open_consumer(
                bootstrap,
                "g",
                ["t"],
                on_revoked=lambda ps: revoked.append((trio.current_time(), ps)),
                **opts,
            ) as stalled,
            open_consumer(bootstrap, "g", ["t"], **opts) as healthy,
            trio.open_nursery() as nursery,
        ):
            read: list[ConsumerRecord] = []

            async def keep_reading() -> None:  # waiting in here stops its clock
                async for record in healthy:
                    read.append(record)

            nursery.start_soon(keep_reading)
            await wait_until(lambda: owns_everything([stalled, healthy], 2))
            states = [stalled.state]

            async def follow_states() -> None:
                while True:
                    states.append(await stalled.wait_state_change())

            nursery.start_soon(follow_states)
            for p in range(2):
                await producer.send("t", f"first {p}", partition=p)
            (record,) = await stalled.getmany()
            got_at = trio.current_time()
            owned = sorted(stalled.assignment)
            member = stalled.member_id

            # The application now takes a minute over this record, and never asks.
            removed = await events.wait_for("removed", member_id=member)
            assert trio.current_time() == got_at + 10.0
            assert removed["reason"] == (
                "left the group: the application did not ask for records within "
                "max_poll_interval (10s)"
            )
            assert revoked[-1] == (got_at + 10.0, owned)  # revoked cleanly, at that moment
            await stalled.wait_state(ConsumerState.UNJOINED)  # (once LeaveGroup is answered)
            assert trio.current_time() == got_at + 10.0 and stalled.assignment == {}
            (warning,) = [r.getMessage() for r in caplog.records]
            assert warning == (
                f"consumer {member} of group g: the application has not asked for records "
                "for 10s (max_poll_interval); leaving the group so that its 1 partition(s) go "
                "to other members. It rejoins when the application asks for records again. If "
                "processing a batch takes this long, process faster, lower the batch "
                "(getmany(max_records=...)) or raise max_poll_interval"
            )
            # The other member takes them at once (its session timeout is 3 s), and is
            # given the record the stalled one had not finished again (at least once).
            await wait_until(lambda: owns_everything([healthy], 2))
            assert trio.current_time() < got_at + 10.0 + 0.1
            await wait_until(lambda: (record.partition, record.offset) in _where(read))
            # Its commit fails, saying why, rather than losing the offsets silently.
            with pytest.raises(UnknownMemberError, match=r"max_poll_interval \(10s\)"):
                await stalled.commit()

            # Back at last: asking for records rejoins the group.
            await trio.sleep(50.0)
            again: list[ConsumerRecord] = []

            async def ask_again() -> None:
                again.extend(await stalled.getmany())

            nursery.start_soon(ask_again)
            await wait_until(lambda: owns_everything([stalled, healthy], 2))
            assert stalled.member_id not in ("", member)
            for p in range(2):
                await producer.send("t", f"second {p}", partition=p)
            await wait_until(lambda: bool(again))
            assert [r.value for r in again] == [f"second {again[0].partition}".encode()]
            await stalled.commit()  # a member again
            # Its states, in order: it left (UNJOINED), then joined anew (REBALANCING,
            # holding nothing) and was started (STABLE).
            assert states == ["STABLE", "UNJOINED", "REBALANCING", "STABLE"]
            nursery.cancel_scope.cancel()


def _where(records: list[ConsumerRecord]) -> set[tuple[int, int]]:
    return {(r.partition, r.offset) for r in records}


async def test_an_application_waiting_for_records_is_never_left(autojump_clock, monkeypatch):
    # The clock runs only while no application task is inside a call: a consumer with
    # nothing to read, waiting in getmany for 15 minutes, stays in the group.
    opts = dict(session_timeout=3.0, max_poll_interval=10.0)
    async with ephemeral_broker_on(1, monkeypatch) as broker:
        async with open_consumer(broker.bootstrap, "g", ["t"], **opts) as consumer:
            await consumer.wait_assigned()
            member = consumer.member_id
            with trio.move_on_after(900.0):
                await consumer.getmany()
            assert consumer.state is ConsumerState.STABLE
            assert consumer.member_id == member


def test_max_poll_interval_is_validated():
    with pytest.raises(ValueError, match=r"max_poll_interval must be positive \(seconds\), not 0"):
        open_consumer("127.0.0.1:1", "g", ["t"], max_poll_interval=0)
