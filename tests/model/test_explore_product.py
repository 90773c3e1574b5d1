"""The scheduler and explorer driving reshard's own code (a preview of the model checker).

* Two operators race a transition through the real ControlStore.
* Two real ShardedTable shims on adjacent phases (dual_write, dual_read) write, update and
  delete the same item: both layouts end up agreeing in every interleaving explored.
* A zombie copier (frozen past its lease between its lease check and its copy, then
  killed) cannot leave a stale new-layout copy behind a finished backfill: its copy is
  version-fenced at the server (issue 12, case 2).
* Two backfill hosts share a segment through the real SegmentEngine; one stalls past its
  lease (by hand, then in every interleaving with at most one preemption and one clock
  jump): the segment is finished exactly once, and pages are redone at most once per
  takeover (the engine's promise: a takeover redoes the page in flight).
"""

from __future__ import annotations

from reshard import errors
from decimal import Decimal

from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper
from reshard.core.phases import Action, Phase
from reshard.core.versions import VersionClock
from reshard.jobs.engine import SegmentEngine, segment_sk
from reshard.control.transition import transition
from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.verify import VERIFY
from tests.model.explore import World, explore
from tests.shim_helpers import by_layout, content, create_table, migration, shim

PAGES = 2


def test_two_operators_race_a_transition():
    """Both saw phase version 1 (``expected_version``, what ``--from`` gives): exactly one wins, the
    other gets ConcurrentChange, and the history has one row per version."""

    def factory(w: World):
        store = ControlStore(w.dynamo, "ctl", clock=w.clock)
        m = migration("sensor")
        store.register(m, who="setup")
        outcome = {}

        def operator(name):
            def run():
                try:
                    transition(store, m.id, Action.ADVANCE, who=name, expected_version=1, allow_no_shims=True)
                    outcome[name] = "won"
                except errors.ConcurrentChange:
                    outcome[name] = "lost"
            return run

        w.actor("op1", operator("op1"))
        w.actor("op2", operator("op2"))

        def check(w: World) -> None:
            assert sorted(outcome.values()) == ["lost", "won"], outcome
            state = store.load_state(m.id)
            assert state.phase is Phase.DUAL_WRITE and state.phase_version == 2
            assert [t.phase_version for t in store.history(m.id)] == [1, 2]
        return check

    result = explore(factory, preemption_bound=1, samples=20, seed=3)
    result.assert_ok()
    # A transition is 18 calls (the census also lists the table's other migrations: a Scan and
    # a META read; and reads heartbeats in both their partition and where older releases put
    # them; the winner records the compare-and-set answer's Date as ``phase_since``); a loser
    # that got as far as the compare-and-set makes 15, fails it, reads the row once (did its own
    # write land, its answer lost? ``store.landed``: no) and the state once more for its
    # message: 17. Longest: 18 + 17.
    assert result.longest == 35
    # Bound 1: the 2 serial orders, plus, for either operator first, a switch after any of its
    # first 17 calls (then the other runs to its end, then the first finishes: forced): 2 + 2 * 17.
    assert result.schedules == 36 and result.sampled == 20


def backfill_world(w: World, pages: int = PAGES):
    """Two hosts' SegmentEngines (one worker each) on one segment of ``pages`` pages; each page
    bumps a counter item in a data table. Returns the store."""
    store = ControlStore(w.dynamo, "ctl", clock=w.clock)
    store.ensure_table()
    w.dynamo.call("create_table", TableName="data", BillingMode="PAY_PER_REQUEST",
                  KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                  AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}])

    def page(ctx, key):
        i = int(key["pos"]["N"]) if key else 0
        w.dynamo.call("update_item", TableName="data", Key={"k": {"S": f"page-{i}"}},
                      UpdateExpression="ADD copies :one", ExpressionAttributeValues={":one": {"N": "1"}})
        return {"pages_copied": 1}, ({"pos": {"N": str(i + 1)}} if i < pages - 1 else None)

    for host in ("A", "B"):
        # One worker, run on the actor's own thread (run_all would start threads the scheduler
        # does not know). Hosts differ, so a held lease is only taken over once it expired.
        engine = SegmentEngine(store, "mid", "backfill", 1, 1, page, workers=1, lease_seconds=10,
                               clock=w.clock, sleep=w.sleep, host=host, invocation=host, is_dead=lambda o: False,
                               max_request_seconds=1)
        w.actor(host, engine.work_inline)
    return store


