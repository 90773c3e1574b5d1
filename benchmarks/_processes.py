"""scale.py's "processes" section: ``reshard backfill --processes 2`` against ``--processes 1``.

In one run on one dynalite server, every request paying the same emulated round trip
(a ``before-send`` sleep that boto3 and reshard's lean path both emit, in every process):
  * items/s of ``--processes 2``  ÷  ``--processes 1`` (today's in-process job), same table
    size, segments, workers and concurrency; wall time of the whole job, child start-up
    included (goal ≥ 1.7× where the client is the bottleneck);
  * where the CPU went: client CPU (the children's ``process_time`` + the parent's) and the
    server's (dynalite's utime + stime from /proc), per item, and what that allows whatever
    else runs on the machine: P client processes copy at most P / (client CPU per item)
    items/s, the single-threaded dynalite at most 1 / (its CPU per item), and both share the
    cores; the same model with the server off these cores is the client-bound ratio;
  * peak RSS per process (each child's ``ru_maxrss``) at N and at 10×N items (goal ≤ 1.2×).

With ``--server null`` every client talks to the null data server (benchmarks/_null_server.py:
the data table's Scan from a snapshot, its writes answered and counted, not stored; the rest
forwarded to dynalite): the server's CPU in the model is then the null server's plus what
dynalite still spends on the forwarded control-table requests, and each run asserts from the
null server's counters that every moved item's conditional PutItem reached it.
"""

from __future__ import annotations

import functools
import os
import pathlib
import resource
import time

from benchmarks._support import busy_since, latency_client, machine_cpu, old_items, setup_migration
from reshard import operations
from reshard.aws.dynamo import Dynamo
from reshard.aws.local import DynaliteServer
from reshard.jobs.runner import JobOptions
from reshard.jobs.subscribers import Subscriber

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
    """When the run's header would print (every precondition passed, the first worker started),
    and its work: the first segment's start to the last segment's end (children's events are
    relayed to the parent), so a figure can be split into start-up, work and ending."""

    at: float | None = None
    first: float | None = None
    last: float | None = None

    def on_run_start(self, run) -> None:
        self.at = time.perf_counter()

    def on_segment_start(self, segment, resumed, reason) -> None:
        self.first = self.first or time.perf_counter()

    def on_segment_done(self, segment, counters) -> None:
        self.last = time.perf_counter()


def backfill(server: DynaliteServer, plain: Dynamo, name: str, n: int, processes: int, args, null=None) -> dict:
    """One ``backfill --processes P`` of n fresh items; wall time, CPU on both sides, RSS per process.
    ``null``: a NullServer in front of ``server`` that the clients talk to."""
    m, store = prepare(plain, name, n)
    if null is not None:
        null.snapshot(m.table)
    factory = functools.partial(latency_client, null.endpoint if null else server.endpoint, args.latency_ms)
    dynamo = factory()  # --processes 1: the job runs on this client, in this process
    opts = JobOptions(segments=args.segments, workers=args.workers, page_size=args.page_size,
                      concurrency=args.concurrency, processes=processes)
    started = _Started()
    before = null.stats() if null else None
    s0, c0, t0, m0 = server_cpu(server), time.process_time(), time.perf_counter(), machine_cpu()
    result = operations.run_data_job("backfill", dynamo, store, m.id, opts, subscribers=[started], client=factory)
    elapsed = time.perf_counter() - t0
    parent_cpu, srv, machine = time.process_time() - c0, server_cpu(server) - s0, busy_since(m0)
    assert result.done and result.totals["copied"] == result.totals["moved"], result.totals
    moved = int(result.totals["moved"])
    null_cpu, seen = 0.0, {}
    if null is not None:  # every copy reached the server, conditional (a run cannot pass doing nothing)
        got = null.delta(before)
        assert got["writes"]["PutItem"] >= moved and got["conditional"] >= moved, (moved, got)
        assert got["scans"] > 0 and "scan" not in got["forwarded_data"], got
        null_cpu = got["cpu_seconds"]
        seen = {"null_cpu_us_per_item": round(null_cpu / n * 1e6, 1),
                "null_cpu_us_per_request": round(null_cpu / max(1, got["requests"]) * 1e6, 1),
                "null_requests": got["requests"], "null_puts": got["writes"]["PutItem"],
                "null_conditional": got["conditional"], "forwarded": got["forwarded"]}
    children = result.processes
    client_cpu = parent_cpu + sum(p["cpu_seconds"] for p in children)
    rss = [p["maxrss_kb"] for p in children] or [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]
    end = time.perf_counter()
    worked = end - (started.at or t0)
    work = (started.last - started.first) if started.first and started.last else elapsed
    return {"processes": processes, "items": n, "moved": moved, "seconds": round(elapsed, 3),
            "items_per_s": round(n / elapsed, 1),
            "seconds_after_start": round(worked, 3), "items_per_s_after_start": round(n / worked, 1),
            # first segment start -> last segment done; before it: start-up; after it: the ending
            "work_seconds": round(work, 3), "items_per_s_work": round(n / work, 1),
            "startup_seconds": round((started.first or t0) - t0, 3),
            "ending_seconds": round(end - (started.last or end), 3),
            "client_cpu_seconds": round(client_cpu, 3), "server_cpu_seconds": round(srv, 3),
            "client_cpu_us_per_item": round(client_cpu / n * 1e6, 1),
            "server_cpu_us_per_item": round(srv / n * 1e6, 1),
            "segments_per_process": [len(p["worked"]) for p in children], "maxrss_kb": rss,
            "machine_busy_fraction": machine, **seen}


