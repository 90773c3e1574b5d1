"""DynamoDB's behaviours that dynalite lacks, between the signature check and upstream, each on its own switch.

* ``stale_reads`` (consistency.py): non-consistent reads and GSI reads see recent past states;
* ``partition_throughput`` (throughput.py): a token bucket per partition key value
  (``partition_wcu`` 1,000 / ``partition_rcu`` 3,000 per second), throttles with
  ``ThrottlingReasons``; batch items refused come back unprocessed; ``unprocessed_rate``
  leaves batch items unprocessed at random;
* ``ttl`` (ttl.py): UpdateTimeToLive / DescribeTimeToLive, and expired items deleted
  ``ttl_delay`` seconds after they expire (visible until then).

Page caps need no switch: dynalite already ends a Scan or Query page after 1 MB of items
(its own size measure, before any filter, as DynamoDB does) and answers BatchGetItem with
UnprocessedKeys past about 1 MB of items -- stricter than DynamoDB's 16 MB, so the client
paths that handle a cap are exercised (tests/integration/test_fidelity_behaviours.py).

With every switch off a request goes straight upstream: the proxy parses no body.
"""

from __future__ import annotations

from reshard.aws.fidelity import wire
from reshard.aws.fidelity.consistency import READS, WRITES, StaleReads
from reshard.aws.fidelity.tables import Tables
from reshard.aws.fidelity.throughput import Partitions, Refused
from reshard.aws.fidelity.ttl import TimeToLive

DATA_OPS = READS | WRITES
TABLE_CHANGES = frozenset({"CreateTable", "DeleteTable", "UpdateTable"})
TTL_OPS = frozenset({"UpdateTimeToLive", "DescribeTimeToLive"})
_TYPES = {bool: (bool,), float: (int, float), str: (str,), list: (list, tuple)}


