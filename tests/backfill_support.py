"""Test helpers for the backfill: tables, a migration in the backfill phase, a simulated shim, a model.

The simulated shim uses the same primitives the real shim does: the authoritative
(old) write first, fenced by the write's version, then the fenced mirror write to the
new layout (a ConditionalCheckFailed there means a newer write is already there).
"""

from __future__ import annotations

import json
import random
import threading

from reshard import errors
from reshard.aws import local
from reshard.aws.dynamo import to_wire
from reshard.control.store import ControlStore
from reshard.core.layout import NEW_COPY_ATTR, SOURCE_ATTR, KeyMapper
from reshard.core.migration import load
from reshard.core.phases import Action
from reshard.core.versions import VersionClock, fence_for, tombstone
from reshard.core.wire import dump_key, key_of
from reshard.control.transition import transition

from tests.conftest import ROOT

MIGRATIONS = {
    "sensor": ROOT / "migrations" / "0001_sensor_events.toml",
    "invoices": ROOT / "migrations" / "0002_invoices.toml",
    "hourly": ROOT / "migrations" / "0003_sensor_hourly.toml",
}


def create_table(dynamo, name: str, mapper: KeyMapper) -> None:
    local.create_table(dynamo, name, mapper.keys)


def migration_text(kind: str, table: str, mid: str | None = None) -> str:
    """The example migration file with another table name (and id), for isolated tests."""
    text = MIGRATIONS[kind].read_text()
    m = load(MIGRATIONS[kind])
    text = text.replace(f'table = "{m.table}"', f'table = "{table}"')
    if mid:
        text = text.replace(f'id = "{m.id}"', f'id = "{mid}"')
    return text


def setup_migration(dynamo, kind: str, table: str, control: str = "reshard-control", mid: str | None = None,
                    path=None):
    """Create the data table, register the migration and advance it to ``backfill``."""
    from reshard.core.migration import parse
    text = migration_text(kind, table, mid)
    if path is not None:
        path.write_text(text)
    m = parse(text, str(path or f"<{kind}>"))
    mapper = KeyMapper(m)
    create_table(dynamo, table, mapper)
    store = ControlStore(dynamo, control)
    store.register(m)
    for _ in range(3):  # planned -> dual_write -> dual_read -> backfill (no shims: acknowledged at once)
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    return m, mapper, store


