"""`reshard doctor`: what counts as a problem in the control state and the data table.

Pure domain module: each rule takes what the control plane read (records, literals)
and says whether it is a :class:`Finding`, why, and which command fixes it. The reads
and the repairs (every one a conditional write) live in :mod:`reshard.control.doctor`.

What a rule may call a problem is deliberately narrow: a finding must be something an
operator can act on, and a ``repairable`` one something a conditional write can fix
without ever clobbering a live actor (the repair re-checks the exact state it saw:
a lease's owner and counter, a heartbeat's beat, a lock's owner, an item's version).

Liveness is never judged here by comparing two hosts' clocks. A lease or heartbeat that
*looks* dead by its holder's clock is reported; the repair releases it only after this
host watched it stay unchanged for the holder's own window
(:func:`reshard.core.leases.quiet_remaining`, :attr:`Heartbeat.silence_seconds`).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

from reshard.core.decode import quoted
from reshard.core.layout import NEW_COPY_ATTR, is_tombstone
from reshard.core.leases import SegmentRecord
from reshard.core.phases import JOB_RULES, STRIP_JOB, Phase
from reshard.core.versions import version_ms, version_of

#: Every kind of finding, and what it means (``doctor --help`` and the runbook list them).
KINDS = {
    "orphaned_lease": "a segment lease is held in a run nobody will resume (superseded or finished run, "
                      "the job cannot run in this phase, or the migration is over)",
    "expired_lease": "a segment lease is held past its expiry by its holder's own clock (the worker died?)",
    "unfinished_run": "a job run stopped before it finished and can still be resumed",
    "abandoned_run": "a job run never finished and can never be resumed (superseded, or its phase is over)",
    "paused_run": "a job run an operator paused (`reshard pause`): its processes hold, not stuck; a note, "
                  "not a problem (`reshard resume` lets it go on)",
    "stale_shim": "a shim heartbeats a phase version its migration has left (lagging, or gone)",
    "foreign_shim": "a shim heartbeats a finished migration's file while another migration is active on "
                    "its table",
    "retired_copies": "new-layout copies (_rs_new) of an aborted and retired migration are left in the table",
    "orphan_marker": "the data table's marker names a migration no control table knows (a start that died "
                     "before registering it): shims of other migrations refuse the table",
    "old_tombstones": "delete markers (_rs_del) older than the table's current migration (active, or the newest "
                      "if complete: its own are --strip-bookkeeping's), or left after the last migration ended",
    "dead_budget_member": "a process's beat row in a job run's budget (B#<job>#<run>#<member>) outlived it: "
                          "its run is over, or it has not beaten within its liveness window (killed?)",
    "stale_lock": "a table lock (T#<table>) names a migration that is finished or does not exist",
    "missing_lock": "an active migration does not hold its table's lock",
    "foreign_row": "a control-table row reshard did not write (unknown schema, or contents that disagree with "
                   "its key: forged, or from a newer release); inspect it, then remove it by hand (never "
                   "repaired automatically)",
}

#: How far a shim's clock may lag the operator's when a tombstone is judged older than the
#: active migration: versions are hybrid-logical-clock strings stamped with the writer's
#: wall clock, so "older" keeps a wide margin (a tombstone near the start is kept).
TOMBSTONE_CLOCK_MARGIN_SECONDS = 3600.0


#: Kinds that are notes, not problems: shown, but ``doctor`` stays healthy (exit 0) with them.
NOTES = frozenset({"paused_run"})


@dataclass(frozen=True)
class Finding:
    """One problem: what, where, why, and the command that fixes it.

    ``repairable``: ``reshard doctor --repair`` fixes it with a conditional write.
    ``ref``: what the repair needs to find and re-check the exact state seen (keys,
    tokens); not shown.
    """

    kind: str
    migration: str
    subject: str
    detail: str
    fix: str
    repairable: bool = False
    ref: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def line(self) -> str:
        where = f"{self.migration}: " if self.migration else ""
        return f"{self.kind}: {where}{self.subject}: {self.detail} -> {self.fix}"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "migration": self.migration or None, "subject": self.subject,
                "detail": self.detail, "fix": self.fix, "repairable": self.repairable}


@dataclass(frozen=True)
class MigrationFacts:
    """The few facts of a migration's META row the rules need."""

    id: str
    table: str
    phase: Phase
    phase_version: int
    active: bool
    retired: bool = False


