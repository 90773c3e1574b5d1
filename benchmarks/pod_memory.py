"""Memory of one ``reshard backfill --processes P`` as a container sees it (starts its own dynalite).

The Kubernetes recipe (deploy/kubernetes/backfill-indexed-job.yaml) sets ``--processes`` to the
container's CPU limit; its memory limit must hold the whole process tree: the command's own
process plus P worker processes. This runs the real command line (a subprocess, as the pod
does) against a fresh table of ``--items`` items per P, samples the resident memory (VmRSS) of
every process of the tree every 50 ms, and prints the peak of the tree's sum and of each process.

    PYTHONPATH=. python3 benchmarks/pod_memory.py                    # P = 1, 2, 4; ~1 minute
    PYTHONPATH=. python3 benchmarks/pod_memory.py --processes 2 --items 20000

Writes benchmarks/results/pod_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from benchmarks._processes import prepare  # noqa: E402
from reshard.aws.dynamo import Dynamo  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in pathlib.Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def rss_kb(pid: int) -> int:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(server: DynaliteServer, processes: int, items: int, segments: int) -> dict:
    name = f"podmem-p{processes}-{int(time.time() * 1000) % 10**8}"
    plain = Dynamo(endpoint_url=server.endpoint, region="us-east-1")
    m, _ = prepare(plain, name, items)
    cmd = [sys.executable, "-m", "reshard", "--endpoint-url", server.endpoint, "--control-table", f"{name}-ctl",
           "backfill", m.id, "--segments", str(segments), "--processes", str(processes)]
    proc = subprocess.Popen(cmd, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "RESHARD_PROGRESS_SECONDS": "3600"})
    peak_sum, peak_each = 0, {}
    while proc.poll() is None:
        sizes = {p: rss_kb(p) for p in tree(proc.pid)}
        peak_sum = max(peak_sum, sum(sizes.values()))
        for p, kb in sizes.items():
            peak_each[p] = max(peak_each.get(p, 0), kb)
        time.sleep(0.05)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    parent = peak_each.pop(proc.pid, 0)
    return {"processes": processes, "items": items, "peak_tree_mb": round(peak_sum / 1024, 1),
            "parent_mb": round(parent / 1024, 1), "workers_mb": sorted(round(v / 1024, 1) for v in peak_each.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--items", type=int, default=6000)
    ap.add_argument("--segments", type=int, default=8)
    args = ap.parse_args()
    out = {"load_average": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory() as tmp, DynaliteServer(pathlib.Path(tmp)) as server:
        for p in args.processes:
            out["runs"].append(run(server, p, args.items, max(args.segments, p)))
    print(f"{'--processes':>11} | {'items':>6} | peak of the tree | the command's process | each worker process")
    for r in out["runs"]:
        print(f"{r['processes']:>11} | {r['items']:>6} | {r['peak_tree_mb']:>13} MB | {r['parent_mb']:>18} MB | "
              f"{', '.join(f'{w} MB' for w in r['workers_mb']) or '(in the command itself)'}")
    print(f"load average {out['load_average'][0]:.1f}")
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "pod_memory.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
