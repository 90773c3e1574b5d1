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


def sensor_fleet(w: World, phase: str) -> Fleet:
    f = Fleet(w, phase=phase)
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
    build = half_written_then("cutover", ("rollback", "verify", "abort"))
    r = explore(scenario(build), preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()


@case(3, "cutover serves the new layout, which misses a backfill write whose mirror never landed")
def test_cutover_after_a_half_written_backfill_write(coarse_switch_polls):
    build = half_written_then("backfill", ("advance",))
    r = explore(scenario(build), preemption_bound=1, drive=dead_before_mirror("A", then=("C",)))
    print(describe_bounds(r))
    r.assert_ok()
