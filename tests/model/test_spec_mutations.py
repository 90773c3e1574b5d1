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
        return Fence("attribute_not_exists(#rs_v) OR #rs_v <> :rs_v OR #rs_v = :rs_v", fence.names, fence.values)
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
    return result.violation.message


def test_without_the_switch_hold(monkeypatch, coarse_switch_polls):
    """Backfill -> cutover as a plain transition: a shim on each side, two ADDs, one is lost."""
    import reshard.control.transition as transition_module
    monkeypatch.setattr(transition_module, "changes_authority", lambda frm, to: False)
    must_find(scenario(spec_tests.authority_switch([("add", "k")], [("add", "k")])), **spec_tests.SWITCH_BOUNDS)


def test_without_the_authoritative_version_fence(monkeypatch):
    import reshard.shim.table as table
    disabled_in(table, "fence_for", "_authoritative", monkeypatch)
    must_find(scenario(spec_tests.adjacent_write_phases), preemption_bound=1)


def test_without_the_mirror_version_fence(monkeypatch):
    import reshard.shim.table as table
    disabled_in(table, "fence_for", "_mirror", monkeypatch)
    must_find(scenario(spec_tests.adjacent_write_phases), preemption_bound=1)


def test_without_tombstones(monkeypatch):
    import reshard.shim.phase_cache as phase_cache
    from reshard.core.phases import routing_of
    monkeypatch.setattr(phase_cache, "routing_of",
                        lambda phase, switching=False: dataclasses.replace(routing_of(phase, switching),
                                                                           tombstones=False))
    must_find(scenario(spec_tests.adjacent_write_phases), preemption_bound=1)


def test_without_the_copy_read_back(monkeypatch):
    from reshard.jobs.backfill import Backfill
    monkeypatch.setattr(Backfill, "_settle", lambda self, scanned, copied, current, counts: None)
    must_find(scenario(spec_tests.copier_and_shim), preemption_bound=2)


def test_without_the_recopy_version_fence(monkeypatch):
    import reshard.jobs.backfill as backfill
    disabled_in(backfill, "fence_for", "_fenced_put", monkeypatch)
    must_find(scenario(spec_tests.copier_and_two_shims), preemption_bound=2)


def test_without_the_census(monkeypatch):
    import reshard.control.transition as tr
    real = tr.facts
    monkeypatch.setattr(tr, "facts", lambda store, state, census, gates: dataclasses.replace(
        real(store, state, census, gates), lagging=()))
    must_find(scenario(spec_tests.census_holds_the_fleet), preemption_bound=1)


def test_without_the_liveness_time_fence(monkeypatch):
    """A shim that could not refresh for longer than its liveness window acts anyway."""
    from reshard.shim.phase_cache import PhaseCache
    real = PhaseCache.begin

    def begin(self):
        self._last_ok = self._clock()  # "just refreshed": the window check never trips
        return real(self)
    monkeypatch.setattr(PhaseCache, "begin", begin)
    result = explore(scenario(spec_tests.silent_shim), preemption_bound=1, drive=spec_tests.silence())
    assert result.violation is not None, "the checker found nothing without the liveness time fence"


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
    import reshard.jobs.backfill as backfill
    import reshard.shim.table as table
    assert table.fence_for is versions.fence_for and backfill.fence_for is versions.fence_for
    assert "phase_version = :v" in open(sys.modules[ControlStore.__module__].__file__).read()
