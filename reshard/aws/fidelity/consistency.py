"""Eventually consistent reads: a read that does not ask for ``ConsistentRead`` may see the past.

DynamoDB keeps three copies of every partition; a write is acknowledged once two have it and
an eventually consistent read is served by any one of the three, so it "might not reflect the
results of a recently completed write" (DynamoDB developer guide, read consistency); global
secondary indexes are updated asynchronously and are always eventually consistent. dynalite
answers every read from the latest state.

What the proxy does (``stale_reads`` on):

* every write it forwards records the item's state *before* it (PutItem/DeleteItem/UpdateItem
  get ``ReturnValues=ALL_OLD`` added when they asked for nothing or ALL_OLD themselves, the
  added ``Attributes`` taken out of the answer again; other ReturnValues and BatchWriteItem
  read the old state first with a consistent GetItem/BatchGetItem), kept for ``stale_window``
  seconds: a short history per key;
* a non-consistent read picks, with ``stale_probability``, a moment ``t`` up to
  ``stale_window`` seconds ago (a GSI read always, up to ``gsi_lag`` seconds ago) and shows
  every item as it was at ``t``: a changed item's older state, a deleted item back (in a Scan
  or Query page where dynalite would have listed it: ``ordering``), a new item not yet there.
  Key conditions, filters, projections, ``Limit`` and ``LastEvaluatedKey`` are applied to what
  the past state shows, with reshard's own expression evaluator (``core/expressions``).

Not emulated: a read served by a replica that is behind for one partition and not another
within one page (one ``t`` per request); legacy ``ScanFilter``/``QueryFilter``/``KeyConditions``
requests (left as dynalite answered them); writes that bypass the proxy (no history).
"""

from __future__ import annotations

import bisect
import threading

from reshard.aws.fidelity import ordering
from reshard.aws.fidelity.tables import IndexInfo, TableInfo
from reshard.core import expressions as ex

READS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan"})
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"})


class History:
    """Per table and key, the states an item had before each recent write: [(t, old state or None)]."""

    def __init__(self):
        self.lock = threading.Lock()
        self.tables: dict[str, dict[tuple, list]] = {}
        self._pruned = 0.0

    def record(self, table: str, key: tuple, t: float, old: dict | None) -> None:
        with self.lock:
            entries = self.tables.setdefault(table, {}).setdefault(key, [])
            if not entries or entries[-1][0] <= t:
                entries.append((t, old))
            else:  # answers of concurrent writes arrive out of order
                bisect.insort(entries, (t, old), key=lambda e: e[0])

    def state_at(self, table: str, key: tuple, t: float) -> tuple[bool, dict | None]:
        """(True, the state at ``t``) when the key changed after ``t``; (False, None) when it did not."""
        with self.lock:
            entries = self.tables.get(table, {}).get(key)
            if not entries:
                return False, None
            i = bisect.bisect_right(entries, t, key=lambda e: e[0])
            if i == len(entries):
                return False, None
            return True, entries[i][1]

    def changed_since(self, table: str, t: float) -> dict[tuple, dict | None]:
        """Every key of ``table`` that changed after ``t``, with its state at ``t``."""
        out = {}
        with self.lock:
            for key, entries in self.tables.get(table, {}).items():
                if entries[-1][0] > t:
                    i = bisect.bisect_right(entries, t, key=lambda e: e[0])
                    out[key] = entries[i][1]
        return out

    def prune(self, before: float) -> None:
        with self.lock:
            for table in list(self.tables):
                keys = self.tables[table]
                for key in list(keys):
                    entries = keys[key]
                    if entries[-1][0] < before:
                        del keys[key]
                    elif entries[0][0] < before:
                        keys[key] = [e for e in entries if e[0] >= before]
                if not keys:
                    del self.tables[table]

    def size(self) -> int:
        with self.lock:
            return sum(len(k) for k in self.tables.values())


