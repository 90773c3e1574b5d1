"""Scale benchmark on dynalite (starts its own server): processes, hosts and the budget.

Sections (``--section``, default all that exist here):
  * hosts: 1, 2 and 4 ``reshard backfill`` processes started as separate hosts (distinct
    ``--host-id``) on one run under one ``--max-wcu`` set below what one host copies
    unpaced; consumed WCU per 10 s window, counted by a proxy in front of dynalite
    (goal: every window of the first --hosts-seconds within ±5 % of the budget, ≥ 90 % used;
    the run's ending is shown after them). See benchmarks/_hosts.py.

Prints a table with the goals and writes JSON to benchmarks/results/scale.json.

    PYTHONPATH=. python3 benchmarks/scale.py                      # about 6 minutes
    PYTHONPATH=. python3 benchmarks/scale.py --max-wcu 200 --hosts-seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from benchmarks import _hosts  # noqa: E402
from reshard.aws.dynamo import Dynamo, RetryPolicy  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402

SECTIONS = ("hosts",)


def print_table(rows: list[tuple[str, str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    vwidth = max(28, max(len(r[1]) for r in rows))
    print(f"\n{'measure'.ljust(width)}  {'value'.ljust(vwidth)} goal")
    for name, value, goal in rows:
        print(f"{name.ljust(width)}  {value.ljust(vwidth)} {goal}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=SECTIONS, action="append", help="run only this section (repeatable)")
    ap.add_argument("--max-wcu", type=float, default=100,
                    help="hosts: the run's budget (WCU/s); below what one process copies unpaced on a loaded "
                         "2-core machine (about 200 WCU/s through the proxy)")
    ap.add_argument("--hosts-seconds", type=float, default=60,
                    help="hosts: seconds of copying at the budget per host count (plus a tail)")
    ap.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4], help="hosts: the host counts")
    args = ap.parse_args()
    sections = args.section or list(SECTIONS)
    results: dict = {"params": vars(args)}
    table: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server:
        dynamo = Dynamo(endpoint_url=server.endpoint, region="us-east-1",
                        retry=RetryPolicy(max_attempts=5, base_seconds=0.01))
        if "hosts" in sections:
            results["hosts"] = _hosts.hosts_section(dynamo, server.endpoint, max_wcu=args.max_wcu,
                                                    seconds=args.hosts_seconds, counts=tuple(args.hosts))
            table += _hosts.rows(results["hosts"])
    print_table(table)
    out = ROOT / "benchmarks" / "results" / "scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
