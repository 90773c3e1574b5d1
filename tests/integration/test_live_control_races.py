"""Forced interleavings of the live control (``reshard throttle/pause/resume``) on dynalite.

* A pause that lands in the middle of a page holds the page before its next write (not
  only at the next page boundary), and the held worker keeps renewing its lease: another
  host trying to claim the segment for two lease lengths gets nothing, and no page is redone.
* A pause with ``--release-leases`` mid-page gives the segment back at once (checkpoint
  kept); after ``resume`` the page is redone from its checkpoint.
* Two operators changing one run's control at once: the compare-and-set on ``version``
  makes the loser re-read and apply on top, so both changes are in force and recorded.
* The operator's budget wins over the processes' own ``--max-wcu``, also over a process that
  joins later with another one.
* A process that joins a paused run claims nothing before ``resume``.
"""

from __future__ import annotations

import threading
import time

import pytest

from reshard.aws import local
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.control import budget as rows
from reshard.control import live
from reshard.control.budget import BudgetMembership
from reshard.control.records import Hold, control_sk
from reshard.control.store import ControlStore
from reshard.core.wire import N, S
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import SegmentEngine
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.subscribers import EventLog
from reshard.control.runs import segment_records
from reshard.core.leases import FREE
from reshard.core.migration import Keys
from reshard.core.shares import row_sum_ok

from tests.backfill_support import logical, setup_migration

LEASE = 2.0
WAIT = 20.0


def fast(endpoint: str) -> Dynamo:
    return Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=3, base_seconds=0.01),
                  connect_timeout=0.2, read_timeout=0.3)


@pytest.fixture
def control(dynalite, unique_name):
    store = ControlStore(dynalite, unique_name + "-c")
    store.ensure_table()
    return store


class Page:
    """A page of ``n`` guarded writes (one item each); calls ``after(i)`` once write ``i`` landed."""

    def __init__(self, dynamo: Dynamo, table: str, n: int, after=lambda i: None):
        self.dynamo, self.table, self.n, self.after = dynamo, table, n, after
        self.sent: list[tuple[float, int]] = []  # (monotonic time, item) of every write sent
        self.calls = 0

    def __call__(self, ctx, key):
        self.calls += 1
        for i in range(self.n):
            self.dynamo.call("put_item", guard=ctx.write_guard, TableName=self.table,
                             Item={"pk": S(f"i{i}"), "n": N(self.calls)})
            self.sent.append((time.monotonic(), i))
            self.after(i)
        return {"written": self.n}, None


def table(dynamo: Dynamo, name: str) -> str:
    """A data table with a string partition key ``pk`` only."""
    local.create_table(dynamo, name, Keys("pk", None))
    return name


def engine(store, mid, page, invocation, dynamo, hold, **kw) -> SegmentEngine:
    return SegmentEngine(store, mid, "backfill", 1, 1, page, workers=1, lease_seconds=LEASE,
                         max_request_seconds=dynamo.attempt_seconds, invocation=invocation, hold=hold, **kw)


def start(e: SegmentEngine) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["result"] = e.run_all()
        except BaseException as exc:  # noqa: BLE001 - shown by the assertion
            out["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_pause_mid_page_holds_the_next_write_and_the_lease_stays_with_its_worker(dynalite, dynalite_server,
                                                                                   control, unique_name):
    data = table(dynalite, unique_name)
    box = {"hold": None}
    paused_at = {}

    def pause_after_second_write(i):
        if i == 1 and "at" not in paused_at:
            box["hold"] = Hold(unique_name, "op@test", time.time())  # the beat that read the pause
            paused_at["at"] = time.monotonic()

    own = fast(dynalite_server.endpoint)
    page = Page(own, data, 6, pause_after_second_write)
    log = EventLog()
    worker = engine(ControlStore(own, control.table), unique_name, page, "held", own, lambda: box["hold"],
                    subscribers=[log])
    t, out = start(worker)
    assert wait_until(lambda: "at" in paused_at)
    # Another host tries to take the segment over for two lease lengths: the held worker
    # keeps renewing, so the lease never looks expired to it.
    theirs = fast(dynalite_server.endpoint)
    other = engine(ControlStore(theirs, control.table), unique_name, lambda ctx, key: ({}, None), "other", theirs,
                   lambda: None)
    claimed = []
    until = time.monotonic() + 2 * LEASE + 0.5
    while time.monotonic() < until:
        rec = other.records()[0]
        claimed.append(other.claim(rec, "other-host:1:x:0"))
        time.sleep(0.2)
    sent_while_paused = [i for at, i in page.sent if at > paused_at["at"]]
    assert sent_while_paused == [], f"writes sent during the pause: {sent_while_paused}"
    assert not any(claimed), "the held worker's lease was taken over"
    held = log.kinds("hold")
    assert held and "paused by op@test" in held[-1][2]  # the worker said why it waits (its progress line)
    box["hold"] = None  # resume
    t.join(WAIT)
    assert "error" not in out, out
    result = out["result"]
    assert result.done and [i for _, i in page.sent] == list(range(6))  # the page went on where it stopped
    assert result.segments[0].takeovers == 0 and page.calls == 1  # nothing redone