def logical(kind: str, i: int, **extra) -> dict:
    """A logical item (wire format) of the migration ``kind``, number ``i``."""
    if kind == "invoices":
        base = {"invoice_number": str(100000 + i // 4), "line": str(i % 4)}
    else:
        base = {"sensor_id": f"s-{i % 7}", "event_id": f"e-{i}",
                "ts": f"2024-10-27T{i % 24:02d}:{(i // 24) % 60:02d}:{i % 60:02d}.{i:06d}Z"}
    base.update({"temp": i % 50, "note": "x" * (i % 5)})
    base.update(extra)
    return to_wire(base)


class Shim:
    """A minimal backfill-phase shim over wire items: writes old (authoritative) then new, fenced.

    ``model`` keeps the last acknowledged write per logical item as its old-layout
    physical item (a tombstone after a delete); ``hard_delete`` bypasses the shim.
    """

    def __init__(self, dynamo, mapper: KeyMapper, table: str, writer: str = "shim", seed: int = 1):
        self.dynamo = dynamo
        self.mapper = mapper
        self.table = table
        self.clock = VersionClock(writer)
        self.model: dict[tuple, dict] = {}
        self.shards: dict[tuple, int] = {}
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def ident(self, item: dict) -> tuple:
        return self.mapper.identity(self.mapper.logical_fields(item))

    def _shard(self, ident: tuple) -> int | None:
        if not self.mapper.old.random:
            return None
        return self.shards.setdefault(ident, self.rng.randrange(self.mapper.old.shards))

    def seed(self, item: dict) -> dict:
        """A pre-migration item (no version), written straight to the old layout."""
        ident = self.ident(item)
        phys = self.mapper.to_physical(item, self.mapper.old, self._shard(ident))
        self.dynamo.call("put_item", TableName=self.table, Item=phys)
        self.model[ident] = phys
        return phys

    def _fenced(self, item: dict, version: str, must: bool) -> None:
        f = fence_for(version)
        kw = {"TableName": self.table, "Item": item, "ConditionExpression": f.expression,
              "ExpressionAttributeNames": f.names}
        if f.values:
            kw["ExpressionAttributeValues"] = f.values
        try:
            self.dynamo.call("put_item", **kw)
        except errors.ConditionalCheckFailed:
            if must and not self._landed(item, version):
                raise

    def _landed(self, item: dict, version: str) -> bool:
        """A retried write whose first attempt was applied (the connection dropped after it)."""
        key = {a: item[a] for a in self.mapper.old.key_attrs}
        got = self.dynamo.call("get_item", TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        return bool(got) and got.get("_rs_v", {}).get("S") == version

    def put(self, item: dict) -> None:
        self.put_split(item)()

    def _new_copy(self, item: dict, old: dict) -> dict:
        """The new-layout physical item, marked as a new copy when its key differs from the old one
        (as the real shim does)."""
        new = self.mapper.to_physical(item, self.mapper.new)
        if key_of(new, self.mapper.old.key_attrs) != key_of(old, self.mapper.old.key_attrs):
            new[NEW_COPY_ATTR] = {"S": self.mapper.migration.id}
        return new

    def put_split(self, item: dict):
        """The authoritative write now; returns the mirror write, for the caller to run later."""
        ident = self.ident(item)
        version = self.clock.next()
        item = dict(item, _rs_v={"S": version})
        old = self.mapper.to_physical(item, self.mapper.old, self._shard(ident))
        self._fenced(old, version, must=True)        # authoritative first
        self.model[ident] = old
        new = self._new_copy(item, old)
        return lambda: self._fenced(new, version, must=False)  # fenced mirror

    def delete(self, item: dict) -> None:
        ident = self.ident(item)
        version = self.clock.next()
        keys = {f: item[f] for f in self.mapper.key_fields}
        old = tombstone(self.mapper.to_physical(keys, self.mapper.old, self._shard(ident)), version)
        self._fenced(old, version, must=True)
        self.model[ident] = old
        self._fenced(tombstone(self._new_copy(keys, old), version), version, must=False)

    def hard_delete(self, item: dict) -> None:
        ident = self.ident(item)
        old = self.mapper.to_physical({f: item[f] for f in self.mapper.key_fields}, self.mapper.old,
                                      self._shard(ident))
        self.dynamo.call("delete_item", TableName=self.table, Key=key_of(old, self.mapper.old.key_attrs))
        self.model.pop(ident, None)


def scan_all(dynamo, table: str) -> dict[str, dict]:
    out, kw = {}, {"TableName": table, "ConsistentRead": True}
    while True:
        resp = dynamo.call("scan", **kw)
        for i in resp.get("Items", []):
            out[key_str(i)] = i
        if not resp.get("LastEvaluatedKey"):
            return out
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def key_str(item: dict, attrs=("PK", "SK")) -> str:
    return json.dumps({a: item[a] for a in attrs if a in item}, sort_keys=True)


def expected_table(mapper: KeyMapper, model: dict[tuple, dict], unmappable: list[dict] = ()) -> dict[str, dict]:
    """What the table must hold after a complete backfill: each model item in both layouts, once."""
    out = {}
    for old in list(model.values()) + list(unmappable):
        out[key_str(old)] = old
    for old in model.values():
        new, moves = mapper.remap(old)
        if moves and "_rs_v" not in old:
            # The backfill stamps its copy of a pre-migration item with the item's old key.
            new[SOURCE_ATTR] = {"S": dump_key(key_of(old, mapper.old.key_attrs))}
        out[key_str(new)] = new
    return out


def diff(actual: dict, expected: dict) -> list[str]:
    problems = []
    for k in expected.keys() - actual.keys():
        problems.append(f"missing {k}")
    for k in actual.keys() - expected.keys():
        problems.append(f"unexpected {k}: {actual[k]}")
    for k in expected.keys() & actual.keys():
        if expected[k] != actual[k]:
            problems.append(f"differs {k}: {actual[k]} != {expected[k]}")
    return sorted(problems)
