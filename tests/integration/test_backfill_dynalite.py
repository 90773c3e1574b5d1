"""The backfill against dynalite: SIGKILL-and-resume, two processes sharing a run, injected faults."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time


from reshard.control.runs import backfill_progress as status
from reshard.aws.dynamo import Dynamo, RetryPolicy, make_client
from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.backfill import BACKFILL

from tests.backfill_support import Shim, diff, expected_table, logical, scan_all, setup_migration
from tests.conftest import ROOT
from reshard.aws.local import DynaliteServer


def _seed(dynamo, shim: Shim, kind: str, n: int, versioned_every: int = 10) -> None:
    """n pre-migration items, batch-written; every ``versioned_every``-th also rewritten through the shim."""
    phys = []
    for i in range(n):
        it = logical(kind, i)
        ident = shim.ident(it)
        p = shim.mapper.to_physical(it, shim.mapper.old, shim._shard(ident))
        shim.model[ident] = p
        phys.append({"PutRequest": {"Item": p}})
    dynamo.batch_write(shim.table, phys)
    for i in range(0, n, versioned_every):
        shim.put(logical(kind, i, temp=i + 1000))


def _cli(endpoint: str, control: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "reshard", "--endpoint-url", endpoint, "--control-table", control, *args]


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION="us-east-1")
    env.pop("AWS_PROFILE", None)
    return env


class Traffic(threading.Thread):
    """Light shim traffic (puts and deletes) until stopped; bounded in count."""

    def __init__(self, shim: Shim, kind: str, n: int, max_ops: int = 3000, pause: float = 0.02):
        super().__init__(daemon=True)
        self.shim, self.kind, self.n, self.max_ops, self.pause = shim, kind, n, max_ops, pause
        self.stop = threading.Event()
        self.ops = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        try:
            while not self.stop.is_set() and self.ops < self.max_ops:
                i = rng.randrange(self.n)
                if rng.random() < 0.7:
                    self.shim.put(logical(self.kind, i, temp=rng.randrange(10 ** 6)))
                else:
                    self.shim.delete(logical(self.kind, i))
                self.ops += 1
                self.stop.wait(self.pause)
        except BaseException as e:  # surfaced by the test
            self.error = e


def test_sigkill_at_random_points_then_resume_loses_and_duplicates_nothing(tmp_path):
    kind, n, segments = "sensor", 9000, 4
    with DynaliteServer(tmp_path / "kill") as server:
        # A patient retry policy rides out dynalite's restarts (see Watchdog).
        dynamo = Dynamo(endpoint_url=server.endpoint, region="us-east-1",
                        retry=RetryPolicy(max_attempts=40, base_seconds=0.05, max_backoff_seconds=0.5))
        m, mapper, store = setup_migration(dynamo, kind, "KillEvents", control="kill-control")
        shim = Shim(dynamo, mapper, m.table, writer="app")
        _seed(dynamo, shim, kind, n)
        traffic = Traffic(shim, kind, n)
        traffic.start()
        watchdog = Watchdog(server)
        watchdog.start()
        cmd = _cli(server.endpoint, "kill-control", "--output", "json", "backfill", m.id, "--segments",
                   str(segments), "--workers", "2", "--page-size", "10", "--lease-seconds", "5")
        rng = random.Random(2024)
        kills, attempts, deadline = 0, 0, time.monotonic() + 60
        while kills < 4 and attempts < 12 and time.monotonic() < deadline:
            attempts += 1
            proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # Kill it while it holds a lease (the interpreter's start-up time varies with the
            # machine's load): wait for its first claim, then a random moment after that.
            mine = f":{proc.pid}:"
            claim_by = time.monotonic() + 15
            while proc.poll() is None and time.monotonic() < claim_by and not any(
                    mine in (s.get("owner") or "") for s in (status(store, m.id) or {}).get("segments", [])):
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.5))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.communicate(timeout=30)
            done = (status(store, m.id) or {}).get("done", 0)
            if done == segments:
                break
        traffic.stop.set()
        traffic.join(20)
        assert traffic.error is None and traffic.ops > 0
        final = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
        assert final.returncode == 0, final.stderr
        summary = json.loads(final.stdout)
        st = status(store, m.id)
        redone = sum(s["takeovers"] for s in st["segments"])
        print(f"\nkill test: {kills} SIGKILLs in {attempts} runs ({watchdog.restarts} dynalite restarts), "
              f"{traffic.ops} shim ops raced, "
              f"{st['totals']['pages']:.0f} pages checkpointed, pages redone after takeovers: {redone}, "
              f"moved {st['totals']['moved']:.0f}")
        assert kills >= 4, f"only {kills} kills landed before the backfill finished"
        assert summary["finished"] and st["done"] == segments and st["finished_at"]
        assert 1 <= redone <= kills * 2          # each kill leaves at most one page per worker to redo
        assert diff(scan_all(dynamo, m.table), expected_table(mapper, shim.model)) == []
        watchdog.stop.set()
        watchdog.join(5)


class Watchdog(threading.Thread):
    """Restarts dynalite (same port, same data directory) whenever it dies.

    dynalite throws, and exits, when a client vanishes mid-request ("Error: aborted" in
    its request handler) -- which a SIGKILLed backfill does. So the kill test also
    proves resumption across server restarts.
    """

    def __init__(self, server: DynaliteServer):
        super().__init__(daemon=True)
        self.server = server
        self.stop = threading.Event()
        self.restarts = 0

    def run(self) -> None:
        while not self.stop.wait(0.05):
            if self.server.proc is not None and self.server.proc.poll() is not None:
                self.restarts += 1
                self.server.start()


def test_two_processes_split_the_segments(dynalite, dynalite_server, unique_name):
    kind, segments = "invoices", 8
    control = f"{unique_name}-ctl"
    m, mapper, store = setup_migration(dynalite, kind, unique_name, control=control, mid=unique_name)
    shim = Shim(dynalite, mapper, m.table)
    _seed(dynalite, shim, kind, 2000)
    # A budget (shared by the run's processes) keeps the copy going for seconds: without it the
    # first process could finish every segment before the second one had even started (CI saw it).
    cmd = _cli(dynalite_server.endpoint, control, "--output", "json", "backfill", m.id, "--segments",
               str(segments), "--workers", "2", "--page-size", "50", "--max-wcu", "200")
    procs = [subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    worked = [set(json.loads(o[0])["worked_here"]) for o in outs]
    assert worked[0] and worked[1], f"one process did all the work: {worked}"
    assert worked[0] & worked[1] == set() and worked[0] | worked[1] == set(range(segments))
    assert all(s["takeovers"] == 0 and s["state"] == "done" for s in status(store, m.id)["segments"])
    assert diff(scan_all(dynalite, m.table), expected_table(mapper, shim.model)) == []


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **kw):
        yield self.data


def _answer(status_code: int, body: dict):
    from botocore.awsrequest import AWSResponse
    return AWSResponse("http://127.0.0.1/", status_code, {"x-amzn-RequestId": "injected"},
                       _Body(json.dumps(body).encode()))


class Faults:
    """A before-send hook: throttles, 5xx, and BatchWriteItem split (part applied, the rest unprocessed)."""

    def __init__(self, endpoint: str, rate: float, seed: int = 3):
        self.rng = random.Random(seed)
        self.rate = rate
        self.plain = make_client(endpoint_url=endpoint, region="us-east-1")  # applies the processed part
        self.counts = {"throttle": 0, "5xx": 0, "split": 0, "passed": 0}
        self.lock = threading.Lock()

    def __call__(self, request, **kwargs):
        op = request.headers.get("X-Amz-Target", b"")
        op = (op.decode() if isinstance(op, bytes) else op).split(".")[-1]
        with self.lock:
            r = self.rng.random()
        if r < self.rate / 3:
            self._count("throttle")
            return _answer(400, {"__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                                 "message": "injected throttle"})
        if r < 2 * self.rate / 3:
            self._count("5xx")
            return _answer(500, {"__type": "com.amazon.coral.service#InternalFailure", "message": "injected"})
        if r < 1.6 * self.rate and op == "BatchWriteItem":
            body = json.loads(request.body)
            (table, reqs), = body["RequestItems"].items()
            if len(reqs) > 1:
                cut = self.rng.randrange(1, len(reqs))
                self.plain.batch_write_item(RequestItems={table: reqs[:cut]})  # really apply only this part
                self._count("split")
                return _answer(200, {"UnprocessedItems": {table: reqs[cut:]},
                                     "ConsumedCapacity": [{"TableName": table, "CapacityUnits": float(cut)}]})
        self._count("passed")
        return None

    def _count(self, k: str) -> None:
        with self.lock:
            self.counts[k] += 1


def test_throttling_5xx_and_split_batches_leave_the_same_result(dynalite, dynalite_server, unique_name):
    kind = "hourly"
    results = {}
    for label, rate in (("clean", 0.0), ("faulty", 0.25)):
        table = f"{unique_name}-{label}"
        m, mapper, store = setup_migration(dynalite, kind, table, control=f"{table}-ctl", mid=table)
        shim = Shim(dynalite, mapper, m.table)
        _seed(dynalite, shim, kind, 600)
        # Bounded timeouts: the jobs' time fence subtracts one attempt's bound from the lease.
        client = make_client(endpoint_url=dynalite_server.endpoint, region="us-east-1", connect_timeout=1,
                             read_timeout=4)
        faults = Faults(dynalite_server.endpoint, rate)
        for op in ("Scan", "BatchWriteItem", "BatchGetItem", "PutItem"):
            client.meta.events.register(f"before-send.dynamodb.{op}", faults)
        data = Dynamo(client, retry=RetryPolicy(max_attempts=12, base_seconds=0.005, max_backoff_seconds=0.1))
        from reshard.control.store import ControlStore
        result = run_job(BACKFILL, data, ControlStore(dynalite, f"{table}-ctl"), m.id,
                                      JobOptions(segments=3, workers=3, page_size=40, max_wcu=5000))
        assert result.done
        assert diff(scan_all(dynalite, m.table), expected_table(mapper, shim.model)) == []
        # The two tables hold the same data; only the seeding time (the versions) and the
        # migration id in the new-copy marker differ.
        results[label] = sorted(json.dumps({k: (a if k != "_rs_new" else "marked") for k, a in v.items()
                                            if k != "_rs_v"}, sort_keys=True)
                                for v in scan_all(dynalite, m.table).values())
        if rate:
            # (BatchWriteItem splits no longer occur: the copy is one fenced PutItem per item.)
            assert faults.counts["throttle"] >= 5 and faults.counts["5xx"] >= 5, faults.counts
            st = status(ControlStore(dynalite, f"{table}-ctl"), m.id)
            assert "throttled on" in result.last_throttle
            # A segment records why the budget slowed it when it checkpointed (the budget's
            # current state, else its latest decision): ops13 made it say "AIMD backing off".
            assert any((s["last_throttle"] or "").startswith(("throttled on", "no throttling", "AIMD backing off"))
                       for s in st["segments"])
    assert results["clean"] == results["faulty"]


def test_cli_counts_collisions_and_fenced_copies_and_status_lists_them(dynalite, dynalite_server, unique_name,
                                                                       capsys):
    """What ``reshard backfill`` and ``reshard status`` print is what the copy counts: copied,
    fenced (a newer write was already at the new key), duplicates and collisions -- and the
    collision's two old keys are listed with a pointer to the runbook (no recopied/undone:
    the read-back that counted them is gone)."""
    from reshard.cli.main import main

    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-c",
                                       mid=unique_name)
    put = lambda it, shard, **kw: dynalite.call(  # noqa: E731
        "put_item", TableName=m.table, Item=mapper.to_physical(dict(it, **kw), mapper.old, shard))
    moving = [it for it in (logical("invoices", i) for i in range(400))
              if int(mapper.new.key(mapper.logical_fields(it))["PK"]["S"].rsplit("#", 1)[1]) >= mapper.old.shards]
    clash, twin, newer = moving[:3]
    put(clash, 1, amount={"N": "1"})       # two pre-migration copies that differ: a collision
    put(clash, 2, amount={"N": "2"})
    put(twin, 3)                           # two that agree: a duplicate
    put(twin, 4)
    put(newer, 5)                          # a shim write already at the new key: the copy is fenced
    shim = Shim(dynalite, mapper, m.table)
    shim.shards[shim.ident(newer)] = 5
    shim.put(dict(newer, amount={"N": "9"}))
    for it in moving[3:8]:
        put(it, 6)

    base = ["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table]
    assert main([*base, "--output", "json", "backfill", m.id, "--segments", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {k: summary[k] for k in ("moved", "copied", "fenced", "duplicates", "collisions")} == \
        {"moved": 10, "copied": 7, "fenced": 1, "duplicates": 1, "collisions": 1}, summary
    assert not {"recopied", "undone"} & set(summary)

    assert main([*base, "backfill", m.id, "--segments", "1"]) == 0   # done already: the same totals, as text
    text = capsys.readouterr().out
    assert "of the moved: copied 7, fenced 1 (a newer write was already at the new key and stays), " \
           "duplicates 1 (same content already there), collisions 1 (not copied)" in text, text
    assert "COLLISIONS: 1 pre-migration item(s)" in text and f"`reshard status {m.id}` lists them" in text
    assert "recopied" not in text and "undone" not in text

    assert main([*base, "status", m.id]) == 0
    status = capsys.readouterr().out
    assert "totals: scanned 11, moved 10, copied 7, fenced 1, duplicates 1, collisions 1" in status, status
    line = next(ln for ln in status.splitlines() if "COLLISIONS" in ln)
    assert line.endswith(": 1") and "incident-unmappable.md" in line
    listed = status.splitlines()[status.splitlines().index(line) + 1]
    assert sorted(listed.strip()[:-len(" differ")].split(" and ")) == \
        ["PK='InvoiceNumber#100000#1', SK='0'", "PK='InvoiceNumber#100000#2', SK='0'"], listed
    assert "unmappable items" not in status       # a collision is not counted as unmappable
    assert main([*base, "--output", "json", "status", m.id]) == 0
    job = next(j for j in json.loads(capsys.readouterr().out)["jobs"] if j["job"] == "backfill")
    assert job["collisions"]["count"] == 1 and job["unmappable"]["count"] == 0
