"""The phase commands end to end through ``reshard.cli.main.main`` against moto."""

from __future__ import annotations

import json
import pathlib
import re
import time

import pytest


from reshard.aws import dynamo as dynamo_module
from reshard.cli.main import main
from reshard.control.store import ControlStore
from reshard.aws.dynamo import Dynamo
from reshard.core.phases import Action, Phase
from reshard.control.transition import transition
from reshard.control import fleet

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENSOR_FILE = str(ROOT / "migrations" / "0001_sensor_events.toml")
INVOICES_FILE = str(ROOT / "migrations" / "0002_invoices.toml")
MID = "sensor-events-16-to-32"
CT = ["--control-table", "rs-control"]


def make_table(d: Dynamo, name: str, keys=("PK", "SK")) -> None:
    schema = [{"AttributeName": keys[0], "KeyType": "HASH"}]
    attrs = [{"AttributeName": keys[0], "AttributeType": "S"}]
    if len(keys) > 1:
        schema.append({"AttributeName": keys[1], "KeyType": "RANGE"})
        attrs.append({"AttributeName": keys[1], "AttributeType": "S"})
    d.call("create_table", TableName=name, BillingMode="PAY_PER_REQUEST", KeySchema=schema,
           AttributeDefinitions=attrs)


@pytest.fixture
def aws(moto_dynamo):
    make_table(moto_dynamo, "SensorEvents")
    return moto_dynamo


@pytest.fixture
def store(aws):
    return ControlStore(aws, "rs-control")