def copies(w: World) -> dict:
    return {i["k"]["S"]: int(i["copies"]["N"]) for i in w.db.items("data")}


def test_a_copier_stalled_past_its_lease_loses_it_at_its_next_checkpoint():
    w = World()
    store = backfill_world(w, pages=3)
    s = w.sched
    s.start()
    while "data" not in s.step("A").detail:  # A claims the segment and copies page 0 ...
        pass
    s.stall("A")                             # ... then freezes (a GC pause) before its checkpoint
    s.tick(11)                               # past its 10 s lease
    s.run_to_end()                           # B takes the lease over and does the whole segment
    s.resume("A")
    s.run_to_end()                           # A's fenced checkpoint fails: it stops at once
    s.shutdown()
    trace = [x.line() for x in s.trace]
    assert any("A " in t and "lease_counter = 1" in t and "ConditionalCheckFailed" in t for t in trace), trace
    assert copies(w) == {"page-0": 2, "page-1": 1, "page-2": 1}  # the page in flight, redone once
    rec = store.get("J#mid#backfill", segment_sk("backfill", 1, 0))
    assert rec["done"] == {"BOOL": True} and rec["takeovers"] == {"N": "1"} and rec["owner"] == {"S": "-"}


def test_every_interleaving_of_two_hosts_on_one_segment():
    def factory(w: World):
        store = backfill_world(w)
        w.may_tick(11)  # one jump of the clock past a lease, anywhere

        def check(w: World) -> None:
            got = copies(w)
            rec = store.get("J#mid#backfill", segment_sk("backfill", 1, 0))
            assert set(got) == {f"page-{i}" for i in range(PAGES)}, got
            assert rec["done"] == {"BOOL": True}
            # Each takeover redoes at most the page in flight.
            assert sum(got.values()) - PAGES <= int(rec["takeovers"]["N"]), (got, rec["takeovers"])
            assert store.get("J#mid#backfill", "R#backfill#000001").get("finished_at") is not None
        return check

    result = explore(factory, preemption_bound=1, max_steps=60)
    result.assert_ok()
    assert result.truncated == 0 and result.schedules > 100


def test_two_shims_on_adjacent_phases_keep_both_layouts_in_agreement():
    def factory(w: World):
        m = migration("sensor", table="sensor")
        create_table(w.dynamo, m)
        mapper = KeyMapper(m)
        key = {"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:00:00Z"}
        for name, phase in (("A", "dual_write"), ("B", "dual_read")):
            # Pinned phases (no control table); versions from the logical clock, so replays match.
            t = shim(m, w.dynamo, phase, writer_id=name, version_clock=VersionClock(name, now_ms=w.clock.now_ms))

            def work(t=t, name=name):
                t.put_item(Item={**key, "by": name})
                t.update_item(Key=key, UpdateExpression="ADD n :one SET #b = :me", ExpressionAttributeNames={"#b": "by"},
                              ExpressionAttributeValues={":one": Decimal(1), ":me": name})
                if name == "B":
                    t.delete_item(Key=key)
            w.actor(name, work)

        def check(w: World) -> None:
            layouts = by_layout(mapper, w.db.items("sensor"))
            (ident,) = layouts["old"]
            old, new = layouts["old"][ident], layouts["new"].get(ident, [])
            assert len(old) == 1 and len(new) == 1, (old, new)

            def strip(c):
                return None if c is None else {k: v for k, v in c.items() if k not in ("PK", "SK")}
            assert strip(content(old[0])) == strip(content(new[0])), f"layouts disagree: {old[0]} vs {new[0]}"
        return check

    # Unbounded, this is 978 schedules (about 5 s here); two preemptions give 52, plus random ones.
    result = explore(factory, preemption_bound=2, samples=60, seed=11)
    result.assert_ok()
    assert result.schedules == 52 and result.sampled == 60


