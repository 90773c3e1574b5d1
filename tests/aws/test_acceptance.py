"""The real-AWS acceptance check (issue 29): one small migration on a real DynamoDB table, every phase,
a live shim, every guarantee checked, the cost printed, everything it made deleted.

    RESHARD_AWS_TEST_REGION=eu-west-1 python3 -m pytest tests/aws -s -n 0

Skipped unless ``RESHARD_AWS_TEST_REGION`` is set. It uses your usual credentials (profile,
environment, instance role: what ``aws`` would use; the suite's fake ones are put aside for
it) and needs ``dynamodb:*`` on tables named ``reshard-acceptance-*``.

What it does: creates an on-demand table ``reshard-acceptance-<hex>`` and seeds it with
``RESHARD_AWS_TEST_ITEMS`` (default 300) items of the sensor example (16 shards) and one item
no layout maps; ``reshard start`` creates the control table ``reshard-acceptance-<hex>-ctl``.
An application thread writes through a ``ShardedTable`` the whole time (puts, updates,
deletes, each read back consistently). The operator's commands move the migration to 32
shards through every phase: dual_write, dual_read, backfill (a first backfill killed with
SIGKILL mid-copy, then resumed under ``--max-wcu``), verify, cutover, a rollback to backfill,
verify, cutover, cleanup (``--delete``: TTL would take days), complete.

What it checks (PRODUCT.md's guarantees): every key equals its last acknowledged write,
deleted keys stay deleted, one physical item per logical item at the end, read-your-writes
in every phase, the killed backfill resumed, the budget held, the unmappable item untouched
and reported.

Cost: the request units each part consumed, as DynamoDB reported them (``ConsumedCapacity``),
printed at the end (a few thousand at the default size: cents).

Cleanup: both tables are deleted in ``finally``, also after Ctrl-C (SIGINT) or SIGTERM
(turned into KeyboardInterrupt, a second one ignored while deleting). Only a SIGKILL leaves
them: their names are printed when created (``[aws] created ...``).

``RESHARD_AWS_TEST_ENDPOINT``: run against a local server instead (the suite does, through the
fidelity proxy, and interrupts it: tests/reliability/test_aws_acceptance_cleanup.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from decimal import Decimal

import boto3
import botocore.config
import pytest

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy, to_wire
from reshard.aws.local import create_table
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse
from reshard.shim.table import ShardedTable

from tests.backfill_support import migration_text
from tests.conftest import AWS_VARS, CALLER_AWS_ENV, ROOT
from tests.shim_helpers import scan

REGION = os.environ.get("RESHARD_AWS_TEST_REGION")
ENDPOINT = os.environ.get("RESHARD_AWS_TEST_ENDPOINT") or None
ITEMS = int(os.environ.get("RESHARD_AWS_TEST_ITEMS", "300"))
PREFIX = "reshard-acceptance-"

pytestmark = pytest.mark.skipif(not REGION, reason="the real-AWS acceptance check: set RESHARD_AWS_TEST_REGION=<region> "
                                                   "(it creates two on-demand tables and deletes them)")

DATA_OPS = ("GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem", "BatchWriteItem")


def say(text: str) -> None:
    print(f"[aws] {text}", flush=True)


class Account:
    """The caller's account (or the local endpoint): clients, and the CLI run as a user would."""

    def __init__(self, control: str):
        self.control = control
        if ENDPOINT:  # a local server: placeholder credentials, as the suite's
            self.env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        else:
            self.env = {k: v for k, v in os.environ.items() if k not in AWS_VARS}
            self.env.update(CALLER_AWS_ENV)
        self.env["PYTHONPATH"] = str(ROOT)
        self.env["RESHARD_PROCESSES"] = "1"

    def session(self) -> boto3.session.Session:
        if ENDPOINT:
            return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                         region_name=REGION)
        keys = {k: CALLER_AWS_ENV[v] for k, v in (("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
                                                  ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                                                  ("aws_session_token", "AWS_SESSION_TOKEN")) if v in CALLER_AWS_ENV}
        return boto3.session.Session(profile_name=None if keys else CALLER_AWS_ENV.get("AWS_PROFILE"),
                                     region_name=REGION, **keys)

    def dynamo(self, retry: RetryPolicy | None = None, capacity: bool = False) -> Dynamo:
        # botocore's retries off and bounded timeouts, as reshard's own clients (make_client).
        config = botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5,
                                        read_timeout=30, parameter_validation=False)
        client = self.session().client("dynamodb", region_name=REGION, endpoint_url=ENDPOINT, config=config)
        if capacity:  # every data call reports what it consumed (the cost, below)
            def ask(params, **_):
                params.setdefault("ReturnConsumedCapacity", "TOTAL")
            for op in DATA_OPS:
                client.meta.events.register(f"provide-client-params.dynamodb.{op}", ask)
        return Dynamo(client, retry=retry or RetryPolicy(max_attempts=10, max_seconds=60))

    def cli(self, *args: str, timeout: float = 900, check: bool = True) -> dict:
        cmd = [sys.executable, "-m", "reshard", "--region", REGION, "--control-table", self.control, "--output", "json",
               *(["--endpoint-url", ENDPOINT] if ENDPOINT else []), *args]
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"reshard {' '.join(args)}: exit {r.returncode}: {r.stderr[-2000:]}"
        try:
            return json.loads(r.stdout) if r.stdout.strip() else {}
        except ValueError:
            return {"text": r.stdout}

    def popen(self, *args: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "reshard", "--region", REGION, "--control-table", self.control, "--output", "json",
               *(["--endpoint-url", ENDPOINT] if ENDPOINT else []), *args]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def logical(i: int, token: str, rng: random.Random) -> dict:
    return {"sensor_id": f"s-{i % 9}", "event_id": f"e-{i}", "ts": f"2026-01-02T{i % 24:02d}:{i % 60:02d}:00.{i:06d}Z",
            "temp": Decimal(rng.randrange(-300, 300)) / 10, "op": token}


