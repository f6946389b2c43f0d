"""Per-principal quotas: produce and fetch byte rates and request rates, as in Kafka's design.

Its one job is the throttle decision. :class:`Quotas` measures, per
principal, the bytes it produced and fetched and the requests it sent (a
count, where Kafka's request quota measures handler time) over a sliding set of one-second
windows (Kafka's ``quota.window.num`` x ``quota.window.size.seconds``: 11 x
1 s); when a request takes a principal over its rate, the answer to it is
delayed by the time that brings the measured rate back to the quota
(``(rate - quota) / quota * measured span``, at most :data:`MAX_THROTTLE`),
and Kafka answers carry that time as ``throttle_time_ms``. A delayed answer
holds one of the connection's in-flight slots, so a producer or consumer
over its quota slows down without the broker buffering more for it. The
state per principal is two small rings of numbers; principals are bounded
by the users in the store (or are one, ``User:ANONYMOUS``, without logins).
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["MAX_THROTTLE", "Quotas"]

WINDOW: Final = 1.0
WINDOWS: Final = 11
MAX_THROTTLE: Final = 30.0
"""The longest one answer is delayed (seconds)."""
_MAX_PRINCIPALS: Final = 100_000


class _Rate:
    """Amounts in the last :data:`WINDOWS` windows of :data:`WINDOW` seconds."""

    __slots__ = ("first", "samples", "start")

    def __init__(self, now: float) -> None:
        self.first = now
        self.start = now - now % WINDOW
        self.samples: deque[float] = deque([0.0], maxlen=WINDOWS)

    def add(self, amount: float, now: float) -> float:
        """Record ``amount`` at ``now``; the rate per second over the measured span."""
        while now >= self.start + WINDOW:
            self.start += WINDOW
            self.samples.append(0.0)
            if len(self.samples) == WINDOWS and now >= self.start + WINDOW * WINDOWS:
                self.start = now - now % WINDOW  # (idle for long: start afresh)
                self.samples = deque([0.0], maxlen=WINDOWS)
        self.samples[-1] += amount
        return sum(self.samples) / self.span(now)

    def span(self, now: float) -> float:
        """The seconds the samples cover (at least one window, never before the first use)."""
        covered = (len(self.samples) - 1) * WINDOW + (now - self.start)
        return max(WINDOW, min(covered, now - self.first + WINDOW))


class Quotas:
    """Byte-rate and request-rate quotas per principal (None: no quota of that kind)."""

    def __init__(
        self,
        *,
        produce_bytes_per_s: float | None = None,
        fetch_bytes_per_s: float | None = None,
        requests_per_s: float | None = None,
    ) -> None:
        self.limits = {
            "produce": produce_bytes_per_s,
            "fetch": fetch_bytes_per_s,
            "request": requests_per_s,
        }
        for name, value in self.limits.items():
            if value is not None and not value > 0:
                raise ValueError(f"the {name} quota must be a positive rate (per second)")
        self._rates: dict[tuple[str, str], _Rate] = {}
        self.throttled = 0
        """Answers delayed so far (for metrics and tests)."""

    @property
    def enabled(self) -> bool:
        """True if any quota is set."""
        return any(v is not None for v in self.limits.values())

    @property
    def requests(self) -> bool:
        """True if requests are counted (a request-rate quota is set)."""
        return self.limits["request"] is not None

    def record(self, principal: str, kind: str, amount: int, now: float) -> float:
        """Count ``amount`` (bytes, or 1 request) of ``kind`` ("produce", "fetch",
        "request") for ``principal``; the seconds to delay the answer."""
        quota = self.limits.get(kind)
        if quota is None or amount <= 0:
            return 0.0
        key = (principal, kind)
        rate = self._rates.get(key)
        if rate is None:
            if len(self._rates) >= _MAX_PRINCIPALS:
                self._rates.clear()  # (bounded: forget everyone rather than grow)
            rate = self._rates[key] = _Rate(now)
        observed = rate.add(amount, now)
        if observed <= quota:
            return 0.0
        self.throttled += 1
        return min(MAX_THROTTLE, (observed - quota) / quota * rate.span(now))
