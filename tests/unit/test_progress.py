"""The tqdm subscriber: counts pages' items, shows throttle reasons, stays quiet when disabled."""

from __future__ import annotations

from reshard.jobs.subscribers import TqdmSubscriber


def test_bar_advances_by_scanned_items_and_shows_the_throttle_reason(capsys):
    sub = TqdmSubscriber(100, initial=10, enabled=True)
    sub.on_page(0, {"scanned": 25, "moved": 20})
    sub.on_page(1, {"scanned": 5})
    sub.on_throttle("throttled on BatchWriteItem: rate 400 → 200 WCU/s")
    assert sub.bar.n == 40 and sub.bar.total == 100
    assert "throttled on BatchWriteItem" in sub.bar.postfix
    sub.on_run_done(None)
    assert "40.0/100" in capsys.readouterr().err


def test_disabled_bar_prints_nothing(capsys):
    sub = TqdmSubscriber(100, enabled=False)
    sub.on_page(0, {"scanned": 25})
    sub.on_throttle("x")
    sub.on_run_done(None)
    assert sub.bar is None and capsys.readouterr() == ("", "")


# ---------------------------------------------------------------------- gh-ost style progress

import json  # noqa: E402

import pytest  # noqa: E402

from reshard import errors  # noqa: E402
from reshard.cli import formats  # noqa: E402
from reshard.control.records import RunInfo  # noqa: E402
from reshard.core.progress import Progress, describe, duration  # noqa: E402
from reshard.jobs.budget import CapacityBudget  # noqa: E402
from reshard.jobs.subscribers import ProgressReporter  # noqa: E402


def test_progress_percent_rate_and_eta():
    p = Progress(done=1200, total=20000, elapsed=8.0, done_before=0, total_source="ItemCount")
    assert (p.pct, p.rate, p.eta_seconds) == (6.0, 150.0, (20000 - 1200) / 150.0)
    assert p.text() == "1,200/20,000 items (6.0%), 150.0 items/s, ETA 2m05s"
    # a resumed run: what an earlier invocation did counts for the percent, not for the rate
    assert Progress(1200, 20000, 10.0, done_before=200).rate == 100.0
    # an estimate below what was done: capped, never past 100% or below 0 s
    assert Progress(300, 200, 3.0).pct == 100.0 and Progress(300, 200, 3.0).eta_seconds == 0.0
    assert Progress(5, None, 1.0).text() == "5 items, 5.0 items/s, total unknown (no ETA)"
    assert Progress(0, 100, 0.0).eta_seconds is None
    assert [duration(s) for s in (45, 125, 11220)] == ["45s", "2m05s", "3h07m"]
    assert describe(Progress(10, 100, 2.0).as_dict()) == "10/100 items (10.0%), 5.0 items/s, ETA 18s"


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_the_reporter_says_nothing_before_the_run_starts_then_logs_every_interval():
    said, clock = [], FakeClock()
    rep = ProgressReporter("backfill", "m1", 4, 2, total=lambda: (1000, "DescribeTable ItemCount"),
                           done_before=lambda run: 100, say=said.append, interval=10.0, clock=clock,
                           wall=lambda: 0.0)
    assert said == []  # a refused job never reaches on_run_start: no header
    rep.on_budget(lambda: "at --max-wcu 50: requests wait for the budget")
    rep.on_run_start(RunInfo("m1", "backfill", 2, 4, 0.0, None))
    assert said == ["backfill of m1: 4 segments, 2 workers on this host (run 2); about 1,000 items "
                    "(DescribeTable ItemCount)"]
    clock.t += 4
    rep.on_page(0, {"scanned": 200, "moved": 3})
    assert len(said) == 1  # not yet 10 s
    clock.t += 6
    rep.on_segment_done(0, {})
    rep.on_page(1, {"scanned": 200})
    assert said[1] == ("1970-01-01T00:00:00Z backfill m1: 500/1,000 items (50.0%), 40.0 items/s, ETA 12s; "
                       "1/4 segments done here; throttling: at --max-wcu 50: requests wait for the budget")
    clock.t += 1
    rep.on_run_done(None)  # a last line with the final numbers
    assert len(said) == 3 and said[2].split(": ", 1)[1].startswith("500/1,000 items (50.0%)")


