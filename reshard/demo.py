"""`reshard demo`: a whole migration on a local DynamoDB, with live application traffic.

What it does, in order
    1. Creates ``SensorEvents`` in the calculated-suffix layout of the reference article
       (``PK = f"{sensor_id}#{sha256(event_id) % N}"``, ``SK`` = ISO timestamp), turns on
       its TTL (attribute ``expires_at``) and fills it the way that article's application
       does: plain BatchWriteItem of physical items, shard computed by hand.
    2. Registers a migration N -> M (a demo-local copy of ``migrations/0001_sensor_events.toml``
       with the chosen shard counts and a unique id).
    3. Starts a small fleet: ``app_threads`` threads, each with its own
       :class:`~reshard.shim.table.ShardedTable` (its own heartbeat, refreshing every 0.5 s).
       Each thread owns a disjoint set of sensors, so it knows exactly what every read of
       its items must return: puts, updates, deletes, consistent gets that check
       read-your-writes, and now and then a consistent query of a whole sensor.
    4. Walks every phase to ``complete`` through :func:`reshard.operations.transition`
       (what ``reshard advance --wait`` runs: the fleet acknowledges the current phase,
       the transition, the fleet acknowledges the new one), running the backfill and
       verify in ``backfill``, the catch-up verify in ``cutover`` and the cleanup in ``cleanup``.
    5. Stops the traffic and checks, independently of the migration code: every
       acknowledged write reads back through a fresh shim as written, every deleted item
       stays deleted, and a raw Scan finds each live item exactly once in the new layout.

The verify and cleanup steps are :func:`verify_step` and :func:`cleanup_step`.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Callable

from reshard import errors, operations
from reshard.aws.dynamo import FIRST_CONTACT_ATTEMPTS, SHIM_RETRIES, Dynamo, from_wire, to_wire
from reshard.control.store import ControlStore
from reshard.core.migration import Migration, parse
from reshard.core.phases import ROUTING, Action, Phase
from reshard.core.planning import Distribution, distribution, histogram
from reshard.jobs.runner import JobOptions
from reshard.shim.table import ShardedTable

TABLE = "SensorEvents"
TTL_ATTRIBUTE = "expires_at"

#: The demo's migration file: migrations/0001_sensor_events.toml with the chosen shard counts.
MIGRATION_TEMPLATE = '''\
# reshard demo: migrations/0001_sensor_events.toml with {from_shards} -> {to_shards} shards.
#   PK = f"{{sensor_id}}#{{int(sha256(event_id).hexdigest(), 16) % {from_shards}}}",  SK = ISO timestamp
id = "{id}"
table = "{table}"
description = "reshard demo: sensor events {from_shards} -> {to_shards} shards"

[keys]
partition = "PK"
sort = "SK"

[from]
partition = "{{sensor_id}}#{{shard}}"
sort = "{{ts}}"
shards = {from_shards}
shard_by = ["event_id"]
hash = "sha256"

[to]
partition = "{{sensor_id}}#{{shard}}"
sort = "{{ts}}"
shards = {to_shards}
shard_by = ["event_id"]
hash = "sha256"

[cleanup]
ttl_attribute = "{ttl}"
retain_hours = 168
'''

#: What each phase means for the application's shims, for the banners.
PHASE_NOTES = {
    Phase.PLANNED: "the app's shims write and read the old layout",
    Phase.DUAL_WRITE: "the app writes both layouts (the old one counts), reads the old one",
    Phase.DUAL_READ: "the app writes both layouts (the old one counts), reads both (the newest version wins)",
    Phase.BACKFILL: "the backfill copies the old items to the new layout; then verify compares the layouts",
    Phase.CUTOVER: "the new layout counts now; the app still writes the old one too, so a rollback loses nothing",
    Phase.CLEANUP: "the app uses the new layout only; cleanup marks the old copies to expire",
    Phase.COMPLETE: "the new layout is the steady state",
}

#: Seconds the app's traffic runs in each phase before the next transition, so that every phase
#: serves real requests (also the short ones). The demo's one pacing knob: its wall time is about
#: the jobs' time plus, per transition, the fleet's acknowledgements and this (see the README).
PHASE_DWELL_SECONDS = 0.5

#: The cleanup counters in words, in the order the report lists them (they add up to "scanned").
CLEANUP_WORDS = (
    ("expiring", "old copies marked to expire (TTL attribute {ttl})"),
    ("kept_own_ttl", "old copies that already expire sooner"),
    ("deleted", "old copies deleted"),
    ("tombstones_retired", "delete markers removed"),
    ("new_copies_removed", "new-layout copies removed"),
    ("retired_copies_removed", "copies of an earlier migration removed"),
    ("unmoved", "items whose key did not change, kept"),
    ("untouched", "new-layout items kept"),
    ("unmappable", "items that cannot be mapped, left alone"),
    ("changed_meanwhile", "items the app rewrote while cleanup read them, left for a later pass"),
)


def shard_of(event_id: str, shards: int) -> int:
    """The reference article's ``get_calculated_shard_id`` (written out here on purpose:
    the demo's checks must not lean on reshard's own key mapping)."""
    return int(hashlib.sha256(event_id.encode("utf-8")).hexdigest(), 16) % shards


@dataclass
class DemoOptions:
    """The knobs of ``reshard demo``."""

    items: int = 1000
    from_shards: int = 16
    to_shards: int = 32
    app_threads: int = 4
    segments: int = 8
    sensors: int = 24
    table: str = TABLE
    control_table: str = "reshard-control"
    refresh_seconds: float = 0.5
    #: Seconds the traffic runs in each phase before the next transition (PHASE_DWELL_SECONDS).
    dwell_seconds: float = PHASE_DWELL_SECONDS
    #: Pause between two operations of one app thread (the traffic's rate: about 700 requests in a
    #: run from four threads; at 0.01 s twice as many took the embedded server's CPU from the jobs,
    #: and the run ~40 % longer at a load average of 33).
    op_pause: float = 0.04
    ack_timeout: float = 30.0
    seed: int = 2024
    progress: bool = False


class DemoFailed(errors.ReshardError):
    """The demo could not finish a step (the report says which)."""

    exit_code = 1


# --------------------------------------------------------------------------- app traffic

@dataclass
class Owned:
    """What one app thread knows: the last acknowledged state of each of its items."""

    sensors: list[str]
    items: dict[tuple, dict | None] = field(default_factory=dict)  # (sensor, event, ts) -> item, None = deleted

    def live_keys(self) -> list[tuple]:
        return [k for k, v in self.items.items() if v is not None]


@dataclass
class AppStats:
    """Counts of one app thread (merged for the report)."""

    ops: dict = field(default_factory=lambda: {"put": 0, "update": 0, "delete": 0, "get": 0, "query": 0})
    errors: int = 0
    violations: int = 0
    held: int = 0  # held through a switch past the shim's bound, never sent (SwitchInProgress)
    examples: list = field(default_factory=list)
    by_phase: dict = field(default_factory=dict)

    def note(self, kind: str, text: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(f"{kind}: {text}")


def _key(k: tuple) -> dict:
    return {"sensor_id": k[0], "event_id": k[1], "ts": k[2]}


class AppThread(threading.Thread):
    """One application instance: its own shim, its own sensors, a known expected state."""

    def __init__(self, index: int, shim: ShardedTable, owned: Owned, clock_ts: Callable[[], str],
                 stop: threading.Event, pause: float, seed: int):
        super().__init__(name=f"demo-app-{index}", daemon=True)
        self.shim = shim
        self.owned = owned
        self.next_ts = clock_ts
        self.stop_event = stop
        self.pause = pause
        self.rng = random.Random(seed)
        self.stats = AppStats()

    def run(self) -> None:
        while not self.stop_event.is_set():
            phase = self.shim.phase
            try:
                self._one()
            except errors.SwitchInProgress:
                # Held through a switch longer than the shim's bound and never sent: retryable by
                # contract (nothing changed), so the app goes on with its next request.
                self.stats.held += 1
            except errors.ReshardError as e:
                self.stats.errors += 1
                self.stats.note("error", f"{type(e).__name__} in {phase}: {e}")
            except Exception as e:  # the demo must count, not die
                self.stats.errors += 1
                self.stats.note("error", f"{type(e).__name__} in {phase}: {e}")
            else:
                self.stats.by_phase[phase] = self.stats.by_phase.get(phase, 0) + 1
            self.stop_event.wait(self.pause)

    def _one(self) -> None:
        r = self.rng.random()
        live = self.owned.live_keys()
        if r < 0.25 or not live:
            self._op_put()
        elif r < 0.45:
            self._op_update(self.rng.choice(live))
        elif r < 0.55:
            self._op_delete(self.rng.choice(live))
        elif r < 0.98:
            self._op_get(self.rng.choice(list(self.owned.items)))
        else:
            self._op_query(self.rng.choice(self.owned.sensors))

    def _op_put(self) -> None:
        item = {"sensor_id": self.rng.choice(self.owned.sensors), "event_id": str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
                "ts": self.next_ts(), "temperature": Decimal(str(round(self.rng.uniform(15, 35), 2))),
                "humidity": Decimal(str(round(self.rng.uniform(20, 80), 2)))}
        self.shim.put_item(Item=item)
        self.owned.items[(item["sensor_id"], item["event_id"], item["ts"])] = item
        self.stats.ops["put"] += 1

    def _op_update(self, k: tuple) -> None:
        t = Decimal(str(round(self.rng.uniform(15, 35), 2)))
        resp = self.shim.update_item(Key=_key(k), UpdateExpression="SET temperature = :t, revision = if_not_exists(revision, :z) + :one",
                                     ExpressionAttributeValues={":t": t, ":z": Decimal(0), ":one": Decimal(1)},
                                     ReturnValues="ALL_NEW")
        self.stats.ops["update"] += 1
        expected = dict(self.owned.items[k])
        expected["temperature"] = t
        expected["revision"] = expected.get("revision", Decimal(0)) + 1
        got = resp.get("Attributes") or {}
        # The returned attributes are what the item stores (``ts`` lives only in SK): check
        # what this update wrote; the consistent gets check the whole item.
        if (got.get("temperature"), got.get("revision")) != (t, expected["revision"]):
            self.stats.violations += 1
            self.stats.note("violation", f"update of {k} returned {got}, expected {expected}")
        self.owned.items[k] = expected

    def _op_delete(self, k: tuple) -> None:
        self.shim.delete_item(Key=_key(k))
        self.owned.items[k] = None
        self.stats.ops["delete"] += 1

    def _op_get(self, k: tuple) -> None:
        got = self.shim.get_item(Key=_key(k), ConsistentRead=True).get("Item")
        self.stats.ops["get"] += 1
        want = self.owned.items[k]
        if got != want:  # read-your-writes: the last acknowledged write, or nothing after a delete
            self.stats.violations += 1
            self.stats.note("violation", f"get {k} in {self.shim.phase} read {got}, expected {want}")

    def _op_query(self, sensor: str) -> None:
        got = self.shim.query(Key={"sensor_id": sensor}, ConsistentRead=True)["Items"]
        self.stats.ops["query"] += 1
        want = sorted((v for (s, _, _), v in self.owned.items.items() if s == sensor and v is not None),
                      key=lambda i: i["ts"])
        if got != want:
            self.stats.violations += 1
            self.stats.note("violation", f"query of {sensor} in {self.shim.phase} returned {len(got)} items, "
                                         f"expected {len(want)}")


# --------------------------------------------------------------------------- the run

class Demo:
    """One demo run against a DynamoDB endpoint (the embedded one, or ``--endpoint-url``)."""

    def __init__(self, dynamo: Dynamo, opts: DemoOptions, say: Callable[[str], None] = print):
        self.dynamo = dynamo
        self.opts = opts
        self.say = say
        self.store = ControlStore(dynamo, opts.control_table)
        token = uuid.uuid4().hex[:6]
        self.migration_id = f"sensor-events-{opts.from_shards}-to-{opts.to_shards}-demo-{token}"
        self.migration: Migration = parse(MIGRATION_TEMPLATE.format(
            id=self.migration_id, table=opts.table, from_shards=opts.from_shards, to_shards=opts.to_shards,
            ttl=TTL_ATTRIBUTE), f"demo:{self.migration_id}.toml")
        self.rng = random.Random(opts.seed)
        self._ts_lock = threading.Lock()
        self._ts_next = datetime(2024, 10, 27, 15, 0, 0, tzinfo=timezone.utc)
        self.report: dict = {"migration": self.migration_id, "table": opts.table,
                             "from_shards": opts.from_shards, "to_shards": opts.to_shards,
                             "items": opts.items, "app_threads": opts.app_threads, "segments": opts.segments,
                             "phases": [], "steps": {}, "failures": []}

    # -- helpers
    def next_ts(self) -> str:
        """A fresh ISO timestamp (one per event, so no two events share a sort key)."""
        with self._ts_lock:
            self._ts_next += timedelta(milliseconds=7)
            t = self._ts_next
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"

    def fail(self, why: str) -> None:
        self.report["failures"].append(why)

    # -- 1. the table, as the application has it today
    def create_table(self) -> None:
        o = self.opts
        try:
            self.dynamo.call("describe_table", TableName=o.table)
            raise errors.BadInput(f"table {o.table!r} already exists at {self.dynamo.endpoint_url}; the demo creates "
                                  "its own table: pass --table NAME, or use the embedded DynamoDB")
        except errors.ResourceNotFound:
            pass
        self.dynamo.call("create_table", TableName=o.table, BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                                    {"AttributeName": "SK", "KeyType": "RANGE"}],
                         AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                                               {"AttributeName": "SK", "AttributeType": "S"}])
        for _ in range(120):
            if self.dynamo.describe_table(o.table).get("TableStatus") == "ACTIVE":
                break
            time.sleep(0.5)
        try:
            self.dynamo.call("update_time_to_live", TableName=o.table,
                             TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE})
            self.report["ttl_enabled"] = True
        except errors.AWSError as e:  # dynalite has no UpdateTimeToLive: cleanup then deletes
            self.report["ttl_enabled"] = False
            self.say(f"  (TTL not supported by this server: {e.code}; cleanup will delete old items instead)")

    def fill(self) -> list[dict]:
        """Write ``items`` events exactly as the article's ``write_calculated_sharded_item`` does."""
        o = self.opts
        sensors = [f"sensor-{i:03d}" for i in range(o.sensors)]
        logical = []
        for _ in range(o.items):
            logical.append({"sensor_id": self.rng.choice(sensors),
                            "event_id": str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
                            "ts": self.next_ts(),
                            "temperature": Decimal(str(round(self.rng.uniform(15, 35), 2))),
                            "humidity": Decimal(str(round(self.rng.uniform(20, 80), 2)))})
        requests = []
        for it in logical:
            physical = {"PK": f"{it['sensor_id']}#{shard_of(it['event_id'], o.from_shards)}", "SK": it["ts"],
                        "sensor_id": it["sensor_id"], "event_id": it["event_id"],
                        "temperature": it["temperature"], "humidity": it["humidity"]}
            requests.append({"PutRequest": {"Item": to_wire(physical)}})
        self.dynamo.batch_write(o.table, requests)
        self.report["before"] = distribution((shard_of(i["event_id"], o.from_shards) for i in logical),
                                             o.from_shards).as_dict()
        return logical

    # -- 3. the fleet
    def start_fleet(self, logical: list[dict]) -> None:
        o = self.opts
        sensors = sorted({i["sensor_id"] for i in logical} | {f"sensor-{i:03d}" for i in range(o.sensors)})
        self.stop_traffic = threading.Event()
        self.apps: list[AppThread] = []
        for t in range(o.app_threads):
            mine = [s for i, s in enumerate(sensors) if i % o.app_threads == t]
            owned = Owned(mine, {(i["sensor_id"], i["event_id"], i["ts"]): dict(i)
                                 for i in logical if i["sensor_id"] in set(mine)})
            shim = ShardedTable(self.migration, self.dynamo.with_retry(SHIM_RETRIES), control_table=o.control_table,
                                refresh_seconds=o.refresh_seconds, writer_id=f"demo-app-{t}")
            self.apps.append(AppThread(t, shim, owned, self.next_ts, self.stop_traffic, o.op_pause,
                                       o.seed * 1000 + t))
        for a in self.apps:
            a.start()

    def stop_fleet(self) -> None:
        self.stop_traffic.set()
        for a in self.apps:
            a.join(timeout=30)
        for a in self.apps:
            a.shim.close()

    # -- 4. the phases
    def advance(self) -> Phase:
        """One ``reshard advance --wait``: the fleet acknowledges the current phase, the
        transition, the fleet acknowledges the new one; the demo insists on both."""
        o = self.opts

        def lagging(state, census) -> None:
            raise DemoFailed(f"the fleet did not acknowledge {state.phase} within {o.ack_timeout:g}s: "
                             + ", ".join(census.describe_lagging()))

        for attempt in range(3):
            try:
                done = operations.transition(self.store, self.migration_id, Action.ADVANCE, wait=o.ack_timeout,
                                             who="reshard-demo", poll=0.1, on_lagging=lagging)
                break
            except errors.RefusedTransition as e:
                # A switch the fleet did not get across in time is put back, nothing lost; its
                # message says to retry (a busy machine: a shim's refresh came late).
                if "was abandoned" not in str(e) or attempt == 2:
                    raise
                self.report["switch_retries"] = self.report.get("switch_retries", 0) + 1
                self.say("    a shim was slow to get across the switch, so it was put back; trying again")
        after, census = done.after, done.census
        if not census.acknowledged:
            raise DemoFailed(f"the fleet did not acknowledge {after.phase} within {o.ack_timeout:g}s")
        r = ROUTING[after.phase]
        self.say(f"\n==> {after.phase}: {PHASE_NOTES[after.phase]}")
        self.say(f"    the app's {len(census.live)} shims all switched (writes {' + '.join(r.writes)}, reads "
                 f"{' + '.join(r.reads)}) in {done.ack_seconds:.1f} s")
        self.report["phases"].append({"phase": after.phase.value, "phase_version": after.phase_version,
                                      "ack_seconds": round(done.ack_seconds, 2), "live_shims": len(census.live)})
        time.sleep(o.dwell_seconds)
        return after.phase

    def backfill_step(self) -> dict:
        o = self.opts
        subs = self._progress("backfill")
        result = operations.run_data_job("backfill", self.dynamo, self.store, self.migration_id,
                         JobOptions(segments=o.segments, page_size=250), subscribers=subs)
        t = result.totals
        counts = {k: int(t.get(k, 0)) for k in ("scanned", "moved", "copied", "fenced", "duplicates", "collisions",
                                                 "unmoved", "new_layout", "unmappable")}  # stored as N: whole counts
        out = {"done": result.done, **counts, "seconds": round(result.outcome.elapsed, 2)}
        self.say(f"    backfill ({out['seconds']} s): {backfill_words(out)}")
        if not result.done:
            self.fail("the backfill did not finish every segment")
        return out

    def verify_step(self) -> dict:
        """``reshard verify`` through the library: compares both layouts per logical item."""
        started = time.monotonic()
        result = operations.run_data_job("verify", self.dynamo, self.store, self.migration_id,
                         JobOptions(segments=self.opts.segments), subscribers=self._progress("verify"))
        totals = result.totals
        out = {"passed": bool(result.passed), "checked": result.checked, "counts": result.differences,
               "new_copies": int(totals.get("new_copies", 0)), "unmoved": int(totals.get("unmoved", 0)),
               "examples": list(result.examples)[:5], "run": result.run,
               "seconds": round(time.monotonic() - started, 2)}
        self.say(f"    verify ({out['seconds']} s): {verify_words(out)}")
        if not out["passed"]:
            self.fail(f"verify found differences: {out['counts']}")
        return out

    def cleanup_step(self) -> dict:
        """``reshard cleanup`` through the library: TTL on the old items (moto never expires them)."""
        ttl = bool(self.report.get("ttl_enabled"))
        started = time.monotonic()
        result = operations.run_data_job("cleanup", self.dynamo, self.store, self.migration_id,
                         JobOptions(segments=self.opts.segments, delete=not ttl),
                             subscribers=self._progress("cleanup"))
        out = {"done": bool(result.done), "counts": dict(result.counts), "mode": "ttl" if ttl else "delete",
               "seconds": round(time.monotonic() - started, 2)}
        self.say(f"    cleanup ({out['seconds']} s): {cleanup_words(out)}")
        if not out["done"]:
            self.fail("the cleanup did not finish")
        return out

    def _progress(self, desc: str) -> list:
        if not self.opts.progress:
            return []
        from reshard.jobs.subscribers import TqdmSubscriber
        total = self.dynamo.describe_table(self.opts.table).get("ItemCount")
        return [TqdmSubscriber(total, desc=f"    {desc}", counter=desc)]

    # -- 5. the independent final check
    def final_check(self) -> dict:
        """Every acknowledged write reads back as written; deletes stay deleted; one copy each."""
        o = self.opts
        expected: dict[tuple, dict | None] = {}
        for a in self.apps:
            expected.update(a.owned.items)
        mismatches, resurrected, checked = [], [], 0
        with ShardedTable(self.migration, self.dynamo, control_table=o.control_table,
                          refresh_seconds=o.refresh_seconds, writer_id="demo-check") as shim:
            # The shim's batch_get_item: 100 keys a request (one get_item each was 1.5 s of an
            # idle 17 s run), a few in flight; judged in key order.
            from concurrent.futures import ThreadPoolExecutor
            keys = list(expected)
            chunks = [keys[i:i + 100] for i in range(0, len(keys), 100)]

            def read(chunk: list[tuple]) -> dict[tuple, dict]:
                got = shim.batch_get_item(Keys=[_key(k) for k in chunk], ConsistentRead=True)["Items"]
                return {(i["sensor_id"], i["event_id"], i["ts"]): i for i in got}

            found: dict[tuple, dict] = {}
            with ThreadPoolExecutor(4) as pool:
                for part in pool.map(read, chunks):
                    found.update(part)
            for k in keys:
                got, want = found.get(k), expected[k]
                checked += 1
                if got != want:
                    (resurrected if want is None else mismatches).append(f"{k}: read {got}, expected {want}")
        # A raw Scan, read without reshard's key mapping: each live item exactly once in
        # the new layout, no item of a deleted key there, and the new distribution.
        new_layout: dict[tuple, int] = {}
        shards = []
        old_with_ttl = old_left = 0
        for item in self._scan_all():
            it = from_wire(item)
            if "_rs_del" in it:
                continue
            sensor, shard = it["PK"].rsplit("#", 1)
            k = (sensor, it["event_id"], it["SK"])
            if int(shard) == shard_of(it["event_id"], o.to_shards):
                new_layout[k] = new_layout.get(k, 0) + 1
                shards.append(int(shard))
            elif TTL_ATTRIBUTE in it:
                old_with_ttl += 1
            else:
                old_left += 1
        live = {k for k, v in expected.items() if v is not None}
        missing = sorted(live - set(new_layout))
        extra = sorted(set(new_layout) - live)
        dupes = sorted(k for k, n in new_layout.items() if n > 1)
        moved_items = sum(1 for k in live if shard_of(k[1], o.from_shards) != shard_of(k[1], o.to_shards))
        out = {"checked": checked, "live": len(live), "deleted": len(expected) - len(live),
               "mismatches": len(mismatches), "resurrected": len(resurrected) + len(extra),
               "missing_in_new_layout": len(missing), "duplicates": len(dupes),
               "moved_items": moved_items, "old_items_with_ttl": old_with_ttl, "old_items_left": old_left,
               "examples": (mismatches + resurrected + [f"{k}: live but not in the new layout" for k in missing]
                            + [f"{k}: in the new layout but deleted" for k in extra])[:10]}
        self.report["after"] = distribution(shards, o.to_shards).as_dict()
        if mismatches or resurrected or missing or extra or dupes:
            self.fail(f"final check: {out['mismatches']} mismatches, {out['resurrected']} resurrected, "
                      f"{out['missing_in_new_layout']} missing, {out['duplicates']} duplicated")
        return out

    def _scan_all(self):
        kwargs = {"TableName": self.opts.table, "ConsistentRead": True}
        while True:
            resp = self.dynamo.call("scan", **kwargs)
            yield from resp.get("Items", [])
            if not resp.get("LastEvaluatedKey"):
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    # -- the whole thing
    def run(self) -> dict:
        o = self.opts
        started = time.monotonic()
        self.say(f"reshard demo: table {o.table}, {o.items} items, {o.from_shards} -> {o.to_shards} shards, "
                 f"{o.app_threads} app threads, endpoint {self.dynamo.endpoint_url}")
        self.create_table()
        logical = self.fill()
        timings = self.report["timings"] = {"fill": round(time.monotonic() - started, 2)}
        self.say(f"  filled {o.items} items in the {o.from_shards}-shard layout ({timings['fill']:.1f} s)")
        self.store.register(self.migration, who="reshard-demo")
        self.say(f"\n==> planned: migration {self.migration_id} registered: {PHASE_NOTES[Phase.PLANNED]}")
        self.start_fleet(logical)
        try:
            while True:
                phase = self.advance()
                if phase is Phase.BACKFILL:
                    self.report["steps"]["backfill"] = self.backfill_step()
                    self.report["steps"]["verify"] = self.verify_step()
                    if self.report["failures"]:
                        break
                elif phase is Phase.CUTOVER:
                    # The switch may have left a write whose mirror to the new layout never
                    # landed: a verify started in cutover lifts the catch-up flag (and
                    # `cutover -> cleanup` waits for it; docs/late-writes.md).
                    self.report["steps"]["catch_up_verify"] = self.verify_step()
                    if self.report["failures"]:
                        break
                elif phase is Phase.CLEANUP:
                    self.report["steps"]["cleanup"] = self.cleanup_step()
                    if self.report["failures"]:
                        break
                elif phase is Phase.COMPLETE:
                    break
        except errors.ReshardError as e:
            self.fail(f"{type(e).__name__}: {e}")
        finally:
            self.stop_fleet()
        self.report["app"] = self._app_totals()
        checked_at = time.monotonic()
        self.report["final_check"] = self.final_check()
        self.report["phase"] = self.store.load_state(self.migration_id).phase.value
        now = time.monotonic()
        self.report["elapsed_seconds"] = round(now - started, 1)
        steps = self.report["steps"]
        timings["shims_switching"] = round(sum(p["ack_seconds"] for p in self.report["phases"]), 2)
        timings["traffic_between_phases"] = round(o.dwell_seconds * len(self.report["phases"]), 2)
        for step in ("backfill", "verify", "cleanup"):
            timings[step] = steps.get(step, {}).get("seconds", 0.0)
        timings["final_check"] = round(now - checked_at, 2)
        timings["setup and stopping the app"] = round(now - started - sum(timings.values()), 2)
        try:
            self.report["load_average"] = round(os.getloadavg()[0], 1)
        except OSError:  # no load average on this platform
            self.report["load_average"] = None
        self.report["cores"] = os.cpu_count()
        app = self.report["app"]
        if app["errors"]:
            self.fail(f"{app['errors']} application errors")
        if app["violations"]:
            self.fail(f"{app['violations']} read-your-writes violations")
        if self.report["phase"] != Phase.COMPLETE.value:
            self.fail(f"the migration ended in {self.report['phase']}, not complete")
        self.report["ok"] = not self.report["failures"]
        return self.report

    def _app_totals(self) -> dict:
        ops: dict = {}
        by_phase: dict = {}
        examples = []
        for a in self.apps:
            for k, v in a.stats.ops.items():
                ops[k] = ops.get(k, 0) + v
            for k, v in a.stats.by_phase.items():
                by_phase[k] = by_phase.get(k, 0) + v
            examples += a.stats.examples
        return {"ops": ops, "total": sum(ops.values()), "by_phase": by_phase,
                "errors": sum(a.stats.errors for a in self.apps), "held": sum(a.stats.held for a in self.apps),
                "violations": sum(a.stats.violations for a in self.apps), "examples": examples[:10]}


