"""Issue 15b: the shim over a sharded GSI (the invoice article's layout) on dynalite.

``query(IndexName=...)`` fans out over every partition value of the layouts the phase reads
(reshard/shim/index.py); writes give the GSI attribute the value of the layout the phase
writes. The interleaving tests move an item between the two passes of one fan-out, as the
backfill's conditional UpdateItem does, and check it is returned exactly once.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from boto3.dynamodb.conditions import Attr, Key

from reshard import errors
from reshard.core.index import IndexMapper
from reshard.core.layout import VERSION_ATTR, hash_shard, is_tombstone
from reshard.aws.local import wait_active
from reshard.core.migration import parse
from reshard.shim.index import READS_ATTR
from tests.index_support import gsi_migration
from tests.shim_helpers import shim



def index_migration(table: str, shard_by: str = "PK"):
    return parse(gsi_migration("invoices-gsi-4-to-16", table, shard_by=shard_by))


def create_gsi_table(dynamo, table: str) -> None:
    dynamo.call("create_table", TableName=table, BillingMode="PAY_PER_REQUEST",
                KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
                AttributeDefinitions=[{"AttributeName": a, "AttributeType": t} for a, t in
                                      (("PK", "S"), ("SK", "S"), ("gsi_shard", "N"), ("tx_country", "S"))],
                GlobalSecondaryIndexes=[{"IndexName": "ByCountry", "Projection": {"ProjectionType": "ALL"},
                                         "KeySchema": [{"AttributeName": "gsi_shard", "KeyType": "HASH"},
                                                       {"AttributeName": "tx_country", "KeyType": "RANGE"}]}])
    deadline = time.monotonic() + 5
    while dynamo.call("describe_table", TableName=table)["Table"]["TableStatus"] != "ACTIVE":
        assert time.monotonic() < deadline, "table not ACTIVE after 5 s"
        time.sleep(0.01)


def new_shard(pk: str) -> int:
    return hash_shard(pk, 16)


def pk_at(new: int, avoid=()) -> str:
    """An invoice id whose new (16-shard) GSI value is ``new``."""
    return next(f"inv-{i}" for i in range(10_000) if new_shard(f"inv-{i}") == new and f"inv-{i}" not in avoid)


def header(pk: str, country: str, old: int, **extra) -> dict:
    return {"PK": pk, "SK": "header", "tx_country": country, "gsi_shard": old, **extra}


def stored(dynamo, table, pk) -> dict:
    return dynamo.call("get_item", TableName=table, Key={"PK": {"S": pk}, "SK": {"S": "header"}},
                       ConsistentRead=True)["Item"]


def move(dynamo, table, pk, to: int) -> None:
    """What the backfill does to one item: a conditional UpdateItem of the GSI attribute only."""
    item = stored(dynamo, table, pk)
    kwargs = {"ConditionExpression": "#v = :v", "ExpressionAttributeValues": {":g": {"N": str(to)},
                                                                           ":v": item[VERSION_ATTR]}} \
        if VERSION_ATTR in item else {"ConditionExpression": "attribute_exists(PK)",
                                      "ExpressionAttributeValues": {":g": {"N": str(to)}}}
    names = {"#g": "gsi_shard", **({"#v": VERSION_ATTR} if VERSION_ATTR in item else {})}
    dynamo.call("update_item", TableName=table, Key={"PK": item["PK"], "SK": item["SK"]},
                UpdateExpression="SET #g = :g", ExpressionAttributeNames=names, **kwargs)


def query_all(t, **kw) -> list[dict]:
    out, start = [], None
    for _ in range(100):
        page = t.query(IndexName="ByCountry", ExclusiveStartKey=start, **kw) if start else \
            t.query(IndexName="ByCountry", **kw)
        out.extend(page["Items"])
        start = page.get("LastEvaluatedKey")
        if not start:
            return out
    raise AssertionError("no end after 100 pages")


@pytest.fixture
def table(dynalite, unique_name):
    create_gsi_table(dynalite, unique_name)
    return unique_name


def test_steady_index_query_merges_every_shard_in_order_with_pages(dynalite, table):
    m = index_migration(table)
    t = shim(m, dynalite, query_workers=1)
    rows = [header(f"inv-{i}", c, i % 4, amount=i) for i, c in enumerate(["US", "DE", "US", "FR", "US", "DE", "US"])]
    for r in rows:
        t.put_item(Item=r)
    t.put_item(Item={"PK": "inv-0", "SK": "line-1", "amount": 5})  # no GSI attribute: not in the index
    every = t.query(IndexName="ByCountry", KeyConditionExpression=Key("tx_country").eq("US"))
    us = sorted((r for r in rows if r["tx_country"] == "US"), key=lambda r: r["PK"])
    assert [i["PK"] for i in every["Items"]] == [r["PK"] for r in us]
    assert all(i["SK"] == "header" and not any(k.startswith("_rs_") for k in i) for i in every["Items"])
    assert "LastEvaluatedKey" not in every
    # Pages of 1 and of 2, both directions: the same items, once each, in order.
    got = query_all(t, KeyConditionExpression=Key("tx_country").between("DE", "US"), Limit=2)
    assert [(i["tx_country"], i["PK"]) for i in got] == sorted((r["tx_country"], r["PK"]) for r in rows)
    back = query_all(t, Key={"tx_country": "US"}, Limit=1, ScanIndexForward=False)
    assert [i["PK"] for i in back] == [r["PK"] for r in reversed(us)]
    page = t.query(IndexName="ByCountry", Key={"tx_country": "US"}, Limit=2)
    assert page["LastEvaluatedKey"][READS_ATTR] == "old" and page["ScannedCount"] == 2
    counted = t.query(IndexName="ByCountry", KeyConditionExpression=Key("tx_country").eq("US"), Select="COUNT",
                      FilterExpression=Attr("amount").gt(2))
    assert counted.pop("ResponseMetadata")["HTTPStatusCode"] == 200  # the last page's, as boto3's query
    assert counted == {"Count": 2, "ScannedCount": 4}
    proj = t.query(IndexName="ByCountry", Key={"tx_country": "FR"}, ProjectionExpression="amount")
    assert proj["Items"] == [{"amount": 3}]
    # Refusals, with DynamoDB's message where DynamoDB refuses too.
    with pytest.raises(errors.BadInput, match="Consistent reads are not supported on global secondary indexes"):
        t.query(IndexName="ByCountry", Key={"tx_country": "US"}, ConsistentRead=True)
    with pytest.raises(errors.BadInput, match="'Other' is not a sharded index"):
        t.query(IndexName="Other", Key={"tx_country": "US"})
    with pytest.raises(errors.BadInput, match="sharded partition attribute"):
        t.query(IndexName="ByCountry", Key={"gsi_shard": 1})
    with pytest.raises(errors.BadInput, match="scan the table instead"):
        t.scan(IndexName="ByCountry")


def test_writes_give_the_phase_s_value_and_keep_items_outside_the_index(dynalite, table):
    m = index_migration(table, shard_by="source")
    im = IndexMapper(m.indexes[0])
    t = shim(m, dynalite)
    t.put_item(Item=header("inv-1", "US", 2, source="s-1"))
    assert stored(dynalite, table, "inv-1")["gsi_shard"] == {"N": "2"}  # a random old value is kept
    t.put_item(Item=header("inv-2", "US", 9, source="s-2"))  # out of range for the old layout: replaced
    assert 0 <= int(stored(dynalite, table, "inv-2")["gsi_shard"]["N"]) < 4
    t._pin_phase("dual_read")
    t.put_item(Item=header("inv-3", "DE", 0, source="s-3"))
    assert stored(dynalite, table, "inv-3")["gsi_shard"] == {"N": str(hash_shard("s-3", 16))}
    # An update that does not name the shard_by field: the result is moved to its new value.
    t.update_item(Key={"PK": "inv-1", "SK": "header"}, UpdateExpression="SET amount = :a",
                  ExpressionAttributeValues={":a": 5})
    item = stored(dynalite, table, "inv-1")
    assert item["gsi_shard"] == {"N": str(hash_shard("s-1", 16))} and im.is_at(item, "new")
    # An update of the shard_by field recomputes it; ALL_NEW answers the value written.
    got = t.update_item(Key={"PK": "inv-1", "SK": "header"}, UpdateExpression="SET #s = :s",
                        ExpressionAttributeNames={"#s": "source"}, ExpressionAttributeValues={":s": "s-9"},
                        ReturnValues="ALL_NEW")["Attributes"]
    assert got["gsi_shard"] == hash_shard("s-9", 16) == int(stored(dynalite, table, "inv-1")["gsi_shard"]["N"])
    # A row without the GSI attribute (a line item) stays outside the index.
    t.put_item(Item={"PK": "inv-1", "SK": "line-1", "source": "s-1"})
    t.update_item(Key={"PK": "inv-1", "SK": "line-1"}, UpdateExpression="SET amount = :a",
                  ExpressionAttributeValues={":a": 1})
    assert "gsi_shard" not in dynalite.call("get_item", TableName=table,
                                            Key={"PK": {"S": "inv-1"}, "SK": {"S": "line-1"}})["Item"]
    with pytest.raises(errors.BadInput, match="lacks field 'source'"):
        t.put_item(Item=header("inv-4", "US", 1))
    # Table reads and deletes pass the keys through; a delete leaves a tombstone at the item's own
    # key (issue 25: a held older put must not land on an empty key), which no read returns.
    assert t.get_item(Key={"PK": "inv-3", "SK": "header"})["Item"]["source"] == "s-3"
    t.delete_item(Key={"PK": "inv-3", "SK": "header"})
    left = dynalite.call("get_item", TableName=table, Key={"PK": {"S": "inv-3"}, "SK": {"S": "header"}})["Item"]
    assert is_tombstone(left) and "gsi_shard" not in left  # key fields only: outside the index
    assert "Item" not in t.get_item(Key={"PK": "inv-3", "SK": "header"})
    assert [i["SK"] for i in t.query(Key={"PK": "inv-1"})["Items"]] == ["header", "line-1"]
    assert len(t.scan()["Items"]) == 3


class Hooked:
    """The table's Query calls, with a hook run before each (to move items between passes)."""

    def __init__(self, t, hook):
        self.calls: list[int] = []
        inner = t._index_source.query_page

        def page(**kwargs):
            value = int(kwargs["ExpressionAttributeValues"][":rs_gp"]["N"])
            hook(len(self.calls), value)
            self.calls.append(value)
            return inner(**kwargs)
        t._index_source = dataclasses.replace(t._index_source, query_page=page)


