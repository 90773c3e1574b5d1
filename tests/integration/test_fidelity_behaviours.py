"""The fidelity proxy's step 2 (issue 29): what DynamoDB does and dynalite does not, one behaviour a test.

Time is the proxy's injected ``monotonic`` for the behaviours (how long ago a write landed, how
full a partition's bucket is), stepped by the test: nothing here depends on the machine's speed.
"""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.aws.fidelity import FidelityProxy
from reshard.aws.fidelity.ordering import create_key
from reshard.aws.fidelity.throughput import ON_DEMAND_MESSAGE, PROVISIONED_MESSAGE

from tests.fidelity_support import client, get, make_table, raw_call

ONCE = RetryPolicy(max_attempts=1)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def proxy(dynalite_server, clock):
    with FidelityProxy(dynalite_server.endpoint, monotonic=clock, seed=29) as p:
        yield p


def item(pk: str, sk: str | None = None, **attrs) -> dict:
    out = {"pk": {"S": pk}, **({"sk": {"S": sk}} if sk is not None else {})}
    out.update({k: ({"N": str(v)} if isinstance(v, int) else {"S": v}) for k, v in attrs.items()})
    return out


# ---------------------------------------------------------------------------------- eventual consistency
def test_an_eventually_consistent_get_may_return_the_previous_state_within_the_window(proxy, clock, unique_name):
    dynamo = client(proxy.endpoint)
    make_table(dynamo, unique_name)
    proxy.configure(stale_reads=True, stale_window=1.0, stale_probability=1.0)
    key = {"pk": {"S": "a"}}
    dynamo.call("put_item", TableName=unique_name, Item=item("a", v=1))
    clock.t += 10
    dynamo.call("put_item", TableName=unique_name, Item=item("a", v=2))
    clock.t += 0.5  # 0.5 s after the write: a read as of up to 1 s ago is stale half the time
    seen = [dynamo.call("get_item", TableName=unique_name, Key=key).get("Item", {}).get("v") for _ in range(20)]
    assert set(map(str, seen)) == {str({"N": "1"}), str({"N": "2"})}
    assert all(dynamo.call("get_item", TableName=unique_name, Key=key, ConsistentRead=True)["Item"]["v"] == {"N": "2"}
               for _ in range(10))
    # Batch reads too; and a projection is applied to the past state.
    got = dynamo.call("batch_get_item", RequestItems={unique_name: {"Keys": [key] * 1, "ProjectionExpression": "v"}})
    assert got["Responses"][unique_name][0].keys() == {"v"}
    clock.t += 0.6  # past the window: every read is up to date again
    assert {str(dynamo.call("get_item", TableName=unique_name, Key=key)["Item"]["v"]) for _ in range(10)} == {
        str({"N": "2"})}
    # A key deleted within the window reads back; one created within it reads as absent.
    dynamo.call("delete_item", TableName=unique_name, Key=key)
    dynamo.call("put_item", TableName=unique_name, Item=item("b", v=5))
    assert dynamo.call("get_item", TableName=unique_name, Key=key)["Item"]["v"] == {"N": "2"}
    assert "Item" not in dynamo.call("get_item", TableName=unique_name, Key={"pk": {"S": "b"}})
    # The old state of every kind of write is kept, whatever the write asked back: an update
    # returning the new values (its old state read first), a batch of puts and deletes.
    clock.t += 2
    resp = dynamo.call("update_item", TableName=unique_name, Key={"pk": {"S": "b"}}, UpdateExpression="ADD v :one",
                       ExpressionAttributeValues={":one": {"N": "1"}}, ReturnValues="UPDATED_NEW")
    assert resp["Attributes"] == {"v": {"N": "6"}}
    resp = dynamo.call("put_item", TableName=unique_name, Item=item("c", v=7), ReturnValues="ALL_OLD")
    assert "Attributes" not in resp
    dynamo.batch_write(unique_name, [{"PutRequest": {"Item": item("a", v=3)}},
                                     {"DeleteRequest": {"Key": {"pk": {"S": "c"}}}}])
    assert dynamo.call("get_item", TableName=unique_name, Key={"pk": {"S": "b"}})["Item"]["v"] == {"N": "5"}
    assert "Item" not in dynamo.call("get_item", TableName=unique_name, Key=key)
    assert "Item" not in dynamo.call("get_item", TableName=unique_name, Key={"pk": {"S": "c"}})
    assert get(dynamo, unique_name, "a")["v"] == {"N": "3"} and get(dynamo, unique_name, "c") is None
    assert proxy.stats()["stale_reads"] >= 6


