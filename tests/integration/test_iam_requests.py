"""Every request each role's commands send, judged against that role's generated policy.

A small migration runs on dynalite from the command line (observer: plan, status, list,
doctor, verify --no-record; operator: start, advance, doctor; worker: backfill, verify
--repair, verify, cleanup, cleanup --strip-bookkeeping, status) while a real shim (app)
calls every one of its public methods (iam.SHIM_METHODS, scan() included) in every phase.
A botocore hook records every request with the role whose client sent it, and the shim
method that was running (tests/iam_support.py). Then:

* each shim method sent only what iam.SHIM_METHODS (the table the app policy is made from)
  says it sends, and every method in it was called;
* every request is allowed by its own role's policy (and by the operator's: "everything");
* the requests other roles must never be able to send are denied: the operator's writes
  to the phase row, history and table lock for app, observer and worker; every write the
  worker sent (data, leases, and the recorded verify run in ``J#<id>#verify``, which a
  forger would replay to open the cutover gate) for the observer, which sends no write at
  all; any control write outside its heartbeat partition, and any Scan of the control table,
  for the app.
"""

from __future__ import annotations

import contextlib
import io
import logging
from decimal import Decimal

import pytest

from reshard.cli.main import main
from reshard.core import iam
from reshard.core.migration import parse
from reshard.shim.table import ShardedTable

from tests.backfill_support import migration_text
from tests.iam_support import ACCOUNT, REGION, Recorder, Request, allowed, fake_credentials, leaks
from tests.shim_helpers import read_item

ROLES = ("app", "observer", "worker", "operator")
CONTROL_WRITES = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem")
DATA_WRITES = CONTROL_WRITES


def policies(m, control: str) -> dict[str, dict]:
    return {r: iam.policy(r, m.table, control, REGION, ACCOUNT, migration_id=m.id) for r in ROLES}


