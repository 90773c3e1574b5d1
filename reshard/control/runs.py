"""Job runs as the control table records them: which run counts, how far it got, what it found.

A run (``R#<job>#<run>``) is shared by every process and host working on it; its
segments (``J#...``) carry leases and checkpoints (:mod:`reshard.jobs.engine` writes
them). Everything here only reads, so ``status``, the gates and the job runner agree on
one reading of the same rows.
"""

from __future__ import annotations

import json
import time
from typing import Callable, Iterable

from reshard.control.budget import read_members, read_shares
from reshard.control.live import read_control
from reshard.control.records import (META, RunInfo, check_row, example_prefix, run_sk, segment_prefix, segment_sk,
                                     unmappable_sk)
from reshard.control.store import ControlStore
from reshard.core.compare import differences, failing, passes
from reshard.core.leases import FREE, LeaseWatch, SegmentRecord, quiet_remaining
from reshard.core.phases import BACKFILL_JOB, VERIFY_JOB, Phase
from reshard.core.wire import get_n, get_s, load_key


def read_run(store: ControlStore, migration_id: str, job: str, run: int) -> RunInfo | None:
    item = store.get(store.jpk(migration_id, job), run_sk(job, run))
    return RunInfo.from_item(migration_id, item) if item else None


def runs(store: ControlStore, migration_id: str, job: str) -> list[RunInfo]:
    """Every run of ``job`` for this migration, oldest first."""
    return sorted((RunInfo.from_item(migration_id, i) for i in store.query(store.jpk(migration_id, job), f"R#{job}#")),
                  key=lambda r: r.run)


def latest_run(store: ControlStore, migration_id: str, job: str) -> RunInfo | None:
    all_runs = runs(store, migration_id, job)
    return all_runs[-1] if all_runs else None


def run_to_join(store: ControlStore, migration_id: str, job: str, *, not_before: float = 0.0,
                fresh: bool = False) -> int:
    """The run number this invocation works on.

    An unfinished run that started at or after ``not_before`` is joined (resumed, or
    shared with other hosts); otherwise a new run starts. ``fresh`` forces a new run
    unless the latest one is unfinished (two operators starting a verify at once then
    share one run instead of racing two).
    """
    latest = latest_run(store, migration_id, job)
    if latest is None:
        return 1
    if latest.finished_at is None and latest.started_at >= not_before:
        return latest.run
    if not fresh and latest.started_at >= not_before:
        return latest.run
    return latest.run + 1


def entered_at(store: ControlStore, migration_id: str, frm: str, to: str) -> float:
    """When the migration last moved ``frm`` → ``to`` (0 if never)."""
    times = [t.at for t in store.history(migration_id) if t.from_phase == frm and t.to_phase == to]
    return max(times) if times else 0.0


def backfill_run(store: ControlStore, migration_id: str) -> int:
    """The backfill run that counts: the latest one started since dual writes last began.

    Re-running resumes it (finished segments stay done); a rollback to ``planned`` (the
    shims stopped dual-writing, so the copy went stale) makes the next backfill a new run.
    """
    return run_to_join(store, migration_id, BACKFILL_JOB,
                       not_before=entered_at(store, migration_id, Phase.PLANNED.value, Phase.DUAL_WRITE.value))


def segment_records(store: ControlStore, migration_id: str, job: str, run: int, total: int) -> list[SegmentRecord]:
    """Every segment of a run (one Query), a blank record for segments nobody touched yet."""
    items = {get_s(i, "sk"): i for i in store.query(store.jpk(migration_id, job), segment_prefix(job, run))}
    return [SegmentRecord.from_item(s, items.get(segment_sk(job, run, s))) for s in range(total)]


def sum_counters(records: Iterable[SegmentRecord]) -> dict:
    """The counters of several segments added up."""
    out: dict = {}
    for r in records:
        for k, v in r.counters.items():
            out[k] = out.get(k, 0) + v
    return out