def key(i: int) -> dict:
    return {k: v for k, v in logical(i, "", random.Random(0)).items() if k in ("sensor_id", "event_id", "ts")}


class App(threading.Thread):
    """One application thread through the shim: puts, updates, deletes; each write read back
    consistently (read-your-writes); the last acknowledged state of every key kept."""

    def __init__(self, shim: ShardedTable, keys: int, expected: dict):
        super().__init__(name="app", daemon=True)
        self.shim, self.keys, self.expected = shim, keys, expected
        self.rng = random.Random(29)
        self.stop = threading.Event()
        self.ops = {"put": 0, "update": 0, "delete": 0, "failed": 0}
        self.violations: list[str] = []
        self.phases: set[str] = set()
        self.unsure: set[int] = set()  # a write that raised: landed or not

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            i = self.rng.randrange(self.keys)
            token = f"app-{n}"
            r = self.rng.random()
            try:
                if r < 0.45:
                    item = logical(i, token, self.rng)
                    self.shim.put_item(Item=item)
                    self.expected[i], kind = item, "put"
                elif r < 0.8 and self.expected.get(i) is not None:
                    self.shim.update_item(Key=key(i), UpdateExpression="SET op = :o", ExpressionAttributeValues={":o": token})
                    self.expected[i], kind = dict(self.expected[i], op=token), "update"
                else:
                    self.shim.delete_item(Key=key(i))
                    self.expected[i], kind = None, "delete"
            except errors.ReshardError as e:  # SwitchInProgress and the like: may or may not have landed
                self.ops["failed"] += 1
                self.unsure.add(i)
                say(f"app write failed ({type(e).__name__}): {e}")
                continue
            self.ops[kind] += 1
            self.unsure.discard(i)
            self.phases.add(self.shim.phase)
            got = self.shim.get_item(Key=key(i), ConsistentRead=True).get("Item")
            if got != self.expected[i]:
                self.violations.append(f"read-your-writes in {self.shim.phase}: key {i} read {got}, "
                                       f"wrote {self.expected[i]}")
            self.stop.wait(0.02)


def delete_tables(dynamo: Dynamo, names: list[str]) -> None:
    """Delete every table this run created (or may have: a create interrupted in flight)."""
    for name in names:
        for attempt in range(10):
            try:
                dynamo.call("delete_table", TableName=name)
                say(f"deleted table {name}")
                break
            except errors.ResourceNotFound:
                break
            except errors.AWSError as e:  # ResourceInUse while still CREATING: wait and again
                say(f"deleting {name}: {e.code}; again in a moment")
                time.sleep(min(2 ** attempt, 10))


