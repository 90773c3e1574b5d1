"""Application traffic for the end-to-end lifecycle tests: shim threads over disjoint keys,
each recording every acknowledged result (the oracle) and checking it reads its own writes."""

from __future__ import annotations

import random
import threading
import time
from decimal import Decimal
from typing import Hashable

from reshard import errors
from reshard.shim.table import ShardedTable


class App:
    """``threads`` shims (one per thread) over ``keys`` (id -> logical key), split between them.

    ``base``: id -> the logical item already in the table. After :meth:`finish`,
    ``expected`` holds each id's last acknowledged item (None: deleted)."""

    def __init__(self, path: str, endpoint: str, control: str, keys: dict[Hashable, dict],
                 base: dict[Hashable, dict], *, threads: int = 2, max_ops: int = 3000, pause: float = 0.01,
                 seed: int = 0):
        self.keys = keys
        self.expected: dict[Hashable, dict | None] = dict(base)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.held = 0  # requests the shim held through a switch and did not send (retryable)
        self.ops = {"put": 0, "update": 0, "delete": 0, "get": 0}
        self.max_ops, self.pause = max_ops, pause
        self.tables = [ShardedTable.from_file(path, endpoint_url=endpoint, control_table=control,
                                              refresh_seconds=0.3) for _ in range(threads)]
        ids = list(keys)
        self.threads = [threading.Thread(target=self.run, args=(t, ids[n::threads], random.Random(seed + n)),
                                         daemon=True) for n, t in enumerate(self.tables)]
        for th in self.threads:
            th.start()

    def run(self, t: ShardedTable, ids: list, rng: random.Random) -> None:
        n = 0
        while not self.stop.is_set() and n < self.max_ops:
            n += 1
            i = rng.choice(ids)
            key, cur = self.keys[i], self.expected.get(i)
            acked = None  # the write's result once the shim acknowledged it
            try:
                op = rng.choice(["put", "put", "update", "delete", "get"])
                if op == "put":
                    result = dict(key, temp=Decimal(rng.randrange(100)), note=f"w{n}")
                    t.put_item(Item=result)
                elif op == "update":
                    v = Decimal(rng.randrange(100))
                    t.update_item(Key=key, UpdateExpression="SET humidity = :h", ExpressionAttributeValues={":h": v})
                    result = dict(cur or key, humidity=v)
                elif op == "delete":
                    t.delete_item(Key=key)
                    result = None
                else:
                    result = cur
                acked = (result,)
                got = t.get_item(Key=key, ConsistentRead=True).get("Item")
                with self.lock:
                    self.ops[op] += 1
                    self.expected[i] = result
                    if got != result:
                        self.violations.append(f"{i} after {op}: read {got}, wrote {result}")
            except errors.SwitchInProgress:
                # Documented and retryable: the shim held the request through a switch that
                # outlasted its hold (a loaded machine) and did not send it. The oracle stays
                # known: unchanged if the write was held, the write's result if the read was.
                with self.lock:
                    self.held += 1
                    if acked is not None:
                        self.expected[i] = acked[0]
            except Exception as e:  # noqa: BLE001 - the oracle must see every failure
                with self.lock:
                    self.errors.append(f"{type(e).__name__}: {e}")
                    # The write may or may not have landed: this key's oracle is unknown now.
                    ids.remove(i)
                    self.expected.pop(i, None)
            time.sleep(self.pause)  # leave the 2 cores to the jobs under test

    def finish(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(30)
        for t in self.tables:
            t.close()