def scan_pages(dynamo, table: str, **kw) -> list[dict]:
    out, start = [], None
    while True:
        resp = dynamo.call("scan", TableName=table, **kw, **({"ExclusiveStartKey": start} if start else {}))
        out += resp["Items"]
        start = resp.get("LastEvaluatedKey")
        if not start:
            return out


def test_a_stale_scan_or_query_shows_the_past_table_each_item_once_in_dynalites_order(proxy, clock, unique_name):
    dynamo = client(proxy.endpoint)
    make_table(dynamo, unique_name, sort=True)
    for i in range(40):
        dynamo.call("put_item", TableName=unique_name, Item=item(f"p{i % 3}", f"s{i:02d}", v=i))
    clock.t += 10
    proxy.configure(stale_reads=True, stale_window=1.0, stale_probability=1.0, gsi_lag=1.0)
    past = {(it["pk"]["S"], it["sk"]["S"]): it for it in scan_pages(dynamo, unique_name, ConsistentRead=True)}
    # Now, all at one instant (every stale read is then as of before these writes): deletes,
    # new items, updates.
    for i in (3, 4, 17, 31):
        dynamo.call("delete_item", TableName=unique_name, Key={"pk": {"S": f"p{i % 3}"}, "sk": {"S": f"s{i:02d}"}})
    for i in (40, 41, 42):
        dynamo.call("put_item", TableName=unique_name, Item=item(f"p{i % 3}", f"s{i:02d}", v=i))
    for i in (5, 6):
        dynamo.call("update_item", TableName=unique_name, Key={"pk": {"S": f"p{i % 3}"}, "sk": {"S": f"s{i:02d}"}},
                    UpdateExpression="SET v = :v", ExpressionAttributeValues={":v": {"N": "999"}})
    now = {(it["pk"]["S"], it["sk"]["S"]): it for it in scan_pages(dynamo, unique_name, ConsistentRead=True)}
    assert now != past
    order = sorted(past.values(), key=lambda it: create_key(it, ["pk", "sk"]))
    # Pages of 7, and three segments of pages of 4: every past item exactly once, in order.
    assert scan_pages(dynamo, unique_name, Limit=7) == order
    segs = [it for s in range(3) for it in scan_pages(dynamo, unique_name, Limit=4, Segment=s, TotalSegments=3)]
    assert sorted(map(str, segs)) == sorted(map(str, order)) and len(segs) == len(order)
    # A query of one partition, both directions, in pages, with a filter.
    for forward in (True, False):
        got, start = [], None
        while True:
            resp = dynamo.call("query", TableName=unique_name, KeyConditionExpression="pk = :p AND sk > :s",
                               ExpressionAttributeValues={":p": {"S": "p1"}, ":s": {"S": "s03"}}, Limit=3,
                               ScanIndexForward=forward, **({"ExclusiveStartKey": start} if start else {}))
            got += resp["Items"]
            start = resp.get("LastEvaluatedKey")
            if not start:
                break
        want = sorted((it for k, it in past.items() if k[0] == "p1" and k[1] > "s03"), key=lambda it: it["sk"]["S"],
                      reverse=not forward)
        assert got == want
    filtered = dynamo.call("scan", TableName=unique_name, FilterExpression="v >= :n",
                           ExpressionAttributeValues={":n": {"N": "30"}})["Items"]
    assert sorted(int(it["v"]["N"]) for it in filtered) == sorted(int(it["v"]["N"]) for it in past.values()
                                                                  if int(it["v"]["N"]) >= 30)
    clock.t += 1.1
    assert sorted(map(str, scan_pages(dynamo, unique_name, Limit=7))) == sorted(map(str, now.values()))


def test_a_gsi_query_lags_the_table(proxy, clock, unique_name):
    dynamo = client(proxy.endpoint)
    make_table(dynamo, unique_name, gsi="byg")
    dynamo.call("put_item", TableName=unique_name, Item=item("a", gpk="A", gsk="1", v=1))
    clock.t += 10
    proxy.configure(stale_reads=True, stale_probability=0.0, gsi_lag=0.5)  # the table is up to date, the GSI not
    dynamo.call("update_item", TableName=unique_name, Key={"pk": {"S": "a"}}, UpdateExpression="SET gpk = :b",
                ExpressionAttributeValues={":b": {"S": "B"}})

    def on(value):
        return dynamo.call("query", TableName=unique_name, IndexName="byg", KeyConditionExpression="gpk = :g",
                           ExpressionAttributeValues={":g": {"S": value}})["Items"]

    assert on("B") == [] and [it["pk"]["S"] for it in on("A")] == ["a"]   # the index still has the old entry
    assert get(dynamo, unique_name, "a")["gpk"] == {"S": "B"}             # the table has the new one
    assert dynamo.call("get_item", TableName=unique_name, Key={"pk": {"S": "a"}})["Item"]["gpk"] == {"S": "B"}
    with pytest.raises(errors.AWSError, match="Consistent reads are not supported on global secondary indexes"):
        dynamo.call("query", TableName=unique_name, IndexName="byg", KeyConditionExpression="gpk = :g",
                    ExpressionAttributeValues={":g": {"S": "B"}}, ConsistentRead=True)
    clock.t += 0.6
    assert [it["pk"]["S"] for it in on("B")] == ["a"] and on("A") == []


