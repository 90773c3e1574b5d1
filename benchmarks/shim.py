"""Latency of the shim per phase, divided by raw boto3 on the same dynalite server.

    PYTHONPATH=. python3 benchmarks/shim.py [--ops 400] [--rounds 8]

Starts its own dynalite, creates the 0001 sensor-events table, and times, interleaved
in rounds (so drift hits every case alike), per-operation latency of:

* raw boto3: ``boto3.resource("dynamodb").Table(...)`` put_item / get_item with the
  physical keys computed by the app (what applications run today); the low-level
  client is timed too, for reference;
* the shim, pinned per phase: steady put/get, dual_write put, dual_read get,
  cutover put (plus a fan-out query, sequential vs the thread pool).

Ratios are medians over rounds of (shim median ÷ baseline median), against the boto3
resource Table and against the low-level client; the goals are judged against the
low-level client (issue 14): steady <= 1.05x, dual-write put <= 2.05x, dual-read get <= 1.15x.
The shim's single-item writes, GetItem and BatchGetItem take reshard's lean request path
(``reshard/aws/lean.py``), which the baselines do not: ratios below 1 are that path's saving;
``RESHARD_LEAN=0`` times the shim on botocore's path instead.
The shim records its metrics through the OpenTelemetry API (reshard/shim/metrics.py): a no-op
without an SDK (the default here); ``--otel-sdk`` installs the SDK's MeterProvider with an
in-memory reader first, so the same table states what the metrics cost when an application
collects them (``results/shim-otel-sdk.json``).
Prints a table and writes ``benchmarks/results/shim.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import statistics
import sys
import tempfile
import time
from decimal import Decimal

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402

from reshard.aws.dynamo import SHIM_RETRIES, Dynamo  # noqa: E402
from reshard.aws.local import DynaliteServer, create_table  # noqa: E402
from reshard.core.migration import load  # noqa: E402
from reshard.shim.table import ShardedTable  # noqa: E402

#: Judged against the low-level client (``ratio_vs_client``).
GOALS = {"steady_put": 1.05, "steady_get": 1.05, "dual_write_put": 2.05, "dual_read_get": 1.15}


def item(i: int) -> dict:
    return {"sensor_id": "s-1", "event_id": f"e-{i}", "ts": f"2024-10-27T15:{i // 60 % 60:02d}:{i % 60:02d}Z",
            "temp": Decimal("21.5"), "unit": "C", "tags": {"a", "b"}}


def physical(i: int) -> dict:
    it = item(i)
    shard = int(hashlib.sha256(it["event_id"].encode()).hexdigest(), 16) % 16
    return {**it, "PK": f"{it['sensor_id']}#{shard}", "SK": it["ts"]}


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=150, help="operations per case per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--otel-sdk", action="store_true",
                    help="install the OpenTelemetry SDK (an in-memory reader) before timing the shim")
    args = ap.parse_args(argv)
    if args.otel_sdk:
        from opentelemetry import metrics as otel
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        otel.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server:
        m = load(ROOT / "migrations" / "0001_sensor_events.toml")
        dyn = Dynamo(endpoint_url=server.endpoint, region="us-east-1", retry=SHIM_RETRIES)
        create_table(dyn, m.table, m.keys)
        res = boto3.resource("dynamodb", endpoint_url=server.endpoint, region_name="us-east-1",
                             aws_access_key_id="x", aws_secret_access_key="x")
        table = res.Table(m.table)
        client = boto3.client("dynamodb", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id="x", aws_secret_access_key="x")
        from reshard.aws.dynamo import to_wire
        shims = {}
        for phase in (None, "dual_write", "dual_read", "cutover"):
            t = ShardedTable(m, dyn, control_table=None)
            t._pin_phase(phase)
            shims[phase or "steady"] = t
        pre = [physical(i) for i in range(args.ops)]
        for i in range(args.ops):  # items to read exist in both layouts (written in dual_write)
            shims["dual_write"].put_item(Item=item(i))
        keys = [{k: item(i)[k] for k in ("sensor_id", "event_id", "ts")} for i in range(args.ops)]
        pkeys = [{"PK": p["PK"], "SK": p["SK"]} for p in pre]
        wire_pkeys = [to_wire(k) for k in pkeys]
        wire_items = [to_wire(p) for p in pre]
        cases = {
            "raw_put": lambda i: table.put_item(Item=physical(i)),
            "raw_get": lambda i: table.get_item(Key=pkeys[i]),
            "client_put": lambda i: client.put_item(TableName=m.table, Item=wire_items[i]),
            "client_get": lambda i: client.get_item(TableName=m.table, Key=wire_pkeys[i]),
            "steady_put": lambda i: shims["steady"].put_item(Item=item(i)),
            "steady_get": lambda i: shims["steady"].get_item(Key=keys[i]),
            "dual_write_put": lambda i: shims["dual_write"].put_item(Item=item(i)),
            "dual_read_get": lambda i: shims["dual_read"].get_item(Key=keys[i]),
            "cutover_put": lambda i: shims["cutover"].put_item(Item=item(i)),
        }
        for fn in cases.values():  # warm up connections and caches
            timed(fn, 20)
        medians: dict[str, list[float]] = {c: [] for c in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                medians[name].append(statistics.median(timed(fn, args.ops)))
        # Fan-out query: 16 old + 32 new partitions in dual_read, sequential vs pooled.
        seq = ShardedTable(m, dyn, control_table=None, query_workers=1)
        seq._pin_phase("dual_read")
        q = {}
        for label, t in (("query_dual_read_sequential", seq), ("query_dual_read_pool8", shims["dual_read"])):
            q[label] = statistics.median(timed(lambda i: t.query(Key={"sensor_id": "s-1"}, Limit=20), 15))
        # What the metrics add to one request, measured alone (client CPU, no server): the two
        # clock reads and the record the public methods' wrapper makes.
        from reshard.shim import metrics as shim_metrics
        n = 20000
        cpu0 = time.process_time()
        for _ in range(n):
            t0 = time.perf_counter()
            shim_metrics.request_done(m.id, "steady", "PutItem", time.perf_counter() - t0)
        metrics_us = (time.process_time() - cpu0) / n * 1e6
        base = {"put": "raw_put", "get": "raw_get"}
        rows = []
        for name in ("steady_put", "steady_get", "dual_write_put", "dual_read_get", "cutover_put"):
            b = base[name.rsplit("_", 1)[1]]
            ratio = statistics.median(s / r for s, r in zip(medians[name], medians[b]))
            cb = "client_" + name.rsplit("_", 1)[1]
            cratio = statistics.median(s / r for s, r in zip(medians[name], medians[cb]))
            rows.append({"case": name, "shim_ms": statistics.median(medians[name]) * 1000,
                         "raw_ms": statistics.median(medians[b]) * 1000, "ratio": ratio, "ratio_vs_client": cratio,
                         "goal": GOALS.get(name), "meets_goal": None if name not in GOALS else cratio <= GOALS[name]})
        out = {"server": "dynalite", "ops_per_case_per_round": args.ops, "rounds": args.rounds,
               "otel": "SDK (in-memory reader)" if args.otel_sdk else "API only (no SDK: no-op)",
               "metrics_cpu_us_per_request": round(metrics_us, 2),
               "baseline": "boto3 resource Table (physical keys computed by the app)", "cases": rows,
               "query_ms": {k: v * 1000 for k, v in q.items()},
               "raw_ms": {k: statistics.median(v) * 1000 for k, v in medians.items()}}
        print(f"{'case':<16}{'shim ms':>9}{'raw ms':>9}{'vs Table':>9}{'vs client':>11}{'goal':>7}")
        for r in rows:
            goal = f"{r['goal']:.2f}" if r["goal"] else "-"
            print(f"{r['case']:<16}{r['shim_ms']:>9.3f}{r['raw_ms']:>9.3f}{r['ratio']:>9.2f}"
                  f"{r['ratio_vs_client']:>11.2f}{goal:>7}")
        for k, v in out["query_ms"].items():
            print(f"{k:<32}{v:>9.3f} ms")
        results = ROOT / "benchmarks" / "results"
        results.mkdir(parents=True, exist_ok=True)
        print(f"OpenTelemetry: {out['otel']}; the metrics' client CPU per request: {metrics_us:.2f} us")
        (results / ("shim-otel-sdk.json" if args.otel_sdk else "shim.json")).write_text(json.dumps(out, indent=2))
        for t in (*shims.values(), seq):
            t.close()
        return out


if __name__ == "__main__":
    main()
