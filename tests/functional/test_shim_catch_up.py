"""Catch-up after an authority switch (issue 25, case 3) for every write path, on moto.

A layout's copy is made newer than the authoritative one by hand (a mirror that never landed),
then a shim pinned to the phase with ``newer_may_be`` set writes the item: put, update, delete,
``batch_writer``, with a calculated and a random-suffix old layout. The interleavings through
the proxy are in tests/integration/test_late_writes_shim.py.
"""

from __future__ import annotations

import pytest

from reshard.aws.dynamo import to_wire
from reshard.core.layout import NEW_COPY_ATTR, VERSION_ATTR, KeyMapper, hash_shard
from reshard.shim.table import ShardedTable
from tests.shim_helpers import create_table, migration, scan


def _pinned(m, dynamo, phase, flag=None) -> ShardedTable:
    t = ShardedTable(m, dynamo, control_table=None)
    t._phases.pin(phase, newer_may_be=flag)
    return t


def _setup(moto_dynamo, kind: str):
    m = migration(kind, table=f"{kind}-catch-up")
    create_table(moto_dynamo, m)
    return m, KeyMapper(m)


def _item(kind: str, i: int, **extra) -> dict:
    if kind == "invoices":
        return {"invoice_number": str(5000 + i), "line": "1", **extra}
    return {"sensor_id": "s-1", "event_id": f"e-{i}", "ts": f"2024-10-27T15:00:{i:02d}Z", **extra}


def _key(kind: str, item: dict) -> dict:
    fields = ("invoice_number", "line") if kind == "invoices" else ("sensor_id", "event_id", "ts")
    return {f: item[f] for f in fields}


def _moving(kind: str, mapper: KeyMapper) -> dict:
    for i in range(200):
        item = _item(kind, i)
        fields = mapper.logical_fields(to_wire(item))
        old = (mapper.old.key(fields, hash_shard("#".join(mapper.identity(fields)), mapper.old.shards))
               if mapper.old.random else mapper.old.key(fields))
        if old != mapper.new.key(fields):
            return item
    raise AssertionError("no moving item")


def _behind(moto_dynamo, m, mapper, kind: str, stale_side: str, item: dict, newer: dict) -> None:
    """Both layouts hold ``item``; then ``newer`` lands on the other layout only (its mirror lost)."""
    _pinned(m, moto_dynamo, "backfill").put_item(Item=item)
    fresh_side = "new" if stale_side == "old" else "old"
    writer = _pinned(m, moto_dynamo, "backfill" if fresh_side == "old" else "cutover")
    # The writer's write with its mirror cut off: only the fresh side gets it.
    writer._mirror_to = lambda mirrors, it: None
    writer.put_item(Item=newer)
    stored = [i for i in scan(moto_dynamo, m.table) if i.get("val") == {"N": str(newer["val"])}]
    assert len(stored) == 1, stored  # one layout is behind
    assert (NEW_COPY_ATTR in stored[0]) == (fresh_side == "new")


def _layouts(moto_dynamo, m) -> list[dict]:
    """Every stored copy, without physical keys and the new-copy marker."""
    drop = {"PK", "SK", NEW_COPY_ATTR}
    return sorted(({k: v for k, v in i.items() if k not in drop} for i in scan(moto_dynamo, m.table)),
                  key=lambda i: i.get(VERSION_ATTR, {}).get("S", ""))


