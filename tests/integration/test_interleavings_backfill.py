"""Forced interleavings of the data jobs' writes against dynalite (issue 12, cases 2, 3, 6 and 12).

Each test freezes one actor at an exact point -- a botocore ``before-send`` hook on the
worker's own client, or the budget's pacing point just before a write -- and lets the
others run. They failed on the code before the server-fenced copies, the local write
deadline and the lease-quiet gates, and pass with them:

* case 2: a backfill worker frozen between its lease check and its copy past its lease;
  another worker redoes the segment, the shim writes a newer version, then the frozen
  worker resumes (and dies right after its write, or lives on with a cutover-style
  shim whose old-layout mirror lands last): the newer version survives.
* case 3: random-suffix duplicates: a stale old copy is never copied over a newer shim
  write at the new key, nor over a shim delete's tombstone; two unversioned copies that
  disagree are reported as a collision, not resolved.
* case 6: a backfill worker stalled past its lease while the operator aborts and the
  cleanup retires: no copy appears after the retire.
* case 12: a claimant whose wall clock runs an hour ahead does not take a live lease.
"""

from __future__ import annotations

import threading
import time

import pytest

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.control.runs import unmappable_items
from reshard.control.store import ControlStore
from reshard.control.transition import retire, transition
from reshard.core.layout import NEW_COPY_ATTR, SOURCE_ATTR
from reshard.core.phases import Action, Phase
from reshard.core.wire import key_of
from reshard.jobs.backfill import BACKFILL, Backfill
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.cleanup import CLEANUP
from reshard.jobs.engine import SegmentEngine
from reshard.jobs.runner import JobOptions, phase_guard, run_job

from tests.backfill_support import Shim, logical, scan_all, setup_migration

WAIT = 20.0  # the bound on every wait in this file (seconds)
LEASE = 2.0  # a short lease, so a stall past it takes seconds


class Death(BaseException):
    """Kills a worker thread where it stands (not an Exception: the engine does not catch it)."""


def fast_dynamo(endpoint: str) -> Dynamo:
    """A worker's own client: bounded, short timeouts (one attempt <= 0.8 s), so its time
    fence leaves most of a 2 s lease for work."""
    return Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=3, base_seconds=0.01),
                  connect_timeout=0.3, read_timeout=0.5)


class Freezer:
    """Freezes the first data-table copy write of one client until released, counting later sends.

    ``point="before_send"``: in botocore's before-send event, i.e. after every check
    reshard makes (the request is built and about to go on the wire). ``point="budget"``:
    at the budget's pacing point, where the budget sleeps -- after the per-page lease
    check of the old code, before the per-request guard of the new one.
    """

    OPS = ("PutItem", "BatchWriteItem")

    def __init__(self, dynamo: Dynamo, point: str):
        self.point = point
        self.frozen = threading.Event()
        self.release = threading.Event()
        self.sent_after_release = 0
        self._once = False
        for op in self.OPS:
            dynamo.client.meta.events.register(f"before-send.dynamodb.{op}", self._before_send)

    def _before_send(self, **kwargs):
        if self.release.is_set():
            self.sent_after_release += 1
        if self.point == "before_send":
            self.freeze()

    def freeze(self) -> None:
        if self._once:
            return
        self._once = True
        self.frozen.set()
        assert self.release.wait(WAIT), "never released"

    def budget(self, inner: CapacityBudget) -> CapacityBudget:
        """``inner`` whose first write spend freezes (the budget's own sleep, stretched)."""
        freezer = self
        spend = inner.spend

        def frozen_spend(kind, estimate):
            if kind == "write" and freezer.point == "budget":
                freezer.freeze()
            return spend(kind, estimate)

        inner.spend = frozen_spend
        return inner


def _engine(store, mid, page, invocation, dynamo, **kw) -> SegmentEngine:
    return SegmentEngine(store, mid, "backfill", 1, 1, page, workers=1, lease_seconds=LEASE,
                         max_request_seconds=dynamo.attempt_seconds, invocation=invocation, **kw)