def test_the_reporter_counts_verify_by_checked_items():
    said = []
    rep = ProgressReporter("verify", "m1", 1, 1, total=lambda: (None, "ItemCount is 0"), say=said.append,
                           interval=0.0)
    rep.on_run_start(RunInfo("m1", "verify", 1, 1, 0.0, None))
    rep.on_page(0, {"checked": 7, "scanned": 99})
    assert rep.done == 7 and said[0].endswith("total unknown (ItemCount is 0)")
    assert "7 items" in said[1] and "total unknown (no ETA)" in said[1]


def test_the_budget_says_why_it_throttles():
    clock = FakeClock()
    b = CapacityBudget(max_wcu=10, clock=clock, sleep=lambda s: None)
    assert b.throttle_reason() == ""
    with b.spend("write", 30):  # 30 units at 10/s: the bucket makes the request wait
        pass
    assert b.throttle_reason() == "at --max-wcu 10: requests wait for the budget"
    clock.t += 60
    assert b.throttle_reason() == ""  # not paced for a while
    b._local.kind = "write"
    b.lanes["write"].recent.append((clock.t, 50.0))
    b.on_throttle("put_item")  # DynamoDB said no: AIMD backs off
    assert b.throttle_reason().startswith("AIMD backing off after DynamoDB throttled: writes at 7 of 10 WCU/s")


def test_output_formats_and_query():
    data = {"migrations": [{"id": "a", "phase": "complete", "n": 1.0}, {"id": "b", "phase": "backfill", "n": None}],
            "control_table": "ctl"}
    q = formats.compile_query("migrations[?phase=='complete'].id")
    assert formats.emit_text(data, "people", "text", q) == "a"
    assert json.loads(formats.emit_text(data, "people", "json", q)) == ["a"]
    assert formats.emit_text(data, lambda: "people", None) == "people"  # no --output: the text for people
    # --output text: aws-cli's text of the document (issue 27: it printed the text for people)
    assert formats.emit_text(data, lambda: "people", "text") == \
        "ctl\nMIGRATIONS\ta\t1\tcomplete\nMIGRATIONS\tb\tNone\tbackfill"
    assert formats.emit_text(data, "people", "text", formats.compile_query("migrations[].[id, phase]")) == \
        "a\tcomplete\nb\tbackfill"
    table = formats.emit_text(data, "people", "table").splitlines()
    assert "| control_table | ctl |" in table
    assert "| id | phase    | n    |" in table and "| a  | complete | 1    |" in table
    assert "| b  | backfill | None |" in table
    with pytest.raises(errors.BadInput, match=r"--query 'jobs\[' is not a JMESPath expression"):
        formats.compile_query("jobs[")


# ---------------------------------------------------------------------- issue 27 point 11: one unit

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from reshard.core.progress import progress_done  # noqa: E402


class Done:
    done = True


def test_a_backfill_counts_the_old_layouts_items_not_the_new_copies_it_scans():
    """The issue's `6,196/4,401 (100%)`: the scan read both layouts against a total of old items."""
    said, clock = [], FakeClock()
    rep = ProgressReporter("backfill", "m1", 2, 1, total=lambda: (4401, "count stored by start"),
                           say=said.append, interval=0.0, clock=clock, wall=lambda: 0.0)
    rep.on_run_start(RunInfo("m1", "backfill", 1, 2, 0.0, None))
    # Two pages: 4,401 old items and 1,795 new-layout copies (shim writes since dual_write).
    rep.on_page(0, {"scanned": 3100, "new_layout": 1000, "moved": 1500})
    rep.on_page(1, {"scanned": 3096, "new_layout": 795})
    assert rep.done == 4401
    assert "4,401/4,401 items (100.0%)" in said[-1]


def test_segments_done_count_each_segment_once_per_run():
    """The issue's `32/16 segments done`: a cleanup that retires an aborted migration sweeps twice
    with the same reporter; each run counts its own segments."""
    said = []
    rep = ProgressReporter("cleanup", "m1", 2, 1, total=lambda: (None, ""), say=said.append, interval=0.0)
    for run in (1, 2):
        rep.on_run_start(RunInfo("m1", "cleanup", run, 2, 0.0, None))
        for seg in (0, 1, 1):  # a segment reported done twice counts once
            rep.on_segment_done(seg, {})
        rep.on_page(0, {"scanned": 1})
        assert "2/2 segments done here" in said[-1], said[-1]


