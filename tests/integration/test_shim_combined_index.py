"""The shim's ``query(IndexName=...)`` in a migration that re-keys the table and a sharded GSI at
once (issue 15), on dynalite: every index entry is one physical copy, resolved to its logical
item as ``get_item`` reads it in the phase (reshard/shim/index.py, "Table keys and index at once").

The copies are made by the shims' own writes, by a shim whose mirror writes are dropped (a stale
copy; a tombstone beside a live copy), and by the jobs' page functions on single items (the
backfill copy, re-keyed and given the new GSI value as A2's backfill gives it; the GSI rewrite).
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from boto3.dynamodb.conditions import Attr, Key

from reshard.aws.local import wait_active
from reshard.core.index import NEW, IndexMapper
from reshard.core.layout import KeyMapper, is_tombstone
from reshard.core.migration import parse
from reshard.jobs.backfill import Backfill
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.index_jobs import IndexRewrite
from reshard.shim.index import READS_ATTR
from tests.shim_helpers import scan, shim

INDEX = "ByCountry"


def combined(table: str, old: str = 'shards = 2\nshard_by = ["invoice"]') -> str:
    return f"""\
id = "combined"
table = "{table}"

[keys]
partition = "PK"

[from]
partition = "INV#{{invoice}}#{{shard}}"
{old}

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


@pytest.fixture
def table(dynalite, unique_name):
    dynalite.call("create_table", TableName=unique_name, BillingMode="PAY_PER_REQUEST",
                  AttributeDefinitions=[{"AttributeName": a, "AttributeType": t} for a, t in
                                        (("PK", "S"), ("gsi_shard", "N"), ("tx_country", "S"))],
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                  GlobalSecondaryIndexes=[{"IndexName": INDEX, "Projection": {"ProjectionType": "ALL"}, "KeySchema": [
                      {"AttributeName": "gsi_shard", "KeyType": "HASH"},
                      {"AttributeName": "tx_country", "KeyType": "RANGE"}]}])
    wait_active(dynalite, unique_name)
    return unique_name


def pre_migration(dynalite, m, items: dict, shard_of=None) -> None:
    """Unversioned items at their old keys and old GSI values (``shard_of``: a random old layout's pick)."""
    mapper, im = KeyMapper(m), IndexMapper(m.indexes[0])
    for invoice, (customer, country) in items.items():
        key = mapper.old.key({"invoice": invoice}, shard_of(invoice) if shard_of else None)
        dynalite.call("put_item", TableName=m.table, Item={
            **key, "invoice": {"N": str(invoice)} if isinstance(invoice, int) else {"S": invoice}, "customer": {"S": customer}, "tx_country": {"S": country},
            im.attr: im.value({"customer": customer}, "old")})


def set_country(t, invoice, country: str) -> None:
    t.update_item(Key={"invoice": invoice}, UpdateExpression="SET tx_country = :c",
                  ExpressionAttributeValues={":c": country})


def without_mirrors(t, fn) -> None:
    """``fn()`` with the shim's mirror writes lost (a crash after the authoritative write)."""
    t._mirror_to = lambda *a, **k: None
    try:
        fn()
    finally:
        del t._mirror_to


def backfill(dynalite, m) -> None:
    """What the backfill does to every item, one page function call each: copy every old item
    and tombstone (its GSI value the new layout's), then rewrite every physical item's GSI value old -> new."""
    mapper, im = KeyMapper(m), IndexMapper(m.indexes[0])
    budget = CapacityBudget(None, None)
    copier = Backfill(dynalite, None, m.id, mapper, m.table, budget)
    for item in scan(dynalite, m.table):
        if mapper.is_new_copy(item) or not mapper.moves(item):
            continue
        new, _ = mapper.remap(item)  # a tombstone too: it replaces a stale new copy
        if im.in_index(new):
            new[im.attr] = im.value(im.fields(new, NEW), NEW)
        copier._copy(None, (item, new))
    rewriter = IndexRewrite(dynalite, None, m.id, "backfill", {INDEX: im}, m.keys, m.table, budget, NEW, {})
    for item in scan(dynalite, m.table):
        outcome, changes = rewriter.plan(item)
        if changes:
            assert rewriter._update_once(None, (item, changes)) == "moved"


def logical_view(t, invoices) -> list[dict]:
    """Every live item as ``get_item`` reads it in ``t``'s phase, in the index's order."""
    got = [t.get_item(Key={"invoice": i}, ConsistentRead=True).get("Item") for i in invoices]
    return sorted((i for i in got if i is not None), key=lambda i: (i["tx_country"], i["invoice"]))


