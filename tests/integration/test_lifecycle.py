"""The whole migration on dynalite, from the command line, with application traffic throughout.

plan → start → advance ×3 → backfill → verify → advance (cutover) → rollback → advance →
advance (cleanup) → cleanup → advance (complete), while application threads write through
real ShardedTable instances that follow the control table. The oracle is every
acknowledged write: nothing lost, nothing resurrected, one physical item per logical item,
read-your-writes after every write.

Each thread owns its keys, so the oracle is exact (concurrency on one key is covered by
tests/integration/test_shim_concurrency.py and the reliability suite).
"""

from __future__ import annotations

import hashlib
import time
from decimal import Decimal

from reshard.core.marker import is_marker
from reshard.cli.main import main
from reshard.control.store import ControlStore
from reshard.aws.dynamo import from_wire, to_wire
from reshard.aws.local import wait_active
from reshard.core.layout import NEW_COPY_ATTR, KeyMapper, is_tombstone
from reshard.core.migration import parse

from tests.conftest import ROOT
from tests.lifecycle_app import App

ITEMS = 400
THREADS = 4


def sensor_item(i: int) -> dict:
    """A pre-migration item exactly as the reference article's app writes it."""
    event_id = f"evt-{i:05d}"
    shard = int(hashlib.sha256(event_id.encode()).hexdigest(), 16) % 16
    sensor = f"sensor-{i % 5}"
    ts = f"2024-10-27T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}.{i:03d}Z"
    return {"PK": f"{sensor}#{shard}", "SK": ts, "sensor_id": sensor, "event_id": event_id,
            "temperature": Decimal(i % 90), "humidity": Decimal(i % 40)}


def app_keys(base: dict[str, dict], threads: int) -> dict[str, dict]:
    """Logical keys of the seeded items and of 40 brand-new items per thread."""
    keys = {eid: {"sensor_id": x["sensor_id"], "event_id": eid, "ts": x["ts"]} for eid, x in base.items()}
    for n in range(threads):
        for j in range(40):
            keys[f"new-{n}-{j}"] = {"sensor_id": f"sensor-{j % 5}", "event_id": f"new-{n}-{j}",
                                    "ts": f"2024-10-28T00:{n:02d}:{j:02d}.000Z"}
    return keys


def cli(*args: str) -> int:
    return main(list(args))


