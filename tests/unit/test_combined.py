"""A combined migration (table keys AND a sharded GSI): its phase rules, what verify compares,
the copy's GSI value and plan's numbers. Pure tests with literals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from reshard.control.transition import needs_switch
from reshard.core.compare import classify
from reshard.core.index import IndexMapper, changes_index_writes, index_transition_refusal, reindexed
from reshard.core.index_planning import gsi_problems, index_plan
from reshard.core.join import OLD, Recorder
from reshard.core.layout import KeyMapper, hash_shard
from reshard.core.migration import load, parse
from reshard.core.phases import ORDER, Action, Phase, changes_authority
from reshard.core.planning import SampleAnalysis
from reshard import errors
from reshard.jobs.combined import _COUNTED, HALF_ATTR, CombinedVerifier, SharedScan, _both, merge

from tests.conftest import ROOT

M = load(ROOT / "migrations" / "0006_invoices_table_and_gsi.toml")
STATE = SimpleNamespace(migration=lambda: M)
PHASES = [*ORDER, Phase.ABORTED]


def old_header(inv: str, shard: int, customer: str = "c-1", **extra) -> dict:
    return {**KeyMapper(M).old.key({"invoice": inv, "line": "root"}), "tx_country": {"S": "USA"},
            "customer": {"S": customer}, "gsi_shard": {"N": str(shard)}, "amount": {"N": "5"}, **extra}


def test_a_combined_file_switches_where_either_machine_does():
    """The union of both machines' rules: the table's switch (backfill <-> cutover) and the
    index's (a change of the GSI value shims write: dual_write <-> dual_read, an abort from
    dual_read/backfill)."""
    for frm, to in ((a, b) for a in PHASES for b in PHASES if a is not b):
        assert needs_switch(STATE, frm, to) == (changes_authority(frm, to) or changes_index_writes(frm, to)), (frm, to)


def test_a_combined_file_switches_at_both_places_and_refuses_rollback_to_planned():
    assert needs_switch(STATE, Phase.DUAL_WRITE, Phase.DUAL_READ)  # the index's
    assert needs_switch(STATE, Phase.BACKFILL, Phase.CUTOVER)  # the table's
    assert needs_switch(STATE, Phase.BACKFILL, Phase.ABORTED) and needs_switch(STATE, Phase.DUAL_READ, Phase.ABORTED)
    assert not needs_switch(STATE, Phase.DUAL_READ, Phase.BACKFILL)
    # transition() asks index_transition_refusal for every file with [index.NAME]; a combined one has it.
    assert M.indexes and index_transition_refusal(Action.ROLLBACK, Phase.DUAL_WRITE, Phase.PLANNED)


def test_verify_does_not_compare_the_gsi_value_of_a_combined_file():
    """An old copy at its old value and its new copy at the new one agree; any other attribute,
    and whether the GSI attribute is there at all, still counts, in the judge and in the join's
    digests alike."""
    mapper = KeyMapper(M)
    old = old_header("77", 3)
    new, _ = mapper.remap(old)
    new = dict(new, gsi_shard={"N": "12"})
    assert classify(mapper, old, new) is None
    assert classify(mapper, old, dict(new, amount={"N": "6"})) == "diverged"
    # Whether a copy carries it still counts: a copy left out of the (sparse) index is a difference.
    assert classify(mapper, old, {k: v for k, v in new.items() if k != "gsi_shard"}) == "diverged"
    rec = Recorder(mapper)
    values = mapper.fields(old, mapper.old)
    assert rec.record(old, OLD, values).digest == rec.record(dict(old, gsi_shard={"N": "1"}), OLD, values).digest
    assert rec.record(old, OLD, values).digest != rec.record(dict(old, amount={"N": "6"}), OLD, values).digest
    without = {k: v for k, v in old.items() if k != "gsi_shard"}
    assert rec.record(old, OLD, values).digest != rec.record(without, OLD, values).digest
    assert mapper.to_logical(new, mapper.new)["gsi_shard"] == {"N": "12"}  # what the shim returns keeps it


def test_a_table_only_file_still_compares_every_attribute():
    m = load(ROOT / "migrations" / "0002_invoices.toml")
    assert KeyMapper(m).ignored == frozenset()


def test_the_copy_gets_the_new_gsi_value_of_its_own_fields():
    index = IndexMapper(M.indexes[0])
    item = old_header("9", 1, customer="c-4")
    out = reindexed(item, [index], "new")
    assert out["gsi_shard"] == {"N": str(hash_shard("c-4", 16))} and item["gsi_shard"] == {"N": "1"}
    line = {"PK": {"S": "x"}, "SK": {"S": "line#1"}, "amount": {"N": "1"}}  # outside the sparse index
    tomb = dict(old_header("9", 1), _rs_del={"BOOL": True})
    assert reindexed(line, [index], "new") == line and reindexed(tomb, [index], "new") == tomb


def test_plan_counts_the_new_copies_gsi_puts_and_start_checks_the_gsi():
    """Per item that moves in the table: the copy (table), the old copy's GSI rewrite (table
    write + GSI delete + put), and the new copy's GSI put; the GSI checks are start's too."""
    desc = {"GlobalSecondaryIndexes": [{"IndexName": "ByCountry", "Projection": {"ProjectionType": "KEYS_ONLY"},
                                        "KeySchema": [{"AttributeName": "gsi_shard", "KeyType": "HASH"},
                                                      {"AttributeName": "tx_country", "KeyType": "RANGE"}]}],
            "AttributeDefinitions": [{"AttributeName": "gsi_shard", "AttributeType": "N"}]}
    a = SampleAnalysis(KeyMapper(M))
    a.index = index_plan(M, desc)
    old = next(s for s in range(4) if s != hash_shard("c-1", 16))  # an old value that is not the new one
    for i in range(40):
        a.observe(old_header(str(i), old))
    ix = a.index.analyses["ByCountry"]
    assert a.scanned == a.index.scanned == 40 and ix.moves == 40
    assert ix.copy_index_wcu == a.moves > 0  # small KEYS_ONLY entries: 1 WCU per new copy's put
    assert ix.index_wcu == 2 * 40 and ix.as_dict(1.0)["rewrite_wcu"]["copies_index"] == a.moves
    cap = a.index.capacity(40, max_wcu=None, write_price=1.0, read_price=1.0)
    assert cap["backfill"]["index_wcu"] == 2 * 40 + a.moves
    assert any("KEYS_ONLY" in p for p in gsi_problems(desc, M))


def test_the_index_half_of_a_page_is_counted_under_gsi_():
    out = merge({"scanned": 7, "moved": 3, "unmappable": 1, "rcu": 1.5, "wcu": 3.0},
                {"scanned": 7, "moved": 2, "already": 5, "unmappable": 1, "rcu": 0.5, "wcu": 6.0, "gsi_value": 1})
    assert out == {"scanned": 7, "moved": 3, "unmappable": 2, "rcu": 2.0, "wcu": 9.0, "gsi_moved": 2,
                   "gsi_already": 5, "gsi_unmappable": 1, "gsi_value": 1}


class _FakeDynamo:
    def __init__(self):
        self.calls, self.noted = [], []

    def call(self, operation, **kwargs):
        self.calls.append(operation)
        start = kwargs.get("ExclusiveStartKey", 0)
        return {"Items": [{"n": start}, {"n": start + 1, "_rs_new": True}], "LastEvaluatedKey": start + 2}

    def note_capacity(self, table, units):
        self.noted.append((table, units))


def test_the_index_half_gets_the_table_halfs_scan_page_once_and_filtered():
    d = _FakeDynamo()
    shared = SharedScan(d, keep=lambda item: "_rs_new" not in item)
    first = shared.recording.call("scan", TableName="t", Segment=0, ExclusiveStartKey=4)
    again = shared.replaying.call("scan", TableName="t", Segment=0, ExclusiveStartKey=4)
    assert d.calls == ["scan"] and again == {**first, "Items": [{"n": 4}]} and d.noted == [("t", _COUNTED)]
    shared.replaying.call("scan", TableName="t", Segment=0, ExclusiveStartKey=4)  # answered once only
    shared.recording.call("scan", TableName="t", Segment=0, ExclusiveStartKey=6)
    shared.replaying.call("scan", TableName="t", Segment=1, ExclusiveStartKey=6)  # other arguments: a real scan
    assert d.calls == ["scan"] * 4


def test_a_page_whose_halves_end_apart_is_not_checkpointed():
    page = _both(lambda ctx, key: ({"checked": 1}, {"k": 2}), lambda ctx, key: ({}, {"k": 3}), "verify")
    with pytest.raises(errors.ReshardError, match="not checkpointed"):
        page(None, None)
    assert _both(lambda c, k: ({"a": 1}, None), lambda c, k: ({"moved": 2}, None), "backfill")(None, None) == \
        ({"a": 1, "gsi_moved": 2}, None)


class _Half:
    """A verifier half whose join takes ``pages`` pages (checkpoint {"join": n})."""

    def __init__(self, name: str, pages: int):
        self.name, self.pages, self.seen = name, pages, []

    def page(self, ctx, key):
        self.seen.append(key)
        n = int(key["join"]["S"]) + 1 if key else 1
        return {"checked": 1}, ({"join": {"S": str(n)}} if n < self.pages else None)


def test_the_join_segment_runs_the_index_join_then_the_tables_and_resumes_in_either():
    index, table = _Half("index", 2), _Half("table", 2)
    index._join_page = None  # an index verify with a join of its own
    v = CombinedVerifier(table, index, segments=2)
    ctx, key, keys = SimpleNamespace(segment=2), None, []
    while True:
        counts, key = v.page(ctx, key)
        keys.append(key)
        if key is None:
            break
    assert index.seen == [None, {"join": {"S": "1"}}] and table.seen == [None, {"join": {"S": "1"}}]
    assert [k and k[HALF_ATTR]["S"] for k in keys] == ["index", "table", "table", None]
    resumed = CombinedVerifier(_Half("table", 2), _Half("index", 2), segments=2)  # no index join: the table's only
    assert resumed.page(ctx, None)[1] == {"join": {"S": "1"}, HALF_ATTR: {"S": "table"}}


def test_start_refuses_a_gsi_sort_key_the_table_migration_rewrites():
    """What the shim refuses (two copies would sort apart in the index), plan and start refuse."""
    text = (ROOT / "migrations" / "0006_invoices_table_and_gsi.toml").read_text()
    rewritten = parse(text.replace('sort = "tx_country"', 'sort = "SK"').replace('sort = "{line}"\nshards = 8',
                                                                                 'sort = "L#{line}"\nshards = 8'))
    (problem,) = [p for p in gsi_problems({}, rewritten) if "rewrites" in p]
    assert problem.startswith("[index.ByCountry]: the GSI sort key 'SK' is a table key attribute")
    kept = parse(text.replace('sort = "tx_country"', 'sort = "SK"').replace('"{line}"', '"{SK}"'))
    assert not [p for p in gsi_problems({}, kept) if "rewrites" in p]
