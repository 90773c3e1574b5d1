"""Latency of the shim per phase, divided by raw boto3 on the same dynalite server.

    PYTHONPATH=. python3 benchmarks/shim.py [--ops 400] [--rounds 8]

Starts its own dynalite, creates the 0001 sensor-events table, and times, interleaved
in rounds (so drift hits every case alike), per-operation latency of:

* raw boto3: ``boto3.resource("dynamodb").Table(...)`` put_item / get_item with the
  physical keys computed by the app (what applications run today); the low-level
  client is timed too, for reference;
* the shim, in each phase as applications run it: a control table (one per phase, the
  migration registered and moved there by the control store), the refresh thread, and every
  request signed by its phase fact's horizon (docs/late-writes.md): steady put/get, dual_write
  put, dual_read get, cutover put, and the catch-up mode (cutover with ``newer_may_be``: a
  consistent BatchGetItem before each write, both layouts read); plus a fan-out query,
  sequential vs the thread pool, and steady put/get of a shim without a control table
  (``*_unsigned``: no facts, no horizon) for the horizon's own cost.

Every request of every path (baselines, shims, the refresh threads) pays an emulated network
round trip (``--latency-ms``, default 3: a ``before-send`` sleep, which botocore and the lean path
both emit), as against DynamoDB; ``--latency-ms 0`` times against dynalite alone.

Ratios are medians over rounds of (shim median ÷ baseline median), against the boto3
resource Table and against the low-level client; the goals are judged against the
low-level client (issue 14): steady <= 1.05x, dual-write put <= 2.05x, dual-read get <= 1.15x.
``cpu us`` is the client's CPU per operation (``time.process_time``: this process, the shims'
refresh threads included, not dynalite's).

With a tracing hook (last, the patch cannot be undone): X-Ray's botocore patch when
``aws_xray_sdk`` is installed (a segment open, sampling off), else a ``functools.wraps`` wrapper
of ``BaseClient._make_api_call`` (what X-Ray, OpenTelemetry and Datadog wrap). ``*_traced``: the
shim as it runs then -- the app's requests through botocore, so the tracer sees them
(reshard/aws/lean.py ``traced``); ``*_traced_lean``: the lean path kept (the tracer blind to
them: what the shim did before), for the cost of the decision; baselines ``client_*_traced``.
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
from reshard.control.records import META  # noqa: E402
from reshard.control.store import ControlStore  # noqa: E402
from reshard.core.migration import load  # noqa: E402
from reshard.core.phases import ORDER, Phase  # noqa: E402
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


def phase_shim(m, dyn, phase: str | None, newer_may_be: str | None = None) -> ShardedTable:
    """A shim of ``m`` on a table of its own, with a control table where the migration is in
    ``phase`` (None: no migration registered: the steady state)."""
    import dataclasses
    label = (phase or "steady") + (f"-{newer_may_be}" if newer_may_be else "")
    m = dataclasses.replace(m, table=f"{m.table}-{label}")
    create_table(dyn, m.table, m.keys)
    store = ControlStore(dyn, f"bench-ctl-{label}")
    store.ensure_table()
    if phase is not None:
        store.register(m)
        for p in ORDER[1:ORDER.index(Phase(phase)) + 1]:
            store.set_phase(store.load_state(m.id), p, "bench", "bench")
        if newer_may_be:
            store.update(store.mpk(m.id), META, "SET newer_may_be = :n", values={":n": {"S": newer_may_be}})
    t = ShardedTable(m, dyn, control_table=store.table)
    assert t.phase == (phase or "steady") and t._phases.facts.dated, (t.phase, phase)
    return t


def _loadavg() -> float:
    try:
        import os
        return round(os.getloadavg()[0], 1)
    except OSError:
        return -1.0


class _Tracer:
    """X-Ray's botocore patch (a segment open while timed), or a wrapper of the same call."""

    def __init__(self):
        try:
            from aws_xray_sdk.core import patch, xray_recorder
        except ImportError:
            import functools

            import botocore.client
            real = botocore.client.BaseClient._make_api_call
            spans = []

            @functools.wraps(real)
            def traced(self, operation_name, api_params):
                t0 = time.perf_counter()
                try:
                    return real(self, operation_name, api_params)
                finally:
                    spans.append((operation_name, time.perf_counter() - t0))
                    del spans[:-1000]
            botocore.client.BaseClient._make_api_call = traced
            self.name, self._recorder = "a functools.wraps wrapper of BaseClient._make_api_call", None
        else:
            import logging
            logging.getLogger("aws_xray_sdk").setLevel(logging.ERROR)  # other shims' refreshes: no segment
            xray_recorder.configure(sampling=False, context_missing="IGNORE_ERROR")
            patch(["botocore"])
            self.name, self._recorder = "X-Ray SDK patch(['botocore']), a segment open", xray_recorder

    def __enter__(self):
        if self._recorder is not None:
            self._recorder.begin_segment("bench")

    def __exit__(self, *exc):
        if self._recorder is not None:
            self._recorder.end_segment()


