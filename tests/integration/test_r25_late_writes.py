"""r25: an outside review of issue 25 ("no late write lands"), forced interleavings on dynalite
behind the fidelity proxy. Each test is the shortest interleaving found that breaks a guarantee
of PRODUCT.md 5b on main; each is ``xfail(strict=True)`` so the suite stays green until fixed.

The migrations here record ``server_deadline = enforced`` (the proxy enforces the signature
window) with a request horizon of :data:`HZ` seconds, and every phase lasts ``HZ + 2`` s of
the proxy's clock before the next one (what the operator's transitions wait).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from reshard import operations
from reshard.aws import fidelity
from reshard.control.records import META
from reshard.core.phases import Phase, STRIP_JOB
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.runner import JobOptions, run_job
from tests.late_support import Background, Run, key_of, plain

#: The request horizon of these migrations: long enough that real time spent by a slow machine
#: between a request's fact and its delivery never expires it by accident.
HZ = 30.0
FAST = JobOptions(segments=1, workers=1, page_size=50)


@pytest.fixture
def proxy(dynalite_server):
    with fidelity.FidelityProxy(dynalite_server.endpoint) as p:
        yield p


def _run(proxy, name: str) -> Run:
    from reshard.control import marker as markers
    run = Run.start(proxy, name)
    # As `start` does: the table's marker names the migration (a next one's start replaces it).
    markers.claim(run.dynamo, run.store, run.migration.id, run.migration.table,
                  run.dynamo.describe_table(run.migration.table))
    run.store.update(run.store.mpk(run.migration.id), META, "SET request_horizon = :h, server_deadline = :e",
                     values={":h": {"N": str(HZ)}, ":e": {"S": "enforced"}})
    return run


def _move(run: Run, target: str, *, switching: bool = False) -> None:
    """A compare-and-set of the phase (stamped with the server's Date), then HZ + 2 s of server time."""
    state = run.store.load_state(run.migration.id)
    run.store.set_phase(state, Phase(target), "test", "test", switching=switching)
    run.proxy.advance_clock(HZ + 2)


def _to(run: Run, phase: str) -> None:
    """From backfill (after a backfill pass) on to ``phase`` (cutover, cleanup or complete)."""
    assert run_job(BACKFILL, run.dynamo, run.store, run.migration.id, FAST).done
    _move(run, "cutover", switching=True)
    _move(run, "cutover")
    for p in ("cleanup", "complete"):
        if phase == "cutover" or (phase == "cleanup" and p == "complete"):
            break
        _move(run, p)


def _start_next(run: Run, m2, horizon: float = HZ) -> None:
    """``start`` of a next migration of the table as ``operations.start`` does it: claim the table
    marker (keeping the owner it replaces), register with that owner's horizon, and wait out of
    ``planned`` as the transition does (``control/horizon.horizon_for`` + 2 s of server time)."""
    from reshard.control import marker as markers
    from reshard.control.horizon import horizon_for
    mine = markers.claim(run.dynamo, run.store, m2.id, m2.table, run.dynamo.describe_table(m2.table))
    run.store.register(m2, request_horizon=horizon, server_deadline=True,
                       previous_horizon=markers.previous_horizon(run.store, mine))
    run.proxy.advance_clock(horizon_for(run.store.load_state(m2.id)) + 2)


# ------------------------------------------------------------------ 1. strip un-fences a duplicate
def test_r25_strip_lets_a_duplicated_add_apply_twice(proxy, unique_name):
    """``complete``: shim A's ``ADD n 1`` lands and is acknowledged; the network keeps a copy of the
    request (a duplicate, or the retry of an attempt whose answer was lost). The strip pass
    (``cleanup --strip-bookkeeping``, started after complete lasted H + 2 s) removes ``_rs_v``
    from the item. The copy is delivered, well inside its horizon: its only guard was
    ``_rs_v <> :v``, which an item without ``_rs_v`` passes, so the ``ADD`` is applied a second
    time. Guarantee 1 (and 5b: "through complete and --strip-bookkeeping").

    Fixed: strip sends a page's REMOVEs only H + 2 s after the page's scan (jobs/strip.py), so the
    copy has expired by then and DynamoDB refuses it. (H = 6 here: the strip waits 8 s.)"""
    run = _run(proxy, unique_name)
    _to(run, "complete")
    run.store.update(run.store.mpk(run.migration.id), META, "SET request_horizon = :h", values={":h": {"N": "6"}})
    t = run.shim()
    try:
        assert t.phase == "complete"
        item = run.moving(val=1, n=Decimal(10))
        t.put_item(Item=item)
        _, new_key = run.keys(item)
        rule = proxy.duplicate(op="UpdateItem", key=plain(new_key), copy="hold")
        out = t.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1},
                            ReturnValues="UPDATED_NEW")
        assert out["Attributes"] == {"n": 11}
        copy = proxy.held(rule=rule)[0]["handle"]  # the copy, kept until released

        result = operations.run_data_job(STRIP_JOB, run.dynamo, run.store, run.migration.id,
                                         JobOptions(segments=1, workers=1))
        assert result.counts["stripped"] >= 1
        assert "_rs_v" not in run.stored(new_key)

        outcome = proxy.release(copy)
        assert outcome["status"] == 400 and "Signature expired" in outcome["body"]["message"], outcome
        assert t.get_item(Key=key_of(item), ConsistentRead=True)["Item"]["n"] == 11, "the ADD was applied twice"
    finally:
        t.close()


