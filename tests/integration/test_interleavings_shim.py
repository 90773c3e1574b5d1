"""Issue 12, shim side: forced interleavings against dynalite.

Each test pins the exact moment that broke a guarantee (cases 4, 5, 8, 9, 10 and the
tombstone-vs-app-condition case of point 12) and fails on the shim before the fix.
"""

from __future__ import annotations

import dataclasses
import time

import botocore.exceptions
import pytest

from reshard import errors
from reshard.aws.dynamo import to_wire
from reshard.control import fleet
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core.layout import NEW_COPY_ATTR, TOMBSTONE_ATTR, VERSION_ATTR, hash_shard
from reshard.core.phases import Action
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.cleanup import CLEANUP
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.verify import VERIFY
from reshard.shim.table import ShardedTable
from tests.backfill_support import setup_migration
from tests.shim_helpers import create_table as _create_table
from tests.shim_helpers import migration, scan, shim

FAST = dict(segments=2, workers=1, page_size=50)


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def create_table(dynamo, m) -> None:
    """Create the data table and wait (bounded) until dynalite serves it: right after
    CreateTable it can still answer ResourceNotFound for a moment."""
    _create_table(dynamo, m)
    deadline = time.monotonic() + 5
    while dynamo.call("describe_table", TableName=m.table)["Table"]["TableStatus"] != "ACTIVE":
        assert time.monotonic() < deadline, "table not ACTIVE after 5 s"
        time.sleep(0.01)


def ev(k: int, **extra) -> dict:
    return {"sensor_id": "s-1", "event_id": f"e-{k}", "ts": f"2024-10-27T15:{k:02d}:00Z", **extra}


def key(k: int) -> dict:
    return dict(ev(k))


def verify(dynamo, store, m):
    return run_job(VERIFY, dynamo, store, m.id, JobOptions(**FAST, rechecks=2, recheck_pause=0.0),
                   sleep=lambda s: None)


# ----------------------------------------------------------------------------- case 4
def test_case4_cutover_put_whose_new_key_is_its_old_key_stays_an_old_item(dynalite, unique_name):
    """A brand-new invoice put in cutover whose new key equals the old key derived for it is
    one physical item serving both layouts: unmarked, so after a rollback verify sees it as
    the old item it is (before the fix it was marked `_rs_new`, verify called it `extra`, and
    --repair deleted the acknowledged write)."""
    ctl = f"{unique_name}-ctl"
    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=ctl)
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**FAST)).done
    assert verify(dynalite, store, m).passed
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # -> cutover (no shim yet: acknowledged at once)
    # Refreshing often: the rollback below is a switch, which waits for this shim to acknowledge.
    t = ShardedTable(m, dynalite, control_table=ctl, refresh_seconds=0.2)
    try:
        assert t.phase == "cutover"
        # An invoice line whose new key (md5 over 20 shards) equals the old shard the shim
        # derives for a brand-new item (its identity hashed over 10 shards): ~5 % of puts.
        for i in range(400):
            item = {"invoice_number": str(200000 + i), "line": "1"}
            fields = t._fields(to_wire(item))
            derived_old = mapper.old.key(fields, hash_shard(t._identity_text(fields), mapper.old.shards))
            if mapper.new.key(fields) == derived_old:
                break
        else:
            pytest.fail("no colliding invoice in 400 tries")
        t.put_item(Item={**item, "amount": 7})
        stored = [i for i in scan(dynalite, m.table) if i.get("invoice_number") == {"S": item["invoice_number"]}]
        assert len(stored) == 1, stored
        assert NEW_COPY_ATTR not in stored[0], "the only copy of an acknowledged write is marked as a new copy"

        transition(store, m.id, Action.ROLLBACK, allow_no_shims=True)  # -> backfill; the shim acknowledged cutover
        assert t.refresh() and t.phase == "backfill"
        result = verify(dynalite, store, m)
        assert result.passed and not result.differences.get("extra"), result.differences
        assert t.get_item(Key=item, ConsistentRead=True).get("Item") == {**item, "amount": 7}
    finally:
        t.close()


