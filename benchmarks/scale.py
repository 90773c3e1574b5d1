"""Scale benchmark on dynalite (starts its own server): processes, hosts and the budget.

Sections (``--section``, default all that exist here):
  * processes: ``reshard backfill --processes 2`` ÷ ``--processes 1`` in items/s with an
    emulated round trip on every request (goal ≥ 1.7× where the client is the bottleneck),
    client and server CPU per item, peak RSS per process at N and 10×N items (goal ≤ 1.2×).
    See benchmarks/_processes.py.
  * hosts: 1, 2 and 4 ``reshard backfill`` processes started as separate hosts (distinct
    ``--host-id``) on one run under one ``--max-wcu`` set below what one host copies
    unpaced; consumed WCU per 10 s window, counted by a proxy in front of dynalite
    (goal: every window of the first --hosts-seconds within ±5 % of the budget, ≥ 90 % used;
    the run's ending is shown after them). See benchmarks/_hosts.py.

``--server null`` (processes section only): every client talks to the null data server
(benchmarks/_null_server.py, its own process: the data table's Scan from a snapshot, its
writes answered and counted, not stored, the rest forwarded to dynalite), so the client is
the bottleneck, as against DynamoDB, whose side is not one process on the client's cores.

Prints a table with the goals and writes JSON to benchmarks/results/scale.json (scale-null.json).

    PYTHONPATH=. python3 benchmarks/scale.py                      # about 7 minutes
    PYTHONPATH=. python3 benchmarks/scale.py --section processes --items 20000 --latency-ms 5
    PYTHONPATH=. python3 benchmarks/scale.py --section hosts --max-wcu 200 --hosts-seconds 30
    PYTHONPATH=. python3 benchmarks/scale.py --section processes --server null
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from benchmarks import _hosts, _processes  # noqa: E402
from benchmarks._null_server import NullServer  # noqa: E402
from reshard.aws.dynamo import Dynamo, RetryPolicy  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402

SECTIONS = ("processes", "hosts")


def print_table(rows: list[tuple[str, str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    vwidth = max(28, max(len(r[1]) for r in rows))
    print(f"\n{'measure'.ljust(width)}  {'value'.ljust(vwidth)} goal")
    for name, value, goal in rows:
        print(f"{name.ljust(width)}  {value.ljust(vwidth)} {goal}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=SECTIONS, action="append", help="run only this section (repeatable)")
    ap.add_argument("--items", type=int, default=6000, help="processes: items of the P = 2 vs P = 1 comparison")
    ap.add_argument("--rss-items", type=int, default=1500, help="processes: N of the RSS comparison (and 10×N)")
    ap.add_argument("--segments", type=int, default=8, help="processes: --segments")
    ap.add_argument("--workers", type=int, default=4, help="processes: --workers (threads per process)")
    ap.add_argument("--concurrency", type=int, default=8, help="processes: --concurrency")
    ap.add_argument("--page-size", type=int, default=500, help="processes: --page-size")
    ap.add_argument("--repeat", type=int, default=2, help="processes: runs of each P (alternated; the best counts)")
    ap.add_argument("--latency-ms", type=float, default=3.0,
                    help="processes: emulated round trip per request (dynalite on loopback answers in ~1 ms)")
    ap.add_argument("--max-wcu", type=float, default=100,
                    help="hosts: the run's budget (WCU/s); below what one process copies unpaced on a loaded "
                         "2-core machine (about 200 WCU/s through the proxy)")
    ap.add_argument("--hosts-seconds", type=float, default=60,
                    help="hosts: seconds of copying at the budget per host count (plus a tail)")
    ap.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4], help="hosts: the host counts")
    ap.add_argument("--server", choices=("dynalite", "null"), default="dynalite",
                    help="processes: null puts the null data server between the clients and dynalite (the "
                         "data table's scan from a snapshot, its writes answered and counted, not stored)")
    args = ap.parse_args()
    sections = args.section or (["processes"] if args.server == "null" else list(SECTIONS))
    if args.server == "null" and "hosts" in sections:
        ap.error("--server null is for the processes section (the hosts section counts dynalite's consumed WCU)")
    results: dict = {"params": vars(args)}
    table: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server, \
            (NullServer(server.endpoint) if args.server == "null" else contextlib.nullcontext()) as null:
        dynamo = Dynamo(endpoint_url=server.endpoint, region="us-east-1",
                        retry=RetryPolicy(max_attempts=5, base_seconds=0.01))
        if "processes" in sections:
            results["processes"] = _processes.processes_section(server, dynamo, args, null)
            table += _processes.rows(results["processes"])
        if "hosts" in sections:
            results["hosts"] = _hosts.hosts_section(dynamo, server.endpoint, max_wcu=args.max_wcu,
                                                    seconds=args.hosts_seconds, counts=tuple(args.hosts))
            table += _hosts.rows(results["hosts"])
    print_table(table)
    out = ROOT / "benchmarks" / "results" / ("scale-null.json" if null else "scale.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
