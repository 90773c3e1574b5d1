"""The shim's reads of a sharded GSI: the fan-out query over its partition values.

(The value a write gives the partition attribute is ``index_values.py``; which layouts a
phase reads and writes, ``routing.index_routing``.)

The layout (``reshard/core/index.py``): every item in the index carries a GSI partition
attribute (``gsi_shard``) whose value spreads one logical key (the GSI sort key,
``tx_country``) over N index partitions. Reading the index means querying every value
of every layout the phase reads (:data:`reshard.core.index.INDEX_ROUTING`, in pass order)
and merging. Items keep their table keys; only that one attribute moves.

The fan-out: no item twice, none missed while it moves
    A logical page is read in two passes, the first layout of ``reads`` (the one items move
    away from) over *every* one of its partition values, then the second over every one of
    its values -- also values the first pass already read (old ``0..3`` lies inside new
    ``0..15``, and an item may move from 3 to 1 after 1 was read). Items move in one
    direction only while a query runs (core/index.py), so an item is either still at its
    source value when the first pass reads it, or already at its destination value when
    the second pass does. An item's *position* -- (GSI sort value, table key) -- does not
    change when its partition value moves, so the two reads of one item meet at one
    position: one result per table key is kept (the larger ``_rs_v``).

    For that argument to hold on every position a page returns, the second pass must not
    read a position before the first pass did. The first pass reads each of its partitions
    until it holds enough items (``Limit``, or 1 MB) before the sort value its
    ``LastEvaluatedKey`` stopped at; the smallest such stop is the page's *frontier* (every
    position before it was read by the first pass, in every partition). The second pass then
    reads each of its partitions up to the frontier, and the page is the first ``Limit``
    positions before it. Items past the frontier are dropped and read again by the next page.

    DynamoDB orders the items of one GSI partition by sort value, but ties (one sort value,
    several items) by an internal hash of the table key, not by the key: a frontier is a
    sort value, and a tie group is always read whole before any of it is returned. An index
    without a sort key is one tie group per partition value: each page reads its partitions
    whole (correct, and as costly as it sounds: give such an index a sort key).

Table keys and index at once (a combined migration: ``[from]``/``[to]`` and ``[index.NAME]``)
    A logical item then has up to two physical copies (old key, new key; one item when both
    keys are equal), and every copy carrying the GSI attributes is an entry of the index. Each
    copy a shim writes gets the value of ``INDEX_ROUTING[phase].writes`` (both copies in
    dual_write and cutover), the backfill copy gives a new copy the new value and the rewrite
    moves every physical item's value: per copy, values move one way per period, so the two
    passes above find every copy that exists throughout the query. But an entry is a physical
    copy -- possibly stale (a lost mirror; an old copy cleanup-phase writes no longer reach),
    an old copy after cutover, a live copy whose counterpart is a tombstone -- so entries are
    *resolved* (:class:`Resolver`, :func:`_resolved_page`):

    1. grouped by (sort value, *logical* key), not by table key;
    2. each logical item read as the phase's consistent ``get_item`` reads it (the keys the
       phase reads, every candidate of a random old layout; the newest copy; a tombstone is
       absent), in one BatchGetItem per round of the groups the page still needs;
    3. the resolved item R returned at a group iff R is live, in the index, *its own sort
       value is the group's*, and its partition fields equal the query's (then the filter);
    4. ordered and paged by (sort value, logical key): ``LastEvaluatedKey`` carries the logical
       key fields, the sort value and ``_rs_reads``; it round-trips as ``ExclusiveStartKey``.

    Why an item unchanged during the query is returned exactly once. Let C be the copy the
    phase's ``get_item`` resolves it to: in planned, dual_write and aborted (retired too) the
    old copy (the only layout read; aborted's cleanup removes new copies only); in dual_read
    and backfill the old copy as well -- it is authoritative, so no copy is newer, and the
    copier copies it at its version; in cutover, cleanup and complete the new copy (cleanup
    removes old copies only, and verify put every copy at the new GSI value before cutover).
    C exists throughout the query, at R's sort value, with a GSI value of a layout the query
    reads: the two passes find its entry, and its group returns R. Every other entry of the
    item (a stale copy, an old copy after cutover, a copy beside a tombstone) resolves to R or
    to nothing and is skipped (R's sort value is not its group's), or is C's own group: R has
    one sort value, so one group per query returns it, and the cursor keeps pages disjoint.
    Without step 3 a stale copy's entry would return R a second time, at the stale position.

    A concurrent write: the index and the resolving read are two moments. An item whose sort
    value changes during the query may be returned at its old or its new position, at both
    across two pages, or missed (its new entry was not there yet when the index was read, its
    old one resolves elsewhere) -- as a DynamoDB query racing an update of its sort key across
    pages. An item deleted or created during the query is returned or not.

    Cost: one consistent read per logical item a page resolves (one key per copy the phase
    reads: 1 or 2; N or N+1 for a random old layout of N shards, as ``get_item``), in rounds of
    the page's remaining ``Limit`` (up to :data:`RESOLVE_BATCH` items), beside the fan-out's
    queries. An entry whose projection lacks a key field stored only as an attribute costs one
    consistent GetItem more (it is read whole to learn its logical key). The resolved item is
    the table's item: ``ALL_PROJECTED_ATTRIBUTES`` returns all of it.

Pagination, as boto3's: ``Limit`` counts items evaluated (before ``FilterExpression``;
items dropped by the key condition are not evaluated); ``LastEvaluatedKey`` is a logical
cursor -- the table key and GSI sort value of the last item evaluated, plus ``_rs_reads``,
the layouts (in pass order) the page read -- present whenever the page stopped at ``Limit``
or 1 MB. Passed back as ``ExclusiveStartKey``, every partition is queried again from just
before that sort value and every position at or before the cursor is skipped. A cursor
from a page read under other layouts is refused with ``ReshardScanInterrupted`` (restart
the query), as a paged scan's is; a cursor without ``_rs_reads`` (built by the application)
is taken as is.

What a reader may see (GSIs are eventually consistent; DynamoDB refuses ``ConsistentRead``
on a GSI, and so does the shim): the guarantee holds against the index's state. While
DynamoDB propagates a change of one item's GSI key to the index (the migration's move, or
any application update), that item can be momentarily absent from the index or still at
its previous value there -- exactly as for a GSI key an application updates itself. The
shim never adds a duplicate on top: one result per table key per page. dynalite updates
its indexes synchronously, so the tests see the strong form.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from reshard import errors
from reshard.aws.dynamo import from_wire, to_wire
from reshard.core.index import IndexMapper, IndexRouting
from reshard.core.layout import is_tombstone, item_size, scalar
from reshard.core.versions import newest
from reshard.shim.query import PAGE_BYTES, _after, _just_before, _order_key, _plain, _satisfies, _sort_to_av, conjuncts

#: The reserved attribute of an index query's LastEvaluatedKey: the layouts it read, in pass order.
READS_ATTR = "_rs_reads"

_OPS = ("=", "<", "<=", ">", ">=")


# --------------------------------------------------------------------------- key conditions

def index_key_condition(im: IndexMapper, node: tuple | None, key: Mapping[str, Any] | None) -> tuple[dict, tuple | None]:
    """(equalities on logical fields, condition on the GSI sort attribute) of a parsed
    KeyConditionExpression and/or ``Key={...}`` over the index's logical fields.

    The sort attribute takes one condition (``=``, ``<``, ``<=``, ``>``, ``>=``, BETWEEN,
    begins_with) as DynamoDB's; the index's partition fields (template fields, ``shard_by``
    fields) take equalities, which pick the partition values to read; the partition
    attribute itself cannot be named: the shim fans out over it.
    """
    leaves = conjuncts(node)
    allowed = im.partition_fields() | set(im.old.shard_by or ()) | set(im.new.shard_by or ())
    eq: dict[str, Any] = {}
    sort: tuple | None = None
    for leaf in leaves:
        kind = leaf[0]
        if kind == "cmp" and leaf[1] in _OPS:
            field, op, args = _path(leaf[2]), leaf[1], [leaf[3]]
        elif kind == "between":
            field, op, args = _path(leaf[1]), "between", [leaf[2], leaf[3]]
        elif kind == "func" and leaf[1] == "begins_with":
            field, op, args = _path(leaf[2][0]), "begins_with", [leaf[2][1]]
        else:
            raise errors.BadInput("KeyConditionExpression: only =, <, <=, >, >=, BETWEEN and begins_with, joined by "
                                  "AND, are allowed (use FilterExpression for the rest)")
        if any(a[0] != "value" for a in args):
            raise errors.BadInput("KeyConditionExpression: compare a key field with values (:v), not with a path")
        values = [scalar(a[1]) for a in args]
        if field == im.sort_attr:
            if sort is not None:
                raise errors.BadInput(f"KeyConditionExpression: at most one condition on the sort key {field!r}")
            sort = (op, *values)
        else:
            _equality(im, allowed, eq, field, op, values[0])
    for field, v in (key or {}).items():
        if field == im.sort_attr:
            wire = scalar(to_wire({"v": v})["v"])
            if sort is not None and sort != ("=", wire):
                raise errors.BadInput(f"query: Key and KeyConditionExpression disagree on {field!r}")
            sort = ("=", wire)
        else:
            _equality(im, allowed, eq, field, "=", scalar(to_wire({"v": v})["v"]))
    return eq, sort


def _equality(im: IndexMapper, allowed: set, eq: dict, field: str, op: str, value: Any) -> None:
    if field == im.attr:
        raise errors.BadInput(f"query: {field!r} is index {im.name}'s sharded partition attribute: the shim queries "
                              f"every value of it; name the index's logical fields "
                              f"({', '.join(sorted(allowed | {im.sort_attr} - {None})) or 'its sort key'})")
    if field not in allowed:
        sort = f"its sort key {im.sort_attr!r}" if im.sort_attr else "it has no sort key"
        raise errors.BadInput(f"KeyConditionExpression: {field!r} is not a key field of index {im.name} ({sort}; "
                              f"partition fields: {', '.join(sorted(allowed)) or 'none'}); use FilterExpression for "
                              "other attributes")
    if op != "=":
        raise errors.BadInput(f"KeyConditionExpression: {field!r} is a partition field of index {im.name}: only = "
                              "is allowed on it")
    if field in eq and eq[field] != value:
        raise errors.BadInput(f"query: two different equalities on {field!r}")
    eq[field] = value


def _path(node: tuple) -> str:
    if node[0] != "path" or len(node[1]) != 1 or not isinstance(node[1][0], str):
        raise errors.BadInput("KeyConditionExpression: conditions must be on top-level key fields")
    return node[1][0]


# --------------------------------------------------------------------------- the fan-out

@dataclass(frozen=True)
class IndexSource:
    """All an index query needs from the table it reads."""

    #: The table's key attribute names (an item's identity in the index).
    key_attrs: tuple[str, ...]
    #: One DynamoDB Query on the table: Query's parameters except TableName -> its response.
    query_page: Callable[..., dict]
    #: Call ``fn`` on every element; concurrently where the table keeps a thread pool.
    run_all: Callable[[Callable[[Any], None], Sequence[Any]], None]
    #: A stored item as the application sees it (None: not an application item).
    to_app: Callable[[Mapping[str, Any]], dict | None]


@dataclass(frozen=True)
class Resolver:
    """A combined migration's logical resolution of index entries (the module docstring,
    "Table keys and index at once"): built per query, on the phase the query acts on."""

    #: The table's logical key fields: a cursor names them, not the table's key attributes.
    key_fields: tuple[str, ...]
    #: (logical identity, wire key fields) of a stored entry of either layout; None: not an
    #: item of the migration (unmappable: no ``get_item`` could find it either).
    identify: Callable[[Mapping[str, Any]], tuple[tuple, dict] | None]
    #: (logical identity, a physical table key) of wire key fields (a cursor's).
    of_key: Callable[[Mapping[str, Any]], tuple[tuple, dict]]
    #: Per wire key fields, read as the phase's consistent ``get_item`` reads them, in one
    #: BatchGetItem: (the newest copy, the logical wire item), or None (absent, a tombstone).
    resolve: Callable[[Sequence[Mapping[str, Any]]], list[tuple[dict, dict] | None]]


#: Logical items resolved per BatchGetItem round when no Limit says how many are needed.
RESOLVE_BATCH = 100


class _Part:
    """One GSI partition value of one pass: what it returned so far and where it stopped."""

    def __init__(self, side: str, value: dict):
        self.side = side
        self.value = value
        self.entries: list[tuple[tuple, dict]] = []  # (position, stored item), in read order
        self.lek: dict | None = None
        self.done = False
        self.fetches = 0

    def bound(self, sort_attr: str | None) -> Any:
        """The sort value this partition stopped at (_DONE: read whole; _NONE: no sort key,
        so nothing is complete before the end)."""
        if self.done:
            return _DONE
        if sort_attr is None:
            return _NONE
        return _sv(self.lek[sort_attr])


_DONE = object()
_NONE = object()


def run_index_query(src: IndexSource, im: IndexMapper, routing: IndexRouting, eq: Mapping[str, Any],
                    condition: tuple | None, limit: int | None, forward: bool, start: Mapping[str, Any] | None,
                    select: str | None, post: Callable[[dict], dict | None] | None,
                    resolver: Resolver | None = None) -> dict:
    """One page of a fan-out query of index ``im`` over the layouts ``routing`` reads.

    ``eq``: equalities on the index's partition fields; ``condition``: a condition tuple on
    the GSI sort attribute (physical value = logical value: it is never rewritten);
    ``post(item)``: the item to return (filtered, projected), None when the filter drops it.
    ``resolver``: a migration that also re-keys the table (an entry is one physical copy):
    entries are grouped by logical key and each is read as ``get_item`` reads it.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise errors.BadInput(f"Limit must be a positive integer (got {limit!r})")
    if condition is not None and im.sort_attr is None:
        raise errors.BadInput(f"query: index {im.name} has no sort key; a condition can only fix its partition fields")
    sort_attr = im.sort_attr
    key_attrs = src.key_attrs
    reads = ",".join(routing.reads)
    cursor = _cursor(im, key_attrs, start, reads, resolver)
    #: A combined migration's wire key fields per logical identity (the cursor names them).
    logical_keys: dict[tuple, dict] = {}

    passes: list[list[_Part]] = []
    for side in routing.reads:
        try:
            values = im.query_values(side, eq)
        except errors.UnmappableItem as e:
            raise errors.BadInput(f"query: {e.detail}") from None
        passes.append([_Part(side, v) for v in values])

    names = {"#rs_gp": im.attr}
    kce = "#rs_gp = :rs_gp"
    vals: dict = {}
    if condition is not None:
        names["#rs_gs"] = sort_attr
        kce += _sort_condition(condition, vals)
    base: dict[str, Any] = {"IndexName": im.name, "KeyConditionExpression": kce, "ExpressionAttributeNames": names,
                            "ScanIndexForward": forward}
    if select in ("ALL_ATTRIBUTES", "ALL_PROJECTED_ATTRIBUTES"):
        base["Select"] = select  # DynamoDB says whether the index's projection allows it
    start_sv = None
    if cursor is not None and sort_attr is not None:
        start_sv = _just_before(cursor[0], forward)
        if start_sv is not None and not _satisfies(condition, start_sv):
            start_sv = None  # DynamoDB refuses a start key outside the key condition: read from the start

    def before(sv: Any, bound: Any) -> bool:
        """Whether sort value ``sv`` lies strictly before ``bound`` in the reading direction."""
        if bound is _DONE:
            return True
        if bound is _NONE:
            return False
        return sv < bound if forward else sv > bound

    def fetch(p: _Part) -> None:
        kwargs = dict(base)
        kwargs["ExpressionAttributeValues"] = {**vals, ":rs_gp": p.value}
        if limit is not None:
            # Doubling on each further page of one partition: a tie group longer than Limit
            # (or items the key condition drops) is read in a few requests, not one per item.
            kwargs["Limit"] = min(limit << min(p.fetches, 10), max(limit, 1000))
        if p.lek is not None:
            kwargs["ExclusiveStartKey"] = p.lek
        elif start_sv is not None:
            # Just before the cursor's sort value: DynamoDB orders a tie group by a hash of the
            # table key, so the whole group at the cursor is read again and filtered below.
            # (The sort value last: the GSI sort attribute may also be a table key attribute.)
            kwargs["ExclusiveStartKey"] = {**cursor[2], im.attr: p.value, sort_attr: _sort_to_av(start_sv)}
        p.fetches += 1
        resp = src.query_page(**kwargs)
        p.lek = resp.get("LastEvaluatedKey")
        p.done = not p.lek
        for item in resp.get("Items", []):
            if resolver is None:
                pos = _position(item, sort_attr, key_attrs)
            else:
                who = resolver.identify(item)
                if who is None:
                    continue  # not an item of the migration: get_item could not find it either
                pos = (_sv(item.get(sort_attr)) if sort_attr else None, who[0])
                logical_keys.setdefault(who[0], who[1])
            if cursor is not None and not _after(pos, cursor[:2], forward):
                continue  # at or before the cursor: an earlier page evaluated it
            if resolver is None and not _matches(im, item, eq, p.side):
                continue  # the partition value was computed from a shard_by field: other items share it
            p.entries.append((pos, item))

    def enough(p: _Part, bound: Any) -> bool:
        """Whether ``p`` holds a full page before ``bound``."""
        n = size = 0
        for (sv, _), item in p.entries:
            if not before(sv, bound) or is_tombstone(item):
                continue
            n += 1
            size += item_size(item)
            if (limit is not None and n >= limit) or size >= PAGE_BYTES:
                return True
        return False

    def first_pass(p: _Part) -> None:
        # Until the partition is read whole or holds a full page before where it stopped.
        while not p.done and not (p.fetches and enough(p, p.bound(sort_attr))):
            fetch(p)

    src.run_all(first_pass, passes[0])
    # The first pass read every position before the frontier, in every partition. (Without a
    # sort key, first_pass read every partition whole: the frontier is the end.)
    frontier = _DONE
    for p in passes[0]:
        b = p.bound(sort_attr)
        if b is not _DONE and (frontier is _DONE or before(b, frontier)):
            frontier = b

    def later_pass(p: _Part) -> None:
        # Up to the frontier: every position before it, never past it (the first pass has not
        # read past it, and a later page reads it again in both passes, in order).
        while not p.done and (not p.fetches or before(p.bound(sort_attr), frontier)):
            fetch(p)

    for parts in passes[1:]:
        src.run_all(later_pass, parts)

    if resolver is not None:
        return _resolved_page(im, resolver, passes, logical_keys, eq, limit, forward, post, reads,
                              lambda sv: before(sv, frontier), frontier is not _DONE)

    # Every position before the frontier, one result per table key (the newest copy).
    best: dict[tuple, tuple[tuple, dict]] = {}
    for parts in passes:
        for p in parts:
            for pos, item in p.entries:
                if not before(pos[0], frontier):
                    continue
                have = best.get(pos[1])
                if have is None or newest([have[1], item]) is item and have[1] is not item:
                    best[pos[1]] = (pos, item)
    ordered = sorted(best.values(), key=lambda e: _order_key(e[0]), reverse=not forward)

    out: list[dict] = []
    evaluated, size, last = 0, 0, None
    full = False
    for pos, item in ordered:
        if (limit is not None and evaluated >= limit) or size >= PAGE_BYTES:
            full = True
            break
        if is_tombstone(item):
            continue
        app = src.to_app(item)
        if app is None:
            continue
        evaluated += 1
        size += item_size(item)
        last = (pos, item)
        got = post(app) if post is not None else app
        if got is not None:
            out.append(got)
    if not full and ((limit is not None and evaluated >= limit) or size >= PAGE_BYTES):
        full = True  # DynamoDB's rule: a page that stopped at Limit has a LastEvaluatedKey, also at the end
    if not full and frontier is not _DONE and last is not None:
        full = True  # the frontier ended the page: the rest follows from its last item
    resp: dict[str, Any] = {"Items": out, "Count": len(out), "ScannedCount": evaluated}
    if full and last is not None:
        pos, item = last
        lek = {a: item[a] for a in key_attrs}
        if sort_attr is not None:
            lek[sort_attr] = item[sort_attr]
        resp["LastEvaluatedKey"] = {**from_wire(lek), READS_ATTR: reads}
    return resp


