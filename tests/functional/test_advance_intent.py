"""`advance`/`rollback` move exactly the step their operator meant; `--dry-run`; `reshard wait`;
the hints (issue 27 point 8). Through the real ``main()`` against moto."""

from __future__ import annotations

import json
import re
import threading

import pytest

from reshard.cli.main import main
from reshard.control import fleet
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core.migration import load
from reshard.core.phases import Action, Phase
from reshard.core.wire import N, S
from tests.functional.test_phase_cli import SENSOR_FILE, make_table

MID = "sensor-events-16-to-32"
CT = ["--control-table", "intent-ctl"]
LOSER = re.compile(r"reshard: error: (?P<who>\S+) already moved it from (?P<frm>\w+) to (?P<to>\w+) at \S+Z"
                   r"(?P<after> \(after this command started\))?; nothing done: "
                   rf"'{MID}' is in (?P<now>\w+) \(phase version (?P<v>\d+)\)")


@pytest.fixture
def store(moto_dynamo, monkeypatch):
    make_table(moto_dynamo, "SensorEvents")
    s = ControlStore(moto_dynamo, CT[1])
    s.register(load(SENSOR_FILE), who="alice@h0")
    return s


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([*args, *CT])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_advance_started_before_another_operators_move_does_not_move_again(store, monkeypatch, capsys):
    """The issue's double move: B runs `advance` while A's `advance` is under way; A's move lands
    before B reads the phase. B would advance from the phase A just set -- two phases for two
    operators who each meant one. Forced: B's first control-table read waits until A is done."""
    monkeypatch.setenv("RESHARD_OPERATOR", "op")
    real = ControlStore.load_state
    a_done = threading.Event()
    b_reading = threading.Event()

    def load_state(self, migration_id, missing_ok=False):
        if threading.current_thread().name == "B" and not b_reading.is_set():
            b_reading.set()
            assert a_done.wait(30)
        return real(self, migration_id, missing_ok)

    monkeypatch.setattr(ControlStore, "load_state", load_state)
    results: dict = {}
    b = threading.Thread(target=lambda: results.__setitem__("B", main(["advance", MID, "--allow-no-shims", *CT])),
                         name="B")
    b.start()
    assert b_reading.wait(30)  # B started (its clock says when) and is about to read the phase
    monkeypatch.setenv("RESHARD_OPERATOR", "alice@h1")
    results["A"] = main(["advance", MID, "--allow-no-shims", *CT])
    a_done.set()
    b.join(30)
    out, err = capsys.readouterr()
    assert (results["A"], results["B"]) == (0, 2), (out, err)
    (line,) = [l for l in err.splitlines() if l.startswith("reshard: error:")]
    g = LOSER.match(line)
    assert g and (g["who"], g["frm"], g["to"], g["now"], g["v"]) == ("alice@h1", "planned", "dual_write",
                                                                     "dual_write", "2"), line
    assert g["after"], line  # said: the move came after B started
    assert store.load_state(MID).phase is Phase.DUAL_WRITE  # one phase, not two
    assert [t.to_phase for t in store.history(MID)] == ["planned", "dual_write"]


def test_the_operator_who_began_a_switch_is_not_told_nothing_was_done(moto_dynamo, monkeypatch):
    """A began dual_write -> dual_read of an index-only file (a switch: two compare-and-sets);
    B's advance finished that switch first. A's move happened: A returns it, not an error."""
    from reshard.core.migration import load as load_file
    m = load_file("migrations/0005_invoices_gsi.toml")
    store = ControlStore(moto_dynamo, "switch-ctl")
    store.register(m, who="t")
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # dual_write
    real = ControlStore.set_phase
    fired = []

    class AStore(ControlStore):
        def set_phase(self, state, target, action, who, switching=False, **kw):
            if action == "switch" and not fired:
                fired.append(True)
                transition(ControlStore(moto_dynamo, "switch-ctl"), m.id, Action.ADVANCE, who="b@h2",
                           allow_no_shims=True)  # B finishes A's switch
            return real(self, state, target, action, who, switching, **kw)

    before, after = transition(AStore(moto_dynamo, "switch-ctl"), m.id, Action.ADVANCE, who="a@h1",
                               allow_no_shims=True)
    assert fired and (before.phase, after.phase, after.switching) == (Phase.DUAL_WRITE, Phase.DUAL_READ, False)
    assert [(t.to_phase, t.action, t.who) for t in store.history(m.id)][-2:] == [
        ("dual_read", "advance", "a@h1"), ("dual_read", "switch", "b@h2")]