def record_every_role(dynalite_server, tmp_path_factory):
    """Run the commands of every role once: (migration, control table, requests, all output)."""
    import uuid

    from reshard.aws import local
    from reshard.aws.dynamo import Dynamo, to_wire
    from reshard.core.layout import KeyMapper

    mp = pytest.MonkeyPatch()
    table = f"t-iam-{uuid.uuid4().hex[:8]}"
    control = f"{table}-ctl"
    path = tmp_path_factory.mktemp("iam") / "m.toml"
    path.write_text(migration_text("sensor", table))
    m = parse(path.read_text(), str(path))
    setup = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1")
    local.create_table(setup, table, KeyMapper(m).keys)
    for i in range(12):  # a few pre-migration items in the old layout
        fields = {"sensor_id": f"s-{i % 3}", "event_id": f"e-{i}", "ts": f"2024-10-27T00:00:{i:02d}Z"}
        setup.call("put_item", TableName=table, Item=KeyMapper(m).old.key(to_wire(fields)) | to_wire(
            {"sensor_id": fields["sensor_id"], "event_id": fields["event_id"], "v": i}))

    rec = Recorder()
    rec.install(mp)
    # Known fake credentials and --verbose: the output is searched for them too (one
    # lifecycle for two tests; tests/functional/test_no_secrets.py covers the error paths).
    fake_credentials(mp)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("reshard").addHandler(handler)
    logging.getLogger("reshard").setLevel(logging.DEBUG)
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", control, "--region", "us-east-1",
         "--verbose"]

    def run(role: str, *args: str, status: int | tuple = 0) -> None:
        rec.role = role
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main([*args, *g])
        log.write(out.getvalue())
        assert code in (status if isinstance(status, tuple) else (status,)), (role, args, out.getvalue())

    n = [0]

    def call(name: str, fn, *args, **kwargs):
        rec.method = name  # the requests it sends are tagged with the shim method
        try:
            return fn(*args, **kwargs)
        finally:
            rec.method = ""

    def traffic(shim: ShardedTable) -> None:
        """Every public method of the shim that sends a request (iam.SHIM_METHODS), scan() included."""
        n[0] += 1
        key = {"sensor_id": "s-9", "event_id": f"a-{n[0]}", "ts": f"2024-10-28T00:00:{n[0]:02d}Z"}
        call("put_item", shim.put_item, Item=dict(key, v=Decimal(1)))
        call("update_item", shim.update_item, Key=key, UpdateExpression="SET v = :v",
             ExpressionAttributeValues={":v": Decimal(2)})
        assert call("get_item", read_item, shim, Key=key)["v"] == 2
        assert call("batch_get_item", shim.batch_get_item, Keys=[key])["Items"]
        call("query", shim.query, Key={"sensor_id": "s-9"})
        assert any(i["event_id"] == key["event_id"] for i in call("scan", shim.scan)["Items"])
        call("delete_item", shim.delete_item, Key=key)
        call("load", shim.load)

        def batch():
            with shim.batch_writer() as b:
                b.put_item(Item=dict(key, event_id=f"b-{n[0]}", v=Decimal(3)))
        call("batch_writer", batch)

    def with_shim() -> None:
        # A shim per phase (its first refresh acknowledges it), closed before the next
        # transition: the operator then moves an empty fleet (--allow-no-shims) at once.
        rec.role = "app"
        with ShardedTable.from_file(str(path), endpoint_url=dynalite_server.endpoint, control_table=control,
                                    refresh_seconds=60) as shim:
            traffic(shim)

    try:
        run("observer", "plan", str(path), "--sample", "20", "--segments", "2")
        # The steady state (the file deployed before `start`): the only phase that still sends a
        # plain DeleteItem and a BatchWriteItem (every migration phase fences each write).
        with_shim()
        run("operator", "start", str(path))
        with_shim()
        for _ in range(3):  # dual_write, dual_read, backfill
            run("operator", "advance", m.id, "--allow-no-shims")
            with_shim()
        # A backfill run that has started (a worker's run row), steered by the operator's live
        # control (its control row in M#<id>), then worked by the worker, who reads that row.
        from reshard.control.store import ControlStore
        from reshard.jobs.engine import SegmentEngine
        rec.role = "worker"
        SegmentEngine(ControlStore(Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1"), control), m.id,
                      "backfill", 1, 2, page=lambda ctx, key: ({}, None)).start_run()
        run("operator", "throttle", m.id, "--max-wcu", "500")
        run("operator", "pause", m.id, "--release-leases")
        run("operator", "resume", m.id)
        run("worker", "backfill", m.id, "--segments", "2", "--max-wcu", "1000", "--host-id", "pod-0")  # + the budget rows
        run("worker", "verify", m.id, "--segments", "2", "--repair")
        run("observer", "verify", m.id, "--segments", "2", "--no-record")
        run("worker", "verify", m.id, "--segments", "2")  # the recorded run the cutover gate needs
        run("observer", "status", m.id)
        run("worker", "status", m.id)
        run("observer", "list")
        # Findings (exit 1) are fine here: what counts is what the doctor sends.
        run("observer", "doctor", m.id, status=(0, 1))
        run("operator", "advance", m.id, "--allow-no-shims", "--dry-run")  # reads only
        run("operator", "wait", m.id, "--timeout", "5")  # moves nothing
        run("operator", "advance", m.id, "--allow-no-shims")  # cutover
        with_shim()
        run("worker", "verify", m.id, "--segments", "2")  # the catch-up verify after the switch
        run("operator", "advance", m.id, "--allow-no-shims")  # cleanup
        with_shim()
        run("worker", "cleanup", m.id, "--segments", "2", "--delete")
        run("operator", "advance", m.id, "--allow-no-shims")  # complete
        with_shim()
        run("worker", "cleanup", m.id, "--strip-bookkeeping", "--segments", "2")  # REMOVEs _rs_* attributes
        run("observer", "doctor", status=(0, 1))  # every migration of the control table
        run("operator", "doctor", m.id, "--repair", "--wait", "0", status=(0, 1))
        run("operator", "list")
    finally:
        mp.undo()
        logging.getLogger("reshard").removeHandler(handler)
        logging.getLogger("reshard").setLevel(logging.NOTSET)
    hash_keys = {table: m.keys.partition, control: "pk"}
    RECORDED_METHODS[table] = rec.by_method(table)
    return m, control, rec.requests(hash_keys), log.getvalue()


#: table -> the operations each shim method sent to it (filled by record_every_role).
RECORDED_METHODS: dict[str, dict[str, set[str]]] = {}


def test_every_request_is_judged_by_its_roles_policy(dynalite_server, tmp_path_factory):
    """One lifecycle (it takes a while), three checks."""
    recorded = record_every_role(dynalite_server, tmp_path_factory)
    every_shim_method_sends_what_the_policy_table_says(recorded)
    every_request_of_a_role_is_allowed_by_its_policy(recorded)
    what_other_roles_must_never_send_is_denied(recorded)
    no_credential_in_the_output_of_any_command(recorded)


def every_shim_method_sends_what_the_policy_table_says(recorded):
    """The app policy is made from iam.SHIM_METHODS: each method's recorded requests are in its
    row, and every method of the table was called (scan() too: its Scan was once denied)."""
    m = recorded[0]
    sent = RECORDED_METHODS[m.table]
    assert set(sent) == set(iam.SHIM_METHODS), sorted(sent)
    assert {method: sorted(ops - set(iam.SHIM_METHODS[method])) for method, ops in sent.items()
            if not ops <= set(iam.SHIM_METHODS[method])} == {}
    assert "Scan" in sent["scan"]


def every_request_of_a_role_is_allowed_by_its_policy(recorded):
    m, control, requests, _ = recorded
    pols = policies(m, control)
    by_role = {r: [q for q in requests if q.role == r] for r in ROLES}
    assert all(by_role.values()), {r: len(v) for r, v in by_role.items()}  # every role sent requests
    refused = [str(q) for q in requests if not allowed(pols[q.role], q)]
    assert refused == []
    assert [str(q) for q in requests if not allowed(pols["operator"], q)] == []  # "and everything above"
    # The shim used every kind of data request it is granted.
    ops = {q.operation for q in by_role["app"] if q.table == m.table}
    assert {"PutItem", "UpdateItem", "DeleteItem", "GetItem", "Query", "BatchWriteItem", "Scan"} <= ops
    # The worker's strip-bookkeeping pass wrote its own partition and the data table.
    assert any(q.leading_keys == {f"J#{m.id}#strip-bookkeeping"} for q in by_role["worker"])


def what_other_roles_must_never_send_is_denied(recorded):
    m, control, requests, _ = recorded
    pols = policies(m, control)
    # The operator's transitions: writes to the phase row, history and table lock.
    transitions = [q for q in requests if q.role == "operator" and q.table == control
                   and q.operation in CONTROL_WRITES and all(k.startswith(("M#", "T#")) for k in q.leading_keys)]
    assert {q.operation for q in transitions} >= {"PutItem", "UpdateItem"}
    for role in ("app", "observer", "worker"):
        assert [str(q) for q in transitions if allowed(pols[role], q)] == [], role
    # throttle / pause / resume: three conditional puts of the run's control row, the operator's only.
    assert len([q for q in transitions if q.operation == "PutItem" and q.leading_keys == {f"M#{m.id}"}]) >= 3
    # The observer writes nothing: it sent no write, and every write the worker sent is
    # refused to it -- data, leases, and the recorded verify run (R#verify#..., segments and
    # examples in J#<id>#verify): an observer replaying it would forge a passing verify.
    assert [str(q) for q in requests if q.role == "observer" and q.operation in CONTROL_WRITES] == []
    worker_writes = [q for q in requests if q.role == "worker" and q.operation in DATA_WRITES]
    assert any(q.table == m.table for q in worker_writes) and any(q.table == control for q in worker_writes)
    assert any(q.leading_keys == {f"J#{m.id}#verify"} for q in worker_writes)
    assert [str(q) for q in worker_writes if allowed(pols["observer"], q)] == []
    # The observer's commands all ran and sent requests, list's and doctor's included.
    observer = {q.operation for q in requests if q.role == "observer" and q.table == control}
    assert {"Scan", "Query", "GetItem"} <= observer
    # Every control write that is not a heartbeat, whoever sent it, is refused to the app.
    not_heartbeats = [q for q in requests if q.table == control and q.operation in CONTROL_WRITES
                      and q.leading_keys != {f"S#{m.id}"}]
    assert len(not_heartbeats) > 10
    assert [str(q) for q in not_heartbeats if allowed(pols["app"], q)] == []


@pytest.mark.parametrize("role, request_", [
    ("app", Request("app", "PutItem", "{control}", None, frozenset({"M#{id}"}))),  # forge the phase row
    ("app", Request("app", "UpdateItem", "{control}", None, frozenset({"M#{id}"}))),
    ("app", Request("app", "DeleteItem", "{control}", None, frozenset({"J#{id}#backfill"}))),  # drop a lease
    ("app", Request("app", "PutItem", "{control}", None, frozenset({"T#{table}"}))),  # steal the table lock
    ("app", Request("app", "PutItem", "{control}", None, frozenset({"S#other-migration"}))),
    ("app", Request("app", "Scan", "{control}")),  # (the data table's Scan is scan()'s: granted)
    ("app", Request("app", "CreateTable", "{control}")),
    ("worker", Request("worker", "UpdateItem", "{control}", None, frozenset({"M#{id}"}))),  # a transition
    # The run's control row (M#<id>/C#...): a worker cannot lift a pause or an operator's budget.
    ("worker", Request("worker", "PutItem", "{control}", None, frozenset({"M#{id}"}))),
    ("observer", Request("observer", "PutItem", "{control}", None, frozenset({"M#{id}"}))),
    ("worker", Request("worker", "PutItem", "{control}", None, frozenset({"H#{id}"}))),
    ("worker", Request("worker", "DeleteItem", "{control}", None, frozenset({"T#{table}"}))),
    ("worker", Request("worker", "PutItem", "{control}", None, frozenset({"S#{id}"}))),  # forge a heartbeat
    ("worker", Request("worker", "UpdateTimeToLive", "{table}")),
    ("observer", Request("observer", "PutItem", "{table}")),
    ("observer", Request("observer", "UpdateItem", "{control}", None, frozenset({"J#{id}#backfill"}))),
    ("observer", Request("observer", "UpdateItem", "{control}", None, frozenset({"M#{id}"}))),
    ("observer", Request("observer", "PutItem", "{control}", None, frozenset({"J#{id}#verify", "M#{id}"}))),
    # A forged verify run (R#verify#<run>) or lease: all sit in J#<id>#verify.
    ("observer", Request("observer", "PutItem", "{control}", None, frozenset({"J#{id}#verify"}))),
    ("observer", Request("observer", "UpdateItem", "{control}", None, frozenset({"J#{id}#verify"}))),
    ("observer", Request("observer", "DeleteItem", "{control}", None, frozenset({"J#{id}#verify"}))),
    ("observer", Request("observer", "PutItem", "{control}", None, frozenset({"S#{id}"}))),
])
def test_forbidden_requests_are_denied(role, request_):
    m = parse(migration_text("sensor", "Data", "mig-1"), "<m>")
    fill = {"control": "ctl", "table": m.table, "id": m.id}
    q = Request(role, request_.operation, request_.table.format(**fill), None,
                frozenset(k.format(**fill) for k in request_.leading_keys))
    assert not allowed(iam.policy(role, m.table, "ctl", REGION, ACCOUNT, migration_id=m.id), q)
    assert allowed(iam.policy("operator", m.table, "ctl", REGION, ACCOUNT, migration_id=m.id), q)


def no_credential_in_the_output_of_any_command(recorded):
    """Every command above ran with known fake credentials and --verbose (success paths)."""
    m, _, _, output = recorded
    assert f"{m.id}" in output and "backfill" in output  # the commands' output really was captured
    assert leaks(output) == []


def test_the_observer_policy_grants_no_write_at_all():
    """Pure: no write action in the observer's policy, on any table (reads only)."""
    m = parse(migration_text("sensor", "Data", "mig-1"), "<m>")
    actions = {a for st in iam.policy("observer", m.table, "ctl", migration_id=m.id)["Statement"]
               for a in st["Action"]}
    assert "dynamodb:Scan" in actions and "dynamodb:GetItem" in actions
    assert {a for a in actions if not a.split(":")[1].startswith(("Describe", "Get", "BatchGet", "Query", "Scan"))} \
        == set()
    assert "verify --no-record" in iam.ROLES["observer"] and "verify" not in iam.ROLES["observer"]
