"""The fidelity proxy's cost per request, and hot new shards with and without per-key pacing.

Section ``cpu``: the proxy as a process (``python -m reshard.aws.fidelity``) in front of the
null data server (benchmarks/_null_server.py: conditional PutItems of a snapshot table
answered at almost no cost), one client sending ``--requests`` PutItems on the lean path
(keep-alive, one thread), first straight to the null server, then through the proxy with its
switches off (the signature date checked, the Date header set: what every test gets), then
with every DynamoDB behaviour on (stale-read history kept per write, a partition bucket per
key, TTL on). Reported: the proxy's CPU per request (its process's user+system time, from
/proc), the client's CPU per request in each case (what the proxy adds to a test's own
process: nothing but its wait), and wall time per request.

Section ``hot``: the hourly example migrated from 16 shards to 2, every item in one hour (two
new partition keys), backfilled behind the proxy's partition limit (``--limit`` WCU/s per key:
DynamoDB's 1,000 scaled down so a local copy reaches it) without per-key pacing, then paced at
``--pace`` (reshard backfill --max-wcu-per-key). Reported: per-key throttles, the seconds keys
spent throttled (distinct key-seconds with a throttle), the copy's time and items/s.

    PYTHONPATH=. python3 benchmarks/fidelity.py
    PYTHONPATH=. python3 benchmarks/fidelity.py --section cpu --requests 20000

Prints a table and writes JSON to benchmarks/results/fidelity.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time
from decimal import Decimal

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["RESHARD_PROCESSES"] = "1"

from benchmarks._null_server import NullServer  # noqa: E402
from benchmarks._support import busy_since, machine_cpu  # noqa: E402
from benchmarks.scale import print_table  # noqa: E402
from reshard.aws.dynamo import Dynamo, RetryPolicy, to_wire  # noqa: E402
from reshard.aws.fidelity import FidelityProcess  # noqa: E402
from reshard.aws.local import DynaliteServer, create_table  # noqa: E402
from reshard.control.store import ControlStore  # noqa: E402
from reshard.control.transition import transition  # noqa: E402
from reshard.core.layout import KeyMapper  # noqa: E402
from reshard.core.migration import Keys, parse  # noqa: E402
from reshard.core.phases import Action  # noqa: E402
from reshard.jobs.backfill import BACKFILL  # noqa: E402
from reshard.jobs.runner import JobOptions, run_job  # noqa: E402

from benchmarks._support import migration_text  # noqa: E402

EVERY = {"stale_reads": True, "partition_throughput": True, "ttl": True, "ttl_sweep_seconds": 60.0}


def _cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client(endpoint: str) -> Dynamo:
    return Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=5, base_seconds=0.01))


def _puts(dynamo: Dynamo, table: str, n: int) -> tuple[float, float]:
    """n conditional PutItems; (client CPU s, wall s)."""
    c0, t0 = time.process_time(), time.monotonic()
    for i in range(n):
        dynamo.call("put_item", TableName=table, Item={"PK": {"S": f"k{i % 500}"}, "SK": {"S": "1"},
                                                       "v": {"N": str(i)}},
                    ConditionExpression="attribute_not_exists(PK) OR v < :v", ExpressionAttributeValues={":v": {"N": str(i)}})
    return time.process_time() - c0, time.monotonic() - t0


def cpu_section(server: DynaliteServer, args) -> dict:
    table = "fidelity-cpu"
    create_table(_client(server.endpoint), table, Keys("PK", "SK"))
    out: dict = {}
    with NullServer(server.endpoint) as null:
        null.snapshot(table)
        direct = _client(null.endpoint)
        _puts(direct, table, 200)
        cpu, wall = _puts(direct, table, args.requests)
        out["direct"] = {"client_us": cpu / args.requests * 1e6, "wall_us": wall / args.requests * 1e6}
        for label, settings in (("proxy, switches off", {}), ("proxy, every behaviour on", EVERY)):
            with FidelityProcess(null.endpoint, **settings) as proxy:
                client = _client(proxy.endpoint)
                _puts(client, table, 200)  # warm: connections, the table's description
                p0, busy0 = _cpu(proxy.proc.pid), machine_cpu()
                cpu, wall = _puts(client, table, args.requests)
                proxy_cpu = _cpu(proxy.proc.pid) - p0
                out[label] = {"proxy_us": proxy_cpu / args.requests * 1e6, "client_us": cpu / args.requests * 1e6,
                              "wall_us": wall / args.requests * 1e6, "machine_busy": busy_since(busy0),
                              "stats": {k: v for k, v in proxy.stats().items() if k in ("requests", "stale_history_keys",
                                                                                         "partition_buckets")}}
    return out


def cpu_rows(r: dict) -> list[tuple[str, str, str]]:
    rows = [("client CPU/request, straight to the null server", f"{r['direct']['client_us']:.0f} µs", "")]
    for label in ("proxy, switches off", "proxy, every behaviour on"):
        x = r[label]
        rows.append((f"proxy CPU/request, {label[7:]}", f"{x['proxy_us']:.0f} µs (client {x['client_us']:.0f} µs, "
                     f"wall {x['wall_us']:.0f} µs)", "below the client's"))
    return rows


def hot_section(server: DynaliteServer, args) -> dict:
    raw = _client(server.endpoint)
    out = {}
    for label, pace in (("unpaced", None), ("paced", args.pace)):
        table = f"fidelity-hot-{label}"
        m = parse(migration_text("hourly", table, table).replace("shards = 64", "shards = 2"), "<hot>")
        mapper = KeyMapper(m)
        create_table(raw, table, m.keys)
        store = ControlStore(raw, table + "-ctl")
        store.register(m)
        for _ in range(3):
            transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
        reqs = []
        for i in range(args.items):
            logical = {"sensor_id": f"s-{i % 37}", "ts": f"2024-10-27T15:{(i // 60) % 60:02d}:{i % 60:02d}.{i:06d}Z",
                       "event_id": f"e-{i}", "temp": Decimal(i)}
            reqs.append({"PutRequest": {"Item": mapper.to_physical(to_wire(logical), mapper.old)}})
        raw.batch_write(table, reqs)
        with FidelityProcess(server.endpoint, partition_throughput=True, partition_wcu=args.limit,
                             partition_tables=[table]) as proxy:
            data = Dynamo(endpoint_url=proxy.endpoint, region="us-east-1", connect_timeout=1, read_timeout=4,
                          retry=RetryPolicy(max_attempts=60, max_seconds=120, base_seconds=0.01,
                                            max_backoff_seconds=0.2))
            t0 = time.monotonic()
            result = run_job(BACKFILL, data, store, m.id, JobOptions(segments=4, workers=4, concurrency=4,
                                                                     page_size=100, max_wcu_per_key=pace))
            elapsed = time.monotonic() - t0
            stats = proxy.stats()
        copied = int(result.totals.get("copied", 0))
        out[label] = {"copied": copied, "elapsed_s": round(elapsed, 2), "items_per_s": round(copied / elapsed, 1),
                      "throttles": stats["throttle_reasons"].get("TableWriteKeyRangeThroughputExceeded", 0),
                      "throttled_key_seconds": stats["throttled_key_seconds"], "pace": pace, "limit": args.limit}
    return out


def hot_rows(r: dict) -> list[tuple[str, str, str]]:
    u, p = r["unpaced"], r["paced"]
    return [
        (f"hot new shards: 2 new keys, limit {u['limit']:g} WCU/s/key, unpaced",
         f"{u['throttles']} throttles, {u['throttled_key_seconds']} key-seconds throttled, "
         f"{u['copied']} copied in {u['elapsed_s']} s", ""),
        (f"hot new shards: paced at {p['pace']:g} WCU/s/key (--max-wcu-per-key)",
         f"{p['throttles']} throttles, {p['throttled_key_seconds']} key-seconds throttled, "
         f"{p['copied']} copied in {p['elapsed_s']} s", "no key over its limit for long"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=("cpu", "hot"), action="append", help="run only this section (repeatable)")
    ap.add_argument("--requests", type=int, default=5000, help="cpu: PutItems per case")
    ap.add_argument("--items", type=int, default=300, help="hot: items copied into the two new keys")
    ap.add_argument("--limit", type=float, default=10.0, help="hot: the proxy's limit per key, WCU/s")
    ap.add_argument("--pace", type=float, default=8.0, help="hot: --max-wcu-per-key of the paced run")
    args = ap.parse_args()
    sections = args.section or ["cpu", "hot"]
    results: dict = {"params": vars(args), "load_before": os.getloadavg()}
    rows: list = []
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server:
        if "cpu" in sections:
            results["cpu"] = cpu_section(server, args)
            rows += cpu_rows(results["cpu"])
        if "hot" in sections:
            results["hot"] = hot_section(server, args)
            rows += hot_rows(results["hot"])
    results["load_after"] = os.getloadavg()
    print_table(rows)
    print(f"load average before {results['load_before'][0]:.1f}, after {results['load_after'][0]:.1f}")
    out = ROOT / "benchmarks" / "results" / "fidelity.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
