"""A combined migration (the table's keys AND a sharded GSI) from the command line on dynalite.

The file is ``migrations/0006_invoices_table_and_gsi.toml`` on a small table: the table moves
2 -> 8 calculated suffixes, the ByCountry GSI's ``gsi_shard`` from Random(0..3) to
sha256(customer) % 16. The first tests' traffic is raw writes shaped like a shim's (a ``dual_write``
mirror that still carries an old GSI value); the last one runs shims (writes and
``query(IndexName=...)`` in every phase).
"""

from __future__ import annotations

import json
import random
import threading
import time
from decimal import Decimal

import pytest
from boto3.dynamodb.conditions import Key

from reshard.core.marker import is_marker
from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.jobs import backfill as backfill_jobs
from reshard.jobs.runner import JobOptions
from reshard.operations import run_data_job
from reshard.core.phases import Action
from reshard.core.versions import Fence
from reshard.core.wire import key_of
from reshard.shim.table import ShardedTable
from reshard.core.index import IndexMapper
from reshard.core.layout import NEW_COPY_ATTR, VERSION_ATTR, KeyMapper, is_tombstone
from reshard.core.migration import parse
from reshard.core.versions import VersionClock

from tests.conftest import ROOT
from tests.index_support import create_gsi_table
from tests.integration.test_lifecycle import cli

COMBINED = ROOT / "migrations" / "0006_invoices_table_and_gsi.toml"
HEADERS = 24


def combined_file(tmp_path, table: str):
    text = COMBINED.read_text().replace('table = "InvoiceTransactions"', f'table = "{table}"')
    path = tmp_path / "both.toml"
    path.write_text(text)
    return path, parse(text, str(path))


def seed(dynalite, table: str, m) -> dict[str, dict]:
    """Headers (in the GSI, at a random old value) and line items (outside it), old layout."""
    mapper = KeyMapper(m)
    rng = random.Random(3)
    heads = {}
    for i in range(HEADERS):
        inv = str(5000 + i)
        item = {**mapper.old.key({"invoice": inv, "line": "root"}), "tx_country": {"S": ("USA", "FRA")[i % 2]},
                "customer": {"S": f"c-{i % 9}"}, "amount": {"N": str(100 + i)},
                "gsi_shard": {"N": str(rng.randrange(4))}}
        dynalite.call("put_item", TableName=table, Item=item)
        heads[inv] = item
        if i % 4 == 0:
            dynalite.call("put_item", TableName=table, Item={**mapper.old.key({"invoice": inv, "line": "line#1"}),
                                                             "amount": {"N": "1"}})
    return heads


def mirror_in_dual_write(dynalite, table: str, m, heads: dict, inv: str) -> None:
    """What a dual_write shim's put leaves: both copies at one version, the GSI at an OLD value."""
    mapper = KeyMapper(m)
    item = dict(heads[inv], amount={"N": "777"}, **{VERSION_ATTR: {"S": VersionClock("app").next()}})
    dynalite.call("put_item", TableName=table, Item=item)
    new = dict(item, **mapper.new.key({"invoice": inv, "line": "root"}), **{NEW_COPY_ATTR: {"S": m.id}})
    dynalite.call("put_item", TableName=table, Item=new)
    heads[inv] = item


def physical(dynalite, table: str) -> list[dict]:
    """The table's items (the table marker, which `start` writes, is not one)."""
    return [i for i in dynalite.call("scan", TableName=table, ConsistentRead=True)["Items"] if not is_marker(i)]


