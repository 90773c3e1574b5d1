"""Per-partition throughput: a token bucket per partition key value, and unprocessed batch items under load.

DynamoDB serves each partition at most 3,000 RCU and 1,000 WCU per second, in on-demand and
provisioned mode alike; past that it throttles with the reason ``KeyRangeThroughputExceeded``
(``TableWriteKeyRangeThroughputExceeded``, ``IndexReadKeyRangeThroughputExceeded``, ...; the
DynamoDB API reference, ThrottlingReason; "Key range throughput exceeded (hot partitions)"
in the developer guide). One partition key value never spans partitions, so one value can
take no more than that whatever the table's capacity.

The burst: DynamoDB "retains up to 5 minutes (300 seconds) of unused read and write capacity"
for a *table* in provisioned mode, but "burst capacity can't alleviate partition-level
throttling ... if a resulting hot partition exceeds the per partition limits of 3,000 RCU or
1,000 WCU per second ... your table throttles" (AWS re:Post knowledge center, "How does
DynamoDB handle spiky workloads in short intervals"). So the partition limit is a hard limit
per second: each bucket holds ``partition_burst_seconds`` (default 1) seconds of its rate, not
300. A request is admitted when its key's bucket holds its estimated units (or the bucket is
full, for an item bigger than one second's worth) and charged what it used once answered;
a bucket in debt refuses until it refills.

Batch calls: each item or key is admitted on its own; those refused come back as
``UnprocessedItems`` / ``UnprocessedKeys`` (the rest is forwarded), and when none of a call's
items is admitted, the call is throttled as a whole, as DynamoDB documents for BatchWriteItem.
``unprocessed_rate`` also leaves that fraction of batch items unprocessed at random (a busy
table), whether or not buckets are on.
"""

from __future__ import annotations

import math
import time

from reshard.aws.fidelity import wire
from reshard.aws.fidelity.tables import TableInfo
from reshard.core.capacity import TokenBucket, read_units, write_units
from reshard.core.expressions import Context, parse_condition
from reshard.core.layout import item_size

#: DynamoDB's messages for the two throttling errors (as users quote them).
PROVISIONED_MESSAGE = ("The level of configured provisioned throughput for the table was exceeded. "
                       "Consider increasing your provisioning level with the UpdateTable API.")
ON_DEMAND_MESSAGE = ("Throughput exceeds the current capacity of your table or index. DynamoDB is automatically "
                     "scaling your table or index so please try again shortly. If exceptions persist, check if you "
                     "have a hot key: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/"
                     "bp-partition-key-design.html")
THROTTLE_ERRORS = ("ProvisionedThroughputExceededException", "ThrottlingException")


class Refused(Exception):
    """A request (or every item of a batch) the buckets refuse: the throttle answer."""

    def __init__(self, answer):
        self.answer = answer


