"""Phase transitions: gather the facts, let the pure rules decide, compare-and-set.

:func:`reshard.core.phases.decide` holds the rules; :mod:`reshard.control.fleet` says who
is live and lagging; the gates (:func:`reshard.control.gates.gate_facts`, or any function
of the same shape a caller passes in) say what the run records prove; the write is
:meth:`ControlStore.set_phase`, a compare-and-set on ``phase_version``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from reshard import errors
from reshard.control import fleet
from reshard.control.gates import gate_facts
from reshard.control.records import MigrationState
from reshard.control.store import ControlStore, operator_name
from reshard.control.runs import await_no_writers
from reshard.core.phases import BACKFILL_JOB, VERIFY_JOB, Action, Facts, Phase, decide

#: ``gates(store, state) -> dict`` of :class:`Facts` fields (backfill/verify/cleanup_missing).
Gates = Callable[[ControlStore, MigrationState], dict]


def facts(store: ControlStore, state: MigrationState, census: fleet.Census, gates: Gates = gate_facts) -> Facts:
    """What the rules need to judge a transition out of ``state``."""
    return Facts(lagging=tuple(h.describe() for h in census.lagging), **gates(store, state))


#: The jobs that write the data table: while one of their leases may still be used, no
#: gate that relies on "no job is writing" opens (``verify`` counts: ``--repair`` writes).
WRITING_JOBS = (BACKFILL_JOB, VERIFY_JOB)


def transition(store: ControlStore, migration_id: str, action: Action, who: str | None = None,
               expected_version: int | None = None,
               gates: Gates = gate_facts, lease_wait: float = 0.0) -> tuple[MigrationState, MigrationState]:
    """Apply ``action`` if the rules allow it. Returns (before, after).

    ``expected_version``: act only on the version the operator saw (``--from``), so a
    retried script cannot move the migration twice. ``lease_wait``: how long cutover may
    watch held job leases go quiet (:func:`reshard.control.runs.await_no_writers`).
    """
    who = who or operator_name()
    state = store.load_state(migration_id)
    if expected_version is not None and state.phase_version != expected_version:
        raise store.lost_race(migration_id, expected_version)
    if state.last is not None:
        # The previous transition wrote META first and its history row second; if that
        # process died in between, record the row now (write-once, so a no-op normally),
        # before META's copy of it is overwritten and the history would keep a gap.
        store.record_history(migration_id, state.last)
    census = fleet.census(store, migration_id, state.phase_version)
    found = facts(store, state, census, gates)
    if action is Action.ADVANCE and state.phase is Phase.BACKFILL:
        # Cutover makes the new layout authoritative: no backfill or repair worker may
        # still be able to write (a stalled one stops at its own deadline; we wait it out).
        found = replace(found, writers=await_no_writers(store, migration_id, WRITING_JOBS, lease_wait))
    decision = decide(action, state.phase, found)
    if not decision.allowed:
        raise errors.RefusedTransition(f"{action.value} refused for {migration_id!r} in {state.phase}: "
                                       + "; ".join(decision.refusals))
    after = store.set_phase(state, decision.target, action.value, who)
    if decision.target is Phase.COMPLETE:
        # An aborted migration keeps the table until `reshard cleanup` removed its new
        # copies (see retire): a new migration must not start among them.
        store.release_table(state.table, migration_id)
    return state, after


def retire(store: ControlStore, migration_id: str, who: str | None = None,
           lease_wait: float | None = 0.0) -> MigrationState:
    """Mark an aborted migration cleaned up (its cleanup pass finished).

    Shims pick the change up like a phase change (aborted + retired = steady state:
    plain deletes, no versions) and acknowledge it. Idempotent; releases the table for a
    new migration. Refused while a backfill or repair worker may still write a copy
    (``lease_wait``: how long to watch its lease go quiet; None: as long as it needs):
    a copy landing after the retire would outlive the migration.
    """
    state = store.load_state(migration_id)
    if state.phase is not Phase.ABORTED:
        raise errors.RefusedTransition(f"only an aborted migration can be retired ({migration_id!r} is in "
                                       f"{state.phase})")
    if not state.retired:
        busy = await_no_writers(store, migration_id, WRITING_JOBS, lease_wait)
        if busy:
            raise errors.RefusedTransition(f"retire refused for {migration_id!r}: {busy}")
        store.mark_retired(state, who or operator_name())
    store.release_table(state.table, migration_id)
    return store.load_state(migration_id)
