"""``reshard backfill``: copy old-layout items to the new layout (resumable, many hosts at once)."""

from __future__ import annotations

import time

from reshard import errors, operations
from reshard.cli.metrics import metrics_options
from reshard.cli.options import (command, concurrency_option, host_id_option, job_progress, lease_seconds_option,
                                 max_rcu_option, max_wcu_option, max_wcu_per_key_option, migration_argument,
                                 page_size_option, processes_option, resolve_processes, segments_option,
                                 workers_option)
from reshard.jobs.backfill import COUNTERS
from reshard.jobs.index_jobs import REWRITE_COUNTERS
from reshard.jobs.runner import JobOptions

#: What the backfill counts (its totals, less the capacity units), in the order shown.
COPY_COUNTERS = tuple(k for k in COUNTERS if k not in ("rcu", "wcu"))


def copy_summary_lines(t: dict) -> list[str]:
    """The backfill's counters in words: what was scanned, and what became of each moved item."""
    return [f"  scanned {t['scanned']}: moved {t['moved']}, unmoved {t['unmoved']} (key does not change), "
            f"new layout {t['new_layout']} (copies already there), unmappable {t['unmappable']}",
            f"  of the moved: copied {t['copied']}, fenced {t['fenced']} (a newer write was already at the new "
            f"key and stays), duplicates {t['duplicates']} (same content already there), "
            f"collisions {t['collisions']} (not copied)"]


def rewrite_summary_lines(t: dict) -> list[str]:
    """The counters of an index-only migration's rewrite (reshard.jobs.index_jobs)."""
    return [f"  scanned {t['scanned']}: rewritten {t['moved']} (GSI value set to the [to] layout's), already new "
            f"{t['already']}, raced {t['raced']} (written or deleted since the scan: that write stays), "
            f"not in the index {t['not_indexed']}, unmappable {t['unmappable']}"]


#: A combined migration's GSI rewrite (reshard.jobs.combined): the index half's counters, ``gsi_`` prefixed.
GSI_COUNTERS = ("moved", "already", "raced", "not_indexed", "unmappable")


def gsi_summary_lines(g: dict) -> list[str]:
    """The GSI half of a combined migration's backfill (or abort cleanup), in words."""
    return [f"  GSI values: rewritten {g['moved']} (physical items at an old value: old copies, dual_write "
            f"mirrors), already new {g['already']} (new copies are written with it), raced {g['raced']} (written "
            f"or deleted since the scan: that write stays), not in the index {g['not_indexed']}, unmappable "
            f"{g['unmappable']}"]


def report_pointer_lines(mid: str, t: dict) -> list[str]:
    """Where the items the backfill left alone are listed (both are ``U#backfill#...`` rows)."""
    lines = []
    if t.get("collisions"):
        lines.append(f"  COLLISIONS: {t['collisions']} pre-migration item(s) have another old copy with different "
                     f"content; neither was copied over the other. `reshard status {mid}` lists them (both old "
                     f"keys); decide which is right: runbooks/incident-unmappable.md")
    if t.get("unmappable"):
        lines.append(f"  unmappable items are listed by `reshard status {mid}` (control table U#backfill#...): "
                     f"runbooks/incident-unmappable.md")
    return lines


@command("backfill")
@migration_argument
@segments_option
@processes_option
@workers_option
@concurrency_option
@max_wcu_option
@max_rcu_option
@max_wcu_per_key_option
@host_id_option
@page_size_option("Items per Scan page (the unit of work redone after a kill).")
@lease_seconds_option("How long a segment lease lasts without a renewal before another worker may take the "
                      "segment over.")
