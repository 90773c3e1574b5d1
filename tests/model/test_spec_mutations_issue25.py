"""Mutation tests of issue 25's fences (docs/late-writes.md): each test disarms one fence of the
product on main and runs a scenario of ``test_spec_issue25.py`` (or the issue-12 one that found
the fence) that passes with it; the explorer must report an invariant violation (``must_find``).
The table in ``tests/model/README.md`` lists them with the violation each one finds.
"""

from __future__ import annotations

import pytest

from tests.model import test_spec_issue12 as spec12
from tests.model import test_spec_issue25 as spec25
from tests.model.spec import scenario
from tests.model.test_spec_issue12 import coarse_switch_polls  # noqa: F401  (fixture)
from tests.model.test_spec_mutations import must_find

# ----------------------------------------------------------------------------- the request horizon

def passes_then_found(build, drive, monkeypatch, disarm) -> str:
    """The scenario ``build`` from ``drive`` passes with every fence (each schedule from that
    opening), and with ``disarm(monkeypatch)`` the checker finds a violation from it."""
    from tests.model.explore import explore
    explore(scenario(build), preemption_bound=1, drive=drive).assert_ok()
    disarm(monkeypatch)
    return must_find(scenario(build), preemption_bound=1, drive=drive)


def test_shim_writes_signed_now(monkeypatch, coarse_switch_polls):
    """The shim still checks its fact before every attempt (``PhaseCache.horizon``) but signs
    "now" (``Dynamo.call(horizon=None)``): the frozen mirror lands after the cleanup job removed
    B's tombstone. (In cleanup B's delete is a tombstone, which the late mirror's version fence
    fails too: the horizon is what fences it once the cleanup job removed the tombstone, H + 2 s
    after its scan. The scenario with the job is explored from the opening and the operator's
    whole plan: exploring it all took minutes.)"""
    from reshard.shim.table import ShardedTable
    real = ShardedTable._horizon

    def now(self):
        real(self)  # the fact check stays: only the date goes
        return None
    found = passes_then_found(spec25.frozen_mirror_across_the_cleanup_job,
                              then_run(spec25.frozen_before_mirror("A", then=("C",)), "op"), monkeypatch,
                              lambda mp: mp.setattr(ShardedTable, "_horizon", now))
    assert "'by': 'A'" in found


def then_run(opening, *actors: str):
    """``opening``, then each of ``actors`` run to its end: a mutation test starts where the
    schedule that finds the violation goes (a prefix of one schedule the scenario explores)."""
    def drive(w) -> None:
        opening(w)
        for name in actors:
            while w.sched.actors[name].pending:
                w.apply(name)
    return drive


def test_job_writes_signed_now(monkeypatch):
    """A job's data writes go out without their horizon (``jobs/facts.DatedWrites`` passes
    everything through): the stalled copy lands after the cleanup job removed B's tombstone."""
    from reshard.jobs.facts import DatedWrites
    passes_then_found(spec25.stalled_copy_across_the_cleanup_job,
                      then_run(spec25.copy_on_the_wire("C1", watchers=("C2",)), "C2"), monkeypatch,
                      lambda mp: mp.setattr(DatedWrites, "call",
                                            lambda self, operation, **kw: self._dynamo.call(operation, **kw)))


# ----------------------------------------------------------------------------- catch-up

def test_without_catch_up_reads_of_both_layouts(monkeypatch, coarse_switch_polls):
    """After the switch the shim reads the new authority alone (``routing_of`` keeps the
    pre-write catch-up but not the flagged layout's read): B misses A's backfill write."""
    import dataclasses

    import reshard.shim.phase_cache as phase_cache
    real = phase_cache.routing_of

    def routing_of(phase, switching=False, newer_may_be=None):
        r = real(phase, switching, newer_may_be)
        plain = real(phase, switching, None)
        return dataclasses.replace(r, reads=plain.reads)
    monkeypatch.setattr(phase_cache, "routing_of", routing_of)
    must_find(scenario(spec25.half_written_then("backfill", ("advance",), after=(("get", "k"),))),
              preemption_bound=1, drive=spec25.dead_before_mirror("A", then=("C",)))


