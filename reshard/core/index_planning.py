"""What ``plan`` and ``start`` say about an ``[index.NAME]`` migration: checks, skew and cost.

Pure domain module: works on a DescribeTable answer and on scanned wire items.

The cost of the rewrite
    The backfill rewrites one attribute with an UpdateItem. DynamoDB charges the table
    write (1 WCU per started KB of the item) and, because the GSI's key changes, two
    writes to the index: a delete of the old index entry and a put of the new one (each
    1 WCU per started KB of the *index entry*: the projected attributes, the table and
    index keys, and 100 bytes of overhead). An item already at its new value is not
    written at all. In a combined migration (the table's keys change too) each new copy
    is put with its new value: one more index write per copy (``copy_index_wcu``), on top
    of the table's copy and the rewrite of the old copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from reshard.core.capacity import scan_units, write_units
from reshard.core.index import IndexMapper
from reshard.core.layout import VERSION_ATTR, _av_size, is_tombstone, item_size
from reshard.core.migration import IndexSpec, Keys, Migration
from reshard.core.planning import EXAMPLES, Distribution, distribution
from reshard.errors import UnmappableItem

#: DynamoDB adds this many bytes to every index entry when it sizes it.
INDEX_ENTRY_OVERHEAD = 100


def gsi_problems(desc: Mapping[str, Any], m: Migration) -> list[str]:
    """Why the table's GSIs cannot carry the file's ``[index.NAME]`` layouts, one sentence each.

    The GSI must exist and be ACTIVE, its key schema must name the file's attributes, the
    partition attribute's type must be the one the layouts write, and its projection must
    carry ``_rs_v`` (ALL, or INCLUDE naming it): a fan-out reads one item under two values
    and keeps the larger version, and a KEYS_ONLY index cannot tell which is newer.
    """
    gsis = {g["IndexName"]: g for g in desc.get("GlobalSecondaryIndexes", [])}
    types = {a["AttributeName"]: a["AttributeType"] for a in desc.get("AttributeDefinitions", [])}
    out = []
    for spec in m.indexes:
        where = f"[index.{spec.name}]"
        if m.changes_table and spec.sort in (m.keys.partition, m.keys.sort) and not any(
                spec.sort in layout.template_fields() for layout in (m.source, m.target)):
            # A combined file: the old and new copy of an item would sit at two sort values of
            # the index, and the shim resolves an entry by (sort value, logical key): it refuses.
            out.append(f"{where}: the GSI sort key {spec.sort!r} is a table key attribute this migration rewrites "
                       "(an item's two copies would sort apart in the index; the shim refuses such a file): sort "
                       "the index by an application attribute, or keep the key a field of its template (\"{"
                       f"{spec.sort}}}\")")
        g = gsis.get(spec.name)
        if g is None:
            lsi = any(i["IndexName"] == spec.name for i in desc.get("LocalSecondaryIndexes", []))
            known = ", ".join(sorted(gsis)) or "none"
            out.append(f"{where}: table {m.table!r} has no global secondary index {spec.name!r}"
                       + (" (it is a local secondary index, whose partition key is the table's)" if lsi else "")
                       + f" (its GSIs: {known})")
            continue
        status = g.get("IndexStatus", "ACTIVE")
        if status != "ACTIVE":
            out.append(f"{where}: GSI {spec.name!r} is {status}; wait until it is ACTIVE")
        schema = {k["KeyType"]: k["AttributeName"] for k in g.get("KeySchema", [])}
        if schema.get("HASH") != spec.partition or schema.get("RANGE") != spec.sort:
            out.append(f"{where}: GSI {spec.name!r} has partition {schema.get('HASH')!r}, sort {schema.get('RANGE')!r} "
                       f"but the file says partition {spec.partition!r}, sort {spec.sort!r}")
            continue
        have = types.get(spec.partition)
        if have != spec.partition_type:
            hint = (' (a template other than exactly "{shard}" builds a string)' if spec.partition_type == "S"
                    and have == "N" else f' (set type = "{have}" in {where})' if have in ("S", "N") else "")
            out.append(f"{where}: GSI partition attribute {spec.partition!r} has type {have} but the layouts "
                       f"write {spec.partition_type}{hint}")
        proj = g.get("Projection", {})
        kind = proj.get("ProjectionType", "ALL")
        if kind == "KEYS_ONLY" or (kind == "INCLUDE" and VERSION_ATTR not in proj.get("NonKeyAttributes", [])):
            out.append(f"{where}: GSI {spec.name!r} projects {kind}"
                       + (f" without {VERSION_ATTR!r}" if kind == "INCLUDE" else "")
                       + f": the shim's fan-out keeps the newer of an item's two index entries by {VERSION_ATTR!r}, "
                       f"so the index must project it (ALL, or INCLUDE with {VERSION_ATTR!r}); recreate the index")
    return out


def index_entry_size(item: Mapping[str, Any], keys: Keys, spec: IndexSpec, projection: Mapping[str, Any]) -> int:
    """DynamoDB's size of the item's entry in the GSI (projected attributes + keys + 100 bytes)."""
    kind = projection.get("ProjectionType", "ALL")
    if kind == "ALL":
        return item_size(item) + INDEX_ENTRY_OVERHEAD
    names = {keys.partition, keys.sort, spec.partition, spec.sort} - {None}
    if kind == "INCLUDE":
        names |= set(projection.get("NonKeyAttributes", []))
    return sum(len(k.encode()) + _av_size(v) for k, v in item.items() if k in names) + INDEX_ENTRY_OVERHEAD


@dataclass
class IndexAnalysis:
    """What a sample of items says about one ``[index.NAME]``: who moves, skew, cost.

    ``not_indexed``: items outside the (sparse) GSI: no partition value or no sort
    attribute; the migration leaves them alone. ``unmappable``: indexed items whose
    stored value fits neither layout, or that lack a field the ``to`` layout needs.
    """

    mapper: IndexMapper
    keys: Keys
    projection: Mapping[str, Any] = field(default_factory=lambda: {"ProjectionType": "ALL"})
    examples_limit: int = EXAMPLES
    indexed: int = 0
    not_indexed: int = 0
    tombstones: int = 0
    at_new: int = 0  # already at the value of the ``to`` layout (not written)
    moves: int = 0
    table_wcu: int = 0
    index_wcu: int = 0  # a delete of the old entry + a put of the new one, per moved item
    #: A combined migration (``combined``): the put of each new copy's entry (the copy carries the new value).
    copy_index_wcu: int = 0
    combined: bool = False
    entry_bytes: int = 0  # every index entry's size: what verify's fan-out over the index reads
    unmappable: dict = field(default_factory=dict)
    examples: list = field(default_factory=list)
    old_shards: list = field(default_factory=list)
    new_shards: list = field(default_factory=list)

    def observe(self, item: Mapping[str, Any]) -> None:
        """Account for one scanned item (wire format)."""
        if is_tombstone(item):
            self.tombstones += 1
            return
        m = self.mapper
        if not m.in_index(item):
            self.not_indexed += 1
            return
        self.indexed += 1
        self.entry_bytes += index_entry_size(item, self.keys, m.spec, self.projection)
        try:
            new_shard = m.new.shard_for(m.fields(item, "new"))
            if m.is_at(item, "new"):
                self.at_new += 1
                self.new_shards.append(new_shard)
                if m.is_at(item, "old"):  # "{shard}" on both sides: its value is an old shard too
                    self.old_shards.append(m.shard_of(item[m.attr], "old"))
                return
            if not m.is_at(item, "old"):
                raise UnmappableItem("off-layout", f"{m.attr} = {_show(item[m.attr])} is a value of neither "
                                                   f"layout (shards 0..{m.old.shards - 1} of "
                                                   f"{m.old.partition.text!r})")
            old_shard = m.shard_of(item[m.attr], "old")
        except UnmappableItem as e:
            self.unmappable[e.reason] = self.unmappable.get(e.reason, 0) + 1
            if len(self.examples) < self.examples_limit:
                key = {a: _show(item[a]) for a in (self.keys.partition, self.keys.sort) if a and a in item}
                self.examples.append({"key": key, "reason": e.reason, "detail": e.detail})
            return
        self.old_shards.append(old_shard)
        self.new_shards.append(new_shard)
        self.moves += 1
        self.table_wcu += write_units(item_size(item))
        self.index_wcu += 2 * write_units(index_entry_size(item, self.keys, m.spec, self.projection))

    @property
    def unmappable_count(self) -> int:
        return sum(self.unmappable.values())

    def old_distribution(self) -> Distribution:
        """Items per GSI shard as stored now (every item whose value is an old-layout value)."""
        return distribution(self.old_shards, self.mapper.old.shards)

    def new_distribution(self) -> Distribution:
        """Items per GSI shard once every item is at its new value."""
        return distribution(self.new_shards, self.mapper.new.shards)

    def as_dict(self, scale: float) -> dict:
        old, new = self.old_distribution(), self.new_distribution()
        mappable = self.moves + self.at_new
        return {
            "name": self.mapper.name, "partition": self.mapper.attr, "sort": self.mapper.sort_attr,
            "type": self.mapper.type, "projection": self.projection.get("ProjectionType", "ALL"),
            "items": {"indexed": self.indexed, "not_indexed": self.not_indexed, "tombstones": self.tombstones,
                      "moves": self.moves, "already_new": self.at_new,
                      "moves_pct": round(100.0 * self.moves / mappable, 2) if mappable else 0.0,
                      "estimated_moves": round(self.moves * scale),
                      "unmappable": self.unmappable_count,
                      "unmappable_by_reason": dict(sorted(self.unmappable.items())),
                      "unmappable_examples": self.examples},
            "distribution": {"old": old.as_dict(), "new": new.as_dict()},
            "rewrite_wcu": {"table": round(self.table_wcu * scale, 1), "index": round(self.index_wcu * scale, 1),
                            **({"copies_index": round(self.copy_index_wcu * scale, 1)} if self.combined else {}),
                            "total": round((self.table_wcu + self.index_wcu + self.copy_index_wcu) * scale, 1)},
        }


@dataclass
class IndexPlan:
    """The per-index analyses of one scan of the table, and the whole table's totals."""

    analyses: dict[str, IndexAnalysis]
    full_scan: bool = False
    scanned: int = 0
    bytes_all: int = 0

    def observe(self, item: Mapping[str, Any]) -> None:
        self.scanned += 1
        self.bytes_all += item_size(item)
        for a in self.analyses.values():
            a.observe(item)

    def observe_copy(self, new_item: Mapping[str, Any]) -> None:
        """A combined migration's new copy of a sampled item: one put into each GSI it is in."""
        for a in self.analyses.values():
            if a.mapper.in_index(new_item):
                a.copy_index_wcu += write_units(index_entry_size(new_item, a.keys, a.mapper.spec, a.projection))

    @property
    def mappable(self) -> int:
        return sum(a.moves + a.at_new for a in self.analyses.values())

    @property
    def unmappable_count(self) -> int:
        return sum(a.unmappable_count for a in self.analyses.values())

    #: Items keep their keys: no two can meet on one key (what ``start`` prints for a table file).
    collisions = 0

    def blockers(self, allow_unmappable: int = 0) -> list[str]:
        """What ``start`` refuses (``plan`` shows the same list), one sentence each."""
        out = []
        for name, a in self.analyses.items():
            if a.unmappable_count > allow_unmappable:
                reasons = ", ".join(f"{k}: {v}" for k, v in sorted(a.unmappable.items()))
                ex = a.examples[0] if a.examples else None
                eg = (f"; e.g. {', '.join(f'{k}={v!r}' for k, v in ex['key'].items())}: {ex['detail']}" if ex else "")
                out.append(f"[index.{name}]: {a.unmappable_count} sampled indexed item(s) cannot be mapped "
                           f"({reasons}{eg}) and the allowance is {allow_unmappable}: fix them, or allow them with "
                           f"--allow-unmappable N (the backfill skips and lists them)")
        return out

    def scale(self, table_items: int) -> float:
        total = max(table_items, self.scanned)
        return total / self.scanned if self.scanned else 0.0

    def capacity(self, table_items: int, *, max_wcu: float | None, write_price: float,
                 read_price: float) -> dict:
        """The rewrite's units for the whole table: one scan, and per moved item the table
        write plus the GSI's delete and put. Verify scans again and reads every index entry once
        (its fan-out over the ``[to]`` values; at least 0.5 RCU per query page besides)."""
        scale = self.scale(table_items)
        scan = scan_units(round(self.bytes_all * scale))
        table = sum(a.table_wcu for a in self.analyses.values()) * scale
        index = sum(a.index_wcu + a.copy_index_wcu for a in self.analyses.values()) * scale
        wcu = table + index
        entries = scan_units(round(sum(a.entry_bytes for a in self.analyses.values()) * scale))
        usd = scan / 1e6 * read_price + wcu / 1e6 * write_price
        return {"scale": round(scale, 6), "backfill": {"scan_rcu": round(scan, 1), "table_wcu": round(table, 1),
                                                       "index_wcu": round(index, 1), "wcu": round(wcu, 1)},
                "max_wcu": max_wcu, "backfill_seconds": round(wcu / max_wcu, 1) if max_wcu else None,
                "verify": {"scan_rcu": round(scan, 1), "index_rcu": round(entries, 1), "rcu": round(scan + entries, 1)},
                "cleanup": "nothing to expire: items keep their keys (one consistent scan deletes the shims' "
                           "delete markers)",
                "on_demand": {"write_price_per_million": write_price, "read_price_per_million": read_price,
                              "backfill_usd": round(usd, 4)}}


def index_plan(m: Migration, desc: Mapping[str, Any], full_scan: bool = False) -> IndexPlan:
    """An empty :class:`IndexPlan` for ``m``'s indexes, with the projections DescribeTable gives."""
    projections = {g["IndexName"]: g.get("Projection", {"ProjectionType": "ALL"})
                   for g in desc.get("GlobalSecondaryIndexes", [])}
    return IndexPlan({s.name: IndexAnalysis(IndexMapper(s), m.keys, projections.get(s.name, {"ProjectionType": "ALL"}),
                                            combined=m.changes_table)
                      for s in m.indexes}, full_scan=full_scan)


def _show(av: Mapping[str, Any]) -> Any:
    (t, v), = av.items()
    return v if t in ("S", "N") else f"<{t}>"

