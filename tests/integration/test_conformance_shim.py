"""Issue 14: the conformance suite. Every case runs against a plain boto3 ``Table`` whose
keys are the application's own (``customer``, ``order``) and against ``ShardedTable``
(steady state and each migration phase, ``planned`` to ``complete`` and ``aborted``), on
dynalite, and asserts equal results and equal exception codes.

Key shapes (:data:`SHAPES`): string and number sort keys, a binary sort key, and a
random-suffix old layout (reads look at every candidate key); S runs in every phase, the
others in the phases where their layouts are read or written differently (:data:`CASES`).

One dynalite server; per worker and key shape one plain table and one physical table per
phase, created on first use (module fixture); each case works in its own partition, so
cases do not see each other (scans compare whole tables: equal as long as every case ran
on both). Data a phase must be able to read was written by the phase before it
(:data:`SEEDED_BY`).

A sharded GSI (``[index.NAME]``, :func:`test_sharded_index_queries_answer_as_an_unsharded_gsi`):
``query(IndexName=...)`` against a plain table whose GSI holds the same logical data unsharded,
in each of the four index routings (old; new, old; old, new; new).
"""

from __future__ import annotations

import itertools
import uuid
from decimal import Decimal

import boto3
import pytest
from boto3.dynamodb.conditions import Attr, Key
from boto3.dynamodb.types import Binary
from botocore.exceptions import ClientError

from reshard.aws import local
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.core.migration import parse
from reshard.shim.table import ShardedTable
from tests.index_support import gsi_migration

PHASES = [None, "planned", "dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete", "aborted"]
#: How each phase's table was seeded: by a shim of the phase before it (steady: old layout
#: only; dual_write/dual_read: both layouts; cleanup: new layout only). ``aborted`` is the
#: rollback from dual_read: both layouts hold the items, the old one is read again.
SEEDED_BY = {None: None, "planned": None, "dual_write": None, "dual_read": None, "backfill": None,
             "cutover": "dual_write", "cleanup": "dual_write", "complete": "cleanup", "aborted": "dual_read"}


class Shape:
    """A key shape: the sort key's type and values, the customer's type, the [from] layout,
    and the phases it runs in (the suite's time budget: every phase once for S; the other
    shapes where their layouts are read or written differently)."""

    def __init__(self, sort_type, order, customer_type="S", from_shard_by='["customer", "order"]',
                 to_shard_by='["customer", "order"]', phases=tuple(PHASES)):
        self.sort_type, self.order, self.customer_type = sort_type, order, customer_type
        self.from_shard_by, self.to_shard_by, self.phases = from_shard_by, to_shard_by, phases


SHAPES = {
    "S": Shape("S", lambda i: f"o-{i:03d}"),
    "N": Shape("N", lambda i: Decimal(i), customer_type="N",
               phases=(None, "dual_write", "dual_read", "backfill", "cutover", "cleanup")),
    # A binary sort key is kept as it is (an identity template; a binary value cannot be hashed
    # into a shard): read from both layouts, and from the new one alone.
    "B": Shape("B", lambda i: Binary(b"o\x00" + bytes([i])), from_shard_by='["customer"]', to_shard_by='["customer"]',
               phases=("dual_read", "complete")),
    # A random-suffix old layout: reads look at every candidate key while the old layout is read
    # (steady, dual_read/backfill, and again after the rollback).
    "random": Shape("S", lambda i: f"o-{i:03d}", from_shard_by='"random"',
                    phases=(None, "dual_read", "backfill", "aborted")),
}

MIGRATION = """
id = "conf-{name}"
table = "{name}"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{{customer}}#{{shard}}"
sort = "{{order}}"
shards = 2
shard_by = {from_shard_by}
{from_hash}
[to]
partition = "{{customer}}#{{shard}}"
sort = "{{order}}"
shards = 4
shard_by = {to_shard_by}
hash = "md5"
"""