# ------------------------------------------------------------------ 2. a retry after another writer
@pytest.mark.parametrize("phase", ["cutover", "complete"])
def test_r25_a_lost_answer_retried_after_another_writer_applies_an_add_twice(proxy, unique_name, phase):
    """Shim A's ``ADD n 1`` lands; its answer is lost; A's client retries, and the retry is held a
    moment on the way (well inside the horizon). Shim B's ``SET val = 2`` lands meanwhile
    (acknowledged). The retry arrives: in ``cutover`` it fails the fence (B's version is newer)
    and the shim, finding B's version and not its own, takes it for a fence loss and applies the
    ``ADD`` again above it; in ``complete`` its ``_rs_v <> :v`` passes at once. Either way
    ``n`` is 12: no order of the two acknowledged writes gives that. Guarantee 1 through 5b
    ("an answer lost and its request retried"). docs/late-writes.md lists this as "not covered".

    Fixed: an update (or a conditional write) whose answer was lost is not sent again blindly
    (``aws/dynamo.RETRY_UNKNOWN``); one consistent read decides: its own version stored, it
    landed; another writer's newer version stored, its outcome is unknown and the application
    hears ``ReshardOutcomeUnknown`` (as a plain client's timeout would tell it), never a second
    application. Here that read is held until B's write landed."""
    from botocore.exceptions import ClientError

    run = _run(proxy, unique_name)
    _to(run, phase)
    a, b = run.shim(read_timeout=60), run.shim()
    try:
        assert a.phase == phase and b.phase == phase
        item = run.moving(val=1, n=Decimal(10))
        a.put_item(Item=item)
        _, new_key = run.keys(item)
        proxy.lose_answer(op="UpdateItem", key=plain(new_key))
        read_rule = proxy.hold(op="GetItem", key=plain(new_key))
        add = Background(lambda: a.update_item(Key=key_of(item), UpdateExpression="ADD n :one",
                                               ExpressionAttributeValues={":one": 1}))
        read = proxy.wait_held(1, rule=read_rule, timeout=30)[0]["handle"]
        assert run.stored(new_key)["n"] == {"N": "11"}, "the first attempt landed"

        b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 2})
        proxy.release(read)
        with pytest.raises(ClientError) as e:
            add.result()
        assert e.value.response["Error"]["Code"] == "ReshardOutcomeUnknown"
        got = b.get_item(Key=key_of(item), ConsistentRead=True)["Item"]
        assert got["val"] == 2
        assert got["n"] == 11, "one ADD was applied twice"
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ 3. a job's stale decision, freshly dated
def _without_mirror(run: Run, shim, item: dict, mirror_key: dict) -> None:
    """``shim`` puts ``item``; its authoritative write lands and its mirror never does."""
    from reshard import errors
    rule = run.proxy.fail(op="PutItem", key=plain(mirror_key), times=None, status=400,
                          code="com.amazonaws.dynamodb.v20120810#ValidationException", message="injected")
    with pytest.raises(errors.AWSError):
        shim.put_item(Item=item)
    run.proxy.remove_rule(rule)


