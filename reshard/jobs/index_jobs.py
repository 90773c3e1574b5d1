"""The data jobs of an index-only migration: rewrite a sharded GSI attribute in place, verify it.

Items keep their keys, so there is nothing to copy and nothing to expire: the whole
migration is one attribute per item, rewritten from the ``from`` layout's value to the
``to`` layout's (:mod:`reshard.core.index`).

The rewrite (``reshard backfill``; abort's ``reshard cleanup`` runs it backwards)
    Per page of one parallel-scan segment: for each item in the GSI whose value is not
    already the destination layout's, one UpdateItem ``SET <attr> = :dest`` conditioned on
    the item as scanned: ``_rs_v = :scanned`` (or, for a pre-migration item,
    ``attribute_not_exists(_rs_v) AND attribute_exists(<pk>)``) and ``<attr> = :seen``.
    Never a blind write: a delete since the scan fails the condition, so the item is never
    re-created (UpdateItem would otherwise upsert it); a shim write since the scan stamped a
    newer ``_rs_v`` and fails it too, and that write stays -- in the rewrite's phase shims
    write the destination value themselves (``INDEX_ROUTING``), so nothing is left behind.
    ``_rs_v`` is kept: the content did not change, so a racing shim write still wins its own
    fence. After a failed condition the item is read again (consistently): deleted, or now at
    the destination value, it is left to that write; still at its source value (a write that
    did not touch the attribute), it is rewritten again under the same kind of condition.
    Counted: ``moved`` (written), ``already`` (at the destination value), ``raced`` (the
    condition failed and the item needed nothing more), ``not_indexed`` (outside a sparse GSI: left alone),
    ``unmappable`` (a missing field, or a value of neither layout: listed, left alone).

Verify (``reshard verify``)
    Every item in the GSI must hold the ``to`` layout's value (``gsi_value``; a suspect is
    re-read consistently before it counts, a shim write may have just fixed it), and per
    page one item (a probe) must be returned exactly once by the fan-out query a reader
    issues over every new partition value (``gsi_query``; GSIs are eventually consistent,
    so it is re-asked ``--rechecks`` times before it counts).
"""

from __future__ import annotations

import hashlib
import json
import random
import time

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.records import example_prefix, unmappable_sk
from reshard.control.store import ControlStore
from reshard.core.capacity import items_read_units, write_units
from reshard.core.index import NEW, OLD, IndexMapper, mappers
from reshard.core.index_planning import index_entry_size
from reshard.core.layout import is_tombstone, item_size
from reshard.core.migration import Keys
from reshard.core.phases import BACKFILL_JOB, VERIFY_JOB, Phase
from reshard.core.versions import unchanged, version_of
from reshard.core.wire import N, S, dump_key, key_of
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import PageContext
from reshard.jobs.runner import (DEFAULT_PAGE_SIZE, JobContext, JobOptions, JobSpec, announce_repair, count_writes,
                                 scan_page)

REWRITE_COUNTERS = ("scanned", "moved", "already", "raced", "not_indexed", "unmappable", "rcu", "wcu")

#: Rewrites of one item whose condition failed (a write since the scan or the last read).
_TRIES = 3


def _projections(dynamo: Dynamo, table: str) -> dict[str, dict]:
    desc = dynamo.describe_table(table)
    return {g["IndexName"]: g.get("Projection", {"ProjectionType": "ALL"})
            for g in desc.get("GlobalSecondaryIndexes", [])}