def pages(t, **kw) -> list[dict]:
    """Every page of the query, each cursor passed back exactly as returned."""
    out, start = [], None
    for _ in range(50):
        page = t.query(IndexName=INDEX, **kw, **({"ExclusiveStartKey": start} if start else {}))
        out.append(page)
        start = page.get("LastEvaluatedKey")
        if not start:
            return out
    raise AssertionError("no end after 50 pages")


def strip_gsi(items: list[dict]) -> list[dict]:
    # Two copies of one version may differ in the GSI value while the rewrite runs.
    return [{k: v for k, v in i.items() if k != "gsi_shard"} for i in items]


def check_phase(t, invoices, phase: str, paged: bool = True) -> list[dict]:
    """The fan-out equals the logical view: whole and (``paged``) in pages of 1 (cursors
    round-trip) and backwards."""
    t._pin_phase(phase)
    want = strip_gsi(logical_view(t, invoices))
    whole = t.query(IndexName=INDEX)
    assert strip_gsi(whole["Items"]) == want, phase
    if not paged:
        return want
    one = pages(t, Limit=1)
    assert strip_gsi([i for p in one for i in p["Items"]]) == want, phase
    for page, item in zip(one, want):
        # The cursor names the logical key and the GSI sort value, as the table's query does.
        assert page["LastEvaluatedKey"] == {"invoice": item["invoice"], "tx_country": item["tx_country"],
                                            READS_ATTR: page["LastEvaluatedKey"][READS_ATTR]}, phase
    back = [i for p in pages(t, Limit=2, ScanIndexForward=False) for i in p["Items"]]
    assert strip_gsi(back) == want[::-1], phase
    return want


def test_a_combined_migration_s_index_query_in_every_phase(dynalite, table):
    m = parse(combined(table), "<combined>")
    mapper = KeyMapper(m)
    items = {"1": ("a", "USA"), "2": ("b", "USA"), "3": ("c", "USA"), "4": ("e", "USA"), "5": ("b", "CAN"),
             "6": ("a", "CAN")}
    invoices = [*items, "8"]
    pre_migration(dynalite, m, items)
    t = shim(m, dynalite, "dual_write", query_workers=2)
    set_country(t, "1", "MEX")                 # both copies
    t.delete_item(Key={"invoice": "2"})        # a tombstone (old key = new key: one physical item)
    set_country(t, "3", "FRA")
    without_mirrors(t, lambda: set_country(t, "3", "PER"))  # old copy PER, new copy FRA: stale
    got = check_phase(t, invoices, "dual_write")
    assert [i["invoice"] for i in got] == ["5", "6", "1", "3", "4"]
    assert next(i for i in got if i["invoice"] == "3")["tx_country"] == "PER"
    # Key condition and filter are judged on the resolved item: the stale copy's FRA is not it.
    assert t.query(IndexName=INDEX, Key={"tx_country": "FRA"})["Items"] == []
    hits = t.query(IndexName=INDEX, KeyConditionExpression=Key("tx_country").between("MEX", "USA"),
                   FilterExpression=Attr("customer").eq("c"))
    assert [(i["invoice"], i["tx_country"]) for i in hits["Items"]] == [("3", "PER")]
    assert hits["ScannedCount"] == 3  # 1 (MEX), 3 (PER), 4 (USA); 3's stale FRA entry is not counted

    t._pin_phase("dual_read")
    set_country(t, "4", "BRA")
    # Both copies get the phase's GSI value: the update's own copy, and its mirror.
    im = IndexMapper(m.indexes[0])
    for key in (mapper.old.key({"invoice": "4"}), mapper.new.key({"invoice": "4"})):
        copy = dynalite.call("get_item", TableName=table, Key=key, ConsistentRead=True)["Item"]
        assert copy["tx_country"] == {"S": "BRA"} and im.is_at(copy, NEW) and not im.is_at(copy, "old"), copy
    t.put_item(Item={"invoice": "8", "customer": "c", "tx_country": "USA", "gsi_shard": 0})
    without_mirrors(t, lambda: t.delete_item(Key={"invoice": "8"}))  # old: tombstone; new: live, stale
    assert is_tombstone(dynalite.call("get_item", TableName=table, Key=mapper.old.key({"invoice": "8"}),
                                      ConsistentRead=True)["Item"])
    got = check_phase(t, invoices, "dual_read")
    assert "8" not in [i["invoice"] for i in got]

    backfill(dynalite, m)
    check_phase(t, invoices, "backfill", paged=False)
    check_phase(t, invoices, "aborted", paged=False)  # the abort's reads: old table copies, new then old GSI values
    t._pin_phase("cutover")
    set_country(t, "5", "JPN")
    check_phase(t, invoices, "cutover", paged=False)
    t._pin_phase("cleanup")
    set_country(t, "6", "IND")                 # the new copy only: the old copy stays at CAN
    t.delete_item(Key={"invoice": "1"})        # the new copy only: the old one stays, live, in the index
    got = check_phase(t, invoices, "cleanup")
    assert [(i["invoice"], i["tx_country"]) for i in got] == [
        ("4", "BRA"), ("6", "IND"), ("5", "JPN"), ("3", "PER")]