def _resolved_page(im: IndexMapper, resolver: Resolver, passes: list[list[_Part]], logical_keys: dict[tuple, dict],
                   eq: Mapping[str, Any], limit: int | None, forward: bool, post: Callable[[dict], dict | None] | None,
                   reads: str, in_page: Callable[[Any], bool], cut: bool) -> dict:
    """The page of a combined migration's fan-out: every (sort value, logical key) group before
    the frontier (``in_page``), in that order, each item read as ``get_item`` reads it and
    returned where its own sort value puts it (the module docstring). ``cut``: the frontier
    ended the read (more may follow)."""
    sort_attr = im.sort_attr
    groups = {pos for parts in passes for p in parts for pos, _ in p.entries if in_page(pos[0])}
    ordered = sorted(groups, key=_order_key, reverse=not forward)
    resolved: dict[tuple, tuple[dict, dict] | None] = {}
    out: list[dict] = []
    evaluated, size, done = 0, 0, None
    full = False
    for n, pos in enumerate(ordered):
        if (limit is not None and evaluated >= limit) or size >= PAGE_BYTES:
            full = True
            break
        ident = pos[1]
        if ident not in resolved:
            # The logical items this page still needs (a skipped entry asks for the next ones).
            want = min(max(limit - evaluated, 1), RESOLVE_BATCH) if limit is not None else RESOLVE_BATCH
            batch: list[tuple] = []
            for later in itertools.islice(ordered, n, None):
                if later[1] not in resolved and later[1] not in batch:
                    batch.append(later[1])
                    if len(batch) >= want:
                        break
            resolved.update(zip(batch, resolver.resolve([logical_keys[b] for b in batch])))
        done = pos
        got = resolved[ident]
        if got is None:
            continue  # deleted (a tombstone) or absent where the phase reads: the entry is a leftover copy
        stored, logical = got
        if not _returned_here(im, stored, pos[0]):
            continue  # a stale copy's entry: the item is returned where its own sort value puts it
        if any(logical.get(f) is None or scalar(logical[f]) != v for f, v in eq.items()):
            continue  # its current partition fields are another query's
        evaluated += 1
        size += item_size(stored)
        app = from_wire(logical)
        got_app = post(app) if post is not None else app
        if got_app is not None:
            out.append(got_app)
    if not full and ((limit is not None and evaluated >= limit) or size >= PAGE_BYTES or (cut and done is not None)):
        full = True  # at Limit (DynamoDB's rule, also at the end), or the frontier ended the page
    resp: dict[str, Any] = {"Items": out, "Count": len(out), "ScannedCount": evaluated}
    if full and done is not None:
        # The logical position of the last group handled (returned, filtered or skipped).
        lek = dict(logical_keys[done[1]])
        if sort_attr is not None:
            lek[sort_attr] = _sort_to_av(done[0])
        resp["LastEvaluatedKey"] = {**from_wire(lek), READS_ATTR: reads}
    return resp