class World:
    """A plain table and one shim per phase (its table made on first use), for one key shape."""

    def __init__(self, endpoint: str, shape: str, dynamo):
        self.shape = SHAPES[shape]
        self.sort_type, self.order = self.shape.sort_type, self.shape.order
        self.res = boto3.resource("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                                  aws_access_key_id="x", aws_secret_access_key="x")
        self.tag = f"{shape}-{uuid.uuid4().hex[:8]}"
        self.dynamo = dynamo
        self.plain = self._create(f"conf-plain-{self.tag}", "customer", self.shape.customer_type, "order")
        self.shims: dict = {}
        self.customers = itertools.count()

    def shim(self, phase) -> ShardedTable:
        """This shape's shim pinned to ``phase``."""
        if phase not in self.shims:
            name = f"conf-{phase or 'steady'}-{self.tag}"
            self._create(name, "PK", "S", "SK")
            sh = self.shape
            m = parse(MIGRATION.format(name=name, from_shard_by=sh.from_shard_by, to_shard_by=sh.to_shard_by,
                                       from_hash="" if "random" in sh.from_shard_by else 'hash = "sha256"'))
            t = ShardedTable(m, self.dynamo, control_table=None)
            t._pin_phase(phase)
            self.shims[phase] = t
        return self.shims[phase]

    def _create(self, name: str, pk: str, pk_type: str, sk: str):
        self.res.meta.client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                                  KeySchema=[{"AttributeName": pk, "KeyType": "HASH"},
                                             {"AttributeName": sk, "KeyType": "RANGE"}],
                                  AttributeDefinitions=[{"AttributeName": pk, "AttributeType": pk_type},
                                                        {"AttributeName": sk, "AttributeType": self.sort_type}])
        local.wait_active(self.dynamo, name)  # boto3's waiter polls every 20 s
        return self.res.Table(name)

    def customer(self):
        n = next(self.customers)
        return Decimal(1000 + n) if self.shape.customer_type == "N" else f"c-{n}"

    def seed(self, phase, items) -> None:
        """Items that exist before the phase: in the plain table, and written by the phase before."""
        for it in items:
            self.plain.put_item(Item=it)
        t = self.shims[phase]
        seeder = ShardedTable(t.migration, self.dynamo, control_table=None)
        seeder._pin_phase(SEEDED_BY[phase])
        for it in items:
            seeder.put_item(Item=it)
        seeder.close()


#: (shape, phase): each shape in its phases only.
CASES = [pytest.param(shape, phase, id=f"{shape}-{phase}") for shape in SHAPES for phase in SHAPES[shape].phases]


@pytest.fixture(scope="module")
def world(request, dynalite_server):
    dynamo = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1",
                    retry=RetryPolicy(max_attempts=5, base_seconds=0.01), connect_timeout=1, read_timeout=4)
    w = World(dynalite_server.endpoint, request.param, dynamo)
    yield w
    for t in w.shims.values():
        t.close()


def outcome(fn, table):
    """The call's answer without ResponseMetadata, or ("error", code)."""
    try:
        resp = fn(table)
    except ClientError as e:
        return ("error", e.response["Error"]["Code"])
    if isinstance(resp, dict):
        resp = {k: v for k, v in resp.items() if k != "ResponseMetadata"}
    return resp


def same(world, shim, fn, *, unordered=False):
    a, b = outcome(fn, world.plain), outcome(fn, shim)
    if unordered:  # a scan: the plain table also holds the other phases' items (ScannedCount counts them)
        a, b = ({k: v for k, v in x.items() if k != "ScannedCount"} if isinstance(x, dict) else x for x in (a, b))
    if unordered:
        a, b = (dict(x, Items=sorted(x["Items"], key=repr)) if isinstance(x, dict) and "Items" in x else x
                for x in (a, b))
    assert a == b, f"plain {a!r} != shim {b!r}"
    return a


VALUES = {
    "s": "text", "empty_s": "", "n": Decimal("42"), "big": Decimal("99999999999999999999999999999999999999"),
    "tiny": Decimal("0.00000000000000000000000000000000000001"),
    "neg": Decimal("-12345678901234567890123456789012345678"),
    "precise": Decimal("0.12345678901234567890123456789012345678"), "zero": Decimal("-0"),
    "b": Binary(b"\x00\x01bin"), "empty_b": Binary(b""), "ss": {"a", "b"}, "ns": {Decimal(1), Decimal("2.5")},
    "bs": {Binary(b"x"), Binary(b"y")}, "l": ["x", Decimal(1), None, True, {"k": ["deep"]}],
    "m": {"inner": {"list": [Decimal(1), {"deeper": "yes"}], "flag": False}}, "bool": True, "null": None,
    "name": "reserved word", "status": "reserved too",
}


