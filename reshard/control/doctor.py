"""`reshard doctor`: read the control state and the data table, list what is wrong, repair what is safe.

:func:`diagnose` only reads: META rows, job runs and segment leases (:mod:`reshard.control.runs`),
heartbeats (only through :mod:`reshard.control.fleet`), the ``T#<table>`` locks, and one
filtered Scan of each data table. What counts as a problem is decided in
:mod:`reshard.core.doctor`.

:func:`repair` fixes the repairable findings, each with one conditional write that
re-checks exactly the state the diagnosis saw, so a live actor is never clobbered:

* a lease is released only if its owner and ``lease_counter`` are still the ones seen,
  and only after this host watched that token unchanged for the holder's lease + its
  longest request (the holder stops writing at its own deadline, so by then nothing it
  sent can still land) -- the gates' rule (:func:`reshard.control.runs.await_no_writers`);
* a heartbeat row is removed only after it was watched silent for the shim's liveness
  window + its longest request, and only if its ``beat`` is unchanged (:func:`fleet.reap`);
* a budget member's beat row (and its share) goes only after its beat was watched unchanged
  for its liveness + longest request, and only if the beat is still that one;
* a run is marked abandoned only if it is still unfinished;
* a lock is deleted only while it names the same finished (or missing) migration, and
  taken for an active migration only if nobody holds it;
* a data item is deleted only if its ``_rs_v`` is still the version scanned (a shim
  write that landed since is newer, and it stays).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, ContextManager

from reshard import errors
from reshard.aws import inspect
from reshard.aws.dynamo import Dynamo
from reshard.control import budget, fleet, runs
from reshard.control import marker as markers
from reshard.control.horizon import retire_settled
from reshard.control.live import read_control
from reshard.control.records import TABLE_LOCK_SK, MigrationState, check_row, run_sk, segment_sk, table_lock_pk
from reshard.control.store import ControlStore, operator_name
from reshard.core import doctor as rules
from reshard.core.doctor import Finding, MigrationFacts
from reshard.core.decode import MAX_LIVENESS_SECONDS, MAX_REQUEST_SECONDS, seconds
from reshard.core.layout import NEW_COPY_ATTR, TOMBSTONE_ATTR
from reshard.core.marker import Owner, owner_of
from reshard.core.leases import FREE, LeaseWatch, SegmentRecord
from reshard.core.phases import JOB_RULES, Phase
from reshard.core.versions import still_tombstone, unchanged, version_of
from reshard.core.wire import N, S, get_n, get_s

#: A capacity budget's pacing: ``with spend("read" | "write", units): <the request>``.
Spend = Callable[[str, float], ContextManager]


def _unpaced(kind: str, units: float) -> ContextManager:
    return contextlib.nullcontext()


#: The jobs whose runs and leases the doctor inspects (every job with a rule).
JOBS = tuple(dict.fromkeys(name.split(" ")[0] for name in JOB_RULES))


@dataclass
class Diagnosis:
    """What :func:`diagnose` found, and how much it looked at."""

    findings: list[Finding]
    migrations: int = 0
    locks: int = 0
    tables: dict = field(default_factory=dict)  # data table -> items scanned (None: skipped, and why)

    def as_dict(self) -> dict:
        return {"findings": [f.as_dict() for f in self.findings], "migrations": self.migrations,
                "locks": self.locks, "tables_scanned": self.tables,
                "healthy": not [f for f in self.findings if f.kind not in rules.NOTES]}


@dataclass(frozen=True)
class Repaired:
    """The outcome of one repair: ``repaired``, ``changed`` (the state moved since the
    diagnosis: left alone), ``live`` (it kept changing while watched: an actor is alive),
    ``waiting`` (not watched long enough; ``note`` says how long to retry with), or
    ``manual`` (not repairable by the doctor: run the fix command)."""

    finding: Finding
    outcome: str
    note: str = ""

    def line(self) -> str:
        f = self.finding
        what = f.line() if self.outcome == "manual" else f"{f.kind}: {f.migration + ': ' if f.migration else ''}{f.subject}"
        return f"{self.outcome}: {what}" + (f" ({self.note})" if self.note else "")

    def as_dict(self) -> dict:
        return {**self.finding.as_dict(), "outcome": self.outcome, "note": self.note or None}


class _Screened(ControlStore):
    """The doctor's view of the control table: a row :func:`check_row` refuses is set
    aside (kept in :attr:`foreign`, reported as a ``foreign_row`` finding) instead of
    stopping the diagnosis, which goes on as if the row were not there. Only the doctor
    reads this way: everything that acts on rows (census, gates, shim) stops instead."""

    def __init__(self, store: ControlStore):
        super().__init__(store.dynamo, store.table, store.clock, store.monotonic)
        self.heartbeat_watch = store.heartbeat_watch
        self.foreign: dict[tuple[str, str], str] = {}

    def _keep(self, item: dict) -> bool:
        try:
            check_row(item)
            return True
        except errors.ForeignControlRow as e:
            self.foreign[(get_s(item, "pk", ""), get_s(item, "sk", ""))] = str(e)
            return False

    def _read(self, operation: str, **kwargs) -> dict:
        resp = super()._read(operation, **kwargs)
        if "Item" in resp and not self._keep(resp["Item"]):
            resp = {k: v for k, v in resp.items() if k != "Item"}
        if "Items" in resp:
            resp = dict(resp, Items=[i for i in resp["Items"] if self._keep(i)])
        return resp

    def query(self, pk: str, prefix: str = "", consistent: bool = True, **kwargs) -> list[dict]:
        return [i for i in super().query(pk, prefix, consistent, **kwargs) if self._keep(i)]

    def check_every_row(self) -> None:
        """One Scan of the whole control table (it is small), so a foreign row in a
        partition no reader queries (an unknown prefix) is found too."""
        kwargs: dict = {"TableName": self.table, "ConsistentRead": True}
        while True:
            resp = self._read("scan", **kwargs)
            if not resp.get("LastEvaluatedKey"):
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def facts(s: MigrationState) -> MigrationFacts:
    return MigrationFacts(s.id, s.table, s.phase, s.phase_version, s.active, s.retired)


def diagnose(store: ControlStore, dynamo: Dynamo, migration_id: str | None = None, *, data: bool = True,
             now: float | None = None, spend: Spend | None = None) -> Diagnosis:
    """Every finding of one migration (``migration_id``) or of the whole control table. Reads only.
    ``spend``: a capacity budget's pacing for the data Scan (``CapacityBudget.spend``)."""
    store.require_table()
    store = _Screened(store)
    store.check_every_row()
    states = store.list_states()
    server_now = store.dynamo.answer_date()  # the server's clock, as the Scan's answer dated it
    if migration_id is not None:
        store.load_state(migration_id)  # a clear error for an unknown id
    chosen = [s for s in states if migration_id in (None, s.id)]
    now = store.clock() if now is None else now
    by_id = {s.id: s for s in states}
    active_on = {}
    for s in states:
        if s.active:
            active_on.setdefault(s.table, s)
    locks = store.table_locks()
    found: list[Finding] = []
    for s in chosen:
        m = facts(s)
        for job in JOBS:
            all_runs = runs.runs(store, s.id, job)
            latest = all_runs[-1].run if all_runs else 0
            info = {r.run: r for r in all_runs}
            held = runs.held_leases(store, s.id, [job])
            for _, run, rec in held:
                f = rules.lease_finding(m, job, run, rec, run_finished=bool(info.get(run) and info[run].finished),
                                        latest_run=latest, now=now)
                found += [f] if f else []
            for r in all_runs:
                control = read_control(store, s.id, job, r.run) if not r.finished and r.run == latest else None
                hold = control.hold if control else None
                f = rules.run_finding(m, job, r.run, finished=r.finished, abandoned=r.abandoned_at is not None,
                                      latest_run=latest, segments=r.total_segments,
                                      held_leases=sum(1 for _, run, _ in held if run == r.run),
                                      paused=hold.summary() if hold else None)
                found += [f] if f else []
            for row in budget.member_rows(store, s.id, job):
                run = int(get_n(row, "run", 0))
                f = rules.budget_member_finding(
                    m, job, run, get_s(row, "member", "?"), int(get_n(row, "beat", 0)),
                    last_beat_at=float(get_n(row, "at", 0)),
                    liveness_seconds=seconds(get_n(row, "liveness_seconds"), MAX_LIVENESS_SECONDS),
                    request_seconds=seconds(get_n(row, "request_seconds"), MAX_REQUEST_SECONDS), now=now,
                    run_over=not rules.job_can_run(job, m) or run < latest or bool(
                        info.get(run) and (info[run].finished or info[run].abandoned_at is not None)))
                found += [f] if f else []
        other = active_on.get(s.table)
        for h in fleet.heartbeats(store, s.id):
            f = rules.shim_finding(m, h.instance, h.describe(), h.phase_version,
                                   active_on_table=other.id if other else None, silence=h.silence_seconds)
            if f:
                found.append(Finding(f.kind, f.migration, f.subject, f.detail, f.fix, f.repairable,
                                     {**f.ref, "token": h.token}))
        holder = get_s(locks[s.table], "migration_id") if s.table in locks else None
        if holder is not None and holder != s.id and not (holder in by_id and by_id[holder].active):
            holder = None  # a stale lock (its own finding): deleting it comes first, then ours is taken
        f = rules.missing_lock_finding(m, holder)
        found += [f] if f else []
    tables = {s.table for s in chosen}
    for table, lock in sorted(locks.items()):
        if migration_id is None or table in tables:
            owner = get_s(lock, "migration_id", "?")
            f = rules.lock_finding(table, owner, facts(by_id[owner]) if owner in by_id else None)
            if f:
                found.append(Finding(f.kind, f.migration, f.subject, f.detail, f.fix, f.repairable,
                                     {**f.ref, "at": lock.get("at")}))
    for (pk, sk), reason in sorted(store.foreign.items()):
        f = rules.foreign_row_finding(store.table, pk, sk, reason)
        if migration_id is None or f.migration in ("", migration_id):
            found.append(f)
    scanned: dict = {}
    for table in sorted(tables):
        if not data:
            scanned[table] = None
            continue
        try:
            more, scanned[table] = _data_findings(dynamo, table, [s for s in states if s.table == table],
                                                  active_on.get(table), spend, server_now)
            found += more
            f = _marker_finding(store, dynamo, table, by_id)
            found += [f] if f else []
        except (errors.ResourceNotFound, errors.TableProblem):
            scanned[table] = None  # the data table is gone: nothing left in it
    return Diagnosis(found, len(chosen), len(locks), scanned)


