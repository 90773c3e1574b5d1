"""The model checker as the specification of issue 12 (see ``spec.py`` for the invariants).

Scenarios that pass on today's code must keep passing. Scenarios that find one of issue
12's bugs are ``xfail(strict=True)`` with the case number: they turn into failures (XPASS)
the moment the fix lands, and the marker goes. Bounds are chosen so the folder stays fast:
exhaustive search under a preemption bound, then a few seeded random schedules.
"""

from __future__ import annotations

import pytest

from tests.model.explore import World, explore, describe_bounds
from tests.model.spec import Fleet, scenario

SENSOR_KEY = dict(sensor_id="s-1", event_id="e-1", ts="2024-10-27T15:00:00Z")


def sensor_fleet(w: World, phase: str) -> Fleet:
    f = Fleet(w, phase=phase)
    f.key("k", **SENSOR_KEY)
    return f


def run(build, **bounds):
    result = explore(scenario(build), **bounds)
    print(describe_bounds(result))
    result.assert_ok()
    return result


# ----------------------------------------------------------------------------- passing today

def adjacent_write_phases(w: World) -> Fleet:
    """dual_read -> backfill while two shims put / ADD / delete / read one item and refresh
    (acknowledging) in between: old-first writers on both sides, the layouts converge."""
    f = sensor_fleet(w, "dual_read")
    f.shim_actor("A", ("put", "k", {"by": "A"}), ("refresh",), ("add", "k"), ("get", "k"))
    f.shim_actor("B", ("add", "k"), ("refresh",), ("delete", "k"))
    f.operator("op", "advance")
    return f


def test_shims_across_dual_read_to_backfill():
    r = run(adjacent_write_phases, preemption_bound=1, samples=10, seed=1)
    assert r.schedules > 50 and r.truncated == 0


def adjacent_cutover_cleanup(w: World) -> Fleet:
    """cutover -> cleanup: both sides write the new layout first (cleanup unfenced, cutover fenced)."""
    f = sensor_fleet(w, "cutover")
    f.shim_actor("A", ("put", "k", {"by": "A"}), ("refresh",), ("add", "k"), ("get", "k"))
    f.shim_actor("B", ("add", "k"), ("refresh",), ("delete", "k"), ("get", "k"))
    f.operator("op", "advance")
    return f


def test_shims_across_cutover_to_cleanup():
    r = run(adjacent_cutover_cleanup, preemption_bound=1, samples=10, seed=2)
    assert r.schedules > 50


def census_holds_the_fleet(w: World) -> Fleet:
    """An operator advancing twice (dual_read -> backfill -> cutover) while shim B never refreshes:
    the census refuses the second step, so B (dual_read) never meets a cutover shim."""
    f = sensor_fleet(w, "dual_read")
    f.shim_actor("A", ("refresh",), ("refresh",), ("add", "k"))
    f.shim_actor("B", ("add", "k"))
    f.operator("op", "advance", "advance")
    return f


def test_census_keeps_the_fleet_on_adjacent_phases():
    run(census_holds_the_fleet, preemption_bound=1)


def copier_and_shim(w: World) -> Fleet:
    """A copier (the real Backfill.page) and a shim writing the items it copies, in backfill:
    the read-back and the fenced re-copy keep the new layout right."""
    f = Fleet(w, phase="backfill")
    for i, extra in ((1, {}), (2, {})):
        f.key(f"k{i}", sensor_id="s-1", event_id=f"e-{i}", ts=f"2024-10-27T15:00:0{i}Z")
        f.seed(f"k{i}", {"temp": i})
        f.expect_initial(f"k{i}", {"temp": i})
    f.copier("C")
    f.shim_actor("A", ("put", "k1", {"by": "A"}), ("delete", "k2"), ("add", "k1"))
    return f


def test_a_copier_racing_shim_writes():
    r = run(copier_and_shim, preemption_bound=2, samples=10, seed=3)
    assert r.schedules > 50


