"""Issue 25 ("No late write lands") in the model checker: the contract's fault model (PRODUCT.md
5b) -- a process frozen anywhere for any time, a request landing at any later time or twice, an
answer lost and its request retried -- through every phase, ``complete``, ``--strip-bookkeeping``
and the next migration of the same table.

One scenario (at least) per case of the issue, on the real product (shims, transitions, jobs)
over the in-memory DynamoDB that enforces the signature window on its own clock. Every one
passes on main since issue 25's fixes (each was ``xfail(strict=True)`` with its case number, and
failed, before them; ``test_spec_mutations.py`` disarms each fence again). The invariants are
``spec.py``'s; each scenario also checks that it *reached* what it is about (:func:`explored`):
the operator's whole plan went through in some schedule, and the late request arrived after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.model.explore import WRITES, Result, World, describe_bounds, explore, writes_to
from tests.model.spec import Fleet
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


@dataclass
class Seen:
    """What the schedules of one exploration reached (see :func:`explored`)."""

    #: Per schedule: every operator action's outcomes, in order ("ok", "refused"; a verify's
    #: "passed"/"failed", a repair's "clean"/"found" before its "ok").
    plans: list[list[tuple[str, str]]] = field(default_factory=list)
    #: Per schedule: the results of ``late``'s data-table calls made after the operator's last
    #: call (its request arriving late), and of the network's deliveries.
    late: list[list[str]] = field(default_factory=list)
    #: Per schedule: how many answers the network lost, and the actors whose data-table writes
    #: were applied.
    lost: list[int] = field(default_factory=list)
    #: Per schedule: what the network's deliveries after the operator's last call answered.
    late_calls: list[list[str]] = field(default_factory=list)
    writers: list[set[str]] = field(default_factory=list)

    def late_refused(self) -> int:
        """How many schedules had the late request arrive after the plan and the server refuse it
        as signed too long ago."""
        return sum(1 for calls in self.late if "InvalidSignatureException" in calls)

    def summary(self) -> str:
        from collections import Counter
        return (f"whole plan in {self.whole_plan()} of {len(self.plans)}; plans: {Counter(map(tuple, self.plans))}; "
                f"late: {Counter(map(tuple, self.late))}; answers lost: {Counter(self.lost)}")

    def whole_plan(self) -> int:
        """How many schedules ran the operator's plan to its end: its last action went through
        (a refusal before it is the plan's business: a gate that holds until a verify passed)."""
        return sum(1 for p in self.plans if p and p[-1][1] == "ok")


def explored(build, late: str | None = None, operator: str = "op", plan: bool = False, lost: bool = False,
             never_write: tuple[str, ...] = (), **bounds) -> tuple[Result, Seen]:
    """``explore`` of ``build`` (every invariant holds: ``assert_ok``), recording per schedule the
    operator's outcomes and, for the actor ``late``, what its data-table calls answered once the
    actor ``operator`` (whose script runs the operator's plan) had made its last call. A scenario
    that passes only because the operator was always refused, or the late request never came
    late, proves nothing: ``plan`` asserts the plan's last action went through in some schedule,
    ``late`` that its request arrived after the plan and was refused as too late, ``lost`` that
    an answer was lost, ``never_write`` that those actors never wrote the data table."""
    seen = Seen()

    def factory(w: World):
        f = build(w)

        def check(w: World) -> None:
            seen.plans.append([(a, "refused" if r.startswith("refused") else r.split(" ")[0].rstrip(":"))
                               for a, r in f.outcomes.get("op", [])])
            seen.lost.append(sum(1 for s in w.sched.trace if "the answer is lost" in s.result))
            seen.writers.append({s.actor for s in w.sched.trace if s.op in WRITES and f" {f.table} " in f" {s.detail} "
                                 and s.result.startswith("ok")})
            trace = w.sched.trace
            last_op = max((s.index for s in trace if s.actor == operator), default=0)
            seen.late_calls.append([s.result.split(" ")[0] for s in trace if s.index > last_op and s.op == "deliver"])
            if late is not None:
                trace = w.sched.trace
                last_op = max((s.index for s in trace if s.actor == operator), default=0)
                seen.late.append([s.result.split(" ")[0] for s in trace if s.index > last_op and (
                    (s.actor == late and f" {f.table} " in f" {s.detail} ") or
                    (s.op == "deliver" and f"({late}'s" in s.detail))])
            f.check(w)
        return check
    result = explore(factory, **bounds)
    print(describe_bounds(result))
    result.assert_ok()
    # What the scenario is about happened (in some schedule), or its passing proves nothing.
    assert not plan or seen.whole_plan(), f"the operator's plan never went through: {seen.summary()}"
    assert late is None or seen.late_refused(), f"{late}'s late request never arrived after the plan: {seen.summary()}"
    assert not lost or any(seen.lost), f"no answer was lost: {seen.summary()}"
    for name in never_write:
        assert not any(name in w for w in seen.writers), f"{name} wrote the data table"
    return result, seen


def run(build, **bounds) -> Result:
    return explored(build, **bounds)[0]


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


def test_a_lost_answer_of_a_create_if_absent_put_in_cutover():
    run(lost_answer("cutover", ("cas", "k", None, 1)), lost=True)


@pytest.mark.parametrize("phase", ["cutover", "complete"])
def test_a_lost_answer_of_an_add(phase):
    run(lost_answer(phase, ("add", "k")), lost=True)


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


def frozen_mirror_across_cleanup(w: World, job: bool = False) -> Fleet:
    """Case 1: in backfill, A's put lands on the old layout (authoritative) and A freezes before its
    mirror; C reads the put. The fleet goes through the switch to cutover (a verify run in
    between) and cleanup, where B (started then) deletes the item (a tombstone since issue 25's
    last cases; a plain delete before). A's mirror may land at any point after that."""
    f = sensor_fleet(w, "backfill")
    f.shim_actor("A", ("put", "k", {"by": "A"}))
    f.shim_actor("C", ("get", "k"), ("close",))
    b = f.shim("B", late=True)
    f.script("op", f.operator_body("op", ("advance", "repair", "verify", "advance")),
             f.shim_body("B", b, (("delete", "k"), ("get", "k")), late=True),
             f.operator_body("op", ("cleanup",) if job else ()))
    return f


def frozen_mirror_across_the_cleanup_job(w: World) -> Fleet:
    """:func:`frozen_mirror_across_cleanup`, then the operator's cleanup job (it removes B's
    tombstone H + 2 s after its scan). Explored from the opening and the operator's whole plan
    (``test_spec_mutations_issue25``): the whole space takes minutes."""
    return frozen_mirror_across_cleanup(w, job=True)


def test_a_frozen_mirror_across_cutover_cleanup_and_a_delete(coarse_switch_polls):
    explored(frozen_mirror_across_cleanup, late="A", plan=True, preemption_bound=1,
                drive=frozen_before_mirror("A", then=("C",)))


def frozen_mirror_across_strip(w: World) -> Fleet:
    """Case 1's variant: the same frozen mirror while the fleet goes on to complete, B (started
    then) updates the item, and ``--strip-bookkeeping`` (S) removes its ``_rs_v``: the mirror's
    version fence then has nothing to compare against."""
    f = sensor_fleet(w, "backfill")
    f.shim_actor("A", ("put", "k", {"by": "A"}))
    f.shim_actor("C", ("get", "k"), ("close",))
    b = f.shim("B", late=True)
    f.script("op", f.operator_body("op", ("advance", "repair", "verify", "advance", "advance")),
             f.shim_body("B", b, (("update", "k", {"temp": 5}),), late=True),
             f.operator_body("op", ("strip",)))
    return f


def test_a_frozen_mirror_across_complete_strip_and_an_update(coarse_switch_polls):
    explored(frozen_mirror_across_strip, late="A", plan=True, preemption_bound=1,
                drive=frozen_before_mirror("A", then=("C",)))


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


def test_rollback_after_a_half_written_cutover_write(coarse_switch_polls):
    build = half_written_then("cutover", ("rollback",), after=(("get", "k"), ("add", "k"), ("get", "k")))
    explored(build, plan=True, preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))


