"""A shim in a process of its own, for a chaos lifecycle to freeze (SIGSTOP) and resume (SIGCONT).

``python -m tests.reliability.frozen_shim --endpoint URL --control TABLE --migration FILE
--kind hourly --keys 580,581,... --stop-file PATH`` puts whole items (``op`` = ``frozen-<n>``)
on its keys, one after the other, until PATH exists, and prints one JSON line when each put
starts and one when it ends (``acked``, the error; times on the system's monotonic clock,
which the parent shares). Frozen mid-put and resumed after the parent created PATH, it
finishes that put (its requests are refused past their horizon, or never sent) and starts
no other. Short liveness and request bounds, so the census calls it gone within seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.core.migration import load
from reshard.shim.table import ShardedTable

from tests.reliability.lifecycle import WORKLOADS


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--endpoint", "--control", "--migration", "--kind", "--keys"):
        p.add_argument(name, required=True)
    p.add_argument("--stop-file", required=True)
    a = p.parse_args()
    dynamo = Dynamo(endpoint_url=a.endpoint, region="us-east-1", read_timeout=2.0, connect_timeout=1.0,
                    retry=RetryPolicy(max_attempts=6, max_seconds=3.0, base_seconds=0.01, max_backoff_seconds=0.2))
    table = ShardedTable(load(a.migration), dynamo, control_table=a.control, refresh_seconds=0.25,
                         liveness_seconds=1.5, writer_id="frozen")
    workload, rng = WORKLOADS[a.kind](), random.Random(0)
    keys = [int(k) for k in a.keys.split(",")]
    seq = 0
    while not os.path.exists(a.stop_file):
        i = keys[seq % len(keys)]
        seq += 1
        token = f"frozen-{seq}"
        print(json.dumps({"i": i, "token": token, "start": time.monotonic(), "phase": str(table.phase)}), flush=True)
        try:
            table.put_item(Item=workload.item(i, token, rng))
            ok, err = True, None
        except errors.ReshardError as e:
            ok, err = False, f"{type(e).__name__}: {e}"[:300]
        print(json.dumps({"i": i, "token": token, "end": time.monotonic(), "acked": ok, "error": err,
                          "phase": str(table.phase)}), flush=True)
        time.sleep(0.005)
    table.close()


if __name__ == "__main__":
    main()