def test_r25_a_frozen_repair_dated_by_a_fresh_fact_resurrects_after_cleanup(proxy, unique_name, monkeypatch):
    """``backfill``: A's write (val 2) lands in the old layout, its mirror never does (the new copy
    stays at val 1). The switch to ``cutover`` flags ``newer_may_be = old``. A ``verify --repair``
    worker V re-reads both copies, judges "old is newer", and freezes inside the repair's
    ``Dynamo.call`` -- after its lease guard passed, before the horizon is taken. Meanwhile
    shim B updates the item (catch-up, then val 3 on both layouts), the flag is cleared (the
    version bumped and lasting H + 2 s), and the fleet goes on. V resumes just before
    ``cleanup``: its fact keeper reads META (``cutover``: a phase verify may write in), dates
    the repair ``now + H`` and sends it; the network holds it a moment. The operator moves to
    ``cleanup``; shim C deletes the item (a plain delete). The repair lands -- inside its
    horizon -- on the empty key (``attribute_not_exists(_rs_v) OR ...`` passes) and the
    deleted item is back, with the stale val 2. Guarantees 2 and 1 (5b: a frozen job).

    The fence that is missing: a job's write is dated by the *latest* META read that saw an
    allowed phase name, not by the read its decision rests on; the decision's read (the settle
    re-read at ``cutover`` v_flagged) is two transitions older than the date the write carries.
    """
    from reshard.jobs import facts as job_facts
    from reshard.jobs.verify import VERIFY
    import threading

    run = _run(proxy, unique_name)
    a = run.shim()
    item = run.moving(val=1)
    a.put_item(Item=item)  # both layouts, val 1
    assert run_job(BACKFILL, run.dynamo, run.store, run.migration.id, FAST).done
    old_key, new_key = run.keys(item)
    _without_mirror(run, a, {**item, "val": 2}, new_key)
    assert run.stored(old_key)["val"] == {"N": "2"} and run.stored(new_key)["val"] == {"N": "1"}
    a.close()

    _move(run, "cutover", switching=True)
    state = run.store.load_state(run.migration.id)
    run.store.set_phase(state, Phase.CUTOVER, "test", "test")
    run.store.update(run.store.mpk(run.migration.id), META, "SET newer_may_be = :n", values={":n": {"S": "old"}})
    run.proxy.advance_clock(HZ + 2)

    frozen, thaw, skipped = threading.Event(), threading.Event(), []
    original = job_facts.JobFacts.horizon

    def freezing_horizon(self):
        if not frozen.is_set():
            frozen.set()  # the repair's first attempt: its lease guard passed, its horizon not yet taken
            thaw.wait(60)
            # The freeze lasted as long on the job's clock as on the server's (the proxy's jumps).
            base = self.monotonic
            self.monotonic = lambda: base() + sum(skipped)
        return original(self)
    monkeypatch.setattr(job_facts.JobFacts, "horizon", freezing_horizon)
    repair = Background(lambda: run_job(VERIFY, run.dynamo, run.store, run.migration.id,
                                        JobOptions(segments=1, workers=1, repair=True, settle_seconds=0)))
    assert frozen.wait(60), "the verify decided no repair"

    b = run.shim()
    try:
        assert b.phase == "cutover"
        b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 3})
        assert run.stored(new_key)["val"] == {"N": "3"} and run.stored(old_key)["val"] == {"N": "3"}
    finally:
        b.close()
    # A verify passed (both layouts agree): the operator clears the flag, the cleared version lasts H + 2.
    assert run.store.clear_newer_may_be(run.store.load_state(run.migration.id), "test")
    run.proxy.advance_clock(HZ + 2)
    skipped.append(2 * (HZ + 2))

    held = proxy.hold(op="PutItem", key=plain(new_key))
    thaw.set()
    try:  # fixed: the repair is never sent (its decision's phase version is gone), the run stops
        repair.result(timeout=30)
    except Exception:  # noqa: BLE001 - still running: its request is held (the break)
        pass
    try:
        handle = proxy.wait_held(1, rule=held, timeout=1)[0]["handle"]
    except TimeoutError:
        handle = None
    run.store.set_phase(run.store.load_state(run.migration.id), Phase.CLEANUP, "test", "test")
    c = run.shim()
    try:
        assert c.phase == "cleanup"
        c.delete_item(Key=key_of(item))
        # `reshard cleanup` removes the tombstone (after its hold): the repair's horizon alone must fence it.
        run.dynamo.call("delete_item", TableName=run.migration.table, Key=new_key)
        assert run.stored(new_key) is None
        outcome = proxy.release(handle) if handle is not None else {"status": None}
        try:
            repair.result(timeout=60)
        except Exception:  # noqa: BLE001 - the run's own outcome is not the point
            pass
        assert outcome["status"] != 200 or run.stored(new_key) is None, \
            f"a deleted item came back: {run.stored(new_key)}"
        assert handle is None, "the repair decided under the flagged version was sent after the flag was cleared"
        assert c.get_item(Key=key_of(item), ConsistentRead=True).get("Item") is None
    finally:
        c.close()


