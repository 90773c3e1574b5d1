"""Verify benchmark on dynalite (starts its own server): verify at scan cost (issue 16, goal 4).

Measures, in one process run on one server, for a calculated (sensor, 16 -> 32) and a random
(invoices, random 10 -> hashed 20) old layout, each on one backfilled table:

  * items/s of ``reshard verify``  ÷  a plain parallel Scan of the same table with the same
    segments and threads (reading every item once, comparing nothing);        goal >= 0.5
  * RCU per logical item of verify  ÷  that of the plain eventually consistent Scan
    (DynamoDB's ConsumedCapacity as the server reports it);                   goal <= 2.0
  * peak RSS of a verify process at N and at 10 N items (subprocesses, random layout);
    goal: bounded (<= 1.2x at 10x the items).

Verify scans every item once, records (key, side, version, digest) per item in SQLite files,
joins them by logical item and re-reads only items whose records disagree (none here).

Also the client's CPU (``process_time``) per scanned item of each: on a shared machine the
items/s ratio moves with the load, the CPU far less.

A second row per layout: verify as operators run it by default, ``--processes`` = the cores
this process may use (``operations.run_data_job``, each child with its own client and
workers, child start-up included), against the same plain scan -- which stays ONE process
(boto3, the same segments and threads). Its CPU figure adds the children's CPU to the
parent's.

Prints a table with the goals beside the figures and writes JSON to benchmarks/results/verify.json.

    PYTHONPATH=. python3 benchmarks/verify.py              # 6000 items per table, about two minutes
    PYTHONPATH=. python3 benchmarks/verify.py --items 20000 --rounds 3 --rss-items 3000
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import boto3
import botocore.config

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchmarks.backfill as backfill_bench  # noqa: E402
from benchmarks.backfill import client, prepare  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.control.store import ControlStore  # noqa: E402
from benchmarks._support import latency_client  # noqa: E402
from reshard import operations  # noqa: E402
from reshard.jobs.backfill import BACKFILL  # noqa: E402
from reshard.jobs.processes import default_processes  # noqa: E402
from reshard.jobs.runner import JobOptions, run_job  # noqa: E402
from reshard.jobs.verify import VERIFY  # noqa: E402

GOALS = {"items_per_s_ratio": 0.5, "rcu_per_item_ratio": 2.0, "rss_ratio_10x": 1.2}


def plain_scan(boto, table: str, segments: int, page_size: int) -> tuple[int, float]:
    """A plain parallel, eventually consistent Scan through boto3 (what a user would run; not
    reshard's lean path): (items, RCU consumed)."""
    counts, units = [0] * segments, [0.0] * segments

    def seg(s: int) -> None:
        kw = {"TableName": table, "Segment": s, "TotalSegments": segments, "Limit": page_size,
              "ReturnConsumedCapacity": "TOTAL"}
        while True:
            resp = boto.scan(**kw)
            counts[s] += len(resp.get("Items", []))
            units[s] += float(resp.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0))
            if not resp.get("LastEvaluatedKey"):
                return
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    threads = [threading.Thread(target=seg, args=(s,)) for s in range(segments)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), sum(units)


def opts(args, records_dir: str) -> JobOptions:
    return JobOptions(segments=args.segments, workers=args.segments, page_size=args.page_size,
                      records_dir=records_dir)


