"""The model checker on a migration that re-keys the table *and* a sharded GSI at once (issue 15).

A logical item has up to two physical copies (old key, new key; one item where both keys are
equal) and each copy is an entry of the GSI, maybe stale (a lost mirror, a cleanup-phase write
that leaves the old copy behind), maybe a copy whose counterpart is a tombstone. The shim's
``query(IndexName=...)`` fans out over the index (two passes) and resolves every entry to its
logical item, read as ``get_item`` reads it in that phase (reshard/shim/index.py).

Each scenario builds the migration's history up to one phase through the shims' own writes
(dual_write, dual_read, backfill, cutover, cleanup; aborted from a half-done backfill; lost
mirrors made by dropping a shim's mirror write) and then explores every interleaving, up to a
preemption bound, of one application query (whole, or in pages of ``Limit=1``: the cursor sits
on (sort value, logical key)) with what runs in that phase: a shim updating an item's sort
value, a shim deleting an item, and where the phase has them the copier (A2's backfill copy: the
old item re-keyed, its GSI value the new layout's, one version-conditioned PutItem), the GSI
rewrite (``IndexRewrite._update_once``, old -> new; abort's: new -> old) and cleanup's deletes
(old copies; an abort's new copies). The invariant:

* an item no actor writes during the query is returned exactly once, with the content
  ``get_item`` gives it (never a stale copy's, never a deleted item);
* an item written during the query is returned at most twice (its sort value moved between two
  pages, as DynamoDB's own pages may show it), each time with its content before or after;
* the results are in sort-value order.

Mutations that the checker must catch: no logical resolution (one result per *table* key, as an
index-only migration has it: both copies returned); resolution that takes the newest *live* copy
(a deleted item's stale copy comes back) or the copy of the last layout read (a stale copy's
content); resolution without the rule that an item is returned only where its own sort value
puts it (a stale copy's entry returns it at the wrong place, and twice).
"""

from __future__ import annotations

import copy as copy_module
import sys

import pytest

from reshard.core.index import NEW, OLD, IndexMapper
from reshard.core.layout import KeyMapper, is_tombstone
from reshard.core.migration import parse
from reshard.core.versions import newest
from reshard.jobs.backfill import Backfill
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.cleanup import Cleaner
from reshard.jobs.index_jobs import IndexRewrite
from reshard.jobs.runner import JobOptions
from reshard.shim.table import ShardedTable
from tests.model.explore import World, explore

TABLE = "Invoices"
INDEX = "ByCountry"
TEXT = f"""\
id = "combined-2-to-4"
table = "{TABLE}"

[keys]
partition = "PK"

[from]
partition = "INV#{{invoice}}#{{shard}}"
shards = 2
shard_by = ["invoice"]

[to]
partition = "INV#{{invoice}}#{{shard}}"
shards = 4
shard_by = ["invoice"]

[index.{INDEX}]
partition = "gsi_shard"
sort = "tx_country"

[index.{INDEX}.from]
partition = "{{shard}}"
shards = 2
shard_by = ["customer"]

[index.{INDEX}.to]
partition = "{{shard}}"
shards = 4
shard_by = ["customer"]
"""
M = parse(TEXT, "<combined>")
MAPPER = KeyMapper(M)
IM = IndexMapper(M.indexes[0])

#: invoice -> (customer, country) before the migration. Table keys: invoices 2 and 5 keep theirs
#: (shard 1 of 2 and of 4: one physical item), the others move. GSI values: a 1 -> 3, b 1 -> 1,
#: c 0 -> 2, d 0 -> 0 (the new values 0..3 include every old one).
ITEMS = {"1": ("a", "USA"), "2": ("b", "USA"), "3": ("c", "USA"), "4": ("d", "USA"), "5": ("b", "CAN"),
         "6": ("a", "CAN")}
INVOICES = ("1", "2", "3", "4", "5", "6", "8")


def old_key(invoice: str) -> dict:
    return MAPPER.old.key({"invoice": invoice})


