"""The write pause of the authority switch (backfill -> cutover), on dynalite (starts its own server).

Several application instances (each its own ``ShardedTable`` refreshing every
``--refresh`` seconds) write continuously (``ADD n :1`` on a few hot keys, plus puts)
while the operator advances the migration from ``backfill`` to ``cutover``: the switch
holds every request from the moment a shim sees it until the whole fleet is across.

Measured in the same run: the latency of every write, split into writes that started
during the switch window and the others (the baseline). Reported: the pause (p50, p99,
max) of held writes against the goal p99 <= refresh + 1 s, the baseline latency, the
switch's own duration, and a check that every acknowledged increment counted.

    PYTHONPATH=. python3 benchmarks/switch.py                 # 4 shims, refresh 1 s, ~20 s
    PYTHONPATH=. python3 benchmarks/switch.py --shims 8 --refresh 2 --rounds 3

Prints a table and writes JSON to benchmarks/results/switch.json.
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
from decimal import Decimal

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reshard import errors  # noqa: E402
from reshard.aws import local  # noqa: E402
from reshard.aws.dynamo import Dynamo, RetryPolicy  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.control import fleet  # noqa: E402
from reshard.control.store import ControlStore  # noqa: E402
from reshard.control.transition import transition  # noqa: E402
from reshard.core.migration import load  # noqa: E402
from reshard.core.phases import Action, Phase  # noqa: E402
from reshard.shim.table import ShardedTable  # noqa: E402

OPEN = lambda store, state: {"backfill_missing": None, "verify_missing": None, "cleanup_missing": None}  # noqa: E731


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def one_round(endpoint: str, n_shims: int, refresh: float, name: str) -> dict:
    import dataclasses
    dyn = Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=5, base_seconds=0.01))
    m = dataclasses.replace(load(ROOT / "migrations" / "0001_sensor_events.toml"), table=name)
    local.create_table(dyn, m.table, m.keys)
    store = ControlStore(dyn, f"{name}-ctl")
    store.register(m)
    shims = [ShardedTable(m, Dynamo(endpoint_url=endpoint, region="us-east-1",
                                    retry=RetryPolicy(max_attempts=5, base_seconds=0.01)),
                          control_table=store.table, refresh_seconds=refresh, writer_id=f"w{i}")
             for i in range(n_shims)]
    keys = [{"sensor_id": "s-1", "event_id": f"e-{k}", "ts": f"2024-10-27T15:{k:02d}:00Z"} for k in range(4)]
    try:
        while store.load_state(m.id).phase is not Phase.BACKFILL:
            state = store.load_state(m.id)
            fleet.wait_for_ack(store, m.id, state.phase_version, refresh * 3 + 5, poll=0.1)
            transition(store, m.id, Action.ADVANCE, gates=OPEN, switch_wait=30)
        fleet.wait_for_ack(store, m.id, store.load_state(m.id).phase_version, refresh * 3 + 5, poll=0.1)
        for k in keys:
            shims[0].put_item(Item={**k, "n": Decimal(0)})
        samples: list[tuple[float, float, str]] = []  # (start, seconds, outcome)
        acked = {i: 0 for i in range(len(keys))}
        lock = threading.Lock()
        stop = threading.Event()

        def writer(i: int) -> None:
            t, j = shims[i], 0
            while not stop.is_set():
                k = (i + j) % len(keys)
                j += 1
                start = time.monotonic()
                try:
                    t.update_item(Key=keys[k], UpdateExpression="ADD n :one",
                                  ExpressionAttributeValues={":one": Decimal(1)})
                    outcome = "ok"
                    with lock:
                        acked[k] += 1
                except errors.SwitchInProgress:
                    outcome = "retry"
                with lock:
                    samples.append((start, time.monotonic() - start, outcome))

        threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(n_shims)]
        for th in threads:
            th.start()
        time.sleep(max(2.0, refresh * 1.5))
        switch_start = time.monotonic()
        transition(store, m.id, Action.ADVANCE, gates=OPEN, switch_wait=refresh * 1.2 + 5)
        switch_end = time.monotonic()
        time.sleep(max(2.0, refresh * 1.5))
        stop.set()
        for th in threads:
            th.join(30)
        assert store.load_state(m.id).phase is Phase.CUTOVER
        final = [shims[0].get_item(Key=k, ConsistentRead=True).get("Item")["n"] for k in keys]
        # A write "during the switch" started after the operator's first write and ended
        # after it started; its latency is the pause it saw.
        during = [s for st, s, _ in samples if st >= switch_start - 0.5 and st <= switch_end]
        outside = [s for st, s, _ in samples if st < switch_start - 0.5 or st > switch_end + refresh * 1.3]
        return {"shims": n_shims, "refresh_s": refresh, "writes": len(samples),
                "retryable_errors": sum(1 for *_, o in samples if o == "retry"),
                "switch_s": round(switch_end - switch_start, 3),
                "pause_p50_s": round(pct(during, 50), 3), "pause_p99_s": round(pct(during, 99), 3),
                "pause_max_s": round(max(during, default=0.0), 3),
                "baseline_p50_s": round(pct(outside, 50), 4), "baseline_p99_s": round(pct(outside, 99), 4),
                "goal_p99_s": refresh + 1.0, "increments_lost": sum(acked.values()) - int(sum(final))}
    finally:
        for t in shims:
            t.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shims", type=int, default=4)
    ap.add_argument("--refresh", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = DynaliteServer(tmp)
        server.start()
        try:
            rows = [one_round(server.endpoint, args.shims, args.refresh, f"switch-bench-{r}")
                    for r in range(args.rounds)]
        finally:
            server.stop()
    print(f"{'round':>5} {'shims':>5} {'refresh':>7} {'writes':>6} {'switch s':>8} {'pause p50':>9} "
          f"{'pause p99':>9} {'max':>6} {'goal p99':>8} {'base p50':>8} {'retries':>7} {'lost':>4}")
    for i, r in enumerate(rows):
        print(f"{i:>5} {r['shims']:>5} {r['refresh_s']:>7} {r['writes']:>6} {r['switch_s']:>8} "
              f"{r['pause_p50_s']:>9} {r['pause_p99_s']:>9} {r['pause_max_s']:>6} {r['goal_p99_s']:>8} "
              f"{r['baseline_p50_s']:>8} {r['retryable_errors']:>7} {r['increments_lost']:>4}")
    summary = {"rounds": rows, "pause_p99_s_median": statistics.median(r["pause_p99_s"] for r in rows),
               "goal_p99_s": rows[0]["goal_p99_s"], "met": all(r["pause_p99_s"] <= r["goal_p99_s"] for r in rows),
               "increments_lost": sum(r["increments_lost"] for r in rows)}
    print(f"pause p99 {summary['pause_p99_s_median']} s vs goal {summary['goal_p99_s']} s: "
          f"{'met' if summary['met'] else 'NOT met'}; increments lost: {summary['increments_lost']}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "switch.json").write_text(json.dumps(summary, indent=2))
    return 0 if summary["increments_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
