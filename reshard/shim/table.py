"""The application shim: :class:`ShardedTable`, a phase-aware stand-in for a boto3 ``Table``.

Applications read and write *logical* items (their own fields, boto3 resource types);
the shim computes the physical keys of the layouts the current migration phase uses
(``reshard.core.phases.ROUTING``; ``phases.STEADY`` when no migration is registered).

Writes (put, update, delete)
    The authoritative layout is written first, then the other layout gets the full
    resulting item. Every write of a registered migration stamps ``_rs_v`` (a
    :class:`~reshard.core.versions.VersionClock` version, one clock per ShardedTable). In
    fenced phases both writes carry the fence ``attribute_not_exists(_rs_v) OR _rs_v <
    :v``: versions only grow on each copy, so both layouts converge to the newest write,
    also when two instances on adjacent phases (``backfill`` / ``cutover``) have
    different authoritative layouts. A fenced authoritative write that fails is told
    apart from the application's own condition by one consistent read: a stored
    version >= ours is a fence loss (observe it, retry above it, bounded), an older one
    means the application's ConditionExpression failed. A failed mirror write means a
    newer write is already there: fine. Items whose old and new keys are equal are
    written once, unmarked (one physical item serving both layouts -- also a brand-new
    item of a random-suffix old layout whose derived old key equals its new key, so a
    rollback keeps it). No TransactWriteItems: one plain write per layout per app write.

Deletes
    In ``routing.tombstones`` phases a delete writes a tombstone (physical key, the
    logical key fields, ``_rs_v``, ``_rs_del``) fenced to both layouts, so neither a
    racing backfill copy nor a lagging mirror write can bring the item back; reads
    treat a tombstone as absent; ``reshard cleanup`` retires them. Elsewhere (steady,
    cleanup, complete) a delete is a plain DeleteItem.

Random-suffix old layouts
    The old shard cannot be computed. A read asks for every candidate key in one
    BatchGetItem (N keys, so N read units per read instead of 1); a write that targets
    the old layout first finds the item with a consistent BatchGetItem of the candidates
    (newest wins) and writes it there (N consistent read units extra per write). A
    brand-new item goes to a shard derived from its identity, so two racing creators
    pick the same key.

Sharded GSIs (``[index.NAME]`` migrations)
    ``query(IndexName=...)`` fans out over the index's partition values
    (``reshard/shim/index.py``); writes give the GSI attribute of items in the index the
    value of the layout the phase writes (a put: computed; an update of a field the value is
    computed from: in the same UpdateItem, ``shim/index.index_actions``; any other update:
    from its result, by one more conditional UpdateItem when it differs). An index-only migration keeps items at
    their keys: the table is one identity layout here (:func:`_table_view`), no copies, no
    tombstones. A migration that also re-keys the table gives every copy it writes the
    phase's value (a mirror too) and resolves each index entry to its logical item as
    ``get_item`` reads it (:meth:`_index_resolver`).

Phase
    Every request asks the instance's :class:`~reshard.shim.phase_cache.PhaseCache` for
    the phase to act on (never the control table) and tells it when it is done, so a
    new phase is acknowledged only after the requests on the old one drain.

Late requests (docs/late-writes.md)
    Every request to the data table goes through :meth:`ShardedTable._call` (or
    ``_batch_get``): signed so that DynamoDB refuses it once the server's clock passes the
    horizon of the phase fact it obeys (``PhaseCache.horizon``), a refusal for lateness being
    ``ShimUnavailable``. A write retried after a lost answer recognises its own landed attempt
    (``_authoritative``). While the control row's ``newer_may_be`` is set, reads read both
    layouts and each write first catches the authoritative copy up (``_catch_up``). The table
    marker and copies a cleanup retired (``_rs_gone``) are no items to any read, and no
    update builds on a retired copy.

Reserved names: every bookkeeping attribute starts with ``_rs_`` and never reaches the
application; placeholders ``#rs_*`` / ``:rs_*`` are reserved in expressions.

Tombstones and the application's conditions
    A tombstone stores the logical key fields (the backfill must be able to re-key it),
    yet the application must see an absent item. Its ConditionExpression is rewritten
    (``expr.tombstone_aware``): what the condition means on an absent item is a constant
    computed from its text (every path is missing there), so the server decides with
    ``attribute_exists(_rs_del) OR (cond)`` (constant true) or
    ``attribute_not_exists(_rs_del) AND (cond)`` (constant false) -- no extra request.
    A condition whose value on an absent item depends on values alone (``:a = :b``) is
    sent unchanged. Every update, in every phase, removes ``_rs_del``: a leftover
    tombstone never hides an acknowledged update.

Sizes
    A put is checked against 400 KB in every layout it writes (the new copy is larger:
    the marker, the version, maybe a longer key) *before* the authoritative write, and
    refused with a ``ValidationException`` (:class:`ItemTooLarge`, also a botocore
    ``ClientError``). An update's result is not known in advance: an update that grows
    an item past the limit in the mirror layout only still fails after the authoritative
    write (a known limit).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder

from reshard import errors
from reshard.aws.dynamo import (CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS, SHIM_RETRIES, Dynamo,
                                expression_kwargs, from_wire, make_client, to_wire)
from reshard.core.index import IndexMapper
from reshard.core.layout import (GONE_ATTR, MAX_ITEM_BYTES, NEW_COPY_ATTR, SOURCE_ATTR, TOMBSTONE_ATTR, VERSION_ATTR,
                                 KeyMapper, Layout, hash_shard, is_retired, is_tombstone, item_size, not_data, to_av)
from reshard.core.migration import RESERVED_PREFIX, LayoutSpec, Migration, TemplatePart, load
from reshard.core import expressions
from reshard.core.decode import safe_text
from reshard.core.wire import dump_key, still_as_read
from reshard.core.phases import Phase, Routing
from reshard.core.versions import (VersionClock, fence_for, newest, not_version, own_attempt, stored_version, unchanged,
                                   version_of)
from reshard.shim import metrics as shim_metrics
from reshard.shim.errors import ItemTooLarge, OldValuesUnknown, ShimValidationError, client_errors
from reshard.shim.expr import (TOMBSTONE_NAME, and_conditions, check_placeholders, check_targets, merge_update,
                               split_clauses, tombstone_aware, touched_attributes)
from reshard.shim.phase_cache import (DEFAULT_CONTROL_TABLE, DEFAULT_LIVENESS_SECONDS, PhaseCache, PhaseState,
                                      registered_migration)
from reshard.shim.index import (IndexSource, IndexUpdate, Resolver, index_actions, index_key_condition,
                                index_routing, index_update_plan, read_changed, run_index_query, update_effect,
                                write_value)
from reshard.shim.query import QuerySource, _plain, logical_key_condition, run_query
from reshard.shim.scan import ScanSource, run_scan

log = logging.getLogger("reshard.shim")

#: ``control_table``'s default: ``$RESHARD_CONTROL_TABLE``, else ``reshard-control`` (:func:`control_table_name`).
USE_ENV: Any = type("UseEnv", (), {"__repr__": lambda self: "$RESHARD_CONTROL_TABLE or 'reshard-control'"})()

#: How often a fenced authoritative write may lose to a newer version before giving up.
MAX_FENCE_RETRIES = 5


# ReturnConsumedCapacity: a logical request is several physical ones (mirror, lookups,
# fan-out), each asked for its capacity while the app's request runs; the sum is reported.
_CAPACITY: contextvars.ContextVar[list | None] = contextvars.ContextVar("reshard_capacity", default=None)
_HOOKS_LOCK = threading.Lock()
#: The (table, phase state) of the request running in this context: its data requests are signed
#: by the fact of that phase version (``PhaseCache.horizon``); query workers run in a copy of it.
_REQUEST: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("reshard_request", default=None)
#: The ``ResponseMetadata`` of the last physical page a query or scan read (a list the request's
#: context and its pool workers share): the answer's, as boto3's query/scan carry one.
_PAGE_META: contextvars.ContextVar[list | None] = contextvars.ContextVar("reshard_page_meta", default=None)


def _note_page(resp: Mapping[str, Any]) -> None:
    seen = _PAGE_META.get()
    if seen is not None and resp.get("ResponseMetadata") is not None:
        seen[:] = [resp["ResponseMetadata"]]


def _with_page_meta(fn):
    """A query/scan method whose answer carries the last page's ``ResponseMetadata`` (boto3's shape)."""
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        seen: list = []
        token = _PAGE_META.set(seen)
        try:
            resp = fn(self, *args, **kwargs)
        finally:
            _PAGE_META.reset(token)
        if seen and "ResponseMetadata" not in resp:
            resp["ResponseMetadata"] = seen[0]
        return resp
    return method


def _late(e: errors.AWSError) -> bool:
    """DynamoDB refused the request as signed too long ago (it arrived after its horizon)."""
    return e.code == "InvalidSignatureException" and "expired" in (e.aws_message or "").lower()


def _hidden(item: Mapping[str, Any] | None) -> bool:
    """An item no read returns, not even as a tombstone: the table marker, or an old-layout copy
    a cleanup retired (``_rs_gone``): for the shim it is no copy at all."""
    return not_data(item)


class _Landed(dict):
    """The outcome of an authoritative write whose answer was lost and whose retry met its own
    landed attempt: ``{"Attributes": the stored item}`` (what ALL_NEW would have returned)."""


def _ask_capacity(params: dict, **_) -> None:
    if _CAPACITY.get() is not None and "ReturnConsumedCapacity" not in params:
        params["ReturnConsumedCapacity"] = "TOTAL"


def _count_capacity(table: str, units: float) -> None:
    units_seen = _CAPACITY.get()
    if units_seen is not None:
        units_seen.append(units)


def _install_capacity_hooks(dynamo: Dynamo) -> None:
    """Once per client: add ReturnConsumedCapacity to the physical calls of a request that asked for it."""
    with _HOOKS_LOCK:
        # Copies of a Dynamo (with_retry, bounded) share the client and the listener list.
        if _count_capacity in dynamo._capacity_listeners:
            return
        dynamo.client.meta.events.register("provide-client-params.dynamodb", _ask_capacity,
                                           unique_id="reshard-shim-capacity")
        dynamo.add_capacity_listener(_count_capacity)


def with_capacity(fn):
    """Accept boto3's ``ReturnConsumedCapacity`` (TOTAL, INDEXES, NONE) on a shim method and
    answer ``ConsumedCapacity``: the units of every physical request it made."""
    @functools.wraps(fn)
    def method(self, *args, ReturnConsumedCapacity: str | None = None, **kwargs):
        if ReturnConsumedCapacity in (None, "NONE"):
            return fn(self, *args, **kwargs)
        if ReturnConsumedCapacity not in ("TOTAL", "INDEXES"):
            raise errors.BadInput(f"ReturnConsumedCapacity must be INDEXES, TOTAL or NONE "
                                  f"(got {ReturnConsumedCapacity!r})")
        _install_capacity_hooks(self.dynamo)  # on first use: most apps never ask
        units: list[float] = []
        token = _CAPACITY.set(units)
        try:
            resp = fn(self, *args, **kwargs)
        finally:
            _CAPACITY.reset(token)
        used = {"TableName": self.table, "CapacityUnits": float(sum(units))}
        if ReturnConsumedCapacity == "INDEXES":
            used["Table"] = {"CapacityUnits": used["CapacityUnits"]}
        resp["ConsumedCapacity"] = [used] if fn.__name__ == "batch_get_item" else used
        return resp
    return method


class ShardedTable:
    """A DynamoDB table under (or after, or before) a reshard migration, seen logically.

    One instance serves many threads. Use :meth:`from_file` or
    :meth:`from_migration_id`; close it (or use it as a context manager) to stop the
    refresh thread and remove its heartbeat.
    """

    def __init__(self, migration: Migration, dynamo: Dynamo, *, control_table: str | None = USE_ENV,
                 refresh_seconds: float = 5.0, liveness_seconds: float = DEFAULT_LIVENESS_SECONDS,
                 clock: Callable[[], float] = time.monotonic, writer_id: str | None = None,
                 query_workers: int = 8, start: bool = True, version_clock: VersionClock | None = None,
                 switch_hold_seconds: float | None = None, control_clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] = time.sleep, control_dynamo: Dynamo | None = None):
        self.migration = migration
        control_table = control_table_name(control_table)
        self.mapper = KeyMapper(_table_view(migration))
        if migration.changes_table:
            for spec in migration.indexes:
                if spec.sort in self.mapper._key_attrs and spec.sort not in self.mapper._kept_key_attrs:
                    # The two copies of an item would sit at two sort values of the index.
                    raise errors.BadInput(f"migration {migration.id!r}: index {spec.name}'s sort key {spec.sort!r} is "
                                          "a key attribute the migration rewrites; the shim resolves an index entry "
                                          "to its logical item by (sort value, logical key)")
        #: The migration's sharded GSIs by IndexName (reshard/shim/index.py).
        self._indexes = {spec.name: IndexMapper(spec) for spec in migration.indexes}
        # An index-only migration keeps every item at its key: one physical item, one layout.
        self._index_only = not migration.changes_table
        self._single = {}  # the table routing of an index-only migration, per phase routing
        self.table = migration.table
        self.dynamo = dynamo
        self.instance_id = writer_id or uuid.uuid4().hex[:12]
        self.versions = version_clock or VersionClock(self.instance_id)
        self._phases = PhaseCache(migration, dynamo, control_table, self.instance_id,
                                  refresh_seconds=refresh_seconds, liveness_seconds=liveness_seconds, clock=clock,
                                  switch_hold_seconds=switch_hold_seconds, control_clock=control_clock,
                                  sleep=sleep, control_dynamo=control_dynamo)
        self._lock = threading.Lock()  # guards the lazily created query pool
        self._executor: ThreadPoolExecutor | None = None
        self._query_workers = max(1, query_workers)
        self._query_source = QuerySource(mapper=self.mapper, query_page=self._query_page, run_all=self._run_all,
                                         to_app=self._to_app)
        self._scan_source = ScanSource(mapper=self.mapper, scan_page=self._scan_page, batch_get=self._lookup,
                                       to_app=self._to_app)
        self._index_source = IndexSource(key_attrs=tuple(self.mapper.old.key_attrs), query_page=self._query_page,
                                         run_all=self._run_all, to_app=self._to_app)
        m = self.mapper
        self._key_attrs = set(m.old.key_attrs)
        self._kept = m._kept_key_attrs
        self._key_fields = m.key_fields
        self._key_field_set = set(m.key_fields)
        # Names the app's update may not write: key fields (they are the identity) and
        # the physical key attributes.
        self._frozen_attrs = set(m.key_fields) | self._key_attrs
        if self._phases.controlled and start:
            self._phases.start()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_file(cls, path: str, endpoint_url: str | None = None, region_name: str | None = None,
                  control_table: str | None = USE_ENV, refresh_seconds: float = 5.0,
                  liveness_seconds: float = DEFAULT_LIVENESS_SECONDS, dynamo: Dynamo | None = None, *,
                  session=None, client=None, config=None, **kwargs) -> "ShardedTable":
        """A shim for the migration file at ``path`` (also for the steady state: keep it after the migration).

        ``session`` (a boto3 Session), ``client`` (a DynamoDB client) or ``config`` (a botocore
        Config): the application's own, as it gave them to boto3 (:func:`app_dynamo`).
        ``control_table``: default ``$RESHARD_CONTROL_TABLE``, else ``reshard-control``; None: none.
        """
        migration = load(path)
        dynamo, control = app_dynamo(dynamo, endpoint_url, region_name, session, client, config)
        return cls(migration, dynamo, control_table=control_table, refresh_seconds=refresh_seconds,
                   liveness_seconds=liveness_seconds, control_dynamo=control, **kwargs)

    @classmethod
    def from_migration_id(cls, migration_id: str, endpoint_url: str | None = None, region_name: str | None = None,
                          control_table: str = USE_ENV, refresh_seconds: float = 5.0,
                          liveness_seconds: float = DEFAULT_LIVENESS_SECONDS, dynamo: Dynamo | None = None, *,
                          session=None, client=None, config=None, **kwargs) -> "ShardedTable":
        """A shim for a registered migration; the file text comes from the control table.
        ``session``/``client``/``config`` and ``control_table``: as :meth:`from_file`."""
        dynamo, control = app_dynamo(dynamo, endpoint_url, region_name, session, client, config)
        control_table = control_table_name(control_table)
        if not control_table:
            raise errors.BadInput("from_migration_id reads the migration from the control table: name one "
                                  "(control_table= or $RESHARD_CONTROL_TABLE), or use from_file")
        return cls(registered_migration(control or dynamo, control_table, migration_id), dynamo,
                   control_table=control_table, refresh_seconds=refresh_seconds, liveness_seconds=liveness_seconds,
                   control_dynamo=control, **kwargs)

    def __enter__(self) -> "ShardedTable":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the refresh thread and remove this instance's heartbeat (it leaves the census at once)."""
        self._phases.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    # ------------------------------------------------------------------ phase
    @property
    def phase(self) -> str:
        """The phase this instance acts on now (``steady`` when no migration is registered)."""
        return self._phases.phase

    @property
    def refresh_seconds(self) -> float:
        """How often the phase is re-read and the heartbeat written (± jitter)."""
        return self._phases.refresh_seconds

    @property
    def liveness_seconds(self) -> float:
        """How long without a successful refresh before requests fail with ShimUnavailable."""
        return self._phases.liveness_seconds

    def refresh(self) -> bool:
        """Read the phase and write the heartbeat now. True on success (the refresh thread calls this)."""
        return self._phases.refresh()

    def _pin_phase(self, phase: Phase | str | None, version: int = 1) -> None:
        """TEST ONLY: act on ``phase`` (None: steady) from now on, ignoring the control table."""
        self._phases.pin(phase, version)

    def _begin(self) -> PhaseState:
        # Every request brackets its work with _begin/_end: the phase cache must know
        # which phase versions still have requests running before it acknowledges a newer one.
        st = self._phases.begin()
        if self._index_only:
            # Items keep their keys: one layout, no copies, so no tombstones (a delete is a plain
            # delete: nothing can bring the item back, the index rewrite never creates an item).
            # Writes stay fenced and stamped as the phase says.
            r = st.routing
            single = self._single.get(r)
            if single is None:
                single = self._single[r] = Routing(("old",), ("old",), tombstones=False, fenced=r.fenced,
                                                   hold=r.hold)
            st = dataclasses.replace(st, routing=single)
        _REQUEST.set((self, st))
        return st

    def _end(self, st: PhaseState) -> None:
        _REQUEST.set(None)
        self._phases.end(st)

    # ------------------------------------------------------------------ data requests
    def _horizon(self) -> float | None:
        """``Dynamo.call(horizon=)`` of every data request: the server time after which DynamoDB
        refuses it, from the fact of the phase version the request runs under."""
        cur = _REQUEST.get()
        st = cur[1] if cur is not None and cur[0] is self else self._phases.current()
        return self._phases.horizon(st)

    def _call(self, operation: str, guard: Callable[[], None] | None = None, **kwargs) -> dict:
        """One request to the data table, signed to die at its horizon. A refusal for arriving
        after it is ShimUnavailable (nothing was applied; never retried as is)."""
        try:
            return self.dynamo.call(operation, guard=guard, horizon=self._horizon, **kwargs)
        except errors.AWSError as e:
            if _late(e):
                raise self._phases.refused_late(e, operation) from e
            raise

    def _get(self, key: dict, consistent: bool, **kwargs) -> tuple[dict | None, dict]:
        """(the stored item at ``key`` or None -- a retired copy or the marker count as none, the response)."""
        resp = self._call("get_item", TableName=self.table, Key=key, ConsistentRead=consistent, **kwargs)
        item = resp.get("Item")
        return (None if _hidden(item) else item), resp

    def _batch_get(self, keys: list[dict], consistent: bool, last_response: dict | None = None) -> list[dict]:
        """Every stored item at ``keys`` (BatchGetItems of 100), retired copies and the marker left out."""
        try:
            found = self.dynamo.batch_get(self.table, keys, consistent=consistent, last_response=last_response,
                                          horizon=self._horizon)
        except errors.AWSError as e:
            if _late(e):
                raise self._phases.refused_late(e, "BatchGetItem") from e
            raise
        return [i for i in found if not _hidden(i)]

    def _visible(self, resp: dict) -> dict:
        """A Query or Scan page without the items no read returns."""
        items = resp.get("Items")
        if items and any(_hidden(i) for i in items):
            resp = {**resp, "Items": [i for i in items if not _hidden(i)]}
        return resp

    # ------------------------------------------------------------------ inputs
    def _logical_item(self, item: Mapping[str, Any]) -> dict:
        if not isinstance(item, Mapping):
            raise errors.BadInput("Item must be a dict of attribute values")
        for name in item:
            if name.startswith(RESERVED_PREFIX):
                raise errors.BadInput(f"attribute {name!r}: names starting with {RESERVED_PREFIX!r} "
                                      "are reserved for reshard's bookkeeping")
            if name in self._key_attrs and name not in self._kept:
                raise errors.BadInput(f"attribute {name!r} is a physical key attribute of {self.table!r}; "
                                      "write logical items (the shim computes the keys)")
        return to_wire(item)

    def _fields(self, logical: Mapping[str, Any]) -> dict:
        try:
            return self.mapper.logical_fields(logical)
        except errors.UnmappableItem as e:
            raise errors.BadInput(f"{self.table}: {e.detail}") from None

    def _key(self, key: Mapping[str, Any]) -> tuple[dict, dict]:
        """(wire key fields, python fields) of an application ``Key``."""
        if not isinstance(key, Mapping):
            raise errors.BadInput("Key must be a dict of the logical key fields")
        extra = [k for k in key if k not in self._key_field_set]
        if extra:
            raise errors.BadInput(f"Key has {', '.join(map(repr, extra))}, which are not key fields of "
                                  f"{self.table!r} (key fields: {', '.join(self._key_fields)})")
        wire = to_wire(key)
        return wire, self._fields(wire)

    def _identity_text(self, fields: Mapping[str, Any]) -> str:
        return "#".join(p.hex() if isinstance(p, bytes) else p for p in self.mapper.identity(fields))

    # ------------------------------------------------------------------ routing
    def _write_keys(self, st: PhaseState, fields: dict) -> list[tuple[dict, bool]]:
        """Physical keys to write, authoritative first, each with whether it gets the
        new-copy marker (``_rs_new``); an unmoved item's equal keys are written once.

        The marker goes on a new-layout item whose key differs from the item's old key,
        so scans (backfill, verify, cleanup, abort) can tell the layouts apart. When the
        old layout is not written (cutover's mirror aside: cleanup, complete) and is random,
        the old key is unknown without a lookup: mark anyway. That is harmless there: abort
        is impossible from those phases and cleanup only skips marked items.
        """
        keys: list[dict] = []
        sides: list[set[str]] = []  # the layouts each physical key serves
        for side in st.routing.writes:
            layout = self.mapper.layout(side)
            key = self._locate(layout, fields) if layout.random else layout.key(fields)
            if key in keys:
                sides[keys.index(key)].add(side)  # one physical item serves both layouts
            else:
                keys.append(key)
                sides.append({side})
        written = set().union(*sides)
        if "new" not in written:
            return [(k, False) for k in keys]
        if "old" in written:
            old_key = next(k for k, s in zip(keys, sides) if "old" in s)
        elif self.mapper.old.random:
            old_key = None
        else:
            old_key = self.mapper.old.key(fields)
        # A key that is also the item's old-layout key is never marked: it is the old copy
        # too (as for an unmoved item), so rollback, verify --repair, abort and cleanup
        # keep it. Marking it would leave an acknowledged write with no old copy at all.
        return [(k, "new" in s and "old" not in s and k != old_key) for k, s in zip(keys, sides)]

    def _marked(self, item: dict, mark: bool) -> dict:
        """``item`` with the new-copy marker set or removed as its target key needs."""
        if mark:
            item[NEW_COPY_ATTR] = {"S": self.migration.id}
        else:
            item.pop(NEW_COPY_ATTR, None)
        return item

    def _locate(self, layout: Layout, fields: dict) -> dict:
        """Where an item of a random-suffix layout lives: a consistent BatchGetItem of every
        candidate, newest wins; a brand-new item gets a shard derived from its identity."""
        candidates = layout.candidate_keys(fields)
        # Consistent: an eventually consistent miss would put a second copy of an existing
        # item into another shard.
        found = self._batch_get(candidates, consistent=True)
        if found:
            # The new layout's key may also parse as an old candidate (same template): the
            # new-copy marker tells the copy apart from the item's genuine old location.
            genuine = [i for i in found if not self.mapper.is_new_copy(i)] or found
            return self._key_of(newest(genuine))
        # Nothing stored yet. Two instances creating the item at once must pick the same
        # key (one item, ordered by the fence), so the shard comes from the identity,
        # not from a random draw.
        return layout.key(fields, hash_shard(self._identity_text(fields), layout.shards))

    def _key_of(self, item: Mapping[str, Any]) -> dict:
        return {a: item[a] for a in self.mapper.old.key_attrs}

    def _read_keys(self, st: PhaseState, fields: dict) -> list[tuple[dict, Layout]]:
        out: list[tuple[dict, Layout]] = []
        seen: list[dict] = []
        for side in st.routing.reads:
            layout = self.mapper.layout(side)
            for key in layout.candidate_keys(fields):
                if key not in seen:
                    seen.append(key)
                    out.append((key, layout))
        return out

    # ------------------------------------------------------------------ low-level writes
    def _put(self, item: dict, condition: str | None, names: dict | None, values: dict | None,
             return_old: bool = False, mirror: bool = False) -> dict:
        """One PutItem; the caller's condition is the whole contract (see the write paths).

        An authoritative write checks our liveness window before every attempt (a retry
        after it could act on an authority the fleet has left); a mirror write does not:
        it carries the whole authoritative item under its version fence, so a late one
        only ever installs that item where nothing newer is, while a mirror never sent
        would leave the write in one layout only.
        """
        kwargs = expression_kwargs(condition, names, values)
        if return_old:
            kwargs["ReturnValues"] = "ALL_OLD"
        return self._call("put_item", guard=None if mirror else self._phases.check_live,
                          TableName=self.table, Item=item, **kwargs)

    def _put_through(self, st: PhaseState, targets: list[tuple[dict, bool]], base: Mapping[str, Any],
                     app_condition: str | None, app_names: dict, app_values: dict, *, return_old: bool,
                     tombstone: bool = False) -> dict:
        """Put ``base`` (a logical item, or a tombstone's key fields) on the authoritative
        key under the app's condition and the fence, then mirror the item it stored.

        Mirrors get exactly the stored item (same version, the winning retry's), so
        both layouts converge on it. Returns the authoritative PutItem's response.
        """
        key, mark = targets[0]
        built: dict = {}
        self._check_sizes(st, targets, base, tombstone)
        # The app's condition sees a tombstone as the absent item it stands for.
        app_condition, uses = tombstone_aware(app_condition)
        if uses:
            app_names = {**app_names, TOMBSTONE_NAME: TOMBSTONE_ATTR}

        def attempt(version, condition, names, values):
            item = dict(base)
            item.update(key)
            self._marked(item, mark)
            if version:  # always set in tombstone phases: they all stamp
                item[VERSION_ATTR] = {"S": version}
            if tombstone:
                item[TOMBSTONE_ATTR] = {"BOOL": True}
            built["item"] = item
            return self._put(item, condition, {**app_names, **names} or None, {**app_values, **values} or None,
                             return_old=return_old)

        _, resp = self._authoritative(st, key, app_condition, attempt)
        self._mirror_to(targets[1:], built["item"])
        if isinstance(resp, _Landed):
            # Our own attempt landed and its answer was lost: the write happened exactly once.
            if return_old:
                raise OldValuesUnknown("DeleteItem" if tombstone else "PutItem")
            return {}
        return resp

    def _check_sizes(self, st: PhaseState, targets: list[tuple[dict, bool]], base: Mapping[str, Any],
                     tombstone: bool) -> None:
        """Refuse, before the authoritative write, an item that one layout cannot store.

        The new layout's copy is larger (the marker, maybe a longer key): a put checked
        only by DynamoDB on the authoritative write would commit there and then fail on
        the mirror, leaving an acknowledged-looking half write that verify cannot repair.
        """
        if tombstone:
            return
        # A version string as long as the one the write will carry.
        version = {"S": "0" * 13 + ".000000." + self.versions.writer_id} if st.stamps else None
        for i, (key, mark) in enumerate(targets):
            item = dict(base)
            item.update(key)
            self._marked(item, mark)
            if version:
                item[VERSION_ATTR] = version
            size = item_size(item)
            if size > MAX_ITEM_BYTES:
                side = st.routing.writes[min(i, len(st.routing.writes) - 1)]
                raise ItemTooLarge("put_item", f"Item size has exceeded the maximum allowed size: the item would be "
                                   f"{size} bytes in the {side} layout of migration {self.migration.id!r} "
                                   f"(limit {MAX_ITEM_BYTES} bytes = 400 KB, including reshard's bookkeeping "
                                   "attributes and the longer key); nothing was written")

    def _mirror_to(self, mirrors: list[tuple[dict, bool]], item: Mapping[str, Any]) -> None:
        """Copy the authoritative copy's resulting ``item`` to every other layout's key."""
        for key, mark in mirrors:
            mirrored = dict(item)
            mirrored.update(key)
            self._mirror(self._marked(mirrored, mark))

    def _mirror(self, item: dict) -> None:
        """Write the full resulting item to the other layout, fenced by its own version.

        The fence keeps an older mirror (ours, delayed; or a lagging instance's) from
        overwriting a newer copy or a tombstone on that layout.
        """
        fence = fence_for(version_of(item))
        try:
            self._put(item, fence.expression, fence.names, fence.values, mirror=True)
        except errors.ConditionalCheckFailed:
            pass  # a newer write (or tombstone) is already there: it wins, as it should
        except errors.ShimUnavailable as e:
            # Late: this shim froze (or the mirror was held) past its phase fact's horizon, so
            # the fleet may have moved on (two transitions: the item may be deleted or stripped
            # since). DynamoDB refused the mirror -- or it was never sent -- and that is the
            # fence working. The authoritative write landed: the app's write succeeded; the
            # other layout catches up (the switch's newer_may_be, then verify).
            log.warning("reshard shim %s: mirror write of %s to table %r not applied, too late (the authoritative "
                        "write landed; the fleet's catch-up and verify bring the other layout up to date): %s",
                        self.instance_id, {k: item[k] for k in self.mapper.old.key_attrs if k in item}, self.table, e)
        except errors.ReshardError as e:
            # The authoritative write landed; this layout misses it until the next write,
            # a backfill re-run or verify --repair (README, Limits). Say so loudly.
            shim_metrics.mirror_failed(self.migration.id, self._phases.phase)
            log.warning("reshard shim %s: mirror write of %s to table %r failed after the authoritative write "
                        "landed (re-run `reshard verify` before the next transition): %s",
                        self.instance_id, {k: item[k] for k in self.mapper.old.key_attrs if k in item}, self.table, e)
            raise

    def _catch_up(self, st: PhaseState, fields: dict, targets: list[tuple[dict, bool]]) -> None:
        """Catch-up after an authority switch (``routing.catch_up``, docs/late-writes.md): bring
        the authoritative copy up to a newer copy of the flagged layout before writing over it.

        A mirror lost before the switch (its writer died between its two writes, or froze until
        the mirror was refused as late) left the flagged layout newer than the authoritative
        one. One consistent BatchGetItem reads the authoritative key and the flagged layout's
        copy (every candidate of a random-suffix layout); when that copy is newer (or the
        authoritative copy is missing), it is put onto the authoritative key under its own
        version's fence -- never over a newer write -- and the version clock observes it, so
        the write that follows builds on it and carries a higher version (its mirror then
        overwrites the stale copy: both layouts equal again). A tombstone is copied like an
        item: the write then builds on the absent item it stands for.
        """
        other = st.routing.catch_up
        if other is None:
            return
        auth_key, mark = targets[0]
        layout = self.mapper.layout(other)
        candidates = [k for k in layout.candidate_keys(fields) if k != auth_key]
        if not candidates:
            return  # the item does not move: one physical item serves both layouts
        found = self._batch_get([auth_key] + candidates, consistent=True)
        auth = next((i for i in found if self._key_of(i) == auth_key), None)
        copies = [i for i in found if self._key_of(i) != auth_key]
        if other == "old" and layout.random:
            # A new copy found at a key the old template also parses is not an old copy.
            copies = [i for i in copies if not self.mapper.is_new_copy(i)]
        best = newest(copies)
        if best is None or (auth is None and is_tombstone(best)):
            return
        if auth is not None and version_of(best) <= version_of(auth):
            return
        item = {k: v for k, v in best.items() if k != SOURCE_ATTR}
        item.update(auth_key)
        self._marked(item, mark)
        if not is_tombstone(item):
            item = self._with_index_values(st, item, fields)  # the phase's GSI value, as every copy it writes
        fence = fence_for(version_of(best))
        try:
            self._put(item, fence.expression, fence.names, fence.values)
        except errors.ConditionalCheckFailed:
            pass  # something at least as new landed meanwhile: the write builds on that
        self.versions.observe(version_of(best))
        log.info("reshard shim %s: caught %s up from the %s layout (version %s)", self.instance_id, auth_key, other,
                 version_of(best) or "unversioned")

    def _authoritative(self, st: PhaseState, key: dict, app_condition: str | None,
                       attempt: Callable[[str | None, str | None, dict, dict], dict],
                       update: bool = False) -> tuple[str | None, dict]:
        """Run ``attempt(version, condition, names, values)`` on the authoritative copy.

        In fenced phases the condition is the app's AND the version fence; in stamped phases
        without a fence (cleanup, complete) the app's AND ``_rs_v <> :v`` (``not_version``). On a
        failed condition one consistent read tells them apart:

        * the stored version *is* ours: our own attempt landed and its answer was lost (the
          client retried it): returns a :class:`_Landed` with the stored item -- the write
          happened exactly once, and is not applied again (an ``ADD`` stays single);
        * fenced, stored version >= ours: a fence loss: observe it and retry above it;
        * otherwise the application's condition failed.

        A copy a cleanup retired (``_rs_gone``) at the key is no item: when it fails a condition
        (an ``update`` never writes over one: it would keep its stale attributes) it is deleted,
        still retired and unchanged, and the write is tried again.
        """
        version = self.versions.next() if st.stamps else None
        for _ in range(MAX_FENCE_RETRIES + 1):
            names: dict = {}
            values: dict = {}
            condition = app_condition
            fence = fence_for(version) if st.routing.fenced else not_version(version) if version else None
            if fence is not None:
                ours = fence.expression
                if update:
                    ours = f"({ours}) AND attribute_not_exists(#rs_gone)"
                    names["#rs_gone"] = GONE_ATTR
                condition = and_conditions(app_condition, ours)
                names.update(fence.names)
                values.update(fence.values)
            try:
                return version, attempt(version, condition, names, values)
            except errors.ConditionalCheckFailed:
                if fence is None:
                    raise  # no condition of ours in this phase: only the app's can have failed
                # Consistent: a stale (older) version would turn our fence loss into a
                # false "condition failed" for the application.
                item = self._call("get_item", TableName=self.table, Key=key, ConsistentRead=True).get("Item")
                if is_retired(item):
                    self._remove_retired(key, item)
                    continue
                if own_attempt(version, item) or (not st.routing.fenced and not app_condition and not update):
                    # (An unfenced put with no app condition: only `_rs_v <> :v` can have failed, so
                    # our attempt landed, even if a newer write replaced it before this read.)
                    log.info("reshard shim %s: %s landed on a lost answer's first attempt; not applied again",
                             self.instance_id, key)
                    return version, _Landed(Attributes=item)
                # A stored version is input: one no reshard writer wrote (malformed, or further
                # ahead than the clocks' skew) is never adopted; this item's write is refused.
                stored = stored_version(item, self.versions.now(), f"item {_key_text(key)} of table {self.table!r}")
                if not st.routing.fenced:
                    if not app_condition:
                        continue  # an update's retired-copy guard, and that copy is gone since: again
                    raise  # not ours: the app's condition failed
                if stored >= version:
                    self.versions.observe(stored)  # another writer is ahead: go above it
                elif app_condition:
                    raise  # the stored item is older than us, so it was the app's condition
                # Otherwise the newer item that beat our fence was replaced or removed
                # before our read (e.g. by an unfenced cleanup-phase instance): try again.
                version = self.versions.next()
        # Bounded: a writer that keeps losing (a badly lagging clock, a hot key) fails
        # the request loudly instead of spinning.
        raise errors.AWSError("write", "ReshardVersionConflict",
                              f"lost the version race on {key} {MAX_FENCE_RETRIES + 1} times; retry the request")

    def _remove_retired(self, key: dict, item: Mapping[str, Any]) -> None:
        """Delete a copy a cleanup retired (``_rs_gone``), if it is still that copy: no reader
        counts it, its TTL would remove it later, and a write must not build on it."""
        fence = unchanged(version_of(item), self.mapper.keys.partition)
        try:
            self._call("delete_item", guard=self._phases.check_live, TableName=self.table, Key=key,
                       ConditionExpression=f"attribute_exists(#rs_gone) AND ({fence.expression})",
                       ExpressionAttributeNames={**fence.names, "#rs_gone": GONE_ATTR},
                       **({"ExpressionAttributeValues": fence.values} if fence.values else {}))
        except errors.ConditionalCheckFailed:
            pass  # changed since: the retried write meets what is there now

    @staticmethod
    def _app_names_values(names: Mapping | None, values: Mapping | None) -> tuple[dict, dict]:
        check_placeholders(names, values)
        return dict(names or {}), to_wire(dict(values)) if values else {}

    @classmethod
    def _app_expressions(cls, condition: Any, names: Mapping | None,
                         values: Mapping | None) -> tuple[str | None, dict, dict]:
        """(condition text, wire names, wire values) of the app's request.

        A boto3 condition object (``Attr("x").not_exists()``) becomes text, names and
        values through boto3's own ``ConditionExpressionBuilder``, as boto3's Table does
        (``#n0`` / ``:v0`` placeholders, merged with the app's own).
        """
        names, values = dict(names or {}), dict(values or {})
        if isinstance(condition, ConditionBase):
            built = ConditionExpressionBuilder().build_expression(condition, is_key_condition=False)
            condition = built.condition_expression
            _merge_placeholders(names, built.attribute_name_placeholders, "ExpressionAttributeNames")
            _merge_placeholders(values, built.attribute_value_placeholders, "ExpressionAttributeValues")
        elif condition is not None and not isinstance(condition, str):
            raise errors.BadInput(f"ConditionExpression must be a string or a boto3 condition "
                                  f"(boto3.dynamodb.conditions.Attr/Key), not {type(condition).__name__}")
        app_names, app_values = cls._app_names_values(names, values)
        return condition, app_names, app_values

    def _to_app(self, item: Mapping[str, Any] | None, layout: Layout | None = None) -> dict | None:
        if not item or is_tombstone(item) or _hidden(item):
            return None
        if layout is None:
            layout = self.mapper.old
        try:
            logical = self.mapper.to_logical(item, layout)
        except errors.UnmappableItem:
            other = self.mapper.new if layout is self.mapper.old else self.mapper.old
            logical = self.mapper.to_logical(item, other)
        return from_wire(logical)

    def _strip(self, attrs: Mapping[str, Any] | None) -> dict | None:
        """Returned attributes without bookkeeping and physical keys (for UPDATED_* values)."""
        if not attrs or is_tombstone(attrs) or _hidden(attrs):
            return None
        return from_wire({k: v for k, v in attrs.items()
                          if not k.startswith(RESERVED_PREFIX) and (k not in self._key_attrs or k in self._kept)})

    # ------------------------------------------------------------------ API: writes
    @client_errors("PutItem")
    @with_capacity
    def put_item(self, Item: Mapping[str, Any], ConditionExpression: str | ConditionBase | None = None,
                 ExpressionAttributeNames: Mapping[str, str] | None = None,
                 ExpressionAttributeValues: Mapping[str, Any] | None = None,
                 ReturnValues: str | None = None) -> dict:
        """Write a logical item, as boto3's ``Table.put_item``: ``{"ResponseMetadata": ...}``,
        plus ``"Attributes"`` (the old item) with ReturnValues ALL_OLD when there was one."""
        if ReturnValues not in (None, "NONE", "ALL_OLD"):
            raise errors.BadInput(f"put_item ReturnValues must be NONE or ALL_OLD (got {ReturnValues!r})")
        logical = self._logical_item(Item)
        fields = self._fields(logical)
        condition, app_names, app_values = self._app_expressions(ConditionExpression, ExpressionAttributeNames,
                                                                 ExpressionAttributeValues)
        st = self._begin()
        try:
            logical = self._with_index_values(st, logical, fields)
            targets = self._write_keys(st, fields)
            self._catch_up(st, fields, targets)
            resp = self._put_through(st, targets, logical, condition, app_names, app_values,
                                     return_old=ReturnValues == "ALL_OLD")
        finally:
            self._end(st)
        return self._response(resp.get("Attributes") if ReturnValues == "ALL_OLD" else None,
                              self.mapper.layout(st.routing.writes[0]), resp)

    @client_errors("DeleteItem")
    @with_capacity
    def delete_item(self, Key: Mapping[str, Any], ConditionExpression: str | ConditionBase | None = None,
                    ExpressionAttributeNames: Mapping[str, str] | None = None,
                    ExpressionAttributeValues: Mapping[str, Any] | None = None,
                    ReturnValues: str | None = None) -> dict:
        """Delete a logical item (a tombstone in fenced phases), as boto3's ``Table.delete_item``.
        ReturnValues: NONE or ALL_OLD (``"Attributes"``: the deleted item, when there was one)."""
        if ReturnValues not in (None, "NONE", "ALL_OLD"):
            raise errors.BadInput(f"delete_item ReturnValues must be NONE or ALL_OLD (got {ReturnValues!r})")
        key_wire, fields = self._key(Key)
        ConditionExpression, app_names, app_values = self._app_expressions(
            ConditionExpression, ExpressionAttributeNames, ExpressionAttributeValues)
        want_old = ReturnValues == "ALL_OLD"
        st = self._begin()
        try:
            targets = self._write_keys(st, fields)
            self._catch_up(st, fields, targets)
            keys = [k for k, _ in targets]
            if not st.routing.tombstones:
                # No racing copy exists in these phases (steady, cleanup, complete): a
                # plain delete, with the app's condition as DynamoDB would check it. The
                # condition and ALL_OLD belong to the authoritative key (in these phases
                # it is the only one).
                old, first = None, {}
                condition, uses = tombstone_aware(ConditionExpression)  # a leftover tombstone is absent
                if uses:
                    app_names = {**app_names, TOMBSTONE_NAME: TOMBSTONE_ATTR}
                for i, key in enumerate(keys):
                    kwargs: dict[str, Any] = {"TableName": self.table, "Key": key}
                    if condition and i == 0:
                        kwargs["ConditionExpression"] = condition
                        if app_names:
                            kwargs["ExpressionAttributeNames"] = app_names
                        if app_values:
                            kwargs["ExpressionAttributeValues"] = app_values
                    if want_old and i == 0:
                        kwargs["ReturnValues"] = "ALL_OLD"
                    resp = self._call("delete_item", guard=self._phases.check_live if i == 0 else None, **kwargs)
                    if i == 0:
                        old, first = resp.get("Attributes"), resp
                return self._response(old, self.mapper.layout(st.routing.writes[0]), first)
            # Tombstone: key fields let the backfill re-key it; the version orders it.
            marker_base = {f: key_wire[f] for f in self._key_fields}
            resp = self._put_through(st, targets, marker_base, ConditionExpression, app_names, app_values,
                                     return_old=want_old, tombstone=True)
        finally:
            self._end(st)
        return self._response(resp.get("Attributes") if want_old else None,
                              self.mapper.layout(st.routing.writes[0]), resp)

    @client_errors("UpdateItem")
    @with_capacity
    def update_item(self, Key: Mapping[str, Any], UpdateExpression: str | None = None,
                    ConditionExpression: str | ConditionBase | None = None,
                    ExpressionAttributeNames: Mapping[str, str] | None = None,
                    ExpressionAttributeValues: Mapping[str, Any] | None = None,
                    ReturnValues: str | None = None) -> dict:
        """DynamoDB's UpdateItem on the authoritative copy; the full result is mirrored, fenced.

        ReturnValues: NONE, ALL_NEW, UPDATED_NEW, ALL_OLD, UPDATED_OLD. When a mirror is
        written, the shim needs the new item: ALL_OLD / UPDATED_OLD then cost one more
        consistent read, and UPDATED_NEW returns whole top-level attributes.
        """
        rv = ReturnValues or "NONE"
        if rv not in ("NONE", "ALL_NEW", "UPDATED_NEW", "ALL_OLD", "UPDATED_OLD"):
            raise errors.BadInput(f"update_item ReturnValues {ReturnValues!r} is not one of DynamoDB's")
        key_wire, fields = self._key(Key)
        ConditionExpression, app_names, app_values = self._app_expressions(
            ConditionExpression, ExpressionAttributeNames, ExpressionAttributeValues)
        clauses = split_clauses(UpdateExpression) if UpdateExpression and UpdateExpression.strip() else {}
        targets = touched_attributes(clauses, app_names)
        check_targets(targets, self._frozen_attrs, "a key field or key attribute: an item's identity cannot "
                                                   "change (delete it and put the new one)")
        # Our own actions: a complete item even when the update creates it.
        extra_set, our_names, our_values = [], {}, {}
        for i, f in enumerate(self._key_fields):
            if f in self._key_attrs:
                continue  # a key kept as is (identity template): the Key already writes it, SET may not
            our_names[f"#rs_k{i}"] = f
            our_values[f":rs_k{i}"] = key_wire[f]
            extra_set.append(f"#rs_k{i} = if_not_exists(#rs_k{i}, :rs_k{i})")
        st = self._begin()
        try:
            write_targets = self._write_keys(st, fields)
            self._catch_up(st, fields, write_targets)
            keys = [k for k, _ in write_targets]
            mirrors = write_targets[1:]
            # In every phase, steady included: an update of a tombstone revives the item.
            # A tombstone left behind (a lagging shim's delete, an aborted migration's
            # marker) would otherwise hide this acknowledged update for good.
            extra_remove = [TOMBSTONE_NAME]
            our_names[TOMBSTONE_NAME] = TOMBSTONE_ATTR
            our_names["#rs_new"] = NEW_COPY_ATTR
            if write_targets[0][1]:
                extra_set.append("#rs_new = :rs_new")
                our_values[":rs_new"] = {"S": self.migration.id}
            else:
                # The same as a put: an unmarked target (it is also the old copy) loses a
                # stale marker, so rollback and cleanup treat it as the old item it is.
                extra_remove.append("#rs_new")
            if st.stamps:
                extra_set.append("#rs_v = :rs_nv")
                our_names["#rs_v"] = VERSION_ATTR
            # The app's condition sees a tombstone as the absent item it stands for.
            app_condition, _ = tombstone_aware(ConditionExpression)
            internal_rv = rv
            need_result = bool(mirrors or self._indexes)
            if need_result and rv in ("NONE", "UPDATED_NEW"):
                # The mirror (and an index value) needs the whole new item: get it from the update itself.
                internal_rv = "ALL_NEW"
            plan = self._index_update_plan(st, clauses, app_names, key_wire)
            read: dict = {}
            for _ in range(MAX_FENCE_RETRIES + 1):
                sets, index_names, index_values, condition = [], {}, {}, app_condition
                if plan is not None:
                    # GSI values computed from the update's own operands and the fields read
                    # here, set in the same request (shim/index.py: index_actions).
                    read = self._read_for_index(keys[0], plan)
                    sets, index_names, index_values, ours, overrides = index_actions(
                        plan, read, key_wire, app_values, UpdateExpression or "", ConditionExpression,
                        self._identity_text(fields))
                    condition = and_conditions(app_condition, ours)
                    index_values.update(overrides)
                expression = merge_update(UpdateExpression, extra_set + sets, extra_remove)

                def attempt(version, condition, names, values, expression=expression,
                            added=(index_names, index_values)):
                    kwargs: dict[str, Any] = {"TableName": self.table, "Key": keys[0],
                                              "UpdateExpression": expression,
                                              "ExpressionAttributeNames": {**app_names, **our_names, **added[0],
                                                                           **names}}
                    vals = {**app_values, **our_values, **added[1], **values}
                    if version:
                        vals[":rs_nv"] = {"S": version}
                    kwargs["ExpressionAttributeValues"] = vals
                    if condition:
                        kwargs["ConditionExpression"] = condition
                    if internal_rv != "NONE":
                        kwargs["ReturnValues"] = internal_rv
                    return self._call("update_item", guard=self._phases.check_live, **kwargs)

                try:
                    _, resp = self._authoritative(st, keys[0], condition, attempt, update=True)
                    break
                except errors.ConditionalCheckFailed:
                    # Ours or the app's condition: without an app condition it was ours; with
                    # one, ours failed only if a field read has changed since.
                    if plan is None or not plan.reads or (
                            app_condition and not read_changed(plan, read, self._read_for_index(keys[0], plan))):
                        raise
            else:
                raise errors.AWSError("write", "ReshardVersionConflict",
                                      f"the fields index values are computed from changed under the update of "
                                      f"{keys[0]} {MAX_FENCE_RETRIES + 1} times; retry the request")
            # Our own attempt already landed (its answer was lost): the stored item is our result.
            landed = isinstance(resp, _Landed)
            attrs = resp.get("Attributes")
            if need_result:
                if internal_rv == "ALL_NEW" or landed:
                    full = attrs
                else:
                    # The app asked for old values: read the result (one more read). A
                    # write landing in between is mirrored instead of ours; fine, it is
                    # newer and the mirror is fenced by its own version.
                    full = self._get(keys[0], True)[0]
                if full and self._indexes:
                    fixed = self._fix_index_values(st, keys[0], full)
                    if fixed and internal_rv == "ALL_NEW" and attrs:
                        attrs = {**attrs, **{a: v for a, v in fixed.items() if a in attrs}}
                if full and mirrors:  # None: the item was removed in between; nothing left to mirror
                    # Every copy gets the index value of the phase, as a put gives it.
                    self._mirror_to(mirrors, self._with_index_values(st, full, fields))
            if landed and rv in ("ALL_OLD", "UPDATED_OLD"):
                raise OldValuesUnknown("UpdateItem")  # after the mirror: the write is complete
        finally:
            self._end(st)
        meta = _metadata(resp)
        if rv == "NONE":
            return meta
        if rv in ("UPDATED_NEW", "UPDATED_OLD"):
            # Only what the app's actions touched: the shim's own SETs (key fields,
            # bookkeeping) count as "updated" for DynamoDB too.
            wanted = set(targets)
            attrs = {k: v for k, v in (attrs or {}).items() if k in wanted}
        if rv in ("ALL_OLD", "UPDATED_OLD") and attrs and is_tombstone(attrs):
            attrs = None
        out = self._strip(attrs)
        return {"Attributes": out, **meta} if out else meta

    # ------------------------------------------------------------------ sharded GSIs
    def _with_index_values(self, st: PhaseState, item: dict, fields: Mapping[str, Any]) -> dict:
        """``item`` (wire) with each sharded GSI attribute it carries set to the value of the
        layout this phase writes (``reshard.shim.index.write_value``)."""
        if not self._indexes:
            return item
        side = index_routing(st.phase).writes
        for im in self._indexes.values():
            value = write_value(im, item, side, self._identity_text(fields))
            if value is not None:
                item = {**item, im.attr: value}
        return item

    def _index_update_plan(self, st: PhaseState, clauses: Mapping[str, str], names: Mapping[str, str],
                           known: Mapping[str, Any]) -> IndexUpdate | None:
        """Whether this update sets GSI values in its own request (``shim/index.index_update_plan``)."""
        if not self._indexes or not clauses:
            return None
        return index_update_plan(list(self._indexes.values()), index_routing(st.phase).writes,
                                 update_effect(clauses, names), known)

    def _read_for_index(self, key: dict, plan: IndexUpdate) -> dict:
        """The attributes ``plan`` reads, consistently (an update conditioned on them follows)."""
        if not plan.reads:
            return {}
        names = {f"#rs_r{i}": a for i, a in enumerate(plan.reads)}
        names["#rs_gone"] = GONE_ATTR  # a retired copy there is no item: its fields are not the item's
        resp = self._call("get_item", TableName=self.table, Key=key, ConsistentRead=True,
                          ProjectionExpression=", ".join(names), ExpressionAttributeNames=names)
        item = resp.get("Item") or {}
        return {} if is_retired(item) else dict(item)

    def _fix_index_values(self, st: PhaseState, key: dict, full: Mapping[str, Any]) -> dict:
        """After an update: give each GSI attribute of the resulting item ``full`` the value of
        the layout this phase writes, when it has another one. Returns what it set.

        An update that writes a field the value is computed from (or the GSI attribute, or its
        sort attribute) already set the value in its own request (``index_update_plan``): here
        it is the phase's, and nothing is sent. Any other update changed nothing the value
        depends on, so this only moves an item still at the other layout's value to this
        phase's -- harmless if cut off (the shim dies, or fails closed, before it): the item is
        exactly as findable as before the update, every phase in which items may hold the
        other layout's value reads both layouts (``INDEX_ROUTING``), and the rewrite and verify
        move the rest. One more UpdateItem, only when the value differs: conditional on the GSI
        value and every field it is computed from being as read -- a write in between computed
        its own value, and a deleted item is never re-created. ``_rs_v`` is kept (the item's
        content did not change).
        """
        if is_tombstone(full):
            return {}
        side = index_routing(st.phase).writes
        fixed: dict = {}
        for im in self._indexes.values():
            try:
                value = write_value(im, full, side, self._identity_text(self.mapper.logical_fields(full)))
            except (errors.BadInput, errors.UnmappableItem) as e:
                # The update removed a field the value needs: the item stays where it is
                # (verify lists it); the write itself was the application's to make.
                log.warning("reshard shim %s: index %s value of %s not recomputed: %s", self.instance_id, im.name,
                            key, e)
                continue
            if value is None:
                continue
            names = {"#rs_g": im.attr}
            values = {":rs_g": value, ":rs_was": full[im.attr]}
            cond = ["#rs_g = :rs_was", *still_as_read(im.layout(side).needed_fields, full, "rs_f", names, values)]
            try:
                self._call("update_item", guard=self._phases.check_live, TableName=self.table, Key=key,
                           UpdateExpression="SET #rs_g = :rs_g", ConditionExpression=" AND ".join(cond),
                           ExpressionAttributeNames=names, ExpressionAttributeValues=values)
            except errors.ConditionalCheckFailed:
                # Changed since (that write computed the value from what it wrote) -- or this very
                # update landed and its answer was lost: then the item holds our value.
                now, _ = self._get(key, True)
                if now is None or now.get(im.attr) != value:
                    continue
            fixed[im.attr] = value
        return fixed

    def _response(self, old: Mapping[str, Any] | None, layout: Layout, resp: Mapping[str, Any]) -> dict:
        """A write's answer in boto3's shape: ``{"Attributes"?, "ResponseMetadata"}``."""
        out = self._to_app(old, layout) if old else None
        meta = _metadata(resp)
        return {"Attributes": out, **meta} if out else meta

    # ------------------------------------------------------------------ API: reads
    @client_errors("GetItem")
    @with_capacity
    def get_item(self, Key: Mapping[str, Any], ConsistentRead: bool = False) -> dict:
        """The logical item as boto3's ``Table.get_item`` answers: ``{"Item": {...},
        "ResponseMetadata": ...}``, or no ``"Item"`` when absent. Both layouts in one
        BatchGetItem where the phase reads both."""
        _, fields = self._key(Key)
        st = self._begin()
        try:
            keys = self._read_keys(st, fields)
            if len(keys) == 1:
                item, resp = self._get(keys[0][0], ConsistentRead)
                layout = keys[0][1]
            else:
                resp = {}
                found = self._batch_get([k for k, _ in keys], ConsistentRead, last_response=resp)
                item = newest(found)
                layout = None
                if item is not None:
                    k = self._key_of(item)
                    layout = next(l for kk, l in keys if kk == k)
        finally:
            self._end(st)
        out = self._to_app(item, layout)
        meta = _metadata(resp)
        return {"Item": out, **meta} if out is not None else meta

    @client_errors("Query")
    @with_capacity
    @_with_page_meta
    def query(self, KeyConditionExpression: str | ConditionBase | None = None, *,
              Key: Mapping[str, Any] | None = None, SortKeyCondition: tuple | None = None,
              FilterExpression: str | ConditionBase | None = None, ProjectionExpression: str | None = None,
              ExpressionAttributeNames: Mapping[str, str] | None = None,
              ExpressionAttributeValues: Mapping[str, Any] | None = None, Select: str | None = None,
              ScanIndexForward: bool = True, Limit: int | None = None,
              ExclusiveStartKey: Mapping[str, Any] | None = None, ConsistentRead: bool = False,
              IndexName: str | None = None) -> dict:
        """boto3's ``Table.query`` over logical fields, fanned out over every shard of every
        layout the phase reads, merged in sort-key order, newest copy wins, tombstones dropped.

        ``KeyConditionExpression``: ``Key("sensor_id").eq("s-1") & Key("ts").between(a, b)``
        or the string form with names and values; ``Key={"sensor_id": "s-1"}`` is shorthand
        for its equalities (``SortKeyCondition=("between", a, b)``, on the physical sort key,
        the older shorthand for the rest). ``FilterExpression`` and ``ProjectionExpression``
        are evaluated on the logical item (the newest copy), ``Limit`` counts logical items
        evaluated, ``LastEvaluatedKey`` is the logical key of the last one (pass it back as
        ``ExclusiveStartKey``). Returns ``{"Items", "Count", "ScannedCount",
        "LastEvaluatedKey"?}`` (no ``Items`` with ``Select="COUNT"``).

        ``IndexName``: one of the migration's sharded GSIs (``[index.NAME]``), queried over its
        logical fields (the GSI sort key, partition template and ``shard_by`` fields) by the
        fan-out of ``reshard/shim/index.py``; ``ConsistentRead=True`` is refused there, as by DynamoDB.
        """
        if IndexName is not None:
            return self._query_index(IndexName, KeyConditionExpression, Key=Key, SortKeyCondition=SortKeyCondition,
                                     FilterExpression=FilterExpression, ProjectionExpression=ProjectionExpression,
                                     ExpressionAttributeNames=ExpressionAttributeNames,
                                     ExpressionAttributeValues=ExpressionAttributeValues, Select=Select,
                                     ScanIndexForward=ScanIndexForward, Limit=Limit,
                                     ExclusiveStartKey=ExclusiveStartKey, ConsistentRead=ConsistentRead)
        names, values = dict(ExpressionAttributeNames or {}), dict(ExpressionAttributeValues or {})
        builder = ConditionExpressionBuilder()  # one per request: placeholders stay distinct, as in boto3
        kce = self._built(builder, KeyConditionExpression, names, values, True, "KeyConditionExpression")
        filt = self._built(builder, FilterExpression, names, values, False, "FilterExpression")
        check_placeholders(names, values)
        ctx = expressions.Context(names, to_wire(values) if values else {})
        if kce is not None and SortKeyCondition is not None:
            raise errors.BadInput("query: give KeyConditionExpression or SortKeyCondition, not both")
        node = expressions.parse_condition(kce, ctx, "KeyConditionExpression") if kce is not None else None
        post = self._post(filt, ProjectionExpression, Select, ctx)
        st = self._begin()
        try:
            key: dict[str, Any] = {}
            condition = SortKeyCondition
            if node is not None:
                layouts = [self.mapper.layout(side) for side in st.routing.reads]
                key, condition = logical_key_condition(self.mapper, layouts, node)
            for f, v in (Key or {}).items():
                if f in key and key[f] != v:
                    raise errors.BadInput(f"query: Key and KeyConditionExpression disagree on {f!r}")
                key[f] = v
            if not key:
                raise errors.BadInput("query: give the partition fields, in KeyConditionExpression "
                                      "(Key('sensor_id').eq(...)) or in Key={...}")
            resp = run_query(self._query_source, st.routing, key, condition, Limit, ScanIndexForward,
                             ExclusiveStartKey, ConsistentRead, post)
        finally:
            self._end(st)
        if Select == "COUNT":
            del resp["Items"]
        return resp

    def _query_index(self, index_name: str, KeyConditionExpression, *, Key, SortKeyCondition, FilterExpression,
                     ProjectionExpression, ExpressionAttributeNames, ExpressionAttributeValues, Select,
                     ScanIndexForward, Limit, ExclusiveStartKey, ConsistentRead) -> dict:
        """``query(IndexName=...)`` of one of the migration's sharded GSIs: the fan-out of
        ``reshard/shim/index.py`` over the partition values of every layout the phase reads."""
        im = self._indexes.get(index_name)
        if im is None:
            raise errors.BadInput(f"query: IndexName {index_name!r} is not a sharded index of migration "
                                  f"{self.migration.id!r} (its [index.NAME] tables: "
                                  f"{', '.join(self._indexes) or 'none'}); ShardedTable queries only those; query "
                                  "another index with table.meta.client.query(TableName=..., IndexName=...)")
        if ConsistentRead:
            raise errors.BadInput("Consistent reads are not supported on global secondary indexes")
        if SortKeyCondition is not None:
            raise errors.BadInput("query: SortKeyCondition is for the table's sort key; with IndexName use "
                                  f"KeyConditionExpression (Key({im.sort_attr!r}).eq(...))")
        names, values = dict(ExpressionAttributeNames or {}), dict(ExpressionAttributeValues or {})
        builder = ConditionExpressionBuilder()
        kce = self._built(builder, KeyConditionExpression, names, values, True, "KeyConditionExpression")
        filt = self._built(builder, FilterExpression, names, values, False, "FilterExpression")
        check_placeholders(names, values)
        ctx = expressions.Context(names, to_wire(values) if values else {})
        node = expressions.parse_condition(kce, ctx, "KeyConditionExpression") if kce is not None else None
        eq, condition = index_key_condition(im, node, Key)
        post = self._post(filt, ProjectionExpression, Select, ctx, index=True)
        st = self._begin()
        try:
            resp = run_index_query(self._index_source, im, index_routing(st.phase), eq, condition, Limit,
                                   ScanIndexForward, ExclusiveStartKey, Select, post, self._index_resolver(st))
        finally:
            self._end(st)
        if Select == "COUNT":
            del resp["Items"]
        return resp

    def _index_resolver(self, st: PhaseState) -> Resolver | None:
        """A combined migration's resolution of index entries (``reshard/shim/index.py``): an
        entry is one physical copy, so each logical item is read as ``get_item`` reads it in
        this phase (the newest copy; a tombstone is absent). None for an index-only migration."""
        if self._index_only:
            return None
        m = self.mapper
        known: dict[str, tuple[tuple, dict] | None] = {}  # per table key: both passes may meet an entry

        def identify(item: Mapping[str, Any]) -> tuple[tuple, dict] | None:
            k = repr(sorted(self._key_of(item).items()))
            if k not in known:
                known[k] = self._logical_key(item)
            return known[k]

        def of_key(wire: Mapping[str, Any]) -> tuple[tuple, dict]:
            fields = m.logical_fields(wire)
            return _identity(m, fields), m.old.candidate_keys(fields)[0]

        def resolve(wires: Sequence[Mapping[str, Any]]) -> list[tuple[dict, dict] | None]:
            out: list[tuple[dict, dict] | None] = []
            for got in self._newest_copies(st, [m.logical_fields(w) for w in wires], consistent=True):
                live = got is not None and not is_tombstone(got[0])
                out.append((got[0], m.to_logical(got[0], got[1])) if live else None)
            return out
        return Resolver(key_fields=m.key_fields, identify=identify, of_key=of_key, resolve=resolve)

    def _logical_key(self, item: Mapping[str, Any], reread: bool = True) -> tuple[tuple, dict] | None:
        """(identity, wire key fields) of a stored copy of either layout; None: unmappable.

        An index entry whose projection lacks a key field kept only as an attribute is read
        whole once (one consistent GetItem), rather than dropped from the results."""
        m = self.mapper
        missing = False
        for layout in ((m.new, m.old) if m.is_new_copy(item) else (m.old, m.new)):
            try:
                fields = m.fields(item, layout)
            except errors.UnmappableItem as e:
                missing = missing or e.reason == "missing-field"
                continue
            # A field stored as an attribute keeps its type in the cursor (a key template makes text).
            return _identity(m, fields), {f: item[f] if f in item else to_av(v) for f, v in fields.items()}
        if missing and reread:
            whole = self._get(self._key_of(item), True)[0]
            if whole is not None:
                return self._logical_key(whole, reread=False)
        return None

    @staticmethod
    def _built(builder: ConditionExpressionBuilder, expression: Any, names: dict, values: dict, is_key: bool,
               what: str) -> str | None:
        """The text of an expression given as text or as a boto3 condition object (its names
        and values merged into ``names`` / ``values``)."""
        if expression is None or isinstance(expression, str):
            return expression
        if not isinstance(expression, ConditionBase):
            raise errors.BadInput(f"{what} must be a string or a boto3 condition (boto3.dynamodb.conditions), "
                                  f"not {type(expression).__name__}")
        built = builder.build_expression(expression, is_key_condition=is_key)
        _merge_placeholders(names, built.attribute_name_placeholders, "ExpressionAttributeNames")
        _merge_placeholders(values, built.attribute_value_placeholders, "ExpressionAttributeValues")
        return built.condition_expression

    @staticmethod
    def _post(filt: str | None, projection: str | None, select: str | None,
              ctx: "expressions.Context", index: bool = False) -> Callable[[dict], dict | None] | None:
        """What a read returns for an evaluated application item: filtered, projected (None: dropped)."""
        if index and select == "ALL_PROJECTED_ATTRIBUTES":
            if projection:
                raise errors.BadInput("Cannot specify the ProjectionExpression when choosing to get "
                                      "ALL_PROJECTED_ATTRIBUTES")
            select = None
        if select not in (None, "ALL_ATTRIBUTES", "COUNT", "SPECIFIC_ATTRIBUTES"):
            raise errors.BadInput(f"Select {select!r}: ALL_PROJECTED_ATTRIBUTES needs an index (IndexName is not "
                                  "supported yet); use ALL_ATTRIBUTES, SPECIFIC_ATTRIBUTES or COUNT")
        if select == "ALL_ATTRIBUTES" and projection:
            raise errors.BadInput("Cannot specify the ProjectionExpression when choosing to get ALL_ATTRIBUTES")
        if select == "SPECIFIC_ATTRIBUTES" and not projection:
            raise errors.BadInput("Select SPECIFIC_ATTRIBUTES needs a ProjectionExpression")
        node = expressions.parse_condition(filt, ctx, "FilterExpression") if filt else None
        paths = expressions.parse_projection(projection, ctx) if projection else None
        if node is None and paths is None:
            return None

        def post(item: dict) -> dict | None:
            wire = to_wire(item)
            if node is not None and not expressions.evaluate(node, wire):
                return None
            return from_wire(expressions.project(wire, paths)) if paths is not None else item
        return post

    @client_errors("Scan")
    @with_capacity
    @_with_page_meta
    def scan(self, *, FilterExpression: str | ConditionBase | None = None, ProjectionExpression: str | None = None,
             ExpressionAttributeNames: Mapping[str, str] | None = None,
             ExpressionAttributeValues: Mapping[str, Any] | None = None, Select: str | None = None,
             Limit: int | None = None, ExclusiveStartKey: Mapping[str, Any] | None = None,
             Segment: int | None = None, TotalSegments: int | None = None, ConsistentRead: bool = False,
             IndexName: str | None = None) -> dict:
        """boto3's ``Table.scan``: every live logical item once, whatever layout holds it
        (``reshard/shim/scan.py``). Filter and projection apply to the newest copy;
        ``LastEvaluatedKey`` is the physical position, to pass back unchanged."""
        if IndexName is not None and IndexName in self._indexes:
            # A physical scan of the index would see an item twice or miss it while the
            # migration moves it between partition values (the scan's order is by value).
            raise errors.BadInput(f"scan: IndexName {IndexName!r} is a sharded index of migration "
                                  f"{self.migration.id!r}: scan the table instead (every item of the index is an "
                                  f"item of the table; FilterExpression=Attr({self._indexes[IndexName].attr!r}).exists() "
                                  "keeps the index's items), or query the index")
        if IndexName is not None:
            raise errors.BadInput("scan: IndexName is not supported by ShardedTable yet (the sharded-GSI issue); "
                                  "scan the index with table.meta.client.scan(TableName=..., IndexName=...)")
        names, values = dict(ExpressionAttributeNames or {}), dict(ExpressionAttributeValues or {})
        filt = self._built(ConditionExpressionBuilder(), FilterExpression, names, values, False, "FilterExpression")
        check_placeholders(names, values)
        ctx = expressions.Context(names, to_wire(values) if values else {})
        post = self._post(filt, ProjectionExpression, Select, ctx)
        st = self._begin()
        try:
            resp = run_scan(self._scan_source, st.routing, Limit, ExclusiveStartKey, Segment, TotalSegments,
                            ConsistentRead, post)
        finally:
            self._end(st)
        if Select == "COUNT":
            del resp["Items"]
        return resp

    def _scan_page(self, **kwargs) -> dict:
        resp = self._call("scan", TableName=self.table, **kwargs)
        _note_page(resp)
        return self._visible(resp)

    def _lookup(self, keys: list[dict]) -> list[dict]:
        # Consistent: a scan decides which copy to return from these reads.
        return self._batch_get(keys, consistent=True)

    # Two of the callables this table hands to query.py as its QuerySource (with _to_app).
    def _query_page(self, **kwargs) -> dict:
        resp = self._call("query", TableName=self.table, **kwargs)
        _note_page(resp)
        return self._visible(resp)

    def _run_all(self, fn: Callable[[Any], None], items: Sequence[Any]) -> None:
        pool = self._pool() if len(items) > 1 else None
        if pool is not None:
            # Each task in a copy of the caller's context (one copy each: a context cannot
            # be entered by two threads), so the request's capacity count follows it.
            tasks = [(contextvars.copy_context(), x) for x in items]
            list(pool.map(lambda t: t[0].run(fn, t[1]), tasks))
        else:
            for x in items:
                fn(x)

    def _pool(self) -> ThreadPoolExecutor | None:
        if self._query_workers <= 1:
            return None
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._query_workers, thread_name_prefix="reshard-query")
            return self._executor

    # ------------------------------------------------------------------ API: bulk
    def batch_writer(self, overwrite_by_pkeys: Sequence[str] | None = None) -> "BatchWriter":
        """boto3-style bulk puts/deletes. BatchWriteItem where the phase writes one unfenced
        layout with computable keys (steady, cleanup, complete); otherwise each item is an
        individual fenced put/delete (correctness over batching). ``overwrite_by_pkeys``
        (logical key fields), as boto3's: a buffered request for the same key is replaced."""
        return BatchWriter(self, overwrite_by_pkeys=overwrite_by_pkeys)

    @client_errors("BatchGetItem")
    @with_capacity
    def batch_get_item(self, Keys: Sequence[Mapping[str, Any]], ConsistentRead: bool = False,
                       ProjectionExpression: str | None = None,
                       ExpressionAttributeNames: Mapping[str, str] | None = None) -> dict:
        """The equivalent of boto3's ``batch_get_item`` for this table (boto3 has it on the
        resource): ``{"Items": [...], "UnprocessedKeys": {}}``, the items found, in no
        particular order, every copy of every key read in BatchGetItems of 100 keys.
        """
        if len(Keys) > 100:
            raise errors.BadInput("Too many items requested for the BatchGetItem call (at most 100 keys)")
        names = dict(ExpressionAttributeNames or {})
        check_placeholders(names, None)
        post = self._post(None, ProjectionExpression, None, expressions.Context(names, {}))
        fields_of = [self._key(k)[1] for k in Keys]
        meta: dict = {}
        st = self._begin()
        try:
            winners = self._newest_copies(st, fields_of, ConsistentRead, meta)
        finally:
            self._end(st)
        out = []
        for winner in winners:
            app = self._to_app(*winner) if winner is not None else None
            if app is not None:
                out.append(post(app) if post is not None else app)
        return {"Items": out, "UnprocessedKeys": {}, **_metadata(meta)}

    def _newest_copies(self, st: PhaseState, fields_of: Sequence[dict], consistent: bool,
                       meta: dict | None = None) -> list[tuple[dict, Layout] | None]:
        """Per logical item (its fields): the newest of the copies the phase reads, with its
        layout (a tombstone included), or None -- every copy of every item in one BatchGetItem
        (chunks of 100 keys), as ``get_item`` reads one item."""
        wanted: list[list[tuple[dict, Layout]]] = [self._read_keys(st, fields) for fields in fields_of]
        unique: dict[str, dict] = {}
        for keys in wanted:
            for k, _ in keys:
                unique.setdefault(repr(sorted(k.items())), k)
        found = {repr(sorted(self._key_of(i).items())): i
                 for i in self._batch_get(list(unique.values()), consistent, last_response=meta)}
        out: list[tuple[dict, Layout] | None] = []
        for keys in wanted:
            copies = [(found[r], layout) for r, layout in ((repr(sorted(k.items())), l) for k, l in keys)
                      if r in found]
            winner = newest(c[0] for c in copies)
            out.append(None if winner is None else (winner, next(l for i, l in copies if i is winner)))
        return out

    @property
    def meta(self) -> "TableMeta":
        """``meta.client`` (the low-level client, for the rest) and ``meta.table_name``, as boto3's."""
        return TableMeta(self)

    @property
    def name(self) -> str:
        return self.table

    # ------------------------------------------------------------------ boto3's Table attributes
    @property
    def table_name(self) -> str:
        """The table's name (boto3's identifier), as ``name``."""
        return self.table

    def load(self) -> None:
        """As boto3's ``Table.load``: one DescribeTable now (``ResourceNotFoundException`` when the
        table does not exist); the description attributes read it, the first read loads it."""
        self._description = self.dynamo.call("describe_table", TableName=self.table)["Table"]

    def reload(self) -> None:
        """As boto3's ``Table.reload``: :meth:`load` again."""
        self.load()

    def _described(self, member: str) -> Any:
        if getattr(self, "_description", None) is None:
            self.load()
        return self._description.get(member)

    @property
    def key_schema(self) -> list[dict]:
        """The *logical* key: every field a ``Key`` holds (``HASH`` the fields that choose the
        partition, ``RANGE`` the others), in boto3's shape. The physical schema (``PK``/``SK``) is
        ``meta.client.describe_table``'s: the application never names those attributes."""
        m = self.mapper
        partition = {f for lay in (m.old, m.new) for f in (*lay.partition.fields, *lay.shard_by)}
        schema = [{"AttributeName": f, "KeyType": "HASH" if f in partition else "RANGE"} for f in m.key_fields]
        return sorted(schema, key=lambda k: k["KeyType"] != "HASH")  # HASH first, as DynamoDB lists them

    @property
    def attribute_definitions(self) -> list[dict]:
        """The logical key fields' types, then the table's other defined attributes (its indexes'
        keys) from DescribeTable. A field that alone forms a key attribute has that attribute's
        type; a field rendered into a composite key is text there (``S``)."""
        defined = {d["AttributeName"]: d["AttributeType"] for d in self._described("AttributeDefinitions") or ()}
        m = self.mapper
        alone = {}
        for lay in (m.old, m.new):
            for attr, template in ((lay.partition_attr, lay.partition), (lay.sort_attr, lay.sort)):
                if template is not None and template.identity and attr in defined:
                    alone[template.fields[0]] = defined[attr]
        out = [{"AttributeName": f, "AttributeType": alone.get(f, defined.get(f, "S"))}
               for f in (k["AttributeName"] for k in self.key_schema)]
        hidden = set(m.key_fields) | (self._key_attrs - self._kept)
        return out + [{"AttributeName": a, "AttributeType": t} for a, t in defined.items() if a not in hidden]


