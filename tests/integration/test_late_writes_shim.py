"""Issue 25 ("no late write lands"), the shim's cases, forced on dynalite behind the fidelity proxy.

Each test holds, drops or loses exactly the request that broke a guarantee, moves the fleet on
(the control row, and the proxy's clock past the request horizon ``H``) and lets the late
request arrive. Before the fix each of them failed: a late mirror resurrected a deleted item or
overwrote an acknowledged update (case 1), a rollback served a stale copy (case 3), a lost
answer turned into ConditionalCheckFailed or an ``ADD`` applied twice (case 4), a frozen shim's
request landed (the horizon).
"""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from reshard import errors
from reshard.core.layout import VERSION_ATTR
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.runner import JobOptions, run_job
from reshard.shim import errors as shim_errors
from reshard.aws import fidelity
from tests.late_support import H, Background, Run, key_of, plain

FAST = JobOptions(segments=1, workers=1, page_size=50)


@pytest.fixture
def proxy(dynalite_server):
    with fidelity.FidelityProxy(dynalite_server.endpoint) as p:
        yield p


@pytest.fixture
def run(proxy, unique_name):
    return Run.start(proxy, unique_name)


def _held_mirror(run: Run, shim, item: dict):
    """``shim`` puts ``item`` in backfill; its mirror to the new layout is held by the proxy
    (the shim froze between its two writes). Returns (the put running in the background, the
    held request's handle)."""
    old_key, new_key = run.keys(item)
    rule = run.proxy.hold(op="PutItem", key=plain(new_key))
    put = Background(lambda: shim.put_item(Item=item))
    held = run.proxy.wait_held(1, rule=rule, timeout=30)
    assert run.stored(old_key)["val"] == {"N": str(item["val"])}, "the authoritative write landed"
    assert run.stored(new_key) is None, "the mirror is held"
    return put, held[0]["handle"]


# ------------------------------------------------------------------------------------ case 1
def test_case1_a_frozen_mirror_is_refused_after_cleanup_deleted_the_item(run):
    """Shim A's authoritative write lands in backfill, its mirror is held (A froze). The backfill
    copies the item, the fleet goes through cutover to cleanup (each phase lasting H + 2 s of
    server time), shim B deletes the item and the cleanup job removes its tombstone. A resumes:
    DynamoDB refuses its mirror
    as late -- the item stays deleted -- and A's put still returns, as boto3's would (its
    authoritative write landed). Before the fix the mirror's version fence passed on the empty key
    and the item came back."""
    a, b = run.shim(read_timeout=60), run.shim()
    try:
        item = run.moving(val=1)
        put, handle = _held_mirror(run, a, item)
        assert run_job(BACKFILL, run.dynamo, run.store, run.migration.id, FAST).done
        run.switch("cutover", newer_may_be=None)  # the verify after the backfill passed: no flag
        run.move("cleanup")
        assert b.refresh() and b.phase == "cleanup"
        assert b.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == item
        b.delete_item(Key=key_of(item))  # a tombstone, which the late mirror's fence would also fail
        # `reshard cleanup` deletes the tombstone (after its hold): only the horizon is left to
        # refuse the mirror.
        run.dynamo.call("delete_item", TableName=run.migration.table, Key=run.keys(item)[1])
        assert run.stored(run.keys(item)[1]) is None

        outcome = run.proxy.release(handle)
        assert outcome["code"].endswith("InvalidSignatureException") and "expired" in outcome["message"], outcome
        assert "Attributes" not in put.result()  # the app's put succeeded: its authoritative write landed
        assert run.stored(run.keys(item)[1]) is None, "a late mirror brought a deleted item back"
        assert b.get_item(Key=key_of(item), ConsistentRead=True).get("Item") is None
    finally:
        a.close()
        b.close()