def new_key(invoice: str) -> dict:
    return MAPPER.new.key({"invoice": invoice})


def stored(w: World, key: dict) -> dict | None:
    return w.db.get_item(TableName=TABLE, Key=key, ConsistentRead=True).get("Item")


def shim(w: World, name: str, phase: str) -> ShardedTable:
    t = ShardedTable(M, w.dynamo, control_table=None, writer_id=name, query_workers=1, clock=w.clock)
    t._pin_phase(phase)
    return t


def set_country(t: ShardedTable, invoice: str, country: str) -> None:
    t.update_item(Key={"invoice": invoice}, UpdateExpression="SET tx_country = :c",
                  ExpressionAttributeValues={":c": country})


def losing_mirrors(t: ShardedTable, fn) -> None:
    """``fn()`` with the shim's mirror writes lost (a crash after the authoritative write)."""
    t._mirror_to = lambda *a, **k: None
    try:
        fn()
    finally:
        del t._mirror_to


def budget(w: World) -> CapacityBudget:
    return CapacityBudget(None, None, clock=w.clock, sleep=w.sleep)


def copy(w: World, scanned: dict) -> str:
    """A2's backfill copy of one scanned old item: re-keyed, its GSI value the new layout's, one
    version-conditioned PutItem (``Backfill._copy``)."""
    item, moves = MAPPER.remap(scanned)
    assert moves, scanned
    if IM.in_index(item):
        item[IM.attr] = IM.value(IM.fields(item, NEW), NEW)
    return Backfill(w.dynamo, None, M.id, MAPPER, TABLE, budget(w))._copy(None, (scanned, item))


def rewrite(w: World, scanned: dict, dest: str) -> str:
    """The GSI rewrite of one scanned physical item (either copy) toward ``dest``."""
    rw = IndexRewrite(w.dynamo, None, M.id, "backfill" if dest == NEW else "cleanup", {INDEX: IM}, M.keys, TABLE,
                      budget(w), dest, {})
    outcome, changes = rw.plan(scanned)
    return rw._update_once(None, (scanned, changes)) if changes else outcome


def cleaner(w: World, aborted: bool) -> Cleaner:
    return Cleaner(w.dynamo, MAPPER, TABLE, budget(w), JobOptions(), aborted=aborted, clock=w.clock)


def create_table(w: World) -> None:
    w.dynamo.call("create_table", TableName=TABLE, BillingMode="PAY_PER_REQUEST",
                  AttributeDefinitions=[{"AttributeName": a, "AttributeType": t} for a, t in
                                        (("PK", "S"), ("gsi_shard", "N"), ("tx_country", "S"))],
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                  GlobalSecondaryIndexes=[{"IndexName": INDEX, "Projection": {"ProjectionType": "ALL"}, "KeySchema": [
                      {"AttributeName": "gsi_shard", "KeyType": "HASH"},
                      {"AttributeName": "tx_country", "KeyType": "RANGE"}]}])


_HISTORIES: dict[str, tuple] = {}


def with_history(w: World, upto: str) -> dict:
    """The table as :func:`history` leaves it, built once per phase and copied into each run;
    returns every item as ``get_item`` reads it then (the oracle)."""
    if upto not in _HISTORIES:
        built = World()
        history(built, upto)
        oracle = shim(built, "oracle", upto)
        _HISTORIES[upto] = built.db.tables[TABLE], {
            i: oracle.get_item(Key={"invoice": i}, ConsistentRead=True).get("Item") for i in INVOICES}
        World.current = w
    table, before = _HISTORIES[upto]
    w.db.tables[TABLE] = copy_module.deepcopy(table)
    return before