def test_without_the_pre_write_catch_up(monkeypatch, coarse_switch_polls):
    """Writes after the switch do not first bring the authoritative copy up to the flagged
    layout's newer one (``ShardedTable._catch_up`` does nothing): B's ADD builds on the stale copy."""
    from reshard.shim.table import ShardedTable
    monkeypatch.setattr(ShardedTable, "_catch_up", lambda self, st, fields, targets: None)
    must_find(scenario(spec25.half_written_then("cutover", ("rollback",),
                                                after=(("get", "k"), ("add", "k"), ("get", "k")))),
              preemption_bound=1, drive=spec25.dead_before_mirror("A", then=("C",)))


def test_without_the_catch_up_gates(monkeypatch, coarse_switch_polls):
    """``decide`` lets abort into a phase that reads old alone while the new layout may be newer
    (``catch_up_refusal`` says nothing). The shims still read both layouts while the flag is set
    (fail safe), so the abort alone loses nothing: its cleanup, which removes the new copies, does
    -- the write that landed in the new layout only."""
    import reshard.core.phases as phases
    monkeypatch.setattr(phases, "catch_up_refusal", lambda target, newer_may_be, verify_command="": None)
    must_find(scenario(spec25.half_written_then("cutover", ("rollback", "abort", "cleanup"))),
              preemption_bound=1, drive=spec25.dead_before_mirror("A", then=("C",)))


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="p25: a cleanup shim deletes with a tombstone now, which a flagged reader of both layouts "
                          "takes as newest; the clear's version bump is defence in depth in this scenario (the "
                          "cleanup job, which removes tombstones, starts only once the fleet acknowledged cleanup)")
def test_the_catch_up_clear_without_its_version_bump(monkeypatch, coarse_switch_polls):
    """Clearing ``newer_may_be`` as before main's fix: a plain compare-and-set that removes the
    flag, same phase version (shims on that version keep reading both layouts)."""
    from reshard.control.records import META
    from reshard.control.store import ControlStore
    from reshard.core.wire import S

    def clear(self, state, who):
        from reshard import errors
        try:
            self.update(self.mpk(state.id), META, "REMOVE newer_may_be",
                        condition="phase_version = :v AND newer_may_be = :f",
                        values={":v": {"N": str(state.phase_version)}, ":f": S(state.newer_may_be or "")})
        except errors.ConditionalCheckFailed:
            return False
        return True
    monkeypatch.setattr(ControlStore, "clear_newer_may_be", clear)
    must_find(scenario(spec12.adjacent_cutover_cleanup), preemption_bound=1, samples=10, seed=2)


# ----------------------------------------------------------------------------- lost answers, markers, leftovers

def test_without_the_marker_check(monkeypatch):
    """The shim never refuses for the table marker (``PhaseCache._check_marker``): a shim with a
    mistyped control table writes the steady state's layout in cutover."""
    from reshard.shim.phase_cache import PhaseCache
    monkeypatch.setattr(PhaseCache, "_check_marker", lambda self, item, state: None)
    must_find(scenario(spec25.mistyped_control_table), preemption_bound=1)


def test_without_the_marker_check_on_the_previous_file(monkeypatch):
    from reshard.shim.phase_cache import PhaseCache
    monkeypatch.setattr(PhaseCache, "_check_marker", lambda self, item, state: None)
    must_find(scenario(spec25.on_the_previous_file), preemption_bound=1)


def test_without_skipping_retired_copies(monkeypatch):
    """The shim reads a copy a cleanup retired (``_rs_gone``) as an item (``_hidden`` knows the
    marker only): the reverse migration reads the first one's TTL-pending leftover."""
    import reshard.shim.reads as reads
    import reshard.shim.requests as requests
    from reshard.core.marker import is_marker
    monkeypatch.setattr(requests, "_hidden", is_marker)
    monkeypatch.setattr(reads, "_hidden", is_marker)
    must_find(scenario(spec25.reverse_migration_in_the_retain_window), preemption_bound=1)