def test_case1_a_frozen_mirror_cannot_overwrite_an_update_after_complete_and_strip(run):
    """The variant: B updates the item in cleanup, the migration completes, the bookkeeping is
    stripped (``_rs_v`` removed by hand, as ``--strip-bookkeeping`` does). A's stale mirror,
    released then, is refused; B's acknowledged update stays. Before the fix the mirror passed
    the unversioned branch of the fence and overwrote it."""
    a, b = run.shim(read_timeout=60), run.shim()
    try:
        item = run.moving(val=1)
        put, handle = _held_mirror(run, a, item)
        assert run_job(BACKFILL, run.dynamo, run.store, run.migration.id, FAST).done
        run.switch("cutover", newer_may_be=None)
        run.move("cleanup")
        assert b.refresh()
        b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 2})
        run.move("complete")
        new_key = run.keys(item)[1]
        run.dynamo.call("update_item", TableName=run.migration.table, Key=new_key,
                        UpdateExpression="REMOVE #v", ExpressionAttributeNames={"#v": VERSION_ATTR})
        assert VERSION_ATTR not in run.stored(new_key)

        outcome = run.proxy.release(handle)
        assert "expired" in outcome["message"], outcome
        assert "Attributes" not in put.result()
        assert run.stored(new_key)["val"] == {"N": "2"}, "a late mirror overwrote an acknowledged update"
        assert b.refresh() and b.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == {**item, "val": 2}
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------------------------ case 3
def _without_mirror(run: Run, shim, item: dict, mirror_key: dict) -> None:
    """``shim`` puts ``item``; its authoritative write lands and its mirror never does (it fails
    every attempt: the writer died between its two writes, as far as the other layout knows)."""
    rule = run.proxy.fail(op="PutItem", key=plain(mirror_key), times=None, status=400,
                          code="com.amazonaws.dynamodb.v20120810#ValidationException", message="injected")
    with pytest.raises(errors.AWSError):
        shim.put_item(Item=item)
    run.proxy.remove_rule(rule)


def _layouts_equal(run: Run, item: dict) -> dict:
    old_key, new_key = run.keys(item)
    old, new = run.stored(old_key), run.stored(new_key)
    drop = set(old_key) | {"_rs_new"}
    assert {k: v for k, v in old.items() if k not in drop} == {k: v for k, v in new.items() if k not in drop}
    return new


def test_case3_rollback_after_a_half_written_cutover_write_catches_the_old_layout_up(run):
    """In cutover A's new-layout write lands and every reader sees it; its old-layout mirror never
    lands. Rollback to backfill (``newer_may_be = "new"``): a read returns A's write, an ``ADD``
    builds on it, and its mirror leaves both layouts equal. Before the fix the ``ADD`` was applied
    to the stale old copy and mirrored over A's write (lost)."""
    assert run_job(BACKFILL, run.dynamo, run.store, run.migration.id, FAST).done
    run.switch("cutover", newer_may_be=None)
    a, b = run.shim(), run.shim()
    try:
        item = run.moving(val=1, n=Decimal(10))
        old_key, _ = run.keys(item)
        assert a.phase == "cutover" and b.phase == "cutover"
        _without_mirror(run, a, item, old_key)
        assert run.stored(old_key) is None
        assert b.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == item  # every reader sees it

        run.switch("backfill", newer_may_be="new")  # rollback: a switch, the new layout may be newer
        assert b.refresh() and b.phase == "backfill"
        assert b.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == item
        out = b.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1},
                            ReturnValues="ALL_NEW")
        assert out["Attributes"] == {**item, "n": 11}
        assert b.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == {**item, "n": 11}
        assert _layouts_equal(run, item)["n"] == {"N": "11"}
    finally:
        a.close()
        b.close()


