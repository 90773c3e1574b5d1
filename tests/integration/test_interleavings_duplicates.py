"""Issue 12, random-suffix duplicates (case 3's family), shim side: a forced interleaving on dynalite.

Two identical, unversioned old copies of one invoice line (an application re-put it with
a fresh suffix before the migration). A shim writing it first finds it with a
BatchGetItem of every candidate shard and writes the *newest* copy; between two
unversioned copies the versions tie. DynamoDB does not order BatchGetItem's answer, so
two shims could pick different copies, each write would pass its own fence (each copy is
unversioned), and two acknowledged ``ADD counter 1`` would both return the same value:
one increment lost. The fix breaks the tie deterministically
(:func:`reshard.core.versions.newest`), so every shim writes the same copy and the
version fence orders the two increments.
"""

from __future__ import annotations

import threading
import time

from reshard.aws.dynamo import Dynamo, RetryPolicy, to_wire
from reshard.core.layout import KeyMapper
from reshard.core.versions import newest
from tests.shim_helpers import create_table, migration, scan, shim

KEY = {"invoice_number": "123456", "line": "0"}


def _client(server) -> Dynamo:
    return Dynamo(endpoint_url=server.endpoint, region="us-east-1",
                  retry=RetryPolicy(max_attempts=5, base_seconds=0.01), connect_timeout=1, read_timeout=4)


def test_two_shims_pick_the_same_unversioned_duplicate_whatever_order_batchget_answers(dynalite_server,
                                                                                      unique_name):
    m = migration("invoices", unique_name)
    mapper = KeyMapper(m)
    a_dyn, b_dyn = _client(dynalite_server), _client(dynalite_server)
    create_table(a_dyn, m)
    deadline = time.monotonic() + 5  # dynalite may answer ResourceNotFound right after CreateTable
    while a_dyn.call("describe_table", TableName=m.table)["Table"]["TableStatus"] != "ACTIVE":
        assert time.monotonic() < deadline, "table not ACTIVE after 5 s"
        time.sleep(0.01)
    fields = mapper.logical_fields(to_wire(KEY))
    new_key = mapper.new.key(fields)
    shards = [s for s in range(mapper.old.shards) if mapper.old.key(fields, s) != new_key][:2]
    for s in shards:  # the same item under two suffixes, no version (pre-migration)
        a_dyn.call("put_item", TableName=m.table, Item=mapper.to_physical(to_wire(dict(KEY, counter=5)), mapper.old, s))

    # A's BatchGetItem answers in one order, B's in the other (DynamoDB guarantees no order;
    # dynalite's varies too).
    for d, backwards in ((a_dyn, False), (b_dyn, True)):
        def order(parsed, _backwards=backwards, **_):
            for items in parsed.get("Responses", {}).values():
                items.sort(key=lambda i: i["PK"]["S"], reverse=_backwards)
        d.client.meta.events.register("after-call.dynamodb.BatchGetItem", order)
    # Both shims have located the item before either sends its update.
    barrier = threading.Barrier(2, timeout=10)
    first = {id(a_dyn.client): True, id(b_dyn.client): True}

    for d in (a_dyn, b_dyn):
        def at_send(request, _d=d, **_):
            if first[id(_d.client)]:
                first[id(_d.client)] = False
                barrier.wait()
        d.client.meta.events.register("before-send.dynamodb.UpdateItem", at_send)

    a, b = shim(m, a_dyn, "dual_write", writer_id="a"), shim(m, b_dyn, "dual_write", writer_id="b")
    got: dict[str, int] = {}
    errors: list[BaseException] = []

    def add(name, t):
        try:
            resp = t.update_item(Key=KEY, UpdateExpression="ADD #c :one", ExpressionAttributeNames={"#c": "counter"},
                                 ExpressionAttributeValues={":one": 1}, ReturnValues="UPDATED_NEW")
            got[name] = int(resp["Attributes"]["counter"])
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=add, args=(n, t)) for n, t in (("a", a), ("b", b))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(15)
    assert not any(th.is_alive() for th in threads) and errors == [], errors
    # Two acknowledged increments: the callers were told two different values, and both count.
    assert sorted(got.values()) == [6, 7], f"both increments acknowledged, returned {got}"
    assert int(a.get_item(Key=KEY, ConsistentRead=True).get("Item")["counter"]) == 7
    old = [i for i in scan(a_dyn, m.table) if not mapper.is_new_copy(i)]
    assert int(newest(old)["counter"]["N"]) == 7  # the authoritative (old) layout holds both


def test_newest_breaks_a_version_tie_the_same_way_in_any_order():
    x = {"PK": {"S": "InvoiceNumber#1#2"}, "SK": {"S": "0"}, "n": {"N": "1"}}
    y = {"PK": {"S": "InvoiceNumber#1#7"}, "SK": {"S": "0"}, "n": {"N": "1"}}
    assert newest([x, y]) is newest([y, x])
    v = dict(y, _rs_v={"S": "0000000000001.000000.w"})
    assert newest([x, v]) is v and newest([v, x]) is v
