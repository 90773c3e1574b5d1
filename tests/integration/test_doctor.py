"""`reshard doctor [--repair]` against dynalite: each finding is constructed, reported, repaired,
and a second doctor is clean; repairs never clobber a live actor (forced interleavings).

Bad states are written straight into the control table (the rows a crash or a lost
request leaves behind). Leases and heartbeats carry tiny windows (lease 0.2 s + request
0.1 s) so the repair's watch takes a fraction of a second.
"""

from __future__ import annotations

import json
import time

import pytest

from reshard import operations
from reshard.cli.main import main
from reshard.control import fleet
from reshard.control.records import META, TABLE_LOCK_SK, run_sk, segment_sk, table_lock_pk
from reshard.control.store import ControlStore
from reshard.core.layout import NEW_COPY_ATTR, KeyMapper
from reshard.core.migration import parse
from reshard.core.versions import format_version
from reshard.core.wire import N, S

from tests.backfill_support import create_table, migration_text

QUIET = {"lease_seconds": N(0.2), "max_request_seconds": N(0.1)}


@pytest.fixture
def env(dynalite, dynalite_server, unique_name):
    table = unique_name[:50]
    control = f"{table}-ctl"
    store = ControlStore(dynalite, control)
    store.ensure_table()

    def register(mid: str, create: bool = True):
        m = parse(migration_text("sensor", table, mid), f"<{mid}>")
        if create:
            create_table(dynalite, table, KeyMapper(m))
        store.register(m)
        return m

    def doctor(*args: str, cli: bool = False) -> tuple[int, dict]:
        """Exit status and JSON report; in process (a new CLI client costs ~0.5 s) unless ``cli``."""
        import contextlib
        import io
        if not cli:
            ref = next((a for a in args if not a.startswith("-") and not a.replace(".", "").isdigit()), None)
            wait = float(args[args.index("--wait") + 1]) if "--wait" in args else None
            r = operations.doctor(store, dynalite, ref, repair="--repair" in args, wait=wait,
                                  data="--no-data" not in args, poll=0.05)
            return (0 if r.healthy else 1), json.loads(json.dumps(r.as_dict()))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", control, "--output", "json",
                         "doctor", *args])
        return code, json.loads(out.getvalue())

    return type("Env", (), {"dynamo": dynalite, "store": store, "table": table, "control": control,
                            "register": staticmethod(register), "doctor": staticmethod(doctor)})


def force_meta(store: ControlStore, mid: str, phase: str, version: int, **extra) -> None:
    """Put a migration's META into ``phase`` directly (the test constructs a state, not a path)."""
    sets = ", ".join(f"{k} = :{k}" for k in extra)
    store.update(store.mpk(mid), META, "SET phase = :p, phase_version = :v, updated_at = :u" + (f", {sets}" if sets else ""),
                 values={":p": S(phase), ":v": N(version), ":u": N(time.time()), **{f":{k}": v for k, v in extra.items()}})


def put_run(store: ControlStore, mid: str, job: str, run: int, finished: bool, segments: int = 1) -> None:
    item = {"pk": S(store.jpk(mid, job)), "sk": S(run_sk(job, run)), "total_segments": N(segments),
            "started_at": N(time.time() - 100)}
    if finished:
        item["finished_at"] = N(time.time() - 50)
    store.put(item)


def put_lease(store: ControlStore, mid: str, job: str, run: int, segment: int, owner: str, counter: int,
              expires: float) -> None:
    store.put({"pk": S(store.jpk(mid, job)), "sk": S(segment_sk(job, run, segment)), "segment": N(segment),
               "run": N(run), "owner": S(owner), "lease_counter": N(counter), "lease_expires": N(expires), **QUIET})


def kinds(report: dict) -> list[str]:
    return sorted(f["kind"] for f in report["findings"])


def test_healthy_migration_exits_0(env):
    env.register("m1")
    code, report = env.doctor()
    assert (code, report["findings"], report["healthy"]) == (0, [], True)
    assert report["tables_scanned"] == {env.table: 0}