# ----------------------------------------------------------------------------- case 5
@pytest.mark.parametrize("phase", [None, "cleanup", "complete"])
def test_case5_update_removes_a_leftover_tombstone(dynalite, unique_name, phase):
    """A `planned` (or aborted) shim deletes: a tombstone. A not-yet-refreshed steady (or
    cleanup/complete) shim then updates the key: the update is acknowledged, so it must be
    visible (before the fix `_rs_del` stayed and the item read as None for good)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    old_phase = "planned" if phase is None else "cutover"  # the phase whose delete leaves a tombstone
    deleter, updater = shim(m, dynalite, old_phase), shim(m, dynalite, phase)
    deleter.put_item(Item=ev(1, val=1))
    deleter.delete_item(Key=key(1))
    assert any(TOMBSTONE_ATTR in i for i in scan(dynalite, m.table))
    out = updater.update_item(Key=key(1), UpdateExpression="SET val = :t", ExpressionAttributeValues={":t": 5},
                              ReturnValues="ALL_OLD")
    assert "Attributes" not in out  # the old item was a tombstone: nothing, as for an absent item
    assert updater.get_item(Key=key(1), ConsistentRead=True).get("Item") == ev(1, val=5)
    out = updater.update_item(Key=key(1), UpdateExpression="SET val = :t", ExpressionAttributeValues={":t": 6},
                              ReturnValues="ALL_NEW")
    assert out["Attributes"] == ev(1, val=6)


# ------------------------------------------------------------------- point 12: app conditions
@pytest.mark.parametrize("phase", [None, "planned", "backfill", "cutover"])
def test_tombstone_is_absent_for_the_apps_own_conditions(dynalite, unique_name, phase):
    """After a delete (a tombstone in fenced phases, or one left behind in steady state), the
    app's conditions on key fields see an absent item: `attribute_not_exists(sensor_id)` holds
    (create-if-absent), `attribute_exists(sensor_id)` fails (update-if-present)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    deleter = shim(m, dynalite, phase or "planned")  # leaves a tombstone
    t = shim(m, dynalite, phase)
    deleter.put_item(Item=ev(2, val=1))
    deleter.delete_item(Key=key(2))
    assert any(TOMBSTONE_ATTR in i for i in scan(dynalite, m.table))

    # update-if-present: the item is absent, so the condition fails and nothing is revived.
    with pytest.raises(errors.ConditionalCheckFailed):
        t.update_item(Key=key(2), UpdateExpression="SET val = :t", ExpressionAttributeValues={":t": 9},
                      ConditionExpression="attribute_exists(sensor_id)")
    with pytest.raises(errors.ConditionalCheckFailed):
        t.delete_item(Key=key(2), ConditionExpression="attribute_exists(#e) AND event_id = :e",
                      ExpressionAttributeNames={"#e": "event_id"}, ExpressionAttributeValues={":e": "e-2"})
    assert t.get_item(Key=key(2), ConsistentRead=True).get("Item") is None
    # create-if-absent: holds on the tombstone.
    t.put_item(Item=ev(2, val=3), ConditionExpression="attribute_not_exists(sensor_id)")
    assert t.get_item(Key=key(2), ConsistentRead=True).get("Item") == ev(2, val=3)
    # ...and fails on the live item, as DynamoDB's would.
    with pytest.raises(errors.ConditionalCheckFailed):
        t.put_item(Item=ev(2, val=4), ConditionExpression="attribute_not_exists(sensor_id)")
    t.update_item(Key=key(2), UpdateExpression="SET val = :t", ExpressionAttributeValues={":t": 8},
                  ConditionExpression="attribute_exists(sensor_id)")
    assert t.get_item(Key=key(2), ConsistentRead=True).get("Item") == ev(2, val=8)


# ----------------------------------------------------------------------------- case 8
def _fail_closed_setup(dynalite, unique_name, advance_to: int):
    ctl = f"{unique_name}-ctl"
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=ctl)
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**FAST)).done
    assert verify(dynalite, store, m).passed
    for step in range(advance_to):
        if step == 1:  # cutover -> cleanup needs the catch-up verify after the switch
            assert verify(dynalite, store, m).passed
        if step == 2:  # cleanup -> complete needs the cleanup pass
            assert run_job(CLEANUP, dynalite, store, m.id, JobOptions(**FAST, delete=True)).done
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    clock = FakeClock()
    t = ShardedTable(m, dynalite, control_table=ctl, refresh_seconds=3600, liveness_seconds=30, clock=clock)
    return m, mapper, store, t, clock


