"""The lean path against a server that misbehaves on loopback (issue 30, case 7).

Each answer below once got through as something other than a clean, retryable-or-reported
error: a Content-Length of 2**62 was a MemoryError, -1 read to the end of the connection,
a thousand headers were all read and kept, an answer trickling a byte at a time stayed
within the per-read timeout and outlasted the attempt bound the census and the job fences
assume, and a CR/LF in the application's ``user_agent_extra`` was written raw into the
request, starting a header of its own. Now each is an :class:`~reshard.errors.AWSError` out
of the choke point (or, for the user agent, a request whose headers are the ones we meant).
"""

from __future__ import annotations

import boto3
import botocore.config
import pytest

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy, make_client
from reshard.aws.local import wait_active

from tests.hostile_server import Fault, HostileProxy, answer, on_table

pytestmark = pytest.mark.integration

ITEM = '{"Item":{"pk":{"S":"a"},"v":{"S":"' + "x" * 60 + '"}}}'


@pytest.fixture
def proxied(dynalite_server, unique_name):
    d = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1")
    d.call("create_table", TableName=unique_name, BillingMode="PAY_PER_REQUEST",
           KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
           AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}])
    wait_active(d, unique_name)  # dynalite answers a CREATING table's GetItem with ResourceNotFound
    with HostileProxy(dynalite_server.endpoint) as proxy:
        yield proxy, unique_name


def client(endpoint: str, **config) -> Dynamo:
    d = Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=1),
               connect_timeout=0.5, read_timeout=1.0)
    assert d._lean is not None, "the lean path is what this test is about"
    return d


def get(d: Dynamo, table: str) -> dict:
    return d.call("get_item", TableName=table, Key={"pk": {"S": "a"}}, ConsistentRead=True)


CASES = [
    ("Content-Length 2**62", Fault(answer("", length=str(2 ** 62)), close=True), "UnreadableAnswer"),
    ("Content-Length -1", Fault(answer("{}", length="-1"), close=True), "ConnectionClosedError"),
    ("Content-Length 1e3", Fault(answer("{}", length="1e3"), close=True), "ConnectionClosedError"),
    ("a thousand headers", Fault(answer("{}", headers={f"X-H{i}": "v" for i in range(1000)})), "UnreadableAnswer"),
    ("a 100 KB header", Fault(answer("{}", headers={"X-Big": "v" * 100_000})), "UnreadableAnswer"),
    ("a chunk size past the body bound",
     Fault(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFF\r\n", close=True), "UnreadableAnswer"),
    ("a status line that is no HTTP", Fault(b"HELLO\r\n\r\n", close=True), "ConnectionClosedError"),
    ("a non-numeric x-amz-crc32", Fault(answer(ITEM, headers={"x-amz-crc32": "abc"})), "ConnectionClosedError"),
    ("a 2xx body []", Fault(answer("[]")), "UnreadableAnswer"),
]


@pytest.mark.parametrize("name, fault, code", CASES, ids=[c[0].replace(" ", "-") for c in CASES])
def test_a_bad_answer_is_one_clean_error(proxied, name, fault, code):
    proxy, table = proxied
    proxy.fault = on_table(table, fault)
    with pytest.raises(errors.AWSError) as e:
        get(client(proxy.endpoint), table)
    assert e.value.code == code, (name, str(e.value))
    proxy.fault = None
    assert get(client(proxy.endpoint), table).get("Item") is None  # the path still works


def test_a_trickling_answer_does_not_outlast_the_attempt(proxied):
    """One byte every 0.1 s: each read is well within the 1 s read timeout, the whole answer
    (about 150 bytes: 15 s) far beyond the attempt's 1.5 s. Before: it was read to the end
    and returned. Now the attempt's deadline ends it (a timeout, retried by the policy)."""
    proxy, table = proxied
    proxy.fault = on_table(table, Fault(answer(ITEM), trickle=0.1, chunk=1, close=True))
    with pytest.raises(errors.AWSError) as e:
        get(client(proxy.endpoint), table)
    assert e.value.code == "ReadTimeoutError", str(e.value)


def test_a_line_break_in_user_agent_extra_is_never_written_into_a_header(proxied, monkeypatch):
    proxy, table = proxied
    session = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1")
    raw = session.client("dynamodb", endpoint_url=proxy.endpoint, config=botocore.config.Config(
        user_agent_extra="myapp/1.0\r\nX-Injected: yes", retries={"total_max_attempts": 1},
        connect_timeout=1, read_timeout=2))
    d = Dynamo(raw)
    assert d._lean is not None
    assert get(d, table).get("Item") is None
    sent = proxy.requests[-1]
    assert "X-Injected" not in sent and not any("\r" in v or "\n" in v for v in sent.values())
    assert "myapp/1.0" in sent["User-Agent"]
