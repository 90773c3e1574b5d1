"""The backfill's copy fences and the judgement of a fenced-off copy (pure: core/versions.py).

The fences are evaluated here by a tiny interpreter of exactly the condition forms they
use, so each case says which target a copy may replace; the same fences are proven
against dynalite in tests/integration/test_interleavings_backfill.py.
"""

from __future__ import annotations

import re

import pytest

from reshard.core.layout import SOURCE_ATTR, TOMBSTONE_ATTR, VERSION_ATTR
from reshard.core.versions import copy_fence, copy_outcome, fence_for

V1, V2 = "0001700000000000.000000.a", "0001700000000001.000000.b"
SRC_A, SRC_B = '{"PK":{"S":"a#1"}}', '{"PK":{"S":"a#2"}}'


def holds(fence, target: dict | None) -> bool:
    """Evaluate a fence's condition against ``target`` (None: no item), as DynamoDB would."""
    expr = fence.expression
    for name, attr in fence.names.items():
        expr = expr.replace(name, attr)
    item = target or {}

    def value(tok: str) -> str:
        return fence.values[tok]["S"]

    def atom(a: str) -> bool:
        a = a.strip()
        if m := re.fullmatch(r"attribute_not_exists\((\w+)\)", a):
            return m.group(1) not in item
        if m := re.fullmatch(r"attribute_exists\((\w+)\)", a):
            return m.group(1) in item
        if m := re.fullmatch(r"(\w+) (<|=) (:\w+)", a):
            if m.group(1) not in item:
                return False
            left, right = item[m.group(1)]["S"], value(m.group(3))
            return left < right if m.group(2) == "<" else left == right
        raise AssertionError(a)

    def conj(c: str) -> bool:
        c = c.strip()
        if c.startswith("(") and c.endswith(")"):
            c = c[1:-1]
        return all(atom(x) for x in c.split(" AND "))

    return any(conj(d) for d in re.split(r" OR (?![^(]*\))", expr))


def item(version: str = "", src: str | None = None, tomb: bool = False) -> dict:
    out = {"PK": {"S": "new#7"}, "temp": {"N": "1"}}
    if version:
        out[VERSION_ATTR] = {"S": version}
    if src:
        out[SOURCE_ATTR] = {"S": src}
    if tomb:
        out[TOMBSTONE_ATTR] = {"BOOL": True}
    return out


@pytest.mark.parametrize("version,target,allowed", [
    # an unversioned (pre-migration) copy: onto nothing, or our own earlier copy of the same source
    ("", None, True),
    ("", item(src=SRC_A), True),
    ("", item(src=SRC_B), False),          # another old copy of the same logical item: judged, not replaced
    ("", item(), False),                   # an unmoved old copy sits at the new key
    ("", item(V1), False),                 # any shim write is newer than anything pre-migration
    ("", item(V1, tomb=True), False),      # a shim delete (tombstone) holds
    # a versioned copy: onto nothing, anything unversioned, or an older version only
    (V2, None, True),
    (V2, item(src=SRC_B), True),
    (V2, item(), True),
    (V2, item(V1), True),
    (V1, item(V2), False),
    (V1, item(V1), False),                 # the same version is already there (the shim's mirror)
    (V1, item(V2, tomb=True), False),      # a newer delete is never replaced by an older live copy
])
def test_copy_fence(version, target, allowed):
    assert holds(copy_fence(version, "PK", SRC_A), target) is allowed


def test_versioned_copy_fence_is_the_shims_fence():
    assert copy_fence(V1, "PK", SRC_A) == fence_for(V1)


@pytest.mark.parametrize("version,target,same,outcome", [
    ("", None, False, "gone"),
    ("", item(V1), False, "newer"),
    ("", item(V1, tomb=True), False, "newer"),
    ("", item(src=SRC_B), True, "same"),
    ("", item(src=SRC_B), False, "collision"),
    ("", item(), False, "collision"),
    (V1, item(V1), True, "newer"),
    (V1, item(V2), False, "newer"),
    (V2, item(V1), False, "gone"),          # became older since the fence failed: copy again
])
def test_copy_outcome(version, target, same, outcome):
    assert copy_outcome(version, target, same) == outcome
