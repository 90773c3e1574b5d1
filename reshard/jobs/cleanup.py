"""`reshard cleanup`: retire what the migration no longer needs.

In the ``cleanup`` phase (every live shim acknowledged it, so nobody writes the old
layout any more):

* an **old-layout item whose key moved** gets the table's TTL attribute
  (``[cleanup] ttl_attribute`` = now + ``retain_hours``), or is deleted with ``--delete``.
  Both writes are conditioned on the version scanned (``unchanged``): a write that landed
  meanwhile (a request of a lagging shim arriving late) is never removed or given a TTL
  blindly; it is counted (``changed_meanwhile``) and a later pass sees it. An item whose
  own TTL would expire sooner keeps it.
* an **item whose key did not move** is one physical item serving both layouts: never
  touched (unless it is a tombstone, which is retired).
* a **new-layout item** (``_rs_new`` marker) is never touched, unless it is a tombstone.
* **tombstones** (delete markers) of either layout are deleted, each conditioned on
  its version, so a write that replaced one in the meantime survives -- and, with a server
  deadline, only ``H + DATE_MARGIN`` s after the page's scan answer (``runner.removal_hold``,
  the strip's hold, shared): ``cleanup``-phase shims still write tombstones (issue 25), and a
  live shim's request older than one (a held first attempt, a duplicate) can land until its
  horizon; on the empty key a deletion left it would pass its fence and bring the item back.
  Every such request was signed under a fact older than the scan answer that saw the
  tombstone, so it has expired once that answer is ``H + 2`` s old. A page without a
  tombstone to delete waits for nothing: old-layout expiries and the abort's removal of new
  copies have no live writer (theirs expired before the pass started: ``_check``).

On an **aborted** migration (fleet acknowledged ``aborted``): the new-layout copies
(marked with this migration's id) are deleted and the old layout's tombstones retired,
each conditioned on its version (the tombstones after the same hold: aborted shims write
them); no live old item is ever touched. The pass starts only
once no backfill or repair worker can still write a copy (every lease released, or
unchanged for lease + the longest request on this host's clock: a worker stalled past
its lease stops at its own deadline), so no copy lands behind the scan; the retire checks
it again. When the pass finishes, the migration is marked *retired*: shims then treat the
table as steady state (plain deletes, no versions), and the table is free for a new
migration.

Every pass also removes **marked copies of a retired migration of the same table**
(``_rs_new`` = its id) left behind by anything, each conditioned on its version, and
only when that version is not newer than the retire (a later writer's item is kept).

Unmappable items are left alone (counted). The pass is resumable and budgeted like the
backfill (segment engine, leases, checkpoints). Its Scan is strongly consistent: it runs
right after the fleet entered ``cleanup`` (or the abort), when the last mirror writes of
``cutover`` (or a backfill's last copies) may have landed a moment before, and an eventually
consistent page may not show them yet; an item the pass does not see is never retired. ``cleanup → complete`` needs a
finished pass that started after the migration entered ``cleanup``.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.aws.inspect import ttl_status
from reshard.control.runs import await_no_writers
from reshard.control.store import ControlStore
from reshard.control.horizon import await_before_removal, retire_settled
from reshard.control.transition import WRITING_JOBS, retire
from reshard.core.layout import GONE_ATTR, NEW_COPY_ATTR, KeyMapper, is_tombstone, item_size, not_data
from reshard.core.migration import Migration
from reshard.core.phases import CLEANUP_JOB, Phase
from reshard.core.versions import still_tombstone, unchanged, version_of
from reshard.core.wire import N, S, key_of
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import PageContext, RunResult
from reshard.jobs.runner import (JobContext, JobOptions, JobSpec, conditional_delete, count_writes, hold_after_scan,
                                 removal_hold, scan_page)


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
    """The page function of a cleanup pass.

    ``retired``: ids of other migrations of this table that were aborted and retired
    (:func:`retired_migrations`): their marked copies are garbage.
    ``concurrency``: writes of a page in flight at once (``run_job`` passes ``--concurrency``;
    1, one after the other on the worker's thread, for tests that drive one interleaving).
    """

    def __init__(self, dynamo: Dynamo, mapper: KeyMapper, table: str, budget: CapacityBudget,
                 opts: JobOptions, aborted: bool, clock: Callable[[], float] = time.time,
                 retired: Iterable[str] = (), concurrency: int = 1, hold_seconds: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic):
        #: How long after a page's scan answer its tombstone deletes may be sent
        #: (``runner.removal_hold``: H + DATE_MARGIN with a server deadline, else 0).
        self.hold_seconds = hold_seconds
        self.sleep = sleep
        self.monotonic = monotonic
        self.dynamo = dynamo
        self.mapper = mapper
        self.table = table
        self.budget = budget
        self.opts = opts
        self.aborted = aborted
        self.retired = frozenset(retired)
        self.concurrency = concurrency
        self.key_attrs = mapper.old.key_attrs
        self.ttl_attr = mapper.migration.cleanup.ttl_attribute
        self.expires = int(clock() + mapper.migration.cleanup.retain_hours * 3600)

    def _key(self, item: dict) -> dict:
        return key_of(item, self.key_attrs)

    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        counts = {"scanned": 0, "expiring": 0, "kept_own_ttl": 0, "deleted": 0, "tombstones_retired": 0,
                  "new_copies_removed": 0, "retired_copies_removed": 0, "untouched": 0, "unmoved": 0,
                  "unmappable": 0, "changed_meanwhile": 0, "not_data": 0, "new_layout": 0}
        # Consistent: the last mirrors of cutover (or the last copies before an abort) may have
        # landed a moment ago; a stale page would not show them, and nothing passes again.
        resp = scan_page(self.dynamo, self.budget, self.table, ctx, start_key, self.opts.page_size, consistent=True)
        scanned_at = self.monotonic()
        items = resp.get("Items", [])
        writes = []
        for item in items:
            if not_data(item):
                # The table marker, an old item a cleanup already retired (_rs_gone): not data,
                # not counted as scanned (progress counts items).
                counts["not_data"] += 1
                continue
            counts["scanned"] += 1
            # The new layout's items, counted apart: progress counts the old layout's (core/progress).
            counts["new_layout"] += self.mapper.is_new_copy(item)
            action = self.action(item)
            if action in ("untouched", "unmoved", "unmappable"):
                counts[action] += 1
            else:
                writes.append((action, item))
        if self.hold_seconds and any(is_tombstone(item) for _, item in writes):
            # A live shim's request older than a tombstone (a held first attempt, a duplicate)
            # may land until its horizon; deleted earlier, the empty key lets it pass its fence
            # and the deleted item comes back. Every such request has expired once the scan
            # answer that saw the tombstone is H + 2 s old (the strip's hold, shared).
            hold_after_scan(ctx, scanned_at, self.hold_seconds, self.sleep, self.monotonic)
        # One conditional request per item, several in flight (runner.item_writes).
        count_writes(ctx, self.budget, self._write, writes, self.concurrency, counts)
        return counts, resp.get("LastEvaluatedKey")

    def _write(self, guard, work: tuple[str, dict]) -> str:
        """The write of one item's action; returns the counter it adds to."""
        action, item = work
        if action == "expire" and not self.opts.delete:
            return self._set_ttl(guard, item)
        # Every delete is conditioned on the version scanned: a write that landed
        # since (a late request of a lagging shim) is newer, and it stays.
        done = {"retire": "tombstones_retired", "remove_copy": "new_copies_removed",
                "remove_retired_copy": "retired_copies_removed", "expire": "deleted"}[action]
        return done if self._delete_if_unchanged(guard, item, tombstone=action == "retire") else "changed_meanwhile"

    def action(self, item: dict) -> str:
        """What the pass does to one scanned item (pure decision, see the module docstring)."""
        if not_data(item):
            return "untouched"  # the table marker, or an old item a cleanup already retired (_rs_gone)
        marker = item.get(NEW_COPY_ATTR, {}).get("S")
        if marker is not None and marker in self.retired and marker != self.mapper.migration.id:
            # A copy of a retired migration: no writer keeps that marker on an item it writes
            # (every shim write sets its own migration's marker or removes it), so the marker
            # alone says it is garbage -- no version's wall time is compared with our clock.
            return "remove_retired_copy"
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

    def _delete_if_unchanged(self, guard: Callable[[], None], item: dict, tombstone: bool = False) -> bool:
        """Delete an item only if its version is still the one scanned (a newer write wins),
        and a tombstone only while it still is one (``still_tombstone``). ``guard``: the
        lease's, before every attempt."""
        fence = (still_tombstone if tombstone else unchanged)(version_of(item), self.key_attrs[0])
        return conditional_delete(self.dynamo, self.budget, self.table, self._key(item), fence, guard=guard)

    def _set_ttl(self, guard: Callable[[], None], item: dict) -> str:
        """Give an old item the TTL attribute, unless its own TTL expires sooner, and mark it
        retired (``_rs_gone`` = this migration): until DynamoDB's TTL removes it, every reader
        and every later migration treats it as absent (issue 25, case 6).

        An UpdateItem that sets the attributes. A PutItem of the item as scanned plus the
        attribute, under the same condition, would have the same effect for every writer
        reshard has (they all stamp a new version), but it would also undo a change made
        outside the shim without a version, and dynalite spent about as much CPU on it
        (630-670 against 630-710 us per item, measured side by side): not worth that.
        """
        own = item.get(self.ttl_attr, {}).get("N")
        keep_own = own is not None and float(own) <= self.expires  # it goes sooner by itself
        units = max(1.0, math.ceil(item_size(item) / 1024))  # an update is billed on the item's size
        fence = unchanged(version_of(item), self.key_attrs[0])
        names = {**fence.names, "#gone": GONE_ATTR}
        values = {**fence.values, ":mid": S(self.mapper.migration.id)}
        if keep_own:
            update, condition = "SET #gone = :mid", f"({fence.expression})"
        else:
            # Only the item as scanned (same version; never one created since), and only if
            # its own TTL is not sooner.
            update = "SET #ttl = :exp, #gone = :mid"
            condition = f"({fence.expression}) AND (attribute_not_exists(#ttl) OR #ttl > :exp)"
            names["#ttl"] = self.ttl_attr
            values[":exp"] = N(self.expires)
        try:
            with self.budget.spend("write", units):
                self.dynamo.call("update_item", guard=guard, TableName=self.table, Key=self._key(item),
                                 UpdateExpression=update, ConditionExpression=condition,
                                 ExpressionAttributeNames=names, ExpressionAttributeValues=values)
            return "kept_own_ttl" if keep_own else "expiring"
        except errors.ConditionalCheckFailed:
            return "changed_meanwhile"


def _check(store: ControlStore, state, options: JobOptions) -> float:
    if state.server_deadline:
        await_before_removal(store, state, CLEANUP_JOB)
    elif state.phase is Phase.ABORTED:
        # Without a server deadline: a backfill (or a repairing verify) started before the
        # abort writes new copies until its workers notice the phase at their next page, and
        # one stalled past its lease until its own deadline; removing copies while one may
        # still write could leave copies behind the cleanup's scan. Wait until none can (a
        # stalled lease: lease + longest request, watched on this host's clock).
        busy = await_no_writers(store, state.id, WRITING_JOBS, options.lease_wait)
        if busy:
            raise errors.RefusedTransition(f"cleanup refused for {state.id!r}: {busy}")
    # A pass counts only if it started in this phase (a pass from before a rollback does not).
    return state.last.at if state.last else 0.0


def _prepare(ctx: JobContext) -> None:
    if ctx.state.phase is not Phase.ABORTED and not ctx.options.delete:
        check_ttl(ctx.dynamo, ctx.migration, ctx.options.enable_ttl)


def retired_migrations(store: ControlStore, table: str, but: str) -> set[str]:
    """Ids of other migrations of ``table`` that were aborted and retired, and whose retire
    is at least their request horizon + DATE_MARGIN old on the server's clock (the ``Date``
    of the control table's answer): no copy of theirs can land any more, so a copy removed
    now stays removed. A retire with no recorded date (or no server deadline) counts at once."""
    states = store.list_states()
    now = store.dynamo.answer_date()
    return {s.id for s in states if s.table == table and s.id != but and s.phase is Phase.ABORTED and s.retired
            and retire_settled(s, now)}


def _make_page(ctx: JobContext):
    return Cleaner(ctx.dynamo, ctx.mapper, ctx.migration.table, ctx.budget, ctx.options,
                   ctx.state.phase is Phase.ABORTED, ctx.clock,
                   retired_migrations(ctx.store, ctx.migration.table, ctx.state.id),
                   concurrency=ctx.options.concurrency, hold_seconds=removal_hold(ctx.state), sleep=ctx.sleep).page


def _finish(ctx: JobContext, result: RunResult) -> None:
    if ctx.state.phase is Phase.ABORTED:
        # retire checks again that no backfill/repair worker can still write a copy. Its marker
        # give-back is not one of the job's data writes: sent dated by the job's facts, it was
        # refused (FactExpired) once mark_retired had bumped the phase version, leaving the
        # marker and the table lock behind (f25 saw it under load; a window of H/3 in production).
        retire(ctx.store, ctx.state.id, lease_wait=ctx.options.lease_wait,
               dynamo=getattr(ctx.dynamo, "undated", ctx.dynamo))


#: ``reshard cleanup``: a fresh pass per phase; retires an aborted migration when done.
CLEANUP = JobSpec(CLEANUP_JOB, _make_page, check=_check, fresh=True, prepare=_prepare, finish=_finish)
