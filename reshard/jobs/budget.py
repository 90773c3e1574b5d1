"""Capacity budget: token buckets for ``--max-wcu`` / ``--max-rcu`` with AIMD on throttling.

The budget is client-side, so it works the same on provisioned and on-demand tables.
Each host running a job enforces its own budget (the options say "per host").

How a request is paced
    Before a request, the caller *reserves* an estimate of its cost (from item sizes,
    :func:`write_units` / :func:`read_units`). The bucket may go into debt; the caller
    sleeps until the debt is paid at the allowed rate (reserve-then-sleep, so
    concurrent threads are scheduled one after another instead of all waking at
    once). When the answer reports ``ConsumedCapacity`` (we always ask for ``TOTAL``),
    the actual units are charged and the estimate refunded; a backend that reports
    nothing leaves the estimate charged. Over any window the units charged therefore
    track the budget, and they are the units DynamoDB itself counted.

AIMD
    A throttle (``ProvisionedThroughputExceededException`` & co. or
    ``UnprocessedItems``) halves the allowed rate (at most once per ``cooldown``
    seconds, since one overload produces many throttles at once); every second without
    one adds ``increase_fraction`` of the budget back, up to the budget. Without a
    budget, the first throttle sets the rate to half of what was consumed over the
    last seconds, and the rate returns to "unlimited" once it has climbed back to that
    level. Every decision has a human reason (``throttled on BatchWriteItem: rate 400 →
    200 WCU/s``) that the segment records keep and ``status`` shows.

Pure logic (:class:`TokenBucket`, :class:`Aimd`) takes an injected clock; the thin
glue (:meth:`CapacityBudget.attach`) registers the Dynamo listeners.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

from reshard.core.layout import item_size

WRITE_OPERATIONS = frozenset({"batch_write_item", "put_item", "delete_item", "update_item"})
_OPERATION_NAMES = {"batch_write_item": "BatchWriteItem", "put_item": "PutItem", "delete_item": "DeleteItem",
                    "update_item": "UpdateItem", "batch_get_item": "BatchGetItem", "scan": "Scan",
                    "get_item": "GetItem", "query": "Query"}
UNIT = {"write": "WCU", "read": "RCU"}


# --------------------------------------------------------------------------- estimates

def write_units(items: Iterable[Mapping]) -> float:
    """WCU of writing ``items``: 1 per started KB each."""
    return float(sum(max(1, math.ceil(item_size(i) / 1024)) for i in items))


def read_units(items: Iterable[Mapping], consistent: bool = True) -> float:
    """RCU of reading ``items`` one by one: 1 per started 4 KB (half when eventually consistent)."""
    units = sum(max(1, math.ceil(item_size(i) / 4096)) for i in items)
    return float(units if consistent else units / 2)


def scan_units(n_items: int, avg_item_bytes: float, consistent: bool = False) -> float:
    """RCU of a Scan page: its bytes in 4 KB units (half when eventually consistent)."""
    units = max(1, math.ceil(n_items * avg_item_bytes / 4096))
    return float(units if consistent else units / 2)


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
        op = _OPERATION_NAMES.get(operation, operation)
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


# --------------------------------------------------------------------------- the budget

class _Lane:
    def __init__(self, budget: float | None, kind: str, clock: Callable[[], float]):
        self.kind = kind
        self.bucket = TokenBucket(budget, clock)
        self.aimd = Aimd(budget, UNIT[kind], clock)
        self.recent: deque[tuple[float, float]] = deque()  # (time, units), the last few seconds
        self.consumed = 0.0

    def observed_rate(self, now: float, window: float = 5.0) -> float:
        while self.recent and self.recent[0][0] < now - window:
            self.recent.popleft()
        if not self.recent:
            return 0.0
        span = max(1.0, now - self.recent[0][0])
        return sum(u for _, u in self.recent) / span


class CapacityBudget:
    """Read and write budgets of one job on one host (thread-safe).

    Use :meth:`spend` around every data-table call; :meth:`attach` wires the Dynamo
    listeners that report actual consumed capacity and throttles.
    """

    def __init__(self, max_wcu: float | None = None, max_rcu: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.clock = clock
        self.sleep = sleep
        self.lanes = {"write": _Lane(max_wcu, "write", clock), "read": _Lane(max_rcu, "read", clock)}
        self.decisions: deque[Decision] = deque(maxlen=50)
        self.listeners: list[Callable[[Decision], None]] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self.table: str | None = None

    # -- glue
    def attach(self, dynamo, table: str) -> "CapacityBudget":
        """Listen to ``dynamo``'s consumed capacity (for ``table`` only) and throttles."""
        self.table = table
        dynamo.add_capacity_listener(self._on_capacity)
        dynamo.add_throttle_listener(self.on_throttle)
        return self

    # -- pacing
    @contextmanager
    def spend(self, kind: str, estimate: float) -> Iterator[None]:
        """Wait for ``estimate`` units of ``kind`` ('read'/'write'), then run the block.

        Units reported by the block's calls replace the estimate; if none are
        reported the estimate stands as the charge.
        """
        lane = self.lanes[kind]
        with self._lock:
            decision = lane.aimd.tick()
            if decision:
                lane.bucket.set_rate(lane.aimd.rate)
                self._decided(decision)
            wait = lane.bucket.reserve(estimate)
        if wait > 0:
            self.sleep(wait)
        local = self._local
        local.kind, local.observed = kind, 0.0
        try:
            yield
        finally:
            observed = local.observed
            local.kind = None
            with self._lock:
                if observed > 0:
                    lane.bucket.adjust(-estimate)  # refund: the actual units were charged already
                else:
                    self._record(lane, estimate)
            self._page_add(kind, observed if observed > 0 else estimate)

    def _on_capacity(self, table: str, units: float) -> None:
        kind = getattr(self._local, "kind", None)
        if kind is None or (self.table and table and table != self.table):
            return
        self._local.observed += units
        lane = self.lanes[kind]
        with self._lock:
            lane.bucket.adjust(units)
            self._record(lane, units)

    def _record(self, lane: _Lane, units: float) -> None:
        lane.consumed += units
        lane.recent.append((self.clock(), units))

    def on_throttle(self, operation: str) -> None:
        """A throttle answer from DynamoDB (or UnprocessedItems): multiplicative decrease.

        Only calls made inside :meth:`spend` (on this thread) count: those are the job's
        data-table calls. A throttled control-table write (a checkpoint, a lease) says
        nothing about the data table's capacity and must not slow the copy down.
        """
        kind = getattr(self._local, "kind", None)
        if kind is None:
            return
        lane = self.lanes[kind]
        with self._lock:
            decision = lane.aimd.on_throttle(operation, lane.observed_rate(self.clock()))
            if decision:
                lane.bucket.set_rate(lane.aimd.rate)
                self._decided(decision)

    def _decided(self, d: Decision) -> None:
        self.decisions.append(d)
        for fn in self.listeners:
            fn(d)

    # -- reporting
    def latest_reason(self) -> str:
        return self.decisions[-1].reason if self.decisions else ""

    def rate(self, kind: str) -> float | None:
        return self.lanes[kind].aimd.rate

    def consumed(self) -> dict:
        return {"rcu": round(self.lanes["read"].consumed, 1), "wcu": round(self.lanes["write"].consumed, 1)}

    def _page_add(self, kind: str, units: float) -> None:
        usage = getattr(self._local, "usage", None)
        if usage is None:
            usage = self._local.usage = {"read": 0.0, "write": 0.0}
        usage[kind] += units

    def take_usage(self) -> dict:
        """Units this thread spent since the last call (for per-page counters)."""
        usage = getattr(self._local, "usage", None) or {"read": 0.0, "write": 0.0}
        self._local.usage = {"read": 0.0, "write": 0.0}
        return {"rcu": usage["read"], "wcu": usage["write"]}
