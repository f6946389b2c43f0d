"""A member hands out no record once its lease has run out, not even one already buffered.

The lease is the member's side of the fence (invariant 1): the coordinator
may give its partitions to another member from the moment the lease ends.
The consumer's watchdog drops the partitions when it wakes at that moment,
but under load it wakes a little later; records buffered before were handed
out in between (the hardening chaos test caught one, handed out at the very
end of its ownership). The fetcher now hands out nothing while the lease
does not hold, and looks again when it is renewed.
"""

from __future__ import annotations

import trio
import trio.testing

from trio_coord.client._fetcher import Fetcher, FetchSettings
from trio_coord.protocol.messages import (
    FetchedBatch,
    FetchedPartition,
    FetchResponse,
    TopicPartition,
)
from trio_coord.protocol.records import WireRecord, encode_batch

TP = TopicPartition("t", 0)


def _buffered(fetcher: Fetcher) -> None:
    fetcher.assign({TP: 0})
    batch = encode_batch([WireRecord(1, None, b"a"), WireRecord(1, None, b"b")])
    answer = FetchResponse([FetchedPartition("t", 0, 0, "", 0, 2, [FetchedBatch(0, 2, batch)])])
    fetcher._absorb(answer, {TP: fetcher._parts[TP].epoch})


async def test_buffered_records_wait_while_the_lease_does_not_hold(autojump_clock) -> None:
    lease = {"holds": False}
    fetcher = Fetcher(FetchSettings())
    fetcher.may_hand_out = lambda: lease["holds"]
    _buffered(fetcher)
    got: list[bytes] = []

    async def read() -> None:
        got.extend(r.value for r in await fetcher.next_records(10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.sleep(5)
        assert got == [], "nothing is handed out without a lease"
        lease["holds"] = True
        fetcher.wake()  # (a renewed lease)
        await trio.testing.wait_all_tasks_blocked()
    assert got == [b"a", b"b"]


async def test_without_a_guard_records_are_handed_out_at_once() -> None:
    fetcher = Fetcher(FetchSettings())
    _buffered(fetcher)
    with trio.fail_after(1):
        assert [r.value for r in await fetcher.next_records(10)] == [b"a", b"b"]
