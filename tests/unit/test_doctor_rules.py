"""The doctor's pure rules (reshard.core.doctor) and the strip pass's decision, with literals."""

from __future__ import annotations

from reshard.core import doctor as rules
from reshard.core.doctor import MigrationFacts
from reshard.core.layout import strip_action
from reshard.core.leases import SegmentRecord
from reshard.core.phases import Phase

BACKFILL = MigrationFacts("m1", "T", Phase.BACKFILL, 4, active=True)
COMPLETE = MigrationFacts("m1", "T", Phase.COMPLETE, 8, active=False)
HELD = SegmentRecord(0, exists=True, owner="h:1:w0", lease_expires=1000.0, lease_counter=3)


def test_a_live_lease_of_the_running_run_is_no_finding():
    assert rules.lease_finding(BACKFILL, "backfill", 1, HELD, run_finished=False, latest_run=1, now=900.0) is None


def test_a_lease_is_orphaned_when_nobody_will_resume_its_run():
    cases = [(COMPLETE, "backfill", False, 1, "backfill cannot run in complete"),
             (MigrationFacts("m1", "T", Phase.CLEANUP, 6, True), "backfill", False, 1, "backfill cannot run in cleanup"),
             (BACKFILL, "backfill", True, 1, "its run is finished"),
             (BACKFILL, "backfill", False, 2, "run 2 superseded it")]
    for m, job, finished, latest, why in cases:
        f = rules.lease_finding(m, job, 1, HELD, run_finished=finished, latest_run=latest, now=900.0)
        assert (f.kind, f.detail, f.repairable) == ("orphaned_lease", f"orphaned: {why}", True)
        assert f.ref == {"job": job, "run": 1, "segment": 0, "owner": "h:1:w0", "counter": 3, "quiet": 95.0}


def test_an_expired_lease_is_judged_by_its_holders_clock_and_says_so():
    f = rules.lease_finding(BACKFILL, "backfill", 1, HELD, run_finished=False, latest_run=1, now=1030.0)
    assert f.kind == "expired_lease" and f.detail == "expired 30 s ago by its holder's clock"
    assert rules.lease_finding(BACKFILL, "backfill", 1, SegmentRecord(0, True, "-"), run_finished=False,
                               latest_run=1, now=2000.0) is None


def test_runs_resumable_or_abandoned():
    kw = dict(finished=False, abandoned=False, latest_run=2, segments=8)
    assert rules.run_finding(BACKFILL, "backfill", 2, held_leases=1, **kw) is None  # being worked on
    f = rules.run_finding(BACKFILL, "backfill", 2, held_leases=0, **kw)
    assert (f.kind, f.fix, f.repairable) == ("unfinished_run", "reshard backfill m1 --segments 8", False)
    f = rules.run_finding(BACKFILL, "backfill", 1, held_leases=0, **kw)
    assert (f.kind, f.repairable) == ("abandoned_run", True) and "run 2 superseded it" in f.detail
    assert rules.run_finding(COMPLETE, "verify", 2, held_leases=0, **kw).kind == "abandoned_run"
    # strip-bookkeeping runs in complete: its unfinished latest run is resumable, not abandoned.
    f = rules.run_finding(COMPLETE, "strip-bookkeeping", 2, held_leases=0, **kw)
    assert (f.kind, f.fix) == ("unfinished_run", "reshard cleanup m1 --strip-bookkeeping --segments 8")
    assert rules.run_finding(BACKFILL, "backfill", 1, held_leases=0, **{**kw, "abandoned": True}) is None


def test_shims_stale_or_foreign():
    assert rules.shim_finding(BACKFILL, "i", "i", 4, active_on_table="m1", silence=65) is None
    assert rules.shim_finding(BACKFILL, "i", "i", 3, active_on_table="m1", silence=65).kind == "stale_shim"
    assert rules.shim_finding(COMPLETE, "i", "i", 8, active_on_table=None, silence=65) is None  # steady after complete
    f = rules.shim_finding(COMPLETE, "i", "i", 8, active_on_table="m2", silence=65)
    assert f.kind == "foreign_shim" and "'m2' is active" in f.detail


def test_locks():
    assert rules.lock_finding("T", "m1", BACKFILL) is None
    assert rules.lock_finding("T", "m1", COMPLETE).detail == "names migration 'm1', which is complete"
    assert rules.lock_finding("T", "x", None).ref["missing"] is True
    assert rules.missing_lock_finding(BACKFILL, "m1") is None
    assert rules.missing_lock_finding(BACKFILL, None).repairable
    assert not rules.missing_lock_finding(BACKFILL, "m2").repairable
    assert rules.missing_lock_finding(COMPLETE, None) is None


def test_tombstones_and_retired_copies():
    tomb = lambda ms: {"_rs_del": {"BOOL": True}, "_rs_v": {"S": f"{ms:013d}.000000.w"}}
    assert rules.leftover_tombstone(tomb(5), None)  # no active migration: every tombstone
    cutoff = rules.tombstone_cutoff_ms(BACKFILL, created_at=10_000.0)
    assert cutoff == (10_000 - 3600) * 1000
    assert rules.leftover_tombstone(tomb(cutoff - 1), cutoff) and not rules.leftover_tombstone(tomb(cutoff), cutoff)
    assert not rules.leftover_tombstone({"_rs_v": {"S": "0000000000001.000000.w"}}, None)
    copy = lambda ms: {"_rs_new": {"S": "gone"}, "_rs_v": {"S": f"{ms:013d}.000000.w"}}
    assert rules.retired_copy_of(copy(5000), {"gone"}) == "gone"
    # A version whose wall time is after the retire is a writer whose clock runs ahead of the
    # operator's: the marker alone decides (issue 25 case 6), never the version's wall time.
    assert rules.retired_copy_of(copy(5_000_000_000_000), {"gone"}) == "gone"
    assert rules.retired_copy_of({"_rs_new": {"S": "gone"}}, {"gone"}) == "gone"
    assert rules.retired_copy_of(copy(1), {"other"}) is None


def test_finding_line_names_the_fix():
    f = rules.lock_finding("T", "m1", COMPLETE)
    assert f.line() == ("stale_lock: m1: table 'T' lock: names migration 'm1', which is complete -> "
                        "reshard doctor --repair (deletes it only while it still names 'm1')")


def test_strip_action():
    assert strip_action({"PK": {"S": "a"}}) == ("clean", ())
    assert strip_action({"PK": {"S": "a"}, "_rs_del": {"BOOL": True}, "_rs_v": {"S": "v"}}) == ("delete", ())
    assert strip_action({"_rs_v": {"S": "v"}, "_rs_new": {"S": "m"}, "_rs_src": {"S": "k"}}) == \
        ("strip", ("_rs_v", "_rs_new", "_rs_src"))


def test_a_foreign_row_is_a_manual_finding_with_the_inspect_and_delete_commands():
    f = rules.foreign_row_finding("ctl", "S#m1", "S#a", "control row ('S#m1', 'S#a') says instance 'b' but sits "
                                  "under 'a' (forged, or copied from another row): refusing to act on it")
    assert (f.kind, f.migration, f.repairable) == ("foreign_row", "m1", False)
    assert f.detail.startswith("says instance 'b'")
    assert "aws dynamodb get-item --table-name ctl --key " in f.fix and "aws dynamodb delete-item" in f.fix
    assert rules.foreign_row_finding("ctl", "J#m-2#verify", "R#verify#000001", "x").migration == "m-2"
    assert rules.foreign_row_finding("ctl", "X#y", "z", "x").migration == ""
    assert "foreign_row" in rules.KINDS
