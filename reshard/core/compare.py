"""What `verify` compares: the logical state of one item in the old and the new layout.

Pure domain module. Both layouts live in the same table; a logical item is *live* in a
layout when its physical item there exists and is not a tombstone. The comparison is on
logical content: key attributes and reshard's bookkeeping (``_rs_*``) are ignored,
fields carried only in keys are parsed back (``KeyMapper.to_logical``); a combined
migration's sharded GSI attributes are not content either (``KeyMapper.content``).

The old side of an item is judged over **every** old copy (:func:`judge`): a
random-suffix layout may hold one logical item under several of its N candidate keys.
The newest copy by version is the reference (what the shim reads); copies that tie for
newest with different content are a *collision* (nobody can say which one the
application meant). On a table with TTL, a copy whose TTL epoch has passed is *absent*
(:func:`expired`): DynamoDB deletes expired items lazily, so the two copies of an item
disappear at different times.

Kinds of difference (a sentence for each is in :data:`KINDS`); every one fails the run:

* ``missing``      live in the old layout, absent (or deleted) in the new one;
* ``stale``        live in both with different content, the new copy older;
* ``diverged``     live in both with different content, the new copy not older
                   (a write that reached the new layout only);
* ``extra``        live in the new layout, never existed in the old one, and not
                   written by a shim (no version newer than the old side's);
* ``new_only``     live in the new layout only, with a version newer than every old
                   copy: an acknowledged shim write whose old copy is missing; kept by
                   every repair (never deleted), copied back to the old layout by one;
* ``resurrected``  live in the new layout although deleted in the old one (the
                   tombstone newer);
* ``duplicate``    a new-layout copy that sits at a key its fields do not map to;
* ``collision``    several live old copies tie for newest (no version, in practice)
                   with different content;
* ``too_large``    the new-layout copy would exceed DynamoDB's 400 KB item limit;
* ``unmappable``   an item whose key the old layout cannot map: fails the run unless the
                   operator allowed that many (:func:`passes`, ``allow_unmappable``).

Counted as information only (:data:`INFO`): ``old_copies``, items with several live old
copies of which one is newest (the newest wins, as in the shim).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

from reshard.core.layout import KeyMapper, is_tombstone
from reshard.core.versions import version_of
from reshard.errors import UnmappableItem

KINDS = {
    "missing": "live in the old layout, absent or deleted in the new one",
    "stale": "new copy holds an older version than the old item",
    "diverged": "new copy differs from the old item without being older",
    "extra": "live in the new layout only (no old item, not written by a shim)",
    "new_only": "live in the new layout only, newer than every old copy (a shim write): kept, never deleted",
    "resurrected": "live in the new layout although deleted in the old one",
    "duplicate": "a new-layout copy at a key its fields do not map to",
    "collision": "several live old copies of one item, none newer, with different content",
    "too_large": "the new-layout copy would exceed DynamoDB's 400 KB item limit",
    "unmappable": "an old item the layouts cannot map (bad key, missing field)",
    # An index-only migration ([index.NAME], reshard.jobs.index_jobs):
    "gsi_value": "an item's GSI partition value is not the one the [to] layout gives it",
    "gsi_missing": "an item the fan-out over the [to] GSI values must return is not in the index",
    "gsi_extra": "the fan-out returns an entry the table item does not carry (absent, deleted) or a second one",
    "gsi_differs": "the index entry's partition value, sort value or version differs from the table item's",
    # Kept so a run recorded by an earlier reshard (one fan-out probe per page) still fails if it found one.
    "gsi_query": "(an earlier reshard's verify) a fan-out probe did not return an item exactly once: verify again",
}

#: What the operator does about each kind the repair cannot fix (shown by the gate).
GUIDANCE = {
    "too_large": "shrink each listed item below 400 KB (the new copy adds its marker and a longer key), or "
                 "delete it, then verify again",
    "collision": "keep the right copy of each listed item (delete the others, or write the item again through "
                 "the shim, which gives it a version), then verify again",
    "unmappable": "fix the items or the [from] template (a template that matches no item makes every item "
                  "unmappable); `reshard status` lists the backfill's unmappable items",
    "gsi_value": "run `reshard verify --repair` in the backfill phase (it rewrites each such item's GSI value, "
                 "conditioned on its version like the backfill), then verify again",
    "gsi_missing": "the index lags or lost entries: check the GSI is ACTIVE and not throttled (an index whose "
                   "writes are throttled lags), then verify again, with a longer --settle-seconds if it lags",
    "gsi_extra": "the index lags behind deletes: check the GSI is ACTIVE and not throttled, then verify again, "
                 "with a longer --settle-seconds if it lags",
    "gsi_differs": "the index lags behind writes: check the GSI is ACTIVE and not throttled, then verify again, "
                   "with a longer --settle-seconds if it lags",
    "new_only": "run `reshard verify --repair` in the backfill phase: it copies these shim writes to the old "
                "layout (fenced, never deleting them)",
}

#: Counters that inform but never fail a run.
INFO = {
    "old_copies": "items with several live old copies, one newest (the newest wins, as in the shim)",
}

#: DynamoDB's TTL ignores an epoch more than five years in the past (the item is never deleted).
TTL_MAX_AGE_SECONDS = 5 * 365 * 24 * 3600


def live(item: Mapping[str, Any] | None) -> bool:
    return item is not None and not is_tombstone(item)


def expired(item: Mapping[str, Any] | None, ttl_attribute: str | None, now: float) -> bool:
    """Whether DynamoDB's TTL may delete ``item`` at any moment (so it counts as absent).

    TTL only acts on a Number of epoch seconds that is in the past and at most five
    years old; any other value (a string, milliseconds far in the future) never expires.
    """
    if item is None or not ttl_attribute or ttl_attribute not in item:
        return False
    av = item[ttl_attribute]
    if not isinstance(av, Mapping) or "N" not in av:
        return False
    try:
        epoch = Decimal(av["N"])
    except (InvalidOperation, TypeError):
        return False
    at = Decimal(str(now))
    return at - TTL_MAX_AGE_SECONDS <= epoch < at


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
    if mapper.content(old, mapper.old) == mapper.content(new, mapper.new):
        return None
    return "stale" if version_of(new) < version_of(old) else "diverged"


@dataclass(frozen=True)
class Judgement:
    """The verdict on one logical item, over every old copy and the new-layout item.

    ``kind``: a key of :data:`KINDS` or None. ``reference``: the newest old copy (what
    the new copy must equal; None when there is none). ``new``: the new-layout item
    (None when absent or expired). ``old_copies``: live old copies seen (after TTL).
    """

    kind: str | None
    reference: Mapping[str, Any] | None
    new: Mapping[str, Any] | None
    old_copies: int
    detail: str = ""


def _content(mapper: KeyMapper, item: Mapping[str, Any]):
    """A comparable form of an old copy's logical content (None for a tombstone)."""
    if not live(item):
        return None
    return mapper.content(item, mapper.old)


