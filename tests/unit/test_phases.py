"""The phase rules, table-driven: every (phase, action) pair, the facts, the routing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reshard.core.phases import (ABORTABLE, ORDER, ROUTING, STEADY, TERMINAL, Action, Facts, Phase, decide,
                                 jobs_allowed, next_phase, previous_phase)

P, A = Phase, Action

#: Every gate satisfied, no lagging shim: only the order rules decide.
CLEAR = Facts(lagging=(), backfill_missing=None, verify_missing=None, cleanup_missing=None)

#: (phase, action) -> the target phase, or a fragment of the refusal reason.
RULES: dict[tuple[Phase, Action], Phase | str] = {
    (P.PLANNED, A.ADVANCE): P.DUAL_WRITE,
    (P.DUAL_WRITE, A.ADVANCE): P.DUAL_READ,
    (P.DUAL_READ, A.ADVANCE): P.BACKFILL,
    (P.BACKFILL, A.ADVANCE): P.CUTOVER,
    (P.CUTOVER, A.ADVANCE): P.CLEANUP,
    (P.CLEANUP, A.ADVANCE): P.COMPLETE,
    (P.COMPLETE, A.ADVANCE): "the migration is complete; there is no next phase",
    (P.ABORTED, A.ADVANCE): "the migration is aborted; there is no next phase",
    (P.PLANNED, A.ROLLBACK): "nothing to roll back",
    (P.DUAL_WRITE, A.ROLLBACK): P.PLANNED,
    (P.DUAL_READ, A.ROLLBACK): P.DUAL_WRITE,
    (P.BACKFILL, A.ROLLBACK): P.DUAL_READ,
    (P.CUTOVER, A.ROLLBACK): P.BACKFILL,
    (P.CLEANUP, A.ROLLBACK): "rollback is refused in cleanup: cleanup has begun",
    (P.COMPLETE, A.ROLLBACK): "rollback is refused in complete",
    (P.ABORTED, A.ROLLBACK): "the migration was aborted; start a new migration",
    (P.PLANNED, A.ABORT): P.ABORTED,
    (P.DUAL_WRITE, A.ABORT): P.ABORTED,
    (P.DUAL_READ, A.ABORT): P.ABORTED,
    (P.BACKFILL, A.ABORT): P.ABORTED,
    (P.CUTOVER, A.ABORT): "run `reshard rollback` to return to backfill first",
    (P.CLEANUP, A.ABORT): "abort is refused in cleanup: cleanup has begun",
    (P.COMPLETE, A.ABORT): "abort is refused in complete",
    (P.ABORTED, A.ABORT): "already aborted",
}
ALLOWED = [k for k, v in RULES.items() if isinstance(v, Phase)]
REFUSED = [k for k, v in RULES.items() if not isinstance(v, Phase)]


def test_an_empty_fleet_is_refused_unless_the_operator_vouches_for_it():
    empty = decide(Action.ADVANCE, Phase.PLANNED, Facts(live_shims=0))
    assert not empty.allowed and "no live shim reports for this table" in empty.refusals[0]
    assert "--allow-no-shims" in empty.refusals[0]
    assert decide(Action.ADVANCE, Phase.PLANNED, Facts(live_shims=None)).allowed  # vouched for
    assert decide(Action.ADVANCE, Phase.PLANNED, Facts(live_shims=2)).allowed


def test_the_table_covers_every_phase_and_action():
    assert set(RULES) == {(p, a) for p in Phase for a in Action}


@pytest.mark.parametrize("phase,action", ALLOWED, ids=lambda x: x.value)
def test_allowed_transitions(phase, action):
    d = decide(action, phase, CLEAR)
    assert d.allowed, d.refusals
    assert d.target is RULES[phase, action]
    assert d.refusals == () and d.current is phase and d.action is action


@pytest.mark.parametrize("phase,action", REFUSED, ids=lambda x: x.value)
def test_refused_transitions_say_why(phase, action):
    d = decide(action, phase, CLEAR)
    assert not d.allowed and d.target is None
    assert len(d.refusals) == 1
    assert RULES[phase, action] in d.refusals[0]


@pytest.mark.parametrize("phase,action", REFUSED, ids=lambda x: x.value)
def test_an_impossible_transition_gives_only_the_rule_not_the_fleet(phase, action):
    d = decide(action, phase, Facts(lagging=("i-1 (h pid 1, on planned v1)",)))
    assert d.refusals == (decide(action, phase, CLEAR).refusals[0],)


@pytest.mark.parametrize("phase,action", ALLOWED, ids=lambda x: x.value)
def test_every_possible_transition_waits_for_the_fleet(phase, action):
    d = decide(action, phase, Facts(lagging=("i-1 (h1 pid 1, on x v1)", "i-2 (h2 pid 2, on x v1)"),
                                    backfill_missing=None, verify_missing=None, cleanup_missing=None))
    assert not d.allowed
    assert d.target is RULES[phase, action]  # still says where it would go
    (why,) = d.refusals
    assert why.startswith(f"2 live shim(s) have not acknowledged {phase} yet: i-1 (h1 pid 1, on x v1), i-2")
    assert "`reshard wait` waits for them and moves nothing" in why
    assert f"reshard {action.value} --wait SECONDS" in why


def test_a_long_list_of_laggards_is_shortened():
    lagging = tuple(f"i-{n}" for n in range(8))
    (why,) = decide(A.ADVANCE, P.PLANNED, Facts(lagging=lagging)).refusals
    assert "i-0, i-1, i-2, i-3, i-4 and 3 more" in why and "i-5" not in why


#: gate field -> the one (phase, action) it guards
GATES = {
    "backfill_missing": (P.BACKFILL, A.ADVANCE),
    "verify_missing": (P.BACKFILL, A.ADVANCE),
    "cleanup_missing": (P.CLEANUP, A.ADVANCE),
}


@pytest.mark.parametrize("gate", sorted(GATES))
@pytest.mark.parametrize("phase,action", ALLOWED, ids=lambda x: x.value)
def test_each_gate_guards_exactly_one_transition(gate, phase, action):
    facts = Facts(**{**CLEAR.__dict__, gate: f"{gate} reason: run `reshard x`"})
    d = decide(action, phase, facts)
    if GATES[gate] == (phase, action):
        assert not d.allowed and d.refusals == (f"{gate} reason: run `reshard x`",)
    else:
        assert d.allowed, d.refusals


def test_without_providers_the_gates_are_closed():
    """Facts() (no backfill/verify/cleanup provider registered) never lets cutover or completion through."""
    d = decide(A.ADVANCE, P.BACKFILL, Facts())
    assert d.target is P.CUTOVER and not d.allowed
    assert any("reshard backfill" in r for r in d.refusals) and any("reshard verify" in r for r in d.refusals)
    d = decide(A.ADVANCE, P.CLEANUP, Facts())
    assert not d.allowed and "reshard cleanup" in d.refusals[0]
    assert decide(A.ADVANCE, P.DUAL_READ, Facts()).allowed


def test_all_refusals_are_listed_together():
    d = decide(A.ADVANCE, P.BACKFILL, Facts(lagging=("i-1",)))
    assert len(d.refusals) == 3
    assert "have not acknowledged" in d.refusals[0]


def test_order_helpers():
    assert [next_phase(p) for p in ORDER[:-1]] == list(ORDER[1:])
    assert [previous_phase(p) for p in ORDER[1:]] == list(ORDER[:-1])
    assert next_phase(P.COMPLETE) is None and next_phase(P.ABORTED) is None
    assert previous_phase(P.PLANNED) is None and previous_phase(P.ABORTED) is None


# ---------------------------------------------------------------- routing invariants
def neighbours(phase: Phase) -> set[Phase]:
    """Phases that can serve next to ``phase`` during one transition (either direction)."""
    out = {RULES[phase, a] for a in Action if isinstance(RULES[phase, a], Phase)}
    out |= {p for (p, a), t in RULES.items() if t is phase}
    return out


def reachable(phase: Phase) -> set[Phase]:
    seen, todo = set(), [phase]
    while todo:
        p = todo.pop()
        for a in Action:
            t = RULES[p, a]
            if isinstance(t, Phase) and t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


ADJACENT = sorted({tuple(sorted((p, t), key=lambda x: x.value)) for (p, a), t in RULES.items()
                   if isinstance(t, Phase)}, key=str)


def test_every_phase_has_a_routing():
    assert set(ROUTING) == set(Phase)
    assert STEADY.writes == ("old",) and STEADY.reads == ("old",)


@pytest.mark.parametrize("phase", list(Phase), ids=lambda x: x.value)
def test_authoritative_layout_is_written_first_and_read(phase):
    r = ROUTING[phase]
    assert r.authoritative == r.writes[0]
    assert len(set(r.writes)) == len(r.writes) and set(r.writes) <= {"old", "new"}
    assert r.authoritative in r.reads  # a shim reads what it wrote authoritatively
    assert set(r.reads) <= set(r.writes) | {"old", "new"}


@pytest.mark.parametrize("a,b", ADJACENT, ids=str)
def test_adjacent_phases_are_compatible(a, b):
    """Both write the same authoritative layout, or both are fenced and write each other's."""
    ra, rb = ROUTING[a], ROUTING[b]
    if ra.authoritative != rb.authoritative:
        assert ra.fenced and rb.fenced
        assert rb.authoritative in ra.writes and ra.authoritative in rb.writes