@pytest.mark.parametrize("world,phase", CASES, indirect=["world"])
def test_items_values_and_return_values(world, phase):
    t, o = world.shim(phase), world.order
    c = world.customer()
    k = {"customer": c, "order": o(1)}
    world.seed(phase, [{**k, "v": Decimal(0)}])
    same(world, t, lambda x: x.get_item(Key=k, ConsistentRead=True))
    same(world, t, lambda x: x.put_item(Item={**k, **VALUES}, ReturnValues="ALL_OLD"))
    same(world, t, lambda x: x.get_item(Key=k, ConsistentRead=True))
    same(world, t, lambda x: x.get_item(Key={"customer": c, "order": o(2)}, ConsistentRead=True))  # absent
    same(world, t, lambda x: x.put_item(Item={"customer": c, "order": o(2), "v": Decimal(1)}, ReturnValues="ALL_OLD"))
    for rv in ("NONE", "ALL_OLD", "UPDATED_OLD", "ALL_NEW", "UPDATED_NEW"):
        same(world, t, lambda x: x.update_item(
            Key=k, UpdateExpression="SET #n = :n, m.inner.flag = :t, l[0] = :z ADD ss :add, counter :one "
                                    "REMOVE empty_s", ExpressionAttributeNames={"#n": "name"},
            ExpressionAttributeValues={":n": f"renamed-{rv}", ":t": True, ":z": "first", ":add": {"c"},
                                       ":one": Decimal(1)}, ReturnValues=rv))
    same(world, t, lambda x: x.update_item(Key={"customer": c, "order": o(3)}, UpdateExpression="SET v = :v",
                                           ExpressionAttributeValues={":v": Decimal(3)}, ReturnValues="ALL_NEW"))
    same(world, t, lambda x: x.delete_item(Key=k, ReturnValues="ALL_OLD"))
    same(world, t, lambda x: x.delete_item(Key=k, ReturnValues="ALL_OLD"))  # already gone
    same(world, t, lambda x: x.get_item(Key=k, ConsistentRead=True))
    same(world, t, lambda x: x.get_item(Key={"customer": c}))  # not the whole key


@pytest.mark.parametrize("world,phase", CASES, indirect=["world"])
def test_conditions_objects_and_strings(world, phase):
    t, o = world.shim(phase), world.order
    c = world.customer()
    k = {"customer": c, "order": o(1)}
    world.seed(phase, [{**k, "n": Decimal(5), "s": "hello", "tags": {"x", "y"}}])
    conditions = [
        Attr("n").eq(5), Attr("n").ne(5), Attr("n").lt(6), Attr("n").lte(4), Attr("n").gt(4), Attr("n").gte(6),
        Attr("n").between(1, 5), Attr("s").begins_with("he"), Attr("s").contains("ll"), Attr("tags").contains("x"),
        Attr("s").size().eq(5), Attr("s").attribute_type("S"), Attr("s").exists(), Attr("missing").exists(),
        Attr("customer").not_exists(), Attr("n").is_in([1, 5]), Attr("n").eq(5) & ~Attr("s").eq("no"),
        Attr("n").eq(1) | Attr("s").eq("hello"), Key("order").eq(o(1)),
    ]
    for cond in conditions:
        same(world, t, lambda x: x.update_item(Key=k, UpdateExpression="ADD hits :one", ConditionExpression=cond,
                                               ExpressionAttributeValues={":one": Decimal(1)}))
    same(world, t, lambda x: x.put_item(Item={**k, "n": Decimal(6)}, ConditionExpression="#n = :five AND #s = :h",
                                        ExpressionAttributeNames={"#n": "n", "#s": "s"},
                                        ExpressionAttributeValues={":five": Decimal(5), ":h": "hello"}))
    same(world, t, lambda x: x.put_item(Item={**k, "n": Decimal(7)}, ConditionExpression=Attr("n").eq(5)))
    same(world, t, lambda x: x.delete_item(Key=k, ConditionExpression=Attr("n").lt(6)))
    same(world, t, lambda x: x.delete_item(Key=k, ConditionExpression=Attr("n").eq(6), ReturnValues="ALL_OLD"))
    # Deleted: conditions see an absent item (a tombstone in fenced phases).
    for cond in (Attr("customer").exists(), Attr("n").eq(6), Attr("customer").not_exists()):
        same(world, t, lambda x: x.put_item(Item={**k, "n": Decimal(8)}, ConditionExpression=cond))
    same(world, t, lambda x: x.get_item(Key=k, ConsistentRead=True))


