"""ShardedTable on moto: routing per phase, versions, tombstones, updates, queries,
random-suffix lookups, the phase cache and liveness."""

from __future__ import annotations

import uuid
from decimal import Decimal

import botocore.exceptions
import pytest

from reshard import errors
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper, hash_shard
from reshard.core.phases import Action, Phase
from reshard.shim import errors as shim_errors
from reshard.shim.table import ShardedTable
from reshard.core.versions import VersionClock
from reshard.control.transition import transition
from reshard.control import fleet
from tests.shim_helpers import by_layout, create_table, migration, scan, shim

FENCED = ["planned", "dual_write", "dual_read", "backfill", "cutover"]
ALL = [None, *FENCED, "cleanup", "complete", "aborted"]


@pytest.fixture
def sensor(moto_dynamo):
    m = migration("sensor", table=f"sensor-{uuid.uuid4().hex[:6]}")
    create_table(moto_dynamo, m)
    return m


def event(i: int, **extra) -> dict:
    return {"sensor_id": "s-1", "event_id": f"e-{i}", "ts": f"2024-10-27T15:{i:02d}:00Z", **extra}


def key_of(item: dict) -> dict:
    return {k: item[k] for k in ("sensor_id", "event_id", "ts")}


def moved_and_unmoved(m) -> tuple[int, int]:
    mapper = KeyMapper(m)
    moved = unmoved = None
    for i in range(100):
        f = mapper.logical_fields(event(i))
        same = mapper.old.key(f) == mapper.new.key(f)
        if same and unmoved is None:
            unmoved = i
        if not same and moved is None:
            moved = i
    return moved, unmoved


def where(dynamo, m, item) -> dict:
    """Which layouts hold a physical item for ``item`` (tombstones included)."""
    mapper = KeyMapper(m)
    ident = mapper.identity(mapper.logical_fields(item))
    layouts = by_layout(mapper, scan(dynamo, m.table))
    return {side: layouts[side].get(ident, []) for side in ("old", "new")}


@pytest.mark.parametrize("phase", ALL)
def test_put_routes_per_phase_and_reads_back(moto_dynamo, sensor, phase):
    t = shim(sensor, moto_dynamo, phase)
    moved, unmoved = moved_and_unmoved(sensor)
    item = event(moved, temp=Decimal("21.5"), tags={"a", "b"}, blob=b"\x00\x01", nested={"x": [1, "y"]})
    t.put_item(Item=item)
    found = where(moto_dynamo, sensor, item)
    writes = {None: {"old"}, "planned": {"old"}, "aborted": {"old"}, "dual_write": {"old", "new"},
              "dual_read": {"old", "new"}, "backfill": {"old", "new"}, "cutover": {"old", "new"},
              "cleanup": {"new"}, "complete": {"new"}}[phase]
    assert {s for s, items in found.items() if items} == writes
    for items in found.values():
        assert len(items) <= 1
        if items:
            assert ("_rs_v" in items[0]) == (phase is not None)  # versions stamped iff a migration is registered
    assert t.get_item(Key=key_of(item), ConsistentRead=True).get("Item") == item  # bookkeeping and keys stripped
    # An unmoved item (old key == new key) is one physical item, written once.
    calls_before = dict(moto_dynamo.stats.calls)
    t.put_item(Item=event(unmoved, temp=Decimal(1)))
    assert moto_dynamo.stats.calls.get("put_item", 0) - calls_before.get("put_item", 0) == 1
    assert t.get_item(Key=key_of(event(unmoved)), ConsistentRead=True).get("Item") == event(unmoved, temp=Decimal(1))


def sensor_new_key(m, item):
    from reshard.aws.dynamo import to_wire
    from reshard.core.layout import KeyMapper
    mapper = KeyMapper(m)
    return mapper.new.key(mapper.logical_fields(to_wire(item)))


