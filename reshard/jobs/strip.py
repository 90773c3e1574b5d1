"""`reshard cleanup --strip-bookkeeping`: remove reshard's attributes from items after ``complete``.

A completed migration leaves ``_rs_v`` (the write version), ``_rs_new`` (the new-copy
marker) and ``_rs_src`` (the source of a copied pre-migration item) on the items the
shims and the backfill wrote. Nothing needs them once the migration is complete, and
this budgeted, resumable pass (the segment engine, like the backfill) removes them:
each item with an ``UpdateItem REMOVE`` conditioned on the version scanned.

Why this is safe while shims still run the migration's file in ``complete``
    ``complete`` routes every read and write to one layout (the new one), unfenced and
    without tombstones (:data:`reshard.core.phases.ROUTING`), and every live shim has
    acknowledged it before the pass starts (the runner checks). So no write is fenced by
    a stored ``_rs_v`` any more (only a retry's ``_rs_v <> :v``: below), no read picks the
    newest of two copies, and no job tells layouts apart by ``_rs_new``: the attributes are inert. The pass only REMOVEs those
    attributes, never touches an application attribute, and conditions each REMOVE on
    the version it scanned (or, for an unversioned item, on it still existing
    unversioned): a shim write that lands between the scan and the REMOVE stamped a
    newer version, the condition fails, and the item keeps exactly what the shim wrote
    (counted ``changed_meanwhile``). A write landing after the REMOVE rewrites the item
    in full (PutItem) or updates it, stamping ``_rs_v`` again (and ``_rs_new`` on a
    moved key): nothing is lost, and the attributes come back on that item. So the
    pass is lasting only once the application runs without the migration (a steady
    shim or a plain Table writes no bookkeeping); run it again then.

A stripped ``_rs_v`` must outlive every duplicate of the write that stamped it (issue 25, r25's
B1): in ``complete`` a shim's retry is kept from applying twice by ``_rs_v <> :v`` (its own
attempt's version), and that compares against nothing once ``_rs_v`` is gone. A duplicate (a
retry after a lost answer, a request held in the network) is refused by DynamoDB once its
signature date is older than ``H`` past its fact, and its fact is older than its landing. So
with a server deadline each page's REMOVEs are sent only ``H + DATE_MARGIN`` after the page's
scan answer came (the scan saw the stamp, so the stamping write had landed by then), and each
is conditioned on the version the scan saw: a newer write meanwhile fails it. Cost: a strip
pass takes at least ``H + 2`` s per page per segment (use more segments on a big table).

A tombstone (``_rs_del``) is never stripped, which would turn a delete into a visible
item: it is deleted, conditioned on its version (nothing writes tombstones in
``complete``, so any left is garbage).
"""

from __future__ import annotations

import math
import time

from reshard.aws.dynamo import Dynamo
from reshard.control.horizon import await_before_removal
from reshard.control.store import ControlStore
from reshard.core.deadlines import DATE_MARGIN_SECONDS
from reshard.core.layout import VERSION_ATTR, item_size, not_data, strip_action
from reshard.core.phases import STRIP_JOB
from reshard.core.versions import unchanged, version_of
from reshard.core.wire import key_of
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import PageContext
from reshard.jobs.runner import JobContext, JobOptions, JobSpec, conditional_delete, scan_page
from reshard import errors

#: The counters of a strip pass (status and the CLI show them).
COUNTERS = ("scanned", "stripped", "clean", "tombstones_deleted", "changed_meanwhile", "not_data", "rcu", "wcu")


class Stripper:
    """The page function of a strip pass."""

    def __init__(self, dynamo: Dynamo, table: str, key_attrs: tuple[str, ...], budget: CapacityBudget,
                 opts: JobOptions, hold_seconds: float = 0.0, sleep=time.sleep,
                 monotonic=time.monotonic):
        #: How long after a page's scan answer its REMOVEs may be sent (H + DATE_MARGIN with a
        #: server deadline, else 0): every duplicate of the writes it saw has expired by then.
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
            left = self.hold_seconds - (self.monotonic() - scanned_at)
            while left > 0:  # in slices: a stopped job (Ctrl-C, the phase guard) does not sleep it all out
                ctx.write_guard()
                self.sleep(min(left, 1.0))
                left = self.hold_seconds - (self.monotonic() - scanned_at)
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
                                        unchanged(version_of(item), self.key_attrs[0]), guard=ctx.write_guard)
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
    hold = ctx.state.request_horizon + DATE_MARGIN_SECONDS if ctx.state.server_deadline else 0.0
    return Stripper(ctx.dynamo, ctx.migration.table, [keys.partition] + ([keys.sort] if keys.sort else []),
                    ctx.budget, ctx.options, hold_seconds=hold, sleep=ctx.sleep).page


def _check(store: ControlStore, state, options: JobOptions) -> float:
    # Removing the versions removes what a late mirror's fence compares against.
    await_before_removal(store, state, STRIP_JOB)
    return 0.0


#: ``reshard cleanup --strip-bookkeeping``: a fresh pass per invocation (resumes an unfinished one).
STRIP = JobSpec(STRIP_JOB, _make_page, check=_check, fresh=True)
