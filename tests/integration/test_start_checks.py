"""`start` applies every check of `plan`, from the command line against dynalite (issue 13).

Bad inputs from the issue: a template that matches no item, a number partition key, new-key
collisions of random-suffix pairs, unmappable items with and without ``--allow-unmappable``;
and the item count (`plan --count`, `start --count` stored on the migration).
"""

from __future__ import annotations

import hashlib
import json

from reshard.aws.dynamo import Dynamo
from reshard.aws.local import create_table
from reshard.core.migration import Keys
from reshard.cli.main import main
from reshard.control.runs import allowed_unmappable, item_total
from reshard.control.store import ControlStore


def sha(s: str, n: int) -> int:
    return int(hashlib.sha256(s.encode()).hexdigest(), 16) % n


def make_table(dynamo: Dynamo, name: str, pk: tuple[str, str], sk: tuple[str, str] | None = None) -> None:
    """A table with these (name, type) keys, once ACTIVE."""
    create_table(dynamo, name, Keys(pk[0], sk[0] if sk else None), types=dict([pk, *([sk] if sk else [])]))


def migration(path, table: str, mid: str, *, frm: str, to: str, keys: str = 'partition = "PK"\nsort = "SK"'):
    path.write_text(f'id = "{mid}"\ntable = "{table}"\n[keys]\n{keys}\n[from]\n{frm}\n[to]\n{to}\n')
    return str(path)


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


SENSOR_FROM = 'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 4\nshard_by = ["event_id"]'
SENSOR_TO = 'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 8\nshard_by = ["event_id"]'


def sensor_items(n: int, bad: int = 0) -> list[dict]:
    items = [{"PK": {"S": f"s-{i % 3}#{sha(f'e{i}', 4)}"}, "SK": {"S": f"2024-10-27T10:00:{i % 60:02d}.{i:03d}Z"},
              "sensor_id": {"S": f"s-{i % 3}"}, "event_id": {"S": f"e{i}"}} for i in range(n)]
    # Items without the event_id the shard is computed from: unmappable (missing-field).
    items += [{"PK": {"S": f"s-9#{i}"}, "SK": {"S": f"bad-{i}"}, "sensor_id": {"S": "s-9"}} for i in range(bad)]
    return items


def test_template_matching_nothing_is_refused_by_plan_and_start(dynalite, dynalite_server, unique_name, tmp_path,
                                                                capsys):
    """`{sensor_id}_{shard}` on keys `sensor-x#5`: plan says start will refuse, start refuses (exit 2)."""
    make_table(dynalite, unique_name, ("PK", "S"), ("SK", "S"))
    dynalite.batch_write(unique_name, [{"PutRequest": {"Item": i}} for i in sensor_items(30)])
    f = migration(tmp_path / "m.toml", unique_name, "nothing-matches",
                  frm=SENSOR_FROM.replace("{sensor_id}#{shard}", "{sensor_id}_{shard}"), to=SENSOR_TO)
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", f"{unique_name}-ctl"]

    rc, out, err = run(capsys, *g, "plan", f)
    assert rc == 1  # the report, and the exit status start's refusal will have in a script
    assert "start will refuse (1 problem(s)):" in out
    assert err == f"reshard: error: `reshard start` would refuse {f}: 1 problem(s), listed under \"start will " \
                  "refuse\" (JSON: start_refuses)\n"
    assert "no sampled item fits the [from] layout (30 of 30 unmappable" in out, out
    rc, out, err = run(capsys, *g, "start", f)
    assert rc == 2, out
    lines = err.strip().splitlines()
    assert lines[0].startswith("reshard: error: start refused: 1 problem(s)")
    assert len(lines) == 2 and "no sampled item fits the [from] layout" in lines[1]
    # An allowance does not make a template that matches nothing a migration.
    assert run(capsys, *g, "start", f, "--allow-unmappable", "1000")[0] == 2
    assert not ControlStore(dynalite, f"{unique_name}-ctl").exists()  # nothing registered, nothing created


def test_numeric_partition_key_is_refused_by_plan_and_start(dynalite, dynalite_server, unique_name, tmp_path,
                                                            capsys):
    make_table(dynalite, unique_name, ("PK", "N"), ("SK", "S"))
    dynalite.call("put_item", TableName=unique_name, Item={"PK": {"N": "7"}, "SK": {"S": "t"}})
    f = migration(tmp_path / "m.toml", unique_name, "numeric-pk", frm=SENSOR_FROM, to=SENSOR_TO)
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", f"{unique_name}-ctl"]
    for cmd in ("plan", "start"):
        rc, out, err = run(capsys, *g, cmd, f)
        assert rc == 2, (cmd, out)
        assert "key attribute 'PK' has type N but the templates" in err, (cmd, err)
        assert "Traceback" not in err


