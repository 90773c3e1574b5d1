"""The backfill: copy every old-layout item that moves to its new-layout key, safely and resumably.

The copy protocol, per page of one parallel-scan segment (:func:`Backfill.page`)
    1. Scan one page (``ExclusiveStartKey`` = the segment's checkpoint).
    2. Items whose key does not change are skipped (``unmoved``). Items that cannot be
       mapped (missing fields, unparseable keys, over 400 KB after re-keying) are left
       untouched, counted and recorded as ``U#backfill#<digest>`` in the control table.
       Tombstones are copied like items: they carry the logical key fields.
    3. One *unconditional* BatchWriteItem of the re-keyed items (``UnprocessedItems``
       re-sent by :meth:`Dynamo.batch_write`): one plain write per moved item.
    4. A *consistent* read-back of the *source* items (:meth:`Backfill._read_back`: a
       strongly consistent Scan of the same page range, projected to key + version, with
       a consistent BatchGetItem for the sources it does not meet; every shim write and
       delete stamps a new version, so an unchanged version means an unchanged item and
       the full item is read, consistently, only for those that changed), then
       :func:`reshard.core.versions.copy_action` per item:
         * ``done`` -- the source is what we scanned, so what we wrote is right;
         * ``recopy`` -- the source changed since the scan (a shim write or delete):
           PutItem of ``remap(current)`` fenced by ``current``'s version. A
           ConditionalCheckFailed means the target already has that version or a
           newer one (the shim's own mirror write): fine;
         * ``undo`` -- the source is gone (deleted by a writer that bypasses the shim):
           delete our copy only if it is still ours (same version, or unversioned).
    5. Only then does the segment engine checkpoint the page.

Why this is safe
    In the ``backfill`` phase every shim writes the old (authoritative) layout *first*
    and then mirrors to the new layout with a version fence. Our unconditional batch
    write can overwrite a newer mirror write only if that shim write reached the old
    layout before our read-back (it reached the old layout before its mirror write,
    which was before our batch write). So the consistent read-back sees the change and
    step 4 re-copies it, fenced: the newest version always ends up in the new layout,
    and a delete (a tombstone, versioned) is never replaced by an older copy. Shim
    writes after the read-back are fenced against our copy by their newer versions.
    A kill anywhere before the checkpoint redoes the whole page, which is idempotent.
"""

from __future__ import annotations

import hashlib
import time

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.records import unmappable_sk
from reshard.control.runs import entered_at
from reshard.control.store import ControlStore
from reshard.core.capacity import items_read_units, items_write_units, page_scan_units
from reshard.core.layout import VERSION_ATTR, KeyMapper, item_size
from reshard.core.phases import BACKFILL_JOB, Phase
from reshard.core.versions import copy_action, fence_for, unchanged, version_of
from reshard.core.wire import N, S, dump_key, key_id, key_of, projection
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import PageContext
from reshard.jobs.runner import DEFAULT_PAGE_SIZE, JobContext, JobSpec, conditional_delete, conditional_put, scan_page

COUNTERS = ("scanned", "moved", "unmoved", "new_layout", "recopied", "recopy_fenced", "undone", "undo_skipped",
            "unmappable", "rcu", "wcu")


