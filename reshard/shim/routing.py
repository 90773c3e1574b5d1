"""Routing: which physical keys a logical item has in the layouts a phase writes and reads.

``reshard.core.phases.ROUTING`` says which layouts (``old``/``new``) a phase writes
(authoritative first) and reads; this module turns a logical item's fields into the
physical keys of those layouts.

* Writes (:meth:`Routes._write_keys`): authoritative key first; items whose old and new
  keys are equal are written once, unmarked (one physical item serving both layouts --
  also a brand-new item of a random-suffix old layout whose derived old key equals its new
  key, so a rollback keeps it); a new-layout copy at another key gets the new-copy marker
  ``_rs_new``.
* Random-suffix old layouts (:meth:`Routes._locate`): the old shard cannot be computed. A
  write that targets the old layout first finds the item with a consistent BatchGetItem of
  every candidate (newest wins; N consistent read units extra per write); a brand-new item
  goes to a shard derived from its identity, so two racing creators pick the same key. A
  read asks for every candidate key (:meth:`Routes._read_keys`; N read units per read).
* Index-only migrations (``[index.NAME]`` alone) keep every item at its key: the table is
  one identity layout (:func:`_table_view`), no copies; a delete leaves a versioned tombstone
  at the item's own key, as in a table migration (docs/late-writes.md, 5).

A mixin of :class:`~reshard.shim.table.ShardedTable` (which sets ``mapper``, ``migration`` and
``_single``, the index-only routings).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from reshard.core.index import INDEX_RETIRED, INDEX_ROUTING, IndexRouting
from reshard.core.layout import NEW_COPY_ATTR, KeyMapper, Layout, hash_shard
from reshard.core.migration import LayoutSpec, Migration, TemplatePart
from reshard.core.phases import Phase, Routing
from reshard.core.versions import newest
from reshard.shim.phase_cache import PhaseState
from reshard.shim.query import _plain


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


def index_routing(phase_name: str) -> IndexRouting:
    """The index routing of the phase a shim acts on (``steady``: no migration, or an
    aborted one whose cleanup moved every item back -- both read and write the old values)."""
    try:
        return INDEX_ROUTING[Phase(phase_name)]
    except ValueError:
        return INDEX_RETIRED


def _identity(m: KeyMapper, fields: Mapping[str, Any]) -> tuple:
    """A logical item's position among equal sort values (as the table query orders them)."""
    return tuple(_plain(v) for v in m.identity(fields))


class Routes:
    """The physical keys of a logical item in the layouts the request's phase writes and reads."""

    def _identity_text(self, fields: Mapping[str, Any]) -> str:
        return "#".join(p.hex() if isinstance(p, bytes) else p for p in self.mapper.identity(fields))

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

    def _index_only_routing(self, st: PhaseState) -> PhaseState:
        """The request's phase state with an index-only migration's table routing."""
        # Items keep their keys: one layout, no copies. Deletes still leave a versioned
        # tombstone (as the phase says: every phase of a registered migration): a held first
        # attempt or a duplicate of an older put may land within its horizon after a later
        # acknowledged delete, and on an empty key it would pass its fence and bring the
        # deleted item back. Cleanup and strip delete the tombstones after their hold.
        r = st.routing
        single = self._single.get(r)
        if single is None:
            single = self._single[r] = Routing(("old",), ("old",), tombstones=r.tombstones, fenced=r.fenced,
                                               hold=r.hold)
        return dataclasses.replace(st, routing=single)
