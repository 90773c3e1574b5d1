"""Sharded GSI partition keys: the value of the index attribute per layout, and the phase routing.

Pure domain module (no boto3, no I/O); items are in DynamoDB's wire format, as in
:mod:`reshard.core.layout`.

The layout (the invoice article's "sharding approach for global secondary indexes")
    Each item carries a GSI partition key attribute (``gsi_shard``) whose value spreads
    one hot logical key (``tx_country``, the GSI sort key) over N index partitions:
    ``{shard}`` picked at random, or ``hash(shard_by) % N``, possibly inside a template
    (``{region}#{shard}``). Readers query every value 0..N-1 and merge. An ``[index.NAME]``
    migration rewrites that one attribute in place, from the ``from`` layout's value to the
    ``to`` layout's; the item's table keys never change.

One value per item, so the routing is not the table's
    A table migration keeps two physical items per logical item while it runs, so a shim
    can write both layouts. An index attribute has one value at a time: a shim writes
    either the old value or the new one, and readers find an item under whichever it has.
    :data:`INDEX_ROUTING` says, per phase, which value writes give (``writes``) and which
    layouts' partition values a query fans out over (``reads``, in pass order):

    ================  ======  ==================
    phase             writes  reads (pass order)
    ================  ======  ==================
    planned           old     old
    dual_write        old     new, old
    dual_read         new     old, new
    backfill          new     old, new
    cutover           new     new
    cleanup           new     new
    complete          new     new
    aborted           old     new, old
    aborted, retired  old     old
    ================  ======  ==================

Why a fan-out never misses an item nor returns one twice
    1. *Adjacent phases share their read set's layouts and the fleet reads both before any
       value changes.* A shim starts writing new values only in ``dual_read``, which the
       fleet enters after acknowledging ``dual_write`` (reads old and new). Readers narrow
       to ``new`` only in ``cutover``, which needs the backfill and a passing verify (every
       item is at its new value) while every shim writes new (``backfill``).
    2. *Within any period, items move in one direction only.* A write-changing transition
       (:func:`changes_index_writes`: ``dual_write`` <-> ``dual_read``, and an abort from
       ``dual_read``/``backfill``) goes through the fleet-wide switch, like backfill <->
       cutover: no shim writes an old value while another writes a new one, otherwise an item
       could move old -> new -> old between two passes of one query. The rewriting jobs run
       only once the fleet acknowledged their phase: the backfill moves old -> new in
       ``backfill`` (shims write new), abort's cleanup new -> old in ``aborted`` (shims write old).
    3. *A query reads the layout items move away from first, then the layout they move to*
       (``reads`` is in that order), every partition of each, even values already read in
       the first pass (0..3 lies inside 0..15, and an item can move from 3 to 1 after 1 was
       read). An item is therefore either still at its source value when the first pass
       reads it, or already at its destination value when the second pass does. The reader
       keeps one result per table primary key (the larger ``_rs_v``), so an item read in
       both passes (it moved in between, or its old and new value are equal) appears once.
    4. ``planned`` reads only ``old``, so a rollback ``dual_write`` -> ``planned`` would hide
       items a ``dual_read`` shim already moved: :func:`index_transition_refusal` refuses
       it (``abort`` instead: its cleanup moves them back, then retire narrows to ``old``).

    GSIs are eventually consistent: the guarantee holds against the index's state. While
    DynamoDB propagates one item's change of GSI key, that item can be momentarily absent
    from (or stale in) the index, as for any application update of a GSI key.
"""

from __future__ import annotations

import random as _random
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping

from reshard.core.layout import Layout, Wire, is_tombstone, scalar
from reshard.core.migration import SHARD, IndexSpec
from reshard.core.phases import Action, Phase
from reshard.errors import UnmappableItem

OLD, NEW = "old", "new"


@dataclass(frozen=True)
class IndexRouting:
    """What a shim does with a sharded GSI attribute in one phase.

    ``writes``: the layout whose value a write gives the attribute.
    ``reads``: the layouts a query fans out over, in pass order (see the module docstring).
    """

    writes: str
    reads: tuple[str, ...]


