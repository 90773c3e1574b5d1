"""Any attribute name is safe: reserved words, '.', '#', ':', '-', spaces and non-ASCII in the
key attributes, the templates' fields, shard_by and the application's items.

* a property test (hypothesis) over field names: parse, route to both layouts and back;
* one small migration on dynalite whose every name is awkward, from plan to complete with
  a shim writing in each phase; every request is recorded and no expression text
  (``*Expression``) contains an attribute name (always a ``#placeholder``); verify passes
  and the application reads back exactly what it wrote.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from reshard.cli.main import main
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse
from reshard.shim.table import ShardedTable

from tests.iam_support import Recorder
from tests.shim_helpers import read_item

# Awkward names, and the characters a generated one is built from.
KEY_PK, KEY_SK = "pk select.#:-é", "order"
F_USER, F_TS, F_EVENT = "user id", "ts.名前", "event#id-2"
APP_ATTRS = ("status", "a.b", "x#y", "c:d", "with space", "名前", "-dash", "size", "#", ":v")
NAME_CHARS = st.sampled_from(list("aZ_.#-é名 ") + ["select", "order", "status", "size"])


def q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a TOML basic string


def migration_toml(mid: str, table: str, f_user: str = F_USER, f_ts: str = F_TS, f_event: str = F_EVENT,
                   pk: str = KEY_PK, sk: str = KEY_SK) -> str:
    layout = f"""partition = {q("{" + f_user + "}#{shard}")}
sort = {q("{" + f_ts + "}")}
shard_by = [{q(f_event)}]
hash = "sha256"
"""
    return f"""id = {q(mid)}
table = {q(table)}

[keys]
partition = {q(pk)}
sort = {q(sk)}

[from]
shards = 4
{layout}
[to]
shards = 8
{layout}"""


names = st.lists(NAME_CHARS, min_size=1, max_size=4).map("".join).map(str.strip).filter(bool)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(names, names, names, st.text(min_size=1, max_size=6), st.text(min_size=1, max_size=6))
def test_any_field_name_routes_to_both_layouts_and_back(f_user, f_ts, f_event, user, ts):
    if len({f_user, f_ts, f_event, "shard", KEY_PK, KEY_SK}) < 6:
        return  # fields must differ from each other, from {shard} and from the key attributes
    m = parse(migration_toml("m", "Tbl", f_user, f_ts, f_event), "<generated>")
    mapper = KeyMapper(m)
    logical = {KEY_PK + "x": {"S": "other"}, f_user: {"S": user}, f_ts: {"S": ts}, f_event: {"S": "e"}}
    for layout in (mapper.old, mapper.new):
        physical = mapper.to_physical(logical, layout)
        assert set(physical) >= {KEY_PK, KEY_SK}
        back = mapper.fields(physical, layout)
        assert back[f_user] == user and back[f_ts] == ts


def test_awkward_names_through_plan_backfill_verify_cleanup_and_the_shim(dynalite_server, tmp_path, monkeypatch,
                                                                           capsys):
    from reshard.aws import local
    from reshard.aws.dynamo import Dynamo, to_wire

    table = f"t-names-{uuid.uuid4().hex[:8]}"
    control = f"{table}-ctl"
    path = tmp_path / "m.toml"
    path.write_text(migration_toml("awkward-names", table))
    m = parse(path.read_text(), str(path))
    mapper = KeyMapper(m)
    setup = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1")
    local.create_table(setup, table, mapper.keys)
    expected: dict[str, dict] = {}

    def logical(i: int) -> dict:
        return {F_USER: f"u {i % 3}", F_TS: f"2024-01-01T00:00:{i:02d}", F_EVENT: f"e#{i}",
                **{a: f"{a}={i}" for a in APP_ATTRS}}

    for i in range(6):  # written before the migration, in the old layout
        item = to_wire(logical(i))
        setup.call("put_item", TableName=table, Item=mapper.to_physical(item, mapper.old) | item)
        expected[f"e#{i}"] = logical(i)

    rec = Recorder()
    rec.install(monkeypatch)
    g = ["--endpoint-url", dynalite_server.endpoint, "--control-table", control]
    n = [100]

    def run(*args: str) -> None:
        assert main([*args, *g]) == 0, (args, capsys.readouterr())

    def traffic() -> None:
        with ShardedTable.from_file(str(path), endpoint_url=dynalite_server.endpoint, control_table=control,
                                    refresh_seconds=60) as shim:
            n[0] += 1
            item = logical(n[0])
            key = {F_USER: item[F_USER], F_TS: item[F_TS], F_EVENT: item[F_EVENT]}
            shim.put_item(Item=item, ConditionExpression="attribute_not_exists(#s)",
                          ExpressionAttributeNames={"#s": "status"})
            shim.update_item(Key=key, UpdateExpression="SET #a = :v, #b = :v REMOVE #c",
                             ConditionExpression="#d = :d",
                             ExpressionAttributeNames={"#a": "a.b", "#b": "名前", "#c": "c:d", "#d": "with space"},
                             ExpressionAttributeValues={":v": "new", ":d": item["with space"]})
            item.update({"a.b": "new", "名前": "new"})
            del item["c:d"]
            expected[item[F_EVENT]] = item
            old = logical(n[0] % 6)  # a pre-migration item, changed and read through the shim
            shim.update_item(Key={F_USER: old[F_USER], F_TS: old[F_TS], F_EVENT: old[F_EVENT]},
                             UpdateExpression="SET #s = :s", ExpressionAttributeNames={"#s": "size"},
                             ExpressionAttributeValues={":s": Decimal(n[0])})
            expected[old[F_EVENT]]["size"] = Decimal(n[0])
            for it in expected.values():
                k = {F_USER: it[F_USER], F_TS: it[F_TS], F_EVENT: it[F_EVENT]}
                assert read_item(shim, Key=k, ConsistentRead=True) == it
            assert sorted(i[F_EVENT] for i in shim.query(Key={F_USER: "u 1"}).get("Items", [])) == sorted(
                e for e, it in expected.items() if it[F_USER] == "u 1")

    run("plan", str(path), "--sample", "10", "--segments", "1")
    run("start", str(path))
    traffic()
    for _ in range(3):  # dual_write, dual_read, backfill
        run("advance", m.id, "--allow-no-shims")
        traffic()
    run("backfill", m.id, "--segments", "2")
    run("verify", m.id, "--segments", "2")  # exit 0: no difference
    run("advance", m.id, "--allow-no-shims")  # cutover
    traffic()
    run("verify", m.id, "--segments", "2")  # the catch-up verify after the switch
    run("advance", m.id, "--allow-no-shims")  # cleanup
    traffic()
    run("cleanup", m.id, "--segments", "2", "--delete")
    run("advance", m.id, "--allow-no-shims")  # complete
    traffic()

    awkward = {KEY_PK, KEY_SK, F_USER, F_TS, F_EVENT, *APP_ATTRS} - {"#", ":v"}  # those two are placeholders' shape
    seen = 0
    for _, op, params in rec.calls:
        for field, text in params.items():
            if field.endswith("Expression"):
                seen += 1
                raw = [a for a in awkward if a in text]
                assert raw == [], (op, field, text)
    assert seen > 20
