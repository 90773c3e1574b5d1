"""Which updates set a sharded GSI value in their own request, what they read first, what is refused
(reshard/shim/index_values.py: update_effect, index_update_plan, index_actions). Pure: no server."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.core.index import NEW, OLD, IndexMapper
from reshard.core.layout import hash_shard
from reshard.core.migration import parse
from reshard.shim.expr import split_clauses
from reshard.shim.index_values import index_actions, index_update_plan, update_effect
from tests.index_support import gsi_migration

IM = IndexMapper(parse(gsi_migration("m", "Invoices", shard_by="customer", new_partition="{region}#{shard}")).indexes[0])
KEY = {"PK": {"S": "inv-1"}, "SK": {"S": "root"}}


def effect(text: str, names=None):
    return update_effect(split_clauses(text), names)


def test_update_effect_tells_literal_sets_from_what_it_cannot_evaluate():
    e = effect("SET #r = :r, amount = amount + :n, tags = list_append(tags, :l), c = if_not_exists(c, :c), "
               "m.x = :x, d = :d REMOVE old, lst[0] ADD n :one DELETE s :s", {"#r": "region"})
    assert e.literals == {"region": ":r", "d": ":d"}
    assert e.removed == {"old"}
    assert set(e.other) == {"amount", "tags", "c", "m", "lst", "n", "s"}
    assert e.other["n"] == "ADD n :one"


def test_only_updates_of_what_the_value_depends_on_are_planned():
    assert index_update_plan([IM], NEW, effect("SET amount = :a ADD n :one"), KEY) is None
    plan = index_update_plan([IM], NEW, effect("SET #r = :r", {"#r": "region"}), KEY)
    assert plan.reads == ("customer", "gsi_shard", "tx_country")
    # Membership only: the sort attribute set, the fields read.
    assert index_update_plan([IM], NEW, effect("SET tx_country = :c"), KEY).reads == ("region", "customer", "gsi_shard")
    # ADD on a field only the *other* layout needs is evaluable (the written value does not use it).
    # (dual_write writes the old, random value: it needs no field; the item still moves in the request.)
    assert index_update_plan([IM], OLD, effect("ADD customer :n"), KEY).reads == ("gsi_shard", "tx_country")
    with pytest.raises(errors.BadInput, match=r"'ADD customer :n'.*write 'customer' with a literal value"):
        index_update_plan([IM], NEW, effect("ADD customer :n"), KEY)
    with pytest.raises(errors.BadInput, match="write 'gsi_shard' with a literal value"):
        index_update_plan([IM], NEW, effect("SET gsi_shard = gsi_shard + :n"), KEY)


def test_index_actions_compute_from_literals_and_reads_and_condition_on_the_reads():
    plan = index_update_plan([IM], NEW, effect("SET #r = :r", {"#r": "region"}), KEY)
    read = {"customer": {"S": "c-1"}, "gsi_shard": {"S": "EU#3"}, "tx_country": {"S": "USA"}}
    sets, names, values, cond, overrides = index_actions(plan, read, KEY, {":r": {"S": "US"}}, "SET #r = :r", None,
                                                         "inv-1#root")
    assert sets == ["#rs_ig0 = :rs_ig0"] and values[":rs_ig0"] == {"S": f"US#{hash_shard('c-1', 16)}"}
    assert cond == "#rs_ix0 = :rs_ix0 AND #rs_ix1 = :rs_ix1 AND #rs_ix2 = :rs_ix2" and not overrides
    # An item outside the index (no sort attribute): nothing set, still conditioned on staying outside.
    sets, names, values, cond, _ = index_actions(plan, {"customer": {"S": "c-1"}}, KEY, {":r": {"S": "US"}},
                                                 "SET #r = :r", None, "inv-1#root")
    assert sets == [] and "attribute_not_exists(#rs_ix2)" in cond
    # The application's own GSI value is replaced through its placeholder; a shared one is refused.
    plan = index_update_plan([IM], NEW, effect("SET customer = :c, gsi_shard = :g"), KEY)
    vals = {":c": {"S": "c-2"}, ":g": {"S": "9"}}
    sets, _, _, _, overrides = index_actions(plan, {"region": {"S": "EU"}, "tx_country": {"S": "USA"}}, KEY, vals,
                                             "SET customer = :c, gsi_shard = :g", None, "inv-1#root")
    assert sets == [] and overrides == {":g": {"S": f"EU#{hash_shard('c-2', 16)}"}}
    with pytest.raises(errors.BadInput, match="a placeholder of its own"):
        index_actions(plan, {"region": {"S": "EU"}, "tx_country": {"S": "USA"}}, KEY, vals,
                      "SET customer = :c, gsi_shard = :g", "other = :g", "inv-1#root")