def measure(server, args, kind: str, records_dir: str) -> dict:
    backfill_bench.KIND = kind
    d = client(server.endpoint)
    name = f"bv{kind}"
    m, mapper, store = prepare(d, name, args.items)
    run_job(BACKFILL, d, store, m.id, JobOptions(segments=args.segments, workers=args.segments,
                                                 page_size=args.page_size))
    scan_rates, verify_rates, scan_rcu, verify_rcu, scanned = [], [], [], [], 0
    scan_cpu, verify_cpu = [], []  # client CPU (process_time) per scanned item, µs
    procs_rates, procs_cpu = [], []  # verify --processes = the cores (children's CPU + the parent's)
    processes = default_processes()
    factory = functools.partial(latency_client, server.endpoint, 0.0)  # each child's own client
    boto = boto3.client("dynamodb", endpoint_url=server.endpoint, region_name="us-east-1",
                        config=botocore.config.Config(max_pool_connections=args.segments))
    for _ in range(args.rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        scanned, units = plain_scan(boto, m.table, args.segments, args.page_size)
        scan_rates.append(scanned / (time.perf_counter() - t0))
        scan_cpu.append((time.process_time() - c0) / scanned * 1e6)
        scan_rcu.append(units)
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_job(VERIFY, d, store, m.id, opts(args, records_dir))
        verify_rates.append(result.checked / (time.perf_counter() - t0))
        verify_cpu.append((time.process_time() - c0) / result.checked * 1e6)
        assert result.passed, result.counts
        verify_rcu.append(result.consumed["rcu"])
        if processes > 1:
            t0, c0 = time.perf_counter(), time.process_time()
            result = operations.run_data_job("verify", d, store, m.id,
                                             dataclasses.replace(opts(args, records_dir), workers=None,
                                                                 processes=processes), client=factory)
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - c0 + sum(p["cpu_seconds"] for p in result.processes)
            assert result.passed and len(result.processes) == processes, (result.counts, result.processes)
            procs_rates.append(result.checked / elapsed)
            procs_cpu.append(cpu / result.checked * 1e6)
    ratio = statistics.median(verify_rates) / statistics.median(scan_rates)
    per_item_scan = statistics.median(scan_rcu) / args.items
    per_item_verify = statistics.median(verify_rcu) / args.items
    return {"migration": kind, "logical_items": args.items, "items_in_table": scanned,
            "plain_scan_items_per_s": round(statistics.median(scan_rates), 1),
            "verify_items_per_s": round(statistics.median(verify_rates), 1),
            "items_per_s_ratio": round(ratio, 3),
            "plain_scan_client_cpu_us_per_item": round(statistics.median(scan_cpu), 1),
            "verify_client_cpu_us_per_item": round(statistics.median(verify_cpu), 1),
            "plain_scan_rcu_per_item": round(per_item_scan, 4), "verify_rcu_per_item": round(per_item_verify, 4),
            "rcu_per_item_ratio": round(per_item_verify / per_item_scan, 3) if per_item_scan else None,
            "processes": processes,
            "verify_processes_items_per_s": round(statistics.median(procs_rates), 1) if procs_rates else None,
            "verify_processes_items_per_s_ratio":
                round(statistics.median(procs_rates) / statistics.median(scan_rates), 3) if procs_rates else None,
            "verify_processes_client_cpu_us_per_item": round(statistics.median(procs_cpu), 1) if procs_cpu else None}


def rss_child(endpoint: str, name: str, segments: int, page_size: int, records_dir: str) -> None:
    """Run in a subprocess: verify one backfilled migration, print peak RSS."""
    d = client(endpoint)
    d.describe_table(f"{name}")  # every module and client loaded: the peak before verify's own work
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_job(VERIFY, d, ControlStore(d, f"{name}-ctl"), name,
                     JobOptions(segments=segments, workers=segments, page_size=page_size, records_dir=records_dir))
    assert result.passed, result.counts
    print(json.dumps({"maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "before_kb": before,
                      "checked": result.checked}))


def rss(server, args, n: int, records_dir: str) -> dict:
    backfill_bench.KIND = "invoices"
    d = client(server.endpoint)
    name = f"bvrss{n}"
    m, _, store = prepare(d, name, n)
    run_job(BACKFILL, d, store, m.id, JobOptions(segments=args.segments, workers=args.segments,
                                                 page_size=args.page_size))
    out = subprocess.run([sys.executable, __file__, "--rss-child", server.endpoint, name, str(args.segments),
                          str(args.page_size), records_dir], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return json.loads(out.stdout.strip().splitlines()[-1])


def loadavg() -> str:
    """This machine's load average (the benchmark shares its cores with whatever else runs)."""
    try:
        return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rss-child":
        endpoint, name, segments, page_size, records_dir = sys.argv[2:7]
        rss_child(endpoint, name, int(segments), int(page_size), records_dir)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=6000, help="logical items per table")
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of each (median is reported)")
    ap.add_argument("--rss-items", type=int, default=2000, help="N of the RSS check (verify at N and 10 N)")
    ap.add_argument("--kinds", default="sensor,invoices")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "verify.json"))
    args = ap.parse_args()
    load_before = loadavg()
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp) / "db") as server:
        rows = [measure(server, args, kind, str(pathlib.Path(tmp) / "records")) for kind in args.kinds.split(",")]
        small = rss(server, args, args.rss_items, str(pathlib.Path(tmp) / "records"))
        large = rss(server, args, 10 * args.rss_items, str(pathlib.Path(tmp) / "records"))
    memory = {"items": [args.rss_items, 10 * args.rss_items], "peak_rss_kb": [small["maxrss_kb"], large["maxrss_kb"]],
              "peak_before_verify_kb": [small["before_kb"], large["before_kb"]],
              "physical_items_checked": [small["checked"], large["checked"]],
              "rss_ratio_10x": round(large["maxrss_kb"] / small["maxrss_kb"], 3)}
    out = {"goals": GOALS, "loadavg": [load_before, loadavg()], "segments": args.segments, "page_size": args.page_size, "rounds": args.rounds,
           "layouts": rows, "memory": memory}
    print(f"{'layout':<10}{'scan it/s':>11}{'verify it/s':>13}{'ratio':>8}{'goal':>7}"
          f"{'scan RCU/it':>13}{'verify RCU/it':>15}{'ratio':>8}{'goal':>7}{'client CPU µs/it scan, verify':>31}")
    for r in rows:
        print(f"{r['migration']:<10}{r['plain_scan_items_per_s']:>11}{r['verify_items_per_s']:>13}"
              f"{r['items_per_s_ratio']:>8}{'>=' + str(GOALS['items_per_s_ratio']):>7}"
              f"{r['plain_scan_rcu_per_item']:>13}{r['verify_rcu_per_item']:>15}"
              f"{r['rcu_per_item_ratio']!s:>8}{'<=' + str(GOALS['rcu_per_item_ratio']):>7}"
              f"{r['plain_scan_client_cpu_us_per_item']:>23}{r['verify_client_cpu_us_per_item']:>8}")
    for r in rows:
        if r["verify_processes_items_per_s"] is not None:
            print(f"{r['migration']:<10}{r['plain_scan_items_per_s']:>11}{r['verify_processes_items_per_s']:>13}"
                  f"{r['verify_processes_items_per_s_ratio']:>8}{'>=' + str(GOALS['items_per_s_ratio']):>7}"
                  f"{'':>43}{r['plain_scan_client_cpu_us_per_item']:>23}"
                  f"{r['verify_processes_client_cpu_us_per_item']:>8}"
                  f"   <- verify --processes {r['processes']} (the default: the cores) vs the plain scan in ONE process")
    print(f"peak RSS of verify (random layout): {memory['peak_rss_kb'][0]} KB at {memory['items'][0]} items, "
          f"{memory['peak_rss_kb'][1]} KB at {memory['items'][1]}: x{memory['rss_ratio_10x']} "
          f"(goal <= x{GOALS['rss_ratio_10x']}); before verify: {memory['peak_before_verify_kb'][0]} and "
          f"{memory['peak_before_verify_kb'][1]} KB")
    print(f"load average (1, 5, 15 min): {out['loadavg'][0]} before, {out['loadavg'][1]} after")
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