@pytest.mark.parametrize("a,b", ADJACENT, ids=str)
def test_adjacent_phases_read_each_others_writes(a, b):
    """Read-your-writes in a mixed fleet: what one phase writes, the other reads."""
    ra, rb = ROUTING[a], ROUTING[b]
    assert set(ra.writes) & set(rb.reads) and set(rb.writes) & set(ra.reads)


@pytest.mark.parametrize("phase", list(Phase), ids=lambda x: x.value)
def test_tombstones_wherever_two_layouts_may_be_in_play(phase):
    """A hard delete is only safe where no other layout can bring the item back: the
    phase, every phase serving next to it, and every phase it can lead to use one layout."""
    r = ROUTING[phase]
    if len(set(r.writes) | set(r.reads)) > 1:
        assert r.tombstones and r.fenced
    if not r.tombstones:
        layout = r.authoritative
        assert r.writes == (layout,) and r.reads == (layout,)
        for other in reachable(phase) | neighbours(phase):
            assert ROUTING[other].reads == (layout,), other


def test_phases_reading_old_from_a_dual_phase_neighbour_keep_tombstones():
    # planned and aborted read only old, yet serve next to phases that also write new.
    assert ROUTING[P.PLANNED].tombstones and ROUTING[P.ABORTED].tombstones


def test_abortable_and_terminal_sets_agree_with_the_rules():
    assert ABORTABLE == {p for p in Phase if RULES[p, A.ABORT] is P.ABORTED}
    assert TERMINAL == {p for p in Phase if not isinstance(RULES[p, A.ADVANCE], Phase)}


@pytest.mark.parametrize("phase", list(Phase), ids=lambda x: x.value)
def test_jobs_run_only_where_their_layouts_are_in_play(phase):
    jobs = jobs_allowed(phase)
    if jobs["backfill"]:
        assert ROUTING[phase].writes == ("old", "new") and ROUTING[phase].reads == ("old", "new")
    if jobs["verify"]:
        assert set(ROUTING[phase].writes) == {"old", "new"}
    assert jobs["cleanup"] == (phase in (P.CLEANUP, P.ABORTED))


def test_phase_rules_import_no_aws_or_cli_library():
    code = ("import sys, reshard.core.phases; bad = [m for m in ('boto3', 'botocore', 'click', 'tqdm', 'tenacity') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