def _data_findings(dynamo: Dynamo, table: str, states: list[MigrationState],
                   active: MigrationState | None, spend: Spend | None,
                   store_now: float | None = None) -> tuple[list[Finding], int]:
    """Marked copies of retired migrations and leftover tombstones in one data table
    (and how many items the Scan read)."""
    # Judged by marker and the server's clock (the Date of the control-table answer), never
    # by a version's wall time against ours (issue 25, case 6).
    server_now = store_now
    retired = {s.id for s in states if s.retired and retire_settled(s, server_now)}
    # An aborted migration's shims wrote tombstones until its retire, and a request older than
    # one of them (a held first attempt, a duplicate) can land until its horizon: deleted before
    # then, the empty key lets it pass its fence and the item comes back (a25's finding 1). So
    # no tombstone is a leftover while a retire of this table is younger than H + 2 s on the
    # server's clock; the next diagnosis finds them.
    unsettled = any(s.retired and not retire_settled(s, server_now) for s in states)
    # A complete migration's shims still delete with tombstones (every migration phase does,
    # issue 25) while the application runs its file; `--strip-bookkeeping` deletes them after
    # its hold (a late request older than a tombstone must have expired first), never the
    # doctor's repair, which does not wait: they count as the newest migration's own.
    # The newest *complete* one, not the newest: a later migration aborted and retired gives the
    # marker back to it, and its shims write tombstones again (b25's finding 1).
    complete = [s for s in states if s.phase is Phase.COMPLETE]
    newest_state = max(complete, key=lambda s: s.created_at) if complete else None
    owner = active or newest_state
    cutoff = rules.tombstone_cutoff_ms(facts(owner) if owner else None, owner.created_at if owner else 0.0)
    key_attrs = [k["AttributeName"] for k in dynamo.describe_table(table)["KeySchema"]]
    # Only items carrying a marker can be leftovers; the filter saves the transfer, not the reads.
    items, scanned, _ = inspect.scan_matching(dynamo, table, "attribute_exists(#d) OR attribute_exists(#n)",
                                              {"#d": TOMBSTONE_ATTR, "#n": NEW_COPY_ATTR}, spend=spend)
    copies: dict[str, list] = {}
    tombstones = []
    for item in items:
        seen = ({a: item[a] for a in key_attrs}, version_of(item))
        owner = rules.retired_copy_of(item, retired)
        if owner:
            copies.setdefault(owner, []).append(seen)
        elif not unsettled and rules.leftover_tombstone(item, cutoff):
            tombstones.append(seen)
    newest = max(states, key=lambda s: s.created_at).id if states else ""
    return rules.data_findings(table, active.id if active else newest, copies, tombstones, cutoff), scanned


