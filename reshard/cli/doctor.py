"""``reshard doctor``: diagnose the control state and the leftovers in the data table; repair what is safe."""

from __future__ import annotations

import click

from reshard import errors, operations
from reshard.cli.options import Env, command, max_rcu_option, max_wcu_option, migration_argument
from reshard.core.doctor import KINDS


def _kinds_help() -> str:
    return "\n".join(f"  {k:<15} {v}" for k, v in KINDS.items())


@command("doctor", help=f"""Diagnose the control state and the data table; with --repair, fix what is safe.

\b
Read-only by default. Each finding is one line: kind, migration, what, why, and the
command that fixes it. Exit 0 when healthy (or when --repair fixed every finding),
1 when findings remain, 2 on bad input.

\b
Findings:
{_kinds_help()}

\b
--repair fixes only what a conditional write can fix without clobbering a live actor:
a lease is released only if its owner and counter are still the ones seen, after this
host watched it unchanged for the holder's lease + longest request; a heartbeat row is
removed only after it was watched silent for the shim's liveness window + longest
request, and only if it did not beat since; a lock is deleted only while it names the
same finished migration; a data item is deleted only if its version is unchanged.
Runs that can still be resumed, lagging live shims and two migrations on one table
are left to the command shown.

\b
The data check reads the whole table once (a consistent Scan, paced by --max-rcu;
--no-data skips it); the repair's deletes are paced by --max-wcu.

\b
Examples:
  reshard doctor                       # every migration of the control table
  reshard doctor 0001_sensor_events --repair --wait 120
""")
@migration_argument
@click.option("--repair", is_flag=True, help="Fix the repairable findings (each a conditional write).")
@click.option("--wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="With --repair: watch leases and heartbeats at most SECONDS before giving up on them "
                   "(default: as long as the longest needs, e.g. 60 s lease + 35 s request).")
@click.option("--data/--no-data", default=True, show_default=True,
              help="Scan the data table(s) for retired copies and leftover tombstones.")
@max_rcu_option
@max_wcu_option
def doctor(env: Env, migration, repair, wait, data, max_rcu, max_wcu):
    mid = env.migration_id(migration) if migration else None
    report = operations.doctor(env.store(), env.dynamo(), mid, repair=repair, wait=wait, data=data,
                               max_rcu=max_rcu, max_wcu=max_wcu, say=env.info)
    env.emit(report.as_dict(), report.text)
    if not report.healthy:
        raise errors.ReshardError(report.summary())
