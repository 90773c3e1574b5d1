"""``reshard plan`` on a real server process (dynalite): full parallel scan, real wire path."""

from __future__ import annotations

import hashlib
import json
import pathlib

from reshard.aws.local import wait_active
from reshard.cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sha(s: str) -> int:
    return int(hashlib.sha256(s.encode()).hexdigest(), 16)


def test_plan_full_scan_on_dynalite(dynalite, dynalite_server, unique_name, tmp_path, capsys):
    text = (ROOT / "migrations" / "0001_sensor_events.toml").read_text()
    path = tmp_path / "sensor.toml"
    path.write_text(text.replace('table = "SensorEvents"', f'table = "{unique_name}"'))
    dynalite.call("create_table", TableName=unique_name, BillingMode="PAY_PER_REQUEST",
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                             {"AttributeName": "SK", "KeyType": "RANGE"}],
                  AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                                        {"AttributeName": "SK", "AttributeType": "S"}])
    wait_active(dynalite, unique_name)
    events = [f"evt-{i:04d}" for i in range(600)]
    items = [{"PK": {"S": f"sensor-{i % 9}#{sha(e) % 16}"}, "SK": {"S": f"2024-10-27T15:00:00.{i:06d}Z"},
              "sensor_id": {"S": f"sensor-{i % 9}"}, "event_id": {"S": e}, "temp": {"N": "21.5"}}
             for i, e in enumerate(events)]
    items.append({"PK": {"S": "sensor-x"}, "SK": {"S": "t"}, "event_id": {"S": "x"}})
    dynalite.batch_write(unique_name, [{"PutRequest": {"Item": i}} for i in items])

    rc = main(["--endpoint-url", dynalite_server.endpoint, "plan", str(path), "--sample", "0",
               "--segments", "4", "--max-wcu", "100", "--output", "json"])
    out, err = capsys.readouterr()
    assert rc == 1, err  # the one unmappable item: start would refuse it without an allowance
    r = json.loads(out)
    assert len(r["start_refuses"]) == 1 and "would refuse" in err
    moved = sum(1 for e in events if sha(e) % 32 != sha(e) % 16)
    assert r["sample"] == {"requested": 0, "full_scan": True, "segments": 4, "scanned": 601, "scale": 1}
    assert (r["items"]["mappable"], r["items"]["unmappable"], r["items"]["moves"]) == (600, 1, moved)
    assert r["distribution"]["new"]["counts"] == [sum(1 for e in events if sha(e) % 32 == s) for s in range(32)]
    assert r["capacity"]["backfill"]["wcu"] == moved
    assert r["table"]["ttl"]["status"] == "DISABLED"
    assert r["next"][0].startswith(f"reshard --endpoint-url {dynalite_server.endpoint} start ")


def test_capacity_model_matches_dynalite_consumed_capacity(dynalite, unique_name):
    """The unit rules the plan uses agree with what a real server charges (dynalite is exact)."""
    from reshard.core import capacity
    from reshard.core.layout import item_size

    dynalite.call("create_table", TableName=unique_name, BillingMode="PAY_PER_REQUEST",
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
                  AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                                        {"AttributeName": "SK", "AttributeType": "S"}])
    wait_active(dynalite, unique_name)  # dynalite answers CreateTable while CREATING (flaked under load)
    items = [{"PK": {"S": f"s-{i % 7}#{i % 16}"}, "SK": {"S": f"t{i:05d}"}, "n": {"N": str(i * 37)},
              "blob": {"S": "x" * (i * 53 % 5000)}} for i in range(150)]
    writes = sum(dynalite.call("put_item", TableName=unique_name, Item=i, ReturnConsumedCapacity="TOTAL")
                 ["ConsumedCapacity"]["CapacityUnits"] for i in items)
    assert writes == sum(capacity.write_units(item_size(i)) for i in items)
    assert max(capacity.write_units(item_size(i)) for i in items) == 5  # sizes span 1..5 WCU

    keys = [{"PK": i["PK"], "SK": i["SK"]} for i in items[:100]]
    resp = dynalite.call("batch_get_item", RequestItems={unique_name: {"Keys": keys, "ConsistentRead": True}},
                         ReturnConsumedCapacity="TOTAL")
    assert resp["ConsumedCapacity"][0]["CapacityUnits"] == sum(capacity.read_units(item_size(i)) for i in items[:100])

    scanned, kwargs = 0.0, {"TableName": unique_name, "ReturnConsumedCapacity": "TOTAL", "Limit": 1000}
    for _ in range(100):  # bounded: 150 items fit a few 1 MB pages
        page = dynalite.call("scan", **kwargs)
        scanned += page["ConsumedCapacity"]["CapacityUnits"]
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    # A scan rounds each page (not each item) up to 4 KB: one page here, so the model is exact.
    assert scanned == capacity.scan_units(sum(item_size(i) for i in items))
