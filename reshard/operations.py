"""One function per operator verb, returning what happened as data.

The CLI renders these results (text or JSON, :mod:`reshard.cli.render`); the demo and
the tests call the same functions, so a rule such as "wait for the fleet, then
compare-and-set the phase" exists once. The functions take a loaded migration or a
migration id and built clients, never a file name or global options: the caller
resolves those first, so a bad file is refused before any AWS client exists.
Progress lines go to ``say``; nothing here prints.

Calls into the control plane (:mod:`reshard.control`) are kept here and few.
"""

from __future__ import annotations

import math
import time
import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable

from reshard import errors
from reshard.aws import inspect
from reshard.aws.dynamo import Dynamo
from reshard.control import doctor as doctors
from reshard.control import fleet
from reshard.control import horizon as horizons
from reshard.control import marker as markers
from reshard.control import live
from reshard.control import transition as transitions
from reshard.control.fleet import Census
from reshard.control.gates import catch_up_verified
from reshard.control.records import META, MigrationState, Transition
from reshard.control.runs import (allowed_unmappable, await_no_writers, backfill_run, describe,
                                  describe_lease_wait, held_lease_waits, item_total, read_run, runs,
                                  segment_records, sum_counters, unmappable_items, verify_verdict)
from reshard.control.store import ControlStore, moved_meanwhile, resolve
from reshard.core import capacity, hints, iam, planning
from reshard.core.deadlines import DEFAULT_HORIZON_SECONDS, MAX_HORIZON_SECONDS, MIN_HORIZON_SECONDS, clamp_horizon
from reshard.core.layout import GONE_ATTR, not_data
from reshard.core.marker import MARKER_ATTR
from reshard.core.wire import S
from reshard.core.doctor import NOTES as doctor_notes
from reshard.core.decode import utc_text
from reshard.core.index_planning import IndexPlan, gsi_problems, index_plan
from reshard.core.layout import KeyMapper
from reshard.core.leases import LeaseWatch
from reshard.core.migration import Migration
from reshard.core.progress import Progress, progress_done
from reshard.core.index import index_transition_refusal
from reshard.core.phases import (CLEANUP_JOB, STRIP_JOB, Action, Decision, Phase, Precondition, decide, job_rule,
                                 preconditions)
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.cleanup import CLEANUP
from reshard.jobs.combined import combined_spec, combined_verifier
from reshard.jobs.processes import run_processes
from reshard.jobs.index_jobs import index_spec
from reshard.jobs.runner import JobOptions, JobResult, run_job
from reshard.jobs.strip import STRIP
from reshard.jobs.subscribers import Subscriber
from reshard.jobs import verify as verify_jobs
from reshard.jobs.verify import VERIFY

Say = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


# ---------------------------------------------------------------------- start

@dataclass(frozen=True)
class Started:
    state: MigrationState
    control_table: str
    created: bool  # False: the same file was registered before (idempotent)
    control_table_created: bool
    checked: planning.SampleAnalysis | None = None  # the sample start checked (None: already registered)
    allow_unmappable: int = 0
    item_count: dict | None = None  # the stored count (:func:`reshard.control.runs.item_total`)
    next: str = ""  # the ``next:`` hint (:func:`next_hint`)
    #: The file is byte for byte the registered one (False: the same meaning, written otherwise).
    same_bytes: bool = True