@pytest.mark.parametrize("phase", ALL)
def test_delete_tombstones_per_phase(moto_dynamo, sensor, phase):
    t = shim(sensor, moto_dynamo, phase)
    moved, _ = moved_and_unmoved(sensor)
    item = event(moved, temp=Decimal(3))
    t.put_item(Item=item)
    assert t.delete_item(Key=key_of(item), ReturnValues="ALL_OLD")["Attributes"] == item
    assert t.get_item(Key=key_of(item), ConsistentRead=True).get("Item") is None
    found = where(moto_dynamo, sensor, item)
    tombstones = [i for items in found.values() for i in items]
    if phase is None:
        assert tombstones == []  # the steady state: a plain DeleteItem
    else:
        assert tombstones and all(i.get("_rs_del") == {"BOOL": True} for i in tombstones)
        for i in tombstones:  # physical key + logical key fields + bookkeeping only
            assert set(i) - {"_rs_new"} == {"PK", "SK", "sensor_id", "event_id", "ts", "_rs_v", "_rs_del"}
            # the new-layout copy (and only it) carries the new-copy marker
            assert ("_rs_new" in i) == (i["PK"] == sensor_new_key(sensor, item)["PK"])
    assert t.query(Key={"sensor_id": "s-1"}, ConsistentRead=True)["Items"] == []
    # A put after the delete brings it back (the tombstone is replaced, fenced by a newer version).
    t.put_item(Item=item)
    assert t.get_item(Key=key_of(item), ConsistentRead=True).get("Item") == item


@pytest.mark.parametrize("phase", [None, "dual_read", "cutover", "cleanup"])
def test_update_semantics(moto_dynamo, sensor, phase):
    t = shim(sensor, moto_dynamo, phase)
    moved, _ = moved_and_unmoved(sensor)
    item = event(moved, temp=Decimal(20), gone="x", n=Decimal(1))
    t.put_item(Item=item)
    k = key_of(item)
    r = t.update_item(Key=k, UpdateExpression="SET #t = :t REMOVE gone ADD n :one, tags :tags",
                      ExpressionAttributeNames={"#t": "temp"},
                      ExpressionAttributeValues={":t": Decimal(22), ":one": 2, ":tags": {"x"}},
                      ReturnValues="ALL_NEW")
    want = event(moved, temp=Decimal(22), n=Decimal(3), tags={"x"})
    assert r["Attributes"] == want and set(r) == {"Attributes", "ResponseMetadata"}
    assert t.get_item(Key=k, ConsistentRead=True).get("Item") == want
    if phase in ("dual_read", "cutover"):  # the full resulting item reached the other layout
        found = where(moto_dynamo, sensor, item)
        assert found["old"][0]["_rs_v"] == found["new"][0]["_rs_v"]
        assert {x: v for x, v in found["old"][0].items() if x not in ("PK", "_rs_new")} == \
               {x: v for x, v in found["new"][0].items() if x not in ("PK", "_rs_new")}
    # The app's own condition failing surfaces as ConditionalCheckFailed; nothing changes.
    with pytest.raises(errors.ConditionalCheckFailed):
        t.update_item(Key=k, UpdateExpression="SET #t = :t", ConditionExpression="#t > :big",
                      ExpressionAttributeNames={"#t": "temp"}, ExpressionAttributeValues={":t": 1, ":big": 100})
    assert t.get_item(Key=k, ConsistentRead=True).get("Item") == want
    assert t.update_item(Key=k, UpdateExpression="SET n = :n", ExpressionAttributeValues={":n": 9},
                         ReturnValues="UPDATED_NEW")["Attributes"] == {"n": Decimal(9)}
    # An update of a missing item creates it, with its key fields (a complete item).
    fresh = event(moved + 1)
    t.update_item(Key=key_of(fresh), UpdateExpression="SET v = :v", ExpressionAttributeValues={":v": "new"})
    assert t.get_item(Key=key_of(fresh), ConsistentRead=True).get("Item") == {**fresh, "v": "new"}
    # An update after a delete behaves like one on a missing item.
    t.delete_item(Key=k)
    with pytest.raises(errors.ConditionalCheckFailed):
        t.update_item(Key=k, UpdateExpression="SET v = :v", ConditionExpression="attribute_exists(#t)",
                      ExpressionAttributeNames={"#t": "temp"}, ExpressionAttributeValues={":v": "x"})
    t.update_item(Key=k, UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1})
    assert t.get_item(Key=k, ConsistentRead=True).get("Item") == {**k, "n": Decimal(1)}


