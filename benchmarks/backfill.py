"""Backfill benchmark on dynalite (starts its own server), or on the null data server.

Measures, in one process run on one server, every request paying the same emulated round
trip (``--latency-ms``, default 3 ms, a ``before-send`` sleep that both boto3 and reshard's
lean path emit):
  * client CPU (``time.process_time``) per moved item of ``reshard``'s fenced backfill  ÷
    a plain boto3 conditional ``put_item`` loop (default client, one thread, scan + put_item
    per item; goal ≤ 0.35×);
  * items/s of the backfill  ÷  that naive single-threaded loop (goal ≥ 10×);
  * items/s of the backfill  ÷  an unconditional parallel-scan + BatchWriteItem copy
    (same segments, same threads, same page size; the floor of an unfenced copy);
  * peak RSS of a backfill process at 10× the items  ÷  at 1× (subprocesses, ru_maxrss; goal ≤ 1.2×);
  * consumed WCU per 10 s window with ``--max-wcu`` (goal within ±5 % and ≥ 90 % used).

``--server null`` puts the null data server (benchmarks/_null_server.py, its own process)
between every client and dynalite: the data table's Scan is served from a snapshot and its
writes are answered success without being stored, so the server's CPU is out of the
picture and the client is the bottleneck (as against DynamoDB, whose side is spread over
partitions). Every row goes through it in the same run; each row asserts from the server's
counters that its writes reached it (conditional ones for the backfill and the naive loop).
The RSS and WCU rows are dynalite-only (memory is the client's; the budget needs real
consumed capacity).

Prints a table and writes JSON to benchmarks/results/backfill.json (backfill-null.json).

    PYTHONPATH=. python3 benchmarks/backfill.py            # default sizes, well under 3 minutes
    PYTHONPATH=. python3 benchmarks/backfill.py --items 20000 --wcu-seconds 60
    PYTHONPATH=. python3 benchmarks/backfill.py --server null --skip-rss-wcu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from benchmarks._null_server import NullServer  # noqa: E402
from benchmarks._support import busy_since, machine_cpu, old_items, setup_migration  # noqa: E402
from reshard.aws.dynamo import Dynamo, RetryPolicy  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.errors import UnmappableItem  # noqa: E402

from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.backfill import BACKFILL

KIND = "invoices"  # random suffix 10 -> hashed 20: about 95 % of the items move


#: Requests that paid the emulated round trip (a check that no client went without it).
DELAYED = [0]
LATENCY_MS = [0.0]
_delayed_lock = threading.Lock()


def emulate_latency(botocore_client, latency_ms: float) -> None:
    """A network round trip on every request: a sleep in ``before-send`` (boto3 emits it, and
    so does reshard's lean path, so both sides pay the same)."""
    def delay(**kw):
        with _delayed_lock:
            DELAYED[0] += 1
        time.sleep(latency_ms / 1000)

    if latency_ms > 0:
        LATENCY_MS[0] = latency_ms
        botocore_client.meta.events.register("before-send.dynamodb", delay)


def client(endpoint: str, latency_ms: float = 0.0) -> Dynamo:
    """A reshard client; ``latency_ms`` adds a network round trip to every request (before-send hook)."""
    # Timeouts within a third of the default lease, so run_job keeps this client (and its hook)
    # instead of making a bounded one.
    d = Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(base_seconds=0.02), connect_timeout=5,
               read_timeout=10)
    emulate_latency(d.client, latency_ms)
    return d


def prepare(dynamo: Dynamo, name: str, n: int, null: NullServer | None = None):
    """A table of n old-layout items and a migration in the backfill phase (own control table);
    with ``null``, the null server then serves the table from a snapshot of that state."""
    m, mapper, store = setup_migration(dynamo, KIND, name, control=f"{name}-ctl", mid=name)
    batch = []
    for item in old_items(mapper, KIND, n):
        batch.append({"PutRequest": {"Item": item}})
        if len(batch) == 500:
            dynamo.batch_write(m.table, batch)
            batch = []
    if batch:
        dynamo.batch_write(m.table, batch)
    if null is not None:
        null.snapshot(m.table)
    return m, mapper, store