def copier_and_two_shims(w: World) -> Fleet:
    """A copier and two shims writing one item it copies: a write between the copier's read-back
    and its re-copy is kept by the re-copy's version fence."""
    f = Fleet(w, phase="backfill")
    f.key("k", **SENSOR_KEY)
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.copier("C")
    f.shim_actor("A", ("put", "k", {"temp": 2}))
    f.shim_actor("B", ("add", "k"))
    return f


def test_a_copier_racing_two_shims():
    run(copier_and_two_shims, preemption_bound=1, samples=40, seed=4)


def silent_shim(w: World) -> Fleet:
    """Every shim was silent for 46 s (past the 30 s liveness window + the 15 s skew allowance):
    A refreshes and writes, B writes without refreshing, the operator cuts over (B no longer
    counts in the census). B's request must fail closed (ShimUnavailable), not act on backfill."""
    f = sensor_fleet(w, "backfill")
    f.shim_actor("A", ("refresh",), ("add", "k"))
    f.shim_actor("B", ("add", "k"))
    f.operator("op", "advance")
    return f


def silence(seconds: float = 46.0):
    def drive(w: World) -> None:
        w.sched.tick(seconds)
    return drive


def test_a_silent_shim_fails_closed():
    r = explore(scenario(silent_shim), preemption_bound=1, drive=silence())
    print(describe_bounds(r))
    r.assert_ok()
    assert r.schedules > 20


# ----------------------------------------------------------------------------- issue 12's bugs

def authority_switch(ops_a, ops_b, start="backfill", action="advance"):
    def build(w: World) -> Fleet:
        f = sensor_fleet(w, start)
        f.shim_actor("A", ("refresh",), *ops_a)
        f.shim_actor("B", *ops_b, ("refresh",))
        f.operator("op", action)
        return f
    return build


CASE1 = "issue 12 case 1: authority switch (backfill <-> cutover)"


@pytest.fixture(autouse=True)
def coarse_switch_polls(monkeypatch):
    """The switch polls the control row every 100-150 ms; on the logical clock that is a long
    chain of identical reads. Polling every 2 s keeps the same interleavings of the writes
    (a held request still waits for the whole fleet) with far fewer schedules."""
    import reshard.control.transition as transition_module
    import reshard.shim.phase_cache as phase_cache_module
    monkeypatch.setattr(transition_module, "SWITCH_POLL_SECONDS", 2.0)
    monkeypatch.setattr(phase_cache_module, "SWITCH_POLL_SECONDS", 2.0)


#: Every schedule with at most one preemption (with the coarse polls: a few hundred each).
SWITCH_BOUNDS = {"preemption_bound": 1}


def test_authority_switch_two_increments(coarse_switch_polls):
    run(authority_switch([("add", "k")], [("add", "k")]), **SWITCH_BOUNDS)


def test_authority_switch_put_and_update(coarse_switch_polls):
    run(authority_switch([("put", "k", {"by": "A"})], [("add", "k")]), **SWITCH_BOUNDS)


def test_authority_switch_delete_and_update(coarse_switch_polls):
    def build(w):
        f = authority_switch([("delete", "k")], [("add", "k")])(w)
        f.seed("k", {"temp": 1})
        f.expect_initial("k", {"temp": 1})
        return f
    run(build, **SWITCH_BOUNDS)


def test_authority_switch_two_conditional_writes(coarse_switch_polls):
    run(authority_switch([("cas", "k", None, 1)], [("cas", "k", None, 2)]), **SWITCH_BOUNDS)


def test_authority_switch_back_two_increments(coarse_switch_polls):
    run(authority_switch([("add", "k")], [("add", "k")], start="cutover", action="rollback"), **SWITCH_BOUNDS)