# ---------------------------------------------------------------------------------- per-partition throughput
def test_a_hot_partition_key_is_throttled_with_awss_reasons_and_others_are_not(proxy, clock, unique_name):
    dynamo = client(proxy.endpoint, retry=ONCE)
    make_table(dynamo, unique_name, sort=True)
    arn = dynamo.call("describe_table", TableName=unique_name)["Table"]["TableArn"]
    proxy.configure(partition_throughput=True, partition_wcu=10.0, partition_rcu=2.0)
    for i in range(10):  # a full bucket: one second of the partition's rate
        dynamo.call("put_item", TableName=unique_name, Item=item("hot", str(i)))
    status, _, body = raw_call(proxy.endpoint, "PutItem", {"TableName": unique_name, "Item": item("hot", "x")})
    assert status == 400 and body == {
        "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
        "message": PROVISIONED_MESSAGE,
        "ThrottlingReasons": [{"reason": "TableWriteKeyRangeThroughputExceeded", "resource": arn}]}
    dynamo.call("put_item", TableName=unique_name, Item=item("cold", "1"))  # another partition key: its own bucket
    # botocore's and the lean path's exception both carry the reasons (the lean path adds modeled members too).
    for call in (lambda: dynamo.call("put_item", TableName=unique_name, Item=item("hot", "y")),
                 lambda: dynamo.call("put_item", TableName=unique_name, Item=item("hot", "y"), ReturnValues="ALL_OLD")):
        with pytest.raises(errors.AWSError) as e:
            call()
        assert e.value.code == "ProvisionedThroughputExceededException"
        assert e.value.response["ThrottlingReasons"][0]["reason"] == "TableWriteKeyRangeThroughputExceeded"
    clock.t += 0.5  # half a second: 5 units back
    for i in range(5):
        dynamo.call("put_item", TableName=unique_name, Item=item("hot", f"r{i}"))
    assert raw_call(proxy.endpoint, "PutItem", {"TableName": unique_name, "Item": item("hot", "z")})[0] == 400
    # Reads: 2 RCU/s, an eventually consistent read of a small item costs 0.5.
    for _ in range(4):
        dynamo.call("get_item", TableName=unique_name, Key={"pk": {"S": "hot"}, "sk": {"S": "1"}})
    status, _, body = raw_call(proxy.endpoint, "Query", {"TableName": unique_name, "KeyConditionExpression": "pk = :p",
                                                         "ExpressionAttributeValues": {":p": {"S": "hot"}}})
    assert status == 400 and body["ThrottlingReasons"][0]["reason"] == "TableReadKeyRangeThroughputExceeded"
    # On-demand tables' users report ThrottlingException instead: a setting, its member lower-case as modeled.
    proxy.configure(throttle_error="ThrottlingException")
    status, _, body = raw_call(proxy.endpoint, "PutItem", {"TableName": unique_name, "Item": item("hot", "z")})
    assert body == {"__type": "com.amazonaws.dynamodb.v20120810#ThrottlingException", "message": ON_DEMAND_MESSAGE,
                    "throttlingReasons": [{"reason": "TableWriteKeyRangeThroughputExceeded", "resource": arn}]}
    stats = proxy.stats()
    assert stats["throttle_reasons"]["TableWriteKeyRangeThroughputExceeded"] >= 4


def test_a_gsi_partition_key_has_its_own_limit(proxy, clock, unique_name):
    dynamo = client(proxy.endpoint, retry=ONCE)
    make_table(dynamo, unique_name, gsi="byg")
    proxy.configure(partition_throughput=True, partition_wcu=3.0)
    for i in range(3):  # three table partitions, one index partition
        dynamo.call("put_item", TableName=unique_name, Item=item(f"k{i}", gpk="G", gsk=str(i)))
    status, _, body = raw_call(proxy.endpoint, "PutItem",
                               {"TableName": unique_name, "Item": item("k9", gpk="G", gsk="9")})
    assert status == 400 and body["ThrottlingReasons"][0]["reason"] == "IndexWriteKeyRangeThroughputExceeded"
    assert body["ThrottlingReasons"][0]["resource"].endswith(f"table/{unique_name}/index/byg")
    assert get(dynamo, unique_name, "k9") is None  # a throttled write is not applied
    dynamo.call("put_item", TableName=unique_name, Item=item("k9", gpk="H", gsk="9"))


