"""Reads: which copies a get, batch get, query or scan reads, and which one it returns.

A logical item has one copy per layout the phase reads (``routing.py``: ``_read_keys``;
every candidate of a random-suffix layout). A read asks for all of them at once -- one
GetItem, or one BatchGetItem when there are several -- and returns the newest
(``core.versions.newest``), a tombstone being an absent item. Queries fan out over every
shard of every layout (``query.py``), scans return each item once at its designated copy
(``scan.py``), a sharded GSI's query fans out over its partition values (``index.py``)
and, when the migration also re-keys the table, resolves each index entry to its logical
item as ``get_item`` reads it (:meth:`Reads._index_resolver`). While the control row's
``newer_may_be`` is set the phase reads both layouts (``core.phases.routing_of``).

The arguments arrive checked and built by the facade (``table.py``) and
``app_expressions.py`` (filters, projections: ``post``). A mixin of
:class:`~reshard.shim.table.ShardedTable` (which sets ``mapper``, ``_query_source``,
``_scan_source``, ``_index_source``, the query pool's ``_lock`` / ``_executor`` /
``_query_workers``); the module map is in ``reshard/shim/__init__.py``.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from reshard import errors
from reshard.aws.dynamo import from_wire, to_wire
from reshard.core import expressions
from reshard.core.index import IndexMapper
from reshard.core.layout import Layout, is_tombstone, to_av
from reshard.core.versions import newest
from reshard.shim.index import Resolver, run_index_query
from reshard.shim.phase_cache import PhaseState
from reshard.shim.query import logical_key_condition, run_query
from reshard.shim.requests import _hidden
from reshard.shim.returns import _metadata, _note_page
from reshard.shim.routing import _identity, index_routing
from reshard.shim.scan import run_scan


class Reads:
    """The reads of :class:`~reshard.shim.table.ShardedTable`."""

    # ------------------------------------------------------------------ single items
    def _read_item(self, key_wire: dict, fields: dict, ConsistentRead: bool, paths: list | None = None) -> dict:
        """``get_item``'s read: every copy the phase reads in one request, the newest returned."""
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
        out = self._with_key(self._to_app(item, layout), key_wire)
        if out is not None and paths is not None:  # the app's ProjectionExpression
            out = from_wire(expressions.project(to_wire(out), paths))  # {} when none of the paths is there
        meta = _metadata(resp)
        return {"Item": out, **meta} if out is not None else meta

    def _read_batch(self, parsed: list[tuple[dict, dict]], fields_of: list[dict], ConsistentRead: bool,
                    post: Callable[[dict], dict | None] | None) -> dict:
        """``batch_get_item``'s read: the newest copy of each key (``_newest_copies``)."""
        meta: dict = {}
        st = self._begin()
        try:
            winners = self._newest_copies(st, fields_of, ConsistentRead, meta)
        finally:
            self._end(st)
        out = []
        for winner, (key_wire, _) in zip(winners, parsed):
            app = self._with_key(self._to_app(*winner), key_wire) if winner is not None else None
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

    # ------------------------------------------------------------------ queries and scans
    def _read_query(self, node: tuple | None, Key: Mapping[str, Any] | None, SortKeyCondition: tuple | None,
                    Limit: int | None, ScanIndexForward: bool, ExclusiveStartKey: Mapping[str, Any] | None,
                    ConsistentRead: bool, post: Callable[[dict], dict | None] | None, Select: str | None) -> dict:
        """``query``'s read: the key condition over logical fields, fanned out (``query.py``)."""
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

    def _read_index(self, im: IndexMapper, eq: dict, condition: tuple | None, Limit: int | None,
                    ScanIndexForward: bool, ExclusiveStartKey: Mapping[str, Any] | None, Select: str | None,
                    post: Callable[[dict], dict | None] | None) -> dict:
        """``query(IndexName=...)``'s read: the fan-out over the index's partition values (``index.py``)."""
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

    def _read_scan(self, Limit: int | None, ExclusiveStartKey: Mapping[str, Any] | None, Segment: int | None,
                   TotalSegments: int | None, ConsistentRead: bool, post: Callable[[dict], dict | None] | None,
                   Select: str | None) -> dict:
        """``scan``'s read: every live logical item once (``scan.py``)."""
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
