"""The widened fault model (issue 25): the server's clock, signature dates, held and
duplicated requests, lost answers -- the machinery, checked on small cases before the
scenarios (``test_spec_issue25.py``) rely on it."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.core.deadlines import SIGNATURE_WINDOW_SECONDS as W
from reshard.core.deadlines import parse_http_date, probe_dates
from tests.model.explore import World, explore, replay, writes_to
from tests.model.memory_dynamo import MemoryDynamo
from tests.model.scheduler import LogicalClock

T0 = 1_700_000_000.25  # not a whole second: the Date header cuts the fraction


def table(dynamo: Dynamo, name: str = "tbl") -> None:
    dynamo.call("create_table", TableName=name, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST")


def put(dynamo: Dynamo, pk: str, horizon=None, **extra):
    return dynamo.call("put_item", TableName="tbl", Item={"pk": {"S": pk}, **extra}, horizon=horizon)


@pytest.fixture
def world_parts():
    clock = LogicalClock(T0)
    db = MemoryDynamo(clock=clock)
    dynamo = Dynamo(db, retry=RetryPolicy(max_attempts=1))
    table(dynamo)
    return clock, db, dynamo


def test_answers_carry_the_servers_date(world_parts):
    clock, db, dynamo = world_parts
    put(dynamo, "a")
    assert dynamo.answer_date() == 1_700_000_000.0  # whole seconds (RFC 7231)
    clock.advance(61)
    with pytest.raises(errors.ConditionalCheckFailed):  # an error's answer carries it too
        dynamo.call("put_item", TableName="tbl", Item={"pk": {"S": "a"}}, ConditionExpression="attribute_not_exists(pk)")
    assert dynamo.answer_date() == 1_700_000_061.0
    resp = db.get_item(TableName="tbl", Key={"pk": {"S": "a"}})
    assert parse_http_date(resp["ResponseMetadata"]["HTTPHeaders"]["date"]) == 1_700_000_061.0


def test_a_request_signed_for_a_past_horizon_is_refused_as_dynamodb_does(world_parts):
    clock, db, dynamo = world_parts
    put(dynamo, "a", horizon=lambda: T0 + 15)          # signed floor(T0 + 15 - W): accepted now
    clock.advance(14.5)
    put(dynamo, "b", horizon=lambda: T0 + 15)          # just before the horizon (less the date's fraction)
    clock.advance(0.5)
    with pytest.raises(errors.AWSError) as e:          # past it: refused, whatever the retry policy
        put(dynamo, "c", horizon=lambda: T0 + 15)
    assert e.value.code == "InvalidSignatureException" and "Signature expired" in str(e.value)
    assert [i["pk"]["S"] for i in db.items("tbl")] == ["a", "b"]
    put(dynamo, "d")                                   # no horizon: signed "now", always fine


def test_the_probe_dates_tell_an_enforcing_server(world_parts):
    clock, db, dynamo = world_parts
    refused, accepted = probe_dates(clock())
    db._check_signature(accepted, clock())
    with pytest.raises(Exception, match="Signature expired"):
        db._check_signature(refused, clock())
    with pytest.raises(Exception, match="not yet current"):
        db._check_signature(clock() + W + 2, clock())
    db.signature_window = None  # a server that does not check (dynalite, moto)
    db._check_signature(refused, clock())


def held_put(w: World) -> None:
    """One actor puts ``a`` under a 15 s horizon from "now"; the network may hold it (twice)."""
    table(w.dynamo)
    horizon = w.clock() + 15
    w.actor("A", lambda: _quiet(lambda: put(w.dynamo, "a", horizon=lambda: horizon, n={"N": "1"})))
    w.may_hold("A", copies=2, where=writes_to("tbl"))


def _quiet(fn):
    try:
        fn()
    except errors.AWSError:
        pass  # the app saw an error: the model checks only what landed


def test_a_held_request_arrives_later_once_twice_or_never():
    outcomes = set()

    def factory(w: World):
        held_put(w)
        w.may_tick(20)  # the clock may run past the horizon before the request arrives

        def check(w: World):
            landed = [i for i in w.db.items("tbl")]
            arrived = [s for s in w.trace if s.op == "deliver"]
            outcomes.add((len(arrived), tuple(s.result.split(" ")[0] for s in arrived), len(landed)))
        return check
    r = explore(factory)
    assert r.violation is None
    # The retry landed (3 attempts: World's policy) or the held copy did, twice even; after the
    # tick the held copies are refused by the server (signature expired), and so is A's retry.
    assert (2, ("ok", "ok"), 1) in outcomes
    assert (2, ("ok", "InvalidSignatureException"), 1) in outcomes
    assert (2, ("InvalidSignatureException",) * 2, 0) in outcomes
    assert (0, (), 1) in outcomes and (0, (), 0) in outcomes  # dropped: never arrives
    run = replay(factory, ["hold:A", "tick", "deliver:1", "deliver:1", "A"])
    assert [s.result.split(" ")[0] for s in run.trace if s.op == "deliver"] == ["InvalidSignatureException"] * 2, \
        run.trace_text()


def test_a_lost_answer_is_applied_and_retried():
    """The request lands, the caller times out and retries: an ADD without an idempotency fence
    is applied twice. (The shim's fences are the scenarios' business; here the raw fault.)"""
    def factory(w: World):
        table(w.dynamo)
        w.dynamo.call("put_item", TableName="tbl", Item={"pk": {"S": "a"}, "n": {"N": "0"}})
        w.actor("A", lambda: w.dynamo.call("update_item", TableName="tbl", Key={"pk": {"S": "a"}},
                                           UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": {"N": "1"}}))
        w.may_lose("A")

        def check(w: World):
            assert w.db.items("tbl")[0]["n"] == {"N": "1"}, "an ADD applied twice"
        return check
    r = explore(factory)
    assert r.schedules == 2 and r.violation is not None
    assert r.violation.schedule == ["lose:A", "A", "A"], r.violation.report()  # the backoff sleep, the retry
    assert "answer is lost" in r.violation.report()


def test_a_frozen_request_is_checked_when_it_arrives():
    """A freeze between the horizon's computation and the request (the actor parked at its call
    while the clock runs, e.g. others' sleeps or a tick): the server checks the date on arrival."""
    def factory(w: World):
        table(w.dynamo)
        w.actor("A", lambda: _quiet(lambda: put(w.dynamo, "a", horizon=lambda: w.clock() + 15)))
        w.may_tick(16)

        def check(w: World):
            assert w.db.items("tbl"), "nothing landed"
        return check
    r = explore(factory)
    assert r.schedules == 2 and r.violation.schedule == ["tick", "A"]
    assert "InvalidSignatureException" in r.violation.report()