def control_table_name(name: str | None | object = USE_ENV) -> str | None:
    """The control table a shim reads: the one named, else ``$RESHARD_CONTROL_TABLE`` (as the CLI's
    ``--control-table``), else ``reshard-control``. None: no control table (steady forever)."""
    if name is USE_ENV:
        return os.environ.get("RESHARD_CONTROL_TABLE") or DEFAULT_CONTROL_TABLE
    return name  # type: ignore[return-value]


def app_dynamo(dynamo: Dynamo | None, endpoint_url: str | None, region_name: str | None, session, client,
               config) -> tuple[Dynamo, Dynamo | None]:
    """(the Dynamo of the application's requests, the one of the shim's control refresh or None: the same).

    * ``client=`` (the app's DynamoDB client): used as it is; its retries (mode, attempts, backoff)
      and timeouts stay in force for the app's requests (:meth:`Dynamo.for_app`).
    * ``session=``/``config=``: a client made from the app's session (credentials, profile, region)
      with the app's Config merged over the shim's defaults: an option it sets wins; retries it
      sets are in force as a client's (botocore's path) and on the lean path alike.
    * none: the shim's own client and bounded policy (``SHIM_RETRIES``, 5 s/30 s timeouts).

    The control refresh keeps the shim's bounded policy whatever the app's (``SHIM_RETRIES``, 5 s
    connect, 30 s read on the lean path): a refresh must end well within ``liveness_seconds``
    or the shim fails closed, and it is retried at the next tick anyway; the app's policy may be
    minutes long (botocore's defaults: 10 attempts of up to 60 + 60 s).
    """
    if client is not None:
        if any(v is not None for v in (dynamo, endpoint_url, region_name, session, config)):
            raise errors.BadInput("client= is the application's DynamoDB client as it is: pass it alone "
                                  "(its endpoint, region, credentials and Config come with it), or pass "
                                  "session=/config=/endpoint_url=/region_name= instead")
        if getattr(getattr(client, "meta", None), "service_model", None) is None or \
                client.meta.service_model.service_name != "dynamodb":
            raise errors.BadInput("client= must be a boto3 DynamoDB client (boto3.client(\"dynamodb\"), "
                                  "or resource.meta.client)")
        app = Dynamo.for_app(client)
    elif dynamo is not None:
        if session is not None or config is not None:
            raise errors.BadInput("dynamo= already holds a client: pass session=/config= or dynamo=, not both")
        return dynamo, None
    elif session is None and config is None:
        app = Dynamo(endpoint_url=endpoint_url, region=region_name, retry=SHIM_RETRIES)
    else:
        made = make_client(endpoint_url=endpoint_url, region=region_name, session=session, config=config)
        sets_retries = config is not None and "retries" in getattr(config, "_user_provided_options", {})
        app = Dynamo.for_app(made) if sets_retries else Dynamo(made, retry=SHIM_RETRIES)
    # Always a Dynamo of its own (``background``): a tracer that pulls the app's requests onto
    # botocore's path (reshard/aws/lean.py) leaves the refresh thread's on the lean path -- no
    # application trace holds them (X-Ray would log a missing segment for each).
    return app, app.with_retry(SHIM_RETRIES, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                               read_timeout=READ_TIMEOUT_SECONDS)