def run_demo(opts: DemoOptions, endpoint_url: str | None = None, say: Callable[[str], None] = print) -> dict:
    """Run the demo on ``endpoint_url``, or on an embedded moto server started for it."""
    if endpoint_url:
        return Demo(Dynamo(endpoint_url=endpoint_url, first_contact_attempts=FIRST_CONTACT_ATTEMPTS), opts, say).run()
    from reshard.aws.local import EmbeddedDynamoDB
    with EmbeddedDynamoDB() as server:
        return Demo(Dynamo(endpoint_url=server.endpoint_url), opts, say).run()


def backfill_words(b: dict) -> str:
    """The backfill's counters in words; the parts add up to what it read."""
    moving = [f"{b['copied']} copied to the new layout"]
    if b.get("fenced"):
        moving.append(f"{b['fenced']} skipped: the app had already written a newer version there")
    if b.get("duplicates"):
        moving.append(f"{b['duplicates']} already copied")
    if b.get("collisions"):
        moving.append(f"{b['collisions']} collisions (two old copies differ: listed by reshard status)")
    parts = [f"{b['moved']} old items (delete markers included) whose key changes: " + ", ".join(moving),
             f"{b['unmoved']} old items whose key stays the same (nothing to copy)",
             f"{b['new_layout']} items the app had already written in the new layout"]
    if b.get("unmappable"):
        parts.append(f"{b['unmappable']} items that cannot be mapped (left alone, listed by reshard status)")
    return f"read {b['scanned']} items: " + "; ".join(parts)


