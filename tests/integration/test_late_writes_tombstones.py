"""Issue 25's last cases: ``cleanup`` and ``complete`` are fenced phases with tombstones, the
cleanup job deletes a tombstone only ``H + 2`` s after the scan answer that saw it, and a
``batch_writer`` flush of a registered migration is one fenced write per request.

Forced interleavings on dynalite behind the fidelity proxy (server deadline enforced), with the
harness of ``test_r25_late_writes.py``. The network keeps a copy of an acknowledged request
(``duplicate(copy="hold")``: the fault model's "a request that lands twice") and delivers it
after a later acknowledged write of another shim. ``H`` is :data:`H_JOB` here: the job's hold is
real time (``H + 2`` s), the copy would still be inside its horizon without it.
"""

from __future__ import annotations

import pytest

from reshard.control.records import META
from reshard.core.layout import is_tombstone
from reshard.core.phases import Phase
from reshard.jobs.cleanup import CLEANUP
from reshard.jobs.runner import JobOptions, run_job
from tests.integration.test_r25_late_writes import _move, _run, _to, proxy  # noqa: F401 - the fixture
from tests.late_support import key_of, plain

pytestmark = pytest.mark.integration

#: The request horizon while the cleanup job runs: its hold per page with a tombstone is H + 2 s
#: of real time; a request signed when the shims started is still inside it after the job
#: would have deleted without the hold (a few seconds on a loaded machine).
H_JOB = 8.0


def _short_horizon(run) -> None:
    """H = :data:`H_JOB` from now on (shims started after this sign with it)."""
    run.store.update(run.store.mpk(run.migration.id), META, "SET request_horizon = :h",
                     values={":h": {"N": str(H_JOB)}})


def _copy_then_tombstone(run, a, b, key: dict, item: dict) -> str:
    """A puts ``item`` (acknowledged) and the network keeps a copy of the put; then B deletes it
    (acknowledged: a tombstone with a newer version). Returns the copy's handle."""
    rule = run.proxy.duplicate(op="PutItem", key=plain(key), copy="hold")
    a.put_item(Item=item)
    copy = run.proxy.held(rule=rule)[0]["handle"]
    b.delete_item(Key=key_of(item))
    assert is_tombstone(run.stored(key)), "B's delete left a tombstone"
    assert b.get_item(Key=key_of(item), ConsistentRead=True).get("Item") is None
    return copy


def _the_copy_is_refused_and_the_item_stays_deleted(run, b, key: dict, item: dict, copy: str) -> None:
    outcome = run.proxy.release(copy)
    got = b.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
    assert got is None, f"the item B deleted came back: A's older put landed after the tombstone's removal " \
                        f"({outcome['status']}): {got}"
    assert run.stored(key) is None
    assert outcome["status"] == 400 and outcome["code"] == "InvalidSignatureException", outcome


def test_the_cleanup_job_deletes_a_tombstone_only_once_an_older_put_cannot_land(proxy, unique_name):
    """``cleanup``: A's put lands (acknowledged) and the network keeps a copy; B deletes the item
    (a tombstone, acknowledged after A's put). ``reshard cleanup`` deletes the tombstone; the copy
    is then delivered. Deleted as soon as scanned, the tombstone leaves an empty key that the
    copy's fence (``attribute_not_exists(_rs_v) OR _rs_v < :v``) passes: the item comes back
    (guarantee 2). The job holds a page with a tombstone ``H + 2`` s after its scan answer, and
    the copy, signed under a fact older than that answer, has expired by then."""
    run = _run(proxy, unique_name)
    _to(run, "cleanup")
    _short_horizon(run)
    a, b = run.shim(), run.shim()
    try:
        assert a.phase == "cleanup" and b.phase == "cleanup"
        item = run.moving(val=1)
        _, new_key = run.keys(item)
        copy = _copy_then_tombstone(run, a, b, new_key, item)
        result = run_job(CLEANUP, run.dynamo, run.store, run.migration.id,
                         JobOptions(segments=1, workers=1, page_size=50, delete=True))
        assert result.done and result.counts["tombstones_retired"] == 1, result.counts
        _the_copy_is_refused_and_the_item_stays_deleted(run, b, new_key, item, copy)
    finally:
        a.close()
        b.close()


