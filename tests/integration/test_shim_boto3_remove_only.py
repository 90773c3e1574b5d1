"""Issue 26 (found by the differential fuzzer, ``gsi_remove_only``): an update with no
``ExpressionAttributeValues`` -- a REMOVE-only update -- on a table whose keys the shim keeps as
they are (an index-only migration) in a phase that stamps nothing had no value of its own to
send, and the shim sent an empty ``ExpressionAttributeValues``: DynamoDB's ValidationException.
boto3's Table sends none and the update applies."""

from __future__ import annotations

import pytest

from reshard.core.migration import parse
from tests.index_support import create_gsi_table, gsi_migration
from tests.shim_helpers import shim

pytestmark = pytest.mark.integration

KEY = {"PK": "inv-1", "SK": "root"}


@pytest.mark.parametrize("phase", [None, "dual_write", "cleanup"])
def test_a_remove_only_update_applies_as_boto3s(dynalite, unique_name, phase):
    create_gsi_table(dynalite, unique_name)
    t = shim(parse(gsi_migration("remove-only", unique_name)), dynalite, phase)
    t.put_item(Item={**KEY, "note": "x", "amount": 5})
    out = t.update_item(Key=KEY, UpdateExpression="REMOVE note", ReturnValues="ALL_NEW")
    assert out["Attributes"] == {**KEY, "amount": 5}
    t.update_item(Key=KEY, UpdateExpression="REMOVE #a", ExpressionAttributeNames={"#a": "amount"})
    assert t.get_item(Key=KEY, ConsistentRead=True)["Item"] == KEY
