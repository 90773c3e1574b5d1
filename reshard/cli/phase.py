"""The phase commands: ``start``, ``status``, ``list``, ``advance``, ``rollback``, ``abort``, ``wait``.

Each parses its arguments, calls :mod:`reshard.operations` and prints what came back
(:mod:`reshard.cli.render`); the rules live in :mod:`reshard.core.phases`, the
conditional writes in :mod:`reshard.control.store`.
"""

from __future__ import annotations

import click

from reshard import errors, operations
from reshard.cli import render
from reshard.cli.options import (Env, allow_no_shims_option, command, dry_run_option, from_option, max_rcu_option,
                                 migration_argument, wait_option)
from reshard.core import planning
from reshard.core.deadlines import (DATE_MARGIN_SECONDS, DEFAULT_HORIZON_SECONDS, MAX_HORIZON_SECONDS,
                                    MIN_HORIZON_SECONDS)
from reshard.core.migration import load
from reshard.core.phases import Action


# ---------------------------------------------------------------------- start
@command("start")
@click.argument("file", metavar="FILE")
@click.option("--allow-unmappable", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Let the migration leave up to N items behind that the layouts cannot map (an item over "
                   "400 KB after re-keying is never allowed: it blocks cutover). Recorded on the migration: "
                   "backfill, verify and cutover hold the whole table to it.")
@click.option("--sample", type=click.IntRange(min=0), default=planning.DEFAULT_SAMPLE, show_default=True,
              help="Items the checks sample, spread over the scan segments; 0 scans the whole table.")
@click.option("--segments", type=click.IntRange(1, 1000), default=8, show_default=True,
              help="Parallel-scan segments for the sample (and --count).")
@click.option("--count", is_flag=True,
              help="Count the items exactly (Select=COUNT scan) and store the total for progress and ETA.")
@max_rcu_option
@click.option("--request-horizon", type=float, default=DEFAULT_HORIZON_SECONDS, show_default=True,
              metavar="SECONDS",
              help=f"H: how long after the control read it obeys DynamoDB still accepts a data request of this "
                   f"migration (its signature is dated H - 5 min back). Every phase lasts at least H + "
                   f"{DATE_MARGIN_SECONDS:g} s and the switch holds writes about as long; a shorter H makes shims "
                   f"re-read the control row more often (every H/3). Clamped to {MIN_HORIZON_SECONDS:g}-"
                   f"{MAX_HORIZON_SECONDS:g}.")
@click.option("--no-server-deadline", is_flag=True, envvar="RESHARD_NO_SERVER_DEADLINE",
              help="Do not require the server to refuse late-signed requests (test servers: dynalite, moto, "
                   "DynamoDB Local accept them). Without the server's check, a request of a frozen process can "
                   "land after the fleet moved on; nothing waits on the horizon then. Also "
                   "RESHARD_NO_SERVER_DEADLINE=1.")
def start(env: Env, file: str, allow_unmappable: int, sample: int, segments: int, count: bool,
          max_rcu: float | None, request_horizon: float, no_server_deadline: bool) -> None:
    """Check FILE against the table as `plan` does, then register it (phase `planned`).

    \b
    Runs every check of `plan` on a sample and refuses (exit 2, one line per problem):
    key attribute types that cannot hold the templates (a number partition key cannot
    carry a "#shard" suffix), templates that match no sampled item, unmappable or
    too-large items beyond --allow-unmappable N, and old items that would collide on
    one new key. Creates the control table if missing. Idempotent for a file of the
    same meaning: comments, whitespace, key order, quoting and description may differ
    (no checks again; a new --allow-unmappable is recorded). A change of meaning under
    the same id is refused naming each change, e.g. to.shards: 32 -> 64 (give it a new
    id). Refused when
    the table does not exist, its keys differ from the file's [keys], or the table
    already has an active migration.

    \b
    Late writes: start first checks that the server refuses a request signed more
    than 5 minutes ago, as DynamoDB does (the fence of every late request; refused,
    exit 2, on a server that accepts it, unless --no-server-deadline), then writes
    the table marker (an item at a reserved key naming the migration and its
    control table: a shim that cannot see this migration refuses the table).

    \b
    Example:
      reshard start migrations/0001_sensor_events.toml
      reshard start migrations/0001_sensor_events.toml --allow-unmappable 3 --count
      reshard --endpoint-url http://localhost:8000 start m.toml --no-server-deadline
    """
    m = load(file)
    started = operations.start(env.dynamo(), env.store(), m, say=env.info, allow_unmappable=allow_unmappable,
                               sample=sample, segments=segments, count=count, max_rcu=max_rcu,
                               request_horizon=request_horizon, server_deadline=not no_server_deadline)
    env.emit(render.start_data(started), lambda: render.start_text(started))


# ---------------------------------------------------------------------- status
@command("status")
@migration_argument
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds (progress, rate, ETA, budget, who "
              "paused or throttled a job, lagging shims) until the job or the phase changes; Ctrl-C stops it "
              "(exit 130). With --output json: one JSON document per line.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True, metavar="SECONDS",
              help="Seconds between two frames of --watch.")
def status(env: Env, migration: str | None, watch: bool, interval: float) -> None:
    """Phase, history, live shims and what each acknowledged, and job progress.

    \b
    Also whether `advance` is allowed now (and why not), and the next command.
    Per job: items done / total, %, rate and ETA (the total is DescribeTable's
    ItemCount, an estimate), why the budget throttles it, and who paused or
    throttled it (`reshard pause`, `reshard throttle`) and when.
    Without MIGRATION: the active migration, else the most recently started one
    (so it still answers after `complete`); with several active migrations it lists
    them and asks for one (exit 2). `reshard list` shows them all.

    \b
    Example:
      reshard status
      reshard status sensor-events-16-to-32 --output json
      reshard status --query 'jobs[].progress'
      reshard status --watch --interval 2
    """
    store = env.store()

    def several(active) -> None:
        listed = operations.Listed(store.table, [operations.listed_row(s) for s in active])
        report = render.list_data(listed)
        env.emit(report, lambda: render.list_text(report))

    mid = operations.status_migration(store, migration, on_several=several)
    if watch:
        from reshard.cli.watch import watch_status
        watch_status(env, mid, interval)
        return
    result = operations.status(store, mid, progress_total=lambda state: operations.progress_total(env.dynamo(), state))
    report = render.status_data(result)
    env.emit(report, lambda: render.status_text(report))


@command("list")
def list_command(env: Env) -> None:
    """Every migration of the control table: id, table, phase, started, finished.

    \b
    Oldest first. `finished` is when it stopped owning its table (the move to
    complete, or the cleanup that retired an aborted migration). No control table
    yet: an empty list (exit 0).

    \b
    Example:
      reshard list
      reshard list --query 'migrations[?phase==`complete`].id' --output text
    """
    report = render.list_data(operations.list_migrations(env.store()))
    env.emit(report, lambda: render.list_text(report))


# ---------------------------------------------------------------------- transitions
@command("advance")
@migration_argument
@wait_option
@from_option
@allow_no_shims_option
@dry_run_option
def advance(env: Env, migration: str | None, wait: float | None, from_phase: str | None,
            allow_no_shims: bool, dry_run: bool) -> None:
    """Move the migration one phase forward (checks the fleet and the gates).

    \b
    Moves exactly one phase, from the phase this command read when it started: if
    another operator moved the migration since (even before this command's first
    read), nothing is done and the error names who moved it, from what to what and
    when (exit 2). Refused (exit 2) while a live shim has not acknowledged the current
    phase (`reshard wait` waits for them and moves nothing); with --wait, exit 1
    naming the lagging shims if the fleet has not acknowledged (before the move:
    nothing moved; after it: the move stands). Into cutover it also needs a finished
    backfill and a passing verify started after it, and no backfill or verify worker
    that may still write: its segment lease must have stayed unchanged for the lease
    + the longest request (--wait SECONDS waits for that too; a stalled worker stops
    at its own lease deadline). --dry-run lists every precondition with its state.

    \b
    Late writes: with a server deadline (`start` without --no-server-deadline), the move
    first waits until the phase has lasted the request horizon + 2 s on the server's
    clock, saying so (out of planned at least 17 s); the switch to cutover holds about as
    long. cutover -> cleanup is refused until a `reshard verify` started in cutover
    passed (the catch-up after the switch; the move then clears the flag).

    \b
    Example:
      reshard advance --dry-run
      reshard advance --wait 60
      reshard advance migrations/0001_sensor_events.toml --from dual_write
      reshard advance --allow-no-shims   # nothing writes the table (no shim to wait for)
    """
    run_transition(env, migration, Action.ADVANCE, wait, from_phase, allow_no_shims, dry_run)


@command("rollback")
@migration_argument
@wait_option
@from_option
@allow_no_shims_option
@dry_run_option
def rollback(env: Env, migration: str | None, wait: float | None, from_phase: str | None,
             allow_no_shims: bool, dry_run: bool) -> None:
    """Move the migration one phase back, losslessly (up to cutover).

    \b
    cutover -> backfill -> dual_read -> dual_write -> planned. Refused (exit 2) from
    cleanup and complete: cleanup retires old-layout items. Like advance, it moves
    exactly one phase from the phase read when it started (a move by another
    operator since: nothing done, exit 2), waits for the live shims' acknowledgement
    (--wait) and, with a server deadline, until the phase lasted the request horizon +
    2 s; --dry-run says what it would do. After a rollback from cutover, a rollback
    to dual_write or planned (and abort) is refused until a `reshard verify` passes (the
    catch-up: a cutover write whose mirror to the old layout was lost).

    \b
    Example:
      reshard rollback --dry-run
      reshard rollback --wait 60
    """
    run_transition(env, migration, Action.ROLLBACK, wait, from_phase, allow_no_shims, dry_run)


@command("abort")
@migration_argument
@wait_option
@from_option
@allow_no_shims_option
@dry_run_option
def abort(env: Env, migration: str | None, wait: float | None, from_phase: str | None,
          allow_no_shims: bool, dry_run: bool) -> None:
    """Return to the old layout only (`aborted`); `reshard cleanup` then removes new-layout items.

    \b
    Allowed from planned, dual_write, dual_read and backfill. From cutover roll back
    first (`reshard rollback`), then run `reshard verify` until it passes (the catch-up
    after the switch), then abort; refused from cleanup and complete.

    \b
    Example:
      reshard abort --dry-run
      reshard abort --wait 60
      reshard cleanup sensor-events-16-to-32
    """
    run_transition(env, migration, Action.ABORT, wait, from_phase, allow_no_shims, dry_run)


@command("wait")
@migration_argument
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True, metavar="S",
              help="Give up after S seconds (exit 1, naming what it still waits for); 0 looks once.")
