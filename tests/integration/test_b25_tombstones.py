"""b25: a fourth outside review of issue 25 ("no late write lands"), aimed at the tombstones of
``cleanup`` and ``complete`` (fenced phases, versioned tombstones, the removal hold). Forced
interleavings on dynalite behind the fidelity proxy, with the harness of
``test_r25_late_writes.py`` (server deadline enforced, H = 30 s of the proxy's clock, which moves
only when a test moves it). Each break is ``xfail(strict=True)`` so the suite stays green until
it is fixed."""

from __future__ import annotations

import pytest

from reshard import operations
from reshard.control import transition
from tests.integration.test_r25_late_writes import HZ, _move, _run, _start_next, _to, proxy  # noqa: F401 - the fixture
from tests.late_support import key_of, plain

pytestmark = pytest.mark.integration


def _next(m1, suffix: str = "next"):
    """The next migration of the table: M1's new layout is its old one (32 -> 64)."""
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    from tests.late_support import Run
    text = m1.migration.text.replace("shards = 32", "shards = 64").replace("shards = 16", "shards = 32")
    m2 = parse(text.replace(f'id = "{m1.migration.id}"', f'id = "{m1.migration.id}-{suffix}"'), "<m2>")
    return Run(m1.proxy, m1.dynamo, m2, KeyMapper(m2), m1.store, m1.control)


# ------------------------------------------------------------------ 1. doctor after a retired next migration
def test_b25_doctor_deletes_a_complete_migrations_tombstone_after_a_next_migration_was_retired(proxy, unique_name):
    """M1 is ``complete``; its application still runs M1's file (its shims write versioned
    tombstones: ``complete`` is fenced since p25). M2 (the next migration of the table) is started
    and aborted from ``planned``, then retired: the retire gives the table marker back to M1, and
    M1's shims serve ``complete`` again. Once the retire is H + 2 s old, shim A puts an item
    (acknowledged; the network keeps a copy: ``duplicate(copy="hold")``) and shim B deletes it (a
    tombstone newer than A's version, acknowledged). ``reshard doctor --repair``:
    ``_data_findings`` takes the owner of the table's tombstones to be the *newest* migration only
    when it is active or ``complete`` -- the newest is M2, retired -- so ``tombstone_cutoff_ms``
    is None and every tombstone is a leftover; the repair deletes B's tombstone (``still_tombstone``:
    it still is one) with no hold. The copy of A's put is delivered, inside its horizon: its fence
    passes on the empty key and the deleted item is back. Guarantee 2 through 5b.

    a25's finding 1 guarded only a retire *younger* than H + 2; here the live writer is the
    complete migration under the retired one. Owner should be the newest migration that is
    active or complete (or: doctor never deletes a tombstone without the removal hold)."""
    m1 = _run(proxy, unique_name)
    _to(m1, "complete")
    m2 = _next(m1)
    _start_next(m1, m2.migration)
    _move(m2, "aborted")
    transition.retire(m1.store, m2.migration.id, dynamo=m1.dynamo)
    proxy.advance_clock(HZ + 2)  # the retire is settled (control/horizon.retire_settled)
    a, b = m1.shim(), m1.shim()
    try:
        assert a.phase == "complete" and b.phase == "complete", (a.phase, b.phase)
        item = m1.moving(val=1)
        _, new_key = m1.keys(item)
        rule = proxy.duplicate(op="PutItem", key=plain(new_key), copy="hold")
        a.put_item(Item=item)  # acknowledged
        copy = proxy.held(rule=rule)[0]["handle"]
        b.delete_item(Key=key_of(item))  # acknowledged: a tombstone at M1's new key
        assert "_rs_del" in m1.stored(new_key)

        report = operations.doctor(m1.store, m1.dynamo, None, repair=True, wait=0)
        outcome = proxy.release(copy)
        back = m1.stored(new_key)
        assert back is None or "_rs_del" in back, \
            f"the deleted item is back ({outcome['status']}; doctor: {report}): {back}"
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ 2. a retired next migration's sweep
def test_b25_a_retired_next_migrations_sweep_deletes_the_restored_owners_tombstone_too_soon(proxy, unique_name):
    """M1 (H = 30 s, enforced) is ``complete``; its application still runs M1's file. M2, the next
    migration of the table, is started with ``--request-horizon 4``, aborted, and its abort's
    cleanup pass ends in the retire: the marker goes back to M1, whose shims serve ``complete``
    again (fenced, tombstones, signed with M1's H = 30). Shim A puts an item (acknowledged; the
    network keeps a copy: ``duplicate(copy="hold")``); shim B deletes it (a tombstone at M1's new
    key = M2's old key, acknowledged). M2's second sweep (``operations.sweeps_again``: once the
    retire lasted M2's H + 2) scans the table: an old-layout tombstone is "retire" to it
    (``Cleaner.action``), held ``removal_hold(M2)`` = 4 + 2 s after the scan answer, then deleted
    (still a tombstone: ``still_tombstone`` passes) -- the job refuses to start while M1's shims are
    live, but not once they closed (the application redeployed or restarted: the census counts
    live heartbeats, a late request outlives its sender). A's copy, signed under a fact older than that
    scan but with M1's 30 s horizon, is delivered: it passes its fence on the empty key and the
    item B deleted is back. Guarantee 2 through 5b.

    The sweep deletes tombstones that are not its migration's (the table's owner is M1 again,
    whose shims write them) and holds by its own horizon. It should leave tombstones alone once
    the marker names another owner, or hold by the largest horizon of any migration whose
    shims may write the table (the marker's owner, ``previous_horizon``)."""
    from reshard.jobs.cleanup import CLEANUP
    from reshard.jobs.runner import JobOptions, run_job
    m1 = _run(proxy, unique_name)
    _to(m1, "complete")
    m2 = _next(m1)
    _start_next(m1, m2.migration, horizon=4)
    _move(m2, "aborted")
    opts = JobOptions(segments=1, workers=1, page_size=50)
    first = run_job(CLEANUP, m1.dynamo, m1.store, m2.migration.id, opts)
    assert first.done, first
    if not m1.store.load_state(m2.migration.id).retired:
        transition.retire(m1.store, m2.migration.id, dynamo=m1.dynamo)
    proxy.advance_clock(4 + 2)  # the sweep starts once the retire lasted M2's H + 2 s
    a, b = m1.shim(), m1.shim()
    try:
        assert a.phase == "complete" and b.phase == "complete", (a.phase, b.phase)
        item = m1.moving(val=1)
        _, new_key = m1.keys(item)
        rule = proxy.duplicate(op="PutItem", key=plain(new_key), copy="hold")
        a.put_item(Item=item)  # acknowledged
        copy = proxy.held(rule=rule)[0]["handle"]
        b.delete_item(Key=key_of(item))  # acknowledged: a tombstone at M1's new key
        assert "_rs_del" in m1.stored(new_key)
        a.close()  # the application is redeployed (or restarted): A and B leave the census at once
        b.close()

        sweep = run_job(CLEANUP, m1.dynamo, m1.store, m2.migration.id, opts)
        outcome = proxy.release(copy)
        back = m1.stored(new_key)
        assert back is None or "_rs_del" in back, \
            f"the deleted item is back ({outcome['status']}; sweep: {sweep.counts}): {back}"
    finally:
        a.close()
        b.close()