def _start(engine: SegmentEngine) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["result"] = engine.run_all()
        except BaseException as e:  # noqa: BLE001 - Death, or whatever the worker met
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _new_item(dynamo, mapper, table, logical_item) -> dict | None:
    key = mapper.new.key(mapper.logical_fields(logical_item))
    return dynamo.call("get_item", TableName=table, Key=key, ConsistentRead=True).get("Item")


# --------------------------------------------------------------------------- case 2

@pytest.mark.parametrize("point", ["before_send", "budget"])
@pytest.mark.parametrize("fate", ["dies", "lives_cutover"])
def test_case2_a_worker_frozen_past_its_lease_never_overwrites_a_newer_version(dynalite, dynalite_server,
                                                                               unique_name, point, fate):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c",
                                       mid=unique_name)
    shim = Shim(dynalite, mapper, m.table, writer="app")
    items = [it for it in (logical("sensor", i) for i in range(12))
             if mapper.moves(mapper.to_physical(it, mapper.old))][:6]
    for it in items:
        shim.seed(it)

    # Worker A: its own clients; frozen at its first copy write.
    a_data = fast_dynamo(dynalite_server.endpoint)
    a_store = ControlStore(fast_dynamo(dynalite_server.endpoint), store.table)
    freezer = Freezer(a_data, point)
    if fate == "dies":
        def die(**kwargs):
            if freezer.release.is_set():
                raise Death("worker A dies right after its write, before anything else")
        for op in Freezer.OPS:
            a_data.client.meta.events.register(f"after-call.dynamodb.{op}", die)
    a_budget = freezer.budget(CapacityBudget().attach(a_data, m.table))
    a_page = Backfill(a_data, a_store, m.id, mapper, m.table, a_budget, page_size=100).page
    a = _engine(a_store, m.id, a_page, "A", a_data)
    thread_a, out_a = _start(a)
    assert freezer.frozen.wait(WAIT), "A never reached its write"

    # B watches A's lease stay unchanged for a whole lease, takes the segment over and redoes it.
    b_data = fast_dynamo(dynalite_server.endpoint)
    b_budget = CapacityBudget().attach(b_data, m.table)
    b = _engine(store, m.id, Backfill(b_data, store, m.id, mapper, m.table, b_budget).page, "B", b_data)
    assert b.run_all().done

    # The application writes every item again: a newer version than anything A scanned.
    newest = {}
    for i, it in enumerate(items):
        it = dict(it, temp={"N": str(5000 + i)})
        if fate == "dies":
            shim.put(it)                      # backfill phase: old first, then the fenced mirror
            newest[shim.ident(it)] = it
        else:
            # Cutover-style: the new (authoritative) copy first; the old-layout mirror lands last.
            mirror = _cutover_put(shim, it)
            newest[shim.ident(it)] = (it, mirror)

    freezer.release.set()
    thread_a.join(WAIT)
    assert not thread_a.is_alive()
    if fate == "lives_cutover":
        for it, mirror in newest.values():
            mirror()
    if fate == "dies" and point == "before_send":
        assert isinstance(out_a.get("error"), Death)   # its frozen request went out, then it died

    for ident, v in newest.items():
        it = v if fate == "dies" else v[0]
        got = _new_item(dynalite, mapper, m.table, it)
        assert got is not None and got["temp"] == it["temp"], (ident, got)
        assert got.get("_rs_v") == shim.model[ident]["_rs_v"]
    if point == "budget":
        # Frozen before its per-request check: past its deadline it sent nothing at all.
        assert freezer.sent_after_release == 0


def _cutover_put(shim: Shim, item: dict):
    """A cutover shim's put: the new layout (authoritative) now, fenced; returns the old-layout mirror."""
    ident = shim.ident(item)
    version = shim.clock.next()
    item = dict(item, _rs_v={"S": version})
    old = shim.mapper.to_physical(item, shim.mapper.old, shim._shard(ident))
    shim._fenced(shim._new_copy(item, old), version, must=True)
    shim.model[ident] = old
    return lambda: shim._fenced(old, version, must=True)


