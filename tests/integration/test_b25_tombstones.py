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
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="b25: doctor calls a complete migration's fresh tombstones leftovers once a newer "
                          "migration of the table was retired, and deletes them with no hold")
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
