"""``reshard verify`` and ``reshard cleanup``: prove the copy, then retire what is no longer needed."""

from __future__ import annotations

import click

from reshard import errors, operations
from reshard.cli.metrics import metrics_options
from reshard.cli.options import (Env, command, concurrency_option, host_id_option, job_progress,
                                 lease_seconds_option, max_rcu_option, max_wcu_option, migration_argument,
                                 page_size_option, processes_option, resolve_processes, segments_option,
                                 workers_option)
from reshard.core.compare import GUIDANCE, KINDS
from reshard.core.phases import STRIP_JOB, job_rule
from reshard.jobs.runner import JobOptions


def _run_job(env: Env, job: str, mid: str, opts: JobOptions):
    """Run a data job with progress; returns (result, JSON-able summary)."""
    result = operations.run_data_job(job, env.dynamo(), env.store(), mid, opts,
                                     subscribers=job_progress(env, job, mid, opts), client=env.client_factory(),
                                     say=env.info)
    return result, dict(result.as_dict(), migration=mid)


@command("verify")
@migration_argument
@segments_option
@processes_option
@workers_option
@click.option("--repair", is_flag=True, help="Fix differences from the old (authoritative) layout with writes "
                                              "conditional on the version verify read (a newer shim write stays) "
                                              "and sent only while the lease holds, as the backfill's copies "
                                              "(backfill phase only); then verify again.")
@click.option("--no-record", "no_record", is_flag=True,
              help="Read only: scan every segment in this process and write nothing (no lease, checkpoint, run "
                   "record or example); the same verdict, differences and exit status, but it does NOT count "
                   "for the cutover gate and `status` does not show it (the observer role's verify). Not "
                   "resumable; cannot be combined with --repair.")
@click.option("--examples", type=click.IntRange(0, 1000), default=20, show_default=True,
              help="How many differences to list.")
@click.option("--settle-seconds", type=click.FloatRange(0, 3600), default=None,
              help="Report a difference only once it has stayed unchanged this long (on this host's clock), "
                   "so a shim write still in flight (authoritative copy landed, mirror retrying) is not a false "
                   "alarm. Default: the longest a write can take as the migration's shims publish it in their "
                   "heartbeats (one attempt + every retry of the mirror), or an assumed bound for shims that "
                   "do not say; 0 with no shim. Only suspect items wait, a page's together.")
@click.option("--records-dir", type=click.Path(file_okay=False), default=None, envvar="RESHARD_VERIFY_DIR",
              help="Where this host keeps the scan's records (key, side, version, digest per item; about 200 "
                   "bytes each) until the join: per run, removed when the run's join finished here (else a week later, "
                   "when another run starts here). A segment scanned "
                   "elsewhere (another host, a lost disk) is scanned again by the join. Default: "
                   "$RESHARD_VERIFY_DIR or ~/.cache/reshard/verify (--no-record: a temporary directory).")
