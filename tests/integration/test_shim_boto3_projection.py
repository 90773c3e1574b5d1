"""Issue 26, case 4: ``get_item(ProjectionExpression=..., ExpressionAttributeNames=...)`` (it
raised TypeError) answers as boto3's Table: the projected paths of the logical item -- key
fields parsed from the keys included (the hourly layout stores neither ``sensor_id`` nor
``ts``) --, ``{"Item": {}}`` when none is there, no ``Item`` when the item is absent, and
DynamoDB's ValidationException for a name the projection does not use."""

from __future__ import annotations

from decimal import Decimal

import pytest
from botocore.exceptions import ClientError

from tests.integration.test_interleavings_shim import create_table, ev
from tests.shim_helpers import migration, shim

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name,phase", [("sensor", None), ("sensor", "dual_read"), ("hourly", "cutover")])
def test_get_item_projects_the_logical_item(dynalite, unique_name, name, phase):
    m = migration(name, table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, phase)
    t.put_item(Item=ev(1, n=1, m={"b": {"c": 2, "d": "x"}}))
    k1, k2 = ({f: ev(i)[f] for f in t.mapper.key_fields} for i in (1, 2))
    got = t.get_item(Key=k1, ConsistentRead=True, ProjectionExpression="#m.b.c, ts, n",
                     ExpressionAttributeNames={"#m": "m"})
    assert got["Item"] == {"m": {"b": {"c": Decimal(2)}}, "ts": ev(1)["ts"], "n": Decimal(1)}
    assert "ResponseMetadata" in got
    assert t.get_item(Key=k1, ProjectionExpression="nothing_here")["Item"] == {}
    assert "Item" not in t.get_item(Key=k2, ProjectionExpression="n")
    for kw in ({"ProjectionExpression": "n", "ExpressionAttributeNames": {"#x": "x"}},
               {"ExpressionAttributeNames": {"#x": "x"}}):
        with pytest.raises(ClientError) as e:
            t.get_item(Key=k1, **kw)
        assert e.value.response["Error"]["Code"] == "ValidationException"
