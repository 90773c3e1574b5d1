"""Phase transitions: gather the facts, let the pure rules decide, compare-and-set.

:func:`reshard.core.phases.decide` holds the rules; :mod:`reshard.control.fleet` says who
is live and lagging; the gates (:func:`reshard.control.gates.gate_facts`, or any function
of the same shape a caller passes in) say what the run records prove; the write is
:meth:`ControlStore.set_phase`, a compare-and-set on ``phase_version``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from reshard import errors
from reshard.control import fleet
from reshard.control import marker as markers
from reshard.control.gates import catch_up_verified, gate_facts
from reshard.control.horizon import await_phase_age, horizon_for
from reshard.control.records import MigrationState
from reshard.control.store import ControlStore, operator_name
from reshard.control.runs import await_no_writers
from reshard.core.index import changes_index_writes, index_transition_refusal
from reshard.core.phases import (BACKFILL_JOB, ROUTING, VERIFY_JOB, Action, Decision, Facts, Phase, changes_authority,
                                 decide)

#: How often the operator re-reads the census while the fleet switches authority.
SWITCH_POLL_SECONDS = 0.1

#: ``gates(store, state) -> dict`` of :class:`Facts` fields (backfill/verify/cleanup_missing).
Gates = Callable[[ControlStore, MigrationState], dict]


def facts(store: ControlStore, state: MigrationState, census: fleet.Census, gates: Gates = gate_facts,
          allow_no_shims: bool = False) -> Facts:
    """What the rules need to judge a transition out of ``state``.

    ``allow_no_shims``: the operator vouches that no application writes the table, so an
    empty census is not a reason to refuse (otherwise it is: see :func:`decide`).
    """
    flag = state.newer_may_be
    if flag is not None and catch_up_verified(store, state) is not None:
        flag = None  # a passing verify started after the switch: the next transition clears it
    return Facts(lagging=tuple(census.describe_lagging()),
                 live_shims=None if allow_no_shims else len(census.live) + len(census.foreign),
                 newer_may_be=flag, verify_command=f"reshard verify {state.id}",
                 **gates(store, state))


def needs_switch(state: MigrationState, frm: Phase, to: Phase) -> bool:
    """Whether ``frm`` -> ``to`` goes through the fleet-wide switch.

    A table migration switches when the authoritative layout changes (backfill <-> cutover).
    An index-only one switches when the GSI value shims write changes (dual_write <->
    dual_read, an abort from dual_read or backfill): one shim writing old values while
    another writes new ones could move an item back and forth between two passes of a
    fan-out query (see :mod:`reshard.core.index`). Its backfill -> cutover changes no write.
    """
    m = state.migration()
    if not m.changes_table:
        return changes_index_writes(frm, to)
    return changes_authority(frm, to) or (bool(m.indexes) and changes_index_writes(frm, to))


#: The jobs that write the data table: while one of their leases may still be used, no
#: gate that relies on "no job is writing" opens (``verify`` counts: ``--repair`` writes).
WRITING_JOBS = (BACKFILL_JOB, VERIFY_JOB)


def transition(store: ControlStore, migration_id: str, action: Action, who: str | None = None,
               expected_version: int | None = None, gates: Gates = gate_facts,
               switch_wait: float | None = None, sleep: Callable[[float], None] = time.sleep,
               allow_no_shims: bool = False, lease_wait: float = 0.0,
               say: Callable[[str], None] | None = None,
               on_lease_wait: Callable[[list[str]], None] | None = None) -> tuple[MigrationState, MigrationState]:
    """Apply ``action`` if the rules allow it. Returns (before, after).

    ``expected_version``: act only on the version the operator saw (``--from``), so a
    retried script cannot move the migration twice. ``allow_no_shims``: move even when
    no live shim reports for the table (refused otherwise: fail closed). ``lease_wait``: how
    long cutover may watch held job leases go quiet (:func:`reshard.control.runs.await_no_writers`;
    only without a server deadline: with one, a stalled job's writes expire at its horizon;
    ``on_lease_wait`` hears which, while it waits).

    With a server deadline (``server_deadline`` on META, docs/late-writes.md), no move leaves
    a phase before it has lasted ``H + DATE_MARGIN`` on the server's clock
    (:func:`reshard.control.horizon.await_phase_age`; out of ``planned``, the steady state's
    horizon if longer): every request obeying an earlier phase has landed or never will.
    ``say`` hears what the wait waits for; ``sleep`` is how it waits.

    A move that changes authority (backfill <-> cutover; for a sharded GSI, the value
    written: :func:`needs_switch`) is a *switch* of two
    compare-and-sets: first "switching to the target" (shims that see it hold every
    request), then, once every live shim acknowledged that version -- none is still
    acting on the old authority, none has a request in flight under it -- and (with a
    server deadline) the switch has lasted ``H + DATE_MARGIN``, the target itself. If the
    fleet does not get across within ``switch_wait`` seconds (default:
    :func:`default_switch_wait`), the switch is abandoned: the row goes back to the
    phase it came from and nothing has acted on the new authority. See :func:`finish_switch`.
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
    if state.switching:
        # An operator died (or gave up waiting) in the middle of a switch: the fleet is
        # holding its requests. Advancing finishes that switch; rolling back abandons it.
        if action is Action.ADVANCE:
            return state, finish_switch(store, state, who, switch_wait, sleep, say)
        if action is Action.ROLLBACK:
            return state, abandon_switch(store, state, who, "rollback during the switch")
        raise errors.RefusedTransition(
            f"{action.value} refused for {migration_id!r}: the fleet is switching to {state.phase}; run "
            f"`reshard advance {migration_id}` to finish the switch or `reshard rollback {migration_id}` to undo it")
    if state.newer_may_be is not None and catch_up_verified(store, state) is not None:
        # A verify started after the switch passed: clear the catch-up flag (the operator's
        # write: workers may not write the phase row), conditioned on this phase version. It
        # bumps the version: the fleet acknowledges the cleared flag before the move is judged,
        # as for any phase change. The operator asked for the move, not for this step, so it is
        # waited for as a switch is (a healthy fleet acknowledges within a refresh or two).
        if store.clear_newer_may_be(state, who):
            state = store.load_state(migration_id)
            if say is not None:
                say(f"catch-up verified: the flag is cleared (phase version {state.phase_version}); waiting for "
                    "the fleet to acknowledge it before the move")
            census = fleet.census(store, migration_id, state.phase_version)
            wait = max(lease_wait, default_switch_wait(census) if switch_wait is None else switch_wait)
            if not census.acknowledged:
                fleet.wait_for_ack(store, migration_id, state.phase_version, wait, sleep=sleep,
                                   poll=SWITCH_POLL_SECONDS)
    writers = None
    if action is Action.ADVANCE and state.phase is Phase.BACKFILL and not state.server_deadline:
        # Cutover makes the new layout authoritative: no backfill or repair worker may
        # still be able to write (a stalled one stops at its own deadline; we wait it out).
        # With a server deadline its writes expire at their horizon instead (the switch
        # lasts H + 2 s on the server's clock), so nothing is watched.
        writers = await_no_writers(store, migration_id, WRITING_JOBS, lease_wait, on_wait=on_lease_wait)
    decision = _judge(store, state, action, gates, allow_no_shims, writers)
    if state.server_deadline or (state.phase is Phase.PLANNED and not state.switching and state.previous_horizon):
        # Refusals first (they need no wait), then the phase's minimum age, then judge again
        # on what is true after the wait. `planned` outlasts the previous owner's horizon
        # even when this migration runs without a server deadline: that owner's requests
        # are bounded by it, and only waiting it out keeps them out of dual_write (a25's
        # finding 2; `previous_horizon` is recorded only for an owner with a deadline).
        state = await_phase_age(store, state, horizon_for(state), say=say, sleep=sleep,
                                why=f"before {action.value} to {decision.target}: requests that obeyed the phase "
                                    "before it must have landed or expired")
        decision = _judge(store, state, action, gates, allow_no_shims, writers)
    if needs_switch(state, state.phase, decision.target):
        held = store.set_phase(state, decision.target, action.value, who, switching=True)
        return state, finish_switch(store, held, who, switch_wait, sleep, say)
    after = store.set_phase(state, decision.target, action.value, who)
    if decision.target is Phase.COMPLETE:
        # An aborted migration keeps the table until `reshard cleanup` removed its new
        # copies (see retire): a new migration must not start among them.
        store.release_table(state.table, migration_id)
    return state, after