def test_bad_input_is_refused(moto_dynamo, sensor):
    t = shim(sensor, moto_dynamo, "dual_read")
    for bad in ({**event(1), "_rs_v": "x"}, {**event(1), "PK": "x"}, {"sensor_id": "s-1"}):
        with pytest.raises(errors.BadInput):
            t.put_item(Item=bad)
    with pytest.raises(errors.BadInput, match="key field"):
        t.update_item(Key=key_of(event(1)), UpdateExpression="SET ts = :x", ExpressionAttributeValues={":x": "y"})
    with pytest.raises(errors.BadInput, match="reserved"):
        t.update_item(Key=key_of(event(1)), UpdateExpression="SET a = :rs_v", ExpressionAttributeValues={":rs_v": 1})
    with pytest.raises(errors.BadInput):
        t.get_item(Key={**key_of(event(1)), "temp": 1}).get("Item")


def test_fence_loss_retries_above_newer_version(moto_dynamo, sensor):
    """A writer whose clock lags loses the fence, observes the stored version, retries above it --
    and is not mistaken for its own condition failing."""
    # A minute apart: within the clock-skew bound (core.versions.MAX_AHEAD_MS) a version is adopted.
    ahead = shim(sensor, moto_dynamo, "cutover", version_clock=VersionClock("ahead", lambda: 1_000_000_060_000))
    behind = shim(sensor, moto_dynamo, "backfill", version_clock=VersionClock("behind", lambda: 1_000_000_000_000))
    moved, _ = moved_and_unmoved(sensor)
    item = event(moved, temp=Decimal(1))
    ahead.put_item(Item=item)
    behind.put_item(Item={**item, "temp": Decimal(2)}, ConditionExpression="attribute_exists(#t)", ExpressionAttributeNames={"#t": "temp"})
    for t in (ahead, behind):
        assert t.get_item(Key=key_of(item), ConsistentRead=True).get("Item")["temp"] == Decimal(2)
    found = where(moto_dynamo, sensor, item)
    assert found["old"][0]["_rs_v"]["S"] == found["new"][0]["_rs_v"]["S"] > "1000000060000"
    with pytest.raises(errors.ConditionalCheckFailed):
        behind.put_item(Item=item, ConditionExpression="attribute_not_exists(#t)", ExpressionAttributeNames={"#t": "temp"})


@pytest.mark.parametrize("name", ["sensor", "invoices", "hourly"])
def test_query_merges_dedupes_and_paginates(moto_dynamo, name):
    m = migration(name, table=f"q-{uuid.uuid4().hex[:6]}")
    create_table(moto_dynamo, m)
    if name == "sensor":
        mk = lambda i: event(i, v=Decimal(i))  # noqa: E731
        qkey, sort_of = {"sensor_id": "s-1"}, (lambda it: it["ts"])
        cond = ("between", "2024-10-27T15:03:00Z", "2024-10-27T15:08:00Z")
    elif name == "invoices":
        mk = lambda i: {"invoice_number": "121212", "line": f"{i:03d}", "v": Decimal(i)}  # noqa: E731
        qkey, sort_of = {"invoice_number": "121212"}, (lambda it: it["line"])
        cond = ("begins_with", "00")
    else:
        mk = lambda i: {"sensor_id": f"s-{i}", "ts": "2024-10-27T15:30:00Z", "event_id": f"e-{i}",  # noqa: E731
                        "v": Decimal(i)}
        qkey, sort_of = {"bucket": "2024-10-27T15"}, (lambda it: f"{it['sensor_id']}#{it['ts']}")
        cond = ("begins_with", "s-1")
    # Items 0-5 written before the migration (old only), 6-11 in dual_write (both layouts),
    # 2 and 7 updated in dual_read (newer version in both), 3 and 8 deleted in backfill.
    steady, dual, read, back = (shim(m, moto_dynamo, p) for p in (None, "dual_write", "dual_read", "backfill"))
    for i in range(6):
        steady.put_item(Item=mk(i))
    for i in range(6, 12):
        dual.put_item(Item=mk(i))
    expected = {i: mk(i) for i in range(12)}
    for i in (2, 7):
        key = {k: v for k, v in mk(i).items() if k in KeyMapper(m).key_fields}
        read.update_item(Key=key, UpdateExpression="SET v = :v", ExpressionAttributeValues={":v": Decimal(100)})
        expected[i] = {**mk(i), "v": Decimal(100)}
    for i in (3, 8):
        back.delete_item(Key={k: v for k, v in mk(i).items() if k in KeyMapper(m).key_fields})
        del expected[i]
    want = sorted(expected.values(), key=sort_of)
    for phase in ("planned", "dual_read", "cutover"):
        t = shim(m, moto_dynamo, phase)
        full = t.query(Key=qkey, ConsistentRead=True)
        if phase == "planned":  # reads the old layout only: items 6-11 are there too (dual-written)
            assert full["Items"] == want
        elif phase == "dual_read":
            assert full["Items"] == want and "LastEvaluatedKey" not in full
        else:  # cutover reads the new layout only: moved pre-migration items were never copied
            mapper = KeyMapper(m)
            never_copied = [mk(i) for i in (0, 1, 4, 5)
                            if mapper.old.random or mapper.old.key(mapper.logical_fields(mk(i))) !=
                            mapper.new.key(mapper.logical_fields(mk(i)))]
            assert full["Items"] == [it for it in want if it not in never_copied]
        expect = full["Items"]
        for limit in (1, 2, 5):
            for forward in (True, False):
                pages, token = [], None
                for _ in range(30):
                    page = t.query(Key=qkey, Limit=limit, ScanIndexForward=forward, ExclusiveStartKey=token,
                                   ConsistentRead=True)
                    assert len(page["Items"]) <= limit
                    pages.extend(page["Items"])
                    token = page.get("LastEvaluatedKey")
                    if token is None:
                        break
                assert pages == (expect if forward else expect[::-1]), (phase, limit, forward)
        cond_items = t.query(Key=qkey, SortKeyCondition=cond, ConsistentRead=True)["Items"]
        assert cond_items and all(_matches(cond, sort_of(it)) for it in cond_items)
        assert cond_items == [it for it in expect if _matches(cond, sort_of(it))]