class StaleReads:
    """The switch ``stale_reads`` and its settings; see the module docstring."""

    DEFAULTS = {"stale_reads": False, "stale_window": 1.0, "stale_probability": 0.5, "gsi_lag": 1.0,
                "stale_inserts": True}

    def __init__(self, behaviours):
        self.b = behaviours
        self.history = History()
        self.counts = {"stale_reads": 0, "stale_items": 0}

    @property
    def on(self) -> bool:
        return self.b.config["stale_reads"]

    def _horizon(self) -> float:
        return max(self.b.config["stale_window"], self.b.config["gsi_lag"])

    # ------------------------------------------------------------------ writes
    def prepare(self, req, infos) -> tuple:
        """The request to forward (ReturnValues=ALL_OLD added where that is free) and what the
        answer needs to record the old states."""
        body = req.json
        if req.op == "BatchWriteItem":
            keys = {}
            for table, entries in (body.get("RequestItems") or {}).items():
                info = infos(table)
                if info is None:
                    continue
                for e in entries:
                    item = (e.get("PutRequest") or {}).get("Item") or (e.get("DeleteRequest") or {}).get("Key")
                    if item is not None:
                        keys.setdefault(table, []).append(info.key_item(item))
            return req, ("olds", self.b.read_current(keys))
        info = infos(body.get("TableName"))
        if info is None:
            return req, None
        key = body.get("Key") if req.op != "PutItem" else {a: body["Item"][a] for a in info.key if a in body["Item"]}
        rv = body.get("ReturnValues", "NONE")
        if rv in ("NONE", "ALL_OLD"):
            return req.with_body(dict(body, ReturnValues="ALL_OLD")), ("returned", rv == "NONE")
        olds = self.b.read_current({info.name: [key]})
        return req, ("olds", olds)

    def record(self, req, answer, ctx, infos) -> object:
        """After a successful write: its keys' old states into the history; the answer as the client asked."""
        if ctx is None:
            return answer
        now = self.b.monotonic()
        body = req.json
        kind, data = ctx
        if req.op == "BatchWriteItem":
            unprocessed = answer.json.get("UnprocessedItems") or {}
            for table, entries in (body.get("RequestItems") or {}).items():
                info = infos(table)
                if info is None:
                    continue
                left = {info.key_of(_entry_item(e)) for e in unprocessed.get(table, ())}
                for e in entries:
                    key = info.key_of(_entry_item(e))
                    if key is not None and key not in left:
                        self.history.record(table, key, now, data.get((table, key)))
        else:
            info = infos(body.get("TableName"))
            item = body.get("Key") or body.get("Item") or {}
            key = info.key_of(item)
            if kind == "returned":
                old = answer.json.get("Attributes")
                if data:  # the client asked for nothing: the added Attributes go
                    out = dict(answer.json)
                    out.pop("Attributes", None)
                    answer = answer.with_json(out)
            else:
                old = data.get((info.name, key))
            self.history.record(info.name, key, now, old)
        if now - self.history._pruned > 0.5:
            self.history._pruned = now
            self.history.prune(now - self._horizon() - 1.0)
        return answer

    # ------------------------------------------------------------------ reads
    def _moment(self, gsi: bool) -> float | None:
        """The past moment this read is served as of, or None (up to date)."""
        cfg = self.b.config
        with self.b.lock:
            if gsi:
                lag = self.b.rng.uniform(0, cfg["gsi_lag"])
            elif self.b.rng.random() < cfg["stale_probability"]:
                lag = self.b.rng.uniform(0, cfg["stale_window"])
            else:
                return None
        return self.b.monotonic() - lag

    def rewrite(self, req, answer, infos):
        body = req.json
        if req.op == "GetItem":
            return self._get(body, answer, infos(body.get("TableName")))
        if req.op == "BatchGetItem":
            return self._batch_get(body, answer, infos)
        info = infos(body.get("TableName"))
        if info is None:
            return answer
        return _Page(self, req, answer, info).rewrite()

    def _get(self, body: dict, answer, info: TableInfo | None):
        if info is None or body.get("ConsistentRead"):
            return answer
        t = self._moment(False)
        if t is None:
            return answer
        found, state = self.history.state_at(info.name, info.key_of(body.get("Key") or {}), t)
        if not found:
            return answer
        self._count(1)
        out = dict(answer.json)
        if state is None:
            out.pop("Item", None)
        else:
            out["Item"] = _project(state, body, None, info)
        return answer.with_json(out)

    def _batch_get(self, body: dict, answer, infos):
        out = dict(answer.json)
        responses = {t: list(v) for t, v in (out.get("Responses") or {}).items()}
        unprocessed = out.get("UnprocessedKeys") or {}
        changed = 0
        for table, spec in (body.get("RequestItems") or {}).items():
            info = infos(table)
            if info is None or spec.get("ConsistentRead"):
                continue
            t = self._moment(False)
            if t is None:
                continue
            left = {info.key_of(k) for k in (unprocessed.get(table) or {}).get("Keys", ())}
            got = {info.key_of(it): it for it in responses.get(table, ())}
            for k in spec.get("Keys") or ():
                key = info.key_of(k)
                if key in left:
                    continue
                found, state = self.history.state_at(table, key, t)
                if not found:
                    continue
                changed += 1
                if state is None:
                    got.pop(key, None)
                else:
                    got[key] = _project(state, spec, None, info)
            responses[table] = list(got.values())
        if not changed:
            return answer
        self._count(changed)
        out["Responses"] = responses
        return answer.with_json(out)

    def _count(self, items: int) -> None:
        with self.b.lock:
            self.counts["stale_reads"] += 1
            self.counts["stale_items"] += items


