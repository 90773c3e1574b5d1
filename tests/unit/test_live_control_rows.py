"""Pure parts of the live control and the job metrics: the control row's codec and checks, the
EMF document of a flush, and the aggregation of several processes' budget beats."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.control.records import ControlChange, Hold, RunControl, check_row
from reshard.core.metrics import JOB_METRICS
from reshard.jobs.metrics import JobMetrics, emf_lines, phase_ordinal


def control() -> RunControl:
    changes = (ControlChange(1, "throttle", "a", 10.0, {"max_wcu": None}, {"max_wcu": 40.0}),
               ControlChange(2, "pause", "b", 20.0, {"paused": False}, {"paused": True, "release_leases": True}))
    return RunControl("mig", "backfill", 3, 2, 40.0, None, True, True, "b", 20.0, changes)


def test_the_control_row_round_trips_and_says_who_did_what():
    c = control()
    back = RunControl.from_item(c.to_item())
    assert back == c
    assert back.hold == Hold("mig", "b", 20.0, True)
    assert back.set_by("max_wcu") == "a" and back.set_by("max_rcu") == ""
    assert [ch.text() for ch in back.changes] == ["max_wcu (each process's own option) -> 40",
                                                 "paused, leases released"]
    assert "`reshard resume mig`" in back.hold.reason() and "leases released" in back.hold.summary()


@pytest.mark.parametrize("field, value, why", [
    ("max_wcu", {"N": "-5"}, "outside"), ("max_wcu", {"S": "40"}, "wrong type"), ("paused", {"S": "yes"}, "wrong type"),
    ("id", {"S": "other"}, "says id"), ("job", {"S": "verify"}, "says job"), ("schema", {"N": "9"}, "schema"),
    ("changes", {"L": [{"M": {"version": {"N": "1"}}}]}, "without version, action, who or at"),
])
def test_a_control_row_with_a_wrong_field_is_refused(field, value, why):
    item = control().to_item()
    item[field] = value
    with pytest.raises(errors.ForeignControlRow, match=why):
        RunControl.from_item(item)


def test_check_row_knows_control_rows():
    check_row(control().to_item())
    with pytest.raises(errors.ForeignControlRow):
        check_row({"pk": {"S": "M#mig"}, "sk": {"S": "C#backfill#000003"}, "id": {"S": "mig"}, "job": {"S": "cleanup"}})


def test_an_emf_flush_writes_counter_increases_and_gauges():
    snap = {"scanned": 100, "copied": 80, "consumed_wcu": 90.0, "throttles": {"ThrottlingException": 3},
            "max_wcu": 50.0, "share_wcu": 25.0, "eta": None, "paused": 0, "phase": "backfill", "phase_ordinal": 3}
    before = {"scanned": 40, "copied": 30, "consumed_wcu": 35.0, "throttles": {"ThrottlingException": 1}}
    main, by_reason = emf_lines(snap, before, "mig", "backfill", 1_000)
    assert (main["ItemsScanned"], main["ItemsCopied"], main["ConsumedWriteCapacityUnits"], main["Throttles"]) == \
        (60, 50, 55.0, 2)
    assert main["WriteCapacityBudget"] == 50.0 and "EtaSeconds" not in main and main["PhaseName"] == "backfill"
    names = [m["Name"] for m in main["_aws"]["CloudWatchMetrics"][0]["Metrics"]]
    assert all(n in main for n in names) and set(names) <= {m.emf for m in JOB_METRICS}
    assert (by_reason["Reason"], by_reason["Throttles"]) == ("ThrottlingException", 2)
    assert by_reason["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Migration", "Job", "Reason"]]


def test_several_processes_beats_add_up():
    m = JobMetrics("backfill", "mig", 4)
    m.on_budget_state({"process": 1, "consumed_wcu": 10.0, "share_wcu": 20.0, "max_wcu": 40.0,
                       "throttles": {"X": 1}, "paused": False, "phase": "backfill"})
    m.on_budget_state({"process": 2, "consumed_wcu": 5.0, "share_wcu": 20.0, "max_wcu": 40.0,
                       "throttles": {"X": 2, "Y": 1}, "paused": True, "phase": "backfill"})
    m.on_page(0, {"scanned": 7, "copied": 5})
    m.on_takeover(1, "host:1:x:0")
    snap = m.snapshot()
    assert (snap["consumed_wcu"], snap["share_wcu"], snap["max_wcu"]) == (15.0, 40.0, 40.0)
    assert snap["throttles"] == {"X": 3, "Y": 1} and snap["paused"] == 1 and snap["processes"] == 2
    assert (snap["scanned"], snap["copied"], snap["takeovers"], snap["pages_redone"]) == (7, 5, 1, 1)
    assert snap["max_rcu"] is None and snap["eta"] is None


def test_phase_ordinals():
    assert [phase_ordinal(p) for p in ("planned", "backfill", "complete", "aborted", None)] == [0, 3, 6, -1, None]