def describe(store: ControlStore, migration_id: str, job: str, run: int,
             clock: Callable[[], float] = time.time) -> dict | None:
    """Per-segment progress, owners and totals of a run (for ``reshard status``)."""
    info = read_run(store, migration_id, job, run)
    if info is None:
        return None
    recs = segment_records(store, migration_id, job, run, info.total_segments)
    now = clock()
    throttles = [r.last_throttle for r in recs if r.last_throttle]
    shared = read_shares(store, migration_id, job, run)
    budget = None if shared is None else {
        **{f"max_{u}": shared.total.get(lane) for lane, u in (("write", "wcu"), ("read", "rcu"))},
        "shares": {m: dict(v) for m, v in sorted(shared.shares.items())}}
    control = read_control(store, migration_id, job, run)
    hold = control.hold if control else None
    return {"job": job, "run": run, "total_segments": info.total_segments, "started_at": info.started_at,
            "finished_at": info.finished_at, "done": sum(r.done for r in recs),
            "failed": [r.segment for r in recs if r.failed and not r.done],
            "totals": sum_counters(recs), "last_throttle": throttles[-1] if throttles else None,
            "budget": budget,
            # The operator's live control (reshard throttle/pause/resume): None until first used.
            "control": None if control is None else {
                **control.as_dict(), "set_by": {f: control.set_by(f) or None for f in ("max_wcu", "max_rcu")},
                "paused_by": hold.by if hold else None, "paused_since": hold.since if hold else None},
            # The processes beating in the run's budget row (runs with a budget only).
            "members": [] if shared is None or info.finished_at else
            [{"member": mm.member, "host": mm.host, "pid": mm.pid, "idle": sorted(mm.idle)}
             for mm in read_members(store, migration_id, job, run)],
            "segments": [r.as_dict(now) for r in recs]}


def live_leases(store: ControlStore, migration_id: str, jobs: Iterable[str], now: float) -> list[str]:
    """Segments of ``jobs`` whose lease is still held by someone (their workers may still write)."""
    out = []
    for job in jobs:
        for item in store.query(store.jpk(migration_id, job), f"J#{job}#"):
            check_row(item)
            if get_s(item, "owner", FREE) != FREE and float(get_n(item, "lease_expires", 0)) > now:
                out.append(f"{job} segment {int(get_n(item, 'segment', -1))} ({get_s(item, 'owner')})")
    return out


def held_leases(store: ControlStore, migration_id: str,
                jobs: Iterable[str]) -> list[tuple[str, int, SegmentRecord]]:
    """Every segment lease of ``jobs`` (any run) that is not released: ``(job, run, record)``."""
    out = []
    for job in jobs:
        for item in store.query(store.jpk(migration_id, job), f"J#{job}#"):
            check_row(item)  # types first: a segment number stored as a string is refused in one line
            rec = SegmentRecord.from_item(int(get_n(item, "segment", -1)), item)
            if rec.held:
                out.append((job, int(get_n(item, "run", 0)), rec))
    return out


def held_lease_waits(store: ControlStore, migration_id: str, jobs: Iterable[str], watch: LeaseWatch,
                     now: float) -> list[tuple[str, SegmentRecord, float, float]]:
    """The held leases of ``jobs`` whose worker may still write: (job, record, unchanged for, seconds
    left until it cannot), each timed by ``watch`` on this host's clock."""
    out = []
    for job, run, rec in held_leases(store, migration_id, tuple(jobs)):
        unchanged = watch.observe((job, run, rec.segment), rec.token, now)
        remaining = quiet_remaining(rec, unchanged)
        if remaining > 0:
            out.append((job, rec, unchanged, remaining))
    return out


def describe_lease_wait(job: str, rec: SegmentRecord, unchanged: float, remaining: float) -> str:
    """``backfill segment 3: lease held by host:pid:inv:0, quiet for 12 s of 95 s``."""
    return (f"{job} segment {rec.segment}: lease held by {rec.owner}, quiet for {unchanged:.0f} s of "
            f"{unchanged + remaining:.0f} s")


def await_no_writers(store: ControlStore, migration_id: str, jobs: Iterable[str], wait: float | None,
                     *, monotonic: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                     poll: float = 0.5, on_wait: Callable[[list[str]], None] | None = None) -> str | None:
    """Wait until no worker of ``jobs`` can still write; None then, else a sentence saying how long to wait.

    A lease counts as gone once released, or once its (owner, counter) token has been
    unchanged, *on this host's monotonic clock*, for the holder's lease + its longest
    request in flight (:func:`reshard.core.leases.quiet_remaining`): the holder stops
    sending at its own local deadline, and what it sent before lands within that. The
    timer of a lease starts at the first look, so a single look never clears a held
    lease: ``wait`` seconds are spent watching (None: as long as the held leases need,
    restarting when a token changes, up to twice that). ``on_wait``: called before each sleep
    with what it waits for (:func:`describe_lease_wait` of each lease).
    """
    jobs = tuple(jobs)
    watch = LeaseWatch()
    start = monotonic()
    limit = wait
    while True:
        now = monotonic()
        waits = held_lease_waits(store, migration_id, jobs, watch, now)
        left = [(job, rec, remaining) for job, rec, _, remaining in waits]
        if not left:
            return None
        longest = max(r for _, _, r in left)
        if limit is None:
            limit = 2 * longest + poll
        if now - start + min(poll, longest) > limit:
            shown = ", ".join(f"{job} segment {rec.segment} ({rec.owner})" for job, rec, _ in left[:3])
            return (f"{len(left)} {'/'.join(jobs)} segment lease(s) are still held ({shown}); a worker stalled past "
                    f"its lease could still write until each lease has been unchanged for its lease + the longest "
                    f"request in flight, watched on this host's clock: wait {longest:.0f}s more "
                    f"(retry with --wait {int(longest) + 5}, or see `reshard status`)")
        if on_wait is not None:
            on_wait([describe_lease_wait(*w) for w in waits])
        sleep(min(poll, longest))


