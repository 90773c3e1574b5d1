"""Scale benchmark on dynalite (starts its own server): processes (and, later, hosts under one budget).

Section "processes" (``reshard backfill --processes P``), in one run on one server, every
request paying the same emulated round trip (``--latency-ms``, default 3 ms: a ``before-send``
sleep that boto3 and reshard's lean path both emit, in every process):
  * items/s of ``--processes 2``  ÷  ``--processes 1`` (today's in-process job), same table
    size, segments, workers and concurrency; wall time of the whole job, child start-up
    included (goal ≥ 1.7× where the client is the bottleneck);
  * where the CPU went: client CPU (the children's ``process_time`` + the parent's) and the
    server's (dynalite's utime + stime from /proc), per item; on a machine whose cores
    dynalite shares, the server's share bounds what a second client process can add;
  * peak RSS per process (each child's ``ru_maxrss``) at N and at 10×N items (goal ≤ 1.2×).

Prints a table with the goals beside the figures and writes JSON to benchmarks/results/scale.json
(one key per section, so a later section adds its own).

    PYTHONPATH=. python3 benchmarks/scale.py                  # default sizes, about a minute
    PYTHONPATH=. python3 benchmarks/scale.py --items 20000 --latency-ms 5
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from benchmarks._support import latency_client, old_items, setup_migration  # noqa: E402
from reshard import operations  # noqa: E402
from reshard.aws.dynamo import Dynamo  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.jobs.runner import JobOptions  # noqa: E402
from reshard.jobs.subscribers import Subscriber  # noqa: E402

KIND = "invoices"  # random suffix 10 -> hashed 20: about 95 % of the items move


def server_cpu(server: DynaliteServer) -> float:
    """dynalite's CPU seconds so far (user + system, from /proc; 0 where there is no /proc)."""
    try:
        fields = pathlib.Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prepare(dynamo: Dynamo, name: str, n: int):
    """A table of n old-layout items and a migration in the backfill phase (own control table)."""
    m, mapper, store = setup_migration(dynamo, KIND, name, control=f"{name}-ctl", mid=name)
    batch = []
    for item in old_items(mapper, KIND, n):
        batch.append({"PutRequest": {"Item": item}})
        if len(batch) == 500:
            dynamo.batch_write(m.table, batch)
            batch = []
    if batch:
        dynamo.batch_write(m.table, batch)
    return m, store


class _Started(Subscriber):
    """When the run's header would print: every precondition passed, the first worker started."""

    at: float | None = None

    def on_run_start(self, run) -> None:
        self.at = time.perf_counter()


def backfill(server: DynaliteServer, plain: Dynamo, name: str, n: int, processes: int, args) -> dict:
    """One ``backfill --processes P`` of n fresh items; wall time, CPU on both sides, RSS per process."""
    m, store = prepare(plain, name, n)
    factory = functools.partial(latency_client, server.endpoint, args.latency_ms)
    dynamo = factory()  # --processes 1: the job runs on this client, in this process
    opts = JobOptions(segments=args.segments, workers=args.workers, page_size=args.page_size,
                      concurrency=args.concurrency, processes=processes)
    started = _Started()
    s0, c0, t0 = server_cpu(server), time.process_time(), time.perf_counter()
    result = operations.run_data_job("backfill", dynamo, store, m.id, opts, subscribers=[started], client=factory)
    elapsed = time.perf_counter() - t0
    parent_cpu, srv = time.process_time() - c0, server_cpu(server) - s0
    assert result.done and result.totals["copied"] == result.totals["moved"], result.totals
    children = result.processes
    client_cpu = parent_cpu + sum(p["cpu_seconds"] for p in children)
    import resource
    rss = [p["maxrss_kb"] for p in children] or [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]
    worked = time.perf_counter() - (started.at or t0)
    return {"processes": processes, "items": n, "moved": int(result.totals["moved"]), "seconds": round(elapsed, 3),
            "items_per_s": round(n / elapsed, 1),
            "seconds_after_start": round(worked, 3), "items_per_s_after_start": round(n / worked, 1),
            "client_cpu_seconds": round(client_cpu, 3), "server_cpu_seconds": round(srv, 3),
            "client_cpu_us_per_item": round(client_cpu / n * 1e6, 1),
            "server_cpu_us_per_item": round(srv / n * 1e6, 1),
            "segments_per_process": [len(p["worked"]) for p in children], "maxrss_kb": rss}