# --------------------------------------------------------------------------- case 3

def _duplicated_invoice(mapper, n: int = 0):
    """A logical invoice line whose new shard is < 10 (so an old copy can sit at its new key)."""
    for i in range(n, n + 400):
        it = logical("invoices", i)
        key = mapper.new.key(mapper.logical_fields(it))
        shard = int(key["PK"]["S"].rsplit("#", 1)[1])
        if shard < mapper.old.shards:
            return it, shard
    raise AssertionError("no invoice line maps to a low new shard")


def _old_copy(dynalite, mapper, table, item, shard, **attrs) -> dict:
    phys = mapper.to_physical(dict(item, **attrs), mapper.old, shard)
    dynalite.call("put_item", TableName=table, Item=phys)
    return phys


def _backfill(dynalite, store, m, page_size=3):
    return run_job(BACKFILL, dynalite, store, m.id, JobOptions(segments=1, workers=1, page_size=page_size,
                                                               lease_seconds=30))


def test_case3a_a_stale_duplicate_is_never_copied_over_a_shim_write_at_the_new_key(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-c",
                                       mid=unique_name)
    item, new_shard = _duplicated_invoice(mapper)
    other = (new_shard + 3) % mapper.old.shards
    unmoved = _old_copy(dynalite, mapper, m.table, item, new_shard, temp={"N": "1"})  # already at the new key
    _old_copy(dynalite, mapper, m.table, item, other, temp={"N": "0"})                 # a stale duplicate
    assert not mapper.moves(unmoved)
    shim = Shim(dynalite, mapper, m.table)
    shim.shards[shim.ident(item)] = new_shard
    shim.put(dict(item, temp={"N": "777"}))            # the application updates the copy at the new key
    result = _backfill(dynalite, store, m)
    got = _new_item(dynalite, mapper, m.table, item)
    assert got["temp"] == {"N": "777"} and got["_rs_v"] == shim.model[shim.ident(item)]["_rs_v"]
    assert result.totals["fenced"] >= 1 and result.totals["collisions"] == 0


def test_case3b_a_stale_duplicate_is_never_copied_over_a_shim_delete(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-c",
                                       mid=unique_name)
    lost = []
    for n in (0, 100, 200):  # a few logical items, each with two moving old copies
        item, new_shard = _duplicated_invoice(mapper, n)
        a, b = [s for s in range(mapper.old.shards) if s != new_shard][:2]
        _old_copy(dynalite, mapper, m.table, item, a)
        _old_copy(dynalite, mapper, m.table, item, b)
        shim = Shim(dynalite, mapper, m.table)
        shim.shards[shim.ident(item)] = a
        shim.delete(item)                               # tombstones copy a and the new key
        lost.append(item)
    _backfill(dynalite, store, m, page_size=2)          # later pages meet the live copy b
    for item in lost:
        got = _new_item(dynalite, mapper, m.table, item)
        assert got is not None and got.get("_rs_del") == {"BOOL": True}, got   # the delete holds