def null_checked(null: NullServer | None, before: dict | None, *, puts: int = 0, conditional: int = 0,
                 batch_items: int = 0) -> dict:
    """The null server's counters since ``before``, asserting what the row claims reached it: at
    least ``puts`` PutItems, ``conditional`` of them conditional, ``batch_items`` batched puts, and
    every Scan of the data table served from the snapshot (a row cannot pass by doing nothing)."""
    if null is None:
        return {}
    got = null.delta(before)
    assert got["writes"]["PutItem"] >= puts, (puts, got)
    assert got["conditional"] >= conditional, (conditional, got)
    assert got["batch_write_items"] >= batch_items, (batch_items, got)
    assert got["scans"] > 0 and "scan" not in got["forwarded_data"], got
    return {"null_requests": got["requests"], "null_answered": got["null_answered"], "null_writes": got["writes"],
            "null_conditional": got["conditional"], "null_batch_items": got["batch_write_items"],
            "null_scans": got["scans"], "forwarded": got["forwarded"], "forwarded_data": got["forwarded_data"],
            "null_cpu_seconds": round(got["cpu_seconds"], 3),
            "null_cpu_us_per_request": round(got["cpu_seconds"] / max(1, got["requests"]) * 1e6, 1)}


def ours(dynamo, name, n, segments, page_size, concurrency, null=None):
    m, mapper, store = prepare(dynamo, name, n, null)
    before = null.stats() if null else None
    t0, c0, d0, m0 = time.perf_counter(), time.process_time(), DELAYED[0], machine_cpu()
    result = run_job(BACKFILL, dynamo, store, m.id, JobOptions(segments=segments, workers=segments,
                                                               page_size=page_size, concurrency=concurrency))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert result.done
    moved = result.totals["moved"]
    assert result.totals["copied"] == moved, result.totals
    if LATENCY_MS[0] > 0:  # every copy paid the round trip (a bounded client would not have the hook)
        assert DELAYED[0] - d0 >= moved, "the backfill's requests did not pay the emulated round trip"
    seen = null_checked(null, before, puts=moved, conditional=moved)
    return {"items": n, "seconds": elapsed, "items_per_s": n / elapsed, "moved": moved,
            "cpu_us_per_moved_item": cpu / moved * 1e6, "consumed": result.consumed, "client_busy": cpu / elapsed,
            "machine_busy_fraction": busy_since(m0), **seen}


