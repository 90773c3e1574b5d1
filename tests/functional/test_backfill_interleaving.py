"""Shim writes and deletes interleaved with the backfill's scan and its fenced copies.

The simulated shim (tests.backfill_support.Shim) writes the old, authoritative
layout first and then the fenced mirror, exactly as the shim does in the backfill
phase. A wrapper around ``Dynamo.call`` runs shim operations right after chosen
backfill calls: after the Scan (between the scan and the copies), after each fenced
PutItem of a copy, and after the GetItem that judges a fenced-off copy. The end state
must equal the model: the last acknowledged write per item in both layouts, deletes
(tombstones) not resurrected, one item per key per layout. (Deletes that bypass the
shim leave the copy behind: verify reports it as ``extra``; see the deterministic test.)
"""

from __future__ import annotations

import random

import pytest


from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.backfill import BACKFILL

from tests.backfill_support import Shim, diff, expected_table, logical, scan_all, setup_migration

HOOKED = ("scan", "get_item", "put_item")


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
            step = op
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
    assert hook.fired.get("scan") and hook.fired.get("put_item")
    moto_dynamo.call = hook.real
    assert diff(scan_all(moto_dynamo, m.table), expected_table(mapper, shim.model)) == []


def test_each_race_is_settled_by_the_fence(moto_dynamo):
    """Deterministic: shim writes and deletes between the scan and the copies, and between two
    copies. Every newer write holds by the version fence (no read-back, no re-copy); a source
    deleted by a writer that bypasses the shim leaves its copy behind (verify's ``extra``)."""
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Trace")
    shim = Shim(moto_dynamo, mapper, m.table)
    items = [logical("sensor", i) for i in range(40)]
    for it in items:
        shim.seed(it)
    moving = [it for it in items if mapper.moves(shim.model[shim.ident(it)])][:6]
    a, b, c, d, e, f = moving
    stale = {"e": shim.model[shim.ident(e)], "f": shim.model[shim.ident(f)]}  # as seeded (unversioned)
    plan = {
        # between the scan and the copies: the shim's mirror writes land first, the copies are fenced off
        "scan": lambda: (shim.put(dict(a, temp={"N": "901"})), shim.delete(b), shim.hard_delete(e)),
        # after the first copy: the shim's mirror writes replace copies already made, or fence later ones
        "put_item": lambda: (shim.put(dict(c, temp={"N": "902"})), shim.delete(d), shim.hard_delete(f)),
    }
    done = set()

    def once(op):
        if op in plan and op not in done:
            done.add(op)
            plan[op]()
            return True
        return False

    hook = Interleaver(moto_dynamo, once)
    # One copy at a time (--concurrency 1): the plan runs inside the first copy's call, and
    # copies in flight on other threads would race it inside moto (its condition check and
    # write are not one step across threads), which a loaded machine made fail now and then.
    result = run_job(BACKFILL, moto_dynamo, store, m.id,
                     JobOptions(segments=1, workers=1, page_size=100, lease_seconds=30, concurrency=1))
    moto_dynamo.call = hook.real
    t = result.totals
    assert done == {"scan", "put_item"}
    assert t["fenced"] >= 2            # a and b at least: the shim's newer writes were there first
    assert t["collisions"] == 0 and "recopied" not in t
    # e's and f's sources were deleted behind the shim's back after the scan: their copies
    # stay (verify reports them as extra); everything else is exactly the model.
    leftovers = {k: v for k, v in expected_table(mapper, {i: o for i, o in enumerate(stale.values())}).items()
                 if "_rs_new" in v}
    assert len(leftovers) == 2
    assert diff(scan_all(moto_dynamo, m.table), {**expected_table(mapper, shim.model), **leftovers}) == []
