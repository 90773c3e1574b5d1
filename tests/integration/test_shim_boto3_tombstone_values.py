"""Issue 26 case 6: after a delete (a tombstone), a create-only condition that also compares
values alone (``attribute_not_exists(x) AND :a = :b``) answers as on an absent item (dynalite).

The tombstone stores the key fields; the value-only part used to keep the shim from computing
what the condition means on an absent item, so it was sent as written and refused. Parts over
values alone are now decided client-side (``expr.decide_key_fields``).
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from botocore.exceptions import ClientError

from tests.integration.test_interleavings_shim import create_table, ev, key
from tests.shim_helpers import migration, shim

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("phase", [None, "dual_write", "cutover"])  # steady: a plain delete; else a tombstone
def test_create_only_and_values_after_a_delete(dynalite, unique_name, phase):
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, phase)
    t.put_item(Item=ev(1, n=Decimal(1)))
    t.delete_item(Key=key(1))
    for field in ("sensor_id", "n"):  # a key field (the tombstone stores it) and a stored one
        cond = {"ConditionExpression": "attribute_not_exists(#f) AND :a = :b", "ExpressionAttributeNames": {"#f": field}}
        with pytest.raises(ClientError) as e:
            t.put_item(Item=ev(1, n=Decimal(2)), **cond, ExpressionAttributeValues={":a": "x", ":b": "y"})
        assert e.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
        assert "Item" not in t.get_item(Key=key(1), ConsistentRead=True)
        t.put_item(Item=ev(1, n=Decimal(2)), **cond, ExpressionAttributeValues={":a": "x", ":b": "x"})
        assert t.get_item(Key=key(1), ConsistentRead=True)["Item"] == ev(1, n=Decimal(2))
        t.delete_item(Key=key(1))