def _description_attribute(member: str) -> property:
    def get(self: ShardedTable) -> Any:
        return self._described(member)
    get.__doc__ = f"DescribeTable's ``{member}`` of the table (boto3's Table attribute; loaded on first use)."
    return property(get)


#: The members of DynamoDB's TableDescription (botocore's model; listed, not loaded: reading the
#: service model costs ~80 ms at import). boto3's Table has one attribute per member.
_TABLE_DESCRIPTION = (
    "AttributeDefinitions", "TableName", "KeySchema", "TableStatus", "CreationDateTime", "ProvisionedThroughput",
    "TableSizeBytes", "ItemCount", "TableArn", "TableId", "BillingModeSummary", "LocalSecondaryIndexes",
    "GlobalSecondaryIndexes", "StreamSpecification", "LatestStreamLabel", "LatestStreamArn", "GlobalTableVersion",
    "Replicas", "GlobalTableWitnesses", "GlobalTableSettingsReplicationMode", "RestoreSummary", "SSEDescription",
    "ArchivalSummary", "TableClassSummary", "DeletionProtectionEnabled", "OnDemandThroughput", "WarmThroughput",
    "MultiRegionConsistency")


# The rest of boto3's Table attributes (table_status, item_count, global_secondary_indexes, ...): the
# physical table's, as DescribeTable answers (key_schema, attribute_definitions: logical, above).
def _add_description_attributes() -> frozenset:
    from botocore import xform_name
    added = set()
    for member in _TABLE_DESCRIPTION:
        name = xform_name(member)
        if not hasattr(ShardedTable, name):
            setattr(ShardedTable, name, _description_attribute(member))
            added.add(name)
    return frozenset(added)