def _returned_here(im: IndexMapper, stored: Mapping[str, Any], sv: Any) -> bool:
    """Whether a resolved item belongs at an entry of sort value ``sv``: it is in the index and
    its own sort value is ``sv`` (an entry of a stale copy sits where the item no longer is)."""
    return im.in_index(stored) and (im.sort_attr is None or _sv(stored[im.sort_attr]) == sv)


def _cursor(im: IndexMapper, key_attrs: Sequence[str], start: Mapping[str, Any] | None,
            reads: str, resolver: Resolver | None = None) -> tuple | None:
    """(sort value, identity, wire table key) of a logical ``ExclusiveStartKey``, or None.

    A combined migration's cursor names the logical key fields (``resolver.key_fields``)."""
    if start is None:
        return None
    named = resolver.key_fields if resolver is not None else key_attrs
    want = set(named) | ({im.sort_attr} if im.sort_attr else set())
    if not isinstance(start, Mapping) or set(start) - {READS_ATTR, im.attr} != want:
        raise errors.BadInput(f"ExclusiveStartKey must be the LastEvaluatedKey of a previous page of this index query "
                              f"(a dict of {', '.join(sorted(want))})")
    started = start.get(READS_ATTR)
    if started is not None and started != reads:
        # Refused as a paged scan's resume is: the pages were read over other layouts.
        raise errors.ScanInterrupted(
            f"this paged query of index {im.name} began while the shim read its {started!r} layout(s) and the "
            f"migration now reads {reads!r}; restart the query from the beginning (without ExclusiveStartKey)")
    wire = to_wire({a: start[a] for a in want})
    if resolver is not None:
        ident, table_key = resolver.of_key({f: wire[f] for f in resolver.key_fields})
        return (_sv(wire[im.sort_attr]) if im.sort_attr else None), ident, table_key
    pos = _position(wire, im.sort_attr, key_attrs)
    return pos[0], pos[1], {a: wire[a] for a in key_attrs}