def test_abort_after_a_half_written_cutover_write(coarse_switch_polls):
    # The runbook: after a rollback from cutover, `verify --repair` copies newer new copies back,
    # a verify then passes (lifting the catch-up flag), then abort -- which is refused before.
    build = half_written_then("cutover", ("rollback", "abort", "repair", "verify", "abort"))
    explored(build, plan=True, preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))


def test_cutover_after_a_half_written_backfill_write(coarse_switch_polls):
    # B reads in cutover, and then in cleanup, which the catch-up verify must open first
    # (cutover -> cleanup is refused before it).
    build = half_written_then("backfill", ("advance",), after=(("get", "k"),))
    explored(build, plan=True, preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))


def test_cleanup_after_a_half_written_backfill_write(coarse_switch_polls):
    build = half_written_then("backfill", ("advance", "advance", "repair", "verify", "advance"),
                              after=(("get", "k"),))
    explored(build, plan=True, preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))


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
    the item -- a tombstone since issue 25's last cases (a plain delete before). C1's copy lands
    at any point."""
    f = stalled_copy(w)
    b = f.shim("B", late=True)
    f.copier("C2", then=lambda: (f.operator_body("op", ("advance", "verify", "advance"))(),
                                 f.shim_body("B", b, (("delete", "k"), ("get", "k")), late=True)()))
    return f


def stalled_copy_across_the_cleanup_job(w: World) -> Fleet:
    """:func:`stalled_copy_across_cleanup`, then C2 runs the cleanup job (it removes B's tombstone
    H + 2 s after its scan). Explored from the opening and C2's whole plan."""
    f = stalled_copy(w)
    b = f.shim("B", late=True)
    f.copier("C2", then=lambda: (f.operator_body("op", ("advance", "verify", "advance"))(),
                                 f.shim_body("B", b, (("delete", "k"), ("get", "k")), late=True)(),
                                 f.operator_body("op", ("cleanup",))()))
    return f


