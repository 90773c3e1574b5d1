"""The shim's expression merging (pure)."""

import pytest

from reshard.errors import BadInput
from reshard.shim.expr import (absent_value, and_conditions, check_placeholders, merge_update, split_clauses, split_top,
                               tombstone_aware, touched_attributes, unwrap)


def test_split_clauses_any_order_and_case():
    assert split_clauses("remove a, b set c = :c ADD n :one") == {"REMOVE": "a, b", "SET": "c = :c", "ADD": "n :one"}
    for bad in ("c = :c", "SET a = :a SET b = :b", "SET "):
        with pytest.raises(BadInput):
            split_clauses(bad)


def test_split_top_ignores_commas_in_functions():
    assert split_top("a = list_append(a, :l), b = if_not_exists(b, :z), c[1] = :c") == \
        ["a = list_append(a, :l)", "b = if_not_exists(b, :z)", "c[1] = :c"]


def test_merge_inserts_into_existing_clauses_or_appends():
    assert merge_update("SET a = :a REMOVE b", ["#rs_v = :rs_nv"], ["#rs_del"]) == \
        "SET a = :a, #rs_v = :rs_nv REMOVE b, #rs_del"
    assert merge_update("ADD n :one", ["#rs_v = :rs_nv"], ["#rs_del"]) == \
        "ADD n :one SET #rs_v = :rs_nv REMOVE #rs_del"
    assert merge_update(None, ["#rs_v = :rs_nv"], []) == "SET #rs_v = :rs_nv"


def test_touched_attributes_resolve_names_and_paths():
    clauses = split_clauses("SET #a.b = :x, c[2] = list_append(c, :l) REMOVE d.e ADD #n :one DELETE s :s")
    assert touched_attributes(clauses, {"#a": "alpha", "#n": "count"}) == ["alpha", "c", "d", "count", "s"]
    with pytest.raises(BadInput):
        touched_attributes(split_clauses("SET #undefined = :x"), {})


def test_reserved_placeholders_refused():
    with pytest.raises(BadInput):
        check_placeholders({"#rs_v": "x"}, None)
    with pytest.raises(BadInput):
        check_placeholders(None, {":rs_k0": 1})
    with pytest.raises(BadInput):
        check_placeholders({"#x": "_rs_v"}, None)
    check_placeholders({"#x": "temp"}, {":v": 1})


def test_and_conditions():
    assert and_conditions("a > :a", "attribute_not_exists(#rs_v) OR #rs_v < :rs_v") == \
        "(a > :a) AND (attribute_not_exists(#rs_v) OR #rs_v < :rs_v)"
    assert and_conditions(None, "x") == "x" and and_conditions("y", None) == "y"


ABSENT_CASES = [
    "attribute_exists(PK)", "attribute_not_exists(#s)", "#s = :v", "#s <> :v", "#s < :v", "size(#s) >= :n",
    "size(#s) <> :n", "#s BETWEEN :a AND :b", "#s IN (:a, :b)", "begins_with(#s, :p)", "contains(#s, :p)",
    "attribute_type(#s, :t)", "NOT attribute_exists(#s)", "not (#s = :v) and attribute_not_exists(a.b[1])",
    "attribute_exists(#s) OR #s <> :v", "(#s = :v OR #s > :n) AND NOT contains(#s, :p)",
    "attribute_exists(#s) AND :a = :b", "attribute_not_exists(#s) OR :a = :b",
]


@pytest.mark.parametrize("condition", ABSENT_CASES)
def test_absent_value_matches_dynamodbs_rules_on_a_missing_item(condition):
    """absent_value() agrees with the model's evaluator (conformance-tested against dynalite)
    on an item that does not exist; None only where the answer depends on values alone."""
    from tests.model.expressions import Context, evaluate, parse_condition
    values = {":v": {"S": "x"}, ":n": {"N": "1"}, ":a": {"S": "a"}, ":b": {"S": "b"}, ":p": {"S": "p"},
              ":t": {"S": "S"}}
    node = parse_condition(condition, Context({"#s": "sensor_id"}, values))
    got = absent_value(condition)
    if ":a = :b" in condition and got is None:
        return  # depends on values only: left unchanged, by design
    assert got is evaluate(node, {}), condition


def test_tombstone_aware_rewrites_only_what_it_understands():
    assert tombstone_aware("attribute_not_exists(#s)") == (
        "attribute_exists(#rs_del) OR (attribute_not_exists(#s))", True)
    assert tombstone_aware("attribute_exists(#s)") == ("attribute_not_exists(#rs_del) AND (attribute_exists(#s))", True)
    assert tombstone_aware(":a = :b") == (":a = :b", False)
    assert tombstone_aware(None) == (None, False)
    assert absent_value("this is not ((( a condition") is None


def test_wrapping_never_doubles_parentheses():
    """DynamoDB refuses ``((a))`` ("redundant parentheses"); boto3's builder parenthesises
    every ``&``/``|`` condition, so the fence and the tombstone rewrite unwrap it first."""
    assert unwrap("((a = :a))") == "a = :a"
    assert unwrap("(a) AND (b)") == "(a) AND (b)"  # not one enclosing pair
    assert unwrap("((a) AND (b))") == "(a) AND (b)"
    assert and_conditions("(#n0 = :v0 AND attribute_not_exists(#n1))", "(f)") == \
        "(#n0 = :v0 AND attribute_not_exists(#n1)) AND (f)"
    assert tombstone_aware("(attribute_exists(#n0) AND #n1 = :v0)")[0] == \
        "attribute_not_exists(#rs_del) AND (attribute_exists(#n0) AND #n1 = :v0)"