@max_rcu_option
@max_wcu_option
@host_id_option
@page_size_option()
@lease_seconds_option()
@metrics_options
def verify(env: Env, migration, segments, processes, workers, repair, no_record, examples, settle_seconds,
           records_dir, max_rcu, max_wcu, host_id, page_size, lease_seconds):
    """Compare the old and the new layout item by item, both ways.

    \b
    Each logical item is judged over every old copy (a random-suffix layout may hold
    several; the newest wins) against its new copy. Differences: missing, stale,
    diverged, extra, new_only, resurrected, duplicate, collision, too_large,
    unmappable. Verify costs one scan: each segment records every item compactly
    (--records-dir), a last "join" segment joins the records by item once every
    segment is scanned, and only items whose records disagree are re-read
    consistently, then reported only once they stayed unchanged for the settle window
    (--settle-seconds), so in-flight shim writes are not false alarms. Resumable, and
    several hosts may share one run. The verdict is recorded in
    the control table: `reshard advance` to cutover needs a passing verify that started
    after the backfill finished. --no-record writes nothing and so opens no gate: use it
    to look (the observer IAM role may run only this verify).
    Exit 0 identical, 1 differences (listed; unmappable items beyond the
    `start --allow-unmappable N` allowance count as differences), 2 bad input or refused.

    \b
    An index-only migration ([index.NAME]): every item in the GSI must hold its [to]
    value (gsi_value; --repair rewrites a wrong one with the backfill's conditioned
    UpdateItem), and the index, queried as cutover shims query it (every [to] value of
    each logical partition, all pages), must return exactly the items the scan says
    carry it: the join finds entries missing (gsi_missing), extra or twice
    (gsi_extra), or with another partition/sort value or version (gsi_differs); each
    is re-checked (consistent read + targeted index query) and reported only if it
    stayed for the settle window. The summary shows the index side's RCU. A file that
    also re-keys the table runs both checks over one scan: the copies are compared without
    the GSI attribute, and every copy's GSI value must be the [to] layout's.

    \b
    Example:
      reshard verify migrations/0001_sensor_events.toml --segments 16
      reshard verify 0001_sensor_events --no-record     # look only: writes nothing
    """
    if repair and no_record:
        raise errors.BadInput("--repair writes (the repairs and the run it records): it cannot be combined with "
                              "--no-record")
    if no_record and processes is not None and processes > 1:
        raise errors.BadInput("--no-record scans in this process (no lease shares the segments between "
                              "processes): it cannot be combined with --processes above 1")
    mid = env.migration_id(migration)
    opts = JobOptions(segments=segments, workers=workers, repair=repair, max_rcu=max_rcu,
                      max_wcu=max_wcu, examples=examples, page_size=page_size, lease_seconds=lease_seconds,
                      settle_seconds=settle_seconds, records_dir=records_dir, host_id=host_id,
                      processes=1 if no_record else resolve_processes(processes, segments))
    if no_record:
        result = operations.verify_read_only(env.dynamo(), env.store(), mid, opts)
        data = result.as_dict()
    else:
        result, data = _run_job(env, "verify", mid, opts)
    data["counts"] = result.differences  # verify's counts are the kinds of difference
    totals = result.totals
    if "index_queries" in totals:  # an index-only migration: what the fan-out read, and its cost
        data["index_side"] = {k: round(totals.get(k, 0), 2) for k in
                              ("index_queries", "index_entries", "index_rcu", "rcu", "suspects", "settled")}

    def text() -> str:
        verdict = "PASSED" if result.passed else ("FAILED" if result.finished else "INCOMPLETE")
        run = "(read-only, not recorded: does not count for the cutover gate)" if no_record else f"run {result.run}"
        lines = [f"verify {mid} {run}: {verdict}; checked {result.checked} physical items (both layouts) in "
                 f"{data['elapsed_seconds']} s"]
        for kind, n in result.differences.items():
            if n:
                lines.append(f"  {kind:<12} {n:>8}  ({KINDS[kind]})")
                if kind in GUIDANCE:
                    lines.append(f"  {'':<12} {'':>8}  -> {GUIDANCE[kind]}")
        if "index_side" in data:
            ix = data["index_side"]
            lines.append(f"  index side: {ix['index_queries']:g} fan-out queries over the [to] GSI values read "
                         f"{ix['index_entries']:g} entries for {ix['index_rcu']:g} RCU ({ix['rcu']:g} RCU in all, "
                         f"with the scan); {ix['suspects']:g} disagreement(s) re-checked, {ix['settled']:g} settled")
        if result.allowed_unmappable:
            lines.append(f"  allowed unmappable: {result.allowed_unmappable} (reshard start --allow-unmappable); "
                         f"found {result.differences.get('unmappable', 0)}")
        if result.repaired:
            lines.append(f"  repaired {result.repaired}: run `reshard verify {mid}` again to confirm")
        elif result.totals.get("repair_pages"):  # a page that repaired was redone: its counts are gone
            lines.append(f"  repairs were sent: run `reshard verify {mid}` again to confirm")
        for e in result.examples:
            lines.append(f"  e.g. {e['kind']}: old key {e['old_key']}, new key {e['new_key']}, versions "
                         f"{e['old_version'] or '-'} / {e['new_version'] or '-'} {e['detail']}".rstrip())
        return "\n".join(lines)

    env.emit(data, text)
    if not result.finished:
        if result.stop_reason:
            raise errors.RefusedTransition(result.stop_reason)
        raise errors.ReshardError(f"verify of {mid} stopped before every segment was done; re-run to "
                                  + ("verify again" if no_record else "resume"))
    if not result.passed:
        found = ", ".join(f"{n} {k}" for k, n in result.differences.items() if n)
        if not found:  # only repairs (a page redone after its repair found nothing left)
            raise errors.ReshardError(f"verify repaired items: run `reshard verify {mid}` again to confirm")
        raise errors.ReshardError(f"verify found differences ({found})")


