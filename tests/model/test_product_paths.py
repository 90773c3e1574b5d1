"""The memory client runs reshard's own code paths, and parses every expression reshard sends.

Two checks:

* every ConditionExpression / UpdateExpression / KeyConditionExpression /
  FilterExpression / ProjectionExpression found by grepping ``reshard/`` (and the ones
  the product builds: fences, the shim's merged updates and key conditions) parses, with
  the names and values the product passes;
* the product's flows -- control store, backfill, verify, cleanup (TTL and delete),
  abort + retire, the shim in every phase -- run to the right result on the memory
  client, under the real ``Dynamo`` choke point, and a recorder shows which expressions
  they sent (all of them parsed, or the flows would have failed).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.core.phases import Action, Phase
from reshard.core.versions import fence_for, unchanged



from reshard.shim.expr import and_conditions, merge_update
from reshard.shim.query import _key_condition
from reshard.control.transition import transition
from reshard.control.transition import retire
from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.verify import VERIFY
from reshard.jobs.cleanup import CLEANUP
from tests.backfill_support import Shim, diff, expected_table, logical, scan_all, setup_migration
from tests.model import expressions as ex
from tests.model.memory_dynamo import MemoryDynamo
from tests.shim_helpers import create_table, migration, shim

S = lambda s: {"S": s}  # noqa: E731
N = lambda n: {"N": str(n)}  # noqa: E731
FAST = dict(segments=2, workers=1, page_size=7)

# (kind, expression, names, values): found by `grep -rn "Expression\|condition=" reshard/`.
GREPPED = [
    # reshard/control/store.py
    ("condition", "attribute_not_exists(pk)", {}, {}),
    ("condition", "attribute_not_exists(pk) OR migration_id = :id", {}, {":id": S("m")}),
    ("condition", "migration_id = :other", {}, {":other": S("m")}),
    ("condition", "migration_id = :id", {}, {":id": S("m")}),
    ("condition", "phase_version = :v AND phase = :from", {}, {":v": N(1), ":from": S("planned")}),
    ("condition", "phase_version = :v AND phase = :ph", {}, {":v": N(1), ":ph": S("aborted")}),
    ("update", "SET phase = :to, phase_version = :nv, updated_at = :now, updated_by = :who, "
               "last_from = :from, last_to = :to, last_action = :act", {},
     {":to": S("a"), ":nv": N(2), ":now": N(1.5), ":who": S("w"), ":from": S("b"), ":act": S("advance")}),
    ("update", "SET retired = :t, phase_version = :nv, updated_at = :now, updated_by = :who, "
               "last_from = :ph, last_to = :ph, last_action = :act", {},
     {":t": {"BOOL": True}, ":nv": N(2), ":now": N(1), ":who": S("w"), ":ph": S("aborted"), ":act": S("retire")}),
    ("key", "pk = :pk AND begins_with(sk, :p)", {}, {":pk": S("M#x"), ":p": S("H#")}),
    ("key", "pk = :pk", {}, {":pk": S("M#x")}),
    ("filter", "sk = :m", {}, {":m": S("META")}),
    # reshard/jobs/engine.py (claim, fenced updates, run stamp)
    ("update", "SET #owner = :me, lease_expires = :exp, lease_counter = if_not_exists(lease_counter, :zero) + :one, "
               "done = if_not_exists(done, :f), job = :job, run = :run, #seg = :seg, "
               "takeovers = if_not_exists(takeovers, :zero) + :tk, failed = :f, attempts = :zero",
     {"#owner": "owner", "#seg": "segment"},
     {":me": S("h:1:a:0"), ":exp": N(60), ":one": N(1), ":zero": N(0), ":f": {"BOOL": False}, ":job": S("backfill"),
      ":run": N(1), ":seg": N(0), ":tk": N(0)}),
    ("condition", "lease_counter = :seen AND done = :f", {}, {":seen": N(3), ":f": {"BOOL": False}}),
    ("condition", "#owner = :me AND lease_counter = :tok", {"#owner": "owner"}, {":me": S("x"), ":tok": N(1)}),
    ("update", "SET finished_at = :now, totals = :tot", {}, {":now": N(1), ":tot": {"M": {"moved": N(1)}}}),
    ("condition", "attribute_not_exists(finished_at)", {}, {}),
    # reshard/jobs/cleanup.py
    ("update", "SET #ttl = :exp", {"#ttl": "expires_at"}, {":exp": N(1)}),
    ("condition", "attribute_exists(#pk) AND (attribute_not_exists(#ttl) OR #ttl > :exp)",
     {"#pk": "PK", "#ttl": "expires_at"}, {":exp": N(1)}),
    # reshard/jobs/backfill.py, verify.py: projections
    ("projection", "#k0, #k1, #v", {"#k0": "PK", "#k1": "SK", "#v": "_rs_v"}, {}),
    ("projection", "#k0, #k1, #v, #d, #n", {"#k0": "PK", "#k1": "SK", "#v": "_rs_v", "#d": "_rs_del",
                                           "#n": "_rs_new"}, {}),
    # reshard/demo.py
    ("update", "SET temperature = :t, revision = if_not_exists(revision, :z) + :one", {},
     {":t": N(20), ":z": N(0), ":one": N(1)}),
]


def _built():
    """Expressions the product builds at run time, from the product's own functions."""
    out = []
    for f in (fence_for(""), fence_for("0001700000000000.000000.w"), unchanged("", "PK"),
              unchanged("0001700000000000.000000.w", "PK")):
        out.append(("condition", f.expression, f.names, f.values or {}))
        app = and_conditions("attribute_not_exists(sensor_id)", f.expression)
        out.append(("condition", app, f.names, f.values or {}))
    # The shim's merged update: the app's clauses plus its bookkeeping (shim/writes.py: WriteProtocol._write_update).
    merged = merge_update("SET #t = :t REMOVE gone ADD n :one, tags :tags",
                          ["#rs_k0 = if_not_exists(#rs_k0, :rs_k0)", "#rs_new = :rs_new", "#rs_v = :rs_nv"],
                          ["#rs_del"])
    out.append(("update", merged, {"#t": "temp", "#rs_k0": "sensor_id", "#rs_new": "_rs_new", "#rs_v": "_rs_v",
                                   "#rs_del": "_rs_del"},
                {":t": N(1), ":one": N(1), ":tags": {"SS": ["a"]}, ":rs_k0": S("s-1"), ":rs_new": S("m"),
                 ":rs_nv": S("v")}))
    # The shim's fan-out query key conditions (shim/query.py), one per SortKeyCondition form.
    for cond in (None, ("=", "a"), ("<", "a"), ("<=", "a"), (">", "a"), (">=", "a"), ("between", "a", "b"),
                 ("begins_with", "a")):
        kce, names, vals = _key_condition("PK", "SK", cond)
        out.append(("key", kce, names, {**vals, ":rs_pk": S("s-1#3")}))
    return out


