"""Issue 26 (a find of the differential fuzzer, ``query_projection``): a query whose
``ProjectionExpression`` leaves out the attributes its ``FilterExpression`` names must filter
the whole logical item and return the projection of those that pass -- as boto3's Table does,
on the random-suffix layout where it was found, through every phase (copies of both layouts
merged, the backfill's copies included) and paged with ``Limit``.

The shim did so already: the difference the fuzzer met was the reference's. dynalite answers
``attribute_type(flag, BOOL)`` false for a stored ``false`` (and ``S``/``B`` for ``""``/``b""``),
so its query returned no item where the shim's filter (core/expressions) returned it; the
fuzzer now draws no ``attribute_type`` on those fields (and no ``size`` of ``note``)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from boto3.dynamodb.conditions import Attr, Key

from reshard.aws.dynamo import Dynamo
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse
from tests.integration.test_shim_differential import LAYOUTS, copy_all
from tests.shim_helpers import create_table, shim

pytestmark = pytest.mark.integration


def pages(t, **kw) -> list[dict]:
    items = []
    while True:
        resp = t.query(**kw)
        items.extend(resp["Items"])
        if "LastEvaluatedKey" not in resp:
            return items
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def test_a_filter_on_attributes_the_projection_leaves_out(dynalite: Dynamo, unique_name):
    m = parse(LAYOUTS["random"].toml.format(name=unique_name, table=unique_name))
    create_table(dynalite, m)
    t = shim(m, dynalite, None)
    for line, temp in (("1", "1.5"), ("2", "2"), ("3", "1.50"), ("10", "-3")):
        t.put_item(Item={"invoice_number": "100", "line": line, "temp": Decimal(temp), "note": f"n{line}",
                         "m": {"b": {"c": Decimal(temp)}}})
    expected = [{"note": "n1", "line": "1"}, {"note": "n3", "line": "3"}]  # the sort template is {line}
    for phase in ("planned", "dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete"):
        t._pin_phase(phase)
        if phase == "backfill":
            copy_all(dynalite, KeyMapper(m), m.table, m)
        for limit in (None, 1, 3):
            for filt in (Attr("temp").eq(Decimal("1.5")), Attr("m.b.c").lt(Decimal(2)) & Attr("temp").gt(0)):
                kw = {"KeyConditionExpression": Key("invoice_number").eq("100"), "FilterExpression": filt,
                      "ProjectionExpression": "#n, line", "ExpressionAttributeNames": {"#n": "note"}}
                if limit:
                    kw["Limit"] = limit
                assert pages(t, **kw) == expected, (phase, limit, filt)
