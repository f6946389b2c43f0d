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
import subprocess
import threading
import time
from collections import Counter

import pytest
from test_cli import CLI, ENV, broker_process, ok  # noqa: F401  (broker_process: a fixture)


class CooperativeConsumer:
    """A cooperative ``trio-coord consume --events json`` process, its events collected."""

    def __init__(self, bootstrap: str, session_timeout: float) -> None:
        self.process = subprocess.Popen(
            [
                *CLI,
                "consume",
                "t",
                "--group",
                "g",
                "--session-timeout",
                str(session_timeout),
                "--rebalance-protocol",
                "cooperative",
                "--events",
                "json",
                "-b",
                bootstrap,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=ENV,
        )
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self.events.append(json.loads(line))

    def owned(self, events: list[dict] | None = None) -> set[tuple[str, int]]:
        """What it owns: cooperative callbacks name only the partitions that change."""
        owned: set[tuple[str, int]] = set()
        for event in self.events if events is None else events:
            tps = {tuple(p) for p in event.get("partitions") or []}
            if event["event"] == "assigned":
                owned |= tps
            elif event["event"] in ("revoked", "lost"):
                owned -= tps
        return owned

    @property
    def member_id(self) -> str:
        return self.events[0]["member_id"] if self.events else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=10)
        self._reader.join(timeout=5)


def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"condition not met within {timeout}s"
        time.sleep(0.02)


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
