"""The model checker as the specification of issue 12 (see ``spec.py`` for the invariants).

Every scenario passes on today's code (issue 12's cases 1-6 included; a scenario that finds a
bug would be ``xfail(strict=True)`` with the case number until its fix lands). Bounds are
chosen so the folder stays fast: exhaustive search under a preemption bound, from a fixed
opening where a stall matters (``freeze_at``), then a few seeded random schedules.
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
    each copy is one version-conditioned PutItem (onto nothing or our own earlier copy), so a
    shim write or a delete's tombstone at the new key always stays."""
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
    """A copier and two shims writing one item it copies: a write landing between the copier's
    scan and its copy is kept by the copy's version fence (the copy fails; the target is read
    and judged newer)."""
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
    """Every shim was silent for 46 s (past the 30 s liveness window, and past liveness + the
    longest request, 31 s here, that the census watches a heartbeat stay unchanged before it
    drops the shim; the operator's census looked once before the silence, see ``silence``):
    A refreshes and writes, B writes without refreshing, the operator cuts over (B no longer
    counts in the census). B's request must fail closed (ShimUnavailable), not act on backfill."""
    f = sensor_fleet(w, "backfill")
    f.shim_actor("A", ("refresh",), ("add", "k"))
    f.shim_actor("B", ("add", "k"))
    f.operator("op", "advance")
    return f


def silence(seconds: float = 46.0):
    """The opening: the operator's census looks at the fleet once (its clock starts watching
    every heartbeat: a single look never drops a shim), then nobody refreshes for ``seconds``."""
    def drive(w: World) -> None:
        from reshard.control import fleet as fleet_module
        f = w.fleet
        fleet_module.census(f.store, f.m.id, f.store.load_state(f.m.id).phase_version)
        w.sched.tick(seconds)
    return drive


def test_a_silent_shim_fails_closed():
    r = explore(scenario(silent_shim), preemption_bound=1, drive=silence())
    print(describe_bounds(r))
    r.assert_ok()
    assert r.schedules > 20


def shim_frozen_in_flight(w: World) -> Fleet:
    """B began its request on ``planned`` (the liveness check at the start passed) and froze just
    before the attempt of its write for 46 s (a GC or VM pause): past its liveness window, so the
    census stops counting it and the operator advances to backfill, where C copies. B must fail
    closed at the check before the attempt: acting on ``planned`` it would write the old layout
    only, behind the copy, and the layouts would never converge."""
    f = sensor_fleet(w, "planned")
    f.shim_actor("B", ("add", "k"))
    f.operator("op", "advance", "advance", "advance")
    f.copier("C")
    return f


def census_then_freeze(actor: str, seconds: float = 46.0):
    """The operator's census looks once (see ``silence``); ``actor`` runs to just before the
    per-attempt check of its first guarded write and freezes there for ``seconds``."""
    def drive(w: World) -> None:
        from reshard.control import fleet as fleet_module
        f = w.fleet
        fleet_module.census(f.store, f.m.id, f.store.load_state(f.m.id).phase_version)
        freeze_at(actor, "guard", seconds)(w)
    return drive


def test_a_shim_frozen_before_its_write_attempt_fails_closed():
    r = explore(scenario(shim_frozen_in_flight), preemption_bound=1, drive=census_then_freeze("B"))
    print(describe_bounds(r))
    r.assert_ok()
    assert r.schedules > 5


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
    """Two backfill hosts share the segment; the application puts the item (and shuts down);
    the other host finishes the backfill and the operator cuts over (open gates but the real
    wait for job leases). C1 is frozen before its lease check past its 10 s lease (see
    ``freeze_at``)."""
    f = Fleet(w, phase="backfill")
    f.key("k", **SENSOR_KEY)
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.copier("C1")
    f.shim_actor("A", ("put", "k", {"temp": 99}), ("close",))  # then shuts down: the switch need not wait for it
    # The other host finishes the backfill and the operator cuts over (one actor: the gates
    # would order them anyway); cutover's wait for job leases is the real one.
    # (A real verify inside the schedule, "verify+advance", is 499 schedules / 20 s, and C1 may
    # die at any call another ~2x: too slow for the suite; verify runs over every violated
    # final state anyway, see Fleet.check.)
    f.copier("C2", then=lambda: f.transition("op", "advance"))
    return f