@pytest.mark.parametrize("loss", ["meta_row", "control_table"])
def test_case8_a_shim_that_saw_the_migration_never_falls_back_to_steady(dynalite, unique_name, loss):
    """The shim saw `complete`; then the META row (or the whole control table) disappears.
    It keeps routing to the new layout within the liveness window and then refuses; it never
    writes the old layout (before the fix it went `steady` at once and wrote old keys)."""
    m, mapper, store, t, clock = _fail_closed_setup(dynalite, unique_name, advance_to=3)  # -> complete
    try:
        assert t.phase == "complete"
        if loss == "meta_row":
            store.delete(store.mpk(m.id), "META")
        else:
            dynalite.call("delete_table", TableName=store.table)
        clock.t += 10
        assert not t.refresh()
        assert t.phase == "complete"
        t.put_item(Item=ev(3, val=1))
        new_key = mapper.new.key(t._fields(to_wire(ev(3))))
        old_key = mapper.old.key(t._fields(to_wire(ev(3))))
        stored = {(i["PK"]["S"], i["SK"]["S"]) for i in scan(dynalite, m.table)}
        assert (new_key["PK"]["S"], new_key["SK"]["S"]) in stored
        if old_key != new_key:
            assert (old_key["PK"]["S"], old_key["SK"]["S"]) not in stored
        clock.t += 25  # past the liveness window since the last good refresh
        assert not t.refresh()
        with pytest.raises(errors.ShimUnavailable):
            t.put_item(Item=ev(4))
        with pytest.raises(errors.ShimUnavailable):
            t.get_item(Key=key(3)).get("Item")
    finally:
        t.close()


