"""``reshard plan`` against moto tables shaped like the reference articles.

Each test fills a table (< 300 items) and checks the reported numbers against
numbers computed here, independently of reshard's layout code (plain hashlib).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import random
import re


from reshard.cli.main import main
from reshard.core.migration import load

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENSOR = str(ROOT / "migrations" / "0001_sensor_events.toml")
INVOICES = str(ROOT / "migrations" / "0002_invoices.toml")
HOURLY = str(ROOT / "migrations" / "0003_sensor_hourly.toml")


def sha(s: str) -> int:
    return int(hashlib.sha256(s.encode()).hexdigest(), 16)


def md5(s: str) -> int:
    return int(hashlib.md5(s.encode()).hexdigest(), 16)


def create(dynamo, table: str, keys=("PK", "SK"), types=("S", "S"), billing="PAY_PER_REQUEST") -> None:
    kwargs = {}
    if billing == "PROVISIONED":
        kwargs["ProvisionedThroughput"] = {"ReadCapacityUnits": 50, "WriteCapacityUnits": 25}
    dynamo.call("create_table", TableName=table, BillingMode=billing,
                KeySchema=[{"AttributeName": k, "KeyType": t} for k, t in zip(keys, ("HASH", "RANGE"))],
                AttributeDefinitions=[{"AttributeName": k, "AttributeType": t} for k, t in zip(keys, types)],
                **kwargs)


def fill(dynamo, table: str, items: list[dict]) -> None:
    dynamo.batch_write(table, [{"PutRequest": {"Item": i}} for i in items])


def run_plan(capsys, *args) -> tuple[int, str, str]:
    rc = main(["plan", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def plan_json(capsys, *args) -> dict:
    rc, out, err = run_plan(capsys, *args, "--output", "json")
    r = json.loads(out)
    # Exit 1 exactly when start would refuse the file (issue 27 point 9), 0 otherwise.
    assert rc == (1 if r["start_refuses"] else 0), err
    assert ("would refuse" in err) == bool(r["start_refuses"]), err
    return r


def counts(shards: list[int], n: int) -> list[int]:
    return [shards.count(s) for s in range(n)]


# --------------------------------------------------------------------------- calculated suffix

def sensor_items(n: int = 200) -> tuple[list[dict], list[str]]:
    """write-sharding-time-series.txt, pattern 2: PK = sensor_id#sha256(event_id)%16, SK = ISO time."""
    rng = random.Random(7)
    items, events = [], []
    for i in range(n):
        sensor, event = f"sensor-{rng.randrange(8):03d}", f"evt-{i:05d}-{rng.getrandbits(32):08x}"
        events.append(event)
        items.append({"PK": {"S": f"{sensor}#{sha(event) % 16}"},
                      "SK": {"S": f"2024-10-27T15:{i // 60:02d}:{i % 60:02d}.{i:03d}Z"},
                      "sensor_id": {"S": sensor}, "event_id": {"S": event},
                      "temperature": {"N": str(20 + i % 7)}, "humidity": {"N": "0.4"}})
    return items, events


SENSOR_BROKEN = [
    # unparseable: no shard suffix
    {"PK": {"S": "sensor-legacy"}, "SK": {"S": "2024-01-01T00:00:00Z"}, "event_id": {"S": "x1"}},
    # shard-mismatch: the suffix is not sha256(event_id) % 16
    {"PK": {"S": f"sensor-001#{(sha('x2') + 1) % 16}"}, "SK": {"S": "2024-01-01T00:00:01Z"},
     "sensor_id": {"S": "sensor-001"}, "event_id": {"S": "x2"}},
    # missing-field: no event_id to hash
    {"PK": {"S": "sensor-001#3"}, "SK": {"S": "2024-01-01T00:00:02Z"}, "sensor_id": {"S": "sensor-001"}},
]