def _sort_condition(condition: tuple, vals: dict) -> str:
    op, *args = condition
    for i, a in enumerate(args):
        vals[f":rs_s{i}"] = _sort_to_av(a)
    if op in _OPS:
        return f" AND #rs_gs {op} :rs_s0"
    if op == "between":
        return " AND #rs_gs BETWEEN :rs_s0 AND :rs_s1"
    return " AND begins_with(#rs_gs, :rs_s0)"


def _matches(im: IndexMapper, item: Mapping[str, Any], eq: Mapping[str, Any], side: str) -> bool:
    """Whether ``item`` meets the key condition's equalities on partition fields.

    A field the side's template writes into the partition value is met by construction (and
    may be absent from an INCLUDE projection); a ``shard_by``-only field picked a partition
    value other items share, so it is checked on the item.
    """
    in_template = set(im.layout(side).template_fields)
    for f, v in eq.items():
        got = item.get(f)
        if got is None:
            if f in in_template:
                continue
            return False
        if scalar(got) != v:
            return False
    return True


def _sv(av: Mapping[str, Any] | None) -> Any:
    if av is None:
        return None
    v = scalar(av)
    return bytes(v) if isinstance(v, (bytes, bytearray)) else v


def _position(item: Mapping[str, Any], sort_attr: str | None, key_attrs: Sequence[str]) -> tuple:
    """(GSI sort value, table key identity): where an item sits in the merged order."""
    sv = _sv(item.get(sort_attr)) if sort_attr else None
    return sv, tuple(_plain(_sv(item[a])) for a in key_attrs)