@pytest.mark.parametrize("world,phase", CASES, indirect=["world"])
def test_query_key_conditions_filters_and_pages(world, phase):
    t, o = world.shim(phase), world.order
    c = world.customer()
    items = [{"customer": c, "order": o(i), "n": Decimal(i % 4), "s": f"v{i}", "pad": "x" * (i % 3)}
             for i in range(1, 16)]
    world.seed(phase, items[:10])
    for it in items[10:]:
        same(world, t, lambda x: x.put_item(Item=it))
    same(world, t, lambda x: x.delete_item(Key={"customer": c, "order": o(4)}))
    same(world, t, lambda x: x.update_item(Key={"customer": c, "order": o(5)}, UpdateExpression="SET n = :n",
                                           ExpressionAttributeValues={":n": Decimal(9)}))
    pk = Key("customer").eq(c)
    sort_values = [o(3), o(7), o(12)]
    kces = [pk, pk & Key("order").between(sort_values[0], sort_values[2]), pk & Key("order").lt(sort_values[1]),
            pk & Key("order").gte(sort_values[1]), pk & Key("order").eq(sort_values[1])]
    if world.sort_type == "S":
        kces.append(pk & Key("order").begins_with("o-01"))
    for kce in kces:
        for forward in (True, False):
            same(world, t, lambda x: x.query(KeyConditionExpression=kce, ScanIndexForward=forward, ConsistentRead=True))
    same(world, t, lambda x: x.query(KeyConditionExpression="#c = :c AND #o BETWEEN :a AND :b",
                                     ExpressionAttributeNames={"#c": "customer", "#o": "order"},
                                     ExpressionAttributeValues={":c": c, ":a": o(2), ":b": o(9)}, ConsistentRead=True))
    same(world, t, lambda x: x.query(KeyConditionExpression=pk,
                                     FilterExpression=Attr("n").gte(2) & Attr("pad").size().gt(0),
                                     ConsistentRead=True))
    same(world, t, lambda x: x.query(KeyConditionExpression=pk, ProjectionExpression="#o, s, m.inner",
                                     ExpressionAttributeNames={"#o": "order"}, ConsistentRead=True))
    same(world, t, lambda x: x.query(KeyConditionExpression=pk, Select="COUNT", FilterExpression=Attr("n").eq(1),
                                     ConsistentRead=True))
    # Pages with Limit (and a filter: Limit counts items evaluated), forwards and backwards:
    # the same pages, the same LastEvaluatedKeys (the logical key is the plain table's key).
    for limit, forward, filt in ((1, True, None), (4, False, None), (3, True, Attr("n").eq(2))):
        pages = []
        for x in (world.plain, t):
            kw, got = dict(KeyConditionExpression=pk, Limit=limit, ScanIndexForward=forward, ConsistentRead=True), []
            if filt is not None:
                kw["FilterExpression"] = filt
            for _ in range(40):
                r = outcome(lambda tb: tb.query(**kw), x)
                got.append(r)
                if "LastEvaluatedKey" not in r:
                    break
                kw["ExclusiveStartKey"] = r["LastEvaluatedKey"]
            pages.append(got)
        assert pages[0] == pages[1], (limit, forward)


@pytest.mark.parametrize("world,phase", CASES, indirect=["world"])
def test_scan_every_item_once_with_filter_segments_and_pages(world, phase):
    t, o = world.shim(phase), world.order
    c = world.customer()
    world.seed(phase, [{"customer": c, "order": o(i), "n": Decimal(i)} for i in range(1, 8)])
    same(world, t, lambda x: x.delete_item(Key={"customer": c, "order": o(2)}))
    same(world, t, lambda x: x.put_item(Item={"customer": c, "order": o(9), "n": Decimal(9)}))
    mine = Attr("customer").eq(c)  # the plain table holds every phase's cases: look at this one's
    same(world, t, lambda x: x.scan(FilterExpression=mine, ConsistentRead=True), unordered=True)
    same(world, t, lambda x: x.scan(FilterExpression=mine & Attr("n").gt(3), ProjectionExpression="customer, n",
                                    ConsistentRead=True), unordered=True)
    same(world, t, lambda x: x.scan(FilterExpression="customer = :c", ExpressionAttributeValues={":c": c},
                                    Select="COUNT", ConsistentRead=True)["Count"])
    for x in (world.plain, t):
        parts = [x.scan(Segment=s, TotalSegments=3, FilterExpression=mine, ConsistentRead=True)["Items"]
                 for s in range(3)]
        union = sorted((i for p in parts for i in p), key=repr)
        if x is world.plain:
            want = union
        else:
            assert union == want and len(want) == 7
    for x in (world.plain, t):
        got, kw = [], {"Limit": 3, "ConsistentRead": True, "FilterExpression": mine}
        for _ in range(400):
            r = x.scan(**kw)
            assert r["ScannedCount"] <= 3 and r["Count"] <= 3
            got += r["Items"]
            if "LastEvaluatedKey" not in r:
                break
            kw["ExclusiveStartKey"] = r["LastEvaluatedKey"]
        if x is world.plain:
            want = sorted(got, key=repr)
        else:
            assert sorted(got, key=repr) == want and len(want) == 7