def test_mutation_targets_are_the_names_main_uses():
    """Every name patched above exists and is used where the mutation says (a rename breaks
    this loudly instead of leaving a mutation that disarms nothing)."""
    import inspect

    import reshard.control.transition as transition_module
    import reshard.jobs.cleanup as cleanup
    import reshard.jobs.strip as strip
    import reshard.shim.phase_cache as phase_cache
    import reshard.shim.reads as reads
    import reshard.shim.requests as requests
    import reshard.shim.table as table
    import reshard.shim.writes as writes
    from reshard.control.store import ControlStore
    from reshard.core import phases, versions
    from reshard.jobs.facts import DatedWrites
    assert writes.own_attempt is versions.own_attempt
    assert reads._hidden is requests._hidden
    assert phase_cache.routing_of is phases.routing_of
    for fn, name in ((table.ShardedTable._call, "horizon=self._horizon"),
                     (table.ShardedTable._authoritative, "own_attempt("),
                     (table.ShardedTable._get, "_hidden("), (DatedWrites.call, '"horizon"'),
                     (transition_module.transition, "await_phase_age("), (transition_module.finish_switch, "await_phase_age("),
                     (cleanup._check, "await_before_removal("), (strip._check, "await_before_removal("),
                     (phases.preconditions, "catch_up_refusal("), (phase_cache.PhaseCache._refresh_locked, "_check_marker(")):
        assert name in inspect.getsource(fn), (fn.__qualname__, name)
    assert "phase_version = :nv" in inspect.getsource(ControlStore.clear_newer_may_be)
    # The r25/r25b fences below the section marker.
    import reshard.operations as operations
    from reshard.control import horizon, marker
    from reshard.jobs.facts import JobFacts
    assert writes.RETRY_UNKNOWN is __import__("reshard.aws.dynamo", fromlist=["RETRY_UNKNOWN"]).RETRY_UNKNOWN
    assert transition_module.horizon_for is horizon.horizon_for and callable(marker.previous_horizon)
    for fn, name in ((strip.Stripper.page, "self.hold_seconds"), (strip._make_page, "hold_seconds=removal_hold("),
                     (writes.WriteProtocol, "RETRY_UNKNOWN.set(False)"),
                     (operations.start, "markers.previous_horizon("), (horizon.horizon_for, "state.previous_horizon"),
                     (transition_module.transition, "horizon_for(state)"),
                     (JobFacts._read, "self._check_owner("), (JobFacts._learn, "state.phase_version != self._version"),
                     # p25's fenced cleanup/complete, batch_writer and tombstone hold
                     (writes.WriteProtocol._authoritative, "fence_for(version)"),
                     (writes.WriteProtocol._write_batch, "not st.stamps"),
                     (writes.WriteProtocol._write_delete, "st.routing.tombstones"),
                     (cleanup.Cleaner.page, "self.hold_seconds")):
        assert name in inspect.getsource(fn), (fn.__qualname__, name)
    assert "self._catch_up(" in inspect.getsource(writes.WriteProtocol)


# ----------------------------------------------------------------------------- r25/r25b fences (docs/late-writes.md 2b)

def test_strip_without_its_per_page_hold(monkeypatch):
    """r25's B1: strip sends a page's REMOVEs right after its scan (``Stripper.hold_seconds`` 0):
    the duplicate of A's ADD, delivered after ``_rs_v`` went, passes ``_rs_v <> :v``: counted twice."""
    from reshard.jobs.strip import Stripper
    real = Stripper.__init__

    def no_hold(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.hold_seconds = 0.0
    monkeypatch.setattr(Stripper, "__init__", no_hold)
    found = must_find(scenario(spec25.duplicate_across_strip), preemption_bound=1, drive=spec25.held_twice("A"))
    assert "applied twice" in found


def test_a_lost_answers_update_sent_again_blindly(monkeypatch):
    """r25's B2: the shim no longer keeps ``Dynamo.call`` from re-sending an update whose answer
    was lost (``shim/writes`` sets ``aws/dynamo.RETRY_UNKNOWN`` False around it; here that does
    nothing): B's ADD lands between A's landed attempt and its resend, the resend loses its fence
    to B's newer version, and the shim goes above it -- A's ADD counts twice. (A create-if-absent
    put re-sent by a lone writer is recognised as its own attempt by the read after its failed
    condition: this mutation needs the second writer.)"""
    import reshard.shim.writes as writes

    class Blind:
        """``RETRY_UNKNOWN`` as seen from shim/writes: setting it changes nothing."""

        def set(self, value):
            return None

        def reset(self, token):
            raise AssertionError("never set")
    monkeypatch.setattr(writes, "RETRY_UNKNOWN", Blind())
    found = must_find(scenario(spec25.lost_answer_then_another_writer), preemption_bound=1)
    assert "applied twice" in found or "wrong result" in found


def _facts_blind_to_the_marker(monkeypatch) -> None:
    """A job's facts no longer keyed by the table marker it began under: the first read still
    learns the owner (and caps a foreign migration's horizon), a later owner is not a change."""
    from reshard.jobs.facts import JobFacts
    real = JobFacts._check_owner

    def blind(self, owner):
        return real(self, owner) if not self._owner_read else None
    monkeypatch.setattr(JobFacts, "_check_owner", blind)


def test_job_facts_not_keyed_by_the_table_marker(monkeypatch):
    """r25's B4: m1's strip, stalled across m2's start, renews its facts (m1 is complete) and
    deletes m2's tombstones; A's held mirror lands on the empty key: the item B deleted is back."""
    _facts_blind_to_the_marker(monkeypatch)
    found = must_find(scenario(spec25.previous_strip_across_the_next_start), preemption_bound=1,
                      drive=spec25.parked_at_scan("S"))
    assert "resurrection" in found


def test_job_facts_not_keyed_by_the_table_marker_in_a_retired_sweep(monkeypatch):
    """r25's B5: a retired migration's sweep, stalled across the retry's start, renews its facts
    (``aborted``) and retires the retry's tombstones: the item B deleted is back."""
    _facts_blind_to_the_marker(monkeypatch)
    found = must_find(scenario(spec25.retired_sweep_across_the_retry), preemption_bound=1,
                      drive=spec25.parked_at_scan("S"))
    assert "resurrection" in found


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="defence in depth since p25: D's delete in cleanup "
                   "is a tombstone newer than the stale repair, which fails its fence; the tombstone is removed only "
                   "H + 2 s after a scan that follows the repair's fact read, when the repair has expired (the same "
                   "migration's H dates both)")