def repair_command(migration: str) -> str:
    return f"reshard doctor {migration} --repair" if migration else "reshard doctor --repair"


def foreign_row_finding(control_table: str, pk: str, sk: str, reason: str) -> Finding:
    """A row :func:`reshard.control.records.check_row` refused, with the commands to inspect
    and remove it. Never repairable: whether nobody should have written it (forged) or a
    newer release did is the operator's call, and deleting a newer release's row would
    break that release."""
    kind, _, rest = pk.partition("#")
    migration = rest.rpartition("#")[0] if kind == "J" else rest if kind in ("M", "S") else ""
    where = f"control row ({quoted(pk)}, {quoted(sk)})"  # as reshard.core.decode.where names it
    detail = reason[len(where):].lstrip(": ") if reason.startswith(where) else reason
    key = shlex.quote(json.dumps({"pk": {"S": pk}, "sk": {"S": sk}}, ensure_ascii=False))
    table = shlex.quote(control_table)
    fix = (f"inspect it: aws dynamodb get-item --table-name {table} --key {key}; if nobody should have written "
           f"it: aws dynamodb delete-item --table-name {table} --key {key}")
    return Finding("foreign_row", migration, f"row pk={pk!r} sk={sk!r}", detail, fix, False, {"pk": pk, "sk": sk})


def job_command(job: str, migration: str, segments: int) -> str:
    """The command that resumes a run of ``job``."""
    if job == STRIP_JOB:
        return f"reshard cleanup {migration} --strip-bookkeeping --segments {segments}"
    return f"reshard {job} {migration} --segments {segments}"


def job_can_run(job: str, m: MigrationFacts) -> bool:
    """Whether ``job`` (with or without --repair) may run in the migration's phase now
    (``strip-bookkeeping`` runs in ``complete``, cleanup on a retired abort too)."""
    rules = [r for name, r in JOB_RULES.items() if name == job or name.startswith(job + " ")]
    return any(m.phase in r.phases for r in rules)


def lease_finding(m: MigrationFacts, job: str, run: int, rec: SegmentRecord, *, run_finished: bool,
                  latest_run: int, now: float) -> Finding | None:
    """A held segment lease that nobody will release by working on: orphaned, or expired by
    its holder's clock (``rec.lease_expires`` vs ``now``, shown only: the repair watches)."""
    if not rec.held:
        return None
    subject = f"{job} run {run} segment {rec.segment} leased by {rec.owner}"
    why = None
    if not job_can_run(job, m):
        why = f"{job} cannot run in {m.phase}{' (retired)' if m.retired else ''}"
    elif run_finished:
        why = "its run is finished"
    elif run < latest_run:
        why = f"run {latest_run} superseded it"
    ref = {"job": job, "run": run, "segment": rec.segment, "owner": rec.owner, "counter": rec.lease_counter,
           "quiet": rec.holder_lease_seconds() + rec.holder_max_request_seconds()}
    fix = (f"{repair_command(m.id)} (releases it once this host watched it unchanged for its lease + longest "
           f"request, {ref['quiet']:.0f} s)")
    if why:
        return Finding("orphaned_lease", m.id, subject, f"orphaned: {why}", fix, True, ref)
    if rec.lease_expires and rec.lease_expires < now:
        return Finding("expired_lease", m.id, subject,
                       f"expired {now - rec.lease_expires:.0f} s ago by its holder's clock", fix, True, ref)
    return None