def test_orphaned_lease_and_abandoned_run_are_repaired(env):
    env.register("m1")
    force_meta(env.store, "m1", "backfill", 4)
    put_run(env.store, "m1", "backfill", 1, finished=False)
    put_run(env.store, "m1", "backfill", 2, finished=True)
    # Run 1 was superseded by run 2, but a worker that died kept its lease.
    put_lease(env.store, "m1", "backfill", 1, 0, "deadhost:1:w0", 7, time.time() + 3600)
    code, report = env.doctor()
    assert code == 1 and kinds(report) == ["abandoned_run", "orphaned_lease"]
    lease = next(f for f in report["findings"] if f["kind"] == "orphaned_lease")
    assert "run 2 superseded it" in lease["detail"] and lease["fix"].startswith("reshard doctor m1 --repair")

    code, report = env.doctor("m1", "--repair", cli=True)
    assert code == 0, report
    assert sorted(r["outcome"] for r in report["repairs"]) == ["repaired", "repaired"]
    seg = env.store.get(env.store.jpk("m1", "backfill"), segment_sk("backfill", 1, 0))
    assert seg["owner"]["S"] == "-" and seg["lease_counter"]["N"] == "7"
    assert "abandoned_at" in env.store.get(env.store.jpk("m1", "backfill"), run_sk("backfill", 1))
    assert env.doctor()[0] == 0


def test_expired_lease_is_released_and_the_run_then_says_resume(env):
    env.register("m1")
    force_meta(env.store, "m1", "backfill", 4)
    put_run(env.store, "m1", "backfill", 1, finished=False, segments=2)
    put_lease(env.store, "m1", "backfill", 1, 1, "deadhost:1:w0", 3, time.time() - 120)
    code, report = env.doctor()
    assert code == 1 and kinds(report) == ["expired_lease"]
    assert "by its holder's clock" in report["findings"][0]["detail"]
    code, report = env.doctor("--repair")
    assert report["repairs"][0]["outcome"] == "repaired"
    # Released, the run is a resumable unfinished run: the fix is the backfill command, not a repair.
    code, report = env.doctor()
    assert code == 1 and kinds(report) == ["unfinished_run"]
    assert report["findings"][0]["fix"] == "reshard backfill m1 --segments 2"


def test_stale_shim_row_is_removed_after_watching_it_silent(env):
    env.register("m1")
    force_meta(env.store, "m1", "dual_read", 3)
    fleet.heartbeat(env.store, "m1", "i-dead", "planned", 1, liveness_seconds=0.2, request_seconds=0.1, beat=5)
    code, report = env.doctor()
    assert code == 1 and kinds(report) == ["stale_shim"]
    assert "acts on phase version 1" in report["findings"][0]["detail"]
    code, report = env.doctor("--repair")
    assert code == 0 and report["repairs"][0]["outcome"] == "repaired"
    assert fleet.heartbeats(env.store, "m1") == []
    assert env.doctor()[0] == 0


def test_foreign_shim_of_a_finished_migration(env):
    env.register("old")
    force_meta(env.store, "old", "complete", 8)
    env.store.release_table(env.table, "old")
    env.register("new", create=False)
    fleet.heartbeat(env.store, "old", "i-old", "complete", 8, liveness_seconds=0.2, request_seconds=0.1, beat=1)
    code, report = env.doctor()
    assert code == 1 and kinds(report) == ["foreign_shim"]
    assert "'new' is active" in report["findings"][0]["detail"]
    code, report = env.doctor("--repair")
    assert code == 0 and fleet.heartbeats(env.store, "old") == []
    assert env.doctor()[0] == 0


def test_stale_locks_of_a_finished_and_of_a_missing_migration(env):
    env.register("m1")
    force_meta(env.store, "m1", "complete", 8)  # died between the last phase write and the lock release
    env.store.put({"pk": S(table_lock_pk("OtherTable")), "sk": S(TABLE_LOCK_SK), "migration_id": S("ghost"),
                   "at": N(time.time() - 3600)})
    code, report = env.doctor()
    assert code == 1 and kinds(report) == ["stale_lock", "stale_lock"]
    details = sorted(f["detail"] for f in report["findings"])
    assert details == ["names migration 'ghost', which does not exist", "names migration 'm1', which is complete"]
    code, report = env.doctor("--repair", "--no-data")
    assert code == 0
    assert env.store.table_locks() == {}
    assert env.doctor()[0] == 0


def test_missing_lock_of_an_active_migration_is_taken_back(env):
    env.register("m1")
    env.store.delete(table_lock_pk(env.table), TABLE_LOCK_SK)
    code, report = env.doctor("m1")
    assert code == 1 and kinds(report) == ["missing_lock"]
    assert env.doctor("m1", "--repair")[0] == 0
    assert env.store.table_locks()[env.table]["migration_id"]["S"] == "m1"
    assert env.doctor()[0] == 0