def test_job_facts_keyed_by_the_phase_name(monkeypatch):
    """r25's B3: a job's facts are those of any version of an allowed phase (every version read
    is taken for the one the job began under): V's repair, decided while ``newer_may_be`` was
    set, is dated by a read of the cleared version and lands after cleanup's plain delete."""
    from reshard.jobs.facts import JobFacts
    real = JobFacts._learn

    def by_name(self, state, date, owner_why=None):
        self._version = state.phase_version
        return real(self, state, date, owner_why)
    monkeypatch.setattr(JobFacts, "_learn", by_name)
    found = must_find(scenario(spec25.frozen_repair_across_the_catch_up_clear), preemption_bound=1,
                      drive=spec25.repair_reading_its_fact_before_cleanup("V", "op"))
    assert "resurrection" in found


# ----------------------------------------------------------------------------- cleanup/complete fenced (p25)

@pytest.mark.parametrize("phase", ["cleanup", "complete"])
def test_cleanup_and_complete_writes_fenced_by_inequality_again(monkeypatch, phase):
    """The authoritative write of a cleanup/complete shim carries ``_rs_v <> :v`` again (as before
    the fenced phases): the duplicate of A's ADD, delivered after B's ADD, applies again."""
    import sys

    import reshard.shim.writes as writes
    from reshard.core.versions import Fence
    real = writes.fence_for

    def fence_for(version):
        fence = real(version)
        caller = sys._getframe(1)
        st = caller.f_locals.get("st")
        if caller.f_code.co_name == "_authoritative" and st is not None and st.phase in ("cleanup", "complete") \
                and fence.values:
            return Fence("attribute_not_exists(#rs_v) OR #rs_v <> :rs_v", fence.names, fence.values)
        return fence
    monkeypatch.setattr(writes, "fence_for", fence_for)
    found = must_find(scenario(spec25.duplicate_after_another_writer(phase)), preemption_bound=1,
                      drive=spec25.held_twice("A"))
    assert "applied twice" in found


def _plain_deletes_in(monkeypatch, phases: tuple[str, ...]) -> None:
    import dataclasses

    import reshard.shim.phase_cache as phase_cache
    real = phase_cache.routing_of

    def routing_of(phase, switching=False, newer_may_be=None):
        r = real(phase, switching, newer_may_be)
        return dataclasses.replace(r, tombstones=False) if str(getattr(phase, "value", phase)) in phases else r
    monkeypatch.setattr(phase_cache, "routing_of", routing_of)


@pytest.mark.parametrize("phase", ["cleanup", "complete"])
def test_cleanup_and_complete_delete_plainly_again(monkeypatch, phase):
    """Cleanup/complete shims delete with a plain DeleteItem again: A's put, its first attempt held
    and its retry acknowledged, then B's delete: the held attempt lands on the empty key."""
    _plain_deletes_in(monkeypatch, (phase,))
    found = must_find(scenario(spec25.held_then_deleted(phase)), preemption_bound=1)
    assert "resurrection" in found or "stale read" in found