@metrics_options
def backfill_command(env, migration, segments, processes, workers, concurrency, max_wcu, max_rcu, max_wcu_per_key,
                     host_id, page_size, lease_seconds):
    """Copy every item that moves from the old layout to the new one.

    \b
    An index-only migration ([index.NAME]) copies nothing: each item in the GSI gets its
    new GSI partition value with one UpdateItem conditioned on the version scanned (and
    on the value scanned); an item written or deleted since the scan is left to that
    write (counted as raced), never re-created. A file with both [from]/[to] and
    [index.NAME] does both over one scan: each copy is written with its new GSI value,
    then every item still at an old value (old copies included) is rewritten.

    \b
    Resumable: a kill redoes at most one page per segment. Runs one worker process per
    core (--processes); run it on several hosts at once to share the segments (leases in
    the control table coordinate them) and one --max-wcu/--max-rcu budget (each process
    paces at its share of it). Exit 0 when every segment is done, 1 when segments failed
    (listed; re-run to retry them), a worker process died, or more items could not be mapped than
    `start --allow-unmappable N` allowed, 2 when refused (wrong phase, lagging shims,
    --segments different from the started run).

    \b
    Each item is copied with one PutItem conditional on its version: a newer write
    already at the new key stays (counted as fenced). Two pre-migration copies of one
    item that differ are a collision: neither is copied, both keys are listed by
    `reshard status`. No write is sent once the worker's lease may have expired
    (see --lease-seconds).

    \b
    Example:
      reshard backfill --segments 16 --max-wcu 2000
      reshard backfill migrations/0001_sensor_events.toml --segments 16 --workers 4
      reshard backfill --segments 64 --processes 8 --max-wcu 4000
      reshard backfill 0001_sensor_events --segments 64 --max-wcu 2000 --host-id "$JOB_COMPLETION_INDEX"
      reshard backfill --segments 16 --metrics-port 9108      # Prometheus: docs/metrics.md

    \b
    While it runs: `reshard throttle --max-wcu N`, `reshard pause`, `reshard resume`
    steer every process of the run (no restart), `reshard status --watch` follows it.
    """
    mid = env.migration_id(migration)
    store = env.store()
    opts = JobOptions(segments=segments, workers=workers, page_size=page_size, max_wcu=max_wcu, max_rcu=max_rcu,
                      max_wcu_per_key=max_wcu_per_key or None, lease_seconds=lease_seconds,
                      concurrency=concurrency, host_id=host_id, processes=resolve_processes(processes, segments))
    subs = job_progress(env, "backfill", mid, opts)
    start = time.monotonic()
    result = operations.run_data_job("backfill", env.dynamo(), store, mid, opts, subscribers=subs,
                                     client=env.client_factory())
    t = result.totals
    summary = {
        "migration": mid, "segments": segments, "done": sum(r.done for r in result.segments),
        "processes": opts.processes, "worked_here": result.worked,
        "failed": [{"segment": r.segment, "attempts": r.attempts, "error": r.last_error} for r in result.failed],
        # The counters of reshard.jobs.backfill.COUNTERS (the run's totals over every host).
        **{k: int(t.get(k, 0)) for k in COPY_COUNTERS},
        # An index-only migration's rewrite counts these instead (reshard.jobs.index_jobs).
        **({k: int(t.get(k, 0)) for k in REWRITE_COUNTERS if k not in ("rcu", "wcu")} if "already" in t else {}),
        # A combined migration (table keys and a GSI): the GSI rewrite of the same pages.
        **({"gsi": {k: int(t.get(f"gsi_{k}", 0)) for k in GSI_COUNTERS}} if "gsi_already" in t else {}),
        "pages_redone": sum(r.takeovers for r in result.segments),
        "consumed_here": result.consumed, "consumed_total": {"rcu": round(t.get("rcu", 0), 1),
                                                               "wcu": round(t.get("wcu", 0), 1)},
        "elapsed_seconds": round(time.monotonic() - start, 2), "finished": result.done,
        "last_throttle": result.last_throttle or None,
        "budget": result.shared_budget or None,
    }

    def text() -> str:
        lines = [f"backfill {mid}: {summary['done']}/{segments} segments done "
                 f"({len(result.worked)} by this " + (f"host's {opts.processes} processes" if opts.processes > 1
                                                      else "process") + f") in {summary['elapsed_seconds']} s",
                 *(rewrite_summary_lines(summary) if "already" in summary else copy_summary_lines(summary)),
                 *(gsi_summary_lines(summary["gsi"]) if "gsi" in summary else []),
                 f"  consumed here {result.consumed['rcu']} RCU / {result.consumed['wcu']} WCU; "
                 f"pages redone after takeovers: {summary['pages_redone']}"]
        lines += report_pointer_lines(mid, summary)
        if result.shared_budget:
            b = result.shared_budget
            shown = ", ".join(f"{b[f'share_{u}']:g} of {b[f'max_{u}']:g} {u.upper()}/s" for u in ("wcu", "rcu")
                              if f"max_{u}" in b)
            lines.append(f"  run budget shared by {b['members']} live process(es); this one's last share: {shown}")
        if summary["last_throttle"]:
            lines.append(f"  last budget decision: {summary['last_throttle']}")
        for f in summary["failed"]:
            lines.append(f"  FAILED segment {f['segment']} after {f['attempts']} attempts: {f['error']}")
        return "\n".join(lines)

    env.emit(summary, text)
    if result.failed:
        raise errors.ReshardError(f"{len(result.failed)} segment(s) failed: "
                                  f"{', '.join(str(r.segment) for r in result.failed)}; re-run `reshard backfill "
                                  f"{mid} --segments {segments}` to retry them")
    if not result.done:
        if result.stop_reason:
            raise errors.RefusedTransition(f"{result.stop_reason}; the finished segments stay done")
        raise errors.ReshardError(f"backfill of {mid} stopped before every segment was done; re-run to resume")
    if summary["unmappable"] > result.allowed_unmappable:
        # Finished, but items were left behind beyond what the operator allowed at `start`:
        # verify fails on them too, so cutover stays closed until they are fixed or allowed.
        raise errors.ReshardError(
            f"backfill of {mid} finished but left {summary['unmappable']} unmappable item(s) behind and the "
            f"allowance is {result.allowed_unmappable}: `reshard status {mid}` lists them; fix them, or allow "
            f"them with `reshard start FILE --allow-unmappable {summary['unmappable']}` "
            "(runbooks/incident-unmappable.md)")
