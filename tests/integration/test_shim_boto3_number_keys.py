"""Issue 26 case 2: ``Decimal("1.50")``, ``Decimal("1.5")`` and ``Decimal("15E-1")`` are one
DynamoDB number, so one logical item: one physical key, one shard (dynalite)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from reshard.aws import local
from reshard.core.migration import parse
from tests.integration.test_shim_differential import _NUMBERS
from tests.shim_helpers import scan, shim

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("phase", [None, "dual_write", "cutover"])
def test_numbers_with_trailing_zeros_name_one_item(dynalite, unique_name, phase):
    m = parse(_NUMBERS.format(name=unique_name, table=unique_name))
    local.create_table(dynalite, m.table, m.keys, types={"SK": "N"})
    t = shim(m, dynalite, phase)
    t.put_item(Item={"customer": Decimal("2.50"), "order": Decimal("1.50"), "qty": Decimal(1)})
    # The values DynamoDB returns (normalised) and other spellings find the same item.
    for customer, order in ((Decimal("2.5"), Decimal("1.5")), (Decimal("25E-1"), Decimal("15E-1"))):
        got = t.get_item(Key={"customer": customer, "order": order}, ConsistentRead=True)["Item"]
        assert got == {"customer": Decimal("2.5"), "order": Decimal("1.5"), "qty": Decimal(1)}
    out = t.update_item(Key={"customer": Decimal("2.5"), "order": Decimal("1.5")}, UpdateExpression="ADD qty :one",
                        ExpressionAttributeValues={":one": 1}, ReturnValues="ALL_NEW")["Attributes"]
    assert out["qty"] == 2 and str(out["customer"]) == "2.5" and str(out["order"]) == "1.5"
    items = [i for i in scan(dynalite, m.table) if "_rs_del" not in i]
    assert len({i["PK"]["S"] for i in items if "_rs_new" not in i}) == 1  # one item per layout, not two
    assert t.scan()["Items"] == [{"customer": Decimal("2.5"), "order": Decimal("1.5"), "qty": Decimal(2)}]
    t.delete_item(Key={"customer": Decimal("2.500"), "order": Decimal("1.5000")})
    assert t.scan()["Items"] == []
