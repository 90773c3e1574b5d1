"""Issue 15b, pure parts of the shim's sharded-GSI support: key conditions and write values."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.core import expressions
from reshard.core.index import IndexMapper
from reshard.core.layout import hash_shard
from reshard.core.migration import parse
from reshard.shim.index import index_key_condition
from reshard.shim.index_values import write_value
from reshard.shim.routing import index_routing

FILE = """
id = "g"
table = "Invoices"
[keys]
partition = "PK"
sort = "SK"
[index.ByCountry]
partition = "gsi"
sort = "tx_country"
type = "S"
[index.ByCountry.from]
partition = "{shard}"
shards = 4
shard_by = "random"
[index.ByCountry.to]
partition = "{region}#{shard}"
shards = 16
shard_by = ["source"]
"""


@pytest.fixture
def im():
    return IndexMapper(parse(FILE).indexes[0])


def kce(text, values):
    ctx = expressions.Context({"#r": "region"}, {k: {"S": v} for k, v in values.items()})
    return expressions.parse_condition(text, ctx, "KeyConditionExpression")


def test_key_condition_splits_sort_condition_from_partition_equalities(im):
    eq, sort = index_key_condition(im, kce("tx_country BETWEEN :a AND :b AND #r = :r",
                                           {":a": "DE", ":b": "US", ":r": "eu"}), None)
    assert eq == {"region": "eu"} and sort == ("between", "DE", "US")
    eq, sort = index_key_condition(im, None, {"tx_country": "US", "source": "s-1"})
    assert eq == {"source": "s-1"} and sort == ("=", "US")
    with pytest.raises(errors.BadInput, match="sharded partition attribute"):
        index_key_condition(im, None, {"gsi": "eu#1"})
    with pytest.raises(errors.BadInput, match="not a key field of index ByCountry"):
        index_key_condition(im, kce("amount = :a", {":a": "1"}), None)
    with pytest.raises(errors.BadInput, match="only = is allowed"):
        index_key_condition(im, kce("#r > :a", {":a": "e"}), None)


def test_write_value_keeps_a_valid_value_replaces_others_and_leaves_items_outside_the_index(im):
    item = {"PK": {"S": "inv-1"}, "SK": {"S": "h"}, "region": {"S": "eu"}, "source": {"S": "s-1"},
            "tx_country": {"S": "US"}}
    assert write_value(im, item, "new", "inv-1#h") is None  # no attribute: not in the index
    no_sort = {k: v for k, v in item.items() if k != "tx_country"}
    assert write_value(im, {**no_sort, "gsi": {"S": "9"}}, "new", "inv-1#h") is None  # no sort key: not either
    assert write_value(im, {**item, "gsi": {"S": "2"}}, "old", "inv-1#h") is None  # a random old value: kept
    drawn = write_value(im, {**item, "gsi": {"S": "eu#2"}}, "old", "inv-1#h")
    assert drawn == write_value(im, {**item, "gsi": {"S": "x"}}, "old", "inv-1#h")  # drawn from the identity
    assert write_value(im, {**item, "gsi": {"S": "2"}}, "new", "inv-1#h") == {"S": f"eu#{hash_shard('s-1', 16)}"}
    assert write_value(im, {**item, "gsi": {"S": f"eu#{hash_shard('s-1', 16)}"}}, "new", "inv-1#h") is None
    with pytest.raises(errors.BadInput, match="lacks field 'source'"):
        write_value(im, {"PK": {"S": "inv-1"}, "region": {"S": "eu"}, "gsi": {"S": "1"}, "tx_country": {"S": "US"}},
                    "new", "x")


def test_index_routing_of_the_shim_s_phase_names():
    assert index_routing("steady").reads == ("old",) and index_routing("steady").writes == "old"
    assert index_routing("backfill").reads == ("old", "new") and index_routing("aborted").reads == ("new", "old")
    assert index_routing("cutover").reads == ("new",)


@pytest.mark.parametrize("text", ["5", "0", "123456789012345678901234567890", "1E+125", "-1E+125",
                                  "1.2345678901234567890123456789012345678E-100",
                                  "9.9999999999999999999999999999999999999E+125",
                                  "-9.9999999999999999999999999999999999999E+125"])
def test_the_number_beside_a_cursor_is_strictly_before_it_and_storable(text):
    """A page's start key lies strictly before the cursor's sort value in the reading
    direction, as a number DynamoDB stores (38 digits, |x| <= 9.99...E+125), or is None (the
    partition's start) -- never rounded back onto the cursor, which skipped its ties."""
    from decimal import Decimal

    from reshard.shim.query import _DYNAMO_MAX, _number_beside
    v = Decimal(text)
    for forward in (True, False):
        out = _number_beside(v, forward)
        if out is None:
            assert v == (_DYNAMO_MAX.copy_negate() if forward else _DYNAMO_MAX)  # nothing storable beyond
            continue
        assert (out < v) if forward else (out > v)
        assert len(out.as_tuple().digits) <= 38 and out.copy_abs() <= _DYNAMO_MAX
