"""`reshard verify --no-record` on dynalite: the observer's verify writes nothing, gives the
same verdict and exit status as a recorded run, and opens no gate (issue 17 follow-up)."""

from __future__ import annotations

import contextlib
import io
import json

from reshard.cli.main import main
from reshard.control.gates import verify_missing
from reshard.core.layout import NEW_COPY_ATTR
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.runner import JobOptions, run_job

from tests.backfill_support import Shim, logical, scan_all, setup_migration


def cli(endpoint: str, control: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--endpoint-url", endpoint, "--control-table", control, *args])
    return code, out.getvalue(), err.getvalue()


def test_no_record_verify_writes_nothing_gives_the_verdict_and_opens_no_gate(dynalite, dynalite_server,
                                                                              unique_name):
    control = f"{unique_name}-ctl"
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=control)
    shim = Shim(dynalite, mapper, m.table)
    for i in range(20):
        shim.seed(logical("sensor", i))
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(segments=2, workers=1, page_size=50)).done
    run = lambda *a: cli(dynalite_server.endpoint, control, *a)  # noqa: E731
    before = (scan_all(dynalite, control), scan_all(dynalite, m.table))

    code, out, err = run("--output", "json", "verify", m.id, "--no-record", "--segments", "2")
    assert code == 0, err
    data = json.loads(out)
    assert data["passed"] and data["run"] is None and data["recorded"] is False and data["checked"] >= 20
    assert (scan_all(dynalite, control), scan_all(dynalite, m.table)) == before  # not one row written
    # Nothing was recorded, so the cutover gate is still closed and `status` shows no verify.
    assert verify_missing(store, store.load_state(m.id)) is not None

    # A difference: one new copy gone. Same verdict and exit status as a recorded run.
    copy = next(i for i in scan_all(dynalite, m.table).values() if NEW_COPY_ATTR in i)
    dynalite.call("delete_item", TableName=m.table, Key={k: copy[k] for k in mapper.old.key_attrs})
    before = (scan_all(dynalite, control), scan_all(dynalite, m.table))
    code, out, err = run("verify", m.id, "--no-record", "--segments", "2")
    assert code == 1 and "FAILED" in out and "read-only, not recorded" in out and "missing" in out, (out, err)
    assert "verify found differences (1 missing)" in err and err.count("\n") == 1
    assert (scan_all(dynalite, control), scan_all(dynalite, m.table)) == before
    code, out, err = run("--output", "json", "verify", m.id, "--segments", "2")  # recorded: the same verdict
    assert code == 1 and json.loads(out)["differences"]["missing"] == 1 and json.loads(out)["run"] == 1

    # --repair writes: refused with --no-record, one line, exit 2, before anything is read.
    code, out, err = run("verify", m.id, "--no-record", "--repair")
    assert code == 2 and err.startswith("reshard: error: ") and "--no-record" in err and err.count("\n") == 1


def test_no_record_verify_waits_out_the_settle_window_without_a_lease(dynalite, unique_name):
    """A suspect is re-read until it stayed unchanged for --settle-seconds: the read-only
    pages have no lease to renew while they wait, and still write nothing."""
    from reshard import operations

    control = f"{unique_name}-ctl"
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=control)
    shim = Shim(dynalite, mapper, m.table)
    for i in range(6):
        shim.seed(logical("sensor", i))
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(segments=1, workers=1, page_size=50)).done
    copy = next(i for i in scan_all(dynalite, m.table).values() if NEW_COPY_ATTR in i)
    dynalite.call("delete_item", TableName=m.table, Key={k: copy[k] for k in mapper.old.key_attrs})
    before = (scan_all(dynalite, control), scan_all(dynalite, m.table))
    result = operations.verify_read_only(dynalite, store, m.id, JobOptions(segments=1, settle_seconds=0.3,
                                                                          recheck_pause=0.05))
    assert result.finished and not result.passed and result.differences["missing"] == 1
    assert "settle window 0.3s" in result.examples[0]["detail"]
    assert result.elapsed >= 0.3
    assert (scan_all(dynalite, control), scan_all(dynalite, m.table)) == before
