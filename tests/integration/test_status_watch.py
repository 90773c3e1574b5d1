"""``status`` and ``doctor`` on a steered run, and ``status --watch`` (dynalite, in-process CLI)."""

from __future__ import annotations

import json
import threading
import time

from reshard.cli.main import main
from reshard.jobs.engine import SegmentEngine

from tests.backfill_support import logical, setup_migration


def setup(dynalite, unique_name, n=20, segments=1):
    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-c", mid=unique_name)
    dynalite.batch_write(m.table, [{"PutRequest": {"Item": mapper.to_physical(logical("invoices", i), mapper.old,
                                                                              i % mapper.old.shards)}}
                                   for i in range(n)])
    SegmentEngine(store, m.id, "backfill", 1, segments, lambda ctx, key: ({}, None)).start_run()  # a run has started
    return m, store


def cli(capsys, endpoint, store, *args):
    code = main(["--endpoint-url", endpoint, "--control-table", store.table, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_status_and_doctor_show_who_paused_and_throttled_a_run(dynalite, dynalite_server, unique_name, capsys,
                                                               monkeypatch):
    m, store = setup(dynalite, unique_name)
    monkeypatch.setenv("RESHARD_OPERATOR", "alice")
    assert cli(capsys, dynalite_server.endpoint, store, "throttle", m.id, "--max-wcu", "25")[0] == 0
    code, out, _ = cli(capsys, dynalite_server.endpoint, store, "pause", m.id, "--release-leases")
    assert code == 0 and "paused, leases released" in out and "by alice" in out and "gives its segment lease back" in out
    code, out, _ = cli(capsys, dynalite_server.endpoint, store, "pause", m.id, "--release-leases")
    assert code == 0 and "nothing changed (already paused" in out  # idempotent: no new change recorded

    code, out, _ = cli(capsys, dynalite_server.endpoint, store, "--output", "json", "status", m.id)
    job = json.loads(out)["jobs"][0]
    c = job["control"]
    assert (c["paused"], c["release_leases"], c["paused_by"], c["max_wcu"], c["set_by"]["max_wcu"]) == \
        (True, True, "alice", 25.0, "alice")
    assert [ch["action"] for ch in c["changes"]] == ["throttle", "pause"] and c["version"] == 2
    assert c["changes"][0]["before"] == {"max_wcu": None} and c["changes"][0]["after"] == {"max_wcu": 25.0}
    code, out, _ = cli(capsys, dynalite_server.endpoint, store, "status", m.id)
    assert "PAUSED by alice since" in out and "leases released" in out
    assert "budget set by `reshard throttle`: 25 WCU/s (by alice)" in out

    # doctor: a paused run is a note, not a stuck run (exit 0); resumed with nobody on it, it is unfinished.
    code, out, _ = cli(capsys, dynalite_server.endpoint, store, "doctor", m.id, "--no-data")
    assert code == 0 and "NOTE paused_run" in out and "paused by alice" in out and "unfinished_run" not in out
    assert cli(capsys, dynalite_server.endpoint, store, "resume", m.id)[0] == 0
    code, out, _ = cli(capsys, dynalite_server.endpoint, store, "doctor", m.id, "--no-data")
    assert code == 1 and "unfinished_run" in out and "paused_run" not in out


def test_control_refusals_are_one_line(dynalite, dynalite_server, unique_name, capsys):
    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-c", mid=unique_name)
    code, _, err = cli(capsys, dynalite_server.endpoint, store, "pause", m.id)
    assert code == 2 and "nothing to pause" in err and f"reshard backfill {m.id}" in err and "Traceback" not in err
    code, _, err = cli(capsys, dynalite_server.endpoint, store, "throttle", m.id)
    assert code == 2 and "give --max-wcu N and/or --max-rcu N" in err
    code, _, err = cli(capsys, dynalite_server.endpoint, store, "throttle", m.id, "--max-wcu", "0")
    assert code == 2 and "--max-wcu" in err and len(err.strip().splitlines()) == 1


def test_status_watch_redraws_until_the_job_finishes(dynalite, dynalite_server, unique_name, capsys, monkeypatch):
    """The run is paused while the watch draws its first frames (whatever the machine's load), then
    resumed from the watch's second wait: it finishes, and the watch ends on that."""
    from reshard.control import live
    from reshard.jobs.backfill import BACKFILL
    from reshard.jobs.runner import JobOptions, run_job
    import reshard.cli.watch as watch
    m, store = setup(dynalite, unique_name, n=60, segments=2)
    live.change(store, m.id, "backfill", 1, "pause", who="op", paused=True, release_leases=False)
    t = threading.Thread(target=run_job, args=(BACKFILL, dynalite, store, m.id,
                                               JobOptions(segments=2, max_wcu=200, budget_refresh_seconds=0.2,
                                                          budget_liveness_seconds=2.0)))
    t.start()
    waits = []

    def pause(seconds):
        waits.append(seconds)
        if len(waits) == 2:
            live.change(store, m.id, "backfill", 1, "resume", who="op", paused=False)
        time.sleep(seconds)
    monkeypatch.setattr(watch, "_pause", pause)
    code, out, err = cli(capsys, dynalite_server.endpoint, store, "--output", "json", "status", m.id, "--watch",
                         "--interval", "0.2")
    t.join(60)
    assert code == 0, err
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) >= 3 and len(frames) == len(waits) + 1
    assert all("watch_ended" not in f for f in frames[:-1])
    assert frames[-1]["watch_ended"] == "backfill run 1 finished"
    first = frames[0]["jobs"][0]
    assert first["control"]["paused"] and first["control"]["paused_by"] == "op"
    # The fields the watch shows are in the JSON: progress (rate, ETA), budget, control, lagging shims.
    assert {"progress", "budget", "control", "members", "rate_now"} <= set(first)
    assert {"done", "total", "pct", "rate", "eta_seconds"} <= set(first["progress"])
    assert "lagging" in frames[0]["fleet"]


def test_status_watch_text_and_ctrl_c(dynalite, dynalite_server, unique_name, capsys, monkeypatch):
    m, store = setup(dynalite, unique_name)
    import reshard.cli.watch as watch
    calls = []

    def interrupted(seconds):
        calls.append(seconds)
        if len(calls) == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(watch, "_pause", interrupted)  # Ctrl-C during the second wait
    code, out, err = cli(capsys, dynalite_server.endpoint, store, "status", m.id, "--watch", "--interval", "3")
    assert code == 130 and err.strip() in ("reshard: interrupted", "reshard: aborted")
    assert calls == [3.0, 3.0] and out.count("status --watch at") == 2 and out.count("--- ") == 2
    assert "backfill run 1" in out
