"""The shim's expression merging (pure)."""

import pytest

from reshard.errors import BadInput
from reshard.shim.expr import and_conditions, check_placeholders, merge_update, split_clauses, split_top, touched_attributes


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