def freeze_at(actor: str, op: str | tuple[str, ...], seconds: float, watchers: tuple[str, ...] = (),
              table: str | None = None):
    """A fixed opening: ``actor`` runs to its first ``op`` call (one of them, if a tuple; on
    ``table`` if given) and freezes there while the clock moves ``seconds`` (a GC pause, a VM
    pause). ``op="guard"``: just before the lease-deadline check of a guarded write (the page is
    scanned; the check is still to come, so it sees the freeze: a freeze *after* the check is a
    request in flight, at most max_request_seconds). ``watchers``: other hosts that first run to
    their first sleep (they looked at the held lease, so they may take it over once the freeze
    has outlasted it)."""
    ops = (op,) if isinstance(op, str) else op

    def at(pending) -> bool:
        if not pending or pending[0] not in ops:
            return False
        kwargs = pending[1]["request"] if pending[0] == "guard" else pending[1]
        return table is None or kwargs.get("TableName") == table

    def drive(w: World) -> None:
        a = w.sched.actors[actor]
        while a.pending and not at(a.pending):
            w.apply(actor)
        assert at(a.pending), f"{actor} never reached a {op} call"
        for name in watchers:
            b = w.sched.actors[name]
            while b.pending and b.pending[0] != "sleep":
                w.apply(name)
            assert b.pending, f"{name} finished before it waited for the lease"
        w.sched.tick(seconds)
    return drive


def test_a_copier_stalled_past_its_lease_before_its_write():
    """Case 2 (the fenced copy): C1 scanned the page and froze before its lease check, past its
    lease; C2 takes the segment over, finishes it, verifies and cuts over through the real gates.
    C1's check stops it (its deadline passed): no stale copy ever lands, and had one been in
    flight, its version condition keeps the newer write."""
    r = explore(scenario(stalled_copier_then_cutover), preemption_bound=1,
                drive=freeze_at("C1", "guard", 11, watchers=("C2",)))
    print(describe_bounds(r))
    r.assert_ok()
    assert r.schedules > 20


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


def test_random_suffix_duplicates():
    """Case 3 (fenced copy): the older duplicate's copy goes onto nothing or its own earlier copy
    only; the newer copy already at the new key (the unmoved shard) stays."""
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
    """C1 frozen before its lease check past its lease (see ``freeze_at``); the operator aborts
    and runs the cleanup pass (which waits for the job leases to go quiet) and so retires the
    migration; C1 may wake at any point."""
    f = Fleet(w, phase="backfill")
    f.key("k", **SENSOR_KEY)
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.copier("C1")
    f.operator("op", "abort", "cleanup")
    return f


def test_abort_racing_a_stalled_copier():
    """Case 6: C1 froze before its lease check past its lease; the cleanup pass waits until its
    lease stayed unchanged for lease + longest request (on its own clock), and C1's check stops
    it when it wakes: no copy after the retire."""
    r = explore(scenario(abort_racing_a_stalled_copier), preemption_bound=1,
                drive=freeze_at("C1", "guard", 11))
    print(describe_bounds(r))
    r.assert_ok()
    assert r.schedules > 20


def test_abort_with_a_live_copier():
    """Without the stall: the cleanup pass refuses while the copier's lease is live, and the
    copier's phase guard stops it at its next page; nothing is left behind the retire."""
    r = run(abort_racing_a_stalled_copier, preemption_bound=1)
    assert r.schedules > 20


def test_random_suffix_duplicates_delete():
    """Case 3 (fenced copy): a delete's tombstone at the new key is newer than the live older
    duplicate: its copy is fenced off."""
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


# ----------------------------------------------------------------------------- the job-lease gates

def copier_across_cutover_and_cleanup(w: World, lease_wait: float | None = 0.0) -> Fleet:
    """A copier in the middle of its page while the application deletes the item and shuts down
    (the opening, :func:`mid_page_delete`), then the operator cuts over, enters cleanup and runs
    the cleanup pass (which retires the delete's tombstones). Cutover waits for the copier's job
    lease (one look here: refused while it is held), so its copy never lands behind the cleanup
    pass onto a key whose tombstone is gone. ``lease_wait``: the operator's wait for the lease
    (``advance --wait``; 0: one look, refused while it is held)."""
    f = Fleet(w, phase="backfill", lease_wait=lease_wait)
    f.key("k", **SENSOR_KEY)
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.copier("C")
    f.shim_actor("A", ("delete", "k"), ("close",))
    f.operator("op", "advance", "advance", "cleanup")
    return f


