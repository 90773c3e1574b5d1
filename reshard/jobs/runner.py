"""One job runner for backfill, verify and cleanup (s3transfer's one task machinery).

A job is a :class:`JobSpec`: its name, a factory for its page function, its own extra
precondition and how it picks its run. :func:`run_job` does everything else, the same
way for all three:

1. preconditions: the phase allows the job (:data:`reshard.core.phases.JOB_RULES`) and
   every live shim acknowledged it (a shim one phase behind may not write what the job
   races), then the job's own check, all *before* anything is written;
2. the run to join or start (several hosts share one run);
3. the capacity budget and the subscribers;
4. a phase guard the engine checks before every page, so a job started before an
   abort or a rollback stops at its next page instead of racing what follows;
5. SIGTERM handled like Ctrl-C (finish the page, release the leases);
6. one :class:`JobResult`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control import fleet
from reshard.control import marker as markers
from reshard.control.records import MigrationState, RunInfo, run_sk
from reshard.control.runs import examples as recorded_examples
from reshard.control.runs import allowed_unmappable, run_to_join
from reshard.control.store import ControlStore
from reshard.core.capacity import page_scan_units
from reshard.core.compare import KINDS, differences, passes
from reshard.core.deadlines import DATE_MARGIN_SECONDS
from reshard.core.layout import GONE_ATTR, KeyMapper
from reshard.core.migration import Migration
from reshard.core.phases import VERIFY_JOB, Phase, job_rule
from reshard.core.versions import Fence
from reshard.core.wire import N
from reshard.control.budget import BudgetMembership
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.facts import DatedWrites, JobFacts
from reshard.jobs.engine import (DEFAULT_LEASE_SECONDS, DEFAULT_MAX_ATTEMPTS, LeaseLost, PageContext, PageFn, RunResult,
                                 SegmentEngine, same_host_dead)
from reshard.jobs.pacing import DEFAULT_KEY_WCU
from reshard.jobs.subscribers import Subscriber

DEFAULT_PAGE_SIZE = 500
#: Per-item writes of one page in flight at once, per worker (``--concurrency``): each is one
#: conditional request, so a worker is otherwise idle for a round trip per item.
DEFAULT_CONCURRENCY = 8


@dataclass
class JobOptions:
    """The knobs of every data job (one config object, like s3transfer's ``TransferConfig``).

    The last fields belong to one job each and are ignored by the others.
    """

    segments: int = 16
    workers: int | None = None
    #: Worker processes of this host (``--processes``; :mod:`reshard.jobs.processes`); 1 runs
    #: the job in the calling process. Each has its own client, ``workers`` and ``concurrency``.
    processes: int = 1
    #: How often a worker with nothing to claim looks again (None: the engine's default,
    #: min(2 s, lease / 4)). ``--processes`` children look every 0.5 s: at the end of a run
    #: they wait for their siblings' last segments, and the command ends when the last does.
    poll_seconds: float | None = None
    page_size: int = DEFAULT_PAGE_SIZE
    max_wcu: float | None = None
    max_rcu: float | None = None
    #: The copy's write rate per new partition key, WCU/s, for this host (divided among its
    #: processes; reshard.jobs.pacing); None or 0: not paced per key.
    max_wcu_per_key: float | None = DEFAULT_KEY_WCU
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: How long a job watches what it must wait for: held backfill/verify leases going
    #: quiet (cleanup of an aborted migration), a lagging shim acknowledging the phase or
    #: being watched silent long enough to be gone. None: as long as they need.
    lease_wait: float | None = None
    #: Per-item writes of a page in flight at once, per worker (:func:`item_writes`).
    concurrency: int = DEFAULT_CONCURRENCY
    #: This process's name in the run's budget row (``--host-id``; default the host name).
    host_id: str | None = None
    #: The shared budget's refresh and liveness windows (None: reshard.core.shares' defaults).
    budget_refresh_seconds: float | None = None
    budget_liveness_seconds: float | None = None
    # verify
    repair: bool = False
    examples: int = 20
    rechecks: int = 4
    recheck_pause: float = 0.05
    #: How long verify must see a difference unchanged before it reports it (None: the
    #: largest write bound the migration's shims publish; see ``reshard.core.settle``).
    settle_seconds: float | None = None
    #: Where verify keeps its records between the scan and the join on this host (None:
    #: ``$RESHARD_VERIFY_DIR`` or ``~/.cache/reshard/verify``; see ``reshard.jobs.records``).
    records_dir: str | None = None
    # cleanup
    delete: bool = False
    enable_ttl: bool = False

    @property
    def worker_count(self) -> int:
        return max(1, self.workers or min(self.segments, 4))


@dataclass
class JobContext:
    """What a job's page factory and hooks get: the migration, its run, the budget."""

    dynamo: Dynamo
    store: ControlStore
    state: MigrationState
    migration: Migration
    mapper: KeyMapper | None  # None for an index-only migration (reshard.jobs.index_jobs)
    run: int
    budget: CapacityBudget
    options: JobOptions
    clock: Callable[[], float]
    sleep: Callable[[float], None]


@dataclass(frozen=True)
class JobSpec:
    """One data job: everything :func:`run_job` cannot know by itself.

    ``check(store, state, options) -> not_before``: the job's own precondition (raise
    ``RefusedTransition``); returns the time a run must have started after to be joined.
    ``fresh``: start a new run unless the latest is unfinished (verify and cleanup: a
    finished run is a verdict; the backfill resumes its run).
    ``prepare(ctx)``: a last check against the data table before the first write.
    ``finish(ctx, result)``: what to do once every segment is done (cleanup retires an
    aborted migration).
    ``join``: the run has one segment more than ``--segments``, its last, which no worker
    claims before every other segment is done (verify joins what the scan recorded there).
    """

    name: str
    make_page: Callable[[JobContext], PageFn]
    check: Callable[[ControlStore, MigrationState, JobOptions], float] = lambda store, state, opts: 0.0
    fresh: bool = False
    prepare: Callable[[JobContext], None] = lambda ctx: None
    finish: Callable[[JobContext, RunResult], None] = lambda ctx, result: None
    join: bool = False


@dataclass
class JobResult:
    """What an invocation of a job ended with (this host's view of a shared run)."""

    job: str
    migration_id: str
    run: int
    outcome: RunResult            # the engine's view of the run after this invocation
    consumed: dict = field(default_factory=dict)
    last_throttle: str = ""
    examples: list = field(default_factory=list)
    #: The run's shared budget as this process last saw it (members, totals, its share); {} without one.
    shared_budget: dict = field(default_factory=dict)

    @property
    def info(self) -> RunInfo:
        return self.outcome.run

    @property
    def segments(self) -> list:
        """Every segment's record (lease, checkpoint, counters) as the run ended here."""
        return self.outcome.segments

    @property
    def done(self) -> bool:
        """Every segment of the run is done."""
        return self.outcome.done

    @property
    def finished(self) -> bool:
        """The run record is stamped finished (by whichever host finished the last segment)."""
        return self.info.finished_at is not None

    @property
    def failed(self):
        return self.outcome.failed

    @property
    def stopped(self) -> bool:
        return self.outcome.stopped

    @property
    def stop_reason(self) -> str:
        return self.outcome.stop_reason

    @property
    def worked(self) -> list[int]:
        return self.outcome.worked

    @property
    def totals(self) -> dict:
        """Every counter of the run, summed over its segments."""
        recorded = self.info.totals
        return dict(recorded) if recorded and self.finished else self.outcome.totals

    @property
    def counts(self) -> dict:
        """:attr:`totals` as whole numbers where they are whole."""
        return {k: int(v) if float(v).is_integer() else v for k, v in self.totals.items()}

    #: The unmappable items the operator allowed (the hook of ``runs.allowed_unmappable``).
    allowed_unmappable: int = 0
    #: An aborted migration's cleanup: the pass after the fleet acknowledged the retire.
    sweep: "JobResult | None" = None
    #: With ``--processes`` > 1, one entry per child: pid, segments completed, capacity used,
    #: CPU seconds and peak RSS (KiB).
    processes: list = field(default_factory=list)

    @property
    def differences(self) -> dict:
        """Verify's difference kinds and how many of each were found (all zero for other jobs,
        whose ``unmappable`` counter is information, not a verdict)."""
        return differences(self.totals) if self.job == VERIFY_JOB else dict.fromkeys(KINDS, 0)

    @property
    def passed(self) -> bool:
        """A verify's verdict (``compare.passes``, as the gate reads it); for other jobs: finished."""
        if self.job != VERIFY_JOB:
            return self.finished
        return passes(self.totals, self.finished, self.allowed_unmappable)

    @property
    def checked(self) -> int:
        return int(self.totals.get("checked", 0))

    @property
    def repaired(self) -> int:
        return int(self.totals.get("repaired", 0))

    def as_dict(self) -> dict:
        info = self.info
        return {"job": self.job, "migration": self.migration_id, "run": self.run, "done": self.done,
                "finished": self.finished, "passed": self.passed, "counts": self.counts,
                "differences": self.differences, "checked": self.checked, "repaired": self.repaired,
                "examples": self.examples, "worked_here": self.worked,
                "failed": [{"segment": r.segment, "attempts": r.attempts, "error": r.last_error}
                           for r in self.failed],
                "pages_redone": sum(r.takeovers for r in self.segments),
                "consumed_here": self.consumed, "last_throttle": self.last_throttle or None,
                "budget": self.shared_budget or None,
                "stop_reason": self.stop_reason or None, "processes": max(1, len(self.processes)),
                "started_at": info.started_at, "finished_at": info.finished_at,
                "elapsed_seconds": round(self.outcome.elapsed, 2)}


def announce_repair(store: ControlStore, migration_id: str, run: int, counts: dict) -> None:
    """Before a verify page's first repair write: ``ADD repair_pages 1`` on the run row,
    conditional on the run not being finished.

    A page's counters reach the control table only with its checkpoint. A page that repaired
    and was then redone (it raised after the repair, its lease was lost, two claimants ran it)
    finds nothing left to repair, and its counters say so: without this row the run would
    pass with a repair in it. Written *before* the repair (so a crash in between errs towards
    failing) and refused once the run's verdict is stamped (no repair lands behind a verdict).
    Once per page (``counts["repair_pages"]``): one control-table write, not one per item.
    """
    if counts.get("repair_pages"):
        return
    try:
        store.update(store.jpk(migration_id, VERIFY_JOB), run_sk(VERIFY_JOB, run), "ADD repair_pages :one",
                     condition="attribute_exists(pk) AND attribute_not_exists(finished_at)",
                     values={":one": N(1)})
    except errors.ConditionalCheckFailed:
        raise LeaseLost(f"verify run {run} of {migration_id!r} already has its verdict: no repair now") from None
    counts["repair_pages"] = 1


# --------------------------------------------------------------------------- preconditions

def require_phase_and_ack(store: ControlStore, migration_id: str, job: str, repair: bool = False,
                          wait: float | None = 0.0, sleep: Callable[[float], None] = time.sleep,
                          on_wait: Callable[[str], None] | None = None) -> MigrationState:
    """The migration is in a phase where ``job`` runs and every live shim acknowledged it.

    ``wait``: how long to watch a lagging fleet catch up (None: until each lagging shim
    either acknowledged or was watched silent long enough to be gone -- its liveness
    window + request bound; one look cannot tell a crashed shim from a slow one).
    ``on_wait``: told, at each look while it waits, which shims it waits for.
    """
    rule = job_rule(job, repair)
    state = store.load_state(migration_id)
    if state.phase not in rule.phases:
        allowed = " or ".join(p.value for p in rule.phases)
        raise errors.RefusedTransition(f"{job} refused for {migration_id!r}: the migration is in {state.phase}; "
                                       f"{job} runs only in {allowed} ({rule.why})")
    if state.switching:
        raise errors.RefusedTransition(
            f"{job} refused for {migration_id!r}: the fleet is switching authority to {state.phase}; run "
            f"`reshard advance {migration_id}` to finish the switch (or `reshard rollback` to undo it) first")
    census = fleet.census(store, migration_id, state.phase_version)
    if not census.acknowledged and wait != 0:
        bound = max(h.silence_seconds for h in census.lagging) + 1.0 if wait is None else wait
        said = (lambda c: on_wait(
            f"{len(c.lagging)} live shim(s) have not acknowledged {state.phase} v{state.phase_version}, and the "
            f"job writes only once they have: {', '.join(c.describe_lagging()[:5])} (a shim that is gone is "
            "dropped once watched silent for its liveness window + longest request)")) if on_wait else None
        census = fleet.wait_for_ack(store, migration_id, state.phase_version, bound, sleep=sleep, on_wait=said)
    if not census.acknowledged:
        shown = ", ".join(census.describe_lagging()[:5])
        raise errors.RefusedTransition(
            f"{job} refused for {migration_id!r}: {len(census.lagging)} live shim(s) have not acknowledged "
            f"{state.phase} yet ({shown}); a shim one phase behind could race the job's writes. Wait and retry "
            "(see `reshard status`)")
    return state


def phase_guard(store: ControlStore, migration_id: str, job: str, phases: Iterable[Phase],
                min_interval: float = 1.0) -> Callable[[], str | None]:
    """A segment-engine guard: a reason to stop once the migration left ``phases``.

    A consistent read of META at most every ``min_interval`` seconds, shared by the
    workers, so a job started before an abort or a rollback stops writing at its next
    page instead of racing the cleanup that follows. It is also the job's fact keeper:
    :meth:`~reshard.jobs.facts.JobFacts.horizon` dates every data write (docs/late-writes.md).
    """
    return JobFacts(store, migration_id, job, phases, min_interval=min_interval)


# --------------------------------------------------------------------------- the runner

def _interrupt(signum, frame):  # SIGTERM behaves like Ctrl-C: finish the page, release the leases
    # Once: a second signal (a parent forwarding it, an impatient operator) must not cut the
    # release of the leases short; the previous handler is restored when the job ends.
    signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt


def choose_run(spec: JobSpec, dynamo: Dynamo, store: ControlStore, migration_id: str, opts: JobOptions,
               sleep: Callable[[float], None] = time.sleep,
               on_wait: Callable[[str], None] | None = None) -> tuple[MigrationState, int]:
    """Every precondition of ``spec``, then the run to join or start (nothing is written).

    :func:`run_job` calls it; so does a parent of ``--processes`` workers, to refuse once
    before starting any and to hand all of them the same run (a fresh job's children must
    not each decide on their own whether to start a new run).
    """
    state = require_phase_and_ack(store, migration_id, spec.name, opts.repair, wait=opts.lease_wait, sleep=sleep,
                                  on_wait=on_wait)
    not_before = spec.check(store, state, opts)
    dynamo.describe_table(state.migration().table)  # a clear error if the table is missing
    return state, run_to_join(store, migration_id, spec.name, not_before=not_before, fresh=spec.fresh)


def run_job(spec: JobSpec, dynamo: Dynamo, store: ControlStore, migration_id: str,
            options: JobOptions | None = None, *, subscribers: Iterable[Subscriber] = (),
            clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
            budget: CapacityBudget | None = None, run: int | None = None, finish: bool = True,
            idle_wait: Callable[[float], None] | None = None) -> JobResult:
    """Check every precondition, then run (or join, or resume) ``spec``'s run with this host's workers.

    ``run``: join exactly this run (a ``--processes`` child: its parent chose it with
    :func:`choose_run`; the preconditions are still checked here). ``finish``: call the
    job's ``finish`` hook when every segment is done (a parent of processes calls it once
    instead). ``idle_wait``: how an idle worker waits for other workers' segments (default
    ``sleep``; a child's parent wakes it when a sibling's segment ended).
    """
    opts = options or JobOptions()
    # A data write or a lease renewal must not stay in flight for most of a lease (the
    # time fence subtracts the longest request from it): bound one attempt to a third of it.
    dynamo = dynamo.bounded(opts.lease_seconds / 3)
    lease_store = store if store.dynamo.attempt_seconds <= opts.lease_seconds / 3 else \
        ControlStore(store.dynamo.bounded(opts.lease_seconds / 3), store.table, store.clock)
    subscribers = list(subscribers)
    state, chosen = choose_run(spec, dynamo, store, migration_id, opts, sleep,
                               on_wait=lambda what: [s.on_wait(None, what) for s in subscribers])
    run = chosen if run is None else run
    migration = state.migration()
    # The phase guard keeps the job's facts; every data write is dated by them (jobs/facts.py).
    # ... and by the table marker as the job first saw it (a next migration's start ends them).
    marker = (dynamo, migration.table, markers.key_for(dynamo.describe_table(migration.table))) \
        if state.server_deadline else None
    facts = JobFacts(store, migration_id, spec.name, job_rule(spec.name, opts.repair).phases, state=state,
                     marker=marker)
    dynamo = DatedWrites(dynamo, migration.table, facts.horizon)
    budget = budget or CapacityBudget(opts.max_wcu, opts.max_rcu)
    budget.attach(dynamo, migration.table)
    budget.listeners.append(lambda d: [s.on_throttle(d.reason) for s in subscribers])
    budget.wait_listeners.append(lambda what: [s.on_wait(None, what) for s in subscribers])
    for s in subscribers:
        s.on_budget(budget.throttle_reason)
    mapper = KeyMapper(migration) if migration.changes_table else None
    ctx = JobContext(dynamo, store, state, migration, mapper, run, budget, opts, clock, sleep)
    spec.prepare(ctx)
    guard = facts  # the page guard (the job's metrics read the phase it last saw)
    engine = SegmentEngine(lease_store, migration_id, spec.name, run, opts.segments + spec.join, spec.make_page(ctx),
                           workers=opts.worker_count, lease_seconds=opts.lease_seconds,
                           max_attempts=opts.max_attempts, clock=clock, sleep=sleep, subscribers=subscribers,
                           poll_seconds=opts.poll_seconds,
                           max_request_seconds=max(dynamo.attempt_seconds, lease_store.dynamo.attempt_seconds),
                           throttle_reason=budget.throttle_reason,
                           guard=facts, join=spec.join, idle_wait=idle_wait, phase_version=state.phase_version,
                           hold=lambda: budget.hold)
    engine.stop_hooks.append(budget.stop)  # Ctrl-C: no worker sleeps out a low budget first
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if on_main else None
    membership = None
    try:
        membership = shared_budget(lease_store, migration_id, spec.name, run, budget, opts, engine)
        membership.listeners.append(lambda m: [s.on_budget_state(budget_state(m, dynamo, guard, state.phase.value))
                                               for s in subscribers])
        membership.join()  # the run's control (a pause, an operator's budget) before the first claim
        segments = engine.run_all()
        membership.notify()  # the last counters, for the job's metrics
    finally:
        if membership:
            membership.leave()
        if on_main:
            signal.signal(signal.SIGTERM, previous)
    if segments.done and finish:
        spec.finish(ctx, segments)
    shown = recorded_examples(store, migration_id, spec.name, run)[:opts.examples] if opts.examples else []
    return JobResult(spec.name, migration_id, run, segments, budget.consumed(), budget.latest_reason(), shown,
                     membership.describe() if membership else {}, allowed_unmappable(store, migration_id))


def shared_budget(store: ControlStore, migration_id: str, job: str, run: int, budget: CapacityBudget,
                  opts: JobOptions, engine: SegmentEngine) -> BudgetMembership:
    """This process's membership of the run's budget row and reader of its live control.

    It paces at a share of the run's budget when it was given ``--max-wcu`` / ``--max-rcu``,
    when the run has a budget (a process started without one must not spend outside the
    run's budget), or once an operator sets one (``reshard throttle``); without any it only
    reads the run's control row at each beat (a pause, or a budget to join)."""
    totals = {"write": opts.max_wcu, "read": opts.max_rcu}
    if opts.max_wcu is None and opts.max_rcu is None:
        totals = None
    # Named after the host (or --host-id) and pid; the invocation keeps a restarted process
    # with a recycled pid (pid 1 in a container) apart from its predecessor.
    member = f"{opts.host_id or engine.host}:{os.getpid()}:{engine.invocation}"
    return BudgetMembership(store, migration_id, job, run, budget, totals, member=member,
                            request_seconds=engine.max_request_seconds,
                            refresh_seconds=opts.budget_refresh_seconds,
                            liveness_seconds=opts.budget_liveness_seconds, host=engine.host,
                            # A member process of this host that no longer exists (kill -9): its
                            # share is reclaimed at once, as its leases are taken over at once.
                            is_dead=lambda m: same_host_dead(f"{m.host}:{m.pid}", engine.host))


def budget_state(m: BudgetMembership, dynamo: Dynamo, guard, phase: str) -> dict:
    """What a budget beat tells the job's subscribers (its metrics): this process's budget,
    what it consumed, its throttles by reason, the run's control, the phase as last read."""
    budget = m.budget
    out = {"member": m.member, "pid": os.getpid(), "members": m.live_members,
           "phase": getattr(guard, "phase", lambda: None)() or phase,
           "budget_wait_seconds": round(budget.waited, 3),
           "throttles": dynamo.throttle_reasons()}
    for kind, unit in (("write", "wcu"), ("read", "rcu")):
        lane = budget.lanes[kind]
        out[f"consumed_{unit}"] = round(lane.consumed, 3)
        out[f"max_{unit}"] = lane.total if lane.total is not None else lane.budget
        out[f"share_{unit}"] = lane.budget if lane.total is not None else None
        out[f"set_by_{unit}"] = budget.set_by.get(kind) or None
    hold = budget.hold
    out.update({"paused": hold is not None, "release_leases": bool(hold and hold.release_leases),
                "hold_reason": hold.reason() if hold else None,
                "control_version": m.control.version if m.control else 0})
    return out


# --------------------------------------------------------------------------- data-table writes jobs share

def over_leftovers(fence: Fence) -> Fence:
    """``fence``, or the target is a retired leftover (``_rs_gone``: an earlier migration's
    cleanup retired it, and its TTL will delete it): every reader treats it as absent, so a
    copy may replace it whatever its version -- keeping it would let the TTL delete the item."""
    return Fence(f"({fence.expression}) OR attribute_exists(#rs_gone)", {**fence.names, "#rs_gone": GONE_ATTR},
                 fence.values)


def _guarded(guard: Callable[[], None] | None) -> dict:
    return {"guard": guard} if guard is not None else {}


def conditional_put(dynamo: Dynamo, budget: CapacityBudget, table: str, item: dict, fence: Fence,
                    units: float = 1.0, guard: Callable[[], None] | None = None) -> bool:
    """PutItem under a version condition, within the budget; False when the condition failed
    (a newer write is there, and it stays).

    ``guard`` (a job's :meth:`PageContext.write_guard`) runs after the budget's sleep,
    immediately before each attempt is sent: a worker whose lease may have expired
    sends nothing.
    """
    try:
        with budget.spend("write", units):
            dynamo.call("put_item", **_guarded(guard), TableName=table, Item=item, ReturnConsumedCapacity="TOTAL",
                        **fence.kwargs())
        return True
    except errors.ConditionalCheckFailed:
        return False


def conditional_delete(dynamo: Dynamo, budget: CapacityBudget, table: str, key: dict, fence: Fence,
                       guard: Callable[[], None] | None = None) -> bool:
    """DeleteItem under a version condition, within the budget; False when the condition failed.
    ``guard``: as for :func:`conditional_put`."""
    try:
        with budget.spend("write", 1.0):
            dynamo.call("delete_item", **_guarded(guard), TableName=table, Key=key, ReturnConsumedCapacity="TOTAL",
                        **fence.kwargs())
        return True
    except errors.ConditionalCheckFailed:
        return False


def scan_page(dynamo: Dynamo, budget: CapacityBudget, table: str, ctx: PageContext, start_key: dict | None,
              page_size: int, avg_item_bytes: float = 1024.0, consistent: bool = False) -> dict:
    """One page of this segment's parallel Scan, paced by the read budget.

    ``consistent``: a strongly consistent Scan (twice the read units). An eventually
    consistent page may show an item as it was up to about a second ago -- not there yet,
    or at its previous version. The backfill and verify read so (a copy of a past version
    is fenced, a past difference is re-read consistently before it counts); a job that
    decides from the page alone and never passes again -- cleanup, the strip, an abort's
    GSI rewrite -- must see what is there now (tests/integration/test_stale_scans.py).
    """
    kwargs: dict = {"TableName": table, "Segment": ctx.segment, "TotalSegments": ctx.total_segments,
                    "Limit": page_size, "ReturnConsumedCapacity": "TOTAL"}
    if consistent:
        kwargs["ConsistentRead"] = True
    if start_key:
        kwargs["ExclusiveStartKey"] = start_key
    with budget.spend("read", page_scan_units(page_size, avg_item_bytes, consistent)):
        return dynamo.call("scan", **kwargs)


def removal_hold(state: MigrationState) -> float:
    """How long after a page's scan answer a job may delete a tombstone (or strip ``_rs_v``)
    that page showed: ``H + DATE_MARGIN`` with a server deadline, else 0 (nothing expires).

    A live writer's request older than the tombstone (a held first attempt, a duplicate) was
    signed under a fact older than the scan answer that saw the tombstone, so DynamoDB refuses
    it once that answer is ``H + DATE_MARGIN`` old; removed earlier, the empty key (or the
    unversioned item) would let it pass its fence (docs/late-writes.md, 5).

    ``H`` is the longest horizon of a writer that may still write the table: this migration's,
    and the previous owner's (``previous_horizon``): after an abort's retire the marker goes back
    to that owner, whose shims (in ``complete``) write tombstones again, dated by *their* H, while
    the retired migration's second sweep deletes tombstones (b25's finding 2)."""
    h = max(state.request_horizon if state.server_deadline else 0.0, state.previous_horizon)
    return h + DATE_MARGIN_SECONDS if h else 0.0


def hold_after_scan(ctx: PageContext, scanned_at: float, seconds: float, sleep: Callable[[float], None] = time.sleep,
                    monotonic: Callable[[], float] = time.monotonic) -> None:
    """Wait until ``seconds`` have passed since ``scanned_at`` (``monotonic``'s clock, taken when
    the page's scan answer came): :func:`removal_hold`. In slices of a second, checking the
    page's write guard before each: a stopped job (Ctrl-C, the phase guard) does not sleep it
    all out."""
    left = seconds - (monotonic() - scanned_at)
    while left > 0:
        ctx.write_guard()
        sleep(min(left, 1.0))
        left = seconds - (monotonic() - scanned_at)


# --------------------------------------------------------------------------- per-item writes of a page

#: Threads that send the per-item writes of every page of this process (shared by workers
#: and jobs, so their keep-alive connections are reused from page to page).
_POOL_THREADS = 64
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="reshard-write")
        return _pool


