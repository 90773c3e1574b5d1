"""The lean request path against dynalite: the same answers, errors, retries and reports as boto3's."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from botocore.awsrequest import AWSResponse

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.aws.local import create_table
from reshard.core.migration import Keys


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def _lean(endpoint: str, **kw) -> Dynamo:
    d = Dynamo(endpoint_url=endpoint, region="us-east-1", connect_timeout=1, read_timeout=4,
               retry=RetryPolicy(max_attempts=4, base_seconds=0.001, max_backoff_seconds=0.01), **kw)
    assert d._lean is not None
    return d


@pytest.fixture
def table(dynalite, unique_name):
    create_table(dynalite, unique_name, Keys("PK", "SK"))
    return unique_name


@pytest.fixture
def btable(dynalite, unique_name):
    """A binary sort key: the reads' answers then carry bytes in their keys too."""
    create_table(dynalite, unique_name + "-b", Keys("PK", "SK"), types={"SK": "B"})
    return unique_name + "-b"


def test_writes_errors_and_binary_values_match_boto3(dynalite_server, table):
    d = _lean(dynalite_server.endpoint)
    sent = []
    d.client.meta.events.register("before-send.dynamodb.PutItem", lambda request, **_: sent.append(request))
    item = {"PK": {"S": "a"}, "SK": {"S": "1"}, "bin": {"B": b"\x00\xff"}, "set": {"BS": [b"\x01"]}}
    resp = d.call("put_item", TableName=table, Item=item, ConditionExpression="attribute_not_exists(PK)",
                  ReturnConsumedCapacity="TOTAL")
    assert resp["ConsumedCapacity"]["CapacityUnits"] == 1.0 and len(sent) == 1  # the lean path emitted the hook
    assert d.stats.consumed[table] == 1.0
    with pytest.raises(errors.ConditionalCheckFailed) as failed:
        d.call("put_item", TableName=table, Item=item, ConditionExpression="attribute_not_exists(PK)")
    assert failed.value.request_id
    assert isinstance(failed.value, d.client.exceptions.ConditionalCheckFailedException)  # as boto3 raises it
    got = d.call("get_item", TableName=table, Key={"PK": {"S": "a"}, "SK": {"S": "1"}}, ConsistentRead=True)
    assert got["Item"] == item  # read back by boto3: what the lean path sent was the same item
    d.call("update_item", TableName=table, Key={"PK": {"S": "a"}, "SK": {"S": "1"}}, UpdateExpression="SET n = :one",
           ExpressionAttributeValues={":one": {"N": "1"}}, ConditionExpression="attribute_exists(PK)")
    d.call("delete_item", TableName=table, Key={"PK": {"S": "a"}, "SK": {"S": "1"}},
           ConditionExpression="n = :one", ExpressionAttributeValues={":one": {"N": "1"}})
    assert "Item" not in d.call("get_item", TableName=table, Key={"PK": {"S": "a"}, "SK": {"S": "1"}},
                                ConsistentRead=True)
    with pytest.raises(errors.ResourceNotFound):
        d.call("put_item", TableName=table + "-missing", Item=item)
    assert d.stats.calls["put_item"] == 1 and d.stats.calls["delete_item"] == 1


def test_a_throttle_answer_is_retried_and_reported_and_the_guard_runs_before_every_attempt(dynalite_server, table):
    d = _lean(dynalite_server.endpoint)
    answers = [400, 500]

    def fault(request, **_):
        if answers:
            status = answers.pop(0)
            kind = "ProvisionedThroughputExceededException" if status == 400 else "InternalServerError"
            body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{kind}", "message": "injected"})
            return AWSResponse("http://127.0.0.1/", status, {"x-amzn-RequestId": "x"}, _Body(body.encode()))
        return None

    d.client.meta.events.register("before-send.dynamodb.PutItem", fault)
    throttles, guarded = [], []
    d.add_throttle_listener(throttles.append)
    d.call("put_item", guard=lambda: guarded.append(1), TableName=table, Item={"PK": {"S": "t"}, "SK": {"S": "1"}})
    assert throttles == ["put_item"] and d.stats.throttles == 1 and d.stats.retries["put_item"] == 2
    assert len(guarded) == 3  # before each of the three attempts


def test_a_hook_on_a_step_the_lean_path_skips_sends_the_call_through_boto3(dynalite_server, table):
    d = _lean(dynalite_server.endpoint)
    seen = []
    d.client.meta.events.register("provide-client-params.dynamodb.PutItem", lambda params, **_: seen.append(params))
    d.call("put_item", TableName=table, Item={"PK": {"S": "h"}, "SK": {"S": "1"}})
    assert len(seen) == 1


