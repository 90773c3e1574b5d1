"""a25: a third outside review of issue 25 ("no late write lands"), after r25 and r25b's fixes.
Forced interleavings on dynalite behind the fidelity proxy, with the harness of
``test_r25_late_writes.py`` (server deadline enforced, H = 30 s of the proxy's clock, which moves
only when a test moves it, so real time never expires a request by accident). Each break is
``xfail(strict=True)`` so the suite stays green until it is fixed."""

from __future__ import annotations

import pytest
from boto3.dynamodb.conditions import Attr
from botocore.exceptions import ClientError

from reshard import errors, operations
from reshard.control import transition
from tests.integration.test_r25_late_writes import _move, _run, proxy  # noqa: F401 - the fixture
from tests.late_support import plain, key_of


# ------------------------------------------------------------------ 1. doctor removes a tombstone too soon
def test_a25_doctor_deletes_a_tombstone_a_late_duplicate_still_needs(proxy, unique_name):
    """``aborted`` (tombstones, fenced writes on the old layout): shim A's put lands and is
    acknowledged; the network keeps a copy of it (``duplicate(copy="hold")``). Shim B deletes
    the item: a tombstone, newer than A's version, acknowledged. The abort's cleanup ends in
    the retire (no migration left on the table). ``reshard doctor --repair`` runs at once: with
    no active migration it calls every tombstone a leftover (``core/doctor.tombstone_cutoff_ms``
    returns None) and deletes it, conditioned on its version only -- no wait on the server's
    clock. The copy of A's put is delivered, well inside its horizon (A's aborted-phase fact +
    H): its fence ``attribute_not_exists(_rs_v) OR _rs_v < :v`` passes on the empty key and the
    item B deleted is back. Guarantee 2 through 5b ("a request that lands ... twice").

    The abort's own second sweep (``operations.sweeps_again``) waits until the retire lasted
    H + 2 s (``await_before_removal``), so a copy like this one has expired by then; doctor's
    tombstone repair has no such wait (nor a date on its deletes)."""
    run = _run(proxy, unique_name)
    _move(run, "aborted")
    a, b = run.shim(), run.shim()
    try:
        assert a.phase == "aborted" and b.phase == "aborted"
        item = run.moving(val=1)
        old_key, _ = run.keys(item)
        rule = proxy.duplicate(op="PutItem", key=plain(old_key), copy="hold")
        a.put_item(Item=item)  # acknowledged
        copy = proxy.held(rule=rule)[0]["handle"]
        b.delete_item(Key=key_of(item))  # acknowledged: a tombstone at the old key
        assert "_rs_del" in run.stored(old_key)

        transition.retire(run.store, run.migration.id, dynamo=run.dynamo)
        # On main: finding "old_tombstones", repaired (the tombstone deleted, conditioned on its version).
        operations.doctor(run.store, run.dynamo, run.migration.id, repair=True, wait=0)

        outcome = proxy.release(copy)
        back = run.stored(old_key)
        assert back is None or "_rs_del" in back, \
            f"the deleted item is back ({outcome['status']}): {back}"
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ 2. --no-server-deadline after an enforced owner
def test_a25_no_server_deadline_on_the_next_migration_forgets_the_previous_horizon(proxy, unique_name):
    """M1 ran with the server deadline enforced (H = 30 s) and is ``complete``; shim A still runs
    M1's file and deletes an item (a plain delete: ``complete``); the request is held on the way,
    inside its horizon, and the application is redeployed with M2's file (A closes: its
    heartbeat goes, the census no longer counts it). M2 is started on the same table -- the same enforcing server -- with
    ``--no-server-deadline`` (``RESHARD_NO_SERVER_DEADLINE=1`` left in an operator's shell, or a
    script written for the test server): ``start`` probes nothing and records ``server_deadline =
    off``, and with it every wait of docs/late-writes.md section 2 is off, also the one r25's B6 fix
    added (``planned`` lasts the previous owner's horizon: ``control/horizon.horizon_for`` is only
    consulted with a server deadline), although ``start`` recorded ``previous_horizon`` = 30 s.
    ``advance`` moves M2 to ``dual_write`` at once; M2's shim B updates the item (old layout
    authoritative) and is acknowledged. A's delete lands (its horizon has not passed: DynamoDB
    accepts it) and B's acknowledged update is gone -- a read in ``dual_write`` finds nothing.
    Guarantees 1 and 4 through 5b; r25's B6 again, through the opt-out.

    The option was meant for servers that do not check signatures; here it also switches off the
    fences a previous, enforced migration's requests still rely on. ``start --no-server-deadline``
    could keep ``planned`` for ``previous_horizon`` on the server's clock whatever its own mode,
    or probe anyway and refuse the option on a server that enforces the window."""
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    from reshard.core.phases import Action
    from tests.integration.test_r25_late_writes import _to
    from tests.late_support import Background, Run

    m1 = _run(proxy, unique_name)
    _to(m1, "complete")
    a = m1.shim(read_timeout=120)
    try:
        item = m1.moving(val=1)
        a.put_item(Item=item)
        _, k = m1.keys(item)  # M1's new layout: M2's old
        # A tombstone put since p25 (complete is fenced, with tombstones): the version fence refuses
        # it after B's newer update too, so this test holds for two reasons now; the planned wait
        # (horizon_for with previous_horizon whatever M2's mode) is checked below on its own.
        rule = proxy.hold(op="PutItem", key=plain(k))
        delete = Background(lambda: a.delete_item(Key=key_of(item)))
        handle = proxy.wait_held(1, rule=rule, timeout=30)[0]["handle"]
        a.close()  # the application is redeployed with M2's file: A leaves the census at once

        text = m1.migration.text.replace("shards = 32", "shards = 64").replace("shards = 16", "shards = 32")
        m2 = parse(text.replace(f'id = "{m1.migration.id}"', 'id = "sensor-events-32-to-64"'), "<m2>")
        operations.start(m1.dynamo, m1.store, m2, server_deadline=False)  # records previous_horizon = 30
        slept = []

        def sleep(seconds):  # a wait, if any, on the server's clock
            slept.append(seconds)
            proxy.advance_clock(seconds)
        moved = operations.transition(m1.store, m2.id, Action.ADVANCE, allow_no_shims=True, sleep=sleep)
        assert str(moved.after.phase) == "dual_write", moved
        # `planned` outlasted M1's horizon (30 s) on the server's clock, M2's own mode notwithstanding.
        assert sum(slept) >= 30, slept
        run2 = Run(proxy, m1.dynamo, m2, KeyMapper(m2), m1.store, m1.control)
        b = run2.shim()
        try:
            assert b.phase == "dual_write"
            b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 2})
            outcome = proxy.release(handle)
            try:
                delete.result()
            except Exception:  # noqa: BLE001 - refused is what a fix gives
                pass
            got = b.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
            assert got is not None and got["val"] == 2, \
                f"M1's late delete ({outcome['status']}) undid B's acknowledged update in M2's dual_write: {got}"
        finally:
            b.close()
    finally:
        a.close()


