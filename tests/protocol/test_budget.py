"""ByteBudget: takers wait while it is spent, are woken when bytes come back, and one
charge larger than the whole budget goes alone rather than never."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_coord.protocol.budget import ByteBudget


def test_try_take_takes_what_is_free_and_nothing_else() -> None:
    budget = ByteBudget(100)
    assert budget.try_take(60) == 60
    assert budget.try_take(50) == 0 and budget.used == 60
    assert budget.try_take(40) == 40 and budget.spent
    budget.give(100)
    assert budget.try_take(10**9) == 100, "an oversized charge goes, alone"
    with pytest.raises(ValueError):
        ByteBudget(0)


async def test_a_taker_waits_until_enough_is_given_back(autojump_clock) -> None:
    budget = ByteBudget(100)
    assert await budget.take(80) == 80
    taken_at = []

    async def taker() -> None:
        await budget.take(50)
        taken_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(taker)
        await trio.sleep(1)
        budget.give(10)  # 30 free: not enough yet
        await trio.sleep(1)
        budget.give(70)
    assert taken_at == [2.0] and budget.used == 50
