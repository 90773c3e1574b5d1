"""``reshard throttle``, ``reshard pause``, ``reshard resume``: steer a running job without a restart.

Each is one conditional write to the run's control row (:mod:`reshard.control.live`); every
process and host of the run adopts it at its next budget beat (about a second).
"""

from __future__ import annotations

import time

import click

from reshard import errors, operations
from reshard.cli.options import Env, command, migration_argument
from reshard.control.live import JOBS
from reshard.core.shares import DEFAULT_REFRESH_SECONDS

job_option = click.option(
    "--job", type=click.Choice(JOBS), default=None,
    help="Only this job's run (default: every unfinished backfill, verify, cleanup or strip-bookkeeping run of "
         "the migration).")


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at)) if at else "?"


def _data(done: operations.Controlled) -> dict:
    return {"migration": done.migration, "action": done.action,
            "runs": [{"job": c.job, "run": c.run, "changed": c.changed, "before": c.before.values(),
                      "after": c.after.values(), "version": c.after.version,
                      "change": c.change.as_dict() if c.change else None} for c in done.runs]}


def _adopted(r: dict) -> str:
    after = r["after"]
    if after["paused"]:
        return ("every worker gives its segment lease back before its next data write (the page in flight is "
                "redone after resume) and claims nothing" if after["release_leases"] else
                "every worker holds before its next data write and keeps its segment lease, renewed (nothing is "
                "taken over, no page is redone)")
    return "every process paces at it"


def _text(done: operations.Controlled) -> str:
    lines = []
    for r in _data(done)["runs"]:
        head = f"{done.action} {done.migration}: {r['job']} run {r['run']}: "
        if not r["changed"]:
            state = "paused" if r["after"]["paused"] else "running"
            lines.append(head + f"nothing changed (already {state}"
                         + "".join(f", {k} {r['after'][k]:g}" for k in ("max_wcu", "max_rcu") if r["after"][k])
                         + ")")
            continue
        c = r["change"]
        lines.append(head + f"{c['text']} (control version {r['version']}, by {c['who']} at {_when(c['at'])})")
        lines.append(f"  {_adopted(r)}, on every process and host of the run from its next beat "
                     f"(every ~{DEFAULT_REFRESH_SECONDS:g} s)")
    if done.action == "pause":
        lines.append(f"next: `reshard resume {done.migration}` lets it go on; `reshard status {done.migration}` "
                     "shows who paused it")
    return "\n".join(lines)


def _emit(env: Env, done: operations.Controlled) -> None:
    env.emit(_data(done), lambda: _text(done))


@command("throttle")
@migration_argument
@click.option("--max-wcu", type=click.FloatRange(min=0, min_open=True, max=1e9, max_open=True), default=None,
              help="The run's write budget in WCU/s, for every process and host of it.")
@click.option("--max-rcu", type=click.FloatRange(min=0, min_open=True, max=1e9, max_open=True), default=None,
              help="The run's read budget in RCU/s, for every process and host of it.")
@job_option
def throttle(env: Env, migration: str | None, max_wcu: float | None, max_rcu: float | None, job: str | None) -> None:
    """Change a running job's capacity budget, on every host, without a restart.

    \b
    One conditional write to the run's control row; each process of the run takes its
    share of the new budget at its next beat (about a second). The operator's budget
    wins over the processes' own --max-wcu/--max-rcu, also over a process started later
    with another value, until the next `reshard throttle`. Recorded (who, when, old ->
    new) and shown by `reshard status`.

    \b
    Example:
      reshard throttle --max-wcu 500
      reshard throttle sensor-events-16-to-32 --max-wcu 2000 --max-rcu 1000 --job backfill
    """
    if max_wcu is None and max_rcu is None:
        raise errors.BadInput("nothing to change: give --max-wcu N and/or --max-rcu N "
                              "(see `reshard throttle --help`)")
    mid = env.migration_id(migration)
    _emit(env, operations.control_job(env.store(), mid, "throttle", job=job, max_wcu=max_wcu, max_rcu=max_rcu))


@command("pause")
@migration_argument
@click.option("--release-leases", is_flag=True, default=False,
              help="Give the segment leases back at once (the pages in flight are redone after resume), e.g. "
                   "before stopping the hosts; by default each worker keeps its lease, renewed, and sends nothing.")
@job_option
def pause(env: Env, migration: str | None, release_leases: bool, job: str | None) -> None:
    """Hold every worker of a running job, on every host, without a restart.

    \b
    Each worker stops before its next data write (within about a second) and claims no
    segment. By default it keeps its segment lease and renews it (nothing is taken over,
    no page redone, resume goes on exactly where it stopped); --release-leases gives the
    leases back instead. The processes keep running: `reshard resume` lets them go on.
    `reshard status` shows who paused it and since when; `reshard doctor` calls the run
    paused, not stuck.

    \b
    Example:
      reshard pause
      reshard pause sensor-events-16-to-32 --release-leases
    """
    mid = env.migration_id(migration)
    _emit(env, operations.control_job(env.store(), mid, "pause", job=job, paused=True,
                                      release_leases=release_leases))


@command("resume")
@migration_argument
@job_option
def resume(env: Env, migration: str | None, job: str | None) -> None:
    """Let a paused job go on, on every host (within about a second).

    \b
    Example:
      reshard resume
      reshard resume sensor-events-16-to-32 --job backfill
    """
    mid = env.migration_id(migration)
    _emit(env, operations.control_job(env.store(), mid, "resume", job=job, paused=False))