def test_unmappable_items_need_an_explicit_allowance(dynalite, dynalite_server, unique_name, tmp_path, capsys):
    """Start refuses 2 unmappable items; --allow-unmappable 2 registers and records the allowance;
    the backfill then passes; without the allowance a finished backfill exits 1 and verify fails."""
    make_table(dynalite, unique_name, ("PK", "S"), ("SK", "S"))
    dynalite.batch_write(unique_name, [{"PutRequest": {"Item": i}} for i in sensor_items(40, bad=2)])
    f = migration(tmp_path / "m.toml", unique_name, "two-bad", frm=SENSOR_FROM, to=SENSOR_TO)
    control = f"{unique_name}-ctl"
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", control]

    rc, out, err = run(capsys, *g, "start", f)
    assert rc == 2
    assert "2 sampled item(s) cannot be mapped (missing-field: 2; e.g. PK='s-9#" in err
    assert "--allow-unmappable N (N at least 2" in err
    assert run(capsys, *g, "start", f, "--allow-unmappable", "1")[0] == 2
    rc, out, err = run(capsys, *g, "start", f, "--allow-unmappable", "2", "--output", "json")
    assert rc == 0, err
    r = json.loads(out)
    assert (r["allow_unmappable"], r["checked"]["unmappable"], r["checked"]["mappable"]) == (2, 2, 40)
    store = ControlStore(dynalite, control)
    assert allowed_unmappable(store, "two-bad") == 2

    for _ in range(3):
        assert run(capsys, *g, "advance", "two-bad", "--allow-no-shims")[0] == 0
    assert run(capsys, *g, "backfill", "two-bad", "--segments", "2")[0] == 0
    rc, out, err = run(capsys, *g, "verify", "two-bad", "--segments", "2")
    assert rc == 0, out + err
    assert "allowed unmappable: 2" in out

    # The same file again with a smaller allowance: recorded (no new checks), and now the
    # finished backfill and the verify both fail, and cutover is refused.
    assert run(capsys, *g, "start", f, "--allow-unmappable", "1")[0] == 0
    assert allowed_unmappable(store, "two-bad") == 1
    rc, out, err = run(capsys, *g, "backfill", "two-bad", "--segments", "2")
    assert rc == 1 and "left 2 unmappable item(s) behind and the allowance is 1" in err, err
    rc, out, err = run(capsys, *g, "verify", "two-bad", "--segments", "2")
    assert rc == 1 and "2 unmappable" in err, err
    rc, out, err = run(capsys, *g, "advance", "two-bad", "--allow-no-shims")
    assert rc == 2 and "2 unmappable" in err, err
    assert store.load_state("two-bad").phase.value == "backfill"


def test_new_key_collisions_are_listed_by_plan_and_refused_by_start(dynalite, dynalite_server, unique_name,
                                                                    tmp_path, capsys):
    """Random-suffix pairs: two events of one sensor in one millisecond, under different suffixes;
    the new layout keys on sensor and timestamp only, so both land on one new key."""
    make_table(dynalite, unique_name, ("PK", "S"), ("SK", "S"))
    items = []
    for i in range(20):
        ts = f"2024-10-27T10:00:00.{i:03d}Z"
        items.append({"PK": {"S": f"s-{i % 2}#{i % 4}"}, "SK": {"S": ts}, "event_id": {"S": f"a{i}"}})
        if i < 3:  # the pair: same sensor, same millisecond, another suffix, another event
            items.append({"PK": {"S": f"s-{i % 2}#{(i + 1) % 4}"}, "SK": {"S": ts}, "event_id": {"S": f"b{i}"}})
    dynalite.batch_write(unique_name, [{"PutRequest": {"Item": i}} for i in items])
    frm = 'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 4\nshard_by = "random"'
    to = 'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 8\nshard_by = ["sensor_id", "ts"]'
    f = migration(tmp_path / "m.toml", unique_name, "pairs", frm=frm, to=to)
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", f"{unique_name}-ctl"]

    rc, out, _ = run(capsys, *g, "plan", f, "--sample", "0", "--output", "json")
    assert rc == 1  # start refuses the collisions
    r = json.loads(out)
    assert r["items"]["collisions"] == 3
    shown = {tuple(sorted(k["PK"] for k in ex["keys"])) for ex in r["items"]["collision_examples"]}
    assert shown == {tuple(sorted([f"s-{i % 2}#{i % 4}", f"s-{i % 2}#{(i + 1) % 4}"])) for i in range(3)}
    assert any("3 sampled old item(s) map to the same new key" in b for b in r["start_refuses"])
    rc, out, err = run(capsys, *g, "start", f, "--sample", "0", "--allow-unmappable", "10")
    assert rc == 2
    assert "3 sampled old item(s) map to the same new key as another old item (e.g. PK=" in err


def test_item_count_source_and_stale_warning_and_count(dynalite, dynalite_server, unique_name, tmp_path, capsys):
    """dynalite's ItemCount is 0: plan says where its count comes from and warns; --count counts;
    start --count stores the total on the migration (runs.item_total) for progress and ETA."""
    make_table(dynalite, unique_name, ("PK", "S"), ("SK", "S"))
    dynalite.batch_write(unique_name, [{"PutRequest": {"Item": i}} for i in sensor_items(120)])
    f = migration(tmp_path / "m.toml", unique_name, "counted", frm=SENSOR_FROM, to=SENSOR_TO)
    control = f"{unique_name}-ctl"
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", control]

    rc, out, _ = run(capsys, *g, "plan", f, "--sample", "50", "--segments", "2", "--output", "json")
    r = json.loads(out)
    assert r["items"]["table_source"].startswith("DescribeTable's ItemCount (refreshed about every 6 hours)")
    assert any("ItemCount is 0 but the sample alone holds 50 items" in w for w in r["warnings"])
    rc, out, err = run(capsys, *g, "plan", f, "--sample", "50", "--segments", "2", "--count", "--max-rcu", "50")
    assert rc == 0, err
    assert "to 120 items, counted now (Select=COUNT scan)" in out
    assert "ItemCount is 0" not in out
    assert "counting the items of" in out  # progress, on stdout in text mode

    rc, out, err = run(capsys, *g, "start", f, "--count", "--segments", "3")
    assert rc == 0, err
    assert "items: 120 (count)" in out
    total = item_total(ControlStore(dynalite, control), "counted")
    assert (total["items"], total["source"]) == (120, "count") and total["at"] > 0
