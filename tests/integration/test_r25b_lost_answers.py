"""r25b: a second outside review of issue 25 after r25's fixes (B2: "an update or a conditional
write whose answer was lost is not sent again blindly"). Forced interleavings on dynalite behind
the fidelity proxy, with the harness of ``test_r25_late_writes.py`` (server deadline enforced,
H = 30 s so real time never expires a request by accident). Each break is
``xfail(strict=True)`` so the suite stays green until fixed."""

from __future__ import annotations

from decimal import Decimal

import pytest

from reshard.core.layout import is_tombstone
from reshard.core.phases import Phase
from tests.integration.test_r25_late_writes import _run, _to, proxy  # noqa: F401 - the fixture
from tests.late_support import Background, key_of, plain


def deleted(stored: dict | None) -> bool:
    """The physical item is gone or a tombstone (every migration phase deletes with one since
    issue 25's last cases: the shim reads it as absent)."""
    return stored is None or is_tombstone(stored)


# ------------------------------------------------------------------ 1. a conditional plain delete
@pytest.mark.parametrize("phase", ["cleanup", "complete"])
def test_r25b_a_lost_answer_of_a_conditional_delete_fails_a_landed_delete(proxy, unique_name, phase):
    """``cleanup``/``complete`` (stamping phases, no tombstones): the shim's delete is a plain
    DeleteItem carrying the application's condition. Its first attempt lands (the item is gone),
    the answer is lost, and ``Dynamo.call`` sends it again (RETRY_UNKNOWN is only cleared for
    writes that go through ``_authoritative``): the retry meets the absent item, fails the
    application's own condition and the application hears ConditionalCheckFailed -- "your
    delete did not happen" -- for a delete that landed. docs/late-writes.md promises "never a
    ConditionalCheckFailed for a write that landed" for every write with an application
    condition in a stamping phase, and excludes only a *plain* delete as "idempotent in
    effect": a conditional one is not. (With another writer's put between the attempt and the
    retry, the retry deletes that acknowledged put instead: a lost write, guarantee 1.)
    Since these phases delete with a tombstone (a fenced PutItem), the lost answer is the
    tombstone's: one consistent read recognises its own landed attempt."""
    from botocore.exceptions import ClientError

    run = _run(proxy, unique_name)
    _to(run, phase)
    a = run.shim(read_timeout=60)
    try:
        assert a.phase == phase
        item = run.moving(val=1, n=Decimal(10))
        a.put_item(Item=item)
        _, new_key = run.keys(item)
        assert run.stored(new_key) is not None
        rule = proxy.lose_answer(op=["DeleteItem", "PutItem"], key=plain(new_key))  # PutItem: the delete's tombstone
        try:
            a.delete_item(Key=key_of(item), ConditionExpression="attribute_exists(sensor_id)")
            outcome = "acknowledged"
        except ClientError as e:
            outcome = e.response["Error"]["Code"]
        assert next(r for r in proxy.rules() if r["id"] == rule)["applied"] == 1, "the delete's answer was lost"
        assert deleted(run.stored(new_key)), "the delete landed"
        assert outcome in ("acknowledged", "ReshardOutcomeUnknown"), \
            f"a delete that landed answered {outcome} (\"not applied\")"
    finally:
        a.close()