# ------------------------------------------------------------------ 4. the previous migration's strip
def test_r25_the_previous_migrations_strip_deletes_the_next_ones_tombstones(proxy, unique_name, monkeypatch):
    """Migration M1 (16 -> 32 shards) is ``complete``; its strip pass starts (nothing else runs:
    its census passes) and its worker stalls before its first page (a big table, a slow host).
    M2 (32 -> 64) starts on the same table (M1 is complete: nothing refuses it) and reaches
    ``dual_read``; the strip's fact keeper looks at M1's row only (``complete``: always fresh). Shim A (M2) puts an item:
    the old-layout write lands, its mirror to the new layout is held on the way (well inside its
    horizon). Shim B (M2) deletes the item: tombstones in both layouts. M1's strip runs now and
    deletes both tombstones ("nothing writes tombstones in complete, so any left is garbage": M2's
    shims do). A's mirror lands on the empty key (its fence passes) and B's delete is undone:
    every M2 reader (dual_read reads both layouts) sees the item again. Guarantee 2, 5b ("the
    next migration of the same table")."""
    from reshard.core.migration import parse
    from reshard.control.store import ControlStore

    import threading
    from reshard.jobs import strip as strip_job

    m1 = _run(proxy, unique_name)
    _to(m1, "complete")
    stalled, go = threading.Event(), threading.Event()
    scan = strip_job.scan_page

    def stalling_scan(*args, **kwargs):
        if not stalled.is_set():
            stalled.set()
            go.wait(120)
        return scan(*args, **kwargs)
    monkeypatch.setattr(strip_job, "scan_page", stalling_scan)
    stripping = Background(lambda: operations.run_data_job(STRIP_JOB, m1.dynamo, m1.store, m1.migration.id,
                                                           JobOptions(segments=1, workers=1)))
    assert stalled.wait(60)
    text = m1.migration.text.replace("shards = 32", "shards = 64").replace("shards = 16", "shards = 32")
    text = text.replace(f'id = "{m1.migration.id}"', 'id = "sensor-events-32-to-64"')
    m2 = parse(text, "<m2>")
    store: ControlStore = m1.store
    _start_next(m1, m2)
    for phase in ("dual_write", "dual_read"):
        store.set_phase(store.load_state(m2.id), Phase(phase), "test", "test")
        proxy.advance_clock(HZ + 2)
    run2 = Run(proxy, m1.dynamo, m2, __import__("reshard.core.layout", fromlist=["KeyMapper"]).KeyMapper(m2),
               store, m1.control)
    a, b = run2.shim(read_timeout=60), run2.shim()
    try:
        assert a.phase == "dual_read" and b.phase == "dual_read"
        item = run2.moving(val=1)
        old_key, new_key = run2.keys(item)
        rule = proxy.hold(op="PutItem", key=plain(new_key))
        put = Background(lambda: a.put_item(Item=item))
        handle = proxy.wait_held(1, rule=rule, timeout=30)[0]["handle"]
        b.delete_item(Key=key_of(item))
        assert "_rs_del" in run2.stored(old_key) and "_rs_del" in run2.stored(new_key)

        go.set()
        try:  # fixed: M1's strip stops (the marker names M2 now) before it writes
            stripping.result(timeout=120)
        except Exception:  # noqa: BLE001 - how it reports the stop is not the point
            pass
        assert "_rs_del" in run2.stored(old_key) and "_rs_del" in run2.stored(new_key), \
            "the previous migration's strip deleted the next one's tombstones"

        proxy.release(handle)  # A's mirror, in time: refused by the tombstone's fence
        try:
            put.result()
        except Exception:  # noqa: BLE001 - the mirror's failure is logged, not raised
            pass
        assert b.get_item(Key=key_of(item), ConsistentRead=True).get("Item") is None, "a deleted item came back"
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ 5. case 4 in the steady state
@pytest.mark.xfail(strict=True, reason="r25: case 4 in the steady state (no migration registered, or after a "
                                      "retire): a lost answer's retry fails its own condition / applies an ADD twice")
