"""Cleanup benchmark on dynalite (starts its own server): TTL marking, today's way against the fast path.

In one process run on one server, every request paying the same emulated round trip
(``--latency-ms``, default 3 ms, a ``before-send`` sleep that both boto3 and reshard's lean
path emit), two migrations of the same items brought to the ``cleanup`` phase (backfill,
verify, cutover), then one TTL-marking pass each:
  * **before**: what issue 16 started from -- one conditional UpdateItem per item, one after
    the other on each worker's thread, through boto3 (``--concurrency 1``, lean path off);
  * **now**: the same writes, ``--concurrency`` of them in flight per worker, on the lean path.
Both use the same segments and workers. Goal: now ÷ before ≥ 5× items/s.

dynalite has no UpdateTimeToLive, so the pass's one precondition that reads the table's
TTL setting is skipped here (``prepare``); every write is the real, conditional one.

Prints a table and writes JSON to benchmarks/results/cleanup.json.

    PYTHONPATH=. python3 benchmarks/cleanup.py
    PYTHONPATH=. python3 benchmarks/cleanup.py --items 6000 --latency-ms 5
"""

from __future__ import annotations

import argparse
import dataclasses
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

from benchmarks.backfill import DELAYED, client, prepare  # noqa: E402
from reshard import operations  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.core.phases import Action  # noqa: E402
from reshard.jobs.backfill import BACKFILL  # noqa: E402
from reshard.jobs.cleanup import CLEANUP  # noqa: E402
from reshard.jobs.runner import JobOptions, run_job  # noqa: E402
from reshard.jobs.verify import VERIFY  # noqa: E402

#: The cleanup pass without its TTL-setting check (dynalite cannot enable TTL).
CLEANUP_ON_DYNALITE = dataclasses.replace(CLEANUP, prepare=lambda ctx: None)


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


def ttl_pass(dynamo, m, store, segments: int, concurrency: int, server, delete: bool = False) -> dict:
    """One cleanup pass (TTL marking, or ``delete``: conditional DeleteItem of the same old items)."""
    t0, c0, d0, s0 = time.perf_counter(), time.process_time(), DELAYED[0], server_cpu(server)
    result = run_job(CLEANUP_ON_DYNALITE, dynamo, store, m.id,
                     JobOptions(segments=segments, workers=segments, concurrency=concurrency, delete=delete))
    elapsed, cpu, scpu = time.perf_counter() - t0, time.process_time() - c0, server_cpu(server) - s0
    assert result.done, result.as_dict()
    marked = int(result.totals["deleted" if delete else "expiring"])
    assert DELAYED[0] - d0 >= marked, "the pass's requests did not pay the emulated round trip"
    assert marked > 0 and result.totals.get("changed_meanwhile", 0) == 0, result.totals
    return {"marked": marked, "scanned": int(result.totals["scanned"]), "seconds": round(elapsed, 2),
            "items_per_s": marked / elapsed, "cpu_us_per_item": cpu / marked * 1e6,
            "server_cpu_us_per_item": scpu / marked * 1e6, "server_busy": scpu / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency-ms", type=float, default=3.0)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server:
        setup = client(server.endpoint)
        first, first_store = to_cleanup(setup, "cleanup-before", args.items, args.segments)
        second, second_store = to_cleanup(setup, "cleanup-now", args.items, args.segments)
        third, third_store = to_cleanup(setup, "cleanup-delete", args.items, args.segments)
        before_client = client(server.endpoint, args.latency_ms)
        before_client._lean = None  # boto3 for every request, as before the lean path
        before = ttl_pass(before_client, first, first_store, args.segments, 1, server)
        now = ttl_pass(client(server.endpoint, args.latency_ms), second, second_store, args.segments,
                       args.concurrency, server)
        delete = ttl_pass(client(server.endpoint, args.latency_ms), third, third_store, args.segments,
                          args.concurrency, server, delete=True)

    ratio = now["items_per_s"] / before["items_per_s"]
    delete_ratio = delete["items_per_s"] / before["items_per_s"]
    results = {"before": before, "now": now, "delete": delete, "ratio_items_per_s": round(ratio, 2),
               "delete_ratio_items_per_s": round(delete_ratio, 2),
               "params": vars(args), "goals": {"ratio_items_per_s": ">= 5"}}
    rows = [
        ("emulated round trip per request", f"{args.latency_ms:g} ms", ""),
        ("old items marked per pass", f"{now['marked']} of {now['scanned']} scanned", ""),
        ("before: serial boto3 UpdateItem, items/s", f"{before['items_per_s']:.0f}", ""),
        (f"now: lean path, {args.concurrency} in flight/worker, items/s", f"{now['items_per_s']:.0f}", ""),
        ("now ÷ before (TTL marking)", f"{ratio:.1f}×", "≥ 5×"),
        ("--delete (conditional DeleteItem) ÷ before", f"{delete_ratio:.1f}×", ""),
        ("client CPU µs per item: before → now → delete",
         f"{before['cpu_us_per_item']:.0f} → {now['cpu_us_per_item']:.0f} → {delete['cpu_us_per_item']:.0f}", ""),
        ("dynalite CPU µs per item: before → now → delete",
         f"{before['server_cpu_us_per_item']:.0f} → {now['server_cpu_us_per_item']:.0f} → "
         f"{delete['server_cpu_us_per_item']:.0f}", ""),
        ("dynalite busy (CPU s per wall s): before → now → delete",
         f"{before['server_busy']:.2f} → {now['server_busy']:.2f} → {delete['server_busy']:.2f}", "1.00 = its one core"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure'.ljust(width)}  {'value':<26} goal")
    for name, value, goal in rows:
        print(f"{name.ljust(width)}  {value:<26} {goal}")
    out = ROOT / "benchmarks" / "results" / "cleanup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
