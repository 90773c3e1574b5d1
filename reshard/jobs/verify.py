"""`reshard verify`: prove the copy, item by item, both ways, before cutover.

Each segment of a parallel Scan is checked with the segment engine (leases,
checkpoints, resumable like the backfill). For every scanned item:

* an **old-layout item** that moves: its new-layout counterpart must hold the same
  logical content (``compare.classify``: missing, stale, diverged, resurrected ...);
* an **old-layout item** that does not move is one physical item serving both layouts:
  nothing to compare;
* a **new-layout copy** (``_rs_new`` marker): it must sit at the key its fields map to
  (else ``duplicate``), and its old-layout counterpart must exist and be live (else
  ``extra`` / ``resurrected``); with a random old layout every candidate shard is read
  and two live old items are a ``duplicate``.

Telling live traffic from real differences
    The first look uses the scanned item and an eventually consistent read. Every
    candidate difference is then re-read with consistent reads of *both* sides, up to
    ``rechecks`` times, a short pause apart. A shim write in flight (authoritative copy
    written, mirror not yet) settles within one write's latency, so the re-read agrees
    and nothing is reported. A difference is reported only when two consecutive
    consistent re-reads show the same versions on both sides and still disagree (or it
    keeps changing through every re-read, which is reported too, marked as such).

``--repair`` (backfill phase only, where the old layout is authoritative) fixes what it
finds from the old layout with fenced writes that never overwrite a newer version.

The run's verdict is kept in the control table (``R#verify#<run>``: started, finished,
totals per kind) and examples under ``D#verify#<run>#<digest>``; the cutover gate
(:func:`verify_facts`) needs a passing run that started after the backfill finished.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Callable

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.records import example_prefix
from reshard.control.runs import backfill_run, read_run
from reshard.control.store import ControlStore
from reshard.core.compare import KINDS, Difference, classify, live
from reshard.core.layout import NEW_COPY_ATTR, TOMBSTONE_ATTR, VERSION_ATTR, KeyMapper
from reshard.core.phases import BACKFILL_JOB, VERIFY_JOB
from reshard.core.versions import fence_for, unchanged, version_of
from reshard.core.wire import S, key_of, projection
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import PageContext
from reshard.jobs.runner import JobContext, JobOptions, JobSpec, conditional_delete, conditional_put, scan_page

DIFFERENCE_KINDS = tuple(KINDS)


def _kid(key: dict) -> tuple:
    """A cheap hashable id of a key: (attribute, type, value) per key attribute."""
    return tuple((a, *next(iter(key[a].items()))) for a in sorted(key))


class Verifier:
    """The page function of a verify run."""

    def __init__(self, dynamo: Dynamo, store: ControlStore, migration_id: str, run: int, mapper: KeyMapper,
                 table: str, budget: CapacityBudget, opts: JobOptions,
                 sleep: Callable[[float], None] = time.sleep):
        self.dynamo = dynamo
        self.store = store
        self.migration_id = migration_id
        self.run = run
        self.mapper = mapper
        self.table = table
        self.budget = budget
        self.opts = opts
        self.sleep = sleep
        self.key_attrs = mapper.old.key_attrs
        self._liveness_projection = projection([*self.key_attrs, VERSION_ATTR, TOMBSTONE_ATTR, NEW_COPY_ATTR])

    def _key(self, item: dict) -> dict:
        return key_of(item, self.key_attrs)

    def _read(self, keys: list[dict], consistent: bool, projection: dict | None = None) -> dict[str, dict]:
        unique = list({_kid(k): k for k in keys}.values())
        if not unique:
            return {}
        with self.budget.spend("read", len(unique) * (1.0 if consistent else 0.5)):
            found = self.dynamo.batch_get(self.table, unique, consistent=consistent, capacity=True,
                                          projection=projection)
        return {_kid(self._key(i)): i for i in found}

    # ---------------------------------------------------------------- one page
    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        counts: dict[str, float] = {"checked": 0, "unmoved": 0, "unmappable": 0, "new_copies": 0, "settled": 0,
                                    "repaired": 0, "unrepaired": 0}
        for k in DIFFERENCE_KINDS:
            counts[k] = 0
        resp = scan_page(self.dynamo, self.budget, self.table, ctx, start_key, self.opts.page_size)
        items = resp.get("Items", [])

        # (side, old candidate keys, new key) per logical item. Each kind of difference is
        # judged from one side only, so a pair seen from both sides is counted once.
        checks: list[tuple[str, list[dict], dict]] = []
        for item in items:
            counts["checked"] += 1
            if self.mapper.is_new_copy(item):
                counts["new_copies"] += 1
                try:
                    fields = self.mapper.fields(item, self.mapper.new)
                    misplaced = self.mapper.new.key(fields) != self._key(item)
                    detail = "a new-layout copy at a key its fields do not map to"
                except errors.UnmappableItem as e:
                    fields, misplaced = None, True
                    detail = f"a new-layout copy whose key does not map: {e}"
                if misplaced:
                    # Nothing reads a copy at a key its own fields do not map to: garbage
                    # (from a bug or a hand edit). Repair deletes it if it is still the same.
                    if self.opts.repair:
                        fixed = self._delete_copy(item, self._key(item))
                        counts["repaired" if fixed else "unrepaired"] += 1
                        detail += "; repaired" if fixed else ""
                    ident = self.mapper.identity(fields) if fields else ()
                    self._report(counts, "duplicate", ident, None, self._key(item), None, item, detail)
                    continue
                checks.append(("new", self.mapper.old.candidate_keys(fields), self._key(item), item))
                continue
            try:
                fields = self.mapper.fields(item, self.mapper.old)
            except errors.UnmappableItem:
                counts["unmappable"] += 1  # the backfill lists these; they are not copied on purpose
                continue
            new_key = self.mapper.new.key(fields)
            if new_key == self._key(item):
                counts["unmoved"] += 1
                continue
            # From the old side one old key is enough: duplicates among a random layout's
            # shards are judged from the new side, which reads every candidate.
            checks.append(("old", [self._key(item)], new_key, item))

        suspects = self._first_look(checks)
        for side, old_keys, new_key in suspects:
            self._settle(counts, side, old_keys, new_key)
        usage = self.budget.take_usage()
        counts["rcu"], counts["wcu"] = round(usage["rcu"], 2), round(usage["wcu"], 2)
        return counts, resp.get("LastEvaluatedKey")

    def _first_look(self, checks: list[tuple]) -> list[tuple[str, list[dict], dict]]:
        """Eventually consistent reads of every pair's counterpart (the scanned item is its own
        side); returns the pairs that look different.

        From the new side only the old item's liveness matters (extra, resurrected,
        duplicate), so those reads are projected to the key and bookkeeping attributes.
        """
        found: dict[str, dict] = {}
        found.update(self._read([new_key for side, _, new_key, _ in checks if side == "old"], consistent=False))
        found.update(self._read([k for side, old_keys, _, _ in checks if side == "new" for k in old_keys],
                                consistent=False, projection=self._liveness_projection))
        suspects = []
        for side, old_keys, new_key, scanned in checks:
            view = dict(found)
            view[_kid(self._key(scanned))] = scanned
            if self._judge(side, old_keys, new_key, view)[0] is not None:
                suspects.append((side, old_keys, new_key))
        return suspects

    #: Which side of a pair judges which kinds (see ``page``).
    SIDE_KINDS = {"old": frozenset({"missing", "stale", "diverged"}),
                  "new": frozenset({"extra", "resurrected", "duplicate"})}

    def _judge(self, side: str, old_keys: list[dict], new_key: dict, found: dict[str, dict]):
        """(kind or None, old item, new item, versions) for one logical item, judged from ``side``."""
        kind, old, new, versions = self._compare(side, old_keys, new_key, found)
        if kind not in self.SIDE_KINDS[side]:
            kind = None
        return kind, old, new, versions

    def _compare(self, side: str, old_keys: list[dict], new_key: dict, found: dict[str, dict]):
        new = found.get(_kid(new_key))
        olds = [found[_kid(k)] for k in old_keys if _kid(k) in found and not self.mapper.is_new_copy(found[_kid(k)])]
        live_olds = [o for o in olds if live(o)]
        if len(live_olds) > 1:
            return "duplicate", live_olds[0], new, tuple(version_of(o) for o in olds) + (version_of(new),)
        old = live_olds[0] if live_olds else (olds[0] if olds else None)
        versions = (version_of(old), version_of(new), old is None, new is None)
        if side == "new" and old is not None and live(old):
            return None, old, new, versions  # content is judged from the old side
        return classify(self.mapper, old, new), old, new, versions

    def _settle(self, counts: dict, side: str, old_keys: list[dict], new_key: dict) -> None:
        """Re-read a suspect consistently until it agrees or stays the same twice."""
        previous = None
        kind = old = new = None
        steady = False
        for attempt in range(max(1, self.opts.rechecks)):
            if attempt:
                self.sleep(self.opts.recheck_pause * attempt)
            found = self._read([*old_keys, new_key], consistent=True)
            kind, old, new, versions = self._judge(side, old_keys, new_key, found)
            if kind is None:
                counts["settled"] += 1  # an in-flight write, now landed
                return
            if versions == previous:
                steady = True
                break
            previous = versions
        ident = self._identity(old, new)
        detail = "" if steady else f"still changing after {self.opts.rechecks} consistent re-reads"
        if self.opts.repair and self._repair(kind, old, new, new_key):
            counts["repaired"] += 1
            detail = (detail + "; " if detail else "") + "repaired"
        elif self.opts.repair:
            counts["unrepaired"] += 1
        self._report(counts, kind, ident, self._key(old) if old else old_keys[0], new_key, old, new, detail)

    def _identity(self, old: dict | None, new: dict | None) -> tuple:
        try:
            if old is not None:
                return self.mapper.identity(self.mapper.fields(old, self.mapper.old))
            if new is not None:
                return self.mapper.identity(self.mapper.fields(new, self.mapper.new))
        except errors.UnmappableItem:
            pass
        return ()

    def _report(self, counts: dict, kind: str, identity: tuple, old_key: dict | None, new_key: dict | None,
                old: dict | None, new: dict | None = None, detail: str = "") -> None:
        counts[kind] += 1
        # Examples go to the control table (bounded: the first few per page), so a run
        # shared by several hosts still has one list; the digest makes a re-done page idempotent.
        if counts[kind] > max(1, self.opts.examples // 4):
            return
        body = Difference(kind, identity, old_key, new_key, version_of(old), version_of(new), detail).as_dict()
        text = json.dumps(body, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        self.store.put({"pk": S(self.store.mpk(self.migration_id)), "sk": S(example_prefix(VERIFY_JOB, self.run) + digest),
                        "body": S(text)})

    # ---------------------------------------------------------------- repair
    def _repair(self, kind: str, old: dict | None, new: dict | None, new_key: dict) -> bool:
        """Fix one difference from the old (authoritative) layout; never overwrite a newer version."""
        try:
            if kind in ("missing", "stale", "diverged", "resurrected") and old is not None:
                if version_of(new) > version_of(old):
                    return False  # a newer write sits in the new layout only: leave it, report it
                target, _ = self.mapper.remap(old)  # a tombstone re-keys to a tombstone copy
                # Same version but other content: only this exact stale copy may be replaced.
                fence = unchanged(version_of(old), self.key_attrs[0]) \
                    if new is not None and version_of(new) == version_of(old) else fence_for(version_of(old))
                return conditional_put(self.dynamo, self.budget, self.table, target, fence)
            if kind == "extra" and new is not None and self.mapper.is_new_copy(new):
                # A copy with no old item behind it. (Duplicates among old shards are
                # reported, not repaired: which one the application meant is not ours to
                # guess; the shim reads the newest.)
                return self._delete_copy(new, new_key)
        except errors.UnmappableItem:
            return False
        return False

    def _delete_copy(self, item: dict, key: dict) -> bool:
        """Delete a new-layout copy if it is still the one we saw (same version)."""
        return conditional_delete(self.dynamo, self.budget, self.table, key,
                                  unchanged(version_of(item), self.key_attrs[0]))


def _after_backfill(store: ControlStore, state, options: JobOptions) -> float:
    """The backfill run finished (else uncopied items would show as missing); a verify run
    counts only if it started after that."""
    info = read_run(store, state.id, BACKFILL_JOB, backfill_run(store, state.id))
    if info is None or info.finished_at is None:
        raise errors.RefusedTransition(
            f"verify refused for {state.id!r}: the backfill has not finished, so uncopied items would show as "
            f"missing; run `reshard backfill {state.id}` to completion first")
    return info.finished_at


def _make_page(ctx: JobContext):
    return Verifier(ctx.dynamo, ctx.store, ctx.state.id, ctx.run, ctx.mapper, ctx.migration.table, ctx.budget,
                    ctx.options, ctx.sleep).page


#: ``reshard verify``: a fresh run each time (a finished run is a verdict), joined by
#: other hosts while it is unfinished.
VERIFY = JobSpec(VERIFY_JOB, _make_page, check=_after_backfill, fresh=True)