def test_full_migration_from_the_command_line_with_live_traffic(dynalite, dynalite_server, unique_name, tmp_path,
                                                                  capsys):
    table = unique_name[:60]
    control = f"{table}-ctl"
    text = (ROOT / "migrations" / "0001_sensor_events.toml").read_text().replace(
        'table = "SensorEvents"', f'table = "{table}"')
    path = tmp_path / "m.toml"
    path.write_text(text)
    m = parse(text, str(path))
    mapper = KeyMapper(m)
    dynalite.call("create_table", TableName=table, BillingMode="PAY_PER_REQUEST",
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
                  AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                                        {"AttributeName": "SK", "AttributeType": "S"}])
    wait_active(dynalite, table)  # dynalite answers CreateTable before the table takes writes
    base = {}
    for start in range(0, ITEMS, 25):
        batch = [sensor_item(i) for i in range(start, min(ITEMS, start + 25))]
        dynalite.batch_write(table, [{"PutRequest": {"Item": to_wire(x)}} for x in batch])
        for x in batch:
            base[x["event_id"]] = {k: v for k, v in x.items() if k not in ("PK", "SK")} | {"ts": x["SK"]}

    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", control]
    assert cli("plan", str(path), "--sample", "0", "--segments", "2", *g) == 0
    assert cli("start", str(path), *g) == 0
    app = App(str(path), dynalite_server.endpoint, control, app_keys(base, THREADS), base, threads=THREADS,
              max_ops=5000, pause=0.002, seed=7)
    try:
        for _ in range(3):  # dual_write, dual_read, backfill
            assert cli("advance", m.id, "--wait", "20", *g) == 0
        assert cli("advance", m.id, *g) == 2  # cutover needs the backfill and a verify
        assert cli("backfill", m.id, "--segments", "4", "--page-size", "50", *g) == 0
        assert cli("verify", m.id, "--segments", "4", *g) == 0
        assert cli("advance", m.id, "--wait", "20", *g) == 0  # cutover
        assert cli("rollback", m.id, "--wait", "20", *g) == 0  # back to backfill: old is authoritative again
        time.sleep(0.5)
        assert cli("advance", m.id, "--wait", "20", *g) == 0  # cutover again (the verify still holds)
        assert cli("verify", m.id, "--segments", "4", *g) == 0  # the catch-up verify after the switch
        assert cli("advance", m.id, "--wait", "20", *g) == 0  # cleanup
        assert cli("rollback", m.id, *g) == 2  # refused from cleanup on
        assert cli("cleanup", m.id, "--segments", "4", "--delete", *g) == 0  # dynalite has no TTL
        assert cli("advance", m.id, "--wait", "20", *g) == 0  # complete
        time.sleep(0.5)
    finally:
        app.finish()
    capsys.readouterr()

    print(f"lifecycle: ops {app.ops}, live items {sum(v is not None for v in app.expected.values())}")
    assert app.errors == []
    assert app.violations == []
    assert sum(app.ops.values()) > 200 and app.ops["delete"] > 10 and app.ops["update"] > 10
    store = ControlStore(dynalite, control)
    assert store.load_state(m.id).phase.value == "complete"

    # The table now holds the new layout only: one physical item per live logical item, at its
    # new key; no tombstones, no old copies of moved items; deleted items nowhere.
    items = []
    kw = {"TableName": table, "ConsistentRead": True}
    while True:
        resp = dynalite.call("scan", **kw)
        items += resp.get("Items", [])
        if not resp.get("LastEvaluatedKey"):
            break
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
    # The table marker stays after complete (it names the layout's owner): not an item.
    assert [i["_rs_marker"]["S"] for i in items if is_marker(i)] == [m.id]
    items = [i for i in items if not is_marker(i)]
    # Deletes made in complete leave tombstones (until --strip-bookkeeping): each stands for an
    # item the app deleted; every other item is live.
    tombstones = [i for i in items if is_tombstone(i)]
    items = [i for i in items if not is_tombstone(i)]
    assert all(app.expected.get(t["event_id"]["S"], "never written") is None for t in tombstones), tombstones[:3]
    by_id: dict[str, list[dict]] = {}
    for i in items:
        by_id.setdefault(i["event_id"]["S"], []).append(i)
    assert all(len(v) == 1 for v in by_id.values()), [k for k, v in by_id.items() if len(v) > 1][:5]
    live = {eid: item for eid, item in app.expected.items() if item is not None}
    assert set(by_id) == set(live)  # nothing lost, nothing resurrected
    for eid, (phys,) in by_id.items():
        fields = mapper.fields(phys, mapper.new)
        assert mapper.new.key(fields) == {a: phys[a] for a in ("PK", "SK")}  # at its new key
        logical = from_wire(mapper.to_logical(phys, mapper.new))
        assert logical == live[eid], eid
        # The new-copy marker is on exactly the items whose key moved.
        assert (NEW_COPY_ATTR in phys) == (mapper.old.key(fields) != mapper.new.key(fields)), phys

    # Nothing left behind (every shim closed, every job finished, the lock released), and the
    # bookkeeping can go once the application no longer runs the migration.
    assert cli("doctor", m.id, *g) == 0
    assert cli("cleanup", m.id, "--strip-bookkeeping", "--segments", "2", *g) == 0
    kw = {"TableName": table, "ConsistentRead": True}
    stripped = []
    while True:
        resp = dynalite.call("scan", **kw)
        stripped += resp.get("Items", [])
        if not resp.get("LastEvaluatedKey"):
            break
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
    stripped = [i for i in stripped if not is_marker(i)]  # the marker keeps naming the owner
    assert len(stripped) == len(items) and not any(k.startswith("_rs_") for i in stripped for k in i)
