"""A ``_rs_v`` written by a plain client (issue 30, case 2), on dynalite (moto fails a condition
comparing a number with a string with an internal error instead of a false condition)."""

from __future__ import annotations

from decimal import Decimal

import botocore.exceptions
import pytest

from reshard import errors
from reshard.core.layout import KeyMapper
from tests.functional.test_shim import event, key_of
from tests.shim_helpers import create_table, migration, shim

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("forged", [{"S": "9999999999999.999999.zz"}, {"N": "1795000000000"},
                                    {"S": "9999999999999.000000.bad.writer"}, {"S": "9" * 5000},
                                    {"L": [{"S": "9999999999999.000000.zz"}]}],
                         ids=["the-issues", "a-number", "a-bad-writer", "overlong", "a-list"])
def test_a_forged_version_is_refused_for_its_item_and_poisons_nothing_else(dynalite, unique_name, forged):
    """Issue 30, case 2: a plain client writes ``_rs_v`` on one item (any value). The shim's
    fenced write of that item loses, reads the stored version, and refuses the item with a
    ValidationException naming it and the value (it once adopted "9999999999999.999999.zz":
    the clock overflowed to a 14-digit version sorting below every real one and every later
    fenced write of *other* items failed; a number raised a bare KeyError). The clock never
    moved: the other items are written as before, and the item is writable again once the
    attribute is removed."""
    sensor = migration("sensor", unique_name)
    create_table(dynalite, sensor)
    t = shim(sensor, dynalite, "backfill")
    mapper = KeyMapper(sensor)
    other, victim = event(1, v=Decimal(1)), event(2, v=Decimal(1))
    t.put_item(Item=other)
    t.put_item(Item=victim)
    old_key = mapper.old.key(mapper.logical_fields(victim))
    dynalite.call("update_item", TableName=sensor.table, Key=old_key, UpdateExpression="SET #v = :v",
                     ExpressionAttributeNames={"#v": "_rs_v"}, ExpressionAttributeValues={":v": forged})
    for write in (lambda: t.put_item(Item={**victim, "v": Decimal(2)}),
                  lambda: t.update_item(Key=key_of(victim), UpdateExpression="SET v = :v",
                                        ExpressionAttributeValues={":v": Decimal(3)})):
        with pytest.raises(botocore.exceptions.ClientError) as e:
            write()
        assert e.value.response["Error"]["Code"] == "ValidationException"
        assert "_rs_v" in str(e.value) and "s-1#" in str(e.value) and "\n" not in str(e.value)
        assert isinstance(e.value, errors.BadVersion) or isinstance(e.value.__cause__, errors.BadVersion)
    assert t.versions.next() < "2"  # still this era's milliseconds: nothing was adopted
    t.update_item(Key=key_of(other), UpdateExpression="SET v = :v", ExpressionAttributeValues={":v": Decimal(5)})
    assert t.get_item(Key=key_of(other), ConsistentRead=True)["Item"]["v"] == 5
    assert t.get_item(Key=key_of(victim), ConsistentRead=True)["Item"]["v"] == 1  # reads never raise
    dynalite.call("update_item", TableName=sensor.table, Key=old_key, UpdateExpression="REMOVE #v",
                     ExpressionAttributeNames={"#v": "_rs_v"})
    t.put_item(Item={**victim, "v": Decimal(4)})
    assert t.get_item(Key=key_of(victim), ConsistentRead=True)["Item"]["v"] == 4