@pytest.mark.parametrize("op", ["create-if-absent", "ADD"])
def test_r25_a_lost_answer_in_the_steady_state_is_not_recognised(proxy, unique_name, op):
    """A shim deployed with the next migration's file before its ``start`` (the steady state PRODUCT.md
    5b covers as "the next migration of the table"; also every shim after an abort's retire)
    writes unstamped: the retry of a create-if-absent put whose answer was lost fails the app's
    own condition (the app gets ConditionalCheckFailed for its own landed write, case 4 exactly),
    and an ``ADD`` is applied twice. The fence that is missing: steady writes carry no version, so
    neither ``_rs_v <> :v`` nor the own-attempt read can apply."""
    from botocore.exceptions import ClientError
    from reshard.control.store import ControlStore
    from reshard.core.layout import KeyMapper
    from tests.late_support import client
    from tests.shim_helpers import create_table, migration

    dynamo = client(proxy.endpoint)
    m = migration("sensor", table=unique_name)
    create_table(dynamo, m)
    store = ControlStore(dynamo, f"{unique_name}-ctl")
    store.ensure_table()
    run = Run(proxy, dynamo, m, KeyMapper(m), store, f"{unique_name}-ctl")
    t = run.shim()
    try:
        assert t.phase == "steady"
        item = run.moving(val=1, n=Decimal(10))
        old_key, _ = run.keys(item)
        if op == "create-if-absent":
            proxy.lose_answer(op="PutItem", key=plain(old_key))
            try:
                t.put_item(Item=item, ConditionExpression="attribute_not_exists(sensor_id)")
            except ClientError as e:
                pytest.fail(f"the app's own landed put came back as {e.response['Error']['Code']}")
        else:
            t.put_item(Item=item)
            proxy.lose_answer(op="UpdateItem", key=plain(old_key))
            t.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1})
            assert t.get_item(Key=key_of(item), ConsistentRead=True)["Item"]["n"] == 11, "ADD applied twice"
        assert proxy.stats()["rule_lose_answer"] == 1
    finally:
        t.close()


