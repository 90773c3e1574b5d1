"""The fidelity proxy's pure parts: SigV4 dates and AWS's refusal messages, rules' matching and counting,
answers' Date header and CRC32, request parsing."""

from __future__ import annotations

import json
import random
import zlib

import pytest

from reshard.aws.fidelity import wire
from reshard.aws.fidelity.rules import Rule, request_keys
from reshard.aws.fidelity.wire import Request, amz_date, parse_amz_date, signature_refusal


def test_amz_dates_round_trip_and_junk_is_not_a_date():
    t = 1_795_000_000.0
    assert amz_date(t) == "20261118T110640Z"
    assert parse_amz_date(amz_date(t)) == t
    for junk in ("", "20261118T074000", "2026-11-18T07:40:00Z", "20261318T074000Z", "2026111xT074000Z"):
        assert parse_amz_date(junk) is None


def test_signature_refusals_have_awss_wording_and_bounds():
    now = 1_795_000_000.0
    assert signature_refusal(amz_date(now - 300), now - 300, now + 0.9, 300) is None
    assert signature_refusal(amz_date(now + 300), now + 300, now, 300) is None
    assert signature_refusal(amz_date(now - 301), now - 301, now + 0.9, 300) == (
        "Signature expired: 20261118T110139Z is now earlier than 20261118T110140Z (20261118T110640Z - 5 min.)")
    assert signature_refusal(amz_date(now + 301), now + 301, now, 300) == (
        "Signature not yet current: 20261118T111141Z is still later than 20261118T111140Z "
        "(20261118T110640Z + 5 min.)")
    assert signature_refusal(amz_date(now - 900), now - 900, now, 900 - 1) .endswith("- 14.9833 min.)")


def req(op: str, body: dict) -> Request:
    return Request.make({"x-amz-target": f"DynamoDB_20120810.{op}"}, json.dumps(body).encode())


def test_rules_match_on_operation_table_key_and_body():
    put = req("PutItem", {"TableName": "T", "Item": {"pk": {"S": "a"}, "v": {"N": "1"}}})
    batch = req("BatchWriteItem", {"RequestItems": {"U": [{"DeleteRequest": {"Key": {"pk": {"S": "b"}}}}]}})
    assert Rule("r", "hold", op="PutItem").matches(put) and not Rule("r", "hold", op="GetItem").matches(put)
    assert Rule("r", "hold", table=["T", "X"]).matches(put) and Rule("r", "hold", table="U").matches(batch)
    assert Rule("r", "hold", key={"pk": "a"}).matches(put) and not Rule("r", "hold", key={"pk": "b"}).matches(put)
    assert Rule("r", "hold", key={"pk": {"S": "b"}}).matches(batch)
    assert Rule("r", "hold", contains='"v"').matches(put) and not Rule("r", "hold", contains="zzz").matches(put)
    assert Rule("r", "hold", where=lambda op, body: body["Item"]["v"]["N"] == "1").matches(put)
    get = req("BatchGetItem", {"RequestItems": {"T": {"Keys": [{"pk": {"S": "c"}}]}}})
    assert request_keys(get.json) == [{"pk": {"S": "c"}}]


def test_rules_count_nth_times_and_probability():
    rng = random.Random(1)
    r = Rule("r", "fail", nth=3, times=2)
    assert [r.take(rng) for _ in range(6)] == [False, False, True, True, False, False]
    r = Rule("r", "fail", times=None, probability=0.25)
    hits = sum(r.take(rng) for _ in range(4000))
    assert 850 < hits < 1150 and r.matched == 4000 and r.applied == hits
    with pytest.raises(ValueError, match="unknown action"):
        Rule("r", "explode")
    with pytest.raises(ValueError, match="wait or lose"):
        Rule("r", "hold", mode="later")


class _Sock:
    """A socket that hands out ``data`` a few bytes at a time (messages split anywhere)."""

    def __init__(self, data: bytes, step: int = 7):
        self.data, self.step = data, step

    def recv(self, n: int) -> bytes:
        out, self.data = self.data[:min(n, self.step)], self.data[min(n, self.step):]
        return out


def test_requests_and_answers_on_the_wire():
    raw = (b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.GetItem\r\nX-Amz-Date: 20261118T110640Z"
           b"\r\nContent-Length: 2\r\n\r\n{}")
    stream = wire.Stream(_Sock(b"\r\n" + raw + raw))
    for _ in range(2):
        r = stream.read_request()
        assert r.op == "GetItem" and r.header(b"x-amz-date") == "20261118T110640Z" and r.json == {}
        assert r.headers["host"] == "x" and r.raw("up:1") == raw  # forwarded as the client sent it
    assert stream.read_request() is None
    changed = r.with_body({"TableName": "T"})
    assert b"content-length: 17\r\n" in changed.raw("up:1") and b"host: up:1\r\n" in changed.raw("up:1")
    assert changed.raw("up:1").endswith(b'\r\n\r\n{"TableName":"T"}') and changed.tables() == ["T"]
    answer = wire.aws_error(400, wire.CORAL_ERROR + "InvalidSignatureException", "m")
    out = wire.encode_answer(answer, "Thu, 01 Jan 1970 00:00:00 GMT")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT" in head
    assert json.loads(body) == {"__type": "com.amazon.coral.service#InvalidSignatureException", "message": "m"}
    assert dict(answer.headers)["x-amz-crc32"] == str(zlib.crc32(body))
    assert answer.code == "InvalidSignatureException"
    upstream = (b"HTTP/1.1 200 OK\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nTransfer-Encoding: chunked\r\n"
                b"x-amz-crc32: 1\r\nConnection: close\r\n\r\n2\r\n{}\r\n3\r\n   \r\n0\r\n\r\n"
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}")
    stream = wire.Stream(_Sock(upstream, step=5))
    a = stream.read_answer()
    assert a.status == 200 and a.body == b"{}   " and [k for k, _ in a.headers] == ["x-amz-crc32"] and a.close
    bare = stream.read_answer()  # only headers the proxy sets itself: none left, no empty line
    assert bare.status == 400 and bare.lines == b"" and wire.encode_answer(bare, "d").count(b"\r\n\r\n") == 1
    b = a.with_json({"Items": []})
    assert dict(b.headers)["x-amz-crc32"] == str(zlib.crc32(b.body))
    date = wire.HttpDate()
    assert date(0.5) == "Thu, 01 Jan 1970 00:00:00 GMT" and date(86400.2) == "Fri, 02 Jan 1970 00:00:00 GMT"
