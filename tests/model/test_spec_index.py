"""The model checker on a sharded GSI: a shim's fan-out query racing the in-place rewrite.

Every interleaving of one application query through the shim (``query(IndexName=...)``,
pinned to ``backfill``: it reads the old layout's partition values, then the new one's) with
the real rewrite (``IndexRewrite._update_once``: the version- and value-conditioned UpdateItem
that moves an item's GSI value from old to new) and a shim ``put_item`` (which writes the new
value itself). Every item exists throughout, so the invariant is exact: the query returns each
item once -- never missed while it moves, never twice. Each item sorts the same (one GSI sort
value, ``USA``: a single run of ties, the invoice article's hot country), so the paged variant
also checks the cursor inside a tie group.

The mutations show the fences are what holds it: the second pass skipping partition values the
first one read (old 0..1 lies inside new 0..3), and the passes in the wrong order, each let an
item moving between the passes be missed.
"""

from __future__ import annotations

import hashlib

import pytest

from reshard.core.index import INDEX_ROUTING, NEW, OLD, IndexMapper
from reshard.core.migration import parse
from reshard.core.phases import Phase
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.index_jobs import IndexRewrite
from reshard.shim.table import ShardedTable
from tests.index_support import create_gsi_table, gsi_migration
from tests.model.explore import World, explore

TABLE = "Invoices"
MIGRATION = gsi_migration("gsi-2-to-4", TABLE, old_shards=2, new_shards=4)
#: The same move to values that share none with the old ones (``n0``..``n3``, a string attribute).
DISJOINT = gsi_migration("gsi-2-to-4", TABLE, old_shards=2, new_shards=4, new_partition="n{shard}")

#: (invoice, customer, old shard): new shard = sha256(customer) % 4. "b": old 1 -> new 1 (stays);
#: "d": old 1 -> new 0 (moves to a value the first pass read *before* its old one); "g": old 0 -> new 1
#: (moves to a value the first pass reads *after* its old one); "c": old 0 -> new 2 (outside the old set).
ITEMS = (("1", "d", 1), ("2", "g", 0), ("3", "c", 0), ("4", "b", 1))


def new_shard(customer: str) -> int:
    return int(hashlib.sha256(customer.encode()).hexdigest(), 16) % 4


def wire(invoice: str, customer: str, shard: int, kind: str = "N") -> dict:
    return {"PK": {"S": f"InvoiceNumber#{invoice}"}, "SK": {"S": "root"}, "tx_country": {"S": "USA"},
            "customer": {"S": customer}, "gsi_shard": {kind: str(shard)}}


def world_with_items(w: World, text: str):
    m = parse(text, "<gsi>")
    kind = "S" if text is DISJOINT else "N"
    create_gsi_table(w.dynamo, TABLE, partition_type=kind)
    for invoice, customer, shard in ITEMS:
        w.dynamo.call("put_item", TableName=TABLE, Item=wire(invoice, customer, shard, kind))
    return m


def shim(w: World, m, name: str) -> ShardedTable:
    t = ShardedTable(m, w.dynamo, control_table=None, writer_id=name, query_workers=1, clock=w.clock)
    t._pin_phase("backfill")
    return t


def rewriter(w: World, m) -> IndexRewrite:
    budget = CapacityBudget(None, None, clock=w.clock, sleep=w.sleep)
    return IndexRewrite(w.dynamo, None, m.id, "backfill", {i.name: IndexMapper(i) for i in m.indexes}, m.keys,
                        TABLE, budget, NEW, {})


def scenario(limit: int | None, movers=("1", "2"), writer: str | None = "3", text: str = MIGRATION):
    """Q queries (pages of ``limit`` when set); R rewrites ``movers`` one UpdateItem each, as the
    backfill does (from the item as scanned before Q began); W puts ``writer`` through a shim
    (a backfill-phase write gives the new value)."""
    def factory(w: World):
        m = world_with_items(w, text)
        kind = "S" if text is DISJOINT else "N"
        q = shim(w, m, "reader")
        seen: list[str] = []

        def query():
            start = None
            while True:
                kwargs = {"IndexName": "ByCountry", "Key": {"tx_country": "USA"}}
                if limit:
                    kwargs["Limit"] = limit
                if start:
                    kwargs["ExclusiveStartKey"] = start
                resp = q.query(**kwargs)
                seen.extend(i["PK"] for i in resp["Items"])
                start = resp.get("LastEvaluatedKey")
                if not start:
                    return
        w.actor("Q", query)

        rw = rewriter(w, m)
        scanned = {invoice: wire(invoice, customer, shard, kind) for invoice, customer, shard in ITEMS}

        def rewrite():
            for invoice in movers:
                outcome, changes = rw.plan(scanned[invoice])
                assert outcome == "moved" and changes, (invoice, outcome)
                assert rw._update_once(None, (scanned[invoice], changes)) == "moved"
        w.actor("R", rewrite)

        if writer is not None:
            wt = shim(w, m, "writer")
            invoice, customer = next((i, c) for i, c, _ in ITEMS if i == writer)
            w.actor("W", lambda: wt.put_item(Item={"PK": f"InvoiceNumber#{invoice}", "SK": "root",
                                                   "tx_country": "USA", "customer": customer,
                                                   "gsi_shard": 0 if kind == "N" else "0"}))

        def check(w: World):
            want = sorted(f"InvoiceNumber#{i}" for i, _, _ in ITEMS)
            assert sorted(seen) == want, f"invariant: the fan-out returned {sorted(seen)}, every item once is {want}"
            # The scenario moved what it says it moved.
            im = IndexMapper(m.indexes[0])
            stored = {it["PK"]["S"]: it for it in w.db.items(TABLE)}
            for invoice, customer, _ in ITEMS:
                if invoice in movers or invoice == writer:
                    assert im.is_at(stored[f"InvoiceNumber#{invoice}"], NEW), invoice
        return check
    return factory