def processes_section(server: DynaliteServer, plain: Dynamo, args) -> tuple[dict, list]:
    """P = 2 vs P = 1 (alternated, best of ``--repeat`` each), then RSS at N and 10×N."""
    runs = {1: [], 2: []}
    for r in range(args.repeat):
        for p in (1, 2):
            runs[p].append(backfill(server, plain, f"p{p}r{r}", args.items, p, args))
    best = {p: max(rs, key=lambda x: x["items_per_s"]) for p, rs in runs.items()}
    rss1 = backfill(server, plain, "rss1", args.rss_items, 2, args)
    rss10 = backfill(server, plain, "rss10", args.rss_items * 10, 2, args)
    growth = max(rss10["maxrss_kb"]) / max(rss1["maxrss_kb"])
    cores = os.cpu_count() or 1
    out = {
        "items_per_s_p1": best[1]["items_per_s"], "items_per_s_p2": best[2]["items_per_s"],
        "ratio_p2_vs_p1": round(best[2]["items_per_s"] / best[1]["items_per_s"], 3),
        "ratio_p2_vs_p1_after_start": round(best[2]["items_per_s_after_start"] / best[1]["items_per_s_after_start"], 3),
        "client_cpu_us_per_item": {"p1": best[1]["client_cpu_us_per_item"], "p2": best[2]["client_cpu_us_per_item"]},
        "server_cpu_us_per_item": {"p1": best[1]["server_cpu_us_per_item"], "p2": best[2]["server_cpu_us_per_item"]},
        # Of the cores' time during the run, how much the client and the server used.
        "cpu_busy_fraction": {f"p{p}": round((b["client_cpu_seconds"] + b["server_cpu_seconds"])
                                              / (b["seconds"] * cores), 3) for p, b in best.items()},
        "rss_kb_per_process_1x": rss1["maxrss_kb"], "rss_kb_per_process_10x": rss10["maxrss_kb"],
        "rss_growth_10x": round(growth, 3), "cores": cores,
        "runs": runs, "rss_runs": [rss1, rss10],
        "goals": {"ratio_p2_vs_p1": ">= 1.7", "rss_growth_10x": "<= 1.2"},
    }
    b1, b2 = best[1], best[2]
    rows = [
        ("emulated round trip per request", f"{args.latency_ms:g} ms", ""),
        (f"backfill items/s, --processes 1 ({args.items} items)", f"{b1['items_per_s']:.0f}", ""),
        (f"backfill items/s, --processes 2 ({args.items} items)", f"{b2['items_per_s']:.0f}", ""),
        ("--processes 2 ÷ --processes 1", f"{out['ratio_p2_vs_p1']:.2f}×", "≥ 1.7×"),
        ("  the same, after the run started (no spawn)", f"{out['ratio_p2_vs_p1_after_start']:.2f}×", "(information)"),
        ("client CPU µs/item  P=1 → P=2", f"{b1['client_cpu_us_per_item']:.0f} → {b2['client_cpu_us_per_item']:.0f}",
         ""),
        ("dynalite CPU µs/item  P=1 → P=2", f"{b1['server_cpu_us_per_item']:.0f} → {b2['server_cpu_us_per_item']:.0f}",
         ""),
        (f"CPU busy of {cores} cores  P=1 → P=2",
         f"{out['cpu_busy_fraction']['p1']:.0%} → {out['cpu_busy_fraction']['p2']:.0%}", "(client + server)"),
        (f"peak RSS per process {args.rss_items} → {args.rss_items * 10} items",
         f"{max(rss1['maxrss_kb']) / 1024:.0f} → {max(rss10['maxrss_kb']) / 1024:.0f} MB ({growth:.2f}×)", "≤ 1.2×"),
    ]
    return out, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=6000, help="items for the P = 2 vs P = 1 comparison")
    ap.add_argument("--rss-items", type=int, default=1500, help="N of the RSS comparison (10×N is also run)")
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4, help="worker threads per process")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each P (alternated; the best counts)")
    ap.add_argument("--latency-ms", type=float, default=3.0,
                    help="emulated network round trip per request (dynalite on loopback answers in ~1 ms)")
    args = ap.parse_args()

    sections, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server:
        plain = Dynamo(endpoint_url=server.endpoint, region="us-east-1")
        sections["processes"], section_rows = processes_section(server, plain, args)
        rows += section_rows
    sections["params"] = vars(args)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure'.ljust(width)}  {'value':<28} goal")
    for name, value, goal in rows:
        print(f"{name.ljust(width)}  {value:<28} {goal}")
    out = ROOT / "benchmarks" / "results" / "scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(sections, indent=2, default=str) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