def test_r25_a_retired_migrations_sweep_deletes_the_next_ones_tombstones(proxy, unique_name, monkeypatch):
    """The same through an abort: M1 is aborted in ``backfill``, its cleanup pass ends in the retire
    (the table is free), and the sweep that follows (``run_data_job``'s second pass, or an
    operator re-running ``reshard cleanup``) stalls before its first page. A retry migration
    M2 of the same file starts and reaches ``dual_read``. A's put lands in the old layout, its
    mirror held; B deletes (tombstones in both layouts); M1's sweep runs on: phase ``aborted``
    is one its fact keeper accepts forever, and it retires every tombstone it meets, M2's too.
    A's mirror lands on the empty new key: the deleted item is back. Guarantee 2, 5b."""
    import threading
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    from reshard.jobs import cleanup as cleanup_job
    from reshard.jobs.cleanup import CLEANUP

    m1 = _run(proxy, unique_name)
    _move(m1, "aborted")
    assert run_job(CLEANUP, m1.dynamo, m1.store, m1.migration.id, FAST).done
    assert m1.store.load_state(m1.migration.id).retired
    proxy.advance_clock(HZ + 2)  # the retire lasted H + 2 s: the sweep may start

    stalled, go = threading.Event(), threading.Event()
    scan = cleanup_job.scan_page

    def stalling_scan(*args, **kwargs):
        if not stalled.is_set():
            stalled.set()
            go.wait(120)
        return scan(*args, **kwargs)
    monkeypatch.setattr(cleanup_job, "scan_page", stalling_scan)
    sweep = Background(lambda: run_job(CLEANUP, m1.dynamo, m1.store, m1.migration.id, FAST))
    assert stalled.wait(60)

    text = m1.migration.text.replace(f'id = "{m1.migration.id}"', 'id = "sensor-events-retry"')
    m2 = parse(text, "<m2>")
    _start_next(m1, m2)
    for phase in ("dual_write", "dual_read"):
        m1.store.set_phase(m1.store.load_state(m2.id), Phase(phase), "test", "test")
        proxy.advance_clock(HZ + 2)
    run2 = Run(proxy, m1.dynamo, m2, KeyMapper(m2), m1.store, m1.control)
    a, b = run2.shim(read_timeout=60), run2.shim()
    try:
        assert a.phase == "dual_read" and b.phase == "dual_read"
        item = run2.moving(val=1)
        old_key, new_key = run2.keys(item)
        rule = proxy.hold(op="PutItem", key=plain(new_key))
        put = Background(lambda: a.put_item(Item=item))
        handle = proxy.wait_held(1, rule=rule, timeout=30)[0]["handle"]
        b.delete_item(Key=key_of(item))
        assert "_rs_del" in run2.stored(old_key) and "_rs_del" in run2.stored(new_key)

        go.set()
        try:  # fixed: M1's sweep stops (the marker names M2 now) before it writes
            sweep.result(timeout=120)
        except Exception:  # noqa: BLE001 - how it reports the stop is not the point
            pass
        assert "_rs_del" in run2.stored(old_key) and "_rs_del" in run2.stored(new_key), \
            "the retired migration's sweep deleted the next one's tombstones"
        proxy.release(handle)  # A's mirror, in time: refused by the tombstone's fence
        try:
            put.result()
        except Exception:  # noqa: BLE001 - the mirror's failure is logged, not raised
            pass
        assert b.get_item(Key=key_of(item), ConsistentRead=True).get("Item") is None, "a deleted item came back"
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ 6. the previous migration's horizon
def test_r25_a_late_delete_of_the_previous_migrations_shim_lands_in_the_next_dual_write(proxy, unique_name):
    """M1 (started with ``--request-horizon 30``) is ``complete``; shim A still runs M1's file. A deletes
    an item (a plain delete then: ``complete`` routing; a tombstone now, which B's newer version
    also fences); the request is held on the way, inside its
    horizon (M1's fact + 30 s). M2 (32 -> 64, ``--request-horizon 6``) starts on the table; out
    of ``planned`` the operator waits ``max(H, STEADY_HORIZON_SECONDS) + 2`` = 17 s
    (``control/horizon.horizon_for``), then ``dual_write``. M2's shim B updates the item (old
    layout, mirrored to the new one). A's delete lands now (24 s < 30 s after its fact): the
    old copy is gone, with no tombstone. B reads in ``dual_write`` (old layout only): absent --
    the delete is what the fleet serves. One phase later (``dual_read``, newest of both layouts)
    the item is back, with no write in between. Guarantee 2 (and 4: B's own update vanished and
    came back). The wait out of ``planned`` knows the steady shims' horizon but not the horizon
    of the owner the marker replaced."""
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    from reshard.core.deadlines import STEADY_HORIZON_SECONDS

    m1 = _run(proxy, unique_name)
    _to(m1, "complete")
    a = m1.shim(read_timeout=120)
    try:
        assert a.phase == "complete"
        item = m1.moving(val=1)
        a.put_item(Item=item)
        _, k = m1.keys(item)  # M1's new layout: M2's old
        # A tombstone (a PutItem) since complete deletes with one; a plain DeleteItem before.
        rule = proxy.hold(op=["DeleteItem", "PutItem"], key=plain(k))
        delete = Background(lambda: a.delete_item(Key=key_of(item)))
        handle = proxy.wait_held(1, rule=rule, timeout=30)[0]["handle"]

        text = m1.migration.text.replace("shards = 32", "shards = 64").replace("shards = 16", "shards = 32")
        m2 = parse(text.replace(f'id = "{m1.migration.id}"', 'id = "sensor-events-32-to-64"'), "<m2>")
        _start_next(m1, m2, horizon=6)  # out of planned: max(6, STEADY, M1's 30) + 2 s
        assert STEADY_HORIZON_SECONDS < HZ
        m1.store.set_phase(m1.store.load_state(m2.id), Phase.DUAL_WRITE, "test", "test")
        run2 = Run(proxy, m1.dynamo, m2, KeyMapper(m2), m1.store, m1.control)
        b = run2.shim()
        try:
            assert b.phase == "dual_write"
            b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 2})
            assert run2.stored(run2.keys(item)[0])["val"] == {"N": "2"}

            outcome = proxy.release(handle)
            # fixed: M2's planned outlasted M1's horizon, so the delete dated by M1's fact is refused
            assert outcome["status"] != 200, outcome
            with pytest.raises(Exception):
                delete.result()
            assert b.get_item(Key=key_of(item), ConsistentRead=True)["Item"]["val"] == 2  # B's update stands

            proxy.advance_clock(6 + 2)
            m1.store.set_phase(m1.store.load_state(m2.id), Phase.DUAL_READ, "test", "test")
            assert b.refresh() and b.phase == "dual_read"
            assert b.get_item(Key=key_of(item), ConsistentRead=True)["Item"]["val"] == 2, \
                "B's acknowledged update was undone one phase later"
        finally:
            b.close()
    finally:
        a.close()


