"""The benchmarks' null data server (benchmarks/_null_server.py) in front of dynalite: its
Scan yields every item of the snapshot exactly once over segments and pages, its writes are
counted (and the conditional ones) but stored nowhere, and what it does not serve is
forwarded to dynalite and answered from there."""

from __future__ import annotations

import boto3
import pytest

from benchmarks._null_server import NullServer
from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.aws.local import create_table
from reshard.core.migration import Keys


def _item(i: int) -> dict:
    return {"pk": {"S": f"p{i % 5}"}, "sk": {"S": f"s{i:03d}"}, "n": {"N": str(i)}, "b": {"B": bytes([i % 256, 0])}}


def _scan_all(dynamo: Dynamo, table: str, segments: int, limit: int) -> tuple[list, int]:
    seen, pages = [], 0
    for seg in range(segments):
        kw = {"TableName": table, "Segment": seg, "TotalSegments": segments, "Limit": limit,
              "ReturnConsumedCapacity": "TOTAL"}
        while True:
            page = dynamo.call("scan", **kw)
            pages += 1
            assert pages < 100, "the scan does not end"  # bounded, whatever the server answers
            assert len(page["Items"]) <= limit and page["Count"] == len(page["Items"])
            assert page["ConsumedCapacity"]["TableName"] == table and page["ConsumedCapacity"]["CapacityUnits"] > 0
            seen += [(it["pk"]["S"], it["sk"]["S"], it["b"]["B"]) for it in page["Items"]]
            if not page.get("LastEvaluatedKey"):
                break
            kw["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return seen, pages


def test_null_server_scans_counts_and_forwards(dynalite, dynalite_server, unique_name):
    table = unique_name
    create_table(dynalite, table, Keys("pk", "sk"))
    dynalite.batch_write(table, [{"PutRequest": {"Item": _item(i)}} for i in range(47)])
    expected = sorted((f"p{i % 5}", f"s{i:03d}", bytes([i % 256, 0])) for i in range(47))

    with NullServer(dynalite_server.endpoint) as null:
        assert null.snapshot(table) == 47
        client = Dynamo(endpoint_url=null.endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=2),
                        connect_timeout=2, read_timeout=5)
        before = null.stats()

        # Every item exactly once over 3 segments of 6-item pages (binary values as botocore returns them).
        seen, pages = _scan_all(client, table, segments=3, limit=6)
        assert sorted(seen) == expected and pages >= 47 // 6

        # A key from another segment is refused, not silently restarted.
        first = client.call("scan", TableName=table, Segment=0, TotalSegments=3, Limit=1)
        with pytest.raises(errors.AWSError):
            client.call("scan", TableName=table, Segment=2, TotalSegments=3, Limit=1,
                        ExclusiveStartKey=first["LastEvaluatedKey"])

        # Writes: answered, counted (conditional ones too), never stored.
        new = {"pk": {"S": "new"}, "sk": {"S": "x"}}
        assert client.call("put_item", TableName=table, Item=new, ConditionExpression="attribute_not_exists(pk)",
                           ReturnConsumedCapacity="TOTAL")["ConsumedCapacity"]["CapacityUnits"] == 1.0
        client.call("delete_item", TableName=table, Key={"pk": {"S": "p0"}, "sk": {"S": "s000"}},
                    ConditionExpression="attribute_exists(pk)")
        plain = boto3.client("dynamodb", endpoint_url=null.endpoint, region_name="us-east-1")
        plain.update_item(TableName=table, Key={"pk": {"S": "p1"}, "sk": {"S": "s001"}},
                          UpdateExpression="SET ttl_at = :t", ExpressionAttributeValues={":t": {"N": "1"}})
        plain.batch_write_item(RequestItems={table: [{"PutRequest": {"Item": _item(100 + i)}} for i in range(3)]})

        # Forwarded: reads of the table and DescribeTable are dynalite's, which holds none of those writes.
        assert "Item" not in plain.get_item(TableName=table, Key=new)
        assert plain.get_item(TableName=table, Key={"pk": {"S": "p0"}, "sk": {"S": "s000"}})["Item"]["n"] == {"N": "0"}
        assert client.describe_table(table)["KeySchema"][0]["AttributeName"] == "pk"
        # A Scan it does not implement (a filter) is dynalite's too, and counted as such.
        assert client.call("scan", TableName=table, FilterExpression="n = :n",
                           ExpressionAttributeValues={":n": {"N": "3"}})["Count"] == 1

        got = null.delta(before)
        assert got["writes"] == {"PutItem": 1, "UpdateItem": 1, "DeleteItem": 1}
        assert got["conditional"] == 2 and got["batch_write_items"] == 3
        assert got["scans"] == pages + 2  # and the refused one
        assert got["forwarded_data"] == {"getitem": 2, "describetable": 1, "scan": 1}
        assert got["forwarded"] == {"getitem": 2, "describetable": 1, "scan": 1}
        assert got["cpu_seconds"] > 0
