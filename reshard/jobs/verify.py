"""`reshard verify`: prove the copy, item by item, both ways, before cutover.

Each segment of a parallel Scan is checked with the segment engine (leases,
checkpoints, resumable like the backfill). Every scanned item belongs to a *logical
item*, judged once (:func:`reshard.core.compare.judge`) over **every** physical item it
has: all its old copies (a random-suffix old layout may hold it under any of its N
candidate keys) and the item at its new key. The newest old copy is the reference; old
copies that tie for newest with different content are a ``collision``. On a table whose
TTL is on, a copy whose TTL epoch has passed counts as absent (DynamoDB deletes expired
items lazily, so the two copies of an item go at different times).

Who reports: the marked copy at the new key if there is one (it reads every old
candidate), else the newest old copy. An old item whose new key holds a marked copy
stops after that one read; otherwise it reads every candidate itself. Every physical
item is scanned once, so each logical item is judged once.

* an old item whose key does not move (non-random layout) serves both layouts: nothing
  to compare;
* a marked copy at a key its own fields do not map to is a ``duplicate``;
* an old item the layout cannot map is ``unmappable``, and fails the run (unless the
  operator allowed that many: ``compare.passes``);
* a copy that would exceed 400 KB in the new layout is ``too_large`` (with guidance).

Telling live traffic from real differences
    The first look uses the scanned item and an eventually consistent read. Every
    candidate difference (a page's together) is then re-read with consistent reads of
    every copy, soon at first, then less often. A shim write in flight (authoritative
    copy written, mirror not yet) may take as long as the shim's retries allow; each
    shim publishes that bound in its heartbeat. A difference is reported only when the
    same versions were seen on two looks and for the whole settle window (the largest
    bound published, or ``--settle-seconds``) on verify's own monotonic clock
    (:mod:`reshard.core.settle`); or when it keeps changing through ``rechecks`` looks
    (reported too, marked as such).

``--repair`` (backfill phase only, where the old layout is authoritative) fixes what it
can with version-fenced writes that never overwrite a newer version and never delete a
shim's write: a marked copy newer than every old copy (``new_only``) is copied back to the
old layout, never deleted; only an unversioned copy with no old item (``extra``) is
deleted, and only if still unchanged. Collisions, too-large and unmappable items are
reported with guidance, not guessed at. Every repair request is also guarded, before each
attempt, by the lease's local deadline (``PageContext.write_guard``, as the backfill's
copies are): a repair worker stalled past its lease sends nothing, so the gates that wait
for job leases to go quiet (cutover, retire) can rely on it. Before a page's first repair
the run row counts it (``repair_pages``, :func:`reshard.jobs.runner.announce_repair`): a
page redone after its repair finds nothing left, yet the run still does not pass.

The run's verdict is kept in the control table (``R#verify#<run>``: started, finished,
totals per kind) and examples under ``D#verify#<run>#<digest>``; the cutover gate
(:func:`reshard.control.gates.verify_missing`) needs a passing run that started after the
backfill finished.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.fleet import heartbeats
from reshard.control.records import example_prefix
from reshard.control.runs import allowed_unmappable, backfill_run, read_run
from reshard.control.store import ControlStore
from reshard.aws.inspect import ttl_status
from reshard.core.compare import INFO, KINDS, Difference, Judgement, differences, judge, passes
from reshard.core.index import NEW as INDEX_NEW, mappers, reindexed
from reshard.core.join import MISPLACED, NEW, OLD, Record, Recorder, fields_from_text, verdict
from reshard.core.deadlines import DATE_MARGIN_SECONDS
from reshard.core.layout import NEW_COPY_ATTR, TOMBSTONE_ATTR, VERSION_ATTR, KeyMapper, hash_shard, is_tombstone, not_data
from reshard.core.migration import SHARD
from reshard.core.phases import BACKFILL_JOB, ROUTING, VERIFY_JOB, job_rule
from reshard.core.settle import Watch, decide, settle_window
from reshard.core.versions import fence_for, stored_version, unchanged, version_of
from reshard.core.wire import S, dump_key, key_of
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import LeaseLost, PageContext, settle_text, settle_wait
from reshard.jobs.index_jobs import IndexVerifier
from reshard.jobs.records import END, RESCAN_TOKEN, Join, RunRecords, SegmentFiles, StaleWrite
from reshard.jobs.records import complete as records_complete
from reshard.jobs.records import discard as discard_records
from reshard.jobs.runner import (JobContext, JobOptions, JobSpec, announce_repair, conditional_delete, conditional_put,
                                 over_leftovers, phase_guard, require_phase_and_ack, scan_page)

DIFFERENCE_KINDS = tuple(KINDS)
#: The join segment's checkpoint: the identity hash (hex) of the last suspect judged.
JOIN_ATTR = "join"


def _zero_counts() -> dict[str, float]:
    counts: dict[str, float] = {"checked": 0, "unmoved": 0, "new_copies": 0, "settled": 0,
                                "repaired": 0, "unrepaired": 0}
    for k in (*DIFFERENCE_KINDS, *INFO):
        counts[k] = 0
    return counts


class _Slice(NamedTuple):
    """What ``scan_page`` reads of a page context: the scan's segment and segment count (the
    engine counts one segment more: the join)."""

    segment: int
    total_segments: int


def _kid(key: dict) -> tuple:
    """A cheap hashable id of a key: (attribute, type, value) per key attribute."""
    return tuple((a, *next(iter(key[a].items()))) for a in sorted(key))


class Check(NamedTuple):
    """One logical item to re-read and judge: every old candidate key, its new-layout key."""

    side: str  # "join": a suspect of the join
    candidates: list
    new_key: dict
    scanned: dict | None
    identity: tuple


class Verifier(RunRecords):
    """The page function of a verify run."""

    def __init__(self, dynamo: Dynamo, store: ControlStore, migration_id: str, run: int, mapper: KeyMapper,
                 table: str, budget: CapacityBudget, opts: JobOptions,
                 sleep: Callable[[float], None] = time.sleep, *, ttl_attribute: str | None = None,
                 clock: Callable[[], float] = time.time, records_dir: pathlib.Path | None = None,
                 horizon: float | None = None, authoritative: str = "old"):
        self.dynamo = dynamo
        #: The migration's request horizon when the server enforces it (None: it does not):
        #: the settle window is then ``horizon + DATE_MARGIN`` on the server's clock.
        self.horizon = horizon
        #: The layout written first in the phase this run repairs in (``"old"`` in backfill,
        #: ``"new"`` in cutover): a copy of the same version but other content is replaced
        #: only from it.
        self.authoritative = authoritative
        self.store = store
        self.migration_id = migration_id
        self.run = run
        self.mapper = mapper
        self.table = table
        self.budget = budget
        self.opts = opts
        self.sleep = sleep
        self.ttl_attribute = ttl_attribute
        self.clock = clock
        self.key_attrs = mapper.old.key_attrs
        #: A read-only verify (``--no-record``) keeps its examples here instead of writing
        #: them to the control table (None: a recorded run writes them).
        self.collected: list[dict] | None = None
        self.recorder = Recorder(mapper, ttl_attribute)
        #: Where this run's records are kept on this host (None: the run's directory under
        #: ``opts.records_dir``, found at the first page); removed once the join finished.
        self.records_dir = records_dir
        self.remove_records = records_dir is None
        self._segment_files: SegmentFiles | None = None
        self._files_lock = threading.Lock()
        #: A combined migration's sharded GSIs: a repair's copy gets their [to] values (the
        #: phase's, as the backfill's copy); set by :mod:`reshard.jobs.combined`.
        self.indexes: tuple = ()

    def _key(self, item: dict) -> dict:
        return key_of(item, self.key_attrs)

    def _read(self, keys: list[dict], consistent: bool) -> dict[tuple, dict]:
        unique = list({_kid(k): k for k in keys}.values())
        if not unique:
            return {}
        with self.budget.spend("read", len(unique) * (1.0 if consistent else 0.5)):
            found = self.dynamo.batch_get(self.table, unique, consistent=consistent, capacity=True)
        # A retired leftover (``_rs_gone``) or the table marker is absent for every reader.
        return {_kid(self._key(i)): i for i in found if not not_data(i)}

    # ---------------------------------------------------------------- one page
    def page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        """A scan segment's page (records), or a page of the join (the run's last segment)."""
        if ctx.segment >= self.opts.segments:
            return self._join_page(ctx, start_key)
        counts = _zero_counts()
        resp = scan_page(self.dynamo, self.budget, self.table, _Slice(ctx.segment, self.opts.segments), start_key,
                         self.opts.page_size)
        records = self._records(resp.get("Items", []), ctx, counts)
        next_key = resp.get("LastEvaluatedKey")
        # Kept before the page returns, i.e. before the engine checkpoints it: a kill redoes this page.
        ctx.check_deadline()
        try:
            self._files().write_page(ctx.segment, dump_key(start_key) if start_key else END,
                                     dump_key(next_key) if next_key else END, records,
                                     getattr(ctx.lease, "token", None))
        except StaleWrite as e:  # paused past the deadline check: a later holder of this host wrote here
            raise LeaseLost(str(e)) from None
        usage = self.budget.take_usage()
        counts["rcu"], counts["wcu"] = round(usage["rcu"], 2), round(usage["wcu"], 2)
        return counts, next_key

    def _records(self, items: list[dict], ctx: PageContext, counts: dict | None) -> list[Record]:
        """The records of a page's items; with ``counts``, the scan's own findings are counted
        and reported too (unmappable items, misplaced copies: no join needed); without, the
        page is only recorded again (the join re-scanning a segment this host lacks)."""
        out = []
        record = self.recorder.record
        mapper = self.mapper
        old, new, fields_of, is_new_copy = mapper.old, mapper.new, mapper.fields, mapper.is_new_copy
        for item in items:
            if not_data(item):
                continue  # the table marker, an earlier migration's retired leftover: not data
            if counts is not None:
                counts["checked"] += 1
            if is_new_copy(item):
                if counts is not None:
                    counts["new_copies"] += 1
                try:
                    fields = fields_of(item, new)
                    misplaced = new.key(fields) != self._key(item)
                    detail = "a new-layout copy at a key its fields do not map to"
                except errors.UnmappableItem as e:
                    fields, misplaced = None, True
                    detail = f"a new-layout copy whose key does not map: {e}"
                if not misplaced:
                    out.append(record(item, NEW, fields))
                    continue
                # Nothing reads a copy at a key its own fields do not map to: garbage
                # (from a bug or a hand edit). Repair deletes it if it is still the same.
                fixed = False
                if counts is not None:
                    if self.opts.repair:
                        self._announce_repair(counts)
                        fixed = self._delete_copy(ctx, item, self._key(item))
                        counts["repaired" if fixed else "unrepaired"] += 1
                        detail += "; repaired" if fixed else ""
                    ident = self.mapper.identity(fields) if fields else ()
                    self._report(counts, "duplicate", ident, None, self._key(item), None, item, detail)
                if not fixed:  # it still sits at its key: another item's judge would see it there
                    out.append(record(item, MISPLACED, fields))
                continue
            try:
                if VERSION_ATTR in item:
                    stored_version(item, None, "the item")  # a plain client's _rs_v: reported, never judged
                fields = fields_of(item, old)
                new_key = new.key(fields)
            except errors.UnmappableItem as e:
                # Never a pass: an item verify cannot map is an item it cannot prove copied
                # (a template that matches nothing would otherwise pass with every item skipped).
                if counts is not None:
                    self._report(counts, "unmappable", (), self._key(item), None, item, None,
                                 f"{e.reason}: {e.detail}")
                out.append(record(item, OLD, None))
                continue
            if counts is not None and new_key == self._key(item):
                counts["unmoved"] += 1  # one physical item serving both layouts
            out.append(record(item, OLD, fields, new_key))
        return out

    # ---------------------------------------------------------------- the join
    def _join_page(self, ctx: PageContext, start_key: dict | None) -> tuple[dict, dict | None]:
        """The run's last segment, claimable once every scan segment is done: join the records
        (first page), and re-read and judge the suspects, ``page_size`` per page, in
        identity-hash order (the checkpoint is the last one judged). A page redone on a host
        without the join file builds it again (the counts of the first page are not redone)."""
        directory = self._records_dir()
        counts = _zero_counts()
        join = Join(directory)
        try:
            if start_key is None or not join.built():
                built = self._build(ctx, join)
                if start_key is None:
                    counts["old_copies"] += built["old_copies"]
                    counts["suspects"] = built["suspects"]
            after = bytes.fromhex(start_key[JOIN_ATTR]["S"]) if start_key else b""
            batch = join.suspects(after, self.opts.page_size)
        finally:
            join.close()
        checks = []
        for _ident, fields, _why in batch:
            values = fields_from_text(fields)
            checks.append(Check("join", self.mapper.old.candidate_keys(values), self.mapper.new.key(values), None,
                                self.mapper.identity(values)))
        self._settle(ctx, counts, checks)
        usage = self.budget.take_usage()
        counts["rcu"], counts["wcu"] = round(usage["rcu"], 2), round(usage["wcu"], 2)
        if len(batch) < self.opts.page_size:
            with self._files_lock:
                files, self._segment_files = self._segment_files, None
            # The verdict is in; the records are not needed.
            discard_records(files, directory if self.remove_records else None)
            return counts, None
        return counts, {JOIN_ATTR: {"S": batch[-1][0].hex()}}

    def _build(self, ctx: PageContext, join: Join) -> dict:
        """Every scan segment's records on this host (scanning again any segment whose records
        are not all here: scanned elsewhere, or lost), joined."""
        directory = self._records_dir()
        for s in range(self.opts.segments):
            if not records_complete(directory, s):
                self._files().forget(s)
                self._rescan(ctx, s)
        now = self.clock()
        ttl = bool(self.ttl_attribute)
        return join.build(self.opts.segments, lambda recs: verdict(recs, ttl=ttl, now=now),
                          tick=ctx.ensure_lease)

    def _rescan(self, ctx: PageContext, segment: int) -> None:
        """Record ``segment`` again from its start (records only: its counts and reports were
        made by the worker that scanned it)."""
        key = None
        while True:
            ctx.ensure_lease()
            resp = scan_page(self.dynamo, self.budget, self.table, _Slice(segment, self.opts.segments), key,
                             self.opts.page_size)
            nxt = resp.get("LastEvaluatedKey")
            self._files().write_page(segment, dump_key(key) if key else END, dump_key(nxt) if nxt else END,
                                     self._records(resp.get("Items", []), ctx, None), RESCAN_TOKEN)
            if not nxt:
                return
            key = nxt

    def _olds(self, c: Check, view: dict) -> list[dict]:
        """The old copies present among the candidates (tombstones included), in candidate order.

        An unmarked item at the new key counts when its key is a candidate (it did not move).
        """
        out = []
        for k in c.candidates:
            item = view.get(_kid(k))
            if item is not None and not self.mapper.is_new_copy(item):
                out.append(item)
        return out

    def _judge(self, c: Check, view: dict) -> Judgement:
        foreign = self._foreign(c, view)
        if foreign is not None:
            # Another logical item sits at one of this item's keys (two events of one sensor
            # in one millisecond, say, where the new key drops what told them apart): one
            # copy would overwrite the other. Never "repaired" over another item's data.
            return Judgement("collision", None, foreign, 0,
                             f"another item ({', '.join(map(str, self._item_identity(foreign)))}) sits at "
                             f"key {self._key(foreign)} of this item")
        return judge(self.mapper, self._olds(c, view), view.get(_kid(c.new_key)),
                     ttl_attribute=self.ttl_attribute, now=self.clock())

    def _item_identity(self, item: dict) -> tuple | None:
        layout = self.mapper.new if self.mapper.is_new_copy(item) else self.mapper.old
        try:
            return self.mapper.identity(self.mapper.fields(item, layout))
        except errors.UnmappableItem:
            return None

    def _foreign(self, c: Check, view: dict) -> dict | None:
        """An item of another identity at one of ``c``'s keys, if any."""
        for k in (*c.candidates, c.new_key):
            item = view.get(_kid(k))
            if item is not None:
                ident = self._item_identity(item)
                if ident is not None and ident != c.identity:
                    return item
        return None

    def _window(self) -> float:
        """How long a disagreement must be seen unchanged before it is reported: the
        operator's ``--settle-seconds``; else, when the server enforces the request horizon,
        ``H + DATE_MARGIN`` on the server's clock (a write in flight when verify looked has
        landed by then, or can never land); else the largest write bound any shim of the
        migration published (:func:`reshard.core.settle.settle_window`)."""
        if self.opts.settle_seconds is not None:
            return max(0.0, self.opts.settle_seconds)
        if self.horizon is not None:
            return self.horizon + DATE_MARGIN_SECONDS
        return settle_window(h.settle_seconds for h in heartbeats(self.store, self.migration_id))

    def _settle(self, ctx: PageContext, counts: dict, suspects: list[Check]) -> None:
        """Re-read the page's suspects consistently, together, until each agrees, or has
        shown the same versions on two looks and for the whole settle window (then it is
        reported), or keeps changing (reported, marked as such).

        A shim write in flight (authoritative copy landed, mirror not yet) can go on for
        as long as the shim's retries allow (:mod:`reshard.core.settle`); a difference
        seen unchanged for longer on our own monotonic clock is not one. Only suspects
        wait, in one batch per page: one consistent read of all of them per look, one
        sleep until the earliest look due. The lease is renewed while waiting and nothing
        is checkpointed until every suspect is judged (this page returns only then), so a
        lost lease or a crash redoes the page and skips nothing.
        """
        if not suspects:
            return
        window: float | None = None
        watches = [(c, Watch()) for c in suspects]
        reads = 0
        # With a server deadline the window is timed on the server's clock: the ``Date`` of
        # each re-read's answer (whole seconds, so a look happened in [date, date + 1)).
        server = self.horizon is not None
        while watches:
            keys = [k for c, _ in watches for k in (*c.candidates, c.new_key)]
            # Two instants per look: what the read shows was true at some moment between
            # them. A write seen landed landed before ``now`` (so "same since" starts at
            # ``now``, late); the look shows the state at or after ``sent`` (so the window
            # is judged at ``sent``, early). Both err towards waiting longer.
            sent = ctx.now()
            found = self._read(keys, consistent=True)
            reads += 1
            now = ctx.now()
            date = self.dynamo.answer_date() if server else None
            if server and date is None:
                server = False  # no Date header: our own monotonic clock, as without a deadline
            if server:
                sent, now = date, date + 1.0
            if window is None:
                # Read after the first consistent look: a shim whose write we may have seen
                # in flight wrote its heartbeat before it served that write.
                window = self._window()
            waiting, due = [], []
            for c, w in watches:
                j = self._judge(c, found)
                if j.kind is None:
                    counts["settled"] += 1  # an in-flight write, now landed
                    if j.old_copies > 1:
                        counts["old_copies"] += 1
                    continue
                w.observe(tuple(version_of(found.get(_kid(k))) if _kid(k) in found else None
                                for k in (*c.candidates, c.new_key)), now)
                verdict, at = decide(w, sent, window, max_changes=max(1, self.opts.rechecks - 1),
                                     pause=self.opts.recheck_pause)
                if verdict == "wait":
                    waiting.append((c, w))
                    due.append(at)
                    continue
                details = [j.detail] if j.detail else []
                if verdict == "changing":
                    details.append(f"still changing after {reads} consistent re-reads")
                elif window:
                    details.append(f"unchanged for {sent - w.since:.1f}s (settle window {window:g}s)")
                self._conclude(ctx, counts, c, j, details)
            watches = waiting
            if watches:
                shown = ", ".join(f"{f}={v}" for f, v in zip(self.mapper.key_fields, watches[0][0].identity))
                # On the server's clock with a deadline: its times become ours by the offset seen at
                # the last look (the wait sleeps on our monotonic clock, in slices it can report).
                shift = ctx.now() - sent if server else 0.0
                settle_wait(ctx, self.sleep, min(due) + shift, lambda now, n=len(watches), ends=max(
                    w.since for _, w in watches) + window + shift, e=shown: settle_text(n, e, window, ends - now))

    def _conclude(self, ctx: PageContext, counts: dict, c: Check, j: Judgement, details: list[str]) -> None:
        """Report a difference that stayed (repairing it first if asked)."""
        old, new = j.reference, j.new
        if self.opts.repair and self._repair(ctx, j, c, counts):
            counts["repaired"] += 1
            details.append("repaired")
        elif self.opts.repair:
            counts["unrepaired"] += 1
        self._report(counts, j.kind, c.identity, self._key(old) if old else c.candidates[0], c.new_key, old, new,
                     "; ".join(details))

    def _report(self, counts: dict, kind: str, identity: tuple, old_key: dict | None, new_key: dict | None,
                old: dict | None, new: dict | None = None, detail: str = "") -> None:
        counts[kind] += 1
        # Examples go to the control table (bounded: the first few per page), so a run
        # shared by several hosts still has one list; the digest makes a re-done page idempotent.
        if counts[kind] > max(1, self.opts.examples // 4):
            return
        body = Difference(kind, identity, old_key, new_key, version_of(old), version_of(new), detail).as_dict()
        text = json.dumps(body, sort_keys=True, default=str)
        if self.collected is not None:
            self.collected.append(json.loads(text))  # the shape a recorded example is read back in
            return
        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        self.store.put({"pk": S(self.store.jpk(self.migration_id, VERIFY_JOB)), "sk": S(example_prefix(VERIFY_JOB, self.run) + digest),
                        "body": S(text)})

    # ---------------------------------------------------------------- repair
    def _announce_repair(self, counts: dict) -> None:
        """The run row learns that this page repairs before its first repair is sent: a page
        redone after its repairs finds nothing left, and must not make the run pass."""
        announce_repair(self.store, self.migration_id, self.run, counts)

    def _repair(self, ctx: PageContext, j: Judgement, c: Check, counts: dict) -> bool:
        """Fix one difference with a version-fenced write; never overwrite a newer version,
        never delete anything a shim wrote.

        Fenced twice, like the backfill's copy: at the server by version (a shim write that
        landed since our consistent re-read is newer, so the condition fails and it stays),
        and in time by ``ctx.write_guard`` before every attempt (a worker stalled past its
        lease sends nothing: after a lease expiry the gates -- cutover, retire -- may already
        have relied on "no job writes", and a version condition cannot see that).
        """
        kind, old, new = j.kind, j.reference, j.new
        try:
            if kind in ("missing", "stale", "diverged", "resurrected") and old is not None:
                if new is not None and version_of(new) > version_of(old):
                    # The new copy is newer: a write (or a delete's tombstone) whose mirror to
                    # the old layout never landed -- a cutover write before a rollback. The
                    # newer copy goes over the older one, as catch-up needs in both directions.
                    self._announce_repair(counts)
                    return self._mirror_to_old(ctx, new, c, old)
                same = new is not None and version_of(new) == version_of(old)
                if same and self.authoritative != "old":
                    return False  # same version, other content: only the authoritative copy may win
                target, _ = self.mapper.remap(old)  # a tombstone re-keys to a tombstone copy
                target = reindexed(target, self.indexes, INDEX_NEW) if self.indexes else target
                self._announce_repair(counts)
                # Same version but other content: only this exact stale copy may be replaced.
                fence = unchanged(version_of(old), self.key_attrs[0]) if same else \
                    over_leftovers(fence_for(version_of(old)))
                return conditional_put(self.dynamo, self.budget, self.table, target, fence, guard=ctx.write_guard)
            if kind == "extra" and new is not None and self.mapper.is_new_copy(new) and not version_of(new):
                # An unversioned copy with no old item behind it (its source was deleted
                # behind the shim's back). A versioned one is a shim write: ``new_only``.
                self._announce_repair(counts)
                return self._delete_copy(ctx, new, c.new_key)
            if kind == "new_only" and new is not None:
                self._announce_repair(counts)
                return self._mirror_to_old(ctx, new, c, old)
            # collision, too_large: which copy the application meant, or how to shrink an
            # item, is not ours to guess; they are reported with guidance.
        except errors.UnmappableItem:
            return False
        return False

    def _mirror_to_old(self, ctx: PageContext, new: dict, c: Check, old: dict | None) -> bool:
        """Give a shim write found only in the new layout its old copy back (the mirror
        write that never landed), fenced so it only replaces an older version or nothing."""
        version = version_of(new)
        if _kid(c.new_key) in {_kid(k) for k in c.candidates}:
            # Its key is also an old candidate (a random layout whose derived shard is the
            # new key): one physical item can serve both layouts, unmarked, as an unmoved
            # item does. Only if it still is exactly this write.
            item = {k: v for k, v in new.items() if k != NEW_COPY_ATTR}
            return conditional_put(self.dynamo, self.budget, self.table, item,
                                   unchanged(version, self.key_attrs[0]), guard=ctx.write_guard)
        fields = self.mapper.fields(new, self.mapper.new)
        if not self.mapper.old.random:
            shard = None
        elif old is not None:
            shard = self.mapper.old.parse(old)[SHARD]  # where the shim finds the item: its newest copy
        else:
            shard = hash_shard(_identity_text(self.mapper.identity(fields)), self.mapper.old.shards)
        logical = self.mapper.to_logical(new, self.mapper.new)
        item = self.mapper.to_physical(logical, self.mapper.old, shard)
        item[VERSION_ATTR] = new[VERSION_ATTR]
        if is_tombstone(new):
            item[TOMBSTONE_ATTR] = new[TOMBSTONE_ATTR]  # a delete's marker goes back as a delete marker
        return conditional_put(self.dynamo, self.budget, self.table, item, over_leftovers(fence_for(version)),
                               guard=ctx.write_guard)

    def _delete_copy(self, ctx: PageContext, item: dict, key: dict) -> bool:
        """Delete a new-layout copy if it is still the one we saw (same version), and only
        while our lease holds (``ctx.write_guard`` before every attempt)."""
        return conditional_delete(self.dynamo, self.budget, self.table, key,
                                  unchanged(version_of(item), self.key_attrs[0]), guard=ctx.write_guard)


def _identity_text(identity: tuple) -> str:
    """The text a brand-new item's random-layout shard is hashed from (the same rule as
    ``ShardedTable._identity_text``, so a repair puts the item where the shim looks first)."""
    return "#".join(p.hex() if isinstance(p, bytes) else p for p in identity)


def table_ttl_attribute(dynamo: Dynamo, table: str) -> str | None:
    """The attribute DynamoDB's TTL deletes by, when TTL is on for ``table``; else None.

    An endpoint that cannot tell (no DescribeTimeToLive) gets None: expired items are then
    compared like any other, which can show a false difference but never a false pass.
    """
    try:
        status, attribute = ttl_status(dynamo, table)
    except errors.AccessDenied:
        raise
    except errors.AWSError:
        return None
    return attribute if status in ("ENABLED", "ENABLING") else None


def _after_backfill(store: ControlStore, state, options: JobOptions) -> float:
    """The backfill run finished (else uncopied items would show as missing); a verify run
    counts only if it started after that."""
    info = read_run(store, state.id, BACKFILL_JOB, backfill_run(store, state.id))
    if info is None or info.finished_at is None:
        raise errors.RefusedTransition(
            f"verify refused for {state.id!r}: the backfill has not finished, so uncopied items would show as "
            f"missing; run `reshard backfill {state.id}` to completion first")
    return info.finished_at


def settle_horizon(state) -> float | None:
    """The request horizon the settle window is timed by (None: no server deadline)."""
    return state.request_horizon if state.server_deadline else None


def _make_page(ctx: JobContext):
    return Verifier(ctx.dynamo, ctx.store, ctx.state.id, ctx.run, ctx.mapper, ctx.migration.table, ctx.budget,
                    ctx.options, ctx.sleep, ttl_attribute=table_ttl_attribute(ctx.dynamo, ctx.migration.table),
                    clock=ctx.clock, horizon=settle_horizon(ctx.state),
                    authoritative=ROUTING[ctx.state.phase].authoritative).page


#: ``reshard verify``: a fresh run each time (a finished run is a verdict), joined by
#: other hosts while it is unfinished. Its last segment is the join (``join=True``).
VERIFY = JobSpec(VERIFY_JOB, _make_page, check=_after_backfill, fresh=True, join=True)


# --------------------------------------------------------------------------- read-only verify

class _NoLease(NamedTuple):
    renew_due: float = math.inf
    deadline: float = math.inf


class _Segment:
    """What a page of a read-only verify needs of a :class:`PageContext`: its segment and a
    monotonic clock (the settle window). No lease: nothing is written, nothing to fence.
    ``stop``: set on Ctrl-C; a settle wait then gives up (:meth:`pause`)."""

    lease = _NoLease()

    def __init__(self, segment: int, total: int, monotonic: Callable[[], float],
                 stop: threading.Event | None = None):
        self.segment, self.total_segments, self.now = segment, total, monotonic
        self._stop = stop or threading.Event()

    def pause(self, seconds: float) -> None:
        self._stop.wait(seconds)
        if self._stop.is_set():
            raise errors.JobStopped("the verify is stopping")

    def ensure_lease(self) -> None:  # no lease to renew
        pass

    check_deadline = ensure_lease  # no deadline either

    def write_guard(self) -> None:  # only repair writes, and repair is refused before a page runs
        raise errors.ReshardError("a read-only verify writes nothing")


@dataclass
class ReadOnlyVerify:
    """A ``verify --no-record``: the same verdict as a recorded run, kept in memory only.
    ``run`` is None: no run exists, so neither ``status`` nor the cutover gate sees it."""

    job: str
    migration_id: str
    totals: dict
    finished: bool
    allowed_unmappable: int
    examples: list = field(default_factory=list)
    elapsed: float = 0.0
    stop_reason: str = ""
    run: None = None
    repaired: int = 0

    @property
    def differences(self) -> dict:
        return differences(self.totals)

    @property
    def passed(self) -> bool:
        return passes(self.totals, self.finished, self.allowed_unmappable)

    @property
    def checked(self) -> int:
        return int(self.totals.get("checked", 0))

    def as_dict(self) -> dict:
        counts = {k: int(v) if float(v).is_integer() else v for k, v in self.totals.items()}
        return {"job": self.job, "migration": self.migration_id, "run": None, "recorded": False,
                "done": self.finished, "finished": self.finished, "passed": self.passed, "counts": counts,
                "differences": self.differences, "checked": self.checked, "repaired": 0,
                "examples": self.examples, "stop_reason": self.stop_reason or None,
                "elapsed_seconds": round(self.elapsed, 2)}


def verify_read_only(dynamo: Dynamo, store: ControlStore, migration_id: str, opts: JobOptions, *,
                     clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                     monotonic: Callable[[], float] = time.monotonic,
                     combined: Callable | None = None) -> ReadOnlyVerify:
    """``reshard verify --no-record``: every segment scanned in this process, no lease,
    checkpoint, run record or example written (the observer role may send no write).

    The same preconditions and the same page function as a recorded run, so the verdict
    is the same; but it cannot be resumed or shared, and it does not count for the cutover
    gate, which needs a recorded run (a run an observer could write could be forged).
    ``combined``: what builds a combined migration's verifier
    (:func:`reshard.jobs.combined.combined_verifier`, which builds on this module).
    """
    if opts.repair:
        raise errors.BadInput("verify --repair writes (repairs, and the run it records): it cannot be combined "
                              "with --no-record")
    started = monotonic()
    state = require_phase_and_ack(store, migration_id, VERIFY_JOB, False, wait=opts.lease_wait, sleep=sleep)
    _after_backfill(store, state, opts)
    migration = state.migration()
    dynamo.describe_table(migration.table)  # a clear error if the table is missing
    budget = CapacityBudget(None, opts.max_rcu).attach(dynamo, migration.table)
    if migration.changes_table and migration.indexes:
        if combined is None:
            raise errors.BadInput("a read-only verify of a combined migration needs its verifier "
                                  "(operations passes it)")
        verifier = combined(dynamo, store, migration_id, 0, migration, KeyMapper(migration), budget, opts, sleep,
                            clock, horizon=settle_horizon(state))
    elif migration.changes_table:
        verifier = Verifier(dynamo, store, migration_id, 0, KeyMapper(migration), migration.table, budget, opts, sleep,
                            ttl_attribute=table_ttl_attribute(dynamo, migration.table), clock=clock,
                            horizon=settle_horizon(state))
    else:
        verifier = IndexVerifier(dynamo, store, migration_id, 0, mappers(migration.indexes), migration.keys,
                                 migration.table, budget, opts, sleep, horizon=settle_horizon(state))
    verifier.collected = []
    # Stop at the next page once the migration left verify's phases, as a recorded run does.
    guard = phase_guard(store, migration_id, VERIFY_JOB, job_rule(VERIFY_JOB).phases)
    stop = threading.Event()  # Ctrl-C: settle waits and budget sleeps give up, the pool ends

    def pages(index: int, total: int) -> tuple[dict, str]:
        counts: dict = {}
        key = None
        while True:
            why = guard()
            if why:
                return counts, why
            if stop.is_set():
                return counts, "stopped"
            page, key = verifier.page(_Segment(index, total, monotonic, stop), key)
            for k, v in page.items():
                counts[k] = counts.get(k, 0) + v
            if not key:
                return counts, ""

    totals: dict = {}
    reasons = []

    def add(counts: dict, why: str) -> None:
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
        reasons.extend([why] if why else [])

    join = True  # both verifiers' last segment joins (an index-only one: the scan with the index side)
    with tempfile.TemporaryDirectory(prefix="reshard-verify-") as tmp:
        verifier.records_dir = pathlib.Path(tmp)
        verifier.remove_records = False
        with ThreadPoolExecutor(min(opts.worker_count, opts.segments), thread_name_prefix="verify-ro") as pool:
            try:
                for counts, why in pool.map(lambda i: pages(i, opts.segments + join), range(opts.segments)):
                    add(counts, why)
            except KeyboardInterrupt:
                stop.set()  # the pool's threads give up at their next wait or page; then exit 130
                budget.stop()
                raise
        if join and not reasons:  # every segment's records are here: the join
            add(*pages(opts.segments, opts.segments + 1))
    shown = verifier.collected[:opts.examples] if opts.examples else []
    return ReadOnlyVerify(VERIFY_JOB, migration_id, totals, not reasons, allowed_unmappable(store, migration_id),
                          shown, monotonic() - started, reasons[0] if reasons else "")
