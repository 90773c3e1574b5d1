"""f25: the operator's (and the jobs' lease) conditional writes whose answer is lost.

The fidelity proxy delivers the write, then closes the connection without its answer
(``lose_answer``); ``Dynamo.call`` sends it again and the resend fails its own condition on the
first attempt's effect. Each writer must tell that from another writer's change (one consistent
read: the row holds exactly what this attempt wrote, ``store.landed``) and go on as if the answer
had come -- not report "another operator moved it; nothing done", not return quietly without the
write's date and history row, not leave an orphan marker or a lease its own worker gave up on.
Each test failed before the fix (checked by reverting it), except the history row's, which is
write-once already (recorded here).
"""

from __future__ import annotations

import pytest

from reshard.control import marker as markers
from reshard.control.records import META, TABLE_LOCK_SK, table_lock_pk
from reshard.core.marker import Owner, marker_item, owner_of
from reshard.core.migration import parse
from reshard.core.phases import Phase
from reshard.core.wire import N, S
from tests.backfill_support import migration_text
from tests.integration.test_r25_late_writes import proxy  # noqa: F401 - the fixture
from tests.late_support import Run


def _lost(proxy, rule: str) -> None:
    """The rule applied: the write landed and its answer was lost."""
    assert next(r for r in proxy.rules() if r["id"] == rule)["applied"] == 1, "the write's answer was not lost"


def _history(run: Run) -> list[dict]:
    return run.store.query(run.store.mpk(run.migration.id), "H#")


def _meta(run: Run) -> dict:
    return run.store.get(run.store.mpk(run.migration.id), META)


@pytest.mark.parametrize("switching", [False, True], ids=["move", "switch"])
def test_a_lost_answer_of_a_phase_move_is_the_operators_own(proxy, unique_name, switching):
    """``set_phase`` backfill -> cutover (the switch's first compare-and-set too): the move lands,
    its answer is lost, the resend fails ``phase_version = :v``. Before: ConcurrentChange "<us>
    already moved it ...; nothing done", no ``phase_since``, no history row."""
    run = Run.start(proxy, unique_name)
    state = run.store.load_state(run.migration.id)
    rule = proxy.lose_answer(op="UpdateItem", contains=b"switching = :sw")
    after = run.store.set_phase(state, Phase.CUTOVER, "advance", "op@host", switching=switching)
    _lost(proxy, rule)
    assert after.phase is Phase.CUTOVER and after.switching is switching
    assert after.phase_version == state.phase_version + 1
    assert "phase_since" in _meta(run), "the phase's date was not recorded"
    rows = [r for r in _history(run) if r["phase_version"] == N(state.phase_version + 1)]
    assert len(rows) == 1 and rows[0]["action"] == S("advance"), rows


def test_another_operators_move_is_still_refused(proxy, unique_name):
    """The other side of the check: a move made by another operator (its own values) is
    ConcurrentChange as before."""
    from reshard import errors
    run = Run.start(proxy, unique_name)
    state = run.store.load_state(run.migration.id)
    run.store.set_phase(state, Phase.CUTOVER, "advance", "other@host", switching=True)
    with pytest.raises(errors.ConcurrentChange, match="other@host already"):
        run.store.set_phase(state, Phase.CUTOVER, "advance", "op@host", switching=True)


def test_a_lost_answer_of_the_catch_up_clear(proxy, unique_name):
    """``clear_newer_may_be`` lands, its answer is lost. Before: False ("it moved, or is clear"),
    so the transition judged the move on the old version and its compare-and-set failed."""
    run = Run.start(proxy, unique_name)
    run.move("cutover", switching=True)
    run.move("cutover", newer_may_be="old")
    state = run.store.load_state(run.migration.id)
    rule = proxy.lose_answer(op="UpdateItem", contains=b"REMOVE newer_may_be")
    assert run.store.clear_newer_may_be(state, "op@host")
    _lost(proxy, rule)
    now = run.store.load_state(run.migration.id)
    assert now.newer_may_be is None and now.phase_version == state.phase_version + 1
    assert "phase_since" in _meta(run)
    assert [r["action"]["S"] for r in _history(run)][-1] == "catch-up"


def test_a_lost_answer_of_the_retire(proxy, unique_name):
    """``mark_retired`` lands, its answer is lost. Before: it returned quietly ("another host
    retired it first") without ``phase_since`` -- the second sweep counts from it -- and without
    the history row."""
    run = Run.start(proxy, unique_name)
    run.move("aborted")
    state = run.store.load_state(run.migration.id)
    rule = proxy.lose_answer(op="UpdateItem", contains=b"SET retired = :t")
    run.store.mark_retired(state, "op@host")
    _lost(proxy, rule)
    assert run.store.load_state(run.migration.id).retired
    assert "phase_since" in _meta(run), "the retire's date (the second sweep counts from it) was not recorded"
    assert [r["action"]["S"] for r in _history(run)][-1] == "retire"


def test_a_lost_answer_of_the_history_row_neither_duplicates_nor_fails(proxy, unique_name):
    """``record_history`` is a write-once put keyed by the phase version: the resend fails its
    ``attribute_not_exists`` on its own row and is taken as "already recorded". One row."""
    run = Run.start(proxy, unique_name)
    state = run.store.load_state(run.migration.id)
    rule = proxy.lose_answer(op="PutItem", contains=b'"H#')
    run.store.set_phase(state, Phase.CUTOVER, "advance", "op@host", switching=True)
    _lost(proxy, rule)
    rows = [r for r in _history(run) if r["phase_version"] == N(state.phase_version + 1)]
    assert len(rows) == 1, rows


