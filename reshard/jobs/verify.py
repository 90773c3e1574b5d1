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
from dataclasses import dataclass, field
from typing import Callable, Iterable

from reshard import errors
from reshard.jobs.backfill import JOB as BACKFILL_JOB
from reshard.jobs.backfill import current_run as backfill_run
from reshard.jobs.budget import CapacityBudget
from reshard.core.compare import KINDS, classify, live
from reshard.control.store import ControlStore, S, register_facts_provider
from reshard.aws.dynamo import Dynamo
from reshard.jobs.runner import scan_page, conditional_delete, conditional_put, latest_run, make_engine, require_phase_and_ack, run_to_join
from reshard.core.layout import NEW_COPY_ATTR, TOMBSTONE_ATTR, VERSION_ATTR, KeyMapper
from reshard.core.phases import Phase
from reshard.jobs.engine import DEFAULT_LEASE_SECONDS, PageContext, RunResult, Subscriber, read_run
from reshard.core.versions import fence_for, unchanged, version_of

JOB = "verify"
DIFFERENCE_KINDS = tuple(KINDS)


@dataclass
class VerifyOptions:
    """The knobs of ``reshard verify``."""

    segments: int = 16
    workers: int | None = None
    repair: bool = False
    max_rcu: float | None = None
    max_wcu: float | None = None
    examples: int = 20
    page_size: int = 500
    rechecks: int = 4
    recheck_pause: float = 0.05
    lease_seconds: float = DEFAULT_LEASE_SECONDS


@dataclass
class VerifyResult:
    """The outcome of a verify run (possibly shared with other hosts)."""

    run: int
    finished: bool
    passed: bool
    counts: dict
    examples: list = field(default_factory=list)
    checked: int = 0
    repaired: int = 0
    started_at: float = 0.0
    finished_at: float | None = None
    segments: RunResult | None = None

    def as_dict(self) -> dict:
        return {"run": self.run, "finished": self.finished, "passed": self.passed, "counts": self.counts,
                "checked": self.checked, "repaired": self.repaired, "examples": self.examples,
                "started_at": self.started_at, "finished_at": self.finished_at}


def _kid(key: dict) -> tuple:
    """A cheap hashable id of a key: (attribute, type, value) per key attribute."""
    return tuple((a, *next(iter(key[a].items()))) for a in sorted(key))