def judge(mapper: KeyMapper, olds: Sequence[Mapping[str, Any]], new: Mapping[str, Any] | None, *,
          ttl_attribute: str | None = None, now: float = 0.0) -> Judgement:
    """Judge one logical item from every old copy found (``olds``, in candidate order,
    tombstones included, new-layout copies excluded) and the item at its new key.

    The item at the new key may be one of ``olds`` (an unmarked item whose key does not
    move serves both layouts).
    """
    all_versions = [version_of(o) for o in olds]
    present = [o for o in olds if not expired(o, ttl_attribute, now)]
    if expired(new, ttl_attribute, now):
        new = None
    reference, kind, detail = None, None, ""
    live_olds = [o for o in present if live(o)]
    if present:
        top = max(version_of(o) for o in present)
        tied = [o for o in present if version_of(o) == top]
        reference = tied[0]
        contents = []
        for o in tied:
            c = _content(mapper, o)
            if c not in contents:
                contents.append(c)
        if len(contents) > 1:
            return Judgement("collision", reference, new, len(live_olds),
                             f"{len(tied)} old copies tie at version {top or '(none)'} with different content")
    kind = classify(mapper, reference, new)
    if kind in ("extra", "resurrected") and version_of(new) and version_of(new) > max(all_versions, default=""):
        # Newer than every old copy: a shim wrote it (e.g. a cutover put stored once, or a
        # mirror to the old layout that never landed). It is an acknowledged write:
        # never deleted, and the old layout must get it back.
        kind = "new_only"
        detail = "a shim write newer than every old copy; kept"
    elif kind in ("missing", "stale", "diverged") and live(reference):
        try:
            mapper.remap(reference)
        except UnmappableItem as e:
            if e.reason == "too-large":
                kind, detail = "too_large", f"{e.detail}: shrink or delete the item"
    return Judgement(kind, reference, new, len(live_olds), detail)


def differences(totals: Mapping[str, float]) -> dict[str, int]:
    """How many differences of each kind a verify run's totals hold (zero for absent kinds)."""
    return {k: int(totals.get(k, 0)) for k in KINDS}


def failing(totals: Mapping[str, float], allow_unmappable: int = 0) -> dict[str, int]:
    """The kinds that fail the run: every difference, unmappable items beyond the allowance.

    ``allow_unmappable`` is the hook for an operator's explicit allowance (a later
    ``--allow-unmappable N``): until then it is 0, so a run that could not map an item
    never passes (a template that matches nothing must not pass with every item skipped).
    """
    out = {k: n for k, n in differences(totals).items() if n}
    if 0 < out.get("unmappable", 0) <= allow_unmappable:
        del out["unmappable"]
    return out


def passes(totals: Mapping[str, float], finished: bool, allow_unmappable: int = 0) -> bool:
    """THE verify verdict (the CLI, ``status`` and the cutover gate all ask this): finished,
    nothing failing, and no repair sent (``repair_pages``: a run that repaired proves the
    table as it was, not as it is now; counted apart from the differences, which a page
    redone after its repair no longer finds)."""
    return bool(finished) and not failing(totals, allow_unmappable) and not totals.get("repair_pages", 0)
