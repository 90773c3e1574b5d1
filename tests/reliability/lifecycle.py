"""A whole migration under chaos: app threads, phase changes with rollbacks, killed backfills, faults.

``Lifecycle`` owns one dynalite (``--path``), the fault proxy in front of it, the shims
and their application threads, and drives the migration through the command line and
the ControlStore. ``audit()`` compares the final table with the oracle and returns the
figures the test prints and asserts on.

Late faults (issue 25, ``late_faults`` / ``RESHARD_CHAOS_LATE=1``): the proxy holds some
data-table writes and delivers them late (inside and past the horizon), loses answers of
applied writes, and delivers some twice, late. Only the server deadline fences a late
request, so those lifecycles register the migration with it enforced (`start` without
``--no-server-deadline``, ``--request-horizon`` LATE_HORIZON; the proxy enforces the 5-minute
signature window). What the contract allows and the checks know: a mirror refused past its
horizon is lost by design and verify reports it until ``verify --repair`` (LostMirrors); a
write in an unfenced phase (the steady state; cleanup and complete are fenced since issue 25's
last cases) may land up to its horizon late, over newer writes, as a plain DynamoDB write would
(``Oracle.late_window``). The soak, every seed a run::

    for s in 1 2 3 4 5; do RESHARD_CHAOS_SEED=$s RESHARD_CHAOS_LATE=1 RESHARD_CHAOS_FIDELITY=1 \
        python3 -m pytest -q -n 1 tests/reliability/test_chaos_lifecycle.py \
        tests/reliability/test_chaos_counters.py || break; done
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from decimal import Decimal

from reshard import errors
from reshard.control.store import ControlStore
from reshard.aws.dynamo import Dynamo, RetryPolicy, to_wire
from reshard.core.deadlines import STEADY_HORIZON_SECONDS
from reshard.core.layout import KeyMapper, is_tombstone
from reshard.core.migration import load
from reshard.core.phases import Action, Phase
from reshard.shim.table import ShardedTable
from reshard.control.transition import transition
from reshard.control import fleet

from tests.backfill_support import create_table, migration_text
from tests.integration.test_backfill_dynalite import Watchdog, _cli, _env
from tests.reliability.chaos import (ABSENT, AppThread, FaultProcess, FaultProxy, Oracle, Workload, Write, total_ops,
                                     unfenced)
from reshard.aws.local import DynaliteServer
from tests.shim_helpers import by_layout, scan, shim

PATIENT = RetryPolicy(max_attempts=14, max_seconds=30.0, base_seconds=0.01, max_backoff_seconds=0.3)

#: Every DynamoDB behaviour of the fidelity proxy (issue 29, reshard/aws/fidelity) at once,
#: scaled to what dynalite serves: stale reads (a non-consistent read up to 0.5 s in the past
#: half the time), a partition limit per key of the data table (2 WCU/s: DynamoDB's 1,000
#: scaled down until a local run meets it; the control table keeps DynamoDB's), a tenth of
#: batch items left unprocessed, TTL with late deletes. Reads get 60 RCU/s, not 6 (3,000 scaled
#: alike): the table marker is one key of the data table that every shim (each refresh, 4 a
#: second here) and every job (each fact) reads consistently -- 25 RCU/s in these lifecycles,
#: where DynamoDB's 3,000 take ~15,000 processes refreshing every 5 s. At 6 the marker was
#: throttled without pause and a backfill's fact read gave up (exit 1) at load 35.
EVERY_BEHAVIOUR = {"stale_reads": True, "stale_window": 0.5, "stale_probability": 0.5, "gsi_lag": 0.5,
                   "partition_throughput": True, "partition_wcu": 2.0, "partition_rcu": 60.0,
                   "unprocessed_rate": 0.1, "ttl": True, "ttl_delay": 0.5, "ttl_sweep_seconds": 0.5}
#: The backfill's per-key pace under that scaled limit (its default, 800, is under DynamoDB's 1,000).
KEY_WCU = 1.6
#: ``RESHARD_CHAOS_FIDELITY=1``: every lifecycle runs with every behaviour (the soak);
#: ``RESHARD_CHAOS_LATE=1``: and with issue 25's late requests and lost answers, the server
#: deadline enforced (see the module docstring; the hourly lifecycle always has them).
SOAK_FIDELITY = os.environ.get("RESHARD_CHAOS_FIDELITY") == "1"
#: ``RESHARD_CHAOS_FIDELITY_SETTINGS='{"stale_window": 2, "stale_probability": 1}'``: other
#: settings over EVERY_BEHAVIOUR (a harsher soak).
if os.environ.get("RESHARD_CHAOS_FIDELITY_SETTINGS"):
    EVERY_BEHAVIOUR = {**EVERY_BEHAVIOUR, **json.loads(os.environ["RESHARD_CHAOS_FIDELITY_SETTINGS"])}
LATE_FAULTS = os.environ.get("RESHARD_CHAOS_LATE") == "1"
#: The request horizon (``start --request-horizon``) of a migration run with the server deadline
#: enforced (the late faults' lifecycles): short, so the phases' H + 2 waits stay short, but not
#: 2 s: a fact is dated by a whole-second ``Date`` and not used within SEND_MARGIN_SECONDS (1 s)
#: of its horizon, so with H = 2 it is usable for under a second after each refresh, and one
#: throttled refresh left the shims' mirrors unsent ("lost", by design) faster than a verify
#: under traffic could repair them (seed 1 of the sensor lifecycle, three rounds).
LATE_HORIZON = 4.0
WRITE_OPS = ["PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"]


def sensor_workload() -> Workload:
    def key(i):
        return {"sensor_id": f"s-{i % 11}", "event_id": f"e-{i}",
                "ts": f"2024-10-27T{i % 24:02d}:{(i // 24) % 60:02d}:{i % 60:02d}.{i:06d}Z"}

    def item(i, token, rng):
        # "data" and "timestamp" are DynamoDB reserved words: the shim must use placeholders.
        return dict(key(i), temp=Decimal(rng.randrange(-400, 400)) / 10, op=token, data="x" * rng.randrange(0, 40),
                    timestamp=Decimal(1_700_000_000 + i))

    return Workload(key, item, ident=lambda i: i)


def hourly_workload() -> Workload:
    def key(i):
        return {"sensor_id": f"s-{i % 13}",
                "ts": f"2024-10-{20 + i % 7:02d}T{i % 24:02d}:{(i // 24) % 60:02d}:{i % 60:02d}.{i:06d}Z"}

    def item(i, token, rng):
        return dict(key(i), event_id=f"e-{i}", temp=Decimal(rng.randrange(-400, 400)) / 10, op=token)

    return Workload(key, item, ident=lambda i: i)


def invoices_workload() -> Workload:
    """Invoice lines of the random-suffix layout (migrations/0002_invoices.toml): four lines per invoice."""
    def key(i):
        return {"invoice_number": str(100000 + i // 4), "line": str(i % 4)}

    def item(i, token, rng):
        return dict(key(i), amount=Decimal(rng.randrange(1, 100000)) / 100, op=token, memo="m" * rng.randrange(0, 30))

    return Workload(key, item, ident=lambda i: i)


WORKLOADS = {"sensor": sensor_workload, "hourly": hourly_workload, "invoices": invoices_workload}


#: The differences one layout's missing mirror makes (reshard/jobs/verify.py): the other copy
#: older (stale), absent (missing), a deleted item's tombstone not mirrored (resurrected), a
#: newer copy on the new layout after a rollback to backfill (diverged, new_only).
MIRROR_KINDS = ("stale", "missing", "resurrected", "diverged", "new_only")


class LostMirrors(logging.Handler):
    """The keys of the shims' mirror writes that never landed: refused past their horizon (a
    mirror held or retried too long, or left unsent for want of a fresh fact) or failed after
    every retry. By design the authoritative write stands and the app's write succeeds
    (reshard/shim/table.py ``_mirror``, docs/late-writes.md): the other layout is behind until
    the switch's catch-up or ``verify --repair``. A verify before then reports exactly these."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.keys: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("reshard shim %s: mirror write of %s") \
                and isinstance(record.args, tuple) and len(record.args) >= 2 and isinstance(record.args[1], dict):
            self.keys.add(json.dumps(record.args[1], sort_keys=True))


