"""The data jobs of a *combined* migration: the table's keys and a sharded GSI change at once.

A logical item has up to two physical copies while the migration runs (old and new
layout); the GSI attribute of each copy follows :data:`reshard.core.index.INDEX_ROUTING`
exactly as in an index-only migration (shims write it for the phase on every copy). Each
job is the table's job and the index's job over **one** scan: per page, the table half
scans it and the index half is handed the same answer (:class:`SharedScan`), so one
``reshard backfill`` / ``verify`` / ``cleanup`` does both, resumes both from one
checkpoint and reports both (the index half's counters carry a ``gsi_`` prefix).

backfill
    The copy writes each new copy with the GSI values of the ``[to]`` layout, computed
    from the copied item (:func:`reshard.core.index.reindexed`; still the version-fenced
    PutItem, ``_rs_v`` kept), then the index rewrite moves every physical item of the page
    still at an old value -- old copies, unmoved items, and new copies mirrored in
    ``dual_write`` (when shims still wrote old values) -- to its new value, each by the
    conditioned UpdateItem of :class:`reshard.jobs.index_jobs.IndexRewrite`.
verify
    The table verify compares the copies' content *without* the GSI attributes
    (:meth:`reshard.core.layout.KeyMapper.content`: an old copy may hold another value
    than its new copy, e.g. two random shards), and :class:`IndexVerifier` checks every
    physical item's value against ``[to]`` and its fan-out probe; both kinds of
    difference fail the run, so cutover needs both to pass.
cleanup
    The table's (old copies expire or are deleted); nothing for the index. On an aborted
    migration the table's abort cleanup deletes the new copies and the index rewrite moves
    every remaining physical item back to its old value, before the retire.

Why sharing the scan is safe: the index half sees exactly the items of the table half's
page and returns the same next key (checked: a mismatch stops the page, never skips
items), so the one checkpoint covers both halves; a page redone after a kill redoes both,
and both are idempotent (version-conditioned writes).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.core.index import NEW, OLD, mappers
from reshard.core.phases import ROUTING, BACKFILL_JOB, CLEANUP_JOB, VERIFY_JOB, Phase
from reshard.jobs import backfill as backfill_jobs
from reshard.jobs import cleanup as cleanup_jobs
from reshard.jobs import verify as verify_jobs
from reshard.jobs.index_jobs import IndexRewrite, IndexVerifier, _projections
from reshard.jobs.runner import JobContext, JobSpec

#: Counters of the index half that are the table half's too (not repeated under ``gsi_``).
_SHARED = {"scanned", "rcu", "wcu"}
#: Counters of the index half also added to the table half's own (one allowance of
#: unmappable items, one verify kind; the backfill's exit status reads the sum).
_SUMMED = {"unmappable", "repaired"}


#: What a replayed Scan reports to the budget: not nothing (its estimate would stand as the charge).
_COUNTED = 1e-9


def is_combined(migration) -> bool:
    """Whether ``migration`` re-keys the table and shards a GSI at once."""
    return bool(migration.changes_table and migration.indexes)


def _scan_id(kwargs: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in kwargs.items()))


class SharedScan:
    """Two views of one :class:`Dynamo` for the two halves of a combined page.

    ``recording``'s Scan goes to DynamoDB and is kept (per thread: each worker has its own
    page); ``replaying``'s next Scan with the same arguments gets that answer, its items
    filtered by ``keep``. Every other call goes to DynamoDB as it is.
    """

    def __init__(self, dynamo: Dynamo, keep: Callable[[dict], bool] | None = None):
        self._local = threading.local()
        self.recording = _View(dynamo, self, record=True)
        self.replaying = _View(dynamo, self, record=False)
        self.keep = keep

    def put(self, kwargs: dict, resp: dict) -> None:
        self._local.saved = (_scan_id(kwargs), resp)

    def take(self, kwargs: dict) -> dict | None:
        saved, self._local.saved = getattr(self._local, "saved", None), None
        if saved is None or saved[0] != _scan_id(kwargs):
            return None
        resp = saved[1]
        if self.keep is not None:
            resp = {**resp, "Items": [i for i in resp.get("Items", []) if self.keep(i)]}
        return resp


class _View:
    def __init__(self, dynamo: Dynamo, shared: SharedScan, record: bool):
        self._dynamo, self._shared, self._record = dynamo, shared, record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dynamo, name)

    def call(self, operation: str, **kwargs):
        if operation != "scan":
            return self._dynamo.call(operation, **kwargs)
        if not self._record:
            resp = self._shared.take(kwargs)
            if resp is not None:
                # Already counted by the table half: the budget refunds this call's estimate.
                self._dynamo.note_capacity(kwargs.get("TableName", ""), _COUNTED)
                return resp
        resp = self._dynamo.call(operation, **kwargs)
        if self._record:
            self._shared.put(kwargs, resp)
        return resp


class _Slice:
    """A page context whose scan has ``total`` segments (verify's engine counts its join segment too)."""

    def __init__(self, ctx, total: int):
        self._ctx, self.total_segments = ctx, total

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def merge(counts: dict, index_counts: dict) -> dict:
    """The page's counters: the table half's, plus the index half's (``gsi_`` prefix)."""
    out = dict(counts)
    for k, v in index_counts.items():
        if k in ("rcu", "wcu"):
            out[k] = round(out.get(k, 0) + v, 2)
        elif k not in _SHARED:
            if k in _SUMMED:
                out[k] = out.get(k, 0) + v
            name = k if k.startswith("gsi_") else f"gsi_{k}"
            out[name] = out.get(name, 0) + v
    return out


def _both(table_page, index_page, what: str):
    def page(ctx, start_key):
        counts, next_key = table_page(ctx, start_key)
        index_counts, index_next = index_page(ctx, start_key)
        if index_next != next_key:
            # Never checkpoint a page one half did not finish: stop it (it is redone).
            raise errors.ReshardError(f"{what}: the index half of a page ended at {index_next!r}, the table half "
                                      f"at {next_key!r}; the page is not checkpointed")
        return merge(counts, index_counts), next_key
    return page


# --------------------------------------------------------------------------- backfill

def _backfill_page(ctx: JobContext):
    m, opts = ctx.migration, ctx.options
    index_mappers = mappers(m.indexes)
    shared = SharedScan(ctx.dynamo)
    table = backfill_jobs.Backfill(shared.recording, ctx.store, ctx.state.id, ctx.mapper, m.table, ctx.budget,
                                   opts.page_size, opts.concurrency, indexes=tuple(index_mappers.values()),
                                   key_pacer=backfill_jobs.job_key_pacer(ctx))
    index = IndexRewrite(shared.replaying, ctx.store, ctx.state.id, BACKFILL_JOB, index_mappers, m.keys, m.table,
                         ctx.budget, NEW, _projections(ctx.dynamo, m.table), opts.page_size, opts.concurrency)
    return _both(table.page, index.page, "backfill")


# --------------------------------------------------------------------------- verify

#: The join segment's checkpoint names the half it is in ("index" first, then "table").
HALF_ATTR = "_rs_half"


class CombinedVerifier:
    """verify's page function for a combined migration: the table's :class:`Verifier` (GSI
    attributes not compared) and :class:`IndexVerifier` over each scan page. The run's last
    (join) segment runs the index half's join first, when it has one, then the table's: the
    table's removes the run's record directory, the index half's only its own ``index/``.
    Exposes what :func:`verify_read_only` sets on a verifier."""

    def __init__(self, table: verify_jobs.Verifier, index: IndexVerifier, segments: int):
        self.table, self.index, self.segments = table, index, segments
        self.index_joins = hasattr(index, "_join_page")  # the index verify that joins a read of the index

    @property
    def collected(self):
        return self.table.collected

    @collected.setter
    def collected(self, value) -> None:
        self.table.collected = self.index.collected = value  # one list: every example, both halves

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "records_dir":  # a read-only verify's directory: the index half's records apart
            self.table.records_dir = value
            self.index.records_dir = None if value is None else value / "index"
        elif name == "remove_records":
            self.table.remove_records = self.index.remove_records = value
        else:
            object.__setattr__(self, name, value)

    def page(self, ctx, start_key):
        if ctx.segment < self.segments:
            return _both(self.table.page, lambda c, k: self.index.page(_Slice(c, self.segments), k), "verify")(
                ctx, start_key)
        start_key = dict(start_key or {})
        half = start_key.pop(HALF_ATTR)["S"] if start_key else ("index" if self.index_joins else "table")
        inner = start_key or None
        if half == "index":
            counts, next_key = self.index.page(ctx, inner)
            # Between the halves the checkpoint says "table": a redone page starts the table's join.
            return merge({}, counts), {**(next_key or {}), HALF_ATTR: {"S": "index" if next_key else "table"}}
        counts, next_key = self.table.page(ctx, inner)
        return counts, None if next_key is None else {**next_key, HALF_ATTR: {"S": "table"}}


def combined_verifier(dynamo: Dynamo, store, migration_id: str, run: int, migration, mapper, budget, opts, sleep,
                      clock, repair: bool = False, horizon: float | None = None,
                      authoritative: str = "old") -> CombinedVerifier:
    """Both halves of a combined verify over one :class:`SharedScan` of ``dynamo``
    (``horizon``, ``authoritative``: as :class:`~reshard.jobs.verify.Verifier`'s)."""
    index_mappers = mappers(migration.indexes)
    shared = SharedScan(dynamo)
    table = verify_jobs.Verifier(shared.recording, store, migration_id, run, mapper, migration.table, budget, opts,
                                 sleep, ttl_attribute=verify_jobs.table_ttl_attribute(dynamo, migration.table),
                                 clock=clock, horizon=horizon, authoritative=authoritative)
    table.indexes = tuple(index_mappers.values())
    fixer = None
    if repair:  # backfill phase only (JOB_RULES): shims write the new value, as the rewrite does
        fixer = IndexRewrite(shared.replaying, store, migration_id, VERIFY_JOB, index_mappers, migration.keys,
                             migration.table, budget, NEW, _projections(dynamo, migration.table))
    index = IndexVerifier(shared.replaying, store, migration_id, run, index_mappers, migration.keys, migration.table,
                          budget, opts, sleep, repair=fixer, horizon=horizon)
    return CombinedVerifier(table, index, opts.segments)


def _verify_page(ctx: JobContext):
    return combined_verifier(ctx.dynamo, ctx.store, ctx.state.id, ctx.run, ctx.migration, ctx.mapper, ctx.budget,
                             ctx.options, ctx.sleep, ctx.clock, repair=ctx.options.repair,
                             horizon=verify_jobs.settle_horizon(ctx.state),
                             authoritative=ROUTING[ctx.state.phase].authoritative).page


# --------------------------------------------------------------------------- cleanup

def _cleanup_page(ctx: JobContext):
    if ctx.state.phase is not Phase.ABORTED:
        return cleanup_jobs._make_page(ctx)  # old copies expire with their GSI entries; nothing to rewrite
    m = ctx.migration
    # The table half deletes this migration's new copies; every other physical item goes
    # back to its old GSI value (a retired migration reads only old values).
    shared = SharedScan(ctx.dynamo, keep=lambda item: not ctx.mapper.is_new_copy(item))
    cleaner = cleanup_jobs.Cleaner(shared.recording, ctx.mapper, m.table, ctx.budget, ctx.options, True, ctx.clock,
                                   cleanup_jobs.retired_migrations(ctx.store, m.table, ctx.state.id),
                                   concurrency=ctx.options.concurrency)
    index = IndexRewrite(shared.replaying, ctx.store, ctx.state.id, CLEANUP_JOB, mappers(m.indexes), m.keys, m.table,
                         ctx.budget, OLD, _projections(ctx.dynamo, m.table), ctx.options.page_size,
                         ctx.options.concurrency)
    return _both(cleaner.page, index.page, "cleanup")


_PAGES = {BACKFILL_JOB: _backfill_page, VERIFY_JOB: _verify_page, CLEANUP_JOB: _cleanup_page}


def combined_spec(spec: JobSpec) -> JobSpec:
    """``spec`` whose pages do the table's job and the index's for a combined migration (and
    exactly what they did for any other): chosen per run, from the registered file."""
    make = _PAGES.get(spec.name)
    if make is None:
        return spec
    table_make = spec.make_page

    def make_page(ctx: JobContext):
        return make(ctx) if is_combined(ctx.migration) else table_make(ctx)
    return replace(spec, make_page=make_page)