# ------------------------------------------------------------------ 3. a retired migration's shim and the retry
def test_a25_a_retired_migrations_late_delete_lands_in_the_retry_migrations_dual_write(proxy, unique_name):
    """M1 (``--request-horizon 30``) is aborted and retired: the retire removes the table marker
    (M1 replaced no owner) and M1's shims serve the steady state -- but each steady request is
    still dated by M1's ``request_horizon`` (``shim/phase_cache``: ``facts.saw(...,
    state.request_horizon)`` for any registered state, a retired one too), i.e. it may land up to
    30 s after its fact. Shim A (M1's file, after the retire) deletes an item; the DeleteItem is
    held on the way, inside that horizon; the application is redeployed with the retry
    migration's file (A closes, its heartbeat goes). M1' (the retry: same layouts, another id,
    ``--request-horizon 6``) is started by ``operations.start``: the marker it claims names no
    previous owner, so ``previous_horizon`` = 0 and ``planned`` lasts ``max(6, steady 15, 0) + 2``
    = 17 s of server time (``control/horizon.horizon_for``), then ``dual_write``. M1''s shim B
    updates the item (old layout authoritative), acknowledged. A's delete lands (17 s < 30 s: the
    server accepts it): B's acknowledged update is gone, a read in ``dual_write`` finds nothing.
    Guarantees 1 and 4 through 5b (r25's B6, through the retire instead of ``complete``).

    Either a retired migration's shims sign with at most the steady horizon (as its jobs do:
    ``JobFacts.horizon_cap``), or the retire keeps the retired migration's horizon where the next
    ``start`` finds it (the marker's previous owner, or a table-level row)."""
    from reshard.control.horizon import horizon_for
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    from reshard.core.phases import Phase
    from tests.late_support import Background, Run

    m1 = _run(proxy, unique_name)
    _move(m1, "aborted")
    transition.retire(m1.store, m1.migration.id, dynamo=m1.dynamo)
    a = m1.shim(read_timeout=120)
    try:
        assert a.phase == "steady"
        item = m1.moving(val=1)
        a.put_item(Item=item)
        old_key, _ = m1.keys(item)
        rule = proxy.hold(op="DeleteItem", key=plain(old_key))
        delete = Background(lambda: a.delete_item(Key=key_of(item)))
        handle = proxy.wait_held(1, rule=rule, timeout=30)[0]["handle"]
    finally:
        a.close()  # redeployed with the retry migration's file: A leaves the census at once

    retry = parse(m1.migration.text.replace(f'id = "{m1.migration.id}"', f'id = "{m1.migration.id}-retry"'), "<m1'>")
    started = operations.start(m1.dynamo, m1.store, retry, request_horizon=6)
    # What `advance` waits out of planned, on the server's clock (on main 15 + 2 s: previous_horizon is 0).
    proxy.advance_clock(horizon_for(started.state) + 2)
    m1.store.set_phase(m1.store.load_state(retry.id), Phase.DUAL_WRITE, "test", "test")
    run2 = Run(proxy, m1.dynamo, retry, KeyMapper(retry), m1.store, m1.control)
    b = run2.shim()
    try:
        assert b.phase == "dual_write"
        b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 2})
        outcome = proxy.release(handle)
        try:
            delete.result()
        except Exception:  # noqa: BLE001 - refused is what a fix gives
            pass
        got = b.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
        assert got is not None and got["val"] == 2, \
            f"the retired migration's late delete ({outcome['status']}) undid B's acknowledged update: {got}"
    finally:
        b.close()


