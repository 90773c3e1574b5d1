"""The budget row of a job run: one ``--max-wcu`` / ``--max-rcu`` for every process and host.

Rows, in the job's partition ``J#<id>#<job>`` (the worker role's, IAM ``LeadingKeys``)::

    B#<job>#<run:06d>             the budget: max_wcu / max_rcu (absent: no budget on that
                                  lane), every member's shares, ``version`` (compare-and-set)
    B#<job>#<run:06d>#<member>    one member's beat: beat counter, liveness_seconds,
                                  request_seconds, host, pid (written by that member only)

The rules (who takes what, when a member is gone) are pure: :mod:`reshard.core.shares`.
Every refresh also reads the run's live-control row (``M#<id>`` / ``C#<job>#<run>``,
:mod:`reshard.control.live`): the operator's ``reshard throttle`` budget replaces the
processes' own ``--max-wcu`` / ``--max-rcu`` on the lanes it sets, and ``reshard pause``
holds the process (:attr:`CapacityBudget.hold`, which the segment engine obeys).
This module reads and writes the rows; every change of the budget row is conditional on
its ``version`` (or on its absence, for the first member), so two members that rebalance
at once never overwrite each other's share: the loser re-reads and decides again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Callable

from reshard import errors
from reshard.control.live import read_control
from reshard.control.records import RunControl, check_row
from reshard.control.store import ControlStore
from reshard.core.decode import MAX_LIVENESS_SECONDS, MAX_REQUEST_SECONDS, seconds
from reshard.core.leases import LeaseWatch
from reshard.core.shares import (DEFAULT_LIVENESS_SECONDS, DEFAULT_REFRESH_SECONDS, LANES, Member, Rebalance, Shares,
                                 rebalance, silence_bound)
from reshard.core.survive import FailureLog, describe
from reshard.core.wire import N, S, get_n, get_s

log = logging.getLogger("reshard.jobs")
#: The row attribute of each lane's total.
TOTAL_ATTR = {"write": "max_wcu", "read": "max_rcu"}


def budget_sk(job: str, run: int) -> str:
    return f"B#{job}#{run:06d}"


def member_prefix(job: str, run: int) -> str:
    return f"{budget_sk(job, run)}#"


def member_sk(job: str, run: int, member: str) -> str:
    return f"{member_prefix(job, run)}{member}"


def read_shares(store: ControlStore, migration_id: str, job: str, run: int) -> Shares | None:
    """The run's budget row (a consistent read), or None when the run has no budget row."""
    item = store.get(store.jpk(migration_id, job), budget_sk(job, run))
    if item is None:
        return None
    check_row(item)
    totals = {lane: (float(get_n(item, attr)) if attr in item else None) for lane, attr in TOTAL_ATTR.items()}
    shares = {m: {lane: float(v["M"][lane]["N"]) for lane in LANES if lane in v.get("M", {})}
              for m, v in item.get("shares", {}).get("M", {}).items()}
    return Shares(totals, shares, int(get_n(item, "version", 0)))


def read_members(store: ControlStore, migration_id: str, job: str, run: int) -> list[Member]:
    """Every member row of the run (live or not: liveness is the reader's judgment)."""
    out = []
    for i in store.query(store.jpk(migration_id, job), member_prefix(job, run)):
        check_row(i)
        # The silence it asks the others to wait out is clamped (reshard.core.decode).
        out.append(Member(get_s(i, "member"), int(get_n(i, "beat", 0)),
                          seconds(get_n(i, "liveness_seconds"), MAX_LIVENESS_SECONDS),
                          seconds(get_n(i, "request_seconds"), MAX_REQUEST_SECONDS), get_s(i, "host", "?"),
                          int(get_n(i, "pid", 0)),
                          frozenset(v["S"] for v in i.get("idle", {}).get("L", []))))
    return out


def member_rows(store: ControlStore, migration_id: str, job: str) -> list[dict]:
    """Every member beat row of every run of ``job`` (the budget rows themselves left out)."""
    rows = store.query(store.jpk(migration_id, job), f"B#{job}#")
    return [i for i in rows if "member" in i]


def beat(store: ControlStore, migration_id: str, job: str, run: int, member: str, count: int,
         liveness_seconds: float, request_seconds: float, host: str | None = None, idle: frozenset = frozenset()) -> None:
    """Write this member's beat (unconditional: a member owns its row; ``count`` must change
    with every call, it is what other members watch; ``idle``: the lanes it has no demand on)."""
    store.put({"pk": S(store.jpk(migration_id, job)), "sk": S(member_sk(job, run, member)), "job": S(job),
               "run": N(run), "member": S(member), "beat": N(count), "liveness_seconds": N(float(liveness_seconds)),
               "request_seconds": N(float(request_seconds)), "host": S(host or socket.gethostname()),
               "pid": N(os.getpid()), "at": N(store.clock()), "idle": {"L": [S(k) for k in sorted(idle)]}})