def unmappable_items(store: ControlStore, migration_id: str, job: str = BACKFILL_JOB) -> list[dict]:
    """The unmappable-items report of a job (old key, reason, detail); a ``collision`` (two
    unversioned old copies of one logical item that differ) also names the other old key."""
    out = []
    for i in store.query(store.jpk(migration_id, job), unmappable_sk(job, "")):
        check_row(i)
        row = {"old_key": _key_or_text(get_s(i, "old_key", "")), "reason": get_s(i, "reason", "?"),
               "detail": get_s(i, "detail", "")}
        if "other_key" in i:
            row["other_key"] = _key_or_text(get_s(i, "other_key"))
        out.append(row)
    return out


def _key_or_text(text: str):
    """A key a worker recorded (JSON), or its text as it is when it is none (shown, never used)."""
    try:
        key = load_key(text)
        return key if isinstance(key, dict) else text
    except (ValueError, TypeError, AttributeError):
        return text


def examples(store: ControlStore, migration_id: str, job: str, run: int) -> list[dict]:
    """The example differences a run recorded (``D#<job>#<run>#...``; a body that is no JSON
    object is shown as its text)."""
    out = []
    for i in store.query(store.jpk(migration_id, job), example_prefix(job, run)):
        check_row(i)
        body = get_s(i, "body", "")
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        out.append(parsed if isinstance(parsed, dict) else {"kind": "?", "detail": body})
    return out


def backfill_progress(store: ControlStore, migration_id: str) -> dict | None:
    """The counting backfill run's segments, owners, totals, throttle reason and unmappable count."""
    d = describe(store, migration_id, BACKFILL_JOB, backfill_run(store, migration_id))
    if d is not None:
        d["unmappable_items"] = len(store.query(store.jpk(migration_id, BACKFILL_JOB), unmappable_sk(BACKFILL_JOB, "")))
    return d


def allowed_unmappable(store: ControlStore, migration_id: str) -> int:
    """How many unmappable items the operator allowed (``reshard start --allow-unmappable N``).

    The number lives in the migration's META row (``allow_unmappable``), 0 when never
    given: a verify or a backfill with an item it could not map then fails, and the
    cutover gate stays closed.
    """
    item = store.get(store.mpk(migration_id), META)
    if item:
        check_row(item)
    return int(get_n(item, "allow_unmappable", 0)) if item else 0


def item_total(store: ControlStore, migration_id: str) -> dict | None:
    """The data table's item count stored on META by ``start --count`` (or a full-scan start).

    ``{"items": n, "source": "count" | "full scan", "at": epoch}``, or None when nothing
    was counted (then DescribeTable's ItemCount, refreshed about every 6 hours, is all
    there is). Progress totals and ETAs read this.
    """
    item = store.get(store.mpk(migration_id), META)
    if not item or "item_count" not in item:
        return None
    check_row(item)
    return {"items": int(get_n(item, "item_count")), "source": get_s(item, "item_count_source"),
            "at": float(get_n(item, "item_count_at", 0))}


def verify_verdict(store: ControlStore, migration_id: str, run: int, shown: int = 20,
                   allow_unmappable: int | None = None) -> dict:
    """A verify run's verdict as recorded: finished, passed, differences per kind, examples.

    Passing is :func:`reshard.core.compare.passes` (finished, no difference, no unmappable
    item beyond the allowance); a run that repaired anything also says so (the gate then
    wants another run, since the repairs changed what it read).
    """
    info = read_run(store, migration_id, VERIFY_JOB, run)
    totals = info.totals if info else {}
    counts = differences(totals)
    finished = bool(info and info.finished)
    allowed = allowed_unmappable(store, migration_id) if allow_unmappable is None else allow_unmappable
    return {"run": run, "finished": finished, "passed": passes(totals, finished, allowed), "counts": counts,
            "failing": failing(totals, allowed), "allowed_unmappable": allowed,
            "old_copies": int(totals.get("old_copies", 0)),
            "checked": int(totals.get("checked", 0)), "repaired": int(totals.get("repaired", 0)),
            "repair_pages": int(totals.get("repair_pages", 0)),
            "examples": examples(store, migration_id, VERIFY_JOB, run)[:shown] if shown else [],
            "started_at": info.started_at if info else 0.0, "finished_at": info.finished_at if info else None}
