"""The checker's own judgement: linearizability of small histories (no scheduler, no DynamoDB)."""

from __future__ import annotations

from decimal import Decimal

from tests.model.spec import UNKNOWN, Op, linearizable

KEYS = {"id": "k"}


def op(actor, kind, invoke, resp, result=None, **args) -> Op:
    return Op(actor, kind, "k", args, invoke, resp, UNKNOWN if resp is None else result)


def item(**attrs):
    return {**KEYS, **attrs}


def test_two_concurrent_increments_must_count_two():
    ops = [op("A", "add", 0, 5, Decimal(1)), op("B", "add", 1, 6, Decimal(2))]
    assert linearizable(ops, None, KEYS, item(n=Decimal(2)), results=True, reads=False)
    assert not linearizable(ops, None, KEYS, item(n=Decimal(1)), results=False, reads=False)  # a lost increment


def test_both_callers_told_one_is_a_wrong_result_even_if_the_count_is_right():
    ops = [op("A", "add", 0, 5, Decimal(1)), op("B", "add", 1, 6, Decimal(1))]
    assert linearizable(ops, None, KEYS, item(n=Decimal(2)), results=False, reads=False)
    assert not linearizable(ops, None, KEYS, item(n=Decimal(2)), results=True, reads=False)


def test_real_time_order_binds_sequential_calls():
    put, delete = op("A", "put", 0, 2, by="A"), op("B", "delete", 3, 4)
    assert linearizable([put, delete], None, KEYS, None, results=True, reads=False)
    assert not linearizable([put, delete], None, KEYS, item(by="A"), results=True, reads=False)  # resurrection
    overlapping = [op("A", "put", 0, 4, by="A"), op("B", "delete", 1, 3)]
    assert linearizable(overlapping, None, KEYS, item(by="A"), results=True, reads=False)


def test_an_unanswered_call_may_or_may_not_have_happened():
    ops = [op("A", "put", 0, None, by="A")]
    assert linearizable(ops, None, KEYS, None, results=True, reads=False)
    assert linearizable(ops, None, KEYS, item(by="A"), results=True, reads=False)
    assert not linearizable(ops, None, KEYS, item(by="B"), results=True, reads=False)


def test_read_your_writes():
    ops = [op("A", "put", 0, 2, by="A"), op("A", "get", 3, 4, None)]
    assert linearizable(ops, None, KEYS, item(by="A"), results=True, reads=False)
    assert not linearizable(ops, None, KEYS, item(by="A"), results=True, reads=True)


def test_two_conditional_creates_cannot_both_win():
    a = op("A", "cas", 0, 5, "ok", expect=None, ver=1, by="A")
    b = op("B", "cas", 1, 6, "ok", expect=None, ver=2, by="B")
    assert not linearizable([a, b], None, KEYS, item(ver=2, by="B"), results=True, reads=False)
    b_lost = op("B", "cas", 1, 6, "failed", expect=None, ver=2, by="B")
    assert linearizable([a, b_lost], None, KEYS, item(ver=1, by="A"), results=True, reads=False)