#: No application writes these tests' tables: the operator vouches for the empty fleet.
NO_SHIMS = ["--allow-no-shims"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    vouch = NO_SHIMS if args and args[0] in ("advance", "rollback", "abort") else []
    code = main([*args, *CT, *vouch])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reshard: error: "), err
    return lines[0]


def status_json(capsys, *ref: str) -> dict:
    code, out, err = run(capsys, "status", *ref, "--output", "json")
    assert code == 0, err
    return json.loads(out)


def test_the_phase_commands_end_to_end(aws, capsys):
    code, out, err = run(capsys, "start", SENSOR_FILE)
    assert code == 0, err
    assert f"registered migration '{MID}' on table 'SensorEvents': phase planned" in out
    assert f"next: deploy the shim, then `reshard advance {MID}`" in out
    assert "created control table 'rs-control'" in out + err

    code, out, err = run(capsys, "status")
    assert code == 0 and "phase:     planned  (phase version 1" in out
    assert "advance:   to dual_write refused now:" in out  # fail closed on an empty fleet
    assert "- no live shim reports for this table" in out
    code, out, err = main(["advance", *CT]), *capsys.readouterr()
    assert code == 2 and "no live shim reports for this table" in one_error_line(err) and "--allow-no-shims" in err
    assert status_json(capsys)["phase_version"] == 1  # nothing moved

    for expected in ("planned -> dual_write", "dual_write -> dual_read"):
        code, out, err = run(capsys, "advance")
        assert code == 0 and expected in out and "fleet: no live shims; acknowledged at once" in out

    code, out, err = run(capsys, "rollback", MID)
    assert code == 0 and "rollback: sensor-events-16-to-32 moved dual_read -> dual_write (phase version 4)" in out

    report = status_json(capsys, SENSOR_FILE)  # MIGRATION as a file path
    assert report["phase"] == "dual_write" and report["phase_version"] == 4
    assert [(h["from"], h["to"], h["action"]) for h in report["history"]] == [
        ("", "planned", "start"), ("planned", "dual_write", "advance"), ("dual_write", "dual_read", "advance"),
        ("dual_read", "dual_write", "rollback")]
    assert all(h["who"] and h["at"].endswith("+00:00") for h in report["history"])  # ISO 8601 (aws-cli v2)
    assert report["shims"] == [] and report["jobs"] == [] and report["fleet"]["acknowledged"] is True

    code, out, err = run(capsys, "abort", "--output", "json")
    assert code == 0
    moved = json.loads(out)
    assert (moved["from"], moved["to"], moved["phase_version"]) == ("dual_write", "aborted", 5)
    assert "reshard cleanup" in moved["next"]

    # Aborted but not cleaned up yet: still the active migration, and nothing comes next.
    code, out, err = run(capsys, "advance")
    assert code == 2 and "there is no next phase" in one_error_line(err)
    code, out, err = run(capsys, "advance", MID)
    assert code == 2 and "there is no next phase" in one_error_line(err)


def test_start_is_idempotent_and_refuses_a_changed_file(aws, capsys, tmp_path):
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    code, out, err = run(capsys, "start", SENSOR_FILE)
    assert code == 0 and "already registered with this file: phase planned" in out and "nothing changed" in out
    changed = tmp_path / "changed.toml"
    changed.write_text(pathlib.Path(SENSOR_FILE).read_text().replace("retain_hours = 168", "retain_hours = 24"))
    code, out, err = run(capsys, "start", str(changed))
    line = one_error_line(err)
    assert code == 2 and "already registered with a different meaning" in line
    assert "cleanup.retain_hours: 168 -> 24" in line and "new id" in line


def test_start_checks_the_data_table(moto_dynamo, capsys, tmp_path):
    code, out, err = run(capsys, "start", SENSOR_FILE)
    assert code == 2 and "table 'SensorEvents' does not exist" in one_error_line(err)
    make_table(moto_dynamo, "SensorEvents", keys=("pk", "sk"))
    code, out, err = run(capsys, "start", SENSOR_FILE)
    line = one_error_line(err)
    assert code == 2 and "has partition 'pk', sort 'sk', the file says partition 'PK', sort 'SK'" in line
    assert not ControlStore(moto_dynamo, "rs-control").exists()  # nothing created on bad input


def test_a_bad_file_is_one_line(aws, capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "x"\n')
    code, out, err = run(capsys, "start", str(bad))
    assert code == 2 and str(bad) in one_error_line(err)


def test_status_without_a_control_table_is_one_clear_line(aws, capsys):
    for args in (("status",), ("status", MID), ("advance",)):
        code, out, err = run(capsys, *args)
        assert code == 2 and "control table 'rs-control' does not exist" in one_error_line(err)


def test_two_active_migrations_must_be_named(aws, capsys):
    make_table(aws, "Invoices")
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    assert run(capsys, "start", INVOICES_FILE)[0] == 0
    code, out, err = run(capsys, "advance")
    assert code == 2 and "2 active migrations" in one_error_line(err)
    assert run(capsys, "advance", "invoices-random-10-to-hashed-20")[0] == 0
    assert status_json(capsys, MID)["phase"] == "planned"


def test_advance_waits_for_the_fleet(aws, capsys, store):
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    fleet.heartbeat(store, MID, "i-1", "planned", 1, host="h1", pid=11)
    fleet.heartbeat(store, MID, "i-2", "planned", 0, host="h2", pid=12, liveness_seconds=600)

    code, out, err = run(capsys, "advance")
    line = one_error_line(err)
    assert code == 2 and "1 live shim(s) have not acknowledged planned yet: i-2 (h2 pid 12, on planned v0)" in line

    # --wait ran out before the move: exit 1 naming the lagging shim, nothing moved.
    code, out, err = run(capsys, "advance", "--wait", "0.2")
    assert code == 1 and "gave up after 0.2s waiting for the fleet to acknowledge planned v1" in out + err
    assert "have not acknowledged planned v1: i-2 (h2 pid 12, on planned v0); nothing moved" in err.splitlines()[-1]
    assert status_json(capsys)["phase"] == "planned"

    report = status_json(capsys)
    assert {s["instance"]: s["acknowledged"] for s in report["shims"]} == {"i-1": True, "i-2": False}
    assert report["advance"]["allowed"] is False and report["fleet"]["lagging"] == ["i-2 (h2 pid 12, on planned v0)"]

    fleet.forget(store, MID, "i-2")
    code, out, err = run(capsys, "advance", "--wait", "0.2")
    # The transition happened, but the fleet has not caught up within --wait: exit 1 naming it.
    assert code == 1, err
    assert "moved planned -> dual_write" in out
    assert "fleet: NOT caught up: 1 of 1 live shim(s) still act on an earlier phase after waiting:" in out
    assert "i-1 (h1 pid 11, on planned v1)" in out
    assert one_error_line(err).endswith("1 live shim(s) have not acknowledged it: i-1 (h1 pid 11, on planned v1) "
                                        "(`reshard wait` waits for them without moving; "
                                        "runbooks/incident-shim-lagging.md)")

    code, out, err = run(capsys, "advance", "--output", "json")
    assert code == 2 and "have not acknowledged dual_write" in one_error_line(err) and out == ""

    fleet.heartbeat(store, MID, "i-1", "dual_write", 2, host="h1", pid=11)
    code, out, err = run(capsys, "advance", "--wait", "0.2", "--output", "json")
    assert code == 1 and "have not acknowledged it: i-1" in err
    moved = json.loads(out)
    assert moved["to"] == "dual_read" and moved["fleet"]["acknowledged"] is False
    assert moved["fleet"]["lagging"] == ["i-1 (h1 pid 11, on dual_write v2)"]


def test_rollback_is_refused_once_cleanup_began(aws, capsys):
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    for _ in range(3):
        assert run(capsys, "advance")[0] == 0
    # The cutover gate reads the run records: a real (empty-table) backfill and verify open it.
    for job in ("backfill", "verify"):
        code, out, err = run(capsys, job, "--segments", "1")
        assert code == 0, err
    assert run(capsys, "advance")[0] == 0
    assert run(capsys, "verify", "--segments", "1")[0] == 0  # the catch-up verify after the switch
    assert run(capsys, "advance")[0] == 0
    assert status_json(capsys)["phase"] == "cleanup"
    for cmd, why in (("rollback", "rollback is refused in cleanup: cleanup has begun"),
                     ("abort", "abort is refused in cleanup")):
        code, out, err = run(capsys, cmd)
        assert code == 2 and why in one_error_line(err)


def test_status_lists_job_runs_and_segments(aws, capsys, store):
    """Status shows each job run as the segment engine records it: segments, owners, errors, totals."""
    from reshard.jobs.engine import SegmentEngine

    assert run(capsys, "start", SENSOR_FILE)[0] == 0

    def page(ctx, start_key):
        if ctx.segment == 1:
            raise RuntimeError("ThrottlingException after 10 attempts")
        return {"scanned": 5, "moved": 2}, None

    engine = SegmentEngine(store, MID, "backfill", 1, 3, page, workers=1, max_attempts=1, invocation="inv1")
    result = engine.run_all()
    assert [r.done for r in result.segments] == [True, False, True]
    jobs = status_json(capsys)["jobs"]
    assert len(jobs) == 1
    j = jobs[0]
    assert (j["job"], j["run"], j["total_segments"], j["done"], j["failed"]) == ("backfill", 1, 3, 2, [1])
    assert j["totals"]["scanned"] == 10 and j["totals"]["moved"] == 4
    assert j["segments"][1]["last_error"] == "RuntimeError: ThrottlingException after 10 attempts"
    code, out, err = run(capsys, "status")
    assert code == 0, err
    assert "backfill run 1: 2/3 segments done, in progress; FAILED segments 1" in out
    assert "totals: scanned 10, moved 4" in out
    assert "error: RuntimeError: ThrottlingException after 10 attempts" in out


def test_the_loser_of_a_race_is_told_in_one_line(aws, capsys, monkeypatch, store):
    """Another operator's advance lands between our read and our compare-and-set."""
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    rival = ControlStore(Dynamo(region="us-east-1"), "rs-control")
    real_make_client = dynamo_module.make_client
    fired = []

    def make_client(**kwargs):
        client = real_make_client(**kwargs)

        def rival_moves_first(**_):
            if not fired:
                fired.append(True)
                transition(rival, MID, Action.ADVANCE, who="rival@h9", allow_no_shims=True)

        client.meta.events.register("before-call.dynamodb.UpdateItem", rival_moves_first)
        return client

    monkeypatch.setattr(dynamo_module, "make_client", make_client)
    code, out, err = run(capsys, "advance")
    assert code == 2 and fired
    assert re.fullmatch(
        rf"reshard: error: rival@h9 already moved it from planned to dual_write at \S+Z; nothing done: '{MID}' is in "
        r"dual_write \(phase version 2\); check `reshard status`, then run the command again if you still mean it "
        r"from there", one_error_line(err)), err
    hist = store.history(MID)
    assert [(t.phase_version, t.to_phase, t.who) for t in hist][1:] == [(2, "dual_write", "rival@h9")]


def test_a_silent_shim_blocks_until_a_wait_watched_it_go(aws, capsys, store):
    """An old stamp is not proof of death (the shim's clock may be an hour behind ours):
    one look keeps it in the census; `advance --wait` watches its beat stay unchanged for
    its liveness window + request bound on our clock, then removes it and moves on."""
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    long_ago = ControlStore(aws, "rs-control", clock=lambda: time.time() - 3600)
    fleet.heartbeat(long_ago, MID, "i-old", "planned", 0, host="h0", pid=5, liveness_seconds=0.5,
                    request_seconds=0.5, beat=7)
    fleet.heartbeat(store, MID, "i-new", "planned", 1, host="h1", pid=6, beat=1)
    report = status_json(capsys)
    assert [(s["instance"], s["live"], s["acknowledged"]) for s in report["shims"]] == [
        ("i-new", True, True), ("i-old", True, False)]
    assert report["shims"][1]["seconds_ago"] >= 3600
    code, out, err = run(capsys, "status")
    assert re.search(r"i-old\s+h0 pid 5\s+on planned v0\s+\d+\.\ds ago  LAGGING", out), out
    code, out, err = run(capsys, "advance")
    assert code == 2 and "i-old" in err and "--wait" in err
    code, out, err = run(capsys, "advance", "--wait", "3")
    # It moved; i-new is a recorded heartbeat, not a running shim, so it never acknowledges
    # dual_write: --wait ran out after the move, exit 1 naming it.
    assert code == 1 and "moved planned -> dual_write" in out and "i-new" in one_error_line(err)
    assert [h.instance for h in fleet.heartbeats(store, MID)] == ["i-new"]
    assert store.load_state(MID).phase is Phase.DUAL_WRITE


def test_restarting_a_finished_migration_says_what_to_do(aws, capsys):
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    assert run(capsys, "abort")[0] == 0
    code, out, err = run(capsys, "start", SENSOR_FILE)
    assert code == 0 and "phase aborted" in out and "give the file a new id" in out


def test_from_guards_against_moving_twice(aws, capsys, store):
    """Two operators who both mean "planned -> dual_write" one after the other: the second is refused."""
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    code, out, err = run(capsys, "advance", MID, "--from", "planned")
    assert code == 0 and "planned -> dual_write" in out
    code, out, err = run(capsys, "advance", MID, "--from", "planned")
    line = one_error_line(err)
    assert code == 2 and "it is in dual_write (phase version 2" in line and "not planned" in line
    assert store.load_state(MID).phase.value == "dual_write"
    code, out, err = run(capsys, "rollback", MID, "--from", "dual_write", "--wait", "1")
    assert code == 0 and "dual_write -> planned" in out