def check_horizon(seconds: float) -> float:
    """``--request-horizon``: a positive number of seconds, clamped to the documented bounds."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise errors.BadInput(f"--request-horizon {seconds:g}: give a positive number of seconds "
                              f"(default {DEFAULT_HORIZON_SECONDS:g}; between {MIN_HORIZON_SECONDS:g} and "
                              f"{MAX_HORIZON_SECONDS:g})")
    return clamp_horizon(seconds)


def start(dynamo: Dynamo, store: ControlStore, m: Migration, say: Say = _quiet, *, allow_unmappable: int = 0,
          sample: int = planning.DEFAULT_SAMPLE, segments: int = 8, count: bool = False,
          max_rcu: float | None = None, request_horizon: float = DEFAULT_HORIZON_SECONDS,
          server_deadline: bool = True) -> Started:
    """Run every check of ``plan``, then register ``m`` (phase planned), creating the control table if missing.

    Refuses (:class:`~reshard.errors.BadInput`, one line per problem) what ``plan`` flags
    (:func:`start_problems`): key types, templates that match no item, unmappable and
    too-large items beyond ``allow_unmappable``, new-key collisions. The allowance is
    recorded on the migration; ``backfill``, ``verify`` and the cutover gate hold the
    whole table to it. Re-running ``start`` with the same file checks nothing again
    (idempotent) but records a changed allowance. ``count``: count the items exactly
    (:func:`count_items`) and store the total for progress and ETA.

    Late writes (docs/late-writes.md): ``server_deadline`` probes that the server enforces
    DynamoDB's signature window (:func:`reshard.control.horizon.probe`) and refuses one that
    does not; False (``--no-server-deadline``, test servers) records ``server_deadline = off``
    and nothing waits on the horizon. ``request_horizon`` (H, clamped) goes into META. Before
    registering, the table marker is written (:mod:`reshard.control.marker`), naming this
    migration and keeping the owner it replaces.
    """
    horizon = check_horizon(request_horizon)
    desc = inspect.check_keys(dynamo, m)
    existing = store.load_state(m.id, missing_ok=True) if store.exists() else None
    if existing is not None and existing.changes_from(m):
        store.register(m)  # refuses a change of meaning under a registered id, naming the changes
    analysis = None
    if existing is None:
        analysis = analyse(dynamo, m, sample=sample, segments=segments, desc=desc)
        problems = start_problems(desc, m, analysis, allow_unmappable)
        if problems:
            raise errors.BadInput(f"start refused: {len(problems)} problem(s) with {m.path} on table {m.table!r} "
                                  "(`reshard plan` shows the details):\n"
                                  + "\n".join(f"  - {p}" for p in problems))
        if server_deadline:
            # On the control row when the control table exists, else on the marker's key: the
            # same server, and nothing is created before the probe passed.
            why = (horizons.probe(store.dynamo, store.table, {"pk": S(store.mpk(m.id)), "sk": S(META)})
                   if store.exists() else horizons.probe(dynamo, m.table, markers.key_for(desc)))
            if why:
                raise errors.BadInput(f"start refused: {why}")
    if horizon != request_horizon:
        say(f"--request-horizon {request_horizon:g} clamped to {horizon:g}s")
    created_table = store.ensure_table()
    if created_table:
        say(f"created control table {store.table!r} (PAY_PER_REQUEST)")
    if existing is None or existing.active:
        # Before the registration (and again after a re-run: a doctor may have removed a
        # marker whose start had not registered yet): shims refuse a table whose marker names
        # a migration they cannot see.
        mine = markers.claim(dynamo, store, m.id, m.table, desc)
        previous_horizon = markers.previous_horizon(store, mine)
    else:
        previous_horizon = 0.0
    try:
        state, created = store.register(m, request_horizon=horizon, server_deadline=server_deadline,
                                        previous_horizon=previous_horizon)
    except errors.ReshardError:
        if existing is None:  # e.g. another migration took the table meanwhile: its owner comes back
            markers.give_back(dynamo, store, m.id, m.table, desc)
        raise
    if created and not server_deadline:
        say("server deadline off (--no-server-deadline): the server does not refuse late requests, so a frozen "
            "process's request could land after the fleet moved on; for test servers only")
    if created or allow_unmappable != allowed_unmappable(store, m.id):
        store.set_allowance(m.id, allow_unmappable)
    total = None
    if count:
        n = count_items(dynamo, m.table, segments=segments, max_rcu=max_rcu, say=say)
        store.set_item_count(m.id, n, "count")
    elif analysis is not None and analysis.full_scan:
        store.set_item_count(m.id, analysis.scanned, "full scan")
    if count or (analysis is not None and analysis.full_scan):
        total = item_total(store, m.id)
    state = store.load_state(m.id)
    # A file registered before may be anywhere in its life: its hint reads the gates.
    return Started(state, store.table, created, created_table, analysis, allow_unmappable, total,
                   next=hints.next_step(state.id, state.phase) if created else next_hint(store, state),
                   same_bytes=state.file_hash == m.content_hash)


def start_problems(desc: dict, m: Migration, analysis: planning.SampleAnalysis | IndexPlan,
                   allow_unmappable: int) -> list[str]:
    """Everything ``start`` refuses, one sentence each; ``plan`` shows the same list."""
    if not m.changes_table:
        return gsi_problems(desc, m) + analysis.blockers(allow_unmappable)
    problems = []
    key_problem = inspect.string_key_problem(desc, m)
    if key_problem:
        problems.append(key_problem)
    problems += planning.blockers(analysis, allow_unmappable)
    if m.indexes:  # combined: the table's and the index's checks
        problems += gsi_problems(desc, m) + (analysis.index.blockers(allow_unmappable) if analysis.index else [])
    return problems


def analyse(dynamo: Dynamo, m: Migration, *, sample: int = planning.DEFAULT_SAMPLE, segments: int = 8,
            say: Say = _quiet, desc: dict | None = None) -> planning.SampleAnalysis | IndexPlan:
    """Scan ``sample`` items over ``segments`` parallel-scan segments (0: all) through the layouts.

    An index-only migration gets an :class:`~reshard.core.index_planning.IndexPlan` (``desc``:
    the DescribeTable answer whose GSI projections size the index writes)."""
    full = sample == 0
    if m.changes_table:
        analysis = planning.SampleAnalysis(KeyMapper(m), full_scan=full)
        if m.indexes:  # combined: the index plan over the same sample
            analysis.index = index_plan(m, desc if desc is not None else dynamo.describe_table(m.table),
                                        full_scan=full)
    else:
        analysis = index_plan(m, desc if desc is not None else dynamo.describe_table(m.table), full_scan=full)
    if full:
        say(f"scanning all of {m.table} ({segments} segments) ...")

    def observe(items: list[dict]) -> None:
        for item in items:
            if not not_data(item):  # the table marker, a retired leftover: not an item to plan for
                analysis.observe(item)

    inspect.scan_segments(dynamo, m.table, segments, None if full else sample, observe)
    return analysis


def count_items(dynamo: Dynamo, table: str, *, segments: int = 8, max_rcu: float | None = None,
                say: Say = _quiet, on_count: Callable[[int], None] | None = None) -> int:
    """Count the table's items exactly: a parallel ``Select=COUNT`` scan within ``max_rcu``.

    DescribeTable's ``ItemCount`` is refreshed about every six hours (and 0 on local
    servers); this reads the whole table once (charged as a scan) and says how far it got.
    """
    budget = CapacityBudget(max_rcu=max_rcu).attach(dynamo, table)
    seen = {"n": 0, "shown": time.monotonic()}

    def progress(n: int) -> None:
        seen["n"] += n
        if on_count is not None:
            on_count(n)
        if time.monotonic() - seen["shown"] >= 5:
            seen["shown"] = time.monotonic()
            say(f"counting {table}: {seen['n']} items so far ...")

    say(f"counting the items of {table} (Select=COUNT scan, {segments} segments"
        + (f", at most {max_rcu:g} RCU/s)" if max_rcu else ")"))
    # The table marker and an earlier migration's retired leftovers are not items to migrate.
    return inspect.count_items(dynamo, table, segments, progress, pace=lambda: budget.spend("read", 1.0),
                               exclude=("attribute_not_exists(#rs_m) AND attribute_not_exists(#rs_g)",
                                        {"#rs_m": MARKER_ATTR, "#rs_g": GONE_ATTR}))


def next_hint(store: ControlStore, state: MigrationState, census: Census | None = None) -> str:
    """The ``next:`` hint for ``state``, from the same facts the transition rules read."""
    if not state.active:
        return hints.next_step(state.id, state.phase, retired=state.retired)
    census = census or fleet.census(store, state.id, state.phase_version)
    return hints.next_step(state.id, state.phase, transitions.facts(store, state, census),
                           retired=state.retired, switching=state.switching, rolled_back_from=rolled_back_from(state))


def rolled_back_from(state: MigrationState) -> Phase | None:
    """The phase the last move rolled back out of (None: the last move was no rollback)."""
    last = state.last
    if last is None or last.action != "rollback" or not last.from_phase:
        return None
    return Phase(last.from_phase)


# ---------------------------------------------------------------------- status, list

@dataclass(frozen=True)
class Status:
    state: MigrationState
    control_table: str
    now: float
    history: list[Transition]
    census: Census
    advance: Decision  # whether `advance` would be allowed now, and why not
    jobs: list[dict]  # every job run, as :func:`job_runs` describes it
    next: str = ""  # the ``next:`` hint, from the same facts as ``advance``
    #: The passing verify run that lifts the catch-up flag (the next transition clears it), or None.
    catch_up_run: int | None = None


def status_migration(store: ControlStore, ref: str | None,
                     on_several: Callable[[list[MigrationState]], None] | None = None) -> str:
    """The migration ``status`` shows: the one named, else the active one, else the most recently
    started (so ``status`` still answers after ``complete`` or a retired abort).

    Several active migrations and none named: ``on_several(active)`` is told them (the CLI lists
    them), then a one-line refusal asks for one (exit 2)."""
    if ref:
        return resolve(store, ref)
    store.require_table()
    states = store.list_states()
    active = [s for s in states if s.active]
    if len(active) > 1:
        if on_several is not None:
            on_several(active)
        raise errors.BadInput(f"{len(active)} active migrations in control table {store.table!r} (listed above): "
                              f"name one, e.g. `reshard status {active[0].id}`")
    if active:
        return active[0].id
    if not states:
        raise errors.MigrationNotFound(f"no migration in control table {store.table!r} (run `reshard start FILE`)")
    return max(states, key=lambda s: s.created_at).id


def status(store: ControlStore, migration_id: str,
           progress_total: Callable[[MigrationState], tuple] | None = None) -> Status:
    """Phase, history, fleet, job runs, and whether ``advance`` is allowed now.

    ``progress_total(state) -> (items, source)``: the total the in-progress jobs' ETA is
    computed against (:func:`progress_total`); None leaves rate and ETA out.
    """
    state = store.load_state(migration_id)
    now = store.clock()
    census = fleet.census(store, migration_id, state.phase_version)
    facts = transitions.facts(store, state, census)
    decision = decide(Action.ADVANCE, state.phase, facts)
    jobs = job_runs(store, migration_id)
    total = progress_total(state) if progress_total and any(not j["finished_at"] for j in jobs) else None
    for j in jobs:
        j["progress"] = job_progress_of(j, now, total)
    hint = (hints.next_step(state.id, state.phase, facts, retired=state.retired, switching=state.switching,
                            rolled_back_from=rolled_back_from(state))
            if state.active else hints.next_step(state.id, state.phase, retired=state.retired))
    verified = catch_up_verified(store, state) if state.newer_may_be else None
    return Status(state=state, control_table=store.table, now=now, history=store.history(migration_id),
                  census=census, advance=decision, jobs=jobs, next=hint, catch_up_run=verified)


@dataclass(frozen=True)
class Listed:
    control_table: str
    migrations: list[dict]  # id, table, phase, retired, started, finished, by
    control_table_exists: bool = True


def list_migrations(store: ControlStore) -> Listed:
    """Every migration of the control table, oldest first (one Scan of the META rows).

    ``finished`` is when it stopped owning its table: the move to ``complete``, or the
    retire of an aborted migration; None while it is active. No control table: no
    migration (an empty list; `start` creates the table), not an error.
    """
    if not store.exists():
        return Listed(store.table, [], control_table_exists=False)
    return Listed(store.table, [listed_row(s) for s in store.list_states()])


def listed_row(s: MigrationState) -> dict:
    """One migration as ``list`` shows it."""
    return {"id": s.id, "table": s.table, "phase": s.phase.value, "retired": s.retired,
            "active": s.active, "phase_version": s.phase_version, "started": s.created_at,
            "started_by": s.created_by, "finished": None if s.active else s.updated_at}


def job_runs(store: ControlStore, migration_id: str) -> list[dict]:
    """Every backfill/verify/cleanup/strip-bookkeeping run: per-segment progress, owners, errors, totals, verdicts."""
    out = []
    for job in DATA_JOBS:
        all_runs = runs(store, migration_id, job)
        for info in all_runs:
            d = describe(store, migration_id, job, info.run, clock=store.clock)
            if d is None:
                continue
            d["latest"] = info is all_runs[-1]
            d["totals"] = {k: (int(v) if float(v).is_integer() else round(v, 1)) for k, v in d["totals"].items()}
            if job == "backfill":
                d["current"] = info.run == backfill_run(store, migration_id)
                if d["latest"]:
                    # One report (U#backfill#...), two lists: items the layout cannot map, and
                    # collisions (two pre-migration copies of one item that differ; neither copied).
                    items = unmappable_items(store, migration_id)
                    unmappable = [i for i in items if i["reason"] != "collision"]
                    collisions = [i for i in items if i["reason"] == "collision"]
                    d["unmappable"] = {"count": len(unmappable), "examples": unmappable[:5],
                                       "allowed": allowed_unmappable(store, migration_id)}
                    d["collisions"] = {"count": len(collisions), "examples": collisions[:5]}
            if job == "verify":
                d["result"] = verify_verdict(store, migration_id, info.run, shown=5)
            out.append(d)
    return out


# ---------------------------------------------------------------------- advance, rollback, abort

@dataclass(frozen=True)
class Transitioned:
    action: Action
    before: MigrationState
    after: MigrationState
    census: Census  # the fleet on the new phase version, after waiting if asked to
    waited: bool
    ack_seconds: float  # from the transition write to ``census`` (monotonic clock, for reports)
    next: str = ""  # the ``next:`` hint after the move


#: How often ``advance --wait`` re-reads the census: a census is a couple of small control-table
#: reads, and a shim acknowledges within one refresh, so a short poll ends the wait soon after.
ACK_POLL_SECONDS = 0.25


def transition(store: ControlStore, migration_id: str, action: Action, *, wait: float | None = None,
               from_phase: str | None = None, who: str | None = None, poll: float = ACK_POLL_SECONDS,
               say: Say = _quiet,
               on_lagging: Callable[[MigrationState, Census], None] | None = None,
               allow_no_shims: bool = False, started_at: float | None = None,
               sleep: Callable[[float], None] = time.sleep) -> Transitioned:
    """Apply one transition, exactly the step its operator meant; with ``wait``, wait for the fleet
    before and after it.

    The phase this command starts from is read once, first: every later step (the wait, the
    facts, the compare-and-set) acts on that phase version, so two operators who each run one
    ``advance`` never move a migration two phases -- the one whose compare-and-set comes
    second gets "X already moved it from A to B at T; nothing done". ``started_at`` (the wall
    clock when the operator ran the command; the CLI passes it): a move recorded after it is
    one this operator cannot have seen, so an ``advance``/``rollback`` that would now start
    from the phase that move set is refused the same way (cross-host clock skew can make this
    refuse a command started within the skew of another move: run it again).

    ``wait`` is one budget for both waits. ``from_phase`` acts only if the migration is in
    that phase now. Refusals (rules, a lagging fleet, a lost race) raise; once the
    transition happened, a fleet that has not caught up is reported, not raised.
    ``on_lagging`` is called when the wait before the transition gave up (it may raise to
    stop there; otherwise the transition is tried and the rules decide). ``allow_no_shims``:
    the operator vouches that nothing writes the table (an empty census is refused otherwise).
    With a server deadline the move also waits until the phase has lasted its request horizon on
    the server's clock (it says so on ``say``; ``sleep`` is how it waits:
    :func:`reshard.control.transition.transition`).
    """
    first = store.load_state(migration_id)
    if action in (Action.ADVANCE, Action.ROLLBACK) and started_at is not None and first.last is not None \
            and first.last.at > started_at and first.last.action != "start":
        raise errors.ConcurrentChange(moved_meanwhile(first.last, migration_id, after_start=True))
    if from_phase is not None and first.phase.value != from_phase:
        raise errors.ConcurrentChange(
            f"{action.value} refused for {migration_id!r}: it is in {first.phase} (phase version "
            f"{first.phase_version}, last moved by {first.last.who if first.last else '?'}), "
            f"not {from_phase}; nothing done; check `reshard status` before acting again")
    # The compare-and-set below acts on exactly the version read here.
    expected = first.phase_version
    remaining = 0.0
    if wait:
        start_at = store.monotonic()
        census = fleet.census(store, migration_id, expected)
        if not census.acknowledged:
            say(f"waiting up to {wait:g}s for {len(census.lagging)} live shim(s) to acknowledge "
                f"{first.phase} v{expected}: {', '.join(census.describe_lagging()[:5])}")
            census = fleet.wait_for_ack(store, migration_id, expected,
                                        max(0.0, wait - (store.monotonic() - start_at)), poll=poll,
                                        on_wait=lagging_reporter(say, first.phase, expected, wait, store.monotonic))
        if not census.acknowledged:
            say(f"gave up after {wait:g}s waiting for the fleet to acknowledge {first.phase} "
                f"v{expected}; lagging: {', '.join(census.describe_lagging())}")
            if on_lagging is not None:
                on_lagging(first, census)
        remaining = max(0.0, wait - (store.monotonic() - start_at))
    started = time.monotonic()
    # The same budget covers watching stalled job leases go quiet before a cutover.
    leases_due = every(WAIT_REPORT_SECONDS, store.monotonic)
    before, after = transitions.transition(
        store, migration_id, action, who=who, expected_version=expected, allow_no_shims=allow_no_shims,
        lease_wait=remaining,
        on_lease_wait=lambda waits: say("waiting for job leases to go quiet before the cutover (a worker stalled "
                                        "past its lease could still write): " + "; ".join(waits[:5]))
        if leases_due() else None, say=say, sleep=sleep)
    census = fleet.wait_for_ack(store, migration_id, after.phase_version, remaining, poll=poll,
                                on_wait=lagging_reporter(say, after.phase, after.phase_version, wait or 0.0,
                                                         store.monotonic)) \
        if wait else fleet.census(store, migration_id, after.phase_version)
    return Transitioned(action, before, after, census, bool(wait), time.monotonic() - started,
                        next_hint(store, after, census))


#: Seconds between two lines saying what a wait still waits for (PRODUCT.md: at least every 10 s).
WAIT_REPORT_SECONDS = 8.0


def every(seconds: float, clock: Callable[[], float] = time.monotonic, first: bool = True) -> Callable[[], bool]:
    """True at the first call (``first``; else only once ``seconds`` passed since this was made),
    then at most once per ``seconds`` (what a wait's report line uses)."""
    last = [None if first else clock()]

    def due() -> bool:
        now = clock()
        if last[0] is None or now - last[0] >= seconds:
            last[0] = now
            return True
        return False
    return due


def lagging_reporter(say: Say, phase, version: int, limit: float, clock: Callable[[], float],
                     report_seconds: float = WAIT_REPORT_SECONDS) -> Callable[[Census], None]:
    """A wait's report: the lagging shims by name and how long is left, every ``report_seconds``
    (the line that began the wait said it first)."""
    due = every(report_seconds, clock, first=False)
    began = clock()

    def report(census: Census) -> None:
        if census.acknowledged or not due():
            return
        left = max(0.0, limit - (clock() - began)) if limit else None
        names = census.describe_lagging()
        say(f"waiting for {len(names)} shim(s) to acknowledge {phase} v{version}: "
            + ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            + (f"; {left:.0f}s left" if left is not None else "")
            + " (a shim that is gone is dropped once watched silent for its liveness window + longest request)")
    return report


@dataclass(frozen=True)
class Preview:
    """``advance|rollback|abort --dry-run``: what the command would do now and why, nothing written."""

    action: Action
    state: MigrationState
    target: Phase | None
    checks: tuple  # reshard.core.phases.Precondition, each with its state
    switch: bool  # the move goes through the fleet-wide switch
    census: Census

    @property
    def allowed(self) -> bool:
        return self.target is not None and all(c.ok for c in self.checks)

    @property
    def exit_code(self) -> int:
        """0 it would go; 1 refused only for now (a wait may clear it); 2 refused by the rules."""
        if self.allowed:
            return 0
        return 1 if self.target is not None and all(c.ok or c.clears_by_waiting for c in self.checks) else 2


def preview(store: ControlStore, migration_id: str, action: Action, *, allow_no_shims: bool = False,
            from_phase: str | None = None) -> Preview:
    """What ``action`` would do now, each precondition with its state; reads only (one look at the
    fleet and the job leases: a held lease counts as a writer here, which ``--wait`` may watch go quiet)."""
    state = store.load_state(migration_id)
    census = fleet.census(store, migration_id, state.phase_version)
    if state.switching:
        # advance finishes the switch, rollback abandons it (control.transition); abort is refused.
        back = Phase(state.last.from_phase) if state.last and state.last.from_phase else None
        target = {Action.ADVANCE: state.phase, Action.ROLLBACK: back}.get(action)
        why = ("every live shim holds" if census.acknowledged else f"{len(census.lagging)} live shim(s) do not hold "
               f"yet: {', '.join(census.describe_lagging()[:5])}")
        checks = (Precondition(f"{action.value} is possible during the switch to {state.phase}", target is not None,
                               "yes" if target is not None else "finish the switch (`reshard advance`) or undo it "
                               "(`reshard rollback`) first"),) + (
            (Precondition("every live shim acknowledged the switch", census.acknowledged, why,
                          clears_by_waiting=True),) if action is Action.ADVANCE else ())
        return Preview(action, state, target, checks, True, census)
    found = transitions.facts(store, state, census, allow_no_shims=allow_no_shims)
    if action is Action.ADVANCE and state.phase is Phase.BACKFILL:
        found = dataclasses.replace(found, writers=await_no_writers(store, migration_id,
                                                                    transitions.WRITING_JOBS, 0.0))
    target, checks = preconditions(action, state.phase, found)
    if target is not None and state.migration().indexes:
        refusal = index_transition_refusal(action, state.phase, target)
        checks += (Precondition("the sharded GSI allows this move", refusal is None, refusal or "yes"),)
    if from_phase is not None:
        checks = (Precondition(f"the migration is in {from_phase} (--from)", state.phase.value == from_phase,
                               "yes" if state.phase.value == from_phase else f"it is in {state.phase}"),) + checks
    switch = target is not None and transitions.needs_switch(state, state.phase, target)
    return Preview(action, state, target, checks, switch, census)

@dataclass(frozen=True)
class Waited:
    """``reshard wait``: the fleet and the jobs as the wait left them (nothing was moved)."""

    state: MigrationState
    census: Census
    writers: list[str]  # job leases a live worker may still use (describe_lease_wait each)
    done: bool  # every live shim acknowledged the phase version, no job lease is held
    seconds: float
    next: str = ""


#: The jobs whose leases ``reshard wait`` waits for (every data job: "and jobs finished").
ALL_JOBS = ("backfill", "verify", CLEANUP_JOB, STRIP_JOB)


def wait(store: ControlStore, migration_id: str, *, timeout: float | None = None, poll: float = ACK_POLL_SECONDS,
         say: Say = _quiet, sleep: Callable[[float], None] = time.sleep,
         report_seconds: float = WAIT_REPORT_SECONDS) -> Waited:
    """Wait until every live shim acknowledged the current phase version and no job's worker holds
    a lease; move nothing. ``timeout`` None: as long as it takes.

    The current phase is read again at every look (a transition meanwhile is waited for too).
    A shim that is gone counts until it was watched silent for its liveness window + longest
    request, and is then removed (as ``advance --wait`` does); a job lease counts until it is
    released, or unchanged for the holder's lease + longest request (a dead worker's). Every
    ``report_seconds`` it says what it still waits for, by name.
    """
    began = store.monotonic()
    watch = LeaseWatch()
    due = every(report_seconds, store.monotonic)
    while True:
        state = store.load_state(migration_id)
        census = fleet.census(store, migration_id, state.phase_version)
        if census.expired:
            fleet.reap(store, migration_id, census.expired)
        leases = held_lease_waits(store, migration_id, ALL_JOBS, watch, store.monotonic())
        writers = [describe_lease_wait(*w) for w in leases]
        done = census.acknowledged and not writers
        elapsed = store.monotonic() - began
        if done or (timeout is not None and elapsed >= timeout):
            return Waited(state, census, writers, done, elapsed, next_hint(store, state, census))
        if due():
            pending = [f"shim {d}" for d in census.describe_lagging()[:5]] + writers[:5]
            left = f"; {timeout - elapsed:.0f}s left" if timeout is not None else ""
            say(f"waiting for {len(census.lagging)} shim(s) to acknowledge {state.phase} v{state.phase_version} "
                f"and {len(writers)} job lease(s): {'; '.join(pending)}{left}")
        sleep(poll if timeout is None else max(0.0, min(poll, timeout - elapsed)))


# ---------------------------------------------------------------------- plan

@dataclass(frozen=True)
class Plan:
    migration: Migration
    table: dict  # DescribeTable
    ttl: dict  # :func:`reshard.aws.inspect.ttl_report`
    analysis: planning.SampleAnalysis
    estimate: planning.Estimate
    recommendation: planning.Recommendation | None
    sample: int  # requested; 0 = full scan
    segments: int
    table_items: int  # the item count the estimates are scaled to
    warnings: list[str]
    count_source: str = ""  # where ``table_items`` comes from (:data:`COUNT_SOURCES`)
    blockers: list[str] = dataclasses.field(default_factory=list)  # what `start` would refuse
    #: A combined migration: the GSI half's units (:meth:`IndexPlan.capacity`; None: no [index.NAME]).
    index_capacity: dict | None = None


#: Where an item count comes from, in words (plan's report, status's ETA).
COUNT_SOURCES = {
    "DescribeTable": "DescribeTable's ItemCount (refreshed about every 6 hours)",
    "count": "counted now (Select=COUNT scan)",
    "full scan": "counted by the full scan",
}


def check_plan_options(peak_writes_per_sec: float | None, item_kb: float | None) -> None:
    """An item size alone recommends nothing: refuse it rather than ignore it."""
    if item_kb is not None and peak_writes_per_sec is None:
        raise errors.BadInput("--item-kb needs --peak-writes-per-sec (the recommendation uses both)")


def plan(dynamo: Dynamo, m: Migration, *, sample: int = planning.DEFAULT_SAMPLE, segments: int = 8,
         max_wcu: float | None = None, peak_writes_per_sec: float | None = None, item_kb: float | None = None,
         headroom: float = planning.DEFAULT_HEADROOM, write_price: float = planning.DEFAULT_WRITE_PRICE,
         read_price: float = planning.DEFAULT_READ_PRICE, count: bool = False, max_rcu: float | None = None,
         say: Say = _quiet) -> Plan:
    """Check ``m`` against the live table and estimate the work; reads only.

    Samples ``sample`` items over ``segments`` parallel-scan segments (0: the whole
    table) and scales the estimates to the table's item count: DescribeTable's, the full
    scan's, or with ``count`` an exact ``Select=COUNT`` scan (:func:`count_items`).
    ``blockers`` is what ``start`` would refuse (:func:`start_problems`, no allowance).
    """
    check_plan_options(peak_writes_per_sec, item_kb)
    if not m.changes_table:
        return plan_index(dynamo, m, sample=sample, segments=segments, max_wcu=max_wcu, write_price=write_price,
                          read_price=read_price, count=count, max_rcu=max_rcu, say=say)
    table = inspect.check_plannable(dynamo, m)
    ttl = inspect.ttl_report(dynamo, m.table)
    analysis = analyse(dynamo, m, sample=sample, segments=segments, say=say, desc=table)
    full = sample == 0
    item_count = int(table.get("ItemCount", 0) or 0)
    if count:
        counted = count_items(dynamo, m.table, segments=segments, max_rcu=max_rcu, say=say)
        table_items, source = counted, COUNT_SOURCES["count"]
    elif full:
        table_items, source = analysis.scanned, COUNT_SOURCES["full scan"]
    else:
        table_items, source = max(item_count, analysis.scanned), COUNT_SOURCES["DescribeTable"]
    est = planning.estimate(analysis, table_items, max_wcu=max_wcu,
                            write_price=write_price, read_price=read_price)
    rec = None
    if peak_writes_per_sec is not None:
        if item_kb is None:
            item_kb = math.ceil(analysis.bytes_all / analysis.scanned / capacity.KB) if analysis.scanned else 1
        rec = planning.recommend(peak_writes_per_sec, item_kb, m.target.shards, headroom)
    warnings = plan_warnings(m, ttl, analysis, rec)
    index_cap = None
    if analysis.index is not None:  # combined: the GSI half (skew, rewrite and new copies' GSI puts)
        warnings += index_warnings(analysis.index)
        index_cap = analysis.index.capacity(table_items, max_wcu=max_wcu, write_price=write_price,
                                            read_price=read_price)
    if not (count or full) and item_count < analysis.scanned:
        warnings.append(f"DescribeTable's ItemCount is {item_count} but the sample alone holds {analysis.scanned} "
                        "items: the count is stale (DynamoDB refreshes it about every 6 hours; local servers say 0), "
                        "so the estimates may be too low; plan --count counts the items exactly")
    return Plan(m, table, ttl, analysis, est, rec, sample, segments, table_items, warnings,
                count_source=source, blockers=start_problems(table, m, analysis, 0), index_capacity=index_cap)


@dataclass(frozen=True)
class IndexPlanReport:
    """``plan`` of an index-only migration: the GSI checks, shard skew before/after, the rewrite's cost."""

    migration: Migration
    table: dict  # DescribeTable
    analysis: IndexPlan
    sample: int
    segments: int
    table_items: int
    count_source: str
    capacity: dict
    warnings: list[str]
    blockers: list[str]


def plan_index(dynamo: Dynamo, m: Migration, *, sample: int, segments: int, max_wcu: float | None,
               write_price: float, read_price: float, count: bool, max_rcu: float | None,
               say: Say = _quiet) -> IndexPlanReport:
    """:func:`plan` for an index-only migration (reads only): items keep their keys, one
    attribute per item is rewritten; the table write and the GSI's delete + put are counted."""
    table = inspect.check_keys(dynamo, m)
    analysis = analyse(dynamo, m, sample=sample, segments=segments, say=say, desc=table)
    full = sample == 0
    item_count = int(table.get("ItemCount", 0) or 0)
    if count:
        table_items, source = count_items(dynamo, m.table, segments=segments, max_rcu=max_rcu, say=say), \
            COUNT_SOURCES["count"]
    elif full:
        table_items, source = analysis.scanned, COUNT_SOURCES["full scan"]
    else:
        table_items, source = max(item_count, analysis.scanned), COUNT_SOURCES["DescribeTable"]
    warnings = index_warnings(analysis)
    if analysis.scanned == 0:
        warnings.append(f"{m.table} looks empty: nothing to sample, estimates are zero")
    if not (count or full) and item_count < analysis.scanned:
        warnings.append(f"DescribeTable's ItemCount is {item_count} but the sample alone holds {analysis.scanned} "
                        "items: the count is stale; plan --count counts the items exactly")
    cap = analysis.capacity(table_items, max_wcu=max_wcu, write_price=write_price, read_price=read_price)
    return IndexPlanReport(m, table, analysis, sample, segments, table_items, source, cap, warnings,
                           start_problems(table, m, analysis, 0))


def index_warnings(analysis: IndexPlan) -> list[str]:
    """What the operator should know about each ``[index.NAME]`` of the sample (skew, an empty index)."""
    warnings = []
    for name, a in analysis.analyses.items():
        new = a.new_distribution()
        if new.total and new.skew > 2:
            noise = " (few sampled items per shard: part of that is sampling noise)" if new.mean < 20 else ""
            warnings.append(f"[index.{name}] new layout is skewed: the hottest GSI shard holds {new.hottest_pct:.1f}% "
                            f"(skew {new.skew:.2f}); check shard_by has enough distinct values{noise}")
        if a.indexed == 0 and analysis.scanned:
            warnings.append(f"[index.{name}]: no sampled item is in GSI {name!r} (none has {a.mapper.attr!r}"
                            + (f" and {a.mapper.sort_attr!r}" if a.mapper.sort_attr else "") + ")")
        old, new_fields = (_query_fields(a.mapper.old), _query_fields(a.mapper.new))
        if old != new_fields:
            # From dual_write to backfill (and aborted) a query reads both layouts' values: an
            # application query that names only the old template's fields starts failing there.
            warnings.append(f"[index.{name}]: the [from] and [to] partition templates need different query fields "
                            f"({', '.join(sorted(old)) or 'none'} / {', '.join(sorted(new_fields)) or 'none'}): from "
                            f"dual_write until cutover a query(IndexName={name!r}) must give an equality on each of "
                            f"{', '.join(sorted(old | new_fields))}, or the shim refuses it")
    return warnings


def _query_fields(layout) -> set[str]:
    """The fields a query of one index layout must fix (template fields, derived ones by source)."""
    return {layout.derived[f].source if f in layout.derived else f for f in layout.template_fields}


def plan_warnings(m: Migration, ttl: dict, a: planning.SampleAnalysis,
                  rec: planning.Recommendation | None) -> list[str]:
    """What the operator should fix or know before ``start``."""
    new = a.new_distribution()
    warnings = []
    if m.cleanup.ttl_attribute:
        if ttl["status"] == "UNKNOWN":
            warnings.append(f"could not read the TTL setting of {m.table} ({ttl.get('error')}): make sure TTL "
                            f"is enabled on {m.cleanup.ttl_attribute!r} before cleanup")
        elif ttl["status"] not in ("ENABLED", "ENABLING") or ttl["attribute"] != m.cleanup.ttl_attribute:
            now = (f"TTL is {ttl['status']}" + (f" on {ttl['attribute']!r}" if ttl["attribute"] else ""))
            warnings.append(f"[cleanup] ttl_attribute = {m.cleanup.ttl_attribute!r} but {now} on {m.table}: "
                            f"old items would never expire; enable TTL on {m.cleanup.ttl_attribute!r} "
                            f"before cleanup")
    else:
        warnings.append("[cleanup] has no ttl_attribute: cleanup will delete old-layout items one by one")
    if a.unmappable_count:
        warnings.append(f"{a.unmappable_count} sampled item(s) cannot be mapped: start refuses them unless "
                        "--allow-unmappable N covers them; the backfill counts, lists and skips them (see the examples)")
    if a.collisions:
        warnings.append(f"{a.collisions} sampled old item(s) map to the same new key as another old item with "
                        "different content and no newer version (collisions, see the examples): only one can "
                        "exist in the new layout; the backfill lists them and verify fails until each is "
                        "resolved (keep one copy, or write the item again through the shim)")
    if m.source.random and a.scanned and not a.full_scan:
        warnings.append("[from] is a random-suffix layout: a sample finds a collision only when it holds both "
                        "copies; plan --sample 0 (a full scan) counts them all")
    if a.in_new_layout or a.tombstones:
        warnings.append(f"{a.in_new_layout} sampled item(s) are already in the new layout and {a.tombstones} are "
                        "tombstones: a migration has written this table (plan is meant for before `start`)")
    if a.scanned == 0:
        warnings.append(f"{m.table} looks empty: nothing to sample, estimates are zero")
    if rec and rec.warning:
        warnings.append(rec.warning)
    if new.total and new.skew > 2:
        # A small sample is uneven by chance alone; say so rather than stay silent.
        noise = (f" (only {new.mean:.1f} sampled items per shard: part of that is sampling noise)"
                 if new.mean < 20 else "")
        warnings.append(f"new layout is skewed: the hottest shard holds {new.hottest_pct:.1f}% "
                        f"(skew {new.skew:.2f}); check shard_by has enough distinct values{noise}")
    return warnings


# ---------------------------------------------------------------------- iam-policy

@dataclass(frozen=True)
class IamPolicy:
    role: str
    document: dict


def iam_policy(m: Migration, role: str, control_table: str, region: str | None = None,
               account: str = "*") -> IamPolicy:
    """The least-privilege policy for ``role`` on ``m``'s table and the control table."""
    return IamPolicy(role, iam.policy(role, m.table, control_table, region or "*", account, migration_id=m.id,
                                      indexes=tuple(i.name for i in m.indexes)))



# ---------------------------------------------------------------------- doctor

@dataclass(frozen=True)
class DoctorReport:
    """What ``reshard doctor`` found and, with ``--repair``, what it did about each finding."""

    control_table: str
    diagnosis: doctors.Diagnosis
    repairs: list[doctors.Repaired] | None  # None: read-only

    @property
    def remaining(self) -> list:
        """Findings still there (notes aside: a paused run is no problem): all of them read-only,
        else those not repaired."""
        if self.repairs is None:
            return [f for f in self.diagnosis.findings if f.kind not in doctor_notes]
        return [r.finding for r in self.repairs if r.outcome != "repaired" and r.finding.kind not in doctor_notes]

    @property
    def healthy(self) -> bool:
        return not self.remaining

    def summary(self) -> str:
        n = len(self.remaining)
        if self.repairs is None:
            return f"{n} finding(s); the command after each fixes it (`--repair` fixes the repairable ones)"
        return f"{n} finding(s) left after --repair; see the lines above"

    def as_dict(self) -> dict:
        d = {"control_table": self.control_table, **self.diagnosis.as_dict(), "healthy": self.healthy}
        if self.repairs is not None:
            d["repairs"] = [r.as_dict() for r in self.repairs]
        return d

    def text(self) -> str:
        d = self.diagnosis
        scanned = ", ".join(f"{t} ({'not scanned' if n is None else f'{n} item(s) scanned'})" for t, n in d.tables.items())
        lines = [f"doctor: control table {self.control_table}: {d.migrations} migration(s), {d.locks} table "
                 f"lock(s); data: {scanned or 'none'}"]
        if self.repairs is None:
            lines += [f"{'NOTE' if f.kind in doctor_notes else 'FOUND'} {f.line()}" for f in d.findings]
        else:
            lines += [r.line() for r in self.repairs]
        lines.append("healthy" if self.healthy else f"{len(self.remaining)} finding(s) remain")
        return "\n".join(lines)


def doctor(store: ControlStore, dynamo: Dynamo, migration_id: str | None = None, *, repair: bool = False,
           wait: float | None = None, data: bool = True, poll: float = 0.5, say: Say = _quiet,
           max_rcu: float | None = None, max_wcu: float | None = None,
           before_write: Callable | None = None) -> DoctorReport:
    """Diagnose (read-only); with ``repair``, fix the repairable findings with conditional writes.
    ``max_rcu`` / ``max_wcu`` pace the data table's Scan and deletes like a job's budget."""
    budget = CapacityBudget(max_wcu, max_rcu).attach(dynamo, "")
    diagnosis = doctors.diagnose(store, dynamo, migration_id, data=data, spend=budget.spend)
    repairs = None
    if repair and diagnosis.findings:
        watched = [f for f in diagnosis.findings if f.repairable and f.ref.get("quiet")]
        if watched:
            longest = max(f.ref["quiet"] for f in watched)
            say(f"watching {len(watched)} lease(s)/heartbeat(s) go quiet (up to "
                f"{longest if wait is None else min(wait, longest):.0f} s) before releasing them")
        repairs = doctors.repair(store, dynamo, diagnosis.findings, wait=wait, poll=poll, before_write=before_write,
                                 spend=budget.spend)
    elif repair:
        repairs = []
    return DoctorReport(store.table, diagnosis, repairs)


# ---------------------------------------------------------------------- throttle, pause, resume

@dataclass(frozen=True)
class Controlled:
    """What ``reshard throttle``, ``pause`` or ``resume`` did: one entry per running job run."""

    migration: str
    action: str
    runs: list[live.Changed]


def control_job(store: ControlStore, migration_id: str, action: str, *, job: str | None = None,
                who: str | None = None, **fields) -> Controlled:
    """Change the live control of every unfinished job run of the migration (or of ``job``'s):
    ``max_wcu``/``max_rcu`` (throttle), ``paused`` and ``release_leases`` (pause, resume). Each
    run is one conditional write (:func:`reshard.control.live.change`); every process of the
    run adopts it at its next budget beat."""
    found = live.targets(store, migration_id, job, action)
    return Controlled(migration_id, action, [live.change(store, migration_id, name, run, action, who=who, **fields)
                                             for name, run in found])


# ---------------------------------------------------------------------- backfill, verify, cleanup

#: The data jobs by name (their JobSpecs; one runner runs them all).
DATA_JOBS = {spec.name: spec for spec in (BACKFILL, VERIFY, CLEANUP, STRIP)}


def run_data_job(job: str, dynamo: Dynamo, store: ControlStore, migration_id: str, options: JobOptions, *,
                 subscribers: Iterable[Subscriber] = (), client: Callable[[], Dynamo] | None = None,
                 say: Say = _quiet, sleep: Callable[[float], None] = time.sleep) -> JobResult:
    """``reshard backfill|verify|cleanup``: run (or join, or resume) the job with this host's workers.

    ``options.processes`` > 1 runs it in that many child processes of this host
    (:mod:`reshard.jobs.processes`), each building its own client with ``client()`` (picklable).

    The cleanup of an aborted migration ends with the retire; shims move to the steady
    state at their next refresh, and one still on the pre-retire version deletes with a
    tombstone (``aborted`` routing) that the pass already went by. So once the fleet
    acknowledged the retire (the second pass's precondition waits for it, up to
    ``options.lease_wait``), nothing writes tombstones any more and a second pass sweeps
    what was left (:attr:`JobResult.sweep`).

    With a server deadline, a pass that removes or marks (cleanup, each sweep, strip) starts
    only once its phase lasted the request horizon on the server's clock; the wait says so
    on ``say`` (the job's own check waits too, silently, for callers that go straight to it).
    """
    if options.processes > 1 and client is None:
        raise ValueError("run_data_job: processes > 1 needs client, the factory each child process calls")
    before = store.load_state(migration_id)
    index_only = not (before.migration().changes_table or job == STRIP_JOB)
    spec = index_spec(DATA_JOBS[job]) if index_only else combined_spec(DATA_JOBS[job])

    def one_pass() -> JobResult:
        if job in (CLEANUP_JOB, STRIP_JOB):
            state = store.load_state(migration_id)
            if job_rule(job).phases and state.phase in job_rule(job).phases:
                horizons.await_before_removal(store, state, job, say=say, sleep=sleep)
        if options.processes > 1:
            return run_processes(job, client, dynamo, store, migration_id, options, subscribers=subscribers,
                                 index_only=index_only)
        return run_job(spec, dynamo, store, migration_id, options, subscribers=subscribers)

    result = one_pass()
    if job == CLEANUP_JOB and result.finished and sweeps_again(before, lambda: store.load_state(migration_id)):
        result = dataclasses.replace(result, sweep=one_pass())
    return result


def sweeps_again(before: MigrationState, after: Callable[[], MigrationState]) -> bool:
    """Whether a finished cleanup pass retired an aborted migration (``before``: the state it
    began on; ``after``: the state now), so a second pass must sweep the tombstones of shims
    still on ``aborted`` (:func:`run_data_job`; the model checker's cleanup calls it too)."""
    return before.phase is Phase.ABORTED and not before.retired and after().retired


def verify_read_only(dynamo: Dynamo, store: ControlStore, migration_id: str, options: JobOptions):
    """``reshard verify --no-record``: the verdict without a write (:func:`reshard.jobs.verify.verify_read_only`)."""
    return verify_jobs.verify_read_only(dynamo, store, migration_id, options, combined=combined_verifier)


def live_shims(store: ControlStore, migration_id: str) -> int:
    """How many shims report for this migration's file (one look of the census: a crashed
    shim's row counts until a --wait watched it silent)."""
    state = store.load_state(migration_id)
    return len(fleet.census(store, migration_id, state.phase_version).live)


def table_item_count(dynamo: Dynamo, store: ControlStore, migration_id: str) -> int | None:
    """The items of the migration's table (a progress bar's total): the count `start --count`
    (or a full-scan start) stored, else DescribeTable's ItemCount (refreshed ~6 h)."""
    stored = item_total(store, migration_id)
    if stored is not None:
        return stored["items"]
    return dynamo.describe_table(store.load_state(migration_id).table).get("ItemCount")


#: Where a job's progress total comes from, asked in order: ``source(dynamo, state) ->
#: (items, "where it comes from")`` or None to pass: the count ``start --count`` (or a
#: full-scan start) stored on the migration, then DescribeTable's ItemCount.
#: :func:`add_total_source` puts another source first.
TotalSource = Callable[[Dynamo, MigrationState], "tuple[int, str] | None"]
TOTAL_SOURCES: list[TotalSource] = []


def add_total_source(source: TotalSource) -> None:
    """Ask ``source`` before the ones already known (a better count goes first)."""
    TOTAL_SOURCES.insert(0, source)


def _item_count_source(dynamo: Dynamo, state: MigrationState) -> tuple[int, str] | None:
    count = int(dynamo.describe_table(state.table).get("ItemCount", 0) or 0)
    if count <= 0:
        return None
    return count, "DescribeTable ItemCount, refreshed about every 6 h"


def _stored_count_source(dynamo: Dynamo, state: MigrationState) -> tuple[int, str] | None:
    raw = state.raw
    if "item_count" not in raw:
        return None
    at = utc_text(float(raw.get("item_count_at", {}).get("N", 0)))
    source = raw.get("item_count_source", {}).get("S", "count")
    return int(raw["item_count"]["N"]), f"{source} stored by `reshard start` at {at}"


TOTAL_SOURCES.extend([_stored_count_source, _item_count_source])


def progress_total(dynamo: Dynamo, state: MigrationState) -> tuple[int | None, str]:
    """The item total progress is measured against, and where it comes from (None: unknown)."""
    for source in TOTAL_SOURCES:
        found = source(dynamo, state)
        if found:
            return found
    return None, "DescribeTable ItemCount is 0 (not refreshed yet, or an empty table)"


def done_items(store: ControlStore, migration_id: str, job: str, run: int) -> int:
    """Items a run's segments already read (what a resumed run starts from)."""
    info = read_run(store, migration_id, job, run)
    if info is None:
        return 0
    totals = sum_counters(segment_records(store, migration_id, job, run, info.total_segments))
    return progress_done(job, totals)


def job_progress_of(run: dict, now: float, total: tuple[int | None, str] | None) -> dict:
    """A recorded run's progress (``status``): items done, rate since the run started, and for a
    run in progress the percent and ETA against ``total`` (:func:`progress_total`)."""
    done = progress_done(run["job"], run["totals"])
    end = run["finished_at"] or now
    items, source = (None, "") if run["finished_at"] or total is None else total
    return Progress(done, items, max(0.0, end - run["started_at"]), total_source=source).as_dict()
