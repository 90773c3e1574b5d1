"""The application shim: :class:`ShardedTable`, a phase-aware stand-in for a boto3 ``Table``.

Applications read and write *logical* items (their own fields, boto3 resource types);
the shim computes the physical keys of the layouts the current migration phase uses
(``reshard.core.phases.ROUTING``; ``phases.STEADY`` when no migration is registered).

This module is the boto3 surface, a facade: the constructors, the public methods with
boto3's names and arguments, their argument checks, the ``client_errors`` /
``with_capacity`` wrappers (botocore ``ClientError``\\ s, the per-request metrics,
``ReturnConsumedCapacity``), ``meta``, ``batch_writer()``. Each public method checks its
arguments and hands them to the module that holds the rule (``reshard/shim/__init__.py``
has the map):

* the phase a request acts on and how it reaches the table -- ``requests.py``;
* which physical keys a logical item has in the phase's layouts -- ``routing.py``;
* the write protocol (authoritative write, mirror, fences, own-attempt recognition,
  catch-up, tombstones, GSI values) -- ``writes.py``;
* reads and merging (newest copy, fan-out query, scan, index query) -- ``reads.py``;
* the app's expressions made ready (condition objects, filters, projections) --
  ``app_expressions.py``; what a request answers (``ReturnValues``) -- ``returns.py``.

Reserved names: every bookkeeping attribute starts with ``_rs_`` and never reaches the
application; placeholders ``#rs_*`` / ``:rs_*`` are reserved in expressions.
"""

from __future__ import annotations

import contextvars
import functools
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, Callable, Mapping, Sequence

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder

from reshard import errors
from reshard.aws.dynamo import (CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS, SHIM_RETRIES, Dynamo, make_client,
                                to_wire)
from reshard.core import expressions
from reshard.core.index import IndexMapper
from reshard.core.layout import KeyMapper, number_text
from reshard.core.migration import RESERVED_PREFIX, Migration, load
from reshard.core.phases import Phase
from reshard.core.versions import VersionClock
from reshard.shim.app_expressions import AppExpressions, app_expressions, expression_text, read_post
from reshard.shim.errors import ShimValidationError, client_errors
from reshard.shim.expr import check_placeholders, check_targets, split_clauses, touched_attributes
from reshard.shim.index import IndexSource, index_key_condition
from reshard.shim.phase_cache import DEFAULT_CONTROL_TABLE, DEFAULT_LIVENESS_SECONDS, PhaseCache, registered_migration
from reshard.shim.query import QuerySource
from reshard.shim.reads import Reads
from reshard.shim.requests import Requests
from reshard.shim.returns import Answers, _with_page_meta
from reshard.shim.routing import Routes, _table_view
from reshard.shim.scan import ScanSource
from reshard.shim.writes import MAX_FENCE_RETRIES, WriteProtocol  # noqa: F401  (MAX_FENCE_RETRIES: its old home)

#: ``control_table``'s default: ``$RESHARD_CONTROL_TABLE``, else ``reshard-control`` (:func:`control_table_name`).
USE_ENV: Any = type("UseEnv", (), {"__repr__": lambda self: "$RESHARD_CONTROL_TABLE or 'reshard-control'"})()


# ReturnConsumedCapacity: a logical request is several physical ones (mirror, lookups,
# fan-out), each asked for its capacity while the app's request runs; the sum is reported.
_CAPACITY: contextvars.ContextVar[list | None] = contextvars.ContextVar("reshard_capacity", default=None)
_HOOKS_LOCK = threading.Lock()


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


