"""Cooperative rebalancing with real processes: ``trio-coord consume --rebalance-protocol
cooperative``, one of three consumers killed with SIGKILL.

The survivors end up owning every partition exactly once, as with eager
rebalancing, but they are never stopped: after the kill, their event streams
show only the victim's partitions being *added* (``assigned``), no
``revoked`` and no ``lost``; and ``groups describe`` agrees with them.
"""

from __future__ import annotations

import json
import signal
from collections import Counter

import pytest
from test_cli import (  # noqa: F401  (broker_process: a fixture)
    ConsumerProcess,
    broker_process,
    ok,
    wait_for,
)


class CooperativeConsumer(ConsumerProcess):
    """A cooperative ``trio-coord consume --events json`` process (topic t, group g)."""

    def __init__(self, bootstrap: str, session_timeout: float) -> None:
        super().__init__(
            bootstrap, "t", "g", session_timeout, "--rebalance-protocol", "cooperative"
        )

    def owned(self, events: list[dict] | None = None) -> set[tuple[str, int]]:
        """What it owns (after ``events`` only, if given): cooperative callbacks name only
        the partitions that change."""
        owned: set[tuple[str, int]] = set()
        for event in self.events if events is None else events:
            tps = {tuple(p) for p in event.get("partitions") or []}
            if event["event"] == "assigned":
                owned |= tps
            elif event["event"] in ("revoked", "lost"):
                owned -= tps
        return owned


@pytest.mark.slow
def test_sigkill_in_a_cooperative_group_stops_none_of_the_survivors(broker_process):  # noqa: F811
    bootstrap = broker_process
    ok("topics", "create", "t", "--partitions", "12", "-b", bootstrap)
    consumers = [CooperativeConsumer(bootstrap, 3.0) for _ in range(3)]

    def exactly_once(members) -> bool:
        counts = Counter(tp for c in members for tp in c.owned())
        return counts == Counter({("t", p): 1 for p in range(12)})

    try:
        wait_for(lambda: exactly_once(consumers) and all(c.owned() for c in consumers), 20.0)
        victim, survivors = consumers[1], [consumers[0], consumers[2]]
        lost = victim.owned()
        marks = [len(c.events) for c in survivors]
        victim.process.send_signal(signal.SIGKILL)
        wait_for(lambda: exactly_once(survivors), 20.0)
        after = [c.events[mark:] for c, mark in zip(survivors, marks, strict=True)]
        assert all(e["event"] == "assigned" for events in after for e in events), after
        gained = set().union(*(c.owned(events) for c, events in zip(survivors, after, strict=True)))
        assert gained == lost  # only the victim's partitions moved
        described = json.loads(ok("groups", "describe", "g", "--json", "-b", bootstrap))
        assert described["state"] == "STABLE" and described["assignor"] == "uniform"
        assert {m["rebalance_protocol"] for m in described["members"]} == {"cooperative"}
        by_member = {
            m["member_id"]: {tuple(p) for p in m["partitions"]} for m in described["members"]
        }
        assert by_member == {c.member_id: c.owned() for c in survivors}
    finally:
        for consumer in consumers:
            if consumer.process.poll() is None:
                consumer.stop()