def history(w: World, upto: str) -> None:
    """The migration's life up to ``upto``, through the shims' own writes (not explored)."""
    create_table(w)
    for invoice, (customer, country) in ITEMS.items():  # pre-migration: unversioned, old keys and GSI values
        item = {"invoice": {"S": invoice}, "customer": {"S": customer}, "tx_country": {"S": country},
                IM.attr: IM.value({"customer": customer}, OLD), **old_key(invoice)}
        w.db.put_item(TableName=TABLE, Item=item)
    if upto == "planned":
        return
    h = shim(w, "history", "dual_write")
    set_country(h, "1", "MEX")                     # both copies, old GSI value
    h.delete_item(Key={"invoice": "2"})            # a tombstone (one physical item)
    set_country(h, "3", "FRA")                     # both copies FRA
    losing_mirrors(h, lambda: set_country(h, "3", "PER"))  # old copy PER, new copy FRA: stale
    if upto == "dual_write":
        return
    h._pin_phase("dual_read")
    set_country(h, "4", "BRA")                     # both copies, new GSI value
    h.put_item(Item={"invoice": "8", "customer": "c", "tx_country": "USA", "gsi_shard": 0})
    losing_mirrors(h, lambda: h.delete_item(Key={"invoice": "8"}))  # old: tombstone; new: stale live copy
    if upto in ("dual_read", "backfill"):
        return
    if upto == "aborted":
        copy(w, stored(w, old_key("6")))          # a half-done backfill: one copy, one rewrite
        rewrite(w, stored(w, old_key("4")), NEW)
        return
    for invoice in INVOICES:                       # the whole backfill: copies, then every GSI value
        item = stored(w, old_key(invoice))
        if item is not None and not is_tombstone(item) and MAPPER.moves(item):
            copy(w, item)
    for item in list(w.db.items(TABLE)):
        if not is_tombstone(item):
            rewrite(w, item, NEW)
    h._pin_phase("cutover")
    set_country(h, "5", "JPN")                     # new copy first, then the old one
    if upto == "cutover":
        return
    h._pin_phase("cleanup")
    set_country(h, "6", "IND")                     # new copy only: the old copy stays at CAN
    h.delete_item(Key={"invoice": "1"})            # new copy only: the old copy stays, live, in the index


#: Per phase: the history, the shim writes racing the query, and the jobs of that phase
#: (each job acts on one item as scanned before the query began).
SCENARIOS = {
    "dual_write": dict(writes=[("update", "5", "ARG"), ("delete", "6")], jobs=[]),
    "dual_read": dict(writes=[("update", "5", "ARG"), ("delete", "6")], jobs=[]),
    "backfill": dict(writes=[], jobs=[("copy", "6"), ("rewrite-old", "1")]),
    "cutover": dict(writes=[("update", "5", "ARG"), ("delete", "6")], jobs=[]),
    "cleanup": dict(writes=[("update", "3", "ARG")], jobs=[("expire", "6")]),
    "aborted": dict(writes=[("update", "5", "ARG")], jobs=[("rewrite-back", "4"), ("remove-copy", "6")]),
}