def copy_on_the_wire(actor: str, seconds: float = 11.0, watchers: tuple[str, ...] = ()):
    """The opening: ``actor`` (a copier) scanned its page and passed its lease check; its copy is
    sent but has not arrived (parked at the PutItem) while ``seconds`` pass (past its lease)."""
    from tests.model.test_spec_issue12 import freeze_at
    return freeze_at(actor, "put_item", seconds, watchers=watchers, table="data")


def test_a_copy_stalled_after_its_lease_check_across_cutover_cleanup_and_a_delete():
    explored(stalled_copy_across_cleanup, late="C1", plan=True, operator="C2", preemption_bound=1,
                drive=copy_on_the_wire("C1", watchers=("C2",)))


def retry_migration(f: Fleet, horizon: float | None = None):
    """The retry of an aborted migration of the same table: the same layouts, another id
    (``horizon``: its own request horizon)."""
    from tests.model.spec import migration_variant
    return f.add_migration("m2", migration_variant(f.kind, f.table, f.m.id + "-retry"), horizon=horizon)


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


def test_a_copy_stalled_after_its_lease_check_across_abort_cleanup_and_a_retry():
    explored(stalled_copy_across_abort_and_retry, late="C1", plan=True, preemption_bound=1, drive=copy_on_the_wire("C1"))


# ----------------------------------------------------------------------------- case 5: a shim nobody counts

def mistyped_control_table(w: World) -> Fleet:
    """Case 5: in cutover, shim M was deployed with a mistyped control table: it never sees the
    migration, so it would serve the steady state (old layout, plain writes); B (a shim of the
    fleet) reads and deletes. M must refuse rather than write where nobody reads. The mistyped
    name is a control table that exists (another deployment's, say): a missing one fails
    the refresh anyway."""
    from reshard.control.store import ControlStore
    from tests.model.spec import lift_catch_up
    f = sensor_fleet(w, "cutover")
    lift_catch_up(f.store, f.m.id)  # the catch-up verify passed: the fleet reads the new layout alone
    ControlStore(w.dynamo, "ctl-typo", clock=w.clock).ensure_table()
    f.shim_actor("M", ("put", "k", {"by": "M"}), ("delete", "k"), ("put", "k", {"by": "M2"}),
                 control_table="ctl-typo")
    f.shim_actor("B", ("get", "k"))
    return f


def test_a_shim_with_a_mistyped_control_table():
    run(mistyped_control_table, preemption_bound=1, never_write=("M",))


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


def test_a_shim_still_on_the_previous_migrations_file():
    run(on_the_previous_file, preemption_bound=1, never_write=("P",))


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


def test_a_retire_under_clock_skew(coarse_switch_polls):
    explored(skewed_late_mirror_across_abort_and_retry, late="A", plan=True, preemption_bound=1,
                drive=frozen_before_mirror("A", then=("C",)))


def reverse_migration_in_the_retain_window(w: World) -> Fleet:
    """Case 6 (a second migration inside the first one's ``retain_hours``): m1 (16 -> 32) went
    through cleanup with TTL (its old copy of the item waits for TTL deletion, ``retain_hours``)
    to complete; D deletes the item (complete: a tombstone on the new copy, which
    ``--strip-bookkeeping`` then deletes after its hold); the operator starts the reverse migration m2 (32 -> 16: its new keys are m1's old keys) and brings it to
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
             f.operator_body("op", ("strip", "start@m2", "advance@m2", "advance@m2")),
             f.shim_body("R", r, (("get", "k"),), late=True))
    return f


def test_a_second_migration_inside_the_first_ones_retain_window():
    run(reverse_migration_in_the_retain_window, preemption_bound=1, plan=True)


# ----------------------------------------------------------------------------- late and duplicate delivery

def held_then_deleted(phase: str):
    """The network holds A's put (A times out; ``Dynamo.call`` retries it, and the retry lands:
    acknowledged); B deletes the item and reads it; the held first attempt arrives at any later
    point (within its horizon, or after it), or never."""
    def build(w: World) -> Fleet:
        f = sensor_fleet(w, phase)
        f.shim_actor("A", ("put", "k", {"by": "A"}))
        f.shim_actor("B", ("delete", "k"), ("get", "k"))
        w.may_hold("A", where=DATA)
        return f
    return build


def test_a_held_first_attempt_after_a_delete_in_cutover():
    """Fenced phases delete with a tombstone: the held attempt's version is not newer, it fails."""
    _, seen = explored(held_then_deleted("cutover"), operator="B", preemption_bound=1)
    late = [calls for calls in seen.late_calls if "ConditionalCheckFailed" in calls]
    assert late, f"the held attempt never arrived after B's delete: {seen.summary()}"


@pytest.mark.parametrize("phase", ["cleanup", "complete"])
def test_a_held_first_attempt_after_a_plain_delete(phase):
    run(held_then_deleted(phase), preemption_bound=1)