def test_lock_of_a_finished_migration_is_replaced_by_the_active_ones(env):
    env.register("old")
    force_meta(env.store, "old", "complete", 8)
    env.register("new", create=False)  # takes the stale lock over
    env.store.put({"pk": S(table_lock_pk(env.table)), "sk": S(TABLE_LOCK_SK), "migration_id": S("old"),
                   "at": N(time.time())})  # as if the finished migration still held it
    code, report = env.doctor("--no-data")
    assert code == 1 and kinds(report) == ["missing_lock", "stale_lock"]
    assert env.doctor("--repair", "--no-data")[0] == 0
    assert env.store.table_locks()[env.table]["migration_id"]["S"] == "new"


def test_retired_copies_and_old_tombstones_are_deleted_only_if_unchanged(env):
    m = env.register("gone")
    retired_at = time.time()
    force_meta(env.store, "gone", "aborted", 9, retired={"BOOL": True})
    env.store.release_table(env.table, "gone")
    old_v = format_version(int((retired_at - 60) * 1000), 0, "w1")
    new_v = format_version(int((retired_at + 600) * 1000), 0, "w2")
    put = lambda pk, **a: env.dynamo.call("put_item", TableName=env.table, Item={"PK": S(pk), "SK": S("x"), **a})
    put("copy-1", **{NEW_COPY_ATTR: S("gone"), "_rs_v": S(old_v)})
    put("copy-2", **{NEW_COPY_ATTR: S("gone")})
    # A version whose wall time is 10 minutes after the retire: a writer whose clock runs ahead
    # of the operator's. No writer keeps a retired migration's marker on an item it writes (each
    # sets its own migration's or removes it), so the marker alone makes it a leftover (issue 25
    # case 6; the wall-clock comparison once kept it for ever).
    put("ahead", **{NEW_COPY_ATTR: S("gone"), "_rs_v": S(new_v)})
    put("tomb", **{"_rs_del": {"BOOL": True}, "_rs_v": S(old_v)})
    put("live", temp=N(1))
    code, report = env.doctor()
    assert code == 1 and kinds(report) == ["old_tombstones", "retired_copies"]
    details = {f["kind"]: f["detail"] for f in report["findings"]}
    assert details["retired_copies"] == "3 new-layout copies of retired migration 'gone'"
    assert details["old_tombstones"] == "1 delete marker(s) left after the last migration ended"
    code, report = env.doctor("--repair")
    assert code == 0, report
    left = {i["PK"]["S"] for i in env.dynamo.call("scan", TableName=env.table)["Items"]}
    assert left == {"live"}
    assert env.doctor()[0] == 0
    assert m.table == env.table


def test_data_item_rewritten_between_scan_and_repair_stays(env):
    """Forced: a shim rewrites a leftover tombstone after the scan; the version-conditioned delete spares it."""
    env.register("m1")
    force_meta(env.store, "m1", "complete", 8)
    env.store.release_table(env.table, "m1")
    # From before m1 started (beyond the clock margin): a leftover. (A tombstone m1's complete-phase
    # shims wrote is m1's own: strip deletes it after its hold, below.)
    v1 = format_version(int((time.time() - 2 * 3600) * 1000), 0, "w1")
    env.dynamo.call("put_item", TableName=env.table,
                    Item={"PK": S("a"), "SK": S("x"), "_rs_del": {"BOOL": True}, "_rs_v": S(v1)})
    v2 = format_version(int(time.time() * 1000), 0, "w2")

    def rewrite(finding):
        env.dynamo.call("put_item", TableName=env.table, Item={"PK": S("a"), "SK": S("x"), "temp": N(2),
                                                                "_rs_v": S(v2)})

    report = operations.doctor(env.store, env.dynamo, repair=True, before_write=rewrite)
    assert [r.outcome for r in report.repairs] == ["changed"]
    item = env.dynamo.call("get_item", TableName=env.table, Key={"PK": S("a"), "SK": S("x")})["Item"]
    assert item["temp"] == N(2)