def test_case3_forward_a_backfill_write_without_its_mirror_is_not_lost_by_cutover(run):
    """The forward direction: in backfill A's old-layout write lands, its mirror to the new layout
    never does; the switch to cutover sets ``newer_may_be = "old"``. A cutover read returns A's
    write, an ``ADD`` builds on it, both layouts end equal. Before the fix cutover read the stale
    new copy (A's acknowledged write invisible) and the ``ADD`` overwrote it."""
    a, b = run.shim(), run.shim()
    try:
        first = run.moving(val=1, n=Decimal(10))
        a.put_item(Item=first)  # both layouts
        assert run_job(BACKFILL, run.dynamo, run.store, run.migration.id, FAST).done
        item = {**first, "val": 2, "n": Decimal(20)}
        _without_mirror(run, a, item, run.keys(item)[1])
        assert run.stored(run.keys(item)[1])["val"] == {"N": "1"}  # the new layout is behind

        run.switch("cutover", newer_may_be="old")
        assert b.refresh() and b.phase == "cutover"
        assert b.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == item
        got = b.query(Key={"sensor_id": "s-1"}, ConsistentRead=True)["Items"]
        assert got == [item]
        out = b.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1},
                            ReturnValues="ALL_NEW")
        assert out["Attributes"] == {**item, "n": 21}
        assert _layouts_equal(run, item)["n"] == {"N": "21"}
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------------------------ case 4
@pytest.mark.parametrize("phase", ["cutover", "complete"])
def test_case4_a_lost_answer_is_recognised_as_the_writers_own_landed_attempt(run, phase):
    """The proxy applies a create-if-absent put and an ``ADD`` update, then loses each answer;
    ``Dynamo.call`` retries. The retry meets the writer's own landed attempt (stored ``_rs_v`` ==
    its version): the app gets success, the mirror is written (cutover), the ``ADD`` is applied
    once. Before the fix the put's retry read as another writer's newer write
    (ConditionalCheckFailed, no mirror) and the ``ADD`` was applied twice."""
    assert run_job(BACKFILL, run.dynamo, run.store, run.migration.id, FAST).done
    run.switch("cutover", newer_may_be=None)
    if phase == "complete":
        run.move("cleanup")
        run.move("complete")
    t = run.shim()
    try:
        assert t.phase == phase
        item = run.moving(val=1, n=Decimal(10))
        old_key, new_key = run.keys(item)
        run.proxy.lose_answer(op="PutItem", key=plain(new_key))
        out = t.put_item(Item=item, ConditionExpression="attribute_not_exists(sensor_id)")
        assert "Attributes" not in out
        assert run.proxy.stats()["rule_lose_answer"] == 1
        if phase == "cutover":
            assert run.stored(old_key)[VERSION_ATTR] == run.stored(new_key)[VERSION_ATTR], "the mirror was written"

        run.proxy.lose_answer(op="UpdateItem", key=plain(new_key))
        out = t.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1},
                            ReturnValues="UPDATED_NEW")
        assert out["Attributes"] == {"n": 11}
        assert run.proxy.stats()["rule_lose_answer"] == 2
        assert t.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == {**item, "n": 11}, "ADD applied twice"
        if phase == "cutover":
            assert _layouts_equal(run, item)["n"] == {"N": "11"}

        # Old values were only in the lost answer: a clear error, after the write completed.
        run.proxy.lose_answer(op="UpdateItem", key=plain(new_key))
        with pytest.raises(shim_errors.OldValuesUnknown) as e:
            t.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1},
                          ReturnValues="ALL_OLD")
        assert e.value.response["Error"]["Code"] == "ReshardOldValuesUnknown" and e.value.landed
        assert t.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == {**item, "n": 12}
        if phase == "cutover":
            assert _layouts_equal(run, item)["n"] == {"N": "12"}
    finally:
        t.close()


# ----------------------------------------------------------------------- a frozen shim's request
def _steady(proxy, name: str) -> Run:
    """No migration registered for the table (its control table exists): a steady-state shim."""
    from reshard.control.store import ControlStore
    from tests.late_support import client
    from tests.shim_helpers import create_table, migration
    dynamo = client(proxy.endpoint)
    m = migration("sensor", table=name)
    create_table(dynamo, m)
    store = ControlStore(dynamo, f"{name}-ctl")
    store.ensure_table()
    from reshard.core.layout import KeyMapper
    return Run(proxy, dynamo, m, KeyMapper(m), store, f"{name}-ctl")


