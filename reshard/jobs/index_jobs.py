"""The data jobs of an index-only migration: rewrite a sharded GSI attribute in place, verify it.

Items keep their keys, so there is nothing to copy and nothing to expire: the whole
migration is one attribute per item, rewritten from the ``from`` layout's value to the
``to`` layout's (:mod:`reshard.core.index`).

Cleanup (``reshard cleanup``)
    Nothing expires, but shims delete with versioned tombstones in every phase (issue 25: a
    held older put must not land on an empty key): the pass scans consistently and deletes each
    tombstone only while it still is one (``still_tombstone``) and, with a server deadline,
    ``H + 2`` s after the scan answer that saw it (``runner.removal_hold``). In ``aborted`` the
    same pass also rewrites every item back to its old value, then the migration is retired.

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
    Proves the index, read the way cutover shims read it (every ``[to]`` partition value of
    each logical partition), returns exactly the items a scan of the table says carry it.
    *Scan segments*: every item in the GSI must hold the ``to`` layout's value (``gsi_value``;
    a suspect is re-read consistently before it counts, a shim write may have just fixed it;
    ``--repair`` rewrites it as the backfill does), and every item carrying the index's
    attributes leaves a compact record (:mod:`reshard.core.index_join`: table key, GSI
    partition and sort value, ``_rs_v``) in this host's segment files
    (:mod:`reshard.jobs.records`, as the table verify's).
    *The join segment* (the run's last, claimed once every scan segment is done): queries
    every ``[to]`` partition value of each logical partition the scan recorded (``{shard}``
    alone: one; ``{region}#{shard}``: each region seen), no sort condition, all pages,
    eventually consistent, a record per entry, spilled page by page; joins both sides by
    (index, table key) in SQLite's external sort (memory bounded at any size). Each
    disagreement -- missing from the index (``gsi_missing``), an entry the table does not
    carry or a second one (``gsi_extra``), another partition/sort value or version
    (``gsi_differs``) -- is re-checked with a consistent GetItem and targeted index queries
    (partition and sort value = the item's and where the join saw it), and reported only
    when it stayed the same (item version, GSI keys, entries) on two looks and for the
    settle window (:mod:`reshard.core.settle`), or kept changing: an item a shim wrote
    meanwhile is judged on its new state. The index side's read units are counted apart
    (``index_rcu``; ``index_queries``, ``index_entries``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import shutil
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import NamedTuple

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.fleet import heartbeats
from reshard.control.records import example_prefix, unmappable_sk
from reshard.control.store import ControlStore
from reshard.core.capacity import items_read_units, write_units
from reshard.core.index import NEW, OLD, IndexMapper, mappers
from reshard.core.index_join import (GSI_DIFFERS, GSI_EXTRA, GSI_MISSING, SCAN, entry_record, judge, partition_of,
                                     prefix_fields, scan_record, targets)
from reshard.core.index_join import verdict as index_verdict
from reshard.core.index_planning import index_entry_size
from reshard.core.join import COLUMNS, fields_from_text, from_row
from reshard.core.layout import VERSION_ATTR, is_tombstone, item_size, not_data
from reshard.core.migration import Keys
from reshard.core.phases import BACKFILL_JOB, CLEANUP_JOB, VERIFY_JOB, Phase
from reshard.core.deadlines import DATE_MARGIN_SECONDS
from reshard.core.settle import Watch, decide, settle_window
from reshard.core.versions import still_tombstone, unchanged, version_of
from reshard.core.wire import N, S, dump_key, key_of, projection
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import LeaseLost, PageContext, settle_text, settle_wait
from reshard.jobs.records import END, RESCAN_TOKEN, Join, RunRecords, SegmentFiles, StaleWrite, _groups, segment_path
from reshard.jobs.records import complete as records_complete
from reshard.jobs.runner import (DEFAULT_PAGE_SIZE, JobContext, JobOptions, JobSpec, announce_repair,
                                 conditional_delete, count_writes, hold_after_scan, removal_hold, scan_page)

REWRITE_COUNTERS = ("scanned", "moved", "already", "raced", "not_indexed", "unmappable", "rcu", "wcu")
#: What cleanup's pass counts besides (the tombstones it deleted, or found changed since the scan).
RETIRE_COUNTERS = ("tombstones_retired", "changed_meanwhile")

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
                 page_size: int = DEFAULT_PAGE_SIZE, concurrency: int = 1, rng: random.Random | None = None,
                 retire_tombstones: bool = False, hold_seconds: float = 0.0, sleep=time.sleep,
                 monotonic=time.monotonic):
        self.dynamo, self.store, self.migration_id, self.job = dynamo, store, migration_id, job
        #: ``reshard cleanup``'s pass (``dest`` None in ``cleanup``: nothing to rewrite; OLD in
        #: ``aborted``) also deletes the shims' tombstones, each ``hold_seconds`` after the scan
        #: answer that saw it (``runner.removal_hold``) and only while it still is one.
        self.retire_tombstones = retire_tombstones
        self.hold_seconds = hold_seconds
        self.sleep, self.monotonic = sleep, monotonic
        self.mappers: list[IndexMapper] = list(index_mappers.values())
        self.keys = keys
        self.key_attrs = [keys.partition] + ([keys.sort] if keys.sort else [])
        self.table = table
        self.budget = budget
        self.dest = dest
        self.source = None if dest is None else OLD if dest == NEW else NEW
        self.projections = projections
        self.page_size = page_size
        self.concurrency = concurrency
        self.rng = rng or random.Random()

    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        counts = dict.fromkeys(REWRITE_COUNTERS + (RETIRE_COUNTERS if self.retire_tombstones else ()), 0)
        self.budget.take_usage()
        # The abort's rewrite back to old values is consistent: a backfill's rewrite that landed
        # a moment ago would show its item still at the old value on a stale page, and stay new.
        # Cleanup's pass is consistent too: a tombstone written a moment ago must not be missed.
        resp = scan_page(self.dynamo, self.budget, self.table, ctx, start_key, self.page_size,
                         consistent=self.dest == OLD or self.retire_tombstones)
        scanned_at = self.monotonic()
        items = resp.get("Items", [])
        counts["scanned"] = len(items)
        work, tombstones = [], []
        for item in items:
            if self.retire_tombstones and is_tombstone(item) and not not_data(item):
                tombstones.append(item)
                continue
            outcome, changes = self.plan(item)
            if changes:
                work.append((item, changes))
            else:
                counts[outcome] += 1
        count_writes(ctx, self.budget, self._update, work, self.concurrency, counts)
        if tombstones:
            if self.hold_seconds:
                # A live shim's request older than a tombstone (a held first attempt, a duplicate)
                # may land until its horizon; deleted earlier, the empty key lets it pass its fence
                # and the deleted item comes back (the table cleanup's hold, shared).
                hold_after_scan(ctx, scanned_at, self.hold_seconds, self.sleep, self.monotonic)
            count_writes(ctx, self.budget, self._retire, tombstones, self.concurrency, counts)
        return counts, resp.get("LastEvaluatedKey")

    def _retire(self, guard, item: dict) -> str:
        """Delete a tombstone while it still is one, at the version scanned (``still_tombstone``:
        an update over it since keeps its ``_rs_v`` but removes ``_rs_del``, and stays)."""
        fence = still_tombstone(version_of(item), self.keys.partition)
        ok = conditional_delete(self.dynamo, self.budget, self.table, key_of(item, self.key_attrs), fence, guard=guard)
        return "tombstones_retired" if ok else "changed_meanwhile"

    def plan(self, item: dict) -> tuple[str, list]:
        """What the rewrite does to one scanned item: (counter, [(mapper, seen, value)]).

        The changes of every index of the item go into one UpdateItem."""
        if is_tombstone(item) or not_data(item):
            # A delete marker (a shim's delete: it carries the key fields only, never a GSI
            # value), the table marker, an old item a cleanup retired (``_rs_gone``): not an item.
            return "not_indexed", []
        if self.dest is None:  # cleanup's pass: nothing to rewrite (shims write the new value)
            return "already", []
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


class IndexVerifier(RunRecords):
    """The page function of verify for an index-only migration (module docstring).

    Pages of segments below ``opts.segments`` scan the table (checks, records); the run's
    last segment (the engine's join segment) reads the index side, joins and re-checks.
    """

    records_subdir = "index"  # apart from a table Verifier's files over the same scan (combined)

    def __init__(self, dynamo: Dynamo, store: ControlStore, migration_id: str, run: int, index_mappers: dict,
                 keys: Keys, table: str, budget: CapacityBudget, opts: JobOptions, sleep=time.sleep,
                 repair: IndexRewrite | None = None, horizon: float | None = None):
        self.dynamo, self.store, self.migration_id, self.run = dynamo, store, migration_id, run
        #: The request horizon when the server enforces it: the settle window is then H + 2 s on
        #: the server's clock (the table verify's rule, ``Verifier._window``); None: it does not.
        self.horizon = horizon
        self.repair = repair
        self.mappers: list[IndexMapper] = list(index_mappers.values())
        self.by_name = {m.name: m for m in self.mappers}
        self.keys = keys
        self.key_attrs = [keys.partition] + ([keys.sort] if keys.sort else [])
        self.table = table
        self.budget = budget
        self.opts = opts
        self.sleep = sleep
        self.collected: list | None = None  # read-only verify: examples kept here, not written
        #: Where this run's records are kept on this host (None: the run's directory under
        #: ``opts.records_dir``); removed once the join finished when ``remove_records``.
        self.records_dir: pathlib.Path | None = None
        self.remove_records = True
        self._segment_files: SegmentFiles | None = None
        self._files_lock = threading.Lock()

    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        if ctx.segment >= self.opts.segments:
            return self._join_page(ctx, start_key)
        counts = {"scanned": 0, "checked": 0, "gsi_value": 0, "unmappable": 0, "repaired": 0}
        self.budget.take_usage()
        resp = scan_page(self.dynamo, self.budget, self.table, _Slice(ctx.segment, self.opts.segments), start_key,
                         self.opts.page_size)
        items = resp.get("Items", [])
        counts["scanned"] = len(items)
        for item in items:
            if is_tombstone(item) or not_data(item):
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
            counts["checked"] += checked
        next_key = resp.get("LastEvaluatedKey")
        # Kept before the page returns, i.e. before the engine checkpoints it: a kill redoes this page.
        ctx.check_deadline()
        try:
            self._files().write_page(ctx.segment, dump_key(start_key) if start_key else END,
                                     dump_key(next_key) if next_key else END, self._records(items),
                                     getattr(ctx.lease, "token", None))
        except StaleWrite as e:  # paused past the deadline check: a later holder of this host wrote here
            raise LeaseLost(str(e)) from None
        usage = self.budget.take_usage()
        counts["rcu"], counts["wcu"] = round(usage["rcu"], 2), round(usage["wcu"], 2)
        return counts, next_key

    def _records(self, items: list[dict]) -> list:
        """A record per (index, item carrying its attributes), tombstones too: the index mirrors them."""
        return [scan_record(m, item, self.key_attrs) for item in items for m in self.mappers if m.in_index(item)]

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

    def _read(self, item: dict) -> dict | None:
        with self.budget.spend("read", items_read_units([item])):
            return self.dynamo.call("get_item", TableName=self.table, Key=key_of(item, self.key_attrs),
                                    ConsistentRead=True, ReturnConsumedCapacity="TOTAL").get("Item")

    # ---------------------------------------------------------------- the index side and the join
    def _join_page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        """The run's last segment, claimable once every scan segment is done: read the index
        the way cutover shims do and join it with the scan's records (first page), then
        re-check the suspects, ``page_size`` per page (the checkpoint is the last one judged).
        A page redone on a host without the join file reads the index and joins again."""
        directory = self._records_dir()
        counts = dict.fromkeys(JOIN_COUNTERS, 0)
        self.budget.take_usage()
        self._rcu = {"table": 0.0, "index": 0.0}
        join = IndexJoin(directory)
        try:
            if start_key is None or not join.built():
                built = self._build(ctx, join)
                if start_key is None:
                    counts.update(built)
            after = bytes.fromhex(start_key[JOIN_ATTR]["S"]) if start_key else b""
            batch = join.suspects(after, self.opts.page_size)
        finally:
            join.close()
        self._settle(ctx, counts, batch)
        self._account("table")
        counts["index_rcu"] = round(self._rcu["index"], 2)
        counts["rcu"] = round(self._rcu["table"] + self._rcu["index"], 2)  # the whole page's, index side included
        if len(batch) < self.opts.page_size:
            self._files().close()
            if self.remove_records:
                shutil.rmtree(directory, ignore_errors=True)  # the verdict is in; the records are not needed
                try:
                    directory.parent.rmdir()  # the run's directory, unless another verifier's files are there
                except OSError:
                    pass
            return counts, None
        return counts, {JOIN_ATTR: {"S": batch[-1][0].hex()}}

    def _build(self, ctx: PageContext, join: "IndexJoin") -> dict:
        """Every scan segment's records on this host (a segment scanned elsewhere is scanned
        again, records only), the index side's records, joined. Returns the join's counters."""
        directory = self._records_dir()
        for s in range(self.opts.segments):
            if not records_complete(directory, s):
                self._files().forget(s)
                self._rescan(ctx, s)
        self._account("table")
        # The index side goes to a directory only this build writes (as the join file itself:
        # a stale builder of this host, woken from a pause, never mixes its pages in), merged
        # with the scan's records, then removed.
        private = directory / f"index.{os.getpid()}.{threading.get_ident()}.{os.urandom(4).hex()}"
        try:
            out = self._read_index(ctx, directory, private)
            join.index_dir, join.index_parts = private, out.pop("index_parts")
            built = join.build(self.opts.segments, None, tick=ctx.ensure_lease)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        out["suspects"] = built["suspects"]
        return out

    def _rescan(self, ctx: PageContext, segment: int) -> None:
        key = None
        while True:
            ctx.ensure_lease()
            resp = scan_page(self.dynamo, self.budget, self.table, _Slice(segment, self.opts.segments), key,
                             self.opts.page_size)
            nxt = resp.get("LastEvaluatedKey")
            self._files().write_page(segment, dump_key(key) if key else END, dump_key(nxt) if nxt else END,
                                     self._records(resp.get("Items", [])), RESCAN_TOKEN)
            if not nxt:
                return
            key = nxt

    def _prefixes(self, directory: pathlib.Path) -> dict[str, list[str]]:
        """Per index, the distinct logical partitions the scan recorded (one, "[]", for ``{shard}``)."""
        # ``{shard}`` alone: its one logical partition is read even if no item carries the index.
        out: dict[str, set[str]] = {m.name: set() if prefix_fields(m) else {"[]"} for m in self.mappers}
        for s in range(self.opts.segments):
            con = sqlite3.connect(str(segment_path(directory, s)))
            try:
                for (text,) in con.execute("SELECT DISTINCT ttl FROM rec WHERE side = ? AND ttl IS NOT NULL", (SCAN,)):
                    name, prefix = partition_of(text)
                    out[name].add(prefix)
            finally:
                con.close()
        return {name: sorted(p) for name, p in out.items()}

    def _read_index(self, ctx: PageContext, directory: pathlib.Path, into: pathlib.Path) -> dict:
        """Query every [to] partition value of every logical partition of each index, all
        pages (eventually consistent: a GSI has no other read), a record per entry, spilled
        page by page. The values are spread over this worker's threads (``--workers``: the
        join is the run's last segment, the other workers have nothing left), each writing
        one chain of pages to its own file in ``into``; they share the run's read budget."""
        prefixes = self._prefixes(directory)
        # Once per partition value: prefixes of a derived field (a day of ``ts``) are the
        # source values, and many of them give one partition (read once, or its entries
        # would be joined once per source value and re-checked as duplicates).
        work = list({(m.name, repr(value)): (m, value)
                     for m in self.mappers for prefix in prefixes[m.name]
                     for value in m.query_values(NEW, fields_from_text(prefix))}.values())
        threads = max(1, min(self.opts.worker_count, len(work)))
        stop = threading.Event()

        def read(slot: int) -> tuple[int, float]:
            files = SegmentFiles(into)
            pages = entries = 0
            self.budget.take_usage()
            try:
                for m, value in work[slot::threads]:
                    for page in self._query(m, value):
                        if stop.is_set():
                            return entries, self.budget.take_usage()["rcu"]
                        entries += len(page)
                        files.write_page(slot, f"q{pages}" if pages else END, f"q{pages + 1}",
                                         [entry_record(m, e, self.key_attrs) for e in page])
                        pages += 1
                files.write_page(slot, f"q{pages}" if pages else END, END, [])
            finally:
                files.close()
            return entries, self.budget.take_usage()["rcu"]  # this thread's units: the caller counts them

        with ThreadPoolExecutor(threads, thread_name_prefix="verify-index") as pool:
            futures = [pool.submit(read, slot) for slot in range(threads)]
            try:
                while not all(f.done() for f in futures):
                    wait(futures, timeout=1.0)
                    ctx.ensure_lease()  # renewed here while the threads read (a lost lease stops them)
            except BaseException:
                stop.set()
                raise
            done = [f.result() for f in futures]
        self._rcu["index"] += sum(rcu for _, rcu in done)
        return {"index_queries": len(work), "index_entries": sum(n for n, _ in done), "index_parts": threads}

    def _query(self, m: IndexMapper, value: dict, sort: dict | None = None, key: dict | None = None):
        """The pages (entries) of one index query: partition ``value`` (and ``sort``), only the
        table key ``key`` when given (a re-check); the table keys, GSI keys and ``_rs_v`` read."""
        attrs = [*self.key_attrs, m.attr, *([m.sort_attr] if m.sort_attr else []), VERSION_ATTR]
        proj = projection(attrs)
        names = dict(proj["ExpressionAttributeNames"])
        names["#rsg"] = m.attr
        values = {":rsg": value}
        cond = "#rsg = :rsg"
        kwargs: dict = {}
        if sort is not None and m.sort_attr:
            names["#rss"], values[":rss"] = m.sort_attr, sort
            cond += " AND #rss = :rss"
        if key is not None:
            flt = []
            for i, a in enumerate(self.key_attrs):
                names[f"#rsk{i}"], values[f":rsk{i}"] = a, key[a]
                flt.append(f"#rsk{i} = :rsk{i}")
            kwargs["FilterExpression"] = " AND ".join(flt)
        kwargs.update(TableName=self.table, IndexName=m.name, KeyConditionExpression=cond,
                      ProjectionExpression=proj["ProjectionExpression"], ExpressionAttributeNames=names,
                      ExpressionAttributeValues=values, ReturnConsumedCapacity="TOTAL")
        while True:
            with self.budget.spend("read", 0.5):
                resp = self.dynamo.call("query", **kwargs)
            yield resp.get("Items", [])
            if not resp.get("LastEvaluatedKey"):
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    # ---------------------------------------------------------------- re-checks
    def _look(self, suspects: list[tuple]) -> list[tuple]:
        """One consistent read of every suspect's table item, then its targeted index queries:
        [(mapper, key, item or None, entries)] in ``suspects`` order."""
        keys = {dump_key(key): key for _, key, _ in suspects}
        found = {}
        if keys:
            with self.budget.spend("read", float(len(keys))):
                for item in self.dynamo.batch_get(self.table, list(keys.values()), consistent=True, capacity=True):
                    found[dump_key(key_of(item, self.key_attrs))] = item
        self._first_date = self.dynamo.answer_date() if keys else None  # the look's start, server clock
        out = []
        for m, key, seen in suspects:
            item = found.get(dump_key(key))
            where = list(seen)
            if item is not None and m.in_index(item):
                mine = (item[m.attr], item.get(m.sort_attr) if m.sort_attr else None)
                if mine not in where:
                    where.append(mine)
            self._account("table")
            entries = {}
            for pv, sort in where:
                for page in self._query(m, pv, sort, key):
                    for e in page:
                        entries[json.dumps([e.get(m.attr), e.get(m.sort_attr) if m.sort_attr else None],
                                           sort_keys=True, default=str)] = e
            self._account("index")
            out.append((m, key, item, [entries[k] for k in sorted(entries)]))
        return out

    def _settle(self, ctx: PageContext, counts: dict, batch: list[tuple]) -> None:
        """Re-check the page's suspects together until each agrees, or showed the same state
        (the item's version and GSI keys, the entries found) on two looks and for the whole
        settle window (reported), or kept changing (reported, marked as such): as the table
        verify does (``reshard.jobs.verify.Verifier._settle``). An item a shim wrote
        meanwhile is judged again on its new state."""
        if not batch:
            return
        watches = []
        for _ident, fields, _why in batch:
            name, key, seen = targets(json.loads(fields))
            watches.append(((self.by_name[name], key, seen), Watch()))
        window: float | None = None
        reads = 0
        server = self.horizon is not None  # timed by the re-reads' Date (see Verifier._settle)
        while watches:
            sent = ctx.now()
            looked = self._look([s for s, _ in watches])
            reads += 1
            now = ctx.now()
            date = self.dynamo.answer_date() if server else None
            first = getattr(self, "_first_date", None) or date
            if server and (date is None or first is None):
                server = False
            if server:
                sent, now = first, date + 1.0  # the look began no earlier than ``first``'s second
            if window is None:
                window = self._window()
            waiting, due = [], []
            for (s, w), (m, key, item, entries) in zip(watches, looked):
                kind, detail = judge(m, item, entries)
                if kind is None:
                    counts["settled"] += 1
                    continue
                w.observe((version_of(item) if item else None,
                           json.dumps([item.get(m.attr), item.get(m.sort_attr) if m.sort_attr else None]
                                      if item else None, sort_keys=True, default=str),
                           json.dumps(entries, sort_keys=True, default=str)), now)
                decision, at = decide(w, sent, window, max_changes=max(1, self.opts.rechecks - 1),
                                      pause=self.opts.recheck_pause)
                if decision == "wait":
                    waiting.append((s, w))
                    due.append(at)
                    continue
                if decision == "changing":
                    detail += f"; still changing after {reads} re-checks"
                elif window:
                    detail += f"; unchanged for {sent - w.since:.1f}s (settle window {window:g}s)"
                counts[kind] += 1
                if counts[kind] <= max(1, self.opts.examples // 4):
                    self._example(kind, key, m, version_of(item) if item else "",
                                  version_of(entries[0]) if entries else "", detail)
            watches = waiting
            if watches:
                # On the server's clock with a deadline: its times become ours by the offset seen at
                # the last look (the wait sleeps on our monotonic clock, in slices it can report).
                shift = ctx.now() - sent if server else 0.0
                settle_wait(ctx, self.sleep, min(due) + shift, lambda now, n=len(watches), ends=max(
                    w.since for _, w in watches) + window + shift: settle_text(n, f"GSI {watches[0][0][0].name}",
                                                                               window, ends - now))

    def _account(self, side: str) -> None:
        """Charge the read units this thread spent since the last call to ``side`` (table or index)."""
        self._rcu[side] += self.budget.take_usage()["rcu"]

    def _window(self) -> float:
        """The settle window: ``--settle-seconds``, else the largest write bound the migration's
        shims publish (as the table verify's ``Verifier._window``)."""
        if self.opts.settle_seconds is not None:
            return max(0.0, self.opts.settle_seconds)
        if self.horizon is not None:
            return self.horizon + DATE_MARGIN_SECONDS
        return settle_window(h.settle_seconds for h in heartbeats(self.store, self.migration_id))

    # ---------------------------------------------------------------- examples
    def example(self, kind: str, item: dict, m: IndexMapper, detail: str) -> None:
        self._example(kind, key_of(item, [a for a in self.key_attrs if a in item]), m, version_of(item), "", detail)

    def _example(self, kind: str, key: dict, m: IndexMapper, old_version: str, new_version: str, detail: str) -> None:
        shown = dump_key(key)
        body = {"kind": kind, "identity": [shown], "old_key": shown, "new_key": f"index {m.name}",
                "old_version": old_version, "new_version": new_version, "detail": detail}
        text = json.dumps(body, sort_keys=True)
        if self.collected is not None:
            self.collected.append(body)
            return
        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        self.store.put({"pk": S(self.store.jpk(self.migration_id, VERIFY_JOB)),
                        "sk": S(example_prefix(VERIFY_JOB, self.run) + digest), "body": S(text)})


class _Slice(NamedTuple):
    """What ``scan_page`` reads of a page context: the scan's segment and segment count (the
    engine counts one segment more: the join)."""

    segment: int
    total_segments: int


#: The join segment's counters (the kinds of difference it finds, and what it read).
JOIN_COUNTERS = (GSI_MISSING, GSI_EXTRA, GSI_DIFFERS, "suspects", "settled", "index_queries", "index_entries",
                 "index_rcu")
#: The join segment's checkpoint: the identity hash (hex) of the last suspect re-checked.
JOIN_ATTR = "join"


class IndexJoin(Join):
    """:class:`reshard.jobs.records.Join` with index verify's rule (:mod:`reshard.core.index_join`):
    the scan segments' records and the index side's (``index_dir``'s segment 0) in one file."""

    index_dir: pathlib.Path | None = None
    index_parts = 1

    def _merge(self, segments: int) -> None:
        super()._merge(segments)
        con = self.con
        for part in range(self.index_parts if self.index_dir is not None else 0):
            if not records_complete(self.index_dir, part):
                raise RuntimeError(f"the index side's records (part {part}) do not chain from start to end")
            con.execute("ATTACH DATABASE ? AS seg", (str(segment_path(self.index_dir, part)),))
            try:
                con.execute(f"INSERT INTO rec ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM seg.rec")
            finally:
                con.execute("DETACH DATABASE seg")

    def _build(self, verdict) -> dict[str, int]:
        con = self.con
        for statement in ("DROP TABLE IF EXISTS hard", "CREATE TABLE hard (ident BLOB PRIMARY KEY) WITHOUT ROWID"):
            con.execute(statement)
        # One sorted pass (SQLite's external sort: bounded memory) clears every (index, table
        # key) whose records agree (``index_join.agrees``: one scan record, and one entry with
        # the same digest and version, or none when the fan-out need not return it).
        con.execute("INSERT INTO hard SELECT ident FROM rec GROUP BY ident HAVING NOT (SUM(side = 0) = 1 AND ("
                    " (SUM(side = 1) = 1 AND MIN(digest) = MAX(digest) AND MIN(version) = MAX(version))"
                    " OR (SUM(side = 1) = 0 AND MAX(flag) = 0)))")
        rows = con.execute(f"SELECT {', '.join('r.' + c for c in COLUMNS)} FROM rec r JOIN hard h "
                           "ON h.ident = r.ident ORDER BY r.ident")
        found: list[tuple] = []
        for group in _groups(rows):
            records = [from_row(r) for r in group]
            found.append((records[0].ident, json.dumps([r.fields for r in records]), index_verdict(records)))
            if len(found) >= 1000:
                self._add(found)
        self._add(found)
        con.execute("DROP TABLE hard")
        suspects = con.execute("SELECT COUNT(*) FROM sus").fetchone()[0]
        con.execute("INSERT OR REPLACE INTO meta VALUES ('built', '1')")
        return {"suspects": suspects}


def _show(av: dict) -> str:
    (t, v), = av.items()
    return f"{v!r} ({t})"


# --------------------------------------------------------------------------- JobSpecs

def _rewrite_page(dest: str | None, job: str):
    def make(ctx: JobContext):
        m = ctx.migration
        retire = job == CLEANUP_JOB  # shims of every migration phase delete with tombstones
        return IndexRewrite(ctx.dynamo, ctx.store, ctx.state.id, job, mappers(m.indexes), m.keys, m.table, ctx.budget,
                            dest, _projections(ctx.dynamo, m.table), ctx.options.page_size,
                            ctx.options.concurrency, retire_tombstones=retire,
                            hold_seconds=removal_hold(ctx.state) if retire else 0.0, sleep=ctx.sleep).page
    return make


def _verify_page(ctx: JobContext):
    m = ctx.migration
    repair = None
    if ctx.options.repair:  # backfill phase only (JOB_RULES): shims write the new value, as the rewrite does
        repair = IndexRewrite(ctx.dynamo, ctx.store, ctx.state.id, VERIFY_JOB, mappers(m.indexes), m.keys, m.table,
                              ctx.budget, NEW, _projections(ctx.dynamo, m.table))
    return IndexVerifier(ctx.dynamo, ctx.store, ctx.state.id, ctx.run, mappers(m.indexes), m.keys, m.table,
                         ctx.budget, ctx.options, ctx.sleep, repair=repair,
                         horizon=ctx.state.request_horizon if ctx.state.server_deadline else None).page


def _cleanup_page(ctx: JobContext):
    if ctx.state.phase is Phase.ABORTED:
        # abort: every item back to an old value and the shims' tombstones deleted, then retire
        return _rewrite_page(OLD, CLEANUP_JOB)(ctx)
    # cleanup: nothing expires (every item keeps its key); the shims' tombstones are deleted
    return _rewrite_page(None, CLEANUP_JOB)(ctx)


def index_spec(spec: JobSpec) -> JobSpec:
    """The index-only variant of a data job's spec (same name, checks, run choice and finish)."""
    from dataclasses import replace
    make = {BACKFILL_JOB: _rewrite_page(NEW, BACKFILL_JOB), VERIFY_JOB: _verify_page, CLEANUP_JOB: _cleanup_page}
    if spec.name not in make:
        raise errors.BadInput(f"{spec.name} does not apply to an index-only migration")
    # cleanup's TTL check (prepare) has nothing to do: nothing expires.
    # verify's last segment joins the scan with the index side (IndexVerifier); the others have none.
    return replace(spec, make_page=make[spec.name], join=spec.name == VERIFY_JOB,
                   prepare=(lambda ctx: None) if spec.name == CLEANUP_JOB else spec.prepare)