def test_a_freeze_before_any_call_outlives_the_horizon():
    """``may_freeze``: A reads a fact (the answer's ``Date``) and writes twice under its horizon
    (fact + 15 s); a 20-s freeze may come before any of its three calls. Frozen before the read,
    both writes land (the fact is read after the freeze); before a write, that write and every
    later one are refused by the server; never frozen, both land."""
    outcomes = set()

    def factory(w: World):
        table(w.dynamo)

        def body():
            w.dynamo.call("get_item", TableName="tbl", Key={"pk": {"S": "none"}})
            fact = w.dynamo.answer_date()
            for pk in ("a", "b"):
                _quiet(lambda pk=pk: put(w.dynamo, pk, horizon=lambda: fact + 15))
        w.actor("A", body)
        w.may_freeze("A", 20)

        def check(w: World):
            frozen = [s.detail.split(" before its ")[1].split(" ")[0] for s in w.trace if s.op == "freeze"]
            landed = tuple(i["pk"]["S"] for i in w.db.items("tbl"))
            outcomes.add((tuple(frozen), landed))
        return check
    r = explore(factory)
    assert r.violation is None
    assert outcomes == {((), ("a", "b")), (("get_item",), ("a", "b")), (("put_item",), ("a",)), (("put_item",), ())}, \
        outcomes
    run = replay(factory, ["A", "freeze:A", "A", "A"])
    assert "frozen 20s before its put_item" in run.trace_text()