def test_plan_sensor_events_full_scan(moto_dynamo, capsys):
    create(moto_dynamo, "SensorEvents")
    items, events = sensor_items()
    fill(moto_dynamo, "SensorEvents", items + SENSOR_BROKEN)

    r = plan_json(capsys, SENSOR, "--sample", "0", "--segments", "4", "--max-wcu", "50")

    moved = [e for e in events if sha(e) % 32 != sha(e) % 16]
    it = r["items"]
    assert (it["sampled"], it["mappable"], it["unmappable"]) == (203, 200, 3)
    assert it["unmappable_by_reason"] == {"missing-field": 1, "shard-mismatch": 1, "unparseable-key": 1}
    assert {ex["key"]["PK"] for ex in it["unmappable_examples"]} == {i["PK"]["S"] for i in SENSOR_BROKEN}
    assert it["moves"] == len(moved) and it["stays"] == 200 - len(moved)
    assert r["distribution"]["old"]["counts"] == counts([sha(e) % 16 for e in events], 16)
    assert r["distribution"]["new"]["counts"] == counts([sha(e) % 32 for e in events], 32)
    new = counts([sha(e) % 32 for e in events], 32)
    assert r["distribution"]["new"]["skew"] == round(max(new) / (200 / 32), 3)
    assert r["distribution"]["new"]["hottest_pct"] == round(100 * max(new) / 200, 2)
    # Items are under 1 KB: one WCU per write; no read-back (no two old items share a new key).
    cap = r["capacity"]
    assert cap["scale"] == 1
    assert cap["backfill"]["wcu"] == len(moved)
    assert cap["backfill"]["fence_read_rcu"] == 0 and "readback_rcu" not in cap["backfill"]
    assert cap["cleanup"]["wcu"] == len(moved)
    assert cap["backfill_seconds"] == round(len(moved) / 50, 1)
    assert r["table"]["billing_mode"] == "PAY_PER_REQUEST"
    assert r["table"]["ttl"]["status"] == "DISABLED"
    assert any("ttl_attribute = 'expires_at'" in w for w in r["warnings"])
    assert r["next"][0] == f"reshard start {SENSOR}"
    assert r["recommendation"] is None


def test_plan_text_carries_the_same_numbers(moto_dynamo, capsys):
    create(moto_dynamo, "SensorEvents", billing="PROVISIONED")
    items, events = sensor_items(120)
    fill(moto_dynamo, "SensorEvents", items + SENSOR_BROKEN[:1])
    r = plan_json(capsys, SENSOR, "--sample", "0", "--peak-writes-per-sec", "30000", "--item-kb", "1.5")
    rc, text, err = run_plan(capsys, SENSOR, "--sample", "0", "--peak-writes-per-sec", "30000", "--item-kb", "1.5")
    assert rc == 1, err  # the unmappable row: start would refuse it (and the text says so)
    it = r["items"]
    assert f"  move        {it['moves']:>8}" in text
    assert f"  unmappable  {it['unmappable']:>8}  (unparseable-key: 1)" in text
    assert "e.g. PK='sensor-legacy'" in text
    old, new = r["distribution"]["old"], r["distribution"]["new"]
    assert f"skew {old['skew']:.2f} (max/mean), hottest shard {old['hottest_shard']}" in text
    assert f"skew {new['skew']:.2f} (max/mean), hottest shard {new['hottest_shard']}" in text
    assert "PROVISIONED (50 RCU / 25 WCU)" in text
    assert r["table"]["provisioned"] == {"rcu": 50, "wcu": 25}
    # 30000 writes/s x ceil(1.5 KB) = 60 partitions, x1.5 = 90 > 32: a warning.
    rec = r["recommendation"]
    assert (rec["base_shards"], rec["recommended_shards"], rec["to_shards"]) == (60, 90, 32)
    assert "Recommended shards: 90" in text
    assert "warning: [to] shards = 32 is below the recommended 90" in text
    for line in r["next"]:
        assert line in text
    # The histograms show every shard of both layouts with its count.
    lines = text.splitlines()
    for name, d in (("old", old), ("new", new)):
        start = next(i for i, l in enumerate(lines) if l.startswith(f"Items per shard, {name} layout"))
        rows = lines[start + 1:start + 1 + d["shards"]]
        assert [int(re.search(r"\|[ #]*?(\d+)  \(", row).group(1)) for row in rows] == d["counts"]


def test_plan_sample_is_bounded_and_scaled(moto_dynamo, capsys):
    create(moto_dynamo, "SensorEvents")
    items, _ = sensor_items(240)
    fill(moto_dynamo, "SensorEvents", items)
    r = plan_json(capsys, SENSOR, "--sample", "40", "--segments", "4")
    assert 0 < r["items"]["sampled"] <= 40
    assert r["items"]["table"] == 240  # DescribeTable's ItemCount
    assert r["capacity"]["scale"] == round(240 / r["items"]["sampled"], 6)
    assert r["capacity"]["backfill"]["wcu"] == round(r["items"]["moves"] * 240 / r["items"]["sampled"], 1)


