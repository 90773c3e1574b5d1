"""The ``next:`` hint: the command an operator runs next, from the phase and the gates' facts.

Pure module, the one place that writes the hint (``start``, ``status``, ``advance``,
``rollback``, ``abort`` and ``list`` all print it). It reads the same :class:`Facts` the
rules of :func:`reshard.core.phases.decide` judge, so the hint never names a command the
rules would refuse for a reason it already knows: after a passing backfill and verify it
says advance; after an aborted migration's cleanup it says the migration is retired.
"""

from __future__ import annotations

from reshard.core.phases import ABORTABLE, Facts, Phase

#: The hint when nothing is known about the fleet or the gates (a migration just registered).
UNKNOWN = Facts(live_shims=None)


def next_step(migration_id: str, phase: Phase, facts: Facts = UNKNOWN, *, retired: bool = False,
              switching: bool = False, rolled_back_from: Phase | None = None) -> str:
    """What to run next for migration ``migration_id`` in ``phase``, given ``facts``.

    ``facts.live_shims`` None means "not looked at" (no remark about an empty fleet);
    0 means nothing reports for the table, which refuses a transition without
    ``--allow-no-shims``. ``retired``: an aborted migration whose cleanup finished.
    ``switching``: the fleet is switching authority into ``phase``. ``rolled_back_from``:
    the last move was a rollback out of that phase; the advance back into it is named as
    what it is (undoing the rollback), once whatever caused the rollback is fixed.
    """
    mid = migration_id
    advance = f"`reshard advance {mid}`"
    if phase is Phase.COMPLETE:
        return "nothing: the migration is complete and the new layout is the steady state"
    if phase is Phase.ABORTED:
        if retired:
            return ("nothing: the migration is retired (aborted and cleaned up); the old layout is the steady "
                    "state and the table is free for a new migration")
        return f"`reshard cleanup {mid}` removes the new-layout items and retires the migration"
    if switching:
        return (f"{advance} finishes the switch to {phase} once every live shim holds "
                f"(`reshard rollback {mid}` undoes it)")
    if facts.lagging:
        return (f"wait for {len(facts.lagging)} lagging shim(s) to acknowledge {phase}: "
                f"`reshard wait {mid}` (moves nothing; runbooks/incident-shim-lagging.md)")
    if rolled_back_from is not None:
        # Not a bare "advance": that would redo the very move the operator just undid.
        forward = next_step(mid, phase, facts, retired=retired)
        abort = f"; or `reshard abort {mid}` returns to the old layout" if phase in ABORTABLE else ""
        return (f"you rolled back from {rolled_back_from}: find and fix what made you roll back first "
                f"(runbooks/07-rollback.md); the way forward again: {forward}{abort}")

    if phase is Phase.PLANNED:
        step = f"{advance} (to dual_write)"
        return f"deploy the shim, then {step}" if facts.live_shims in (None, 0) else step
    if phase is Phase.DUAL_WRITE:
        step = f"{advance} (to dual_read)"
    elif phase is Phase.DUAL_READ:
        step = f"{advance} (to backfill)"
    elif phase is Phase.BACKFILL:
        then = f"then {advance} (to cutover)"
        if facts.newer_may_be == "new":
            then += f"; before an abort, `reshard verify {mid}` must pass (the rollback may have left new writes)"
        if facts.backfill_missing:
            return f"{facts.backfill_missing}; then `reshard verify {mid}`, {then}"
        if facts.verify_missing:
            return f"{facts.verify_missing}; {then}"
        if facts.writers:
            return f"{facts.writers}; {then}"
        step = f"{advance} (to cutover)"
    elif phase is Phase.CUTOVER:
        if facts.newer_may_be == "old":
            return (f"`reshard verify {mid}` (the catch-up verify after the switch: a mirror may have been lost; "
                    f"--repair if it finds differences), then check the application, then {advance} (to cleanup; "
                    "no rollback after that)")
        step = f"check the application, then {advance} (to cleanup; no rollback after that)"
    elif phase is Phase.CLEANUP:
        if facts.cleanup_missing:
            return f"{facts.cleanup_missing}; then {advance} (to complete)"
        step = f"{advance} (to complete)"
    else:  # pragma: no cover - every phase is handled above
        raise ValueError(phase)
    if facts.live_shims == 0:
        step += " (no live shim reports for the table: add --allow-no-shims only if nothing writes it)"
    return step
