"""Bad input: each mistake gets exit 2 (or the documented code) and one clear line, and loses nothing.

Already covered elsewhere, not repeated here: every migration-file mistake
(tests/unit/test_migration_errors.py); plan/start on a missing table or a key schema
that does not match, and status/advance without a control table
(tests/functional/test_plan.py, tests/functional/test_phase_cli.py).
"""

from __future__ import annotations

import pathlib
from decimal import Decimal

import pytest

from reshard.aws.local import wait_active
from reshard.control.runs import unmappable_items
from reshard.cli.main import main
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper, item_size
from reshard.core.migration import parse
from reshard.core.phases import Action
from reshard.shim.table import ShardedTable
from reshard.control.transition import transition
from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.backfill import BACKFILL

from tests.backfill_support import scan_all
from tests.conftest import ROOT
from tests.shim_helpers import scan

SENSOR = str(ROOT / "migrations" / "0001_sensor_events.toml")
CT = ["--control-table", "bad-ctl"]


def one_line(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return code, lines[0]


# ------------------------------------------------------------------------ command line
@pytest.mark.parametrize("args, says", [
    (["backfill", "m", "--segments", "0"], "--segments"),
    (["backfill", "m", "--segments", "many"], "--segments"),
    (["backfill", "m", "--no-such-option"], "--no-such-option"),
    (["backfill", "m", "--workers", "-1"], "--workers"),
    (["backfill", "m", "--max-wcu", "lots"], "--max-wcu"),
    (["plan"], "FILE"),
    (["start"], "FILE"),
    (["plan", "/nonexistent/m.toml"], "m.toml"),
    (["start", "/nonexistent/m.toml"], "m.toml"),
    (["advance", "--wait", "soon"], "--wait"),
    (["start", SENSOR, "--request-horizon", "soon"], "--request-horizon"),
    (["start", SENSOR, "--request-horizon", "-1"], "--request-horizon -1: give a positive number of seconds"),
    (["start", SENSOR, "--request-horizon", "nan"], "--request-horizon"),
    (["status", "--output", "yaml"], "--output"),
    (["no-such-command"], "no-such-command"),
])
def test_wrong_arguments_exit_2_with_one_line(capsys, args, says):
    code, line = one_line(capsys, *args, *CT)
    assert code == 2 and says in line, line


# ------------------------------------------------------------------------ tables
def test_backfill_without_control_table_or_data_table(moto_dynamo, capsys, tmp_path):
    code, line = one_line(capsys, "backfill", "sensor-events-16-to-32", *CT)
    assert code == 2 and "control table 'bad-ctl' does not exist" in line
    code, line = one_line(capsys, "rollback", *CT)
    assert code == 2 and "control table 'bad-ctl' does not exist" in line


def _table(dynamo, name, sort_type="S", sort="SK"):
    schema = [{"AttributeName": "PK", "KeyType": "HASH"}]
    attrs = [{"AttributeName": "PK", "AttributeType": "S"}]
    if sort:
        schema.append({"AttributeName": sort, "KeyType": "RANGE"})
        attrs.append({"AttributeName": sort, "AttributeType": sort_type})
    dynamo.call("create_table", TableName=name, BillingMode="PAY_PER_REQUEST", KeySchema=schema,
                AttributeDefinitions=attrs)
    wait_active(dynamo, name)  # dynalite answers CreateTable before the table takes writes


def _register(dynamo, text: str, ctl: str = "bad-ctl"):
    m = parse(text, "<test>")
    store = ControlStore(dynamo, ctl)
    store.register(m)
    for _ in range(3):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    return m, store


def test_backfill_when_the_data_table_was_deleted(moto_dynamo, capsys):
    _table(moto_dynamo, "SensorEvents")
    text = pathlib.Path(SENSOR).read_text()
    m, store = _register(moto_dynamo, text)
    moto_dynamo.call("delete_table", TableName="SensorEvents")
    code, line = one_line(capsys, "backfill", m.id, "--segments", "2", *CT)
    assert code == 2 and "SensorEvents" in line, line


# ------------------------------------------------------------------------ items too large after re-keying
GROWING = """
id = "grow"
table = "Grow"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{sensor_id}#{shard}"
sort = "{ts}"
shards = 4
shard_by = ["event_id"]
[to]
partition = "{sensor_id}#{event_id}#{shard}"
sort = "{ts}"
shards = 8
shard_by = ["event_id"]
"""


def test_items_over_400_kb_after_rekeying_are_reported_and_left(dynalite, unique_name):
    # dynalite, not moto: moto measures item size differently from DynamoDB (it refuses
    # items DynamoDB accepts), dynalite follows DynamoDB's documented rule.
    moto_dynamo = dynalite
    table = f"{unique_name}-grow"
    _table(moto_dynamo, table)
    m, store = _register(moto_dynamo, GROWING.replace('"Grow"', f'"{table}"'), ctl=f"{unique_name}-ctl")
    mapper = KeyMapper(m)
    big_id = "e" * 1900  # the new partition key repeats it: +1.9 KB
    small = mapper.to_physical({"sensor_id": {"S": "s"}, "event_id": {"S": "small"}, "ts": {"S": "1"},
                                "v": {"S": "x"}}, mapper.old)
    big = mapper.to_physical({"sensor_id": {"S": "s"}, "event_id": {"S": big_id}, "ts": {"S": "2"}}, mapper.old)
    big["blob"] = {"S": "z" * (400 * 1024 - 1100 - item_size(big))}  # 1.1 KB under the limit
    for item in (small, big):
        moto_dynamo.call("put_item", TableName=table, Item=item)
    result = run_job(BACKFILL, moto_dynamo, store, m.id, JobOptions(segments=1, workers=1, page_size=10))
    assert result.done
    report = unmappable_items(store, m.id)
    assert [u["reason"] for u in report] == ["too-large"], report
    assert report[0]["old_key"] == {"PK": big["PK"], "SK": big["SK"]}
    items = scan_all(moto_dynamo, table)
    assert big in items.values()                                  # left untouched
    assert len(items) == 3                                        # small (old + new copy) and big


# ------------------------------------------------------------------------ reserved words as fields
RESERVED = """
id = "reserved"
table = "Reserved"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{name}#{shard}"
sort = "{timestamp}"
shards = 4
shard_by = ["data"]
[to]
partition = "{name}#{shard}"
sort = "{timestamp}"
shards = 16
shard_by = ["data"]
"""


def test_reserved_words_as_fields_through_shim_and_backfill(moto_dynamo):
    _table(moto_dynamo, "Reserved")
    m, store = _register(moto_dynamo, RESERVED)
    shim = ShardedTable(m, moto_dynamo, control_table="bad-ctl", refresh_seconds=60)
    try:
        keys = [{"name": f"n{i}", "timestamp": f"2024-01-0{1 + i % 9}", "data": f"d{i}"} for i in range(30)]
        for k in keys:
            shim.put_item(Item=dict(k, size=Decimal(1), count=Decimal(2)))
        shim.update_item(Key=keys[0], UpdateExpression="SET #s = :s", ExpressionAttributeNames={"#s": "size"},
                         ExpressionAttributeValues={":s": Decimal(5)})
        shim.delete_item(Key=keys[1])
        result = run_job(BACKFILL, moto_dynamo, store, m.id, JobOptions(segments=2, workers=1, page_size=7))
        assert result.done
        assert shim.get_item(Key=keys[0], ConsistentRead=True).get("Item")["size"] == 5
        assert shim.get_item(Key=keys[1], ConsistentRead=True).get("Item") is None
        assert all(shim.get_item(Key=k, ConsistentRead=True).get("Item") == dict(k, size=1, count=2) for k in keys[2:])
    finally:
        shim.close()


# ------------------------------------------------------------------------ number and binary sort keys
TYPED = """
id = "typed-{t}"
table = "Typed{t}"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{{device}}#{{shard}}"
sort = "{{seq}}"
shards = 4
shard_by = ["device"]
[to]
partition = "{{device}}#{{shard}}"
sort = "{{seq}}"
shards = 8
shard_by = ["device"]
"""


@pytest.mark.parametrize("t, value", [("N", lambda i: Decimal(i * 7 + 1)), ("B", lambda i: bytes([i, 255 - i]))])
def test_number_and_binary_sort_keys_through_shim_and_backfill(moto_dynamo, t, value):
    _table(moto_dynamo, f"Typed{t}", sort_type=t)
    m, store = _register(moto_dynamo, TYPED.format(t=t))
    mapper = KeyMapper(m)
    from reshard.aws.dynamo import to_wire
    # Pre-migration items, written by the app before reshard (typed sort key).
    for i in range(20):
        moto_dynamo.call("put_item", TableName=m.table,
                         Item=mapper.to_physical(to_wire({"device": f"d{i % 5}", "seq": value(i), "v": i}), mapper.old))
    shim = ShardedTable(m, moto_dynamo, control_table="bad-ctl", refresh_seconds=60)
    try:
        shim.put_item(Item={"device": "d9", "seq": value(50), "v": Decimal(50)})
        shim.update_item(Key={"device": "d0", "seq": value(0)}, UpdateExpression="SET v = :v",
                         ExpressionAttributeValues={":v": Decimal(-1)})
        result = run_job(BACKFILL, moto_dynamo, store, m.id, JobOptions(segments=2, workers=1, page_size=6))
        assert result.done and not unmappable_items(store, m.id)
        items = scan(moto_dynamo, m.table)
        assert {i["SK"].get(t) is not None for i in items} == {True}   # the sort key keeps its type
        got = shim.get_item(Key={"device": "d0", "seq": value(0)}, ConsistentRead=True).get("Item")
        assert got["v"] == -1 and got["seq"] == value(0)
        assert shim.get_item(Key={"device": "d3", "seq": value(3)}, ConsistentRead=True).get("Item")["v"] == 3
        assert shim.get_item(Key={"device": "d9", "seq": value(50)}, ConsistentRead=True).get("Item")["v"] == 50
    finally:
        shim.close()
