"""Issue 26 case 1: conditions and ReturnValues on key fields kept only inside the keys (dynalite).

The hourly layout (``0003``) parses ``sensor_id`` and ``ts`` from ``PK``/``SK``; an item the
application wrote before it adopted the shim (and its backfill copy) does not store them. A
plain boto3 ``Table`` keyed by those fields sees them on every item: the shim decides each
condition part over key fields from the request's key (``expr.decide_key_fields``) and puts
the key fields back, typed as the request typed them, into what it returns.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from boto3.dynamodb.conditions import Attr
from botocore.exceptions import ClientError

from reshard.aws import local
from reshard.aws.dynamo import to_wire
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse
from tests.integration.test_shim_differential import _NUMBERS, copy_all
from tests.shim_helpers import create_table, migration, shim

pytestmark = pytest.mark.integration

ITEM = {"sensor_id": "s-1", "ts": "2024-10-27T15:00:00Z", "val": Decimal("21.5")}
KEY = {"sensor_id": "s-1", "ts": "2024-10-27T15:00:00Z"}


def raw_put(dynamo, m, logical: dict, drop: tuple) -> None:
    """The application's own write before the shim: the old layout's item, ``drop`` not stored."""
    physical = KeyMapper(m).to_physical(to_wire(logical), KeyMapper(m).old)
    dynamo.call("put_item", TableName=m.table, Item={k: v for k, v in physical.items() if k not in drop})


def failed(fn) -> bool:
    try:
        fn()
    except ClientError as e:
        assert e.response["Error"]["Code"] == "ConditionalCheckFailedException"
        return True
    return False


@pytest.mark.parametrize("phase", [None, "dual_write", "cutover"])
def test_conditions_on_fields_kept_only_in_the_keys(dynalite, unique_name, phase):
    m = migration("hourly", table=unique_name)
    create_table(dynalite, m)
    raw_put(dynalite, m, ITEM, drop=("sensor_id", "ts"))
    if phase == "cutover":
        copy_all(dynalite, KeyMapper(m), m.table, m)  # the backfill's copy: it lacks them too
    t = shim(m, dynalite, phase)
    # The create-only put must not overwrite the existing item (it did: data lost).
    assert failed(lambda: t.put_item(Item={**ITEM, "val": Decimal(0)}, ConditionExpression=Attr("sensor_id").not_exists()))
    assert t.get_item(Key=KEY, ConsistentRead=True)["Item"] == ITEM
    # Existence and values of key fields, as objects and as text mixed with stored fields.
    out = t.update_item(Key=KEY, UpdateExpression="SET val = :t", ConditionExpression=Attr("ts").exists(),
                        ExpressionAttributeValues={":t": Decimal(22)}, ReturnValues="ALL_OLD")
    assert out["Attributes"] == ITEM
    assert failed(lambda: t.update_item(
        Key=KEY, UpdateExpression="SET val = :t", ConditionExpression="#s = :other AND val = :was",
        ExpressionAttributeNames={"#s": "sensor_id"},
        ExpressionAttributeValues={":t": Decimal(1), ":other": "s-2", ":was": Decimal(22)}))
    out = t.update_item(Key=KEY, UpdateExpression="SET val = :t",
                        ConditionExpression="begins_with(#ts, :day) AND #ts <> val",  # <>: a key field and a stored one
                        ExpressionAttributeNames={"#ts": "ts"},
                        ExpressionAttributeValues={":t": Decimal(23), ":day": "2024-10-27"}, ReturnValues="ALL_NEW")
    assert out["Attributes"] == {**ITEM, "val": Decimal(23)}
    out = t.delete_item(Key=KEY, ConditionExpression=Attr("sensor_id").exists() & Attr("sensor_id").eq("s-1"),
                        ReturnValues="ALL_OLD")
    assert out["Attributes"] == {**ITEM, "val": Decimal(23)}
    assert "Item" not in t.get_item(Key=KEY, ConsistentRead=True)
    # Absent (or a tombstone): the create-only put succeeds, an existence check fails.
    assert failed(lambda: t.delete_item(Key=KEY, ConditionExpression=Attr("sensor_id").exists()))
    t.put_item(Item=ITEM, ConditionExpression=Attr("sensor_id").not_exists())
    assert t.get_item(Key=KEY, ConsistentRead=True)["Item"] == ITEM


@pytest.mark.parametrize("phase", [None, "dual_write"])
def test_a_number_kept_only_in_a_string_key_comes_back_a_number(dynalite, unique_name, phase):
    m = parse(_NUMBERS.format(name=unique_name, table=unique_name))
    local.create_table(dynalite, m.table, m.keys, types={"SK": "N"})
    item = {"customer": Decimal(7), "order": Decimal("1.5"), "qty": Decimal(1)}
    key = {"customer": Decimal(7), "order": Decimal("1.5")}
    raw_put(dynalite, m, item, drop=("customer", "order"))
    t = shim(m, dynalite, phase)
    assert t.get_item(Key=key, ConsistentRead=True)["Item"] == item
    assert type(t.get_item(Key=key, ConsistentRead=True)["Item"]["customer"]) is Decimal
    assert failed(lambda: t.put_item(Item=item, ConditionExpression=Attr("customer").not_exists()))
    assert failed(lambda: t.put_item(Item=item, ConditionExpression=Attr("customer").attribute_type("S")))
    old = t.put_item(Item={**item, "qty": Decimal(2)}, ConditionExpression=Attr("customer").attribute_type("N"),
                     ReturnValues="ALL_OLD")["Attributes"]
    assert old == item and type(old["customer"]) is Decimal
    got = t.batch_get_item(Keys=[key], ConsistentRead=True)["Items"]
    assert got == [{**item, "qty": Decimal(2)}] and type(got[0]["customer"]) is Decimal
