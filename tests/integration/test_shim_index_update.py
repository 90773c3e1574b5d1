"""A shim update that changes what a sharded GSI value is computed from sets that value in the
same UpdateItem (reshard/shim/index.py: ``index_update_plan``, ``index_actions``), on dynalite.

The index here is ``{region}#{shard}`` (the template's logical field ``region``) over
``hash(PK) % 16``, from 4 random shards: an item whose region changed but whose GSI value did
not sits under the old region's partitions, where a query for its new region never looks.
"""

from __future__ import annotations

import pytest
from boto3.dynamodb.conditions import Key

from reshard import errors
from reshard.core.layout import hash_shard
from reshard.core.migration import parse
from tests.index_support import create_gsi_table, gsi_migration
from tests.shim_helpers import shim

KEY = {"PK": "inv-1", "SK": "root"}
REGION = {"#r": "region"}  # a reserved word in DynamoDB


class Stopped(BaseException):
    """The shim process dies here (a BaseException: nothing in the shim catches it)."""


def migration(table: str, shard_by: str = "PK"):
    return parse(gsi_migration("gsi-region", table, shard_by=shard_by, new_partition="{region}#{shard}"))


def stored(dynamo, table) -> dict:
    return dynamo.call("get_item", TableName=table, Key={"PK": {"S": "inv-1"}, "SK": {"S": "root"}},
                       ConsistentRead=True)["Item"]


def found(t, region: str) -> list[str]:
    got = t.query(IndexName="ByCountry", KeyConditionExpression=Key("tx_country").eq("USA") & Key("region").eq(region))
    return [i["PK"] for i in got["Items"]]


def die_after_the_update(monkeypatch, dynamo) -> list[str]:
    """Every request of ``dynamo`` after its first UpdateItem is stopped: the shim dies (or
    freezes past its liveness and fails closed) between the update and anything later."""
    real = dynamo.call
    sent: list[str] = []

    def call(op, *args, **kwargs):
        if "update_item" in sent:
            raise Stopped(op)
        sent.append(op)
        return real(op, *args, **kwargs)
    monkeypatch.setattr(dynamo, "call", call)
    return sent


@pytest.mark.parametrize("phase", ["dual_read", "dual_write"])
def test_an_update_of_the_template_field_moves_the_item_in_the_same_request(dynalite, unique_name, monkeypatch,
                                                                          phase):
    """The shim is stopped right after the update lands. The item must be found under its new
    region, and not under the old one. On the two-request version (main before this change:
    the update, then ``SET gsi_shard`` from its result) the item stays at ``EU#h`` with region
    US: a query for US misses it, one for EU returns it (this test fails there)."""
    create_gsi_table(dynalite, unique_name, partition_type="S")
    m = migration(unique_name)
    writer = shim(m, dynalite, phase="dual_read")
    writer.put_item(Item={**KEY, "tx_country": "USA", "region": "EU", "gsi_shard": "0"})
    assert stored(dynalite, unique_name)["gsi_shard"] == {"S": f"EU#{hash_shard('inv-1', 16)}"}
    writer._pin_phase(phase)
    sent = die_after_the_update(monkeypatch, dynalite)
    try:
        writer.update_item(Key=KEY, UpdateExpression="SET #r = :r", ExpressionAttributeNames={"#r": "region"},
                           ExpressionAttributeValues={":r": "US"})
    except Stopped:
        pass
    monkeypatch.undo()
    assert "update_item" in sent and stored(dynalite, unique_name)["region"] == {"S": "US"}
    reader = shim(m, dynalite, phase=phase, query_workers=1)
    assert found(reader, "US") == ["inv-1"]
    assert found(reader, "EU") == []
    # dual_read writes the new value; dual_write the old one (random: the item's own pick).
    want = {"S": f"US#{hash_shard('inv-1', 16)}"} if phase == "dual_read" else None
    assert want is None or stored(dynalite, unique_name)["gsi_shard"] == want
    assert sent == ["get_item", "update_item"]  # the membership read, then the one update