@pytest.mark.parametrize("kind", ["sensor", "invoices"])
@pytest.mark.parametrize("phase,flag", [("backfill", "new"), ("cutover", "old")])
def test_every_write_path_builds_on_the_newer_copy(moto_dynamo, kind, phase, flag):
    m, mapper = _setup(moto_dynamo, kind)
    item = _moving(kind, mapper)
    _behind(moto_dynamo, m, mapper, kind, "new" if flag == "old" else "old", {**item, "val": 1, "n": 1},
            {**item, "val": 2, "n": 10})
    t = _pinned(m, moto_dynamo, phase, flag)
    key = _key(kind, item)
    # A read sees the newer copy.
    assert t.get_item(Key=key, ConsistentRead=True)["Item"] == {**item, "val": 2, "n": 10}
    # update: builds on it; both layouts end equal.
    out = t.update_item(Key=key, UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1},
                        ReturnValues="ALL_NEW")
    assert out["Attributes"] == {**item, "val": 2, "n": 11}
    copies = _layouts(moto_dynamo, m)
    assert len(copies) == 2 and copies[0] == copies[1], copies


@pytest.mark.parametrize("kind", ["sensor", "invoices"])
@pytest.mark.parametrize("phase,flag", [("backfill", "new"), ("cutover", "old")])
def test_put_delete_and_batch_writer_catch_up_first(moto_dynamo, kind, phase, flag):
    m, mapper = _setup(moto_dynamo, kind)
    item = _moving(kind, mapper)
    stale = "new" if flag == "old" else "old"
    key = _key(kind, item)
    # put with the app's condition on the newer copy, and ReturnValues=ALL_OLD from it.
    _behind(moto_dynamo, m, mapper, kind, stale, {**item, "val": 1}, {**item, "val": 2})
    t = _pinned(m, moto_dynamo, phase, flag)
    out = t.put_item(Item={**item, "val": 3}, ConditionExpression="val = :two",
                     ExpressionAttributeValues={":two": 2}, ReturnValues="ALL_OLD")
    assert out["Attributes"] == {**item, "val": 2}
    copies = _layouts(moto_dynamo, m)
    assert len(copies) == 2 and copies[0] == copies[1] and copies[0]["val"] == {"N": "3"}
    # delete: its ALL_OLD is the newer copy, and both layouts end deleted.
    moto_dynamo.call("delete_item", TableName=m.table, Key={a: scan(moto_dynamo, m.table)[0][a] for a in ("PK", "SK")})
    moto_dynamo.call("delete_item", TableName=m.table, Key={a: scan(moto_dynamo, m.table)[0][a] for a in ("PK", "SK")})
    _behind(moto_dynamo, m, mapper, kind, stale, {**item, "val": 4}, {**item, "val": 5})
    out = t.delete_item(Key=key, ReturnValues="ALL_OLD")
    assert out["Attributes"] == {**item, "val": 5}
    assert t.get_item(Key=key, ConsistentRead=True).get("Item") is None
    assert _pinned(m, moto_dynamo, "backfill").get_item(Key=key, ConsistentRead=True).get("Item") is None
    # batch_writer (individual fenced writes in these phases): a put over the newer copy.
    for i in scan(moto_dynamo, m.table):
        moto_dynamo.call("delete_item", TableName=m.table, Key={a: i[a] for a in ("PK", "SK")})
    _behind(moto_dynamo, m, mapper, kind, stale, {**item, "val": 6}, {**item, "val": 7})
    with t.batch_writer() as b:
        b.put_item(Item={**item, "val": 8})
    copies = _layouts(moto_dynamo, m)
    assert len(copies) == 2 and copies[0] == copies[1] and copies[0]["val"] == {"N": "8"}


def test_without_the_flag_nothing_is_read_first(moto_dynamo):
    """The cost: catch-up reads only while the flag is set."""
    m, mapper = _setup(moto_dynamo, "sensor")
    item = _moving("sensor", mapper)
    t = _pinned(m, moto_dynamo, "cutover")
    before = dict(moto_dynamo.stats.calls)
    t.put_item(Item={**item, "val": 1})
    assert moto_dynamo.stats.calls.get("batch_get_item", 0) == before.get("batch_get_item", 0)
    flagged = _pinned(m, moto_dynamo, "cutover", "old")
    flagged.put_item(Item={**item, "val": 2})
    assert moto_dynamo.stats.calls.get("batch_get_item", 0) == before.get("batch_get_item", 0) + 1
