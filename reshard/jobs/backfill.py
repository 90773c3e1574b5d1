"""The backfill: copy every old-layout item that moves to its new-layout key, safely and resumably.

The copy protocol, per page of one parallel-scan segment (:func:`Backfill.page`)
    1. Scan one page (``ExclusiveStartKey`` = the segment's checkpoint).
    2. Items whose key does not change are skipped (``unmoved``). Items that cannot be
       mapped (missing fields, unparseable keys, over 400 KB after re-keying) are left
       untouched, counted and recorded as ``U#backfill#<digest>`` in the control table.
       Tombstones are copied like items: they carry the logical key fields.
    3. One *version-conditioned* PutItem per moved item, ``--concurrency`` of them in flight
       per worker (:func:`reshard.jobs.runner.item_writes`), each new partition key paced
       under DynamoDB's per-key limit (:mod:`reshard.jobs.pacing`, ``--max-wcu-per-key``)
       (:func:`reshard.core.versions.copy_fence`): onto nothing or an older version only;
       a copy of an unversioned (pre-migration) item also onto our own earlier copy of
       the same source (stamped ``_rs_src``: a redone page). Just before each request
       (after the budget's sleep, and before every retry) the worker checks its lease's
       local deadline (:meth:`reshard.jobs.engine.PageContext.write_guard`): a worker
       whose lease may have expired sends nothing.
    4. A ConditionalCheckFailed means the new key already holds something newer -- a
       shim's mirror write, a delete's tombstone, a newer old copy of the same logical
       item: it stays (``fenced``). For an unversioned source the target is read
       (consistently) to tell a duplicate old copy with the same content (``duplicates``,
       nothing to do) from one with *different* content: a ``collision``, recorded like
       an unmappable item (``U#backfill#…``, reason ``collision``, both old keys) and
       never resolved silently.
    5. Only then does the segment engine checkpoint the page.

Why this is safe
    Every write the copy makes is fenced at the server by version, so no interleaving
    with a shim (whose writes and deletes stamp newer versions), another worker, or a
    worker stalled past its lease can put an older state over a newer one. Several old
    copies of one logical item (a random-suffix layout) are ordinary: the newest version
    wins whichever is met first; two unversioned ones that disagree are a collision.
    A kill anywhere before the checkpoint redoes the page, which is idempotent (same
    versions, same ``_rs_src``).

A combined migration (the table's keys and a sharded GSI)
    Each new copy is written with the ``[to]`` value of every GSI it is in, computed from
    the copied item (``indexes``; the same fenced PutItem); the GSI half of the page is
    :mod:`reshard.jobs.combined`'s.

What the read-back of earlier versions did, and why it is gone
    The copy used to be an unconditional BatchWriteItem followed by a consistent
    read-back and fix-ups. With every write fenced, a shim write racing the copy
    needs no repair (the fence keeps the newer one either way), so the read-back is
    gone. One thing it did is not kept: the "undo" of a copy whose source a writer
    *bypassing the shim* deleted meanwhile. That copy now stays and verify reports it as
    ``extra`` (deletes through the shim leave tombstones, which the fence honours).
"""

from __future__ import annotations

import hashlib
import time
from typing import Sequence

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.records import unmappable_sk
from reshard.control.runs import entered_at
from reshard.control.store import ControlStore
from reshard.core.capacity import items_read_units, items_write_units
from reshard.core.index import NEW, IndexMapper, reindexed
from reshard.core.layout import SOURCE_ATTR, VERSION_ATTR, KeyMapper, item_size, not_data
from reshard.core.phases import BACKFILL_JOB, Phase
from reshard.core.versions import copy_fence, copy_outcome, stored_version, version_of
from reshard.core.wire import N, S, dump_key, key_of
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import PageContext
from reshard.jobs.pacing import KeyPacer, key_pacer
from reshard.jobs.runner import (DEFAULT_PAGE_SIZE, JobContext, JobSpec, conditional_put, count_writes, over_leftovers,
                                 scan_page)

