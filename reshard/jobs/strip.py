"""`reshard cleanup --strip-bookkeeping`: remove reshard's attributes from items after ``complete``.

A completed migration leaves ``_rs_v`` (the write version), ``_rs_new`` (the new-copy
marker) and ``_rs_src`` (the source of a copied pre-migration item) on the items the
shims and the backfill wrote. Nothing needs them once the migration is complete, and
this budgeted, resumable pass (the segment engine, like the backfill) removes them:
each item with an ``UpdateItem REMOVE`` conditioned on the version scanned.

Why this is safe while shims still run the migration's file in ``complete``
    ``complete`` routes every read and write to one layout (the new one), and every live
    shim has acknowledged it before the pass starts (the runner checks). Its writes are
    fenced (``attribute_not_exists(_rs_v) OR _rs_v < :v``) and its deletes write tombstones,
    as in every phase of a registered migration (:data:`reshard.core.phases.ROUTING`, issue
    25): a stripped item counts as unversioned (oldest), so a later write lands on it, and no
    read picks the newest of two copies nor does a job tell layouts apart by ``_rs_new``. The
    pass only REMOVEs those attributes, never touches an application attribute, and
    conditions each REMOVE on the version it scanned (or, for an unversioned item, on it
    still existing unversioned): a shim write that lands between the scan and the REMOVE
    stamped a newer version, the condition fails, and the item keeps exactly what the shim
    wrote (counted ``changed_meanwhile``). A write landing after the REMOVE stamps ``_rs_v``
    again (and ``_rs_new`` on a moved key), and a delete leaves a tombstone again: nothing is
    lost, and the bookkeeping comes back on that item. So the pass is lasting only once the
    application runs without the migration (a steady shim or a plain Table writes no
    bookkeeping and no tombstones); run it again then -- before a plain boto3 ``Table``
    replaces the shim, which would read a leftover tombstone as an item.

A stripped ``_rs_v`` (or a deleted tombstone) must outlive every request older than it (issue 25,
r25's B1): a duplicate of a complete-phase write, or a held first attempt, compares its version
with the stored one, and an unversioned item or an empty key passes that fence. Such a request
is refused by DynamoDB once its signature date is older than ``H`` past its fact, and its fact
is older than the stamp (or tombstone) the scan saw. So with a server deadline each page's
REMOVEs and tombstone deletes are sent only ``H + DATE_MARGIN`` after the page's scan answer
came (``runner.removal_hold`` / ``hold_after_scan``, shared with ``reshard cleanup``), and each
is conditioned on the version the scan saw: a newer write meanwhile fails it. Cost: a strip
pass takes at least ``H + 2`` s per page per segment (use more segments on a big table).

A tombstone (``_rs_del``) is never stripped, which would turn a delete into a visible
item: it is deleted after that hold, conditioned on its version (complete-phase shims keep
writing tombstones while they run the migration's file).
"""

from __future__ import annotations

import math
import time

from reshard.aws.dynamo import Dynamo
from reshard.control.horizon import await_before_removal
from reshard.control.store import ControlStore
from reshard.core.layout import VERSION_ATTR, item_size, not_data, strip_action
from reshard.core.phases import STRIP_JOB
from reshard.core.versions import still_tombstone, unchanged, version_of
from reshard.core.wire import key_of
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import PageContext
from reshard.jobs.runner import (JobContext, JobOptions, JobSpec, conditional_delete, hold_after_scan, removal_hold,
                                 scan_page)
from reshard import errors

#: The counters of a strip pass (status and the CLI show them).
COUNTERS = ("scanned", "stripped", "clean", "tombstones_deleted", "changed_meanwhile", "not_data", "rcu", "wcu")