@command("cleanup")
@migration_argument
@segments_option
@processes_option
@workers_option
@concurrency_option
@click.option("--delete", is_flag=True, help="Delete old-layout items instead of giving them the TTL attribute.")
@click.option("--enable-ttl", is_flag=True,
              help="Enable TTL on [cleanup] ttl_attribute (UpdateTimeToLive) if it is not enabled.")
@click.option("--strip-bookkeeping", is_flag=True,
              help="After complete only: remove _rs_v, _rs_new and _rs_src from every item (each REMOVE "
                   "conditional on the version scanned) and delete leftover delete markers.")
@max_wcu_option
@max_rcu_option
@host_id_option
@page_size_option()
@lease_seconds_option()
@metrics_options
def cleanup(env: Env, migration, segments, processes, workers, concurrency, delete, enable_ttl, strip_bookkeeping, max_wcu,
            max_rcu, host_id, page_size, lease_seconds):
    """Retire what the migration no longer needs.

    \b
    In the cleanup phase: old-layout items whose key moved get the TTL attribute
    (now + retain_hours; an item's own sooner TTL is kept), or are deleted with
    --delete; items whose key did not move and new-layout items are never touched;
    delete markers (tombstones) are retired (with a server deadline, a page that has
    one waits H + 2 s after its scan first: a late older write must have expired).
    On an aborted migration: removes the new-layout copies and the old layout's
    tombstones, never an old item, then marks the migration retired (the shims go back
    to plain steady state and the table is free for a new migration); once every live
    shim acknowledged the retire, a second pass sweeps the tombstones that shims which
    had not seen it yet left behind. Waits first for stalled backfill/verify workers
    (lease + longest request, watched on this host's clock).
    Resumable and budgeted like the backfill.
    An index-only migration ([index.NAME]) has nothing to expire: the pass deletes its
    shims' delete markers (after the same hold); aborted, its cleanup also rewrites every
    GSI value back to the old layout. A file
    that also re-keys the table: its old copies expire; aborted, the new copies are
    deleted and every other item's GSI value is rewritten back.

    \b
    --strip-bookkeeping (after complete): the items keep reshard's _rs_v (write
    version) and _rs_new (new-copy marker) after complete; nothing needs them then.
    This pass removes them with an UpdateItem REMOVE conditioned on the version it
    scanned (a shim write in between keeps what it wrote), and deletes leftover delete
    markers (after the same wait). Shims still running the migration's file stamp them
    again on the items they write and delete with markers: run it again once the
    application runs without the migration.

    \b
    Example:
      reshard cleanup migrations/0001_sensor_events.toml --segments 16 --enable-ttl
      reshard cleanup 0001_sensor_events --strip-bookkeeping --max-wcu 500
    """
    if strip_bookkeeping:
        if delete or enable_ttl:
            raise errors.BadInput("--strip-bookkeeping cannot be combined with --delete or --enable-ttl")
        return _strip(env, migration, JobOptions(segments=segments, workers=workers, max_wcu=max_wcu,
                                                 max_rcu=max_rcu, page_size=page_size, lease_seconds=lease_seconds,
                                                 host_id=host_id, processes=resolve_processes(processes, segments)))
    mid = env.migration_id(migration)
    opts = JobOptions(segments=segments, workers=workers, delete=delete,
                      enable_ttl=enable_ttl, max_wcu=max_wcu, max_rcu=max_rcu, page_size=page_size,
                      lease_seconds=lease_seconds, concurrency=concurrency, host_id=host_id,
                      processes=resolve_processes(processes, segments))
    result, data = _run_job(env, "cleanup", mid, opts)
    if result.sweep is not None:
        data["sweep"] = result.sweep.as_dict()

    def text() -> str:
        c = result.counts
        lines = [f"cleanup {mid} run {result.run}: {'done' if result.done else 'INCOMPLETE'} in "
                 f"{data['elapsed_seconds']} s; scanned {c.get('scanned', 0)}"]
        for k, label in (("expiring", "old items given the TTL attribute"), ("kept_own_ttl", "kept their own "
                         "sooner TTL"), ("deleted", "old items deleted"), ("tombstones_retired",
                         "delete markers retired"), ("new_copies_removed", "new-layout copies removed"),
                         ("unmoved", "items that did not move (untouched)"),
                         ("untouched", "live items left alone"), ("unmappable", "unmappable items left alone"),
                         ("changed_meanwhile", "changed while we looked (left; re-run to retry)")):
            if c.get(k):
                lines.append(f"  {c[k]:>8}  {label}")
        if "already" in c and "expiring" not in c:  # an index-only migration's pass (jobs/index_jobs)
            lines.append("  nothing to expire: an index-only migration keeps every item's key (its shims' delete "
                         "markers are retired)")
        for k, label in (("moved", "items whose GSI value was rewritten back to the old layout"),
                         ("raced", "written or deleted since the scan (their own write stays)")):
            if c.get(k):
                lines.append(f"  {c[k]:>8}  {label}")
        if result.sweep is not None:
            swept = result.sweep.counts
            lines.append(f"retired; after the fleet acknowledged, run {result.sweep.run} swept again: "
                         f"{swept.get('tombstones_retired', 0)} late delete markers retired, "
                         f"{swept.get('new_copies_removed', 0)} copies removed")
        return "\n".join(lines)

    env.emit(data, text)
    if not result.done:
        failed = [r.segment for r in result.failed]
        if result.stop_reason:
            raise errors.RefusedTransition(result.stop_reason)
        raise errors.ReshardError(f"cleanup of {mid} did not finish"
                                  + (f" (failed segments {failed})" if failed else "") + "; re-run to resume")


