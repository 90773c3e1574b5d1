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
