"""The lean request path's pure parts: its SigV4 signature equals botocore's, its HTTP reader."""

from __future__ import annotations

import io
import time

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from reshard.aws.lean import _dumps, _read_response, sign, signing_key


def _botocore_signature(creds, region, url, headers, body, amz_date):
    """What botocore's own SigV4Auth computes for the same request at the same instant."""
    req = AWSRequest(method="POST", url=url, data=body, headers=dict(headers, **{"X-Amz-Date": amz_date}))
    req.context["timestamp"] = amz_date
    auth = SigV4Auth(creds, "dynamodb", region)
    canonical = auth.canonical_request(req)
    return auth.signature(auth.string_to_sign(req, canonical), req), auth.signed_headers(auth.headers_to_sign(req))


def test_the_signature_is_botocores():
    now = time.gmtime(1_790_000_000)
    body = _dumps({"TableName": "t", "Item": {"pk": {"S": "a  b"}, "bin": {"B": b"\x00\xff"}}})
    for creds, host, url in ((Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG"), "127.0.0.1:8000",
                              "http://127.0.0.1:8000/"),
                             (Credentials("ASIAEXAMPLE", "secret", "the  session token"), "dynamodb.eu-west-1.amazonaws.com",
                              "https://dynamodb.eu-west-1.amazonaws.com/")):
        region = "eu-west-1"
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "DynamoDB_20120810.PutItem"}
        if creds.token:
            headers["X-Amz-Security-Token"] = creds.token
        out = sign(lambda secret, date: signing_key(secret, date, region), creds.access_key, creds.secret_key,
                   region, host, headers, body, now)
        expected, signed_names = _botocore_signature(creds, region, url, headers, body, out["X-Amz-Date"])
        assert out["X-Amz-Date"] == "20260921T141320Z"
        assert out["Authorization"].endswith(f"Signature={expected}")
        assert f"SignedHeaders={signed_names}," in out["Authorization"]
        assert f"Credential={creds.access_key}/20260921/{region}/dynamodb/aws4_request," in out["Authorization"]


def test_binary_values_go_as_base64_like_botocore():
    assert _dumps({"B": b"\x00\xff"}) == b'{"B":"AP8="}'


def test_the_reader_takes_content_length_and_chunked_answers():
    plain = io.BytesIO(b"HTTP/1.1 400 Bad Request\r\nX-Amzn-RequestId: r1\r\nContent-Length: 2\r\n\r\n{}rest")
    assert _read_response(plain) == (400, {"x-amzn-requestid": "r1", "content-length": "2"}, b"{}")
    chunked = io.BytesIO(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert _read_response(chunked)[2] == b"abcde"


def test_a_cut_answer_is_a_dropped_connection():
    import pytest
    with pytest.raises(ConnectionResetError):
        _read_response(io.BytesIO(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"))
    with pytest.raises(ConnectionResetError):
        _read_response(io.BytesIO(b""))