def test_a_zombie_copier_cannot_put_a_stale_copy_over_a_newer_write():
    """A copier frozen past its lease just before its copy request goes out (after every check
    it makes): another host takes the segment over and finishes it, the application writes the
    item (both layouts, versioned), then the zombie's copy is sent and it dies. (Frozen *after*
    its guard for longer than a request can be in flight: this checks the version fence alone,
    as if the time fence had failed; the Fleet scenarios bound requests in flight.) On main this
    was an unconditional batch write that left the stale pre-migration copy behind a finished
    run (verify reported it stale). Now the copy is version-fenced at the server: it fails,
    the application's write stays, and verify passes."""
    import time

    from reshard.aws.dynamo import from_wire
    from reshard.jobs.backfill import Backfill
    from reshard.core.phases import BACKFILL_JOB as JOB
    from reshard.control.runs import backfill_run as current_run
    from reshard.jobs.budget import CapacityBudget
    pass
    from tests.backfill_support import Shim, logical, setup_migration

    w = World(clock_start=time.time() + 3600)  # after the set-up's (real-time) phase changes
    m, mapper, _ = setup_migration(w.dynamo, "sensor", "Tzombie")
    store = ControlStore(w.dynamo, "reshard-control", clock=w.clock)
    item = next(x for x in (logical("sensor", i) for i in range(50)) if mapper.moves(mapper.to_physical(x, mapper.old)))
    Shim(w.dynamo, mapper, m.table).seed(item)  # a pre-migration item that moves
    run = current_run(store, m.id)

    def copier(host):
        budget = CapacityBudget(None, None, clock=w.clock, sleep=w.sleep)
        budget.attach(w.dynamo, m.table)
        page = Backfill(w.dynamo, store, m.id, mapper, m.table, budget, page_size=10).page
        engine = SegmentEngine(store, m.id, JOB, run, 1, page, workers=1, lease_seconds=10, clock=w.clock,
                               sleep=w.sleep, host=host, invocation=host, is_dead=lambda o: False,
                               max_request_seconds=1)

        return engine.work_inline

    app = shim(m, w.dynamo, "backfill", writer_id="app", version_clock=VersionClock("app", now_ms=w.clock.now_ms))
    w.actor("A", copier("A"))
    w.actor("B", copier("B"))
    w.actor("app", lambda: app.put_item(Item={**from_wire(item), "temp": Decimal(99)}))
    s = w.sched
    s.start()
    s.stall("app")
    while s.actors["A"].pending[0] != "put_item":
        s.step("A")                          # A claims, scans the page, passes its checks ...
    s.stall("A")                             # ... and freezes just before its copy is sent
    s.tick(11)
    s.run_to_end()                           # B takes over, copies, settles, finishes the run
    s.resume("app")
    s.run_to_end()                           # the app's write: old and new layout, versioned
    s.resume("A")
    s.step("A")                              # the zombie's copy lands: fenced, it fails
    s.kill("A")                              # and it dies
    s.shutdown()

    layouts = by_layout(mapper, w.db.items(m.table))
    (ident,) = layouts["old"]
    (old,), (new,) = layouts["old"][ident], layouts["new"][ident]
    assert old["temp"] == {"N": "99"} and "_rs_v" in old
    assert new["temp"] == {"N": "99"} and new["_rs_v"] == old["_rs_v"]  # the application's write stayed
    result = run_job(VERIFY, w.dynamo, store, m.id, JobOptions(segments=1, workers=1, page_size=50, rechecks=2,
                                                             recheck_pause=0.0), sleep=lambda s: None)
    assert result.passed