def test_the_items_move_where_the_scenario_says():
    assert [(i, new_shard(c), old) for i, c, old in ITEMS] == [("1", 0, 1), ("2", 1, 0), ("3", 2, 0), ("4", 1, 1)]


@pytest.mark.parametrize("text", [MIGRATION, DISJOINT], ids=["overlapping-values", "disjoint-values"])
def test_a_fan_out_racing_the_rewrite_returns_every_item_once(text):
    r = explore(scenario(None, text=text))
    r.assert_ok()
    assert r.schedules > 50, r


def test_a_paged_fan_out_racing_the_rewrite_returns_every_item_once():
    """Limit=2: the cursor sits inside the run of equal sort values; items move between pages."""
    r = explore(scenario(2, writer=None), preemption_bound=2)
    r.assert_ok()
    assert r.schedules > 50, r


def must_find(factory, **bounds) -> str:
    r = explore(factory, **bounds)
    assert r.violation is not None, f"the checker found nothing without the fence ({r.schedules} schedules)"
    assert r.violation.message.startswith("invariant:") or "invariant:" in r.violation.message, \
        r.violation.report()[:3000]
    return r.violation.message


def test_without_rereading_the_first_pass_values(monkeypatch):
    """The second pass skips the partition values the first read (0..1 inside 0..3): "1" moving
    1 -> 0 after the first pass read 0 and before it read 1 is missed."""
    real = IndexMapper.query_values

    def skip(self, side, eq):
        values = real(self, side, eq)
        if side == NEW:
            first = real(self, OLD, eq)
            values = [v for v in values if v not in first]
        return values
    monkeypatch.setattr(IndexMapper, "query_values", skip)
    must_find(scenario(None, movers=("1",), writer=None))


def test_with_the_passes_in_the_wrong_order(monkeypatch):
    """New values first, then old: "2" moving old 0 -> new n1 after the first pass read n1 and
    before the second read 0 is missed. (Where the new values include every old one, the first
    pass reads the old values too and this order happens to hold: hence disjoint values.)"""
    import reshard.shim.routing as shim_routing
    routing = INDEX_ROUTING[Phase.BACKFILL]
    wrong = type(routing)(routing.writes, (NEW, OLD))
    monkeypatch.setitem(shim_routing.INDEX_ROUTING, Phase.BACKFILL, wrong)
    must_find(scenario(None, movers=("2",), writer=None, text=DISJOINT))


def rewrite_racing_a_put(w: World):
    """R scanned "1" (customer d, old 1) and rewrites it to its new value; W puts "1" again with
    customer b, whose new value (1) equals the scanned old one, so only the version tells the
    rewrite that the item changed. Either order must leave "1" at the new value of what W wrote."""
    m = world_with_items(w, MIGRATION)
    rw = rewriter(w, m)
    scanned = wire("1", "d", 1)
    outcome, changes = rw.plan(scanned)
    assert outcome == "moved"
    w.actor("R", lambda: rw._update_once(None, (scanned, changes)))
    wt = shim(w, m, "writer")
    w.actor("W", lambda: wt.put_item(Item={"PK": "InvoiceNumber#1", "SK": "root", "tx_country": "USA",
                                           "customer": "b", "gsi_shard": 1}))

    def check(w: World):
        im = IndexMapper(m.indexes[0])
        item = next(i for i in w.db.items(TABLE) if i["PK"]["S"] == "InvoiceNumber#1")
        assert item["customer"] == {"S": "b"}
        assert im.is_at(item, NEW), f"invariant: the rewrite overwrote a newer write: {item['gsi_shard']} for customer b"
    return check


def test_the_rewrite_never_overwrites_a_newer_shim_write():
    r = explore(rewrite_racing_a_put)
    r.assert_ok()
    assert r.schedules >= 2, r


def test_without_the_rewrites_version_fence(monkeypatch):
    """The rewrite's UpdateItem without its version condition (the scanned-value condition
    stays): W's put lands first, the rewrite still matches the value and writes d's new value."""
    import reshard.jobs.index_jobs as index_jobs
    from tests.model.test_spec_mutations import disabled_in
    disabled_in(index_jobs, "unchanged", "_update_once", monkeypatch)
    must_find(rewrite_racing_a_put)
