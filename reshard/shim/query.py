"""The shim's fan-out query: every shard of every layout a phase reads, merged.

One Query per physical partition (a partition shared by both layouts -- the same
``{sensor_id}#5`` string -- is queried once), the first page of all partitions
concurrently, then a k-way merge in sort-key order. The table hands in what the query
needs as a :class:`QuerySource` (run one Query, run fetches in parallel, convert a
stored item), so this module knows nothing else about it.

Copies of one logical item (old and new layout) have the same sort key (the layouts
the phase reads must share the sort template), so they meet at the same merge step:
the newest version wins, tombstones are dropped.

Pagination, as boto3's: ``LastEvaluatedKey`` is the *logical key* (every key field,
``KeyMapper.key_fields``) of the last item the page evaluated, and it is present whenever
the page stopped at ``Limit`` (or at 1 MB of items), also when nothing follows -- DynamoDB's
own rule. Passed back as ``ExclusiveStartKey`` it resumes after that item, in any phase
(the layouts read may have changed between pages): its sort value and identity are
computed from the key, every partition is queried again from just before that sort value
(``ExclusiveStartKey`` = the closest value DynamoDB accepts below it, within the sort
condition), and on every partition the items at or before (sort value, identity) are
skipped -- DynamoDB's rule -- so an item that landed meanwhile behind the position (a
backfill copy) is neither repeated nor returned out of order.

``Limit`` counts *logical* items evaluated (copies of one item count once, tombstones not
at all), before ``FilterExpression``, as DynamoDB counts stored items: ``ScannedCount`` is
that number, ``Count`` the items that passed the filter.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from typing import Any, Callable, Mapping, Sequence

from reshard import errors
from reshard.aws.dynamo import to_wire
from reshard.core.layout import KeyMapper, Layout, derive_time, is_tombstone, item_size, scalar, text_of
from reshard.core.migration import SHARD
from reshard.core.phases import Routing
from reshard.core.versions import newest

_OPS = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


#: DynamoDB ends a page at 1 MB of items; so does a logical page (counted on stored items).
PAGE_BYTES = 1024 * 1024


class _Partition:
    """One physical partition's read position and buffered items."""

    def __init__(self, pk: dict, layouts: list, start: Any):
        self.pk = pk
        self.layouts = layouts
        self.buf: list[dict] = []
        self.lek: dict | None = None
        self.done = False
        self.after: Any = start  # the sort value to start after (None: the partition's start)


@dataclass(frozen=True)
class QuerySource:
    """All a fan-out query needs from the table it reads (and nothing else of it)."""

    mapper: KeyMapper
    #: One DynamoDB Query on the table: Query's parameters except TableName -> its response.
    query_page: Callable[..., dict]
    #: Call ``fn`` on every element; concurrently where the table keeps a thread pool.
    run_all: Callable[[Callable[[Any], None], Sequence[Any]], None]
    #: A stored item (of ``layout``) as the application sees it; None for a tombstone.
    to_app: Callable[[Mapping[str, Any], Layout], dict | None]