def _marker_finding(store: ControlStore, dynamo: Dynamo, table: str, by_id: dict) -> Finding | None:
    """The table's marker, if it names a migration no control table knows."""
    owner = owner_of(markers.read(dynamo, table, markers.key_for(dynamo.describe_table(table))))
    if owner is None:
        return None
    known = owner.migration_id in by_id if owner.control_table == store.table else \
        markers.owner_state(store, owner) is not None
    return rules.marker_finding(table, owner.migration_id, owner.control_table, known,
                                owner.previous.text() if owner.previous else None)


def _give_marker_back(store: ControlStore, dynamo: Dynamo, f: Finding) -> str:
    r = f.ref
    owner = Owner(r["owner"], r["control"])
    if markers.owner_state(store, owner) is not None:  # registered since the diagnosis: it is no orphan
        raise errors.ConditionalCheckFailed("put_item", "ConditionalCheckFailedException", "registered since")
    other = store if r["control"] == store.table else ControlStore(store.dynamo, r["control"])
    note = markers.give_back(dynamo, other, r["owner"], r["table"])
    if "changed" in note or "does not name" in note:
        raise errors.ConditionalCheckFailed("put_item", "ConditionalCheckFailedException", note)
    return note


# --------------------------------------------------------------------------- repair

def repair(store: ControlStore, dynamo: Dynamo, findings: list[Finding], *, wait: float | None = None,
           poll: float = 0.5, sleep: Callable[[float], None] = time.sleep,
           before_write: Callable[[Finding], None] | None = None, spend: Spend | None = None) -> list[Repaired]:
    """Fix every repairable finding with a conditional write; the others come back ``manual``.

    Leases and heartbeats are first watched on this host's clock until each has been
    unchanged for its holder's window (``wait``: at most this long; None: as long as the
    longest needs). ``before_write`` runs just before each write (a test's hook).
    """
    out: list[Repaired] = [Repaired(f, "manual") for f in findings if not f.repairable]
    watched = [f for f in findings if f.repairable and f.kind in ("orphaned_lease", "expired_lease",
                                                                    "stale_shim", "foreign_shim",
                                                                    "dead_budget_member")]
    ready, results = _watch(store, watched, wait, poll, sleep)
    out += results
    # A stale lock goes before an active migration takes its table's lock back.
    rest = sorted((f for f in findings if f.repairable and f not in watched), key=lambda f: f.kind != "stale_lock")
    for f in ready + rest:
        if before_write is not None:
            before_write(f)
        out.append(_repair_one(store, dynamo, f, spend or _unpaced))
    return out