def test_a_complete_migrations_own_tombstones_are_left_to_strip(env):
    """A complete migration's shims delete with tombstones (every migration phase does, issue 25);
    the doctor's repair deletes without the hold that keeps an older late request from landing on
    the empty key, so they are not leftovers while that migration is the table's newest:
    `--strip-bookkeeping` removes them. One from before it started still is."""
    env.register("m1")
    force_meta(env.store, "m1", "complete", 8)
    env.store.release_table(env.table, "m1")
    put = lambda pk, v: env.dynamo.call("put_item", TableName=env.table, Item={
        "PK": S(pk), "SK": S("x"), "_rs_del": {"BOOL": True}, "_rs_v": S(format_version(int(v * 1000), 0, "w1"))})
    put("own", time.time() - 5)
    put("before", time.time() - 2 * 3600)
    code, report = env.doctor()
    assert code == 1 and kinds(report) == ["old_tombstones"]
    assert [f["detail"] for f in report["findings"]] == ["1 delete marker(s) from before migration 'm1' started"]
    assert env.doctor("--repair")[0] == 0
    assert {i["PK"]["S"] for i in env.dynamo.call("scan", TableName=env.table)["Items"]} == {"own"}


def test_repair_does_not_release_a_lease_renewed_after_the_diagnosis(env):
    """Forced: the holder renews (lease_counter 3 -> 4) after the watch and before the release;
    the release is conditional on the counter seen, so the renewed lease stays its holder's."""
    env.register("m1")
    force_meta(env.store, "m1", "backfill", 4)
    put_run(env.store, "m1", "backfill", 1, finished=False)
    put_lease(env.store, "m1", "backfill", 1, 0, "slowhost:1:w0", 3, time.time() - 10)

    def renew(finding):
        env.store.update(env.store.jpk("m1", "backfill"), segment_sk("backfill", 1, 0), "SET lease_counter = :c",
                         values={":c": N(4)})

    report = operations.doctor(env.store, env.dynamo, repair=True, before_write=renew, poll=0.05)
    assert [(r.finding.kind, r.outcome) for r in report.repairs] == [("expired_lease", "changed")]
    seg = env.store.get(env.store.jpk("m1", "backfill"), segment_sk("backfill", 1, 0))
    assert (seg["owner"]["S"], seg["lease_counter"]["N"]) == ("slowhost:1:w0", "4")


def test_repair_leaves_a_lease_renewed_while_watched(env):
    """A holder that renews during the watch is alive: nothing is written, the finding stays."""
    env.register("m1")
    force_meta(env.store, "m1", "backfill", 4)
    put_run(env.store, "m1", "backfill", 1, finished=False)
    put_lease(env.store, "m1", "backfill", 1, 0, "slowhost:1:w0", 3, time.time() - 10)
    diagnosis = operations.doctors.diagnose(env.store, env.dynamo, "m1")
    env.store.update(env.store.jpk("m1", "backfill"), segment_sk("backfill", 1, 0), "SET lease_counter = :c",
                     values={":c": N(4)})
    repairs = operations.doctors.repair(env.store, env.dynamo, diagnosis.findings, poll=0.05)
    assert [r.outcome for r in repairs] == ["live"]
    assert env.store.get(env.store.jpk("m1", "backfill"), segment_sk("backfill", 1, 0))["owner"]["S"] == "slowhost:1:w0"


def test_repair_keeps_a_heartbeat_that_beats_while_watched(env):
    env.register("m1")
    force_meta(env.store, "m1", "dual_read", 3)
    fleet.heartbeat(env.store, "m1", "i-slow", "planned", 1, liveness_seconds=0.2, request_seconds=0.1, beat=1)
    beats = iter(range(2, 100))

    def sleep(seconds):  # the shim beats between two looks of the watch
        fleet.heartbeat(env.store, "m1", "i-slow", "planned", 1, liveness_seconds=0.2, request_seconds=0.1,
                        beat=next(beats))
        time.sleep(seconds)

    diagnosis = operations.doctors.diagnose(env.store, env.dynamo, "m1")
    repairs = operations.doctors.repair(env.store, env.dynamo, diagnosis.findings, poll=0.05, sleep=sleep)
    assert [r.outcome for r in repairs] == ["live"]
    assert [h.instance for h in fleet.heartbeats(env.store, "m1")] == ["i-slow"]


def test_repair_wait_0_never_releases_a_lease(env):
    env.register("m1")
    force_meta(env.store, "m1", "backfill", 4)
    put_run(env.store, "m1", "backfill", 1, finished=True)
    put_lease(env.store, "m1", "backfill", 1, 0, "host:1:w0", 3, time.time() + 60)
    code, report = env.doctor("--repair", "--wait", "0", cli=True)
    assert code == 1 and report["repairs"][0]["outcome"] == "waiting"
    assert env.store.get(env.store.jpk("m1", "backfill"), segment_sk("backfill", 1, 0))["owner"]["S"] == "host:1:w0"