def test_r25_a_lost_answer_retried_after_another_writer_fails_a_landed_put(proxy, unique_name):
    """Case 4 with a second writer in between: in ``cutover`` A's ``put_item(..., attribute_not_exists)``
    lands, its answer is lost, its retry is held a moment; B's put of the same item lands
    (acknowledged). The retry fails the fence; the stored version is B's, not A's, so the shim
    takes it for a fence loss, re-evaluates the app's condition against B's item and answers
    ConditionalCheckFailed: A is told its write did not happen, yet it did (it was the item
    B overwrote). The own-attempt check compares with the latest stored version only."""
    from botocore.exceptions import ClientError

    run = _run(proxy, unique_name)
    _to(run, "cutover")
    a, b = run.shim(read_timeout=60), run.shim()
    try:
        item = run.moving(val=1)
        _, new_key = run.keys(item)
        proxy.lose_answer(op="PutItem", key=plain(new_key))
        read_rule = proxy.hold(op="GetItem", key=plain(new_key))
        put = Background(lambda: a.put_item(Item=item, ConditionExpression="attribute_not_exists(sensor_id)"))
        read = proxy.wait_held(1, rule=read_rule, timeout=30)[0]["handle"]
        assert run.stored(new_key)["val"] == {"N": "1"}, "A's first attempt landed"
        b.put_item(Item={**item, "val": 2})
        proxy.release(read)
        # Fixed: not ConditionalCheckFailed (which says "not applied"): the outcome is unknown.
        with pytest.raises(ClientError) as e:
            put.result()
        assert e.value.response["Error"]["Code"] == "ReshardOutcomeUnknown", e.value.response["Error"]
    finally:
        a.close()
        b.close()