def _install_tracer() -> _Tracer:
    return _Tracer()


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
    ap.add_argument("--latency-ms", type=float, default=3.0,
                    help="emulated network round trip per request, every path (0: dynalite alone)")
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
        if args.latency_ms > 0:
            def round_trip(**_):
                time.sleep(args.latency_ms / 1000)
            for c in (dyn.client, table.meta.client, client):
                c.meta.events.register("before-send.dynamodb", round_trip)
        shims = {}
        for phase in (None, "dual_write", "dual_read", "cutover"):
            shims[phase or "steady"] = phase_shim(m, dyn, phase)
        shims["catch_up"] = phase_shim(m, dyn, "cutover", newer_may_be="old")
        unsigned = ShardedTable(m, dyn, control_table=None)  # the steady state, no control plane
        pre = [physical(i) for i in range(args.ops)]
        for name in ("steady", "dual_read", "catch_up"):  # items to read exist in both layouts
            writer = ShardedTable(shims[name].migration, dyn, control_table=None)
            writer._pin_phase("dual_write")
            for i in range(args.ops):
                writer.put_item(Item=item(i))
        for i in range(args.ops):
            unsigned.put_item(Item=item(i))
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
            "catch_up_put": lambda i: shims["catch_up"].put_item(Item=item(i)),
            "catch_up_get": lambda i: shims["catch_up"].get_item(Key=keys[i]),
            "steady_put_unsigned": lambda i: unsigned.put_item(Item=item(i)),
            "steady_get_unsigned": lambda i: unsigned.get_item(Key=keys[i]),
        }
        for fn in cases.values():  # warm up connections and caches
            timed(fn, 20)
        medians: dict[str, list[float]] = {c: [] for c in cases}
        cpu: dict[str, float] = {c: 0.0 for c in cases}
        load0 = _loadavg()

        def run_rounds(cases):
            for _ in range(args.rounds):
                for name, fn in cases.items():
                    c0 = time.process_time()
                    medians.setdefault(name, []).append(statistics.median(timed(fn, args.ops)))
                    cpu[name] = cpu.get(name, 0.0) + time.process_time() - c0
        run_rounds(cases)
        # Fan-out query: 16 old + 32 new partitions in dual_read, sequential vs pooled.
        seq = ShardedTable(shims["dual_read"].migration, dyn, control_table=None, query_workers=1)
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
        # With a tracing hook (last: X-Ray's patch cannot be undone).
        tracer = _install_tracer()
        lean_kept = Dynamo(dyn.client, retry=SHIM_RETRIES)
        lean_kept._lean.yield_to_tracers = False  # the tracer is ignored: the lean path as before
        kept = ShardedTable(m, lean_kept, control_table=None)
        traced_shim = ShardedTable(m, dyn, control_table=None)
        assert not dyn._lean.handles("get_item", {}) and lean_kept._lean.handles("get_item", {})
        traced_cases = {
            "client_put_traced": lambda i: client.put_item(TableName=m.table, Item=wire_items[i]),
            "client_get_traced": lambda i: client.get_item(TableName=m.table, Key=wire_pkeys[i]),
            "steady_put_traced": lambda i: traced_shim.put_item(Item=item(i)),
            "steady_get_traced": lambda i: traced_shim.get_item(Key=keys[i]),
            "steady_put_traced_lean": lambda i: kept.put_item(Item=item(i)),
            "steady_get_traced_lean": lambda i: kept.get_item(Key=keys[i]),
        }
        with tracer:
            for fn in traced_cases.values():
                timed(fn, 20)
            run_rounds(traced_cases)
        load1 = _loadavg()
        base = {"put": "raw_put", "get": "raw_get"}
        rows = []
        ops_done = args.ops * args.rounds
        for name in ("steady_put", "steady_get", "dual_write_put", "dual_read_get", "cutover_put", "catch_up_put",
                     "catch_up_get", "steady_put_unsigned", "steady_get_unsigned", "steady_put_traced",
                     "steady_get_traced", "steady_put_traced_lean", "steady_get_traced_lean"):
            op = next(o for o in ("put", "get") if f"_{o}" in name)
            traced = "_traced" in name
            b = "client_" + op + "_traced" if traced else base[op]
            ratio = statistics.median(s / r for s, r in zip(medians[name], medians[b]))
            cb = "client_" + op + ("_traced" if traced else "")
            cratio = statistics.median(s / r for s, r in zip(medians[name], medians[cb]))
            goal = GOALS.get(name.replace("_traced_lean", "").replace("_traced", ""))
            rows.append({"case": name, "shim_ms": statistics.median(medians[name]) * 1000,
                         "raw_ms": statistics.median(medians[b]) * 1000, "ratio": ratio, "ratio_vs_client": cratio,
                         "cpu_us": cpu[name] / ops_done * 1e6, "client_cpu_us": cpu[cb] / ops_done * 1e6,
                         "goal": goal, "meets_goal": None if goal is None else cratio <= goal})
        out = {"server": "dynalite", "ops_per_case_per_round": args.ops, "rounds": args.rounds,
               "latency_ms": args.latency_ms, "tracer": tracer.name, "load_average": [load0, load1],
               "otel": "SDK (in-memory reader)" if args.otel_sdk else "API only (no SDK: no-op)",
               "metrics_cpu_us_per_request": round(metrics_us, 2),
               "baseline": "boto3 resource Table (physical keys computed by the app)", "cases": rows,
               "query_ms": {k: v * 1000 for k, v in q.items()},
               "raw_ms": {k: statistics.median(v) * 1000 for k, v in medians.items()}}
        print(f"round trip {args.latency_ms:g} ms emulated; tracer: {tracer.name}; load average {load0} -> {load1}")
        print(f"{'case':<24}{'shim ms':>9}{'raw ms':>9}{'vs Table':>9}{'vs client':>11}{'goal':>7}{'met':>5}"
              f"{'cpu us':>9}{'client cpu us':>15}")
        for r in rows:
            goal = f"{r['goal']:.2f}" if r["goal"] else "-"
            met = "-" if r["meets_goal"] is None else ("yes" if r["meets_goal"] else "NO")
            print(f"{r['case']:<24}{r['shim_ms']:>9.3f}{r['raw_ms']:>9.3f}{r['ratio']:>9.2f}"
                  f"{r['ratio_vs_client']:>11.2f}{goal:>7}{met:>5}{r['cpu_us']:>9.0f}{r['client_cpu_us']:>15.0f}")
        for k, v in out["query_ms"].items():
            print(f"{k:<32}{v:>9.3f} ms")
        results = ROOT / "benchmarks" / "results"
        results.mkdir(parents=True, exist_ok=True)
        print(f"OpenTelemetry: {out['otel']}; the metrics' client CPU per request: {metrics_us:.2f} us")
        (results / ("shim-otel-sdk.json" if args.otel_sdk else "shim.json")).write_text(json.dumps(out, indent=2))
        for t in (*shims.values(), seq, unsigned, kept, traced_shim):
            t.close()
        return out


if __name__ == "__main__":
    main()