def test_items_moved_between_the_passes_are_returned_exactly_once(dynalite, table):
    """backfill phase: the old pass reads 0, 1, 2, 3, then the new pass 0..15.

    * ``a``: old 3 -> new 1, moved after the old pass read 1 and before it read 3: found only
      because the new pass reads 1 again (fails if the new pass skips values already read);
    * ``b``: old 0 -> new 3, moved after the old pass read 0, before it read 3: read twice
      (old pass at 3, new pass at 3), returned once;
    * ``c``: old 1 -> new 9 (not an old value), moved after the old pass read 1;
    * ``d``: moved old 2 -> new before any read: found by the new pass only.
    """
    m = index_migration(table)
    t = shim(m, dynalite, query_workers=1)  # partitions in order: the interleaving is deterministic
    a, b = pk_at(1), pk_at(3)
    c, d = pk_at(9), pk_at(12)
    for pk, old in ((a, 3), (b, 0), (c, 1), (d, 2)):
        t.put_item(Item=header(pk, "US", old))
    t._pin_phase("backfill")
    moves = {2: [(a, 1), (b, 3)], 3: [(c, 9)], 0: [(d, 12)]}  # before the n-th query

    def hook(n, value):
        for pk, to in moves.pop(n, []):
            move(dynalite, table, pk, to)
    h = Hooked(t, hook)
    got = t.query(IndexName="ByCountry", Key={"tx_country": "US"})
    assert sorted(i["PK"] for i in got["Items"]) == sorted([a, b, c, d])
    assert h.calls == [0, 1, 2, 3] + list(range(16)) and not moves
    assert got["Count"] == got["ScannedCount"] == 4