def test_r25_the_previous_migrations_strip_unmarks_the_next_ones_copies(proxy, unique_name, monkeypatch):
    """M1 (16 -> 32) is ``complete`` and its strip pass stalls before its first page; M2 (32 -> 48)
    starts and reaches ``dual_write``: shim A writes an item (old layout, and its new-layout copy
    marked ``_rs_new = M2``). M1's strip runs on and removes ``_rs_v``/``_rs_new`` from both. M2 is
    aborted; its cleanup removes only copies marked with its id, so the unmarked copy stays. After
    the retire the table holds the logical item twice, both at old-layout keys (the copy's key is
    also an old-layout key): guarantee 3. The shim hides the stray here (a calculated layout
    tells it the item's key); a random-suffix layout could not, and a later migration's backfill
    meets it as a second old copy."""
    import threading
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    from reshard.aws.dynamo import to_wire as wire
    from reshard.jobs import strip as strip_job
    from reshard.jobs.cleanup import CLEANUP

    m1 = _run(proxy, unique_name)
    _to(m1, "complete")
    stalled, go = threading.Event(), threading.Event()
    scan = strip_job.scan_page

    def stalling_scan(*args, **kwargs):
        if not stalled.is_set():
            stalled.set()
            go.wait(120)
        return scan(*args, **kwargs)
    monkeypatch.setattr(strip_job, "scan_page", stalling_scan)
    stripping = Background(lambda: operations.run_data_job(STRIP_JOB, m1.dynamo, m1.store, m1.migration.id,
                                                           JobOptions(segments=1, workers=1)))
    assert stalled.wait(60)

    text = m1.migration.text.replace("shards = 32", "shards = 48").replace("shards = 16", "shards = 32")
    m2 = parse(text.replace(f'id = "{m1.migration.id}"', 'id = "sensor-events-32-to-48"'), "<m2>")
    _start_next(m1, m2)
    m1.store.set_phase(m1.store.load_state(m2.id), Phase.DUAL_WRITE, "test", "test")
    proxy.advance_clock(HZ + 2)
    mapper = KeyMapper(m2)
    run2 = Run(proxy, m1.dynamo, m2, mapper, m1.store, m1.control)
    # An item whose new-layout key is another old-layout key (shard < 32): read by old-layout queries.
    for i in range(2000):
        item = {"sensor_id": "s-1", "event_id": f"e-{i}", "ts": f"2024-10-27T15:00:{i % 60:02d}.{i:04d}Z"}
        fields = mapper.logical_fields(wire(item))
        old_key, new_key = mapper.old.key(fields), mapper.new.key(fields)
        if old_key != new_key and int(new_key["PK"]["S"].split("#")[1]) < 32:
            break
    else:
        raise AssertionError("no item whose new key is another old-layout key")
    a = run2.shim()
    try:
        assert a.phase == "dual_write"
        a.put_item(Item={**item, "val": 1})
        assert run2.stored(new_key)["_rs_new"] == {"S": m2.id}
    finally:
        a.close()
    go.set()
    try:  # fixed: M1's strip stops (the marker names M2 now) before it writes
        stripping.result(timeout=120)
    except Exception:  # noqa: BLE001 - how it reports the stop is not the point
        pass
    assert run2.stored(new_key)["_rs_new"] == {"S": m2.id}, "the previous migration's strip unmarked M2's copy"

    m1.store.set_phase(m1.store.load_state(m2.id), Phase.ABORTED, "test", "test")
    proxy.advance_clock(HZ + 2)
    assert run_job(CLEANUP, m1.dynamo, m1.store, m2.id, FAST).done
    assert m1.store.load_state(m2.id).retired
    proxy.advance_clock(HZ + 2)
    # (M2's retire gave the marker back to M1: a shim of M2's file refuses now; the table is read raw.)
    if True:
        physical = [x for x in m1.dynamo.call("scan", TableName=m2.table, ConsistentRead=True)["Items"]
                    if x.get("event_id") == {"S": item["event_id"]}]
        assert len(physical) == 1, f"one logical item, {len(physical)} physical items after the abort: {physical}"