def test_a_connection_the_server_closed_is_replaced_and_a_dropped_answer_is_retried(dynalite_server, table):
    d = _lean(dynalite_server.endpoint)
    d.call("put_item", TableName=table, Item={"PK": {"S": "c"}, "SK": {"S": "1"}})
    sock, _ = d._lean._local.conn
    sock.shutdown(socket.SHUT_RDWR)  # as if the server closed the idle keep-alive connection
    d.call("put_item", TableName=table, Item={"PK": {"S": "c"}, "SK": {"S": "2"}})
    assert d.stats.retries.get("put_item", 0) <= 1

    # A server that accepts and hangs up without answering: a dropped connection, retried, then given up.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []

    def serve():
        while len(accepted) < 4:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.recv(65536)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    bad = _lean(f"http://127.0.0.1:{listener.getsockname()[1]}")
    with pytest.raises(errors.AWSError) as failed:
        bad.call("put_item", TableName=table, Item={"PK": {"S": "x"}, "SK": {"S": "1"}})
    assert failed.value.code == "ConnectionClosedError" and len(accepted) == 4  # every attempt
    listener.close()
    t.join(5)


def test_reads_answer_what_botocore_answers_for_every_value_type(dynalite_server, btable):
    table = btable
    """GetItem and BatchGetItem on the lean path: byte for byte botocore's parsed shapes (B and BS
    decoded to bytes at any depth, N as text, NULL/BOOL, sets, lists and maps), and the key of an
    absent item answers no Item, as botocore does."""
    d = _lean(dynalite_server.endpoint)
    plain = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1")
    plain._lean = None  # the reference: botocore's own parser
    sent, send = [], d._lean.send
    d._lean.send = lambda op, kw: sent.append(op) or send(op, kw)  # what the lean path answered
    item = {"PK": {"S": "r"}, "SK": {"B": b"\x00\x01\xfe"}, "n": {"N": "-1500"}, "ss": {"SS": ["a", "b"]},
            "ns": {"NS": ["1", "2"]}, "bs": {"BS": [b"\x00", b"\xff"]}, "null": {"NULL": True},
            "t": {"BOOL": False}, "empty": {"S": ""},
            "L": {"L": [{"B": b"\x07"}, {"M": {"B": {"B": b"\x08"}, "BS": {"S": "not binary"}}},
                        {"L": [{"BS": [b"\x09"]}]}]},
            "M": {"M": {"deep": {"M": {"x": {"B": b"\x0a"}}}, "s": {"S": '"B'}}}}
    plain.call("put_item", TableName=table, Item=item)
    key = {"PK": {"S": "r"}, "SK": {"B": b"\x00\x01\xfe"}}
    for kw in ({}, {"ConsistentRead": True, "ReturnConsumedCapacity": "TOTAL"}):
        got = d.call("get_item", TableName=table, Key=key, **kw)
        want = plain.call("get_item", TableName=table, Key=key, **kw)
        assert got["Item"] == item and got["Item"] == want["Item"]
        assert got.get("ConsumedCapacity") == want.get("ConsumedCapacity")
    assert sent == ["get_item", "get_item"]
    absent = {"PK": {"S": "r"}, "SK": {"B": b"\x02"}}
    assert set(d.call("get_item", TableName=table, Key=absent)) == {"ResponseMetadata"}
    got = d.call("batch_get_item", RequestItems={table: {"Keys": [key, absent], "ConsistentRead": True}},
                 ReturnConsumedCapacity="TOTAL")
    want = plain.call("batch_get_item", RequestItems={table: {"Keys": [key, absent], "ConsistentRead": True}},
                      ReturnConsumedCapacity="TOTAL")
    assert got["Responses"] == want["Responses"] == {table: [item]}
    assert got["ConsumedCapacity"] == want["ConsumedCapacity"] and not got.get("UnprocessedKeys")
    assert d.batch_get(table, [key, absent], consistent=True) == [item]
    assert sent.count("batch_get_item") == 2 and d.stats.calls["get_item"] == 3


def test_unprocessed_keys_come_back_as_bytes_and_are_asked_again(dynalite_server, btable):
    table = btable
    """A BatchGetItem answer's UnprocessedKeys (binary keys decoded) are re-sent by batch_get."""
    d = _lean(dynalite_server.endpoint, sleep=lambda s: None)
    item = {"PK": {"S": "u"}, "SK": {"B": b"\xff\x00"}}
    d.call("put_item", TableName=table, Item=item)
    bodies = []

    def once_unprocessed(request, **_):
        bodies.append(json.loads(request.body))
        if len(bodies) % 2:  # every other answer: nothing read, the key unprocessed (as under throttling)
            body = json.dumps({"Responses": {table: []}, "UnprocessedKeys": bodies[-1]["RequestItems"]}).encode()
            return AWSResponse(request.url, 200, {"x-amzn-requestid": "r1"}, _Body(body))
        return None

    d.client.meta.events.register("before-send.dynamodb.BatchGetItem", once_unprocessed)
    assert d.batch_get(table, [item], consistent=True) == [item]
    assert len(bodies) == 2 and bodies[1] == bodies[0]  # the same key, re-encoded from bytes
    resp = d.call("batch_get_item", RequestItems={table: {"Keys": [item]}})
    assert resp["UnprocessedKeys"] == {table: {"Keys": [item]}}  # bytes, as botocore parses them


