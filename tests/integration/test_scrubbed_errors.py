"""No path shows a credential a server quoted back (issue 30, case 3).

AWS's error messages can carry what the request was signed with: InvalidSignatureException
quotes the canonical request (the signed ``x-amz-security-token`` header: the session token)
and the string to sign; IncompleteSignatureException quotes the ``Authorization`` header
(``Credential=<access key id>/...``, ``Signature=<hex>``). Each known shape (as users
reported them) is answered to every request by a loopback server, through the lean path and
through botocore, and each path that shows error text is searched: the CLI's error line,
its ``--verbose`` traceback, the shim's log lines, and what the application catches (``str``
of the exception, its ``response``, its formatted traceback with the chained botocore error).
One function scrubs them all: ``reshard.errors.scrub``.
"""

from __future__ import annotations

import json
import logging
import traceback

import pytest

from reshard import errors
from reshard.cli.main import main
from reshard.shim.table import ShardedTable

from tests.hostile_server import Fault, HostileProxy, answer
from tests.iam_support import KEY_ID, SECRET, TOKEN, fake_credentials
from tests.shim_helpers import create_table, migration

pytestmark = pytest.mark.integration

SIGNATURE = "f25d654c0543603aa2924ed7fa8365fde8b97223112233445566778899aabbcc"
CANONICAL = ("POST\n/\n\ncontent-type:application/x-amz-json-1.0\nhost:dynamodb.us-east-1.amazonaws.com\n"
             f"x-amz-date:20240101T000000Z\nx-amz-security-token:{TOKEN}\nx-amz-target:DynamoDB_20120810.GetItem\n\n"
             "content-type;host;x-amz-date;x-amz-security-token;x-amz-target\n"
             "9c3f1f4b1e2a6d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6e5f4")
#: (code, message) as AWS answers them (shapes collected from users' reports).
SHAPES = {
    "InvalidSignature-canonical": (
        "com.amazon.coral.service#InvalidSignatureException",
        "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access "
        "Key and signing method. Consult the service documentation for details.\n\nThe Canonical String for this "
        f"request should have been\n'{CANONICAL}'\n\nThe String-to-Sign should have been\n'AWS4-HMAC-SHA256\n"
        "20240101T000000Z\n20240101/us-east-1/dynamodb/aws4_request\n"
        "0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c'\n"),
    "IncompleteSignature-header": (
        "IncompleteSignatureException",
        f"'{KEY_ID} /20240101/us-east-1/dynamodb/aws4_request' not a valid key=value pair (missing equal-sign) in "
        f"Authorization header: 'AWS4-HMAC-SHA256 Credential={KEY_ID} /20240101/us-east-1/dynamodb/aws4_request, "
        f"SignedHeaders=host;x-amz-date;x-amz-security-token;x-amz-target, Signature={SIGNATURE}'."),
    "IncompleteSignature-requires": (
        "IncompleteSignatureException",
        "Authorization header requires 'Signature' parameter. Authorization header requires 'SignedHeaders' "
        f"parameter. Authorization=AWS4-HMAC-SHA256 Credential={KEY_ID}/20240101/us-east-1/dynamodb/aws4_request"),
    "UnrecognizedClient": ("com.amazon.coral.service#UnrecognizedClientException",
                           "The security token included in the request is invalid."),
    "ExpiredToken": ("com.amazon.coral.service#ExpiredTokenException",
                     "The security token included in the request is expired"),
    "AccessDenied-arn": (
        "com.amazon.coral.service#AccessDeniedException",
        "User: arn:aws:sts::123456789012:assumed-role/app/i-0abc is not authorized to perform: dynamodb:GetItem on "
        "resource: arn:aws:dynamodb:us-east-1:123456789012:table/ctl because no identity-based policy allows the "
        "dynamodb:GetItem action"),
    "SignatureExpired": ("com.amazon.coral.service#InvalidSignatureException",
                         "Signature expired: 20240101T000000Z is now earlier than 20240101T000501Z "
                         "(20240101T001001Z - 5 min.)"),
    "Token-in-a-query": ("com.amazon.coral.service#InvalidSignatureException",
                         f"Credential should be scoped to a valid region. X-Amz-Security-Token={TOKEN}&"
                         f"X-Amz-Credential={KEY_ID}%2F20240101&X-Amz-Signature={SIGNATURE}"),
}
#: What no output may contain (the values, not the words AWS uses around them).
SECRETS = (KEY_ID, SECRET, TOKEN, TOKEN[:16], SIGNATURE, SIGNATURE[:16])


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def refuse_everything(proxy: HostileProxy, shape: str) -> None:
    code, message = SHAPES[shape]
    body = json.dumps({"__type": code, "message": message})
    proxy.fault = lambda target, request: Fault(answer(body, status=400))


@pytest.fixture
def proxy(dynalite_server):
    with HostileProxy(dynalite_server.endpoint) as p:
        yield p


@pytest.mark.parametrize("lean", ["1", "0"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_reaches_no_path_with_a_credential(proxy, dynalite_server, unique_name, monkeypatch, capsys, caplog,
                                                     shape, lean):
    fake_credentials(monkeypatch)
    monkeypatch.setenv("RESHARD_LEAN", lean)
    caplog.set_level(logging.DEBUG, logger="reshard")
    m = migration("sensor", unique_name)
    from reshard.aws.dynamo import Dynamo, RetryPolicy
    create_table(Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1"), m)
    refuse_everything(proxy, shape)
    code, message = SHAPES[shape]

    # The CLI: its error line, then with --verbose its traceback.
    for extra in ([], ["--verbose"]):
        rc = main(["status", m.id, "--endpoint-url", proxy.endpoint, "--region", "us-east-1", *extra])
        out, err = capsys.readouterr()
        assert rc != 0 and "reshard: error: " in err and "internal error" not in err, err
        assert leaked(out + err) == [], (extra, err)
        assert "\x1b" not in err
        if extra:
            assert "Traceback" in err
    assert code.rpartition("#")[2] in err  # the server's answer did reach the CLI (its code is shown)

    # The shim: its log lines (a refresh that fails), and what the application catches.
    d = Dynamo(endpoint_url=proxy.endpoint, region="us-east-1",
               retry=RetryPolicy(max_attempts=1), connect_timeout=1, read_timeout=2)
    shim = ShardedTable(m, d, control_table=f"{unique_name}-ctl", refresh_seconds=60)
    try:
        with pytest.raises(errors.ReshardError) as caught:
            shim.put_item(Item={"sensor_id": "s", "event_id": "e", "ts": "2024-01-01T00:00:00Z"})
    finally:
        shim.close()
    e = caught.value
    seen = [str(e), repr(getattr(e, "response", None)), "".join(traceback.format_exception(e))]
    seen += [r.getMessage() for r in caplog.records]
    assert leaked("\n".join(seen)) == [], shape
    assert any("phase refresh failed" in r.getMessage() for r in caplog.records)
    if shape == "AccessDenied-arn":  # what the operator needs to fix a policy stays
        assert "arn:aws:sts::123456789012:assumed-role/app/i-0abc" in "\n".join(seen)
    if shape == "SignatureExpired":
        assert "Signature expired: 20240101T000000Z" in "\n".join(seen)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_scrub_keeps_what_an_operator_needs_and_removes_the_rest(shape):
    code, message = SHAPES[shape]
    out = errors.scrub(message)
    assert leaked(out) == []
    assert errors.scrub(out) == out  # idempotent
    if "Canonical" in message:
        assert out.startswith("The request signature we calculated does not match") and "canonical request" in out
    assert str(errors.AWSError("get_item", code, message)).count("removed") == out.count("removed")