def test_combined_file_from_start_to_complete(dynalite, dynalite_server, unique_name, tmp_path, capsys):
    table = unique_name[:60]
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", f"{table}-ctl"]
    path, m = combined_file(tmp_path, table)
    create_gsi_table(dynalite, table)
    heads = seed(dynalite, table, m)
    mapper, index = KeyMapper(m), IndexMapper(m.indexes[0])

    assert cli("plan", str(path), "--sample", "0", *g) == 0
    out = capsys.readouterr().out
    assert "Index ByCountry" in out and "backfill's GSI half" in out and "Items per shard, new layout (8" in out
    assert cli("start", str(path), *g) == 0, capsys.readouterr().err
    assert cli("advance", m.id, "--allow-no-shims", *g) == 0  # dual_write
    mirror_in_dual_write(dynalite, table, m, heads, "5001")
    for _ in range(2):  # dual_read (a switch: the GSI value shims write changes), backfill
        assert cli("advance", m.id, "--allow-no-shims", *g) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert cli("backfill", m.id, "--segments", "2", "--page-size", "7", *g) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    # Both halves in one summary: the copies and the GSI rewrite.
    assert "copied 2" in out and "GSI values: rewritten 2" in out, out
    after = physical(dynalite, table)
    in_index = [i for i in after if index.in_index(i)]
    moving = sum(mapper.moves(h) for h in heads.values())
    assert 0 < moving < HEADERS and len(in_index) == HEADERS + moving  # an old and a new copy of each that moves
    assert all(index.is_at(i, "new") for i in in_index)  # every copy, old ones and the mirror included

    # One old copy put back at an old GSI value: the index half of verify fails the run (a
    # read-only verify too), though the copies' content still agrees.
    victim = next(i for i in in_index if not mapper.is_new_copy(i) and mapper.moves(i))
    wrong = next(n for n in range(4) if not index.is_at(dict(victim, gsi_shard={"N": str(n)}), "new"))
    dynalite.call("put_item", TableName=table, Item=dict(victim, gsi_shard={"N": str(wrong)}))
    capsys.readouterr()
    for extra in ((), ("--no-record",)):
        assert cli("verify", m.id, "--segments", "2", "--workers", "1", "--settle-seconds", "0", *extra, *g) == 1
        out = capsys.readouterr().out
        # Only the index half fails it: the copies' content (the GSI attribute left out) agrees.
        kinds = {w[0]: w[1] for w in (line.split() for line in out.splitlines() if line.startswith("  "))
                 if len(w) > 1 and w[1].isdigit()}  # "  <kind>  <count>  (why)" per failing kind
        assert kinds.get("gsi_value") == "1" and not kinds.keys() & {"diverged", "stale", "missing"}, out
    # --repair rewrites it with the backfill's conditioned UpdateItem (that run still reports it).
    assert cli("verify", m.id, "--segments", "2", "--workers", "1", "--settle-seconds", "0", "--repair", *g) == 1
    assert index.is_at(dynalite.call("get_item", TableName=table, Key=key_of(victim, ["PK", "SK"]),
                                     ConsistentRead=True)["Item"], "new")
    assert cli("verify", m.id, "--segments", "2", "--workers", "1", "--settle-seconds", "0", *g) == 0, \
        capsys.readouterr()
    assert cli("advance", m.id, "--allow-no-shims", *g) == 0  # cutover (the switch)
    assert cli("verify", m.id, "--segments", "2", "--workers", "1", "--settle-seconds", "0", *g) == 0  # catch-up
    assert cli("advance", m.id, "--allow-no-shims", *g) == 0  # cleanup
    assert cli("cleanup", m.id, "--segments", "2", "--delete", *g) == 0, capsys.readouterr().err
    assert cli("advance", m.id, "--allow-no-shims", *g) == 0  # complete
    assert ControlStore(dynalite, f"{table}-ctl").load_state(m.id).phase.value == "complete"

    final = physical(dynalite, table)
    headers = [i for i in final if i["SK"]["S"] == "root"]
    assert len(headers) == HEADERS and len(final) == HEADERS + HEADERS // 4
    for item in final:  # every item at its new key, every header at its new GSI value
        fields = mapper.fields(item, mapper.new)
        assert mapper.new.key(fields) == {"PK": item["PK"], "SK": item["SK"]}
    for item in headers:
        inv = mapper.fields(item, mapper.new)["invoice"]
        assert index.is_at(item, "new") and item["amount"] == heads[inv]["amount"], inv