def forget(store: ControlStore, migration_id: str, job: str, run: int, member: str) -> None:
    """Remove this member's beat row (it left the run)."""
    store.delete(store.jpk(migration_id, job), member_sk(job, run, member))


def reap(store: ControlStore, migration_id: str, job: str, run: int, gone: list[Member]) -> None:
    """Remove the beat rows of members judged gone, each only while its beat is still the one
    judged (a member that beat meanwhile keeps its row, and rejoins with what is free).

    Without this, every process that joins the run later (a re-run after a kill -9) would
    count the dead member live until it had watched its beat for the silence bound itself,
    and meanwhile hold only half the budget; `doctor --repair` was the only way out.
    """
    for m in gone:
        try:
            store.delete(store.jpk(migration_id, job), member_sk(job, run, m.member), condition="#b = :b",
                         names={"#b": "beat"}, values={":b": N(m.beat)})
        except errors.ConditionalCheckFailed:
            pass  # it beat again: alive after all
        except errors.ReshardError:
            break  # an outage: the next refresh tries again


def write_shares(store: ControlStore, migration_id: str, job: str, run: int, row: Shares | None,
                 decided: Rebalance) -> int:
    """Write ``decided`` into the row read as ``row``: compare-and-set on its version.

    Returns the new version. Raises :class:`~reshard.errors.ConditionalCheckFailed` when
    the row changed since it was read (another member rebalanced): re-read and decide again.
    """
    base = row or Shares(decided.totals)
    shares = {m: dict(v) for m, v in base.shares.items() if m not in decided.drop}
    shares[decided.member] = {k: v for k, v in decided.shares.items() if v is not None}
    version = base.version + 1
    item = {"pk": S(store.jpk(migration_id, job)), "sk": S(budget_sk(job, run)), "job": S(job), "run": N(run),
            "version": N(version), "at": N(store.clock()),
            "shares": {"M": {m: {"M": {k: N(v) for k, v in lanes.items()}} for m, lanes in shares.items()}}}
    for lane, attr in TOTAL_ATTR.items():
        if decided.totals.get(lane) is not None:
            item[attr] = N(decided.totals[lane])
    if row is None:
        # The first member creates the row; a second one that raced it re-reads.
        store.put(item, condition="attribute_not_exists(pk)")
    else:
        store.put(item, condition="#v = :v", names={"#v": "version"}, values={":v": N(row.version)})
    return version


def remove_share(store: ControlStore, migration_id: str, job: str, run: int, member: str, attempts: int = 5) -> bool:
    """Take ``member``'s share out of the row (it leaves), so the others grow at their next
    refresh instead of after its liveness window. Conditional on the version; False if it
    kept losing the race (the others then drop it once its beat went silent)."""
    for _ in range(attempts):
        row = read_shares(store, migration_id, job, run)
        if row is None or member not in row.shares:
            return True
        try:
            store.update(store.jpk(migration_id, job), budget_sk(job, run), "SET #v = :nv REMOVE shares.#m",
                         condition="#v = :v", names={"#v": "version", "#m": member},
                         values={":v": N(row.version), ":nv": N(row.version + 1)})
            return True
        except errors.ConditionalCheckFailed:
            continue  # another member rebalanced meanwhile: read again
    return False


# --------------------------------------------------------------------------- one budget for the whole run

