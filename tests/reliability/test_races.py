"""Races: a shim cut off from the control table, two backfills and a verify at once.

Four `advance` processes at once are covered by
tests/integration/test_control_races.py::test_four_advance_processes_at_once and
::test_four_plain_advance_processes_leave_a_chain (not repeated here).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from reshard import errors
from reshard.control.store import ControlStore
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.shim.table import ShardedTable
from reshard.control import fleet

from tests.backfill_support import setup_migration
from tests.integration.test_backfill_dynalite import _cli, _env
from tests.reliability.chaos import FaultProxy
from tests.reliability.lifecycle import sensor_workload

FAST = RetryPolicy(max_attempts=2, max_seconds=1.0, base_seconds=0.01, max_backoff_seconds=0.05)


def test_a_shim_cut_off_from_the_control_table_stops_writing_and_leaves_the_census(
        dynalite, dynalite_server, unique_name, tmp_path):
    ctl = f"{unique_name}-ctl"
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=ctl, mid=unique_name)
    w = sensor_workload()
    with FaultProxy(dynalite_server.port, seed=11, throttle=0, error5xx=0, split=0) as proxy:
        cut = ShardedTable(m, Dynamo(endpoint_url=proxy.endpoint, region="us-east-1", retry=FAST),
                           control_table=ctl, refresh_seconds=0.2, liveness_seconds=1.5, writer_id="cut")
        try:
            cut.put_item(Item=w.item(1, "before", __import__("random").Random(1)))
            assert {h.instance for h in fleet.census(store, m.id, 4).live} == {"cut"}
            proxy.blocked_tables.add(ctl)          # the data table stays reachable
            cut_at = time.monotonic()
            # The window counts from the start of the last refresh that succeeded, which on a
            # loaded machine may be well before the cut (the refresh thread can be starved).
            last_ok_at_cut = cut._phases._last_ok
            accepted_after_window = 0
            refused = None
            for i in range(400):                    # bounded: ~4 s at most
                try:
                    cut.put_item(Item=w.item(2 + i, f"during-{i}", __import__("random").Random(i)))
                    if time.monotonic() - cut_at > 1.5 + 0.3:
                        accepted_after_window += 1
                except errors.ShimUnavailable as e:
                    refused = (time.monotonic() - cut_at, str(e))
                    break
                time.sleep(0.01)
            assert refused is not None, "the cut-off shim kept accepting writes"
            assert accepted_after_window == 0
            # not before its liveness window, counted from the last refresh known good at the cut
            assert refused[0] >= 1.5 - (cut_at - last_ok_at_cut)
            assert "liveness window 1.5s" in refused[1] and "stale phase" in refused[1]
            with pytest.raises(errors.ShimUnavailable):
                cut.get_item(Key=w.key(1)).get("Item")
            # Its heartbeat is no longer renewed: a census that watched it (on its own clock,
            # here an injected one, not to wait ~37 s) drops it once it stayed unchanged for
            # the liveness window + the shim's longest request (its reported attempt bound).
            beat, = fleet.heartbeats(store, m.id)
            assert beat.instance == "cut" and beat.request_seconds == cut.dynamo.attempt_seconds
            t = [0.0]
            later = ControlStore(dynalite, ctl, monotonic=lambda: t[0])
            assert [h.instance for h in fleet.census(later, m.id, 4).live] == ["cut"]  # first look: live
            t[0] += beat.silence_seconds + 0.1
            census = fleet.census(later, m.id, 4)
            assert census.live == () and [h.instance for h in census.expired] == ["cut"]
            print(f"\n[cut-off shim] refused after {refused[0]:.2f}s: {refused[1]}; "
                  f"blocked control calls: {proxy.counts['blocked']}")
            proxy.blocked_tables.clear()            # reconnected: it serves again after a refresh
            assert cut.refresh()
            cut.put_item(Item=w.item(1, "after", __import__("random").Random(2)))
        finally:
            proxy.blocked_tables.clear()
            cut.close()


def test_two_backfills_and_a_verify_at_once(dynalite, dynalite_server, unique_name, tmp_path):
    ctl = f"{unique_name}-ctl"
    path = tmp_path / "m.toml"
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=ctl, mid=unique_name, path=path)
    from tests.backfill_support import Shim, logical
    shim = Shim(dynalite, mapper, m.table)
    reqs = []
    for i in range(1500):
        it = logical("sensor", i)
        p = mapper.to_physical(it, mapper.old)
        shim.model[shim.ident(it)] = p
        reqs.append({"PutRequest": {"Item": p}})
    dynalite.batch_write(m.table, reqs)
    backfill = _cli(dynalite_server.endpoint, ctl, "--output", "json", "backfill", m.id, "--segments", "8",
                    "--workers", "2", "--page-size", "50", "--max-wcu", "120")  # the run's: 60 each
    verify = _cli(dynalite_server.endpoint, ctl, "--output", "json", "verify", m.id, "--segments", "4")
    procs = [subprocess.Popen(backfill, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(1.0)
    v = subprocess.run(verify, env=_env(), capture_output=True, text=True, timeout=120)
    from reshard.control.runs import backfill_progress as status
    unfinished = not (status(store, m.id) or {}).get("finished_at")
    assert unfinished, "the backfill finished before verify returned: the race did not happen (slow it down)"
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    print(f"\n[backfill+verify] verify during the backfill: exit {v.returncode}: {v.stderr.strip()[:300]}")
    # Either verify refuses clearly (exit 2, one line) while the backfill is unfinished, or it runs
    # and reports the not-yet-copied items as differences (exit 1) -- it must never pass (exit 0)
    # on a half-copied table, and must not crash.
    assert v.returncode in (1, 2), (v.returncode, v.stdout[-500:], v.stderr)
    if v.returncode == 2:
        errs = [l for l in v.stderr.splitlines() if l.startswith("reshard: error:")]
        assert len(errs) == 1 and "backfill" in errs[0] and "Traceback" not in v.stderr, v.stderr
    after = subprocess.run(verify, env=_env(), capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, (after.stdout[-1000:], after.stderr)