# --------------------------------------------------------------------------- --dry-run

def test_dry_run_says_what_would_happen_and_writes_nothing(store, capsys):
    code, out, err = run(capsys, "advance", "--dry-run")
    assert code == 2, err  # no shim reports and none vouched for: the rules refuse
    assert out.splitlines()[0] == f"advance --dry-run: {MID} is in planned (phase version 1); advance to " \
                                  "dual_write: refused"
    assert "  [NO] live shims report for the table: no live shim reports" in out
    assert "  [ok] every live shim acknowledged planned: yes" in out and out.rstrip().endswith("(--dry-run)")
    code, out, _ = run(capsys, "advance", "--dry-run", "--allow-no-shims")
    assert code == 0 and "it would move planned -> dual_write (phase version 2)" in out
    assert "[ok] live shims report for the table: not counted: --allow-no-shims" in out
    # A lagging shim: refused only for now (exit 1), and said so.
    fleet.heartbeat(store, MID, "i-1", "planned", 0, host="app1", pid=7, liveness_seconds=600)
    code, out, _ = run(capsys, "advance", "--dry-run")
    assert code == 1 and "refused for now (a wait may clear it: `reshard wait`)" in out
    assert "[NO] every live shim acknowledged planned: 1 live shim(s) have not acknowledged planned yet: " \
           "i-1 (app1 pid 7, on planned v0)" in out
    code, out, _ = run(capsys, "advance", "--dry-run", "--output", "json")
    doc = json.loads(out)
    assert (doc["dry_run"], doc["would_move"], doc["exit_status"], doc["to"]) == (True, False, 1, "dual_write")
    assert [(c["what"], c["ok"]) for c in doc["preconditions"]] == [
        ("live shims report for the table", True), ("every live shim acknowledged planned", False)]
    code, out, _ = run(capsys, "rollback", "--dry-run", "--allow-no-shims")
    assert code == 2 and "the migration is planned; there is nothing to roll back" in out
    assert store.load_state(MID).phase_version == 1 and len(store.history(MID)) == 1  # nothing written


def test_dry_run_into_cutover_lists_every_gate(store, capsys):
    for _ in range(3):
        transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    # A backfill lease held by a worker (a live one, as far as one look can tell).
    store.put({"pk": S(store.jpk(MID, "backfill")), "sk": S("J#backfill#000001#00000"), "job": S("backfill"),
               "run": N(1), "segment": N(0), "owner": S("h9:42:abc:0"), "lease_counter": N(3),
               "lease_expires": N(0), "done": {"BOOL": False}, "lease_seconds": N(60), "max_request_seconds": N(5)})
    code, out, _ = run(capsys, "advance", "--dry-run", "--allow-no-shims")
    assert code == 2
    lines = out.splitlines()
    assert lines[0] == f"advance --dry-run: {MID} is in backfill (phase version 4); advance to cutover: refused"
    assert any(l.startswith("  [NO] the backfill finished: the backfill has not run") for l in lines), out
    assert any(l.startswith("  [NO] a passing verify started after the backfill finished:") for l in lines), out
    assert any(l.startswith("  [NO] no backfill or verify worker can still write: 1 backfill/verify segment lease(s) "
                            "are still held (backfill segment 0 (h9:42:abc:0))") for l in lines), out


# --------------------------------------------------------------------------- reshard wait

