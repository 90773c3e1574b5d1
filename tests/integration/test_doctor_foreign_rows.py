"""`reshard doctor` lists control rows reshard did not write (``foreign_row``) instead of
stopping at the first one, and never removes them itself (issue 17 follow-up), on dynalite."""

from __future__ import annotations

import contextlib
import io
import json
import shlex

from reshard.cli.main import main
from reshard.control.records import heartbeat_pk, jobs_pk, run_sk, shim_sk
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse
from reshard.core.wire import N, S

from tests.backfill_support import create_table, migration_text


def test_doctor_reports_each_foreign_row_with_the_manual_fix_and_goes_on(dynalite, dynalite_server, unique_name):
    table = unique_name[:50]
    control = f"{table}-ctl"
    store = ControlStore(dynalite, control)
    store.ensure_table()
    m = parse(migration_text("sensor", table, "m1"), "<m1>")
    create_table(dynalite, table, KeyMapper(m))
    store.register(m)
    rows = {
        # A row of a schema this release does not know (a newer release's, or junk).
        "schema": {"pk": S(jobs_pk("m1", "backfill")), "sk": S(run_sk("backfill", 9)), "schema": N(99)},
        # A forged heartbeat: it names another instance than the one its key says.
        "heartbeat": {"pk": S(heartbeat_pk("m1")), "sk": S(shim_sk("inst-a")), "instance": S("inst-b"),
                      "schema": N(1), "host": S("h"), "pid": N(1), "phase": S("planned"), "phase_version": N(1),
                      "at": N(0), "beat": N(1)},
        # A partition reshard never writes (no reader queries it: only the doctor's Scan finds it).
        "unknown": {"pk": S("X#junk"), "sk": S("it's here")},
    }
    for item in rows.values():
        dynalite.call("put_item", TableName=control, Item=item)

    def doctor(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", control, *args])
        return code, out.getvalue(), err.getvalue()

    code, out, err = doctor("--output", "json", "doctor", "--no-data")
    assert code == 1, err  # findings, not a stop (exit 2) at the first foreign row
    report = json.loads(out)
    foreign = [f for f in report["findings"] if f["kind"] == "foreign_row"]
    assert sorted((f["migration"] or "", f["subject"]) for f in foreign) == [
        ("", "row pk='X#junk' sk=\"it's here\""),
        ("m1", "row pk='J#m1#backfill' sk='R#backfill#000009'"),
        ("m1", "row pk='S#m1' sk='S#inst-a'")]
    by_pk = {f["subject"].split("'")[1]: f for f in foreign}
    assert "schema '99'" in by_pk["J#m1#backfill"]["detail"]
    assert "instance 'inst-b'" in by_pk["S#m1"]["detail"]
    assert not any(f["repairable"] for f in foreign)
    # The rest was diagnosed as if the rows were not there: the migration is counted.
    assert report["migrations"] == 1
    # The fix is a manual delete-item of exactly that key (the shell line parses back to it).
    for pk, f in by_pk.items():
        words = shlex.split(f["fix"].split("; if nobody should have written it: ")[1])
        assert words[:5] == ["aws", "dynamodb", "delete-item", "--table-name", control]
        assert json.loads(words[words.index("--key") + 1])["pk"] == {"S": pk}

    # Text: one line per finding; a migration's doctor lists its rows and the unattributed one.
    code, out, err = doctor("doctor", "m1", "--no-data")
    lines = [line for line in out.splitlines() if line.startswith("FOUND foreign_row")]
    assert code == 1 and len(lines) == 3 and all("aws dynamodb delete-item" in line for line in lines), out

    # --repair never removes them (manual), and they are all still there.
    code, out, err = doctor("--output", "json", "doctor", "--repair", "--wait", "0", "--no-data")
    assert code == 1, err
    outcomes = {r["subject"]: r["outcome"] for r in json.loads(out)["repairs"] if r["kind"] == "foreign_row"}
    assert len(outcomes) == 3 and set(outcomes.values()) == {"manual"}
    for item in rows.values():
        assert dynalite.call("get_item", TableName=control, Key={"pk": item["pk"], "sk": item["sk"]}).get("Item")
