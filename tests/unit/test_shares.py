"""The shared budget's pure rule (reshard.core.shares) and the CapacityBudget pacing at a share."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard import errors
from reshard.core.capacity import Aimd
from reshard.core.shares import (Member, Shares, beat_valid_until, even_split, next_share, rebalance, row_sum_ok,
                                 silence_bound)
from reshard.jobs.budget import CapacityBudget


def apply(row: Shares, member: str, live, totals=None) -> Shares:
    """One member's refresh written into the row (what control.budget.write_shares stores)."""
    d = rebalance(row, member, live, totals)
    if not d.write:
        return row
    shares = {m: dict(v) for m, v in row.shares.items() if m not in d.drop}
    shares[member] = {k: v for k, v in d.shares.items() if v is not None}
    return Shares(d.totals, shares, row.version + 1)


def test_a_newcomer_takes_only_what_is_free_and_the_split_evens_out():
    row = apply(Shares({"write": 300.0, "read": None}), "a", ["a"])
    assert row.share("a", "write") == 300                        # alone: the whole budget
    row = apply(row, "b", ["a", "b"])
    assert row.share("b", "write") == 0 and row_sum_ok(row, "write")  # nothing free yet: no overshoot
    row = apply(row, "a", ["a", "b"])
    assert row.share("a", "write") == 150                        # a shrinks at its refresh ...
    row = apply(row, "b", ["a", "b"])
    assert row.share("b", "write") == 150                        # ... then b grows to the even split
    assert "read" not in row.shares["a"]                          # no read budget: no read share


def test_a_member_judged_gone_is_dropped_and_the_rest_grow():
    row = Shares({"write": 90.0}, {"a": {"write": 30.0}, "b": {"write": 30.0}, "c": {"write": 30.0}}, 7)
    d = rebalance(row, "a", ["a", "b"])                           # c went silent
    assert d.drop == ("c",) and d.write and d.shares["write"] == 45
    row = apply(row, "a", ["a", "b"])
    assert set(row.shares) == {"a", "b"} and row.version == 8
    assert apply(row, "b", ["a", "b"]).share("b", "write") == 45


def test_nothing_to_write_when_the_share_is_already_right():
    row = Shares({"write": 100.0, "read": 40.0}, {"a": {"write": 50.0, "read": 20.0}, "b": {"write": 50.0, "read": 20.0}}, 3)
    assert rebalance(row, "a", ["a", "b"]).write is False


def test_a_new_budget_replaces_the_lanes_it_names_and_keeps_the_others():
    row = Shares({"write": 100.0, "read": 40.0}, {"a": {"write": 100.0, "read": 40.0}}, 1)
    d = rebalance(row, "b", ["a", "b"], {"write": 50.0, "read": None})
    assert d.totals == {"write": 50.0, "read": 40.0}
    assert d.shares == {"write": 0.0, "read": 0.0}                # a still holds more than the new total
    row = apply(apply(row, "b", ["a", "b"], {"write": 50.0}), "a", ["a", "b"])
    assert row.share("a", "write") == 25 and row.share("a", "read") == 20


def test_shares_are_rounded_down():
    assert next_share(100.0, 0.0, even_split(100.0, 3)) == 33.333
    assert 3 * next_share(100.0, 0.0, even_split(100.0, 3)) <= 100
    assert next_share(None, 0.0, 50.0) is None and even_split(10.0, 0) == 10.0


def test_liveness_bounds():
    m = Member("h:1:x", beat=4, liveness_seconds=10.0, request_seconds=3.0)
    assert silence_bound(m) == 13.0                               # the member stops at 10 s, a request lands by 13
    assert beat_valid_until(100.0, 10.0) == 110.0


def apply_idle(row: Shares, member: str, live, idle) -> Shares:
    d = rebalance(row, member, live, None, {"write": idle})
    if not d.write:
        return row
    shares = {m: dict(v) for m, v in row.shares.items() if m not in d.drop}
    shares[member] = {k: v for k, v in d.shares.items() if v is not None}
    return Shares(d.totals, shares, row.version + 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sets(st.integers(0, 4)), st.sets(st.integers(0, 4))),
                min_size=1, max_size=30),
       st.floats(1.0, 10_000.0))
