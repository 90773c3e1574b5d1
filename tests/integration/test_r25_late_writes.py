"""r25: an outside review of issue 25 ("no late write lands"), forced interleavings on dynalite
behind the fidelity proxy. Each test is the shortest interleaving found that breaks a guarantee
of PRODUCT.md 5b on main; each is ``xfail(strict=True)`` so the suite stays green until fixed.

The migrations here record ``server_deadline = enforced`` (the proxy enforces the signature
window) with a request horizon of :data:`HZ` seconds, and every phase lasts ``HZ + 2`` s of
the proxy's clock before the next one (what the operator's transitions wait).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from reshard import operations
from reshard.aws import fidelity
from reshard.control.records import META
from reshard.core.phases import Phase, STRIP_JOB
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.runner import JobOptions, run_job
from tests.late_support import Background, Run, key_of, plain

#: The request horizon of these migrations: long enough that real time spent by a slow machine
#: between a request's fact and its delivery never expires it by accident.
HZ = 30.0
FAST = JobOptions(segments=1, workers=1, page_size=50)


@pytest.fixture
def proxy(dynalite_server):
    with fidelity.FidelityProxy(dynalite_server.endpoint) as p:
        yield p


def _run(proxy, name: str) -> Run:
    run = Run.start(proxy, name)
    run.store.update(run.store.mpk(run.migration.id), META, "SET request_horizon = :h, server_deadline = :e",
                     values={":h": {"N": str(HZ)}, ":e": {"S": "enforced"}})
    return run


def _move(run: Run, target: str, *, switching: bool = False) -> None:
    """A compare-and-set of the phase (stamped with the server's Date), then HZ + 2 s of server time."""
    state = run.store.load_state(run.migration.id)
    run.store.set_phase(state, Phase(target), "test", "test", switching=switching)
    run.proxy.advance_clock(HZ + 2)


def _to(run: Run, phase: str) -> None:
    """From backfill (after a backfill pass) on to ``phase`` (cutover, cleanup or complete)."""
    assert run_job(BACKFILL, run.dynamo, run.store, run.migration.id, FAST).done
    _move(run, "cutover", switching=True)
    _move(run, "cutover")
    for p in ("cleanup", "complete"):
        if phase == "cutover" or (phase == "cleanup" and p == "complete"):
            break
        _move(run, p)


# ------------------------------------------------------------------ 1. strip un-fences a duplicate
@pytest.mark.xfail(strict=True, reason="r25: a duplicated/retried ADD lands twice across --strip-bookkeeping "
                                      "(strip removes the _rs_v that the unfenced phases' `_rs_v <> :v` compares)")
def test_r25_strip_lets_a_duplicated_add_apply_twice(proxy, unique_name):
    """``complete``: shim A's ``ADD n 1`` lands and is acknowledged; the network keeps a copy of the
    request (a duplicate, or the retry of an attempt whose answer was lost). The strip pass
    (``cleanup --strip-bookkeeping``, started after complete lasted H + 2 s) removes ``_rs_v``
    from the item. The copy is delivered, well inside its horizon: its only guard was
    ``_rs_v <> :v``, which an item without ``_rs_v`` passes, so the ``ADD`` is applied a second
    time. Guarantee 1 (and 5b: "through complete and --strip-bookkeeping")."""
    run = _run(proxy, unique_name)
    _to(run, "complete")
    t = run.shim()
    try:
        assert t.phase == "complete"
        item = run.moving(val=1, n=Decimal(10))
        t.put_item(Item=item)
        _, new_key = run.keys(item)
        rule = proxy.duplicate(op="UpdateItem", key=plain(new_key), copy="hold")
        out = t.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1},
                            ReturnValues="UPDATED_NEW")
        assert out["Attributes"] == {"n": 11}
        copy = proxy.held(rule=rule)[0]["handle"]  # the copy, kept until released

        result = operations.run_data_job(STRIP_JOB, run.dynamo, run.store, run.migration.id,
                                         JobOptions(segments=1, workers=1))
        assert result.counts["stripped"] >= 1
        assert "_rs_v" not in run.stored(new_key)

        outcome = proxy.release(copy)
        assert outcome["status"] == 200, outcome  # in time: the horizon did not refuse it
        assert t.get_item(Key=key_of(item), ConsistentRead=True)["Item"]["n"] == 11, "the ADD was applied twice"
    finally:
        t.close()


# ------------------------------------------------------------------ 2. a retry after another writer
@pytest.mark.xfail(strict=True, reason="r25: an ADD whose answer was lost is applied twice when another writer's "
                                      "write lands before its retry (own-attempt check only compares with the "
                                      "latest version)")
@pytest.mark.parametrize("phase", ["cutover", "complete"])
def test_r25_a_lost_answer_retried_after_another_writer_applies_an_add_twice(proxy, unique_name, phase):
    """Shim A's ``ADD n 1`` lands; its answer is lost; A's client retries, and the retry is held a
    moment on the way (well inside the horizon). Shim B's ``SET val = 2`` lands meanwhile
    (acknowledged). The retry arrives: in ``cutover`` it fails the fence (B's version is newer)
    and the shim, finding B's version and not its own, takes it for a fence loss and applies the
    ``ADD`` again above it; in ``complete`` its ``_rs_v <> :v`` passes at once. Either way
    ``n`` is 12: no order of the two acknowledged writes gives that. Guarantee 1 through 5b
    ("an answer lost and its request retried"). docs/late-writes.md lists this as "not covered"."""
    run = _run(proxy, unique_name)
    _to(run, phase)
    a, b = run.shim(read_timeout=60), run.shim()
    try:
        assert a.phase == phase and b.phase == phase
        item = run.moving(val=1, n=Decimal(10))
        a.put_item(Item=item)
        _, new_key = run.keys(item)
        proxy.lose_answer(op="UpdateItem", key=plain(new_key))
        retry_rule = proxy.hold(op="UpdateItem", key=plain(new_key))
        add = Background(lambda: a.update_item(Key=key_of(item), UpdateExpression="ADD n :one",
                                               ExpressionAttributeValues={":one": 1}))
        retry = proxy.wait_held(1, rule=retry_rule, timeout=30)[0]["handle"]
        assert run.stored(new_key)["n"] == {"N": "11"}, "the first attempt landed"

        b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 2})
        proxy.release(retry)
        add.result()
        got = b.get_item(Key=key_of(item), ConsistentRead=True)["Item"]
        assert got["val"] == 2
        assert got["n"] == 11, "one acknowledged ADD was applied twice"
    finally:
        a.close()
        b.close()
