"""Live control of a running job: ``reshard throttle``, ``reshard pause``, ``reshard resume``.

The protocol (Backfila's shape: the knobs are rows, every runner re-reads them at each lease
extension, each change is an event)::

    M#<id>   C#<job>#<run:06d>    the run's control row (:class:`RunControl`): the operator's
                                  max_wcu / max_rcu (absent: the processes' own options),
                                  paused, release_leases, version, and the last changes
                                  (who, when, each field old -> new)

* Only an operator writes it: it sits in the migration's operator partition ``M#<id>``, which
  the worker's IAM policy cannot write (``dynamodb:LeadingKeys``), so a worker's credentials
  cannot lift a pause or a throttle. Each change is one conditional write: ``attribute_not_exists``
  for the first, else ``version = <the version read>``; two operators acting at once never
  lose each other's change: the loser re-reads, applies its change on top and records it.
* Every process of the run reads it at each budget beat (``BudgetMembership.refresh``, every
  second by default), so every host adopts a change within about a second: the budget it
  paces at is the operator's where one is set (it wins over a process's ``--max-wcu``, also
  over one started later with another value), and a pause holds every worker before its next
  data write (:mod:`reshard.jobs.engine`): with the leases kept (renewed, no data write) or,
  with ``--release-leases``, given back at once (the page in flight is redone after ``resume``).
* No process is restarted and no lease is lost by a throttle or a kept-lease pause.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from reshard import errors
from reshard.control.records import CONTROL_CHANGES_KEPT, ControlChange, RunControl, RunInfo, check_row, control_sk
from reshard.control.store import ControlStore, operator_name
from reshard.core.phases import BACKFILL_JOB, CLEANUP_JOB, STRIP_JOB, VERIFY_JOB
from reshard.core.wire import N


#: The jobs whose runs a live control can steer.
JOBS = (BACKFILL_JOB, VERIFY_JOB, CLEANUP_JOB, STRIP_JOB)


def read_control(store: ControlStore, migration_id: str, job: str, run: int) -> RunControl | None:
    """The run's control row (a consistent read), or None when nobody ever changed it."""
    item = store.get(store.mpk(migration_id), control_sk(job, run))
    if item is None:
        return None
    check_row(item)
    return RunControl.from_item(item)


@dataclass(frozen=True)
class Changed:
    """What one ``throttle``/``pause``/``resume`` did to one run: its control before and after."""

    job: str
    run: int
    before: RunControl
    after: RunControl

    @property
    def changed(self) -> bool:
        return self.before.values() != self.after.values()

    @property
    def change(self) -> ControlChange | None:
        return self.after.changes[-1] if self.changed and self.after.changes else None


def change(store: ControlStore, migration_id: str, job: str, run: int, action: str, *, who: str | None = None,
           attempts: int = 8, **fields) -> Changed:
    """Set ``fields`` (``max_wcu``, ``max_rcu``, ``paused``, ``release_leases``; None: unchanged)
    on the run's control row and record the change; nothing is written when nothing changes.

    A compare-and-set on the row's ``version``: another operator's change landing between our
    read and our write fails ours, which then re-reads and applies on top of theirs.
    """
    who = who or operator_name()
    wanted = {k: v for k, v in fields.items() if v is not None}
    for _ in range(attempts):
        before = read_control(store, migration_id, job, run) or RunControl(migration_id, job, run)
        now = before.values()
        diff = {k: v for k, v in wanted.items() if now[k] != v}
        if diff.get("paused") and "release_leases" in wanted:
            diff["release_leases"] = wanted["release_leases"]  # a pause says what it does with the leases
        if not diff:
            return Changed(job, run, before, before)
        at = store.clock()
        record = ControlChange(before.version + 1, action, who, at, {k: now[k] for k in diff}, diff)
        after = replace(before, **diff, version=before.version + 1, updated_by=who, updated_at=at,
                        changes=(before.changes + (record,))[-CONTROL_CHANGES_KEPT:])
        item = after.to_item()
        try:
            if before.version == 0:
                store.put(item, condition="attribute_not_exists(pk)")
            else:
                store.put(item, condition="version = :v", values={":v": N(before.version)})
            return Changed(job, run, before, after)
        except errors.ConditionalCheckFailed:
            if store.landed(item["pk"]["S"], item["sk"]["S"], {k: item[k] for k in ("version", "updated_by",
                                                                                     "updated_at")}):
                return Changed(job, run, before, after)  # ours, its answer lost (the resend failed on it)
            continue  # another operator changed it first: read again, apply on top
    raise errors.ConcurrentChange(f"the control row of {job} run {run} of {migration_id!r} kept changing under "
                                  f"{attempts} attempts; check `reshard status {migration_id}` and retry")


def running_runs(store: ControlStore, migration_id: str, job: str | None = None) -> list[tuple[str, int]]:
    """The runs a live control applies to: the latest run of each data job (or of ``job``) that
    is neither finished nor abandoned, as ``(job, run)``."""
    out = []
    for name in ([job] if job else JOBS):
        # The run rows themselves (not control.runs, which reads budgets: budget members read this module).
        all_runs = sorted((RunInfo.from_item(migration_id, i) for i in store.query(store.jpk(migration_id, name),
                                                                                   f"R#{name}#")),
                          key=lambda r: r.run)
        if all_runs and all_runs[-1].finished_at is None and all_runs[-1].abandoned_at is None:
            out.append((name, all_runs[-1].run))
    return out


def targets(store: ControlStore, migration_id: str, job: str | None, verb: str) -> list[tuple[str, int]]:
    """:func:`running_runs`, or one clear refusal naming the command that starts a job."""
    store.load_state(migration_id)  # a clear error for an unknown migration
    found = running_runs(store, migration_id, job)
    if not found:
        what = f"{job} run" if job else "backfill, verify or cleanup run"
        raise errors.BadInput(f"nothing to {verb}: migration {migration_id!r} has no unfinished {what} "
                              f"(start one with `reshard {job or 'backfill'} {migration_id}`; `reshard status "
                              f"{migration_id}` lists its runs)")
    return found