def test_no_sequence_of_refreshes_makes_the_row_exceed_the_budget(steps, total):
    """Whatever order members refresh in, whoever each judges live and idle, the written
    shares never add up to more than the total; once everyone agrees, the split is even."""
    row = Shares({"write": total})
    for who, live, idle in steps:
        row = apply_idle(row, f"m{who}", [f"m{i}" for i in live], {f"m{i}" for i in idle})
        assert row_sum_ok(row, "write")
    everyone = sorted({f"m{w}" for w, _, _ in steps})
    for _ in range(2):                                            # two rounds of agreeing refreshes
        for m in everyone:
            row = apply(row, m, everyone)
            assert row_sum_ok(row, "write")
    assert all(row.share(m, "write") == pytest.approx(total / len(everyone), abs=0.01) for m in everyone)


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_targets_follow_demand():
    row = Shares({"write": 90.0}, {"a": {"write": 30.0}, "b": {"write": 30.0}, "c": {"write": 30.0}}, 1)
    d = rebalance(row, "c", ["a", "b", "c"], None, {"write": {"c"}})
    assert d.targets["write"] == 0 and d.shares["write"] == 0 and not d.below_target   # idle: gives it all back
    row = apply_idle(row, "c", ["a", "b", "c"], {"c"})
    d = rebalance(row, "a", ["a", "b", "c"], None, {"write": {"c"}})
    assert d.targets["write"] == 45 and d.shares["write"] == 45                         # the busy two split it
    row = apply_idle(apply_idle(row, "a", ["a", "b", "c"], {"c"}), "b", ["a", "b", "c"], {"c"})
    d = rebalance(row, "c", ["a", "b", "c"])                                            # c busy again
    assert d.shares["write"] == 0 and d.below_target                                    # waits for a and b to shrink


def test_a_budget_idles_only_without_demand():
    clock = FakeClock()
    b = CapacityBudget(100.0, None, clock=clock, sleep=clock.sleep)
    assert not b.idle("write", 2.0)                                # a new process counts as busy
    clock.t += 3
    assert b.idle("write", 2.0)
    with b.spend("write", 1.0):
        pass
    assert not b.idle("write", 2.0)
    b.lanes["write"].waiting = 1                                   # a request waits (held or sleeping)
    clock.t += 10
    assert not b.idle("write", 2.0)


def test_a_smaller_share_knows_when_requests_reserved_at_the_larger_one_are_sent():
    clock = FakeClock()
    b = CapacityBudget(100.0, None, clock=clock, sleep=clock.sleep)
    b.set_share("write", 100.0, 100.0)
    b.lanes["write"].bucket.reserve(50)                           # 50 units scheduled over 0.5 s at 100/s
    b.set_share("write", 20.0, 100.0)
    assert b.larger_share_until("write") == pytest.approx(clock() + 0.5)
    assert b.lanes["write"].bucket.reserve(0) == pytest.approx(50 / 20)   # new ones queue behind, at 20/s
    b.set_share("write", 40.0, 100.0)                             # growing never moves it
    assert b.larger_share_until("write") == pytest.approx(clock() + 0.5)


def test_a_budget_without_a_share_sends_nothing_then_gives_up():
    clock = FakeClock()
    b = CapacityBudget(100.0, None, clock=clock, sleep=clock.sleep)
    b.set_share("write", 0.0, 100.0)
    b.hold_limit = 2.0
    assert "no share of the run's budget is free yet" in b.throttle_reason()
    with pytest.raises(errors.BudgetUnavailable, match="waited 2s for capacity"):
        with b.spend("write", 1.0):
            pytest.fail("a request was sent without a share")
    with b.spend("read", 1.0):                                    # reads have no budget: never held
        pass


def test_a_lapsed_share_holds_requests_until_a_refresh_renews_it():
    clock = FakeClock()
    b = CapacityBudget(100.0, None, clock=clock, sleep=clock.sleep)
    b.set_share("write", 50.0, 100.0)
    b.valid_until = clock() - 0.01
    renewed = []

    def sleep(s):                                                 # the refresh thread renews it meanwhile
        clock.t += s
        if clock.t > 101.0 and not renewed:
            renewed.append(clock.t)
            b.valid_until = clock.t + 10
    b.sleep = sleep
    with b.spend("write", 1.0):
        sent_at = clock()
    assert renewed and sent_at >= renewed[0]
    assert b.share("write") == 50.0 and b.lanes["write"].bucket.rate == 50.0


def test_aimd_keeps_its_backoff_fraction_when_the_share_changes():
    clock = FakeClock()
    a = Aimd(100.0, "WCU", clock, decrease=0.5)
    a.on_throttle("put_item", 100.0)
    assert a.rate == 50.0
    a.set_budget(40.0)                                            # the share shrank: still at half of it
    assert (a.rate, a.ceiling, a.budget) == (20.0, 40.0, 40.0)
    b = Aimd(100.0, "WCU", clock)
    b.set_budget(25.0)
    assert (b.rate, b.ceiling) == (25.0, 25.0)