def run_query(src: QuerySource, routing: Routing, key: Mapping[str, Any], condition, limit, forward, start,
              consistent, post: Callable[[dict], dict | None] | None = None) -> dict:
    """One page of a logical query over every partition of the layouts ``routing`` reads.

    ``key``: the partition fields; ``condition``: a physical sort-key condition tuple;
    ``start``: the logical ``ExclusiveStartKey``; ``post(item)``: the item to return for an
    evaluated application item (projected), or None when the filter drops it.
    """
    m = src.mapper
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise errors.BadInput(f"Limit must be a positive integer (got {limit!r})")
    layouts = [m.layout(side) for side in routing.reads]
    sort_attr = m.keys.sort
    if len({(l.sort.text if l.sort else None) for l in layouts}) > 1:
        raise errors.BadInput(f"query: the layouts this phase reads ({', '.join(routing.reads)}) have different "
                              "sort templates, so their items cannot be merged in sort-key order")
    if condition is not None and sort_attr is None:
        raise errors.BadInput("query: a sort-key condition given but the table has no sort key")
    values = to_wire(dict(key)) if key else {}
    fields = {k: scalar(v) for k, v in values.items()}
    last_pos = _start_position(m, layouts[0], start) if start is not None else None
    first_after = None
    if last_pos is not None and sort_attr is not None:
        first_after = _just_before(last_pos[0], forward)
        if first_after is not None and not _satisfies(condition, first_after):
            first_after = None  # DynamoDB refuses a start key outside the sort condition

    partitions: dict[str, _Partition] = {}
    for layout in layouts:
        for pk in _partition_keys(layout, fields):
            name = _pk_name(pk)
            p = partitions.get(name)
            if p is None:
                p = partitions[name] = _Partition(pk, [], first_after)
            p.layouts.append(layout)

    kce, names, vals = _key_condition(m.keys.partition, sort_attr, condition)
    base = {"KeyConditionExpression": kce, "ExpressionAttributeNames": names,
            "ScanIndexForward": forward, "ConsistentRead": consistent}
    if limit is not None:
        base["Limit"] = limit

    def fetch(p: _Partition) -> None:
        kwargs = dict(base)
        kwargs["ExpressionAttributeValues"] = {**vals, ":rs_pk": p.pk[m.keys.partition]}
        if p.lek is not None:
            kwargs["ExclusiveStartKey"] = p.lek
        elif p.after is not None:
            kwargs["ExclusiveStartKey"] = {**p.pk, sort_attr: _sort_to_av(p.after)}
        resp = src.query_page(**kwargs)
        items = resp.get("Items", [])
        p.lek = resp.get("LastEvaluatedKey")
        if not p.lek:
            p.done = True
        entries = []
        for item in items:
            sv = scalar(item[sort_attr]) if sort_attr else None
            ident = _identity(m, item, p.layouts)
            if ident is None:
                continue  # not an item of a layout this phase reads
            if last_pos is not None and not _after((sv, ident), last_pos, forward):
                # DynamoDB's rule, on every partition: nothing at or before the last item
                # evaluated. A partition may hold items that landed meanwhile behind it (a
                # backfill copy): they were evaluated through the other layout.
                continue
            entries.append(((sv, ident), item))
        p.buf.extend(entries)

    # First pages of all partitions at once: a query's latency is one round trip, not N.
    src.run_all(fetch, [p for p in partitions.values() if not p.done])

    out: list[dict] = []
    evaluated, size, last_key, full = 0, 0, None, False
    while True:
        if (limit is not None and evaluated >= limit) or size >= PAGE_BYTES:
            full = True
            break
        for p in partitions.values():
            while not p.buf and not p.done:  # refill sequentially: rare (duplicates, tombstones, big pages)
                fetch(p)
        heads = [p for p in partitions.values() if p.buf]
        if not heads:
            break
        pick = min if forward else max
        best = pick((p.buf[0][0] for p in heads), key=_order_key)
        group = [p for p in heads if p.buf[0][0] == best]
        copies = []
        for p in group:
            (sv, _), item = p.buf.pop(0)
            copies.append((item, p.layouts))
        winner = newest(c[0] for c in copies)
        if is_tombstone(winner):
            continue  # a deleted item: not there for the application, not evaluated
        its_layouts = next(ls for it, ls in copies if it is winner)
        app = src.to_app(winner, its_layouts[0])
        evaluated += 1
        size += item_size(winner)
        last_key = {f: app[f] for f in m.key_fields}
        got = post(app) if post is not None else app
        if got is not None:
            out.append(got)

    resp: dict[str, Any] = {"Items": out, "Count": len(out), "ScannedCount": evaluated}
    if full and last_key is not None:
        resp["LastEvaluatedKey"] = last_key
    return resp


def _start_position(m: KeyMapper, layout: Layout, start: Any) -> tuple:
    """(sort value, identity) of a logical ``ExclusiveStartKey``."""
    if not isinstance(start, Mapping):
        raise errors.BadInput("ExclusiveStartKey must be the LastEvaluatedKey of a previous page: a dict of the key "
                              f"fields {', '.join(m.key_fields)}")
    try:
        fields = m.logical_fields(to_wire(dict(start)))
        sv = scalar(layout.sort.format(layout.with_derived(fields))) if layout.sort is not None else None
    except errors.UnmappableItem as e:
        raise errors.BadInput(f"ExclusiveStartKey: {e.detail}") from None
    return sv, tuple(_plain(v) for v in m.identity(fields))