class Lifecycle:
    """One migration under chaos (see the module docstring)."""

    def __init__(self, tmp_path, kind: str, seed: int, n_items: int, n_inserts: int, threads: int = 4,
                 fidelity: dict | None = None, late_faults: bool = LATE_FAULTS, proxy_process: bool | None = None,
                 server_deadline: bool | None = None):
        """``fidelity``: the proxy's DynamoDB behaviours to switch on (EVERY_BEHAVIOUR, or all
        of them under RESHARD_CHAOS_FIDELITY=1); ``late_faults``: add late requests, lost
        answers and late duplicates of data-table writes once the application starts;
        ``proxy_process``: the proxy as a process of its own (default: when behaviours are on,
        whose CPU per request exceeds a client's); ``server_deadline``: `start` without
        ``--no-server-deadline``, with ``--request-horizon`` LATE_HORIZON (default: with the late
        faults, which only the horizon fences: docs/late-writes.md; the proxy enforces the
        signature window)."""
        self.kind, self.seed = kind, seed
        self.rng = random.Random(seed)
        self.server = DynaliteServer(tmp_path / "db")
        self.server.start()
        self.watchdog = Watchdog(self.server)
        self.watchdog.start()
        self.table, self.control = f"Chaos{kind.title()}", "chaos-control"
        self.fidelity = dict(EVERY_BEHAVIOUR if SOAK_FIDELITY and fidelity is None else fidelity or {})
        if self.fidelity.get("partition_throughput"):
            self.fidelity.setdefault("partition_tables", [self.table])  # the scaled limit: the data table's
        self.late_faults = late_faults
        self.server_deadline = late_faults if server_deadline is None else server_deadline
        process = bool(self.fidelity) if proxy_process is None else proxy_process
        self.proxy = (FaultProcess if process else FaultProxy)(self.server.port, seed=seed, **self.fidelity).start()
        self.proxy.enabled = False  # setup and seeding run clean; chaos starts with the app
        self.raw = Dynamo(endpoint_url=self.server.endpoint, region="us-east-1", retry=PATIENT)
        self.faulty = Dynamo(endpoint_url=self.proxy.endpoint, region="us-east-1", retry=PATIENT)
        self.path = tmp_path / "migration.toml"
        self.path.write_text(migration_text(kind, self.table, f"chaos-{kind}"))
        self.m = load(self.path)
        self.mapper = KeyMapper(self.m)
        self.store = ControlStore(self.faulty, self.control)
        self.workload = WORKLOADS[kind]()
        self.oracle = Oracle()
        if late_faults:
            # A late copy of a write lands up to the horizon after it was sent (signed with
            # its fact + H, the fact at most "now"; 1 s for the Date header's resolution) --
            # without the server deadline, up to the proxy's longest hold (3 s, real time).
            self.oracle.late_window = LATE_HORIZON + 1.0 if self.server_deadline else 3.0
        self.n_items, self.n_inserts, self.n_threads = n_items, n_inserts, threads
        self.kills = 0
        self.backfill_runs = 0
        self.transitions: list[str] = []
        self.shims: list[ShardedTable] = []
        self.apps: list[AppThread] = []
        self.unmappable: list[dict] = []
        self.lost_mirrors = LostMirrors()
        logging.getLogger("reshard.shim").addHandler(self.lost_mirrors)
        self.repairs: list[dict] = []
        self.abandoned_switches = 0
        self.frozen: subprocess.Popen | None = None
        self.frozen_keys: list[int] = []
        self.frozen_final: dict[int, str] = {}
        self.t0 = time.monotonic()

    def log(self, what: str) -> None:
        print(f"  [{time.monotonic() - self.t0:6.1f}s] {what}", flush=True)

    # ------------------------------------------------------------------ setup
    def seed_table(self, unmappable: list[dict] = (), store_key_fields: bool = True) -> None:
        """Pre-migration items written as the application did before reshard (no version).

        ``store_key_fields=False``: the items keep only what is not in their keys (the
        hourly layout's app stores sensor_id and ts only inside SK).
        """
        create_table(self.raw, self.table, self.mapper)
        reqs = []
        for i in range(self.n_items):
            item = self.workload.item(i, f"seed-{i}", self.rng)
            phys = self.mapper.to_physical(to_wire(item), self.mapper.old)
            if not store_key_fields:
                for f in self.mapper.key_fields:
                    phys.pop(f, None)
            reqs.append({"PutRequest": {"Item": phys}})
            self.oracle.record(i, Write(f"seed-{i}", "seed", -2.0, -1.0, True, item))
        for i in range(self.n_items, self.n_items + self.n_inserts):
            self.oracle.record(i, Write(ABSENT, "initial", -2.0, -1.0, True, None))
        self.unmappable = [dict(u) for u in unmappable]
        reqs += [{"PutRequest": {"Item": u}} for u in self.unmappable]
        self.raw.batch_write(self.table, reqs)
        self.log(f"seeded {len(reqs)} items")

    def env(self) -> dict:
        """The CLI's environment: conftest's RESHARD_NO_SERVER_DEADLINE=1 dropped when the
        server deadline is enforced (it is `start`'s --no-server-deadline)."""
        env = _env()
        if self.server_deadline:
            env.pop("RESHARD_NO_SERVER_DEADLINE", None)
        return env

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(_cli(self.proxy.endpoint, self.control, *args), env=self.env(), capture_output=True,
                              text=True, timeout=timeout)

    def start_app(self, seconds: float, max_ops: int) -> None:
        """Register the migration (CLI), then the shims and one application thread per shim."""
        # The planted unmappable items are accepted explicitly, as an operator would (issue 13).
        horizon = ["--request-horizon", f"{LATE_HORIZON:g}"] if self.server_deadline else []
        r = self.cli("start", str(self.path), "--allow-unmappable", str(len(self.unmappable)), *horizon)
        assert r.returncode == 0, r.stderr
        self.skip_steady_horizon()
        self.proxy.enabled = True
        if self.late_faults:
            self.add_late_faults()
        deadline = time.monotonic() + seconds
        keys = list(range(self.n_items + self.n_inserts))
        hot = self.rng.sample(keys, 24)
        for t in range(self.n_threads):
            dynamo = Dynamo(endpoint_url=self.proxy.endpoint, region="us-east-1", retry=PATIENT)
            s = ShardedTable(self.m, dynamo, control_table=self.control, refresh_seconds=0.25,
                             liveness_seconds=30.0, writer_id=f"app{t}")
            self.shims.append(s)
            self.apps.append(AppThread(f"app{t}", s, self.workload, self.oracle, keys, hot,
                                       seed=self.seed * 100 + t, max_ops=max_ops, deadline=deadline))
        for a in self.apps:
            a.start()

    def skip_steady_horizon(self) -> None:
        """With the server deadline, the first move out of `planned` waits until no request of a
        steady-state shim (signed with STEADY_HORIZON_SECONDS, 15 s) can land: 17 s of nothing
        here, where no shim ran before `start` (the seed went to dynalite directly). So the
        proxy's clock (its Date headers and the signature check) moves on by that much, as if
        the migration had been registered that long before the application started; nothing
        is in flight yet to be aged by the jump."""
        if self.server_deadline:
            self.proxy.advance_clock(STEADY_HORIZON_SECONDS)

    def add_late_faults(self) -> None:
        """Issue 25's faults on the data table's writes (every rule on about one write in a
        hundred, the duplicates on one in two hundred):

        * held, the client's connection closed at once (it retries at once), delivered 0.5 s
          later: inside any horizon, so it lands after its own retry, maybe after newer writes;
        * held the same way and delivered 3 s later, judged as if 4 minutes late (inside AWS's
          5): past the horizon, refused when the server deadline is enforced, lands without;
        * its answer lost after the write landed (the client retries);
        * delivered a second time 0.3 s later, and 2 s later as if 4 minutes."""
        self.proxy.hold(table=self.table, op=WRITE_OPS, probability=0.01, times=None, mode="lose", delay=0.5)
        self.proxy.hold(table=self.table, op=WRITE_OPS, probability=0.01, times=None, mode="lose", delay=3.0,
                        age=240)
        self.proxy.lose_answer(table=self.table, op=WRITE_OPS, probability=0.01, times=None)
        self.proxy.duplicate(table=self.table, op=WRITE_OPS, probability=0.005, times=None, copy="delay", delay=0.3)
        self.proxy.duplicate(table=self.table, op=WRITE_OPS, probability=0.005, times=None, copy="delay", delay=2.0,
                             age=240)
        self.log("late requests, lost answers and late duplicates on"
                 + (f" (server deadline enforced, horizon {LATE_HORIZON:g} s)" if self.server_deadline else
                    " (no server deadline: nothing fences a late request)"))

    # ------------------------------------------------------------------ phases
    def phase(self) -> Phase:
        return self.store.load_state(self.m.id).phase

    def move(self, action: Action, dwell: float = 0.6) -> None:
        """Wait for every live shim to acknowledge the current phase, then advance or roll back."""
        state = self.store.load_state(self.m.id)
        census = fleet.wait_for_ack(self.store, self.m.id, state.phase_version, 30, poll=0.1)
        assert census.acknowledged, f"shims did not acknowledge {state.phase}: {census.lagging}"
        # The fleet gets as long to acknowledge a switch or a catch-up clear as it got above: on
        # a loaded machine a shim's refresh is late (the default wait is ~1.2 refresh intervals).
        for attempt in range(3):
            try:
                before, after = transition(self.store, self.m.id, action, who="chaos-test", allow_no_shims=True,
                                           switch_wait=30)
                break
            except errors.RefusedTransition as e:
                # A switch the fleet did not get across even so goes back, safely; the refusal
                # says to retry.
                if "abandoned" not in str(e) or attempt == 2:
                    raise
                self.abandoned_switches += 1
                self.log(f"switch abandoned, again: {e}")
        self.transitions.append(f"{before.phase}->{after.phase}")
        self.log(f"{before.phase} -> {after.phase}")
        time.sleep(dwell)  # let the traffic run in the new phase (and the shims pick it up)

    def backfill_with_kills(self, kills: int, segments: int = 8, max_seconds: float = 60) -> dict:
        """Start `reshard backfill` subprocesses and SIGKILL them at random points, then finish."""
        cmd = ["--output", "json", "backfill", self.m.id, "--segments", str(segments), "--workers", "2",
               "--page-size", "60", "--lease-seconds", "2"]
        if self.fidelity.get("partition_throughput"):
            cmd += ["--max-wcu-per-key", str(KEY_WCU)]
        deadline = time.monotonic() + max_seconds
        attempts = 0
        while self.kills < kills and attempts < kills * 3 and time.monotonic() < deadline:
            attempts += 1
            proc = subprocess.Popen(_cli(self.proxy.endpoint, self.control, *cmd), env=self.env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.backfill_runs += 1
            time.sleep(self.rng.uniform(0.9, 2.2))  # ~0.7 s of interpreter start-up, then pages
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                self.kills += 1
            proc.communicate(timeout=30)
            self.log(f"backfill run {self.backfill_runs}: exit {proc.returncode}")
        final = self.cli(*cmd, timeout=180)
        self.backfill_runs += 1
        self.log(f"backfill finished: exit {final.returncode}: {final.stdout[-1500:]} {final.stderr[-1500:]}")
        assert final.returncode == 0, final.stderr
        return json.loads(final.stdout)

    def unexplained(self, out: dict) -> list[dict]:
        """The differences of a failed verify (``--output json``) that no lost mirror explains:
        each must be one of MIRROR_KINDS at a key whose mirror a shim logged as lost (or an
        allowed unmappable item)."""
        shown = out.get("examples", [])
        if not shown or sum(out.get("counts", {}).values()) != len(shown):
            return shown or [out]  # not every difference listed: none is explained
        lost = self.lost_mirrors.keys | self.frozen_lost_mirrors()
        # Unmappable items are listed too; verify itself holds them to `start --allow-unmappable`.
        return [e for e in shown if e.get("kind") != "unmappable" and (
            e.get("kind") not in MIRROR_KINDS
            or not {json.dumps(e.get(k), sort_keys=True) for k in ("new_key", "old_key")} & lost)]

    def verify_repairing_lost_mirrors(self, *args: str, rounds: int = 3, timeout: float = 180) -> dict:
        """`reshard verify` under the traffic; must pass. Under the late faults with the server
        deadline, a mirror refused past its horizon is a lost mirror by design (LostMirrors):
        when every difference is one of those, do what the operator does -- ``verify --repair``
        -- and verify again (more can be lost meanwhile: ``rounds`` at most). Anything else, or
        without the late faults, fails the test."""
        cmd = ["--output", "json", "verify", self.m.id, *args, "--examples", "1000"]
        for _ in range(rounds):
            r = self.cli(*cmd, timeout=timeout)
            if r.returncode == 0:
                return json.loads(r.stdout)
            try:
                out = json.loads(r.stdout)
            except ValueError:
                out = {}
            unexplained = self.unexplained(out) if self.server_deadline else [out]
            assert not unexplained, (f"verify found differences under live traffic that no lost mirror explains: "
                                     f"{unexplained[:5]} {r.stdout[-3000:]} {r.stderr[-2000:]}")
            repair = self.cli(*cmd, "--repair", timeout=timeout)
            fixed = json.loads(repair.stdout) if repair.stdout.strip().startswith("{") else {}
            self.repairs.append({"differences": out.get("counts"), "repaired": fixed.get("repaired"),
                                 "repair_exit": repair.returncode})
            lost = [e for e in out["examples"] if e.get("kind") != "unmappable"]
            self.log(f"verify: {len(lost)} difference(s), each a mirror the shims logged as lost "
                     f"past its horizon: verify --repair repaired {fixed.get('repaired')} (exit {repair.returncode})")
        raise AssertionError(f"verify did not pass after {rounds} repairs of lost mirrors: {self.repairs}")

    # ------------------------------------------------------------------ a frozen shim
    def start_frozen_shim(self, n_keys: int = 8) -> None:
        """A shim in a process of its own (tests/reliability/frozen_shim.py) putting items on
        keys of its own (beyond the application threads'), to be frozen across phases."""
        base = self.n_items + self.n_inserts
        self.frozen_keys = list(range(base, base + n_keys))
        for i in self.frozen_keys:
            self.oracle.record(i, Write(ABSENT, "initial", -2.0, -1.0, True, None))
        self.frozen_out = self.path.parent / "frozen_shim.jsonl"
        self.frozen_stop = self.path.parent / "frozen_shim.stop"
        cmd = [sys.executable, "-m", "tests.reliability.frozen_shim", "--endpoint", self.proxy.endpoint,
               "--control", self.control, "--migration", str(self.path), "--kind", self.kind,
               "--keys", ",".join(map(str, self.frozen_keys)), "--stop-file", str(self.frozen_stop)]
        with open(self.frozen_out, "w") as out, open(self.path.parent / "frozen_shim.err", "w") as err:
            self.frozen = subprocess.Popen(cmd, env=self.env(), stdout=out, stderr=err, text=True)
        # Until it acted once (it acknowledged the phase): a shim that appears between the
        # operator's census and the move is a refusal (safe, but not this test's point).
        give_up = time.monotonic() + 60
        while '"end"' not in self.frozen_out.read_text():
            assert self.frozen.poll() is None and time.monotonic() < give_up, \
                f"the shim process did not put anything: {self.frozen_err()}"
            time.sleep(0.2)
        self.log(f"shim process {self.frozen.pid} started, putting keys {self.frozen_keys[0]}..{self.frozen_keys[-1]}")

    def frozen_lost_mirrors(self) -> set[str]:
        """The keys of the mirrors the shim process logged as lost (its stderr: Python's
        last-resort handler prints the shim's warnings there)."""
        if self.frozen is None:
            return set()
        text = (self.path.parent / "frozen_shim.err").read_text()
        return {json.dumps(ast.literal_eval(k), sort_keys=True)
                for k in re.findall(r"mirror write of (\{.*?\}\}) to table", text)}

    def frozen_err(self) -> str:
        return (self.path.parent / "frozen_shim.err").read_text()[-3000:]

    def freeze_frozen_shim(self) -> None:
        """SIGSTOP it inside a put (its last line a put's start; else SIGCONT and try again):
        before its first request, between its authoritative write and its mirror, or with a
        request on the wire."""
        for attempt in range(50):
            assert self.frozen.poll() is None, f"the frozen shim ended early: {self.frozen_err()}"
            self.frozen.send_signal(signal.SIGSTOP)
            self.frozen_at = time.monotonic()
            lines = self.frozen_out.read_text().splitlines()
            inside = bool(lines) and '"end"' not in lines[-1]
            if inside:
                break
            self.frozen.send_signal(signal.SIGCONT)
            time.sleep(self.rng.uniform(0.0, 0.05))
        self.log(f"shim process {self.frozen.pid} SIGSTOPped in {self.phase().value}, inside a put: {inside} "
                 f"(try {attempt + 1})")

    def overwrite_frozen_keys(self) -> None:
        """While it is frozen: another shim puts half of its keys and deletes the other half
        (each until acknowledged). Whatever the frozen shim had in flight must not land over
        these: it is late by then (the fleet moved on), and only its horizon can refuse it."""
        dynamo = Dynamo(endpoint_url=self.proxy.endpoint, region="us-east-1", retry=PATIENT)
        writer = ShardedTable(self.m, dynamo, control_table=self.control, refresh_seconds=0.25,
                              liveness_seconds=30.0, writer_id="after-freeze")
        try:
            for n, i in enumerate(self.frozen_keys):
                for attempt in range(5):
                    token = f"over-{i}-{attempt}" if n % 2 else ABSENT
                    item = self.workload.item(i, token, self.rng) if n % 2 else None
                    w = Write(token, "put" if item else "delete", time.monotonic(), math.inf, False, item,
                              f"after-freeze@{writer.phase}", unfenced=unfenced(writer.phase))
                    self.oracle.record(i, w)
                    try:
                        if item:
                            writer.put_item(Item=item)
                        else:
                            writer.delete_item(Key=self.workload.key(i))
                        ok = True
                    except errors.ReshardError:
                        ok = False
                    with self.oracle.lock:
                        w.end, w.acked = time.monotonic(), ok
                        w.unfenced = w.unfenced or unfenced(writer.phase)
                    if ok:
                        self.frozen_final[i] = token
                        break
        finally:
            writer.close()
        self.log(f"overwrote {len(self.frozen_final)} of the frozen shim's {len(self.frozen_keys)} keys in "
                 f"{self.phase().value}")

    def resume_frozen_shim(self) -> dict:
        """SIGCONT it (it finishes the put it was in and starts no other), then record its puts."""
        self.frozen_stop.write_text("stop")
        resumed_at = time.monotonic()
        self.frozen.send_signal(signal.SIGCONT)
        self.frozen.wait(timeout=60)
        assert self.frozen.returncode == 0 and "Traceback" not in self.frozen_err(), self.frozen_err()
        starts, ends = {}, {}
        for line in self.frozen_out.read_text().splitlines():
            r = json.loads(line)
            (ends if "end" in r else starts)[r["token"]] = r
        across = []
        for token, s in starts.items():
            e = ends.get(token, {})
            self.oracle.record(s["i"], Write(token, "put", s["start"], e.get("end", math.inf), e.get("acked", False),
                                             {"op": token}, f"frozen@{s['phase']}", unfenced=unfenced(s["phase"])))
            if s["start"] < self.frozen_at and e.get("end", math.inf) > resumed_at:
                across.append({"token": token, "acked": e.get("acked"), "error": (e.get("error") or "")[:160]})
        self.log(f"the frozen shim resumed and ended: {len(starts)} puts, in flight across the freeze: {across}")
        return {"puts": len(starts), "acked": sum(1 for e in ends.values() if e["acked"]), "across_freeze": across}

    def stop_app(self) -> None:
        for a in self.apps:
            a.stop.set()
        for a in self.apps:
            a.join(30)
            assert not a.is_alive(), f"{a.name} did not stop"
        for s in self.shims:
            s.close()

    def close(self) -> None:
        for a in self.apps:
            a.stop.set()
        if self.frozen is not None and self.frozen.poll() is None:
            self.frozen.send_signal(signal.SIGCONT)
            self.frozen.kill()
            self.frozen.wait(timeout=10)
        for s in self.shims:
            try:
                s.close()
            except Exception:
                pass
        logging.getLogger("reshard.shim").removeHandler(self.lost_mirrors)
        self.watchdog.stop.set()
        self.watchdog.join(5)
        self.proxy.stop()
        self.server.stop()

    # ------------------------------------------------------------------ audit
    def behaviours(self) -> dict:
        """The proxy's counters of its DynamoDB behaviours and late faults that were met."""
        return {k: v for k, v in self.proxy.stats().items()
                if k in ("stale_reads", "stale_items", "partition_throttles", "unprocessed_items", "ttl_deleted",
                         "rule_hold", "rule_lose_answer", "rule_duplicate", "refused_signature") and v}

    def assert_late_faults_met(self, behaviours: dict) -> None:
        """Under the late faults, each kind happened (else a clean audit proves nothing of them)."""
        if self.late_faults:
            assert all(behaviours.get(k, 0) >= 1 for k in ("rule_hold", "rule_lose_answer", "rule_duplicate")), \
                behaviours

    def audit(self, cleaned: bool) -> dict:
        """The final table against the oracle: lost, resurrected, duplicated, leftovers."""
        items = scan(self.raw, self.table)
        layouts = by_layout(self.mapper, items)
        reader = shim(self.m, self.raw, "complete")
        out = {"lost": [], "resurrected": [], "stale": [], "duplicated": [], "old_copies_left": [],
               "unmoved_changed": [], "unmappable_changed": [], "frozen_landed": []}
        moved_n = unmoved_n = 0
        for i in [*range(self.n_items + self.n_inserts), *self.frozen_keys]:
            key = self.workload.key(i)
            got = reader.get_item(Key=key).get("Item")
            problem = self.oracle.check(i, got, math.inf, math.inf)
            if problem:
                out[problem.split(":")[0]].append(problem)
            if i in self.frozen_final and (got.get("op") if got else ABSENT) != self.frozen_final[i]:
                # Nothing wrote it after the overwrite but the frozen shim's late put.
                out["frozen_landed"].append(f"{i}: {got and got.get('op')!r}, not {self.frozen_final[i]!r}")
            fields = self.mapper.logical_fields(to_wire(key))
            ident = self.mapper.identity(fields)
            new = layouts["new"].get(ident, [])
            old = layouts["old"].get(ident, [])
            if len(new) > 1 or len(old) > 1:
                out["duplicated"].append(f"{i}: {len(old)} old, {len(new)} new physical items")
            moves = self.mapper.old.key(fields) != self.mapper.new.key(fields)
            if moves:
                moved_n += 1
                if cleaned and old:
                    out["old_copies_left"].append(f"{i}: {old}")
            else:
                unmoved_n += 1
                # One physical item serves both layouts: same key, unmarked, content = last write
                # (checked through the oracle above).
                if new and (new != old or self.mapper.is_new_copy(new[0])):
                    out["unmoved_changed"].append(f"{i}: old {old} new {new}")
        by_key = {json.dumps({a: it[a] for a in self.mapper.old.key_attrs}, sort_keys=True): it for it in items}
        for u in self.unmappable:
            k = json.dumps({a: u[a] for a in self.mapper.old.key_attrs}, sort_keys=True)
            if by_key.get(k) != u:
                out["unmappable_changed"].append(f"{k}: {by_key.get(k)}")
        out["figures"] = {
            "items_seeded": self.n_items, "insert_keys": self.n_inserts, "moved_keys": moved_n,
            "unmoved_keys": unmoved_n, "physical_items_at_end": len(items),
            "tombstones_at_end": sum(1 for it in items if is_tombstone(it)),
            "ops": total_ops(self.apps), "kills": self.kills, "backfill_runs": self.backfill_runs,
            "faults": self.proxy.faults(), "proxied_calls": self.proxy.counts["calls"],
            "behaviours": self.behaviours(),
            "dynalite_restarts": self.watchdog.restarts, "transitions": self.transitions,
            "read_violations": sum(len(a.violations) for a in self.apps),
            "app_errors": sum(len(a.errors) for a in self.apps),
            "lost_mirrors_logged": len(self.lost_mirrors.keys), "lost_mirror_repairs": self.repairs,
            "abandoned_switches": self.abandoned_switches, "late_window_saves": self.oracle.window_saves[:10],
        }
        return out