INDEX_ROUTING: dict[Phase, IndexRouting] = {
    Phase.PLANNED: IndexRouting(OLD, (OLD,)),
    Phase.DUAL_WRITE: IndexRouting(OLD, (NEW, OLD)),
    Phase.DUAL_READ: IndexRouting(NEW, (OLD, NEW)),
    Phase.BACKFILL: IndexRouting(NEW, (OLD, NEW)),
    Phase.CUTOVER: IndexRouting(NEW, (NEW,)),
    Phase.CLEANUP: IndexRouting(NEW, (NEW,)),
    Phase.COMPLETE: IndexRouting(NEW, (NEW,)),
    Phase.ABORTED: IndexRouting(OLD, (NEW, OLD)),
}

#: An aborted migration whose cleanup moved every item back to its old value.
INDEX_RETIRED = IndexRouting(OLD, (OLD,))


def index_routing(phase: Phase, retired: bool = False) -> IndexRouting:
    """The index routing of ``phase`` (``retired``: an aborted migration after its cleanup)."""
    return INDEX_RETIRED if retired and phase is Phase.ABORTED else INDEX_ROUTING[phase]


def changes_index_writes(frm: Phase, to: Phase) -> bool:
    """Whether ``frm`` -> ``to`` changes the value shims write (so it needs the switch)."""
    a, b = INDEX_ROUTING.get(frm), INDEX_ROUTING.get(to)
    return bool(a and b and a.writes != b.writes)


def index_transition_refusal(action: Action, frm: Phase, to: Phase | None) -> str | None:
    """Why a transition is unsafe for a migration with sharded indexes, or None."""
    if action is Action.ROLLBACK and frm is Phase.DUAL_WRITE and to is Phase.PLANNED:
        return ("rollback to planned is refused for a sharded-index migration: planned reads only the old "
                "index values, and dual_read shims may have written new ones; run `reshard abort` instead "
                "(its cleanup rewrites them back)")
    return None