def _current_token(store: ControlStore, f: Finding, beats: dict) -> tuple | None:
    """The token the subject of ``f`` has now (None: it is gone or released)."""
    if f.kind in ("orphaned_lease", "expired_lease"):
        r = f.ref
        rec = SegmentRecord.from_item(r["segment"], store.get(store.jpk(f.migration, r["job"]),
                                                              segment_sk(r["job"], r["run"], r["segment"])))
        return rec.token if rec.held else None
    if f.kind == "dead_budget_member":
        r = f.ref
        row = store.get(store.jpk(f.migration, r["job"]), budget.member_sk(r["job"], r["run"], r["member"]))
        return (int(get_n(row, "beat", 0)),) if row is not None else None
    if f.migration not in beats:
        beats[f.migration] = {h.instance: h for h in fleet.heartbeats(store, f.migration)}
    h = beats[f.migration].get(f.ref["instance"])
    return h.token if h else None


def _seen_token(f: Finding) -> tuple:
    return (f.ref["owner"], f.ref["counter"]) if "owner" in f.ref and "counter" in f.ref else tuple(f.ref["token"])


def _watch(store: ControlStore, watched: list[Finding], wait: float | None, poll: float,
           sleep: Callable[[float], None]) -> tuple[list[Finding], list[Repaired]]:
    """Watch leases and heartbeats until each stayed unchanged for its window (KCL-style:
    the timer starts at our first look, so one look never clears anything)."""
    ready: list[Finding] = []
    done: list[Repaired] = []
    pending = list(watched)
    if not pending:
        return ready, done
    watch = LeaseWatch()
    start = store.monotonic()
    limit = wait if wait is not None else max(f.ref["quiet"] for f in pending) + poll
    while pending:
        now = store.monotonic()
        beats: dict = {}
        still = []
        for f in pending:
            token = _current_token(store, f, beats)
            if token is None:
                done.append(Repaired(f, "changed", "released or removed by someone else since the diagnosis"))
            elif token != _seen_token(f):
                done.append(Repaired(f, "live", "it changed since the diagnosis: its holder is alive; left alone"))
            elif watch.observe(id(f), token, now) >= f.ref["quiet"]:
                ready.append(f)
            else:
                still.append(f)
        pending = still
        if not pending:
            break
        if now - start >= limit:
            for f in pending:
                done.append(Repaired(f, "waiting", f"watched {now - start:.0f} s of the {f.ref['quiet']:.0f} s "
                                                   f"needed; retry with --wait {int(f.ref['quiet']) + 5}"))
            break
        sleep(min(poll, max(0.0, limit - (now - start))) or poll)
    return ready, done


