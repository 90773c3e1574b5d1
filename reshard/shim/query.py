"""The shim's fan-out query: every shard of every layout a phase reads, merged.

One Query per physical partition (a partition shared by both layouts -- the same
``{sensor_id}#5`` string -- is queried once), the first page of all partitions
concurrently, then a k-way merge in sort-key order. The table hands in what the query
needs as a :class:`QuerySource` (run one Query, run fetches in parallel, convert a
stored item), so this module knows nothing else about it.

Copies of one logical item (old and new layout) have the same sort key (the layouts
the phase reads must share the sort template), so they meet at the same merge step:
the newest version wins, tombstones are dropped.

Pagination token (opaque to the app): base64 of JSON
``{"p": {partition: position}, "last": [sort value, identity]}`` (zlib-compressed) where position is
``0`` (not started), ``1`` (exhausted) or the last consumed sort value. A partition's
next Query starts after its own position (ExclusiveStartKey), so a page boundary never
loses an item; on every partition, items at or before ``last`` (sort value, ties by
identity) are skipped, DynamoDB's own rule, so an item that landed meanwhile behind a
lagging position (a backfill copy) is neither repeated nor returned out of order. A
partition missing from the token (the phase changed between pages and now reads another
layout) is read from its start, with the same skip.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Mapping, Sequence

from reshard import errors
from reshard.aws.dynamo import to_wire
from reshard.core.layout import KeyMapper, Layout, derive_time, is_tombstone, scalar
from reshard.core.migration import SHARD
from reshard.core.phases import Routing
from reshard.core.versions import newest

_OPS = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class _Partition:
    """One physical partition's read position and buffered items."""

    def __init__(self, pk: dict, layouts: list, position: Any):
        self.pk = pk
        self.layouts = layouts
        self.buf: list[dict] = []
        self.lek: dict | None = None
        self.started = position not in (0, None)
        self.done = position == 1
        self.after: Any = position if self.started and not self.done else None  # last consumed sort value


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


def run_query(src: QuerySource, routing: Routing, key: Mapping[str, Any], condition, limit, forward, token,
              consistent) -> dict:
    """One page of a logical query over every partition of the layouts ``routing`` reads."""
    m = src.mapper
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise errors.BadInput(f"Limit must be a positive integer (got {limit!r})")
    layouts = [m.layout(side) for side in routing.reads]
    sort_attr = m.keys.sort
    if len({(l.sort.text if l.sort else None) for l in layouts}) > 1:
        raise errors.BadInput(f"query: the layouts this phase reads ({', '.join(routing.reads)}) have different "
                              "sort templates, so their items cannot be merged in sort-key order")
    if condition is not None and sort_attr is None:
        raise errors.BadInput("query: SortKeyCondition given but the table has no sort key")
    values = to_wire(dict(key)) if key else {}
    fields = {k: scalar(v) for k, v in values.items()}
    state = _decode(token) if token else {"p": {}, "last": None}

    partitions: dict[str, _Partition] = {}
    for layout in layouts:
        for pk in _partition_keys(layout, fields):
            name = _pk_name(pk)
            p = partitions.get(name)
            if p is None:
                position = state["p"].get(name) if name in state["p"] else (None if token else 0)
                if position is not None and position not in (0, 1):
                    position = _sort_from_json(position)
                p = partitions[name] = _Partition(pk, [], position)
            p.layouts.append(layout)
    last = state.get("last")
    last_pos = (_sort_from_json(last[0]), tuple(last[1])) if last else None

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
                # returned. A partition whose saved position lags ``last`` (or one new to
                # this phase) may hold items that landed meanwhile (a backfill copy): they
                # were returned through the other layout, or belong before this page.
                continue
            entries.append(((sv, ident), item))
        p.buf.extend(entries)

    # First pages of all partitions at once: a query's latency is one round trip, not N.
    src.run_all(fetch, [p for p in partitions.values() if not p.done])

    out: list[dict] = []
    last_emitted = last_pos
    while limit is None or len(out) < limit:
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
            p.after = sv
            p.started = True
            copies.append((item, p.layouts))
        winner = newest(c[0] for c in copies)
        its_layouts = next(ls for it, ls in copies if it is winner)
        last_emitted = best
        if not is_tombstone(winner):
            out.append(src.to_app(winner, its_layouts[0]))

    more = any(p.buf or not p.done for p in partitions.values())
    # ScannedCount: the logical items evaluated (copies and tombstones are not items of the app).
    resp: dict[str, Any] = {"Items": out, "Count": len(out), "ScannedCount": len(out)}
    if more:
        resp["LastEvaluatedKey"] = _encode(partitions, last_emitted)
    return resp


def _pk_name(pk: Mapping[str, Any]) -> str:
    (av,) = pk.values()
    return av["S"] if "S" in av else json.dumps(_jsonable(av), sort_keys=True)


def _partition_keys(layout, fields: Mapping[str, Any]) -> list[dict]:
    """Every physical partition key value of ``layout`` under the query's key fields."""
    if SHARD not in layout.partition.fields:
        raise errors.BadInput(f"query: the {layout.side} partition template {layout.partition.text!r} has no "
                              "{shard}; only layouts sharded in the partition key can be queried")
    allowed = set(layout.partition.fields) | set(layout.shard_by or ()) | {d.source for d in layout.derived.values()}
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


def _sort_to_json(v: Any) -> Any:
    if isinstance(v, Decimal):
        return {"N": str(v)}
    if isinstance(v, (bytes, bytearray)):
        return {"B": base64.b64encode(bytes(v)).decode()}
    return {"S": v}


def _sort_from_json(j: Any) -> Any:
    if j is None:
        return None
    (t, v), = j.items()
    if t == "N":
        return Decimal(v)
    if t == "B":
        return base64.b64decode(v)
    return v


def _sort_to_av(v: Any) -> dict:
    if isinstance(v, Decimal):
        return {"N": str(v)}
    if isinstance(v, (bytes, bytearray)):
        return {"B": bytes(v)}
    return {"S": v}


def _encode(partitions: Mapping[str, _Partition], last: tuple | None) -> str:
    p = {}
    for name, part in partitions.items():
        if part.done and not part.buf:
            p[name] = 1
        elif part.after is not None:
            p[name] = _sort_to_json(part.after)
        else:
            p[name] = 0
    doc = {"v": 1, "p": p, "last": [_sort_to_json(last[0]), list(last[1])] if last else None}
    return base64.urlsafe_b64encode(zlib.compress(json.dumps(doc, separators=(",", ":")).encode())).decode()


def _decode(token: str) -> dict:
    try:
        doc = json.loads(zlib.decompress(base64.urlsafe_b64decode(token.encode())))
        if doc.get("v") != 1 or not isinstance(doc.get("p"), dict):
            raise ValueError("unknown token version")
        return doc
    except (ValueError, TypeError, AttributeError, zlib.error) as e:
        raise errors.BadInput(f"ExclusiveStartKey is not a token returned by ShardedTable.query ({e})") from None
