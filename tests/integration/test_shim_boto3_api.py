"""Issue 14, priority 1: the shim answers and fails like boto3's ``Table`` (dynalite).

Return shapes (``{"Item": ...}`` / ``{}`` plus ``ResponseMetadata``), errors as botocore
``ClientError``\\ s with DynamoDB's codes, and boto3 ``Attr``/``Key`` condition objects
built by boto3's ``ConditionExpressionBuilder`` -- in the steady state and in phases
that write two layouts and tombstones.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from reshard import errors
from reshard.shim import errors as shim_errors
from tests.integration.test_interleavings_shim import create_table, ev, key
from tests.shim_helpers import migration, shim
from tests.shim_helpers import scan as shim_scan

PHASES = [None, "dual_write", "cutover"]  # steady; old authoritative + mirror; new authoritative + tombstones


def code(e: ClientError) -> str:
    return e.response["Error"]["Code"]


@pytest.mark.parametrize("phase", PHASES)
def test_get_item_and_writes_answer_in_boto3_shapes(dynalite, unique_name, phase):
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, phase)
    absent = t.get_item(Key=key(1))
    assert "Item" not in absent and set(absent) == {"ResponseMetadata"}
    put = t.put_item(Item=ev(1, val=Decimal(1)))
    assert set(put) == {"ResponseMetadata"} and put["ResponseMetadata"]["HTTPStatusCode"] == 200
    got = t.get_item(Key=key(1), ConsistentRead=True)
    assert got["Item"] == ev(1, val=Decimal(1)) and "ResponseMetadata" in got
    old = t.put_item(Item=ev(1, val=Decimal(2)), ReturnValues="ALL_OLD")
    assert old["Attributes"] == ev(1, val=Decimal(1))
    upd = t.update_item(Key=key(1), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 3},
                        ReturnValues="UPDATED_NEW")
    assert upd["Attributes"] == {"val": Decimal(3)} and "ResponseMetadata" in upd
    gone = t.delete_item(Key=key(1), ReturnValues="ALL_OLD")
    assert gone["Attributes"] == ev(1, val=Decimal(3))
    assert set(t.delete_item(Key=key(1), ReturnValues="ALL_OLD")) == {"ResponseMetadata"}  # nothing was there
    assert "Item" not in t.get_item(Key=key(1), ConsistentRead=True)
    q = t.query(Key={"sensor_id": "s-1"})
    assert q["Items"] == [] and q["Count"] == 0 and q["ScannedCount"] == 0


@pytest.mark.parametrize("phase", PHASES)
def test_condition_objects_and_client_errors(dynalite, unique_name, phase):
    """``Attr(...)`` conditions reach the server as an expression (before: the object's repr,
    a server syntax error); failures are ClientErrors with DynamoDB's code, also reshard's
    ConditionalCheckFailed, and the very class botocore raises for that code."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, phase)
    t.put_item(Item=ev(1, n=1), ConditionExpression=Attr("event_id").not_exists())
    with pytest.raises(ClientError) as e:
        t.put_item(Item=ev(1, n=2), ConditionExpression=Attr("event_id").not_exists())
    assert code(e.value) == "ConditionalCheckFailedException"
    assert isinstance(e.value, errors.ConditionalCheckFailed)
    assert isinstance(e.value, dynalite.client.exceptions.ConditionalCheckFailedException)
    assert e.value.operation_name == "PutItem" and "RequestId" in e.value.response["ResponseMetadata"]
    # Condition objects with values, on update and delete; app names next to boto3's #n0.
    t.update_item(Key=key(1), UpdateExpression="SET #c = :c",
                  ConditionExpression=Attr("n").eq(1) & Attr("x").not_exists(),
                  ExpressionAttributeNames={"#c": "colour"}, ExpressionAttributeValues={":c": "red"})
    with pytest.raises(ClientError) as e:
        t.update_item(Key=key(1), UpdateExpression="SET #c = :c", ConditionExpression=Attr("n").gt(5),
                      ExpressionAttributeNames={"#c": "colour"}, ExpressionAttributeValues={":c": "blue"})
    assert code(e.value) == "ConditionalCheckFailedException"
    with pytest.raises(ClientError) as e:
        t.delete_item(Key=key(1), ConditionExpression=Attr("colour").eq("blue"))
    assert code(e.value) == "ConditionalCheckFailedException"
    assert t.get_item(Key=key(1), ConsistentRead=True)["Item"] == ev(1, n=Decimal(1), colour="red")
    t.delete_item(Key=key(1), ConditionExpression=Attr("colour").eq("red") & Key("ts").begins_with("2024"))
    # After the delete (a tombstone in fenced phases) the item is absent for the app's
    # conditions, also when they come as objects (the tombstone rewrite applies).
    with pytest.raises(ClientError) as e:
        t.update_item(Key=key(1), UpdateExpression="SET n = :n", ExpressionAttributeValues={":n": 2},
                      ConditionExpression=Attr("event_id").exists())
    assert code(e.value) == "ConditionalCheckFailedException"
    t.put_item(Item=ev(1, n=3), ConditionExpression=Attr("event_id").not_exists())
    assert t.get_item(Key=key(1), ConsistentRead=True)["Item"] == ev(1, n=Decimal(3))


