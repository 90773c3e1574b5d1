"""The backfill on moto: copy correctness, unmoved/unmappable, resume, leases, failures, races."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.control.gates import backfill_missing
from reshard.jobs.backfill import Backfill

RUN = 1  # the first backfill run of a migration
from reshard.core.phases import BACKFILL_JOB as JOB
from reshard.control.runs import unmappable_items
from reshard.jobs.budget import CapacityBudget
from reshard.control.store import ControlStore
from reshard.jobs.subscribers import EventLog
from reshard.jobs.engine import SegmentEngine, read_run
from reshard.control.transition import transition
from reshard.control import fleet
from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.backfill import BACKFILL

from tests.backfill_support import Shim, diff, expected_table, logical, scan_all, setup_migration


def _opts(**kw):
    base = dict(segments=3, workers=1, page_size=7, lease_seconds=30)
    base.update(kw)
    return JobOptions(**base)


@pytest.mark.parametrize("kind", ["sensor", "invoices", "hourly"])
def test_copy_is_exact_for_each_example_migration(moto_dynamo, kind):
    m, mapper, store = setup_migration(moto_dynamo, kind, f"T{kind}")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(40):
        shim.seed(logical(kind, i))
    for i in range(40, 50):                       # a few versioned (shim-written) items
        shim.put(logical(kind, i))
    shim.delete(logical(kind, 45))                # and a tombstone
    log = EventLog()
    before = len(scan_all(moto_dynamo, m.table))   # both layouts: the shim's mirror writes are there too
    result = run_job(BACKFILL, moto_dynamo, store, m.id, _opts(), subscribers=[log])
    assert result.done and not result.failed
    assert diff(scan_all(moto_dynamo, m.table), expected_table(mapper, shim.model)) == []
    t = result.totals
    # Every moving old item copied once; the scan also meets new-layout items (the shim's
    # mirror writes and copies made earlier in the run), which are skipped. (With a random
    # old layout, a new item on a shard < 10 also parses as old, so it counts as unmoved.)
    assert t["moved"] == sum(mapper.moves(o) for o in shim.model.values()) > 0
    assert t["scanned"] >= before and t["moved"] + t["unmoved"] + t["new_layout"] == t["scanned"]
    assert t["unmappable"] == 0 and t["new_layout"] > 0
    assert t["moved"] > 0
    assert read_run(store, m.id, JOB, RUN).finished_at is not None
    assert backfill_missing(store, store.load_state(m.id)) is None
    # A crash between the last segment and the run stamp: the next invocation stamps it.
    store.update(store.jpk(m.id, "backfill"), "R#backfill#000001", "REMOVE finished_at")
    assert "incomplete" in backfill_missing(store, store.load_state(m.id))
    run_job(BACKFILL, moto_dynamo, store, m.id, _opts())
    assert backfill_missing(store, store.load_state(m.id)) is None
    assert {e[1] for e in log.kinds("done")} == {0, 1, 2}


def test_unmoved_items_are_skipped_and_unmappable_reported_untouched(moto_dynamo):
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Tsensor")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(30):
        shim.seed(logical("sensor", i))
    unmoved = [o for o in shim.model.values() if not mapper.moves(o)]
    assert unmoved, "the sample must contain items whose key does not change"
    bad = [
        {"PK": {"S": "nohash"}, "SK": {"S": "2024"}, "event_id": {"S": "e"}},                  # unparseable key
        {"PK": {"S": "s-1#3"}, "SK": {"S": "2024-10-27T00:00:00Z"}},                           # missing event_id
    ]
    for b in bad:
        moto_dynamo.call("put_item", TableName=m.table, Item=b)
    # moto refuses items over 405,000 bytes, so the 400 KB item (exactly DynamoDB's limit,
    # over it once re-keyed) is slipped into one scan page instead of being stored.
    big = _just_fits_until_rekeyed()
    real_call, injected = moto_dynamo.call, []

    def call(op, **kw):
        resp = real_call(op, **kw)
        if op == "scan" and not injected and kw.get("Segment") == 0:
            injected.append(big)
            resp = dict(resp, Items=resp.get("Items", []) + [big])
        return resp

    moto_dynamo.call = call
    result = run_job(BACKFILL, moto_dynamo, store, m.id, _opts())
    assert result.done
    t = result.totals
    assert t["unmoved"] == len(unmoved) and t["unmappable"] == 3 and t["moved"] == 30 - len(unmoved)
    report = unmappable_items(store, m.id)
    assert sorted(r["reason"] for r in report) == ["missing-field", "too-large", "unparseable-key"]
    after = scan_all(moto_dynamo, m.table)
    assert diff(after, expected_table(mapper, shim.model, bad)) == []   # nothing written for any of them


def _just_fits_until_rekeyed() -> dict:
    """An old item of exactly 400 KB whose new partition key is one character longer."""
    from reshard.core.layout import MAX_ITEM_BYTES, hash_shard, item_size
    eid = next(f"e-big-{n}" for n in range(1000)
               if hash_shard(f"e-big-{n}", 16) < 10 <= hash_shard(f"e-big-{n}", 32))
    item = {"PK": {"S": f"s-2#{hash_shard(eid, 16)}"}, "SK": {"S": "big"}, "sensor_id": {"S": "s-2"},
            "event_id": {"S": eid}, "blob": {"S": ""}}
    item["blob"]["S"] = "y" * (MAX_ITEM_BYTES - item_size(item))
    assert item_size(item) == MAX_ITEM_BYTES
    return item


def test_resume_from_checkpoint_does_not_rescan_done_pages(moto_dynamo):
    m, mapper, store = setup_migration(moto_dynamo, "invoices", "Tinv")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(60):
        shim.seed(logical("invoices", i))
    budget = CapacityBudget()
    budget.attach(moto_dynamo, m.table)
    copier = Backfill(moto_dynamo, store, m.id, mapper, m.table, budget, page_size=5)
    pages = {"n": 0}

    def dies_after_three_pages(ctx, key):
        pages["n"] += 1
        if pages["n"] == 4:
            raise KeyboardInterrupt  # a crash mid-segment: no release, no checkpoint for page 4
        return copier.page(ctx, key)

    clock = {"t": 1000.0}

    def sleep(s):  # the test's time: the second process watches the dead worker's lease go quiet
        clock["t"] += s

    first = SegmentEngine(store, m.id, JOB, RUN, 1, dies_after_three_pages, workers=1, lease_seconds=30,
                          clock=lambda: clock["t"], invocation="first", is_dead=lambda o: False,
                          max_request_seconds=1)
    with pytest.raises(KeyboardInterrupt):
        first.run_all()
    rec = first.records()[0]
    assert rec.counters["pages"] == 3 and rec.checkpoint and rec.counters["scanned"] == 15
    clock["t"] += 31  # wall-clock expiry alone does not count: the second process must see it stay
    log = EventLog()
    second = SegmentEngine(store, m.id, JOB, RUN, 1, copier.page, workers=1, lease_seconds=30,
                           clock=lambda: clock["t"], invocation="second", subscribers=[log], sleep=sleep,
                           max_request_seconds=1)
    start = clock["t"]
    result = second.run_all()
    # Taken over only once the lease's token stayed unchanged for a whole lease on its clock.
    assert clock["t"] - start >= 30
    assert result.done
    assert log.kinds("start") == [("start", 0, True, f"lease of {rec.owner} expired")]
    # Pages 1-3 were not redone: every moving old item was copied (and counted) once.
    assert result.totals["moved"] == sum(mapper.moves(o) for o in shim.model.values())
    assert result.segments[0].takeovers == 1
    assert diff(scan_all(moto_dynamo, m.table), expected_table(mapper, shim.model)) == []


def test_segments_mismatch_is_refused(moto_dynamo):
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Tsensor")
    run_job(BACKFILL, moto_dynamo, store, m.id, _opts(segments=2))
    with pytest.raises(errors.BadInput, match="started with --segments 2"):
        run_job(BACKFILL, moto_dynamo, store, m.id, _opts(segments=4))


def test_refused_outside_backfill_phase_and_gate_says_what_is_missing(moto_dynamo):
    from reshard.core.migration import parse
    from tests.backfill_support import create_table, migration_text
    from reshard.core.layout import KeyMapper
    m = parse(migration_text("sensor", "Tsensor"))
    create_table(moto_dynamo, m.table, KeyMapper(m))
    store = ControlStore(moto_dynamo)
    store.register(m)
    with pytest.raises(errors.RefusedTransition, match="in planned"):
        run_job(BACKFILL, moto_dynamo, store, m.id, _opts())
    from reshard.core.phases import Action
    for _ in range(3):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    fleet.heartbeat(store, m.id, "app-1", "dual_read", store.load_state(m.id).phase_version - 1)
    with pytest.raises(errors.RefusedTransition, match="1 live shim"):
        run_job(BACKFILL, moto_dynamo, store, m.id, _opts(lease_wait=0))  # the operator does not wait
    fleet.forget(store, m.id, "app-1")
    assert "has not run" in backfill_missing(store, store.load_state(m.id))
    # The gate is wired into transitions: advance to cutover is refused with the backfill reason.
    with pytest.raises(errors.RefusedTransition, match="backfill has not run"):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)

    # By default the job watches a lagging shim catch up (here at its next refresh) and runs.
    fleet.heartbeat(store, m.id, "app-1", "dual_read", store.load_state(m.id).phase_version - 1, beat=1)
    naps = []

    def sleep(seconds):
        naps.append(seconds)
        fleet.heartbeat(store, m.id, "app-1", "backfill", store.load_state(m.id).phase_version, beat=2)

    assert run_job(BACKFILL, moto_dynamo, store, m.id, _opts(), sleep=sleep).done and naps


def test_expired_lease_is_taken_over_and_a_lost_lease_stops_the_worker(moto_dynamo):
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Tsensor")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(40):
        shim.seed(logical("sensor", i))
    budget = CapacityBudget()
    budget.attach(moto_dynamo, m.table)
    copier = Backfill(moto_dynamo, store, m.id, mapper, m.table, budget, page_size=4)
    clock = {"t": 5000.0}

    def sleep(s):  # B's polls advance the test's time while A is stalled
        clock["t"] += s

    log_a, log_b = EventLog(), EventLog()
    b = SegmentEngine(store, m.id, JOB, RUN, 1, copier.page, workers=1, lease_seconds=10,
                      clock=lambda: clock["t"], invocation="b", subscribers=[log_b], sleep=sleep,
                      max_request_seconds=1)
    pages_a = {"n": 0}

    def a_page(ctx, key):
        pages_a["n"] += 1
        out = copier.page(ctx, key)
        if pages_a["n"] == 2:
            # A stalls for longer than its lease; B (watching A's lease stay unchanged on its
            # own clock for a whole lease) takes the segment over and finishes it.
            assert b.run_all().done
        return out

    a = SegmentEngine(store, m.id, JOB, RUN, 1, a_page, workers=1, lease_seconds=10,
                      clock=lambda: clock["t"], invocation="a", subscribers=[log_a], max_request_seconds=1)
    result = a.run_all()
    assert [e[0] for e in log_a.events if e[0] in ("lease_lost", "page")] == ["page", "lease_lost"]
    assert pages_a["n"] == 2  # A did not touch another page after losing the lease
    assert log_b.kinds("start")[0][3].startswith("lease of ") and result.done
    assert diff(scan_all(moto_dynamo, m.table), expected_table(mapper, shim.model)) == []


def test_failing_segment_is_released_with_error_then_retried_next_run(moto_dynamo):
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Tsensor")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(20):
        shim.seed(logical("sensor", i))
    budget = CapacityBudget()
    budget.attach(moto_dynamo, m.table)
    copier = Backfill(moto_dynamo, store, m.id, mapper, m.table, budget, page_size=5)
    broken = {"on": True}

    def page(ctx, key):
        if ctx.segment == 1 and broken["on"]:
            raise errors.AWSError("scan", "InternalServerError", "boom")
        return copier.page(ctx, key)

    log = EventLog()
    # One worker: moto's conditional writes are not atomic across threads (lease races are
    # proven on dynalite, tests/integration/test_backfill_dynalite.py).
    first = SegmentEngine(store, m.id, JOB, RUN, 2, page, workers=1, max_attempts=3, invocation="one",
                          subscribers=[log], sleep=lambda s: None, poll_seconds=0)
    result = first.run_all()
    assert not result.done and [r.segment for r in result.failed] == [1]
    rec = result.failed[0]
    assert rec.attempts == 3 and "InternalServerError" in rec.last_error and rec.owner == "-"
    assert [e[3:] for e in log.kinds("failed")][-1] == (3, True)
    assert "1 failed (segments 1)" in backfill_missing(store, store.load_state(m.id))
    broken["on"] = False
    second = SegmentEngine(store, m.id, JOB, RUN, 2, page, workers=1, invocation="two")
    result = second.run_all()
    assert result.done and second.records()[1].last_error == ""
    assert diff(scan_all(moto_dynamo, m.table), expected_table(mapper, shim.model)) == []