def scenario(phase: str, limit: int | None = None, writes=None, jobs=None, writer_phase: str | None = None):
    """The query on ``phase``; the shim writes on ``writer_phase`` (default: the same; an adjacent
    phase two shims may be on at once, i.e. one the switch does not separate)."""
    spec = SCENARIOS.get(phase, {"writes": [], "jobs": []})
    writes = spec["writes"] if writes is None else writes
    jobs = spec["jobs"] if jobs is None else jobs

    def factory(w: World):
        before = with_history(w, phase)
        writer_of: dict[str, str] = {}  # invoice -> the actor writing it
        seen: list[dict] = []
        q = shim(w, "reader", phase)

        def query():
            start = None
            while True:
                kwargs = {"IndexName": INDEX}
                if limit:
                    kwargs["Limit"] = limit
                if start:
                    kwargs["ExclusiveStartKey"] = start
                resp = q.query(**kwargs)
                seen.extend(resp["Items"])
                start = resp.get("LastEvaluatedKey")
                if not start:
                    break
        w.actor("Q", query)

        after = dict(before)
        for n, (kind, invoice, *arg) in enumerate(writes):
            t = shim(w, f"writer{n}", writer_phase or phase)
            if kind == "update":
                after[invoice] = {**before[invoice], "tx_country": arg[0]}
                fn = (lambda t=t, i=invoice, c=arg[0]: set_country(t, i, c))
            else:
                after[invoice] = None
                fn = (lambda t=t, i=invoice: t.delete_item(Key={"invoice": i}))

            writer_of[invoice] = f"W{n}"
            w.actor(f"W{n}", fn)

        for n, (kind, invoice) in enumerate(jobs):
            if kind == "copy":
                scanned = stored(w, old_key(invoice))
                fn = (lambda s=scanned: copy(w, s))
            elif kind == "rewrite-old":
                scanned = stored(w, old_key(invoice))
                fn = (lambda s=scanned: rewrite(w, s, NEW))
            elif kind == "rewrite-back":
                scanned = stored(w, old_key(invoice))
                fn = (lambda s=scanned: rewrite(w, s, OLD))
            elif kind == "expire":
                scanned = stored(w, old_key(invoice))
                assert cleaner(w, False).action(scanned) == "expire", scanned
                fn = (lambda s=scanned: cleaner(w, False)._delete_if_unchanged(None, s))
            else:  # remove-copy
                scanned = stored(w, new_key(invoice))
                assert cleaner(w, True).action(scanned) == "remove_copy", scanned
                fn = (lambda s=scanned: cleaner(w, True)._delete_if_unchanged(None, s))
            w.actor(f"J{n}", fn)

        def check(w: World):
            # When each actor's requests ran: a write took effect between its first and last.
            steps: dict[str, list[int]] = {}
            for step in w.trace:
                steps.setdefault(step.actor, []).append(step.index)
            qs, qe = steps["Q"][0], steps["Q"][-1]
            countries = [i["tx_country"] for i in seen]
            assert countries == sorted(countries), f"out of sort-value order: {countries}"
            for invoice in INVOICES:
                got = [without_gsi(i) for i in seen if i["invoice"] == invoice]
                ran = steps.get(writer_of.get(invoice), [])
                if ran and ran[0] < qe and ran[-1] > qs:
                    allowed = [without_gsi(x) for x in (before[invoice], after[invoice]) if x is not None]
                    assert len(got) <= 2 and all(g in allowed for g in got), \
                        f"item {invoice} written during the query: returned {got}, allowed {allowed} (at most twice)"
                    continue
                want = after[invoice] if ran and ran[-1] < qs else before[invoice]
                want = [without_gsi(want)] if want is not None else []
                assert got == want, f"item {invoice} (unchanged during the query): returned {got}, want {want}"
        return check
    return factory


def without_gsi(item: dict) -> dict:
    """The application's item without the GSI value (two copies of one version may differ in it
    while the rewrite runs: either is the item)."""
    return {k: v for k, v in item.items() if k != IM.attr}


def test_the_history_leaves_the_copies_the_scenarios_need():
    """Stale copies, a tombstone beside a live copy, an old copy left in the index by cleanup."""
    for phase, check in [
        ("dual_write", lambda w: stored(w, new_key("3"))["tx_country"] == {"S": "FRA"}
         and stored(w, old_key("3"))["tx_country"] == {"S": "PER"}),
        ("dual_read", lambda w: is_tombstone(stored(w, old_key("8"))) and IM.in_index(stored(w, new_key("8")))),
        ("cutover", lambda w: all(IM.is_at(i, NEW) for i in w.db.items(TABLE) if IM.in_index(i))),
        ("cleanup", lambda w: (stored(w, new_key("1")) is None or is_tombstone(stored(w, new_key("1"))))
         and IM.in_index(stored(w, old_key("1")))
         and stored(w, old_key("6"))["tx_country"] == {"S": "CAN"}),
        ("aborted", lambda w: IM.is_at(stored(w, new_key("6")), NEW) and IM.is_at(stored(w, old_key("4")), NEW)),
    ]:
        w = World()
        history(w, phase)
        assert check(w), phase
    assert old_key("2") == new_key("2") and old_key("1") != new_key("1")