#: The public members whose only request is :meth:`ShardedTable.load`'s DescribeTable (iam.SHIM_METHODS' ``load`` row).
LOADS = _add_description_attributes() | {"reload", "attribute_definitions"}


def _identity(m: KeyMapper, fields: Mapping[str, Any]) -> tuple:
    """A logical item's position among equal sort values (as the table query orders them)."""
    return tuple(_plain(v) for v in m.identity(fields))


def _table_view(m: Migration) -> Migration:
    """The migration as :class:`KeyMapper` sees the table: an index-only migration keeps every
    item at its key, so both table layouts are the identity (one shard, no ``{shard}``)."""
    if m.changes_table:
        return m
    k = m.keys

    def spec(side: str) -> LayoutSpec:
        return LayoutSpec(side=side, partition=(TemplatePart(field=k.partition),),
                          partition_text="{" + k.partition + "}", sort=None, sort_text=None, shards=1, shard_by=(),
                          hash=None, shard_function=None)
    return dataclasses.replace(m, source=spec("from"), target=spec("to"))


def _metadata(resp: Mapping[str, Any]) -> dict:
    """``{"ResponseMetadata": ...}`` of the request that decided the answer (when the client gave one)."""
    meta = resp.get("ResponseMetadata")
    return {"ResponseMetadata": meta} if meta is not None else {}