def item_writes(ctx: PageContext, budget: CapacityBudget, write: Callable[[Callable[[], None], Any], Any],
                items: Sequence, concurrency: int) -> tuple[list, dict]:
    """``write(guard, item)`` for every item of a page, ``concurrency`` at a time.

    Returns the results in item order and the capacity the writes used (``rcu``/``wcu``).
    Each write is still one conditional request with the lease's guard before every
    attempt; concurrency changes nothing a fence decides (two writes of one target are
    ordered by their conditions at the server, whatever order they are sent in). The guard
    is serialized (a renewal is one compare-and-set at a time). The first failure (the
    lease's deadline, a lost lease, an error) stops the remaining items, and the page
    raises it only after every write already sent has answered: nothing of the page is
    in flight once it returns or raises.
    """
    lock = threading.Lock()

    def guard() -> None:
        with lock:
            ctx.write_guard()

    results: list = [None] * len(items)
    stop = threading.Event()

    def chunk(indexes: range) -> dict:
        budget.take_usage()  # this thread's usage is this chunk's alone
        try:
            for i in indexes:
                if stop.is_set():
                    break
                results[i] = write(guard, items[i])
        except BaseException:
            stop.set()
            raise
        finally:
            usage = budget.take_usage()
        return usage

    n = max(1, min(concurrency, len(items)))
    if n == 1:  # on the page's own thread: its usage stays there, for the page to take
        for i in range(len(items)):
            results[i] = write(guard, items[i])
        return results, {"rcu": 0.0, "wcu": 0.0}
    futures = [_shared_pool().submit(chunk, range(k, len(items), n)) for k in range(n)]
    total = {"rcu": 0.0, "wcu": 0.0}
    first: BaseException | None = None
    for f in futures:  # every chunk, even after a failure: nothing stays in flight
        try:
            usage = f.result()
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the others finished
            first = first or e
            continue
        total["rcu"] += usage["rcu"]
        total["wcu"] += usage["wcu"]
    if first is not None:
        raise first
    return results, total


def count_writes(ctx: PageContext, budget: CapacityBudget, write: Callable[[Callable[[], None], Any], Any],
                 items: Sequence, concurrency: int, counts: dict) -> dict:
    """A page's per-item writes (:func:`item_writes`), each outcome added to its counter in
    ``counts``, and the page's capacity (its own reads and writes plus the writes') in
    ``counts["rcu"]``/``counts["wcu"]``: the ending every data job's page shares."""
    outcomes, used = item_writes(ctx, budget, write, items, concurrency)
    for outcome in outcomes:
        if outcome:
            counts[outcome] += 1
    usage = budget.take_usage()
    counts["rcu"] = round(usage["rcu"] + used["rcu"], 2)
    counts["wcu"] = round(usage["wcu"] + used["wcu"], 2)
    return counts