def _judge(store: ControlStore, state: MigrationState, action: Action, gates: Gates, allow_no_shims: bool,
           writers: str | None) -> Decision:
    """The rules' decision on ``action`` now (census, gates, index rules, ``writers``: what
    :func:`await_no_writers` said); raises the refusal."""
    census = fleet.census(store, state.id, state.phase_version)
    found = replace(facts(store, state, census, gates, allow_no_shims), writers=writers)
    decision = decide(action, state.phase, found)
    index_refusal = index_transition_refusal(action, state.phase, decision.target) \
        if state.migration().indexes else None
    if index_refusal:
        decision = replace(decision, refusals=(*decision.refusals, index_refusal))
    if not decision.allowed:
        raise errors.RefusedTransition(f"{action.value} refused for {state.id!r} in {state.phase}: "
                                       + "; ".join(decision.refusals))
    return decision


def default_switch_wait(census: fleet.Census) -> float:
    """How long a switch may wait for the fleet: every live shim notices the switch at its
    next refresh (at most 1.2 x its refresh interval, with jitter), plus slack."""
    return max((h.refresh_seconds for h in census.live), default=0.0) * 1.2 + 2.0


def finish_switch(store: ControlStore, held: MigrationState, who: str, switch_wait: float | None = None,
                  sleep: Callable[[float], None] = time.sleep,
                  say: Callable[[str], None] | None = None) -> MigrationState:
    """Wait until every live shim acknowledged the switching version, then end the switch.

    Acknowledging means the shim holds new requests and none of its requests under the
    previous authority is still running; once all have, nobody acts on the old
    authority, so the second compare-and-set lets the fleet act on the new one. A fleet
    that does not get across in time makes the switch go back (:func:`abandon_switch`):
    requests were only held, never served on either side, so nothing is lost.

    With a server deadline the switch also lasts ``H + DATE_MARGIN`` on the server's clock:
    a request of the old authority that a frozen or slow process sent before it saw the
    switch is then refused by DynamoDB, whatever the census saw. The second compare-and-set
    sets the catch-up flag (``newer_may_be``: the old authority may hold a write whose
    mirror never landed), which a passing verify clears (:func:`reshard.core.phases.decide`).
    """
    census = fleet.census(store, held.id, held.phase_version)
    wait = default_switch_wait(census) if switch_wait is None else switch_wait
    if not census.acknowledged:
        census = fleet.wait_for_ack(store, held.id, held.phase_version, wait, sleep=sleep, poll=SWITCH_POLL_SECONDS)
    if not census.acknowledged:
        lagging = ", ".join(census.describe_lagging()[:5])
        abandon_switch(store, held, who, f"{len(census.lagging)} live shim(s) did not acknowledge within {wait:g}s")
        raise errors.RefusedTransition(
            f"the switch of {held.id!r} to {held.phase} was abandoned: {len(census.lagging)} live shim(s) did not "
            f"reach it within {wait:g}s ({lagging}); the migration is back in {held.last.from_phase if held.last else '?'}"
            " and nothing acted on the new authority. Retry when they are healthy (see `reshard status`)")
    if held.server_deadline:
        held = await_phase_age(store, held, held.request_horizon, say=say, sleep=sleep,
                               why="no request of the old authority can land under the new one")
    try:
        return store.set_phase(held, held.phase, "switch", who, switching=False, newer_may_be=catch_up_flag(held))
    except errors.ConcurrentChange:
        # Another operator's advance finished this very switch first: the move this operator
        # began is done, not lost (reporting "nothing done" would be false).
        now = store.load_state(held.id)
        if now.phase_version == held.phase_version + 1 and now.phase is held.phase and not now.switching \
                and now.last is not None and now.last.action == "switch":
            return now
        raise