def steady_write_held_across_start(w: World) -> Fleet:
    """Migration m1 (16 -> 32) is complete; S runs the next migration's file (m2, 32 -> 64)
    before its ``start``, so it serves the steady state (plain writes, signed with
    ``STEADY_HORIZON_SECONDS``). The network holds S's put (S times out and retries it: the retry
    lands, acknowledged); the operator starts m2, and D (planned) puts and reads the item. The
    held first attempt arrives at any point, or never."""
    from tests.model.spec import migration_variant
    f = sensor_fleet(w, "complete")
    f.add_migration("m2", migration_variant(f.kind, f.table, "sensor-events-32-to-64", (32, 64)))
    f.shim_actor("S", ("put", "k", {"by": "S"}), migration="m2")
    d = f.shim("D", migration="m2", late=True)
    f.script("op", f.operator_body("op", ("start@m2",)),
             f.shim_body("D", d, (("put", "k", {"by": "D"}), ("get", "k")), late=True))
    w.may_hold("S", where=DATA)
    return f


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="out of scope by decision (r25's B7, docs/late-writes.md §5): the steady state keeps "
                          "boto3's semantics; a steady shim's plain put, its first attempt held and retried "
                          "(acknowledged), lands within the steady horizon behind a planned shim's later write and "
                          "overwrites it, as a held request of a plain boto3 client would. Bounded: `planned` lasts "
                          "the steady horizon + 2 s, so no steady write lands in dual_write or later")
def test_a_held_steady_write_after_a_planned_write():
    explored(steady_write_held_across_start, plan=True, preemption_bound=1)


# ----------------------------------------------------------------------------- sampled over every fault

def every_fault_across_the_switch(w: World) -> Fleet:
    """Backfill -> cutover with the fault model at once: A puts and adds (its requests may be held
    by the network: delivered later, up to twice, or never; its answers lost), B reads before and
    after a refresh; A may freeze 30 s (past H) before any call; the operator switches authority.
    One writer: a timed-out write with another writer's write before its retry is the open case
    of :func:`test_a_lost_answer_then_another_writer`."""
    f = sensor_fleet(w, "backfill")
    f.shim_actor("A", ("put", "k", {"by": "A"}), ("add", "k"), ("get", "k"))
    f.shim_actor("B", ("get", "k"), ("refresh",), ("get", "k"))
    f.operator("op", "advance")
    w.may_hold("A", times=2, copies=2, where=DATA)
    w.may_lose("A", where=DATA)
    w.may_freeze("A", 30.0)
    return f


def test_random_schedules_over_every_fault(coarse_switch_polls):
    """Seeded random schedules (unbounded preemptions) over holds, duplicates, a lost answer and a
    freeze (``max_steps=0``: no exhaustive part -- every fault move at every point is far too
    wide even at preemption bound 0)."""
    _, seen = explored(every_fault_across_the_switch, max_steps=0, samples=40, seed=25, sample_max_steps=400)
    assert any(seen.late_calls) and any(seen.lost), seen.summary()


def lost_answer_then_another_writer(w: World) -> Fleet:
    """Cutover: the network may lose the answer of A's ADD (applied); B adds too, and may land
    between A's lost answer and A's retry."""
    f = sensor_fleet(w, "cutover")
    f.shim_actor("A", ("add", "k"), ("get", "k"))
    f.shim_actor("B", ("add", "k"))
    w.may_lose("A", where=DATA)
    return f


def test_a_lost_answer_then_another_writer():
    """Found by the model (an ADD counted twice) until main's d521632 (r25's B2): the retry of a
    write whose answer was lost reads first, and another writer's newer write there ends it with
    an unknown outcome instead of a second ADD."""
    run(lost_answer_then_another_writer, preemption_bound=1, lost=True)


# ----------------------------------------------------------------------------- r25/r25b fences (docs/late-writes.md 2b)

def duplicate_across_strip(w: World) -> Fleet:
    """r25's B1: ``complete`` has lasted H + 2 s (strip may start at once). The network holds A's
    ``ADD`` (A times out; the update is not sent again blindly: A's read finds nothing of its own,
    the outcome is unknown) and may deliver it twice; the operator runs ``--strip-bookkeeping``.
    A duplicate delivered after strip removed the ``_rs_v`` the first delivery stamped passes
    ``_rs_v <> :v``: the ADD counts twice -- unless strip sent its REMOVE only H + 2 s after its
    scan (``jobs/strip.py``, ``hold_seconds``), when every duplicate has expired."""
    f = sensor_fleet_at(w, "complete")
    f.shim_actor("A", ("add", "k"))
    f.operator("op", "strip")
    return f


def held_twice(actor: str, delivered: int = 1, copies: int = 2):
    """The opening: ``actor``'s first data-table write is held by the network (two copies: a
    duplicate), ``delivered`` of them arrive at once and ``actor`` runs to its end; the rest may
    arrive at any later point, or never. (Fixed here rather than offered at every point: the explorer's ``deliver`` moves
    are free, and two of them at every point of a strip pass is thousands of schedules.)"""
    def drive(w: World) -> None:
        a = w.sched.actors[actor]
        while a.pending and not DATA(*a.pending):
            w.apply(actor)
        assert a.pending, f"{actor} never wrote the data table"
        w.sched.hold(actor, copies)
        for ident in list(w.sched.held)[:delivered]:
            w.sched.deliver(ident)
        while a.pending:  # the writer's read decides (its own attempt landed), it is answered
            w.apply(actor)
    return drive