class BudgetMembership:
    """This process as a member of its job run's budget row (every process and host of a run
    shares one ``--max-wcu`` / ``--max-rcu``; the rules are :mod:`reshard.core.shares`).

    :meth:`join` beats, takes this process's share and starts a thread that does the same
    every ``refresh_seconds``; :meth:`leave` gives the share back. Until it holds a share
    the :class:`CapacityBudget` sends nothing, and once its last beat is ``liveness_seconds``
    old (on ``budget.clock``, a monotonic clock) it sends nothing again until a refresh
    succeeds: the other members give a silent member's share away only after watching its
    beat unchanged for longer than that.

    ``budget``: the process's :class:`reshard.jobs.budget.CapacityBudget` (``set_share``,
    ``share``, ``valid_until``, ``clock``; control never imports jobs).
    ``totals``: the budget this process was started with (lane -> units/s; None: join the
    run's budget as the row states it). The latest process started with a budget sets the
    run's budget; the others follow at their next refresh -- unless an operator set that
    lane with ``reshard throttle`` (the run's control row): the operator's budget wins, for
    every process, also one started later with another ``--max-wcu``.
    """

    def __init__(self, store, migration_id: str, job: str, run: int, budget,
                 totals: dict | None, *, member: str, request_seconds: float,
                 refresh_seconds: float | None = None, liveness_seconds: float | None = None,
                 host: str | None = None, is_dead: Callable[[Member], bool] | None = None):
        self.store = store
        self.migration_id, self.job, self.run = migration_id, job, run
        self.budget = budget
        self.totals = totals
        self.member = member
        self.host = host
        self.request_seconds = request_seconds
        self.refresh_seconds = refresh_seconds or DEFAULT_REFRESH_SECONDS
        self.liveness_seconds = liveness_seconds or DEFAULT_LIVENESS_SECONDS
        if self.liveness_seconds <= 2 * self.refresh_seconds:
            raise errors.BadInput(f"the budget's liveness window ({self.liveness_seconds:g}s) must exceed two "
                                  f"refreshes ({self.refresh_seconds:g}s each)")
        #: A member known dead at once (a process of this host that no longer exists): its share
        #: is reclaimed at the next refresh instead of after its silence bound.
        self.is_dead = is_dead or (lambda m: False)
        #: Who holds a share this member is short of, while it waits (what the job says it waits for).
        self.waiting_for = ""
        budget.hold_detail = lambda: self.waiting_for
        self.live_members = 0
        #: The run's live control as last read (None: never changed by an operator).
        self.control: RunControl | None = None
        #: Called after every refresh (the job's metrics and its progress read the state then).
        self.listeners: list = []
        #: This member holds less than the even split of some lane (it waits for others to shrink).
        self.below_split = False
        self.last_error = ""
        self._beat = 0
        self._watch = LeaseWatch()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one refresh at a time (the thread, and join/leave)
        # The thread survives every failure (a garbled budget row, a bad answer): logged once
        # per kind, and the share lapses until a refresh works again (reshard.core.survive).
        self._failures = FailureLog(log, f"{job} budget beat of {member}")
        if totals:
            for kind, total in totals.items():
                if total is not None:
                    budget.set_share(kind, 0.0, total)  # nothing is sent before the first share
        budget.valid_until = budget.clock() - 1.0

    # -- lifecycle
    def join(self) -> "BudgetMembership":
        """Take this process's first share (raises on a control-table error), then keep refreshing."""
        self.refresh()
        self.notify()
        self._thread = threading.Thread(target=self._loop, name=f"{self.job}-budget", daemon=True)
        self._thread.start()
        return self

    def leave(self) -> None:
        """Stop refreshing and give the share back (best effort: a member that cannot is
        dropped by the others once its beat went silent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.refresh_seconds + self.request_seconds)
        self.budget.valid_until = self.budget.clock() - 1.0  # send nothing more under this share
        try:
            remove_share(self.store, self.migration_id, self.job, self.run, self.member)
            forget(self.store, self.migration_id, self.job, self.run, self.member)
        except errors.ReshardError as e:
            self.last_error = str(e)

    def _loop(self) -> None:
        # Below its even split (it joined, or another member left), a member refreshes five
        # times as often: the others shrink at their own refresh, and what they free is
        # unused until this member takes it.
        while not self._stop.wait(self.refresh_seconds / 5 if self.below_split else self.refresh_seconds):
            try:
                self.refresh()
            except Exception as e:  # noqa: BLE001 - retried next refresh; the share lapses meanwhile
                self.last_error = describe(e)
                self._failures.failed(e)
            else:
                self._failures.recovered()
            self.notify()

    def notify(self) -> None:
        """Call every listener with this membership (after each refresh, and once at the end)."""
        for fn in self.listeners:
            try:
                fn(self)
            except Exception as e:  # noqa: BLE001 - a metrics listener never stops the budget
                self.last_error = f"listener: {describe(e)}"

    # -- one refresh
    def refresh(self, attempts: int = 8) -> bool:
        """Beat, judge who is live, rebalance this member's share (compare-and-set). True when
        this process holds a share it may pace at until ``budget.valid_until``."""
        with self._lock:
            sent = self.budget.clock()  # before sending: the share lapses counting from here
            # The operator's live control first: a pause holds the workers at their next data
            # write, a throttle replaces this process's own totals (reshard.control.live).
            self.control = read_control(self.store, self.migration_id, self.job, self.run)
            self.budget.hold = self.control.hold if self.control else None
            totals = self.effective_totals()
            if not totals and read_shares(self.store, self.migration_id, self.job, self.run) is None:
                return False  # the run has no budget (nothing to share); the control was read
            self._beat += 1
            # Lanes without demand for two refreshes: aim at 0, the active members share the budget.
            # A held (paused) process keeps its share: its workers wait for `resume`, not for work.
            idle = frozenset() if self.budget.hold else \
                frozenset(k for k in LANES if self.budget.idle(k, 2 * self.refresh_seconds))
            beat(self.store, self.migration_id, self.job, self.run, self.member, self._beat,
                 self.liveness_seconds, self.request_seconds, self.host, idle)
            for _ in range(attempts):
                # The row before the members: a member in the row beat before it was written
                # into it, so the member query that follows sees its beat (never dropped unseen).
                row = read_shares(self.store, self.migration_id, self.job, self.run)
                if row is None and not totals:
                    return False  # the run has no budget (nothing to share)
                members = read_members(self.store, self.migration_id, self.job, self.run)
                now = self.budget.clock()
                quiet = {m.member: self._watch.observe(m.member, m.beat, now) for m in members}
                judged = [m for m in members if m.member == self.member
                          or (quiet[m.member] <= silence_bound(m) and not self.is_dead(m))]
                live = [m.member for m in judged]
                gone = [m for m in members if m.member not in live]
                if gone:
                    reap(self.store, self.migration_id, self.job, self.run, gone)
                holders = [m for m in judged if m.member != self.member and row is not None
                           and any(row.share(m.member, k) > 0 for k in LANES)
                           and quiet[m.member] > 2 * self.refresh_seconds]
                self.waiting_for = "; ".join(
                    f"member {m.member} holds " + ", ".join(f"{row.share(m.member, k):g} {k}" for k in LANES
                                                            if row.share(m.member, k) > 0)
                    + f" units/s and has not beaten for {quiet[m.member]:.0f}s of {silence_bound(m):.0f}s "
                      "(then its share is reclaimed)" for m in holders[:3])
                resting = {k: {m.member for m in judged if k in m.idle and m.member != self.member}
                           | ({self.member} if k in idle else set()) for k in LANES}
                decided = rebalance(row or Shares(totals or {}), self.member, live, totals, resting)
                self.live_members = len(set(live) | {self.member})
                if decided.write:
                    # Lower before the write lands, raise only after: the shares in use never
                    # add up to more than the row's.
                    self._apply({k: min(v, self.budget.share(k) or 0.0) if v is not None else None
                                 for k, v in decided.shares.items()}, decided.totals)
                    shrinks = [k for k, v in decided.shares.items()
                               if v is not None and row is not None and v < row.share(self.member, k)]
                    # Requests reserved at the larger share are still going out on its schedule:
                    # the row keeps the larger share until the last of them has.
                    pending = max((self.budget.larger_share_until(k) for k in shrinks), default=-1e18) \
                        - self.budget.clock()
                    if pending > self.refresh_seconds:
                        break  # write it at a later refresh; pace at the smaller share meanwhile
                    if pending > 0:
                        time.sleep(pending)
                    try:
                        write_shares(self.store, self.migration_id, self.job, self.run, row, decided)
                    except errors.ConditionalCheckFailed:
                        continue  # another member rebalanced first: read and decide again
                self._apply(decided.shares, decided.totals)
                self.below_split = decided.below_target
                self.budget.valid_until = sent + self.liveness_seconds
                return True
            else:
                return False
            # A shrink not written yet: this process paces at the smaller share, which the
            # row's larger one covers, so it may go on sending.
            self.below_split = False
            self.budget.valid_until = sent + self.liveness_seconds
            return True

    def effective_totals(self) -> dict | None:
        """The totals this process writes into the run's budget row: the operator's (``reshard
        throttle``) on the lanes it set, this process's own options on the others; None: neither."""
        own = self.totals or {}
        set_by_operator = self.control.totals if self.control else {}
        out = {lane: set_by_operator.get(lane) if set_by_operator.get(lane) is not None else own.get(lane)
               for lane in LANES}
        for lane, field in TOTAL_ATTR.items():
            self.budget.set_by[lane] = self.control.set_by(field) if set_by_operator.get(lane) is not None else ""
        return {k: v for k, v in out.items() if v is not None} or None

    def _apply(self, shares: dict, totals: dict) -> None:
        """Pace at ``shares`` (lanes with a budget)."""
        for kind, share in shares.items():
            if share is not None and totals.get(kind) is not None:
                self.budget.set_share(kind, share, totals[kind])

    def describe(self) -> dict:
        """For the job's result: the run's budget and this process's share of it."""
        out: dict = {"members": self.live_members}
        for kind, unit in (("write", "wcu"), ("read", "rcu")):
            lane = self.budget.lanes[kind]
            if lane.total is not None:
                out[f"max_{unit}"] = lane.total
                out[f"share_{unit}"] = lane.budget
        if len(out) == 1:
            return {}  # no budget on either lane
        by = {unit: self.budget.set_by[kind] for kind, unit in (("write", "wcu"), ("read", "rcu"))
              if self.budget.set_by.get(kind)}
        if by:
            out["set_by"] = by  # lanes whose budget an operator set with `reshard throttle`
        return out