class IndexRewrite:
    """The page function of the rewrite toward ``dest`` (``"new"``: backfill; ``"old"``: abort's cleanup)."""

    def __init__(self, dynamo: Dynamo, store: ControlStore, migration_id: str, job: str, index_mappers: dict,
                 keys: Keys, table: str, budget: CapacityBudget, dest: str, projections: dict,
                 page_size: int = DEFAULT_PAGE_SIZE, concurrency: int = 1, rng: random.Random | None = None):
        self.dynamo, self.store, self.migration_id, self.job = dynamo, store, migration_id, job
        self.mappers: list[IndexMapper] = list(index_mappers.values())
        self.keys = keys
        self.key_attrs = [keys.partition] + ([keys.sort] if keys.sort else [])
        self.table = table
        self.budget = budget
        self.dest = dest
        self.source = OLD if dest == NEW else NEW
        self.projections = projections
        self.page_size = page_size
        self.concurrency = concurrency
        self.rng = rng or random.Random()

    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        counts = dict.fromkeys(REWRITE_COUNTERS, 0)
        self.budget.take_usage()
        resp = scan_page(self.dynamo, self.budget, self.table, ctx, start_key, self.page_size)
        items = resp.get("Items", [])
        counts["scanned"] = len(items)
        work = []
        for item in items:
            outcome, changes = self.plan(item)
            if changes:
                work.append((item, changes))
            else:
                counts[outcome] += 1
        count_writes(ctx, self.budget, self._update, work, self.concurrency, counts)
        return counts, resp.get("LastEvaluatedKey")

    def plan(self, item: dict) -> tuple[str, list]:
        """What the rewrite does to one scanned item: (counter, [(mapper, seen, value)]).

        The changes of every index of the item go into one UpdateItem."""
        if is_tombstone(item):
            return "not_indexed", []  # a leftover delete marker of an earlier migration: not an item
        changes, indexed = [], False
        for m in self.mappers:
            if not m.in_index(item):
                continue
            indexed = True
            try:
                if m.is_at(item, self.dest):
                    continue
                if not m.is_at(item, self.source):
                    raise errors.UnmappableItem(
                        "off-layout", f"index {m.name}: {m.attr} = {_show(item[m.attr])} is a value of neither layout")
                changes.append((m, item[m.attr], m.value(m.fields(item, self.dest), self.dest, self.rng)))
            except errors.UnmappableItem as e:
                self.record_unmappable(item, e)
                return "unmappable", []
        if not indexed:
            return "not_indexed", []
        return ("already", []) if not changes else ("moved", changes)

    def _update(self, guard, work: tuple[dict, list]) -> str:
        """The conditioned UpdateItem (module docstring); after a failed condition, the item is
        re-read and, if it still needs the rewrite (a write that left its GSI value alone,
        e.g. an UpdateItem of other attributes), rewritten again, conditioned on what was read."""
        for _ in range(_TRIES):
            outcome = self._update_once(guard, work)
            if outcome != "raced":
                return outcome
            fresh = self._read(key_of(work[0], self.key_attrs))
            # Gone (deleted: it stays deleted), or the racing write set the value itself.
            outcome, changes = self.plan(fresh) if fresh is not None else ("raced", [])
            if not changes:
                return "raced"
            work = (fresh, changes)
        return "raced"  # kept changing under us: the next verify judges it

    def _read(self, key: dict) -> dict | None:
        with self.budget.spend("read", 1.0):
            return self.dynamo.call("get_item", TableName=self.table, Key=key, ConsistentRead=True,
                                    ReturnConsumedCapacity="TOTAL").get("Item")

    def _update_once(self, guard, work: tuple[dict, list]) -> str:
        item, changes = work
        fence = unchanged(version_of(item), self.keys.partition)
        names = dict(fence.names)
        values = dict(fence.values)
        sets, conds = [], [f"({fence.expression})"]
        units = write_units(item_size(item))
        for i, (m, seen, value) in enumerate(changes):
            names[f"#g{i}"] = m.attr
            values[f":g{i}"] = value
            values[f":seen{i}"] = seen
            sets.append(f"#g{i} = :g{i}")
            conds.append(f"#g{i} = :seen{i}")
            # The GSI key changes: the index deletes the old entry and puts the new one.
            units += 2 * write_units(index_entry_size(item, self.keys, m.spec,
                                                      self.projections.get(m.name, {"ProjectionType": "ALL"})))
        try:
            with self.budget.spend("write", units):
                self.dynamo.call("update_item", guard=guard, TableName=self.table, Key=key_of(item, self.key_attrs),
                                 UpdateExpression="SET " + ", ".join(sets), ConditionExpression=" AND ".join(conds),
                                 ExpressionAttributeNames=names, ExpressionAttributeValues=values,
                                 ReturnConsumedCapacity="TOTAL")
            return "moved"
        except errors.ConditionalCheckFailed:
            # Written or deleted since the scan: that write stays (in this phase shims
            # write the destination value themselves), and a deleted item stays deleted.
            return "raced"

    def record_unmappable(self, item: dict, e: errors.UnmappableItem) -> None:
        """``U#<job>#<digest>``: the item's key, the reason and the detail (idempotent put)."""
        key = dump_key(key_of(item, [a for a in self.key_attrs if a in item]))
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        self.store.put({"pk": S(self.store.jpk(self.migration_id, self.job)), "sk": S(unmappable_sk(self.job, digest)),
                        "job": S(self.job), "old_key": S(key), "reason": S(e.reason), "detail": S(e.detail[:1000]),
                        "size": N(item_size(item)), "at": N(time.time())})