def test_case3c_two_unversioned_duplicates_that_differ_are_a_reported_collision(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-c",
                                       mid=unique_name)
    item, new_shard = _duplicated_invoice(mapper)
    a, b = [s for s in range(mapper.old.shards) if s != new_shard][:2]
    first = _old_copy(dynalite, mapper, m.table, item, a, temp={"N": "1"})
    second = _old_copy(dynalite, mapper, m.table, item, b, temp={"N": "2"})
    # And an identical duplicate of another item: harmless, not a collision.
    twin, twin_shard = _duplicated_invoice(mapper, 300)
    c, d = [s for s in range(mapper.old.shards) if s != twin_shard][:2]
    _old_copy(dynalite, mapper, m.table, twin, c)
    _old_copy(dynalite, mapper, m.table, twin, d)
    result = _backfill(dynalite, store, m)
    report = [r for r in unmappable_items(store, m.id) if r["reason"] == "collision"]
    assert len(report) == 1
    assert result.totals["collisions"] == 1 and result.totals["duplicates"] == 1
    got = _new_item(dynalite, mapper, m.table, item)
    # Whichever copy came first stays, stamped with its source; the other was not written over it.
    src = got[SOURCE_ATTR]["S"]
    assert got["temp"] == (first if "#" + str(a) + '"' in src else second)["temp"]
    keys = {str(r) for r in (report[0]["old_key"], report[0]["other_key"])}
    assert keys == {str(key_of(first, mapper.old.key_attrs)), str(key_of(second, mapper.old.key_attrs))}
    # Redone (the page again): idempotent, still one collision row, nothing overwritten.
    again = Backfill(dynalite, store, m.id, mapper, m.table, CapacityBudget().attach(dynalite, m.table))
    engine = SegmentEngine(store, m.id, "backfill", 99, 1, again.page, workers=1, lease_seconds=30,
                           max_request_seconds=dynalite.attempt_seconds)
    assert engine.run_all().done
    assert _new_item(dynalite, mapper, m.table, item) == got
    assert len([r for r in unmappable_items(store, m.id) if r["reason"] == "collision"]) == 1


# --------------------------------------------------------------------------- case 6

def test_case6_a_backfill_stalled_past_its_lease_writes_nothing_after_the_abort_retire(dynalite, dynalite_server,
                                                                                      unique_name):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c",
                                       mid=unique_name)
    shim = Shim(dynalite, mapper, m.table, writer="app")
    for i in range(10):
        shim.seed(logical("sensor", i))
    before = scan_all(dynalite, m.table)

    a_data = fast_dynamo(dynalite_server.endpoint)
    a_store = ControlStore(fast_dynamo(dynalite_server.endpoint), store.table)
    freezer = Freezer(a_data, "budget")     # stalled where the budget sleeps, after the page's lease check
    a_budget = freezer.budget(CapacityBudget().attach(a_data, m.table))
    a_page = Backfill(a_data, a_store, m.id, mapper, m.table, a_budget, page_size=100).page
    a = _engine(a_store, m.id, a_page, "A", a_data,
                guard=phase_guard(a_store, m.id, "backfill", (Phase.BACKFILL,), min_interval=0))
    thread_a, out_a = _start(a)
    assert freezer.frozen.wait(WAIT)

    transition(store, m.id, Action.ABORT, allow_no_shims=True)  # the operator aborts; the fleet (none here) acknowledged
    started = time.monotonic()
    while True:  # as an operator would: retry a refused cleanup until it runs (bounded)
        try:
            result = run_job(CLEANUP, dynalite, store, m.id, JobOptions(segments=1, workers=1, lease_seconds=30))
            break
        except errors.RefusedTransition:
            assert time.monotonic() - started < WAIT
            time.sleep(0.5)
    assert result.done and store.load_state(m.id).retired
    waited = time.monotonic() - started

    freezer.release.set()                   # A wakes up past its deadline
    thread_a.join(WAIT)
    assert not thread_a.is_alive() and "error" not in out_a, out_a
    after = scan_all(dynalite, m.table)
    copies = [i for i in after.values() if NEW_COPY_ATTR in i]
    assert copies == [] and after == before
    assert freezer.sent_after_release == 0
    # The cleanup waited for A's lease to stay unchanged for lease + A's longest request.
    assert waited >= LEASE + a_data.attempt_seconds - 0.5


def test_case6_retire_refuses_while_a_backfill_lease_may_still_write(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c",
                                       mid=unique_name)
    engine = SegmentEngine(store, m.id, "backfill", 1, 1, lambda ctx, key: ({}, None), workers=1,
                           lease_seconds=LEASE, max_request_seconds=0.5, invocation="held")
    engine.start_run()
    assert engine.claim(engine.records()[0], "elsewhere:1:held:0")   # held, never released (a stalled worker)
    transition(store, m.id, Action.ABORT, allow_no_shims=True)
    with pytest.raises(errors.RefusedTransition, match=r"lease.*wait \d+s more"):
        retire(store, m.id)
    assert not store.load_state(m.id).retired
    started = time.monotonic()
    assert retire(store, m.id, lease_wait=WAIT).retired      # waiting: once the lease stayed quiet long enough
    assert time.monotonic() - started >= LEASE + 0.5 - 0.2