def test_a_random_old_layout_reads_every_candidate_once_per_item(dynalite, table, monkeypatch):
    """Numbered invoices (an N attribute, text in the key): the cursor gives them back as numbers."""
    m = parse(combined(table, old='shards = 3\nshard_by = "random"'), "<combined-random>")
    items = {i: ("abcd"[i % 4], "USA" if i % 2 else "CAN") for i in range(1, 7)}
    pre_migration(dynalite, m, items, shard_of=lambda invoice: invoice % 3)
    t = shim(m, dynalite, "dual_write", query_workers=2)
    set_country(t, 1, "MEX")                   # found at its random old key, mirrored to its new key
    t._pin_phase("dual_read")
    set_country(t, 2, "BRA")
    requested: list[int] = []
    real = type(dynalite).batch_get

    def counting(self, table_name, keys, **kw):
        requested.append(len(keys))
        return real(self, table_name, keys, **kw)
    monkeypatch.setattr(type(dynalite), "batch_get", counting)
    whole = t.query(IndexName=INDEX)
    # One BatchGetItem round for the page: the 3 old candidates and the new key of each logical
    # item found (the new key is one of the candidates when its shard is below 3).
    mapper = KeyMapper(m)
    keys = [{repr(k) for k in [*mapper.old.candidate_keys({"invoice": i}), mapper.new.key({"invoice": i})]}
            for i in items]
    assert requested == [sum(map(len, keys))] and 3 * len(items) < requested[0] < 4 * len(items)
    monkeypatch.setattr(type(dynalite), "batch_get", real)
    want = strip_gsi(logical_view(t, items))
    assert strip_gsi(whole["Items"]) == want and len(want) == len(items)
    one = pages(t, Limit=1)
    assert strip_gsi([i for p in one for i in p["Items"]]) == want
    assert [p["LastEvaluatedKey"]["invoice"] for p in one[:-1]] == [i["invoice"] for i in want]
    assert all(type(p["LastEvaluatedKey"]["invoice"]) is Decimal for p in one[:-1])
    backfill(dynalite, m)
    check_phase(t, items, "backfill", paged=False)
    check_phase(t, items, "cutover", paged=False)


def test_an_entry_without_a_key_field_is_read_whole_once(dynalite, unique_name):
    """The logical key is (invoice, seq), ``seq`` only an attribute (a ``shard_by`` field, as
    ``event_id`` in migrations/0001), and the
    index's INCLUDE projection leaves it out: each entry is read whole once (a consistent GetItem),
    never dropped, and the page resolves as usual."""
    text = combined(unique_name).replace('shards = 2\nshard_by = ["invoice"]', 'shards = 2\nshard_by = ["seq"]', 1) \
        .replace('shards = 4\nshard_by = ["invoice"]', 'shards = 4\nshard_by = ["seq"]', 1)
    m = parse(text, "<combined-seq>")
    dynalite.call("create_table", TableName=unique_name, BillingMode="PAY_PER_REQUEST",
                  AttributeDefinitions=[{"AttributeName": a, "AttributeType": t} for a, t in
                                        (("PK", "S"), ("gsi_shard", "N"), ("tx_country", "S"))],
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                  GlobalSecondaryIndexes=[{"IndexName": INDEX, "KeySchema": [
                      {"AttributeName": "gsi_shard", "KeyType": "HASH"},
                      {"AttributeName": "tx_country", "KeyType": "RANGE"}],
                      "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["_rs_v", "customer"]}}])
    wait_active(dynalite, unique_name)
    t = shim(m, dynalite, "dual_read", query_workers=1)
    for n in range(3):
        t.put_item(Item={"invoice": str(7 + n), "seq": f"s{n}", "customer": "abc"[n], "tx_country": "USA", "gsi_shard": 0})
    gets: list[dict] = []
    real = type(dynalite).call

    def counting(self, operation, **kw):
        if operation == "get_item":
            gets.append(kw["Key"])
        return real(self, operation, **kw)
    type(dynalite).call = counting
    try:
        got = t.query(IndexName=INDEX)
    finally:
        type(dynalite).call = real
    assert sorted(i["seq"] for i in got["Items"]) == ["s0", "s1", "s2"]
    # One read per physical item met (up to two copies per item; one met in both passes is read once).
    assert 3 <= len(gets) <= 6 and len({repr(k) for k in gets}) == len(gets)