def test_a_lost_answer_of_the_registration(proxy, unique_name):
    """``register``'s put of META lands, its answer is lost; the resend fails
    ``attribute_not_exists(pk)``. Before: taken for "someone registered the same id", it
    returned ``created = False`` without ``phase_since`` and without the history row."""
    run = Run.start(proxy, unique_name)
    m2 = parse(migration_text("sensor", f"{unique_name}-2", "second"), "<m2>")
    rule = proxy.lose_answer(op="PutItem", contains=b"file_text")
    state, created = run.store.register(m2, "op@host")
    _lost(proxy, rule)
    assert created and state.id == "second"
    assert "phase_since" in run.store.get(run.store.mpk("second"), META)
    assert len(run.store.query(run.store.mpk("second"), "H#")) == 1


def test_a_lost_answer_of_a_table_lock_takeover(proxy, unique_name):
    """A stale ``T#<table>`` lock (its owner never got META written) is taken over conditionally
    on the owner it names; the answer is lost. Before: ConcurrentChange "another operator claimed
    table ... at the same moment"."""
    run = Run.start(proxy, unique_name)
    table = f"{unique_name}-3"
    run.store.put({"pk": S(table_lock_pk(table)), "sk": S(TABLE_LOCK_SK), "migration_id": S("ghost"), "at": N(1)})
    m3 = parse(migration_text("sensor", table, "third"), "<m3>")
    rule = proxy.lose_answer(op="PutItem", contains=b"migration_id = :other")
    _, created = run.store.register(m3, "op@host")
    _lost(proxy, rule)
    assert created
    assert run.store.get(table_lock_pk(table), TABLE_LOCK_SK)["migration_id"] == S("third")


def test_a_lost_answer_of_the_marker_claim(proxy, unique_name):
    """``start`` claims the table marker (conditional on the marker it read: none); the answer is
    lost. Before: ConcurrentChange "another operator wrote the table marker" -- and the marker
    left naming a migration ``start`` then never registered (an orphan marker)."""
    run = Run.start(proxy, unique_name)
    desc = run.dynamo.describe_table(run.migration.table)
    rule = proxy.lose_answer(op="PutItem", table=run.migration.table, contains=b"_rs_marker")
    mine = markers.claim(run.dynamo, run.store, run.migration.id, run.migration.table, desc)
    _lost(proxy, rule)
    assert mine == Owner(run.migration.id, run.store.table)
    assert owner_of(markers.read(run.dynamo, run.migration.table, markers.key_for(desc))) == mine


@pytest.mark.parametrize("previous", [False, True], ids=["removed", "given-back"])
def test_a_lost_answer_of_the_marker_give_back(proxy, unique_name, previous):
    """A retire gives the marker back (a put of the previous owner, or a delete when there was
    none); the answer is lost. Before: "the marker changed meanwhile (left alone)", which the
    retire reports, although the marker was given back."""
    run = Run.start(proxy, unique_name)
    desc = run.dynamo.describe_table(run.migration.table)
    key = markers.key_for(desc)
    if previous:
        run.dynamo.call("put_item", TableName=run.migration.table, Item=marker_item(key, Owner("before", "ctl0")))
    markers.claim(run.dynamo, run.store, run.migration.id, run.migration.table, desc)
    if previous:
        rule = proxy.lose_answer(op="PutItem", table=run.migration.table, contains=b"before")
    else:
        rule = proxy.lose_answer(op="DeleteItem", table=run.migration.table)
    said = markers.give_back(run.dynamo, run.store, run.migration.id, run.migration.table, desc)
    _lost(proxy, rule)
    assert said == ("marker given back to migration 'before' (control table 'ctl0')" if previous
                    else "marker removed (no previous owner)"), said
    left = owner_of(markers.read(run.dynamo, run.migration.table, key))
    assert left == (Owner("before", "ctl0") if previous else None)


def test_a_lost_answer_of_a_lease_claim(proxy, unique_name):
    """A backfill worker claims its segment's lease; the claim lands, its answer is lost, the
    resend fails ``attribute_not_exists(pk)``. Before: the claim was "won by another worker";
    the segment, now leased to this very worker, was "in this process's hands" and the only
    worker left: the run ended with the segment undone (until its lease expired and another
    invocation took it over)."""
    from reshard.jobs.backfill import BACKFILL
    from reshard.jobs.runner import JobOptions, run_job
    run = Run.start(proxy, unique_name)
    rule = proxy.lose_answer(op="UpdateItem", contains=b"lease_counter = if_not_exists")
    result = run_job(BACKFILL, run.dynamo, run.store, run.migration.id, JobOptions(segments=1, workers=1))
    _lost(proxy, rule)
    assert result.done, result.summary() if hasattr(result, "summary") else result


def test_a_lost_answer_of_a_live_control_change(proxy, unique_name):
    """``reshard throttle``'s compare-and-set on the run's control row lands, its answer is lost.
    Before: the resend failed, the re-read found the change already there and the operator was
    told nothing changed (``changed`` False, no change record of its own)."""
    from reshard.control import live
    run = Run.start(proxy, unique_name)
    live.change(run.store, run.migration.id, "backfill", 1, "throttle", who="a@h", max_wcu=100.0)
    rule = proxy.lose_answer(op="PutItem", contains=b"version = :v")
    done = live.change(run.store, run.migration.id, "backfill", 1, "throttle", who="op@h", max_wcu=50.0)
    _lost(proxy, rule)
    assert done.changed and done.change is not None and done.change.who == "op@h", done
    assert live.read_control(run.store, run.migration.id, "backfill", 1).version == 2
