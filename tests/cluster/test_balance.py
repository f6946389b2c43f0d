"""The slot-balancing rules every broker computes from the same view of the cluster.

Pure: :func:`claimants` says who claims each vacant slot and :func:`shedder`
which single broker gives a slot up. A simulation of brokers acting together
on each still view shows that a broker joining takes its share with every
slot moving at most once, and the counts end at most one apart.
"""

from __future__ import annotations

import pytest

from trio_coord.broker.cluster import claimants, shedder


def held(counts: dict[int, int]) -> dict[int, int]:
    """Slot → holder, the slots numbered in broker order."""
    holders = {}
    for broker, count in sorted(counts.items()):
        for _ in range(count):
            holders[len(holders)] = broker
    return holders


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({1: 6, 2: 6, 3: 4}, 1),  # two could shed: only the lowest id of the most
        ({1: 6, 2: 7, 3: 4}, 2),  # the most
        ({1: 6, 2: 5, 3: 5}, None),  # as even as it gets
        ({1: 8, 2: 8}, None),
        ({1: 16, 2: 0}, 1),
    ],
)
def test_only_the_broker_holding_the_most_sheds(counts, expected):
    slots = sum(counts.values())
    assert shedder(counts, held(counts), slots) == expected


def test_nobody_sheds_while_slots_are_vacant():
    holders = held({1: 7, 2: 0})
    assert shedder([1, 2], holders, 8) is None
    assert claimants([1, 2], holders, 8) == {7: 2}


def test_claims_go_to_the_fewest_lowest_id_first():
    holders = {0: 1, 1: 1, 2: 2}
    assert claimants([1, 2, 3], holders, 6) == {3: 3, 4: 2, 5: 3}


def balance(brokers: list[int], holders: dict[int, int], slots: int) -> list[int]:
    """Let every broker act on each view, as they would all at once; the slots moved."""
    moved = []
    for _ in range(10 * slots):
        claims = claimants(brokers, holders, slots)
        if claims:
            holders.update(claims)
            continue
        broker = shedder(brokers, holders, slots)
        if broker is None:
            return moved
        slot = max(s for s, b in holders.items() if b == broker)
        del holders[slot]
        moved.append(slot)
    raise AssertionError(f"no balance reached: {holders}")


@pytest.mark.parametrize(
    ("before", "joiner", "expected"),
    [
        ({1: 8, 2: 8}, 3, [5, 5, 6]),
        ({1: 16}, 2, [8, 8]),
        ({1: 6, 2: 5, 3: 5}, 4, [4, 4, 4, 4]),
        ({1: 4, 2: 4, 3: 4}, 4, [3, 3, 3, 3]),
    ],
)
def test_a_joining_broker_takes_its_share_each_slot_moving_once(before, joiner, expected):
    slots = sum(before.values())
    holders = held(before)
    brokers = [*before, joiner]
    moved = balance(brokers, holders, slots)
    counts = [sum(1 for b in holders.values() if b == broker) for broker in brokers]
    assert sorted(counts) == expected
    assert len(moved) == len(set(moved))  # no slot moved twice
    # Exactly the joiner's share moved: every slot given up went to it.
    assert len(moved) == counts[-1]
    assert all(holders[slot] == joiner for slot in moved)
