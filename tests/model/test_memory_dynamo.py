"""Conformance: the same requests against dynalite and against the memory client give the
same answers and the same error codes.

Every request goes to both (dynalite through a raw botocore client: no retries, no
translation) and the outcomes are compared: a successful response without its
metadata and consumed capacity (sets compared unordered, BatchGetItem responses
unordered -- DynamoDB promises no order there), or the error code. Query and Scan pages
are compared *exactly*, LastEvaluatedKey included: the memory client orders a scan and
splits parallel-scan segments the way dynalite does (md5 of the hash key).
"""

from __future__ import annotations

import uuid

import botocore.exceptions
import pytest

from tests.model.memory_dynamo import MemoryDynamo

S = lambda s: {"S": s}  # noqa: E731
N = lambda n: {"N": str(n)}  # noqa: E731
B = lambda b: {"B": b}  # noqa: E731


def _canon(v):
    """A response with sets sorted, for an order-insensitive comparison of sets."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if k in ("SS", "NS", "BS") and isinstance(x, list):
                out[k] = sorted(x, key=lambda e: (str(type(e)), e))
            else:
                out[k] = _canon(x)
        return out
    if isinstance(v, list):
        return [_canon(x) for x in v]
    return v


class Both:
    """Send each request to dynalite and to the memory client; assert they agree."""

    def __init__(self, real, prefix: str):
        self.real = real
        self.mem = MemoryDynamo()
        self.prefix = prefix
        self.compared = 0
        self.errors: dict[str, int] = {}

    def table(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def _run(self, client, op, kw):
        try:
            resp = getattr(client, op)(**kw)
        except botocore.exceptions.ClientError as e:
            return ("error", e.response["Error"]["Code"])
        resp = {k: v for k, v in resp.items() if k not in ("ResponseMetadata", "ConsumedCapacity")}
        if op == "batch_get_item":
            resp["Responses"] = {t: sorted(items, key=repr) for t, items in resp["Responses"].items()}
        if op in ("create_table", "describe_table", "delete_table"):
            d = resp.get("TableDescription") or resp.get("Table")
            resp = {k: d[k] for k in ("TableName", "KeySchema")}
            resp["AttributeDefinitions"] = sorted(d["AttributeDefinitions"], key=lambda a: a["AttributeName"])
        return ("ok", _canon(resp))

    def __call__(self, op, **kw):
        want = self._run(self.real, op, kw)
        got = self._run(self.mem, op, kw)
        assert got == want, f"{op}({str(kw)[:500]}):\n  dynalite: {str(want)[:1500]}\n  memory:   {str(got)[:1500]}"
        self.compared += 1
        if want[0] == "error":
            self.errors[want[1]] = self.errors.get(want[1], 0) + 1
        return want[1]

    def create(self, name, hash_=("pk", "S"), range_=("sk", "S"), **kw):
        t = self.table(name)
        keys = [{"AttributeName": hash_[0], "KeyType": "HASH"}]
        attrs = [{"AttributeName": hash_[0], "AttributeType": hash_[1]}]
        if range_:
            keys.append({"AttributeName": range_[0], "KeyType": "RANGE"})
            attrs.append({"AttributeName": range_[0], "AttributeType": range_[1]})
        self("create_table", TableName=t, KeySchema=keys, AttributeDefinitions=attrs, BillingMode="PAY_PER_REQUEST",
             **kw)
        self.wait_active(t)
        return t

    def wait_gone(self, t: str) -> None:
        import time
        for _ in range(200):
            try:
                self.real.describe_table(TableName=t)
            except botocore.exceptions.ClientError:
                return
            time.sleep(0.01)

    def wait_active(self, t: str) -> None:
        import time
        for _ in range(200):  # dynalite creates tables asynchronously even with --createTableMs 0
            if self.real.describe_table(TableName=t)["Table"]["TableStatus"] == "ACTIVE":
                return
            time.sleep(0.01)

    def error(self, code, op, **kw):
        got = self(op, **kw)
        assert got == code, f"{op}: expected {code}, both said {got}"


COMPARED: dict[str, int] = {}


@pytest.fixture
def both(dynalite, request):
    b = Both(dynalite.client, f"m{uuid.uuid4().hex[:8]}")
    yield b
    COMPARED[request.node.name] = b.compared
    print(f"\n{request.node.name}: {b.compared} requests agreed ({sum(b.errors.values())} errors: {b.errors}); "
          f"{sum(COMPARED.values())} so far")


CCF = "ConditionalCheckFailedException"
VAL = "ValidationException"


def test_conditional_puts_updates_and_deletes(both):
    t = both.create("cond")
    k = {"pk": S("a"), "sk": S("1")}
    both("put_item", TableName=t, Item={**k, "v": N(1)}, ConditionExpression="attribute_not_exists(pk)")
    both.error(CCF, "put_item", TableName=t, Item={**k, "v": N(2)}, ConditionExpression="attribute_not_exists(pk)")
    both("put_item", TableName=t, Item={**k, "v": N(2), "s": S("hello"), "tags": {"SS": ["x", "y"]},
                                        "doc": {"M": {"a": {"L": [N(5), S("q")]}, "b": {"NULL": True}}},
                                        "bin": B(b"\x00\x01\xff")},
         ConditionExpression="v = :one", ExpressionAttributeValues={":one": N(1)}, ReturnValues="ALL_OLD")
    ok = lambda cond, **kw: both("update_item", TableName=t, Key=k, UpdateExpression="SET hits = :h",  # noqa: E731
                                 ConditionExpression=cond, ExpressionAttributeValues={":h": N(0), **kw.pop("v", {})},
                                 **kw)
    # Each condition holds (no error) or fails (CCF); both must agree on every one.
    conditions = [
        ("v < :x", {":x": N(10)}), ("v <= :x", {":x": N(2)}), ("v > :x", {":x": N("1.5")}), ("v >= :x", {":x": N(3)}),
        ("v <> :x", {":x": N(2)}), ("nothere <> :x", {":x": N(2)}), ("nothere = :x", {":x": N(2)}),
        ("v = :x", {":x": S("2")}), ("s < :x", {":x": S("help")}), ("s > :x", {":x": S("Hello")}),
        ("bin < :x", {":x": B(b"\x00\x02")}), ("bin > :x", {":x": B(b"\x00")}),
        ("v BETWEEN :a AND :b", {":a": N(1), ":b": N(2)}), ("s BETWEEN :a AND :b", {":a": S("a"), ":b": S("h")}),
        ("v IN (:a, :b)", {":a": N(7), ":b": N(2)}), ("v IN (:a)", {":a": N(7)}),
        ("begins_with(s, :p)", {":p": S("he")}), ("begins_with(s, :p)", {":p": S("lo")}),
        ("begins_with(bin, :p)", {":p": B(b"\x00\x01")}),
        ("contains(s, :p)", {":p": S("ell")}), ("contains(tags, :p)", {":p": S("y")}),
        ("contains(tags, :p)", {":p": S("z")}), ("contains(doc.a, :p)", {":p": S("q")}),
        ("size(s) = :n", {":n": N(5)}), ("size(tags) > :n", {":n": N(2)}), ("size(doc) = :n", {":n": N(2)}),
        ("attribute_type(v, :t)", {":t": S("N")}), ("attribute_type(v, :t)", {":t": S("S")}),
        ("attribute_type(doc.b, :t)", {":t": S("NULL")}),
        ("doc.a[0] = :x", {":x": N(5)}), ("doc.a[1] = :x", {":x": N(5)}), ("doc.a[7] = :x", {":x": N(5)}),
        ("attribute_exists(doc.a[1])", {}), ("attribute_not_exists(doc.a[2])", {}),
        ("NOT v = :x", {":x": N(2)}), ("NOT (v = :x OR s = :y)", {":x": N(1), ":y": S("hello")}),
        ("v = :x AND s = :y OR nothere = :x", {":x": N(2), ":y": S("no")}),
        ("v = :x AND (s = :y OR attribute_exists(tags))", {":x": N(2), ":y": S("no")}),
        ("NOT attribute_exists(pk) or v = :x", {":x": N(2)}),
    ]
    outcomes = []
    for cond, values in conditions:
        got = ok(cond, v=values)
        outcomes.append("ok" if isinstance(got, dict) else got)
    assert "ok" in outcomes and CCF in outcomes
    both("update_item", TableName=t, Key=k, UpdateExpression="SET #n.#x = :v", ExpressionAttributeNames={"#n": "doc",
         "#x": "new.attr"}, ExpressionAttributeValues={":v": S("dotted")}, ConditionExpression="#n.#x <> :v",
         ReturnValues="UPDATED_NEW")
    for rv in ("NONE", "ALL_OLD", "UPDATED_OLD", "ALL_NEW", "UPDATED_NEW"):
        both("update_item", TableName=t, Key=k, UpdateExpression="SET v = v + :one, doc.a[0] = :x REMOVE doc.b",
             ExpressionAttributeValues={":one": N(1), ":x": S(rv)}, ReturnValues=rv)
    both.error(CCF, "update_item", TableName=t, Key=k, UpdateExpression="SET v = :x",
               ConditionExpression="v > :x", ExpressionAttributeValues={":x": N(100)})
    both.error(CCF, "update_item", TableName=t, Key={"pk": S("nobody"), "sk": S("1")}, UpdateExpression="SET v = :x",
               ConditionExpression="attribute_exists(pk)", ExpressionAttributeValues={":x": N(1)})
    both.error(CCF, "delete_item", TableName=t, Key=k, ConditionExpression="v = :x",
               ExpressionAttributeValues={":x": N(0)})
    both("delete_item", TableName=t, Key=k, ConditionExpression="attribute_exists(v)", ReturnValues="ALL_OLD")
    both("delete_item", TableName=t, Key=k, ReturnValues="ALL_OLD")  # gone: no Attributes
    both("get_item", TableName=t, Key=k, ConsistentRead=True)
    assert both.errors[CCF] >= 5


def test_counters_sets_lists_and_removes(both):
    t = both.create("ctr", range_=None)
    k = {"pk": S("c")}
    add = dict(TableName=t, Key=k, UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": N(1)},
               ReturnValues="UPDATED_NEW")
    both("update_item", **add)  # creates the item
    both("update_item", **add)
    both("update_item", TableName=t, Key=k, UpdateExpression="ADD n :d", ExpressionAttributeValues={":d": N("-0.25")},
         ReturnValues="ALL_NEW")
    both("update_item", TableName=t, Key=k, UpdateExpression="SET r = if_not_exists(r, :z) + :one",
         ExpressionAttributeValues={":z": N(0), ":one": N(1)}, ReturnValues="ALL_NEW")
    both("update_item", TableName=t, Key=k, UpdateExpression="SET r = if_not_exists(r, :z) + :one",
         ExpressionAttributeValues={":z": N(0), ":one": N(1)}, ReturnValues="UPDATED_OLD")
    both("update_item", TableName=t, Key=k, UpdateExpression="SET m = r - :ten, l = :l",
         ExpressionAttributeValues={":ten": N(10), ":l": {"L": [S("a")]}}, ReturnValues="ALL_NEW")
    both("update_item", TableName=t, Key=k, UpdateExpression="SET l = list_append(l, :more), l2 = list_append(:more, l)",
         ExpressionAttributeValues={":more": {"L": [S("b"), N(3)]}}, ReturnValues="ALL_NEW")
    both("update_item", TableName=t, Key=k, UpdateExpression="ADD ns :a, ss :s",
         ExpressionAttributeValues={":a": {"NS": ["1", "2"]}, ":s": {"SS": ["x"]}}, ReturnValues="ALL_NEW")
    both("update_item", TableName=t, Key=k, UpdateExpression="ADD ns :a DELETE ss :s",
         ExpressionAttributeValues={":a": {"NS": ["2", "3"]}, ":s": {"SS": ["x", "nope"]}}, ReturnValues="ALL_NEW")
    both("update_item", TableName=t, Key=k, UpdateExpression="DELETE ns :a", ExpressionAttributeValues={":a": {"NS": ["1"]}},
         ReturnValues="UPDATED_NEW")
    both("update_item", TableName=t, Key=k, UpdateExpression="REMOVE l[0], m, nothing", ReturnValues="ALL_NEW")
    # Type errors and malformed updates: ValidationException from both.
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="ADD l :one",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET x = l + :one",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET x = nothing + :one",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET n = :one, n = :one",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET l = :one REMOVE l[0]",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET pk = :one",
               ExpressionAttributeValues={":one": S("x")})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET n = :one",
               ExpressionAttributeValues={":one": N(1), ":unused": N(2)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET #n = :one",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET size = :one",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET n = :one,",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET n = :one SET m = :one",
               ExpressionAttributeValues={":one": N(1)})
    both.error(VAL, "update_item", TableName=t, Key=k, UpdateExpression="SET n = :one",
               ConditionExpression="n <", ExpressionAttributeValues={":one": N(1)})
    both("update_item", TableName=t, Key=k, UpdateExpression="SET n = :one",  # no static type check on <
         ConditionExpression="n < :s", ExpressionAttributeValues={":one": N(1), ":s": {"SS": ["a"]}})
    for cond in ("((n = :one))", "n = n", "contains(l, l)", "NOT NOT n = :one", "n BETWEEN :one AND :s",
                 "n BETWEEN :two AND :one", "missing = :one", "(n) = :one", "size(nothere) = :one"):
        vals = {k: v for k, v in {":one": N(1), ":two": N(2), ":s": S("s")}.items() if k in cond}
        both("update_item", TableName=t, Key=k, UpdateExpression="SET w = :w", ConditionExpression=cond,
             ExpressionAttributeValues={**vals, ":w": N(0)})
    both.error(VAL, "put_item", TableName=t, Item={"pk": S("big"), "blob": S("x" * (400 * 1024))})
    both.error(VAL, "put_item", TableName=t, Item={"nokey": S("x")})
    both.error(VAL, "put_item", TableName=t, Item={"pk": N(1)})
    both.error(VAL, "put_item", TableName=t, Item={"pk": S("")})
    both.error(VAL, "put_item", TableName=t, Item={"pk": S("e"), "s": {"SS": []}})
    both.error(VAL, "get_item", TableName=t, Key={"pk": S("c"), "extra": S("x")})
    both.error(VAL, "put_item", TableName=t, Item={"pk": S("x")}, ReturnValues="ALL_NEW")
    both.error("ResourceNotFoundException", "get_item", TableName=both.table("nope"), Key=k)
    both("get_item", TableName=t, Key=k, ConsistentRead=True)
    both("get_item", TableName=t, Key=k, ProjectionExpression="n, l[1], #ns", ExpressionAttributeNames={"#ns": "ns"})
    assert both.errors[VAL] >= 20


@pytest.mark.parametrize("sort_type,values", [
    ("S", ["a", "B", "aa", "a b", "~", "0", "a-1", "Z", "ab", "a0"]),
    ("N", ["-10", "-1.5", "0", "0.001", "2", "10", "100", "1e3", "-0.0001", "99999999999999999999"]),
    ("B", [b"\x00", b"\x00\x00", b"\x01", b"\x7f", b"\x80", b"\xff", b"\xff\x00", b"a", b"ab", b"b"]),
])
def test_query_order_pagination_and_key_conditions(both, sort_type, values):
    t = both.create(f"q{sort_type.lower()}", range_=("sk", sort_type))
    for i, v in enumerate(values):
        both("put_item", TableName=t, Item={"pk": S("p"), "sk": {sort_type: v}, "i": N(i), "odd": {"BOOL": i % 2 == 1}})
        both("put_item", TableName=t, Item={"pk": S("other"), "sk": {sort_type: v}})
    lo, hi = sorted(values, key=lambda v: (float(v) if sort_type == "N" else v))[2:8:5]
    conds = [("pk = :p", {}), ("pk = :p AND sk < :a", {":a": {sort_type: hi}}),
             ("pk = :p AND sk <= :a", {":a": {sort_type: hi}}), ("pk = :p AND sk > :a", {":a": {sort_type: lo}}),
             ("pk = :p AND sk >= :a", {":a": {sort_type: lo}}), ("pk = :p AND sk = :a", {":a": {sort_type: lo}}),
             ("sk BETWEEN :a AND :b AND pk = :p", {":a": {sort_type: lo}, ":b": {sort_type: hi}})]
    if sort_type != "N":
        conds.append(("pk = :p AND begins_with(sk, :a)", {":a": {sort_type: values[0]}}))
    for cond, vals in conds:
        for forward in (True, False):
            for limit in (3, None):
                kw = dict(TableName=t, KeyConditionExpression=cond, ScanIndexForward=forward,
                          ExpressionAttributeValues={":p": S("p"), **vals}, ConsistentRead=True)
                if limit:
                    kw["Limit"] = limit
                pages = 0
                while True:
                    resp = both("query", **kw)
                    pages += 1
                    if "LastEvaluatedKey" not in resp:
                        break
                    kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
                assert pages < 10
    both("query", TableName=t, KeyConditionExpression="pk = :p", FilterExpression="odd = :t",
         ProjectionExpression="sk, i", ExpressionAttributeValues={":p": S("p"), ":t": {"BOOL": True}}, Limit=4)
    both("query", TableName=t, KeyConditionExpression="pk = :p", Select="COUNT",
         ExpressionAttributeValues={":p": S("p")})
    both.error(VAL, "query", TableName=t, KeyConditionExpression="sk = :p", ExpressionAttributeValues={":p": S("p")})
    both.error(VAL, "query", TableName=t, KeyConditionExpression="pk = :p OR pk = :p",
               ExpressionAttributeValues={":p": S("p")})
    both.error(VAL, "query", TableName=t, KeyConditionExpression="pk = :p", FilterExpression="sk = :p",
               ExpressionAttributeValues={":p": S("p")})
    both.error(VAL, "query", TableName=t, KeyConditionExpression="pk = :p AND sk > :a AND sk < :a",
               ExpressionAttributeValues={":p": S("p"), ":a": {sort_type: values[0]}})
    both.error(VAL, "query", TableName=t, KeyConditionExpression="pk = :p AND sk > :a",
               ExpressionAttributeValues={":p": S("p"), ":a": S("x") if sort_type != "S" else N(1)})


@pytest.mark.parametrize("hash_type", ["S", "N", "B"])
def test_parallel_scan_pages_match_and_cover_every_item_once(both, hash_type):
    t = both.create(f"scan{hash_type.lower()}", hash_=("pk", hash_type), range_=("sk", "N"))
    make = {"S": lambda i: S(f"item-{i}"), "N": lambda i: N(i * 7 - 300), "B": lambda i: B(f"b{i}".encode())}[hash_type]
    keys = set()
    for i in range(60):
        for j in range(2):
            both("put_item", TableName=t, Item={"pk": make(i), "sk": N(j), "v": N(i)})
            keys.add((repr(make(i)), j))
    for total in (1, 3, 7):
        seen = []
        for segment in range(total):
            kw = dict(TableName=t, Segment=segment, TotalSegments=total, Limit=9, ConsistentRead=True)
            while True:
                resp = both("scan", **kw)
                seen += [(repr(i["pk"]), int(i["sk"]["N"])) for i in resp["Items"]]
                if "LastEvaluatedKey" not in resp:
                    break
                kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        assert sorted(seen) == sorted(keys), f"{total} segments: not every item exactly once"
    both("scan", TableName=t, FilterExpression="v BETWEEN :a AND :b", ProjectionExpression="pk, v",
         ExpressionAttributeValues={":a": N(10), ":b": N(20)}, Limit=50)
    both.error(VAL, "scan", TableName=t, Segment=3, TotalSegments=3)
    # (Segment without TotalSegments: DynamoDB refuses it, the memory client too; dynalite ignores it.)
    first = both("scan", TableName=t, Segment=0, TotalSegments=4, Limit=1)
    both.error(VAL, "scan", TableName=t, Segment=1, TotalSegments=4, ExclusiveStartKey=first["LastEvaluatedKey"])


def test_batch_write_and_get(both):
    t = both.create("batch")
    puts = [{"PutRequest": {"Item": {"pk": S(f"p{i % 3}"), "sk": S(f"s{i}"), "v": N(i)}}} for i in range(20)]
    both("batch_write_item", RequestItems={t: puts})
    mixed = [{"DeleteRequest": {"Key": {"pk": S(f"p{i % 3}"), "sk": S(f"s{i}")}}} for i in range(0, 20, 4)]
    mixed += [{"PutRequest": {"Item": {"pk": S("q"), "sk": S(f"s{i}"), "v": N(-i)}}} for i in range(5)]
    both("batch_write_item", RequestItems={t: mixed})
    both.error(VAL, "batch_write_item", RequestItems={t: puts[:2] + puts[:1]})  # duplicate keys
    both.error(VAL, "batch_write_item", RequestItems={t: [puts[0], {"DeleteRequest": {"Key": {
        "pk": puts[0]["PutRequest"]["Item"]["pk"], "sk": puts[0]["PutRequest"]["Item"]["sk"]}}}]})
    both.error(VAL, "batch_write_item", RequestItems={t: puts + puts[:6] + [
        {"PutRequest": {"Item": {"pk": S("x"), "sk": S(str(i))}}} for i in range(6)]})  # 32 > 25
    keys = [{"pk": S(f"p{i % 3}"), "sk": S(f"s{i}")} for i in range(20)] + [{"pk": S("none"), "sk": S("x")}]
    both("batch_get_item", RequestItems={t: {"Keys": keys, "ConsistentRead": True}})
    both("batch_get_item", RequestItems={t: {"Keys": keys[:5], "ProjectionExpression": "#s, v",
                                             "ExpressionAttributeNames": {"#s": "sk"}}})
    both.error(VAL, "batch_get_item", RequestItems={t: {"Keys": keys[:2] + keys[:1]}})
    for i in range(5):
        both("get_item", TableName=t, Key={"pk": S("q"), "sk": S(f"s{i}")})


def test_tables_and_ttl(both):
    t = both.create("tbl")
    both.error("ResourceInUseException", "create_table", TableName=t,
               KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
               AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST")
    both("describe_table", TableName=t)
    both.error("ResourceNotFoundException", "describe_table", TableName=both.table("missing"))
    both("describe_time_to_live", TableName=t)  # (dynalite has no UpdateTimeToLive: see the memory-only tests)
    both("delete_table", TableName=t)
    both.wait_gone(t)  # dynalite deletes asynchronously (DELETING for a moment); the memory client at once
    both.error("ResourceNotFoundException", "describe_table", TableName=t)


# --------------------------------------------------------------------------- memory-only (no dynalite)
# Behaviour dynalite cannot referee: it lacks the operation, or differs from DynamoDB there.


def _mem_table(db, name="mem", range_=True, **kw):
    keys = [{"AttributeName": "pk", "KeyType": "HASH"}]
    attrs = [{"AttributeName": "pk", "AttributeType": "S"}]
    if range_:
        keys.append({"AttributeName": "sk", "KeyType": "RANGE"})
        attrs.append({"AttributeName": "sk", "AttributeType": "S"})
    attrs += kw.pop("extra_attrs", [])
    db.create_table(TableName=name, KeySchema=keys, AttributeDefinitions=attrs, BillingMode="PAY_PER_REQUEST", **kw)
    return name


def _code(fn, **kw):
    try:
        fn(**kw)
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"]
    return "ok"


def test_ttl_update_describe_and_expiry():
    db = MemoryDynamo()
    t = _mem_table(db, range_=False)
    assert db.describe_time_to_live(TableName=t)["TimeToLiveDescription"] == {"TimeToLiveStatus": "DISABLED"}
    db.update_time_to_live(TableName=t, TimeToLiveSpecification={"Enabled": True, "AttributeName": "exp"})
    assert db.describe_time_to_live(TableName=t)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "ENABLED", "AttributeName": "exp"}
    assert _code(db.update_time_to_live, TableName=t,
                 TimeToLiveSpecification={"Enabled": True, "AttributeName": "exp"}) == VAL
    db.put_item(TableName=t, Item={"pk": S("old"), "exp": N(100)})
    db.put_item(TableName=t, Item={"pk": S("new"), "exp": N(300)})
    db.put_item(TableName=t, Item={"pk": S("none")})
    assert db.expire_ttl(now=200) == 1
    assert [i["pk"]["S"] for i in db.items(t)] == ["new", "none"]


def test_dynamodb_rules_dynalite_relaxes():
    db = MemoryDynamo()
    t = _mem_table(db)
    assert _code(db.scan, TableName=t, Segment=0) == VAL  # DynamoDB wants TotalSegments too
    assert _code(db.put_item, TableName=t, Item={"pk": S("a"), "sk": S("b")}, Expected={}) == VAL  # legacy: refused
    assert _code(db.get_item, TableName="no", Key={}) == VAL  # table names are 3..255 characters
    assert _code(db.put_item, TableName=t, Item={"pk": S("a"), "sk": S("b"), "n": N("1" * 39)}) == VAL


def test_gsi_query_and_scan():
    db = MemoryDynamo()
    t = _mem_table(db, extra_attrs=[{"AttributeName": "g", "AttributeType": "S"}],
                   GlobalSecondaryIndexes=[{"IndexName": "by-g", "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                                            "Projection": {"ProjectionType": "ALL"}}])
    for i in range(5):
        db.put_item(TableName=t, Item={"pk": S(f"p{i}"), "sk": S("x"), **({"g": S("G")} if i % 2 else {})})
    got = db.query(TableName=t, IndexName="by-g", KeyConditionExpression="g = :g", ExpressionAttributeValues={":g": S("G")})
    assert [i["pk"]["S"] for i in got["Items"]] == ["p1", "p3"]
    assert db.scan(TableName=t, IndexName="by-g")["Count"] == 2
    assert _code(db.query, TableName=t, IndexName="by-g", KeyConditionExpression="g = :g", ConsistentRead=True,
                 ExpressionAttributeValues={":g": S("G")}) == VAL
    assert db.describe_table(TableName=t)["Table"]["GlobalSecondaryIndexes"][0]["IndexName"] == "by-g"


def test_fault_injection_goes_through_the_choke_point_retries():
    from reshard.aws.dynamo import Dynamo, RetryPolicy
    db = MemoryDynamo()
    t = _mem_table(db)
    left = {"n": 2}

    def throttle_twice(op, kw):
        if op == "put_item" and left["n"]:
            left["n"] -= 1
            return "ProvisionedThroughputExceededException"
        return None

    db.faults.append(throttle_twice)
    dynamo = Dynamo(db, retry=RetryPolicy(max_attempts=5, base_seconds=0.0), sleep=lambda s: None)
    dynamo.call("put_item", TableName=t, Item={"pk": S("a"), "sk": S("b")})
    assert dynamo.stats.throttles == 2 and dynamo.stats.retries == {"put_item": 2}
    assert len(db.items(t)) == 1