def _matches(cond, value) -> bool:
    if cond[0] == "between":
        return cond[1] <= value <= cond[2]
    return value.startswith(cond[1])


def test_query_token_survives_a_phase_change(moto_dynamo, sensor):
    dual, cut = shim(sensor, moto_dynamo, "dual_write"), shim(sensor, moto_dynamo, "cutover")
    items = [event(i) for i in range(8)]
    for it in items:
        dual.put_item(Item=it)
    first = shim(sensor, moto_dynamo, "dual_write").query(Key={"sensor_id": "s-1"}, Limit=3, ConsistentRead=True)
    rest = cut.query(Key={"sensor_id": "s-1"}, ExclusiveStartKey=first["LastEvaluatedKey"], ConsistentRead=True)
    assert first["Items"] + rest["Items"] == items


def test_random_suffix_lookups(moto_dynamo):
    m = migration("invoices", table=f"inv-{uuid.uuid4().hex[:6]}")
    create_table(moto_dynamo, m)
    mapper = KeyMapper(m)
    # A pre-migration item at a random shard that is neither the hashed shard nor the new key.
    logical = {"invoice_number": "121212", "line": "001", "amount": Decimal(5)}
    f = mapper.logical_fields(logical)
    home = hash_shard("121212#001", 10)
    new_shard = int(mapper.new.key(f)["PK"]["S"].rsplit("#", 1)[1])
    r = next(s for s in range(10) if s not in (home, new_shard))
    moto_dynamo.call("put_item", TableName=m.table,
                     Item={**__import__("reshard.aws.dynamo", fromlist=["x"]).to_wire(logical), **mapper.old.key(f, r)})
    t = shim(m, moto_dynamo, "dual_write")
    key = {"invoice_number": "121212", "line": "001"}
    before = moto_dynamo.stats.calls.get("batch_get_item", 0)
    assert t.get_item(Key=key).get("Item") == logical  # all 10 candidates in one BatchGetItem
    assert moto_dynamo.stats.calls["batch_get_item"] == before + 1
    t.update_item(Key=key, UpdateExpression="SET amount = :a", ExpressionAttributeValues={":a": 7})
    pks = sorted(i["PK"]["S"] for i in scan(moto_dynamo, m.table))
    # Written where it lives (shard r) and at the new key; nothing at the hashed shard.
    assert pks == sorted({f"InvoiceNumber#121212#{r}", f"InvoiceNumber#121212#{new_shard}"})
    for phase in ("dual_read", "cutover", "planned"):
        got = shim(m, moto_dynamo, phase).get_item(Key=key, ConsistentRead=True).get("Item")
        assert got == {**logical, "amount": 7}
    # A brand-new item goes to the shard derived from its identity (racing creators agree).
    t.put_item(Item={"invoice_number": "999", "line": "002"})
    assert any(i["PK"]["S"] == f"InvoiceNumber#999#{hash_shard('999#002', 10)}" for i in scan(moto_dynamo, m.table))