COUNTERS = ("scanned", "moved", "copied", "fenced", "duplicates", "collisions", "unmoved", "new_layout",
            "unmappable", "not_data", "rcu", "wcu")

#: How often a copy is retried when its target vanished between the failed fence and the read.
_COPY_TRIES = 3


class Backfill:
    """The copy loop of one migration: the page function handed to the segment engine.

    ``concurrency``: copies of a page in flight at once (``run_job`` passes ``--concurrency``;
    1, one after the other on the worker's thread, for tests that drive one interleaving).
    """

    def __init__(self, dynamo: Dynamo, store: ControlStore, migration_id: str, mapper: KeyMapper, table: str,
                 budget: CapacityBudget, page_size: int = DEFAULT_PAGE_SIZE, concurrency: int = 1,
                 indexes: Sequence[IndexMapper] = (), key_pacer: KeyPacer | None = None):
        self.dynamo = dynamo
        self.store = store
        self.migration_id = migration_id
        self.mapper = mapper
        self.table = table
        self.budget = budget
        self.page_size = page_size
        self.concurrency = concurrency
        self.old_attrs = mapper.old.key_attrs
        self.new_attrs = mapper.new.key_attrs
        self._avg_bytes = 1024.0
        #: A combined migration's sharded GSIs: each new copy is written with their [to] values
        #: (what shims write from dual_read on), so the copy never lands an old value.
        self.indexes = tuple(indexes)
        #: Paces the copies of each new partition key under DynamoDB's per-key limit (pacing.py).
        self.key_pacer = key_pacer or KeyPacer(None)

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

        moving = []
        for item in items:
            if not_data(item):
                # The table marker, or an old item an earlier migration's cleanup retired
                # (``_rs_gone``, TTL pending): not data, never copied (case 6 of issue 25), and
                # not counted as scanned (the progress total counts items, not these).
                counts["not_data"] += 1
                counts["scanned"] -= 1
                continue
            # The table holds both layouts: a new-layout copy (a shim's mirror write, or a
            # copy made earlier) carries the _rs_new marker and is not an old item at all.
            if self.mapper.is_new_copy(item):
                counts["new_layout"] += 1
                continue
            try:
                # A version no reshard writer wrote (a plain client's) is reported, not copied:
                # every fenced write after the copy would refuse the item anyway.
                if VERSION_ATTR in item:
                    stored_version(item, None, "the item")
                new_item, moves = self.mapper.remap(item)
                if moves and self.indexes:
                    new_item = reindexed(new_item, self.indexes, NEW)
            except errors.UnmappableItem as e:
                counts["unmappable"] += 1
                self.record_unmappable(item, e)
                continue
            if not moves:
                counts["unmoved"] += 1  # one physical item serves both layouts
                continue
            counts["moved"] += 1
            moving.append((item, new_item))

        # One fenced PutItem per moved item, several in flight (see runner.item_writes).
        count_writes(ctx, self.budget, self._copy, moving, self.concurrency, counts)
        return counts, next_key

    def _copy(self, guard, pair: tuple[dict, dict]) -> str:
        """One fenced PutItem of ``src`` re-keyed; a failed fence is judged, never overridden.
        Returns the counter it adds to. ``guard``: the lease's, before every attempt."""
        src, new = pair
        version = version_of(src)
        source = dump_key(key_of(src, self.old_attrs))
        if version:
            new.pop(SOURCE_ATTR, None)  # provenance only matters for unversioned copies
        else:
            new[SOURCE_ATTR] = S(source)
        fence = over_leftovers(copy_fence(version, self.new_attrs[0], source))
        units = items_write_units([new])
        # A few new partition keys take the whole copy: each is paced under its own limit.
        self.key_pacer.pace(dump_key({self.new_attrs[0]: new[self.new_attrs[0]]}), units)
        for _ in range(_COPY_TRIES):
            # Fenced at the server: onto nothing or an older version only (see the module
            # docstring). The lease's guard: no request once our lease may have expired.
            if conditional_put(self.dynamo, self.budget, self.table, new, fence, units, guard=guard):
                return "copied"
            if version:
                # The new key holds this version or a newer one (a shim write, a tombstone,
                # a newer old copy): it stays.
                return "fenced"
            target = self._read(key_of(new, self.new_attrs))
            outcome = copy_outcome(version, target, target is not None and self._same_content(src, target))
            if outcome == "gone":
                continue  # removed since the fence failed: copy again, fenced again
            if outcome == "collision":
                self.record_collision(src, target)
                return "collisions"
            return "fenced" if outcome == "newer" else "duplicates"
        return "fenced"  # kept changing under us: whatever is there now is a newer write's

    def _read(self, key: dict) -> dict | None:
        with self.budget.spend("read", items_read_units([{}])):
            return self.dynamo.call("get_item", TableName=self.table, Key=key, ConsistentRead=True,
                                    ReturnConsumedCapacity="TOTAL").get("Item")

    def _same_content(self, src: dict, target: dict) -> bool:
        """The logical items agree (keys and bookkeeping ignored, as verify compares)."""
        try:
            return self.mapper.content(src, self.mapper.old) == self.mapper.content(target, self.mapper.new)
        except errors.UnmappableItem:
            return False

    # ---------------------------------------------------------------- reports
    def record_unmappable(self, item: dict, e: errors.UnmappableItem) -> None:
        """``U#backfill#<digest>``: the old key, the reason and the detail (idempotent put)."""
        key = dump_key({a: item[a] for a in self.old_attrs if a in item})
        self._report(key, e.reason, e.detail, item_size(item))

    def record_collision(self, src: dict, target: dict) -> None:
        """Two unversioned old copies of one logical item with different content: report both keys.

        The other copy is the one at the new key: an old item that does not move
        (``unmoved``), or our copy of another old item (its ``_rs_src``).
        """
        key = dump_key(key_of(src, self.old_attrs))
        other = target[SOURCE_ATTR]["S"] if SOURCE_ATTR in target else dump_key(key_of(target, self.old_attrs))
        detail = (f"two pre-migration copies of one logical item differ: old keys {key} and {other}; neither was "
                  f"copied over the other. Decide which is right, delete the other old copy, write the right one "
                  f"through the shim, then verify")
        self._report(key, "collision", detail, item_size(src), other=other,
                     digest_of="collision|" + "|".join(sorted((key, other))))

    def _report(self, key: str, reason: str, detail: str, size: int, other: str | None = None,
                digest_of: str | None = None) -> None:
        digest = hashlib.sha256((digest_of or key).encode()).hexdigest()[:20]
        row = {"pk": S(self.store.jpk(self.migration_id, BACKFILL_JOB)), "sk": S(unmappable_sk(BACKFILL_JOB, digest)),
               "job": S(BACKFILL_JOB), "old_key": S(key), "reason": S(reason), "detail": S(detail[:1000]),
               "size": N(size), "at": N(time.time())}
        if other is not None:
            row["other_key"] = S(other)
        self.store.put(row)


def _since_dual_writes(store: ControlStore, state, options) -> float:
    # The run that counts started after the shims last began dual-writing: a rollback to
    # `planned` stopped the mirror writes, so an older copy is stale and a new run starts.
    return entered_at(store, state.id, Phase.PLANNED.value, Phase.DUAL_WRITE.value)


def _make_page(ctx: JobContext):
    return Backfill(ctx.dynamo, ctx.store, ctx.state.id, ctx.mapper, ctx.migration.table, ctx.budget,
                    ctx.options.page_size, ctx.options.concurrency, key_pacer=job_key_pacer(ctx)).page


def job_key_pacer(ctx: JobContext) -> KeyPacer:
    """The run's per-key pacer in this process (``--max-wcu-per-key``, shared by its workers; a
    ``--processes`` child's options already carry its part of the host's rate)."""
    return key_pacer(ctx.options.max_wcu_per_key, sleep=ctx.sleep)


#: ``reshard backfill``: run it with :func:`reshard.jobs.runner.run_job`.
BACKFILL = JobSpec(BACKFILL_JOB, _make_page, check=_since_dual_writes)