# --------------------------------------------------------------------------- case 12 (leases)

def test_a_claimant_whose_wall_clock_runs_ahead_does_not_take_a_live_lease_early(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c",
                                       mid=unique_name)
    holder = SegmentEngine(store, m.id, "backfill", 1, 1, lambda ctx, key: ({}, None), workers=1,
                           lease_seconds=LEASE, max_request_seconds=0.5, invocation="holder")
    holder.start_run()
    lease, _, _ = holder.claim(holder.records()[0], "holder-host:1:holder:0")
    # An hour ahead: by its wall clock the holder's lease_expires is long past.
    skewed = SegmentEngine(store, m.id, "backfill", 1, 1, lambda ctx, key: ({}, None), workers=1,
                           lease_seconds=LEASE, max_request_seconds=0.5, invocation="skewed",
                           clock=lambda: time.time() + 3600)
    assert skewed.claim(skewed.records()[0], "skewed-host:1:skewed:0") is None
    # The holder renews (a checkpoint) within its lease: the token changes, the watch restarts.
    time.sleep(LEASE * 0.6)
    holder.checkpoint(lease, {"PK": {"S": "x"}, "SK": {"S": "y"}}, {})
    time.sleep(LEASE * 0.6)
    assert skewed.claim(skewed.records()[0], "skewed-host:1:skewed:0") is None   # alive: not taken
    # Then the holder stalls: once its token stayed unchanged for a whole lease, it may be taken.
    time.sleep(LEASE + 0.1)
    taken = skewed.claim(skewed.records()[0], "skewed-host:1:skewed:0")
    assert taken is not None and taken[2].takeover


# --------------------------------------------------------------------------- leftovers of a retired migration

def test_cleanup_removes_marked_copies_a_retired_migration_left_behind(dynalite, unique_name):
    """A copy marked with a retired migration's id (left by anything that outlived its abort)
    is removed by the next migration's cleanup pass -- unless a later writer stamped it with a
    version newer than the retire, which is kept."""
    from reshard.core.migration import parse
    from reshard.core.versions import VersionClock
    from tests.backfill_support import migration_text

    control = unique_name + "-c"
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=control, mid=unique_name + "-a")
    transition(store, m.id, Action.ABORT, allow_no_shims=True)
    assert run_job(CLEANUP, dynalite, store, m.id, JobOptions(segments=1, workers=1, lease_seconds=30)).done
    assert store.load_state(m.id).retired
    stale = mapper.remap(mapper.to_physical(logical("sensor", 1), mapper.old))[0]   # marked with m.id
    later = mapper.remap(mapper.to_physical(logical("sensor", 2), mapper.old))[0]
    later["_rs_v"] = {"S": VersionClock("later").next()}
    for item in (stale, later):
        dynalite.call("put_item", TableName=m.table, Item=item)

    # A second migration of the same table (another id), aborted: its cleanup pass sweeps them.
    second = parse(migration_text("sensor", m.table, unique_name + "-b"))
    store.register(second)
    transition(store, second.id, Action.ABORT, allow_no_shims=True)
    result = run_job(CLEANUP, dynalite, store, second.id, JobOptions(segments=1, workers=1, lease_seconds=30))
    left = scan_all(dynalite, m.table)
    keys = {str(key_of(i, mapper.new.key_attrs)) for i in left.values()}
    assert str(key_of(stale, mapper.new.key_attrs)) not in keys
    assert str(key_of(later, mapper.new.key_attrs)) in keys
    assert result.done and result.totals["retired_copies_removed"] == 1
