"""The ``next:`` hint (reshard.core.hints): one table row per phase and gate state, and the
property that makes it true: it names `reshard advance` exactly when the rules allow it."""

from __future__ import annotations

import itertools

import pytest

from reshard.core.hints import next_step
from reshard.core.phases import Action, Facts, Phase, decide

MID = "m1"
ADV = f"`reshard advance {MID}`"
BACKFILL_MISSING = f"the backfill has not run: run `reshard backfill {MID} --segments 16`"
VERIFY_MISSING = f"no verify since the backfill finished: run `reshard verify {MID}`"
CLEANUP_MISSING = f"the cleanup pass has not run: run `reshard cleanup {MID}`"
WRITERS = "1 backfill segment lease(s) are still held (...): wait 60s more"
OPEN = dict(backfill_missing=None, verify_missing=None, cleanup_missing=None)

#: (phase, facts, retired, switching, the hint)
ROWS = [
    (Phase.PLANNED, Facts(live_shims=None), False, False, f"deploy the shim, then {ADV} (to dual_write)"),
    (Phase.PLANNED, Facts(live_shims=0), False, False, f"deploy the shim, then {ADV} (to dual_write)"),
    (Phase.PLANNED, Facts(live_shims=3), False, False, f"{ADV} (to dual_write)"),
    (Phase.PLANNED, Facts(live_shims=3, lagging=("i-1 (h pid 1, on planned v0)",)), False, False,
     f"wait for 1 lagging shim(s) to acknowledge planned: `reshard wait {MID}` "
     "(moves nothing; runbooks/incident-shim-lagging.md)"),
    (Phase.DUAL_WRITE, Facts(live_shims=2), False, False, f"{ADV} (to dual_read)"),
    (Phase.DUAL_WRITE, Facts(live_shims=0), False, False,
     f"{ADV} (to dual_read) (no live shim reports for the table: add --allow-no-shims only if nothing writes it)"),
    (Phase.DUAL_READ, Facts(live_shims=2), False, False, f"{ADV} (to backfill)"),
    # backfill: the first missing gate decides, in the order the work is done
    (Phase.BACKFILL, Facts(live_shims=2, backfill_missing=BACKFILL_MISSING, verify_missing="x"), False, False,
     f"{BACKFILL_MISSING}; then `reshard verify {MID}`, then {ADV} (to cutover)"),
    (Phase.BACKFILL, Facts(live_shims=2, backfill_missing=None, verify_missing=VERIFY_MISSING), False, False,
     f"{VERIFY_MISSING}; then {ADV} (to cutover)"),
    (Phase.BACKFILL, Facts(live_shims=2, writers=WRITERS, **OPEN), False, False, f"{WRITERS}; then {ADV} (to cutover)"),
    # a passing backfill and verify: advance (the stale hint said "run the backfill")
    (Phase.BACKFILL, Facts(live_shims=2, **OPEN), False, False, f"{ADV} (to cutover)"),
    (Phase.BACKFILL, Facts(live_shims=2, **OPEN), False, True,
     f"{ADV} finishes the switch to backfill once every live shim holds (`reshard rollback {MID}` undoes it)"),
    (Phase.CUTOVER, Facts(live_shims=2, **OPEN), False, False,
     f"check the application, then {ADV} (to cleanup; no rollback after that)"),
    (Phase.CUTOVER, Facts(live_shims=2, **OPEN), False, True,
     f"{ADV} finishes the switch to cutover once every live shim holds (`reshard rollback {MID}` undoes it)"),
    (Phase.CLEANUP, Facts(live_shims=2, cleanup_missing=CLEANUP_MISSING), False, False,
     f"{CLEANUP_MISSING}; then {ADV} (to complete)"),
    (Phase.CLEANUP, Facts(live_shims=2, **OPEN), False, False, f"{ADV} (to complete)"),
    (Phase.COMPLETE, Facts(live_shims=2), False, False,
     "nothing: the migration is complete and the new layout is the steady state"),
    (Phase.ABORTED, Facts(live_shims=2), False, False,
     f"`reshard cleanup {MID}` removes the new-layout items and retires the migration"),
    # after abort + cleanup: retired (the stale hint said "cleanup" again)
    (Phase.ABORTED, Facts(live_shims=2), True, False,
     "nothing: the migration is retired (aborted and cleaned up); the old layout is the steady state and "
     "the table is free for a new migration"),
]


