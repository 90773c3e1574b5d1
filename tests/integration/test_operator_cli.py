"""The operator sees the truth (issue 13, part B), from the command line against dynalite.

``reshard.cli.main.main`` in-process with ``--endpoint-url`` (the console script's entry
point, without a Python start per command): status and list after ``complete`` and after a
retired abort, ``next:`` hints that follow the gates, ``advance --wait`` exiting 1, jobs that
refuse before printing, progress with a total, rate and ETA, ``--output table`` and
``--query``, and AWS configuration errors as one line with exit 2.
"""

from __future__ import annotations

import json
import re

import pytest

from reshard import operations
from reshard.cli.main import main
from reshard.control import fleet
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse
from reshard.core.phases import Action
from reshard.control.transition import transition
from reshard.jobs.engine import SegmentEngine

from tests.backfill_support import create_table, logical, migration_text

ITEMS = 12


@pytest.fixture
def env(dynalite, dynalite_server, unique_name, tmp_path, monkeypatch):
    """A sensor-events table with ITEMS old-layout items, a migration file for it, a control table."""
    table, mid = f"{unique_name}-data", f"{unique_name}-mig"
    path = tmp_path / "m.toml"
    path.write_text(migration_text("sensor", table, mid))
    m = parse(path.read_text(), str(path))
    mapper = KeyMapper(m)
    create_table(dynalite, table, mapper)
    dynalite.batch_write(table, [{"PutRequest": {"Item": mapper.to_physical(logical("sensor", i), mapper.old)}}
                                 for i in range(ITEMS)])
    monkeypatch.delenv("RESHARD_PROGRESS_SECONDS", raising=False)
    store = ControlStore(dynalite, f"{unique_name}-ctl")
    return {"endpoint": dynalite_server.endpoint, "store": store, "mid": mid, "table": table, "path": str(path),
            "tmp": tmp_path, "mapper": mapper}


def rs(capsys, env, *args: str) -> tuple[int, str, str]:
    vouch = ["--allow-no-shims"] if args[0] in ("advance", "rollback", "abort") else []
    code = main(["--endpoint-url", env["endpoint"], "--control-table", env["store"].table, *args, *vouch])
    out, err = capsys.readouterr()
    return code, out, err


def ok(capsys, env, *args: str) -> str:
    code, out, err = rs(capsys, env, *args)
    assert code == 0, (args, out, err)
    return out


def next_line(out: str) -> str:
    (line,) = [l for l in out.splitlines() if l.startswith("next:")]
    return re.sub(r"^next:\s+", "", line)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reshard: error: "), err
    return lines[0]


def api_advance(env, mid: str, n: int = 1, gates=None) -> None:
    """Advance through the operations API (fewer CLI starts; the CLI's own output is tested elsewhere)."""
    for _ in range(n):
        kwargs = {"gates": gates} if gates else {}
        state = env["store"].load_state(mid)
        if gates and state.newer_may_be:
            # Open gates stand in for the jobs; the catch-up verify is one of them here.
            env["store"].clear_newer_may_be(state, "setup")
        transition(env["store"], mid, Action.ADVANCE, allow_no_shims=True, **kwargs)


