"""Issue 25 case 3, the operator's part: after an authority switch the layout that was
authoritative may hold a write whose mirror never landed (its writer died in between). The
switch sets ``newer_may_be``; moves into phases that read only the other layout are refused
until a verify that started after the switch passes (its repairs copy the newer copy over the
older, in both directions). On dynalite, without a server deadline: the flag is about lost
mirrors, not late requests.

Each test fails without the flag (checked by reverting ``catch_up_flag`` in
``control/transition.py`` to return None: the abort / the cleanup advance are then allowed at
once and the write is lost).
"""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.control.transition import transition
from reshard.core.layout import NEW_COPY_ATTR, VERSION_ATTR, TOMBSTONE_ATTR
from reshard.core.phases import Action, Phase
from reshard.core.versions import VersionClock
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.verify import VERIFY

from tests.backfill_support import Shim, logical, scan_all, key_str, setup_migration

OPTS = dict(segments=2, workers=1, lease_seconds=30, concurrency=1)


def advance(store, mid, action=Action.ADVANCE):
    return transition(store, mid, action, allow_no_shims=True)[1]


def verify(dynamo, store, mid, repair=False):
    return run_job(VERIFY, dynamo, store, mid, JobOptions(**OPTS, repair=repair))


def moving_items(mapper, n):
    out = []
    for i in range(200):
        item = logical("sensor", i)
        phys = mapper.to_physical(item, mapper.old)
        if mapper.moves(phys):
            out.append(item)
        if len(out) == n:
            return out
    raise AssertionError("not enough moving items")


def to_cutover(dynamo, store, m, shim, items):
    for item in items:
        shim.put(item)
    assert run_job(BACKFILL, dynamo, store, m.id, JobOptions(**OPTS)).done
    assert verify(dynamo, store, m.id).passed
    return advance(store, m.id)  # backfill -> switching -> cutover


def test_rollback_from_cutover_holds_abort_until_a_verify_brought_old_up_to_date(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c")
    shim = Shim(dynalite, mapper, m.table)
    a, b = moving_items(mapper, 2)
    cut = to_cutover(dynalite, store, m, shim, [a, b])
    assert cut.phase is Phase.CUTOVER and cut.newer_may_be == "old"

    # Shim A in cutover: its authoritative new-layout write lands (every reader saw it), then
    # A dies before its old-layout mirror. Item b: a delete's tombstone, likewise unmirrored.
    clock = VersionClock("shim-a")
    newer = dict(mapper.to_physical({**a, "temp": {"N": "77"}}, mapper.new), **{VERSION_ATTR: {"S": clock.next()},
                                                                            NEW_COPY_ATTR: {"S": m.id}})
    dynalite.call("put_item", TableName=m.table, Item=newer)
    gone = mapper.to_physical({f: b[f] for f in mapper.key_fields}, mapper.new)
    gone.update({VERSION_ATTR: {"S": clock.next()}, TOMBSTONE_ATTR: {"BOOL": True}, NEW_COPY_ATTR: {"S": m.id}})
    dynalite.call("put_item", TableName=m.table, Item=gone)

    back = advance(store, m.id, Action.ROLLBACK)  # cutover -> switching -> backfill
    assert back.phase is Phase.BACKFILL and back.newer_may_be == "new"
    with pytest.raises(errors.RefusedTransition, match=rf"new layout may hold writes.*`reshard verify {m.id}`"):
        advance(store, m.id, Action.ABORT)
    assert advance(store, m.id, Action.ROLLBACK).phase is Phase.DUAL_READ  # still reads both layouts: allowed
    with pytest.raises(errors.RefusedTransition, match="reshard verify"):
        advance(store, m.id, Action.ROLLBACK)  # dual_read -> dual_write reads old only: held
    advance(store, m.id)  # back to backfill (dual_read -> backfill: no switch)

    first = verify(dynalite, store, m.id)
    assert not first.passed and store.load_state(m.id).newer_may_be == "new"
    repaired = verify(dynalite, store, m.id, repair=True)
    assert repaired.repaired == 2 and store.load_state(m.id).newer_may_be == "new"  # a repairing run proves nothing
    old_a = scan_all(dynalite, m.table)[key_str(mapper.to_physical(a, mapper.old))]
    assert old_a["temp"] == {"N": "77"} and old_a[VERSION_ATTR] == newer[VERSION_ATTR]  # the newer copy went back
    old_b = scan_all(dynalite, m.table)[key_str(mapper.to_physical(b, mapper.old))]
    assert TOMBSTONE_ATTR in old_b  # ... and the delete too
    assert verify(dynalite, store, m.id).passed  # a run of this phase version: lifts the flag
    aborted = advance(store, m.id, Action.ABORT)
    assert aborted.phase is Phase.ABORTED and aborted.newer_may_be is None  # the operator's move cleared it


def test_cutover_to_cleanup_waits_for_the_verify_after_the_switch(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c")
    shim = Shim(dynalite, mapper, m.table)
    (a,) = moving_items(mapper, 1)
    shim.put(a)
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**OPTS)).done
    assert verify(dynalite, store, m.id).passed
    # After the passing verify, still in backfill: shim A's authoritative old write lands and A
    # dies before its mirror to the new layout.
    shim.put_split({**a, "temp": {"N": "55"}})  # the mirror it returns is never run
    cut = advance(store, m.id)
    assert cut.phase is Phase.CUTOVER and cut.newer_may_be == "old"
    with pytest.raises(errors.RefusedTransition, match="old layout may hold writes"):
        advance(store, m.id)
    # A verify run started before the switch would not count; one started now finds the stale copy.
    assert not verify(dynalite, store, m.id).passed
    assert verify(dynalite, store, m.id, repair=True).repaired == 1  # old -> new, fenced, in cutover
    new_a = scan_all(dynalite, m.table)[key_str(mapper.to_physical(a, mapper.new))]
    assert new_a["temp"] == {"N": "55"}
    assert verify(dynalite, store, m.id).passed
    assert store.load_state(m.id).newer_may_be == "old"  # the worker does not write the phase row...
    cleanup = advance(store, m.id)
    assert cleanup.phase is Phase.CLEANUP and cleanup.newer_may_be is None  # ... the operator's move clears it


def test_a_verify_run_started_before_the_switch_does_not_lift_the_flag(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c")
    shim = Shim(dynalite, mapper, m.table)
    cut = to_cutover(dynalite, store, m, shim, moving_items(mapper, 1))
    from reshard.control.gates import catch_up_verified
    from reshard.control.runs import latest_run
    run = latest_run(store, m.id, "verify")  # passed, but in backfill's phase version
    assert run.phase_version < cut.phase_version
    assert catch_up_verified(store, cut) is None
    with pytest.raises(errors.RefusedTransition, match="old layout may hold writes"):
        advance(store, m.id)