def test_paged_fan_out_while_the_rewrite_runs_returns_each_item_once_in_order(dynalite, table, seed=7, limit=2):
    """16 items over 2 countries (ties within one partition value, ordered by DynamoDB by a
    hash of the table key); the rewrite moves them old -> new during the pages and during
    the passes of each page: every page in (tx_country, key) order, every item exactly once."""
    import random
    rng = random.Random(seed)
    m = index_migration(table)
    t = shim(m, dynalite, query_workers=1)
    rows = [header(f"inv-{i}", rng.choice(["DE", "US"]), rng.randrange(4)) for i in range(16)]
    with t.batch_writer() as w:
        for r in rows:
            w.put_item(Item=r)
    t._pin_phase("backfill")
    unmoved = [r["PK"] for r in rows]
    rng.shuffle(unmoved)

    def hook(n, value):
        if unmoved and rng.random() < 0.3:
            pk = unmoved.pop()
            move(dynalite, table, pk, new_shard(pk))
    Hooked(t, hook)
    got = query_all(t, KeyConditionExpression=Key("tx_country").gte("A"), Limit=limit)
    assert [(i["tx_country"], i["PK"]) for i in got] == sorted((r["tx_country"], r["PK"]) for r in rows)


def test_a_cursor_from_other_read_layouts_is_refused(dynalite, table):
    t = shim(index_migration(table), dynalite)
    for i in range(3):
        t.put_item(Item=header(f"inv-{i}", "US", i))
    t._pin_phase("backfill")
    page = t.query(IndexName="ByCountry", Key={"tx_country": "US"}, Limit=1)
    assert page["LastEvaluatedKey"][READS_ATTR] == "old,new"
    t._pin_phase("cutover")
    with pytest.raises(errors.ScanInterrupted, match="restart the query"):
        t.query(IndexName="ByCountry", Key={"tx_country": "US"}, ExclusiveStartKey=page["LastEvaluatedKey"])


