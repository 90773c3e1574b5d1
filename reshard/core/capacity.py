"""Capacity rules: what DynamoDB charges for a request, and the pure pacing logic.

The unit rules are DynamoDB's (a write: 1 WCU per started KB; a read: 1 RCU per started
4 KB, half when eventually consistent; a Scan: its bytes in 4 KB units). ``plan``
estimates with them and the jobs' budget reserves with them, so both agree.

:class:`TokenBucket` and :class:`Aimd` take an injected clock; the budget that wires
them to DynamoDB's answers is :class:`reshard.jobs.budget.CapacityBudget`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from reshard.core.layout import item_size

KB = 1024
UNIT = {"write": "WCU", "read": "RCU"}
OPERATION_NAMES = {"batch_write_item": "BatchWriteItem", "put_item": "PutItem", "delete_item": "DeleteItem",
                   "update_item": "UpdateItem", "batch_get_item": "BatchGetItem", "scan": "Scan",
                   "get_item": "GetItem", "query": "Query"}


# --------------------------------------------------------------------------- unit rules

def write_units(size_bytes: int) -> int:
    """WCU of one write of an item this size: ceil(size / 1 KB), at least 1."""
    return max(1, math.ceil(size_bytes / KB))


def read_units(size_bytes: int, consistent: bool = True) -> float:
    """RCU of one single-item read: ceil(size / 4 KB), halved when eventually consistent."""
    units = max(1, math.ceil(size_bytes / (4 * KB)))
    return units if consistent else units / 2


def scan_units(total_bytes: float, consistent: bool = False) -> float:
    """RCU of a Scan over this many bytes: 1 per started 4 KB, halved when eventually consistent."""
    units = math.ceil(total_bytes / (4 * KB))
    return units if consistent else units / 2


def items_write_units(items: Iterable[Mapping]) -> float:
    """WCU of writing each of ``items`` once."""
    return float(sum(write_units(item_size(i)) for i in items))


def items_read_units(items: Iterable[Mapping], consistent: bool = True) -> float:
    """RCU of reading each of ``items`` with a single-item read."""
    return float(sum(read_units(item_size(i), consistent) for i in items))


def page_scan_units(n_items: int, avg_item_bytes: float, consistent: bool = False) -> float:
    """RCU to reserve for a Scan page of ``n_items`` (at least one 4 KB unit)."""
    return max(scan_units(4 * KB, consistent), scan_units(n_items * avg_item_bytes, consistent))


# --------------------------------------------------------------------------- pure logic

class TokenBucket:
    """A reserve-then-sleep token bucket; ``rate=None`` means unlimited.

    ``reserve(n)`` takes ``n`` tokens (going into debt if needed) and returns how long
    the caller must wait before acting. ``burst_seconds`` caps the saved-up tokens, so
    an idle spell does not allow a burst above the budget.
    """

    def __init__(self, rate: float | None, clock: Callable[[], float], burst_seconds: float = 0.5):
        self.rate = rate
        self.clock = clock
        self.burst_seconds = burst_seconds
        self.tokens = 0.0
        self.last = clock()

    def _refill(self) -> None:
        now = self.clock()
        if self.rate is not None:
            self.tokens = min(self.tokens + (now - self.last) * self.rate, self.rate * self.burst_seconds)
        self.last = now

    def reserve(self, n: float) -> float:
        self._refill()
        if self.rate is None:
            return 0.0
        self.tokens -= n
        return max(0.0, -self.tokens / self.rate)

    def try_take(self, n: float) -> bool:
        """Take ``n`` tokens if the bucket holds them, else take nothing and say False (a server
        admitting a request). A request bigger than the bucket can hold is admitted when the
        bucket is full, going into debt."""
        self._refill()
        if self.rate is None:
            return True
        if self.tokens < min(n, self.rate * self.burst_seconds):
            return False
        self.tokens -= n
        return True

    def adjust(self, delta: float) -> None:
        """Charge (positive) or refund (negative) units after the fact."""
        self._refill()
        if self.rate is None:
            return
        self.tokens = min(self.tokens - delta, self.rate * self.burst_seconds)

    def set_rate(self, rate: float | None) -> None:
        self._refill()
        self.rate = rate
        if rate is None:
            self.tokens = 0.0


@dataclass(frozen=True)
class Decision:
    """One budget decision: when, which lane, the new rate, and why."""

    at: float
    kind: str
    rate: float | None
    reason: str


class Aimd:
    """Additive-increase / multiplicative-decrease of one lane's allowed rate.

    The defaults (×0.7 at most once per 2 s, +10 % of the ceiling per second) settle, under
    throttling that never stops whatever the rate, at about two thirds of the ceiling
    (r = 0.7 r + 0.2 C); real throttling stops once the rate is below the table's capacity,
    so the rate then climbs back. Halving every second instead drove a copy under a steady
    trickle of throttles down to its floor.
    """

    def __init__(self, budget: float | None, unit: str, clock: Callable[[], float], *,
                 decrease: float = 0.7, increase_fraction: float = 0.1, cooldown: float = 2.0,
                 min_fraction: float = 0.02, min_observed: float = 20.0):
        self.budget = budget
        self.min_observed = min_observed
        self.unit = unit
        self.clock = clock
        self.decrease = decrease
        self.increase_fraction = increase_fraction
        self.cooldown = cooldown
        self.min_fraction = min_fraction
        self.rate = budget
        self.ceiling = budget  # where additive increase stops (the budget, or the pre-throttle rate)
        self._last_decrease = -math.inf
        self._last_tick = clock()

    def on_throttle(self, operation: str, observed_rate: float) -> Decision | None:
        """A throttle answer: halve the rate (once per cooldown)."""
        now = self.clock()
        self.tick()
        if now - self._last_decrease < self.cooldown:
            return None
        self._last_decrease = now
        op = OPERATION_NAMES.get(operation, operation)
        before = self.rate
        if before is None:  # no budget: start from what we were actually consuming
            if observed_rate < self.min_observed:
                # Too little history to estimate a rate (e.g. the first request was throttled):
                # leave the pacing to the per-request backoff rather than crawl at ~0.
                return Decision(now, self.unit, None, f"throttled on {op}: no budget set and too little "
                                                      "traffic to size one; retrying with backoff")
            self.ceiling = observed_rate
            before = self.ceiling
        floor = (self.budget or self.ceiling) * self.min_fraction
        self.rate = max(floor, before * self.decrease)
        return Decision(now, self.unit, self.rate,
                        f"throttled on {op}: rate {_fmt(before)} → {_fmt(self.rate)} {self.unit}/s")

    def set_budget(self, budget: float) -> None:
        """A new budget (this process's share of a run's budget changed): a rate backing off
        after a throttle keeps its fraction of the budget, otherwise it is the new budget."""
        if self.budget and self.rate is not None and self.ceiling is not None and self.rate < self.ceiling:
            self.rate = self.rate * budget / self.budget
        else:
            self.rate = budget
        self.budget = self.ceiling = budget

    def tick(self) -> Decision | None:
        """Additive increase for the time since the last tick; a Decision when back at the ceiling."""
        now = self.clock()
        elapsed, self._last_tick = now - self._last_tick, now
        if self.rate is None or self.ceiling is None or self.rate >= self.ceiling:
            return None
        self.rate = min(self.ceiling, self.rate + self.ceiling * self.increase_fraction * elapsed)
        if self.rate >= self.ceiling:
            self.rate = self.budget  # None again when there was no budget
            shown = f"{_fmt(self.ceiling)} {self.unit}/s" if self.budget else "unlimited"
            return Decision(now, self.unit, self.rate, f"no throttling since the last decrease: rate back to {shown}")
        return None


def _fmt(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"