def test_doctor_text_output_and_unknown_migration(env, dynalite_server, capsys):
    env.register("m1")
    force_meta(env.store, "m1", "complete", 8)
    code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", env.control, "doctor"])
    out, err = capsys.readouterr()
    assert code == 1
    assert f"FOUND stale_lock: m1: table '{env.table}' lock: names migration 'm1', which is complete -> " \
           f"reshard doctor --repair" in out
    assert err.startswith("reshard: error: 1 finding(s)")
    code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", env.control, "doctor", "nosuch"])
    assert code == 2 and "no migration 'nosuch'" in capsys.readouterr().err


def test_data_scan_and_deletes_are_paced_by_the_budget(env):
    """--max-rcu / --max-wcu: every Scan page and every delete goes through the budget's spend."""
    import contextlib
    env.register("m1")
    force_meta(env.store, "m1", "complete", 8)
    env.store.release_table(env.table, "m1")
    for i in range(3):
        env.dynamo.call("put_item", TableName=env.table, Item={"PK": S(f"t{i}"), "SK": S("x"), "_rs_del": {"BOOL": True},
                                                              "_rs_v": S("0001600000000.000000.w")})
    spent = []

    @contextlib.contextmanager
    def spend(kind, units):
        spent.append(kind)
        yield

    diagnosis = operations.doctors.diagnose(env.store, env.dynamo, spend=spend)
    assert spent == ["read"] and kinds({"findings": [f.as_dict() for f in diagnosis.findings]}) == ["old_tombstones"]
    repairs = operations.doctors.repair(env.store, env.dynamo, diagnosis.findings, spend=spend)
    assert [r.outcome for r in repairs] == ["repaired"] and spent == ["read", "write", "write", "write"]


def test_budget_beat_rows_of_killed_processes_are_removed_after_watching_them_silent(env):
    """A killed process leaves its beat row (and share) in its run's budget: reported when the run
    is over or the beat is older than its liveness window; removed once watched unchanged; a
    member that beats while watched is alive and stays."""
    from reshard.control import budget
    from reshard.core.shares import Rebalance
    env.register("m1")
    force_meta(env.store, "m1", "backfill", 4)
    put_run(env.store, "m1", "backfill", 1, finished=True)
    put_run(env.store, "m1", "backfill", 2, finished=False)
    for run, member in ((1, "h:1:dead"), (2, "h:2:dead"), (2, "h:3:slow")):
        budget.beat(env.store, "m1", "backfill", run, member, 7, liveness_seconds=0.2, request_seconds=0.1)
    totals = {"write": 100.0, "read": None}
    budget.write_shares(env.store, "m1", "backfill", 1, None,
                        Rebalance("h:1:dead", {"write": 100.0}, (), True, totals, totals))
    code, report = env.doctor()
    members = [f for f in report["findings"] if f["kind"] == "dead_budget_member"]
    assert code == 1 and [f["subject"] for f in members] == ["backfill run 1 budget member h:1:dead"]
    assert "its run is over" in members[0]["detail"] and members[0]["repairable"]
    time.sleep(0.3)  # the run-2 members' last beats are now older than their liveness window
    beats = iter(range(8, 100))

    def sleep(seconds):  # h:3:slow beats between two looks of the watch
        budget.beat(env.store, "m1", "backfill", 2, "h:3:slow", next(beats), liveness_seconds=0.2,
                    request_seconds=0.1)
        time.sleep(seconds)

    diagnosis = operations.doctors.diagnose(env.store, env.dynamo, "m1")
    found = [f for f in diagnosis.findings if f.kind == "dead_budget_member"]
    assert sorted(f.ref["member"] for f in found) == ["h:1:dead", "h:2:dead", "h:3:slow"]
    repairs = operations.doctors.repair(env.store, env.dynamo, found, poll=0.05, sleep=sleep)
    assert sorted((r.finding.ref["member"], r.outcome) for r in repairs) == [
        ("h:1:dead", "repaired"), ("h:2:dead", "repaired"), ("h:3:slow", "live")]
    assert [i["member"]["S"] for i in budget.member_rows(env.store, "m1", "backfill")] == ["h:3:slow"]
    assert budget.read_shares(env.store, "m1", "backfill", 1).shares == {}
