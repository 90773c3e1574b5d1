"""Dynamo.call's retry loop: the first attempt is sent outside tenacity (issue 16: the retry
machinery cost 15-40 us per request), and a call that fails is retried exactly as if tenacity
had made every attempt: the same attempt count, backoffs, stats, throttle reports, guard."""

from __future__ import annotations

import json

import pytest
from botocore.awsrequest import AWSResponse

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def _answer(status: int, kind: str | None = None) -> AWSResponse:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{kind}", "message": "injected"}) if kind else "{}"
    return AWSResponse("http://127.0.0.1/", status, {"x-amzn-RequestId": "r"}, _Body(body.encode()))


def _client(answers: list, **policy) -> tuple[Dynamo, list, list]:
    """A Dynamo whose requests never leave the process: each is answered from ``answers``."""
    slept, sent = [], []
    d = Dynamo(endpoint_url="http://127.0.0.1:9", region="us-east-1", sleep=slept.append,
               retry=RetryPolicy(**{"max_attempts": 4, "base_seconds": 0.001, **policy}))

    def answer(request, **_):
        sent.append(1)
        return answers.pop(0) if answers else _answer(200)

    d.client.meta.events.register("before-send.dynamodb", answer)
    return d, slept, sent


ITEM = {"TableName": "t", "Item": {"PK": {"S": "a"}}}


def test_a_call_that_succeeds_at_once_sends_once_and_never_sleeps():
    d, slept, sent = _client([])
    guarded = []
    d.call("put_item", guard=lambda: guarded.append(1), **ITEM)
    assert sent == [1] and slept == [] and guarded == [1] and d.stats.calls["put_item"] == 1
    assert not d.stats.retries


def test_a_throttled_first_attempt_is_retried_reported_and_guarded_like_any_other():
    d, slept, sent = _client([_answer(400, "ProvisionedThroughputExceededException"),
                              _answer(500, "InternalServerError")])
    throttles, guarded = [], []
    d.add_throttle_listener(throttles.append)
    d.call("put_item", guard=lambda: guarded.append(1), **ITEM)
    assert len(sent) == 3 and len(guarded) == 3  # the guard before each attempt, the first included
    assert len(slept) == 2  # a backoff before each retry
    assert throttles == ["put_item"] and d.stats.throttles == 1 and d.stats.retries["put_item"] == 2


def test_the_attempt_count_is_the_policys_with_the_first_attempt_counted():
    d, slept, sent = _client([_answer(500, "InternalServerError") for _ in range(10)], max_attempts=3)
    with pytest.raises(errors.AWSError):
        d.call("put_item", **ITEM)
    assert len(sent) == 3 and len(slept) == 2 and d.stats.retries["put_item"] == 2


def test_a_refusal_is_not_retried():
    d, slept, sent = _client([_answer(400, "ConditionalCheckFailedException")])
    with pytest.raises(errors.ConditionalCheckFailed):
        d.call("put_item", **ITEM)
    assert sent == [1] and slept == []


def test_the_total_time_counts_from_the_first_attempt():
    d, slept, sent = _client([_answer(500, "InternalServerError") for _ in range(10)], max_seconds=0)
    with pytest.raises(errors.AWSError):
        d.call("put_item", **ITEM)
    assert sent == [1] and slept == []  # over the total time once the first attempt failed


def test_a_guard_that_refuses_the_first_attempt_sends_nothing():
    from reshard.jobs.engine import LeaseLost

    d, slept, sent = _client([])

    def refuse():
        raise LeaseLost("the lease expired")

    with pytest.raises(LeaseLost):
        d.call("put_item", guard=refuse, **ITEM)
    assert sent == [] and slept == []


def test_throttles_are_counted_by_dynamodbs_throttling_reason_else_the_error_code():
    """The jobs' reshard_job_throttles_total{reason}: ThrottlingReasons when the answer has them."""
    reasons = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                          "message": "injected", "ThrottlingReasons": [
                              {"reason": "TableWriteKeyRangeThroughputExceeded", "resourceArn": "arn:t"}]})
    with_reason = AWSResponse("http://127.0.0.1/", 400, {"x-amzn-RequestId": "r"}, _Body(reasons.encode()))
    d, _, _ = _client([with_reason, _answer(400, "ThrottlingException")])
    d.call("put_item", **ITEM)
    assert d.throttle_reasons() == {"TableWriteKeyRangeThroughputExceeded": 1, "ThrottlingException": 1}
