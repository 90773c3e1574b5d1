"""Requests signed with a horizon's date (docs/late-writes.md): both send paths, the server's Date.

A loopback HTTP server records each request's ``X-Amz-Date`` and answers like DynamoDB with a
fixed ``Date`` header: ``Dynamo.call(horizon=...)`` must sign ``floor(horizon - W)`` on the lean
path and on botocore's, every attempt (a retry too), and ``answer_date()`` must read the ``Date``.
"""

from __future__ import annotations

import http.server
import json
import threading

import boto3
import botocore.config
import pytest

from reshard.aws import signing
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.core import deadlines

pytestmark = pytest.mark.unit

SERVER_DATE = "Fri, 27 Nov 2026 19:30:00 GMT"
SERVER_EPOCH = 1795807800.0  # the same instant


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list = []
    fail_first: list = []

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Recorder.seen.append((self.headers.get("X-Amz-Date"), self.headers.get("X-Amz-Target"), body))
        if _Recorder.fail_first:
            _Recorder.fail_first.pop()
            status, out = 500, {"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError", "message": "x"}
        else:
            status, out = 200, {}
        data = json.dumps(out).encode()
        self.send_response_only(status)
        self.send_header("Date", SERVER_DATE)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def server():
    _Recorder.seen = []
    _Recorder.fail_first = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _dynamo(endpoint: str, lean: bool, monkeypatch) -> Dynamo:
    monkeypatch.setenv("RESHARD_LEAN", "1" if lean else "0")
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                          config=botocore.config.Config(retries={"max_attempts": 1, "mode": "standard"}))
    return Dynamo(client, retry=RetryPolicy(max_attempts=3, base_seconds=0.001, max_backoff_seconds=0.001))


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "botocore"])
def test_a_call_with_a_horizon_is_signed_w_before_it_on_every_attempt(server, lean, monkeypatch):
    d = _dynamo(server, lean, monkeypatch)
    assert (d._lean is not None) is lean
    horizon = 1_790_000_000.7
    _Recorder.fail_first.append(1)  # the first attempt answers 500: the retry is signed alike
    d.call("put_item", horizon=lambda: horizon, TableName="t", Item={"pk": {"S": "a"}})
    dates = [s[0] for s in _Recorder.seen]
    assert len(dates) == 2
    want = deadlines.amz_date(horizon - deadlines.SIGNATURE_WINDOW_SECONDS)
    assert dates == [want, want] and want == "20260921T140820Z"
    # Without a horizon: signed now (not the chosen date).
    d.call("put_item", TableName="t", Item={"pk": {"S": "a"}})
    assert _Recorder.seen[-1][0] != want
    assert signing.SIGN_DATE.get() is None  # never leaks out of the call


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "botocore"])
def test_the_answer_date_is_the_servers_clock(server, lean, monkeypatch):
    d = _dynamo(server, lean, monkeypatch)
    assert d.answer_date() is None
    d.call("get_item", TableName="t", Key={"pk": {"S": "a"}})
    assert d.answer_date() == SERVER_EPOCH


def test_a_horizon_that_raises_stops_the_attempt(server, monkeypatch):
    d = _dynamo(server, True, monkeypatch)

    class Expired(Exception):
        pass

    def gone():
        raise Expired()

    with pytest.raises(Expired):
        d.call("put_item", horizon=gone, TableName="t", Item={"pk": {"S": "a"}})
    assert _Recorder.seen == []


def test_the_dated_signer_is_botocores_sigv4():
    signing.self_check()  # raises if DatedSigV4Auth no longer reproduces botocore's signature
    assert signing._checked == [True]


def test_dates_round_down_and_parse_back():
    assert deadlines.sign_epoch(1000.9, window=300) == 700
    assert deadlines.parse_amz_date(deadlines.amz_date(1_790_000_000.9)) == 1_790_000_000
    assert deadlines.parse_http_date(SERVER_DATE) == SERVER_EPOCH
    assert deadlines.parse_http_date("garbage") is None and deadlines.parse_http_date(None) is None
    assert deadlines.clamp_horizon(1e125) == deadlines.MAX_HORIZON_SECONDS
    assert deadlines.clamp_horizon(float("nan")) == deadlines.DEFAULT_HORIZON_SECONDS
    assert deadlines.phase_left(100.0, 110.0, 15.0) == 7.0 and deadlines.phase_left(100.0, 200.0, 15.0) == 0.0
    refused, accepted = deadlines.probe_dates(10_000.0, window=300)
    assert refused < 10_000 - 300 < accepted
