"""Issue 26 cases 1 and 6: ``expr.decide_key_fields`` decides condition parts over key fields
(maybe kept only inside the physical keys) and over values alone from the request."""

from __future__ import annotations

import pytest

from reshard.core import expressions
from reshard.shim.expr import decide_key_fields, split_clauses, updated_paths

pytestmark = pytest.mark.unit

KEY = {"sensor_id": {"S": "s-1"}, "ts": {"S": "2024"}}


def decide(cond, names=None, values=None, elsewhere=""):
    return decide_key_fields(cond, names or {}, values or {}, KEY, "PK", elsewhere)


def truth(text, names, values, item):
    """The decided condition's value on a physical item (None: no condition)."""
    if text is None:
        return True
    return expressions.evaluate(expressions.parse_condition(text, expressions.Context(names, values)), item)


STORED = {"PK": {"S": "0#2024"}, "val": {"N": "5"}}  # an existing item that stores no key field


@pytest.mark.parametrize("cond, names, values, on_item, on_absent", [
    ("attribute_not_exists(sensor_id)", {}, {}, False, True),
    ("attribute_exists(#s)", {"#s": "sensor_id"}, {}, True, False),
    ("sensor_id = :a", {}, {":a": {"S": "s-1"}}, True, False),
    ("sensor_id <> :a", {}, {":a": {"S": "s-2"}}, True, True),
    ("begins_with(ts, :p) AND val > :t", {}, {":p": {"S": "20"}, ":t": {"N": "4"}}, True, False),
    ("ts <> val", {}, {}, True, True),  # a key field and a stored attribute (two missing operands: <> holds)
    ("NOT attribute_exists(sensor_id) OR val = :t", {}, {":t": {"N": "6"}}, False, True),
    ("attribute_not_exists(val) AND :a = :b", {}, {":a": {"S": "x"}, ":b": {"S": "y"}}, False, False),
    ("attribute_not_exists(sensor_id) AND :a = :b", {}, {":a": {"S": "x"}, ":b": {"S": "x"}}, False, True),
    ("attribute_type(sensor_id, :t)", {}, {":t": {"S": "N"}}, False, False),
])
def test_decided_conditions_answer_as_on_the_logical_item(cond, names, values, on_item, on_absent):
    text, n, v = decide(cond, names, values)
    # What the original condition says on the logical item (key fields stored) and on none ...
    assert truth(cond, names, values, {**STORED, **KEY}) is on_item
    assert truth(cond, names, values, {}) is on_absent
    # ... the decided one says on the physical item (no key field stored) and on none.
    assert truth(text, n, v, STORED) is on_item
    assert truth(text, n, v, {}) is on_absent
    assert not (set(names) - set(n)) or not any(p in (text or "") for p in names)  # the app's dropped


def test_untouched_conditions_and_placeholders_shared_with_the_update():
    assert decide("val > :t", {}, {":t": {"N": "1"}}) == ("val > :t", {}, {":t": {"N": "1"}})
    _, names, values = decide("attribute_exists(#s) AND #v = :v", {"#s": "sensor_id", "#v": "val"},
                                 {":v": {"N": "1"}}, elsewhere="SET #v = :v")
    assert "#v" in names and ":v" in values and "#s" not in names  # #v/:v: still used by the update
    assert decide("bad ((", {"#x": "a"}, {}) == ("bad ((", {"#x": "a"}, {})  # DynamoDB answers


def test_updated_paths_are_document_paths():
    clauses = split_clauses("SET #m.b.c = :v, l[1] = :w ADD n :one REMOVE m.z DELETE tags :t")
    assert updated_paths(clauses, {"#m": "m"}) == [("path", ("m", "b", "c")), ("path", ("l", 1)),
                                                  ("path", ("n",)), ("path", ("tags",)), ("path", ("m", "z"))] or \
        sorted(p[1] for p in updated_paths(clauses, {"#m": "m"})) == sorted(
            [("m", "b", "c"), ("l", 1), ("n",), ("m", "z"), ("tags",)], key=repr)