@pytest.mark.parametrize("world,phase", CASES, indirect=["world"])
def test_item_near_400_kb_and_refusals(world, phase):
    t, o = world.shim(phase), world.order
    c = world.customer()
    k = {"customer": c, "order": o(1)}
    same(world, t, lambda x: x.put_item(Item={**k, "blob": Binary(b"z" * 408_000)}))
    same(world, t, lambda x: x.get_item(Key=k, ConsistentRead=True)["Item"]["blob"] == Binary(b"z" * 408_000))
    same(world, t, lambda x: x.put_item(Item={**k, "blob": Binary(b"z" * 410_000)}))  # too large for both
    same(world, t, lambda x: x.put_item(Item={**k, "v": 1}, ConditionExpression="attribute_exists("))
    same(world, t, lambda x: x.update_item(Key=k, UpdateExpression="SET v = :v"))  # :v undefined


# ---------------------------------------------------------------------------------------------
# A sharded GSI ([index.NAME]): the shim's fan-out query against boto3's query of a plain table
# whose GSI holds the same logical data unsharded: HASH region, RANGE tx_country. On the
# sharded table the GSI partition key is gsi_shard = "{shard}" (old: 2 random shards) ->
# "{region}#{shard}" (new: hash(PK) % 4), its sort key tx_country.


def _gsi_table(res, dynamo, name: str, partition: str, sort: str):
    res.meta.client.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in ("PK", "SK", partition, sort)],
        GlobalSecondaryIndexes=[{"IndexName": "ByCountry", "Projection": {"ProjectionType": "ALL"},
                                 "KeySchema": [{"AttributeName": partition, "KeyType": "HASH"},
                                               {"AttributeName": sort, "KeyType": "RANGE"}]}])
    local.wait_active(dynamo, name)
    return res.Table(name)


def index_outcome(fn, table):
    """The answer without ResponseMetadata and without the shim-owned ``gsi_shard`` (the plain
    table keeps the application's value); a LastEvaluatedKey as its table key and GSI sort value
    (the plain one also names the GSI partition key, the shim's carries the layouts it read)."""
    got = outcome(fn, table)
    if isinstance(got, dict):
        if "Items" in got:
            got["Items"] = [{k: v for k, v in i.items() if k != "gsi_shard"} for i in got["Items"]]
        if "LastEvaluatedKey" in got:
            got["LastEvaluatedKey"] = {k: got["LastEvaluatedKey"][k] for k in ("PK", "SK", "tx_country")}
    return got