def stalled_copier_then_cutover(w: World) -> Fleet:
    """Two backfill hosts share the segment; the application puts the item; the operator cuts
    over. C1 is frozen past its 10 s lease (see ``freeze_at``) and may die between any two of
    its later calls."""
    f = Fleet(w, phase="backfill")
    f.key("k", **SENSOR_KEY)
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.copier("C1")
    f.shim_actor("A", ("put", "k", {"temp": 99}))
    # The other host finishes the backfill, verify runs, and the operator cuts over through
    # the real gates (one actor: the gates already order them).
    f.copier("C2", then=lambda: f.transition("op", "verify+advance"))
    w.may_kill("C1")
    return f


def freeze_at(actor: str, op: str, seconds: float):
    """A fixed opening: ``actor`` runs to its first ``op`` call and freezes there while the clock
    moves ``seconds`` (a GC pause, a VM pause, or the budget's own sleep after the lease check)."""
    def drive(w: World) -> None:
        while w.sched.actors[actor].pending and w.sched.actors[actor].pending[0] != op:
            w.apply(actor)
        w.sched.tick(seconds)
    return drive


@pytest.mark.xfail(strict=True, reason="issue 12 case 2: a copier stalled past its lease blind-writes a stale page "
                                       "onto the authoritative new layout after cutover")
def test_a_copier_stalled_past_its_lease_before_its_write():
    r = explore(scenario(stalled_copier_then_cutover), preemption_bound=1,
                drive=freeze_at("C1", "batch_write_item", 11))
    print(describe_bounds(r))
    r.assert_ok()


def invoices_key(w: World | None = None) -> tuple[dict, int, int]:
    """An invoice line whose new shard is < 10, so old shard ``unmoved`` gives the very same key,
    and another old shard ``other``."""
    from reshard.aws.dynamo import to_wire
    from reshard.core.layout import KeyMapper
    from tests.shim_helpers import migration
    mapper = KeyMapper(migration("invoices"))
    for n in range(100):
        fields = {"invoice_number": str(100000 + n), "line": "1"}
        new = mapper.to_physical(to_wire(fields), mapper.new)
        shard = int(new["PK"]["S"].rsplit("#", 1)[1])
        if shard < 10:
            return fields, shard, (shard + 1) % 10
    raise AssertionError("no invoice maps to a new shard below 10")


def random_suffix_duplicates(w: World) -> Fleet:
    """The invoices table (random suffix): one logical item under two old shards, the newer
    (versioned) copy at the shard whose key equals the new key, an older unversioned copy under
    another; a shim ADDs to it while the copier runs."""
    f = Fleet(w, kind="invoices", phase="backfill", table="Invoices")
    fields, unmoved, other = invoices_key()
    f.key("k", **fields)
    f.seed("k", {"amount": 5}, shards=(other,))
    f.seed("k", {"amount": 7}, shards=(unmoved,), versions=("1600000000000.000000.old",))
    f.seeded_old["k"] = 2
    f.expect_initial("k", {"amount": 7})
    f.copier("C")
    f.shim_actor("A", ("add", "k"), ("get", "k"))
    return f


@pytest.mark.xfail(strict=True, reason="issue 12 case 3: the copy of an older duplicate overwrites the newer "
                                       "copy already at the new key")
def test_random_suffix_duplicates():
    run(random_suffix_duplicates, preemption_bound=1)


def leftover_tombstone(w: World) -> Fleet:
    """An aborted migration being retired: shim A (still on aborted) deletes, shim B (already on
    the retired = steady state) updates the same item."""
    f = sensor_fleet(w, "aborted")
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.shim_actor("A", ("delete", "k"))
    f.shim_actor("B", ("refresh",), ("add", "k"), ("get", "k"))
    f.operator("op", "retire")
    return f


def test_leftover_tombstone_after_retire():
    run(leftover_tombstone, preemption_bound=1)


def abort_racing_a_stalled_copier(w: World) -> Fleet:
    """C1 frozen at its batch write past its lease; the operator aborts, runs the cleanup pass
    (which waits only for live leases) and so retires the migration; C1 may then write."""
    f = Fleet(w, phase="backfill")
    f.key("k", **SENSOR_KEY)
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.copier("C1")
    f.operator("op", "abort", "cleanup")
    return f