def test_a_scan_page_answers_what_botocore_answers(dynalite_server, btable):
    """Scan (and Query) on the lean path (the jobs' pages): items of every value type, the binary
    LastEvaluatedKey a next page starts from, Count and ConsumedCapacity, as botocore parses them."""
    table = btable
    d = _lean(dynalite_server.endpoint)
    plain = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1")
    plain._lean = None
    sent, send = [], d._lean.send
    d._lean.send = lambda op, kw: sent.append(op) or send(op, kw)
    items = [{"PK": {"S": f"s{i}"}, "SK": {"B": bytes([i, 0xff])}, "n": {"N": str(i)}, "bs": {"BS": [b"\x01"]},
              "M": {"M": {"x": {"L": [{"B": b"\x02"}, {"BOOL": True}, {"NULL": True}]}}}} for i in range(5)]
    items.append({"PK": {"S": "plain"}, "SK": {"B": b"\x00"}, "t": {"BOOL": False}, "s": {"S": 'a "B": b'}})
    for item in items:
        plain.call("put_item", TableName=table, Item=item)
    kw = {"TableName": table, "Limit": 2, "ReturnConsumedCapacity": "TOTAL"}
    seen = []
    while True:
        got, want = d.call("scan", **kw), plain.call("scan", **kw)
        for name in ("Items", "Count", "ScannedCount", "LastEvaluatedKey", "ConsumedCapacity"):
            assert got.get(name) == want.get(name), name
        seen.extend(got["Items"])
        if not got.get("LastEvaluatedKey"):
            break
        assert isinstance(got["LastEvaluatedKey"]["SK"]["B"], bytes)
        kw["ExclusiveStartKey"] = got["LastEvaluatedKey"]  # bytes, sent back as base64
    assert sorted(seen, key=repr) == sorted(items, key=repr) and sent.count("scan") == len(sent) >= 3
    assert d.stats.consumed[table] > 0
    # Query: the same shapes, page after page (a binary sort key in LastEvaluatedKey, a key condition on it).
    kw = {"TableName": table, "KeyConditionExpression": "PK = :p AND SK > :b", "Limit": 1, "ScanIndexForward": False,
          "ExpressionAttributeValues": {":p": {"S": "s3"}, ":b": {"B": b"\x00"}}, "ReturnConsumedCapacity": "TOTAL"}
    found = []
    for _ in range(3):
        got, want = d.call("query", **kw), plain.call("query", **kw)
        for name in ("Items", "Count", "ScannedCount", "LastEvaluatedKey", "ConsumedCapacity"):
            assert got.get(name) == want.get(name), name
        found.extend(got["Items"])
        if not got.get("LastEvaluatedKey"):
            break
        kw["ExclusiveStartKey"] = got["LastEvaluatedKey"]
    assert found == [items[3]] and "query" in sent


def test_numbers_written_in_other_forms_read_back_alike_and_digest_alike(dynalite_server, table):
    """verify's content digest compares numbers as DynamoDB returns them: normalised, so ``1.0``
    and ``1``, ``01.50`` and ``1.5`` are one number (and ``1`` and ``2`` are not)."""
    from reshard.core.join import digest
    d = _lean(dynalite_server.endpoint)
    forms = {"a": ("1.0", "01.50", ["2", "1.0"]), "b": ("1", "1.5", ["2", "1"]), "c": ("2", "1.5", ["2", "1"])}
    for pk, (n, m, ns) in forms.items():
        d.call("put_item", TableName=table, Item={"PK": {"S": pk}, "SK": {"S": "1"}, "n": {"N": n},
                                                    "doc": {"M": {"m": {"N": m}}}, "ns": {"NS": ns}})
    read = {i["PK"]["S"]: {k: v for k, v in i.items() if k not in ("PK", "SK")}
            for i in d.call("scan", TableName=table)["Items"]}
    assert digest(read["a"]) == digest(read["b"]) != digest(read["c"])


def test_a_2xx_answer_neither_parser_reads_raises_instead_of_an_empty_page(dynalite_server, table):
    """A Scan answered 200 with a body that is no JSON: an error, never ``{}`` (no Items, no
    LastEvaluatedKey), which a job would take for the end of its segment."""
    d = _lean(dynalite_server.endpoint)
    d.client.meta.events.register(
        "before-send.dynamodb.Scan",
        lambda request, **_: AWSResponse("http://127.0.0.1/", 200, {"x-amzn-RequestId": "x"}, _Body(b'{"Items": [')))
    with pytest.raises(errors.AWSError, match="unreadable Scan answer"):
        d.call("scan", TableName=table)