def _just_before(v: Any, forward: bool) -> Any:
    """A sort value close before ``v`` in the reading direction (None: the partition's start).

    Nothing lies strictly between a string (or binary) and itself + NUL, so backwards it is
    exact. Forwards there is no closest value; one just below (and for numbers ``v - 1``) is
    enough: the items in between are skipped by the (sort value, identity) rule.
    """
    if isinstance(v, Decimal):
        return _number_beside(v, forward)
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v)
        if not forward:
            return v + b"\x00"
        return (v[:-1] + bytes([v[-1] - 1]) + b"\xff" * 4) if v[-1] else (v[:-1] or None)
    if not forward:
        return v + "\x00"
    c = ord(v[-1])
    if c == 0 or 0xD800 <= c - 1 <= 0xDFFF:
        return v[:-1] or None
    return v[:-1] + chr(c - 1) + "\U0010ffff"


#: DynamoDB's numbers: 38 significant digits, magnitudes 1E-130 .. 9.99...E+125.
_DYNAMO_MAX = Decimal("9.9999999999999999999999999999999999999E+125")
_EXACT = Context(prec=400)  # v -/+ 1 exactly: 38 digits spread over at most 256 decimal places
_BELOW = Context(prec=38, rounding=ROUND_FLOOR)
_ABOVE = Context(prec=38, rounding=ROUND_CEILING)


def _number_beside(v: Decimal, forward: bool) -> Decimal | None:
    """A DynamoDB number strictly before ``v`` in the reading direction (None: the partition's start).

    ``v - 1`` in Python's default 28-digit context rounds a 30-digit value back up to ``v``
    (the next page would start at or after the cursor and skip its ties): computed exactly,
    then rounded away from ``v`` to 38 digits, it stays strictly before ``v`` and storable.
    """
    if forward:
        out = _BELOW.plus(_EXACT.subtract(v, 1))
    else:
        out = _ABOVE.plus(_EXACT.add(v, 1))
    return out if out.copy_abs() <= _DYNAMO_MAX else None  # copy_abs: abs() rounds to 28 digits


def _satisfies(condition, v: Any) -> bool:
    """Whether a physical sort value meets a SortKeyCondition tuple (None: no condition)."""
    if condition is None:
        return True
    op, *args = condition
    args = [_plain_sort(a) for a in args]
    if type(v) is not type(args[0]):
        return False
    if op == "begins_with":
        return v.startswith(args[0])
    if op == "between":
        return args[0] <= v <= args[1]
    return {"=": v == args[0], "<": v < args[0], "<=": v <= args[0], ">": v > args[0], ">=": v >= args[0]}[op]


def _plain_sort(v: Any) -> Any:
    v = scalar(to_wire({"v": v})["v"])
    return bytes(v) if isinstance(v, (bytes, bytearray)) else v


def _pk_name(pk: Mapping[str, Any]) -> str:
    (av,) = pk.values()
    return av["S"] if "S" in av else json.dumps(_jsonable(av), sort_keys=True)


def _partition_keys(layout, fields: Mapping[str, Any]) -> list[dict]:
    """Every physical partition key value of ``layout`` under the query's key fields."""
    if SHARD not in layout.partition.fields and (layout.shards != 1 or SHARD in layout.template_fields_all):
        raise errors.BadInput(f"query: the {layout.side} partition template {layout.partition.text!r} has no "
                              "{shard}; only layouts sharded in the partition key can be queried")
    allowed = set(layout.partition.fields) | set(layout.shard_by or ()) | {d.source for d in layout.derived.values()}
    # A sort field fixed by the KeyConditionExpression (``{sensor_id}#{ts}``) is no partition field.
    sort_fields = set(layout.sort.fields) if layout.sort is not None else set()
    fields = {f: v for f, v in fields.items() if f in allowed or f not in sort_fields}
    extra = [f for f in fields if f not in allowed]
    if extra:
        raise errors.BadInput(f"query Key has {', '.join(map(repr, extra))}, not a field of the {layout.side} "
                              f"partition template {layout.partition.text!r} (or its shard_by)")
    vals = dict(fields)
    for name, d in layout.derived.items():
        if name not in vals and d.source in vals:
            vals[name] = derive_time(vals[d.source], d.format, d.source)
    if not layout.random and all(f in fields for f in layout.shard_by):
        shards = [layout.shard_for(fields)]  # the Key pins the shard: one partition
    else:
        shards = range(layout.shards)
    out = []
    for s in shards:
        vals[SHARD] = s
        try:
            out.append({layout.partition_attr: layout.partition.format(vals)})
        except errors.UnmappableItem as e:
            raise errors.BadInput(f"query Key: {e.detail} (partition template {layout.partition.text!r})") from None
    return out