def wait_command(env: Env, migration: str | None, timeout: float) -> None:
    """Wait until the fleet acknowledged the current phase and no job is running; moves nothing.

    \b
    Waits until every live shim acknowledged the current phase version (a shim that
    is gone counts until this command has watched its heartbeat stay unchanged for
    its liveness window + its longest request, about 65 s by default, and then
    removes it), and until no backfill, verify or cleanup worker holds a segment
    lease (released, or unchanged for the lease + the longest request: a dead
    worker's). Says what it waits for, by name, every few seconds. Exit 0 when
    both hold, 1 after --timeout naming what is still pending.

    \b
    Example:
      reshard wait
      reshard wait sensor-events-16-to-32 --timeout 120 && reshard advance
    """
    store = env.store()
    mid = env.migration_id(migration)
    waited = operations.wait(store, mid, timeout=timeout, say=env.info)
    env.emit(render.wait_data(waited), lambda: render.wait_text(waited))
    if not waited.done:
        pending = [f"{len(waited.census.lagging)} live shim(s) have not acknowledged {waited.state.phase} "
                   f"v{waited.state.phase_version}: {_lagging(waited.census)}"] if waited.census.lagging else []
        pending += [f"{len(waited.writers)} job lease(s) held: {'; '.join(waited.writers[:5])}"] if waited.writers else []
        raise errors.FleetLagging(f"still waiting after {timeout:g}s: " + "; ".join(pending)
                                  + " (runbooks/incident-shim-lagging.md, runbooks/incident-lease.md)")