def test_combined_abort_brings_every_gsi_value_back(dynalite, dynalite_server, unique_name, tmp_path, capsys):
    table = unique_name[:60]
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", f"{table}-ctl"]
    path, m = combined_file(tmp_path, table)
    create_gsi_table(dynalite, table)
    heads = seed(dynalite, table, m)
    mapper, index = KeyMapper(m), IndexMapper(m.indexes[0])
    assert cli("start", str(path), *g) == 0
    assert cli("advance", m.id, "--allow-no-shims", *g) == 0
    capsys.readouterr()
    # The index's rule holds for a combined file: planned reads only old GSI values.
    assert cli("rollback", m.id, "--allow-no-shims", *g) == 2
    assert "rollback to planned is refused for a sharded-index migration" in capsys.readouterr().err
    for _ in range(2):
        assert cli("advance", m.id, "--allow-no-shims", *g) == 0
    assert cli("backfill", m.id, "--segments", "2", *g) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert cli("status", m.id, "--output", "json", *g) == 0
    (run,) = [j for j in json.loads(capsys.readouterr().out)["jobs"] if j["job"] == "backfill"]
    assert run["totals"]["copied"] > 0 and run["totals"]["gsi_moved"] > 0  # both halves, as recorded
    assert cli("doctor", m.id, *g) == 0, capsys.readouterr().out
    assert cli("iam-policy", str(path), "--role", "worker", *g) == 0
    assert "index/ByCountry" in capsys.readouterr().out
    moved = [i for i in physical(dynalite, table) if index.in_index(i)]
    assert all(index.is_at(i, "new") for i in moved)
    assert sum(not index.is_at(i, "old") for i in moved) > HEADERS // 2  # most values did change

    assert cli("abort", m.id, "--allow-no-shims", *g) == 0, capsys.readouterr().err  # a switch
    assert cli("cleanup", m.id, "--segments", "2", *g) == 0, capsys.readouterr().err
    state = ControlStore(dynalite, f"{table}-ctl").load_state(m.id)
    assert state.phase.value == "aborted" and state.retired

    final = physical(dynalite, table)
    assert not any(mapper.is_new_copy(i) for i in final)  # the new copies are gone
    headers = [i for i in final if i["SK"]["S"] == "root"]
    assert len(headers) == HEADERS
    for item in headers:  # each at its old key, with an old GSI value again
        inv = mapper.fields(item, mapper.old)["invoice"]
        assert {"PK": item["PK"], "SK": item["SK"]} == mapper.old.key({"invoice": inv, "line": "root"})
        assert index.is_at(item, "old"), item