def sensor_fleet_at(w: World, phase: str, **kwargs) -> Fleet:
    """:func:`sensor_fleet` whose phase has already lasted H + 2 s of server time when the actors
    start (the removing jobs start at once; the shims' facts are read then)."""
    f = fleet(w, phase, **kwargs)
    f.key("k", **SENSOR_KEY)
    w.clock.advance(H + 2)
    return f


def test_a_duplicate_across_strip():
    explored(duplicate_across_strip, late="A", plan=True, preemption_bound=1, drive=held_twice("A"))


def late_delete_of_the_previous_owner(w: World) -> Fleet:
    """r25's B6: m1 (16 -> 32, started with ``--request-horizon 30``) is complete; A still runs
    m1's file and deletes the item (``complete``: a plain delete). The network holds the first
    attempt (the opening; A's retry lands: acknowledged). The operator starts m2 (32 -> 64, H 5:
    m2's old layout is m1's new one) and moves it to ``dual_write``, where B (m2) updates the item
    and reads it. The held delete arrives at any point, or never: within m1's horizon it removes
    B's acknowledged update from the layout ``dual_write`` reads -- unless ``planned`` lasted the
    previous owner's horizon too (``previous_horizon``, ``control/horizon.horizon_for``)."""
    from tests.model.spec import migration_variant
    f = Fleet(w, phase="complete", horizon=PREVIOUS_H)
    f.open_catch_up, f.lost_mirrors = False, True
    f.key("k", **SENSOR_KEY)
    f.add_migration("m2", migration_variant(f.kind, f.table, "sensor-events-32-to-64", (32, 64)), horizon=H)
    f.shim_actor("A", ("delete", "k"), ("close",))  # A leaves the census: m2's transitions may go on
    b = f.shim("B", migration="m2", late=True)
    f.script("op", f.operator_body("op", ("start@m2", "advance@m2")),
             f.shim_body("B", b, (("update", "k", {"temp": 5}), ("get", "k")), late=True))
    return f


#: The previous migration's request horizon in :func:`late_delete_of_the_previous_owner`: longer
#: than the steady horizon (15 s) and the next migration's H.
PREVIOUS_H = 30.0


def test_a_late_delete_of_the_previous_owners_shim():
    explored(late_delete_of_the_previous_owner, late="A", plan=True, preemption_bound=1,
             drive=held_twice("A", delivered=0, copies=1))


def parked_at_scan(actor: str):
    """The opening: ``actor`` (a job) runs its precondition, claims its segment and is about to
    scan its first page; it stays there (stalled: a slow host) until the scenario resumes it."""
    def drive(w: World) -> None:
        a = w.sched.actors[actor]
        while a.pending and not (a.pending[0] == "scan" and a.pending[1].get("TableName") == w.fleet.table):
            w.apply(actor)
        assert a.pending, f"{actor} never scanned the data table"
        w.sched.stall(actor)
    return drive


def is_mirror(op: str, kwargs: dict) -> bool:
    """A shim's mirror to the new layout (a put carrying the new-copy marker)."""
    return op == "put_item" and "_rs_new" in kwargs.get("Item", {})


def previous_strip_across_the_next_start(w: World) -> Fleet:
    """r25's B4: m1 (16 -> 32, H 2) is complete and its ``--strip-bookkeeping`` S claimed its
    segment and stalls before its first scan (the opening; its lease is long). The operator starts
    m2 (32 -> 64, H 10) and brings it to ``dual_read``; A (m2) puts the item (old layout, then its
    mirror: the network may hold the mirror's first attempt, A's retry lands), B (m2) deletes it
    (tombstones in both layouts) and reads it; then S runs on. Were its facts renewed (m1 is
    complete, a phase strip may write in), it would delete m2's tombstones (strip deletes every
    tombstone it meets) H1 + 2 s after its scan, and A's held mirror, dated by m2's H, lands on
    the empty key: the deleted item is back. S's facts are keyed by the table marker it began
    under, which m2's ``start`` replaced: S stops."""
    from tests.model.spec import migration_variant
    f = Fleet(w, phase="complete", horizon=2.0, lease_seconds=300.0)
    f.open_catch_up, f.lost_mirrors = False, True
    f.key("k", **SENSOR_KEY)
    f.add_migration("m2", migration_variant(f.kind, f.table, "sensor-events-32-to-64", (32, 64)), horizon=10.0)
    w.actor("S", lambda: f.strip_pass("S"))
    a = f.shim("A", migration="m2", late=True)
    b = f.shim("B", migration="m2", late=True)
    f.script("op", f.operator_body("op", ("start@m2", "advance@m2", "advance@m2")),
             f.shim_body("A", a, (("put", "k", {"by": "A"}), ("close",)), late=True),
             f.shim_body("B", b, (("delete", "k"), ("get", "k"), ("close",)), late=True),
             lambda: w.sched.resume("S"))
    w.may_hold("op", where=is_mirror)
    return f


