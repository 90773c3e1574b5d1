"""Hot new shards (issue 29): a copy into a layout with few new partition keys, behind the fidelity
proxy's per-partition throttle, with and without per-key pacing (reshard/jobs/pacing.py).

The migration goes from 16 hourly shards to 2 with every item in one hour: the whole copy
lands on two partition key values. The proxy serves each key ``LIMIT`` WCU/s (DynamoDB's is
1,000; scaled down so a local copy reaches it). Unpaced, the copy runs into the limit and is
throttled over and over; paced under it, it is not throttled (beyond a stray one), and copies
everything either way.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal

from reshard.aws.dynamo import Dynamo, RetryPolicy, to_wire
from reshard.aws.fidelity import FidelityProxy
from reshard.control.store import ControlStore
from reshard.aws.local import create_table
from reshard.control.transition import transition
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse
from reshard.core.phases import Action
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.pacing import KeyPacer
from reshard.jobs.runner import JobOptions, run_job

from tests.backfill_support import migration_text
from tests.shim_helpers import scan

LIMIT = 20.0     # WCU/s per partition key at the proxy
PACED = 16.0     # the copy's pace per new key
ITEMS = 100


def two_shards(dynamo: Dynamo, table: str):
    """The hourly example migrated from 16 shards to 2, registered and in ``backfill``."""
    text = migration_text("hourly", table, table).replace("shards = 64", "shards = 2")
    m = parse(text, "<hourly 16 to 2>")
    assert m.target.shards == 2
    mapper = KeyMapper(m)
    create_table(dynamo, table, m.keys)
    store = ControlStore(dynamo, f"{table}-ctl")
    store.register(m)
    for _ in range(3):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    return m, mapper, store


def seed(dynamo: Dynamo, mapper: KeyMapper, table: str) -> None:
    reqs = []
    for i in range(ITEMS):
        logical = {"sensor_id": f"s-{i % 37}", "ts": f"2024-10-27T15:{i // 60:02d}:{i % 60:02d}.{i:06d}Z",
                   "event_id": f"e-{i}", "temp": Decimal(i)}
        reqs.append({"PutRequest": {"Item": mapper.to_physical(to_wire(logical), mapper.old)}})
    dynamo.batch_write(table, reqs)


class StepClock:
    """The proxy's time in the unpaced run: it moves only as the client's retries back off, so the
    copy meets the limit however fast or slow the machine is (nothing waits for it)."""

    def __init__(self):
        self.t = 1000.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


def test_a_copy_into_two_new_keys_is_throttled_unless_paced_per_key(dynalite, dynalite_server, unique_name):
    throttles = {}
    for label, per_key in (("unpaced", None), ("paced", PACED)):
        table = f"{unique_name}-{label}"
        m, mapper, store = two_shards(dynalite, table)
        seed(dynalite, mapper, table)
        # Unpaced: the proxy's clock moves with the retries' backoff (the burst goes, then each
        # write waits for its key to refill). Paced: real time, the pacer's own.
        step = StepClock() if per_key is None else None
        with FidelityProxy(dynalite_server.endpoint, partition_throughput=True, partition_wcu=LIMIT,
                           monotonic=step or time.monotonic) as proxy:
            data = Dynamo(endpoint_url=proxy.endpoint, region="us-east-1", connect_timeout=1, read_timeout=4,
                          retry=RetryPolicy(max_attempts=60, max_seconds=120, base_seconds=0.01,
                                            max_backoff_seconds=0.2), sleep=step.sleep if step else None)
            result = run_job(BACKFILL, data, store, m.id,
                             JobOptions(segments=4, workers=4, concurrency=4, page_size=50, max_wcu_per_key=per_key))
            assert result.done
            stats = proxy.stats()
        throttles[label] = stats["throttle_reasons"].get("TableWriteKeyRangeThroughputExceeded", 0)
        new_keys = {it["PK"]["S"] for it in scan(dynalite, table) if mapper.is_new_copy(it)}
        assert len(new_keys) == 2  # every copy in one of two partition keys
        assert sum(1 for it in scan(dynalite, table) if mapper.is_new_copy(it)) == ITEMS - result.totals["unmoved"]
    print(f"\n[hot new shards] per-key throttles: unpaced {throttles['unpaced']}, paced {throttles['paced']}")
    assert throttles["unpaced"] >= 10
    assert throttles["paced"] <= 2 < throttles["unpaced"]


def test_the_pacer_spaces_writes_per_key_and_leaves_other_keys_alone():
    t, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        t[0] += s

    pacer = KeyPacer(100.0, clock=lambda: t[0], sleep=sleep, burst_seconds=0.25)
    for _ in range(25):  # the burst: a quarter second's worth at once
        assert pacer.pace("a", 1) == 0
    assert pacer.pace("a", 1) > 0 and pacer.pace("b", 1) == 0
    for _ in range(100):
        pacer.pace("a", 1)
    # 126 units on key a: 25 at once, the rest at 100/s
    assert abs(t[0] - 1.01) < 1e-6 and pacer.paced == 101
    assert KeyPacer(None).pace("a", 10 ** 6) == 0
