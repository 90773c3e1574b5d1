"""Verify vs a shim write still in flight: the settle window (a time fence).

In the backfill phase a shim writes the old copy, then mirrors it to the new layout.
Verify must not report the gap between the two while the mirror can still land: it
waits until the same versions were seen for the largest write bound the shims publish
(``reshard.core.settle``). A shim with small bounds keeps these tests short.
"""

from __future__ import annotations

import json
import re
import threading
import time

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.control.fleet import heartbeats
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.verify import VERIFY
from reshard.shim.table import ShardedTable
from tests.backfill_support import setup_migration

FAST = dict(segments=1, workers=1, page_size=50)
ITEM = {"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:01:00Z", "temp": 7}


def small_shim_dynamo(endpoint: str) -> Dynamo:
    """One attempt <= 0.5 s, two attempts within 0.2 s: a write bound of about 2 s."""
    return Dynamo(endpoint_url=endpoint, region="us-east-1", connect_timeout=0.2, read_timeout=0.3,
                  retry=RetryPolicy(max_attempts=2, max_seconds=0.2, base_seconds=0.01, max_backoff_seconds=0.05))


class MirrorGate:
    """A botocore ``before-send`` hook on the shim's client: holds (or fails) the mirror
    PutItem -- the one that carries the new-copy marker -- until released."""

    def __init__(self, dynamo: Dynamo, fail: bool = False):
        self.held, self.release, self.fail = threading.Event(), threading.Event(), fail
        dynamo.client.meta.events.register("before-send.dynamodb.PutItem", self._hook)

    def _hook(self, request, **_):
        if b"_rs_new" not in (request.body or b""):
            return None
        self.held.set()
        if self.fail:
            raise errors.AWSError("put_item", "InternalServerError", "the test drops the mirror write")
        assert self.release.wait(10), "the mirror was never released"
        return None


def _setup(dynalite, dynalite_server, unique_name, fail=False):
    ctl = f"{unique_name}-ctl"
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=ctl)
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**FAST)).done  # empty: done at once
    shim_dynamo = small_shim_dynamo(dynalite_server.endpoint)
    gate = MirrorGate(shim_dynamo, fail=fail)
    t = ShardedTable(m, shim_dynamo, control_table=ctl, refresh_seconds=0.5)
    assert t.phase == "backfill"
    [beat] = heartbeats(store, m.id)
    window = beat.settle_seconds
    assert 1.0 < window < 3.0, window  # published by the shim: its attempt + two whole calls
    result: dict = {}

    def write():
        try:
            t.put_item(Item=ITEM)
            result["ok"] = True
        except errors.ReshardError as e:
            result["error"] = e

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert gate.held.wait(5), "the shim never sent its mirror write"
    return m, store, t, gate, writer, result, window


def test_a_mirror_held_past_the_quick_rechecks_but_within_the_window_is_not_reported(
        dynalite, dynalite_server, unique_name):
    """The old copy landed, the mirror is held in flight for longer than the quick
    re-reads take (0.05+0.1+0.15 s of pauses) but less than the shim's write bound.
    Before the settle window, verify reported it ``missing`` after its quick re-reads."""
    m, store, t, gate, writer, result, window = _setup(dynalite, dynalite_server, unique_name)
    slept = []

    def sleep(s):
        slept.append(s)
        if sum(slept) > 0.35:  # past every quick re-read: now let the mirror land
            gate.release.set()
        time.sleep(s)

    try:
        start = time.monotonic()
        v = run_job(VERIFY, dynalite, store, m.id, JobOptions(**FAST), sleep=sleep)
        elapsed = time.monotonic() - start
        assert gate.release.is_set(), "verify decided before the mirror was released"
        writer.join(5)
        assert result.get("ok"), result
        assert v.passed, (v.differences, v.examples)
        assert v.counts.get("settled", 0) >= 1
        assert elapsed < window + 2.0, elapsed
    finally:
        gate.release.set()
        t.close()


