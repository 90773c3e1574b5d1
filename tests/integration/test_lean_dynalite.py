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