def _strip(env: Env, migration: str | None, opts: JobOptions) -> None:
    """``cleanup --strip-bookkeeping``: refused (one line, exit 2) unless the migration is complete."""
    mid = migration_or_latest(env, migration)
    state = env.store().load_state(mid)
    if state.phase not in job_rule(STRIP_JOB).phases:
        raise errors.RefusedTransition(
            f"cleanup --strip-bookkeeping refused for {mid!r}: the migration is in {state.phase}; it runs only "
            f"after complete ({job_rule(STRIP_JOB).why})")
    result, data = _run_job(env, STRIP_JOB, mid, opts)
    live = operations.live_shims(env.store(), mid)
    data["shims_reporting"] = live

    def text() -> str:
        c = result.counts
        lines = [f"cleanup --strip-bookkeeping {mid} run {result.run}: {'done' if result.done else 'INCOMPLETE'} in "
                 f"{data['elapsed_seconds']} s; scanned {c.get('scanned', 0)}",
                 f"  {c.get('stripped', 0):>8}  items stripped of _rs_v/_rs_new/_rs_src",
                 f"  {c.get('clean', 0):>8}  items without bookkeeping"]
        if c.get("tombstones_deleted"):
            lines.append(f"  {c['tombstones_deleted']:>8}  leftover delete markers deleted")
        if c.get("changed_meanwhile"):
            lines.append(f"  {c['changed_meanwhile']:>8}  written by a shim while we looked (kept as written)")
        if live:
            lines.append(f"  {live} shim(s) still report for {mid!r} (its file): the items they write get _rs_v "
                         "(and _rs_new) again; run this again once the application runs without the migration")
        return "\n".join(lines)

    env.emit(data, text)
    if not result.done:
        if result.stop_reason:
            raise errors.RefusedTransition(result.stop_reason)
        raise errors.ReshardError(f"cleanup --strip-bookkeeping of {mid} did not finish; re-run to resume")


def migration_or_latest(env: Env, migration: str | None) -> str:
    """MIGRATION, else the one active migration, else the most recent complete one (strip runs after complete)."""
    if migration:
        return env.migration_id(migration)
    done = [s for s in env.store().list_states() if s.phase.value == "complete"]
    if not env.store().active_migration_ids() and done:
        return max(done, key=lambda s: s.updated_at).id
    return env.migration_id(None)