def test_batch_writer(moto_dynamo, sensor):
    steady = shim(sensor, moto_dynamo, None)
    with steady.batch_writer() as b:
        for i in range(30):
            b.put_item(Item=event(i))
        b.delete_item(Key=key_of(event(0)))
    assert moto_dynamo.stats.calls.get("batch_write_item", 0) == 2
    assert steady.get_item(Key=key_of(event(0))).get("Item") is None
    assert steady.get_item(Key=key_of(event(29))).get("Item") == event(29)
    dual = shim(sensor, moto_dynamo, "dual_write")
    puts = moto_dynamo.stats.calls.get("put_item", 0)
    with dual.batch_writer() as b:  # fenced phase: individual fenced puts
        b.put_item(Item=event(40))
    assert moto_dynamo.stats.calls.get("batch_write_item", 0) == 2
    assert moto_dynamo.stats.calls["put_item"] > puts
    assert shim(sensor, moto_dynamo, "dual_read").get_item(Key=key_of(event(40))).get("Item") == event(40)


# ---------------------------------------------------------------- phase cache and liveness

class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_startup_heartbeat_phase_and_liveness(moto_dynamo, sensor):
    store = ControlStore(moto_dynamo, "ctl")
    store.ensure_table()
    store.register(sensor, who="test")
    order = []
    moto_dynamo.client.meta.events.register(
        "provide-client-params.dynamodb", lambda model, params, **kw: order.append((model.name, params.get("TableName"))))
    clock = FakeClock()
    t = ShardedTable(sensor, moto_dynamo, control_table="ctl", refresh_seconds=3600, liveness_seconds=30, clock=clock)
    try:
        # Heartbeat first (version 0), then the phase read (META row, then the table's
        # lock row: another active migration there is refused; then the data table's marker,
        # its key types read once), then the acknowledgement.
        assert order[:6] == [("PutItem", "ctl"), ("GetItem", "ctl"), ("GetItem", "ctl"),
                             ("DescribeTable", sensor.table), ("GetItem", sensor.table), ("PutItem", "ctl")]
        assert t.phase == "planned"
        beat = fleet.heartbeats(store, sensor.id)
        assert [(h.instance, h.phase, h.phase_version) for h in beat] == [(t.instance_id, "planned", 1)]
        transition(store, sensor.id, Action.ADVANCE, who="test", allow_no_shims=True)
        assert t.phase == "planned"  # cached: no control read per request
        t.put_item(Item=event(1))
        assert t.refresh() and t.phase == "dual_write"
        assert fleet.census(store, sensor.id, 2).acknowledged
        # The control table becomes unreachable: requests go on within the liveness window...
        def broken(**kw):
            raise __import__("botocore").exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        moto_dynamo.client.meta.events.register("provide-client-params.dynamodb.GetItem", lambda params, **kw:
                                                broken() if params.get("TableName") == "ctl" else None)
        clock.t += 10
        assert not t.refresh()
        assert t.get_item(Key=key_of(event(1))).get("Item") == event(1)
        # ...and are refused, before anything is sent, once the last fact's request horizon (H =
        # 15 s after its server Date, on the shim's clock since) is too close: a refresh is
        # tried first, and fails.
        clock.t += 10
        with pytest.raises(errors.ShimUnavailable, match="no usable fact for phase version 2"):
            t.get_item(Key=key_of(event(1))).get("Item")
        # The liveness window still narrows (the census stops counting us after it).
        clock.t += 15
        with pytest.raises(errors.ShimUnavailable, match="could not refresh"):
            t.get_item(Key=key_of(event(1))).get("Item")
        with pytest.raises(errors.ShimUnavailable):
            t.put_item(Item=event(2))
        # ...as a botocore ClientError too, so an app's `except ClientError` sees it (issue 14).
        with pytest.raises(botocore.exceptions.ClientError) as e:
            t.query(Key={"sensor_id": "s-1"})
        assert e.value.response["Error"]["Code"] == "ReshardShimUnavailable"
        assert isinstance(e.value, shim_errors.ShimUnavailable) and isinstance(e.value, errors.ShimUnavailable)
    finally:
        t.close()
    assert fleet.heartbeats(store, sensor.id) == []  # close() leaves the census at once


