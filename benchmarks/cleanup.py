"""Cleanup benchmark on dynalite (starts its own server), or on the null data server: TTL
marking, today's way against the fast path.

In one process run on one server, every request paying the same emulated round trip
(``--latency-ms``, default 3 ms, a ``before-send`` sleep that both boto3 and reshard's lean
path emit), two migrations of the same items brought to the ``cleanup`` phase (backfill,
verify, cutover), then one TTL-marking pass each:
  * **before**: what issue 16 started from -- one conditional UpdateItem per item, one after
    the other on each worker's thread, through boto3 (``--concurrency 1``, lean path off);
  * **now**: the same writes, ``--concurrency`` of them in flight per worker, on the lean path;
  * **now, --processes 2**: the same pass run by two worker processes (``operations.run_data_job``,
    as ``reshard cleanup --processes 2``), each with its own client, same segments and workers.
Both use the same segments and workers. Goal: now ÷ before ≥ 5× items/s.

dynalite has no DescribeTimeToLive, so every client here answers that one request itself
(a ``before-call`` hook: TTL enabled on the file's attribute) and the pass's precondition
passes; every write is the real, conditional one.

``--server null``: the passes talk to the null data server (benchmarks/_null_server.py, its
own process), which serves the cleaned table's Scan from a snapshot taken once it is in the
cleanup phase and answers its writes without storing them (every condition holds; each pass
asserts from its counters that every mark reached it, conditional); the rest goes on to
dynalite. The server's CPU is then out of the figures, as against DynamoDB.

Prints a table and writes JSON to benchmarks/results/cleanup.json (cleanup-null.json).

    PYTHONPATH=. python3 benchmarks/cleanup.py
    PYTHONPATH=. python3 benchmarks/cleanup.py --items 6000 --latency-ms 5
    PYTHONPATH=. python3 benchmarks/cleanup.py --server null
"""

from __future__ import annotations

import argparse
import contextlib
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

from benchmarks._null_server import NullServer  # noqa: E402
from benchmarks._support import busy_since, machine_cpu  # noqa: E402
from benchmarks.backfill import DELAYED, client, prepare  # noqa: E402
from reshard import operations  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.core.phases import Action  # noqa: E402
from reshard.jobs.backfill import BACKFILL  # noqa: E402
from reshard.jobs.cleanup import CLEANUP  # noqa: E402
from reshard.jobs.runner import JobOptions, run_job  # noqa: E402
from reshard.jobs.subscribers import Subscriber  # noqa: E402
from reshard.jobs.verify import VERIFY  # noqa: E402


class _Answered:
    """The HTTP side of an answer a ``before-call`` hook gives botocore."""
    status_code = 200
    headers: dict = {}


class _Started(Subscriber):
    """When the run's header would print (children started, the first worker running)."""

    at: float | None = None

    def on_run_start(self, run) -> None:
        self.at = time.perf_counter()


def ttl_client(endpoint: str, latency_ms: float, ttl_attribute: str):
    """:func:`benchmarks.backfill.client`, answering DescribeTimeToLive itself (TTL enabled on
    ``ttl_attribute``: dynalite has no TTL). Module-level: a ``--processes`` child builds its own."""
    d = client(endpoint, latency_ms)
    ttl = {"TimeToLiveDescription": {"TimeToLiveStatus": "ENABLED", "AttributeName": ttl_attribute}}
    d.client.meta.events.register("before-call.dynamodb.DescribeTimeToLive",
                                  lambda **kw: (_Answered(), dict(ttl, ResponseMetadata={"HTTPStatusCode": 200})))
    return d


def to_cleanup(dynamo, name: str, n: int, segments: int):
    """A migration of n items in the cleanup phase: backfilled, verified, cut over."""
    m, _, store = prepare(dynamo, name, n)
    opts = JobOptions(segments=segments, workers=segments)
    assert run_job(BACKFILL, dynamo, store, m.id, opts).done
    assert run_job(VERIFY, dynamo, store, m.id, opts).passed
    for _ in range(2):  # backfill -> cutover -> cleanup (no shims: acknowledged at once)
        operations.transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    return m, store