class Partitions:
    DEFAULTS = {"partition_throughput": False, "partition_wcu": 1000.0, "partition_rcu": 3000.0,
                "partition_burst_seconds": 1.0, "throttle_error": "ProvisionedThroughputExceededException",
                "unprocessed_rate": 0.0, "partition_tables": []}

    def __init__(self, behaviours, clock=time.monotonic):
        self.b = behaviours
        self.clock = clock
        self.buckets: dict[tuple, TokenBucket] = {}
        self._admitted = 0
        self.counts = {"partition_throttles": 0, "unprocessed_items": 0, "throttle_reasons": {}}
        #: (table, index, key, second) of every throttle: how long keys spent over their limit.
        self._throttled_seconds: set = set()

    @property
    def on(self) -> bool:
        return self.b.config["partition_throughput"]

    def limited(self, table: str) -> bool:
        """``partition_tables`` (empty: every table) names the tables whose partitions are limited:
        a test that scales the limit down to what a local server reaches scales it for the data
        table, not for the control table."""
        tables = self.b.config["partition_tables"]
        return not tables or table in tables

    def check(self, value) -> None:
        if value not in THROTTLE_ERRORS:
            raise ValueError(f"throttle_error must be one of {', '.join(THROTTLE_ERRORS)}, not {value!r}")

    # ------------------------------------------------------------------ buckets
    def _bucket(self, table: str, index: str, hash_value, kind: str) -> TokenBucket:
        key = (table, index, hash_value, kind)
        bucket = self.buckets.get(key)
        if bucket is None:
            cfg = self.b.config
            rate = cfg["partition_wcu"] if kind == "write" else cfg["partition_rcu"]
            bucket = TokenBucket(rate, self.clock, burst_seconds=cfg["partition_burst_seconds"])
            bucket.tokens = rate * cfg["partition_burst_seconds"]  # an idle partition starts full
            self.buckets[key] = bucket
        return bucket

    def _take(self, table: str, index: str, hash_value, kind: str, units: float) -> bool:
        with self.b.lock:
            ok = self._bucket(table, index, hash_value, kind).try_take(units)
            self._admitted += 1
            if self._admitted % 2000 == 0:
                self._forget_idle()
        return ok

    def _charge(self, table: str, index: str, hash_value, kind: str, units: float) -> None:
        if units:
            with self.b.lock:
                self._bucket(table, index, hash_value, kind).adjust(units)

    def _forget_idle(self) -> None:
        """Buckets untouched for longer than they take to refill are full: forgotten (memory)."""
        now = self.clock()
        horizon = self.b.config["partition_burst_seconds"] + 1.0
        for key in [k for k, b in self.buckets.items() if now - b.last > horizon and b.tokens >= 0]:
            del self.buckets[key]

    def _throttle(self, info: TableInfo, kind: str, index: str = "", value=None):
        reason = f"{'Index' if index else 'Table'}{'Write' if kind == 'write' else 'Read'}KeyRangeThroughputExceeded"
        resource = info.arn + (f"/index/{index}" if index else "")
        code = self.b.config["throttle_error"]
        with self.b.lock:
            self.counts["partition_throttles"] += 1
            if len(self._throttled_seconds) < 1_000_000:
                self._throttled_seconds.add((info.name, index, value, kind, int(self.clock())))
            self.counts["throttle_reasons"][reason] = self.counts["throttle_reasons"].get(reason, 0) + 1
        reasons = [{"reason": reason, "resource": resource}]
        if code == "ThrottlingException":  # its member is lower-case in DynamoDB's model
            return wire.aws_error(400, wire.DYNAMODB_ERROR + code, ON_DEMAND_MESSAGE, throttlingReasons=reasons)
        return wire.aws_error(400, wire.DYNAMODB_ERROR + code, PROVISIONED_MESSAGE, ThrottlingReasons=reasons)

    # ------------------------------------------------------------------ admission
    def _write_targets(self, info: TableInfo, item: dict, units: float):
        """(index, hash value) of every partition a write of ``item`` writes: the table's, and each
        GSI whose key the item carries (an index write is charged the same units)."""
        yield "", _hash(info.key[0], item)
        for ix in info.indexes.values():
            if ix.is_global and all(a in item for a in ix.key):
                yield ix.name, _hash(ix.key[0], item)

    def _admit_write(self, info: TableInfo, item: dict, units: float) -> tuple | None:
        """None when admitted (every partition charged), else (index ("" the table), key value) that refused."""
        taken = []
        for index, value in self._write_targets(info, item, units):
            if value is None:
                continue
            if not self._take(info.name, index, value, "write", units):
                for t in taken:  # not written after all: nothing charged
                    self._charge(info.name, t[0], t[1], "write", -units)
                return index, value
            taken.append((index, value))
        return None

    def admit(self, req, infos):
        """The request to forward (a batch without its refused items) and the refused items/keys
        by table; Refused when the request (or every item of a batch) is throttled."""
        op, body = req.op, req.json
        cfg = self.b.config
        if op in ("PutItem", "UpdateItem", "DeleteItem") and self.on:
            info = infos(body.get("TableName"))
            if info is not None and self.limited(info.name):
                item = body.get("Item") if op == "PutItem" else body.get("Key") or {}
                units = write_units(item_size(item)) if op == "PutItem" else 1
                refused = self._admit_write(info, item, units)
                if refused is not None:
                    raise Refused(self._throttle(info, "write", *refused))
            return req, None
        if op in ("GetItem", "Query") and self.on:
            info = infos(body.get("TableName"))
            if info is not None and self.limited(info.name):
                index, value = self._read_partition(info, body)
                units = 1.0 if body.get("ConsistentRead") else 0.5
                if value is not None and not self._take(info.name, index, value, "read", units):
                    raise Refused(self._throttle(info, "read", index, value))
            return req, None
        if op == "BatchWriteItem" and (self.on or cfg["unprocessed_rate"]):
            return self._batch(req, infos, "write")
        if op == "BatchGetItem" and (self.on or cfg["unprocessed_rate"]):
            return self._batch(req, infos, "read")
        return req, None

    def _read_partition(self, info: TableInfo, body: dict):
        """(index, hash value) a GetItem or Query reads (Query: from its key condition)."""
        if "Key" in body:
            return "", _hash(info.key[0], body["Key"])
        index = body.get("IndexName") or ""
        hash_attr = info.indexes[index].key[0] if index in info.indexes else info.key[0]
        text = body.get("KeyConditionExpression")
        if not text:
            return index, None
        try:
            node = parse_condition(text, Context(body.get("ExpressionAttributeNames"),
                                                 body.get("ExpressionAttributeValues")), "KeyConditionExpression")
        except Exception:  # noqa: BLE001 - upstream refuses it with DynamoDB's message
            return index, None
        return index, _equality(node, hash_attr)

    def _batch(self, req, infos, kind: str):
        body = req.json
        cfg = self.b.config
        keep, left, throttled, total = {}, {}, False, 0
        for table, spec in (body.get("RequestItems") or {}).items():
            info = infos(table)
            entries = spec if kind == "write" else list(spec.get("Keys") or ())
            kept, refused = [], []
            for e in entries:
                total += 1
                with self.b.lock:
                    busy = cfg["unprocessed_rate"] and self.b.rng.random() < cfg["unprocessed_rate"]
                if busy:
                    refused.append(e)
                    continue
                if self.on and info is not None and self.limited(table):
                    if kind == "write":
                        item = (e.get("PutRequest") or {}).get("Item")
                        units = write_units(item_size(item)) if item is not None else 1
                        target = item if item is not None else (e.get("DeleteRequest") or {}).get("Key") or {}
                        if self._admit_write(info, target, units) is not None:
                            refused.append(e)
                            throttled = True
                            continue
                    else:
                        units = 1.0 if spec.get("ConsistentRead") else 0.5
                        if not self._take(table, "", _hash(info.key[0], e), "read", units):
                            refused.append(e)
                            throttled = True
                            continue
                kept.append(e)
            if kept:
                keep[table] = kept if kind == "write" else dict(spec, Keys=kept)
            if refused:
                left[table] = refused if kind == "write" else dict(spec, Keys=refused)
        if not left:
            return req, None
        n_left = sum(len(v if kind == "write" else v["Keys"]) for v in left.values())
        with self.b.lock:
            self.counts["unprocessed_items"] += n_left
        if not keep:
            if throttled:
                info = infos(next(iter(left)))
                raise Refused(self._throttle(info, kind) if info else wire.aws_error(
                    400, wire.DYNAMODB_ERROR + cfg["throttle_error"], PROVISIONED_MESSAGE))
            return None, left  # nothing to forward: every item unprocessed (a busy table)
        return req.with_body(dict(body, RequestItems=keep)), left

    # ------------------------------------------------------------------ after the answer
    def charge(self, req, answer, infos) -> None:
        """Reads are charged what they returned (a Scan: each item to its own partition)."""
        if not self.on or answer.status != 200:
            return
        op, body = req.op, req.json
        if body.get("TableName") and not self.limited(body["TableName"]):
            return
        if op == "GetItem":
            info = infos(body.get("TableName"))
            item = answer.json.get("Item")
            if info is not None and item:
                consistent = bool(body.get("ConsistentRead"))
                units = read_units(item_size(item), consistent) - (1.0 if consistent else 0.5)
                self._charge(info.name, "", _hash(info.key[0], item), "read", units)
        elif op in ("Query", "Scan"):
            info = infos(body.get("TableName"))
            if info is None:
                return
            index = body.get("IndexName") or ""
            hash_attr = info.indexes[index].key[0] if index in info.indexes else info.key[0]
            sizes: dict = {}
            for item in answer.json.get("Items") or ():
                v = _hash(hash_attr, item)
                sizes[v] = sizes.get(v, 0) + item_size(item)
            consistent = bool(body.get("ConsistentRead"))
            admitted = 0.0
            if op == "Query":
                admitted = 1.0 if consistent else 0.5
            for v, size in sizes.items():
                units = math.ceil(size / 4096) * (1.0 if consistent else 0.5)
                self._charge(info.name, index, v, "read", units - admitted)
                admitted = 0.0

    def stats(self) -> dict:
        with self.b.lock:
            return {"partition_throttles": self.counts["partition_throttles"],
                    "unprocessed_items": self.counts["unprocessed_items"],
                    "throttle_reasons": dict(self.counts["throttle_reasons"]),
                    "throttled_key_seconds": len(self._throttled_seconds),
                    "partition_buckets": len(self.buckets)}


def _hash(attr: str, item: dict):
    v = item.get(attr)
    return next(iter(v.items())) if isinstance(v, dict) and v else None


def _equality(node, attr: str):
    """The value a key condition fixes ``attr`` to (``attr = :v``, possibly ANDed), or None."""
    if node[0] == "and":
        return _equality(node[1], attr) or _equality(node[2], attr)
    if node[0] == "cmp" and node[1] == "=":
        a, b = node[2], node[3]
        if a[0] == "value":
            a, b = b, a
        if a == ("path", (attr,)) and b[0] == "value":
            return next(iter(b[1].items()))
    return None
