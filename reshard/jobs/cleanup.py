"""`reshard cleanup`: retire what the migration no longer needs.

In the ``cleanup`` phase (every live shim acknowledged it, so nobody writes the old
layout any more):

* an **old-layout item whose key moved** gets the table's TTL attribute
  (``[cleanup] ttl_attribute`` = now + ``retain_hours``), or is deleted with ``--delete``
  (plain BatchWriteItem deletes: nobody writes those keys any more). An item whose own
  TTL would expire sooner keeps it (the update is conditional).
* an **item whose key did not move** is one physical item serving both layouts: never
  touched (unless it is a tombstone, which is retired).
* a **new-layout item** (``_rs_new`` marker) is never touched, unless it is a tombstone.
* **tombstones** (delete markers) of either layout are deleted, each conditioned on
  its version, so a write that replaced one in the meantime survives.

On an **aborted** migration (fleet acknowledged ``aborted``): the new-layout copies
(marked with this migration's id; nobody writes them any more) are deleted in batches and
the old layout's tombstones retired, each conditioned on its version; no live old item is
ever touched. When the pass
finishes, the migration is marked *retired*: shims then treat the table as steady state
(plain deletes, no versions), and the table is free for a new migration.

Unmappable items are left alone (counted). The pass is resumable and budgeted like the
backfill (segment engine, leases, checkpoints). ``cleanup → complete`` needs a
finished pass that started after the migration entered ``cleanup``.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.aws.inspect import ttl_status
from reshard.control.runs import live_leases
from reshard.control.store import ControlStore
from reshard.control.transition import retire
from reshard.core.layout import KeyMapper, is_tombstone, item_size
from reshard.core.migration import Migration
from reshard.core.phases import BACKFILL_JOB, CLEANUP_JOB, VERIFY_JOB, Phase
from reshard.core.versions import unchanged, version_of
from reshard.core.wire import N, key_of
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import PageContext, RunResult
from reshard.jobs.runner import JobContext, JobOptions, JobSpec, conditional_delete, scan_page


def check_ttl(dynamo: Dynamo, migration: Migration, enable: bool) -> None:
    """TTL must be enabled on ``[cleanup] ttl_attribute`` for the TTL path (or ``--enable-ttl``)."""
    attr = migration.cleanup.ttl_attribute
    if not attr:
        raise errors.BadInput(f"{migration.path}: cleanup.ttl_attribute is not set: add it to the migration "
                              "file, or pass --delete to delete old items instead")
    status, current = ttl_status(dynamo, migration.table)
    if status in ("ENABLED", "ENABLING") and current == attr:
        return
    if status in ("ENABLED", "ENABLING") and current != attr:
        raise errors.BadInput(f"table {migration.table!r} has TTL on {current!r}, not on the file's "
                              f"cleanup.ttl_attribute {attr!r}: fix the file (a new migration id) or use --delete")
    if not enable:
        raise errors.BadInput(f"TTL is {status} on table {migration.table!r}: old items given {attr!r} would never "
                              f"expire. Run with --enable-ttl (UpdateTimeToLive on {attr!r}), or --delete")
    dynamo.call("update_time_to_live", TableName=migration.table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": attr})


class Cleaner:
    """The page function of a cleanup pass."""

    def __init__(self, dynamo: Dynamo, mapper: KeyMapper, table: str, budget: CapacityBudget,
                 opts: JobOptions, aborted: bool, clock: Callable[[], float] = time.time):
        self.dynamo = dynamo
        self.mapper = mapper
        self.table = table
        self.budget = budget
        self.opts = opts
        self.aborted = aborted
        self.key_attrs = mapper.old.key_attrs
        self.ttl_attr = mapper.migration.cleanup.ttl_attribute
        self.expires = int(clock() + mapper.migration.cleanup.retain_hours * 3600)

    def _key(self, item: dict) -> dict:
        return key_of(item, self.key_attrs)

    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        counts = {"scanned": 0, "expiring": 0, "kept_own_ttl": 0, "deleted": 0, "tombstones_retired": 0,
                  "new_copies_removed": 0, "untouched": 0, "unmoved": 0, "unmappable": 0, "changed_meanwhile": 0}
        resp = scan_page(self.dynamo, self.budget, self.table, ctx, start_key, self.opts.page_size)
        items = resp.get("Items", [])
        counts["scanned"] = len(items)
        # Keys nobody writes any more (the fleet acknowledged this phase): old items of a
        # moved key in cleanup, new copies of an aborted migration. They go in plain
        # BatchWriteItem deletes, 25 per call. Tombstones are still written by shims
        # (until a migration completes or is retired), so they are deleted one by one,
        # only if unchanged.
        batched: list[dict] = []
        for item in items:
            ctx.ensure_lease()
            action = self.action(item)
            if action in ("untouched", "unmoved", "unmappable"):
                counts[action] += 1
            elif action == "retire":
                ok = self._delete_if_unchanged(item)
                counts["tombstones_retired" if ok else "changed_meanwhile"] += 1
            elif action == "remove_copy":
                batched.append(self._key(item))
                counts["new_copies_removed"] += 1
            elif action == "expire":
                if self.opts.delete:
                    batched.append(self._key(item))
                    counts["deleted"] += 1
                else:
                    counts[self._set_ttl(item)] += 1
        if batched:
            ctx.ensure_lease()
            with self.budget.spend("write", float(len(batched))):
                self.dynamo.batch_write(self.table, [{"DeleteRequest": {"Key": k}} for k in batched],
                                        capacity=True)
        usage = self.budget.take_usage()
        counts["rcu"], counts["wcu"] = round(usage["rcu"], 2), round(usage["wcu"], 2)
        return counts, resp.get("LastEvaluatedKey")

    def action(self, item: dict) -> str:
        """What the pass does to one scanned item (pure decision, see the module docstring)."""
        if self.mapper.is_new_copy(item):
            if self.aborted:
                return "remove_copy"
            return "retire" if is_tombstone(item) else "untouched"
        try:
            fields = self.mapper.fields(item, self.mapper.old)
        except errors.UnmappableItem:
            # Not an old-layout item we understand. A tombstone is still ours to retire
            # (only the shim writes them); anything else is left exactly as it is.
            return "retire" if is_tombstone(item) else "unmappable"
        if is_tombstone(item):
            return "retire"
        if self.aborted:
            return "untouched"  # a live old item: the old layout is the layout again
        if self.mapper.new.key(fields) == self._key(item):
            return "unmoved"
        return "expire"

    def _delete_if_unchanged(self, item: dict) -> bool:
        """Delete an item only if its version is still the one scanned (a newer write wins)."""
        return conditional_delete(self.dynamo, self.budget, self.table, self._key(item),
                                  unchanged(version_of(item), self.key_attrs[0]))

    def _set_ttl(self, item: dict) -> str:
        """Give an old item the TTL attribute, unless its own TTL expires sooner."""
        units = max(1.0, math.ceil(item_size(item) / 1024))  # an update is billed on the item's size
        try:
            with self.budget.spend("write", units):
                self.dynamo.call(
                    "update_item", TableName=self.table, Key=self._key(item),
                    UpdateExpression="SET #ttl = :exp",
                    # attribute_exists: never create an item that vanished meanwhile.
                    ConditionExpression="attribute_exists(#pk) AND (attribute_not_exists(#ttl) OR #ttl > :exp)",
                    ExpressionAttributeNames={"#ttl": self.ttl_attr, "#pk": self.key_attrs[0]},
                    ExpressionAttributeValues={":exp": N(self.expires)})
            return "expiring"
        except errors.ConditionalCheckFailed:
            return "kept_own_ttl"


def _check(store: ControlStore, state, options: JobOptions) -> float:
    if state.phase is Phase.ABORTED:
        # A backfill (or a repairing verify) started before the abort writes new copies
        # until its workers notice the phase at their next page; removing copies while
        # one still holds a lease could leave copies behind the cleanup's scan.
        busy = live_leases(store, state.id, (BACKFILL_JOB, VERIFY_JOB), store.clock())
        if busy:
            raise errors.RefusedTransition(
                f"cleanup refused for {state.id!r}: {len(busy)} backfill/verify segment lease(s) are still "
                f"held ({', '.join(busy[:3])}); their workers stop at their next page: retry when the leases "
                "are released or expired (see `reshard status`)")
    # A pass counts only if it started in this phase (a pass from before a rollback does not).
    return state.last.at if state.last else 0.0


def _prepare(ctx: JobContext) -> None:
    if ctx.state.phase is not Phase.ABORTED and not ctx.options.delete:
        check_ttl(ctx.dynamo, ctx.migration, ctx.options.enable_ttl)


def _make_page(ctx: JobContext):
    return Cleaner(ctx.dynamo, ctx.mapper, ctx.migration.table, ctx.budget, ctx.options,
                   ctx.state.phase is Phase.ABORTED, ctx.clock).page


def _finish(ctx: JobContext, result: RunResult) -> None:
    if ctx.state.phase is Phase.ABORTED:
        retire(ctx.store, ctx.state.id)


#: ``reshard cleanup``: a fresh pass per phase; retires an aborted migration when done.
CLEANUP = JobSpec(CLEANUP_JOB, _make_page, check=_check, fresh=True, prepare=_prepare, finish=_finish)
