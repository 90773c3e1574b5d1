"""The model checker on a sharded GSI: a shim update of the field the GSI value is computed from,
by a shim that may die at any of its requests.

The index is ``{region}#{shard}`` (new layout, 4 shards over ``hash(PK)``; old: 2 random
shards). W, a ``dual_read`` shim (it writes new values), changes one invoice's region EU -> US
and may be killed before any request. Whatever W got done, a query for the region the item
*holds* must return it, and a query for the other region must not: an item whose region changed
while its GSI value did not sits under the old region's partitions, where no query for its
region looks.

The mutation is the two-request update (main before this change): the update, then a
follow-up ``SET gsi_shard`` computed from its result. Killing W between the two leaves the
item under ``EU#..`` with region US.
"""

from __future__ import annotations

from boto3.dynamodb.conditions import Key

from reshard.core.index import NEW, IndexMapper
from reshard.core.migration import parse
from reshard.shim.table import ShardedTable
from tests.index_support import create_gsi_table, gsi_migration
from tests.model.explore import World, explore

TABLE = "Invoices"
MIGRATION = gsi_migration("gsi-region", TABLE, old_shards=2, new_shards=4, shard_by="PK",
                          new_partition="{region}#{shard}")
PK = "InvoiceNumber#1"


def shim(w: World, m, name: str) -> ShardedTable:
    t = ShardedTable(m, w.dynamo, control_table=None, writer_id=name, query_workers=1, clock=w.clock)
    t._pin_phase("dual_read")
    return t


CUSTOMER = gsi_migration("gsi-region", TABLE, old_shards=2, new_shards=4, shard_by="customer",
                         new_partition="{region}#{shard}")


def region_update(text: str = MIGRATION, racer: bool = False):
    """W changes the region (and may die); with ``racer``, V (another shim) changes the customer
    at the same time: with ``shard_by = customer`` W reads the customer first and V the region,
    each updates conditioned on what it read."""
    def factory(w: World):
        m = parse(text, "<gsi>")
        im = IndexMapper(m.indexes[0])
        create_gsi_table(w.dynamo, TABLE, partition_type="S")
        item = {"PK": {"S": PK}, "SK": {"S": "root"}, "tx_country": {"S": "USA"}, "region": {"S": "EU"},
                "customer": {"S": "c-1"}}
        item["gsi_shard"] = im.value(im.fields(item, NEW), NEW)
        w.dynamo.call("put_item", TableName=TABLE, Item=item)
        wt = shim(w, m, "writer")
        w.actor("W", lambda: wt.update_item(Key={"PK": PK, "SK": "root"}, UpdateExpression="SET #r = :r",
                                            ExpressionAttributeNames={"#r": "region"},
                                            ExpressionAttributeValues={":r": "US"}))
        w.may_kill("W")
        if racer:
            vt = shim(w, m, "racer")
            w.actor("V", lambda: vt.update_item(Key={"PK": PK, "SK": "root"}, UpdateExpression="SET customer = :c",
                                                ExpressionAttributeValues={":c": "c-2"}))

        def check(w: World):
            stored = next(i for i in w.db.items(TABLE) if i["PK"]["S"] == PK)
            holds, customer = stored["region"]["S"], stored["customer"]["S"]
            reader = shim(w, m, "reader")

            def found(region: str) -> bool:
                cond = Key("tx_country").eq("USA") & Key("region").eq(region)
                if "customer" in text:
                    cond = cond & Key("customer").eq(customer)  # one partition value per layout
                got = reader.query(IndexName="ByCountry", KeyConditionExpression=cond)
                return [i["PK"] for i in got["Items"]] == [PK]
            other = "EU" if holds == "US" else "US"
            assert found(holds), f"invariant: the item (region {holds}, customer {customer}, " \
                                 f"{stored['gsi_shard']}) is missed by a query for it"
            assert not found(other), f"invariant: the item (region {holds}) is returned for region {other}"
        return check
    return factory


def test_a_dying_shim_never_leaves_an_item_under_its_old_region():
    r = explore(region_update())
    r.assert_ok()
    assert r.schedules >= 3, r  # killed before its read, before its update, or not at all


def test_a_dying_shim_racing_a_write_of_a_field_it_read():
    r = explore(region_update(CUSTOMER, racer=True))
    r.assert_ok()
    assert r.schedules > 10, r


def must_find(factory) -> str:
    r = explore(factory)
    assert r.violation is not None, f"the checker found nothing without the fence ({r.schedules} schedules)"
    assert "invariant: the item" in r.violation.message, r.violation.report()[:3000]
    return r.violation.message


def test_with_the_two_request_update(monkeypatch):
    """The update of ``region`` without the GSI value (the follow-up sets it afterwards)."""
    import reshard.shim.writes as writes
    monkeypatch.setattr(writes, "index_update_plan", lambda *args: None)
    assert "(region US" in must_find(region_update())


def test_without_the_condition_on_the_fields_read(monkeypatch):
    """W's update not conditioned on the customer it read: V's customer lands between W's read
    and W's update, W sets the value of the old customer, and dies before its follow-up."""
    import reshard.shim.writes as writes
    real = writes.index_actions

    def unconditioned(*args, **kwargs):
        sets, names, values, cond, overrides = real(*args, **kwargs)
        if cond:  # placeholders kept (DynamoDB refuses unused ones), the condition always true
            cond = f"({cond}) OR attribute_exists(PK) OR attribute_not_exists(PK)"
        return sets, names, values, cond, overrides
    monkeypatch.setattr(writes, "index_actions", unconditioned)
    must_find(region_update(CUSTOMER, racer=True))
