"""The fidelity proxy's step 1 (issue 29 / issue 25): signature age, the Date header, held
(late) requests, lost answers, duplicates -- each against dynalite, as DynamoDB does it or as
users observe it.

AWS's refusal of a request signed too long before it arrives, as users quote it:
``InvalidSignatureException: Signature expired: 20160610T180547Z is now earlier than
20160610T180612Z (20160610T181112Z - 5 min.)`` (HTTP 400, ``__type``
``com.amazon.coral.service#InvalidSignatureException``), and for a date ahead of the server's
clock ``Signature not yet current: 20181017T093750Z is still later than 20181017T093639Z
(20181017T093139Z + 5 min.)``.
"""

from __future__ import annotations

import email.utils
import subprocess
import sys
import threading
import time

import pytest

from reshard import errors
from reshard.aws.fidelity import FidelityProcess, FidelityProxy
from reshard.aws.fidelity.wire import amz_date

from tests.fidelity_support import client, get, make_table, raw_call

T = 1_795_000_000.0  # a fixed proxy clock: every date in the messages below is exact
SIGNATURE = "com.amazon.coral.service#InvalidSignatureException"


@pytest.fixture
def proxy(dynalite_server):
    with FidelityProxy(dynalite_server.endpoint) as p:
        yield p


@pytest.fixture
def table(dynalite, unique_name):
    make_table(dynalite, unique_name)
    return unique_name


def put(pk: str, v: int, table: str) -> dict:
    return {"TableName": table, "Item": {"pk": {"S": pk}, "v": {"N": str(v)}}}


def test_a_request_signed_more_than_the_window_away_is_refused_with_awss_message(dynalite_server, dynalite,
                                                                                 table):
    with FidelityProxy(dynalite_server.endpoint, clock=lambda: T + 0.4) as p:
        status, _, body = raw_call(p.endpoint, "PutItem", put("old", 1, table), signed_at=T - 301)
        assert status == 400
        assert body == {"__type": SIGNATURE, "message": f"Signature expired: {amz_date(T - 301)} is now earlier "
                                                        f"than {amz_date(T - 300)} ({amz_date(T)} - 5 min.)"}
        status, _, body = raw_call(p.endpoint, "PutItem", put("new", 1, table), signed_at=T + 301)
        assert status == 400
        assert body == {"__type": SIGNATURE, "message": f"Signature not yet current: {amz_date(T + 301)} is still "
                                                        f"later than {amz_date(T + 300)} ({amz_date(T)} + 5 min.)"}
        # Exactly at the bound is still accepted, on either side.
        assert raw_call(p.endpoint, "PutItem", put("edge-old", 1, table), signed_at=T - 300)[0] == 200
        assert raw_call(p.endpoint, "PutItem", put("edge-new", 1, table), signed_at=T + 300)[0] == 200
        # A refused request never reached dynalite.
        assert get(dynalite, table, "old") is None and get(dynalite, table, "new") is None
        assert get(dynalite, table, "edge-old") is not None
        assert p.stats()["refused_signature"] == 2
        # The window is a setting; 0 turns the check off.
        p.configure(signature_window=60)
        _, _, body = raw_call(p.endpoint, "ListTables", {}, signed_at=T - 61)
        assert body["message"].endswith(f"({amz_date(T)} - 1 min.)")
        p.configure(signature_window=0)
        assert raw_call(p.endpoint, "ListTables", {}, signed_at=T - 86400)[0] == 200


def test_botocore_and_the_lean_path_get_the_refusal_once_never_retried(proxy, table):
    dynamo = client(proxy.endpoint)
    proxy.configure(clock_offset=301)  # the server's clock ahead of this client's by more than the window
    before = proxy.stats()["requests"]
    with pytest.raises(errors.AWSError) as e:
        dynamo.call("describe_table", TableName=table)           # botocore's path
    assert e.value.code == "InvalidSignatureException"
    assert e.value.response["Error"]["Message"].startswith("Signature expired: ")
    with pytest.raises(errors.AWSError) as e:
        dynamo.call("put_item", **put("x", 1, table))            # the lean path
    assert e.value.code == "InvalidSignatureException"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert proxy.stats()["requests"] - before == 2  # a client error: not retried


