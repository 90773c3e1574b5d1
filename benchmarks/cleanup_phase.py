"""The shim's cost in ``cleanup`` / ``complete`` (issue 25's last cases: fenced, with tombstones).

    PYTHONPATH=. python3 benchmarks/cleanup_phase.py [--ops 200] [--rounds 5] [--phases steady,cleanup,complete]

Starts its own dynalite and, per phase (``steady`` for reference, ``cleanup``, ``complete``),
a shim on a table of its own (``benchmarks/shim.phase_shim``). Times, interleaved in rounds:
put, ``ADD`` update and delete of an existing item, a put and an ``ADD`` with an application
condition (always true: ``*_if``) (client CPU per operation:
``time.process_time``, this process; wall median per operation), and one ``batch_writer``
flush of 25 puts (requests sent per flush, counted on the client's ``before-send`` event, which
botocore and reshard's lean path both emit; CPU and wall per flush). Every request pays an
emulated round trip (``--latency-ms``, default 3). Run it on two checkouts (before/after a
change) to compare; prints a table and writes ``benchmarks/results/cleanup_phase.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
from decimal import Decimal

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.shim import item, phase_shim  # noqa: E402
from reshard.aws.dynamo import SHIM_RETRIES, Dynamo  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.core.migration import load  # noqa: E402

FLUSH = 25  # boto3's batch_writer flushes 25 requests at a time


def key(i: int) -> dict:
    it = item(i)
    return {k: it[k] for k in ("sensor_id", "event_id", "ts")}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=200, help="operations per case per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=3.0)
    ap.add_argument("--phases", default="steady,cleanup,complete",
                    help="comma-separated: which phases' shims to time (steady = no migration registered)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cleanup_phase.json"))
    args = ap.parse_args(argv)
    sent = [0]
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server:
        m = load(ROOT / "migrations" / "0001_sensor_events.toml")
        dyn = Dynamo(endpoint_url=server.endpoint, region="us-east-1", retry=SHIM_RETRIES)

        def before_send(**_):
            sent[0] += 1
            if args.latency_ms > 0:
                time.sleep(args.latency_ms / 1000)
        dyn.client.meta.events.register("before-send.dynamodb", before_send)
        phases = [p.strip() for p in args.phases.split(",") if p.strip()]
        shims = {p: phase_shim(m, dyn, None if p == "steady" else p) for p in phases}
        n = args.ops
        cases = {}
        for name, t in shims.items():
            cases[f"{name}_put"] = (lambda t: lambda i: t.put_item(Item=item(i)))(t)
            cases[f"{name}_add"] = (lambda t: lambda i: t.update_item(
                Key=key(i), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": Decimal(1)}))(t)
            # With an application condition (always true here: the write lands): what the
            # condition costs beside the shim's own guards.
            cases[f"{name}_put_if"] = (lambda t: lambda i: t.put_item(
                Item=item(i), ConditionExpression="attribute_not_exists(nope)"))(t)
            cases[f"{name}_add_if"] = (lambda t: lambda i: t.update_item(
                Key=key(i), UpdateExpression="ADD n :one", ConditionExpression="attribute_exists(#t)",
                ExpressionAttributeNames={"#t": "temp"}, ExpressionAttributeValues={":one": Decimal(1)}))(t)
            cases[f"{name}_delete"] = (lambda t: lambda i: t.delete_item(Key=key(i)))(t)

            def flush(i, t=t):
                with t.batch_writer() as b:
                    for j in range(FLUSH):
                        b.put_item(Item=item(n + (i % 8) * FLUSH + j))
            cases[f"{name}_batch_flush"] = flush
        wall: dict[str, list[float]] = {c: [] for c in cases}
        cpu: dict[str, float] = dict.fromkeys(cases, 0.0)
        reqs: dict[str, int] = dict.fromkeys(cases, 0)
        count: dict[str, int] = dict.fromkeys(cases, 0)
        for _ in range(args.rounds):
            for name, fn in cases.items():
                ops = n if not name.endswith("batch_flush") else max(4, n // FLUSH)
                r0, c0, times = sent[0], time.process_time(), []
                for i in range(ops):
                    t0 = time.perf_counter()
                    fn(i)
                    times.append(time.perf_counter() - t0)
                cpu[name] += time.process_time() - c0
                reqs[name] += sent[0] - r0
                count[name] += ops
                wall[name].append(statistics.median(times))
        for t in shims.values():
            t.close()
    out = {name: {"cpu_us_per_op": round(cpu[name] / count[name] * 1e6),
                  "wall_ms_median": round(statistics.median(wall[name]) * 1e3, 2),
                  "requests_per_op": round(reqs[name] / count[name], 2)} for name in cases}
    import os
    loadavg = round(os.getloadavg()[0], 1)
    print(f"{'case':24} {'cpu us/op':>10} {'wall ms':>8} {'requests/op':>12}   (load {loadavg}, latency "
          f"{args.latency_ms} ms, ops {n} x {args.rounds})")
    for name, r in out.items():
        print(f"{name:24} {r['cpu_us_per_op']:>10} {r['wall_ms_median']:>8} {r['requests_per_op']:>12}")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps({"load": loadavg, "args": vars(args), "cases": out}, indent=1))
    return out


if __name__ == "__main__":
    main()