def _merge_placeholders(into: dict, built: Mapping[str, Any], what: str) -> None:
    for k, v in built.items():
        if k in into and into[k] != v:
            raise errors.BadInput(f"{what} {k}: used by the app and by its boto3 condition object with "
                                  "different meanings; rename the app's placeholder")
        into[k] = v


#: The low-level operations that read or write this table's items: through ``meta.client``
#: they would see or write physical items, bypassing the layouts, fences and tombstones.
_ITEM_OPERATIONS = {
    "get_item": "get_item", "put_item": "put_item", "update_item": "update_item", "delete_item": "delete_item",
    "query": "query", "scan": "scan", "batch_get_item": "batch_get_item", "batch_write_item": "batch_writer()",
    "transact_write_items": "one put_item/update_item/delete_item per item (no transactions across layouts)",
    "transact_get_items": "batch_get_item", "execute_statement": "query/scan",
    "batch_execute_statement": "batch_get_item/batch_writer()", "execute_transaction": "put_item/update_item",
}


class TableMeta:
    """boto3's ``Table.meta``: ``client`` and ``table_name``."""

    def __init__(self, table: ShardedTable):
        self.table_name = table.table
        self.client = GuardedClient(table.dynamo.client, table.table)


class GuardedClient:
    """The low-level DynamoDB client, refusing item operations on the sharded table.

    Everything else (describe_table, other tables, waiters, exceptions ...) passes through.
    """

    def __init__(self, client, table: str):
        self._client = client
        self._table = table

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if name not in _ITEM_OPERATIONS:
            return attr

        def call(*args, **kwargs):
            if self._names_table(kwargs):
                raise ShimValidationError(
                    f"meta.client.{name} on {self._table!r} would read or write physical items, bypassing the "
                    f"migration's layouts, version fences and tombstones; use ShardedTable.{_ITEM_OPERATIONS[name]}",
                    name)
            return attr(*args, **kwargs)
        return call

    def _names_table(self, kwargs: Mapping[str, Any]) -> bool:
        if kwargs.get("TableName") == self._table or self._table in (kwargs.get("RequestItems") or {}):
            return True
        for t in kwargs.get("TransactItems") or ():
            if any(isinstance(v, Mapping) and v.get("TableName") == self._table for v in t.values()):
                return True
        statements = [kwargs.get("Statement") or ""] + [s.get("Statement", "") for s in kwargs.get("Statements") or ()]
        statements += [s.get("Statement", "") for s in kwargs.get("TransactStatements") or ()]
        return any(f'"{self._table}"' in st or f" {self._table}" in st for st in statements)