def test_unregistered_migration_is_steady_and_from_migration_id(moto_dynamo, sensor):
    with ShardedTable(sensor, moto_dynamo, control_table="missing-ctl", refresh_seconds=3600) as t:
        assert t.phase == "steady"
        t.put_item(Item=event(1))
        assert "_rs_v" not in scan(moto_dynamo, sensor.table)[0]
    store = ControlStore(moto_dynamo, "ctl2")
    store.register(sensor, who="test")
    with ShardedTable.from_migration_id(sensor.id, control_table="ctl2", dynamo=moto_dynamo,
                                        refresh_seconds=3600) as t:
        assert t.phase == Phase.PLANNED.value
        assert t.table == "SensorEvents"  # the registered file's table
        create_table(moto_dynamo, t.migration)
        t.put_item(Item=event(2))
        assert t.get_item(Key=key_of(event(2))).get("Item") == event(2)


def test_acknowledges_a_new_phase_only_after_older_requests_finish(moto_dynamo, sensor):
    store = ControlStore(moto_dynamo, "ctl3")
    store.register(sensor, who="test")
    with ShardedTable(sensor, moto_dynamo, control_table="ctl3", refresh_seconds=3600) as t:
        running = t._begin()  # a request in flight under planned (v1)
        transition(store, sensor.id, Action.ADVANCE, who="test", allow_no_shims=True)
        assert t.refresh() and t.phase == "dual_write"  # new requests use the new phase...
        assert [h.phase_version for h in fleet.heartbeats(store, sensor.id)] == [1]  # ...but v2 is not acknowledged
        assert not fleet.census(store, sensor.id, 2).acknowledged
        t._end(running)
        assert t.refresh()
        assert fleet.census(store, sensor.id, 2).acknowledged


def test_throttling_is_retried_and_errors_carry_code_and_request_id(moto_dynamo, sensor):
    from botocore.awsrequest import AWSResponse

    class Raw:
        def __init__(self, body):
            self.body = body

        def stream(self, **kw):
            yield self.body

    sent = {"n": 0}

    def throttle_once(request, **kw):
        sent["n"] += 1
        if sent["n"] == 1:
            body = b'{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"slow"}'
            return AWSResponse(request.url, 400, {"x-amzn-RequestId": "req-1"}, Raw(body))
        return None

    t = shim(sensor, moto_dynamo, "dual_write")
    moto_dynamo.client.meta.events.register("before-send.dynamodb.PutItem", throttle_once)
    t.put_item(Item=event(1))
    assert moto_dynamo.stats.throttles == 1
    assert t.get_item(Key=key_of(event(1))).get("Item") == event(1)
    with pytest.raises(errors.ConditionalCheckFailed) as e:
        t.put_item(Item=event(1), ConditionExpression="attribute_not_exists(sensor_id)")
    assert e.value.code == "ConditionalCheckFailedException" and e.value.request_id