def test_the_previous_migrations_strip_across_the_next_start():
    _, seen = explored(previous_strip_across_the_next_start, plan=True, preemption_bound=1, never_write=("S",),
                       drive=parked_at_scan("S"))
    assert_fenced_late(seen)


def assert_fenced_late(seen: Seen) -> None:
    """The held mirror arrived after the operator's actor (and the shims of its script) ended, in
    time, and its version fence (B's tombstone) refused it: the scenario reached its point."""
    assert any("ConditionalCheckFailed" in calls for calls in seen.late_calls), \
        f"the held mirror never arrived after B's delete: {seen.summary()}"


def retired_sweep_across_the_retry(w: World) -> Fleet:
    """r25's B5: m1 was aborted, its cleanup pass retired it, and the retire has lasted H + 2 s;
    a sweep of m1 (``reshard cleanup`` again, the second pass) S claimed its segment and stalls
    before its first scan (the opening; its lease is long). The operator starts the retry m2 (the
    same layouts) and brings it to ``dual_read``; A (m2) puts the item (its mirror's first attempt
    may be held by the network), B (m2) deletes it and reads it; then S runs on. ``aborted`` is a
    phase the sweep may always write in: were its facts renewed, it would retire m2's tombstones,
    and A's held mirror lands on the empty key. S's facts are keyed by the table marker (none,
    after the retire) it began under, which m2's ``start`` claimed: S stops. (m1's H is 2 and
    m2's 10, as in :func:`previous_strip_across_the_next_start`: the sweep deletes a tombstone
    H1 + 2 s after its scan, which A's mirror must outlive.)"""
    f = Fleet(w, phase="aborted", horizon=2.0, lease_seconds=300.0)
    f.open_catch_up, f.lost_mirrors = False, True
    f.key("k", **SENSOR_KEY)
    f.setup_to("m1", "retired")
    w.clock.advance(2.0 + 2)
    retry_migration(f, horizon=10.0)
    w.actor("S", lambda: f.cleanup_pass("S", run=2))
    a = f.shim("A", migration="m2", late=True)
    b = f.shim("B", migration="m2", late=True)
    f.script("op", f.operator_body("op", ("start@m2", "advance@m2", "advance@m2")),
             f.shim_body("A", a, (("put", "k", {"by": "A"}), ("close",)), late=True),
             f.shim_body("B", b, (("delete", "k"), ("get", "k"), ("close",)), late=True),
             lambda: w.sched.resume("S"))
    w.may_hold("op", where=is_mirror)
    return f


def test_a_retired_migrations_sweep_across_the_retry():
    _, seen = explored(retired_sweep_across_the_retry, plan=True, preemption_bound=1, never_write=("S",),
                       drive=parked_at_scan("S"))
    assert_fenced_late(seen)


def _inside(w: World, actor: str, function: str, owner: type) -> bool:
    """Whether ``actor``'s parked call was made from inside ``owner.function`` (its thread's stack)."""
    import sys
    frame = sys._current_frames().get(w.sched.actors[actor].thread.ident)
    while frame is not None:
        if frame.f_code.co_name == function and isinstance(frame.f_locals.get("self"), owner):
            return True
        frame = frame.f_back
    return False


def repair_reading_its_fact_before_cleanup(repairer: str, operator: str):
    """The opening of :func:`frozen_repair_across_the_catch_up_clear`: ``repairer`` (a ``verify
    --repair``) runs until its repair write passed its lease check and its fact keeper is about to
    read META for the write's date (the decision was taken); then ``operator`` runs its plan until
    it is about to compare-and-set the phase to ``cleanup`` (the catch-up clear done, the cleared
    version has lasted H + 2 s)."""
    def drive(w: World) -> None:
        from reshard.jobs.facts import JobFacts
        v = w.sched.actors[repairer]
        while v.pending and not (v.pending[0] == "get_item" and _inside(w, repairer, "horizon", JobFacts)):
            w.apply(repairer)
        assert v.pending, f"{repairer} never dated a repair write"
        at_move_to(operator, "cleanup")(w)
    return drive


def at_move_to(operator: str, phase: str):
    """The opening: ``operator`` runs its plan until it is about to compare-and-set the phase to
    ``phase`` (every wait before it done)."""
    def drive(w: World) -> None:
        o = w.sched.actors[operator]

        def cas(op: str, kwargs: dict) -> bool:
            return op == "update_item" and kwargs.get("UpdateExpression", "").startswith("SET phase = :to") and \
                kwargs.get("ExpressionAttributeValues", {}).get(":to") == {"S": phase}
        while o.pending and not cas(*o.pending):
            w.apply(operator)
        assert o.pending, f"{operator} never moved to {phase}: {w.fleet.outcomes}"
    return drive