def test_sharded_index_queries_answer_as_an_unsharded_gsi(dynalite_server):
    """Steady (reads old), dual_write (new then old), backfill (old then new), cutover (new): items
    at old values, at new values, and both mixed; every answer equal to the plain table's."""
    dynamo = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1",
                    retry=RetryPolicy(max_attempts=5, base_seconds=0.01), connect_timeout=1, read_timeout=4)
    res = boto3.resource("dynamodb", endpoint_url=dynalite_server.endpoint, region_name="us-east-1",
                         aws_access_key_id="x", aws_secret_access_key="x")
    tag = uuid.uuid4().hex[:8]
    plain = _gsi_table(res, dynamo, f"conf-gsi-plain-{tag}", "region", "tx_country")
    name = f"conf-gsi-{tag}"
    _gsi_table(res, dynamo, name, "gsi_shard", "tx_country")
    m = parse(gsi_migration(f"conf-{name}", name, old_shards=2, new_shards=4, shard_by="PK",
                                   new_partition="{region}#{shard}"))
    # Distinct sort values per region: DynamoDB orders ties in a GSI partition by an internal
    # hash, the shim by table key (docs/shim.md).
    items = [{"PK": f"inv-{i:02d}", "SK": "root", "region": ("EU", "US")[i % 2], "tx_country": f"C-{i:02d}",
              "amount": Decimal(i % 5), "gsi_shard": str(i % 2)} for i in range(14)]
    items.append({"PK": "inv-00", "SK": "line-1", "region": "EU", "amount": Decimal(1)})  # not in the index
    shims = {phase: ShardedTable(m, dynamo, control_table=None) for phase in (None, "dual_write", "backfill",
                                                                               "cutover", "dual_read")}
    for phase, t in shims.items():
        t._pin_phase(phase)
    for it in items:
        plain.put_item(Item=it)
        shims[None].put_item(Item=it)  # old values

    def compare(t, pages_and_errors=True):
        def same_answer(**kw):
            a = index_outcome(lambda x: x.query(IndexName="ByCountry", **kw), plain)
            b = index_outcome(lambda x: x.query(IndexName="ByCountry", **kw), t)
            assert a == b, (kw, a, b)
            return a
        eu = Key("region").eq("EU")
        for kce, forward in ((eu & Key("tx_country").between("C-02", "C-08"), False),
                             (eu & Key("tx_country").lt("C-05"), True), (eu & Key("tx_country").gte("C-05"), False),
                             (eu & Key("tx_country").eq("C-04"), True),
                             (eu & Key("tx_country").begins_with("C-1"), True), (Key("region").eq("nowhere"), True)):
            same_answer(KeyConditionExpression=kce, ScanIndexForward=forward)
        assert len(same_answer(KeyConditionExpression=eu)["Items"]) == 7
        same_answer(KeyConditionExpression="#r = :r AND begins_with(#c, :p)",
                    ExpressionAttributeNames={"#r": "region", "#c": "tx_country"},
                    ExpressionAttributeValues={":r": "US", ":p": "C-1"})
        same_answer(KeyConditionExpression=eu, FilterExpression=Attr("amount").gte(2))
        same_answer(KeyConditionExpression=eu, ProjectionExpression="PK, amount")
        assert same_answer(KeyConditionExpression=eu, Select="COUNT", FilterExpression=Attr("amount").eq(1)) == \
            {"Count": 1, "ScannedCount": 7}
        if not pages_and_errors:
            return
        # Pages (Limit counts items evaluated, before the filter), both directions: the same pages.
        for limit, forward, filt in ((2, True, None), (3, False, None), (2, True, Attr("amount").gt(1))):
            pages = []
            for x in (plain, t):
                kw, got = {"IndexName": "ByCountry", "KeyConditionExpression": eu, "Limit": limit,
                           "ScanIndexForward": forward}, []
                if filt is not None:
                    kw["FilterExpression"] = filt
                for _ in range(20):
                    r = outcome(lambda tb: tb.query(**kw), x)
                    kw["ExclusiveStartKey"] = r.get("LastEvaluatedKey")
                    got.append(index_outcome(lambda _: r, None))
                    if not kw["ExclusiveStartKey"]:
                        break
                pages.append(got)
            assert pages[0] == pages[1], (limit, forward)
        # Errors: the same codes. (Without the region: refused once a phase reads the new values;
        # the old values do not hold the region, so steady answers, see below.)
        for kw in ({"IndexName": "Nope", "KeyConditionExpression": eu},
                   {"IndexName": "ByCountry", "KeyConditionExpression": eu, "ConsistentRead": True},
                   {"IndexName": "ByCountry", "KeyConditionExpression": eu & Key("amount").eq(1)},
                   {"IndexName": "ByCountry", "KeyConditionExpression": Key("tx_country").eq("C-01")}):
            assert outcome(lambda x: x.query(**kw), plain) == outcome(lambda x: x.query(**kw), t) == \
                ("error", "ValidationException"), kw

    compare(shims[None], pages_and_errors=False)  # (pages and errors: the same code, over both layouts below)
    assert outcome(lambda x: x.query(IndexName="ByCountry", KeyConditionExpression=Key("tx_country").eq("C-01")),
                   shims[None])["Count"] == 1  # no region needed while only the old values are read
    for it in items[::2]:
        shims["dual_read"].put_item(Item=it)  # half the items at their new values
    compare(shims["dual_write"])
    compare(shims["backfill"])
    for it in items[1::2]:
        shims["dual_read"].put_item(Item=it)
    compare(shims["cutover"], pages_and_errors=False)
    # A deliberate difference: DynamoDB scans a GSI, the shim refuses a sharded one (an item
    # moving between partition values would be scanned twice or not at all; scan the table).
    assert len(plain.scan(IndexName="ByCountry")["Items"]) == 14
    assert outcome(lambda x: x.scan(IndexName="ByCountry"), shims["backfill"]) == ("error", "ValidationException")
    for t in shims.values():
        t.close()
