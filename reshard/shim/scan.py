"""The shim's scan: every live logical item once, whatever layout holds it.

One physical Scan of the table (``Segment`` / ``TotalSegments`` passed through, so each
physical item is in exactly one segment) reads items of both layouts, tombstones and
other entity types. A logical item is returned at exactly one of its physical copies,
its *designated* copy, with the content of its newest copy:

* the old-layout copy when the phase reads the old layout and one exists (for a
  random-suffix layout with duplicates: the newest genuine one, ties by key), else the
  new-layout copy. In the phases that read both layouts (dual_read, backfill) an old
  copy is never removed (deletes are tombstones), so the choice cannot flip while a
  scan runs: an item present for the whole scan is returned once, as DynamoDB does;
* when the phase reads one layout with computable keys, every copy is designated and
  no lookup is needed (steady, planned, dual_write, cutover, cleanup, complete);
  otherwise the other copies of a page's items are read in one consistent BatchGetItem
  per 100 keys (the choice must not depend on a stale read).

A tombstone (newest copy) is an absent item: not returned, not counted. ``Limit`` counts
logical items evaluated (before ``FilterExpression``, as DynamoDB counts), and a page
also ends at 1 MB of items. ``LastEvaluatedKey`` is the *physical* key of the last item
evaluated -- the scan's position in the table, as a plain table's scan returns -- plus
``_rs_scan``, the layouts the page was read with; pass it back unchanged as
``ExclusiveStartKey``. The designated copy depends on the layouts the phase reads, so a
paged scan resumed after the phase changed them (e.g. across the backfill -> cutover
switch) could return an item twice or miss one: that resume is refused with
``ReshardScanInterrupted`` (a ``ClientError``; restart the scan), never answered
differently. A start key without ``_rs_scan`` (built by the application) is taken as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from reshard import errors
from reshard.aws.dynamo import from_wire, to_wire
from reshard.core.layout import KeyMapper, Layout, is_tombstone, item_size
from reshard.core.phases import Routing
from reshard.core.versions import newest
from reshard.shim.query import PAGE_BYTES


@dataclass(frozen=True)
class ScanSource:
    """What a scan needs from its table."""

    mapper: KeyMapper
    #: One DynamoDB Scan on the table: Scan's parameters except TableName -> its response.
    scan_page: Callable[..., dict]
    #: Consistent BatchGetItem of physical keys -> the items found.
    batch_get: Callable[[list[dict]], list[dict]]
    to_app: Callable[[Mapping[str, Any], Layout], dict | None]


#: The reserved attribute of a scan's LastEvaluatedKey naming the layouts it was read with.
SCAN_READS_ATTR = "_rs_scan"


def run_scan(src: ScanSource, routing: Routing, limit: int | None, start: Mapping[str, Any] | None,
             segment: int | None, total_segments: int | None, consistent: bool,
             post: Callable[[dict], dict | None] | None) -> dict:
    m = src.mapper
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise errors.BadInput(f"Limit must be a positive integer (got {limit!r})")
    if (segment is None) != (total_segments is None):
        raise errors.BadInput("Segment and TotalSegments go together")
    reads = list(routing.reads)
    layouts = {side: m.layout(side) for side in reads}
    needs_lookup = len(reads) > 1 or any(l.random for l in layouts.values())
    key_attrs = m.old.key_attrs
    kwargs: dict[str, Any] = {"ConsistentRead": consistent}
    if segment is not None:
        kwargs.update(Segment=segment, TotalSegments=total_segments)
    read_with = ",".join(reads)
    if start is not None:
        if not isinstance(start, Mapping) or set(start) - {SCAN_READS_ATTR} != set(key_attrs):
            raise errors.BadInput("ExclusiveStartKey must be the LastEvaluatedKey of a previous scan page "
                                  f"(a dict of {', '.join(key_attrs)})")
        started_with = start.get(SCAN_READS_ATTR)
        if started_with is not None and started_with != read_with:
            # Pages before and after designate different copies: continuing could return an
            # item twice or skip one. Refuse rather than answer differently from DynamoDB.
            raise errors.ScanInterrupted(
                f"this paged scan began while the shim read the {started_with!r} layout(s) and the migration "
                f"now reads {read_with!r}: an item could be returned twice or missed; restart the scan "
                "from the beginning (without ExclusiveStartKey)")
        kwargs["ExclusiveStartKey"] = to_wire({a: start[a] for a in key_attrs})

    out: list[dict] = []
    evaluated, size, last_key = 0, 0, None
    while True:
        if limit is not None:
            kwargs["Limit"] = limit - evaluated + 10  # a few spare for copies, tombstones, other items
        resp = src.scan_page(**kwargs)
        page = resp.get("Items", [])
        members = [(item, _sides(m, layouts, item)) for item in page]
        others = _other_copies(src, layouts, members) if needs_lookup else {}
        stopped = False
        for item, sides in members:
            if not sides:
                continue
            value = _designated_value(m, layouts, item, sides, others) if needs_lookup else (item, sides[0])
            if value is None:
                continue
            winner, side = value
            if is_tombstone(winner):
                continue
            app = src.to_app(winner, layouts[side])
            evaluated += 1
            size += item_size(winner)
            last_key = {a: item[a] for a in key_attrs}
            got = post(app) if post is not None else app
            if got is not None:
                out.append(got)
            if (limit is not None and evaluated >= limit) or size >= PAGE_BYTES:
                stopped = True
                break
        if stopped:
            break
        lek = resp.get("LastEvaluatedKey")
        if not lek:
            last_key = None
            break
        kwargs["ExclusiveStartKey"] = lek
        last_key = None
    result: dict[str, Any] = {"Items": out, "Count": len(out), "ScannedCount": evaluated}
    if last_key is not None:
        result["LastEvaluatedKey"] = {**from_wire(last_key), SCAN_READS_ATTR: read_with}
    return result


def _sides(m: KeyMapper, layouts: Mapping[str, Layout], item: Mapping[str, Any]) -> list[str]:
    """The read layouts ``item`` is a copy of (both for an unmoved item), old first."""
    key = {a: item[a] for a in m.old.key_attrs if a in item}
    out = []
    for side, layout in layouts.items():
        try:
            fields = m.fields(item, layout)
        except errors.UnmappableItem:
            continue
        marked = m.is_new_copy(item)
        if side == "old" and marked:
            continue  # a new-layout copy whose key also parses as an old one
        if not layout.random and layout.key(fields) != key:
            continue
        if layout.random and side == "new" and "old" in layouts and not marked:
            continue  # an old item that parses as a random new key
        out.append(side)
    return sorted(out, key=lambda s: s != "old")


def _candidates(m: KeyMapper, layouts: Mapping[str, Layout], item: Mapping[str, Any], side: str) -> dict[str, list]:
    fields = m.fields(item, layouts[side])
    return {s: l.candidate_keys(fields) for s, l in layouts.items()}


def _other_copies(src: ScanSource, layouts, members) -> dict[tuple, dict]:
    """Every other physical copy of the page's items, by key (one consistent BatchGetItem per 100 keys)."""
    m = src.mapper
    wanted: dict[tuple, dict] = {}
    for item, sides in members:
        if not sides:
            continue
        own = _key_id(m, item)
        for keys in _candidates(m, layouts, item, sides[0]).values():
            for k in keys:
                kid = _key_id(m, k)
                if kid != own:
                    wanted.setdefault(kid, k)
    found = src.batch_get(list(wanted.values())) if wanted else []
    return {_key_id(m, i): i for i in found}


def _designated_value(m: KeyMapper, layouts, item, sides, others) -> tuple[dict, str] | None:
    """(newest copy, its layout) when ``item`` is its logical item's designated copy, else None."""
    own = _key_id(m, item)
    cands = _candidates(m, layouts, item, sides[0])
    copies: dict[str, list[dict]] = {}
    for side, keys in cands.items():
        for k in keys:
            kid = _key_id(m, k)
            got = item if kid == own else others.get(kid)
            if got is None:
                continue
            if side == "old" and m.is_new_copy(got):
                continue  # the new copy, found at a key the old template also parses
            copies.setdefault(side, []).append(got)
    primary = "old" if copies.get("old") else "new"
    # newest(): the canonical pick the shim's reads and writes make among duplicates.
    pick = newest(copies.get(primary, []))
    if pick is None or _key_id(m, pick) != own:
        return None
    winner = newest(i for items in copies.values() for i in items)
    side = next(s for s, items in copies.items() if any(i is winner for i in items))
    return winner, side


def _key_id(m: KeyMapper, item: Mapping[str, Any]) -> tuple:
    return tuple(sorted((a, repr(item[a])) for a in m.old.key_attrs))
