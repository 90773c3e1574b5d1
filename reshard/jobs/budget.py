"""Capacity budget: token buckets for ``--max-wcu`` / ``--max-rcu`` with AIMD on throttling.

The budget is client-side, so it works the same on provisioned and on-demand tables.
It is the whole run's: every process of a run (on any host) is a member of the run's
budget row and paces at its *share* (:class:`reshard.control.budget.BudgetMembership`, the rules in
:mod:`reshard.core.shares`); AIMD below works within that share.

How a request is paced
    Before a request, the caller *reserves* an estimate of its cost (from item sizes,
    :mod:`reshard.core.capacity`). The bucket may go into debt; the caller
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

The pure logic (:class:`~reshard.core.capacity.TokenBucket`, :class:`~reshard.core.capacity.Aimd`)
lives in :mod:`reshard.core.capacity` with the unit rules; this module is the glue
(:meth:`CapacityBudget.attach` registers the Dynamo listeners).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

from reshard import errors
from reshard.core.capacity import UNIT, Aimd, Decision, TokenBucket

WRITE_OPERATIONS = frozenset({"batch_write_item", "put_item", "delete_item", "update_item"})


# --------------------------------------------------------------------------- the budget

class _Lane:
    def __init__(self, budget: float | None, kind: str, clock: Callable[[], float]):
        self.kind = kind
        self.bucket = TokenBucket(budget, clock)
        self.aimd = Aimd(budget, UNIT[kind], clock)
        self.recent: deque[tuple[float, float]] = deque()  # (time, units), the last few seconds
        self.consumed = 0.0
        self.paced_at = -1e18  # when a request last waited for the bucket (at the budget)
        self.budget = budget
        #: The run's budget when ``budget`` is this process's share of it (None: not shared).
        self.total: float | None = None
        #: When the last request reserved before the share shrank goes out (set_share).
        self.larger_until = -1e18
        #: Demand: requests inside spend() now, and when one last entered or left it.
        self.waiting = 0
        self.demand_at = clock()

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
        #: A member of a shared budget paces nothing after this instant of ``clock`` (its
        #: last beat's liveness window; :class:`BudgetMembership` sets it). None: not shared.
        self.valid_until: float | None = None
        #: The run is paused (``reshard pause``; :class:`reshard.control.records.Hold`): the segment
        #: engine sends no data write while it is set. The budget membership sets it every beat.
        self.hold = None
        #: lane -> who set the run's budget with ``reshard throttle`` ("" : the processes' options).
        self.set_by = {"write": "", "read": ""}
        #: Seconds requests waited for the budget (pacing and holds), for the job's metrics.
        self.waited = 0.0
        #: How long a request waits for a share before the page fails (BudgetUnavailable).
        self.hold_limit = 60.0
        self.hold_poll = 0.05
        #: Told, while a request is held without a share, what it waits for (progress reports
        #: rate-limit them); :class:`BudgetMembership` adds who holds the share (``hold_detail``).
        self.wait_listeners: list[Callable[[str], None]] = []
        self.hold_detail: Callable[[], str] | None = None
        #: Set by :meth:`stop` (Ctrl-C, SIGTERM): no request waits for capacity any more.
        self._stopped = threading.Event()
        self._paced_said = -1e18

    def stop(self) -> None:
        """The job is stopping: wake every request sleeping for capacity; it and every later
        one raises :class:`~reshard.errors.JobStopped` instead of being sent (its page is
        abandoned, not checkpointed: the next run redoes it)."""
        self._stopped.set()

    def _say_paced(self) -> None:
        """Requests wait for the budget (a page may take minutes at a low one): say so to the
        wait listeners, at most once a second (the progress line shows it between pages)."""
        if not self.wait_listeners:
            return
        now = self.clock()
        if now - self._paced_said < 1.0:
            return
        self._paced_said = now
        text = f"capacity: {self.throttle_reason()}"
        for fn in self.wait_listeners:
            fn(text)

    def _pause(self, seconds: float) -> None:
        """Sleep for the budget, cut short by :meth:`stop` (an injected ``sleep`` is called as is)."""
        if self.sleep is time.sleep:
            self._stopped.wait(seconds)
        else:
            self.sleep(seconds)
        if self._stopped.is_set():
            raise errors.JobStopped("the job is stopping: the request was not sent")

    # -- a share of a run's budget (BudgetMembership calls these)
    def set_share(self, kind: str, share: float, total: float) -> None:
        """Pace ``kind`` at ``share`` units/s of the run's ``total`` (0: send nothing until a share comes).

        A smaller share leaves the requests already reserved at the larger one on their
        schedule: :attr:`_Lane.larger_until` says when the last of them goes out, and the
        member writes the smaller share into the run's row only after that, so the shares
        in use never add up to more than the row's.
        """
        lane = self.lanes[kind]
        with self._lock:
            bucket = lane.bucket
            bucket._refill()
            if lane.budget is not None and share < lane.budget and bucket.rate:
                lane.larger_until = max(lane.larger_until, self.clock() + max(0.0, -bucket.tokens / bucket.rate))
            lane.total = total
            lane.budget = share
            lane.aimd.set_budget(share)
            bucket.set_rate(lane.aimd.rate)

    def larger_share_until(self, kind: str) -> float:
        """When the last request reserved at a larger share of ``kind`` than now is sent (``clock``)."""
        return self.lanes[kind].larger_until

    def share(self, kind: str) -> float | None:
        """This process's share of ``kind`` (None when the lane is not a shared budget)."""
        lane = self.lanes[kind]
        return lane.budget if lane.total is not None else None

    def idle(self, kind: str, after: float) -> bool:
        """No request of ``kind`` wanted capacity for ``after`` seconds (none waits now either):
        this process's share of the run's budget is better given to the others."""
        lane = self.lanes[kind]
        with self._lock:
            return lane.waiting == 0 and self.clock() - lane.demand_at > after

    def _held_back(self, lane: _Lane) -> str | None:
        """Why a request of ``lane`` may not be paced now (None: it may)."""
        if lane.total is None:
            return None
        if self.valid_until is not None and self.clock() > self.valid_until:
            return "this process's share of the run's budget lapsed (its budget row could not be refreshed)"
        if not lane.budget or lane.aimd.rate is None or lane.aimd.rate <= 0:
            return "no share of the run's budget is free yet (the other members shrink at their next refresh)"
        return None

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
        if self._stopped.is_set():
            raise errors.JobStopped("the job is stopping: the request was not sent")
        with self._lock:
            lane.waiting += 1  # demand (CapacityBudget.idle): held, or sleeping for the bucket
            lane.demand_at = self.clock()
        try:
            wait = self._admit(lane, estimate)
            if wait > 0:
                lane.paced_at = self.clock()
                with self._lock:
                    self.waited += wait
                self._pause(wait)
                self._say_paced()
        finally:
            with self._lock:
                lane.waiting -= 1
                lane.demand_at = self.clock()
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

    def _admit(self, lane: _Lane, estimate: float) -> float:
        """Reserve ``estimate`` units (returns how long to sleep), once the lane may pace at all."""
        held_since = None
        while True:
            with self._lock:
                why = self._held_back(lane)
                if why is None:
                    decision = lane.aimd.tick()
                    if decision:
                        lane.bucket.set_rate(lane.aimd.rate)
                        self._decided(decision)
                    wait = lane.bucket.reserve(estimate)
                    break
            # A member without a share (or whose share lapsed) sends nothing: the sum of the
            # shares in use stays within the run's budget (reshard.core.shares).
            now = self.clock()
            held_since = now if held_since is None else held_since
            if now - held_since > self.hold_limit:
                raise errors.BudgetUnavailable(f"waited {self.hold_limit:g}s for capacity: {why}")
            lane.paced_at = now
            if self.wait_listeners:
                detail = self.hold_detail() if self.hold_detail else ""
                text = f"waiting {now - held_since:.0f}s for {lane.kind} capacity: {why}" + (
                    f"; {detail}" if detail else "")
                for fn in self.wait_listeners:
                    fn(text)
            with self._lock:
                self.waited += self.hold_poll
            self._pause(self.hold_poll)
        return wait

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

    def throttle_reason(self, recent: float = 5.0) -> str:
        """Why the job goes slower than it could *now*, for ``status`` and the progress line:
        AIMD backing off after DynamoDB throttled, or requests waiting at --max-wcu/--max-rcu;
        else the latest decision (what happened last), or "" if the budget never acted."""
        now = self.clock()
        hold = self.hold
        if hold is not None:
            return hold.reason()
        with self._lock:
            for kind, option in (("write", "--max-wcu"), ("read", "--max-rcu")):
                if self.set_by.get(kind):
                    option += f" (set by `reshard throttle`, {self.set_by[kind]})"
                lane = self.lanes[kind]
                aimd = lane.aimd
                if aimd.rate is not None and aimd.ceiling is not None and aimd.rate < aimd.ceiling:
                    return (f"AIMD backing off after DynamoDB throttled: {kind}s at {aimd.rate:.0f} of "
                            f"{aimd.ceiling:.0f} {aimd.unit}/s, climbing back")
                if lane.total is not None and (why := self._held_back(lane)):
                    return f"at {option} {lane.total:g} for the whole run: {why}"
                if lane.budget is not None and now - lane.paced_at <= recent:
                    if lane.total is not None:
                        return (f"at {option} {lane.total:g} for the whole run: this process's share "
                                f"{lane.budget:g} {UNIT[kind]}/s; requests wait for it")
                    return f"at {option} {lane.budget:g}: requests wait for the budget"
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

