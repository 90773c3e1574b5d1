"""The cutover and completion gates, computed from the run records alone.

A transition asks :func:`gate_facts` what is missing; the answer is one sentence per
gate with the command that provides it, or None when the gate is open. Nothing here
knows how a job works: only what its run records say (finished, segments done, the
totals it counted).
"""

from __future__ import annotations

from reshard.control.records import MigrationState
from reshard.control.runs import backfill_run, describe, entered_at, latest_run, read_run, verify_verdict
from reshard.control.store import ControlStore
from reshard.core.compare import GUIDANCE
from reshard.core.phases import BACKFILL_JOB, CLEANUP_JOB, VERIFY_JOB, Phase


def backfill_missing(store: ControlStore, state: MigrationState) -> str | None:
    """None only when the backfill run finished with every segment done."""
    run = backfill_run(store, state.id)
    info = read_run(store, state.id, BACKFILL_JOB, run)
    if info is None:
        return f"the backfill has not run: run `reshard backfill {state.id} --segments 16`"
    d = describe(store, state.id, BACKFILL_JOB, run)
    if d["done"] == info.total_segments and info.finished_at is not None:
        return None
    cmd = f"`reshard backfill {state.id} --segments {info.total_segments}`"
    failed = d["failed"]
    why = f"the backfill is incomplete: {d['done']} of {info.total_segments} segments done"
    if failed:
        why += f", {len(failed)} failed (segments {', '.join(map(str, failed[:10]))})"
    return f"{why}: run {cmd} to finish it"


def verify_missing(store: ControlStore, state: MigrationState) -> str | None:
    """None only for a passing verify that started after the backfill finished.

    A run with repairs does not pass: it changed the new layout, so its own reading is
    stale; the operator verifies again.
    """
    cmd = f"`reshard verify {state.id}`"
    backfill = read_run(store, state.id, BACKFILL_JOB, backfill_run(store, state.id))
    if backfill is None or backfill.finished_at is None:
        return f"no verify yet (the backfill must finish first, then run {cmd})"
    latest = latest_run(store, state.id, VERIFY_JOB)
    if latest is None or latest.started_at < backfill.finished_at:
        return f"no verify since the backfill finished: run {cmd}"
    verdict = verify_verdict(store, state.id, latest.run, shown=0)
    if not verdict["finished"]:
        return f"verify run {latest.run} is not finished: run {cmd} to finish it"
    if not verdict["passed"] and verdict["failing"]:
        failing = verdict["failing"]
        found = ", ".join(f"{n} {k}" for k, n in failing.items())
        repairable = [k for k in failing if k not in GUIDANCE or k == "new_only"]
        todo = [f"{k}: {GUIDANCE[k]}" for k in failing if k in GUIDANCE and k != "new_only"]
        if repairable:
            todo.insert(0, f"fix the differences (`reshard verify {state.id} --repair`)")
        return (f"the last verify (run {latest.run}) found differences ({found}): " + "; ".join(todo)
                + f"; then run {cmd} again (`reshard status {state.id}` lists examples)")
    if verdict["repaired"] or verdict["repair_pages"]:
        # repair_pages without a count: a page that repaired was redone (its counters lost).
        n = f"{verdict['repaired']} item(s)" if verdict["repaired"] else "item(s)"
        return f"the last verify (run {latest.run}) repaired {n}: run {cmd} again"
    return None


def cleanup_missing(store: ControlStore, state: MigrationState) -> str | None:
    """None only for a finished pass that started in the current cleanup phase."""
    cmd = f"`reshard cleanup {state.id}`"
    if state.phase is not Phase.CLEANUP:
        return f"the cleanup pass runs in the cleanup phase: then run {cmd}"
    since = entered_at(store, state.id, Phase.CUTOVER.value, Phase.CLEANUP.value)
    latest = latest_run(store, state.id, CLEANUP_JOB)
    if latest is None or latest.started_at < since:
        return f"the cleanup pass has not run: run {cmd}"
    if latest.finished_at is None:
        return f"cleanup run {latest.run} is not finished: run {cmd} to finish it"
    return None


def catch_up_verified(store: ControlStore, state: MigrationState) -> int | None:
    """The verify run that lifts the catch-up flag (``newer_may_be``), or None: the latest
    verify run, if it was started in the phase version the migration is at now (so every item
    it judged was read after the switch), finished and passed (no difference, no repair).

    The flag itself is on the phase row, which a worker may not write (docs/iam.md): the
    operator's next transition clears it (:func:`reshard.control.transition.transition`),
    and until then the shims keep reading both layouts (a cost, never a risk).
    """
    latest = latest_run(store, state.id, VERIFY_JOB)
    if latest is None or latest.phase_version != state.phase_version:
        return None
    verdict = verify_verdict(store, state.id, latest.run, shown=0)
    return latest.run if verdict["finished"] and verdict["passed"] else None


def gate_facts(store: ControlStore, state: MigrationState) -> dict:
    """Every gate's verdict, as the fields of :class:`reshard.core.phases.Facts`."""
    return {"backfill_missing": backfill_missing(store, state), "verify_missing": verify_missing(store, state),
            "cleanup_missing": cleanup_missing(store, state)}