class Backfill:
    """The copy loop of one migration: the page function handed to the segment engine."""

    def __init__(self, dynamo: Dynamo, store: ControlStore, migration_id: str, mapper: KeyMapper, table: str,
                 budget: CapacityBudget, page_size: int = DEFAULT_PAGE_SIZE):
        self.dynamo = dynamo
        self.store = store
        self.migration_id = migration_id
        self.mapper = mapper
        self.table = table
        self.budget = budget
        self.page_size = page_size
        self.old_attrs = mapper.old.key_attrs
        self.new_attrs = mapper.new.key_attrs
        self._avg_bytes = 1024.0
        self._projection = projection([*self.old_attrs, VERSION_ATTR])

    # ---------------------------------------------------------------- one page
    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        """Copy one page of one segment; returns (counts, next key or None at the end)."""
        counts = dict.fromkeys(COUNTERS, 0)
        self.budget.take_usage()
        resp = scan_page(self.dynamo, self.budget, self.table, ctx, start_key, self.page_size, self._avg_bytes)
        items = resp.get("Items", [])
        next_key = resp.get("LastEvaluatedKey")
        counts["scanned"] = len(items)
        if items:  # a running average item size from a sample, for the capacity estimates
            sample = items[:: max(1, len(items) // 8)]
            self._avg_bytes = 0.8 * self._avg_bytes + 0.2 * (sum(map(item_size, sample)) / len(sample))

        # Re-key. `moved` keeps (scanned source, new item) pairs, one per new key.
        moved: list[tuple[dict, dict]] = []
        extra: list[tuple[dict, dict]] = []  # a second source for a new key already in this batch
        seen_new: dict[tuple, int] = {}
        for item in items:
            # The table holds both layouts: a new-layout copy (a shim's mirror write, or a
            # copy made earlier) carries the _rs_new marker and is not an old item at all.
            if self.mapper.is_new_copy(item):
                counts["new_layout"] += 1
                continue
            try:
                new_item, moves = self.mapper.remap(item)
            except errors.UnmappableItem as e:
                counts["unmappable"] += 1
                self.record_unmappable(item, e)
                continue
            if not moves:
                counts["unmoved"] += 1  # one physical item serves both layouts
                continue
            nk = key_id(new_item, self.new_attrs)
            if nk in seen_new:
                # Two old items for one logical item (a random layout can hold duplicates):
                # BatchWriteItem refuses duplicate keys, and the newer version must win,
                # so the later one goes through the fenced path below.
                extra.append((item, new_item))
                continue
            seen_new[nk] = len(moved)
            moved.append((item, new_item))

        if moved:
            ctx.ensure_lease()  # do not start unconditional writes on a lease that is about to expire
            writes = [{"PutRequest": {"Item": new}} for _, new in moved]
            with self.budget.spend("write", len(moved) * max(1.0, -(-self._avg_bytes // 1024))):
                # Unconditional on purpose: one plain write per item; step 4 repairs races.
                self.dynamo.batch_write(self.table, writes, capacity=True)
            counts["moved"] = len(moved)
            now = self._read_back(ctx, start_key, len(items), [src for src, _ in moved])
            for src, new in moved:
                self._settle(src, new, now.get(key_id(src, self.old_attrs)), counts)
        for src, new in extra:
            counts["moved"] += 1
            self._fenced_put(new, version_of(src), counts, recopy=False)

        usage = self.budget.take_usage()
        counts["rcu"], counts["wcu"] = round(usage["rcu"], 2), round(usage["wcu"], 2)
        return counts, next_key

    def _read_back(self, ctx: PageContext, start_key: dict | None, evaluated: int, sources: list[dict]) -> dict:
        """Step 4's consistent read of the sources, as ``{old key id: key + version}``.

        A strongly consistent Scan of the same page range (same start key, same Limit),
        projected to key and version, reads every source that still exists in one call
        and at scan prices (4 KB units over the page, not per item). Sources it does not
        meet -- deleted since, or pushed past the Limit by items inserted into the range
        -- are read with a consistent BatchGetItem. Every shim write and delete stamps
        a new version, so "same version" means "unchanged"; the full item is fetched
        only for those that changed (:meth:`_settle`).
        """
        kw = {"TableName": self.table, "Segment": ctx.segment, "TotalSegments": ctx.total_segments,
              # A little past the first scan's Limit: items copied into this range since
              # (by other workers) would otherwise push sources out of the read.
              "Limit": evaluated + evaluated // 4 + 8, "ConsistentRead": True, "ReturnConsumedCapacity": "TOTAL",
              **self._projection}
        if start_key:
            kw["ExclusiveStartKey"] = start_key
        with self.budget.spend("read", page_scan_units(evaluated, self._avg_bytes, consistent=True)):
            resp = self.dynamo.call("scan", **kw)
        attrs = self.old_attrs
        found = {key_id(i, attrs): i for i in resp.get("Items", []) if all(a in i for a in attrs)}
        missing = [self._old_key(s) for s in sources if key_id(s, attrs) not in found]
        if missing:
            with self.budget.spend("read", float(len(missing))):
                for c in self.dynamo.batch_get(self.table, missing, consistent=True, capacity=True,
                                               projection=self._projection):
                    found[key_id(c, attrs)] = c
        return found

    def _old_key(self, item: dict) -> dict:
        return key_of(item, self.old_attrs)

    def _settle(self, scanned: dict, copied: dict, current_view: dict | None, counts: dict) -> None:
        """Step 4: make the new layout right for one source item after the unconditional copy."""
        current = current_view
        if current_view is not None:
            if version_of(current_view) == version_of(scanned):
                return  # copy_action(view(scanned), view(current)) is "done": same key, same version
            with self.budget.spend("read", items_read_units([scanned])):
                current = self.dynamo.call("get_item", TableName=self.table, Key=self._old_key(scanned),
                                           ConsistentRead=True, ReturnConsumedCapacity="TOTAL").get("Item")
        action = copy_action(scanned, current)
        if action.kind == "done":
            return
        if action.kind == "recopy":
            try:
                new_item, _ = self.mapper.remap(action.item)
            except errors.UnmappableItem as e:
                # The source became unmappable since the scan: record it, take our copy back.
                counts["unmappable"] += 1
                self.record_unmappable(action.item, e)
                self._undo(scanned, copied, counts)
                return
            counts["recopied"] += 1
            self._fenced_put(new_item, version_of(action.item), counts, recopy=True)
            return
        self._undo(scanned, copied, counts)

    def _fenced_put(self, item: dict, version: str, counts: dict, recopy: bool) -> None:
        # A failed fence: the target holds this version or a newer one (the shim's mirror
        # write): keep it.
        if not conditional_put(self.dynamo, self.budget, self.table, item, fence_for(version), items_write_units([item])):
            if recopy:
                counts["recopy_fenced"] += 1

    def _undo(self, scanned: dict, copied: dict, counts: dict) -> None:
        """The source vanished: delete our copy, but only if it is still ours."""
        key = {a: copied[a] for a in self.new_attrs}
        if conditional_delete(self.dynamo, self.budget, self.table, key,
                              unchanged(version_of(scanned), self.new_attrs[0])):
            counts["undone"] += 1
        else:
            counts["undo_skipped"] += 1  # a shim write replaced our copy: it stays

    # ---------------------------------------------------------------- unmappable report
    def record_unmappable(self, item: dict, e: errors.UnmappableItem) -> None:
        """``U#backfill#<digest>``: the old key, the reason and the detail (idempotent put)."""
        key = dump_key({a: item[a] for a in self.old_attrs if a in item})
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        self.store.put({"pk": S(self.store.mpk(self.migration_id)), "sk": S(unmappable_sk(BACKFILL_JOB, digest)),
                        "job": S(BACKFILL_JOB), "old_key": S(key), "reason": S(e.reason), "detail": S(e.detail[:1000]),
                        "size": N(item_size(item)), "at": N(time.time())})


def _since_dual_writes(store: ControlStore, state, options) -> float:
    # The run that counts started after the shims last began dual-writing: a rollback to
    # `planned` stopped the mirror writes, so an older copy is stale and a new run starts.
    return entered_at(store, state.id, Phase.PLANNED.value, Phase.DUAL_WRITE.value)


def _make_page(ctx: JobContext):
    return Backfill(ctx.dynamo, ctx.store, ctx.state.id, ctx.mapper, ctx.migration.table, ctx.budget,
                    ctx.options.page_size).page


#: ``reshard backfill``: run it with :func:`reshard.jobs.runner.run_job`.
BACKFILL = JobSpec(BACKFILL_JOB, _make_page, check=_since_dual_writes)