@pytest.mark.parametrize("phase", ALL)
def test_new_copy_marker_per_phase(moto_dynamo, sensor, phase):
    """Only a new-layout item at a key that differs from the old key carries `_rs_new`,
    whatever the operation; the marker never reaches the application."""
    t = shim(sensor, moto_dynamo, phase)
    moved, unmoved = moved_and_unmoved(sensor)
    for n in (moved, unmoved):
        item = event(n, temp=Decimal(1))
        t.put_item(Item=item)
        t.update_item(Key=key_of(item), UpdateExpression="SET #t = :t",
                      ExpressionAttributeNames={"#t": "temp"}, ExpressionAttributeValues={":t": 2})
        assert "_rs_new" not in t.get_item(Key=key_of(item), ConsistentRead=True).get("Item")
    items = scan(moto_dynamo, sensor.table)
    mapper = KeyMapper(sensor)
    for i in items:
        fields = mapper.fields(i, mapper.new) if "_rs_new" in i else mapper.fields(i, mapper.old)
        old_key, new_key = mapper.old.key(fields), mapper.new.key(fields)
        here = {a: i[a] for a in ("PK", "SK")}
        assert ("_rs_new" in i) == (here == new_key != old_key), i
    if phase in ("dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete"):
        assert any("_rs_new" in i for i in items)  # the moved item's new copy
    else:
        assert not any("_rs_new" in i for i in items)


def test_a_failed_mirror_write_is_logged_and_raised(moto_dynamo, sensor, caplog):
    """The authoritative write landed, the mirror failed after every retry: the application
    gets the error (not an acknowledgement) and the shim logs the key, so an operator knows
    to verify again before the next transition (README, Limits)."""
    import botocore.exceptions

    t = shim(sensor, moto_dynamo, "backfill")
    moved, _ = moved_and_unmoved(sensor)
    item = event(moved, temp=Decimal(7))
    puts = []

    def mirror_fails(params, **kwargs):
        puts.append(params)
        if len(puts) > 1:  # the first PutItem is the authoritative (old) copy
            raise botocore.exceptions.ClientError({"Error": {"Code": "ValidationException", "Message": "boom"}},
                                                  "PutItem")
    events = moto_dynamo.client.meta.events
    events.register("before-call.dynamodb.PutItem", mirror_fails)
    try:
        with caplog.at_level("WARNING", logger="reshard.shim"), pytest.raises(errors.AWSError, match="boom"):
            t.put_item(Item=item)
    finally:
        events.unregister("before-call.dynamodb.PutItem", mirror_fails)
    assert "mirror write of" in caplog.text and "failed after the authoritative write landed" in caplog.text
    found = where(moto_dynamo, sensor, item)
    assert found["old"] and not found["new"]


@pytest.mark.parametrize("phase", [None, "dual_read", "cutover"])
def test_key_condition_over_a_composite_sort_template(moto_dynamo, phase):
    """hourly: PK "{shard}#{bucket}" (bucket from ts), SK "{sensor_id}#{ts}". Equalities render
    the sort template's prefix, the range applies to its last field (issue 14)."""
    from boto3.dynamodb.conditions import Key as K
    m = migration("hourly", table=f"hourly-{uuid.uuid4().hex[:8]}")
    create_table(moto_dynamo, m)
    dual = shim(m, moto_dynamo, "dual_write")
    items = [{"sensor_id": s, "ts": f"2024-10-27T15:{i:02d}:00Z", "event_id": f"{s}-{i}"}
             for s in ("s-1", "s-2") for i in range(6)]
    for it in items:
        dual.put_item(Item=it)
    t = shim(m, moto_dynamo, phase)
    bucket = K("bucket").eq("2024-10-27T15")
    s1 = [it for it in items if it["sensor_id"] == "s-1"]

    def q(kce, **kw):
        return t.query(KeyConditionExpression=kce, ConsistentRead=True, **kw)["Items"]

    assert q(bucket & K("sensor_id").eq("s-1")) == s1
    assert q(bucket & K("sensor_id").eq("s-1") & K("ts").between("2024-10-27T15:01", "2024-10-27T15:03")) == s1[1:3]
    assert q(bucket & K("sensor_id").eq("s-1") & K("ts").begins_with("2024-10-27T15:0"), ScanIndexForward=False) == \
        s1[::-1]
    assert q(bucket & K("sensor_id").eq("s-2") & K("ts").eq(items[8]["ts"])) == [items[8]]
    assert len(q(bucket)) == 12
    with pytest.raises(errors.BadInput, match="cannot be expressed"):
        q(bucket & K("sensor_id").eq("s-1") & K("ts").gt("2024"))
    with pytest.raises(errors.BadInput, match="needs equalities"):
        q(bucket & K("ts").between("a", "b"))
    with pytest.raises(errors.BadInput, match="FilterExpression"):
        q(bucket & K("event_id").eq("x"))
