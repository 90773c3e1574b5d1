"""Issue 26, case 5: ``batch_writer()`` with two requests for one key in one batch is refused as
boto3's Table is refused by DynamoDB -- ``ValidationException`` "Provided list of item keys
contains duplicates", none of that batch written -- in the phases that send a BatchWriteItem
(steady) and in those that send each write on its own, fenced (dual_write, cutover).
``overwrite_by_pkeys`` (the logical key fields) keeps the last request, as boto3's does."""

from __future__ import annotations

from decimal import Decimal

import pytest
from botocore.exceptions import ClientError

from tests.integration.test_interleavings_shim import create_table, ev, key
from tests.shim_helpers import migration, shim

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("phase", [None, "dual_write", "cutover"])
def test_two_requests_for_one_key_in_one_batch_are_refused(dynalite, unique_name, phase):
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, phase)
    for second in (lambda b: b.put_item(Item=ev(1, n=2)), lambda b: b.delete_item(Key=key(1))):
        with pytest.raises(ClientError) as e:
            with t.batch_writer() as b:
                b.put_item(Item=ev(2))
                b.put_item(Item=ev(1, n=1))
                second(b)
        assert e.value.response["Error"]["Code"] == "ValidationException"
        assert "contains duplicates" in e.value.response["Error"]["Message"]
        assert "overwrite_by_pkeys" in e.value.response["Error"]["Message"]
        for k in (1, 2):  # nothing of the refused batch was written
            assert "Item" not in t.get_item(Key=key(k), ConsistentRead=True)
    with t.batch_writer(overwrite_by_pkeys=["sensor_id", "event_id", "ts"]) as b:
        b.put_item(Item=ev(1, n=1))
        b.put_item(Item=ev(1, n=2))
    assert t.get_item(Key=key(1), ConsistentRead=True)["Item"] == ev(1, n=Decimal(2))
