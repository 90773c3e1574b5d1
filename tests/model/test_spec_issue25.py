"""Issue 25 ("No late write lands") in the model checker: the contract's fault model (PRODUCT.md
5b) -- a process frozen anywhere for any time, a request landing at any later time or twice, an
answer lost and its request retried -- through every phase, ``complete``, ``--strip-bookkeeping``
and the next migration of the same table.

One scenario (at least) per case of the issue, on the real product (shims, transitions, jobs)
over the in-memory DynamoDB that enforces the signature window on its own clock. Each is
``xfail(strict=True)`` with its case number until its fix is on main; the invariants are
``spec.py``'s.
"""

from __future__ import annotations

import pytest

from tests.model.explore import World, describe_bounds, explore, writes_to
from tests.model.spec import Fleet, scenario
from tests.model.test_spec_issue12 import SENSOR_KEY, coarse_switch_polls  # noqa: F401  (fixture)

DATA = writes_to("data")
#: The request horizon H of every migration here (``start --request-horizon``; the server
#: enforces it): transitions wait H + 2 s of server time, a request lands within H of its fact.
H = 5.0


def fleet(w: World, phase: str, **kwargs) -> Fleet:
    """A fleet whose migrations run with a server deadline (horizon H) and the real catch-up
    rules (only a passing verify clears ``newer_may_be``)."""
    f = Fleet(w, phase=phase, horizon=H, **kwargs)
    f.open_catch_up = False
    f.lost_mirrors = True
    return f


def sensor_fleet(w: World, phase: str) -> Fleet:
    f = fleet(w, phase)
    f.key("k", **SENSOR_KEY)
    return f


def run(build, **bounds):
    result = explore(scenario(build), **bounds)
    print(describe_bounds(result))
    result.assert_ok()
    return result


def case(n: int, what: str):
    """Marks a scenario that finds issue 25's case ``n`` on code without its fix."""
    return pytest.mark.xfail(strict=True, reason=f"issue 25 case {n}: {what}")


# ----------------------------------------------------------------------------- case 4: a lost answer

def lost_answer(phase: str, *steps: tuple, seed: dict | None = None):
    """Shim A's requests in ``phase``; the network may lose the answer of one of its data-table
    writes (applied; A times out and ``Dynamo.call`` retries it)."""
    def build(w: World) -> Fleet:
        f = sensor_fleet(w, phase)
        if seed is not None:
            f.seed("k", seed)
            f.expect_initial("k", seed)
        f.shim_actor("A", *steps, ("get", "k"))
        w.may_lose("A", where=DATA)
        return f
    return build


@case(4, "a retry fails the version condition against its own landed attempt")
def test_a_lost_answer_of_a_create_if_absent_put_in_cutover():
    run(lost_answer("cutover", ("cas", "k", None, 1)))


@case(4, "a retried ADD is applied twice")
@pytest.mark.parametrize("phase", ["cutover", "complete"])
def test_a_lost_answer_of_an_add(phase):
    run(lost_answer(phase, ("add", "k")))


# ----------------------------------------------------------------------------- case 1: a frozen shim's mirror

def frozen_before_mirror(actor: str, then: tuple[str, ...] = (), seconds: float = 46.0):
    """The opening: ``actor`` (a shim) runs its write until its authoritative copy landed and it
    is about to send the mirror (a write carrying the new-copy marker, or the old layout's key
    after it), and freezes there; the actors ``then`` run to their end (a reader sees the write);
    the operator's census looks once (see ``test_spec_issue12.silence``) and ``seconds`` pass: the
    frozen shim is past its liveness window, so the census will drop it."""
    def drive(w: World) -> None:
        from reshard.control import fleet as fleet_module
        f = w.fleet
        a = w.sched.actors[actor]
        writes = 0
        while a.pending:
            op, kwargs = a.pending
            if op in ("put_item", "update_item", "delete_item") and kwargs.get("TableName") == f.table:
                writes += 1
                if writes == 2:
                    break
            w.apply(actor)
        assert writes == 2, f"{actor} never reached its mirror"
        for name in then:
            while w.sched.actors[name].pending:
                w.apply(name)
        fleet_module.census(f.store, f.m.id, f.store.load_state(f.m.id).phase_version)
        w.sched.tick(seconds)
    return drive