def test_an_update_s_index_value_never_overwrites_a_racing_change_of_its_shard_by_field(dynalite, table):
    """A's update (not naming ``source``) lands, then B's update changes ``source`` and
    lands, then A sets the GSI value from what it read (the old ``source``), then B sets its
    own. A's follow-up must fail (the field changed since A read it); with a condition on the
    GSI value alone it would succeed and B's would then fail: the item stuck at the value of
    a ``source`` it no longer has."""
    m = index_migration(table, shard_by="source")
    a, b = shim(m, dynalite), shim(m, dynalite)
    a.put_item(Item=header("inv-1", "US", 1, source="s-old"))
    a._pin_phase("backfill")
    b._pin_phase("backfill")
    deferred = []
    real_b_fix = b._fix_index_values
    b._fix_index_values = lambda *args: deferred.append(args) or {}
    real_a_fix = a._fix_index_values

    def a_fix(*args):
        b.update_item(Key={"PK": "inv-1", "SK": "header"}, UpdateExpression="SET #s = :s",
                      ExpressionAttributeNames={"#s": "source"}, ExpressionAttributeValues={":s": "s-new"})
        got = real_a_fix(*args)
        real_b_fix(*deferred.pop())
        return got
    a._fix_index_values = a_fix
    a.update_item(Key={"PK": "inv-1", "SK": "header"}, UpdateExpression="SET amount = :a",
                  ExpressionAttributeValues={":a": 3})
    item = stored(dynalite, table, "inv-1")
    assert item["source"] == {"S": "s-new"} and item["amount"] == {"N": "3"}
    assert item["gsi_shard"] == {"N": str(hash_shard("s-new", 16))}


def test_an_index_without_sort_key_pages_by_table_key(dynalite, unique_name):
    """No GSI sort key: DynamoDB orders a partition value's items by a hash of the table key,
    so each page reads its partitions whole and merges by table key; pages still never
    repeat or skip an item."""
    text = gsi_migration("invoices-gsi-4-to-16", unique_name, shard_by="PK").replace('sort = "tx_country"\n', "")
    dynalite.call("create_table", TableName=unique_name, BillingMode="PAY_PER_REQUEST",
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
                  AttributeDefinitions=[{"AttributeName": a, "AttributeType": t} for a, t in
                                        (("PK", "S"), ("SK", "S"), ("gsi_shard", "N"))],
                  GlobalSecondaryIndexes=[{"IndexName": "ByCountry", "Projection": {"ProjectionType": "ALL"},
                                           "KeySchema": [{"AttributeName": "gsi_shard", "KeyType": "HASH"}]}])
    wait_active(dynalite, unique_name)  # dynalite answers ResourceNotFound until the table is ACTIVE
    t = shim(parse(text), dynalite)
    t._pin_phase("backfill")
    for i in range(7):
        t.put_item(Item={"PK": f"inv-{i}", "SK": "header", "gsi_shard": 0})
    got = query_all(t, Limit=3)
    assert [i["PK"] for i in got] == [f"inv-{i}" for i in range(7)]
    with pytest.raises(errors.BadInput, match="it has no sort key"):
        t.query(IndexName="ByCountry", KeyConditionExpression=Key("tx_country").eq("US"))