class IndexVerifier:
    """The page function of verify for an index-only migration (module docstring)."""

    def __init__(self, dynamo: Dynamo, store: ControlStore, migration_id: str, run: int, index_mappers: dict,
                 keys: Keys, table: str, budget: CapacityBudget, opts: JobOptions, sleep=time.sleep,
                 repair: IndexRewrite | None = None):
        self.dynamo, self.store, self.migration_id, self.run = dynamo, store, migration_id, run
        self.repair = repair
        self.mappers: list[IndexMapper] = list(index_mappers.values())
        self.keys = keys
        self.key_attrs = [keys.partition] + ([keys.sort] if keys.sort else [])
        self.table = table
        self.budget = budget
        self.opts = opts
        self.sleep = sleep
        self.collected: list | None = None  # read-only verify: examples kept here, not written

    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        counts = {"scanned": 0, "checked": 0, "probes": 0, "gsi_value": 0, "gsi_query": 0, "unmappable": 0,
                  "repaired": 0}
        self.budget.take_usage()
        resp = scan_page(self.dynamo, self.budget, self.table, ctx, start_key, self.opts.page_size)
        items = resp.get("Items", [])
        counts["scanned"] = len(items)
        probes: dict[str, dict] = {}
        for item in items:
            if is_tombstone(item):
                continue
            checked = False
            for m in self.mappers:
                if not m.in_index(item):
                    continue
                checked = True
                try:
                    fresh = self._not_at_new(m, item)
                except errors.UnmappableItem as e:
                    counts["unmappable"] += 1
                    self.example("unmappable", item, m, e.detail)
                    continue
                if fresh is not None:
                    counts["gsi_value"] += 1
                    if self.repair is not None:
                        # The same conditioned UpdateItem as the backfill's, on the item as re-read.
                        _, changes = self.repair.plan(fresh)
                        if changes:
                            announce_repair(self.store, self.migration_id, self.run, counts)
                        if changes and self.repair._update(ctx.write_guard, (fresh, changes)) == "moved":
                            counts["repaired"] += 1
                elif m.name not in probes:
                    probes[m.name] = item
            counts["checked"] += checked
        for m in self.mappers:
            if m.name in probes:
                counts["probes"] += 1
                counts["gsi_query"] += self._probe(m, probes[m.name])
        usage = self.budget.take_usage()
        counts["rcu"], counts["wcu"] = round(usage["rcu"], 2), round(usage["wcu"], 2)
        return counts, resp.get("LastEvaluatedKey")

    def _not_at_new(self, m: IndexMapper, item: dict) -> dict | None:
        """The item as re-read when its GSI value is not the new layout's, else None."""
        if m.is_at(item, NEW):
            return None
        fresh = self._read(item)  # a shim write may have just fixed it: judge the item as it is now
        if fresh is None or is_tombstone(fresh) or not m.in_index(fresh) or m.is_at(fresh, NEW):
            return None
        if not m.is_at(fresh, OLD):  # the backfill listed and skipped it: it counts against the allowance
            raise errors.UnmappableItem("off-layout", f"{m.attr} = {_show(fresh[m.attr])} is a value of neither layout")
        self.example("gsi_value", fresh, m, f"{m.attr} = {_show(fresh.get(m.attr, {'NULL': True}))}, the [to] layout "
                                            f"gives {_show(m.value(m.fields(fresh, NEW), NEW))}")
        return fresh

    def _probe(self, m: IndexMapper, item: dict) -> int:
        """0 when the reader's fan-out over every new partition value returns ``item`` exactly once."""
        found = 0
        for _ in range(max(1, self.opts.rechecks)):
            found = self._fan_out_count(m, item)
            if found == 1:
                return 0
            fresh = self._read(item)
            if fresh is None or not m.in_index(fresh) or fresh.get(m.attr) != item.get(m.attr):
                return 0  # it changed or went since the scan: nothing to judge
            self.sleep(self.opts.recheck_pause)
        self.example("gsi_query", item, m, f"a fan-out query over the new {m.attr} values returned it {found} times")
        return 1

    def _fan_out_count(self, m: IndexMapper, item: dict) -> int:
        eq = {f: item[f] for f in m.partition_fields() if f in item}
        names = {"#g": m.attr, **{f"#k{i}": a for i, a in enumerate(self.key_attrs)}}
        cond = "#g = :g"
        values = {f":k{i}": item[a] for i, a in enumerate(self.key_attrs)}
        if m.sort_attr:
            names["#s"] = m.sort_attr
            values[":s"] = item[m.sort_attr]
            cond += " AND #s = :s"
        flt = " AND ".join(f"#k{i} = :k{i}" for i in range(len(self.key_attrs)))
        n = 0
        for value in m.query_values(NEW, eq):
            kwargs = {"TableName": self.table, "IndexName": m.name, "KeyConditionExpression": cond,
                      "FilterExpression": flt, "ExpressionAttributeNames": names,
                      "ExpressionAttributeValues": {**values, ":g": value}, "ReturnConsumedCapacity": "TOTAL"}
            while True:
                with self.budget.spend("read", 0.5):
                    resp = self.dynamo.call("query", **kwargs)
                n += len(resp.get("Items", []))
                if not resp.get("LastEvaluatedKey"):
                    break
                kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return n

    def _read(self, item: dict) -> dict | None:
        with self.budget.spend("read", items_read_units([item])):
            return self.dynamo.call("get_item", TableName=self.table, Key=key_of(item, self.key_attrs),
                                    ConsistentRead=True, ReturnConsumedCapacity="TOTAL").get("Item")

    def example(self, kind: str, item: dict, m: IndexMapper, detail: str) -> None:
        key = dump_key(key_of(item, [a for a in self.key_attrs if a in item]))
        body = {"kind": kind, "identity": [key], "old_key": key, "new_key": f"index {m.name}",
                "old_version": version_of(item), "new_version": "", "detail": detail}
        text = json.dumps(body, sort_keys=True)
        if self.collected is not None:
            self.collected.append(body)
            return
        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        self.store.put({"pk": S(self.store.jpk(self.migration_id, VERIFY_JOB)),
                        "sk": S(example_prefix(VERIFY_JOB, self.run) + digest), "body": S(text)})