class Verifier:
    """The page function of a verify run."""

    def __init__(self, dynamo: Dynamo, store: ControlStore, migration_id: str, run: int, mapper: KeyMapper,
                 table: str, budget: CapacityBudget, opts: VerifyOptions,
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
        names = {f"#k{i}": a for i, a in enumerate(self.key_attrs)}
        names.update({"#v": VERSION_ATTR, "#d": TOMBSTONE_ATTR, "#n": NEW_COPY_ATTR})
        self._liveness_projection = {"ProjectionExpression": ", ".join(names), "ExpressionAttributeNames": names}

    def _key(self, item: dict) -> dict:
        return {a: item[a] for a in self.key_attrs}

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
        body = {"kind": kind, "identity": [str(x) for x in identity], "old_key": old_key, "new_key": new_key,
                "old_version": version_of(old), "new_version": version_of(new), "detail": detail}
        text = json.dumps(body, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        self.store.put({"pk": S(self.store.mpk(self.migration_id)), "sk": S(f"D#{JOB}#{self.run:06d}#{digest}"),
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


def check_preconditions(store: ControlStore, migration_id: str, repair: bool):
    """Phase backfill (or cutover, without --repair), fleet acknowledged, backfill finished."""
    phases = (Phase.BACKFILL,) if repair else (Phase.BACKFILL, Phase.CUTOVER)
    why = ("--repair writes from the old layout, which is authoritative only up to backfill" if repair
           else "it compares the layouts the backfill filled")
    state = require_phase_and_ack(store, migration_id, "verify", phases, why)
    run = backfill_run(store, migration_id)
    info = read_run(store, migration_id, BACKFILL_JOB, run)
    if info is None or info.finished_at is None:
        raise errors.RefusedTransition(
            f"verify refused for {migration_id!r}: the backfill has not finished, so uncopied items would show as "
            f"missing; run `reshard backfill {migration_id}` to completion first")
    return state, info


def run_verify(dynamo: Dynamo, store: ControlStore, migration_id: str, opts: VerifyOptions | None = None, *,
               subscribers: Iterable[Subscriber] = (), clock: Callable[[], float] = time.time,
               sleep: Callable[[float], None] = time.sleep) -> VerifyResult:
    """Check the preconditions and run (or join, or resume) a verify run with this host's workers."""
    opts = opts or VerifyOptions()
    state, backfill_info = check_preconditions(store, migration_id, opts.repair)
    phases = (Phase.BACKFILL,) if opts.repair else (Phase.BACKFILL, Phase.CUTOVER)
    migration = state.migration()
    mapper = KeyMapper(migration)
    dynamo.describe_table(migration.table)
    # Join an unfinished run that started after the backfill finished; else start a new one.
    run = run_to_join(store, migration_id, JOB, not_before=backfill_info.finished_at, fresh=True)
    budget = CapacityBudget(opts.max_wcu, opts.max_rcu)
    budget.attach(dynamo, migration.table)
    verifier = Verifier(dynamo, store, migration_id, run, mapper, migration.table, budget, opts, sleep)
    engine = make_engine(dynamo, store, migration_id, JOB, run, opts.segments, verifier.page, budget,
                         phases=phases, workers=opts.workers, lease_seconds=opts.lease_seconds, subscribers=subscribers,
                         clock=clock, sleep=sleep)
    result = engine.run_all()
    return result_of(store, migration_id, run, opts.examples, result)


def result_of(store: ControlStore, migration_id: str, run: int, examples: int = 20,
              segments: RunResult | None = None) -> VerifyResult:
    """The verdict of a verify run as recorded in the control table."""
    info = read_run(store, migration_id, JOB, run)
    item = store.get(store.mpk(migration_id), f"R#{JOB}#{run:06d}") or {}
    totals = {k: float(v["N"]) for k, v in item.get("totals", {}).get("M", {}).items()}
    if segments is not None and not totals:
        totals = segments.totals
    counts = {k: int(totals.get(k, 0)) for k in DIFFERENCE_KINDS}
    finished = bool(info and info.finished_at is not None)
    shown = [json.loads(i["body"]["S"]) for i in store.query(store.mpk(migration_id), f"D#{JOB}#{run:06d}#")]
    return VerifyResult(run=run, finished=finished, passed=finished and not any(counts.values()), counts=counts,
                        examples=shown[:examples], checked=int(totals.get("checked", 0)),
                        repaired=int(totals.get("repaired", 0)), started_at=info.started_at if info else 0.0,
                        finished_at=info.finished_at if info else None, segments=segments)


@register_facts_provider
def verify_facts(store: ControlStore, state) -> dict:
    """``verify_missing``: None only for a passing verify that started after the backfill finished.

    A run with repairs does not pass: it changed the new layout, so its own reading is
    stale; the operator verifies again.
    """
    cmd = f"`reshard verify {state.id}`"
    run = backfill_run(store, state.id)
    backfill = read_run(store, state.id, BACKFILL_JOB, run)
    if backfill is None or backfill.finished_at is None:
        return {"verify_missing": f"no verify yet (the backfill must finish first, then run {cmd})"}
    latest = latest_run(store, state.id, JOB)
    if latest is None or latest.started_at < backfill.finished_at:
        return {"verify_missing": f"no verify since the backfill finished: run {cmd}"}
    result = result_of(store, state.id, latest.run, examples=0)
    if not result.finished:
        return {"verify_missing": f"verify run {latest.run} is not finished: run {cmd} to finish it"}
    if not result.passed:
        found = ", ".join(f"{n} {k}" for k, n in result.counts.items() if n)
        return {"verify_missing": f"the last verify (run {latest.run}) found differences ({found}): fix them "
                                  f"(`reshard verify {state.id} --repair`), then run {cmd} again"}
    if result.repaired:
        return {"verify_missing": f"the last verify repaired {result.repaired} item(s): run {cmd} again"}
    return {"verify_missing": None}