def test_a_pause_that_releases_the_leases_gives_the_segment_back_and_the_page_is_redone(dynalite, dynalite_server,
                                                                                        control, unique_name):
    data = table(dynalite, unique_name)
    box = {"hold": None}
    pause = threading.Event()

    def pause_after_second_write(i):
        if i == 1 and not pause.is_set():
            box["hold"] = Hold(unique_name, "op@test", time.time(), release_leases=True)
            pause.set()

    own = fast(dynalite_server.endpoint)
    page = Page(own, data, 4, pause_after_second_write)
    worker = engine(ControlStore(own, control.table), unique_name, page, "releasing", own, lambda: box["hold"])
    t, out = start(worker)
    assert pause.wait(WAIT)
    rec = wait_until(lambda: (r := worker.records()[0]).owner == FREE and r)  # released at its next write
    assert not rec.done and rec.checkpoint is None and [i for _, i in page.sent] == [0, 1]
    time.sleep(0.5)
    assert [i for _, i in page.sent] == [0, 1] and t.is_alive()  # held, claiming nothing
    box["hold"] = None
    t.join(WAIT)
    assert out["result"].done and page.calls == 2  # the page, redone from its checkpoint
    assert [i for _, i in page.sent] == [0, 1, 0, 1, 2, 3]


def test_two_operators_changing_one_run_at_once_both_count(control, unique_name, monkeypatch):
    """Forced: operator B's pause lands between operator A's read and A's write. A's write is
    conditional on the version it read, fails, and A applies its throttle on top of B's pause."""
    live.change(control, unique_name, "backfill", 1, "throttle", who="c", max_rcu=100.0)  # the row exists: version 1
    real = live.read_control
    forced = []

    def read_then_b_pauses(*args):
        found = real(*args)
        if not forced:
            forced.append(1)
            live.change(control, unique_name, "backfill", 1, "pause", who="b", paused=True, release_leases=False)
        return found
    monkeypatch.setattr(live, "read_control", read_then_b_pauses)
    done = live.change(control, unique_name, "backfill", 1, "throttle", who="a", max_wcu=50.0)
    monkeypatch.undo()
    assert forced and done.changed
    now = live.read_control(control, unique_name, "backfill", 1)
    assert now.paused and now.max_wcu == 50.0 and now.max_rcu == 100.0 and now.version == 3
    assert [(c.who, c.action, c.text()) for c in now.changes] == [
        ("c", "throttle", "max_rcu (each process's own option) -> 100"), ("b", "pause", "paused, leases kept"),
        ("a", "throttle", "max_wcu (each process's own option) -> 50")]


def test_the_operators_budget_wins_over_every_process_own_option(control, unique_name):
    def member(name, total):
        m = BudgetMembership(control, unique_name, "backfill", 1, CapacityBudget(total), {"write": total},
                             member=name, request_seconds=0.2, refresh_seconds=0.1, liveness_seconds=0.5)
        m.budget.lanes["write"].waiting = 1
        return m
    a = member("a:1:x", 100.0)
    a.refresh(), a.refresh()
    assert a.budget.share("write") == 100
    live.change(control, unique_name, "backfill", 1, "throttle", who="op", max_wcu=10.0)
    assert a.refresh() and a.budget.share("write") == 10 and a.budget.set_by["write"] == "op"
    c = member("c:1:y", 500.0)  # a process started later with a larger --max-wcu
    c.refresh(), a.refresh(), c.refresh()
    r = rows.read_shares(control, unique_name, "backfill", 1)
    assert r.total["write"] == 10 and row_sum_ok(r, "write")
    assert a.budget.share("write") + c.budget.share("write") <= 10 + 1e-6
    assert c.budget.lanes["write"].total == 10 and c.budget.set_by["write"] == "op"
    a.budget.lanes["write"].paced_at = a.budget.clock()  # requests wait for the budget now
    assert "--max-wcu (set by `reshard throttle`, op) 10 for the whole run" in a.budget.throttle_reason()


def test_a_process_joining_a_paused_run_claims_nothing_until_resume(dynalite, control, unique_name):
    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-cc", mid=unique_name)
    dynalite.batch_write(m.table, [{"PutRequest": {"Item": mapper.to_physical(logical("invoices", i), mapper.old, 0)}}
                                   for i in range(10)])
    # The run exists (another host started it) and an operator paused it.
    SegmentEngine(store, m.id, "backfill", 1, 2, lambda ctx, key: ({}, None)).start_run()
    live.change(store, m.id, "backfill", 1, "pause", who="op", paused=True, release_leases=False)
    out = {}
    opts = JobOptions(segments=2, workers=2, budget_refresh_seconds=0.1, budget_liveness_seconds=1.0)
    t = threading.Thread(target=lambda: out.setdefault("r", run_job(BACKFILL, dynalite, store, m.id, opts)),
                         daemon=True)
    t.start()
    time.sleep(1.0)
    assert [r.exists for r in segment_records(store, m.id, "backfill", 1, 2)] == [False, False]
    live.change(store, m.id, "backfill", 1, "resume", who="op", paused=False)
    t.join(WAIT)
    assert out["r"].done and out["r"].totals["copied"] > 0


def wait_until(check, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_control_row_refuses_a_forged_field(control, unique_name):
    live.change(control, unique_name, "backfill", 1, "throttle", who="op", max_wcu=10.0)
    control.update(control.mpk(unique_name), control_sk("backfill", 1), "SET max_wcu = :s", values={":s": S("10")})
    from reshard import errors
    with pytest.raises(errors.ForeignControlRow, match="max_wcu of the wrong type"):
        live.read_control(control, unique_name, "backfill", 1)