def test_the_aborts_cleanup_deletes_a_tombstone_only_once_an_older_put_cannot_land(proxy, unique_name):
    """The same in ``aborted``: aborted shims write the old layout with tombstones, and the abort's
    cleanup retires them (before issue 25's last cases: without any hold)."""
    run = _run(proxy, unique_name)
    _move(run, "aborted")
    _short_horizon(run)
    a, b = run.shim(), run.shim()
    try:
        assert a.phase == "aborted" and b.phase == "aborted"
        item = run.moving(val=1)
        old_key, _ = run.keys(item)
        copy = _copy_then_tombstone(run, a, b, old_key, item)
        result = run_job(CLEANUP, run.dynamo, run.store, run.migration.id,
                         JobOptions(segments=1, workers=1, page_size=50))
        assert result.done and result.counts["tombstones_retired"] == 1, result.counts
        assert run.store.load_state(run.migration.id).retired
        _the_copy_is_refused_and_the_item_stays_deleted(run, b, old_key, item, copy)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("phase", ["cleanup", "complete"])
def test_a_duplicated_batch_writer_flush_never_undoes_a_later_put(proxy, unique_name, phase):
    """A's ``batch_writer`` flush lands (acknowledged) and the network keeps a copy of it; B's put
    of the same item lands after it (acknowledged). The copy is delivered inside its horizon.
    A BatchWriteItem takes no condition: its copy would overwrite B's later put (guarantee 1).
    In a registered migration each request of a flush is its own fenced put: the copy's version
    is older than B's, and DynamoDB refuses it."""
    run = _run(proxy, unique_name)
    _to(run, phase)
    a, b = run.shim(), run.shim()
    try:
        assert a.phase == phase and b.phase == phase
        item = run.moving(val=1)
        _, new_key = run.keys(item)
        rule = proxy.duplicate(op=["PutItem", "BatchWriteItem"], key=plain(new_key), copy="hold")
        with a.batch_writer() as batch:
            batch.put_item(Item={**item, "val": 3})
        copy = proxy.held(rule=rule)[0]
        b.put_item(Item={**item, "val": 2})
        expected = {**item, "val": 2}
        assert b.get_item(Key=key_of(item), ConsistentRead=True).get("Item") == expected
        outcome = proxy.release(copy["handle"])
        got = b.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
        assert got == expected, f"A's flush ({copy.get('op')}) landed again after B's acknowledged put " \
                                f"({outcome['status']}): {got}"
        assert outcome["status"] == 400 and outcome["code"] == "ConditionalCheckFailedException", outcome
    finally:
        a.close()
        b.close()


def test_the_aborts_retire_gives_the_marker_back_whatever_the_jobs_facts_say(proxy, unique_name, monkeypatch):
    """The abort's cleanup ends in the retire, which bumps the phase version (``mark_retired``)
    and then gives the table marker back. That give-back is a write to the data table; sent
    through the job's dated client, it asked the job's facts for a date, and a facts read after
    the bump (due whenever the fact is ``H/3`` old) stops the job for good: ``FactExpired``,
    the marker and the table lock left behind, every shim of the table refusing. Forced: every
    date the job asks for reads META afresh."""
    from reshard.control import marker as markers
    from reshard.core.marker import owner_of
    from reshard.jobs import facts as facts_module

    real = facts_module.JobFacts.horizon

    def always_fresh(self):
        self._fact_mono = -1e18  # the fact is old: the next date reads META first
        return real(self)
    monkeypatch.setattr(facts_module.JobFacts, "horizon", always_fresh)
    run = _run(proxy, unique_name)
    _move(run, "aborted")
    key = markers.key_for(run.dynamo.describe_table(run.migration.table))
    assert owner_of(markers.read(run.dynamo, run.migration.table, key)).migration_id == run.migration.id
    result = run_job(CLEANUP, run.dynamo, run.store, run.migration.id, JobOptions(segments=1, workers=1))
    assert result.done, result
    assert run.store.load_state(run.migration.id).retired
    owner = owner_of(markers.read(run.dynamo, run.migration.table, key))
    assert owner is None or owner.migration_id != run.migration.id, f"the marker still names the retired migration: {owner}"