def test_case8_a_shim_that_never_saw_a_migration_is_steady(dynalite, unique_name):
    """Deployed before `reshard start`: no META row means steady, and stays so."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    ControlStore(dynalite, f"{unique_name}-ctl").ensure_table()
    with ShardedTable(m, dynalite, control_table=f"{unique_name}-ctl", refresh_seconds=3600) as t:
        assert t.phase == "steady" and t.refresh() and t.phase == "steady"
        t.put_item(Item=ev(5))
        assert t.get_item(Key=key(5)).get("Item") == ev(5)


def test_case7_a_shim_refuses_a_table_locked_by_another_active_migration(dynalite, unique_name):
    """Migration A completed and released the table; migration B starts on it. A shim still
    running A's file must refuse (naming B and its file) instead of writing B's old layout
    unfenced."""
    m, mapper, store, t, clock = _fail_closed_setup(dynalite, unique_name, advance_to=3)  # A -> complete
    try:
        assert t.phase == "complete"
        t.put_item(Item=ev(6))
        store.release_table(m.table, m.id)
        other = dataclasses.replace(m, id=f"{m.id}-second", path="migrations/0004_second.toml")
        store.register(other)
        clock.t += 1
        assert not t.refresh()
        with pytest.raises(errors.ShimUnavailable, match=r"another migration .*-second.*0004_second\.toml"):
            t.put_item(Item=ev(7))
        with pytest.raises(errors.ShimUnavailable, match="-second"):
            t.get_item(Key=key(6)).get("Item")
        # B finishes (or is retired): A's shim may serve again.
        state = store.load_state(other.id)
        store.update(store.mpk(other.id), "META", "SET phase = :c", values={":c": {"S": "complete"}})
        assert state.active
        clock.t += 1
        assert t.refresh()
        assert t.get_item(Key=key(6)).get("Item") == ev(6)
    finally:
        t.close()


def test_case7_the_census_of_a_second_migration_counts_the_first_ones_shims(dynalite, unique_name):
    """Migration B starts on a table whose fleet still runs A's file: B's census counts those
    shims as lagging (they write A's layouts), so B cannot move until they are redeployed
    (before the fix B counted only its own heartbeats: zero lagging, transition allowed)."""
    m, mapper, store, t, clock = _fail_closed_setup(dynalite, unique_name, advance_to=3)  # A -> complete
    try:
        store.release_table(m.table, m.id)
        other = dataclasses.replace(m, id=f"{m.id}-second", path="migrations/0004_second.toml")
        store.register(other)
        with pytest.raises(errors.RefusedTransition, match=rf"runs migration '{m.id}'"):
            transition(store, other.id, Action.ADVANCE)
        t.close()  # A's instance shuts down cleanly: its heartbeat leaves the census
        with pytest.raises(errors.RefusedTransition, match="no live shim reports for this table"):
            transition(store, other.id, Action.ADVANCE)
    finally:
        t.close()


# ----------------------------------------------------------------------------- case 9
def test_case9_query_page_skips_a_copy_that_landed_behind_a_lagging_partition(dynalite, unique_name):
    """dual_read query. Page 1 ends on item A, read through the old layout. A's new-layout
    partition P holds a later item B (written by a dual_write shim) that page 1 did not reach,
    so P's saved position lags A. Between pages (the query frozen there) the backfill copies A
    into P. Page 2 must not return A again (before the fix P was re-read from its start: A
    came back on two pages, out of order)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    reader = shim(m, dynalite, "dual_read")
    mapper = reader.mapper
    n = 40

    def keys(k):
        f = mapper.logical_fields(to_wire(ev(k)))
        return mapper.old.key(f), mapper.new.key(f)

    moved = [k for k in range(1, n + 1) if keys(k)[0] != keys(k)[1]]
    a, b = next((a, b) for a in moved for b in moved if a < b and keys(a)[1]["PK"] == keys(b)[1]["PK"])
    planned, dual = shim(m, dynalite, "planned"), shim(m, dynalite, "dual_write")
    for k in range(1, n + 1):
        (dual if k == b else planned).put_item(Item=ev(k))  # only B has a new copy yet
    page1 = reader.query(Key={"sensor_id": "s-1"}, Limit=a, ConsistentRead=True)
    assert [i["event_id"] for i in page1["Items"]] == [f"e-{k}" for k in range(1, a + 1)]
    # Frozen between pages: the backfill copies every old item up to A into the new layout.
    stored = {i["SK"]["S"]: i for i in scan(dynalite, m.table) if NEW_COPY_ATTR not in i}
    for k in range(1, a + 1):
        new_item, did_move = mapper.remap(stored[ev(k)["ts"]])
        if did_move:
            dynalite.call("put_item", TableName=m.table, Item=new_item)
    seen = [i["event_id"] for i in page1["Items"]]
    token = page1.get("LastEvaluatedKey")
    for _ in range(n):
        if not token:
            break
        page = reader.query(Key={"sensor_id": "s-1"}, Limit=7, ConsistentRead=True, ExclusiveStartKey=token)
        seen += [i["event_id"] for i in page["Items"]]
        token = page.get("LastEvaluatedKey")
    assert seen == [f"e-{k}" for k in range(1, n + 1)], (a, b, seen)


# ----------------------------------------------------------------------------- case 10
def test_case10_put_too_large_for_the_new_layout_writes_nothing(dynalite, unique_name):
    """An item that fits the old layout but not the new one (marker + longer key): refused
    before the authoritative write, with a ValidationException ClientError, nothing stored
    (before the fix the old write committed and the mirror write raised)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, "dual_write")
    # Find an event that moves (old key != new key) so the new copy carries the marker.
    for k in range(1, 50):
        f = t._fields(to_wire(ev(k)))
        if t.mapper.old.key(f) != t.mapper.new.key(f):
            break
    probe = to_wire(ev(k, blob="x"))
    probe.update(t.mapper.old.key(t._fields(probe)))
    probe[VERSION_ATTR] = {"S": "0" * 13 + ".000000." + t.versions.writer_id}
    from reshard.core.layout import MAX_ITEM_BYTES, item_size
    pad = MAX_ITEM_BYTES - item_size(probe) + 1  # exactly fits the old layout, not the marked new copy
    big = ev(k, blob="x" * pad)
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        t.put_item(Item=big)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "400 KB" in str(caught.value) and "new layout" in str(caught.value)
    assert isinstance(caught.value, errors.AWSError) and caught.value.code == "ValidationException"
    assert scan(dynalite, m.table) == []  # nothing written, in either layout
    # The same item fits in steady state (no marker, old layout only).
    shim(m, dynalite, None).put_item(Item=big)
    assert len(scan(dynalite, m.table)) == 1


def test_case8_heartbeat_stops_when_meta_row_is_missing(dynalite, unique_name):
    """A shim that cannot see its migration row stops acknowledging (it does not beat a
    phase it cannot confirm), so the census stops waiting for it only once it refuses."""
    m, mapper, store, t, clock = _fail_closed_setup(dynalite, unique_name, advance_to=0)  # backfill
    try:
        before = {h.instance: h.at for h in fleet.heartbeats(store, m.id)}
        store.delete(store.mpk(m.id), "META")
        clock.t += 1
        assert not t.refresh()
        after = {h.instance: h.at for h in fleet.heartbeats(store, m.id)}
        assert after == before
        assert t.phase == "backfill"
    finally:
        t.close()



# ----------------------------------------------------------------------------- point 12
def test_point12_a_retry_after_the_liveness_window_is_never_sent(dynalite, unique_name):
    """A write passes the liveness check when it begins; its first attempt fails (a dropped
    connection) and the backoff carries the retry past the shim's liveness window, when the
    census may already have dropped this shim. The guard before every attempt refuses the
    retry: nothing lands (before the fix the retry was sent and the write was stored)."""
    m, mapper, store, t, clock = _fail_closed_setup(dynalite, unique_name, advance_to=3)  # -> complete
    attempts = []

    def first_attempt_stalls_then_drops(request, **kwargs):
        attempts.append(request)
        if len(attempts) == 1:
            clock.t += 31  # the process froze past its 30 s liveness window
            raise botocore.exceptions.ConnectionClosedError(endpoint_url=request.url)

    events = dynalite.client.meta.events
    events.register_first("before-send.dynamodb.PutItem", first_attempt_stalls_then_drops)
    try:
        with pytest.raises(errors.ShimUnavailable, match="liveness window"):
            t.put_item(Item=ev(9, val=1))
    finally:
        events.unregister("before-send.dynamodb.PutItem", first_attempt_stalls_then_drops)
        t.close()
    assert len(attempts) == 1  # the retry was never sent
    new_key = mapper.new.key(t._fields(to_wire(ev(9))))
    assert dynalite.call("get_item", TableName=m.table, Key=new_key, ConsistentRead=True).get("Item") is None


# ----------------------------------------------------------------------------- case 5, retire
def test_case5_a_tombstone_written_after_the_abort_pass_is_swept_once_the_fleet_acknowledged(dynalite, unique_name):
    """The abort's cleanup pass retires the migration; a shim that has not refreshed yet is
    still on `aborted` and deletes an item with a tombstone the pass already went by. The
    cleanup then waits for the fleet to acknowledge the retire and sweeps again: no
    tombstone is left (before the fix it stayed, visible to every non-shim reader)."""
    import threading

    from reshard import operations
    ctl = f"{unique_name}-ctl"
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=ctl)  # in backfill
    t = ShardedTable(m, dynalite, control_table=ctl, refresh_seconds=3600, liveness_seconds=120)
    try:
        t.put_item(Item=ev(5, val=1))
        transition(store, m.id, Action.ABORT)  # the shim is live and acknowledged backfill
        assert t.refresh() and t.phase == "aborted"
        old_key = mapper.old.key(t._fields(to_wire(ev(5))))
        late = {}

        def late_shim():
            deadline = time.monotonic() + 60
            while not store.load_state(m.id).retired and time.monotonic() < deadline:
                time.sleep(0.02)
            t.delete_item(Key=key(5))  # still on `aborted`: a tombstone
            late["tombstone"] = dynalite.call("get_item", TableName=m.table, Key=old_key,
                                              ConsistentRead=True).get("Item")
            t.refresh()  # now it acknowledges the retire (steady: plain deletes)

        th = threading.Thread(target=late_shim)
        th.start()
        result = operations.run_data_job("cleanup", dynalite, store, m.id, JobOptions(**FAST, lease_wait=30))
        th.join(60)
        assert late["tombstone"] is not None and TOMBSTONE_ATTR in late["tombstone"]  # the interleaving happened
        assert dynalite.call("get_item", TableName=m.table, Key=old_key, ConsistentRead=True).get("Item") is None
        assert result.finished and result.sweep is not None and result.sweep.finished
        assert t.get_item(Key=key(5)).get("Item") is None
    finally:
        t.close()