def both(*openings):
    """One opening after the other."""
    def drive(w: World) -> None:
        for opening in openings:
            opening(w)
    return drive


def frozen_repair_across_the_catch_up_clear(w: World) -> Fleet:
    """r25's B3: in ``backfill`` the old copy of the item became newer than the new one (a lost
    mirror: set up directly), and the switch to ``cutover`` flagged ``newer_may_be = old``. V runs
    ``verify --repair``: it judges "old is newer" and, past its repair write's lease check, stalls
    just before its fact keeper dates the write (the opening; requests have no in-flight bound).
    Meanwhile B updates the item (catch-up: both layouts), a verify passes, and the operator's
    advance clears the flag (a new phase version, lasting H + 2 s) and is about to enter
    ``cleanup``. Then V reads META -- ``cutover``, the cleared version -- and would date its stale
    repair by it; the operator enters cleanup and D deletes the item (a plain delete); the repair
    lands on the empty key: the deleted item back. V's facts are keyed by the phase version its
    run began under: the write is not sent."""
    from reshard.core.versions import VersionClock
    # H 2: the repair's fact (the page guard's read) is older than H/3 after the settle's 1 s
    # pause, so the fact keeper reads META again for the write's date: the point of the case.
    f = Fleet(w, phase="backfill", horizon=2.0)
    f.open_catch_up, f.lost_mirrors = False, True
    w.max_request_seconds = None
    f.key("k", **SENSOR_KEY)
    x = f.shim("X")
    x.put_item(Item={**f.keys["k"], "temp": 1})  # both layouts
    x.close()
    from tests.shim_helpers import by_layout
    old = next(iter(by_layout(f.mapper, w.db.items(f.table))["old"].values()))[0]
    newer = VersionClock("Y", now_ms=lambda: int((w.clock() + 1) * 1000)).next()
    w.dynamo.call("put_item", TableName=f.table, Item={**old, "temp": {"N": "2"}, "_rs_v": {"S": newer}})
    f.expect_initial("k", {"temp": 2})  # what the application read (newest of both layouts)
    f.setup_to("m1", "cutover")
    assert f.store.load_state(f.m.id).newer_may_be == "old"
    w.actor("V", lambda: f.transition("V", "repair"))
    b = f.shim("B", late=True)
    d = f.shim("D", late=True)
    f.script("op", f.shim_body("B", b, (("update", "k", {"temp": 3}), ("close",)), late=True),
             f.operator_body("op", ("verify", "advance")),
             f.shim_body("D", d, (("delete", "k"), ("get", "k")), late=True))
    return f


def test_a_frozen_repair_across_the_catch_up_clear():
    explored(frozen_repair_across_the_catch_up_clear, plan=True, preemption_bound=1, never_write=("V",),
             drive=repair_reading_its_fact_before_cleanup("V", "op"))


# ----------------------------------------------------------------------------- cleanup/complete fenced (r25b's B4/B5)

def duplicate_after_another_writer(phase: str):
    """r25b's B4: A's ``ADD`` is held by the network with a duplicate; one copy lands at once and A,
    reading its own version, is answered (the opening); B adds and reads; the duplicate arrives at
    any point, or never. Where writes carry only ``_rs_v <> :v`` (cleanup, complete before the
    fenced phases) the duplicate passes over B's version: A's ADD counts twice."""
    def build(w: World) -> Fleet:
        f = sensor_fleet(w, phase)
        f.shim_actor("A", ("add", "k"))
        f.shim_actor("B", ("add", "k"), ("get", "k"))
        return f
    return build


@pytest.mark.parametrize("phase", ["cleanup", "complete"])
def test_a_duplicate_after_another_writer(phase):
    _, seen = explored(duplicate_after_another_writer(phase), operator="B", preemption_bound=1, drive=held_twice("A"))
    assert any("ConditionalCheckFailed" in calls for calls in seen.late_calls), seen.summary()


def cutover_duplicate_after_a_cleanup_delete(w: World, delete: str = "delete") -> Fleet:
    """r25b's B5: A (cutover) refreshes and puts the item; the network holds the put with a
    duplicate (A's retry lands: acknowledged); the operator enters cleanup, where B deletes the
    item (a plain delete before the fenced cleanup; ``"batch_delete"``: through ``batch_writer``)
    and reads it; the held copies arrive at any point, or never: within A's horizon one lands on
    the empty key."""
    from tests.model.spec import lift_catch_up
    f = sensor_fleet(w, "cutover")
    lift_catch_up(f.store, f.m.id)  # the catch-up verify passed: cutover -> cleanup may go
    f.shim_actor("A", ("refresh",), ("put", "k", {"by": "A"}), ("close",))
    b = f.shim("B", late=True)
    f.script("op", f.operator_body("op", ("advance",)),
             f.shim_body("B", b, ((delete, "k"), ("get", "k")), late=True))
    return f


def cutover_duplicate_after_a_cleanup_batch_delete(w: World) -> Fleet:
    return cutover_duplicate_after_a_cleanup_delete(w, "batch_delete")