def conjuncts(node: tuple | None) -> list[tuple]:
    """The leaves of a key condition's ``AND`` tree (the only connective a key condition has)."""
    if node is None:
        return []
    if node[0] == "and":
        return conjuncts(node[1]) + conjuncts(node[2])
    return [node]


def logical_key_condition(m: KeyMapper, layouts: list[Layout], node: tuple) -> tuple[dict, tuple | None]:
    """(partition fields, physical sort condition) of a parsed KeyConditionExpression over
    logical fields (``sensor_id = :s AND ts BETWEEN :a AND :b``).

    Equalities on partition-template (or ``shard_by``) fields select the partitions. The
    sort template is rendered as far as equalities fix its fields; the one remaining
    condition applies to the next field, which must be the template's last (else the
    rendered text would not order like the field).
    """
    leaves = conjuncts(node)
    eq: dict[str, Any] = {}
    ranged: list[tuple[str, str, list]] = []
    for leaf in leaves:
        kind = leaf[0]
        if kind == "cmp" and leaf[1] != "<>":
            field, args, op = _key_path(leaf[2]), [leaf[3]], leaf[1]
        elif kind == "between":
            field, args, op = _key_path(leaf[1]), [leaf[2], leaf[3]], "between"
        elif kind == "func" and leaf[1] == "begins_with":
            field, args, op = _key_path(leaf[2][0]), [leaf[2][1]], "begins_with"
        else:
            raise errors.BadInput("KeyConditionExpression: only =, <, <=, >, >=, BETWEEN and begins_with, joined by "
                                  "AND, are allowed (use FilterExpression for the rest)")
        if any(a[0] != "value" for a in args):
            raise errors.BadInput("KeyConditionExpression: compare a key field with values (:v), not with a path")
        vals = [scalar(a[1]) for a in args]
        if op == "=" and field not in eq:
            eq[field] = vals[0]
        else:
            ranged.append((field, op, vals))
    layout = layouts[0]
    part_fields = set()
    for l in layouts:
        part_fields |= set(l.partition.fields) | set(l.shard_by or ()) | {d.source for d in l.derived.values()}
    sort_parts = layout.sort.parts if layout.sort is not None else ()
    sort_fields = {p.field for p in sort_parts if p.field}
    for field, _, _ in ranged:
        if field not in sort_fields:
            raise errors.BadInput(f"KeyConditionExpression: {field!r} is not a sort field of {m.migration.table!r} "
                                  f"(sort template {layout.sort.text if layout.sort else None!r}); use "
                                  "FilterExpression for other attributes")
    unknown = [f for f in eq if f not in part_fields and f not in sort_fields]
    if unknown:
        raise errors.BadInput(f"KeyConditionExpression: {', '.join(map(repr, unknown))} is not a key field of the "
                              f"query (partition template fields: {', '.join(sorted(part_fields - {SHARD}))}); use "
                              "FilterExpression for other attributes")
    if len(ranged) > 1:
        raise errors.BadInput("KeyConditionExpression: at most one condition on the sort field besides equalities")
    key = {f: v for f, v in eq.items() if f in part_fields}
    if layout.sort is None:
        return key, None
    if layout.sort.identity:
        f = layout.sort.fields[0]
        if ranged:
            _, op, vals = ranged[0]
            return key, (op, *vals)
        return key, ("=", eq[f]) if f in eq else None
    # A composite template: the prefix the equalities fix, then the next field.
    prefix, nxt, rest = "", None, []
    with_derived = dict(eq)
    for d_name, d in layout.derived.items():
        if d.source in eq:
            with_derived[d_name] = derive_time(eq[d.source], d.format, d.source)
    for i, part in enumerate(sort_parts):
        if part.field is None:
            prefix += part.literal
        elif part.field in with_derived and not any(r[0] == part.field for r in ranged):
            v = with_derived[part.field]
            prefix += format(v, part.spec) if part.spec else text_of(v, part.field)
        else:
            nxt, rest = part.field, sort_parts[i + 1:]
            break
    if nxt is None:
        return key, ("=", prefix)
    if not ranged or ranged[0][0] != nxt:
        if ranged:
            raise errors.BadInput(f"KeyConditionExpression: a condition on {ranged[0][0]!r} needs equalities on the "
                                  f"sort fields before it in {layout.sort.text!r}")
        return key, ("begins_with", prefix) if prefix else None
    if rest:
        raise errors.BadInput(f"KeyConditionExpression: {nxt!r} is not the last field of the sort template "
                              f"{layout.sort.text!r}; only equalities can be used on it")
    _, op, vals = ranged[0]
    texts = [prefix + text_of(v, nxt) for v in vals]
    if op in ("begins_with", "between", "="):
        return key, (op, *texts)
    if not prefix:
        return key, (op, *texts)
    raise errors.BadInput(f"KeyConditionExpression: {op} on {nxt!r} inside the sort template {layout.sort.text!r} "
                          "cannot be expressed on the stored key; use BETWEEN or begins_with")


