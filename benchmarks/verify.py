"""Verify benchmark on dynalite (starts its own server).

Measures, in one process run on one server and one backfilled table:
  * items/s of ``reshard verify``  ÷  a plain parallel Scan of the same table with the same
    segments and threads (the floor: reading every item once, comparing nothing).

Verify reads every item (both layouts live in the table) and, per moved logical item, one
counterpart in a BatchGetItem; differences (none here) get consistent re-reads.

Prints a table and writes JSON to benchmarks/results/verify-KIND.json.

    PYTHONPATH=. python3 benchmarks/verify.py              # default: 6000 items, about a minute
    PYTHONPATH=. python3 benchmarks/verify.py --items 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchmarks.backfill as backfill_bench  # noqa: E402
from benchmarks.backfill import client, prepare  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402


from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.verify import VERIFY


def plain_scan(dynamo, table: str, segments: int, page_size: int) -> int:
    counts = [0] * segments

    def seg(s: int) -> None:
        kw = {"TableName": table, "Segment": s, "TotalSegments": segments, "Limit": page_size}
        while True:
            resp = dynamo.call("scan", **kw)
            counts[s] += len(resp.get("Items", []))
            if not resp.get("LastEvaluatedKey"):
                return
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    threads = [threading.Thread(target=seg, args=(s,)) for s in range(segments)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=6000)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of each (median is reported)")
    ap.add_argument("--kind", choices=["sensor", "invoices", "hourly"], default="sensor",
                    help="which example migration: sensor (calculated suffix, 16 -> 32) reads one counterpart "
                         "per item; invoices (random suffix) reads every old shard from the new side")
    ap.add_argument("--out", default=None, help="default benchmarks/results/verify-KIND.json")
    args = ap.parse_args()
    backfill_bench.KIND = args.kind
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server:
        d = client(server.endpoint)
        m, mapper, store = prepare(d, "benchverify", args.items)
        run_job(BACKFILL, d, store, m.id, JobOptions(segments=args.segments, workers=args.segments,
                                                     page_size=args.page_size))
        scan_rates, verify_rates, scanned = [], [], 0
        for r in range(args.rounds):
            t0 = time.perf_counter()
            scanned = plain_scan(d, m.table, args.segments, args.page_size)
            scan_rates.append(scanned / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            result = run_job(VERIFY, d, store, m.id, JobOptions(segments=args.segments, workers=args.segments,
                                                              page_size=args.page_size))
            assert result.passed, result.counts
            verify_rates.append(result.checked / (time.perf_counter() - t0))
    out = {"migration": args.kind, "items_seeded": args.items, "items_in_table": scanned, "segments": args.segments,
           "plain_scan_items_per_s": round(statistics.median(scan_rates), 1),
           "verify_items_per_s": round(statistics.median(verify_rates), 1),
           "ratio_verify_to_plain_scan": round(statistics.median(verify_rates) / statistics.median(scan_rates), 3),
           "rounds": args.rounds}
    print(f"{'measure':<34}{'value':>12}")
    for k, v in out.items():
        print(f"{k:<34}{v!s:>12}")
    path = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"verify-{args.kind}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