def test_every_answer_carries_a_date_header_from_the_proxys_clock(dynalite_server, table):
    now = [T + 0.7]
    with FidelityProxy(dynalite_server.endpoint, clock=lambda: now[0]) as p:
        expected = email.utils.formatdate(T, usegmt=True)
        assert expected.endswith(" GMT") and expected.startswith(time.strftime("%a, ", time.gmtime(T)))
        status, headers, _ = raw_call(p.endpoint, "PutItem", put("a", 1, table), signed_at=T)
        assert status == 200 and headers["date"] == expected          # upstream's Date replaced, not added
        status, headers, body = raw_call(p.endpoint, "DescribeTable", {"TableName": table + "-missing"},
                                         signed_at=T)
        assert status == 400 and body["__type"].endswith("ResourceNotFoundException")
        assert headers["date"] == expected
        status, headers, _ = raw_call(p.endpoint, "ListTables", {}, signed_at=T - 3600)
        assert status == 400 and headers["date"] == expected          # the proxy's own refusal too
        p.configure(clock_offset=90)                                   # a server clock 90 s ahead
        _, headers, _ = raw_call(p.endpoint, "ListTables", {}, signed_at=T + 90)
        assert headers["date"] == email.utils.formatdate(T + 90, usegmt=True)
        assert p.now() == pytest.approx(T + 90.7)


def test_a_held_request_lands_when_released_and_its_waiting_client_gets_the_answer(proxy, dynalite, table):
    dynamo = client(proxy.endpoint, read_timeout=20)
    rule = proxy.hold(op="PutItem", table=table, key={"pk": "k"})
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("resp", dynamo.call("put_item", **put("k", 1, table))))
    t.start()
    held, = proxy.wait_held(1, rule)
    assert held["op"] == "PutItem" and held["client_waiting"] and held["keys"][0]["pk"] == {"S": "k"}
    time.sleep(0.2)
    assert get(dynalite, table, "k") is None and "resp" not in done     # not landed, the client waits
    outcome = proxy.release(held["handle"])
    assert outcome["status"] == 200
    t.join(10)
    assert "resp" in done and get(dynalite, table, "k")["v"] == {"N": "1"}
    assert proxy.held(rule) == [] and proxy.held(rule, state="delivered")[0]["handle"] == held["handle"]


def test_a_late_request_lands_over_a_newer_write_unless_its_signature_is_too_old(proxy, dynalite, table):
    """The hazard of issue 25 and the server's fence: a put whose connection was closed (the
    client retried and moved on) lands later over a newer write; past the window it is refused."""
    dynamo = client(proxy.endpoint)
    for late_by, expected in ((0, "1"), (301, "2")):
        pk = f"k{late_by}"
        rule = proxy.hold(op="PutItem", table=table, key={"pk": pk}, mode="lose")
        dynamo.call("put_item", **put(pk, 1, table))        # connection closed; its retry lands
        held, = proxy.wait_held(1, rule)
        assert not held["client_waiting"]
        dynamo.call("put_item", **put(pk, 2, table))        # a newer acknowledged write
        proxy.advance_clock(late_by)
        outcome = proxy.release(held["handle"])
        assert get(dynalite, table, pk)["v"] == {"N": expected}
        if late_by:
            assert outcome["status"] == 400 and outcome["code"] == "InvalidSignatureException"
            assert outcome["message"].startswith(f"Signature expired: {held['amz_date']} is now earlier than ")
        else:
            assert outcome["status"] == 200  # the late original undid the newer write
        proxy.configure(clock_offset=0)


def test_a_held_request_can_be_judged_as_if_held_for_minutes(proxy, dynalite, table):
    """``age``: a request held a moment is judged on delivery as if it had been held minutes."""
    dynamo = client(proxy.endpoint)
    within = proxy.hold(op="PutItem", table=table, key={"pk": "m1"}, mode="lose", age=240)
    past = proxy.hold(op="PutItem", table=table, key={"pk": "m2"}, mode="lose", age=301)
    dupe = proxy.duplicate(op="PutItem", table=table, key={"pk": "m3"}, copy="hold", age=301)
    for pk in ("m1", "m2", "m3"):
        dynamo.call("put_item", **put(pk, 1, table))  # each retry (or the original) lands now
    (h1,), (h2,), (h3,) = proxy.wait_held(1, within), proxy.wait_held(1, past), proxy.held(dupe)
    assert proxy.release(h1["handle"])["status"] == 200        # 4 minutes late: still inside AWS's 5
    late = proxy.release(h2["handle"])
    assert late["code"] == "InvalidSignatureException" and late["message"].endswith(" - 5 min.)")
    assert proxy.release(h3["handle"])["code"] == "InvalidSignatureException"
    assert proxy.rules()[0]["age"] == 240 and proxy.now() < time.time() + 5  # the proxy's clock did not move


