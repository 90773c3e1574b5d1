"""The segment engine: a job split into parallel-scan segments, each a lease in the control table.

Backfill, verify and cleanup all walk a table with a parallel Scan (``TotalSegments``)
and must survive kills, share the work between any number of hosts, and never redo a
finished segment. This module does that part once; a job supplies only a *page
function* that processes one page of one segment and returns counters.

Control-table records (partition ``M#<migration id>``, see :mod:`reshard.control.records`)::

    R#<job>#<run:06d>                 the run: total_segments, started_at/by, finished_at,
                                      totals (set once, by whoever finishes the last segment)
    J#<job>#<run:06d>#<segment:05d>   one segment's lease and checkpoint:
        owner            worker holding the lease ("-" when free)
        lease_expires    the holder's wall-clock guess of its expiry: shown by status only
        lease_counter    bumped by every claim and every renewal: the fencing token
                         (KCL's lease counter); observers time how long it stays unchanged
        lease_seconds, max_request_seconds   the holder's lease length and longest request
                         in flight, so observers judge its lease by its own numbers
        checkpoint       JSON of the scan's LastEvaluatedKey (wire format); absent at start
        counters         map of job counters, cumulative, as of the checkpoint
        done / failed    terminal flags; attempts, last_error, failed_by (invocation id)
        takeovers        claims that found an unreleased lease (its page is redone)
        last_throttle    the latest budget decision's reason

Lease protocol (KCL-style)
    *Claim*: read the segment records (one Query), decide locally with the pure
    :func:`reshard.core.leases.lease_decision`, then compare-and-set on ``lease_counter`` (or
    ``attribute_not_exists`` for a segment nobody touched). Of two workers that saw the
    same record, exactly one write matches; the loser just picks another segment. A
    held lease is expired for a claimant once its (owner, lease_counter) token has not
    changed for the holder's lease length *on the claimant's monotonic clock*
    (:class:`reshard.core.leases.LeaseWatch`): no two hosts' clocks are compared.
    *Checkpoint*: a write conditioned on ``owner = me AND lease_counter = my token``;
    it stores the page's LastEvaluatedKey and counters *and* renews the lease (bumping
    the counter, which observers see). If the condition fails, someone took the lease
    over (ours expired): :class:`LeaseLost` stops the worker on that segment at once,
    before it touches another page.
    *Time fence*: immediately before each data write request (after any budget sleep,
    and again before every retry of it), :meth:`PageContext.write_guard` checks the local
    deadline -- the last successful claim or renewal (its monotonic send time) + lease -
    the longest request in flight -- and then renews the lease if due. Past the deadline
    the worker sends nothing more, not even a renewal (:class:`LeaseDeadline`): whatever
    it sent before lands before any observer can call the lease expired. ("Longest
    request in flight" covers the data and the control-table client: one attempt's
    connect + read timeout, since every attempt is guarded.)
    *Done*: the same condition, plus ``done = true``; a done segment is never claimed
    again. *Failure*: a page function that raises after the choke point's retries
    releases the lease with the error and an attempt count; after ``max_attempts`` in
    one invocation the segment is marked ``failed`` (shown by status, exit 1) and the
    next invocation (another ``failed_by``) retries it.

A join segment (``join=True``, verify)
    The run's last segment is claimed only once every other segment is done (verify joins
    there what its scan segments recorded). A worker with nothing claimable but the join
    waits like any worker (polls, or returns when the rest is its own process's); a scan
    segment failed for good in this invocation leaves the join unclaimed here.

Why a kill redoes at most one page
    The checkpoint is written only after the page function returned, i.e. after all
    of that page's writes are durable. A worker killed anywhere leaves the checkpoint
    of the previous page; whoever takes the lease over resumes from it.

Same-host dead workers
    Owners are ``host:pid:invocation:worker``. A lease held by a process of *this*
    host whose pid is gone is taken over at once (a dead process writes nothing), so
    re-running after a crash does not wait for the lease to expire. Anything else
    waits for expiry.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from reshard import errors
from reshard.control.records import RunInfo, run_sk, segment_sk
from reshard.control.runs import read_run, segment_records, sum_counters
from reshard.control.store import ControlStore
from reshard.core.decode import MAX_LEASE_SECONDS, MAX_REQUEST_SECONDS, check_bound
from reshard.core.leases import ASSUMED_MAX_REQUEST_SECONDS, FREE, LeaseDecision, LeaseWatch, SegmentRecord, lease_decision
from reshard.core.wire import N, S, dump_key
from reshard.jobs.subscribers import Fanout, Subscriber
DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_MAX_ATTEMPTS = 3
#: The choke point's default connect + read timeout (:attr:`Dynamo.attempt_seconds`).
DEFAULT_MAX_REQUEST_SECONDS = ASSUMED_MAX_REQUEST_SECONDS


def _local_pid(owner: str, host: str | None = None) -> int | None:
    """The pid of ``owner`` (``host:pid:...``) when it is a process of this host, else None."""
    parts = owner.split(":")
    if len(parts) < 2 or parts[0] != (host or socket.gethostname()):
        return None
    try:
        return int(parts[1])
    except ValueError:
        return None


def same_host_alive(owner: str, host: str | None = None) -> bool:
    """True when ``owner`` is a process of this host that still exists (ours, or a sibling)."""
    pid = _local_pid(owner, host)
    return pid is not None and (pid == os.getpid() or not same_host_dead(owner, host))


def same_host_dead(owner: str, host: str | None = None) -> bool:
    """True when ``owner`` is a process of this host that no longer exists."""
    pid = _local_pid(owner, host)
    if pid is None or pid == os.getpid():
        return False  # another host's, or our own process: its threads release their leases themselves
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --------------------------------------------------------------------------- engine

class LeaseLost(Exception):
    """Our lease on a segment was taken over (it expired); stop working on it now."""


class LeaseDeadline(LeaseLost):
    """Our lease may have expired by now (the local deadline passed): send no further write."""


class Paused(LeaseLost):
    """The run was paused with ``--release-leases`` (or stopped, or its phase moved, while
    paused) before a data write: the page in flight sends nothing more and its lease is
    released; whoever claims it after ``reshard resume`` redoes the page from the checkpoint."""


#: How often a held worker looks whether the run was resumed (its own process's state: no request).
HOLD_POLL_SECONDS = 0.1
#: How often a held worker tells its subscribers why it waits (the progress line says it).
HOLD_SAY_SECONDS = 1.0


@dataclass
class Lease:
    """A held segment lease: the fencing token and the renewal bookkeeping (monotonic clock)."""

    segment: int
    owner: str
    token: int
    renewed_at: float            # monotonic time the last successful claim/renewal was sent
    lease_seconds: float
    max_request_seconds: float
    attempts: int = 0  # failed attempts so far in this invocation's count

    @property
    def deadline(self) -> float:
        """After this (monotonic) time the worker sends no data write: one sent before it
        lands within ``max_request_seconds``, i.e. before any observer calls the lease expired."""
        return self.renewed_at + self.lease_seconds - self.max_request_seconds

    @property
    def renew_due(self) -> float:
        return self.renewed_at + (self.lease_seconds - self.max_request_seconds) / 2


@dataclass
class RunResult:
    """What an invocation of a job ended with."""

    run: RunInfo
    segments: list[SegmentRecord]
    worked: list[int]            # segments this invocation completed
    elapsed: float
    stopped: bool = False        # interrupted (SIGINT/SIGTERM, or the guard): leases released
    stop_reason: str = ""        # why the guard stopped it, if it did

    @property
    def done(self) -> bool:
        return all(r.done for r in self.segments)

    @property
    def failed(self) -> list[SegmentRecord]:
        return [r for r in self.segments if not r.done and r.failed]

    @property
    def totals(self) -> dict:
        return sum_counters(self.segments)


class PageContext:
    """Handed to the page function: the lease (renew it before long writes) and the segment."""

    def __init__(self, engine: "SegmentEngine", lease: Lease, total: int):
        self._engine = engine
        self.lease = lease
        self.segment = lease.segment
        self.total_segments = total

    def now(self) -> float:
        """The engine's monotonic clock (the one the lease deadline is on)."""
        return self._engine.monotonic()

    def ensure_lease(self) -> None:
        """Renew the lease if it is past half its time; raises LeaseLost if it was taken."""
        self._engine._renew_if_due(self.lease)

    def check_deadline(self) -> None:
        """Raise :class:`LeaseDeadline` once the local deadline passed (our lease may have expired)."""
        now = self._engine.monotonic()
        if now >= self.lease.deadline:
            raise LeaseDeadline(f"segment {self.segment}: the lease deadline passed {now - self.lease.deadline:.1f}s "
                                "ago (the lease may have expired): no further write")

    def write_guard(self) -> None:
        """Immediately before each data write request (pass it as ``guard=`` to
        :meth:`Dynamo.call`): a pause holds here (the lease renewed meanwhile), then the time
        fence, then a renewal if due (never past the deadline)."""
        self._engine.hold_here(self.lease, in_page=True)
        self.check_deadline()
        self.ensure_lease()

    @property
    def stopping(self) -> bool:
        """The job is stopping (Ctrl-C, SIGTERM): a page that waits should give up."""
        return self._engine.stop_event.is_set()

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` for the page (verify's settle window), cut short by a stop: then
        raise :class:`~reshard.errors.JobStopped` (the page is abandoned, never checkpointed)."""
        self._engine.pause(seconds)
        if self.stopping:
            raise errors.JobStopped("the job is stopping: the page in flight is abandoned")

    def waiting(self, what: str) -> None:
        """Say what this page waits for (the progress reporter shows it, at least every 10 s)."""
        self._engine.subs.on_wait(self.segment, what)


#: The longest one sleep of a settle wait: between two, the page says what it waits for and
#: notices a stop (Ctrl-C). The looks (a consistent read of the suspects) keep their own pace.
SETTLE_SLICE_SECONDS = 2.0


def settle_text(items: int, example: str, window: float, left: float) -> str:
    """What a page waiting for the settle window says (the progress line shows it)."""
    return (f"settle window: {max(0.0, left):.0f}s left of {window:g}s for {items} item(s) seen differing "
            f"(e.g. {example}), reported only if unchanged that long (the longest a shim write may still land; "
            "--settle-seconds overrides)")


def settle_wait(ctx, sleep: Callable[[float], None], at: float,
                what: Callable[[float], str] | None = None) -> None:
    """Sleep towards ``at`` on the engine's monotonic clock, never past the lease's renewal
    point (renewed here when due; a lease taken over raises, the page is redone). Returns
    when ``at`` (or the renewal point) is reached: the caller looks again (a look is cheap).

    With the real ``time.sleep``, in slices of :data:`SETTLE_SLICE_SECONDS`: before each,
    ``what(now)`` is said (``ctx.waiting``: the reporter shows it at least every 10 s), and
    a stop (Ctrl-C) raises :class:`~reshard.errors.JobStopped` (the page is abandoned, not
    checkpointed). An injected ``sleep`` (tests driving a clock) is called once, as is.
    """
    ctx.ensure_lease()
    now = ctx.now()
    step = at - now
    if ctx.lease.renew_due > now:
        step = min(step, ctx.lease.renew_due - now)
    if step <= 0:
        return
    pause = getattr(ctx, "pause", None)
    if sleep is not time.sleep or pause is None:
        sleep(step)
        return
    end = now + step
    while (left := end - ctx.now()) > 0:
        if what is not None and hasattr(ctx, "waiting"):
            ctx.waiting(what(ctx.now()))
        pause(min(left, SETTLE_SLICE_SECONDS))


#: ``page(ctx, start_key) -> (counts, next_key)``: process one page durably.
PageFn = Callable[[PageContext, dict | None], "tuple[dict, dict | None]"]


class SegmentEngine:
    """Runs one job run's segments with ``workers`` threads on this host.

    ``clock`` (wall seconds, only for what status shows), ``monotonic`` (lease
    observation and the local write deadline; defaults to ``time.monotonic``, or to an
    injected ``clock``, which tests drive) and ``sleep`` are injectable for tests.
    ``max_request_seconds``: the longest a data write request can be in flight after its
    guard (:attr:`Dynamo.attempt_seconds`). ``throttle_reason`` returns the budget's
    latest decision so checkpoints carry it to ``status``.
    """

    def __init__(self, store: ControlStore, migration_id: str, job: str, run: int, total_segments: int,
                 page: PageFn, *, workers: int | None = None, lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] | None = None,
                 max_request_seconds: float = DEFAULT_MAX_REQUEST_SECONDS,
                 sleep: Callable[[float], None] = time.sleep, subscribers: Iterable[Subscriber] = (),
                 poll_seconds: float | None = None, throttle_reason: Callable[[], str] = lambda: "",
                 invocation: str | None = None, host: str | None = None,
                 is_dead: Callable[[str], bool] | None = None,
                 guard: Callable[[], str | None] | None = None, join: bool = False,
                 idle_wait: Callable[[float], None] | None = None, phase_version: int | None = None,
                 hold: Callable[[], object | None] | None = None):
        self.store = store
        #: The migration's phase version the run is started in (recorded on a new run: verify's
        #: catch-up flag is cleared only by a run that started in the current version).
        self.phase_version = phase_version
        #: ``hold() -> Hold | None``: the run is paused (``reshard pause``; the budget membership
        #: reads it at every beat). Workers send no data write and claim nothing while it is set.
        self.hold = hold
        #: The last segment is a join: claimed only once every other segment is done.
        self.join = join
        #: A worker of this engine saw the run stamped finished (it did it, or found it done).
        self._run_stamped = False
        #: Checked before every page: a reason to stop (e.g. the phase moved on), or None.
        self.guard = guard
        self.stop_reason = ""
        self.pk = store.jpk(migration_id, job)
        self.migration_id = migration_id
        self.job = job
        self.run = run
        self.total = total_segments
        self.page = page
        self.workers = max(1, workers or min(total_segments, 4))
        if lease_seconds <= max_request_seconds:
            raise errors.BadInput(
                f"--lease-seconds {lease_seconds:g} must exceed the longest a request can be in flight "
                f"({max_request_seconds:g}s: connect + read timeout), or a worker could never write safely; "
                f"use at least {2 * max_request_seconds:g}")
        # Observers clamp what a segment row says to these bounds (reshard.core.decode): a
        # lease or request bound above them would be judged shorter than it is.
        check_bound("--lease-seconds", lease_seconds, MAX_LEASE_SECONDS, "use a shorter lease")
        check_bound("the longest request (connect + read timeout)", max_request_seconds, MAX_REQUEST_SECONDS,
                    "use shorter timeouts")
        self.lease_seconds = lease_seconds
        self.max_request_seconds = max_request_seconds
        self.max_attempts = max_attempts
        self.clock = clock
        self.monotonic = monotonic or (time.monotonic if clock is time.time else clock)
        self._watch = LeaseWatch()
        self.sleep = sleep
        #: How an idle worker waits for its siblings (at most a poll interval): ``sleep``, or a
        #: wait that a --processes parent cuts short when a sibling process's segment ended.
        self.idle_wait = idle_wait or sleep
        self.subs = Fanout(subscribers)
        self.poll_seconds = poll_seconds if poll_seconds is not None else min(2.0, lease_seconds / 4)
        self.throttle_reason = throttle_reason
        self.host = host or socket.gethostname()
        self.invocation = invocation or os.urandom(3).hex()
        self.is_dead = is_dead or (lambda owner: same_host_dead(owner, self.host))
        self.stop_event = threading.Event()
        #: Called once when the run is stopped (Ctrl-C, SIGTERM): the runner stops the budget's
        #: sleeps there, so no worker waits out a low budget before it releases its lease.
        self.stop_hooks: list[Callable[[], None]] = []
        #: Segments this host could not claim, why (a lease held elsewhere): what an idle worker waits for.
        self._held: dict[int, tuple[str, float, float]] = {}
        self._worked: list[int] = []
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    # ---------------------------------------------------------------- run record
    def start_run(self) -> RunInfo:
        """Create the run record, or join the started run; refuse a different segment count."""
        now = self.clock()
        try:
            # Conditional: the first process creates the run; everyone else joins it.
            row = {"pk": S(self.pk), "sk": S(run_sk(self.job, self.run)), "job": S(self.job),
                   "run": N(self.run), "total_segments": N(self.total), "started_at": N(now),
                   "started_by": S(self._owner_prefix())}
            if self.phase_version is not None:
                row["phase_version"] = N(self.phase_version)
            self.store.put(row, condition="attribute_not_exists(pk)")
        except errors.ConditionalCheckFailed:
            pass
        info = read_run(self.store, self.migration_id, self.job, self.run)
        if info is None:  # pragma: no cover - we just wrote it
            raise errors.AWSError("put_item", "Missing", "run record vanished")
        if info.total_segments != self.total:
            raise errors.BadInput(
                f"{self.job} run {self.run} of {self.migration_id!r} was started with --segments "
                f"{info.total_segments - self.join}; a scan split differently would skip or repeat items. "
                f"Re-run with --segments {info.total_segments - self.join}")
        return info

    def _owner_prefix(self) -> str:
        return f"{self.host}:{os.getpid()}:{self.invocation}"

    # ---------------------------------------------------------------- reads
    def records(self) -> list[SegmentRecord]:
        return segment_records(self.store, self.migration_id, self.job, self.run, self.total)

    # ---------------------------------------------------------------- lease writes
    def claim(self, rec: SegmentRecord, me: str) -> tuple[Lease, SegmentRecord, LeaseDecision] | None:
        """Try to take ``rec``'s lease. None if another worker won the race or it is not claimable."""
        # How long this host has seen the lease's token unchanged, on its own monotonic clock.
        with self._lock:
            unchanged = self._watch.observe(rec.segment, rec.token, self.monotonic())
        d = lease_decision(rec, me=me, invocation=self.invocation, unchanged_for=unchanged,
                           lease_seconds=self.lease_seconds, is_dead=self.is_dead)
        with self._lock:
            # What an idle worker waits for: a lease nobody on this host is known to keep alive
            # (another process of this host that still exists is working on it: not a wait).
            if not d.claim and rec.held and not same_host_alive(rec.owner, self.host):
                self._held[rec.segment] = (rec.owner, unchanged, rec.holder_lease_seconds(self.lease_seconds))
            else:
                self._held.pop(rec.segment, None)
        if not d.claim:
            return None
        sent = self.monotonic()  # before sending: the deadline counts from here, never from a later moment
        now = self.clock()
        values = {":me": S(me), ":exp": N(now + self.lease_seconds), ":one": N(1), ":zero": N(0),
                  ":f": {"BOOL": False}, ":job": S(self.job), ":run": N(self.run), ":seg": N(rec.segment),
                  ":tk": N(1 if d.takeover else 0), ":ls": N(self.lease_seconds), ":mr": N(self.max_request_seconds)}
        sets = ["#owner = :me", "lease_expires = :exp", "lease_counter = if_not_exists(lease_counter, :zero) + :one",
                "done = if_not_exists(done, :f)", "job = :job", "run = :run", "#seg = :seg",
                "takeovers = if_not_exists(takeovers, :zero) + :tk", "lease_seconds = :ls",
                "max_request_seconds = :mr"]
        if rec.failed:
            # A segment failed by an earlier invocation gets a fresh set of attempts.
            sets += ["failed = :f", "attempts = :zero"]
        if rec.exists:
            # Compare-and-set on the counter we read: whoever claimed or renewed since
            # then bumped it, and our decision is stale.
            condition = "lease_counter = :seen AND done = :f"
            values[":seen"] = N(rec.lease_counter)
        else:
            condition = "attribute_not_exists(pk)"
        sk = segment_sk(self.job, self.run, rec.segment)
        try:
            new = self.store.update(self.pk, sk, "SET " + ", ".join(sets), condition=condition,
                                    names={"#owner": "owner", "#seg": "segment"}, values=values, return_new=True)
        except errors.ConditionalCheckFailed:
            # Our own claim, landed with its answer lost (the resend failed on it), is no other
            # worker's: left unclaimed, the segment would be leased to this worker, which gave it up.
            ours = {"owner": values[":me"], "lease_expires": values[":exp"],
                    "lease_counter": N(rec.lease_counter + 1)}  # 0 + 1 for a new record
            if not self.store.landed(self.pk, sk, ours):
                return None
            new = self.store.get(self.pk, sk)
        fresh = SegmentRecord.from_item(rec.segment, new)
        lease = Lease(rec.segment, me, fresh.lease_counter, sent, self.lease_seconds, self.max_request_seconds,
                      fresh.attempts)
        return lease, fresh, d

    def _fenced_update(self, lease: Lease, sets: list[str], values: dict, names: dict | None = None,
                       renew: bool = False) -> None:
        """An update of our segment that only the current lease holder can make.

        ``renew``: it also renews the lease -- bumps ``lease_counter`` (observers see the
        holder is alive) and moves the local deadline to this request's send time.
        """
        values = dict(values)
        values.update({":me": S(lease.owner), ":tok": N(lease.token)})
        names = dict(names or {})
        names["#owner"] = "owner"
        sets = list(sets)
        sent = self.monotonic()
        if renew:
            if sent >= lease.deadline:
                # Never renew past the deadline: an observer may already have judged the lease
                # quiet (a gate opened, or a takeover is under way). The page is redone.
                raise LeaseDeadline(f"segment {lease.segment}: the lease deadline passed before its renewal")
            sets.append("lease_counter = lease_counter + :bump")
            values[":bump"] = N(1)
        def before_each_attempt() -> None:
            # A renewal (and each retry of it) is sent only before the deadline, so it lands
            # within the longest request after it -- before any observer can judge the lease
            # quiet. One landing later would re-arm a worker a gate already counted out.
            if renew and self.monotonic() >= lease.deadline:
                raise LeaseDeadline(f"segment {lease.segment}: the lease deadline passed during its renewal")

        try:
            # Fencing: owner AND token. A worker whose lease was taken over (even by
            # itself, after a restart with the same owner id) fails here and stops.
            self.store.update(self.pk, segment_sk(self.job, self.run, lease.segment), "SET " + ", ".join(sets),
                              condition="#owner = :me AND lease_counter = :tok", names=names, values=values,
                              guard=before_each_attempt if renew else None)
        except errors.ConditionalCheckFailed:
            if not (renew and self._renewal_landed(lease)):
                raise LeaseLost(f"segment {lease.segment}: lease taken over") from None
        if renew:
            lease.token += 1
            lease.renewed_at = sent

    def _renewal_landed(self, lease: Lease) -> bool:
        """A renewal whose first attempt was applied but answered too late (the choke point
        retried it, and the retry's condition saw our own bump): the lease is still ours."""
        rec = SegmentRecord.from_item(lease.segment, self.store.get(self.pk, segment_sk(self.job, self.run,
                                                                                        lease.segment)))
        return rec.owner == lease.owner and rec.lease_counter == lease.token + 1 and not rec.done

    def checkpoint(self, lease: Lease, next_key: dict, counters: dict) -> bool:
        """Save the position after a durable page and renew the lease; False if it was given up.

        Past the local deadline the lease is not renewed (an observer may have judged it
        quiet already): the position is saved and the lease released in one fenced write,
        so the page is not redone, and the worker claims afresh (a new token, and a fresh
        look at the phase) before it writes again.
        """
        now = self.clock()
        sets = ["checkpoint = :cp", "counters = :c", "last_throttle = :thr", "updated_at = :now"]
        values = {":cp": S(dump_key(next_key)), ":c": _counters_av(counters), ":thr": S(self.throttle_reason() or ""),
                  ":now": N(now)}
        if self.monotonic() >= lease.deadline:
            self._fenced_update(lease, sets + ["#owner = :free", "lease_expires = :zero"],
                                {**values, ":free": S(FREE), ":zero": N(0)})
            return False
        self._fenced_update(lease, sets + ["lease_expires = :exp"], {**values, ":exp": N(now + self.lease_seconds)},
                            renew=True)
        return True

    def _renew_if_due(self, lease: Lease) -> None:
        if self.monotonic() < lease.renew_due:
            return
        self._fenced_update(lease, ["lease_expires = :exp"], {":exp": N(self.clock() + self.lease_seconds)},
                            renew=True)

    def finish_segment(self, lease: Lease, counters: dict) -> None:
        now = self.clock()
        self._fenced_update(lease, ["done = :t", "counters = :c", "#owner = :free", "lease_expires = :zero",
                                    "finished_at = :now", "last_throttle = :thr", "last_error = :none"],
                            {":t": {"BOOL": True}, ":c": _counters_av(counters), ":free": S(FREE),
                             ":zero": N(0), ":now": N(now), ":thr": S(self.throttle_reason() or ""),
                             ":none": S("")})

    def release(self, lease: Lease, error: str | None = None) -> SegmentRecord | None:
        """Give the lease back (after an error or a stop); count the attempt if it failed.

        The attempt count and the ``failed`` flag are set in the same fenced write as
        the release, so no other worker can claim the segment in between.
        """
        values = {":free": S(FREE), ":zero": N(0)}
        sets = ["#owner = :free", "lease_expires = :zero"]
        if error is not None:
            attempts = lease.attempts + 1
            values.update({":err": S(error[:1000]), ":n": N(attempts)})
            sets += ["last_error = :err", "attempts = :n"]
            if attempts >= self.max_attempts:
                values.update({":t": {"BOOL": True}, ":inv": S(self.invocation)})
                sets += ["failed = :t", "failed_by = :inv"]
        try:
            self._fenced_update(lease, sets, values)
        except LeaseLost:
            return None
        return SegmentRecord.from_item(lease.segment, self.store.get(self.pk, segment_sk(self.job, self.run,
                                                                                         lease.segment)))

    def _maybe_finish_run(self) -> None:
        recs = self.records()
        if not all(r.done for r in recs):
            return
        totals = sum_counters(recs)
        try:
            # Once: the first worker to see every segment done stamps the run.
            self.store.update(self.pk, run_sk(self.job, self.run), "SET finished_at = :now, totals = :tot",
                              condition="attribute_not_exists(finished_at)",
                              values={":now": N(self.clock()), ":tot": _counters_av(totals)})
        except errors.ConditionalCheckFailed:
            pass
        self._run_stamped = True

    # ---------------------------------------------------------------- a paused run
    def hold_here(self, lease: Lease | None, in_page: bool = False) -> None:
        """Wait here while the run is paused (``reshard pause``): no data write is sent.

        ``lease``: the segment this worker holds (None: between segments). Kept-lease pause: it
        is renewed while held (its token changes, so nobody takes it over and no page is
        redone). ``--release-leases``: raise :class:`Paused` at once; the caller releases it.
        In a page (``in_page``, before one of its writes), a stop or a phase change while held
        raises :class:`Paused` too: the page is redone from its checkpoint by whoever claims it.
        At a page boundary they just end the wait (the caller looks at both next).
        """
        held = self.hold() if self.hold is not None else None
        said = None
        while held is not None:
            if lease is not None and getattr(held, "release_leases", False):
                raise Paused(f"segment {lease.segment}: {held.reason()}")
            if self.stop_event.is_set() or (self.guard is not None and self.guard()):
                if in_page and lease is not None:
                    raise Paused(f"segment {lease.segment}: stopped while paused")
                return
            now = self.monotonic()
            if said is None or now - said >= HOLD_SAY_SECONDS:
                said = now
                self.subs.on_hold(lease.segment if lease else None, held.reason())
            if lease is not None:
                self._renew_if_due(lease)  # a kept lease stays ours for as long as the pause lasts
            self.stop_event.wait(HOLD_POLL_SECONDS)
            held = self.hold()

    # ---------------------------------------------------------------- workers
    def run_all(self) -> RunResult:
        """Work until every segment is done, or failed in this invocation, or we are stopped."""
        start = time.monotonic()
        info = self.start_run()
        self.subs.on_run_start(info)
        # Each worker says it has ended through its own Event. Not Thread.join: a
        # KeyboardInterrupt (Ctrl-C, or SIGTERM via the runner) that lands while join() waits
        # can mark a running thread stopped (CPython 3.11's _wait_for_tstate_lock releases the
        # thread's own lock on the way out), and then the wait below would return at once,
        # the process exit mid-page, and the worker's lease stay held instead of released.
        ended = [threading.Event() for _ in range(self.workers)]

        def work(i: int) -> None:
            try:
                self._worker(i)
            finally:
                ended[i].set()

        threads = [threading.Thread(target=work, args=(i,), name=f"{self.job}-worker-{i}", daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        interrupted = False
        try:
            for e in ended:
                while not e.wait(0.2):
                    pass
        except KeyboardInterrupt:
            # Say so at once; stop the budget's sleeps (a low budget would otherwise keep a
            # worker asleep for its next request); each worker finishes or abandons its page
            # and releases its lease: within a lease, after which it may be gone anyway.
            interrupted = True
            self.subs.on_stopping("stopping: finishing the page in flight, releasing leases")
            self.stop()
            deadline = time.monotonic() + self.lease_seconds
            for e in ended:
                e.wait(max(0.0, deadline - time.monotonic()))
        if self._errors and not interrupted:
            raise self._errors[0]
        # Normally the worker that finished the last segment stamped the run; if that
        # process died in between, whoever sees every segment done does it now (not again
        # when a worker here saw it stamped: that read and failed write was a small verify's
        # last few milliseconds).
        if not self._run_stamped:
            self._maybe_finish_run()
        result = RunResult(read_run(self.store, self.migration_id, self.job, self.run) or info, self.records(),
                           sorted(self._worked), time.monotonic() - start, self.stop_event.is_set(),
                           self.stop_reason)
        self.subs.on_run_done(result)
        if interrupted:
            # Leases released (or left to expire by a worker still in a request): the command
            # ends as interrupted (exit 130), not as a run that stopped by itself.
            raise KeyboardInterrupt
        return result

    def stop(self) -> None:
        """Stop every worker at its next page boundary (or wait), and the stop hooks (the budget)."""
        if self.stop_event.is_set():
            return
        self.stop_event.set()
        for hook in self.stop_hooks:
            hook()

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, cut short by :meth:`stop` (an injected ``sleep`` is called as is)."""
        if self.sleep is time.sleep:
            self.stop_event.wait(seconds)
        else:
            self.sleep(seconds)

    def work_inline(self, index: int = 0) -> list[int]:
        """Join the run and work as one worker on the calling thread (no threads started)
        until nothing is left for it; returns the segments it completed.

        For callers that schedule every DynamoDB call themselves (the model checker in
        ``tests/model`` runs each host as one scheduled actor): ``run_all`` would start
        threads outside that schedule. Raises the worker's error, like ``run_all``.
        """
        self.start_run()
        self._worker(index)
        if self._errors:
            raise self._errors[0]
        return sorted(self._worked)

    def _worker(self, index: int) -> None:
        me = f"{self._owner_prefix()}:{index}"
        rng = random.Random(f"{me}")
        try:
            while not self.stop_event.is_set():
                if self.hold is not None and self.hold() is not None:
                    self.hold_here(None)  # paused: claim nothing until resumed (or stopped)
                    continue
                recs = self.records()
                open_ = [r for r in recs if not r.done and not (r.failed and r.failed_by == self.invocation)]
                ready = open_
                if self.join:
                    last = self.total - 1
                    scans = [r for r in recs if r.segment != last]
                    if any(not r.done and r.failed and r.failed_by == self.invocation for r in scans):
                        open_ = ready = [r for r in open_ if r.segment != last]  # no join in this invocation
                    elif any(not r.done for r in scans):
                        ready = [r for r in open_ if r.segment != last]  # the join waits for every scan
                if not open_:
                    return
                # Start at a different place per worker so workers rarely race for one segment.
                ready = list(ready)
                rng.shuffle(ready)
                claimed = None
                for rec in ready:
                    claimed = self.claim(rec, me)
                    if claimed:
                        break
                if not claimed:
                    mine = f"{self._owner_prefix()}:"
                    # Owners as they are now: a claim lost to a worker of this process that
                    # moved first (two finishing scans racing for the join) is no reason to
                    # sleep a poll interval (it was most of a small verify's wall time).
                    now_ = {r.segment: r for r in self.records()}
                    if any(now_[r.segment].done for r in ready):
                        continue  # one finished meanwhile (at most once per segment): the join may be ready
                    if all(now_[r.segment].owner.startswith(mine) for r in ready):
                        # The rest is in this process's hands (the join too: the worker that
                        # finishes the last scan takes it): its workers finish or release it.
                        return
                    # Some is leased by live workers elsewhere: wait for them to finish, or for
                    # their leases to expire (then we take over). Say which.
                    with self._lock:
                        held = sorted(self._held.items())
                    if held:
                        self.subs.on_wait(None, "; ".join(
                            f"lease of segment {seg} held by {owner}, quiet for {quiet:.0f}s of {lease:.0f}s"
                            for seg, (owner, quiet, lease) in held[:4])
                            + (f" and {len(held) - 4} more" if len(held) > 4 else "")
                            + " (taken over once unchanged for the whole lease; a live holder renews it)")
                    if self.idle_wait is time.sleep:
                        self.stop_event.wait(self.poll_seconds)
                    else:
                        self.idle_wait(self.poll_seconds)
                    continue
                self._work(*claimed)
        except BaseException as e:  # a control-table failure: report it from run_all
            with self._lock:
                self._errors.append(e)
            self.stop_event.set()

    def _work(self, lease: Lease, rec: SegmentRecord, decision: LeaseDecision) -> None:
        if decision.takeover:
            self.subs.on_takeover(rec.segment, rec.owner)
        self.subs.on_segment_start(rec.segment, rec.checkpoint is not None, decision.reason)
        counters = dict(rec.counters)
        key = rec.checkpoint
        ctx = PageContext(self, lease, self.total)
        first = True
        try:
            while True:
                if self.stop_event.is_set():
                    self.release(lease)
                    return
                if self.hold is not None and self.hold() is not None:
                    try:
                        self.hold_here(lease)  # paused at a page boundary: the lease kept and renewed
                    except Paused:
                        self.release(lease)  # --release-leases: checkpoint kept, segment free
                        return
                    continue  # look at the stop and the phase again before the next page
                # The first page after a claim reads the phase afresh: a lease claimed after
                # an abort's cleanup looked for held leases must see the abort before writing.
                why = (getattr(self.guard, "fresh", self.guard)() if first else self.guard()) if self.guard else None
                first = False
                if why:
                    # The job may no longer write (an operator aborted or rolled back): stop
                    # every worker at a page boundary, leases released, checkpoints kept.
                    self.stop_reason = why
                    self.stop_event.set()
                    self.release(lease)
                    return
                try:
                    counts, next_key = self.page(ctx, key)
                except (Paused, errors.JobStopped):
                    # Paused with --release-leases (or stopped while paused) before one of the
                    # page's writes, or stopped mid-page (a budget sleep or a settle wait cut
                    # short): nothing of it is checkpointed or sent any more; the page is redone
                    # after resume or by the next run; not a failed attempt.
                    self.release(lease)
                    return
                except LeaseDeadline:
                    # Nothing more is sent; give the lease back if it is still ours (fenced
                    # on the token, so a lease taken over meanwhile is left alone).
                    self.release(lease)
                    raise
                except LeaseLost:
                    raise
                except Exception as e:  # noqa: BLE001 - any failure releases the segment with its error
                    msg = errors.scrub(f"{type(e).__name__}: {e}")  # stored in the control table, shown by status
                    after = self.release(lease, msg)
                    attempts = after.attempts if after else 0
                    self.subs.on_segment_failed(rec.segment, msg, attempts,
                                                bool(after and after.failed))
                    return
                for k, v in counts.items():
                    counters[k] = counters.get(k, 0) + v
                counters["pages"] = counters.get("pages", 0) + 1
                if next_key is None:
                    self.finish_segment(lease, counters)
                    with self._lock:
                        self._worked.append(rec.segment)
                    self.subs.on_page(rec.segment, counts)
                    self.subs.on_segment_done(rec.segment, counters)
                    self._maybe_finish_run()
                    return
                try:
                    held = self.checkpoint(lease, next_key, counters)
                except LeaseDeadline:  # the deadline passed between the check and the renewal
                    self.release(lease)  # the page is redone by whoever claims it next
                    raise
                self.subs.on_page(rec.segment, counts)
                if not held:
                    return  # saved and released past the deadline: claim afresh before writing again
                key = next_key
        except LeaseLost as e:
            self.subs.on_lease_lost(rec.segment, str(e))


def _counters_av(counters: dict) -> dict:
    return {"M": {k: N(round(v, 3) if isinstance(v, float) else v) for k, v in counters.items()}}
