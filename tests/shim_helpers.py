"""Helpers shared by the shim's functional, model and integration tests."""

from __future__ import annotations

import pathlib

from reshard.aws import local
from reshard.core.layout import NEW_COPY_ATTR, KeyMapper, is_tombstone
from reshard.core.migration import load
from reshard.shim.table import ShardedTable

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIGRATIONS = {
    "sensor": ROOT / "migrations" / "0001_sensor_events.toml",
    "invoices": ROOT / "migrations" / "0002_invoices.toml",
    "hourly": ROOT / "migrations" / "0003_sensor_hourly.toml",
}


def migration(name: str, table: str | None = None):
    """A migration from migrations/, optionally renamed to another table."""
    m = load(MIGRATIONS[name])
    if table:
        import dataclasses
        m = dataclasses.replace(m, table=table)
    return m


def create_table(dynamo, m) -> None:
    local.create_table(dynamo, m.table, m.keys)


def shim(m, dynamo, phase=None, writer_id=None, **kw) -> ShardedTable:
    """A shim with no control table, pinned to ``phase`` (None: steady)."""
    t = ShardedTable(m, dynamo, control_table=None, writer_id=writer_id, **kw)
    t._pin_phase(phase)
    return t


def scan(dynamo, table: str) -> list[dict]:
    out, kwargs = [], {"TableName": table, "ConsistentRead": True}
    while True:
        resp = dynamo.call("scan", **kwargs)
        out.extend(resp.get("Items", []))
        if not resp.get("LastEvaluatedKey"):
            return out
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def by_layout(mapper: KeyMapper, items: list[dict]) -> dict[str, dict[tuple, list[dict]]]:
    """Physical items per layout per logical identity.

    A new-layout copy carries the ``_rs_new`` marker; an unmarked item belongs to the old
    layout when that layout's rule gives it its key (for a random layout: when its key
    parses), and also to the new layout when it does not move (one item serves both).
    """
    out: dict[str, dict[tuple, list[dict]]] = {"old": {}, "new": {}}
    for item in items:
        key = {a: item[a] for a in mapper.old.key_attrs}
        if mapper.is_new_copy(item):
            fields = mapper.fields(item, mapper.new)
            assert mapper.new.key(fields) == key, f"misplaced new copy {item}"
            out["new"].setdefault(mapper.identity(fields), []).append(item)
            continue
        try:
            fields = mapper.fields(item, mapper.old)
        except Exception:
            continue
        if not mapper.old.random and mapper.old.key(fields) != key:
            continue
        out["old"].setdefault(mapper.identity(fields), []).append(item)
        if mapper.new.key(fields) == key:
            out["new"].setdefault(mapper.identity(fields), []).append(item)
    return out


def content(item: dict | None) -> dict | None:
    """What a layout says about a logical item: None if absent or a tombstone, else its
    attributes without physical keys (the version included)."""
    if item is None or is_tombstone(item):
        return None
    return {k: v for k, v in item.items() if k != NEW_COPY_ATTR}


def read_item(table, **kwargs):
    """The item a shim's ``get_item`` returned (boto3's ``{"Item": ...}`` shape), or None."""
    resp = table.get_item(**kwargs)
    assert isinstance(resp, dict) and set(resp) <= {"Item", "ResponseMetadata"}, resp
    return resp.get("Item")