def _repair_one(store: ControlStore, dynamo: Dynamo, f: Finding, spend: Spend) -> Repaired:
    try:
        note = _delete_items(dynamo, f, spend) if f.kind in DATA_KINDS else REPAIRS[f.kind](store, dynamo, f)
    except errors.ConditionalCheckFailed:
        return Repaired(f, "changed", "the state changed since the diagnosis; left alone")
    return Repaired(f, "repaired", note or "")


def _release_lease(store: ControlStore, dynamo: Dynamo, f: Finding) -> str:
    r = f.ref
    # Only the exact (owner, counter) we watched go quiet: a renewal or a takeover since
    # bumped the counter, and then the lease is someone's again and stays.
    store.update(store.jpk(f.migration, r["job"]), segment_sk(r["job"], r["run"], r["segment"]),
                 "SET #owner = :free, lease_expires = :zero, released_by = :who",
                 condition="#owner = :owner AND lease_counter = :counter",
                 names={"#owner": "owner"},
                 values={":free": S(FREE), ":zero": N(0), ":who": S(f"doctor {operator_name()}"),
                         ":owner": S(r["owner"]), ":counter": N(r["counter"])})
    return "released"


def _reap_shim(store: ControlStore, dynamo: Dynamo, f: Finding) -> str:
    h = next((h for h in fleet.heartbeats(store, f.migration) if h.instance == f.ref["instance"]), None)
    if h is None or h.token != tuple(f.ref["token"]) or not fleet.reap(store, f.migration, [h]):
        raise errors.ConditionalCheckFailed("delete_item", "ConditionalCheckFailedException", "heartbeat changed")
    return "heartbeat row removed"


def _remove_member(store: ControlStore, dynamo: Dynamo, f: Finding) -> str:
    r = f.ref
    # Only the beat we watched go quiet: a member that beat since is alive, and stays.
    store.delete(store.jpk(f.migration, r["job"]), budget.member_sk(r["job"], r["run"], r["member"]),
                 condition="beat = :beat", values={":beat": N(r["token"][0])})
    # Its share too (a compare-and-set on the row's version; the live members drop it anyway).
    budget.remove_share(store, f.migration, r["job"], r["run"], r["member"])
    return "beat row and share removed"


