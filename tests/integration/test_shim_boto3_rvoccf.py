"""Issue 26, case 4: ``ReturnValuesOnConditionCheckFailure`` on put/update/delete (it raised
TypeError). A failed condition's ``ClientError`` carries the logical item it failed on in
``e.response["Item"]``, in the wire form boto3's Table leaves it there -- none for an absent
item or a tombstone (the absent item it stands for) -- in the steady state, the phases that
mirror and tombstone, and cleanup. On DynamoDB (moto here) the authoritative request asks for
it and no read is added; dynalite ignores the parameter, and the shim reads the item once."""

from __future__ import annotations

import pytest
from boto3.dynamodb.conditions import Attr
from botocore.exceptions import ClientError

from tests.integration.test_interleavings_shim import create_table, ev, key
from tests.shim_helpers import migration, shim


def wire(item: dict) -> dict:
    return {k: ({"N": str(v)} if isinstance(v, int) else {"S": v}) for k, v in item.items()}


def failed(call) -> ClientError:
    with pytest.raises(ClientError) as e:
        call()
    assert e.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    return e.value


def check(t) -> None:
    t.put_item(Item=ev(1, n=1))
    on = {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
    e = failed(lambda: t.put_item(Item=ev(1, n=2), ConditionExpression=Attr("n").eq(5), **on))
    assert e.response["Item"] == wire(ev(1, n=1))
    e = failed(lambda: t.update_item(Key=key(1), UpdateExpression="SET n = :n", ExpressionAttributeValues={":n": 3},
                                     ConditionExpression="attribute_not_exists(event_id)", **on))
    assert e.response["Item"] == wire(ev(1, n=1))
    e = failed(lambda: t.delete_item(Key=key(1), ConditionExpression=Attr("n").gt(1), **on))
    assert e.response["Item"] == wire(ev(1, n=1))
    e = failed(lambda: t.put_item(Item=ev(1, n=2), ConditionExpression=Attr("n").eq(5),
                                  ReturnValuesOnConditionCheckFailure="NONE"))
    assert "Item" not in e.response
    t.delete_item(Key=key(1))  # a tombstone in the fenced phases: the absent item
    for call in (lambda: t.put_item(Item=ev(1), ConditionExpression=Attr("n").exists(), **on),
                 lambda: t.delete_item(Key=key(1), ConditionExpression=Attr("n").exists(), **on),
                 lambda: t.update_item(Key=key(1), UpdateExpression="SET n = :n", ExpressionAttributeValues={":n": 3},
                                       ConditionExpression=Attr("event_id").exists(), **on)):
        assert "Item" not in failed(call).response
    with pytest.raises(ClientError) as bad:
        t.put_item(Item=ev(1), ReturnValuesOnConditionCheckFailure="ALL_NEW")
    assert bad.value.response["Error"]["Code"] == "ValidationException"


@pytest.mark.integration
@pytest.mark.parametrize("phase", [None, "dual_write", "cutover", "cleanup"])
def test_a_failed_condition_carries_the_logical_item_on_dynalite(dynalite, unique_name, phase):
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    check(shim(m, dynalite, phase))


@pytest.mark.functional
@pytest.mark.parametrize("phase", [None, "cutover"])
def test_the_item_comes_with_the_failure_itself_where_the_server_sends_it(moto_dynamo, phase):
    """moto sends ``Item`` as DynamoDB does: the shim reads nothing more (no GetItem of the key)."""
    m = migration("sensor", table="rvoccf")
    create_table(moto_dynamo, m)
    t = shim(m, moto_dynamo, phase)
    t.put_item(Item=ev(1, n=1))
    real, sent = moto_dynamo.call, []
    moto_dynamo.call = lambda op, *a, **kw: (sent.append(op), real(op, *a, **kw))[1]
    e = failed(lambda: t.put_item(Item=ev(1, n=2), ConditionExpression=Attr("n").eq(5),
                                  ReturnValuesOnConditionCheckFailure="ALL_OLD"))
    assert e.response["Item"] == wire(ev(1, n=1))
    # cutover: the fence's own consistent read tells a lost fence from the app's condition.
    assert sent == (["put_item"] if phase is None else ["put_item", "get_item"])
