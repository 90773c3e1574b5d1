"""The catch-up flag's pure rules (docs/late-writes.md, "Catch-up"; issue 25 case 3):
routing while it is set, and the transitions it holds back until a verify lifts it."""

from __future__ import annotations

import pytest

from reshard.core.phases import (ROUTING, SWITCH, Action, Facts, Phase, catch_up_refusal, decide, job_rule,
                                 routing_of)

OPEN = dict(backfill_missing=None, verify_missing=None, cleanup_missing=None, live_shims=1)


def test_routing_reads_the_layout_that_may_be_newer_and_catches_up_from_it():
    cut = routing_of(Phase.CUTOVER, newer_may_be="old")
    assert cut.reads == ("new", "old") and cut.catch_up == "old" and cut.writes == ROUTING[Phase.CUTOVER].writes
    back = routing_of(Phase.BACKFILL, newer_may_be="new")
    assert back.reads == ("old", "new") and back.catch_up == "new"
    # The authoritative layout itself is never "the other one"; no flag, no change.
    assert routing_of(Phase.CUTOVER, newer_may_be="new") == ROUTING[Phase.CUTOVER]
    assert routing_of(Phase.BACKFILL) == ROUTING[Phase.BACKFILL] and ROUTING[Phase.BACKFILL].catch_up is None
    # A switch holds whatever the flag says.
    assert routing_of(Phase.CUTOVER, switching=True, newer_may_be="old") is SWITCH


def test_cutover_to_cleanup_waits_for_the_post_switch_verify():
    d = decide(Action.ADVANCE, Phase.CUTOVER, Facts(**OPEN, newer_may_be="old", verify_command="reshard verify m1"))
    assert not d.allowed and any("`reshard verify m1`" in r and "old layout may hold" in r for r in d.refusals)
    assert decide(Action.ADVANCE, Phase.CUTOVER, Facts(**OPEN, newer_may_be=None)).allowed
    # "new" newer than old does not hold cleanup back: cleanup reads the new layout.
    assert decide(Action.ADVANCE, Phase.CUTOVER, Facts(**OPEN, newer_may_be="new")).allowed


@pytest.mark.parametrize("action,phase", [(Action.ABORT, Phase.BACKFILL), (Action.ABORT, Phase.DUAL_READ),
                                          (Action.ROLLBACK, Phase.DUAL_READ), (Action.ROLLBACK, Phase.DUAL_WRITE),
                                          (Action.ABORT, Phase.DUAL_WRITE)])
def test_moves_into_old_only_phases_wait_while_new_may_be_newer(action, phase):
    d = decide(action, phase, Facts(**OPEN, newer_may_be="new"))
    assert not d.allowed and any("reshard verify" in r for r in d.refusals)
    assert decide(action, phase, Facts(**OPEN)).allowed


def test_moves_that_still_read_both_layouts_are_not_held():
    # backfill -> dual_read reads both layouts (newest wins): the flag does not hold it back.
    assert decide(Action.ROLLBACK, Phase.BACKFILL, Facts(**OPEN, newer_may_be="new")).allowed
    assert catch_up_refusal(Phase.DUAL_READ, "new") is None and catch_up_refusal(Phase.BACKFILL, "old") is None


def test_verify_repair_runs_on_both_sides_of_the_switch():
    assert job_rule("verify", repair=True).phases == (Phase.BACKFILL, Phase.CUTOVER)
