"""Issue 26, case 7: a query's ``FilterExpression`` on a key field is refused as DynamoDB refuses
it for boto3's Table (``ValidationException``: "Filter Expression can only contain non-primary
key attributes"). The key is the app's logical one: the fields the key templates are made of
(``sensor_id``, ``ts``; the hourly layout's derived ``bucket`` stands for ``ts``), not a
``shard_by``-only field such as ``event_id``, which the logical item stores as any attribute."""

from __future__ import annotations

import pytest
from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from tests.integration.test_interleavings_shim import create_table, ev
from tests.shim_helpers import migration, shim

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["sensor", "hourly"])
def test_a_query_filter_on_a_key_field_is_refused(dynalite, unique_name, name):
    m = migration(name, table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, "dual_read")
    t.put_item(Item=ev(1, n=1))
    kce = Key("sensor_id").eq("s-1") & Key("ts").eq(ev(1)["ts"])  # the hourly layout needs ts pinned
    for filt in (Attr("ts").exists(), Attr("n").eq(1) | Attr("sensor_id").begins_with("s"),
                 {"FilterExpression": "#t > :t", "ExpressionAttributeNames": {"#t": "ts"},
                  "ExpressionAttributeValues": {":t": "2024"}}):
        kw = filt if isinstance(filt, dict) else {"FilterExpression": filt}
        with pytest.raises(ClientError) as e:
            t.query(KeyConditionExpression=kce, **kw)
        assert e.value.response["Error"]["Code"] == "ValidationException"
        assert "non-primary key attributes" in e.value.response["Error"]["Message"]
    # Not key fields of the logical table: filtered by the shim, as any attribute.
    assert t.query(KeyConditionExpression=kce, FilterExpression=Attr("event_id").eq("e-1") & Attr("n").eq(1))[
        "Count"] == 1
    # A scan may filter on anything, key fields included (DynamoDB's rule is the query's).
    assert t.scan(FilterExpression=Attr("ts").exists())["Count"] == 1
