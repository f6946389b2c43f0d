"""One watcher per group expires members whose session passed, in deadline order.

The per-member task and cancel scope it replaced expired each member exactly at
its deadline; so must the shared structure, whatever the mix of session
timeouts, renewals and departures.
"""

from __future__ import annotations

import trio

from trio_coord.broker.liveness import Liveness


async def test_members_expire_at_their_deadlines_whatever_their_timeouts(autojump_clock):
    expired: list[tuple[str, float]] = []
    liveness = Liveness(lambda m: expired.append((m, trio.current_time())))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(liveness.run)
        liveness.watch("slow", 10.0)
        liveness.watch("a", 3.0)
        liveness.watch("b", 3.0)
        await trio.sleep(1.0)
        liveness.renew("a")  # a's deadline: 4.0
        liveness.watch("quick", 0.5)  # earlier than anything: the watcher wakes for it
        liveness.watch("gone", 0.2)
        liveness.forget("gone")
        await trio.sleep(20.0)
        nursery.cancel_scope.cancel()
    assert expired == [("quick", 1.5), ("b", 3.0), ("a", 4.0), ("slow", 10.0)]
    assert len(liveness) == 0


async def test_a_renewed_member_never_expires(autojump_clock):
    expired: list[str] = []
    liveness = Liveness(expired.append)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(liveness.run)
        liveness.watch("m", 1.0)
        for _ in range(100):
            await trio.sleep(0.9)
            liveness.renew("m")
        assert expired == [] and liveness.deadline("m") == trio.current_time() + 1.0
        nursery.cancel_scope.cancel()
