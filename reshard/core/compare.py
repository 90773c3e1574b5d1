"""What `verify` compares: the logical state of one item in the old and the new layout.

Pure domain module. Both layouts live in the same table; a logical item is *live* in a
layout when its physical item there exists and is not a tombstone. The comparison is on
logical content: key attributes and reshard's bookkeeping (``_rs_*``) are ignored,
fields carried only in keys are parsed back (``KeyMapper.to_logical``).

Kinds of difference (a sentence for each is in :data:`KINDS`):

* ``missing``      live in the old layout, absent (or deleted) in the new one;
* ``stale``        live in both with different content, the new copy older;
* ``diverged``     live in both with different content, the new copy not older
                   (a write that reached the new layout only);
* ``extra``        live in the new layout, never existed in the old one;
* ``resurrected``  live in the new layout, deleted (tombstone) in the old one;
* ``duplicate``    more than one physical item for one logical item in a layout, or a
                   new-layout copy that sits at a key its fields do not map to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from reshard.core.layout import KeyMapper, is_tombstone
from reshard.core.versions import version_of

KINDS = {
    "missing": "live in the old layout, absent or deleted in the new one",
    "stale": "new copy holds an older version than the old item",
    "diverged": "new copy differs from the old item without being older",
    "extra": "live in the new layout only (no old item)",
    "resurrected": "live in the new layout although deleted in the old one",
    "duplicate": "more than one physical item for one logical item in a layout",
}


def live(item: Mapping[str, Any] | None) -> bool:
    return item is not None and not is_tombstone(item)


@dataclass(frozen=True)
class Difference:
    """One logical item whose layouts disagree."""

    kind: str
    identity: tuple
    old_key: dict | None
    new_key: dict | None
    old_version: str
    new_version: str
    detail: str = ""

    def as_dict(self) -> dict:
        return {"kind": self.kind, "identity": [str(x) for x in self.identity],
                "old_key": self.old_key, "new_key": self.new_key,
                "old_version": self.old_version, "new_version": self.new_version, "detail": self.detail}


def classify(mapper: KeyMapper, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> str | None:
    """The kind of difference between an item's old and new physical items, or None if they agree."""
    old_live, new_live = live(old), live(new)
    if not old_live and not new_live:
        return None
    if old_live and not new_live:
        return "missing"
    if new_live and not old_live:
        return "resurrected" if old is not None else "extra"
    if mapper.to_logical(old, mapper.old) == mapper.to_logical(new, mapper.new):
        return None
    return "stale" if version_of(new) < version_of(old) else "diverged"


def differences(totals: Mapping[str, float]) -> dict[str, int]:
    """How many differences of each kind a verify run's totals hold (zero for absent kinds)."""
    return {k: int(totals.get(k, 0)) for k in KINDS}