def unconditional(dynamo, name, n, segments, page_size, null=None):
    """The floor: parallel scan + one unconditional BatchWriteItem per page, nothing else."""
    m, mapper, _ = prepare(dynamo, name, n, null)
    new_attrs = mapper.new.key_attrs
    written = [0] * segments
    before = null.stats() if null else None

    def seg(s):
        kw = {"TableName": m.table, "Segment": s, "TotalSegments": segments, "Limit": page_size}
        while True:
            resp = dynamo.call("scan", **kw)
            puts, seen = [], set()
            for item in resp.get("Items", []):
                try:
                    new, moves = mapper.remap(item)
                except UnmappableItem:
                    continue  # an item this copy wrote itself, met again later in the scan
                k = json.dumps([new[a] for a in new_attrs])
                if moves and k not in seen:
                    seen.add(k)
                    puts.append({"PutRequest": {"Item": new}})
            if puts:
                dynamo.batch_write(m.table, puts)
                written[s] += len(puts)
            if not resp.get("LastEvaluatedKey"):
                return
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    t0 = time.perf_counter()
    threads = [threading.Thread(target=seg, args=(s,)) for s in range(segments)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    seen = null_checked(null, before, batch_items=sum(written))
    return {"items": n, "seconds": elapsed, "items_per_s": n / elapsed, "written": sum(written), **seen}


def naive(dynamo, endpoint, latency_ms, name, n, null=None):
    """What people write first, with plain boto3 (default client, one thread): one scan, one
    PutItem per moved item, conditional (onto nothing) like a fenced copy."""
    import boto3
    m, mapper, _ = prepare(dynamo, name, n, null)
    before = null.stats() if null else None
    plain = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    emulate_latency(plain, latency_ms)
    t0, c0 = time.perf_counter(), time.process_time()
    kw, moved = {"TableName": m.table}, 0
    while True:
        resp = plain.scan(**kw)
        for item in resp.get("Items", []):
            try:
                new, moves = mapper.remap(item)
            except UnmappableItem:
                continue
            if moves:
                moved += 1
                plain.put_item(TableName=m.table, Item=new, ConditionExpression="attribute_not_exists(#k)",
                               ExpressionAttributeNames={"#k": mapper.new.key_attrs[0]})
        if not resp.get("LastEvaluatedKey"):
            break
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    seen = null_checked(null, before, puts=moved, conditional=moved)
    return {"items": n, "seconds": elapsed, "items_per_s": n / elapsed, "moved": moved,
            "cpu_us_per_moved_item": cpu / moved * 1e6, **seen}


def rss_child(endpoint: str, name: str, segments: int, page_size: int) -> None:
    """Run in a subprocess: backfill one prepared migration, print peak RSS."""
    dynamo = client(endpoint)
    from reshard.control.store import ControlStore
    result = run_job(BACKFILL, dynamo, ControlStore(dynamo, f"{name}-ctl"), name,
                     JobOptions(segments=segments, workers=segments, page_size=page_size))
    assert result.done
    print(json.dumps({"maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


def rss(dynamo, endpoint, name, n, segments, page_size):
    prepare(dynamo, name, n)
    out = subprocess.run([sys.executable, __file__, "--rss-child", endpoint, name, str(segments), str(page_size)],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return json.loads(out.stdout.strip().splitlines()[-1])["maxrss_kb"]


def wcu_windows(dynamo, name, n, max_wcu, seconds, segments, page_size):
    """Backfill under --max-wcu; consumed WCU (as DynamoDB reported it) per 10 s window."""
    m, _, store = prepare(dynamo, name, n)
    samples: list[tuple[float, float]] = []
    lock = threading.Lock()
    local = threading.local()

    def on_capacity(table, units):
        if table == m.table and getattr(local, "writing", False):
            with lock:
                samples.append((time.monotonic(), units))

    # Attribute units to writes: the listener runs on the calling thread, inside the budget's spend().
    import reshard.jobs.budget as budget_mod
    real_spend = budget_mod.CapacityBudget.spend

    from contextlib import contextmanager

    @contextmanager
    def spend(self, kind, estimate):
        with real_spend(self, kind, estimate):
            local.writing = kind == "write"
            try:
                yield
            finally:
                local.writing = False

    budget_mod.CapacityBudget.spend = spend
    dynamo.add_capacity_listener(on_capacity)
    stop_after = time.monotonic() + seconds
    box = {}

    def run():
        from reshard.jobs.budget import CapacityBudget
        b = CapacityBudget(max_wcu=max_wcu)
        box["result"] = run_job(BACKFILL, dynamo, store, m.id, JobOptions(segments=segments, workers=segments,
                                                                     page_size=page_size, max_wcu=max_wcu),
                                budget=b)

    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds + 5)
    budget_mod.CapacityBudget.spend = real_spend
    done_at = time.monotonic()
    with lock:
        data = list(samples)
    windows = []
    w = 0
    while t0 + (w + 1) * 10 <= min(done_at, stop_after + 5):
        lo, hi = t0 + w * 10, t0 + (w + 1) * 10
        windows.append(sum(u for ts, u in data if lo <= ts < hi) / 10)
        w += 1
    return {"max_wcu": max_wcu, "windows_wcu_per_s": [round(x, 1) for x in windows],
            "finished": not t.is_alive()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=8000, help="items for the throughput comparison")
    ap.add_argument("--naive-items", type=int, default=1500)
    ap.add_argument("--rss-items", type=int, default=1500, help="1× for the RSS test (10× is also run)")
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--max-wcu", type=float, default=150)
    ap.add_argument("--wcu-seconds", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=8, help="the backfill's --concurrency")
    ap.add_argument("--latency-ms", type=float, default=3.0,
                    help="emulated network round trip per request for the three throughput copies "
                         "(dynalite on loopback answers in ~1 ms; DynamoDB in-region is a few ms)")
    ap.add_argument("--skip-rss-wcu", action="store_true", help="only the throughput comparison")
    ap.add_argument("--server", choices=("dynalite", "null"), default="dynalite",
                    help="null: every request through the null data server (the data table's scan from a "
                         "snapshot, its writes answered and counted, not stored; the rest forwarded to "
                         "dynalite), so the client is the bottleneck; implies --skip-rss-wcu")
    ap.add_argument("--rss-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        endpoint, name, seg, page = args.rss_child
        rss_child(endpoint, name, int(seg), int(page))
        return

    if args.server == "null":
        args.skip_rss_wcu = True
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server, \
            (NullServer(server.endpoint) if args.server == "null" else contextlib.nullcontext()) as null:
        endpoint = null.endpoint if null else server.endpoint
        d = client(endpoint, args.latency_ms)
        plain = client(server.endpoint)
        S, P = args.segments, args.page_size
        # Alternate the two fast copies twice and keep each one's best, so neither pays for warm-up.
        runs_ours, runs_base = [], []
        for r in range(2):
            runs_base.append(unconditional(d, f"base{r}", args.items, S, P, null))
            runs_ours.append(ours(d, f"ours{r}", args.items, S, P, args.concurrency, null))
        best_ours = max(runs_ours, key=lambda x: x["items_per_s"])
        best_base = max(runs_base, key=lambda x: x["items_per_s"])
        slow = naive(d, endpoint, args.latency_ms, "naive", args.naive_items, null)
        cpu_ours = min(r["cpu_us_per_moved_item"] for r in runs_ours)
        # The backfill keeps one page per worker in memory, whatever the table size.
        need = int(args.max_wcu * (args.wcu_seconds + 10) * 1.2)
        if args.skip_rss_wcu:
            rss1 = rss10 = 1
            wcu = {"windows_wcu_per_s": []}
        else:
            rss1 = rss(plain, server.endpoint, "rss1", args.rss_items, S, P)
            rss10 = rss(plain, server.endpoint, "rss10", args.rss_items * 10, S, P)
            wcu = wcu_windows(plain, "wcu", need, args.max_wcu, args.wcu_seconds, S, 100)

    full = wcu["windows_wcu_per_s"]
    used = [x / args.max_wcu for x in full]
    results = {
        "backfill_items_per_s": round(best_ours["items_per_s"], 1),
        "unconditional_items_per_s": round(best_base["items_per_s"], 1),
        "naive_items_per_s": round(slow["items_per_s"], 1),
        "ratio_vs_unconditional": round(best_ours["items_per_s"] / best_base["items_per_s"], 3),
        "ratio_vs_naive": round(best_ours["items_per_s"] / slow["items_per_s"], 2),
        "cpu_us_per_moved_item": round(cpu_ours, 1),
        "plain_boto3_cpu_us_per_item": round(slow["cpu_us_per_moved_item"], 1),
        "cpu_ratio_vs_plain_boto3": round(cpu_ours / slow["cpu_us_per_moved_item"], 3),
        "rss_kb_1x": rss1, "rss_kb_10x": rss10,
        "rss_growth_10x": None if args.skip_rss_wcu else round(rss10 / rss1, 3),  # not measured: no figure
        "wcu_budget": args.max_wcu, "wcu_windows": full,
        "wcu_window_fraction_of_budget": [round(u, 3) for u in used],
        "server": args.server, "loadavg": pathlib.Path("/proc/loadavg").read_text().split()[:3],
        "runs": {"ours": runs_ours, "unconditional": runs_base, "naive": slow},
        "params": vars(args) | {"rss_items_10x": args.rss_items * 10, "wcu_items": need},
        "goals": {"cpu_ratio_vs_plain_boto3": "<= 0.35", "ratio_vs_naive": ">= 10",
                  "rss_growth_10x": "<= 1.2", "wcu_window_fraction_of_budget": "within 0.95..1.05"},
    }
    rows = [
        ("server", "null data server" if null else "dynalite", f"load {' '.join(results['loadavg'])}"),
        ("emulated round trip per request", f"{args.latency_ms:g} ms", ""),
        ("backfill items/s", f"{results['backfill_items_per_s']:.0f}", ""),
        ("unconditional scan+batch items/s", f"{results['unconditional_items_per_s']:.0f}", ""),
        ("naive boto3 scan+put_item items/s", f"{results['naive_items_per_s']:.0f}", ""),
        ("backfill ÷ naive", f"{results['ratio_vs_naive']:.1f}×", "≥ 10×"),
        ("client CPU µs per moved item: backfill", f"{results['cpu_us_per_moved_item']:.0f}", ""),
        ("client CPU µs per item: plain boto3 put_item", f"{results['plain_boto3_cpu_us_per_item']:.0f}", ""),
        ("backfill CPU ÷ plain boto3", f"{results['cpu_ratio_vs_plain_boto3']:.2f}×", "≤ 0.35×"),
        ("backfill ÷ unconditional (unfenced floor)", f"{results['ratio_vs_unconditional']:.2f}", "(information)"),
        ("backfill: client busy / the cores busy (any process)",
         f"{best_ours['client_busy']:.2f} cores / {best_ours['machine_busy_fraction'] or 0:.0%}",
         "(other load: the rest)"),
    ]
    if null:
        results["null_cpu_us_per_request"] = {
            "backfill": best_ours["null_cpu_us_per_request"], "unconditional": best_base["null_cpu_us_per_request"],
            "naive": slow["null_cpu_us_per_request"]}
        results["null_cpu_us_per_moved_item"] = round(best_ours["null_cpu_seconds"] / best_ours["moved"] * 1e6, 1)
        rows += [
            ("null server CPU µs/request: backfill / unconditional / naive",
             " / ".join(f"{x:.0f}" for x in results["null_cpu_us_per_request"].values()), "(its own process)"),
            ("null server CPU µs per moved item (backfill)", f"{results['null_cpu_us_per_moved_item']:.0f}",
             "(forwarded control requests included)"),
            ("backfill writes seen by the server (conditional)",
             f"{best_ours['null_writes']['PutItem']} ({best_ours['null_conditional']}) "
             f"for {best_ours['moved']:.0f} moved",
             "≥ moved"),
        ]
    elif not args.skip_rss_wcu:
        rows += [
            (f"peak RSS {args.rss_items} → {args.rss_items * 10} items",
             f"{rss1 / 1024:.0f} → {rss10 / 1024:.0f} MB ({results['rss_growth_10x']:.2f}×)", "≤ 1.2×"),
            (f"WCU/s per 10 s window (budget {args.max_wcu:.0f})", ", ".join(f"{x:.0f}" for x in full) or "-",
             "±5 %, ≥ 90 % used"),
        ]
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure'.ljust(width)}  {'value':<28} goal")
    for name, value, goal in rows:
        print(f"{name.ljust(width)}  {value:<28} {goal}")
    suffix = ("-null" if null else "") + (f"-latency{args.latency_ms:g}ms" if args.latency_ms != 3 else "")
    out = ROOT / "benchmarks" / "results" / f"backfill{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
