"""a25: a third outside review of issue 25 ("no late write lands"), after r25 and r25b's fixes.
Forced interleavings on dynalite behind the fidelity proxy, with the harness of
``test_r25_late_writes.py`` (server deadline enforced, H = 30 s of the proxy's clock, which moves
only when a test moves it, so real time never expires a request by accident). Each break is
``xfail(strict=True)`` so the suite stays green until it is fixed."""

from __future__ import annotations

import pytest

from reshard import operations
from reshard.control import transition
from tests.integration.test_r25_late_writes import _move, _run, proxy  # noqa: F401 - the fixture
from tests.late_support import plain, key_of


# ------------------------------------------------------------------ 1. doctor removes a tombstone too soon
@pytest.mark.xfail(strict=True, reason="a25: `doctor --repair` deletes an aborted migration's tombstones right "
                                       "after the retire, while a duplicate of an older put can still land")
def test_a25_doctor_deletes_a_tombstone_a_late_duplicate_still_needs(proxy, unique_name):
    """``aborted`` (tombstones, fenced writes on the old layout): shim A's put lands and is
    acknowledged; the network keeps a copy of it (``duplicate(copy="hold")``). Shim B deletes
    the item: a tombstone, newer than A's version, acknowledged. The abort's cleanup ends in
    the retire (no migration left on the table). ``reshard doctor --repair`` runs at once: with
    no active migration it calls every tombstone a leftover (``core/doctor.tombstone_cutoff_ms``
    returns None) and deletes it, conditioned on its version only -- no wait on the server's
    clock. The copy of A's put is delivered, well inside its horizon (A's aborted-phase fact +
    H): its fence ``attribute_not_exists(_rs_v) OR _rs_v < :v`` passes on the empty key and the
    item B deleted is back. Guarantee 2 through 5b ("a request that lands ... twice").

    The abort's own second sweep (``operations.sweeps_again``) waits until the retire lasted
    H + 2 s (``await_before_removal``), so a copy like this one has expired by then; doctor's
    tombstone repair has no such wait (nor a date on its deletes)."""
    run = _run(proxy, unique_name)
    _move(run, "aborted")
    a, b = run.shim(), run.shim()
    try:
        assert a.phase == "aborted" and b.phase == "aborted"
        item = run.moving(val=1)
        old_key, _ = run.keys(item)
        rule = proxy.duplicate(op="PutItem", key=plain(old_key), copy="hold")
        a.put_item(Item=item)  # acknowledged
        copy = proxy.held(rule=rule)[0]["handle"]
        b.delete_item(Key=key_of(item))  # acknowledged: a tombstone at the old key
        assert "_rs_del" in run.stored(old_key)

        transition.retire(run.store, run.migration.id, dynamo=run.dynamo)
        report = operations.doctor(run.store, run.dynamo, run.migration.id, repair=True, wait=0)
        assert any(f.kind == "old_tombstones" for f in report.diagnosis.findings), report.diagnosis.findings
        assert run.stored(old_key) is None, "doctor deleted the tombstone"

        outcome = proxy.release(copy)
        back = run.stored(old_key)
        assert back is None or "_rs_del" in back, \
            f"the deleted item is back ({outcome['status']}): {back}"
    finally:
        a.close()
        b.close()