class Stripper:
    """The page function of a strip pass."""

    def __init__(self, dynamo: Dynamo, table: str, key_attrs: tuple[str, ...], budget: CapacityBudget,
                 opts: JobOptions, hold_seconds: float = 0.0, sleep=time.sleep,
                 monotonic=time.monotonic):
        #: How long after a page's scan answer its REMOVEs and deletes may be sent
        #: (``runner.removal_hold``): every request older than what it saw has expired by then.
        self.hold_seconds = hold_seconds
        self.sleep = sleep
        self.monotonic = monotonic
        self.dynamo = dynamo
        self.table = table
        self.key_attrs = key_attrs
        self.budget = budget
        self.opts = opts

    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        counts = dict.fromkeys(COUNTERS, 0)
        # Consistent: an item written a moment ago would be missing from a stale page, never stripped.
        resp = scan_page(self.dynamo, self.budget, self.table, ctx, start_key, self.opts.page_size, consistent=True)
        scanned_at = self.monotonic()
        items = resp.get("Items", [])
        if self.hold_seconds and any(strip_action(i)[0] != "clean" for i in items if not not_data(i)):
            hold_after_scan(ctx, scanned_at, self.hold_seconds, self.sleep, self.monotonic)
        for item in items:
            if not_data(item):  # the table marker (it stays after complete), a retired leftover
                counts["not_data"] += 1
                continue
            counts["scanned"] += 1
            action, attrs = strip_action(item)
            if action == "clean":
                counts["clean"] += 1
            elif action == "delete":
                ok = conditional_delete(self.dynamo, self.budget, self.table, key_of(item, self.key_attrs),
                                        still_tombstone(version_of(item), self.key_attrs[0]),
                                        guard=ctx.write_guard)
                counts["tombstones_deleted" if ok else "changed_meanwhile"] += 1
            else:
                counts["stripped" if self._strip(ctx, item, attrs) else "changed_meanwhile"] += 1
        usage = self.budget.take_usage()
        counts["rcu"], counts["wcu"] = round(usage["rcu"], 2), round(usage["wcu"], 2)
        return counts, resp.get("LastEvaluatedKey")

    def _strip(self, ctx: PageContext, item: dict, attrs: tuple[str, ...]) -> bool:
        """REMOVE the bookkeeping attributes if the item still holds the version scanned."""
        fence = unchanged(version_of(item), self.key_attrs[0])
        names = dict(fence.names)
        placeholders = []
        for i, attr in enumerate(attrs):
            name = "#rs_v" if attr == VERSION_ATTR else f"#rs_b{i}"  # the fence already names _rs_v #rs_v
            names[name] = attr
            placeholders.append(name)
        units = max(1.0, math.ceil(item_size(item) / 1024))  # an update is billed on the item's size
        try:
            with self.budget.spend("write", units):
                # Conditioned on the version scanned (which also means "still exists": a
                # REMOVE on a deleted item would create a key-only item).
                self.dynamo.call("update_item", guard=ctx.write_guard, TableName=self.table,
                                 Key=key_of(item, self.key_attrs), UpdateExpression="REMOVE " + ", ".join(placeholders),
                                 ReturnConsumedCapacity="TOTAL", **{**fence.kwargs(), "ExpressionAttributeNames": names})
            return True
        except errors.ConditionalCheckFailed:
            return False


def _make_page(ctx: JobContext):
    keys = ctx.migration.keys  # the key attribute names, whatever the layouts (an index-only file has none)
    return Stripper(ctx.dynamo, ctx.migration.table, [keys.partition] + ([keys.sort] if keys.sort else []),
                    ctx.budget, ctx.options, hold_seconds=removal_hold(ctx.state), sleep=ctx.sleep).page


def _check(store: ControlStore, state, options: JobOptions) -> float:
    # Removing the versions removes what a late mirror's fence compares against.
    await_before_removal(store, state, STRIP_JOB)
    return 0.0


#: ``reshard cleanup --strip-bookkeeping``: a fresh pass per invocation (resumes an unfinished one).
STRIP = JobSpec(STRIP_JOB, _make_page, check=_check, fresh=True)