@pytest.mark.parametrize("phase", list(SCENARIOS))
def test_a_fan_out_in_a_combined_migration_returns_every_item_once(phase):
    r = explore(scenario(phase), preemption_bound=1)
    r.assert_ok()
    assert r.schedules >= 30, r


@pytest.mark.parametrize("reader, writer, moved", [("planned", "dual_write", "1"), ("cutover", "cleanup", "5"),
                                                   ("cleanup", "cutover", "5")])
def test_a_query_beside_a_writer_on_the_adjacent_phase(reader, writer, moved):
    """planned beside dual_write: the new copy a dual_write shim makes (item 1 moves) carries the
    *old* GSI value, which a planned query reads (one result per logical key, not per copy).
    cutover beside cleanup: one writes both copies, the other only the new one."""
    r = explore(scenario(reader, writes=[("update", moved, "ARG")], writer_phase=writer), preemption_bound=1)
    r.assert_ok()
    assert r.schedules >= 5, r


def test_a_paged_fan_out_in_a_combined_migration():
    """Limit=2 in cleanup: the cursor on (sort value, logical key) inside the run of USA items, old
    copies left in the index (item 1: deleted; item 6: stale), an update moving item 3's sort
    value (PER -> ARG) between pages."""
    r = explore(scenario("cleanup", limit=2, jobs=[]), preemption_bound=1)
    r.assert_ok()
    assert r.schedules >= 20, r


def must_find(factory, **bounds) -> str:
    r = explore(factory, **bounds)
    assert r.violation is not None, f"the checker found nothing without the rule ({r.schedules} schedules)"
    assert "invariant:" in r.violation.message, r.violation.report()[:3000]
    return r.violation.message


def in_resolution(monkeypatch, pick) -> None:
    """``pick(copies)`` instead of ``newest`` where the shim resolves a logical item's copies
    (``ShardedTable._newest_copies``, in the order the phase reads them); elsewhere unchanged."""
    import reshard.shim.reads as reads

    def fake(items):
        if sys._getframe(1).f_code.co_name == "_newest_copies":
            return pick([i for i in items if i is not None])
        return newest(items)
    monkeypatch.setattr(reads, "newest", fake)


def test_without_logical_resolution(monkeypatch):
    """One result per table key, as in an index-only migration: both copies of an item come back."""
    monkeypatch.setattr(ShardedTable, "_index_resolver", lambda self, st: None)
    message = must_find(scenario("dual_read", writes=[], jobs=[]))
    assert "item 1 (unchanged during the query): returned [{" in message and "}, {" in message, message


def test_resolution_to_the_newest_live_copy(monkeypatch):
    """Tombstones ignored when picking the newest copy: item 8, deleted while its mirror was lost,
    comes back from its stale new copy."""
    in_resolution(monkeypatch, lambda copies: newest(i for i in copies if not is_tombstone(i)))
    assert "item 8" in must_find(scenario("dual_read", writes=[], jobs=[]))


def test_resolution_to_the_last_layout_read(monkeypatch):
    """The copy of the last layout read rather than the newest: item 3's stale new copy (FRA)."""
    in_resolution(monkeypatch, lambda copies: copies[-1] if copies else None)
    assert "item 3" in must_find(scenario("dual_read", writes=[], jobs=[]))


def test_without_the_own_sort_value_rule(monkeypatch):
    """A stale copy's entry returns the item at the stale copy's sort value: item 6 in cleanup
    (old copy at CAN, the item at IND) comes back twice: at the old copy's entry and at its own."""
    import reshard.shim.index as shim_index
    monkeypatch.setattr(shim_index, "_returned_here", lambda im, stored, sv: im.in_index(stored))
    message = must_find(scenario("cleanup", writes=[], jobs=[]))
    assert "item 6 (unchanged during the query)" in message, message