# ------------------------------------------------------------------ 2. "no version stored: not landed"
def test_r25b_a_lost_answer_in_cutover_resent_after_a_cleanup_shims_delete(proxy, unique_name):
    """The B2 fix decides a lost answer in a fenced phase by one consistent read, and takes "no
    item (or an older version) stored" for "not landed: send it again under the same
    version", on the premise that "a landed attempt is only ever replaced by a newer version".
    Right after ``cutover -> cleanup`` a cleanup-phase shim (adjacent phase, allowed to coexist)
    deletes with a plain, unversioned DeleteItem. So: shim A (still ``cutover``) sends
    ``ADD n 1``: it lands (n = 11), its answer is lost; shim B (``cleanup``) deletes the item
    (acknowledged); A's read finds nothing and sends the ADD again: the item B deleted comes
    back as ``{n: 1}`` -- the ADD applied twice (n = 11 was stored, then 1) and an item deleted
    through the shim resurrected by a write that had already landed before the delete.
    Guarantees 1/2 through 5b ("an answer lost and its request retried")."""
    run = _run(proxy, unique_name)
    _to(run, "cutover")
    a = run.shim(read_timeout=60)
    try:
        assert a.phase == "cutover"
        item = run.moving(val=1, n=Decimal(10))
        a.put_item(Item=item)
        _, new_key = run.keys(item)
        # cutover -> cleanup: B is a shim of the new phase; A has not refreshed yet (the
        # adjacent-phase mix every transition allows until the old phase's facts expire).
        run.store.set_phase(run.store.load_state(run.migration.id), Phase("cleanup"), "test", "test")
        b = run.shim()
        try:
            assert b.phase == "cleanup" and a.phase == "cutover"
            proxy.lose_answer(op="UpdateItem", key=plain(new_key))
            read_rule = proxy.hold(op="GetItem", key=plain(new_key))
            add = Background(lambda: a.update_item(Key=key_of(item), UpdateExpression="ADD n :one",
                                                   ExpressionAttributeValues={":one": 1}))
            read = proxy.wait_held(1, rule=read_rule, timeout=30)[0]["handle"]
            proxy.remove_rule(read_rule)
            assert run.stored(new_key)["n"] == {"N": "11"}, "A's first attempt landed"
            b.delete_item(Key=key_of(item))  # acknowledged
            assert deleted(run.stored(new_key))
            proxy.release(read)
            try:
                add.result()
            except Exception:  # noqa: BLE001 - ReshardOutcomeUnknown would be a right answer
                pass
            got = b.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
            assert got is None, f"the item B deleted came back after A's landed ADD was sent again: {got}"
        finally:
            b.close()
    finally:
        a.close()


# ------------------------------------------------------------------ 3. the resend's fence loss
def test_r25b_a_resent_add_loses_its_fence_to_a_writer_after_the_first_attempt_landed(proxy, unique_name):
    """``cutover`` (fenced). A's ``ADD n 1`` (attempt 1, version v) is held by the network and A's
    connection is closed (it may land later: the fault model's "a request that lands at any
    later time"). A's one consistent read finds the older stored version: "not landed", so A
    sends it again under v (attempt 2), and attempt 2 is held a moment. Attempt 1 is delivered:
    n = 11 under v. B's ``SET val = 2`` lands (version w > v, acknowledged). Attempt 2 arrives
    and fails the fence; the shim's ConditionalCheckFailed path reads w (not its own v), takes it
    for an ordinary fence loss ("another writer is ahead: go above it") and sends the ADD again
    under a newer version: n = 12. The B2 fix covers a lost answer's *first* resend decision
    only; the ConditionalCheckFailed branch forgets that an earlier attempt of this write may
    have landed. Guarantee 1 through 5b (no order of the two acknowledged writes gives 12)."""
    from botocore.exceptions import ClientError

    run = _run(proxy, unique_name)
    _to(run, "cutover")
    a, b = run.shim(read_timeout=60), run.shim()
    try:
        assert a.phase == "cutover" and b.phase == "cutover"
        item = run.moving(val=1, n=Decimal(10))
        a.put_item(Item=item)
        _, new_key = run.keys(item)
        first_rule = proxy.hold(op="UpdateItem", key=plain(new_key), mode="lose")
        read_rule = proxy.hold(op="GetItem", key=plain(new_key))
        add = Background(lambda: a.update_item(Key=key_of(item), UpdateExpression="ADD n :one",
                                               ExpressionAttributeValues={":one": 1}))
        first = proxy.wait_held(1, rule=first_rule, timeout=30)[0]["handle"]
        read = proxy.wait_held(1, rule=read_rule, timeout=30)[0]["handle"]
        proxy.remove_rule(read_rule)
        second_rule = proxy.hold(op="UpdateItem", key=plain(new_key))
        proxy.release(read)  # the decision read: the put's older version, so "not landed"
        second = proxy.wait_held(1, rule=second_rule, timeout=30)[0]["handle"]
        proxy.remove_rule(second_rule)
        out = proxy.release(first)
        assert out["status"] == 200, out
        assert run.stored(new_key)["n"] == {"N": "11"}, "attempt 1 landed"
        b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 2})
        proxy.release(second)
        try:
            add.result()
        except ClientError as e:  # ReshardOutcomeUnknown would be a right answer
            assert e.response["Error"]["Code"] == "ReshardOutcomeUnknown", e.response["Error"]
        got = b.get_item(Key=key_of(item), ConsistentRead=True)["Item"]
        assert got["val"] == 2
        assert got["n"] == 11, "one ADD was applied twice"
    finally:
        a.close()
        b.close()


