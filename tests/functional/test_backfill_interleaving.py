"""Shim writes and deletes interleaved with the backfill's scan, batch write and read-back.

The simulated shim (tests.backfill_support.Shim) writes the old, authoritative
layout first and then the fenced mirror, exactly as the shim does in the backfill
phase. A wrapper around ``Dynamo.call`` runs shim operations right after chosen
backfill calls: after the Scan (between scan and batch write), after the
BatchWriteItem (between the write and the read-back), after the read-back (a
consistent Scan, plus BatchGetItem for stragglers), after the full GetItem of a
changed source, and after fenced PutItems. The end state must equal the model: the last acknowledged
write per item in both layouts, deletes (tombstones) not resurrected, one item per
key per layout. (Deletes that bypass the shim are only covered by the deterministic
test, in the page being copied: once a page is read back, a hard delete of its source
is invisible to the backfill -- that is why the shim writes tombstones.)
"""

from __future__ import annotations

import random

import pytest


from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.backfill import BACKFILL

from tests.backfill_support import Shim, diff, expected_table, logical, scan_all, setup_migration

HOOKED = ("scan", "batch_write_item", "batch_get_item", "get_item", "put_item")


class Interleaver:
    """Runs ``callback(op)`` after every backfill call of the hooked operations (not its own calls)."""

    def __init__(self, dynamo, callback):
        self.real = dynamo.call
        self.callback = callback
        self.busy = False
        self.fired: dict[str, int] = {}
        dynamo.call = self.call

    def call(self, op, **kw):
        resp = self.real(op, **kw)
        if op in HOOKED and not self.busy and kw.get("TableName", "") != "reshard-control":
            # The read-back is a consistent Scan (plus BatchGetItem for stragglers).
            step = "read_back" if op == "batch_get_item" or (op == "scan" and kw.get("ConsistentRead")) else op
            self.busy = True
            try:
                if self.callback(step):
                    self.fired[step] = self.fired.get(step, 0) + 1
            finally:
                self.busy = False
        return resp


@pytest.mark.parametrize("kind", ["sensor", "invoices"])
@pytest.mark.parametrize("seed", range(6))
def test_random_shim_traffic_between_backfill_steps_converges_to_the_model(moto_dynamo, kind, seed):
    m, mapper, store = setup_migration(moto_dynamo, kind, f"T{kind}{seed}")
    shim = Shim(moto_dynamo, mapper, m.table, seed=seed)
    n = 24
    items = [logical(kind, i) for i in range(n)]
    for it in items[:18]:
        shim.seed(it)                      # pre-migration (unversioned)
    for it in items[18:]:
        shim.put(it)                       # already written through the shim
    rng = random.Random(seed)

    in_flight = []  # mirror writes of shim puts whose authoritative write already happened

    def traffic(op) -> bool:
        if rng.random() < 0.35:
            return False
        while in_flight and rng.random() < 0.7:
            in_flight.pop(0)()
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(n)
            r = rng.random()
            if r < 0.4:
                shim.put(dict(items[i], temp={"N": str(rng.randrange(1000))}))
            elif r < 0.6:
                # A shim write in flight across backfill steps: old now, mirror at a later step.
                # (One at a time per item: a real shim finishes a write before acknowledging it.)
                if not in_flight:
                    in_flight.append(shim.put_split(dict(items[i], temp={"N": str(rng.randrange(1000))})))
            else:
                shim.delete(items[i])
        return True

    hook = Interleaver(moto_dynamo, traffic)
    result = run_job(BACKFILL, moto_dynamo, store, m.id,
                             JobOptions(segments=2, workers=1, page_size=6, lease_seconds=30))
    while in_flight:
        in_flight.pop(0)()
    assert result.done
    assert hook.fired.get("scan") and hook.fired.get("batch_write_item") and hook.fired.get("read_back")
    moto_dynamo.call = hook.real
    assert diff(scan_all(moto_dynamo, m.table), expected_table(mapper, shim.model)) == []


def test_each_race_is_repaired_by_the_right_step(moto_dynamo):
    """Deterministic: one race of each kind, and the counter of the step that repairs it."""
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Trace")
    shim = Shim(moto_dynamo, mapper, m.table)
    items = [logical("sensor", i) for i in range(40)]
    for it in items:
        shim.seed(it)
    moving = [it for it in items if mapper.moves(shim.model[shim.ident(it)])][:6]
    a, b, c, d, e, f = moving
    plan = {
        # between scan and batch write: the batch overwrites the shim's mirror copy
        "scan": lambda: (shim.put(dict(a, temp={"N": "901"})), shim.delete(b), shim.hard_delete(e)),
        # between batch write and read-back: the shim's mirror lands on our copy
        "batch_write_item": lambda: (shim.put(dict(c, temp={"N": "902"})), shim.delete(d), shim.hard_delete(f)),
    }
    done = set()

    def once(op):
        if op in plan and op not in done:
            done.add(op)
            plan[op]()
            return True
        return False

    hook = Interleaver(moto_dynamo, once)
    result = run_job(BACKFILL, moto_dynamo, store, m.id,
                             JobOptions(segments=1, workers=1, page_size=100, lease_seconds=30))
    moto_dynamo.call = hook.real
    t = result.totals
    assert done == {"scan", "batch_write_item"}
    assert t["recopied"] >= 4          # a, b (newer than the stale batch copy), c, d (already there: fenced)
    assert t["recopy_fenced"] >= 2     # c and d: the shim's mirror write was already the newest
    assert t["undone"] >= 2            # e and f: hard-deleted sources, our copies removed
    assert diff(scan_all(moto_dynamo, m.table), expected_table(mapper, shim.model)) == []