def test_a_finished_run_ends_at_100_percent_against_a_high_estimate(capsys):
    """DescribeTable's ItemCount counts both layouts (or is hours old): the bar ended at 90 %."""
    said, clock = [], FakeClock()
    rep = ProgressReporter("backfill", "m1", 1, 1, total=lambda: (1000, "DescribeTable"), say=said.append,
                           interval=0.0, clock=clock, wall=lambda: 0.0)
    rep.on_run_start(RunInfo("m1", "backfill", 1, 1, 0.0, None))
    clock.t += 1
    rep.on_page(0, {"scanned": 900})
    assert "900/1,000 items (90.0%)" in said[-1]
    rep.on_run_done(Done())
    assert "900/900 items (100.0%)" in said[-1]
    bar = TqdmSubscriber(1000, enabled=True)
    bar.on_page(0, {"scanned": 950, "new_layout": 50})
    bar.on_run_done(Done())
    assert bar.bar.n == bar.bar.total == 900


@settings(max_examples=200, deadline=None)
@given(total=st.one_of(st.none(), st.integers(0, 10_000)), before=st.integers(0, 5_000),
       pages=st.lists(st.tuples(st.sampled_from(["backfill", "verify", "cleanup", "strip-bookkeeping"]),
                                st.integers(0, 3_000), st.integers(0, 3_000)), max_size=12),
       elapsed=st.floats(0, 1e5))
def test_done_never_exceeds_the_total_shown(total, before, pages, elapsed):
    """Property: whatever the pages and the estimate, done <= total, 0 <= % <= 100, ETA >= 0."""
    done = before
    for job, read, new in pages:
        counter = {"verify": "checked"}.get(job, "scanned")
        other = {"backfill": "new_layout", "verify": "new_copies", "cleanup": "new_layout"}.get(job, "x")
        n = progress_done(job, {counter: read, other: min(new, read)})
        assert 0 <= n <= read
        done += n
    p = Progress(done, total, elapsed, before).as_dict()
    if p["total"] is not None:
        assert p["done"] <= p["total"] and 0.0 <= p["pct"] <= 100.0
        assert p["estimate_low"] == (done > total)
    assert p["eta_seconds"] is None or p["eta_seconds"] >= 0
    text = describe(p)
    if p["total"]:
        shown_done, shown_total = text.split(" items")[0].split("/")
        assert int(shown_done.replace(",", "")) <= int(shown_total.replace(",", ""))


def test_the_reporter_says_what_a_worker_waits_for_at_least_every_8_seconds():
    said, clock = [], FakeClock()
    rep = ProgressReporter("verify", "m1", 3, 1, total=lambda: (100, "x"), say=said.append, interval=60.0,
                           clock=clock, wall=lambda: 0.0)
    rep.on_run_start(RunInfo("m1", "verify", 1, 3, 0.0, None))
    for _ in range(10):  # a settle wait reports every 2 s for 20 s, no page finishes
        clock.t += 2
        rep.on_wait(5, "settle window: 3 item(s) seen differing ...; 112s left")
    lines = said[1:]
    # Said when it began (t=2), then every 8 s (t=10, t=18): never 10 s without a word.
    assert len(lines) == 3 and all("waiting: segment 5: settle window: 3 item(s)" in l for l in lines), lines
    clock.t += 5  # the wait ended (no report for 3 s): the next line says nothing about it
    rep.on_page(0, {"checked": 1})
    rep.on_run_done(Done())
    assert "waiting" not in said[-1]
    rep.on_stopping("stopping: finishing the page in flight, releasing leases")
    assert said[-1] == "stopping: finishing the page in flight, releasing leases"


def test_a_request_paced_by_the_budget_says_so_at_most_once_a_second():
    """A page at a low budget can take minutes: what it waits for is said between pages."""
    clock, heard = FakeClock(), []
    b = CapacityBudget(max_wcu=10, clock=clock, sleep=lambda s: None)
    b.wait_listeners.append(heard.append)
    for _ in range(3):  # 30 units at 10/s: each request waits for the bucket
        with b.spend("write", 30):
            pass
    assert heard == ["capacity: at --max-wcu 10: requests wait for the budget"]  # the clock did not move
    clock.t += 1.5
    with b.spend("write", 30):
        pass
    assert len(heard) == 2
    said = []
    rep = ProgressReporter("backfill", "m1", 1, 1, total=lambda: (10, "x"), say=said.append, interval=60.0,
                           clock=clock, wall=lambda: 0.0)
    rep.on_budget(b.throttle_reason)
    rep.on_run_start(RunInfo("m1", "backfill", 1, 1, 0.0, None))
    rep.on_wait(None, heard[0])
    assert said[-1].endswith("; waiting: capacity: at --max-wcu 10: requests wait for the budget"), said[-1]
    assert "throttling:" not in said[-1]  # said once, not twice
