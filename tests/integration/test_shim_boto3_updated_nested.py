"""Issue 26 case 3: ``ReturnValues="UPDATED_NEW"``/``"UPDATED_OLD"`` of an update of nested paths
return those paths only (``SET m.b.c = :v`` -> ``{"m": {"b": {"c": v}}}``), also when the item's
key moves between the layouts (the shim then asks DynamoDB for the whole new item: the mirror
needs it) (dynalite)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from reshard.aws.dynamo import to_wire
from reshard.core.layout import KeyMapper
from tests.integration.test_interleavings_shim import create_table, ev, key
from tests.shim_helpers import migration, shim

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("phase", [None, "dual_write", "cutover"])
def test_updated_values_of_nested_paths(dynalite, unique_name, phase):
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    mapper = KeyMapper(m)
    k = next(k for k in range(1, 50)  # an item whose key moves: the write has a mirror
             if mapper.old.key(mapper.logical_fields(to_wire(ev(k)))) != mapper.new.key(mapper.logical_fields(to_wire(ev(k)))))
    t = shim(m, dynalite, phase)
    t.put_item(Item=ev(k, m={"b": {"c": Decimal(1), "d": "x"}, "z": "p"}, l=["x", Decimal(1)], n=Decimal(5)))
    update = {"UpdateExpression": "SET m.b.c = :v, l[1] = :w ADD n :one REMOVE m.z",
              "ExpressionAttributeValues": {":v": Decimal(2), ":w": "y", ":one": 1}}
    new = t.update_item(Key=key(k), **update, ReturnValues="UPDATED_NEW")["Attributes"]
    assert new == {"m": {"b": {"c": Decimal(2)}}, "l": ["y"], "n": Decimal(6)}
    old = t.update_item(Key=key(k), **{**update, "ExpressionAttributeValues": {":v": Decimal(3), ":w": "z", ":one": 1}},
                        ReturnValues="UPDATED_OLD")["Attributes"]
    assert old == {"m": {"b": {"c": Decimal(2)}}, "l": ["y"], "n": Decimal(6)}
    assert t.get_item(Key=key(k), ConsistentRead=True)["Item"] == ev(
        k, m={"b": {"c": Decimal(3), "d": "x"}}, l=["x", "z"], n=Decimal(7))