def catch_up_flag(held: MigrationState) -> str | None:
    """The layout that may be newer once a switch of ``held`` ends: the one that was
    authoritative before it (None for a switch that changes no table authority)."""
    frm = Phase(held.last.from_phase) if held.last and held.last.from_phase else None
    if frm is None or not held.migration().changes_table or not changes_authority(frm, held.phase):
        return None
    return ROUTING[frm].authoritative


def abandon_switch(store: ControlStore, held: MigrationState, who: str, why: str) -> MigrationState:
    """Put the phase back to where the switch started (shims stop holding, on the old authority)."""
    back = Phase(held.last.from_phase) if held.last and held.last.from_phase else None
    if back is None or not needs_switch(held, held.phase, back):
        raise errors.RefusedTransition(f"cannot undo the switch of {held.id!r}: its previous phase is unknown")
    return store.set_phase(held, back, "switch-abandoned", who, switching=False)


def retire(store: ControlStore, migration_id: str, who: str | None = None,
           lease_wait: float | None = 0.0, dynamo=None) -> MigrationState:
    """Mark an aborted migration cleaned up (its cleanup pass finished).

    Shims pick the change up like a phase change (aborted + retired = steady state:
    plain deletes, no versions) and acknowledge it. Idempotent; gives the table marker back
    to its previous owner (``dynamo``: the data table's client, default the control
    table's) and releases the table for a new migration. Without a server deadline it is
    refused while a backfill or repair worker may still write a copy (``lease_wait``: how
    long to watch its lease go quiet; None: as long as it needs): a copy landing after the
    retire would outlive the migration. With one, the cleanup pass that ends in the retire
    started only once ``aborted`` had lasted ``H + DATE_MARGIN``: every copy had landed
    (and the pass saw it) or can never land.
    """
    state = store.load_state(migration_id)
    if state.phase is not Phase.ABORTED:
        raise errors.RefusedTransition(f"only an aborted migration can be retired ({migration_id!r} is in "
                                       f"{state.phase})")
    if not state.retired:
        busy = None if state.server_deadline else await_no_writers(store, migration_id, WRITING_JOBS, lease_wait)
        if busy:
            raise errors.RefusedTransition(f"retire refused for {migration_id!r}: {busy}")
        store.mark_retired(state, who or operator_name())
    markers.give_back(dynamo or store.dynamo, store, migration_id, state.table)
    store.release_table(state.table, migration_id)
    return store.load_state(migration_id)