def _abandon_run(store: ControlStore, dynamo: Dynamo, f: Finding) -> str:
    store.update(store.jpk(f.migration, f.ref["job"]), run_sk(f.ref["job"], f.ref["run"]),
                 "SET abandoned_at = :now, abandoned_by = :who",
                 condition="attribute_exists(pk) AND attribute_not_exists(finished_at) "
                           "AND attribute_not_exists(abandoned_at)",
                 values={":now": N(store.clock()), ":who": S(f"doctor {operator_name()}")})
    return "marked abandoned"


def _delete_lock(store: ControlStore, dynamo: Dynamo, f: Finding) -> str:
    r = f.ref
    owner = store.load_state(r["owner"], missing_ok=True)
    if owner is not None and owner.active:
        raise errors.ConditionalCheckFailed("delete_item", "ConditionalCheckFailedException", "owner active")
    if r["missing"]:
        if owner is not None:  # its META appeared since the diagnosis (a start in flight): leave it
            raise errors.ConditionalCheckFailed("delete_item", "ConditionalCheckFailedException", "owner appeared")
        # A lock with no META could be a start between its two writes; the lock row must
        # still be the very one we saw (same owner, same claim time).
        same = "#at = :at" if r.get("at") else "attribute_not_exists(#at)"
        store.delete(table_lock_pk(r["table"]), TABLE_LOCK_SK, condition=f"migration_id = :id AND {same}",
                     names={"#at": "at"}, values={":id": S(r["owner"]), **({":at": r["at"]} if r.get("at") else {})})
    else:
        # A finished migration never becomes active again: deleting its lock only if it
        # still names it cannot free the table from under anyone.
        store.delete(table_lock_pk(r["table"]), TABLE_LOCK_SK, condition="migration_id = :id",
                     values={":id": S(r["owner"])})
    return "lock deleted"


def _take_lock(store: ControlStore, dynamo: Dynamo, f: Finding) -> str:
    state = store.load_state(f.migration)
    if not state.active:
        raise errors.ConditionalCheckFailed("put_item", "ConditionalCheckFailedException", "no longer active")
    # Only a free lock: one that names anyone (another migration included) stays.
    store.put({"pk": S(table_lock_pk(state.table)), "sk": S(TABLE_LOCK_SK), "migration_id": S(state.id),
               "at": N(store.clock())}, condition="attribute_not_exists(pk)")
    return "lock taken"


def _delete_items(dynamo: Dynamo, f: Finding, spend: Spend) -> str:
    table = f.ref["table"]
    key_attr = [k["AttributeName"] for k in dynamo.describe_table(table)["KeySchema"] if k["KeyType"] == "HASH"][0]
    deleted = changed = 0
    for key, version in f.ref["items"]:
        try:
            # The version scanned, still there: a write since (newer version) stays; a tombstone
            # only while it still is one (a steady update over it keeps its version).
            fence = (still_tombstone if f.kind == "old_tombstones" else unchanged)(version, key_attr)
            with spend("write", 1.0):
                dynamo.call("delete_item", TableName=table, Key=key, ReturnConsumedCapacity="TOTAL",
                            **fence.kwargs())
            deleted += 1
        except errors.ConditionalCheckFailed:
            changed += 1
    if deleted == 0 and changed:
        raise errors.ConditionalCheckFailed("delete_item", "ConditionalCheckFailedException", "all changed")
    return f"{deleted} deleted" + (f", {changed} changed since the scan and kept" if changed else "")


REPAIRS: dict[str, Callable[[ControlStore, Dynamo, Finding], str]] = {
    "orphaned_lease": _release_lease, "expired_lease": _release_lease,
    "stale_shim": _reap_shim, "foreign_shim": _reap_shim, "dead_budget_member": _remove_member,
    "abandoned_run": _abandon_run, "stale_lock": _delete_lock, "missing_lock": _take_lock,
    "orphan_marker": _give_marker_back,
}
#: Findings repaired in the data table (paced by the write budget).
DATA_KINDS = ("retired_copies", "old_tombstones")