def frozen_mirror_across_cleanup(w: World) -> Fleet:
    """Case 1: in backfill, A's put lands on the old layout (authoritative) and A freezes before its
    mirror; C reads the put. The fleet goes through the switch to cutover (a verify run in
    between) and cleanup, where B (started then) deletes the item: a plain delete. A's mirror
    may land at any point after that."""
    f = sensor_fleet(w, "backfill")
    f.shim_actor("A", ("put", "k", {"by": "A"}))
    f.shim_actor("C", ("get", "k"), ("close",))
    b = f.shim("B", late=True)
    f.script("op", f.operator_body("op", ("advance", "verify", "advance")),
             f.shim_body("B", b, (("delete", "k"), ("get", "k")), late=True))
    return f


@case(1, "a frozen shim's mirror lands on the key cleanup's plain delete emptied")
def test_a_frozen_mirror_across_cutover_cleanup_and_a_delete(coarse_switch_polls):
    r = explore(scenario(frozen_mirror_across_cleanup), preemption_bound=1,
                drive=frozen_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()


def frozen_mirror_across_strip(w: World) -> Fleet:
    """Case 1's variant: the same frozen mirror while the fleet goes on to complete, B (started
    then) updates the item, and ``--strip-bookkeeping`` (S) removes its ``_rs_v``: the mirror's
    version fence then has nothing to compare against."""
    f = sensor_fleet(w, "backfill")
    f.shim_actor("A", ("put", "k", {"by": "A"}))
    f.shim_actor("C", ("get", "k"), ("close",))
    b = f.shim("B", late=True)
    f.script("op", f.operator_body("op", ("advance", "verify", "advance", "advance")),
             f.shim_body("B", b, (("update", "k", {"temp": 5}),), late=True),
             f.operator_body("op", ("strip",)))
    return f


@case(1, "a frozen shim's mirror passes the unversioned branch of its fence after strip")
def test_a_frozen_mirror_across_complete_strip_and_an_update(coarse_switch_polls):
    r = explore(scenario(frozen_mirror_across_strip), preemption_bound=1,
                drive=frozen_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()


# ----------------------------------------------------------------------------- case 3: a half-written write, then a switch

def dead_before_mirror(actor: str, then: tuple[str, ...] = ()):
    """The opening: ``actor`` (a shim) lands its authoritative copy and dies before its mirror;
    the readers ``then`` run to their end (they see the write); the census looks once and 46 s
    pass (the dead shim is silent past its liveness window: the census will drop it)."""
    def drive(w: World) -> None:
        frozen_before_mirror(actor, then)(w)
        w.sched.kill(actor)
    return drive


def half_written_then(start: str, actions: tuple[str, ...], write: tuple = ("put", "k", {"by": "A"}),
                      after: tuple[tuple, ...] = (("get", "k"),)):
    """Case 3: in ``start``, A's write lands on the authoritative layout only (A dies before its
    mirror) and C reads it; then the operator's ``actions`` (a shim B, started once they are done,
    does ``after``)."""
    def build(w: World) -> Fleet:
        f = sensor_fleet(w, start)
        f.shim_actor("A", write)
        f.shim_actor("C", ("get", "k"), ("close",))
        b = f.shim("B", late=True)
        f.script("op", f.operator_body("op", actions), f.shim_body("B", b, after, late=True))
        return f
    return build


@case(3, "rollback serves the stale old copy; the next update is mirrored over the new one")
def test_rollback_after_a_half_written_cutover_write(coarse_switch_polls):
    build = half_written_then("cutover", ("rollback",), after=(("get", "k"), ("add", "k"), ("get", "k")))
    r = explore(scenario(build), preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()


@case(3, "abort loses a write that landed in the new layout only")
def test_abort_after_a_half_written_cutover_write(coarse_switch_polls):
    # The runbook: after a rollback from cutover, `verify --repair` copies newer new copies back,
    # a verify then passes (lifting the catch-up flag), then abort -- which is refused before.
    build = half_written_then("cutover", ("rollback", "abort", "repair", "verify", "abort"))
    r = explore(scenario(build), preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()


@case(3, "cutover serves the new layout, which misses a backfill write whose mirror never landed")
def test_cutover_after_a_half_written_backfill_write(coarse_switch_polls):
    # B reads in cutover, and then in cleanup, which the catch-up verify must open first
    # (cutover -> cleanup is refused before it).
    build = half_written_then("backfill", ("advance",), after=(("get", "k"),))
    r = explore(scenario(build), preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()


@case(3, "cleanup serves the new layout, which misses a backfill write whose mirror never landed")
def test_cleanup_after_a_half_written_backfill_write(coarse_switch_polls):
    build = half_written_then("backfill", ("advance", "advance", "repair", "verify", "advance"),
                              after=(("get", "k"),))
    r = explore(scenario(build), preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()


# ----------------------------------------------------------------------------- case 2: a copy stalled after its lease check

def stalled_copy(w: World) -> Fleet:
    """A backfill fleet whose data writes have no in-flight bound (the fault model: a request
    past its guard may land at any later time), one seeded item, copier C1."""
    f = fleet(w, "backfill")
    w.max_request_seconds = None
    f.key("k", **SENSOR_KEY)
    f.seed("k", {"temp": 1})
    f.expect_initial("k", {"temp": 1})
    f.copier("C1")
    return f


def stalled_copy_across_cleanup(w: World) -> Fleet:
    """Case 2: C1 passed its lease check and stalls with its copy on the wire (the opening);
    C2 takes the segment over and finishes, the operator cuts over (the real wait for job
    leases: nothing is held any more), verifies and enters cleanup, and B (started then) deletes
    the item -- a plain delete. C1's copy lands at any point."""
    f = stalled_copy(w)
    b = f.shim("B", late=True)
    f.copier("C2", then=lambda: (f.operator_body("op", ("advance", "verify", "advance"))(),
                                 f.shim_body("B", b, (("delete", "k"), ("get", "k")), late=True)()))
    return f


def copy_on_the_wire(actor: str, seconds: float = 11.0, watchers: tuple[str, ...] = ()):
    """The opening: ``actor`` (a copier) scanned its page and passed its lease check; its copy is
    sent but has not arrived (parked at the PutItem) while ``seconds`` pass (past its lease)."""
    from tests.model.test_spec_issue12 import freeze_at
    return freeze_at(actor, "put_item", seconds, watchers=watchers, table="data")


@case(2, "a copy stalled after its lease check lands on the key cleanup's plain delete emptied")
def test_a_copy_stalled_after_its_lease_check_across_cutover_cleanup_and_a_delete():
    r = explore(scenario(stalled_copy_across_cleanup), preemption_bound=1,
                drive=copy_on_the_wire("C1", watchers=("C2",)))
    print(describe_bounds(r))
    r.assert_ok()


def retry_migration(f: Fleet):
    """The retry of an aborted migration of the same table: the same layouts, another id."""
    from tests.model.spec import migration_variant
    return f.add_migration("m2", migration_variant(f.kind, f.table, f.m.id + "-retry"))


def stalled_copy_across_abort_and_retry(w: World) -> Fleet:
    """Case 2 in an aborted migration: C1's copy is on the wire (the opening); the operator aborts
    and runs the abort's cleanup (the pass waits for C1's lease, removes the new copies, retires);
    the application (steady again) deletes the item; the operator starts a retry of the migration
    and brings it to dual_read, where T reads the item. C1's copy lands at any point."""
    f = stalled_copy(w)
    retry_migration(f)
    s = f.shim("S", late=True)
    t = f.shim("T", migration="m2", late=True)
    f.script("op", f.operator_body("op", ("abort", "cleanup")),
             f.shim_body("S", s, (("delete", "k"), ("close",)), late=True),
             f.operator_body("op", ("start@m2", "advance@m2", "advance@m2")),
             f.shim_body("T", t, (("get", "k"),), late=True))
    return f


@case(2, "a copy stalled after its lease check lands after the abort's cleanup: the retry reads it back")
def test_a_copy_stalled_after_its_lease_check_across_abort_cleanup_and_a_retry():
    r = explore(scenario(stalled_copy_across_abort_and_retry), preemption_bound=1, drive=copy_on_the_wire("C1"))
    print(describe_bounds(r))
    r.assert_ok()


# ----------------------------------------------------------------------------- case 5: a shim nobody counts

def mistyped_control_table(w: World) -> Fleet:
    """Case 5: in cutover, shim M was deployed with a mistyped control table: it never sees the
    migration, so it would serve the steady state (old layout, plain writes); B (a shim of the
    fleet) reads and deletes. M must refuse rather than write where nobody reads."""
    f = sensor_fleet(w, "cutover")
    f.shim_actor("M", ("put", "k", {"by": "M"}), ("delete", "k"), ("put", "k", {"by": "M2"}),
                 control_table="ctl-typo")
    f.shim_actor("B", ("get", "k"))
    return f


@case(5, "a shim with a mistyped control table writes as the steady state in cutover")
def test_a_shim_with_a_mistyped_control_table():
    run(mistyped_control_table, preemption_bound=1)


def on_the_previous_file(w: World) -> Fleet:
    """Case 5's variant: migration m1 (16 -> 32) completed, then a second one m2 (32 -> 64)
    completed too; shim P still runs m1's file (complete: it writes m1's new layout, which is
    m2's *old* one, unfenced); R runs m2's file."""
    from tests.model.spec import migration_variant
    f = sensor_fleet(w, "complete")
    f.add_migration("m2", migration_variant(f.kind, f.table, "sensor-events-32-to-64", (32, 64)), "complete")
    f.shim_actor("P", ("put", "k", {"by": "P"}))
    f.shim_actor("R", ("get", "k"), migration="m2")
    return f


@case(5, "a shim on the previous (completed) migration's file writes a layout nobody reads")
def test_a_shim_still_on_the_previous_migrations_file():
    run(on_the_previous_file, preemption_bound=1)


# ----------------------------------------------------------------------------- case 6: leftovers

def skewed_late_mirror_across_abort_and_retry(w: World) -> Fleet:
    """Case 6 (a retire under clock skew): the shims' wall clocks disagree with the operator's (A
    runs 120 s ahead, the others 30 s behind: versions and heartbeat stamps). In backfill A's put
    lands on the old layout and A freezes before its mirror (the opening; C reads the put). The
    operator aborts and runs the abort's cleanup (which retires the migration); the application,
    steady again, writes the item (S, unversioned); the operator starts a retry of the migration
    (same layouts) and brings it to dual_read, where T reads. A's mirror -- a copy marked with the
    retired migration, stamped 120 s ahead -- lands at any point."""
    f = sensor_fleet(w, "backfill")
    f.shim_actor("A", ("put", "k", {"by": "A"}), skew=120.0)
    f.shim_actor("C", ("get", "k"), ("close",), skew=-30.0)
    retry_migration(f)
    s = f.shim("S", late=True, skew=-30.0)
    t = f.shim("T", migration="m2", late=True, skew=-30.0)
    f.script("op", f.operator_body("op", ("abort", "cleanup")),
             f.shim_body("S", s, (("put", "k", {"by": "S"}), ("close",)), late=True),
             f.operator_body("op", ("start@m2", "advance@m2", "advance@m2")),
             f.shim_body("T", t, (("get", "k"),), late=True))
    return f


@case(6, "a retired migration's copy, stamped by a clock running ahead, outlives the retire")
def test_a_retire_under_clock_skew(coarse_switch_polls):
    r = explore(scenario(skewed_late_mirror_across_abort_and_retry), preemption_bound=1,
                drive=frozen_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()


def reverse_migration_in_the_retain_window(w: World) -> Fleet:
    """Case 6 (a second migration inside the first one's ``retain_hours``): m1 (16 -> 32) went
    through cleanup with TTL (its old copy of the item waits for TTL deletion, ``retain_hours``)
    to complete; D deletes the item (complete: a plain delete of the new copy); the operator
    starts the reverse migration m2 (32 -> 16: its new keys are m1's old keys) and brings it to
    dual_read, where R reads the item: the TTL-pending leftover sits at its new key."""
    from tests.model.spec import migration_variant
    f = sensor_fleet(w, "backfill")
    x = f.shim("X")
    x.put_item(Item={**f.keys["k"], "temp": 1})  # set-up: both layouts hold the item
    x.close()
    f.setup_to("m1", "cleanup")
    f.cleanup_pass("setup", ttl=True)
    f.setup_to("m1", "complete")
    f.expect_initial("k", {"temp": 1})
    f.add_migration("m2", migration_variant(f.kind, f.table, "sensor-events-32-to-16", (32, 16)))
    d = f.shim("D", late=True)
    r = f.shim("R", migration="m2", late=True)
    f.script("op", f.shim_body("D", d, (("delete", "k"), ("close",)), late=True),
             f.operator_body("op", ("start@m2", "advance@m2", "advance@m2")),
             f.shim_body("R", r, (("get", "k"),), late=True))
    return f


@case(6, "the reverse migration reads the first one's TTL-pending leftover at its new key")
def test_a_second_migration_inside_the_first_ones_retain_window():
    run(reverse_migration_in_the_retain_window, preemption_bound=1)