class Behaviours:
    """The three behaviours and what they share (the settings, the table cache, the lock and rng)."""

    def __init__(self, proxy):
        self.proxy = proxy
        self.lock = proxy.lock
        self.rng = proxy.rng
        self.monotonic = proxy.monotonic
        self.config = {**StaleReads.DEFAULTS, **Partitions.DEFAULTS, **TimeToLive.DEFAULTS}
        self.tables = Tables(self._describe)
        self.stale = StaleReads(self)
        self.partitions = Partitions(self, proxy.monotonic)
        self.ttl = TimeToLive(self)

    # ------------------------------------------------------------------ settings, life
    def defaults(self) -> dict:
        return {**StaleReads.DEFAULTS, **Partitions.DEFAULTS, **TimeToLive.DEFAULTS}

    def configure(self, settings: dict) -> None:
        defaults = self.defaults()
        for k, v in settings.items():
            kind = type(defaults[k])
            if not isinstance(v, _TYPES[kind]) or (kind is not bool and isinstance(v, bool)):
                raise ValueError(f"setting {k} takes a {kind.__name__}, not {v!r}")
            if kind is list and not all(isinstance(x, str) for x in v):
                raise ValueError(f"setting {k} takes a list of table names, not {v!r}")
            if kind is float and v < 0:
                raise ValueError(f"setting {k} cannot be negative ({v!r})")
            if k == "throttle_error":
                self.partitions.check(v)
        self.config.update({k: (float(v) if type(defaults[k]) is float else list(v) if type(defaults[k]) is list
                                else v) for k, v in settings.items()})
        if any(k.startswith("partition_") and k != "partition_tables" for k in settings):
            self.partitions.buckets.clear()  # new rates: every partition starts full again
        if settings.get("ttl"):
            self.ttl._wake.set()

    def settings(self) -> dict:
        return dict(self.config)

    def stats(self) -> dict:
        with self.lock:
            out = dict(self.stale.counts, stale_history_keys=self.stale.history.size())
        out.update(self.partitions.stats())
        out.update(self.ttl.stats())
        return out

    def start(self) -> None:
        self.ttl.start()

    def stop(self) -> None:
        self.ttl.stop()

    # ------------------------------------------------------------------ upstream helpers
    def _describe(self, name: str) -> dict | None:
        answer = self.proxy.upstream_call("DescribeTable", {"TableName": name})
        return answer.json.get("Table") if answer.status == 200 else None

    def read_current(self, keys: dict[str, list[dict]]) -> dict:
        """The items at ``keys`` (by table) now, read consistently upstream: {(table, key): item}."""
        out: dict = {}
        pending = []
        for table, ks in keys.items():
            info = self.tables.get(table)
            seen = {}
            for k in ks:
                seen.setdefault(info.key_of(k), k)
            pending += [(table, k) for k in seen.values()]
        for start in range(0, len(pending), 100):
            chunk: dict = {}
            for table, k in pending[start:start + 100]:
                chunk.setdefault(table, {"Keys": [], "ConsistentRead": True})["Keys"].append(k)
            while chunk:
                answer = self.proxy.upstream_call("BatchGetItem", {"RequestItems": chunk})
                if answer.status != 200:
                    raise RuntimeError(f"reading the old states failed: {answer.code}")
                body = answer.json
                for table, items in (body.get("Responses") or {}).items():
                    info = self.tables.get(table)
                    for item in items:
                        out[(table, info.key_of(item))] = item
                chunk = body.get("UnprocessedKeys") or {}
        return out

    # ------------------------------------------------------------------ one delivery
    def deliver(self, req) -> wire.Answer:
        op = req.op
        if op in TABLE_CHANGES:
            answer = self.proxy.forward(req)
            name = req.json.get("TableName")
            self.tables.forget(name)
            if op == "DeleteTable":
                with self.lock:
                    self.ttl.specs.pop(name, None)
            return answer
        cfg = self.config
        if not (cfg["stale_reads"] or cfg["partition_throughput"] or cfg["unprocessed_rate"] or cfg["ttl"]):
            return self.proxy.forward(req)
        if op in TTL_OPS:
            return self.ttl.answer(req) if cfg["ttl"] else self.proxy.forward(req)
        if op not in DATA_OPS:
            return self.proxy.forward(req)
        infos = self.tables.get
        try:
            forwarded, left = self.partitions.admit(req, infos)
        except Refused as refused:
            return refused.answer
        if forwarded is None:  # every item of the batch unprocessed
            body = {"UnprocessedItems": left} if op == "BatchWriteItem" else {"Responses": {}, "UnprocessedKeys": left}
            return wire.json_answer(body)
        ctx = None
        if cfg["stale_reads"] and op in WRITES:
            forwarded, ctx = self.stale.prepare(forwarded, infos)
        answer = self.proxy.forward(forwarded)
        if answer.status != 200:
            return answer  # (a failed condition still used its write units, as in DynamoDB)
        if ctx is not None:
            answer = self.stale.record(forwarded, answer, ctx, infos)
        if cfg["stale_reads"] and op in READS:
            answer = self.stale.rewrite(forwarded, answer, infos)
        self.partitions.charge(forwarded, answer, infos)
        if left:
            answer = _merge_unprocessed(answer, left, op)
        return answer


def _merge_unprocessed(answer: wire.Answer, left: dict, op: str) -> wire.Answer:
    body = dict(answer.json)
    if op == "BatchWriteItem":
        merged = {t: list(v) for t, v in (body.get("UnprocessedItems") or {}).items()}
        for table, entries in left.items():
            merged.setdefault(table, []).extend(entries)
        body["UnprocessedItems"] = merged
    else:
        merged = {t: dict(v) for t, v in (body.get("UnprocessedKeys") or {}).items()}
        for table, spec in left.items():
            if table in merged:
                merged[table]["Keys"] = list(merged[table]["Keys"]) + spec["Keys"]
            else:
                merged[table] = spec
        body["UnprocessedKeys"] = merged
    return answer.with_json(body)
