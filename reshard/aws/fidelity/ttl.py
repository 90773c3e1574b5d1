"""Time to live: UpdateTimeToLive / DescribeTimeToLive, and expired items deleted late, as DynamoDB does.

dynalite has no TTL (DescribeTimeToLive always says DISABLED, UpdateTimeToLive is an unknown
operation). DynamoDB deletes an item whose TTL attribute (a Number, epoch seconds) is in the
past "typically within a few days" and, until then, "items that have expired, but haven't yet
been deleted by TTL, still appear in reads, queries, and scans"; an item whose expiry is more
than five years in the past is not deleted; an item updated to a later expiry (or without the
attribute) before the deletion stays. The proxy (``ttl`` on) answers the two TTL calls from its
own per-table setting and a sweeper thread deletes, every ``ttl_sweep_seconds``, the items whose
expiry is more than ``ttl_delay`` seconds behind the proxy's clock (plus ``ttl_time_offset``,
which lets a test pass days of ``retain_hours`` for TTL alone): a conditional DeleteItem
(the attribute still holds the expired value), the way the service's own deletes skip an item
updated meanwhile. A deleted item's last state goes into the stale-read history.
"""

from __future__ import annotations

import threading
from decimal import Decimal, InvalidOperation

from reshard.aws.fidelity import wire

FIVE_YEARS = 5 * 365 * 86400


class TimeToLive:
    DEFAULTS = {"ttl": False, "ttl_delay": 2.0, "ttl_sweep_seconds": 0.5, "ttl_time_offset": 0.0}

    def __init__(self, behaviours):
        self.b = behaviours
        self.specs: dict[str, str] = {}   # table -> TTL attribute, while enabled
        self.counts = {"ttl_deleted": 0, "ttl_sweeps": 0, "ttl_kept_updated": 0}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def on(self) -> bool:
        return self.b.config["ttl"]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fidelity-ttl", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._wake.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(5)

    # ------------------------------------------------------------------ the two calls
    def answer(self, req):
        body = req.json
        table = body.get("TableName")
        if self.b.tables.get(table) is None:
            return wire.aws_error(400, wire.DYNAMODB_ERROR + "ResourceNotFoundException",
                                  f"Requested resource not found: Table: {table} not found")
        if req.op == "DescribeTimeToLive":
            attr = self.specs.get(table)
            desc = {"TimeToLiveStatus": "ENABLED", "AttributeName": attr} if attr else {"TimeToLiveStatus": "DISABLED"}
            return wire.json_answer({"TimeToLiveDescription": desc})
        spec = body.get("TimeToLiveSpecification") or {}
        enabled, attr = spec.get("Enabled"), spec.get("AttributeName")
        if not isinstance(enabled, bool) or not attr:
            return wire.aws_error(400, wire.DYNAMODB_ERROR + "ValidationException",
                                  "1 validation error detected: TimeToLiveSpecification must have Enabled and "
                                  "AttributeName")
        with self.b.lock:
            current = self.specs.get(table)
            if enabled and current == attr:
                return wire.aws_error(400, wire.DYNAMODB_ERROR + "ValidationException", "TimeToLive is already enabled")
            if enabled and current:
                return wire.aws_error(400, wire.DYNAMODB_ERROR + "ValidationException",
                                      f"TimeToLive is active on a different AttributeName: current AttributeName "
                                      f"is {current}")
            if not enabled and not current:
                return wire.aws_error(400, wire.DYNAMODB_ERROR + "ValidationException",
                                      "TimeToLive is already disabled")
            if enabled:
                self.specs[table] = attr
            else:
                self.specs.pop(table, None)
        self._wake.set()
        return wire.json_answer({"TimeToLiveSpecification": {"Enabled": enabled, "AttributeName": attr}})

    # ------------------------------------------------------------------ the sweeper
    def _loop(self) -> None:
        while not self.b.proxy._stopped.is_set():
            self._wake.wait(self.b.config["ttl_sweep_seconds"])
            self._wake.clear()
            if self.b.proxy._stopped.is_set():
                return
            if self.on and self.specs:
                try:
                    self.sweep()
                except Exception:  # noqa: BLE001 - upstream restarting: the next sweep tries again
                    self.b.proxy.count("ttl_sweep_errors")

    def sweep(self) -> int:
        """One pass over every TTL table; returns how many items it deleted."""
        with self.b.lock:
            specs = dict(self.specs)
            self.counts["ttl_sweeps"] += 1
        deleted = 0
        # ttl_time_offset: time for TTL alone (days of retain_hours in a test), the signatures'
        # and Date's clock left where it is.
        now = self.b.proxy._now() + self.b.config["ttl_time_offset"]
        for table, attr in specs.items():
            info = self.b.tables.get(table)
            if info is None:
                continue
            start = None
            while True:
                req = {"TableName": table, "ConsistentRead": True}
                if start:
                    req["ExclusiveStartKey"] = start
                page = self.b.proxy.upstream_call("Scan", req)
                if page.status != 200:
                    break
                body = page.json
                for item in body.get("Items") or ():
                    if self._expired(item.get(attr), now) and self._delete(info, attr, item):
                        deleted += 1
                start = body.get("LastEvaluatedKey")
                if not start:
                    break
        return deleted

    def _expired(self, value, now: float) -> bool:
        if not isinstance(value, dict) or "N" not in value:
            return False  # only a Number is an expiry; anything else is ignored, as by DynamoDB
        try:
            at = Decimal(value["N"])
        except InvalidOperation:
            return False
        return now - FIVE_YEARS <= at <= Decimal(repr(now - self.b.config["ttl_delay"]))

    def _delete(self, info, attr: str, item: dict) -> bool:
        answer = self.b.proxy.upstream_call("DeleteItem", {
            "TableName": info.name, "Key": info.key_item(item), "ConditionExpression": "#ttl = :expired",
            "ExpressionAttributeNames": {"#ttl": attr}, "ExpressionAttributeValues": {":expired": item[attr]},
            "ReturnValues": "ALL_OLD"})
        if answer.status != 200:
            with self.b.lock:
                self.counts["ttl_kept_updated"] += 1  # updated since the sweep read it: kept
            return False
        with self.b.lock:
            self.counts["ttl_deleted"] += 1
        if self.b.stale.on:
            self.b.stale.history.record(info.name, info.key_of(item), self.b.monotonic(),
                                        answer.json.get("Attributes", item))
        return True

    def stats(self) -> dict:
        with self.b.lock:
            return dict(self.counts, ttl_tables=len(self.specs))