def run_transition(env: Env, ref: str | None, action: Action, wait: float | None,
                   from_phase: str | None = None, allow_no_shims: bool = False, dry_run: bool = False) -> None:
    """Apply one transition (:func:`reshard.operations.transition`) and print the outcome.

    Refusals (rules, a lagging fleet, a lost race) raise and exit 2. With ``--wait``, a
    fleet that has not acknowledged within it exits 1 naming the lagging shims: before
    the move nothing is moved; after it the move stands (the output says so) and the
    next transition waits for them. Without ``--wait`` nobody waited, so a fleet still
    catching up after the move is reported, exit 0. ``dry_run``: print what would happen
    (:func:`reshard.operations.preview`), write nothing, exit 0/1/2.
    """
    store = env.store()
    mid = env.migration_id(ref)
    if dry_run:
        seen = operations.preview(store, mid, action, allow_no_shims=allow_no_shims, from_phase=from_phase)
        env.emit(render.preview_data(seen), lambda: render.preview_text(seen))
        if seen.exit_code:
            raise click.exceptions.Exit(seen.exit_code)
        return

    def gave_up(state, census) -> None:
        raise errors.FleetLagging(f"{action.value} of {mid!r} not done: after --wait {wait:g}s "
                                  f"{len(census.lagging)} live shim(s) have not acknowledged {state.phase} "
                                  f"v{state.phase_version}: {_lagging(census)}; nothing moved "
                                  "(runbooks/incident-shim-lagging.md)")

    done = operations.transition(store, mid, action, wait=wait, from_phase=from_phase, say=env.info,
                                 allow_no_shims=allow_no_shims, on_lagging=gave_up if wait else None,
                                 started_at=env.started_at)
    env.emit(render.transition_data(done), lambda: render.transition_text(done))
    if wait and not done.census.acknowledged:
        raise errors.FleetLagging(f"{mid!r} moved to {done.after.phase}, but after --wait {wait:g}s "
                                  f"{len(done.census.lagging)} live shim(s) have not acknowledged it: "
                                  f"{_lagging(done.census)} (`reshard wait` waits for them without moving; "
                                  "runbooks/incident-shim-lagging.md)")


def _lagging(census) -> str:
    shown = census.describe_lagging()
    return ", ".join(shown[:10]) + (f" and {len(shown) - 10} more" if len(shown) > 10 else "")