def _entry_item(e: dict) -> dict:
    return (e.get("PutRequest") or {}).get("Item") or (e.get("DeleteRequest") or {}).get("Key") or {}


def _project(state: dict, spec: dict, index: IndexInfo | None, info: TableInfo) -> dict:
    """``state`` as the request would have been shown it (ProjectionExpression, AttributesToGet,
    an index's projection)."""
    if spec.get("ProjectionExpression"):
        ctx = ex.Context(spec.get("ExpressionAttributeNames"), spec.get("ExpressionAttributeValues"))
        return ex.project(state, ex.parse_projection(spec["ProjectionExpression"], ctx))
    if spec.get("AttributesToGet"):
        return {a: state[a] for a in spec["AttributesToGet"] if a in state}
    if index is not None and spec.get("Select") != "ALL_ATTRIBUTES":
        return index.project(state, info.key)
    return state


_LEGACY = ("ScanFilter", "QueryFilter", "KeyConditions", "Expected")


class _Page:
    """One Scan or Query answer shown as of a past moment (see the module docstring)."""

    def __init__(self, stale: StaleReads, req, answer, info: TableInfo):
        self.stale, self.req, self.answer, self.info = stale, req, answer, info
        self.body = req.json
        self.index = info.indexes.get(self.body.get("IndexName")) if self.body.get("IndexName") else None

    def rewrite(self):
        body, index = self.body, self.index
        gsi = index is not None and index.is_global
        if (body.get("ConsistentRead") and not gsi) or body.get("Select") == "COUNT" or any(k in body for k in _LEGACY):
            return self.answer
        t = self.stale._moment(gsi)
        if t is None:
            return self.answer
        changes = self.stale.history.changed_since(self.info.name, t)
        if not changes:
            return self.answer
        ctx = ex.Context(body.get("ExpressionAttributeNames"), body.get("ExpressionAttributeValues"))
        self.filter = ex.parse_condition(body["FilterExpression"], ctx, "FilterExpression") \
            if body.get("FilterExpression") else None
        self.keycond = ex.parse_condition(body["KeyConditionExpression"], ctx, "KeyConditionExpression") \
            if self.req.op == "Query" and body.get("KeyConditionExpression") else None
        out = dict(self.answer.json)
        items = out.get("Items") or []
        seen, shown, changed = set(), [], 0
        for it in items:
            key = self.info.key_of(it)
            seen.add(key)
            if key in changes:
                changed += 1
                state = changes[key]
                if self.visible(state):
                    shown.append((state, _project(self.stored(state), body, index, self.info)))
            else:
                shown.append((None, it))
        inserted = self.inserts(changes, seen) if self.can_insert(items) else []
        changed += len(inserted)
        if not changed:
            return self.answer
        if inserted:
            forward = body.get("ScanIndexForward", True) is not False
            keyed = [(self.order(full or it), full or it, it) for full, it in shown]
            keyed += [(self.order(st), st, _project(self.stored(st), body, index, self.info)) for st in inserted]
            keyed.sort(key=lambda p: p[0], reverse=not forward)
            limit = body.get("Limit")
            if limit and len(keyed) > limit:
                keyed = keyed[:limit]
                # The page now ends earlier: its LastEvaluatedKey is the last item it shows.
                out["LastEvaluatedKey"] = self.last_key(keyed[-1][1])
            result = [it for _, _, it in keyed]
        else:
            result = [it for _, it in shown]
        self.stale._count(changed)
        out["Items"] = result
        out["Count"] = len(result)
        out["ScannedCount"] = max(len(result), out.get("ScannedCount", 0) + len(result) - len(items))
        return self.answer.with_json(out)

    def stored(self, state: dict) -> dict:
        return self.index.project(state, self.info.key) if self.index is not None else state

    def visible(self, state: dict | None) -> bool:
        """Would the read have shown this past state at all?"""
        if state is None:
            return False
        if self.index is not None and any(a not in state for a in self.index.key):
            return False  # a sparse index has no entry for it
        if self.keycond is not None and not ex.evaluate(self.keycond, state):
            return False
        if self.filter is not None and not ex.evaluate(self.filter, state):
            return False
        return True

    def can_insert(self, items: list) -> bool:
        """Whether a past item can be put where dynalite would have listed it (its order is known
        and the page's bounds say what it covers)."""
        body = self.body
        if not self.stale.b.config["stale_inserts"] or (body.get("Limit") and self.filter is not None):
            return False
        if body.get("ProjectionExpression") or body.get("AttributesToGet"):
            return False  # the page's items may lack the keys that order them
        if self.req.op == "Query" and self.keycond is None:
            return False
        return True

    def order(self, item: dict) -> str:
        if self.index is not None:
            return ordering.create_index_key(item, list(self.info.key), list(self.index.key))
        return ordering.create_key(item, list(self.info.key))

    def last_key(self, item: dict) -> dict:
        names = list(self.info.key) + [a for a in (self.index.key if self.index else ()) if a not in self.info.key]
        return {a: item[a] for a in names}

    def inserts(self, changes: dict, seen: set) -> list:
        body, out = self.body, []
        forward = body.get("ScanIndexForward", True) is not False
        start = body.get("ExclusiveStartKey")
        last = self.answer.json.get("LastEvaluatedKey")
        low = high = None
        if self.req.op == "Scan":
            low, high = ordering.segment_bounds(body.get("Segment", 0), body.get("TotalSegments", 1))
        start_key = self.order(start) if start else None
        last_key = self.order(last) if last else None
        for key, state in changes.items():
            if key in seen or not self.visible(state):
                continue
            k = self.order(state)
            if forward:
                if (start_key is not None and k <= start_key) or (start_key is None and low is not None and k <= low):
                    continue
                if (last_key is not None and k > last_key) or (last_key is None and high is not None and k >= high):
                    continue
            else:
                if (start_key is not None and k >= start_key) or (last_key is not None and k < last_key):
                    continue
            out.append(state)
        return out