def processes_section(server: DynaliteServer, plain: Dynamo, args, null=None) -> dict:
    """P = 2 vs P = 1 (alternated, best of ``--repeat`` each), then RSS at N and 10×N
    (``null``: every client through that null server)."""
    runs = {1: [], 2: []}
    for r in range(args.repeat):
        for p in (1, 2):
            runs[p].append(backfill(server, plain, f"p{p}r{r}", args.items, p, args, null))
    best = {p: max(rs, key=lambda x: x["items_per_s"]) for p, rs in runs.items()}
    rss1 = backfill(server, plain, "rss1", args.rss_items, 2, args, null)
    rss10 = backfill(server, plain, "rss10", args.rss_items * 10, 2, args, null)
    cores = os.cpu_count() or 1
    # A CPU model from the measured costs per item (c: client, s: each server process), independent
    # of how busy the machine was: P client processes copy at most P/c items/s (one core each),
    # each single-threaded server at most 1/s, and all of it shares the cores: C/(c+Σs). With the
    # null server, dynalite still answers the forwarded control-table requests: both count.
    c = min(r["client_cpu_us_per_item"] for rs in runs.values() for r in rs) / 1e6
    servers = [min(r["server_cpu_us_per_item"] for rs in runs.values() for r in rs) / 1e6]
    if null is not None:
        servers.append(min(r["null_cpu_us_per_item"] for rs in runs.values() for r in rs) / 1e6)
    s = sum(servers)

    def bound(procs: int, server: bool = True) -> float:
        limits = [procs / c, cores / (c + s) if server else cores / c]
        return min(limits + ([1 / x for x in servers if x] if server else []))
    return {
        "server": "null" if null is not None else "dynalite",
        "items_per_s_p1": best[1]["items_per_s"], "items_per_s_p2": best[2]["items_per_s"],
        "ratio_p2_vs_p1": round(best[2]["items_per_s"] / best[1]["items_per_s"], 3),
        "ratio_p2_vs_p1_after_start": round(best[2]["items_per_s_after_start"] / best[1]["items_per_s_after_start"], 3),
        "ratio_p2_vs_p1_work": round(best[2]["items_per_s_work"] / best[1]["items_per_s_work"], 3),
        "client_cpu_us_per_item": {"p1": best[1]["client_cpu_us_per_item"], "p2": best[2]["client_cpu_us_per_item"]},
        "server_cpu_us_per_item": {"p1": best[1]["server_cpu_us_per_item"], "p2": best[2]["server_cpu_us_per_item"]},
        "model_items_per_s": {"p1": round(bound(1)), "p2": round(bound(2)),
                              "server": round(min(1 / x for x in servers if x))},
        "null_cpu_us_per_item": ({"p1": best[1]["null_cpu_us_per_item"], "p2": best[2]["null_cpu_us_per_item"]}
                                 if null is not None else None),
        "null_cpu_us_per_request": ({"p1": best[1]["null_cpu_us_per_request"], "p2": best[2]["null_cpu_us_per_request"]}
                                    if null is not None else None),
        "model_ratio_p2_vs_p1": round(bound(2) / bound(1), 3),
        # The same clients against a server that neither shares the cores nor saturates (DynamoDB).
        "model_ratio_p2_vs_p1_client_bound": round(bound(2, server=False) / bound(1, server=False), 3),
        # Of the cores' time during the run, how much the client and the server used (the rest:
        # other processes of the machine, or idle).
        "cpu_busy_fraction": {f"p{p}": round((b["client_cpu_seconds"] + b["server_cpu_seconds"]
                                               + b.get("null_cpu_us_per_item", 0) * b["items"] / 1e6)
                                              / (b["seconds"] * cores), 3) for p, b in best.items()},
        "machine_busy_fraction": {f"p{p}": b["machine_busy_fraction"] for p, b in best.items()},
        "loadavg": pathlib.Path("/proc/loadavg").read_text().split()[:3],
        "rss_kb_per_process_1x": rss1["maxrss_kb"], "rss_kb_per_process_10x": rss10["maxrss_kb"],
        "rss_growth_10x": round(max(rss10["maxrss_kb"]) / max(rss1["maxrss_kb"]), 3), "cores": cores,
        "loadavg_1min_at_end": os.getloadavg()[0],
        "params": {k: getattr(args, k) for k in ("items", "rss_items", "segments", "workers", "concurrency",
                                                 "page_size", "repeat", "latency_ms")},
        "runs": runs, "rss_runs": [rss1, rss10],
        "goals": {"ratio_p2_vs_p1": ">= 1.7", "rss_growth_10x": "<= 1.2"},
    }