#: The opening of :func:`cutover_duplicate_after_a_cleanup_delete`: the operator at its
#: compare-and-set to cleanup, then A refreshes and puts, its first attempt held with a
#: duplicate, its retry acknowledged (exploring the hold anywhere: 12,425 schedules, 150 s).
CUTOVER_DUPLICATE = both(at_move_to("op", "cleanup"), held_twice("A", delivered=0))


@pytest.mark.parametrize("build", [cutover_duplicate_after_a_cleanup_delete, cutover_duplicate_after_a_cleanup_batch_delete],
                         ids=["delete", "batch_writer"])
def test_a_cutover_duplicate_after_a_cleanup_delete(build):
    _, seen = explored(build, preemption_bound=1, drive=CUTOVER_DUPLICATE)
    assert_fenced_late(seen)


def held_put_across_a_tombstones_removal(phase: str):
    """The removing job's tombstone hold: in ``phase`` (lasted H + 2 s: the cleanup pass -- in
    ``complete``, ``--strip-bookkeeping`` -- starts at once), A refreshes and puts the item, its first attempt held by the network (A's retry lands:
    acknowledged); B deletes it (a tombstone) and reads it; the operator's cleanup pass scans and
    removes the tombstone. The held attempt (older than the tombstone) arrives at any point, or
    never: after the tombstone's removal, within A's horizon, it lands on the empty key, unless the
    pass removes a tombstone only H + 2 s after the scan answer that saw it."""
    def build(w: World) -> Fleet:
        f = sensor_fleet_at(w, phase)
        f.shim_actor("A", ("refresh",), ("put", "k", {"by": "A"}), ("close",))
        f.shim_actor("B", ("delete", "k"), ("get", "k"), ("close",))
        f.operator("op", "strip" if phase == "complete" else "cleanup")  # the job that removes tombstones there
        return f
    return build


def at_scan(actor: str):
    """The opening: ``actor`` (a job) runs until it is about to scan the data table."""
    def drive(w: World) -> None:
        a = w.sched.actors[actor]
        while a.pending and not (a.pending[0] == "scan" and a.pending[1].get("TableName") == w.fleet.table):
            w.apply(actor)
        assert a.pending, f"{actor} never scanned the data table"
    return drive


def run_out(*actors: str):
    def drive(w: World) -> None:
        for name in actors:
            while w.sched.actors[name].pending:
                w.apply(name)
    return drive


#: The opening of :func:`held_put_across_a_tombstones_removal`: the pass about to scan, then A's
#: put (first attempt held, the retry acknowledged) and B's delete.
HELD_BEFORE_THE_SCAN = both(at_scan("op"), held_twice("A", delivered=0, copies=1), run_out("B"))


@pytest.mark.parametrize("phase", ["aborted", "cleanup", "complete"])
def test_a_held_put_across_a_tombstones_removal(phase):
    explored(held_put_across_a_tombstones_removal(phase), late="A", preemption_bound=1, drive=HELD_BEFORE_THE_SCAN)


def held_put_of_the_previous_owner_across_an_abort(w: World) -> Fleet:
    """r25's B6 since cleanup/complete are fenced: m1 (16 -> 32, H 60) is complete; A (m1's file)
    puts the item, its first attempt held by the network (the opening; A's retry lands:
    acknowledged; A closes). The operator starts m2 (32 -> 64, H 2); B (m2, planned) deletes the
    item: a tombstone on m2's old layout (m1's new one); the operator aborts m2 and runs the abort's
    cleanup, which removes the tombstone H2 + 2 s after its scan and retires m2 (the application
    reads m2's old layout, steady). A's held put (older than the tombstone) arrives at any point,
    or never: once the tombstone is gone, within m1's horizon, it lands on the empty key -- unless
    ``planned`` lasted m1's horizon too (``previous_horizon``)."""
    from tests.model.spec import migration_variant
    f = Fleet(w, phase="complete", horizon=LONG_PREVIOUS_H)
    f.open_catch_up, f.lost_mirrors = False, True
    f.key("k", **SENSOR_KEY)
    f.add_migration("m2", migration_variant(f.kind, f.table, "sensor-events-32-to-64", (32, 64)), horizon=2.0)
    f.shim_actor("A", ("put", "k", {"by": "A"}), ("close",))
    b = f.shim("B", migration="m2", late=True)
    f.script("op", f.operator_body("op", ("start@m2",)),
             f.shim_body("B", b, (("delete", "k"), ("get", "k"), ("close",)), late=True),
             f.operator_body("op", ("abort@m2", "cleanup@m2")))
    return f


#: m1's request horizon in :func:`held_put_of_the_previous_owner_across_an_abort`: longer than
#: m2's planned (17 s without ``previous_horizon``) + its abort's cleanup (2 + 2 s, then its hold).
LONG_PREVIOUS_H = 60.0


def test_a_held_put_of_the_previous_owner_across_an_abort():
    explored(held_put_of_the_previous_owner_across_an_abort, late="A", plan=True, preemption_bound=1,
             drive=held_twice("A", delivered=0, copies=1))
