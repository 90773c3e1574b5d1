"""The table marker (reshard/core/marker.py): its key per key type and when a shim refuses."""

from __future__ import annotations

import pytest

from reshard.core.marker import Owner, is_marker, marker_item, marker_key, owner_of, refusal

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("ptype,stype", [("S", None), ("N", "S"), ("B", "N"), ("S", "B")])
def test_the_marker_round_trips_for_every_key_type(ptype, stype):
    key = marker_key("PK", ptype, "SK" if stype else None, stype)
    assert set(key) == ({"PK", "SK"} if stype else {"PK"}) and list(key["PK"]) == [ptype]
    owner = Owner("m2", "ctl", previous=Owner("m1", "ctl"))
    item = marker_item(key, owner)
    assert is_marker(item) and owner_of(item) == owner
    assert not is_marker({"PK": {"S": "x"}}) and owner_of({"PK": {"S": "x"}}) is None
    assert owner_of({**key, "_rs_marker": {"N": "1"}, "_rs_control": {"S": "c"}}) is None  # damaged: unread


def test_when_a_shim_refuses():
    mine = dict(my_migration="m2", my_control_table="ctl")
    assert refusal(None, registered=True, owner_active=True, **mine) is None
    assert refusal(Owner("m2", "ctl"), registered=True, owner_active=True, **mine) is None
    # a mistyped control table (issue 25 case 5)
    assert "control table" in refusal(Owner("m2", "ctl"), my_migration="m2", my_control_table="ctl-typo",
                                      registered=False, owner_active=None)
    # an earlier migration's shim after the next one started or finished
    assert "in progress" in refusal(Owner("m3", "ctl"), registered=True, owner_active=True, **mine)
    assert "owns the layout" in refusal(Owner("m3", "ctl"), registered=True, owner_active=False, **mine)
    # the next migration's file deployed before its start: steady state, served
    assert refusal(Owner("m1", "ctl"), registered=False, owner_active=False, **mine) is None
    assert "in progress" in refusal(Owner("m1", "ctl"), registered=False, owner_active=True, **mine)
