"""The table marker, the operator's side (docs/late-writes.md, "The table marker"; issue 25
case 5): ``start`` writes it before registering (keeping the owner it replaces), ``complete``
keeps it, a retire gives it back, ``doctor`` reports (and repairs) one naming a migration no
control table knows, and ``start`` refuses a table whose marker names an active migration of
another control table. On dynalite (the marker is about visibility, not time)."""

from __future__ import annotations

import pytest

from reshard import errors, operations
from reshard.control import marker as markers
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core.layout import KeyMapper
from reshard.core.marker import Owner, marker_item, owner_of
from reshard.core.phases import Action, Phase
from reshard.core.migration import parse
from reshard.jobs.runner import JobOptions

from tests.backfill_support import create_table, migration_text

OPEN_GATES = lambda store, state: {"backfill_missing": None, "verify_missing": None,  # noqa: E731
                                   "cleanup_missing": None}


def owner(dynamo, table):
    return owner_of(markers.read(dynamo, table, markers.key_for(dynamo.describe_table(table))))


def sensor(table, mid):
    return parse(migration_text("sensor", table, mid), f"<{mid}>")


def walk(store, mid, to: Phase):
    while store.load_state(mid).phase is not to:
        state = store.load_state(mid)
        if state.newer_may_be:  # the catch-up verify is tested elsewhere: clear the flag as a passing one would
            store.clear_newer_may_be(state, "setup")
        transition(store, mid, Action.ADVANCE, allow_no_shims=True, gates=OPEN_GATES)


def test_start_claims_complete_keeps_and_a_retire_gives_back_the_marker(dynalite, unique_name):
    store = ControlStore(dynalite, unique_name + "-c")
    m1 = sensor(unique_name, "m1")
    create_table(dynalite, unique_name, KeyMapper(m1))
    operations.start(dynalite, store, m1, server_deadline=False)
    assert owner(dynalite, unique_name) == Owner("m1", store.table)
    walk(store, "m1", Phase.COMPLETE)
    assert owner(dynalite, unique_name) == Owner("m1", store.table)  # complete keeps it: m1 owns the layout
    m2 = sensor(unique_name, "m2")
    operations.start(dynalite, store, m2, server_deadline=False)
    assert owner(dynalite, unique_name) == Owner("m2", store.table, Owner("m1", store.table))
    operations.start(dynalite, store, m2, server_deadline=False)  # idempotent
    assert owner(dynalite, unique_name).previous == Owner("m1", store.table)
    transition(store, "m2", Action.ABORT, allow_no_shims=True)
    assert operations.run_data_job("cleanup", dynalite, store, "m2", JobOptions(segments=1, workers=1)).done
    assert store.load_state("m2").retired
    assert owner(dynalite, unique_name) == Owner("m1", store.table)  # m1's layout is the steady state again


def test_start_refuses_a_table_whose_marker_names_an_active_migration_elsewhere(dynalite, unique_name):
    first, second = ControlStore(dynalite, unique_name + "-a"), ControlStore(dynalite, unique_name + "-b")
    m1, m2 = sensor(unique_name, "m1"), sensor(unique_name, "m2")
    create_table(dynalite, unique_name, KeyMapper(m1))
    operations.start(dynalite, first, m1, server_deadline=False)
    with pytest.raises(errors.BadInput, match=r"owned by migration 'm1' \(control table .*-a'\), which is in planned"):
        operations.start(dynalite, second, m2, server_deadline=False)
    assert owner(dynalite, unique_name) == Owner("m1", first.table)
    assert not second.exists() or second.load_state("m2", missing_ok=True) is None


def test_doctor_reports_and_repairs_a_marker_no_control_table_knows(dynalite, unique_name):
    store = ControlStore(dynalite, unique_name + "-c")
    m1 = sensor(unique_name, "m1")
    create_table(dynalite, unique_name, KeyMapper(m1))
    operations.start(dynalite, store, m1, server_deadline=False)
    walk(store, "m1", Phase.COMPLETE)
    # A `start` of "ghost" that wrote its marker (keeping m1 as the previous owner) and died
    # before registering: every other migration's shim now refuses the table.
    key = markers.key_for(dynalite.describe_table(unique_name))
    dynalite.call("put_item", TableName=unique_name,
                  Item=marker_item(key, Owner("ghost", store.table, Owner("m1", store.table))))
    report = operations.doctor(store, dynalite)
    (f,) = [f for f in report.diagnosis.findings if f.kind == "orphan_marker"]
    assert f.migration == "ghost" and "no control table knows" in f.detail and f.repairable
    repaired = operations.doctor(store, dynalite, repair=True)
    assert [r.outcome for r in repaired.repairs if r.finding.kind == "orphan_marker"] == ["repaired"]
    assert owner(dynalite, unique_name) == Owner("m1", store.table)
    assert operations.doctor(store, dynalite).healthy