def test_batch_calls_leave_refused_items_unprocessed_and_the_client_finishes(proxy, clock, unique_name, dynalite):
    dynamo = client(proxy.endpoint)
    make_table(dynamo, unique_name, sort=True)
    proxy.configure(partition_throughput=True, partition_wcu=10.0, partition_rcu=3.0)
    puts = [{"PutRequest": {"Item": item("hot", f"{i:02d}")}} for i in range(25)]
    resp = dynamo.call("batch_write_item", RequestItems={unique_name: puts})
    assert resp["UnprocessedItems"][unique_name] == puts[10:]  # exactly the ones past the bucket
    assert len(dynamo.call("query", TableName=unique_name, KeyConditionExpression="pk = :p", ConsistentRead=True,
                           ExpressionAttributeValues={":p": {"S": "hot"}})["Items"]) == 10
    # Nothing admitted at all: the whole call is throttled.
    status, _, body = raw_call(proxy.endpoint, "BatchWriteItem", {"RequestItems": {unique_name: puts[10:]}})
    assert status == 400 and body["ThrottlingReasons"][0]["reason"] == "TableWriteKeyRangeThroughputExceeded"
    clock.t += 0.5  # 5 units back: 5 more of the 15 go
    resp = dynamo.call("batch_write_item", RequestItems={unique_name: puts[10:]})
    assert resp["UnprocessedItems"][unique_name] == puts[15:]
    keys = [{"pk": {"S": "hot"}, "sk": {"S": f"{i:02d}"}} for i in range(10)]
    resp = dynamo.call("batch_get_item", RequestItems={unique_name: {"Keys": keys, "ConsistentRead": True}})
    assert len(resp["Responses"][unique_name]) == 3  # 3 RCU: three consistent reads of small items
    assert resp["UnprocessedKeys"][unique_name] == {"Keys": keys[3:], "ConsistentRead": True}
    # Under load at random (unprocessed_rate), with real time: Dynamo's loops re-send until done.
    proxy.configure(partition_throughput=False, unprocessed_rate=0.5)
    more = [{"PutRequest": {"Item": item(f"k{i}", "1", v=i)}} for i in range(40)]
    calls = dynamo.batch_write(unique_name, more)
    assert calls > 2
    got = dynamo.batch_get(unique_name, [{"pk": {"S": f"k{i}"}, "sk": {"S": "1"}} for i in range(40)], consistent=True)
    assert sorted(int(it["v"]["N"]) for it in got) == list(range(40))
    assert proxy.stats()["unprocessed_items"] > 20


def test_throttles_are_retried_by_dynamo_call_until_the_partition_refills(proxy, clock, unique_name):
    # The client's backoff sleeps move the proxy's clock (nothing waits): the partition refills
    # exactly as fast as the retries back off, whatever the machine's speed.
    dynamo = Dynamo(endpoint_url=proxy.endpoint, region="us-east-1", connect_timeout=1, read_timeout=5,
                    retry=RetryPolicy(max_attempts=30, max_seconds=600, base_seconds=0.02, max_backoff_seconds=0.2),
                    sleep=lambda s: setattr(clock, "t", clock.t + s))
    make_table(dynamo, unique_name, sort=True)
    proxy.configure(partition_throughput=True, partition_wcu=20.0)
    throttles = []
    dynamo.add_throttle_listener(throttles.append)
    for i in range(40):  # 20 from the full bucket, 20 more only as it refills
        dynamo.call("put_item", TableName=unique_name, Item=item("hot", str(i)))
    assert len(throttles) >= 1 and proxy.stats()["partition_throttles"] == len(throttles)
    assert dynamo.call("query", TableName=unique_name, KeyConditionExpression="pk = :p", Select="COUNT",
                       ExpressionAttributeValues={":p": {"S": "hot"}})["Count"] == 40