@pytest.mark.parametrize("phase,facts,retired,switching,hint", ROWS,
                         ids=[f"{r[0].value}-{i}" for i, r in enumerate(ROWS)])
def test_the_hint_of_each_phase_and_gate_state(phase, facts, retired, switching, hint):
    assert next_step(MID, phase, facts, retired=retired, switching=switching) == hint


ROLLED_BACK = [
    (Phase.BACKFILL, Phase.CUTOVER, Facts(live_shims=2, **OPEN),
     f"you rolled back from cutover: find and fix what made you roll back first (runbooks/07-rollback.md); the way "
     f"forward again: {ADV} (to cutover); or `reshard abort {MID}` returns to the old layout"),
    (Phase.BACKFILL, Phase.CUTOVER, Facts(live_shims=2, backfill_missing=None, verify_missing=VERIFY_MISSING),
     f"you rolled back from cutover: find and fix what made you roll back first (runbooks/07-rollback.md); the way "
     f"forward again: {VERIFY_MISSING}; then {ADV} (to cutover); or `reshard abort {MID}` returns to the old layout"),
    (Phase.PLANNED, Phase.DUAL_WRITE, Facts(live_shims=2),
     f"you rolled back from dual_write: find and fix what made you roll back first (runbooks/07-rollback.md); the "
     f"way forward again: {ADV} (to dual_write); or `reshard abort {MID}` returns to the old layout"),
    # A lagging fleet first: wait for it (a rollback too needs the whole fleet across).
    (Phase.DUAL_WRITE, Phase.DUAL_READ, Facts(live_shims=2, lagging=("i-1",)),
     f"wait for 1 lagging shim(s) to acknowledge dual_write: `reshard wait {MID}` (moves nothing; "
     "runbooks/incident-shim-lagging.md)"),
]


@pytest.mark.parametrize("phase,came_from,facts,hint", ROLLED_BACK, ids=[f"{r[1].value}-{i}" for i, r in
                                                                        enumerate(ROLLED_BACK)])
def test_after_a_rollback_the_hint_says_so_before_the_way_forward(phase, came_from, facts, hint):
    assert next_step(MID, phase, facts, rolled_back_from=came_from) == hint


def test_the_table_covers_every_phase():
    assert {r[0] for r in ROWS} == set(Phase)


def _states():
    for phase, bf, vf, cf, wr, lag, live in itertools.product(
            [p for p in Phase], (None, BACKFILL_MISSING), (None, VERIFY_MISSING), (None, CLEANUP_MISSING),
            (None, WRITERS), ((), ("i-1",)), (None, 0, 2)):
        yield phase, Facts(lagging=lag, live_shims=live, backfill_missing=bf, verify_missing=vf,
                           cleanup_missing=cf, writers=wr)


def test_the_hint_says_advance_exactly_when_the_rules_allow_it():
    """Over every phase x gate x fleet state: the hint's first step is a plain `reshard advance`
    iff decide() allows the advance (an empty census aside: the hint then names --allow-no-shims)."""
    checked = 0
    for phase, facts in _states():
        hint = next_step(MID, phase, facts)
        for before in ("deploy the shim, then ", "check the application, then "):
            hint = hint.removeprefix(before)
        says_advance = hint.startswith(f"{ADV} (to ")
        vouched = Facts(**{**facts.__dict__, "live_shims": None}) if facts.live_shims == 0 else facts
        allowed = decide(Action.ADVANCE, phase, vouched).allowed
        assert says_advance == allowed, (phase, facts, hint)
        if says_advance and facts.live_shims == 0 and phase is not Phase.PLANNED:
            assert "--allow-no-shims" in hint
        checked += 1
    assert checked == len(Phase) * 2 ** 5 * 3