@pytest.mark.parametrize("phase", ["steady", "backfill"])
def test_a_request_signed_before_a_freeze_is_refused_after_its_horizon(proxy, unique_name, phase):
    """A thread freezes after its put was dated (the attempt's horizon chosen) and before it is on
    the wire; the server's clock passes the horizon (H + 1 s; a steady shim's H is
    STEADY_HORIZON_SECONDS); the thread resumes and sends it: DynamoDB (the proxy) refuses it, it
    never lands, the app gets ShimUnavailable. Before the fix it landed whenever it arrived."""
    from reshard.core.deadlines import STEADY_HORIZON_SECONDS
    run = Run.start(proxy, unique_name) if phase == "backfill" else _steady(proxy, unique_name)
    horizon = H if phase == "backfill" else STEADY_HORIZON_SECONDS
    t = run.shim()
    try:
        assert t.phase == phase
        item = run.moving(val=1)
        old_key, new_key = run.keys(item)
        frozen, thaw = threading.Event(), threading.Event()
        lean = t.dynamo._lean
        send = lean.send

        def freezing_send(operation, kwargs):
            if operation == "put_item" and all(kwargs["Item"].get(k) == v for k, v in old_key.items()):
                frozen.set()
                thaw.wait(30)
            return send(operation, kwargs)
        lean.send = freezing_send
        put = Background(lambda: t.put_item(Item=item))
        assert frozen.wait(30)
        proxy.advance_clock(horizon + 1)
        thaw.set()
        with pytest.raises(errors.ShimUnavailable, match="refused a put_item that had to land by"):
            put.result()
        assert run.stored(old_key) is None and run.stored(new_key) is None, "a frozen shim's request landed"
        assert proxy.stats()["refused_signature"] == 1
        # The shim is not stuck: its next refresh dates a new fact, and requests go on.
        assert t.refresh()
        t.put_item(Item=item)
        assert t.get_item(Key=key_of(item), ConsistentRead=True)["Item"] == item
    finally:
        t.close()


@pytest.mark.parametrize("op", ["PutItem", "UpdateItem"])
def test_a_request_held_in_the_network_past_its_horizon_never_lands(run, op):
    """The same through the network: the proxy holds a shim's write (its client waits), the
    server's clock passes the horizon, the proxy delivers it: refused, never applied. A put
    takes reshard's lean request path, an update returning values botocore's (its dated signer)."""
    t = run.shim(read_timeout=60)
    try:
        item = run.moving(val=1)
        old_key, new_key = run.keys(item)
        rule = run.proxy.hold(op=op, key=plain(old_key))
        if op == "PutItem":
            put = Background(lambda: t.put_item(Item=item))
        else:
            put = Background(lambda: t.update_item(Key=key_of(item), UpdateExpression="SET val = :v",
                                                   ExpressionAttributeValues={":v": 1}, ReturnValues="ALL_NEW"))
        handle = run.proxy.wait_held(1, rule=rule, timeout=30)[0]["handle"]
        run.proxy.advance_clock(H + 1)
        assert "expired" in run.proxy.release(handle)["message"]
        with pytest.raises(errors.ShimUnavailable):
            put.result()
        assert run.stored(old_key) is None and run.stored(new_key) is None
    finally:
        t.close()


def test_case4_the_sharded_gsi_follow_up_recognises_its_own_landed_attempt(proxy, unique_name):
    """An update moves the item's GSI value to the phase's layout with a follow-up UpdateItem;
    the proxy applies it and loses its answer. The retry's condition (the value as read) fails
    on its own landed attempt: ``ALL_NEW`` still carries the value now stored. Before the fix it
    was taken for a racing write, and the answer carried the old value."""
    from tests.integration.test_shim_sharded_index import create_gsi_table, header, index_migration, new_shard
    from tests.late_support import client
    from tests.shim_helpers import shim
    dynamo = client(proxy.endpoint)
    create_gsi_table(dynamo, unique_name)
    m = index_migration(unique_name)
    shim(m, dynamo).put_item(Item=header("inv-7", "US", 1))
    t = shim(m, dynamo, "backfill")
    proxy.lose_answer(op="UpdateItem", contains="SET #rs_g = :rs_g")
    out = t.update_item(Key={"PK": "inv-7", "SK": "header"}, UpdateExpression="SET amount = :a",
                        ExpressionAttributeValues={":a": 3}, ReturnValues="ALL_NEW")
    assert proxy.stats()["rule_lose_answer"] == 1
    assert out["Attributes"]["gsi_shard"] == new_shard("inv-7") and out["Attributes"]["amount"] == 3
