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
from tests.late_support import H, Background, Run, key_of, plain

fidelity = pytest.importorskip("reshard.aws.fidelity", reason="the fidelity proxy (issue 29, step 1) is not merged yet")

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
    server time), shim B deletes the item (a plain delete). A resumes: DynamoDB refuses its mirror
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
        b.delete_item(Key=key_of(item))
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
