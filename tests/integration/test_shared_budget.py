"""One --max-wcu for every process of a run: the budget row on dynalite (short windows).

Members are driven refresh by refresh (no background thread) so each step is deterministic;
the end-to-end test runs the CLI in-process with the thread.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from reshard import errors
from reshard.control import budget as rows
from reshard.control.budget import BudgetMembership
from reshard.control.store import ControlStore
from reshard.jobs.budget import CapacityBudget

LIVENESS, REQUEST = 0.5, 0.2


@pytest.fixture(scope="module")
def control_table(dynalite_server):
    """One control table for the module (each test has its own migration id in it)."""
    from reshard.aws.dynamo import Dynamo, RetryPolicy
    dynamo = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1",
                    retry=RetryPolicy(max_attempts=5, base_seconds=0.01), connect_timeout=1, read_timeout=4)
    store = ControlStore(dynamo, f"shared-budget-{uuid.uuid4().hex[:6]}")
    store.ensure_table()
    return store


@pytest.fixture
def control(control_table, unique_name):
    MIG[0] = unique_name
    return control_table


#: The migration id of the running test (its rows in the shared control table); set by `control`.
MIG = ["mig"]


def member(store, name: str, total: float | None = 100.0, demand: bool = True) -> BudgetMembership:
    m = BudgetMembership(store, MIG[0], "backfill", 1, CapacityBudget(total), {"write": total} if total else None,
                         member=name, request_seconds=REQUEST, refresh_seconds=0.1, liveness_seconds=LIVENESS)
    if demand:
        m.budget.lanes["write"].waiting = 1  # a worker waits for write capacity the whole test
    return m


def row_of(store):
    return rows.read_shares(store, MIG[0], "backfill", 1)


def test_two_members_split_the_budget_and_a_silent_ones_share_goes_back(control):
    a, b = member(control, "host-a:1:x"), member(control, "host-b:1:y")
    assert a.refresh() and a.budget.share("write") == 100
    assert b.refresh() and b.budget.share("write") == 0            # all of it is a's until a shrinks
    assert "no share of the run's budget is free yet" in b.budget.throttle_reason()
    assert a.refresh() and a.budget.share("write") == 50
    assert b.refresh() and b.budget.share("write") == 50
    r = row_of(control)
    assert r.total["write"] == 100 and r.shares == {"host-a:1:x": {"write": 50.0}, "host-b:1:y": {"write": 50.0}}

    # b stops beating (crashed or stalled). a keeps b's share until it watched b's beat
    # unchanged for b's liveness window + one request, on a's own clock.
    a.refresh()
    a.refresh()
    assert a.budget.share("write") == 50
    time.sleep(LIVENESS + REQUEST + 0.05)
    # By now b itself stopped pacing: its last beat is older than its liveness window.
    assert b.budget.clock() > b.budget.valid_until
    assert "lapsed" in b.budget.throttle_reason()
    assert a.refresh() and a.budget.share("write") == 100
    assert set(row_of(control).shares) == {"host-a:1:x"}

    # b comes back: it rejoins with what is free (nothing) and never paces at its old share.
    assert b.refresh() and b.budget.share("write") == 0


def test_a_member_that_leaves_gives_its_share_back_at_once(control):
    a, c = member(control, "host-a:1:x"), member(control, "host-c:1:z", total=None)  # c joins the run's budget
    a.refresh(), c.refresh(), a.refresh(), c.refresh()
    assert (a.budget.share("write"), c.budget.share("write")) == (50, 50)
    c.leave()
    assert c.budget.clock() > c.budget.valid_until                 # sends nothing more
    assert set(row_of(control).shares) == {"host-a:1:x"}
    assert [m.member for m in rows.read_members(control, MIG[0], "backfill", 1)] == ["host-a:1:x"]  # its beat row too
    assert a.refresh() and a.budget.share("write") == 100           # no liveness window to wait out


def test_a_member_without_demand_gives_its_share_to_the_busy_ones(control):
    """Targets follow demand: a process whose workers wait for segments others hold aims at 0."""
    a, b = member(control, "host-a:1:x"), member(control, "host-b:1:y")
    a.refresh(), b.refresh(), a.refresh(), b.refresh()
    assert (a.budget.share("write"), b.budget.share("write")) == (50, 50)
    b.budget.lanes["write"].waiting = 0                             # b's workers have nothing to copy ...
    time.sleep(0.25)                                                # ... for two refreshes
    assert b.refresh() and b.budget.share("write") == 0
    assert a.refresh() and a.budget.share("write") == 100
    b.budget.lanes["write"].waiting = 1                             # b claims a segment again
    assert b.refresh() and b.budget.share("write") == 0 and b.below_split   # a still holds it all ...
    assert a.refresh() and a.budget.share("write") == 50
    assert b.refresh() and b.budget.share("write") == 50            # ... until a shrank


def test_a_shrinking_member_keeps_its_larger_share_in_the_row_until_its_reserved_requests_went_out(control):
    a, b = member(control, "host-a:1:x"), member(control, "host-b:1:y")
    a.refresh()
    a.budget.lanes["write"].bucket.reserve(30)                      # 30 requests scheduled at 100/s: 0.3 s
    b.refresh()
    assert a.refresh() and a.budget.share("write") == 50            # a paces at 50 at once ...
    assert row_of(control).share("host-a:1:x", "write") == 100      # ... the row still covers the 30 in flight
    assert b.refresh() and b.budget.share("write") == 0
    time.sleep(0.35)
    assert a.refresh() and row_of(control).share("host-a:1:x", "write") == 50
    assert b.refresh() and b.budget.share("write") == 50


def test_two_members_rebalancing_at_once_never_overwrite_each_other(control, monkeypatch):
    """Forced interleaving: b grows its share between a's read of the row and a's write.
    a's write is conditional on the version it read, so it fails, a reads again and b's
    share stays. A blind write would record b at 0 while b paces at 50: the next newcomer
    would take those 50 too and the run would spend 150 of a 100 budget."""
    a, b, c = member(control, "host-a:1:x"), member(control, "host-b:1:y"), member(control, "host-c:1:z")
    a.refresh(), b.refresh(), a.refresh()                           # a 50, b 0 (b grows at its next refresh)
    c.refresh()                                                     # c joins with what is free ...
    rows.forget(control, MIG[0], "backfill", 1, "host-c:1:z")        # ... and is gone: a will drop it (a write)
    assert row_of(control).shares == {"host-a:1:x": {"write": 50.0}, "host-b:1:y": {"write": 0.0},
                                      "host-c:1:z": {"write": 33.333}}
    real = rows.read_shares
    forced = []

    def read_then_b_refreshes(*args):
        found = real(*args)
        if not forced:
            forced.append(1)
            assert b.refresh() and b.budget.share("write") == 50    # b's write lands under a's feet
        return found
    monkeypatch.setattr(rows, "read_shares", read_then_b_refreshes)
    assert a.refresh()
    assert forced
    assert row_of(control).shares == {"host-a:1:x": {"write": 50.0}, "host-b:1:y": {"write": 50.0}}


def test_backfill_processes_share_one_budget_end_to_end(dynalite, dynalite_server, unique_name, capsys):
    """`reshard backfill --max-wcu --host-id` paces at its share, reports it, and leaves the
    run's budget row with no member when it is done."""
    from reshard.cli.main import main
    from tests.backfill_support import logical, setup_migration

    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-c", mid=unique_name)
    items = [logical("invoices", i) for i in range(60)]
    dynalite.batch_write(m.table, [{"PutRequest": {"Item": mapper.to_physical(it, mapper.old, i % mapper.old.shards)}}
                                   for i, it in enumerate(items)])
    base = ["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table, "--output", "json"]
    assert main([*base, "backfill", m.id, "--segments", "2", "--max-wcu", "400", "--host-id", "pod-0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["budget"] == {"members": 1, "max_wcu": 400.0, "share_wcu": 400.0}, summary
    assert summary["moved"] > 0
    r = rows.read_shares(store, m.id, "backfill", 1)
    assert r is not None and r.total["write"] == 400 and r.shares == {}
    assert rows.read_members(store, m.id, "backfill", 1) == []
    from reshard.control.runs import describe
    assert describe(store, m.id, "backfill", 1)["budget"] == {"max_wcu": 400.0, "max_rcu": None, "shares": {}}
    with pytest.raises(errors.ForeignControlRow):                  # the row check knows B rows' job
        from reshard.control.records import check_row
        check_row({"pk": {"S": f"J#{m.id}#backfill"}, "sk": {"S": "B#verify#000001"}})


def test_a_dead_members_share_is_reclaimed_once_watched_silent_and_a_later_process_never_halves(control):
    """Issue 27 point 12. A member killed with kill -9 leaves its share and its beat row. The
    member that watched it silent drops the share *and* removes the beat row; a process that
    joins the run later (a re-run) then takes the whole budget at its first refresh, instead of
    counting the dead member live for its own silence bound (half the budget meanwhile, at
    every re-run, until `doctor --repair`)."""
    a, dead = member(control, "host-a:1:x"), member(control, "host-d:1:dead")
    dead.refresh(), a.refresh(), dead.refresh(), a.refresh()
    assert (a.budget.share("write"), dead.budget.share("write")) == (50, 50)
    time.sleep(0.3)  # more than two refreshes without a beat: said while waiting for capacity
    a.refresh()
    assert "member host-d:1:dead holds 50 write units/s and has not beaten for" in a.waiting_for
    assert a.budget.hold_detail() == a.waiting_for
    time.sleep(LIVENESS + REQUEST + 0.05)  # dead never beats again
    assert a.refresh() and a.budget.share("write") == 100
    assert [m.member for m in rows.read_members(control, MIG[0], "backfill", 1)] == ["host-a:1:x"]
    a.leave()
    # A re-run after a's own end: the whole budget at once (nobody else is in the row).
    rerun = member(control, "host-a:2:rerun")
    assert rerun.refresh() and rerun.budget.share("write") == 100


def test_a_member_process_of_this_host_that_is_gone_is_dropped_at_once(control):
    """A member of this host whose pid no longer exists: no silence bound to wait out."""
    a = member(control, "host-a:1:x")
    dead = member(control, "host-a:2:dead")
    dead.refresh(), a.refresh(), dead.refresh()
    a.is_dead = lambda m: m.member == "host-a:2:dead"  # the runner asks engine.same_host_dead
    assert a.refresh() and a.budget.share("write") == 100
    assert [m.member for m in rows.read_members(control, MIG[0], "backfill", 1)] == ["host-a:1:x"]


def test_the_runner_judges_a_member_by_its_host_and_pid():
    """The rule the runner passes: a process of this host that no longer exists."""
    import os
    import socket
    import subprocess
    import sys

    from reshard.control.records import check_row  # noqa: F401 (the rows' module is importable here)
    from reshard.core.shares import Member
    from reshard.jobs.engine import same_host_dead

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    host = socket.gethostname()
    judge = lambda m: same_host_dead(f"{m.host}:{m.pid}", host)  # noqa: E731 (as in jobs.runner.shared_budget)
    assert judge(Member("x", 1, host=host, pid=int(gone)))
    assert not judge(Member("x", 1, host=host, pid=os.getpid()))
    assert not judge(Member("x", 1, host="another-host", pid=int(gone)))