def test_a_mirror_that_never_lands_is_reported_after_the_window(dynalite, dynalite_server, unique_name):
    """The shim's mirror write fails: the new copy is really missing. Verify reports it,
    but only once it saw the same versions for the whole window, not before."""
    m, store, t, gate, writer, result, window = _setup(dynalite, dynalite_server, unique_name, fail=True)
    try:
        writer.join(5)
        assert "error" in result, result  # the application saw its write fail
        start = time.monotonic()
        v = run_job(VERIFY, dynalite, store, m.id, JobOptions(**FAST))
        elapsed = time.monotonic() - start
        assert not v.passed and v.differences.get("missing") == 1, v.differences
        assert elapsed >= window, (elapsed, window)
        assert elapsed < window + 3.0, (elapsed, window)
        [example] = v.examples
        assert "settle window" in example["detail"], example
    finally:
        t.close()


def test_settle_seconds_overrides_the_published_window(dynalite, dynalite_server, unique_name):
    """``--settle-seconds 0`` (the option): the quick re-reads only, reported at once."""
    m, store, t, gate, writer, result, window = _setup(dynalite, dynalite_server, unique_name, fail=True)
    try:
        writer.join(5)
        start = time.monotonic()
        v = run_job(VERIFY, dynalite, store, m.id, JobOptions(**FAST, settle_seconds=0))
        assert time.monotonic() - start < window
        assert v.differences.get("missing") == 1, v.differences
    finally:
        t.close()


def test_the_settle_wait_says_what_it_waits_for_and_ctrl_c_abandons_it(dynalite, dynalite_server, unique_name):
    """Issue 27 point 12: verify waited out a 127 s window per page in silence, and Ctrl-C waited
    with it. The page now says what it waits for (which items, the window, the time left) while
    it waits, and a stop cuts the wait short: the page is abandoned (not checkpointed: the next
    run redoes it), its lease released, the command interrupted."""
    import signal

    from reshard.control.runs import segment_records
    from reshard.core.leases import FREE
    from reshard.jobs.subscribers import EventLog, Subscriber

    m, store, t, gate, writer, result, window = _setup(dynalite, dynalite_server, unique_name, fail=True)
    main_thread = threading.main_thread().ident
    log = EventLog()

    class CtrlC(Subscriber):
        """Presses Ctrl-C once the page has said it waits for the settle window."""

        def on_wait(self, segment, what):
            if "settle window" in what and not log.kinds("stopping"):
                signal.pthread_kill(main_thread, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        writer.join(5)
        start = time.monotonic()
        try:
            run_job(VERIFY, dynalite, store, m.id, JobOptions(**FAST, settle_seconds=60), subscribers=[log, CtrlC()])
            raise AssertionError("not interrupted")
        except KeyboardInterrupt:
            pass
        elapsed = time.monotonic() - start
    finally:
        signal.signal(signal.SIGINT, previous)
        t.close()
    waits = [w for w in log.kinds("wait") if "settle window" in w[2]]
    assert waits, log.events
    segment, what = waits[0][1:]
    assert segment == 1 and re.match(r"settle window: \d+s left of 60s for 1 item\(s\) seen differing \(e\.g\. "
                                     r"sensor_id=s-1, ts=2024-10-27T15:01:00Z, event_id=e-1\), reported only if "
                                     r"unchanged that long", what), what  # the join segment
    assert int(what.split()[2].rstrip("s")) <= 60
    assert log.kinds("stopping") == [("stopping", "stopping: finishing the page in flight, releasing leases")]
    assert elapsed < 45, elapsed  # the 60 s window was not waited out (printed: it takes ~1 s)
    print(f"settle wait interrupted after {elapsed:.1f}s")
    recs = segment_records(store, m.id, "verify", 1, 2)
    assert all(r.owner == FREE for r in recs) and not recs[1].done and recs[1].checkpoint is None
