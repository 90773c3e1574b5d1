"""Phase rules: the order, the routing of each phase, and what each transition needs.

Pure domain module. The control plane (``reshard.control.store``) gathers *facts* about a
migration (fleet acknowledgement, backfill and verify results) and asks
:func:`decide` whether a transition may happen; this module never reads anything.

Why every transition waits for the fleet
    Shims cache the phase, so during a transition two *adjacent* phases serve traffic
    at once. Every adjacent pair is designed to be compatible (both write the
    authoritative layout first, version fences order the mirror writes, readers take
    the newest version). Two phases further apart are not: a ``cutover`` shim reads only
    the new layout, a ``planned`` shim writes only the old one. So no transition --
    forward, back, or abort -- starts while a live shim still acts on the phase before
    the current one. That keeps the fleet within two adjacent phases at all times.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum


class Phase(str, Enum):
    PLANNED = "planned"
    DUAL_WRITE = "dual_write"
    DUAL_READ = "dual_read"
    BACKFILL = "backfill"
    CUTOVER = "cutover"
    CLEANUP = "cleanup"
    COMPLETE = "complete"
    ABORTED = "aborted"

    def __str__(self) -> str:  # click and f-strings show the value
        return self.value


ORDER: tuple[Phase, ...] = (Phase.PLANNED, Phase.DUAL_WRITE, Phase.DUAL_READ, Phase.BACKFILL,
                            Phase.CUTOVER, Phase.CLEANUP, Phase.COMPLETE)

#: Phases a migration never leaves.
TERMINAL = frozenset({Phase.COMPLETE, Phase.ABORTED})

#: Phases from which ``abort`` is allowed. From ``cutover`` the new layout is
#: authoritative; an ``aborted`` shim (old only) next to a ``cutover`` shim (new only)
#: could lose an update, so the operator rolls back to ``backfill`` first.
ABORTABLE = frozenset({Phase.PLANNED, Phase.DUAL_WRITE, Phase.DUAL_READ, Phase.BACKFILL})


@dataclass(frozen=True)
class Routing:
    """What a shim does in one phase.

    ``writes``: layouts written, authoritative first (``"old"`` / ``"new"``).
    ``reads``: layouts read; with two, the newest version wins.
    ``tombstones``: deletes leave a versioned marker instead of removing the item,
        because a copy (backfill, a lagging shim's mirror write) or a late request (a
        duplicate, a held first attempt) could otherwise bring the item back.
    ``fenced``: authoritative writes carry a version condition, so versions grow
        monotonically per item, mirror writes can be ordered by them, and a late
        request of an older write never lands over a newer one. Every phase of a
        registered migration is fenced with tombstones; only :data:`STEADY` is not.
    ``hold``: the fleet is switching authority (:data:`SWITCH`): requests wait, and
        never act on either layout, until the switch is over.
    ``catch_up``: the layout (``"old"``/``"new"``) that may hold a newer copy than the
        authoritative one after an authority switch (a mirror that never landed): reads
        read it too (newest wins), and a write first reads its copy and, when it is newer,
        puts it onto the authoritative key (docs/late-writes.md, "Catch-up"). None: no
        such layout.
    """

    writes: tuple[str, ...]
    reads: tuple[str, ...]
    tombstones: bool
    fenced: bool
    hold: bool = False
    catch_up: str | None = None

    @property
    def authoritative(self) -> str:
        return self.writes[0]


ROUTING: dict[Phase, Routing] = {
    Phase.PLANNED: Routing(("old",), ("old",), tombstones=True, fenced=True),
    Phase.DUAL_WRITE: Routing(("old", "new"), ("old",), tombstones=True, fenced=True),
    Phase.DUAL_READ: Routing(("old", "new"), ("old", "new"), tombstones=True, fenced=True),
    Phase.BACKFILL: Routing(("old", "new"), ("old", "new"), tombstones=True, fenced=True),
    Phase.CUTOVER: Routing(("new", "old"), ("new",), tombstones=True, fenced=True),
    # One layout, yet fenced with tombstones (issue 25): a duplicate or a held first attempt
    # of an acknowledged write may land until its horizon, after a later acknowledged write
    # (`_rs_v <> :v` would let it pass) or on the empty key a plain delete left. The full
    # fence and a versioned tombstone leave the server something to compare it with;
    # `reshard cleanup` / strip delete a tombstone only H + 2 s after a scan saw it.
    Phase.CLEANUP: Routing(("new",), ("new",), tombstones=True, fenced=True),
    Phase.COMPLETE: Routing(("new",), ("new",), tombstones=True, fenced=True),
    Phase.ABORTED: Routing(("old",), ("old",), tombstones=True, fenced=True),
}

#: The routing of a shim while the fleet switches authority (backfill <-> cutover):
#: hold every request until the whole fleet is across. See :func:`changes_authority`.
SWITCH = Routing((), (), tombstones=True, fenced=True, hold=True)


def changes_authority(frm: Phase, to: Phase) -> bool:
    """Whether moving ``frm`` -> ``to`` changes the layout written first (old <-> new).

    Two adjacent phases normally serve traffic together while the fleet catches up. For
    these moves that is unsafe: a shim still on ``backfill`` writes the old layout first,
    one already on ``cutover`` the new one, and two read-modify-writes (``ADD``, a
    conditional put) of one item can each succeed on a different authoritative copy. So
    the move goes through a *switch*: the control row first says "switching to ``to``"
    (every shim that sees it holds its requests), and only once every live shim has
    acknowledged that does the row say ``to`` (Vitess's deny-and-drain).
    """
    a, b = ROUTING.get(frm), ROUTING.get(to)
    return bool(a and b and a.writes and b.writes and a.authoritative != b.authoritative)


def routing_of(phase: Phase, switching: bool = False, newer_may_be: str | None = None) -> Routing:
    """The routing of ``phase``; :data:`SWITCH` while the fleet switches authority into it.

    ``newer_may_be`` (the control row's catch-up flag, ``"old"`` after backfill -> cutover,
    ``"new"`` after cutover -> backfill, None once a verify cleared it): when it names a
    layout other than the authoritative one, reads also read that layout (newest wins) and
    writes catch up from it first (:attr:`Routing.catch_up`). The gates of :func:`decide`
    keep a phase that reads one layout from starting while the other may be newer.
    """
    if switching:
        return SWITCH
    r = ROUTING[phase]
    if newer_may_be not in ("old", "new") or not r.writes or newer_may_be == r.authoritative:
        return r
    reads = r.reads if newer_may_be in r.reads else (*r.reads, newer_may_be)
    return replace(r, reads=reads, catch_up=newer_may_be)


#: The shim's routing when no migration is registered for its table at all: boto3's
#: semantics (plain writes, no versions, plain deletes, BatchWriteItem), by decision.
STEADY = Routing(("old",), ("old",), tombstones=False, fenced=False)


class Action(str, Enum):
    ADVANCE = "advance"
    ROLLBACK = "rollback"
    ABORT = "abort"


@dataclass(frozen=True)
class Facts:
    """What the control plane knows when an operator asks for a transition.

    ``lagging``: live shims that have not acknowledged the current phase version
    (their descriptions, for the message). ``live_shims``: how many live shims report
    for the table (``None``: the caller vouched that none is expected, e.g. with
    ``--allow-no-shims``). The rest are the cutover and completion gates; each holds
    ``None`` when satisfied or a sentence saying what is missing and the command that
    provides it.
    """

    lagging: tuple[str, ...] = ()
    live_shims: int | None = None
    backfill_missing: str | None = "the backfill has not run: run `reshard backfill`"
    verify_missing: str | None = "no passing verify: run `reshard verify`"
    cleanup_missing: str | None = "the cleanup pass has not run: run `reshard cleanup`"
    #: A job that may still write (a backfill or verify lease not yet released or quiet
    #: long enough, see :func:`reshard.control.runs.await_no_writers`): cutover waits for it.
    writers: str | None = None
    #: The control row's catch-up flag (:func:`routing_of`): ``"old"``, ``"new"`` or None.
    newer_may_be: str | None = None
    #: The command that lifts it (a passing verify started in this phase version).
    verify_command: str = "reshard verify"


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`: a target phase, or the reasons it is refused."""

    action: Action
    current: Phase
    target: Phase | None
    refusals: tuple[str, ...] = field(default_factory=tuple)

    @property
    def allowed(self) -> bool:
        return self.target is not None and not self.refusals


def next_phase(phase: Phase) -> Phase | None:
    if phase in TERMINAL:
        return None
    return ORDER[ORDER.index(phase) + 1]


def previous_phase(phase: Phase) -> Phase | None:
    if phase in (Phase.PLANNED, Phase.ABORTED) or phase not in ORDER:
        return None
    return ORDER[ORDER.index(phase) - 1]


def target_of(action: Action, phase: Phase) -> tuple[Phase | None, str | None]:
    """The phase an action leads to from ``phase``, or the reason there is none."""
    if action is Action.ADVANCE:
        nxt = next_phase(phase)
        return (nxt, None) if nxt else (None, f"the migration is {phase}; there is no next phase")
    if action is Action.ROLLBACK:
        if phase is Phase.ABORTED:
            return None, "the migration was aborted; start a new migration instead"
        if phase in (Phase.CLEANUP, Phase.COMPLETE):
            return None, (f"rollback is refused in {phase}: cleanup has begun retiring old-layout items, "
                          "so the old layout can no longer be trusted as a source")
        prev = previous_phase(phase)
        return (prev, None) if prev else (None, "the migration is planned; there is nothing to roll back "
                                                "(use `reshard abort` to drop it)")
    if action is Action.ABORT:
        if phase in ABORTABLE:
            return Phase.ABORTED, None
        if phase is Phase.CUTOVER:
            return None, ("abort is refused in cutover: the new layout is authoritative; run `reshard rollback` "
                          "to return to backfill first, then abort")
        if phase is Phase.ABORTED:
            return None, "the migration is already aborted"
        return None, f"abort is refused in {phase}: cleanup has begun retiring old-layout items"
    raise ValueError(action)


@dataclass(frozen=True)
class Precondition:
    """One thing a transition needs, and its state now (``advance --dry-run`` lists them all).

    ``ok``: satisfied. ``state``: what was found (when not ok: the refusal sentence).
    ``clears_by_waiting``: not ok only for now -- the fleet has not acknowledged yet, or a
    job's lease is still held -- so ``reshard wait`` (or ``--wait``) may clear it.
    """

    what: str
    ok: bool
    state: str
    clears_by_waiting: bool = False


def preconditions(action: Action, phase: Phase, facts: Facts) -> tuple[Phase | None, tuple[Precondition, ...]]:
    """The phase ``action`` leads to from ``phase`` (None: none) and every precondition with its state.

    :func:`decide` refuses exactly the ones that are not ok, with their ``state`` as the reason.
    """
    target, why_not = target_of(action, phase)
    if target is None:
        return None, (Precondition(f"{action.value} is possible from {phase}", False, why_not),)
    out: list[Precondition] = []
    if facts.live_shims == 0:
        # Fail closed: an empty census also describes an application whose shims report to
        # another control table (a typo), or that does not use the shim at all.
        out.append(Precondition("live shims report for the table", False,
                                "no live shim reports for this table: deploy the application with the shim (same "
                                "control table) first; if nothing writes the table, pass --allow-no-shims"))
    else:
        out.append(Precondition("live shims report for the table", True,
                                "not counted: --allow-no-shims vouches that nothing writes the table"
                                if facts.live_shims is None else f"{facts.live_shims} live shim(s)"))
    if facts.lagging:
        shown = ", ".join(facts.lagging[:5]) + (f" and {len(facts.lagging) - 5} more" if len(facts.lagging) > 5 else "")
        out.append(Precondition(
            f"every live shim acknowledged {phase}", False,
            f"{len(facts.lagging)} live shim(s) have not acknowledged {phase} yet: {shown} "
            f"(`reshard wait` waits for them and moves nothing, or `reshard {action.value} --wait SECONDS`; see "
            "`reshard status`; a shim that is gone counts until a wait has watched its heartbeat stay unchanged "
            "for its liveness window + its longest request, about 65 s by default, and then removes it)",
            clears_by_waiting=True))
    else:
        out.append(Precondition(f"every live shim acknowledged {phase}", True, "yes"))
    if action is Action.ADVANCE and target is Phase.CUTOVER:
        out.append(Precondition("the backfill finished", facts.backfill_missing is None,
                                facts.backfill_missing or "yes"))
        out.append(Precondition("a passing verify started after the backfill finished", facts.verify_missing is None,
                                facts.verify_missing or "yes"))
        out.append(Precondition("no backfill or verify worker can still write", facts.writers is None,
                                facts.writers or "yes", clears_by_waiting=True))
    if action is Action.ADVANCE and target is Phase.COMPLETE:
        out.append(Precondition("the cleanup pass finished", facts.cleanup_missing is None,
                                facts.cleanup_missing or "yes"))
    catch_up = catch_up_refusal(target, facts.newer_may_be, facts.verify_command)
    if facts.newer_may_be is not None:
        out.append(Precondition(f"nothing only the {facts.newer_may_be} layout holds is lost (the catch-up verify "
                                "after the authority switch)", catch_up is None, catch_up or "yes"))
    return target, tuple(out)


def decide(action: Action, phase: Phase, facts: Facts) -> Decision:
    """Whether ``action`` may move a migration out of ``phase``, given ``facts``."""
    target, checks = preconditions(action, phase, facts)
    return Decision(action, phase, target, tuple(c.state for c in checks if not c.ok))


def catch_up_refusal(target: Phase, newer_may_be: str | None, verify_command: str = "reshard verify") -> str | None:
    """Why a move into ``target`` must wait for the catch-up verify, or None.

    After an authority switch the layout that was authoritative before may hold a write
    whose mirror never landed (``newer_may_be``). A phase that reads only the other layout
    would no longer see it: ``cleanup`` (and on) reads only new, so it waits while old may
    be newer; ``aborted``, ``dual_write`` and ``planned`` read only old, so they wait while
    new may be newer. A verify that started in this phase version and passed (its repairs
    copy the newer copy over the older, in both directions) lifts the flag.
    """
    reads_only = {Phase.CLEANUP: "new", Phase.COMPLETE: "new", Phase.ABORTED: "old",
                  Phase.DUAL_WRITE: "old", Phase.PLANNED: "old"}.get(target)
    if reads_only is None or newer_may_be not in ("old", "new") or newer_may_be == reads_only:
        return None
    return (f"the {newer_may_be} layout may hold writes the {reads_only} layout lacks (a mirror lost across the "
            f"authority switch), and {target} reads only the {reads_only} layout: run `{verify_command}` (with "
            "--repair if it finds differences) until a run started in this phase passes, then retry")


#: The data jobs, by name (run records, leases and status use these names).
BACKFILL_JOB, VERIFY_JOB, CLEANUP_JOB = "backfill", "verify", "cleanup"
#: ``reshard cleanup --strip-bookkeeping``: remove ``_rs_v``/``_rs_new``/``_rs_src`` after ``complete``.
STRIP_JOB = "strip-bookkeeping"


@dataclass(frozen=True)
class JobRule:
    """Where a data job may run, and why there (the reason goes into the refusal)."""

    phases: tuple[Phase, ...]
    why: str


#: The one phase -> job table. Every job also needs the whole live fleet to have
#: acknowledged the phase (a shim one phase behind may not write what the job races).
JOB_RULES: dict[str, JobRule] = {
    BACKFILL_JOB: JobRule((Phase.BACKFILL,), "the shims must dual-write before the copy races them; "
                                            "`reshard advance` gets there"),
    VERIFY_JOB: JobRule((Phase.BACKFILL, Phase.CUTOVER), "it compares the layouts the backfill filled"),
    # --repair copies the newer copy over the older (version-fenced), in either direction:
    # the catch-up after a switch (newer_may_be) needs it on both sides of the switch.
    f"{VERIFY_JOB} --repair": JobRule((Phase.BACKFILL, Phase.CUTOVER),
                                      "--repair copies the newer copy over the older, which needs both layouts "
                                      "written (backfill and cutover)"),
    CLEANUP_JOB: JobRule((Phase.CLEANUP, Phase.ABORTED), "old items may be retired only once no shim reads them, "
                                                         "and new copies removed only once a migration is aborted"),
    # complete: one layout, read without "newest wins", so the bookkeeping can go -- each
    # page's REMOVEs and tombstone deletes H + 2 s after the scan that saw them, when every
    # write older than the scan has expired (complete-phase shims still fence against
    # `_rs_v` and write tombstones: see reshard.jobs.strip).
    STRIP_JOB: JobRule((Phase.COMPLETE,), "the versions and markers fence writes and tell the layouts apart "
                                          "until the migration is complete"),
}


def job_rule(job: str, repair: bool = False) -> JobRule:
    """The rule of ``job`` (``repair``: the verify that writes)."""
    return JOB_RULES[f"{job} --repair" if repair and job == VERIFY_JOB else job]


def jobs_allowed(phase: Phase) -> dict[str, bool]:
    """Which data jobs may run in a phase (they also need the fleet's acknowledgement)."""
    return {job: phase in JOB_RULES[job].phases for job in (BACKFILL_JOB, VERIFY_JOB, CLEANUP_JOB)}