def test_a_held_request_with_a_delay_is_delivered_by_the_proxy(proxy, dynalite, table):
    dynamo = client(proxy.endpoint)
    rule = proxy.hold(op="PutItem", table=table, key={"pk": "d"}, delay=0.3, mode="lose")
    dynamo.call("put_item", **put("d", 1, table))  # the original is held; the retry lands at once
    deadline = time.monotonic() + 30
    while not proxy.held(rule, state="delivered") and time.monotonic() < deadline:
        time.sleep(0.02)
    delivered, = proxy.held(rule, state="delivered")
    assert delivered["outcome"]["status"] == 200 and delivered["held_seconds"] >= 0.3
    assert get(dynalite, table, "d")["v"] == {"N": "1"}


def test_a_lost_answers_request_is_applied_once_and_its_retry_sees_it(proxy, dynalite, table):
    dynamo = client(proxy.endpoint)
    proxy.lose_answer(op="PutItem", table=table)
    with pytest.raises(errors.ConditionalCheckFailed):
        # Create-if-absent: the first attempt landed, its answer was lost, the retry finds it.
        dynamo.call("put_item", ConditionExpression="attribute_not_exists(pk)", **put("c", 7, table))
    assert get(dynalite, table, "c")["v"] == {"N": "7"}
    proxy.lose_answer(op="UpdateItem", table=table)
    resp = dynamo.call("update_item", TableName=table, Key={"pk": {"S": "n"}}, UpdateExpression="ADD v :one",
                       ExpressionAttributeValues={":one": {"N": "1"}}, ReturnValues="UPDATED_NEW")
    assert resp["Attributes"]["v"] == {"N": "2"}  # applied, answer lost, applied again by the retry
    assert proxy.stats()["rule_lose_answer"] == 2


def test_a_duplicated_request_is_delivered_twice(proxy, dynalite, table):
    dynamo = client(proxy.endpoint)
    add = {"TableName": table, "Key": {"pk": {"S": "dup"}}, "UpdateExpression": "ADD v :one",
           "ExpressionAttributeValues": {":one": {"N": "1"}}}
    proxy.duplicate(op="UpdateItem", table=table)
    dynamo.call("update_item", **add)
    assert get(dynalite, table, "dup")["v"] == {"N": "2"}
    rule = proxy.duplicate(op="UpdateItem", table=table, copy="hold")
    dynamo.call("update_item", **add)
    assert get(dynalite, table, "dup")["v"] == {"N": "3"}
    copy, = proxy.held(rule)
    assert copy["kind"] == "copy"
    assert proxy.release(copy["handle"])["status"] == 200
    assert get(dynalite, table, "dup")["v"] == {"N": "4"}


def test_rules_pick_the_nth_request_and_fail_it(proxy, table):
    proxy.fail(op="GetItem", table=table, nth=2, code="InternalServerError")
    key = {"TableName": table, "Key": {"pk": {"S": "q"}}}
    assert raw_call(proxy.endpoint, "GetItem", key)[0] == 200
    status, _, body = raw_call(proxy.endpoint, "GetItem", key)
    assert status == 500 and body["__type"].endswith("#InternalServerError")
    assert raw_call(proxy.endpoint, "GetItem", key)[0] == 200  # times=1: only the second
    assert proxy.rules()[0]["matched"] == 3 and proxy.rules()[0]["applied"] == 1
    assert proxy.clear_rules() == 1


def test_the_same_control_api_drives_the_proxy_as_a_process(dynalite_server, dynalite, table):
    with FidelityProcess(dynalite_server.endpoint, signature_window=120) as p:
        assert p.settings()["signature_window"] == 120
        dynamo = client(p.endpoint)
        rule = p.hold(op="PutItem", table=table, mode="lose")
        dynamo.call("put_item", **put("p", 1, table))
        held, = p.wait_held(1, rule)
        dynamo.call("put_item", **put("p", 2, table))
        p.advance_clock(121)
        outcome = p.release(held["handle"])
        assert outcome["code"] == "InvalidSignatureException" and "(- 2 min.)" not in outcome["message"]
        assert outcome["message"].endswith(" - 2 min.)")
        assert get(dynalite, table, "p")["v"] == {"N": "2"}
        with pytest.raises(TimeoutError):
            p.wait_held(1, rule, timeout=0.1)
        with pytest.raises(ValueError, match="unknown setting"):
            p.configure(no_such_switch=1)
        stats = p.stats()
        assert stats["refused_signature"] == 1 and stats["cpu_seconds"] > 0


def test_the_process_refuses_a_bad_upstream_in_one_line():
    r = subprocess.run([sys.executable, "-m", "reshard.aws.fidelity", "--upstream", "nonsense"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: upstream must be http://HOST:PORT, not 'nonsense'"]
