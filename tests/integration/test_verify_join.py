"""verify's join across hosts, on dynalite: the records a scan segment leaves are on the host
that scanned it; the host that runs the join scans again every segment whose records it
does not hold whole, so a run shared by several hosts (or resumed after a lost disk) judges
every item. Without that rescan the joining host would see no records and pass a table
with a missing copy."""

from __future__ import annotations

import threading

from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import SegmentEngine
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.verify import VERIFY, Verifier

from tests.backfill_support import setup_migration
from tests.integration.test_interleavings_verify import _with_a_missing_copy


def test_the_join_on_another_host_scans_again_what_it_lacks(dynalite, unique_name, tmp_path):
    m, mapper, store, _shim, _x, new_key, _ = _with_a_missing_copy(dynalite, unique_name)
    opts = dict(segments=2, workers=1, page_size=3, rechecks=2, recheck_pause=0.0)
    # Host A scans both segments (records under its own directory), then dies at the join.
    a = Verifier(dynalite, store, m.id, 1, mapper, m.table, CapacityBudget().attach(dynalite, m.table),
                 JobOptions(**opts), sleep=lambda s: None, records_dir=tmp_path / "host-a")

    def page(ctx, key):
        if ctx.segment == 2:
            engine.stop_event.set()
            raise RuntimeError("host A is gone before the join")
        return a.page(ctx, key)

    engine = SegmentEngine(store, m.id, "verify", 1, 3, page, workers=1, invocation="A", join=True)
    first = engine.run_all()
    assert [r.done for r in first.segments] == [True, True, False]
    assert first.totals["checked"] >= 8 and first.totals["pages"] >= 4  # several pages per segment
    assert sorted(p.name for p in (tmp_path / "host-a").iterdir() if p.suffix == ".sqlite") == \
        ["seg-00000.sqlite", "seg-00001.sqlite"]

    # Host B joins the same run with an empty records directory: it must scan both segments again.
    scans = []
    dynalite.client.meta.events.register("before-call.dynamodb.Scan", lambda **kw: scans.append(1))
    try:
        result = run_job(VERIFY, dynalite, store, m.id, JobOptions(**opts, records_dir=str(tmp_path / "host-b")),
                         sleep=lambda s: None)
    finally:
        dynalite.client.meta.events.unregister("before-call.dynamodb.Scan")
    assert result.run == 1 and result.finished and not result.passed
    assert {k: n for k, n in result.differences.items() if n} == {"missing": 1}
    assert result.examples[0]["new_key"] == new_key
    assert result.checked == first.totals["checked"]  # the rescan records; it does not count twice
    assert len(scans) >= first.totals["pages"]  # every page of both segments, read again
    assert list((tmp_path / "host-b").rglob("run-*")) == []  # the run's records are gone with its join


def test_a_join_segment_is_claimed_only_after_every_other_and_never_after_a_failed_one(dynalite, unique_name):
    """The engine's ``join=True`` (verify's last segment): two workers, three scan segments; the
    join runs once, after every scan page. A scan segment that fails for good in this
    invocation leaves the join unclaimed, and the run returns (it does not wait for ever)."""
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=f"{unique_name}-ctl")
    seen, lock = [], threading.Lock()

    def page(ctx, key):
        with lock:
            seen.append(ctx.segment)
        return {"n": 1}, None

    engine = SegmentEngine(store, m.id, "verify", 1, 4, page, workers=2, lease_seconds=30, join=True,
                           max_request_seconds=1, sleep=lambda s: None)
    result = engine.run_all()
    assert result.done and seen[-1] == 3 and sorted(seen) == [0, 1, 2, 3]

    def failing(ctx, key):
        with lock:
            seen.append(ctx.segment)
        if ctx.segment == 1:
            raise RuntimeError("this segment fails")
        return {"n": 1}, None

    seen.clear()
    engine = SegmentEngine(store, m.id, "verify", 2, 4, failing, workers=2, lease_seconds=30, join=True,
                           max_request_seconds=1, max_attempts=1, sleep=lambda s: None)
    result = engine.run_all()
    assert not result.done and 3 not in seen and sorted(set(seen)) == [0, 1, 2]
    assert [r.segment for r in result.failed] == [1]