def test_shim_refusals_are_client_errors(dynalite, unique_name):
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, "dual_write")
    with pytest.raises(ClientError) as e:
        t.get_item(Key={**key(1), "val": 1})  # not a key field
    assert code(e.value) == "ValidationException" and isinstance(e.value, errors.BadInput)
    assert isinstance(e.value, shim_errors.ShimValidationError)
    with pytest.raises(ClientError) as e:
        t.put_item(Item=ev(1, blob=b"x" * 410_000))
    assert code(e.value) == "ValidationException" and isinstance(e.value, shim_errors.ItemTooLarge)
    with pytest.raises(ClientError) as e:
        t.put_item(Item=ev(1), ConditionExpression=Attr("n").eq(1),
                   ExpressionAttributeNames={"#n0": "other"})  # boto3's placeholder, another meaning
    assert code(e.value) == "ValidationException"
    with pytest.raises(ClientError) as e:
        t.put_item(Item=ev(1), ConditionExpression=42)
    assert code(e.value) == "ValidationException"
    # A server-side validation error keeps DynamoDB's code and response.
    with pytest.raises(ClientError) as e:
        t.put_item(Item=ev(1), ConditionExpression="attribute_exists(")
    assert code(e.value) == "ValidationException" and "ResponseMetadata" in e.value.response


@pytest.mark.parametrize("phase", [None, "dual_read"])
def test_batch_get_batch_writer_and_meta_client(dynalite, unique_name, phase):
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, phase)
    with t.batch_writer(overwrite_by_pkeys=["sensor_id", "event_id", "ts"]) as b:
        for k in range(4):
            b.put_item(Item=ev(k, v=1))
        b.put_item(Item=ev(1, v=2))  # replaces the buffered put of the same key (boto3's rule)
        b.delete_item(Key=key(3))    # replaces the buffered put: item 3 is never written
    got = t.batch_get_item(Keys=[key(k) for k in range(5)], ConsistentRead=True)
    assert sorted(got["Items"], key=lambda i: i["event_id"]) == [ev(0, v=1), ev(1, v=2), ev(2, v=1)]
    assert got["UnprocessedKeys"] == {} and "ResponseMetadata" in got
    only = t.batch_get_item(Keys=[key(1)], ProjectionExpression="#v", ExpressionAttributeNames={"#v": "v"})
    assert only["Items"] == [{"v": 2}]
    # meta.client: the rest passes through; item operations on this table are refused.
    assert t.meta.table_name == m.table and t.meta.client.describe_table(TableName=m.table)["Table"]
    for call in (lambda c: c.put_item(TableName=m.table, Item={"PK": {"S": "x"}, "SK": {"S": "y"}}),
                 lambda c: c.transact_write_items(TransactItems=[{"Put": {"TableName": m.table, "Item": {}}}]),
                 lambda c: c.scan(TableName=m.table)):
        with pytest.raises(ClientError) as e:
            call(t.meta.client)
        assert code(e.value) == "ValidationException" and "ShardedTable." in str(e.value)
    for call in (lambda: t.query(Key={"sensor_id": "s-1"}, IndexName="by-x"),
                 lambda: t.scan(ReturnConsumedCapacity="SOME")):
        with pytest.raises(ClientError) as e:
            call()
        assert code(e.value) == "ValidationException"


