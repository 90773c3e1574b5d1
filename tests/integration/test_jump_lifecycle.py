"""End to end on dynalite from the command line: ``sha256 % 4`` -> ``jump`` 8, with shim traffic.

Reuses the application threads and oracle of test_lifecycle (every acknowledged write
checked: nothing lost, nothing resurrected, read-your-writes). The final table must hold
each live item once, at its jump key, computed here from the documented key derivation.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal

from reshard.core.marker import is_marker
from reshard.aws.dynamo import from_wire, to_wire
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper, is_tombstone, jump_hash
from reshard.core.migration import parse

from tests.backfill_support import create_table
from tests.integration.test_lifecycle import app_keys, cli
from tests.lifecycle_app import App

ITEMS = 80

JUMP_4_TO_8 = """\
id = "sensor-sha4-to-jump8"
table = "{table}"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{sensor_id}#{shard}"
sort = "{ts}"
shards = 4
shard_by = ["event_id"]
hash = "sha256"
[to]
partition = "{sensor_id}#{shard}"
sort = "{ts}"
shards = 8
shard_by = ["event_id"]
hash = "jump"
"""


def jump8(event_id: str) -> int:
    """The README's derivation, written out: first 8 bytes of sha256, big-endian, then jump."""
    return jump_hash(int.from_bytes(hashlib.sha256(event_id.encode()).digest()[:8], "big"), 8)


def old_item(i: int) -> dict:
    event_id = f"evt-{i:05d}"
    sensor = f"sensor-{i % 5}"
    return {"PK": f"{sensor}#{int(hashlib.sha256(event_id.encode()).hexdigest(), 16) % 4}",
            "SK": f"2024-10-27T{i % 24:02d}:{i % 60:02d}:00.{i:03d}Z", "sensor_id": sensor,
            "event_id": event_id, "temperature": Decimal(i % 90), "humidity": Decimal(i % 40)}


def scan_all(dynalite, table: str) -> list[dict]:
    items, kw = [], {"TableName": table, "ConsistentRead": True}
    while True:
        resp = dynalite.call("scan", **kw)
        items += resp.get("Items", [])
        if not resp.get("LastEvaluatedKey"):
            return items
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def test_sha256_mod_4_to_jump_8_from_the_command_line_with_live_traffic(dynalite, dynalite_server, unique_name,
                                                                         tmp_path, capsys):
    table = unique_name[:60]
    control = f"{table}-ctl"
    path = tmp_path / "m.toml"
    path.write_text(JUMP_4_TO_8.replace("{table}", table))
    m = parse(path.read_text(), str(path))
    mapper = KeyMapper(m)
    create_table(dynalite, table, mapper)  # waits for ACTIVE (a bare CreateTable raced the first write)
    base = {}
    for start in range(0, ITEMS, 25):
        batch = [old_item(i) for i in range(start, min(ITEMS, start + 25))]
        dynalite.batch_write(table, [{"PutRequest": {"Item": to_wire(x)}} for x in batch])
        for x in batch:
            base[x["event_id"]] = {k: v for k, v in x.items() if k not in ("PK", "SK")} | {"ts": x["SK"]}

    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", control]
    capsys.readouterr()
    assert cli("plan", str(path), "--sample", "0", "--segments", "2", *g) == 0
    assert "shard = jump(sha256(event_id)[:8], 8)" in capsys.readouterr().out
    assert cli("start", str(path), *g) == 0
    app = App(str(path), dynalite_server.endpoint, control, app_keys(base, 2), base, threads=2,  # two shims:
              max_ops=5000, pause=0.002, seed=7)                                                # enough traffic
    try:
        for _ in range(3):  # dual_write, dual_read, backfill
            assert cli("advance", m.id, "--wait", "20", *g) == 0
        assert cli("backfill", m.id, "--segments", "2", "--page-size", "50", *g) == 0
        assert cli("verify", m.id, "--segments", "2", *g) == 0
        assert cli("advance", m.id, "--wait", "20", *g) == 0  # cutover
        assert cli("verify", m.id, "--segments", "2", *g) == 0  # the catch-up verify after the switch
        assert cli("advance", m.id, "--wait", "20", *g) == 0  # cleanup
        assert cli("cleanup", m.id, "--segments", "2", "--delete", *g) == 0  # dynalite has no TTL
        assert cli("advance", m.id, "--wait", "20", *g) == 0  # complete
    finally:
        app.finish()
    capsys.readouterr()

    assert app.errors == [] and app.violations == []
    assert sum(app.ops.values()) > 100 and app.ops["delete"] > 5 and app.ops["put"] > 20
    assert ControlStore(dynalite, control).load_state(m.id).phase.value == "complete"
    items = scan_all(dynalite, table)
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
    live = {eid: item for eid, item in app.expected.items() if item is not None}
    assert set(by_id) == set(live)  # no lost write, nothing resurrected
    for eid, phys in by_id.items():
        assert len(phys) == 1, eid
        (p,) = phys
        assert p["PK"]["S"] == f"{live[eid]['sensor_id']}#{jump8(eid)}", (eid, p["PK"])  # at its jump key
        assert from_wire(mapper.to_logical(p, mapper.new)) == live[eid], eid