def _show(av: dict) -> str:
    (t, v), = av.items()
    return f"{v!r} ({t})"


# --------------------------------------------------------------------------- JobSpecs

def _rewrite_page(dest: str, job: str):
    def make(ctx: JobContext):
        m = ctx.migration
        return IndexRewrite(ctx.dynamo, ctx.store, ctx.state.id, job, mappers(m.indexes), m.keys, m.table, ctx.budget,
                            dest, _projections(ctx.dynamo, m.table), ctx.options.page_size,
                            ctx.options.concurrency).page
    return make


def _verify_page(ctx: JobContext):
    m = ctx.migration
    repair = None
    if ctx.options.repair:  # backfill phase only (JOB_RULES): shims write the new value, as the rewrite does
        repair = IndexRewrite(ctx.dynamo, ctx.store, ctx.state.id, VERIFY_JOB, mappers(m.indexes), m.keys, m.table,
                              ctx.budget, NEW, _projections(ctx.dynamo, m.table))
    return IndexVerifier(ctx.dynamo, ctx.store, ctx.state.id, ctx.run, mappers(m.indexes), m.keys, m.table,
                         ctx.budget, ctx.options, ctx.sleep, repair=repair).page


def _nothing_to_expire(ctx: JobContext):
    def page(pctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        return {"index_only": 1}, None
    return page


def _cleanup_page(ctx: JobContext):
    if ctx.state.phase is Phase.ABORTED:
        return _rewrite_page(OLD, "cleanup")(ctx)  # abort: every item back to an old value, then retire
    return _nothing_to_expire(ctx)


def index_spec(spec: JobSpec) -> JobSpec:
    """The index-only variant of a data job's spec (same name, checks, run choice and finish)."""
    from dataclasses import replace
    make = {BACKFILL_JOB: _rewrite_page(NEW, BACKFILL_JOB), VERIFY_JOB: _verify_page, "cleanup": _cleanup_page}
    if spec.name not in make:
        raise errors.BadInput(f"{spec.name} does not apply to an index-only migration")
    # cleanup's TTL check (prepare) has nothing to do: nothing expires.
    return replace(spec, make_page=make[spec.name], join=False,  # item by item: no join segment
                   prepare=(lambda ctx: None) if spec.name == "cleanup" else spec.prepare)