def _key_path(node: tuple) -> str:
    if node[0] != "path" or len(node[1]) != 1 or not isinstance(node[1][0], str):
        raise errors.BadInput("KeyConditionExpression: conditions must be on top-level key fields")
    return node[1][0]


def _key_condition(pk_attr: str, sk_attr: str | None, condition) -> tuple[str, dict, dict]:
    names = {"#rs_pk": pk_attr}
    if condition is None:
        return "#rs_pk = :rs_pk", names, {}
    if not isinstance(condition, (tuple, list)) or not condition:
        raise errors.BadInput(f"SortKeyCondition must be a tuple like ('begins_with', 'x') (got {condition!r})")
    op, *args = condition
    names["#rs_sk"] = sk_attr
    ser = lambda v: to_wire({"v": v})["v"]  # noqa: E731
    if op in _OPS and len(args) == 1:
        return f"#rs_pk = :rs_pk AND #rs_sk {_OPS[op]} :rs_a", names, {":rs_a": ser(args[0])}
    if op == "between" and len(args) == 2:
        return "#rs_pk = :rs_pk AND #rs_sk BETWEEN :rs_a AND :rs_b", names, {":rs_a": ser(args[0]),
                                                                             ":rs_b": ser(args[1])}
    if op == "begins_with" and len(args) == 1:
        return "#rs_pk = :rs_pk AND begins_with(#rs_sk, :rs_a)", names, {":rs_a": ser(args[0])}
    raise errors.BadInput(f"SortKeyCondition {condition!r}: use ('=', v), ('<', v), ('<=', v), ('>', v), "
                          "('>=', v), ('between', a, b) or ('begins_with', prefix)")


def _identity(m: KeyMapper, item: Mapping[str, Any], layouts: list) -> tuple | None:
    """The logical identity of ``item`` if it belongs to one of ``layouts``, else None.

    A physical partition can hold items of both layouts (``s-1#5`` is a partition of
    the 16-shard and of the 32-shard layout), so an item found there counts only if the
    layout's rule gives it exactly this key: a ``cutover`` query must not return an
    old-layout item that happens to share a partition with the new layout. Items that
    map to no layout (other entity types in the same partitions) are not returned.
    """
    key = {a: item[a] for a in m.old.key_attrs}
    for layout in layouts:
        try:
            fields = m.fields(item, layout)
            if not layout.random and layout.key(fields) != key:
                continue
        except errors.UnmappableItem:
            continue
        return tuple(_plain(v) for v in m.identity(fields))
    return None


def _plain(v: Any) -> str:
    return v.hex() if isinstance(v, bytes) else v


def _order_key(pos: tuple) -> tuple:
    sv, ident = pos
    return (sv if sv is not None else "", ident)


def _after(pos: tuple, last: tuple, forward: bool) -> bool:
    a, b = _order_key(pos), _order_key(last)
    return a > b if forward else a < b


def _jsonable(av: Mapping[str, Any]) -> Any:
    (t, v), = av.items()
    if t == "B":
        return {"B": base64.b64encode(bytes(v)).decode()}
    return {t: v}


def _sort_to_av(v: Any) -> dict:
    if isinstance(v, Decimal):
        return {"N": str(v)}
    if isinstance(v, (bytes, bytearray)):
        return {"B": bytes(v)}
    return {"S": v}
