"""Plumbing shared by the data jobs (backfill, verify, cleanup).

Each job is a page function run by :class:`reshard.jobs.engine.SegmentEngine`; what they
share is here: the phase-and-fleet precondition, choosing the run to join or start,
and wiring the capacity budget and subscribers into an engine.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from reshard import errors
from reshard.jobs.budget import CapacityBudget, scan_units
from reshard.control.store import ControlStore, MigrationState, _n, _s
from reshard.aws.dynamo import Dynamo
from reshard.core.phases import Phase
from reshard.jobs.engine import DEFAULT_LEASE_SECONDS, PageContext, PageFn, RunInfo, SegmentEngine, Subscriber, read_run
from reshard.core.versions import Fence


def require_phase_and_ack(store: ControlStore, migration_id: str, job: str, phases: Iterable[Phase],
                          why: str) -> MigrationState:
    """The migration is in one of ``phases`` and every live shim acknowledged it.

    A job that runs while some shim still acts on an earlier phase could race writes that
    shim does not fence or mirror; so the job waits for the fleet like a transition does.
    """
    phases = tuple(phases)
    state = store.load_state(migration_id)
    if state.phase not in phases:
        allowed = " or ".join(p.value for p in phases)
        raise errors.RefusedTransition(f"{job} refused for {migration_id!r}: the migration is in {state.phase}; "
                                       f"{job} runs only in {allowed} ({why})")
    census = store.census(migration_id, state.phase_version)
    if not census.acknowledged:
        shown = ", ".join(h.describe() for h in census.lagging[:5])
        raise errors.RefusedTransition(
            f"{job} refused for {migration_id!r}: {len(census.lagging)} live shim(s) have not acknowledged "
            f"{state.phase} yet ({shown}); wait and retry (see `reshard status`)")
    return state


def runs(store: ControlStore, migration_id: str, job: str) -> list[RunInfo]:
    """Every run of ``job`` for this migration, oldest first."""
    out = []
    for item in store.query(store.mpk(migration_id), f"R#{job}#"):
        fin = _n(item, "finished_at")
        out.append(RunInfo(migration_id, job, int(_s(item, "sk").rsplit("#", 1)[1]),
                           int(_n(item, "total_segments", 0)), float(_n(item, "started_at", 0)),
                           float(fin) if fin is not None else None))
    return sorted(out, key=lambda r: r.run)


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


def phase_guard(store: ControlStore, migration_id: str, job: str, phases: Iterable[Phase],
                min_interval: float = 1.0) -> Callable[[], str | None]:
    """A segment-engine guard: a reason to stop once the migration left ``phases``.

    The precondition is checked once at the start; this keeps checking (a consistent read
    of META at most every ``min_interval`` seconds, shared by the workers), so a job started
    before an abort or a rollback stops writing at its next page instead of racing the
    cleanup that follows.
    """
    phases = frozenset(phases)
    last = {"at": -1e18, "why": None}

    def guard() -> str | None:
        now = time.monotonic()
        if now - last["at"] >= min_interval:
            state = store.load_state(migration_id)
            last["at"] = now
            last["why"] = None if state.phase in phases else (
                f"{job} stopped: the migration moved to {state.phase} (phase version {state.phase_version})")
        return last["why"]

    return guard


def live_leases(store: ControlStore, migration_id: str, jobs: Iterable[str], now: float) -> list[str]:
    """Segments of ``jobs`` whose lease is still held by someone (their workers may still write)."""
    out = []
    for job in jobs:
        for item in store.query(store.mpk(migration_id), f"J#{job}#"):
            if _s(item, "owner", "-") != "-" and float(_n(item, "lease_expires", 0)) > now:
                out.append(f"{job} segment {int(_n(item, 'segment', -1))} ({_s(item, 'owner')})")
    return out


def make_engine(dynamo: Dynamo, store: ControlStore, migration_id: str, job: str, run: int, segments: int,
                page: PageFn, budget: CapacityBudget, *, phases: Iterable[Phase], workers: int | None = None,
                lease_seconds: float = DEFAULT_LEASE_SECONDS, max_attempts: int = 3,
                subscribers: Iterable[Subscriber] = (), clock: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep) -> SegmentEngine:
    """A segment engine for one job run, reporting budget decisions to the subscribers."""
    subscribers = list(subscribers)
    budget.listeners.append(lambda d: [s.on_throttle(d.reason) for s in subscribers])
    return SegmentEngine(store, migration_id, job, run, segments, page, workers=workers,
                         lease_seconds=lease_seconds, max_attempts=max_attempts, clock=clock, sleep=sleep,
                         subscribers=subscribers, throttle_reason=budget.latest_reason,
                         guard=phase_guard(store, migration_id, job, phases))


def finished_run(store: ControlStore, migration_id: str, job: str, run: int) -> RunInfo | None:
    info = read_run(store, migration_id, job, run)
    return info if info and info.finished_at is not None else None


def conditional_put(dynamo: Dynamo, budget: CapacityBudget, table: str, item: dict, fence: Fence,
                    units: float = 1.0) -> bool:
    """PutItem under a version condition, within the budget; False when the condition failed
    (a newer write is there, and it stays)."""
    try:
        with budget.spend("write", units):
            dynamo.call("put_item", TableName=table, Item=item, ReturnConsumedCapacity="TOTAL", **fence.kwargs())
        return True
    except errors.ConditionalCheckFailed:
        return False


def conditional_delete(dynamo: Dynamo, budget: CapacityBudget, table: str, key: dict, fence: Fence) -> bool:
    """DeleteItem under a version condition, within the budget; False when the condition failed."""
    try:
        with budget.spend("write", 1.0):
            dynamo.call("delete_item", TableName=table, Key=key, ReturnConsumedCapacity="TOTAL", **fence.kwargs())
        return True
    except errors.ConditionalCheckFailed:
        return False


def scan_page(dynamo: Dynamo, budget: CapacityBudget, table: str, ctx: PageContext, start_key: dict | None,
              page_size: int, avg_item_bytes: float = 1024.0) -> dict:
    """One page of this segment's parallel Scan, paced by the read budget."""
    kwargs: dict = {"TableName": table, "Segment": ctx.segment, "TotalSegments": ctx.total_segments,
                    "Limit": page_size, "ReturnConsumedCapacity": "TOTAL"}
    if start_key:
        kwargs["ExclusiveStartKey"] = start_key
    with budget.spend("read", scan_units(page_size, avg_item_bytes)):
        return dynamo.call("scan", **kwargs)