def test_a_small_migration_through_every_phase_on_real_dynamodb(tmp_path):
    table = PREFIX + uuid.uuid4().hex[:10]
    control = table + "-ctl"
    account = Account(control)
    raw = account.dynamo()
    created: list[str] = []
    app = shim = None

    def terminate(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        path = tmp_path / "migration.toml"
        path.write_text(migration_text("sensor", table, table))
        m = parse(path.read_text(), str(path))
        mapper = KeyMapper(m)
        created += [table, control]  # before the requests: an interrupted create is deleted too
        say(f"created table {table} (and {control} at `reshard start`): delete both by hand if this run is killed -9")
        create_table(raw, table, m.keys)
        rng = random.Random(1)
        expected: dict = {}
        seed = []
        for i in range(ITEMS):
            item = logical(i, f"seed-{i}", rng)
            expected[i] = item
            seed.append({"PutRequest": {"Item": mapper.to_physical(to_wire(item), mapper.old)}})
        unmappable = {"PK": {"S": "s-x#3"}, "SK": {"S": "no-event-id"}, "temp": {"N": "1"}}
        raw.batch_write(table, seed + [{"PutRequest": {"Item": unmappable}}])
        say(f"seeded {ITEMS} items and one unmappable item")

        account.cli("plan", str(path), check=False)
        account.cli("start", str(path), "--allow-unmappable", "1")
        shim_dynamo = account.dynamo(retry=RetryPolicy(max_attempts=6, max_seconds=10), capacity=True)
        shim = ShardedTable(m, shim_dynamo, control_table=control, refresh_seconds=1.0)
        app = App(shim, ITEMS + 50, expected)
        app.start()
        costs: dict[str, dict] = {}

        def advance(to: str) -> None:
            out = account.cli("advance", m.id, "--wait", "120")
            say(f"phase {to}: {out.get('phase', out)}")

        advance("dual_write")
        advance("dual_read")
        advance("backfill")
        # A backfill killed mid-copy, then resumed (guarantee 5).
        killed = account.popen("backfill", m.id, "--segments", "4", "--page-size", "25", "--max-wcu", "20")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and killed.poll() is None:
            status = account.cli("status", m.id)
            if any(j.get("job") == "backfill" and (j.get("progress") or {}).get("done", 0) > 0
                   for j in status.get("jobs", [])):
                break
            time.sleep(1)
        killed.send_signal(signal.SIGKILL)
        killed.communicate()
        say("first backfill killed mid-copy")
        budget = 100.0
        out = account.cli("backfill", m.id, "--segments", "4", "--max-wcu", str(budget))
        assert out["finished"] and out["unmappable"] >= 1
        costs["backfill"] = out["consumed_total"]
        # Guarantee 7: the resumed run's writes stayed within its budget (plus the first second's burst).
        assert out["consumed_here"]["wcu"] <= budget * (out["elapsed_seconds"] + 1) + 10, out
        for step in ("verify", "cutover", "rollback", "verify", "cutover", "cleanup"):
            if step == "verify":
                out = account.cli("verify", m.id, "--segments", "4")
                assert out.get("passed") is True, out
                costs[f"verify {len(costs)}"] = out.get("consumed_total") or out.get("consumed_here")
            elif step == "rollback":
                account.cli("rollback", m.id)
                say("phase backfill (rolled back from cutover)")
            else:
                advance(step)
        out = account.cli("cleanup", m.id, "--segments", "4", "--delete")
        costs["cleanup"] = out.get("consumed_total") or out.get("consumed_here")
        advance("complete")
        time.sleep(1.5)
        app.stop.set()
        app.join(30)
        assert not app.violations, app.violations[:5]
        assert {"dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete"} <= app.phases, app.phases

        # Guarantees 1-3 at the end, read through a steady-state shim.
        reader = ShardedTable(m, raw, control_table=control, refresh_seconds=60)
        lost = [i for i, want in expected.items() if i not in app.unsure
                and reader.get_item(Key=key(i), ConsistentRead=True).get("Item") != want]
        reader.close()
        assert not lost, f"{len(lost)} keys differ from their last acknowledged write: {lost[:10]}"
        items = scan(raw, table)
        per_item: dict = {}
        for it in items:
            if it == unmappable:
                continue
            fields = mapper.fields(it, mapper.new)
            per_item.setdefault(mapper.identity(fields), []).append(it)
        assert all(len(v) == 1 for v in per_item.values()), "a logical item with more than one physical item"
        assert unmappable in items, "the unmappable item was changed or removed"
        live = {i for i, v in expected.items() if v is not None}
        assert len(per_item) >= len(live - app.unsure)
        status = account.cli("status", m.id)
        assert status.get("phase") == "complete", status

        # The cost, as DynamoDB counted it.
        say(f"app: {app.ops}, phases seen {sorted(app.phases)}")
        say("cost in request units (ConsumedCapacity as DynamoDB reported it):")
        total = 0.0
        for part, c in costs.items():
            c = c or {}
            total += c.get("rcu", 0) + c.get("wcu", 0)
            say(f"  {part:<22} {c.get('rcu', 0):>10.1f} RCU {c.get('wcu', 0):>10.1f} WCU")
        for name, units in sorted(shim_dynamo.stats.consumed.items()):
            total += units
            say(f"  {'app through the shim':<22} {units:>10.1f} units on {name}")
        say(f"  total {total:,.1f} request units (the control table's own requests not counted; on-demand "
            f"prices are per million request units: cents here)")
    finally:
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the deletes
        try:
            if app is not None:
                app.stop.set()
                app.join(10)
            if shim is not None:
                try:
                    shim.close()
                except Exception:  # noqa: BLE001 - its control table may be gone already
                    pass
            delete_tables(raw, created)
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous)