@pytest.mark.parametrize("fence", ["version", "mutant"])
def test_shim_write_between_the_scan_and_the_copy_with_a_changed_gsi_value_stays(dynalite, dynalite_server,
                                                                                unique_name, tmp_path, monkeypatch,
                                                                                fence):
    """The new race of a combined backfill: the copy computes the new copy's GSI value from the
    item as scanned; a shim write (backfill phase: both copies, new GSI value, here of another
    customer) lands between that scan and the copy's PutItem. The version fence keeps the
    shim's write and its GSI value; the rewrite of the old copy is fenced the same way. The
    mutant (copy without a condition) puts the stale content and stale GSI value over it."""
    table = unique_name[:60]
    _, m = combined_file(tmp_path, table)
    create_gsi_table(dynalite, table)
    mapper, index = KeyMapper(m), IndexMapper(m.indexes[0])
    inv = next(str(i) for i in range(100) if mapper.moves(mapper.old.key({"invoice": str(i), "line": "root"})))
    old_key, new_key = (mapper.old.key({"invoice": inv, "line": "root"}),
                        mapper.new.key({"invoice": inv, "line": "root"}))
    stale = {**old_key, "tx_country": {"S": "USA"}, "customer": {"S": "c-1"}, "amount": {"N": "1"},
             "gsi_shard": {"N": "2"}}
    dynalite.call("put_item", TableName=table, Item=stale)
    store = ControlStore(dynalite, f"{table}-ctl")
    store.ensure_table()
    store.register(m)
    for _ in range(3):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    if fence == "mutant":
        monkeypatch.setattr(backfill_jobs, "copy_fence", lambda *a: Fence(
            "attribute_not_exists(#rs_v) OR attribute_exists(#rs_v)", {"#rs_v": VERSION_ATTR}, {}))

    # The shim's put in backfill: both copies, a newer version, the new GSI value of ITS customer.
    shim = {"tx_country": {"S": "USA"}, "customer": {"S": "c-7"}, "amount": {"N": "999"},
            VERSION_ATTR: {"S": VersionClock("shim").next()}}
    shim["gsi_shard"] = index.value(index.fields(shim, "new"), "new")
    assert shim["gsi_shard"] != index.value(index.fields(stale, "new"), "new")  # the race changes the value
    worker = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1", connect_timeout=1, read_timeout=4)
    seen = []

    def before_send(**kwargs):  # the worker's copy of the item, about to go on the wire
        if not seen and new_key["PK"]["S"] in kwargs["request"].body.decode():
            seen.append(1)
            dynalite.call("put_item", TableName=table, Item={**old_key, **shim})
            dynalite.call("put_item", TableName=table, Item={**new_key, **shim, NEW_COPY_ATTR: {"S": m.id}})
    worker.client.meta.events.register("before-send.dynamodb.PutItem", before_send)

    result = run_data_job("backfill", worker, store, m.id, JobOptions(segments=1, workers=1, lease_seconds=30))
    assert seen and result.done
    copy = dynalite.call("get_item", TableName=table, Key=new_key, ConsistentRead=True)["Item"]
    old = dynalite.call("get_item", TableName=table, Key=old_key, ConsistentRead=True)["Item"]
    if fence == "mutant":  # the check below can fail: the stale copy and its stale GSI value won
        assert copy["amount"] == {"N": "1"} and copy["gsi_shard"] != shim["gsi_shard"]
        return
    assert {k: copy[k] for k in shim} == shim and result.totals["fenced"] == 1
    assert {k: old[k] for k in shim} == shim and result.totals["gsi_raced"] == 1  # the rewrite left it too