def test_r25b_a_resent_create_fails_on_its_own_late_first_attempt(proxy, unique_name):
    """The interleaving of the test above with ``put_item(..., attribute_not_exists)`` (r25's
    ``..._fails_a_landed_put``, reached through a late first attempt instead of a lost answer):
    attempt 1 held, the decision read finds no item ("not landed"), attempt 2 held; attempt 1
    lands (A's item created); B's put lands; attempt 2 fails the fence; the shim goes above B
    with a new version, the application's condition now fails on A's own first effect, and A
    hears ConditionalCheckFailed -- "not applied" -- for a create that landed."""
    from botocore.exceptions import ClientError

    run = _run(proxy, unique_name)
    _to(run, "cutover")
    a, b = run.shim(read_timeout=60), run.shim()
    try:
        item = run.moving(val=1)
        _, new_key = run.keys(item)
        first_rule = proxy.hold(op="PutItem", key=plain(new_key), mode="lose")
        read_rule = proxy.hold(op="GetItem", key=plain(new_key))
        put = Background(lambda: a.put_item(Item=item, ConditionExpression="attribute_not_exists(sensor_id)"))
        first = proxy.wait_held(1, rule=first_rule, timeout=30)[0]["handle"]
        read = proxy.wait_held(1, rule=read_rule, timeout=30)[0]["handle"]
        proxy.remove_rule(read_rule)
        second_rule = proxy.hold(op="PutItem", key=plain(new_key))
        proxy.release(read)  # no item: proves nothing (fixed: not sent again, the outcome is unknown)
        try:
            second = proxy.wait_held(1, rule=second_rule, timeout=5)[0]["handle"]
        except TimeoutError:
            second = None
        proxy.remove_rule(second_rule)
        if second is None:
            proxy.release(first)
            with pytest.raises(ClientError) as e:
                put.result()
            assert e.value.response["Error"]["Code"] == "ReshardOutcomeUnknown"
            return
        assert proxy.release(first)["status"] == 200
        assert run.stored(new_key)["val"] == {"N": "1"}, "A's attempt 1 created the item"
        b.put_item(Item={**item, "val": 2})
        proxy.release(second)
        try:
            put.result()
            outcome = "acknowledged"
        except ClientError as e:
            outcome = e.response["Error"]["Code"]
        assert outcome in ("acknowledged", "ReshardOutcomeUnknown"), \
            f"a create that landed answered {outcome} (\"not applied\")"
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ 4. a duplicate after another writer
@pytest.mark.parametrize("phase", ["cleanup", "complete"])
@pytest.mark.parametrize("op", ["add", "put", "delete"])
def test_r25b_a_duplicate_delivered_after_another_writer_applies_again(proxy, unique_name, phase, op):
    """``cleanup``/``complete`` fence nothing: a write's only guard against its own duplicate is
    ``_rs_v <> :v`` (a put/update), or nothing (a plain delete). That guard compares with the
    *latest* stored version only. A's write lands and is acknowledged; the network keeps a copy
    (``duplicate(copy="hold")``: the fault model's "a request that lands ... twice"). B's write of
    the same item lands and is acknowledged *after* A's. The copy is delivered, well inside its
    horizon (no strip has run, nothing waits): B's version is not A's, so it passes and A's
    write is applied a second time, after B's: ``ADD`` twice (n = 12), A's put undoing B's later
    acknowledged put, A's delete removing B's later acknowledged put. Guarantee 1 (the item no
    longer equals its last acknowledged write) through 5b. r25's B1 fix (strip waits H + 2 s)
    and B2 fix (no blind resend) cover neither: this copy is not a retry and no strip ran."""
    run = _run(proxy, unique_name)
    _to(run, phase)
    a, b = run.shim(), run.shim()
    try:
        assert a.phase == phase and b.phase == phase
        item = run.moving(val=1, n=Decimal(10))
        _, new_key = run.keys(item)
        b.put_item(Item=item)
        if op == "add":
            rule = proxy.duplicate(op="UpdateItem", key=plain(new_key), copy="hold")
            a.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1})
            copy = proxy.held(rule=rule)[0]["handle"]
            b.update_item(Key=key_of(item), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 2})
            expected = {**item, "val": 2, "n": 11}
        elif op == "put":
            rule = proxy.duplicate(op="PutItem", key=plain(new_key), copy="hold")
            a.put_item(Item={**item, "val": 3})
            copy = proxy.held(rule=rule)[0]["handle"]
            b.put_item(Item={**item, "val": 2})
            expected = {**item, "val": 2}
        else:
            rule = proxy.duplicate(op=["DeleteItem", "PutItem"], key=plain(new_key), copy="hold")  # or its tombstone
            a.delete_item(Key=key_of(item))
            copy = proxy.held(rule=rule)[0]["handle"]
            b.put_item(Item={**item, "val": 2})
            expected = {**item, "val": 2}
        assert b.get_item(Key=key_of(item), ConsistentRead=True).get("Item") == expected  # B's write acknowledged
        outcome = proxy.release(copy)
        got = b.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
        assert got == expected, f"A's {op} was applied again after B's acknowledged write ({outcome['status']}): {got}"
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ 5. a fenced write's duplicate after a plain delete
@pytest.mark.parametrize("op", ["put", "add"])
def test_r25b_a_cutover_duplicate_resurrects_what_a_cleanup_shim_deleted(proxy, unique_name, op):
    """Right after ``cutover -> cleanup`` (the adjacent-phase mix every transition allows):
    shim A (still ``cutover``, fenced) writes the item and is acknowledged; the network keeps a
    copy of A's request. Shim B (``cleanup``) deletes the item with a plain DeleteItem and is
    acknowledged. The copy is delivered inside its horizon: its fence is
    ``attribute_not_exists(_rs_v) OR _rs_v < :v``, and an item a plain delete removed has no
    ``_rs_v``: it passes, and the item B deleted after A's write comes back (a put: A's item;
    an ``ADD``: ``{n: 1}``). Guarantee 2 (an item deleted through the shim never comes back)
    through 5b. Cleanup's delete leaves no version behind for the fenced phase next to it to
    compare with (a tombstone until the previous phase's requests expired would)."""
    run = _run(proxy, unique_name)
    _to(run, "cutover")
    a = run.shim()
    try:
        item = run.moving(val=1, n=Decimal(10))
        _, new_key = run.keys(item)
        a.put_item(Item=item)
        run.store.set_phase(run.store.load_state(run.migration.id), Phase("cleanup"), "test", "test")
        b = run.shim()
        try:
            assert a.phase == "cutover" and b.phase == "cleanup"
            if op == "put":
                rule = proxy.duplicate(op="PutItem", key=plain(new_key), copy="hold")
                a.put_item(Item={**item, "val": 3})
            else:
                rule = proxy.duplicate(op="UpdateItem", key=plain(new_key), copy="hold")
                a.update_item(Key=key_of(item), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1})
            copy = proxy.held(rule=rule)[0]["handle"]
            b.delete_item(Key=key_of(item))  # acknowledged, after A's write was
            assert b.get_item(Key=key_of(item), ConsistentRead=True).get("Item") is None
            outcome = proxy.release(copy)
            got = b.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
            assert got is None, f"the item B deleted came back ({outcome['status']}): {got}"
        finally:
            b.close()
    finally:
        a.close()