# ---------------------------------------------------------------------------------- TTL
def test_ttl_is_answered_and_expired_items_stay_visible_until_deleted_late(proxy, clock, unique_name):
    dynamo = client(proxy.endpoint, retry=ONCE)
    make_table(dynamo, unique_name)
    proxy.configure(ttl=True, ttl_delay=60.0, ttl_sweep_seconds=3600.0)  # sweeps only when the test asks
    assert dynamo.call("describe_time_to_live", TableName=unique_name)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "DISABLED"}
    resp = dynamo.call("update_time_to_live", TableName=unique_name,
                       TimeToLiveSpecification={"Enabled": True, "AttributeName": "exp"})
    assert resp["TimeToLiveSpecification"] == {"Enabled": True, "AttributeName": "exp"}
    assert dynamo.call("describe_time_to_live", TableName=unique_name)["TimeToLiveDescription"] == {
        "TimeToLiveStatus": "ENABLED", "AttributeName": "exp"}
    with pytest.raises(errors.AWSError, match="TimeToLive is already enabled"):
        dynamo.call("update_time_to_live", TableName=unique_name,
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": "exp"})
    now = int(proxy.now())
    dynamo.call("put_item", TableName=unique_name, Item=item("expired", exp=now - 10))
    dynamo.call("put_item", TableName=unique_name, Item=item("renewed", exp=now - 10))
    dynamo.call("put_item", TableName=unique_name, Item=item("ancient", exp=now - 6 * 365 * 86400))
    dynamo.call("put_item", TableName=unique_name, Item=item("text", exp="yesterday"))
    dynamo.call("put_item", TableName=unique_name, Item=item("future", exp=now + 3600))
    assert proxy.ttl_sweep() == 0  # expired, but within ttl_delay: still there
    assert get(dynamo, unique_name, "expired") is not None
    dynamo.call("update_item", TableName=unique_name, Key={"pk": {"S": "renewed"}}, UpdateExpression="SET #e = :e",
                ExpressionAttributeNames={"#e": "exp"}, ExpressionAttributeValues={":e": {"N": str(now + 7200)}})
    proxy.advance_clock(61)
    assert proxy.ttl_sweep() == 1
    assert get(dynamo, unique_name, "expired") is None
    assert all(get(dynamo, unique_name, k) is not None for k in ("renewed", "ancient", "text", "future"))
    assert proxy.stats()["ttl_deleted"] == 1
    # reshard's own --enable-ttl path: enabled already on the file's attribute, nothing to do.
    from reshard.aws.inspect import ttl_status
    assert ttl_status(dynamo, unique_name) == ("ENABLED", "exp")
    dynamo.call("update_time_to_live", TableName=unique_name,
                TimeToLiveSpecification={"Enabled": False, "AttributeName": "exp"})
    assert ttl_status(dynamo, unique_name) == ("DISABLED", None)


def test_the_sweeper_thread_deletes_on_its_own(dynalite_server, unique_name):
    import time
    with FidelityProxy(dynalite_server.endpoint, ttl=True, ttl_delay=0.0, ttl_sweep_seconds=0.05) as p:
        dynamo = client(p.endpoint)
        make_table(dynamo, unique_name)
        dynamo.call("update_time_to_live", TableName=unique_name,
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": "exp"})
        dynamo.call("put_item", TableName=unique_name, Item=item("x", exp=int(p.now()) - 1))
        deadline = time.monotonic() + 20
        while get(dynamo, unique_name, "x") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert get(dynamo, unique_name, "x") is None


# ---------------------------------------------------------------------------------- page caps
def test_pages_end_after_one_megabyte_and_batch_gets_leave_keys_unprocessed(proxy, unique_name):
    dynamo = client(proxy.endpoint)
    make_table(dynamo, unique_name, sort=True)
    blob = "x" * 200_000
    for i in range(12):  # 2.4 MB in one partition
        dynamo.call("put_item", TableName=unique_name, Item=item("big", f"{i:02d}", blob=blob))
    page = dynamo.call("scan", TableName=unique_name)
    assert page.get("LastEvaluatedKey") and 4 <= page["Count"] <= 6   # 1 MB of 200 KB items, then a page break
    q = dynamo.call("query", TableName=unique_name, KeyConditionExpression="pk = :p",
                    ExpressionAttributeValues={":p": {"S": "big"}})
    assert q.get("LastEvaluatedKey") and q["Count"] == page["Count"]
    keys = [{"pk": {"S": "big"}, "sk": {"S": f"{i:02d}"}} for i in range(12)]
    got = dynamo.call("batch_get_item", RequestItems={unique_name: {"Keys": keys}})
    # dynalite stops near 1 MB (DynamoDB at 16 MB): stricter, so a client's UnprocessedKeys loop runs.
    assert got["UnprocessedKeys"][unique_name]["Keys"] and len(got["Responses"][unique_name]) < 12
    assert len(dynamo.batch_get(unique_name, keys)) == 12