def verify_words(v: dict) -> str:
    """verify's verdict in words: what it read, and each kind of difference it found (with its meaning)."""
    from reshard.core.compare import KINDS
    found = {k: int(n) for k, n in v["counts"].items() if n}
    verdict = "passed, the layouts agree item by item" if v["passed"] else "FAILED"
    new, same = v.get("new_copies", 0), v.get("unmoved", 0)
    read = (f"read {v['checked']} items of both layouts ({new} new-layout copies, {same} items whose key stays, "
            f"{v['checked'] - new - same} old items whose key changes, delete markers included)")
    if not found:
        return f"{verdict}: {read}, no differences"
    return f"{verdict}: {read}; " + "; ".join(f"{n} {k}: {KINDS.get(k, k)}" for k, n in sorted(found.items()))


def cleanup_words(c: dict) -> str:
    """cleanup's counters in words; the parts add up to what it read."""
    counts = c["counts"]
    parts = [f"{int(counts[k])} {text.format(ttl=TTL_ATTRIBUTE)}" for k, text in CLEANUP_WORDS if counts.get(k)]
    return f"read {int(counts.get('scanned', 0))} items: " + "; ".join(parts)


def render_report(r: dict) -> str:
    """The closing report, for people: every count says what it counts, and the parts add up."""
    app, fc = r["app"], r["final_check"]
    ops = app["ops"]
    bf = r["steps"].get("backfill")
    ver = r["steps"].get("verify")
    cl = r["steps"].get("cleanup")
    lines = ["", "=" * 72, f"reshard demo report: {r['migration']} ({r['table']})", "=" * 72]
    for name, key in (("before", "before"), ("after", "after")):
        d = r.get(key)
        if not d:
            continue
        dist = Distribution(tuple(d["counts"]))
        lines.append(f"\nshard distribution {name}: {d['shards']} shards, {d['total']} items, "
                     f"hottest shard {d['hottest_pct']:.1f}% (skew {d['skew']:.2f})")
        lines.append(histogram(dist, width=30))
    lines.append("")
    lines.append("phases:       " + " -> ".join(["planned"] + [p["phase"] for p in r["phases"]]))
    lines.append(f"app traffic:  {app['total']} requests from {r['app_threads']} app threads ("
                 + ", ".join(f"{k} {v}" for k, v in ops.items()) + f"): {app['errors']} errors, "
                 f"{app['violations']} reads that missed the thread's own last write"
                 + (f"; {app['held']} more held by a switch and not sent (retryable)" if app.get("held") else ""))
    lines.append("              per phase: " + ", ".join(f"{k} {v}" for k, v in app["by_phase"].items()))
    lines.append(f"items:        {fc['live']} live at the end = {r['items']} loaded + {ops.get('put', 0)} put by the "
                 f"app - {fc['deleted']} it deleted; {fc['moved_items']} of them changed key "
                 f"({r['from_shards']} -> {r['to_shards']} shards), {fc['live'] - fc['moved_items']} kept theirs")
    lines.append(f"backfill:     {backfill_words(bf)}" if bf else "backfill:     did not run")
    lines.append(f"verify:       {verify_words(ver)}" if ver else "verify:       did not run")
    if cl is not None:
        lines.append(f"cleanup:      {cleanup_words(cl)}")
        lines.append(f"              at the end {fc['old_items_with_ttl']} old copies carry {TTL_ATTRIBUTE} "
                     f"(DynamoDB's TTL deletes them; this local server never does), {fc['old_items_left']} without it")
    lines.append(f"final check:  {fc['checked']} keys (every item loaded or put) read back through a fresh shim: {fc['live']} live "
                 f"items as last written ({fc['mismatches']} mismatches), {fc['deleted']} deleted items stay deleted "
                 f"({fc['resurrected']} came back); a raw scan of the new layout: {fc['missing_in_new_layout']} "
                 f"missing, {fc['duplicates']} twice")
    t = r.get("timings", {})
    load = r.get("load_average")
    on = f" on {r.get('cores')} cores at load average {load}" if load is not None else ""
    lines.append(f"time:         {r['elapsed_seconds']} s{on} = " + ", ".join(
        f"{k.replace('_', ' ')} {v:.1f}" for k, v in t.items()))
    for e in app["examples"] + fc["examples"]:
        lines.append(f"  ! {e}")
    lines.append("")
    lines.append("RESULT: OK, every check held" if r["ok"] else "RESULT: FAILED: " + "; ".join(r["failures"]))
    return "\n".join(lines)