@pytest.mark.xfail(strict=True, reason="issue 12 case 6: abort's cleanup waits only for live leases; a copier "
                                       "stalled past its lease writes its page after the retire")
def test_abort_racing_a_stalled_copier():
    r = explore(scenario(abort_racing_a_stalled_copier), preemption_bound=1,
                drive=freeze_at("C1", "batch_write_item", 11))
    print(describe_bounds(r))
    r.assert_ok()


def test_abort_with_a_live_copier():
    """Without the stall: the cleanup pass refuses while the copier's lease is live, and the
    copier's phase guard stops it at its next page; nothing is left behind the retire."""
    r = run(abort_racing_a_stalled_copier, preemption_bound=1)
    assert r.schedules > 20


@pytest.mark.xfail(strict=True, reason="issue 12 case 3: a delete's tombstone on one copy is overwritten by the "
                                       "copy of the live older duplicate")
def test_random_suffix_duplicates_delete():
    def build(w: World) -> Fleet:
        f = Fleet(w, kind="invoices", phase="backfill", table="Invoices")
        fields, unmoved, other = invoices_key()
        f.key("k", **fields)
        f.seed("k", {"amount": 5}, shards=(other,))
        f.seed("k", {"amount": 7}, shards=(unmoved,), versions=("1600000000000.000000.old",))
        f.seeded_old["k"] = 2
        f.expect_initial("k", {"amount": 7})
        f.shim_actor("A", ("delete", "k"), ("get", "k"))
        f.copier("C")
        return f
    run(build, preemption_bound=1)


def invoice_stored_once_in_cutover() -> dict:
    """A brand-new invoice line whose new key equals the old shard derived for it."""
    from reshard.aws.dynamo import to_wire
    from reshard.core.layout import KeyMapper, hash_shard
    from tests.shim_helpers import migration
    mapper = KeyMapper(migration("invoices"))
    for n in range(2000):
        fields = {"invoice_number": str(200000 + n), "line": "1"}
        wire = to_wire(fields)
        new = mapper.to_physical(wire, mapper.new)
        ident = "#".join(mapper.identity(mapper.logical_fields(wire)))
        if mapper.old.key(mapper.logical_fields(wire), hash_shard(ident, mapper.old.shards)) == \
                {a: new[a] for a in mapper.old.key_attrs}:
            return fields
    raise AssertionError("no such invoice line")


def random_suffix_put_in_cutover_then_abort(w: World) -> Fleet:
    """A shim in cutover puts a brand-new invoice line and shuts down; the operator rolls back,
    aborts and runs the abort's cleanup pass (which removes the migration's new copies)."""
    f = Fleet(w, kind="invoices", phase="cutover", table="Invoices")
    f.key("k", **invoice_stored_once_in_cutover())
    f.shim_actor("A", ("put", "k", {"amount": 3}), ("close",))
    f.operator("op", "rollback", "abort", "cleanup")
    return f


def test_random_suffix_put_in_cutover_then_abort():
    run(random_suffix_put_in_cutover_then_abort, preemption_bound=1)


def test_random_suffix_put_in_cutover_then_repair():
    def build(w: World) -> Fleet:
        f = Fleet(w, kind="invoices", phase="cutover", table="Invoices")
        f.key("k", **invoice_stored_once_in_cutover())
        f.shim_actor("A", ("put", "k", {"amount": 3}), ("close",))
        f.operator("op", "rollback", "repair")
        return f
    run(build, preemption_bound=1)


def rollback_then_repair(w: World) -> Fleet:
    """A shim in cutover puts and ADDs, then shuts down; the operator rolls back and runs
    ``verify --repair`` (refused while the shim is live on cutover)."""
    f = sensor_fleet(w, "cutover")
    f.shim_actor("A", ("put", "k", {"temp": 3}), ("add", "k"), ("close",))
    f.operator("op", "rollback", "repair")
    return f


def test_repair_after_a_rollback_keeps_acknowledged_writes():
    run(rollback_then_repair, preemption_bound=1)
