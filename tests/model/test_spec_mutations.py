"""Mutation tests: remove one fence, and the model checker must find a violation.

Each test disables exactly one fence (the function that builds it returns an always-true
condition, or the condition is dropped) and runs a scenario that passes with the fence in
place (``test_spec_issue12.py``, ``test_explore_product.py``); the explorer must report a
violation. The table in ``tests/model/README.md`` lists them.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from tests.model.test_spec_issue12 import coarse_switch_polls  # noqa: F401  (fixture)

from reshard import errors

from reshard.control.store import ControlStore
from reshard.core import versions
from reshard.core.versions import Fence
from tests.model import test_explore_product as product
from tests.model import test_spec_issue12 as spec_tests
from tests.model.explore import explore
from tests.model.spec import scenario


def always_true(fence: Fence) -> Fence:
    """The same placeholders (DynamoDB refuses unused ones), a condition that always holds."""
    if fence.values:
        # Every other name used once too (``still_tombstone`` also names ``#rs_del``).
        others = "".join(f" OR attribute_exists({n})" for n in fence.names if n != "#rs_v")
        return Fence("attribute_not_exists(#rs_v) OR #rs_v <> :rs_v OR #rs_v = :rs_v" + others, fence.names,
                     fence.values)
    names = dict(fence.names)
    return Fence(" OR ".join([f"attribute_not_exists({n}) OR attribute_exists({n})" for n in names]), names, {})


def disabled_in(module, name: str, caller: str, monkeypatch) -> None:
    """Replace ``module.name`` (a fence builder) by one that disarms the fence only when called
    from the function ``caller``: exactly that fence goes, the others stay."""
    real = getattr(module, name)

    def fake(*args, **kwargs):
        fence = real(*args, **kwargs)
        return always_true(fence) if sys._getframe(1).f_code.co_name == caller else fence
    monkeypatch.setattr(module, name, fake)


def must_find(factory, **bounds) -> str:
    result = explore(factory, **bounds)
    assert result.violation is not None, f"the checker found nothing without the fence ({result.schedules} schedules)"
    print(f"found after {result.schedules} schedules: {result.violation.message[:600]}")
    # An invariant the checker states, not a mutation that broke the code it patched.
    assert result.violation.message.startswith("invariant:"), result.violation.report()[:3000]
    return result.violation.message


def test_without_the_switch_hold(monkeypatch, coarse_switch_polls):
    """Backfill -> cutover as a plain transition: a shim on each side, two ADDs, one is lost."""
    import reshard.control.transition as transition_module
    monkeypatch.setattr(transition_module, "changes_authority", lambda frm, to: False)
    must_find(scenario(spec_tests.authority_switch([("add", "k")], [("add", "k")])), **spec_tests.SWITCH_BOUNDS)


def test_without_the_authoritative_version_fence(monkeypatch):
    import reshard.shim.writes as writes
    disabled_in(writes, "fence_for", "_authoritative", monkeypatch)
    must_find(scenario(spec_tests.adjacent_write_phases), preemption_bound=1)


def test_without_the_mirror_version_fence(monkeypatch):
    import reshard.shim.writes as writes
    disabled_in(writes, "fence_for", "_mirror", monkeypatch)
    must_find(scenario(spec_tests.adjacent_write_phases), preemption_bound=1)


def test_without_tombstones(monkeypatch):
    import reshard.shim.phase_cache as phase_cache
    from reshard.core.phases import routing_of
    monkeypatch.setattr(phase_cache, "routing_of",
                        lambda phase, switching=False, newer_may_be=None: dataclasses.replace(
                            routing_of(phase, switching, newer_may_be), tombstones=False))
    must_find(scenario(spec_tests.adjacent_write_phases), preemption_bound=1)


def test_without_the_copy_version_fence(monkeypatch):
    """The backfill's copy as a blind PutItem: a stale pre-migration copy lands over a shim's
    newer write (or a delete's tombstone) at the new key."""
    import reshard.jobs.backfill as backfill
    disabled_in(backfill, "copy_fence", "_copy", monkeypatch)
    must_find(scenario(spec_tests.copier_and_two_shims), preemption_bound=1)


def test_without_the_lease_deadline_guard(monkeypatch):
    """Every data write's per-attempt guard says "fine" (no deadline check, no renewal): a copier
    frozen past its lease before its copy sends it after the abort's cleanup judged its lease
    quiet and retired the migration."""
    from reshard.jobs.engine import PageContext
    monkeypatch.setattr(PageContext, "write_guard", lambda self: None)
    must_find(scenario(spec_tests.abort_racing_a_stalled_copier), preemption_bound=1,
              drive=spec_tests.freeze_at("C1", "guard", 11))


def no_wait_in(caller: str, monkeypatch, module=None) -> None:
    """``await_no_writers`` answers "nobody can write" at once, only when called from ``caller``."""
    import reshard.control.transition as transition_module
    module = module or transition_module
    real = module.await_no_writers

    def fake(*args, **kwargs):
        return None if sys._getframe(1).f_code.co_name == caller else real(*args, **kwargs)
    monkeypatch.setattr(module, "await_no_writers", fake)


def test_without_the_cutover_wait_for_job_leases(monkeypatch):
    """Cutover no longer waits for job leases: a copier mid-page sends its copy after cutover,
    cleanup and the cleanup pass retired the delete's tombstones, and the deleted item is back."""
    no_wait_in("transition", monkeypatch)
    must_find(scenario(spec_tests.copier_across_cutover_and_cleanup), preemption_bound=1,
              drive=spec_tests.mid_page_delete())


def test_without_the_abort_cleanup_wait_for_job_leases(monkeypatch):
    """The abort's cleanup pass starts while a copier may still write: its copy lands behind the
    pass's scan (the retire, which waits, then lets it stay)."""
    import reshard.jobs.cleanup as cleanup
    no_wait_in("_check", monkeypatch, cleanup)
    must_find(scenario(spec_tests.abort_racing_a_stalled_copier), preemption_bound=1,
              drive=spec_tests.freeze_at("C1", "guard", 11))


def test_the_retire_wait_is_a_second_look(monkeypatch):
    """retire's own wait for job leases, removed, is *not* found, and cannot be in any flow the
    product has: retire runs only at the end of the abort's cleanup pass, whose precondition
    already waited until no job lease could be used (:func:`test_without_the_abort_cleanup_wait_for_job_leases`
    finds that one), and a lease claimed after that look reads the phase afresh before its first
    write (the engine's first-page phase guard) and stops. Calling retire alone while a copier
    can still copy leaves copies by design (retire removes nothing). So this checks the layering
    instead: without retire's wait the abort scenarios still pass."""
    no_wait_in("retire", monkeypatch)
    for drive in (spec_tests.freeze_at("C1", "guard", 11), None):
        result = explore(scenario(spec_tests.abort_racing_a_stalled_copier), preemption_bound=1, drive=drive)
        result.assert_ok()
        assert result.schedules > 20


def test_without_the_cleanup_delete_version_fence(monkeypatch):
    """The cleanup pass's deletes as blind deletes: a tombstone it scanned is deleted after the
    application wrote the item again, and the acknowledged write is lost."""
    import reshard.jobs.cleanup as cleanup
    disabled_in(cleanup, "unchanged", "_delete_if_unchanged", monkeypatch)
    disabled_in(cleanup, "still_tombstone", "_delete_if_unchanged", monkeypatch)  # a tombstone's (a25)
    must_find(scenario(spec_tests.abort_cleanup_racing_a_put), preemption_bound=2)


def test_without_the_repair_lease_deadline_guard(monkeypatch):
    """verify --repair's writes without their lease-deadline guard: a repair frozen past its
    lease writes a new copy after the abort's cleanup and retire."""
    import reshard.jobs.verify as verify
    real = verify.conditional_put

    def unguarded(*args, guard=None, **kwargs):
        return real(*args, **kwargs)
    monkeypatch.setattr(verify, "conditional_put", unguarded)
    must_find(scenario(spec_tests.abort_racing_a_stalled_repair), preemption_bound=1,
              drive=spec_tests.freeze_at("R", ("guard", "put_item"), 11, table="data"))


# The census (``transition.facts`` -> ``decide``, ``Facts.lagging``) has no mutation test any more:
# the one transition where a lagging shim breaks an invariant here (backfill -> cutover) is a
# switch, whose own wait for every live shim's acknowledgement holds it without the census
# (census_holds_the_fleet, and variants from planned, dual_write and cutover, find nothing with
# ``lagging=()``). The old test passed only because its patch raised TypeError.


def test_without_the_liveness_time_fence(monkeypatch):
    """A shim that could not refresh for longer than its liveness window acts anyway (the check
    at the start of a request and before every attempt of an authoritative write both go)."""
    from reshard.shim.phase_cache import PhaseCache
    monkeypatch.setattr(PhaseCache, "_check_live_locked", lambda self, now: None)
    must_find(scenario(undated(spec_tests.silent_shim)), preemption_bound=1, drive=spec_tests.silence())


def undated(build):
    """``build`` on a server whose answers carry no ``Date``: the shim has no server time to date
    its facts by, so the liveness window is its only bound (``PhaseCache.horizon`` returns None).
    With dates, a silent shim's facts expire on the server's clock too (the shim refuses to send:
    ``test_without_the_liveness_time_fence_and_the_fact_horizon``)."""
    def undated_build(w):
        w.db.send_date = False
        return build(w)
    return undated_build


def test_without_the_liveness_time_fence_and_the_fact_horizon(monkeypatch):
    """On a server that sends dates, the liveness fence *and* the shim's own check of its fact's
    horizon (``PhaseCache.horizon``: no usable fact, refresh, else refuse unsent) go: the silent
    shim's write is sent (signed by its old fact, not enforced here: ``server_deadline`` off)."""
    from reshard.shim.phase_cache import PhaseCache
    monkeypatch.setattr(PhaseCache, "_check_live_locked", lambda self, now: None)
    monkeypatch.setattr(PhaseCache, "horizon", lambda self, st: None)
    must_find(scenario(spec_tests.silent_shim), preemption_bound=1, drive=spec_tests.silence())


def test_without_the_shim_per_attempt_liveness_check(monkeypatch):
    """Only the check before every attempt of an authoritative write goes (the one at the start
    of a request stays): a shim frozen in flight on `planned` writes the old layout only, behind the copy."""
    from reshard.shim.phase_cache import PhaseCache
    monkeypatch.setattr(PhaseCache, "check_live", lambda self: None)
    must_find(scenario(spec_tests.shim_frozen_in_flight), preemption_bound=1,
              drive=spec_tests.census_then_freeze("B"))


def disarm(monkeypatch, expression_starts: str) -> None:
    """``ControlStore.update`` with an always-true condition (``<condition> OR attribute_exists(pk)
    OR attribute_not_exists(pk)``: every placeholder still used) for the update expressions that
    start with ``expression_starts``: exactly that compare-and-set goes."""
    real = ControlStore.update

    def update(self, pk, sk, expression, *args, condition=None, **kwargs):
        if condition and expression.startswith(expression_starts):
            condition = f"{condition} OR attribute_exists(pk) OR attribute_not_exists(pk)"
        return real(self, pk, sk, expression, *args, condition=condition, **kwargs)
    monkeypatch.setattr(ControlStore, "update", update)


def found_by(test) -> str:
    """Run a product scenario test that explores and asserts; return its violation report."""
    with pytest.raises(AssertionError) as e:
        test()
    text = str(e.value)
    assert "violation found" in text and " raised " not in text, text[:2000]
    return text


def test_without_the_phase_compare_and_set(monkeypatch):
    disarm(monkeypatch, "SET phase = :to")
    assert "['won', 'won']" in found_by(product.test_two_operators_race_a_transition)


def test_without_the_lease_checkpoint_fence(monkeypatch):
    # The checkpoint, the renewal and the finish: every write conditioned on owner AND token.
    for starts in ("SET checkpoint = :cp", "SET lease_expires = :exp", "SET done = :t"):
        disarm(monkeypatch, starts)
    found_by(product.test_every_interleaving_of_two_hosts_on_one_segment)


def test_without_the_lease_claim_compare_and_set(monkeypatch):
    disarm(monkeypatch, "SET #owner = :me, lease_expires = :exp, lease_counter")
    found_by(product.test_every_interleaving_of_two_hosts_on_one_segment)


def test_fence_builders_are_the_ones_patched():
    """The mutations above patch names the product really uses (a rename must break them loudly)."""
    import inspect

    import reshard.control.transition as transition_module
    import reshard.jobs.backfill as backfill
    import reshard.jobs.cleanup as cleanup
    import reshard.jobs.verify as verify
    import reshard.shim.writes as writes
    from reshard import operations
    from reshard.control import runs
    from reshard.jobs.engine import PageContext
    from reshard.jobs.runner import conditional_put
    from reshard.shim.phase_cache import PhaseCache
    assert writes.fence_for is versions.fence_for
    assert backfill.copy_fence is versions.copy_fence and cleanup.unchanged is versions.unchanged
    assert verify.conditional_put is conditional_put
    # Each fence is built (or the wait made) inside the very function the mutation names.
    for fn, name in ((backfill.Backfill._copy, "copy_fence("), (cleanup.Cleaner._delete_if_unchanged, "unchanged)("),
                     (cleanup.Cleaner._delete_if_unchanged, "still_tombstone if tombstone"),
                     (transition_module.transition, "await_no_writers("), (transition_module.retire, "await_no_writers("),
                     (cleanup._check, "await_no_writers("), (PageContext.write_guard, "self.check_deadline()"),
                     (verify.Verifier._repair, "guard=ctx.write_guard"), (verify.Verifier._mirror_to_old, "guard=ctx.write_guard"),
                     (PhaseCache.begin, "self._check_live_locked("), (PhaseCache.check_live, "self._check_live_locked("),
                     (operations.run_data_job, "sweeps_again("), (writes.WriteProtocol._write_update, "index_actions("),
                     (writes.WriteProtocol._index_update_plan, "index_update_plan(")):
        assert name in inspect.getsource(fn), (fn.__qualname__, name)
    # The model's gates on the logical clock wrap the real wait (conftest).
    assert transition_module.await_no_writers.__name__ == runs.await_no_writers.__name__
    assert "phase_version = :v" in open(sys.modules[ControlStore.__module__].__file__).read()


def test_without_the_abort_cleanup_second_sweep(monkeypatch):
    """`reshard cleanup` of an aborted migration without its second pass (operations.sweeps_again
    says no): A's delete lands after the pass went by, the cleanup returns, the tombstone stays."""
    from reshard import operations
    monkeypatch.setattr(operations, "sweeps_again", lambda before, after: False)
    assert "leftover tombstone after the cleanup returned" in must_find(
        scenario(spec_tests.tombstone_after_the_abort_pass), preemption_bound=1)