class IndexMapper:
    """One ``[index.NAME]``: the GSI partition value of an item in each layout.

    Field values come from the item's stored attributes (any attribute, the table's key
    attributes included, in an index-only migration) or, for a logical item the
    application passes, from its fields; both may be wire attribute values or Python
    scalars.
    """

    def __init__(self, spec: IndexSpec):
        self.spec = spec
        self.name = spec.name
        self.attr = spec.partition
        self.sort_attr = spec.sort
        self.type = spec.partition_type
        self.old = Layout(spec.source, spec.partition, None)
        self.new = Layout(spec.target, spec.partition, None)
        #: Every field either layout needs (the shard_by fields, template fields, derived sources).
        self.fields_needed = tuple(dict.fromkeys([*self.old.needed_fields, *self.new.needed_fields]))

    def layout(self, side: str) -> Layout:
        return self.old if side == OLD else self.new

    # -- computing values
    def fields(self, item: Mapping[str, Any], side: str | None = None) -> dict[str, Any]:
        """The field values ``side`` (both layouts when None) needs, from a wire item.

        Raises UnmappableItem (``missing-field``) naming the first absent field.
        """
        names = self.layout(side).needed_fields if side else self.fields_needed
        out = {}
        for f in names:
            if f not in item:
                raise UnmappableItem("missing-field", f"index {self.name}: the item lacks field {f!r}")
            v = item[f]
            out[f] = scalar(v) if isinstance(v, dict) else v
            if out[f] is None:
                raise UnmappableItem("bad-field-type", f"index {self.name}: field {f!r} is not a string, "
                                                       "number or binary")
        return out

    def value(self, fields: Mapping[str, Any], side: str, rng: _random.Random | None = None) -> Wire:
        """The wire value of the GSI partition attribute for an item with ``fields`` in ``side``.

        A random layout picks a shard 0..N-1 (``rng``, else the module's generator).
        """
        layout = self.layout(side)
        shard = layout.random_shard(rng) if layout.random else None
        return self._format(layout, fields, shard)

    def _format(self, layout: Layout, fields: Mapping[str, Any], shard: int | None) -> Wire:
        """The value for ``fields``; ``shard`` is used by a random layout only (else computed)."""
        return self._typed(layout.key(fields, shard)[self.attr])

    def _at_shard(self, layout: Layout, fields: Mapping[str, Any], shard: int) -> Wire:
        """The value with the template's fields from ``fields`` and this ``shard`` (no hashing)."""
        full = layout.with_derived(fields) if layout.derived else dict(fields)
        full[SHARD] = shard
        return self._typed(layout.partition.format(full))

    def _typed(self, av: Wire) -> Wire:
        if self.type == "S" and "N" in av:
            return {"S": av["N"]}  # "{shard}" alone, stored as a string attribute
        return av

    def shard_of(self, stored: Mapping[str, Any], side: str) -> int:
        """The shard number a stored GSI value carries in ``side``; raises UnmappableItem."""
        layout = self.layout(side)
        tmpl = layout.partition
        if tmpl.identity:
            raw = stored.get("N", stored.get("S"))
            try:
                num = Decimal(raw) if isinstance(raw, str) else None
            except InvalidOperation:
                num = None
            if num is None or num != num.to_integral_value() or not _same(self._at_shard(layout, {}, int(num)), stored):
                raise UnmappableItem("unparseable-key", f"index {self.name}: {stored!r} is not a {side} shard number")
            shard = int(num)
        else:
            shard = tmpl.parse(stored)[SHARD]
        if not 0 <= shard < layout.shards:
            raise UnmappableItem("bad-shard", f"index {self.name}: shard {shard} is outside 0..{layout.shards - 1}")
        return shard

    def is_at(self, item: Mapping[str, Any], side: str) -> bool:
        """Whether the item's stored GSI value is one ``side`` gives this item.

        Random layout: any shard in range, with the template's other fields equal to the
        item's. False when the item has no value; UnmappableItem when a field is missing.
        """
        stored = item.get(self.attr)
        if stored is None:
            return False
        layout = self.layout(side)
        if not layout.random:
            return _same(stored, self.value(self.fields(item, side), side))
        try:
            shard = self.shard_of(stored, side)
        except UnmappableItem:
            return False
        return _same(stored, self._at_shard(layout, self.fields(item, side), shard))

    def in_index(self, item: Mapping[str, Any]) -> bool:
        """Whether the item is in the GSI at all (it has the partition and the sort attribute).

        An item outside a sparse index (a line-item row without ``tx_country``) is left alone:
        giving it a value would add it to the index.
        """
        return self.attr in item and (self.sort_attr is None or self.sort_attr in item)

    # -- queries
    def query_values(self, side: str, eq_fields: Mapping[str, Any]) -> list[Wire]:
        """The GSI partition values a query must read in ``side``, given the fields its key
        condition fixes by equality.

        One value when every ``shard_by`` field is fixed (the shard is computed), else one
        per shard 0..N-1. The template's other fields (and derived fields' sources) must be
        fixed: without them no partition value can be formed (UnmappableItem).
        """
        layout = self.layout(side)
        values = {k: (scalar(v) if isinstance(v, dict) else v) for k, v in eq_fields.items()}
        for f in layout.template_fields:
            src = layout.derived[f].source if f in layout.derived else f
            if src not in values:
                raise UnmappableItem("missing-field", f"index {self.name}: a query needs an equality on "
                                                      f"{src!r} to form the {side} partition values")
        if not layout.random and all(f in values for f in layout.shard_by):
            return [self._format(layout, values, None)]
        return [self._at_shard(layout, values, shard) for shard in range(layout.shards)]

    def partition_fields(self) -> set[str]:
        """Fields of the index's logical partition key (template fields other than the shard,
        their derived sources): what a query's key condition may name besides the sort key."""
        out: set[str] = set()
        for layout in (self.old, self.new):
            for f in layout.template_fields:
                out.add(layout.derived[f].source if f in layout.derived else f)
        return out


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal attribute values (numbers compare by value: "03" and "3" are one N)."""
    if "N" in a and "N" in b:
        return Decimal(a["N"]) == Decimal(b["N"])
    return dict(a) == dict(b)


def reindexed(item: Mapping[str, Any], index_mappers: Iterable[IndexMapper], side: str,
              rng: _random.Random | None = None) -> dict:
    """``item`` (wire) with the GSI value of every index it is in set to ``side``'s value.

    A combined migration's copy (backfill, verify's repair) gives each new-layout copy the
    value its phase writes (``new``), computed from the copied item's own fields. An item
    outside a sparse index, or a tombstone, is returned as is; UnmappableItem when a field
    is missing.
    """
    out = dict(item)
    if is_tombstone(item):
        return out
    for m in index_mappers:
        if m.in_index(item):
            out[m.attr] = m.value(m.fields(item, side), side, rng)
    return out


def mappers(indexes: Iterable[IndexSpec]) -> dict[str, IndexMapper]:
    """An :class:`IndexMapper` per index, by IndexName."""
    return {spec.name: IndexMapper(spec) for spec in indexes}