def rows(out: dict) -> list[tuple[str, str, str]]:
    """The section's lines of scale.py's table: measure, value, goal."""
    p, b = out["params"], {n: max(out["runs"][n], key=lambda x: x["items_per_s"]) for n in (1, 2)}
    rss1, rss10 = max(out["rss_kb_per_process_1x"]), max(out["rss_kb_per_process_10x"])
    null = out.get("server") == "null"
    servers = [("dynalite CPU µs/item  P=1 → P=2" + (" (forwarded requests)" if null else ""),
                f"{b[1]['server_cpu_us_per_item']:.0f} → {b[2]['server_cpu_us_per_item']:.0f}", "")]
    if null:
        servers.insert(0, ("null server CPU µs/item  P=1 → P=2",
                           f"{b[1]['null_cpu_us_per_item']:.0f} → {b[2]['null_cpu_us_per_item']:.0f}",
                           f"({out['null_cpu_us_per_request']['p1']:.0f} → {out['null_cpu_us_per_request']['p2']:.0f}"
                           " µs/request)"))
    return [
        ("server", "null data server" if null else "dynalite", f"load {' '.join(out.get('loadavg', []))}"),
        ("emulated round trip per request", f"{p['latency_ms']:g} ms", ""),
        (f"backfill items/s, --processes 1 ({p['items']} items)", f"{b[1]['items_per_s']:.0f}", ""),
        (f"backfill items/s, --processes 2 ({p['items']} items)", f"{b[2]['items_per_s']:.0f}", ""),
        ("--processes 2 ÷ --processes 1", f"{out['ratio_p2_vs_p1']:.2f}×", "≥ 1.7×"),
        ("  the same, from the header on (no spawn)", f"{out['ratio_p2_vs_p1_after_start']:.2f}×", "(information)"),
        ("  the same, first segment start → last segment done", f"{out['ratio_p2_vs_p1_work']:.2f}×",
         "(information)"),
        ("  seconds of start-up / work / ending  P=1; P=2",
         "; ".join(f"{b[n]['startup_seconds']:.2f} / {b[n]['work_seconds']:.2f} / {b[n]['ending_seconds']:.2f}"
                   for n in (1, 2)), "(information)"),
        ("client CPU µs/item  P=1 → P=2",
         f"{b[1]['client_cpu_us_per_item']:.0f} → {b[2]['client_cpu_us_per_item']:.0f}", ""),
        *servers,
        ("CPU model: items/s at most, P=1 / P=2 / server", f"{out['model_items_per_s']['p1']} / "
         f"{out['model_items_per_s']['p2']} / {out['model_items_per_s']['server']}", "(from CPU per item)"),
        ("  model P=2 ÷ P=1 here (server on the same cores)", f"{out['model_ratio_p2_vs_p1']:.2f}×",
         "(information)"),
        ("  model P=2 ÷ P=1, server off these cores", f"{out['model_ratio_p2_vs_p1_client_bound']:.2f}×",
         "≥ 1.7× (model, not measured)"),
        (f"CPU busy of {out['cores']} cores  P=1 → P=2 (load {out['loadavg_1min_at_end']:.1f})",
         f"{out['cpu_busy_fraction']['p1']:.0%} → {out['cpu_busy_fraction']['p2']:.0%}", "(client + server)"),
        ("  the cores busy, any process  P=1 → P=2", " → ".join(
            f"{x:.0%}" if x is not None else "?" for x in out.get("machine_busy_fraction", {}).values()) or "?",
         "(the rest of it: other load)"),
        (f"peak RSS per process {p['rss_items']} → {p['rss_items'] * 10} items",
         f"{rss1 / 1024:.0f} → {rss10 / 1024:.0f} MB ({out['rss_growth_10x']:.2f}×)", "≤ 1.2×"),
    ]