def test_next_hints_follow_the_gates_and_jobs_log_progress(env, capsys, monkeypatch):
    """One small migration to complete: at each step `next:` names what is actually due."""
    mid = env["mid"]
    adv = f"`reshard advance {mid}`"
    assert next_line(ok(capsys, env, "start", env["path"])) == f"deploy the shim, then {adv} (to dual_write)"
    api_advance(env, mid, 3)
    assert next_line(ok(capsys, env, "status")).startswith(
        f"the backfill has not run: run `reshard backfill {mid} --segments 16`; then `reshard verify {mid}`")

    # Progress as log lines (stdout is not a terminal), against a pluggable total.
    monkeypatch.setenv("RESHARD_PROGRESS_SECONDS", "0")
    monkeypatch.setattr(operations, "TOTAL_SOURCES", [lambda dynamo, state: (ITEMS, "a test count")])
    out = ok(capsys, env, "backfill", "--segments", "2", "--page-size", "4")
    lines = out.splitlines()
    assert lines[0] == (f"backfill of {mid}: 2 segments, 2 workers on this host (run 1); about {ITEMS} items "
                        "(a test count)")
    logged = [l for l in lines if re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ backfill ", l)]
    assert len(logged) >= 3, out  # 12 items in pages of 4, one line each (interval 0) and a last one
    assert re.search(rf"backfill {mid}: {ITEMS}/{ITEMS} items \(100\.0%\), [\d,.]+ items/s, ETA 0s; "
                     r"2/2 segments done here$", logged[-1]), logged[-1]
    assert re.search(rf"backfill {mid}: 2/2 segments done", out)

    out = ok(capsys, env, "status")
    assert next_line(out) == (f"no verify since the backfill finished: run `reshard verify {mid}`; then {adv} "
                              "(to cutover)")
    assert re.search(rf"    progress: {ITEMS} items in \d+s \([\d,.]+ items/s\)", out), out
    ok(capsys, env, "verify", "--segments", "2")
    # A passing backfill and verify: the hint says advance (and, with no live shim, how).
    assert next_line(ok(capsys, env, "status")) == (
        f"{adv} (to cutover) (no live shim reports for the table: add --allow-no-shims only if nothing writes it)")
    api_advance(env, mid)
    # In cutover after the switch: the catch-up verify is due first (docs/late-writes.md).
    assert next_line(ok(capsys, env, "status")).startswith(f"`reshard verify {mid}` (the catch-up verify after "
                                                           "the switch")
    ok(capsys, env, "verify", "--segments", "2")
    assert next_line(ok(capsys, env, "status")).startswith("check the application, then")
    out = ok(capsys, env, "advance")
    assert next_line(out) == f"the cleanup pass has not run: run `reshard cleanup {mid}`; then {adv} (to complete)"
    ok(capsys, env, "cleanup", "--segments", "1", "--delete")
    out = ok(capsys, env, "advance")
    assert "moved cleanup -> complete" in out
    assert next_line(out) == "nothing: the migration is complete and the new layout is the steady state"


OPEN_GATES = lambda store, state: {"backfill_missing": None, "verify_missing": None, "cleanup_missing": None}  # noqa: E731


def test_status_and_list_after_complete_and_after_a_retired_abort(env, capsys):
    mid, store = env["mid"], env["store"]
    ok(capsys, env, "start", env["path"])
    api_advance(env, mid, 6, gates=OPEN_GATES)  # the gates are tested above; here only the records matter
    # After complete: status without an argument shows the most recent migration (it was `no active migration`).
    out = ok(capsys, env, "status")
    assert out.startswith(f"migration {mid}  (table {env['table']}") and "phase:     complete  (phase version " in out
    assert next_line(out) == "nothing: the migration is complete and the new layout is the steady state"

    # A second migration of the same table, aborted and cleaned up: retired.
    second = env["tmp"] / "second.toml"
    second.write_text(migration_text("sensor", env["table"], f"{mid}-2"))
    ok(capsys, env, "start", str(second))
    out = ok(capsys, env, "abort")
    assert next_line(out) == f"`reshard cleanup {mid}-2` removes the new-layout items and retires the migration"
    ok(capsys, env, "cleanup", "--segments", "1")
    out = ok(capsys, env, "status")  # nothing active: the most recently started
    assert f"migration {mid}-2 " in out and "phase:     aborted (retired: cleaned up, the table is free)" in out
    assert next_line(out).startswith("nothing: the migration is retired (aborted and cleaned up)")

    # list: every migration, oldest first, with when it started and finished.
    out = ok(capsys, env, "list").splitlines()
    assert out[0].split() == ["ID", "TABLE", "PHASE", "STARTED", "FINISHED"]
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"
    assert re.match(rf"^{mid}\s+{env['table']}\s+complete\s+{when}\s+{when}$", out[1]), out
    assert re.match(rf"^{mid}-2\s+{env['table']}\s+aborted \(retired\)\s+{when}\s+{when}$", out[2]), out
    listed = json.loads(ok(capsys, env, "list", "--output", "json"))
    assert [(m["id"], m["phase"], m["retired"]) for m in listed["migrations"]] == [
        (mid, "complete", False), (f"{mid}-2", "aborted", True)]
    # ISO 8601 UTC (aws-cli v2): ordered as the times are.
    assert all(m["finished"] >= m["started"] > "2020" and m["started"].endswith("+00:00")
               for m in listed["migrations"])

    # --query (JMESPath on the JSON document) and --output text|table, on list and status.
    assert ok(capsys, env, "list", "--query", "migrations[].[id, phase]", "--output", "text") == \
        f"{mid}\tcomplete\n{mid}-2\taborted\n"
    table = ok(capsys, env, "status", mid, "--output", "table", "--query", "{phase: phase, history: history}")
    assert re.search(r"^\| phase\s+\| complete\s+\|$", table, re.M), table
    assert re.search(r"^\| phase_version \| from\s+\| to\s+\| action\s+\| who\s+\| at\s+\|$", table, re.M), table


def test_jobs_refuse_before_printing_anything(env, capsys):
    ok(capsys, env, "start", env["path"])
    for job in ("backfill", "verify", "cleanup"):
        code, out, err = rs(capsys, env, job, "--segments", "16")
        assert (code, out) == (2, ""), (job, out)
        assert f"{job} refused for '{env['mid']}': the migration is in planned" in one_error_line(err)


def test_advance_wait_exits_1_naming_the_lagging_shims(env, capsys):
    mid, store = env["mid"], env["store"]
    ok(capsys, env, "start", env["path"])
    fleet.heartbeat(store, mid, "i-9", "planned", 0, host="app9", pid=99, liveness_seconds=600)
    code, out, err = rs(capsys, env, "advance", "--wait", "0.3")
    assert code == 1 and "gave up after 0.3s" in out and "moved" not in out
    assert one_error_line(err.splitlines()[-1]) == (
        f"reshard: error: advance of '{mid}' not done: after --wait 0.3s 1 live shim(s) have not acknowledged "
        f"planned v1: i-9 (app9 pid 99, on planned v0); nothing moved (runbooks/incident-shim-lagging.md)")
    assert store.load_state(mid).phase_version == 1

    fleet.heartbeat(store, mid, "i-9", "planned", 1, host="app9", pid=99, liveness_seconds=600)
    code, out, err = rs(capsys, env, "advance", "--wait", "0.3")
    assert code == 1 and "moved planned -> dual_write (phase version 2)" in out
    assert one_error_line(err.splitlines()[-1]).endswith(
        "1 live shim(s) have not acknowledged it: i-9 (app9 pid 99, on planned v1) "
        "(`reshard wait` waits for them without moving; runbooks/incident-shim-lagging.md)")
    # Without --wait nobody waited: the move is reported, exit 0, and the hint says to wait.
    fleet.heartbeat(store, mid, "i-9", "dual_write", 2, host="app9", pid=99, liveness_seconds=600)
    code, out, err = rs(capsys, env, "advance")
    assert code == 0 and "fleet: NOT caught up" in out
    assert next_line(out) == f"wait for 1 lagging shim(s) to acknowledge dual_read: `reshard wait {mid}` " \
                             "(moves nothing; runbooks/incident-shim-lagging.md)"


def test_status_shows_rate_eta_and_why_a_running_job_throttles(env, capsys, monkeypatch):
    """A run in progress (one segment failed): items done of the total, %, rate, ETA, throttling."""
    mid, store = env["mid"], env["store"]
    ok(capsys, env, "start", env["path"])

    def page(ctx, start_key):
        if ctx.segment == 1:
            raise RuntimeError("boom")
        return {"scanned": 10, "moved": 4}, None

    SegmentEngine(store, mid, "backfill", 1, 4, page, workers=1, max_attempts=1, invocation="inv1",
                  throttle_reason=lambda: "at --max-wcu 5: requests wait for the budget").run_all()
    monkeypatch.setattr(operations, "TOTAL_SOURCES", [lambda dynamo, state: (60, "a test count")])
    out = ok(capsys, env, "status")
    assert re.search(r"    progress: 30/60 items \(50\.0%\), [\d,.]+ items/s, ETA \d+\w+ \(total: a test count\)",
                     out), out
    assert "    throttling: at --max-wcu 5: requests wait for the budget" in out
    (job,) = json.loads(ok(capsys, env, "status", "--output", "json"))["jobs"]
    assert job["progress"]["done"] == 30 and job["progress"]["total"] == 60 and job["progress"]["pct"] == 50.0
    assert job["progress"]["eta_seconds"] is not None and job["progress"]["rate"] > 0
    # dynalite's ItemCount is 0: no total, said plainly instead of a wrong ETA.
    monkeypatch.setattr(operations, "TOTAL_SOURCES", [operations._item_count_source])
    assert "30 items, " in ok(capsys, env, "status") and "total unknown (no ETA)" in ok(capsys, env, "status")


def test_a_bad_query_is_refused_before_anything_happens(env, capsys):
    ok(capsys, env, "start", env["path"])
    code, out, err = rs(capsys, env, "advance", "--query", "jobs[")
    assert (code, out) == (2, "") and "--query 'jobs[' is not a JMESPath expression" in one_error_line(err)
    assert env["store"].load_state(env["mid"]).phase_version == 1


@pytest.mark.parametrize("args,setenv,says", [
    (["--profile", "nosuch"], {}, "AWS profile 'nosuch' (--profile) is not in"),
    (["--endpoint-url", "notaurl", "--region", "us-east-1"], {}, "--endpoint-url 'notaurl' has no scheme"),
    (["--endpoint-url", "http://dynamodb.invalid:9"], {"AWS_DEFAULT_REGION": None, "AWS_REGION": None},
     "no AWS region set: use --region, AWS_REGION or AWS_DEFAULT_REGION"),
    # Signing fails before anything is sent: no request leaves the machine.
    (["--endpoint-url", "http://dynamodb.invalid:9", "--region", "us-east-1"],
     {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None, "AWS_PROFILE": None},
     "NoCredentials: no AWS credentials found"),
], ids=["profile", "endpoint", "region", "credentials"])
def test_aws_configuration_errors_are_one_line_exit_2(args, setenv, says, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in setenv.items():
        monkeypatch.delenv(k, raising=False) if v is None else monkeypatch.setenv(k, v)
    code = main([*args, "status", "--control-table", "nothing-here"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert says in one_error_line(err)