def test_plan_ttl_enabled_on_the_right_attribute_gives_no_ttl_warning(moto_dynamo, capsys):
    create(moto_dynamo, "SensorEvents")
    fill(moto_dynamo, "SensorEvents", sensor_items(20)[0])
    moto_dynamo.call("update_time_to_live", TableName="SensorEvents",
                     TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"})
    r = plan_json(capsys, SENSOR)
    assert r["table"]["ttl"] == {"status": "ENABLED", "attribute": "expires_at"}
    assert not any("TTL" in w for w in r["warnings"])


def test_plan_ttl_on_another_attribute_warns(moto_dynamo, capsys):
    create(moto_dynamo, "SensorEvents")
    moto_dynamo.call("update_time_to_live", TableName="SensorEvents",
                     TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"})
    r = plan_json(capsys, SENSOR)
    assert any("TTL is ENABLED on 'gone_at'" in w for w in r["warnings"])
    assert any("looks empty" in w for w in r["warnings"])


# --------------------------------------------------------------------------- random suffix

def test_plan_invoices_random_suffix(moto_dynamo, capsys):
    """choosing-partition-key-aws-blog.txt: PK = InvoiceNumber#121212#rand(0..9), SK = Client#c#txid#t."""
    create(moto_dynamo, "Invoices")
    rng = random.Random(3)
    items, expected = [], []
    for i in range(150):
        invoice, line = str(121212 + i % 6), f"Client#{i % 4}#txid#{i}"
        old = rng.randrange(10)
        items.append({"PK": {"S": f"InvoiceNumber#{invoice}#{old}"}, "SK": {"S": line},
                      "InvoiceDate": {"S": f"2018-05-{1 + i % 28:02d}"}, "amount": {"N": str(i * 10)}})
        expected.append((old, md5(f"{invoice}#{line}") % 20))
    broken = [{"PK": {"S": "InvoiceNumber#121212#25"}, "SK": {"S": "Client#9#txid#1"}},   # shard 25: in neither layout
              {"PK": {"S": "Invoice-121299"}, "SK": {"S": "Client#9#txid#2"}}]            # no template match
    # A copy already in the new layout (md5("121212#Client#9#txid#1") % 20 == 10): not unmappable.
    assert md5("121212#Client#9#txid#1") % 20 == 10
    copied = {"PK": {"S": "InvoiceNumber#121212#10"}, "SK": {"S": "Client#9#txid#1"},
              "_rs_new": {"S": load(INVOICES).id}}  # this migration's copy: marked
    fill(moto_dynamo, "Invoices", items + broken + [copied])

    r = plan_json(capsys, INVOICES, "--sample", "0", "--segments", "3")
    it = r["items"]
    assert (it["mappable"], it["unmappable"], it["in_new_layout"]) == (150, 2, 1)
    assert it["unmappable_by_reason"] == {"bad-shard": 1, "unparseable-key": 1}
    assert any("already in the new layout" in w for w in r["warnings"])
    assert it["moves"] == sum(1 for o, n in expected if o != n)
    assert r["distribution"]["old"]["counts"] == counts([o for o, _ in expected], 10)
    assert r["distribution"]["new"]["counts"] == counts([n for _, n in expected], 20)
    assert r["migration"]["from"]["shard_by"] == "random"


# --------------------------------------------------------------------------- hybrid time buckets

def test_plan_hybrid_items_store_only_event_id_and_readings(moto_dynamo, capsys):
    """write-sharding-time-series.txt, pattern 3: PK = sha256(sensor)%16#hour, SK = sensor#iso."""
    create(moto_dynamo, "SensorHourly")
    sensors = [f"sensor-{c}-{n:03d}" for c in ("alpha", "beta", "gamma") for n in range(6)]
    items, expected = [], []
    for i in range(180):
        sensor = sensors[i % len(sensors)]
        ts = f"2024-10-27T{10 + i % 5:02d}:{i % 60:02d}:07.{i:06d}Z"
        items.append({"PK": {"S": f"{sha(sensor) % 16}#{ts[:13]}"}, "SK": {"S": f"{sensor}#{ts}"},
                      "event_id": {"S": f"evt-{i}"}, "temperature": {"N": "21.5"}, "humidity": {"N": "40"}})
        expected.append((sha(sensor) % 16, sha(sensor) % 64))
    s0 = sensors[0]
    broken = [
        {"PK": {"S": f"{sha(s0) % 16}#2024-10-27T10"}, "SK": {"S": f"{s0}#yesterday"}},          # bad-timestamp
        {"PK": {"S": f"{(sha(s0) + 1) % 16}#2024-10-27T10"}, "SK": {"S": f"{s0}#2024-10-27T10:00:00Z"}},
        {"PK": {"S": f"{sha(s0) % 16}#2024-10-27T11"}, "SK": {"S": f"{s0}#2024-10-27T10:00:00Z"}},  # bucket != ts
    ]
    fill(moto_dynamo, "SensorHourly", items + broken)

    r = plan_json(capsys, HOURLY, "--sample", "0", "--segments", "2")
    it = r["items"]
    assert (it["mappable"], it["unmappable"]) == (180, 3)
    assert it["unmappable_by_reason"] == {"bad-timestamp": 1, "shard-mismatch": 1, "unparseable-key": 1}
    assert it["moves"] == sum(1 for o, n in expected if o != n)
    assert 0 < it["moves"] < 180
    assert r["distribution"]["old"]["counts"] == counts([o for o, _ in expected], 16)
    assert r["distribution"]["new"]["counts"] == counts([n for _, n in expected], 64)
    # 18 sensors over 64 shards: at most 18 non-empty shards, so a skew warning is due.
    assert r["distribution"]["new"]["empty_shards"] >= 64 - 18
    assert any("new layout is skewed" in w for w in r["warnings"])


# --------------------------------------------------------------------------- the table is wrong

def test_plan_key_schema_mismatch_exits_2(moto_dynamo, capsys):
    create(moto_dynamo, "SensorEvents", keys=("pk", "sk"))
    rc, out, err = run_plan(capsys, SENSOR)
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        f"reshard: error: table 'SensorEvents' has key schema pk (HASH), sk (RANGE) but {SENSOR} "
        "[keys] says PK (HASH), SK (RANGE)"]


def test_plan_key_without_sort_exits_2(moto_dynamo, capsys):
    moto_dynamo.call("create_table", TableName="SensorEvents", BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}])
    rc, out, err = run_plan(capsys, SENSOR)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "'SensorEvents'" in err and "Traceback" not in err