def test_return_consumed_capacity_counts_every_physical_request(dynalite, unique_name):
    """dynalite reports 1 unit per small write/read: a dual_write put is two writes, a dual_read
    get one BatchGetItem of two keys, a fanned-out query one Query per partition."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    steady, dual, read = (shim(m, dynalite, p) for p in (None, "dual_write", "dual_read"))
    moved = next(k for k in range(1, 40) if dual._write_keys(dual._begin(), dual._fields(ev(k)))[1:])
    one = steady.put_item(Item=ev(0), ReturnConsumedCapacity="TOTAL")["ConsumedCapacity"]
    two = dual.put_item(Item=ev(moved), ReturnConsumedCapacity="INDEXES")["ConsumedCapacity"]
    assert one == {"TableName": m.table, "CapacityUnits": 1.0}
    assert two["CapacityUnits"] == 2.0 and two["Table"] == {"CapacityUnits": 2.0}
    assert "ConsumedCapacity" not in steady.put_item(Item=ev(0))
    got = read.get_item(Key=key(moved), ReturnConsumedCapacity="TOTAL")
    assert got["Item"] == ev(moved) and got["ConsumedCapacity"]["CapacityUnits"] > 0
    for k in range(1, 12):
        dual.put_item(Item=ev(k))
    # One Query per partition, on the pool's threads: counted as when run one by one.
    sequential = shim(m, dynalite, "dual_read", query_workers=1)
    pooled, one_by_one = (t.query(Key={"sensor_id": "s-1"}, ReturnConsumedCapacity="TOTAL")["ConsumedCapacity"]
                          for t in (read, sequential))
    assert pooled == one_by_one and pooled["CapacityUnits"] >= 2
    assert read.batch_get_item(Keys=[key(0)], ReturnConsumedCapacity="TOTAL")["ConsumedCapacity"][0]["TableName"]


def test_scan_returns_an_item_once_when_the_backfill_copies_it_mid_scan(dynalite, unique_name):
    """dual_read scan, page by page (Limit=1). After each page the backfill copies every item
    returned so far into the new layout: its new copy, often later in the scan order, must
    not be returned again (the item is returned at its old copy, which exists for the whole
    scan in this phase). Choosing the new copy when one exists returned items twice."""
    from reshard.aws.dynamo import to_wire
    from tests.integration.test_interleavings_shim import ev as sensor_ev
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    planned, reader = shim(m, dynalite, "planned"), shim(m, dynalite, "dual_read")
    mapper = reader.mapper
    items = [sensor_ev(k, n=k) for k in range(1, 13)]
    for it in items:
        planned.put_item(Item=it)
    stored = {}
    for i in shim_scan(dynalite, m.table):
        stored[mapper.identity(mapper.fields(i, mapper.old))] = i
    seen, kw = [], {"Limit": 1, "ConsistentRead": True}
    for _ in range(200):
        page = reader.scan(**kw)
        seen += [i["event_id"] for i in page["Items"]]
        for it in page["Items"]:  # the backfill catches up with what the scan returned
            new_item, moved = mapper.remap(stored[mapper.identity(mapper.logical_fields(to_wire(it)))])
            if moved:
                dynalite.call("put_item", TableName=m.table, Item=new_item)
        if "LastEvaluatedKey" not in page:
            break
        kw["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    assert sorted(seen) == sorted(it["event_id"] for it in items), seen


def test_a_paged_scan_resumed_across_a_change_of_read_layouts_is_refused(dynalite, unique_name):
    """A scan paged in backfill (old copies designated) and resumed in cutover (new copies
    designated) could return an item twice or miss one: the resume is refused with a
    ClientError naming the cause; resuming in a phase that reads the same layouts works, and a
    start key the application built itself (no marker) is taken as is."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    writer = shim(m, dynalite, "backfill")
    items = [ev(k, n=k) for k in range(1, 7)]
    for it in items:
        writer.put_item(Item=it)
    first = writer.scan(Limit=2, ConsistentRead=True)
    lek = first["LastEvaluatedKey"]
    assert lek["_rs_scan"] == "old,new" and set(lek) - {"_rs_scan"} == {m.keys.partition, m.keys.sort}
    later = shim(m, dynalite, "cutover")
    with pytest.raises(ClientError) as e:
        later.scan(Limit=2, ConsistentRead=True, ExclusiveStartKey=lek)
    assert code(e.value) == "ReshardScanInterrupted" and isinstance(e.value, errors.ScanInterrupted)
    assert "restart the scan" in str(e.value)
    same = shim(m, dynalite, "dual_read")             # reads the same two layouts: resumes
    seen, kw = [i["event_id"] for i in first["Items"]], {"Limit": 2, "ConsistentRead": True, "ExclusiveStartKey": lek}
    for _ in range(50):
        page = same.scan(**kw)
        seen += [i["event_id"] for i in page["Items"]]
        if "LastEvaluatedKey" not in page:
            break
        kw["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    assert sorted(seen) == sorted(it["event_id"] for it in items)
    bare = {a: lek[a] for a in (m.keys.partition, m.keys.sort)}         # built by the application: no marker
    assert "Items" in later.scan(Limit=2, ConsistentRead=True, ExclusiveStartKey=bare)
    for t in (writer, later, same):
        t.close()