def run_finding(m: MigrationFacts, job: str, run: int, *, finished: bool, abandoned: bool, latest_run: int,
                segments: int, held_leases: int, paused: str | None = None) -> Finding | None:
    """A run that never finished: resumable (the job's command), or never resumable (repair marks
    it); ``paused``: an operator paused it (who, since when, what of its leases): a note."""
    if finished or abandoned:
        return None
    subject = f"{job} run {run}"
    if job_can_run(job, m) and run == latest_run:
        if paused:
            return Finding("paused_run", m.id, subject, f"{paused}; not stuck",
                           f"reshard resume {m.id} --job {job} (when it should go on)")
        if held_leases:
            return None  # being worked on (a dead holder shows up as an expired lease)
        return Finding("unfinished_run", m.id, subject, "stopped before every segment was done, no worker holds it",
                       job_command(job, m.id, segments))
    why = f"{job} cannot run in {m.phase}" if not job_can_run(job, m) else f"run {latest_run} superseded it"
    return Finding("abandoned_run", m.id, subject, f"never finished and cannot be resumed ({why})",
                   f"{repair_command(m.id)} (marks it abandoned; nothing reads it any more)", True,
                   {"job": job, "run": run})


def shim_finding(m: MigrationFacts, instance: str, described: str, phase_version: int, *,
                 active_on_table: str | None, silence: float) -> Finding | None:
    """A heartbeat acting on a phase version its migration left, or on a finished migration's
    file while ``active_on_table`` (another migration) owns the table."""
    ref = {"instance": instance, "quiet": silence}
    gone = (f"if it is gone, {repair_command(m.id)} removes its row once this host watched it silent for "
            f"{silence:.0f} s")
    if not m.active and active_on_table and active_on_table != m.id:
        return Finding("foreign_shim", m.id, f"shim {described}",
                       f"runs finished migration {m.id!r}'s file while {active_on_table!r} is active on table "
                       f"{m.table!r}", f"redeploy it with {active_on_table!r}'s file; {gone}", True, ref)
    if phase_version < m.phase_version:
        return Finding("stale_shim", m.id, f"shim {described}",
                       f"acts on phase version {phase_version}, the migration is at {m.phase} v{m.phase_version}",
                       f"restart or redeploy it; {gone}", True, ref)
    return None


def budget_member_finding(m: MigrationFacts, job: str, run: int, member: str, beat: int, *, last_beat_at: float,
                          liveness_seconds: float, request_seconds: float, run_over: bool,
                          now: float) -> Finding | None:
    """A member's beat row of a run's budget that its process no longer keeps: the run is over
    (a process that leaves removes its row), or its last beat (``last_beat_at``, the member's
    wall clock: shown only, the repair watches the beat counter) is older than its liveness."""
    late = now - last_beat_at
    if not run_over and late <= liveness_seconds:
        return None
    quiet = liveness_seconds + request_seconds
    why = "its run is over" if run_over else f"last beat {late:.0f} s ago by its own clock"
    return Finding("dead_budget_member", m.id, f"{job} run {run} budget member {member}", f"left behind: {why}",
                   f"{repair_command(m.id)} (removes its row and share once this host watched its beat unchanged "
                   f"for {quiet:.0f} s)", True,
                   {"job": job, "run": run, "member": member, "token": [beat], "quiet": quiet})


def lock_finding(table: str, owner: str, owner_state: MigrationFacts | None) -> Finding | None:
    """A ``T#<table>`` lock whose owner is finished (complete, or aborted and retired) or missing."""
    if owner_state is not None and owner_state.active:
        return None
    why = "does not exist" if owner_state is None else (
        f"is {owner_state.phase}{' and retired' if owner_state.retired else ''}")
    return Finding("stale_lock", owner, f"table {table!r} lock", f"names migration {owner!r}, which {why}",
                   f"{repair_command('')} (deletes it only while it still names {owner!r})", True,
                   {"table": table, "owner": owner, "missing": owner_state is None})


def missing_lock_finding(m: MigrationFacts, holder: str | None) -> Finding | None:
    """An active migration whose table lock is gone (repairable) or names another migration."""
    if not m.active or holder == m.id:
        return None
    if holder is None:
        return Finding("missing_lock", m.id, f"table {m.table!r} lock",
                       "the active migration does not hold it, so a second migration could start on the table",
                       f"{repair_command(m.id)} (takes it only if nobody holds it)", True, {"table": m.table})
    return Finding("missing_lock", m.id, f"table {m.table!r} lock",
                   f"held by {holder!r}: two migrations act on one table",
                   f"abort one of them (`reshard abort {m.id}`) and run `reshard cleanup` on it", False)