def test_plan_numeric_partition_key_exits_2(moto_dynamo, capsys):
    create(moto_dynamo, "SensorEvents", types=("N", "S"))
    rc, out, err = run_plan(capsys, SENSOR)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "key attribute 'PK' has type N" in err


def test_plan_missing_table_exits_2(moto_dynamo, capsys):
    rc, out, err = run_plan(capsys, SENSOR, "--output", "json")
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("reshard: error: table 'SensorEvents' does not exist")


def test_plan_item_kb_without_peak_is_bad_input(moto_dynamo, capsys):
    rc, out, err = run_plan(capsys, SENSOR, "--item-kb", "2")
    assert rc == 2 and err == "reshard: error: --item-kb needs --peak-writes-per-sec (the recommendation uses both)\n"


def test_plan_item_kb_defaults_to_the_sampled_mean(moto_dynamo, capsys):
    create(moto_dynamo, "SensorEvents")
    items, _ = sensor_items(30)
    for i in items:
        i["blob"] = {"S": "x" * 1500}  # ~1.6 KB items -> ceil = 2 KB
    fill(moto_dynamo, "SensorEvents", items)
    r = plan_json(capsys, SENSOR, "--peak-writes-per-sec", "10000")
    assert r["recommendation"]["item_kb"] == 2
    assert r["recommendation"]["base_shards"] == 20
    assert r["recommendation"]["recommended_shards"] == 30
    assert r["recommendation"]["warning"] is None


def test_count_items_scans_every_segment_with_select_count_within_the_budget(moto_dynamo):
    """`plan --count` / `start --count`: every page goes through the budget, the count is exact."""
    from contextlib import contextmanager

    from reshard.aws import inspect
    from reshard.operations import count_items

    create(moto_dynamo, "Counted")
    fill(moto_dynamo, "Counted", [{"PK": {"S": f"p{i}"}, "SK": {"S": "s"}} for i in range(70)])
    paced, seen, calls = [], [], []
    original = moto_dynamo.call

    def spy(operation, **kw):
        calls.append((operation, kw.get("Select"), kw.get("Segment")))
        return original(operation, **kw)

    moto_dynamo.call = spy

    @contextmanager
    def pace():
        paced.append(1)
        yield

    assert inspect.count_items(moto_dynamo, "Counted", 3, seen.append, pace=pace) == 70
    scans = [c for c in calls if c[0] == "scan"]
    assert {c[1] for c in scans} == {"COUNT"} and {c[2] for c in scans} == {0, 1, 2}
    assert len(paced) == len(scans) and sum(seen) == 70
    assert count_items(moto_dynamo, "Counted", segments=2, max_rcu=1000) == 70