class ShardedTable(Requests, Routes, WriteProtocol, Reads, AppExpressions, Answers):
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
        wire = self._canonical_numbers(to_wire(key))
        return wire, self._fields(wire)

    def _canonical_numbers(self, wire: dict) -> dict:
        """``wire`` with its number key fields in DynamoDB's text (``1.50`` -> ``1.5``): one
        number, one item -- the key, the shard and what a write returns follow from it."""
        for f in self._key_fields:
            v = wire.get(f)
            if isinstance(v, dict) and "N" in v:
                wire[f] = {"N": number_text(Decimal(v["N"]))}
        return wire

    @staticmethod
    def _on_failure(value: str | None) -> bool:
        """Whether ``ReturnValuesOnConditionCheckFailure`` asks for the item (DynamoDB's values only)."""
        if value not in (None, "NONE", "ALL_OLD"):
            raise errors.BadInput(f"1 validation error detected: Value {value!r} at "
                                  "'returnValuesOnConditionCheckFailure' failed to satisfy constraint: Member must "
                                  "satisfy enum value set: [ALL_OLD, NONE]")
        return value == "ALL_OLD"

    # ------------------------------------------------------------------ API: writes
    @client_errors("PutItem")
    @with_capacity
    def put_item(self, Item: Mapping[str, Any], ConditionExpression: str | ConditionBase | None = None,
                 ExpressionAttributeNames: Mapping[str, str] | None = None,
                 ExpressionAttributeValues: Mapping[str, Any] | None = None,
                 ReturnValues: str | None = None, ReturnValuesOnConditionCheckFailure: str | None = None) -> dict:
        """Write a logical item, as boto3's ``Table.put_item``: ``{"ResponseMetadata": ...}``,
        plus ``"Attributes"`` (the old item) with ReturnValues ALL_OLD when there was one.
        ``ReturnValuesOnConditionCheckFailure="ALL_OLD"``: a failed condition's error carries the
        logical item in ``e.response["Item"]``, as boto3's."""
        if ReturnValues not in (None, "NONE", "ALL_OLD"):
            raise errors.BadInput(f"put_item ReturnValues must be NONE or ALL_OLD (got {ReturnValues!r})")
        on_failure = self._on_failure(ReturnValuesOnConditionCheckFailure)
        logical = self._canonical_numbers(self._logical_item(Item))
        fields = self._fields(logical)
        condition, app_names, app_values = app_expressions(ConditionExpression, ExpressionAttributeNames,
                                                           ExpressionAttributeValues)
        condition, app_names, app_values = self._decided(condition, app_names, app_values, logical)
        return self._write_put(logical, fields, condition, app_names, app_values, ReturnValues, on_failure)

    @client_errors("DeleteItem")
    @with_capacity
    def delete_item(self, Key: Mapping[str, Any], ConditionExpression: str | ConditionBase | None = None,
                    ExpressionAttributeNames: Mapping[str, str] | None = None,
                    ExpressionAttributeValues: Mapping[str, Any] | None = None,
                    ReturnValues: str | None = None, ReturnValuesOnConditionCheckFailure: str | None = None) -> dict:
        """Delete a logical item (a tombstone in fenced phases), as boto3's ``Table.delete_item``.
        ReturnValues: NONE or ALL_OLD (``"Attributes"``: the deleted item, when there was one);
        ReturnValuesOnConditionCheckFailure as ``put_item``'s."""
        if ReturnValues not in (None, "NONE", "ALL_OLD"):
            raise errors.BadInput(f"delete_item ReturnValues must be NONE or ALL_OLD (got {ReturnValues!r})")
        on_failure = self._on_failure(ReturnValuesOnConditionCheckFailure)
        key_wire, fields = self._key(Key)
        ConditionExpression, app_names, app_values = app_expressions(
            ConditionExpression, ExpressionAttributeNames, ExpressionAttributeValues)
        ConditionExpression, app_names, app_values = self._decided(ConditionExpression, app_names, app_values,
                                                                   key_wire)
        want_old = ReturnValues == "ALL_OLD"
        return self._write_delete(key_wire, fields, ConditionExpression, app_names, app_values, want_old, on_failure)

    @client_errors("UpdateItem")
    @with_capacity
    def update_item(self, Key: Mapping[str, Any], UpdateExpression: str | None = None,
                    ConditionExpression: str | ConditionBase | None = None,
                    ExpressionAttributeNames: Mapping[str, str] | None = None,
                    ExpressionAttributeValues: Mapping[str, Any] | None = None,
                    ReturnValues: str | None = None, ReturnValuesOnConditionCheckFailure: str | None = None) -> dict:
        """DynamoDB's UpdateItem on the authoritative copy; the full result is mirrored, fenced.

        ReturnValues: NONE, ALL_NEW, UPDATED_NEW, ALL_OLD, UPDATED_OLD. When a mirror is
        written, the shim needs the new item: ALL_OLD / UPDATED_OLD then cost one more
        consistent read, and UPDATED_NEW is cut from the whole new item to the updated paths.
        """
        rv = ReturnValues or "NONE"
        if rv not in ("NONE", "ALL_NEW", "UPDATED_NEW", "ALL_OLD", "UPDATED_OLD"):
            raise errors.BadInput(f"update_item ReturnValues {ReturnValues!r} is not one of DynamoDB's")
        on_failure = self._on_failure(ReturnValuesOnConditionCheckFailure)
        key_wire, fields = self._key(Key)
        ConditionExpression, app_names, app_values = app_expressions(
            ConditionExpression, ExpressionAttributeNames, ExpressionAttributeValues)
        ConditionExpression, app_names, app_values = self._decided(ConditionExpression, app_names, app_values,
                                                                   key_wire, UpdateExpression)
        clauses = split_clauses(UpdateExpression) if UpdateExpression and UpdateExpression.strip() else {}
        targets = touched_attributes(clauses, app_names)
        check_targets(targets, self._frozen_attrs, "a key field or key attribute: an item's identity cannot "
                                                   "change (delete it and put the new one)")
        return self._write_update(rv, key_wire, fields, UpdateExpression, ConditionExpression, app_names,
                                  app_values, clauses, targets, on_failure)

    # ------------------------------------------------------------------ API: reads
    @client_errors("GetItem")
    @with_capacity
    def get_item(self, Key: Mapping[str, Any], ConsistentRead: bool = False, ProjectionExpression: str | None = None,
                 ExpressionAttributeNames: Mapping[str, str] | None = None) -> dict:
        """The logical item as boto3's ``Table.get_item`` answers: ``{"Item": {...},
        "ResponseMetadata": ...}``, or no ``"Item"`` when absent. Both layouts in one
        BatchGetItem where the phase reads both. ``ProjectionExpression`` is applied by the shim
        to the logical item (the newest copy needs the version, a key-only field the keys)."""
        names = dict(ExpressionAttributeNames or {})
        check_placeholders(names, None)
        ctx = expressions.Context(names, {})
        paths = None
        if ProjectionExpression is not None:
            paths = expressions.parse_projection(ProjectionExpression, ctx)
        elif names:
            raise errors.BadInput("ExpressionAttributeNames can only be specified when using expressions")
        ctx.check_unused()  # DynamoDB refuses a name the projection does not use
        key_wire, fields = self._key(Key)
        return self._read_item(key_wire, fields, ConsistentRead, paths)

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
        kce = expression_text(builder, KeyConditionExpression, names, values, True, "KeyConditionExpression")
        filt = expression_text(builder, FilterExpression, names, values, False, "FilterExpression")
        check_placeholders(names, values)
        ctx = expressions.Context(names, to_wire(values) if values else {})
        if kce is not None and SortKeyCondition is not None:
            raise errors.BadInput("query: give KeyConditionExpression or SortKeyCondition, not both")
        node = expressions.parse_condition(kce, ctx, "KeyConditionExpression") if kce is not None else None
        if filt:
            # DynamoDB refuses a query's filter on the table's key attributes. The app's table is
            # the logical one: its key is the fields the key templates are made of (a derived
            # field stands for its source), not PK/SK and not a shard_by-only field such as
            # event_id, which the logical item stores as any attribute.
            logical_key = {layout.derived[f].source if f in layout.derived else f
                           for layout in (self.mapper.old, self.mapper.new) for f in layout.template_fields}
            named = [p[0] for p in expressions.paths_of(expressions.parse_condition(filt, ctx, "FilterExpression"))
                     if p[0] in logical_key]
            if named:
                raise errors.BadInput(f"Filter Expression can only contain non-primary key attributes: Primary key "
                                      f"attribute: {named[0]} (conditions on key fields belong in "
                                      "KeyConditionExpression)")
        post = read_post(filt, ProjectionExpression, Select, ctx)
        return self._read_query(node, Key, SortKeyCondition, Limit, ScanIndexForward, ExclusiveStartKey,
                                ConsistentRead, post, Select)

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
        kce = expression_text(builder, KeyConditionExpression, names, values, True, "KeyConditionExpression")
        filt = expression_text(builder, FilterExpression, names, values, False, "FilterExpression")
        check_placeholders(names, values)
        ctx = expressions.Context(names, to_wire(values) if values else {})
        node = expressions.parse_condition(kce, ctx, "KeyConditionExpression") if kce is not None else None
        eq, condition = index_key_condition(im, node, Key)
        post = read_post(filt, ProjectionExpression, Select, ctx, index=True)
        return self._read_index(im, eq, condition, Limit, ScanIndexForward, ExclusiveStartKey, Select,
                                post)

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
        filt = expression_text(ConditionExpressionBuilder(), FilterExpression, names, values, False,
                               "FilterExpression")
        check_placeholders(names, values)
        ctx = expressions.Context(names, to_wire(values) if values else {})
        post = read_post(filt, ProjectionExpression, Select, ctx)
        return self._read_scan(Limit, ExclusiveStartKey, Segment, TotalSegments, ConsistentRead, post,
                               Select)

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
        post = read_post(None, ProjectionExpression, None, expressions.Context(names, {}))
        parsed = [self._key(k) for k in Keys]
        fields_of = [fields for _, fields in parsed]
        return self._read_batch(parsed, fields_of, ConsistentRead, post)

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
        # DynamoDB refuses a BatchWriteItem (boto3 sends one per flush) naming one key twice, and
        # writes none of it: so does the shim, whichever way it sends the batch (the fenced phases'
        # single writes would otherwise apply both, in order). The logical key decides: the app's.
        seen: set = set()
        for kind, body in ops:
            fields = t._fields(t._logical_item(body)) if kind == "put" else t._key(body)[1]
            ident = t.mapper.identity(fields)
            if ident in seen:
                raise errors.BadInput("Provided list of item keys contains duplicates (two requests for one key in "
                                      "one batch; batch_writer(overwrite_by_pkeys=[...the key fields]) keeps the "
                                      "last, as boto3's)")
            seen.add(ident)
        t._write_batch(ops)  # the write protocol (writes.py)

    def __enter__(self) -> "BatchWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.flush()