def test_a_cleanup_shims_plain_delete_under_a_cutover_duplicate(monkeypatch):
    """r25b's B5 with plain cleanup deletes again: the cutover put's duplicate lands on the empty key."""
    _plain_deletes_in(monkeypatch, ("cleanup",))
    found = must_find(scenario(spec25.cutover_duplicate_after_a_cleanup_delete), preemption_bound=1,
                      drive=spec25.CUTOVER_DUPLICATE)
    assert "resurrection" in found


@pytest.mark.parametrize("phase", ["aborted", "cleanup", "complete"])
def test_tombstones_removed_right_after_the_scan(monkeypatch, phase):
    """The cleanup job (cleanup, aborted) and strip (complete) delete a tombstone at once after the
    scan that saw it (``hold_seconds`` 0): A's held put, older than B's tombstone, lands on the
    empty key within its horizon."""
    from reshard.jobs.cleanup import Cleaner
    from reshard.jobs.strip import Stripper
    for cls in (Cleaner, Stripper):
        real = cls.__init__

        def no_hold(self, *args, _real=real, **kwargs):
            _real(self, *args, **kwargs)
            self.hold_seconds = 0.0
        monkeypatch.setattr(cls, "__init__", no_hold)
    found = must_find(scenario(spec25.held_put_across_a_tombstones_removal(phase)), preemption_bound=1,
                      drive=spec25.HELD_BEFORE_THE_SCAN)
    assert "'by': 'A'" in found


def test_batch_writer_flushing_one_unconditional_batch_again(monkeypatch):
    """``batch_writer`` sends a migration phase's requests as one BatchWriteItem again (the steady
    state's path, taken where the routing writes one calculated layout): a cleanup shim's batched
    delete is plain, and the cutover put's duplicate lands on the empty key."""
    import sys

    from reshard.shim.phase_cache import PhaseState
    real = PhaseState.stamps

    def stamps(self):
        return False if sys._getframe(1).f_code.co_name == "_write_batch" else real.fget(self)
    monkeypatch.setattr(PhaseState, "stamps", property(stamps))
    found = must_find(scenario(spec25.cutover_duplicate_after_a_cleanup_batch_delete), preemption_bound=1,
                      drive=spec25.CUTOVER_DUPLICATE)
    assert "resurrection" in found


def test_start_without_the_previous_horizon_across_an_abort(monkeypatch):
    """r25's B6 since the fenced complete: without ``previous_horizon`` m2's ``planned`` lasts 17 s,
    the abort's cleanup removes B's tombstone inside m1's horizon (60 s), and A's held put (m1's
    file) lands on the empty key: the item B deleted is back after the retire."""
    from reshard.control import marker
    monkeypatch.setattr(marker, "previous_horizon", lambda store, mine: 0.0)
    found = must_find(scenario(spec25.held_put_of_the_previous_owner_across_an_abort), preemption_bound=1,
                      drive=spec25.held_twice("A", delivered=0, copies=1))
    assert "resurrection" in found


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="defence in depth since b25's fix: the abort's cleanup holds a tombstone's removal for the "
                          "longest writer's horizon (its previous_horizon, 60 s) too, so A's held put has expired "
                          "before B's tombstone goes; the planned-side wait alone is no longer what stops it here")
def test_planned_not_lasting_the_previous_horizon_across_an_abort(monkeypatch):
    """The same on the transition's side (``horizon_for`` ignores ``previous_horizon``; an abort
    out of ``planned`` is a transition out of it like an advance)."""
    import reshard.control.transition as transition_module
    from reshard.control.horizon import horizon_for
    from reshard.core.deadlines import STEADY_HORIZON_SECONDS
    from reshard.core.phases import Phase

    def without_previous(state):
        h = horizon_for(state)
        return max(state.request_horizon, STEADY_HORIZON_SECONDS) if state.phase is Phase.PLANNED and \
            not state.switching else h
    monkeypatch.setattr(transition_module, "horizon_for", without_previous)
    found = must_find(scenario(spec25.held_put_of_the_previous_owner_across_an_abort), preemption_bound=1,
                      drive=spec25.held_twice("A", delivered=0, copies=1))
    assert "resurrection" in found
