"""Every key shape migrates: a table without a sort key, and a number sort key kept as is (issue 13).

The whole migration from the command line on dynalite (plan → start → advance ×3 → backfill →
verify → cutover → cleanup → complete) while application threads write through real
ShardedTable instances. Each thread owns its keys, so the oracle (every acknowledged write)
is exact: nothing lost, nothing resurrected, read-your-writes after every write, items come
back with the attribute names the application wrote, and the table ends with one physical
item per live logical item at its new key. Small on purpose (the suite's time budget).
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from reshard.core.marker import is_marker
from reshard.aws.dynamo import from_wire, to_wire
from reshard.aws.local import create_table
from reshard.cli.main import main
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper, is_tombstone
from reshard.core.migration import parse

from tests.lifecycle_app import App

THREADS = 2
ITEMS = 40

NO_SORT = """
id = "devices-4-to-8"
table = "{table}"
[keys]
partition = "pk"
[from]
partition = "{{device_id}}#{{shard}}"
shards = 4
shard_by = ["device_id"]
[to]
partition = "d#{{device_id}}#{{shard}}"
shards = 8
shard_by = ["device_id"]
"""

# The sort key "SK" (a number) is kept as is: a field under its own name, hashed by shard_by.
NUMBER_SORT = """
id = "readings-4-to-8"
table = "{table}"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{{sensor_id}}#{{shard}}"
shards = 4
shard_by = ["SK"]
[to]
partition = "{{sensor_id}}#{{shard}}"
shards = 8
shard_by = ["SK"]
"""

SHAPES = {
    # name: (migration text, key types, logical key of item i)
    "no-sort-key": (NO_SORT, {"pk": "S"}, lambda i: {"device_id": f"dev-{i}"}),
    "number-sort-key": (NUMBER_SORT, {"PK": "S", "SK": "N"},
                        lambda i: {"sensor_id": f"s-{i % 3}", "SK": Decimal(1_700_000_000_000 + i)}),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_key_shape_migrates_end_to_end_with_live_traffic(shape, dynalite, dynalite_server, unique_name, tmp_path,
                                                         capsys):
    text, types, key_of = SHAPES[shape]
    table, control = unique_name[:60], f"{unique_name[:60]}-ctl"
    path = tmp_path / "m.toml"
    path.write_text(text.format(table=table))
    m = parse(path.read_text(), str(path))
    mapper = KeyMapper(m)
    create_table(dynalite, table, m.keys, types=types)
    base = {i: dict(key_of(i), temp=Decimal(i), payload=f"seed-{i}") for i in range(ITEMS)}
    # Pre-migration items exactly as the application wrote them before reshard (no version).
    dynalite.batch_write(table, [{"PutRequest": {"Item": mapper.to_physical(to_wire(x), mapper.old)}}
                                 for x in base.values()])

    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", control]
    assert main(["plan", str(path), "--sample", "0", "--segments", "2", *g]) == 0
    out = capsys.readouterr().out
    assert "start will refuse" not in out and f"mappable          {ITEMS}" in out, out
    assert main(["start", str(path), *g]) == 0
    app = App(str(path), dynalite_server.endpoint, control, {i: key_of(i) for i in range(ITEMS + 20)}, base,
              threads=THREADS)  # 20 brand-new items too
    try:
        for _ in range(3):  # dual_write, dual_read, backfill
            assert main(["advance", m.id, "--wait", "20", *g]) == 0
        assert main(["backfill", m.id, "--segments", "2", "--page-size", "25", *g]) == 0
        assert main(["verify", m.id, "--segments", "2", *g]) == 0, capsys.readouterr()
        assert main(["advance", m.id, "--wait", "20", *g]) == 0  # cutover
        assert main(["verify", m.id, "--segments", "2", *g]) == 0, capsys.readouterr()  # the catch-up verify
        assert main(["advance", m.id, "--wait", "20", *g]) == 0  # cleanup
        assert main(["cleanup", m.id, "--segments", "2", "--delete", *g]) == 0
        assert main(["advance", m.id, "--wait", "20", *g]) == 0  # complete
        time.sleep(0.4)
    finally:
        app.finish()
    capsys.readouterr()

    assert app.errors == [] and app.violations == []
    assert sum(app.ops.values()) > 100 and app.ops["delete"] > 5 and app.ops["update"] > 5
    assert ControlStore(dynalite, control).load_state(m.id).phase.value == "complete"

    items, kw = [], {"TableName": table, "ConsistentRead": True}
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
    by_key: dict[tuple, list[dict]] = {}
    for phys in items:
        fields = mapper.fields(phys, mapper.new)
        assert mapper.new.key(fields) == {a: phys[a] for a in mapper.new.key_attrs}  # at its new key
        by_key.setdefault(mapper.identity(fields), []).append(phys)
    assert all(len(v) == 1 for v in by_key.values())
    live = {mapper.identity(mapper.logical_fields(to_wire(x))): x for x in app.expected.values() if x is not None}
    assert not [t for t in tombstones if mapper.identity(mapper.fields(t, mapper.new)) in live], tombstones[:3]
    assert set(by_key) == set(live)  # nothing lost, nothing resurrected
    for ident, (phys,) in by_key.items():
        # The attribute names (and types) the application wrote, nothing else.
        assert from_wire(mapper.to_logical(phys, mapper.new)) == live[ident]