def tombstone_cutoff_ms(active: MigrationFacts | None, created_at: float) -> int | None:
    """Tombstones with a version before this (unix ms) are leftovers; None: every tombstone is.

    With no migration writing the table nothing writes tombstones (steady and retired shims
    delete plainly), so any left is garbage. With one -- active, or the newest one on the
    table and ``complete`` (its shims delete with tombstones until the application runs
    without its file; ``--strip-bookkeeping`` removes them after its hold) -- only those
    clearly from before it started (its registration minus a clock-skew margin) are.
    """
    if active is None:
        return None
    return int((created_at - TOMBSTONE_CLOCK_MARGIN_SECONDS) * 1000)


def leftover_tombstone(item: Mapping[str, Any], cutoff_ms: int | None) -> bool:
    if not is_tombstone(item):
        return False
    version = version_of(item)
    if cutoff_ms is None or not version:
        return True
    ms = version_ms(version)
    return ms is not None and ms < cutoff_ms  # a version no writer wrote: not judged a leftover


def retired_copy_of(item: Mapping[str, Any], retired: Collection[str]) -> str | None:
    """The retired migration whose marked copy ``item`` is (``_rs_new`` = its id), else None.

    The rule :class:`reshard.jobs.cleanup.Cleaner` applies. The marker alone decides: every
    shim write sets its own migration's marker on a new-layout key or removes it, so no
    live writer keeps a retired migration's marker; no version's wall time is compared with
    this host's clock (a writer's clock ahead of ours would keep a leftover for ever).
    ``retired`` holds only migrations whose retire is old enough on the server's clock that
    no copy of theirs can still land (:func:`reshard.jobs.cleanup.retire_settled`).
    """
    marker = item.get(NEW_COPY_ATTR, {}).get("S")
    return marker if marker is not None and marker in retired else None


def marker_finding(table: str, owner_id: str, owner_control: str, known: bool, previous: str | None) -> Finding | None:
    """A table marker (``core/marker.py``) naming a migration no control table knows: a
    ``start`` that died between writing the marker and registering the migration. Shims of
    every other migration refuse the table until it goes (fail closed)."""
    if known:
        return None
    back = f"gives the marker back to {previous}" if previous else "removes the marker"
    return Finding("orphan_marker", owner_id, f"table {table!r} marker",
                   f"names migration {owner_id!r} (control table {owner_control!r}), which no control table knows: "
                   "shims of any other migration refuse the table",
                   f"rerun `reshard start` for it, or {repair_command(owner_id)} ({back}, only while it still names "
                   f"{owner_id!r})", True, {"table": table, "owner": owner_id, "control": owner_control})


def data_findings(table: str, migration: str, copies: Mapping[str, list], tombstones: list,
                  cutoff_ms: int | None) -> list[Finding]:
    """One finding per kind of data leftover, with counts; ``ref["items"]`` holds each
    item's key and the version seen (the repair deletes it only if that is unchanged)."""
    out = []
    for retired_id, items in sorted(copies.items()):
        n = len(items)
        out.append(Finding("retired_copies", retired_id, f"table {table!r}",
                           f"{n} new-layout cop{'y' if n == 1 else 'ies'} of retired migration {retired_id!r}",
                           f"{repair_command(retired_id)} (each deleted only if its version is unchanged)", True,
                           {"table": table, "items": list(items)}))
    if tombstones:
        when = "left after the last migration ended" if cutoff_ms is None else \
            f"from before migration {migration!r} started"
        out.append(Finding("old_tombstones", migration, f"table {table!r}",
                           f"{len(tombstones)} delete marker(s) {when}",
                           f"{repair_command(migration)} (each deleted only if its version is unchanged)", True,
                           {"table": table, "items": list(tombstones)}))
    return out