# ------------------------------------------------------------------ 4. the operator's own compare-and-set, answer lost
def test_a25_a_lost_answer_of_the_switch_leaves_the_fleet_holding(proxy, unique_name):
    """``rollback`` from ``cutover`` (a switch). The first compare-and-set (``switching`` to
    ``backfill``) lands; its answer is lost; ``Dynamo.call`` sends it again and the retry fails
    its own condition (``phase_version = :v``: the first attempt moved it). ``set_phase`` takes
    that for another operator's move: ``ConcurrentChange`` "root@... already moved it from cutover
    to backfill; nothing done ... run the command again if you still mean it", ``finish_switch``
    never runs and the row stays ``switching``: every shim holds every request (reads too) until
    someone runs ``advance`` (finishes it) or ``rollback`` again (which *abandons* it: back to
    ``cutover``, not what the operator meant). Nothing is lost (guarantees 1-4 hold), but the
    command reports its own move as someone else's and "nothing done", and the application is
    down for as long as nobody notices -- the data path's lesson (a stored version equal to the
    attempt's own is this writer's own attempt) is not applied to the control plane:
    ``updated_at``/``updated_by`` of the row are the attempt's own ``:now``/``:who`` and would
    say so. The same holds for every ``set_phase``, ``clear_newer_may_be`` and ``mark_retired``."""
    from reshard.core.phases import Action
    from tests.integration.test_r25_late_writes import _to

    run = _run(proxy, unique_name)
    _to(run, "cutover")
    proxy.lose_answer(op="UpdateItem", contains=b"switching = :sw")
    try:
        out = operations.transition(run.store, run.migration.id, Action.ROLLBACK, allow_no_shims=True,
                                    sleep=lambda s: proxy.advance_clock(s))
    except errors.ConcurrentChange as e:
        state = run.store.load_state(run.migration.id)
        raise AssertionError(f"the operator's own move was reported as another's ({e}); the row is left "
                             f"{'switching to ' if state.switching else ''}{state.phase}") from e
    assert out.after.phase.value == "backfill" and not out.after.switching


# ------------------------------------------------------------------ 5. the retire's sweep and a steady update
def test_a25_the_retire_sweep_deletes_a_steady_update_made_over_a_tombstone(proxy, unique_name, monkeypatch):
    """``aborted``: shim B deletes an item (a tombstone at its old key, ``_rs_v`` = v, ``_rs_del``).
    The abort's cleanup pass ends in the retire; the shims serve the steady state (no version
    stamped, the application's requests as boto3 sends them). The cleanup command's second
    sweep (``operations.sweeps_again``; it starts once the retire lasted H + 2 s) scans the
    tombstone. Between that scan and its delete, steady shim C updates the item (an upsert:
    ``SET val = 5``, the tombstone flag removed, acknowledged; ``get_item`` returns it). The
    sweep's delete is conditioned on ``_rs_v = v`` only (``core/versions.unchanged``) -- and a
    steady write stamps no version, so C's update kept ``_rs_v = v``: the condition passes and
    C's acknowledged write is deleted. Guarantee 1 (and 4: C read its write, then it was gone).
    No late fault is needed; a frozen sweep (its delete landing any time later) widens it.
    ``reshard doctor --repair``'s leftover-tombstone delete has the same condition
    (``control/doctor._delete_items``).

    The condition must say "still the tombstone scanned" (``attribute_exists(_rs_del) AND
    _rs_v = :v``), or a steady write over a tombstone must drop its ``_rs_v`` too."""
    from reshard.core.phases import CLEANUP_JOB
    from reshard.jobs import cleanup as cleanup_job
    from reshard.jobs.runner import JobOptions

    run = _run(proxy, unique_name)
    _move(run, "aborted")
    b = run.shim()
    item = run.moving(val=1)
    try:
        b.put_item(Item=item)
        b.delete_item(Key=key_of(item))  # a tombstone at the old key
    finally:
        b.close()
    transition.retire(run.store, run.migration.id, dynamo=run.dynamo)
    proxy.advance_clock(30 + 2)  # the sweep's wait: the retire lasted H + 2 s
    c = run.shim()
    try:
        assert c.phase == "steady"
        original = cleanup_job.Cleaner._delete_if_unchanged
        acked = []

        def between_scan_and_delete(self, guard, scanned, **kw):
            if not acked:  # the sweep scanned the tombstone; C's update lands now
                c.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 5})
                acked.append(c.get_item(Key=key_of(item), ConsistentRead=True).get("Item"))
            return original(self, guard, scanned, **kw)
        monkeypatch.setattr(cleanup_job.Cleaner, "_delete_if_unchanged", between_scan_and_delete)
        operations.run_data_job(CLEANUP_JOB, run.dynamo, run.store, run.migration.id,
                                JobOptions(segments=1, workers=1))
        assert acked and acked[0]["val"] == 5, acked  # C's update was acknowledged and read back
        got = c.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
        assert got == acked[0], f"the sweep deleted C's acknowledged update: {got}"
    finally:
        c.close()


