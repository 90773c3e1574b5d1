"""Pure logic: token bucket, AIMD, budget accounting (fake clock), lease decisions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reshard.core.capacity import Aimd, TokenBucket, items_read_units, items_write_units, page_scan_units
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import FREE, SegmentRecord, lease_decision
from reshard.core.leases import ASSUMED_LEASE_SECONDS, ASSUMED_MAX_REQUEST_SECONDS, LeaseWatch, quiet_remaining


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_token_bucket_paces_to_the_rate_and_caps_bursts():
    clock = FakeClock()
    b = TokenBucket(100.0, clock, burst_seconds=0.5)
    assert b.reserve(50) == pytest.approx(0.5)       # starts empty: 50 units need 0.5 s
    clock.t += 0.5
    assert b.reserve(100) == pytest.approx(1.0)      # reservations queue behind each other
    clock.t += 100                                    # a long idle spell saves at most 0.5 s of tokens
    assert b.reserve(50) == 0 and b.reserve(100) == pytest.approx(1.0)


def test_token_bucket_adjust_charges_actual_units():
    clock = FakeClock()
    b = TokenBucket(10.0, clock)
    b.reserve(5)
    b.adjust(-5)                                      # estimate refunded ...
    b.adjust(20)                                      # ... actual charged
    assert b.reserve(0) == pytest.approx(2.0)


def test_unlimited_bucket_never_waits():
    b = TokenBucket(None, FakeClock())
    assert b.reserve(1e9) == 0


def test_aimd_halves_once_per_cooldown_and_climbs_back_additively():
    clock = FakeClock()
    a = Aimd(400.0, "WCU", clock, decrease=0.5, increase_fraction=0.05, cooldown=1.0)
    d = a.on_throttle("batch_write_item", observed_rate=390)
    assert d.reason == "throttled on BatchWriteItem: rate 400 → 200 WCU/s" and a.rate == 200
    assert a.on_throttle("batch_write_item", 390) is None and a.rate == 200   # same overload
    clock.t += 1.5                                    # +5 % of the budget per second meanwhile
    assert a.on_throttle("put_item", 190).reason == "throttled on PutItem: rate 230 → 115 WCU/s"
    clock.t += 5
    assert a.tick() is None and a.rate == pytest.approx(115 + 400 * 0.05 * 5)
    clock.t += 100
    d = a.tick()
    assert a.rate == 400 and "rate back to 400 WCU/s" in d.reason


def test_aimd_without_budget_starts_from_the_observed_rate_and_returns_to_unlimited():
    clock = FakeClock()
    a = Aimd(None, "RCU", clock, decrease=0.5)
    assert a.rate is None
    d = a.on_throttle("scan", observed_rate=300)
    assert a.rate == 150 and d.reason == "throttled on Scan: rate 300 → 150 RCU/s"
    clock.t += 60
    assert "unlimited" in a.tick().reason and a.rate is None
    clock.t += 5
    d = a.on_throttle("scan", observed_rate=3)       # too little traffic to size a rate from
    assert a.rate is None and "retrying with backoff" in d.reason


def test_aimd_never_goes_below_the_floor():
    clock = FakeClock()
    a = Aimd(100.0, "WCU", clock, min_fraction=0.1, increase_fraction=0.0)
    for _ in range(20):
        clock.t += 2
        a.on_throttle("batch_write_item", 0)
    assert a.rate == pytest.approx(10.0)


def test_budget_charges_reported_units_or_else_the_estimate():
    clock = FakeClock()
    budget = CapacityBudget(max_wcu=100, clock=clock, sleep=clock.sleep)
    budget.table = "T"
    with budget.spend("write", 10):
        budget._on_capacity("T", 25.0)          # the answer said 25
        budget._on_capacity("other", 99.0)      # another table's units are not ours
    with budget.spend("write", 10):
        pass                                     # no ConsumedCapacity: the estimate stands
    assert budget.consumed()["wcu"] == 35
    assert budget.take_usage() == {"rcu": 0.0, "wcu": 35.0}
    with budget.spend("write", 100):
        pass
    # 35 + 100 units at 100/s from an empty bucket: the last request waited until 1.35 s.
    assert clock.t - 100.0 == pytest.approx(1.35, abs=0.01)


def test_budget_throttle_records_a_reason_and_tells_listeners():
    clock = FakeClock()
    budget = CapacityBudget(max_wcu=400, max_rcu=100, clock=clock, sleep=clock.sleep)
    heard = []  # default AIMD: x0.7 per throttle
    budget.listeners.append(heard.append)
    budget.on_throttle("update_item")  # outside spend(): a control-table call, not the data table
    assert budget.rate("write") == 400 and heard == []
    with budget.spend("write", 1):
        budget.on_throttle("batch_write_item")
    with budget.spend("read", 1):
        budget.on_throttle("batch_get_item")
    assert budget.rate("write") == 280 and budget.rate("read") == 70
    assert budget.latest_reason() == "throttled on BatchGetItem: rate 100 → 70 RCU/s"
    assert [d.reason for d in heard][0] == "throttled on BatchWriteItem: rate 400 → 280 WCU/s"


def test_capacity_estimates_follow_dynamodb_units():
    small = {"PK": {"S": "a"}, "v": {"S": "x" * 100}}
    big = {"PK": {"S": "a"}, "v": {"S": "x" * 5000}}
    assert items_write_units([small, big]) == 1 + 5
    assert items_read_units([small, big]) == 1 + 2 and items_read_units([big], consistent=False) == 1
    assert page_scan_units(100, 1024) == 12.5


REC = dict(segment=3, exists=True, owner="h:1:inv:0", lease_expires=200.0, lease_counter=4)


@pytest.mark.parametrize("rec,unchanged,claim,reason", [
    (SegmentRecord(3), 0, True, "new"),
    (SegmentRecord(**{**REC, "owner": FREE}), 0, True, "free"),
    (SegmentRecord(**REC), 99.9, False, "leased by h:1:inv:0"),
    (SegmentRecord(**REC), 100, True, "lease of h:1:inv:0 expired"),
    (SegmentRecord(**{**REC, "owner": "me"}), 0, True, "already mine"),
    (SegmentRecord(**{**REC, "done": True, "owner": FREE}), 999, False, "done"),
    (SegmentRecord(**{**REC, "failed": True, "failed_by": "inv", "attempts": 3, "owner": FREE}), 999, False,
     "failed in this run after 3 attempts"),
    (SegmentRecord(**{**REC, "failed": True, "failed_by": "earlier", "owner": FREE}), 0, True, "free"),
    # The holder's own recorded lease length decides, not the claimant's.
    (SegmentRecord(**{**REC, "lease_seconds": 300.0}), 299, False, "leased by h:1:inv:0"),
])
def test_lease_decision(rec, unchanged, claim, reason):
    # Expiry is how long *this claimant* has seen the token unchanged (its own monotonic
    # clock); the holder's wall-clock lease_expires (200 here) plays no part.
    d = lease_decision(rec, me="me", invocation="inv", unchanged_for=unchanged, lease_seconds=100)
    assert (d.claim, d.reason) == (claim, reason)


def test_a_dead_owner_on_this_host_is_taken_over_before_expiry():
    d = lease_decision(SegmentRecord(**REC), me="me", invocation="inv", unchanged_for=0, is_dead=lambda o: True)
    assert d.claim and d.takeover and "dead process" in d.reason


def test_lease_watch_times_a_token_on_the_observers_clock_and_restarts_on_a_renewal():
    w = LeaseWatch()
    assert w.observe(3, ("a", 1), 1000.0) == 0.0          # first look: unknown age, counts from now
    assert w.observe(3, ("a", 1), 1042.5) == 42.5
    assert w.observe(3, ("a", 2), 1050.0) == 0.0          # a renewal bumped the counter: alive
    assert w.observe(3, ("a", 2), 1051.0) == 1.0
    assert w.observe(4, ("a", 2), 1051.0) == 0.0          # per segment


def test_quiet_remaining_is_lease_plus_the_longest_request_for_a_held_lease_only():
    held = SegmentRecord(**{**REC, "lease_seconds": 20.0, "max_request_seconds": 7.0})
    assert quiet_remaining(held, 0) == 27.0 and quiet_remaining(held, 26) == 1.0 and quiet_remaining(held, 30) == 0
    assert quiet_remaining(SegmentRecord(**{**REC, "owner": FREE}), 0) == 0      # released
    assert quiet_remaining(SegmentRecord(**{**REC, "done": True}), 0) == 0       # finished
    # A record from before the numbers were recorded: the assumed defaults.
    assert quiet_remaining(SegmentRecord(**REC), 0) == ASSUMED_LEASE_SECONDS + ASSUMED_MAX_REQUEST_SECONDS


def test_budget_module_is_pure():
    code = ("import sys, reshard.jobs.budget; bad = [m for m in ('boto3', 'botocore', 'click', 'tqdm', 'tenacity') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_default_aimd_settles_near_two_thirds_under_a_steady_trickle_of_throttles():
    """Throttles that never stop (a fault injector, not capacity) must not drive the rate to the floor."""
    clock = FakeClock()
    a = Aimd(300.0, "WCU", clock)
    for _ in range(200):  # a throttle every 0.5 s for 100 s
        clock.t += 0.5
        a.on_throttle("batch_write_item", observed_rate=a.rate)
    assert 0.5 * 300 <= a.rate <= 0.8 * 300