def server_cpu(server) -> float:
    """CPU seconds the dynalite process has used so far (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = pathlib.Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):
        return 0.0


def ttl_pass(dynamo, m, store, segments: int, concurrency: int, server, delete: bool = False, null=None,
             processes: int = 1, factory=None) -> dict:
    """One cleanup pass (TTL marking, or ``delete``: conditional DeleteItem of the same old items);
    ``processes`` > 1: run by that many worker processes, each with a client from ``factory``.
    Client CPU: this process's, plus the children's. ``null``: the NullServer the clients talk to."""
    before = null.stats() if null else None
    t0, c0, d0, s0, m0 = time.perf_counter(), time.process_time(), DELAYED[0], server_cpu(server), machine_cpu()
    opts = JobOptions(segments=segments, workers=segments, concurrency=concurrency, delete=delete, processes=processes)
    started = _Started()
    if processes > 1:
        result = operations.run_data_job("cleanup", dynamo, store, m.id, opts, client=factory, subscribers=[started])
    else:
        result = run_job(CLEANUP, dynamo, store, m.id, opts)
    elapsed, cpu, scpu = time.perf_counter() - t0, time.process_time() - c0, server_cpu(server) - s0
    machine, after_start = busy_since(m0), time.perf_counter() - (started.at or t0)
    cpu += sum(p["cpu_seconds"] for p in getattr(result, "processes", None) or [])
    assert result.done, result.as_dict()
    marked = int(result.totals["deleted" if delete else "expiring"])
    if processes == 1:  # (a child's round trips are counted in the child)
        assert DELAYED[0] - d0 >= marked, "the pass's requests did not pay the emulated round trip"
    assert marked > 0 and result.totals.get("changed_meanwhile", 0) == 0, result.totals
    out = {"marked": marked, "scanned": int(result.totals["scanned"]), "seconds": round(elapsed, 2),
           "items_per_s": marked / elapsed, "cpu_us_per_item": cpu / marked * 1e6,
           "server_cpu_us_per_item": scpu / marked * 1e6, "server_busy": scpu / elapsed, "processes": processes,
           "client_busy": cpu / elapsed, "machine_busy_fraction": machine,
           "seconds_after_start": round(after_start, 2)}
    if null is not None:  # every mark reached the server, conditional: a pass cannot pass doing nothing
        got = null.delta(before)
        writes = got["writes"]["DeleteItem" if delete else "UpdateItem"]
        assert writes >= marked and got["conditional"] >= marked, (marked, got)
        assert got["scans"] > 0 and "scan" not in got["forwarded_data"], got
        out.update(null_writes=writes, null_conditional=got["conditional"], null_requests=got["requests"],
                   forwarded=got["forwarded"], null_cpu_us_per_item=got["cpu_seconds"] / marked * 1e6,
                   null_cpu_us_per_request=got["cpu_seconds"] / max(1, got["requests"]) * 1e6,
                   null_busy=got["cpu_seconds"] / elapsed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency-ms", type=float, default=3.0)
    ap.add_argument("--processes", type=int, default=2, help="the processes of the 'now, --processes P' row (0: none)")
    ap.add_argument("--server", choices=("dynalite", "null"), default="dynalite",
                    help="null: the passes talk to the null data server (the table's scan from a snapshot, its "
                         "writes answered and counted, not stored; the rest forwarded to dynalite)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server, \
            (NullServer(server.endpoint) if args.server == "null" else contextlib.nullcontext()) as null:
        setup = client(server.endpoint)
        names = ["before", "now", "delete"] + (["processes"] if args.processes > 1 else [])
        prepared = {k: to_cleanup(setup, f"cleanup-{k}", args.items, args.segments) for k in names}
        if null:  # the state each pass starts from (cut over, in cleanup), served frozen from now on
            for m, _ in prepared.values():
                null.snapshot(m.table)
        endpoint = null.endpoint if null else server.endpoint
        factory = functools.partial(ttl_client, endpoint, args.latency_ms,
                                    prepared["now"][0].cleanup.ttl_attribute)
        before_client = factory()
        before_client._lean = None  # boto3 for every request, as before the lean path
        before = ttl_pass(before_client, *prepared["before"], args.segments, 1, server, null=null)
        now = ttl_pass(factory(), *prepared["now"], args.segments, args.concurrency, server, null=null)
        delete = ttl_pass(factory(), *prepared["delete"], args.segments, args.concurrency, server, delete=True,
                          null=null)
        procs = (ttl_pass(factory(), *prepared["processes"], args.segments, args.concurrency, server, null=null,
                          processes=args.processes, factory=factory) if args.processes > 1 else None)

    ratio = now["items_per_s"] / before["items_per_s"]
    delete_ratio = delete["items_per_s"] / before["items_per_s"]
    results = {"server": args.server, "loadavg": pathlib.Path("/proc/loadavg").read_text().split()[:3],
               "before": before, "now": now, "delete": delete, "now_processes": procs,
               "ratio_items_per_s": round(ratio, 2), "delete_ratio_items_per_s": round(delete_ratio, 2),
               "processes_ratio_items_per_s": round(procs["items_per_s"] / before["items_per_s"], 2) if procs else None,
               "params": vars(args), "goals": {"ratio_items_per_s": ">= 5"}}
    passes = [before, now, delete] + ([procs] if procs else [])
    arrows = "before → now → delete" + (f" → P={args.processes}" if procs else "")
    rows = [
        ("server", "null data server" if null else "dynalite", f"load {' '.join(results['loadavg'])}"),
        ("emulated round trip per request", f"{args.latency_ms:g} ms", ""),
        ("old items marked per pass", f"{now['marked']} of {now['scanned']} scanned", ""),
        ("before: serial boto3 UpdateItem, items/s", f"{before['items_per_s']:.0f}", ""),
        (f"now: lean path, {args.concurrency} in flight/worker, items/s", f"{now['items_per_s']:.0f}", ""),
        ("now ÷ before (TTL marking)", f"{ratio:.1f}×", "≥ 5×"),
        ("--delete (conditional DeleteItem) ÷ before", f"{delete_ratio:.1f}×", ""),
    ]
    if procs:
        rows.append((f"now, --processes {args.processes}, items/s (÷ before)",
                     f"{procs['items_per_s']:.0f} ({results['processes_ratio_items_per_s']:.1f}×)", "≥ 5×"))
        rows.append(("  its seconds: all / from the header on (no spawn)",
                     f"{procs['seconds']:.2f} / {procs['seconds_after_start']:.2f}", "(information)"))
    rows += [
        (f"client CPU µs per item: {arrows}", " → ".join(f"{x['cpu_us_per_item']:.0f}" for x in passes), ""),
        (f"dynalite CPU µs per item: {arrows}", " → ".join(f"{x['server_cpu_us_per_item']:.0f}" for x in passes),
         "(forwarded requests only)" if null else ""),
        (f"dynalite busy (CPU s per wall s): {arrows}", " → ".join(f"{x['server_busy']:.2f}" for x in passes),
         "1.00 = its one core"),
        (f"client busy (CPU s per wall s): {arrows}", " → ".join(f"{x['client_busy']:.2f}" for x in passes),
         "1.00 = one core"),
        (f"the cores busy, any process: {arrows}",
         " → ".join(f"{x['machine_busy_fraction']:.0%}" if x["machine_busy_fraction"] is not None else "?"
                    for x in passes), "(other load: the rest)"),
    ]
    if null:
        rows += [
            (f"null server CPU µs per item: {arrows}",
             " → ".join(f"{x['null_cpu_us_per_item']:.0f}" for x in passes),
             "(its own process)"),
            (f"null server CPU µs per request: {arrows}",
             " → ".join(f"{x['null_cpu_us_per_request']:.0f}" for x in passes), ""),
            (f"null server busy: {arrows}", " → ".join(f"{x['null_busy']:.2f}" for x in passes), "1.00 = one core"),
        ]
    width = max(len(r[0]) for r in rows)
    vwidth = max(26, max(len(r[1]) for r in rows))
    print(f"\n{'measure'.ljust(width)}  {'value'.ljust(vwidth)} goal")
    for name, value, goal in rows:
        print(f"{name.ljust(width)}  {value.ljust(vwidth)} {goal}")
    out = ROOT / "benchmarks" / "results" / ("cleanup-null.json" if null else "cleanup.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