class CombinedApp:
    """Shim threads on a combined file, each writing its own invoices (logical keys ``invoice``,
    ``line``) and querying ``ByCountry`` between writes: each of its live invoices of the country
    exactly once, with the amount last acknowledged."""

    def __init__(self, path: str, endpoint: str, control: str, base: dict[str, dict], threads: int = 2):
        self.expected: dict[str, dict | None] = dict(base)
        self.stage = "planned"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.queries: dict[str, int] = {}
        self.tables = [ShardedTable.from_file(path, endpoint_url=endpoint, control_table=control,
                                              refresh_seconds=0.3) for _ in range(threads)]
        ids = sorted(base) + [str(9000 + j) for j in range(10)]  # and brand-new invoices
        self.threads = [threading.Thread(target=self.run, args=(t, ids[n::threads], random.Random(n)), daemon=True)
                        for n, t in enumerate(self.tables)]
        for th in self.threads:
            th.start()

    def run(self, t, ids: list[str], rng: random.Random) -> None:
        while not self.stop.is_set():
            try:
                self.write(t, ids, rng)
                self.query(t, ids, rng.choice(("USA", "FRA")))
            except errors.SwitchInProgress:
                pass  # held through a switch, never sent; the oracle moves on acknowledgements only
            except Exception as e:  # noqa: BLE001 - the oracle must see every failure
                with self.lock:
                    self.errors.append(f"{type(e).__name__}: {e}")
            time.sleep(0.03)

    def write(self, t, ids: list[str], rng: random.Random) -> None:
        inv = rng.choice(ids)
        op = rng.choice(["put", "put", "update", "delete"])
        cur = self.expected.get(inv)
        key = {"invoice": inv, "line": "root"}
        if op == "put":
            new = {**key, "tx_country": rng.choice(("USA", "FRA")), "customer": f"c-{rng.randrange(9)}",
                   "amount": Decimal(rng.randrange(10**6))}
            t.put_item(Item=dict(new, gsi_shard=Decimal(rng.randrange(4))))  # the shim sets the phase's value
        elif op == "update":
            if cur is None:
                return
            new = dict(cur, amount=Decimal(rng.randrange(10**6)))
            t.update_item(Key=key, UpdateExpression="SET amount = :a", ExpressionAttributeValues={":a": new["amount"]})
        else:
            t.delete_item(Key=key)
            new = None
        with self.lock:
            self.expected[inv] = new

    def query(self, t, ids: list[str], country: str) -> None:
        stage, got = self.stage, []
        kw = {"IndexName": "ByCountry", "KeyConditionExpression": Key("tx_country").eq(country)}
        while True:
            resp = t.query(**kw)
            got += resp["Items"]
            if "LastEvaluatedKey" not in resp:
                break
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        mine = set(ids)
        invs = [i["invoice"] for i in got if i.get("line") == "root"]
        own = {i["invoice"]: i for i in got if i.get("line") == "root" and i["invoice"] in mine}
        with self.lock:
            want = {v: x for v in mine if (x := self.expected.get(v)) is not None and x["tx_country"] == country}
            self.queries[stage] = self.queries.get(stage, 0) + 1
            if len(invs) != len(set(invs)):
                self.violations.append(f"{stage}: {country}: an invoice returned twice: {sorted(invs)}")
            if set(own) != set(want):
                self.violations.append(f"{stage}: {country}: missing {sorted(set(want) - set(own))}, "
                                       f"unexpected {sorted(set(own) - set(want))}")
            for inv, item in own.items():
                if inv in want and item.get("amount") != want[inv]["amount"]:
                    self.violations.append(f"{stage}: {inv}: amount {item.get('amount')} != {want[inv]['amount']}")

    def finish(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(30)
        for t in self.tables:
            t.close()


def test_combined_file_with_shim_traffic_in_every_phase(dynalite, dynalite_server, unique_name, tmp_path, capsys):
    """The whole combined migration from the command line while shims write and query the index:
    no query misses or repeats one of a thread's invoices, in any phase."""
    table = unique_name[:60]
    control = f"{table}-ctl"
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", control]
    path, m = combined_file(tmp_path, table)
    create_gsi_table(dynalite, table)
    heads = seed(dynalite, table, m)
    base = {inv: {"invoice": inv, "line": "root", "tx_country": h["tx_country"]["S"],
                  "customer": h["customer"]["S"], "amount": Decimal(h["amount"]["N"])} for inv, h in heads.items()}
    assert cli("start", str(path), *g) == 0
    app = CombinedApp(str(path), dynalite_server.endpoint, control, base)
    steps = [("dual_write", ("advance", m.id, "--wait", "20")), ("dual_read", ("advance", m.id, "--wait", "20")),
             ("backfill", ("advance", m.id, "--wait", "20")),
             ("backfill", ("backfill", m.id, "--segments", "2", "--page-size", "10")),
             ("backfill", ("verify", m.id, "--segments", "2", "--workers", "1")),
             ("cutover", ("advance", m.id, "--wait", "20")),
             ("cutover", ("verify", m.id, "--segments", "2", "--workers", "1")),  # the catch-up verify
             ("cleanup", ("advance", m.id, "--wait", "20")),
             ("cleanup", ("cleanup", m.id, "--segments", "2", "--delete")),
             ("complete", ("advance", m.id, "--wait", "20"))]
    try:
        time.sleep(0.3)
        for stage, args in steps:
            assert cli(*args, *g) == 0, (args, capsys.readouterr().err)
            app.stage = stage
            time.sleep(0.2)  # queries in every phase
    finally:
        app.finish()
    assert app.errors == [] and app.violations == []
    assert set(app.queries) == {"planned", "dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete"}
    mapper, index = KeyMapper(m), IndexMapper(m.indexes[0])
    headers = {}
    for item in physical(dynalite, table):
        fields = mapper.fields(item, mapper.new)
        assert mapper.new.key(fields) == {"PK": item["PK"], "SK": item["SK"]}  # every item at its new key
        if fields["line"] == "root" and not is_tombstone(item):  # a tombstone: deleted in complete
            headers[fields["invoice"]] = item
    assert set(headers) == {inv for inv, x in app.expected.items() if x is not None}
    for inv, item in headers.items():
        assert index.is_at(item, "new") and Decimal(item["amount"]["N"]) == app.expected[inv]["amount"], inv
