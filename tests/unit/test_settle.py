"""The settle window's pure rule (reshard.core.settle) and what shims publish for it."""

from __future__ import annotations

from reshard.aws.dynamo import SHIM_RETRIES, Dynamo, RetryPolicy
from reshard.control.records import Heartbeat
from reshard.core.settle import (ASSUMED_SHIM_RETRY_SECONDS, Watch, assumed_write_seconds, decide,
                                 settle_window, shim_write_seconds)


def test_same_versions_are_reported_only_after_two_looks_and_the_whole_window():
    w = Watch()
    w.observe(("a", "b"), 10.0)
    assert decide(w, 10.0, 2.0, max_changes=3, pause=0.05) == ("wait", 10.05)  # a second look first
    w.observe(("a", "b"), 10.05)
    verdict, at = decide(w, 10.05, 2.0, max_changes=3, pause=0.05)
    assert verdict == "wait" and 10.05 < at <= 12.0  # looked at again soon, never later than the window's end
    w.observe(("a", "b"), 11.99)
    assert decide(w, 11.99, 2.0, max_changes=3, pause=0.05)[0] == "wait"
    w.observe(("a", "b"), 12.0)
    assert decide(w, 12.0, 2.0, max_changes=3, pause=0.05) == ("report", 12.0)


def test_a_change_restarts_the_window_and_too_many_changes_report_a_hot_item():
    w = Watch()
    w.observe(("a", None), 0.0)
    w.observe(("a", None), 1.0)
    w.observe(("b", None), 1.5)  # the in-flight write moved on: timed afresh from here
    assert (w.since, w.looks, w.changes) == (1.5, 1, 1)
    w.observe(("b", None), 2.0)
    assert decide(w, 2.0, 1.0, max_changes=3, pause=0.05)[0] == "wait"  # 0.5 s of the 1 s window
    w.observe(("c", None), 2.1)
    w.observe(("d", None), 2.2)
    assert decide(w, 2.2, 1.0, max_changes=3, pause=0.05) == ("changing", 2.2)


def test_a_zero_window_is_the_old_quick_recheck():
    w = Watch()
    w.observe(("a",), 0.0)
    assert decide(w, 0.0, 0.0, max_changes=1, pause=0.0)[0] == "wait"
    w.observe(("a",), 0.0)
    assert decide(w, 0.0, 0.0, max_changes=1, pause=0.0)[0] == "report"


def test_the_window_is_the_largest_published_bound_and_zero_without_shims():
    assert settle_window([]) == 0.0
    assert settle_window([2.0, 7.5, 3.0]) == 7.5


def test_shims_publish_their_whole_write_bound_and_silent_ones_are_assumed():
    d = Dynamo(region="us-east-1", retry=SHIM_RETRIES, connect_timeout=1, read_timeout=2)
    # The last attempt may start one backoff after the policy's total time, then take a whole attempt.
    assert d.max_request_seconds == SHIM_RETRIES.max_seconds + SHIM_RETRIES.max_backoff_seconds + 3
    assert shim_write_seconds(d.attempt_seconds, d.max_request_seconds) == 3 + 2 * 14
    tiny = Dynamo(region="us-east-1", retry=RetryPolicy(max_attempts=2, max_seconds=60, max_backoff_seconds=1),
                  connect_timeout=1, read_timeout=2)
    assert tiny.max_request_seconds == 2 * 3 + 1  # every attempt and backoff, when fewer than the time allows
    beat = dict(instance="i", host="h", pid=1, phase="backfill", phase_version=3, at=0.0, liveness_seconds=30.0)
    assert Heartbeat(**beat, request_seconds=3.0, write_seconds=31.0).settle_seconds == 31.0
    assert Heartbeat(**beat, request_seconds=3.0).settle_seconds == assumed_write_seconds(3.0) \
        == 3 + 2 * (ASSUMED_SHIM_RETRY_SECONDS + 3)
    assert Heartbeat(**beat).settle_seconds == assumed_write_seconds(0.0) > 100  # nothing said: 35 s attempts