class BatchWriter:
    """Buffers puts and deletes; ``with table.batch_writer() as b: b.put_item(Item=...)``."""

    def __init__(self, table: ShardedTable, flush_amount: int = 25, overwrite_by_pkeys: Sequence[str] | None = None):
        self._t = table
        self._ops: list[tuple[str, Mapping[str, Any]]] = []
        self._flush_amount = flush_amount
        self._pkeys = list(overwrite_by_pkeys or [])

    def _add(self, kind: str, body: Mapping[str, Any]) -> None:
        if self._pkeys:
            # boto3's rule: a later request for the same key replaces the buffered one.
            try:
                ident = [body[k] for k in self._pkeys]
            except KeyError as e:
                raise errors.BadInput(f"overwrite_by_pkeys: the request lacks {e.args[0]!r}") from None
            self._ops = [(k, b) for k, b in self._ops if [b.get(p) for p in self._pkeys] != ident]
        self._ops.append((kind, body))
        if len(self._ops) >= self._flush_amount:
            self.flush()

    @client_errors("BatchWriteItem")
    def put_item(self, Item: Mapping[str, Any]) -> None:
        self._add("put", Item)

    @client_errors("BatchWriteItem")
    def delete_item(self, Key: Mapping[str, Any]) -> None:
        self._add("delete", Key)

    @client_errors("BatchWriteItem")
    def flush(self) -> None:
        ops, self._ops = self._ops, []
        if not ops:
            return
        t = self._t
        st = t._begin()
        try:
            layout = t.mapper.layout(st.routing.writes[0])
            batchable = (len(st.routing.writes) == 1 and not st.routing.fenced and not layout.random
                         and not st.routing.catch_up)
            if batchable:
                # BatchWriteItem takes no conditions: fine here, as these phases fence
                # nothing and need no lookup. It also rejects two requests for one key,
                # so the app's last op on a key is the one sent.
                requests: dict[str, dict] = {}  # physical key -> request; the last op on a key wins
                for kind, body in ops:
                    if kind == "put":
                        logical = t._logical_item(body)
                        fields = t._fields(logical)
                        key = layout.key(fields)
                        item = t._with_index_values(st, logical, fields)
                        item.update(key)
                        if st.stamps:  # cleanup/complete: versions keep growing, as for single puts
                            item[VERSION_ATTR] = {"S": t.versions.next()}
                        requests[repr(sorted(key.items()))] = {"PutRequest": {"Item": item}}
                    else:
                        _, fields = t._key(body)
                        key = layout.key(fields)
                        requests[repr(sorted(key.items()))] = {"DeleteRequest": {"Key": key}}
                try:
                    t.dynamo.batch_write(t.table, list(requests.values()), guard=t._phases.check_live,
                                         horizon=t._horizon)
                except errors.AWSError as e:
                    if _late(e):
                        raise t._phases.refused_late(e, "BatchWriteItem") from e
                    raise
                return
        finally:
            t._end(st)
        for kind, body in ops:  # fenced phases: each write on its own, fenced
            if kind == "put":
                t.put_item(Item=body)
            else:
                t.delete_item(Key=body)

    def __enter__(self) -> "BatchWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.flush()


def _key_text(key: Mapping[str, Any]) -> str:
    """A physical key as a message names it (``{"PK": "s-1#3", "SK": "..."}``)."""
    return safe_text(dump_key(key))