# ------------------------------------------------------------------ 6. a steady update over a retired copy
@pytest.mark.parametrize("op", ["update", "create"])
def test_a25_a_steady_update_over_a_retired_copy_is_acknowledged_and_never_read(proxy, unique_name, op):
    """How the table gets there: M1 (16 -> 32) completes; its cleanup marked every moved old item
    ``_rs_gone`` with a TTL ``retain_hours`` (a week by default) away. An item X is deleted
    afterwards (its 32-shard copy goes; its retired 16-shard copy stays until the TTL). M2 (the
    reverse, 32 -> 16) runs within the week and completes: its backfill had nothing to copy for X,
    so X's 16-shard key still holds M1's retired copy. The application then deploys the next
    migration's file (from the 16-shard layout) before its ``start``: a steady shim
    (docs/late-writes.md: "an application deployed with the next migration's file before start is
    fine"). Here the retired copy is put in place directly (the state after that history), and
    M1 is complete.

    The steady shim's ``update_item(SET val = 5)`` of X (an upsert: X does not exist for any
    reader) is sent as boto3 would send it: no ``attribute_not_exists(_rs_gone)`` guard (only the
    stamping phases carry it, ``shim/writes._authoritative``: ``fence is None`` in the steady
    state). It lands on the retired copy, which keeps ``_rs_gone`` (and the deleted item's stale
    attributes): every read drops it (``shim/requests._hidden``), and its TTL deletes it later.
    The application was told the write happened; ``get_item`` says there is no item. Guarantees 1
    and 4. A plain boto3 Table would have created the item. (``op = create``: a create-if-absent
    ``put_item(..., ConditionExpression=Attr("sensor_id").not_exists())`` of the item no reader
    sees fails with ConditionalCheckFailed: the condition is judged on the retired copy.) The steady shim could guard its
    updates the same way (``attribute_not_exists(_rs_gone)``, delete the retired copy, retry):
    one condition, no version."""
    from reshard.aws.dynamo import to_wire
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    from tests.integration.test_r25_late_writes import _to
    from tests.late_support import Run

    m1 = _run(proxy, unique_name)
    _to(m1, "complete")
    nxt = parse(m1.migration.text.replace(f'id = "{m1.migration.id}"', 'id = "sensor-events-next"'), "<next>")
    steady = Run(proxy, m1.dynamo, nxt, KeyMapper(nxt), m1.store, m1.control)
    s = steady.shim()
    try:
        assert s.phase == "steady"
        item = steady.moving(5, val=1, note="deleted long ago")
        key, _ = steady.keys(item)
        retired = {**to_wire(item), **key, "_rs_v": {"S": "1700000000000.000000.aaaaaaaaaaaa"},
                   "_rs_gone": {"S": m1.migration.id}, "expires_at": {"N": "4102444800"}}
        m1.dynamo.call("put_item", TableName=m1.migration.table, Item=retired)
        assert s.get_item(Key=key_of(item), ConsistentRead=True).get("Item") is None  # absent for every reader

        if op == "update":
            s.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 5})
        else:
            try:
                s.put_item(Item={**key_of(item), "val": 5}, ConditionExpression=Attr("sensor_id").not_exists())
            except ClientError as e:
                raise AssertionError(f"a create-if-absent put of an item no reader sees failed: {e}") from e
        got = s.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
        assert got is not None and got["val"] == 5, f"the acknowledged upsert reads as {got}"
        assert "note" not in got, f"the deleted item's attributes came back with the upsert: {got}"
    finally:
        s.close()