def test_a_field_read_first_and_changed_before_the_update_is_read_again(dynalite, unique_name, monkeypatch):
    """``shard_by = customer``: an update of ``region`` reads ``customer`` first. Another writer
    changes ``customer`` between that read and the update: the update's condition (fields as
    read) fails, the shim reads again and sets the value of the new customer; without the
    condition the item would sit at the old customer's shard (found by no query for it)."""
    create_gsi_table(dynalite, unique_name, partition_type="S")
    m = migration(unique_name, shard_by="customer")
    a, b = shim(m, dynalite, phase="dual_read"), shim(m, dynalite, phase="dual_read")
    a.put_item(Item={**KEY, "tx_country": "USA", "region": "EU", "customer": "c-1", "gsi_shard": "0"})
    real = a._read_for_index
    raced = []

    def read(key, plan):
        got = real(key, plan)
        if not raced:
            raced.append(b.update_item(Key=KEY, UpdateExpression="SET customer = :c",
                                       ExpressionAttributeValues={":c": "c-2"}))
        return got
    monkeypatch.setattr(a, "_read_for_index", read)

    def dies(*args):
        raise Stopped("the follow-up")  # a dies right after its update: no follow-up repairs a stale value
    monkeypatch.setattr(a, "_fix_index_values", dies)
    with pytest.raises(Stopped):
        a.update_item(Key=KEY, UpdateExpression="SET #r = :r", ExpressionAttributeValues={":r": "US"},
                      ExpressionAttributeNames=REGION, ConditionExpression="attribute_exists(PK)")
    monkeypatch.undo()
    item = stored(dynalite, unique_name)
    assert (item["region"], item["customer"]) == ({"S": "US"}, {"S": "c-2"})
    assert item["gsi_shard"] == {"S": f"US#{hash_shard('c-2', 16)}"}
    # The app's own condition still fails as the app's (no retry loop hides it).
    with pytest.raises(errors.ConditionalCheckFailed):
        a.update_item(Key=KEY, UpdateExpression="SET #r = :r", ExpressionAttributeValues={":r": "FR"},
                      ExpressionAttributeNames=REGION, ConditionExpression="attribute_not_exists(PK)")
    assert stored(dynalite, unique_name)["region"] == {"S": "US"}


def test_updates_the_shim_cannot_evaluate_beforehand_are_refused(dynalite, unique_name):
    create_gsi_table(dynalite, unique_name, partition_type="S")
    m = migration(unique_name, shard_by="customer")
    t = shim(m, dynalite, phase="dual_read")
    t.put_item(Item={**KEY, "tx_country": "USA", "region": "EU", "customer": "c-1", "gsi_shard": "0"})
    for expression, values in (("SET #r = if_not_exists(#r, :r)", {":r": "US"}),
                               ("ADD customer :n", {":n": 1}),
                               ("SET customer = list_append(customer, :l)", {":l": ["x"]})):
        with pytest.raises(errors.BadInput, match="write '(region|customer)' with a literal value") as e:
            t.update_item(Key=KEY, UpdateExpression=expression, ExpressionAttributeValues=values,
                          **({"ExpressionAttributeNames": REGION} if "#r" in expression else {}))
        assert e.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(errors.BadInput, match="removes 'customer'.*or REMOVE gsi_shard too"):
        t.update_item(Key=KEY, UpdateExpression="REMOVE customer")  # still in the index: no value without it
    t.update_item(Key=KEY, UpdateExpression="REMOVE customer, gsi_shard")  # leaves the index: fine
    item = stored(dynalite, unique_name)
    assert "customer" not in item and "gsi_shard" not in item and item["region"] == {"S": "EU"}
    # The application's own value of the GSI attribute is replaced by the layout's, in the request.
    t.update_item(Key=KEY, UpdateExpression="SET customer = :c, gsi_shard = :g",
                  ExpressionAttributeValues={":c": "c-3", ":g": "9"})
    assert stored(dynalite, unique_name)["gsi_shard"] == {"S": f"EU#{hash_shard('c-3', 16)}"}