def test_wait_waits_for_the_fleet_and_the_jobs_and_moves_nothing(store, capsys):
    transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    fleet.heartbeat(store, MID, "i-1", "planned", 1, host="app1", pid=7, liveness_seconds=600)
    code, out, err = run(capsys, "wait", "--timeout", "0.5")
    assert code == 1
    # What it waits for goes where progress goes (stdout for people, stderr with --output json).
    assert out.splitlines()[0].startswith("waiting for 1 shim(s) to acknowledge dual_write v2 and 0 job lease(s): "
                                          "shim i-1 (app1 pid 7, on planned v1)")
    assert err.splitlines()[-1].startswith("reshard: error: still waiting after 0.5s: 1 live shim(s) have not "
                                           "acknowledged dual_write v2: i-1 (app1 pid 7, on planned v1)")
    assert "still waiting after" in out and "nothing moved" in out
    fleet.heartbeat(store, MID, "i-1", "dual_write", 2, host="app1", pid=7, liveness_seconds=600, beat=1)
    code, out, err = run(capsys, "wait")
    assert code == 0, err
    assert out.startswith(f"wait: {MID} in dual_write (phase version 2): all 1 live shim(s) acknowledged; no job "
                          "lease held")
    assert store.load_state(MID).phase_version == 2  # moved nothing


def test_wait_waits_for_a_dead_workers_lease_saying_so(store, capsys):
    for _ in range(3):
        transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    # A worker killed holding segment 2, with a short lease (1 s + 0.5 s for a request in flight).
    store.put({"pk": S(store.jpk(MID, "backfill")), "sk": S("J#backfill#000001#00002"), "job": S("backfill"),
               "run": N(1), "segment": N(2), "owner": S("h9:42:abc:1"), "lease_counter": N(3),
               "lease_expires": N(0), "done": {"BOOL": False}, "lease_seconds": N(1), "max_request_seconds": N(0.5)})
    code, out, err = run(capsys, "wait", "--timeout", "30")
    assert code == 0, err
    assert "backfill segment 2: lease held by h9:42:abc:1, quiet for 0 s of 2 s" in out
    assert "no job lease held" in out.splitlines()[-2]


# --------------------------------------------------------------------------- hints

def test_after_a_rollback_the_hint_says_why_before_the_advance(store, capsys):
    transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    code, out, _ = run(capsys, "rollback", "--allow-no-shims")
    assert code == 0
    (hint,) = [l for l in out.splitlines() if l.startswith("next: ")]
    assert hint == (f"next: you rolled back from dual_read: find and fix what made you roll back first "
                    f"(runbooks/07-rollback.md); the way forward again: `reshard advance {MID}` (to dual_read) "
                    "(no live shim reports for the table: add --allow-no-shims only if nothing writes it); "
                    f"or `reshard abort {MID}` returns to the old layout")
    code, out, _ = run(capsys, "status")
    assert "next:      you rolled back from dual_read" in out


def test_a_job_waiting_for_a_lagging_shim_names_it(store, moto_dynamo):
    """Issue 27 point 12: a job whose phase a shim has not acknowledged waited (up to the shim's
    silence bound) before its header, in silence. It now names the shim while it waits."""
    from reshard import errors
    from reshard.jobs.backfill import BACKFILL
    from reshard.jobs.runner import JobOptions, run_job
    from reshard.jobs.subscribers import ProgressReporter

    for _ in range(3):
        transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    fleet.heartbeat(store, MID, "i-7", "dual_read", 3, host="app7", pid=70, liveness_seconds=600)
    said: list[str] = []
    rep = ProgressReporter("backfill", MID, 2, 1, total=lambda: (None, ""), say=said.append)
    with pytest.raises(errors.RefusedTransition, match="1 live shim\\(s\\) have not acknowledged backfill"):
        run_job(BACKFILL, moto_dynamo, store, MID, JobOptions(segments=2, workers=1, lease_wait=0.6),
                subscribers=[rep])
    assert said and said[0].startswith(
        f"backfill of {MID}: waiting: 1 live shim(s) have not acknowledged backfill v4, and the job writes only "
        "once they have: i-7 (app7 pid 70, on dual_read v3)"), said