@pytest.mark.parametrize("kind,text,names,values", GREPPED + _built(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_product_expression_parses(kind, text, names, values):
    ctx = ex.Context(names, values)
    if kind == "update":
        clauses = ex.parse_update(text, ctx)
        ex.check_overlaps(clauses)
    elif kind == "projection":
        ex.parse_projection(text, ctx)
    elif kind == "key":
        shim_query = "#rs_pk" in text  # the shim's queries name the data table's PK/SK
        MemoryDynamo()._key_condition(text, ctx, "PK" if shim_query else "pk", "SK" if shim_query else "sk",
                                      {"pk": "S", "sk": "S", "PK": "S", "SK": "S"})
    else:
        ex.parse_condition(text, ctx)
    ctx.check_unused()  # DynamoDB refuses unused names and values: so do we


class Recorder:
    """An interceptor remembering every expression sent (to show what the flows exercised)."""

    def __init__(self):
        self.seen: dict[str, set] = {}
        self.ops: dict[str, int] = {}

    def before(self, op, kwargs):
        self.ops[op] = self.ops.get(op, 0) + 1
        for k in ("ConditionExpression", "UpdateExpression", "KeyConditionExpression", "FilterExpression",
                  "ProjectionExpression"):
            if kwargs.get(k):
                self.seen.setdefault(k, set()).add(kwargs[k])

    def after(self, op, kwargs, resp, err):
        pass


@pytest.fixture
def recorded():
    rec = Recorder()
    db = MemoryDynamo(interceptor=rec)
    return Dynamo(db, retry=RetryPolicy(max_attempts=2, base_seconds=0.001), sleep=lambda s: None), rec


@pytest.mark.parametrize("kind", ["sensor", "invoices", "hourly"])
def test_backfill_verify_cleanup_run_exactly_on_the_memory_client(recorded, kind):
    dynamo, rec = recorded
    m, mapper, store = setup_migration(dynamo, kind, f"T{kind}")
    shim_ = Shim(dynamo, mapper, m.table)
    for i in range(40):
        shim_.seed(logical(kind, i))
    for i in range(40, 50):
        shim_.put(logical(kind, i))
    shim_.delete(logical(kind, 45))
    result = run_job(BACKFILL, dynamo, store, m.id, JobOptions(**FAST, lease_seconds=30))
    assert result.done and not result.failed
    assert diff(scan_all(dynamo, m.table), expected_table(mapper, shim_.model)) == []
    v = run_job(VERIFY, dynamo, store, m.id, JobOptions(**FAST, rechecks=2, recheck_pause=0.0), sleep=lambda s: None)
    assert v.finished and v.passed, v.counts
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # cutover
    v = run_job(VERIFY, dynamo, store, m.id, JobOptions(**FAST, rechecks=2, recheck_pause=0.0), sleep=lambda s: None)
    assert v.passed, v.counts  # the catch-up verify after the switch
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # cleanup
    c = run_job(CLEANUP, dynamo, store, m.id, JobOptions(**FAST, delete=kind != "sensor", enable_ttl=kind == "sensor"))
    assert c.done
    _, done = transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    assert done.phase is Phase.COMPLETE
    assert [t.to_phase for t in store.history(m.id)][-1] == "complete"
    # What the flows sent (each parsed and evaluated, or they would have failed):
    conds = rec.seen["ConditionExpression"]
    assert "attribute_not_exists(pk) OR migration_id = :id" in conds
    assert "#owner = :me AND lease_counter = :tok" in conds
    assert "lease_counter = :seen AND done = :f" in conds or "attribute_not_exists(pk)" in conds
    assert "phase_version = :v AND phase = :from" in conds
    assert "pk = :pk AND begins_with(sk, :p)" in rec.seen["KeyConditionExpression"]
    # The backfill's copies and cleanup's deletes are single version-conditioned writes now
    # (no BatchWriteItem on the data path).
    # (A copy may also replace an earlier migration's retired leftover: jobs/runner.over_leftovers.)
    assert "(attribute_not_exists(#rs_k) OR (attribute_not_exists(#rs_v) AND #rs_src = :rs_src)) OR " \
           "attribute_exists(#rs_gone)" in conds
    # (verify sends no BatchGetItem on a clean table: it joins what it scanned, and re-reads
    # only the items whose records disagree.)
    assert {"scan", "update_item", "put_item"} <= set(rec.ops)


def test_abort_and_retire(recorded):
    dynamo, rec = recorded
    m, mapper, store = setup_migration(dynamo, "sensor", "Tabort")
    transition(store, m.id, Action.ABORT, allow_no_shims=True)
    state = retire(store, m.id)
    assert state.phase is Phase.ABORTED and state.raw["retired"] == {"BOOL": True}
    assert "phase_version = :v AND phase = :ph" in rec.seen["ConditionExpression"]
    assert store.list_states()[0].id == m.id  # the Scan with FilterExpression sk = :m


PHASES = [None, "planned", "dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete", "aborted"]


@pytest.mark.parametrize("phase", PHASES)
def test_the_shim_in_every_phase(recorded, phase):
    dynamo, rec = recorded
    m = migration("sensor", table="sensor")
    create_table(dynamo, m)
    t = shim(m, dynamo, phase)

    def ev(i, **extra):
        return {"sensor_id": "s-1", "event_id": f"e-{i}", "ts": f"2024-10-27T15:{i:02d}:00Z", **extra}

    def key(i):
        return {k: ev(i)[k] for k in ("sensor_id", "event_id", "ts")}

    for i in range(6):
        t.put_item(Item=ev(i, temp=Decimal(i)), ConditionExpression="attribute_not_exists(sensor_id)")
    with pytest.raises(errors.ConditionalCheckFailed):
        t.put_item(Item=ev(0), ConditionExpression="attribute_not_exists(sensor_id)")
    r = t.update_item(Key=key(1), UpdateExpression="SET #t = :t REMOVE gone ADD n :one, tags :tags",
                      ConditionExpression="#t > :small", ExpressionAttributeNames={"#t": "temp"},
                      ExpressionAttributeValues={":t": Decimal(9), ":one": Decimal(1), ":tags": {"a"},
                                                 ":small": Decimal(0)}, ReturnValues="ALL_NEW")
    assert r["Attributes"]["n"] == 1 and r["Attributes"]["temp"] == 9 and r["Attributes"]["tags"] == {"a"}
    with pytest.raises(errors.ConditionalCheckFailed):
        t.update_item(Key=key(1), UpdateExpression="SET #t = :t", ConditionExpression="#t > :big",
                      ExpressionAttributeNames={"#t": "temp"},
                      ExpressionAttributeValues={":t": Decimal(1), ":big": Decimal(100)})
    t.update_item(Key=key(2), UpdateExpression="SET temperature = :t, revision = if_not_exists(revision, :z) + :one",
                  ExpressionAttributeValues={":t": 1, ":z": Decimal(0), ":one": Decimal(1)})
    t.delete_item(Key=key(3), ConditionExpression="attribute_exists(#t)", ExpressionAttributeNames={"#t": "temp"})
    assert t.get_item(Key=key(3), ConsistentRead=True).get("Item") is None
    assert t.get_item(Key=key(2), ConsistentRead=True).get("Item")["revision"] == 1
    expected = {None: 5, "=": 1, "<": 3, "<=": 3, ">": 4, ">=": 4, "between": 2, "begins_with": 5}
    for cond in [None, ("=", "2024-10-27T15:02:00Z"), ("<", "2024-10-27T15:03"), ("<=", "2024-10-27T15:03"),
                 (">", "2024-10-27T15:01"), (">=", "2024-10-27T15:01"),
                 ("between", "2024-10-27T15:01", "2024-10-27T15:04"), ("begins_with", "2024-10-27T15:0")]:
        out = t.query(Key={"sensor_id": "s-1"}, SortKeyCondition=cond, Limit=2)
        items = out["Items"]
        while "LastEvaluatedKey" in out:
            out = t.query(Key={"sensor_id": "s-1"}, SortKeyCondition=cond, Limit=2,
                          ExclusiveStartKey=out["LastEvaluatedKey"])
            items += out["Items"]
        assert len(items) == expected[cond[0] if cond else None], (phase, cond)
