"""The proxy's port of dynalite's item order (reshard/aws/fidelity/ordering.py) against dynalite's own
Scan, segment and GSI order: where a stale page inserts an item, dynalite would have listed it there."""

from __future__ import annotations

import base64
import random

from reshard.aws.fidelity.ordering import create_index_key, create_key, segment_bounds, to_lexi_str
from reshard.aws.local import wait_active


def scan_all(dynamo, table: str, **kw) -> list[dict]:
    """Every item, as on the wire (the client decodes B values to bytes: encoded back here)."""
    out, start = [], None
    while True:
        resp = dynamo.call("scan", TableName=table, **kw, **({"ExclusiveStartKey": start} if start else {}))
        out += [{k: ({"B": base64.b64encode(v["B"]).decode()} if "B" in v else v) for k, v in it.items()}
                for it in resp["Items"]]
        start = resp.get("LastEvaluatedKey")
        if not start:
            return out


def numbers(rng: random.Random, n: int) -> list[str]:
    out = set()
    while len(out) < n:
        digits = str(rng.randrange(1, 10 ** rng.randrange(1, 12)))
        exp = rng.randrange(-20, 20)
        out.add(("-" if rng.random() < 0.4 else "") + digits + f"e{exp}")
    return sorted(out) + ["0"]


def test_scan_and_index_order_are_dynalites(dynalite, unique_name):
    rng = random.Random(29)
    t = unique_name
    dynalite.call("create_table", TableName=t, BillingMode="PAY_PER_REQUEST",
                  KeySchema=[{"AttributeName": "h", "KeyType": "HASH"}, {"AttributeName": "r", "KeyType": "RANGE"}],
                  AttributeDefinitions=[{"AttributeName": "h", "AttributeType": "N"},
                                        {"AttributeName": "r", "AttributeType": "S"},
                                        {"AttributeName": "g", "AttributeType": "B"},
                                        {"AttributeName": "n", "AttributeType": "N"}],
                  GlobalSecondaryIndexes=[{"IndexName": "gidx", "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"},
                                                                             {"AttributeName": "n", "KeyType": "RANGE"}],
                                           "Projection": {"ProjectionType": "KEYS_ONLY"}}])
    wait_active(dynalite, t)
    hashes, sorts = numbers(rng, 12), numbers(rng, 40)
    items = []
    for i in range(160):
        item = {"h": {"N": rng.choice(hashes)}, "r": {"S": rng.choice(["a", "é", "a#1", "zz", "Z", "💡"]) + str(i)},
                "g": {"B": rng.choice(["AA==", "AQI=", "/w==", "AAAB"])}, "n": {"N": rng.choice(sorts)}}
        items.append(item)
    for i in range(0, len(items), 25):
        dynalite.batch_write(t, [{"PutRequest": {"Item": it}} for it in items[i:i + 25]])
    got = scan_all(dynalite, t, Limit=17)
    assert [create_key(it, ["h", "r"]) for it in got] == sorted(create_key(it, ["h", "r"]) for it in got)
    assert len(got) == len(items)
    for seg in range(3):
        part = scan_all(dynalite, t, Segment=seg, TotalSegments=3)
        low, high = segment_bounds(seg, 3)
        keys = [create_key(it, ["h", "r"]) for it in part]
        assert all((low is None or k > low) and k < high for k in keys)
    index = scan_all(dynalite, t, IndexName="gidx", Limit=13)
    keys = [create_index_key(it, ["h", "r"], ["g", "n"]) for it in index]
    assert keys == sorted(keys) and len(keys) == len(items)
    # Query order within one partition: the range key's toRangeStr (numbers by value)
    g = index[0]["g"]
    q = dynalite.call("query", TableName=t, IndexName="gidx", KeyConditionExpression="g = :g",
                      ExpressionAttributeValues={":g": g})["Items"]
    from decimal import Decimal
    assert [Decimal(it["n"]["N"]) for it in q] == sorted(Decimal(it["n"]["N"]) for it in q)
    assert [to_lexi_str(it["n"]) for it in q] == sorted(to_lexi_str(it["n"]) for it in q)