def mid_page_delete():
    """The opening: C claims and scans the page (the live item) and stops before its copy's lease
    check; A deletes the item (tombstones in both layouts) and shuts down. Then C and the
    operator are explored."""
    def drive(w: World) -> None:
        c, a = w.sched.actors["C"], w.sched.actors["A"]
        while c.pending and c.pending[0] != "guard":
            w.apply("C")
        assert c.pending, "C never reached its copy"
        while a.pending:
            w.apply("A")
    return drive


@pytest.mark.parametrize("lease_wait", [0.0, None], ids=["one_look", "waits"])
def test_a_copier_across_cutover_and_cleanup(lease_wait):
    build = lambda w: copier_across_cutover_and_cleanup(w, lease_wait)  # noqa: E731
    r = explore(scenario(build), preemption_bound=1, drive=mid_page_delete())
    print(describe_bounds(r))
    r.assert_ok()
    assert r.schedules > 20


def abort_cleanup_racing_a_put(w: World) -> Fleet:
    """An aborted migration's cleanup pass retires a delete's tombstone while the application
    (on aborted) writes the item again: the tombstone's delete is conditioned on the version the
    pass scanned, so the new write stays."""
    f = sensor_fleet(w, "aborted")
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.shim_actor("A", ("delete", "k"), ("put", "k", {"temp": 2}), ("close",))
    f.operator("op", "cleanup")
    return f


def test_abort_cleanup_racing_a_put():
    # Two preemptions: the delete, then the pass's scan, then the put, then the pass's delete.
    r = run(abort_cleanup_racing_a_put, preemption_bound=2)
    assert r.schedules > 20


def abort_racing_a_stalled_repair(w: World) -> Fleet:
    """``verify --repair`` (R) finds the item missing from the new layout and is about to write
    it when it freezes past its lease (see ``freeze_at``); the operator aborts and runs the
    abort's cleanup pass, which waits for the repair's job lease to go quiet, removes the
    migration's new copies and retires it. The repair's write must not land after that."""
    f = sensor_fleet(w, "backfill")
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.operator("R", "repair")
    f.operator("op", "abort", "cleanup")
    return f


def test_abort_racing_a_stalled_repair():
    """The repair's data writes are guarded by its lease deadline like the backfill's copies
    (without that guard, as at 40c8ae3 before aa5a378, a copy lands after the retire)."""
    r = explore(scenario(abort_racing_a_stalled_repair), preemption_bound=1,
                drive=freeze_at("R", ("guard", "put_item"), 11, table="data"))
    print(describe_bounds(r))
    r.assert_ok()
    assert r.schedules > 10


def tombstone_after_the_abort_pass(w: World) -> Fleet:
    """The abort's second sweep: A (a shim on aborted, acknowledged) deletes, then refreshes
    (acknowledging the retire once it happened); the operator runs `reshard cleanup`: the pass
    retires the migration, then waits for the fleet's acknowledgement and sweeps again. A
    delete landing after the first pass went by leaves a tombstone only the sweep removes."""
    f = Fleet(w, phase="aborted")
    f.key("k", **SENSOR_KEY)
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.shim_actor("A", ("delete", "k"), ("refresh",))
    f.operator("op", "cleanup+sweep")
    return f


def test_the_abort_cleanup_sweeps_tombstones_written_after_its_pass():
    swept = []

    def build(w: World) -> Fleet:
        f = tombstone_after_the_abort_pass(w)
        check = f.check

        def counted(w: World) -> None:
            swept.append(f.swept_at is not None and f.history.ops[0].resp is not None)
            check(w)
        f.check = counted
        return f
    r = run(build, preemption_bound=1)
    # Not vacuous: in many schedules A's delete was acknowledged and the cleanup returned.
    assert r.schedules > 10 and sum(swept) > 5, (r.schedules, sum(swept))
