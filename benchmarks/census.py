"""One census poll with junk rows in the application's heartbeat partition, on dynalite (starts its own).

An application may write any row under ``S#<migration id>`` (IAM cannot limit the sort key).
Before issue 30 every census poll (``advance --wait``, a switch, a job's checks) read the
other migrations of the table with a consistent Scan of the *whole* control table -- every
junk row included -- and then the heartbeat rows. Now a wait reads the migrations once, and
each poll only Queries the heartbeat rows (sort key ``S#...``), projected to a heartbeat's
attributes, in bounded pages.

Measured in one run, for each junk size: the wall time and client CPU of one poll the old way
(``list_states()`` Scan + both heartbeat Queries unprojected, as ``census`` sent them) and the
new way (``fleet.census`` with the other migrations read once), the rows the server read for
each poll (ScannedCount: what DynamoDB bills, junk included), and the ratio new/old.

    PYTHONPATH=. python3 benchmarks/census.py                      # 0, 500, 2000 junk rows of 4 KB
    PYTHONPATH=. python3 benchmarks/census.py --junk 0 4000 --row-kb 8 --polls 5

Prints a table and writes JSON to benchmarks/results/census.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from benchmarks._support import setup_migration  # noqa: E402
from reshard.aws.dynamo import Dynamo  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.control import fleet  # noqa: E402
from reshard.control.records import Heartbeat  # noqa: E402


def old_poll(store, mid: str) -> int:
    """What one census poll sent before: a Scan for the migrations, then the heartbeat rows."""
    table = store.load_state(mid).table
    others = [s.id for s in store.list_states() if s.table == table and s.id != mid]
    rows = 0
    for m in [mid, *others]:
        for pk in (store.hpk(m), store.mpk(m)):
            for item in store.query(pk, "S#"):
                Heartbeat.from_item(item)
                rows += 1
    return rows


def timed(fn, polls: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(polls):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def answered(dynamo: Dynamo, fn) -> tuple[int, int]:
    """(bytes of the answers, rows the server read for them: ScannedCount) of one poll."""
    seen, scanned = [], []

    def count(http_response=None, parsed=None, **_):
        seen.append(len(getattr(http_response, "content", b"") or b""))
        scanned.append(int((parsed or {}).get("ScannedCount", 0)))

    dynamo.client.meta.events.register("after-call.dynamodb", count)
    try:
        fn()
    finally:
        dynamo.client.meta.events.unregister("after-call.dynamodb", count)
    return sum(seen), sum(scanned)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--junk", type=int, nargs="+", default=[0, 500, 2000])
    p.add_argument("--row-kb", type=float, default=4.0)
    p.add_argument("--shims", type=int, default=8)
    p.add_argument("--polls", type=int, default=5)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = DynaliteServer(pathlib.Path(tmp))
        server.start()
        try:
            dynamo = Dynamo(endpoint_url=server.endpoint, region="us-east-1")
            for n, junk in enumerate(args.junk):
                m, _, store = setup_migration(dynamo, "sensor", f"census-{n}", f"census-ctl-{n}", f"census-{n}")
                for i in range(args.shims):
                    fleet.heartbeat(store, m.id, f"i-{i}", "backfill", 4, pid=i)
                blob = "x" * int(args.row_kb * 1024)
                for i in range(0, junk, 25):
                    dynamo.batch_write(store.table, [{"PutRequest": {"Item": {
                        "pk": {"S": store.hpk(m.id)}, "sk": {"S": f"junk-{j:06d}"}, "blob": {"S": blob}}}}
                        for j in range(i, min(junk, i + 25))])
                others = fleet.others_on_table(store, m.id)
                old_wall, old_cpu = timed(lambda: old_poll(store, m.id), args.polls)
                new_wall, new_cpu = timed(lambda: fleet.census(store, m.id, 4, others), args.polls)
                old_bytes, old_read = answered(dynamo, lambda: old_poll(store, m.id))
                new_bytes, new_read = answered(dynamo, lambda: fleet.census(store, m.id, 4, others))
                rows.append({"junk_rows": junk, "junk_mb": round(junk * args.row_kb / 1024, 1), "shims": args.shims,
                             "old_poll_s": round(old_wall, 4), "new_poll_s": round(new_wall, 4),
                             "old_cpu_s": round(old_cpu, 4), "new_cpu_s": round(new_cpu, 4),
                             "old_bytes": old_bytes, "new_bytes": new_bytes,
                             "old_rows_read": old_read, "new_rows_read": new_read,
                             "ratio_wall": round(new_wall / old_wall, 3) if old_wall else None})
        finally:
            server.stop()
    print(f"{'junk rows':>9} {'MB':>6} {'old poll s':>10} {'new poll s':>10} {'new/old':>7} {'old cpu s':>9} "
          f"{'new cpu s':>9} {'old rows read':>13} {'new rows read':>13}")
    for r in rows:
        print(f"{r['junk_rows']:>9} {r['junk_mb']:>6} {r['old_poll_s']:>10} {r['new_poll_s']:>10} "
              f"{r['ratio_wall']:>7} {r['old_cpu_s']:>9} {r['new_cpu_s']:>9} {r['old_rows_read']:>13} "
              f"{r['new_rows_read']:>13}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "census.json").write_text(json.dumps({"rows": rows, "row_kb": args.row_kb, "polls": args.polls,
                                                 "load": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
