"""The phase commands: ``start``, ``status``, ``advance``, ``rollback``, ``abort``.

Thin functions over :class:`reshard.control.store.ControlStore`: the rules live in
:mod:`reshard.core.phases`, the conditional writes in :mod:`reshard.control.store`. What is
here is the operator's view: which checks run before a write, how long to wait for
the fleet, and what to print (text for people, ``--output json`` for scripts).
"""

from __future__ import annotations

import time
import click

from reshard import errors
from reshard.cli.main import cli
from reshard.cli.options import Env, command, migration_argument
from reshard.control.store import ControlStore, MigrationState
from reshard.control.fleet import Census
from reshard.core.migration import Migration, load
from reshard.core.phases import TERMINAL, Action, Phase, decide
from reshard.control.transition import facts, transition
from reshard.control import fleet

from_option = click.option(
    "--from", "from_phase", type=click.Choice([p.value for p in Phase]), default=None, metavar="PHASE",
    help="Act only if the migration is in PHASE now (guards scripts and a second operator against "
         "moving it twice).")
wait_option = click.option(
    "--wait", "wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
    help="Wait up to SECONDS for the fleet: first for every live shim to acknowledge the current phase, "
         "then, after the transition, for it to acknowledge the new one.")


# ---------------------------------------------------------------------- start
@command(cli, "start")
@click.argument("file", metavar="FILE")
def start(env: Env, file: str) -> None:
    """Register a migration (phase `planned`); creates the control table if missing.

    Idempotent for the same file. A changed file under the same id is refused with
    a summary of the changes (give it a new id). Refused (exit 2) when the table does
    not exist, its keys differ from the file's [keys], or the table already has an
    active migration.

    \b
    Example:
      reshard start migrations/0001_sensor_events.toml
    """
    m = load(file)
    check_data_table(env, m)
    store = env.store()
    created_table = store.ensure_table()
    if created_table:
        env.info(f"created control table {store.table!r} (PAY_PER_REQUEST)")
    state, created = store.register(m)
    nxt = next_step(state)
    data = {"migration": state.id, "table": state.table, "control_table": store.table, "created": created,
            "control_table_created": created_table, "phase": state.phase.value,
            "phase_version": state.phase_version, "next": nxt}
    if created:
        text = f"registered migration {state.id!r} on table {state.table!r}: phase {state.phase}"
    else:
        text = (f"migration {state.id!r} is already registered with this file: phase {state.phase} "
                f"(phase version {state.phase_version}); nothing changed")
        if state.phase in TERMINAL:
            text += f"\n(it is {state.phase}; to migrate again, give the file a new id)"
    env.emit(data, f"{text}\nnext: {nxt}")


def check_data_table(env: Env, m: Migration) -> dict:
    """The data table must exist and have the key attributes the file names (exit 2 otherwise)."""
    desc = env.dynamo().describe_table(m.table)  # TableProblem (exit 2) when missing
    schema = {k["KeyType"]: k["AttributeName"] for k in desc.get("KeySchema", [])}
    want = {"HASH": m.keys.partition, "RANGE": m.keys.sort}
    if schema.get("HASH") != want["HASH"] or schema.get("RANGE") != want["RANGE"]:
        def show(d: dict) -> str:
            return f"partition {d.get('HASH')!r}, sort {d.get('RANGE')!r}"
        raise errors.TableProblem(f"{m.path}: keys: table {m.table!r} has {show(schema)}, "
                                  f"the file says {show(want)}")
    return desc


# ---------------------------------------------------------------------- status
@command(cli, "status")
@migration_argument
def status(env: Env, migration: str | None) -> None:
    """Phase, history, live shims and what each acknowledged, and job progress.

    \b
    Also whether `advance` is allowed now (and why not), and the next command.
    MIGRATION (a file or an id) may be omitted while exactly one is active.

    \b
    Example:
      reshard status
      reshard status sensor-events-16-to-32 --output json
    """
    store = env.store()
    report = status_report(store, env.migration_id(migration))
    env.emit(report, lambda: render_status(report))


def status_report(store: ControlStore, migration_id: str) -> dict:
    """Everything ``status`` shows, as plain data (the JSON output)."""
    state = store.load_state(migration_id)
    now = store.clock()
    census = fleet.census(store, migration_id, state.phase_version)
    decision = decide(Action.ADVANCE, state.phase, facts(store, state, census))
    lagging = {h.instance for h in census.lagging}
    shims = [dict(h.as_dict(now), acknowledged=h.instance not in lagging) for h in census.live]
    shims += [dict(h.as_dict(now), acknowledged=False) for h in census.expired]
    return {
        "migration": state.id, "table": state.table, "control_table": store.table,
        "phase": state.phase.value, "phase_version": state.phase_version,
        "created_at": state.created_at, "created_by": state.created_by,
        "history": [t.as_dict() for t in store.history(migration_id)],
        "fleet": fleet_summary(census),
        "shims": shims,
        "jobs": job_runs(store, migration_id),
        "advance": {"allowed": decision.allowed, "to": decision.target.value if decision.target else None,
                    "refusals": list(decision.refusals)},
        "next": next_step(state),
    }


def fleet_summary(census: Census) -> dict:
    return {"phase_version": census.version, "live": len(census.live), "expired": len(census.expired),
            "acknowledged": census.acknowledged, "lagging": [h.describe() for h in census.lagging]}


JOBS = ("backfill", "verify", "cleanup")
#: The counters worth a column per job in the text output (all of them are in the JSON).
_SHOWN = {"backfill": ("scanned", "moved", "unmoved", "recopied", "unmappable"),
          "verify": ("checked", "unmoved", "settled", "missing", "stale", "diverged", "extra", "resurrected",
                     "duplicate", "repaired"),
          "cleanup": ("scanned", "expiring", "deleted", "kept_own_ttl", "tombstones_retired", "new_copies_removed")}


def job_runs(store: ControlStore, migration_id: str) -> list[dict]:
    """Every backfill/verify/cleanup run: per-segment progress, owners, errors, totals, verdicts."""
    from reshard.control.runs import backfill_run, describe, runs, unmappable_items, verify_verdict

    out = []
    for job in JOBS:
        all_runs = runs(store, migration_id, job)
        for info in all_runs:
            d = describe(store, migration_id, job, info.run, clock=store.clock)
            if d is None:
                continue
            d["latest"] = info is all_runs[-1]
            d["totals"] = {k: (int(v) if float(v).is_integer() else round(v, 1)) for k, v in d["totals"].items()}
            if job == "backfill":
                d["current"] = info.run == backfill_run(store, migration_id)
                if d["latest"]:
                    items = unmappable_items(store, migration_id)
                    d["unmappable"] = {"count": len(items), "examples": items[:5]}
            if job == "verify":
                d["result"] = verify_verdict(store, migration_id, info.run, shown=5)
            out.append(d)
    return out


def _render_job(j: dict) -> list[str]:
    state = "finished " + _when(j["finished_at"]) if j["finished_at"] else "in progress"
    head = f"  {j['job']} run {j['run']}: {j['done']}/{j['total_segments']} segments done, {state}"
    if j["failed"]:
        head += f"; FAILED segments {', '.join(map(str, j['failed']))}"
    lines = [head]
    shown = _SHOWN[j["job"]]
    totals = ", ".join(f"{k} {j['totals'][k]}" for k in shown if j["totals"].get(k))
    if totals:
        lines.append(f"    totals: {totals}")
    if j["job"] == "verify":
        r = j["result"]
        if r["finished"]:
            diffs = ", ".join(f"{n} {k}" for k, n in r["counts"].items() if n) or "no differences"
            lines.append(f"    verdict: {'PASSED' if r['passed'] else 'FAILED'} ({diffs})")
            for e in r["examples"]:
                lines.append(f"      {e['kind']}: old {e['old_key']} new {e['new_key']} {e['detail']}".rstrip())
    if j.get("unmappable", {}).get("count"):
        u = j["unmappable"]
        lines.append(f"    unmappable items (left in place): {u['count']}")
        for e in u["examples"]:
            lines.append(f"      {e['old_key']}: {e['reason']}: {e['detail']}")
    if j.get("last_throttle"):
        lines.append(f"    last budget decision: {j['last_throttle']}")
    if not j["latest"] or j["finished_at"]:
        return lines  # older or finished runs: the summary is enough
    for seg in j["segments"]:
        c = seg["counters"]
        progress = " ".join(f"{k}={int(c[k]) if float(c[k]).is_integer() else c[k]}" for k in shown if c.get(k))
        owner = f" owner {seg['owner']} ({seg['lease_seconds_left']}s left)" if seg["owner"] else ""
        err = f" error: {seg['last_error']}" if seg["last_error"] else ""
        lines.append(f"    segment {seg['segment']:>4} {seg['state']:<8}{owner} {progress}{err}".rstrip())
    return lines


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at)) if at else "?"


def _since(history: list[dict]) -> str:
    return f", since {_when(history[-1]['at'])} by {history[-1]['who']}" if history else ""


def render_status(r: dict) -> str:
    """The text form of :func:`status_report`, for an operator."""
    lines = [f"migration {r['migration']}  (table {r['table']}, control table {r['control_table']})",
             f"phase:     {r['phase']}  (phase version {r['phase_version']}" + _since(r["history"]) + ")"]
    adv = r["advance"]
    if adv["to"] is None:
        lines.append(f"advance:   not possible: {'; '.join(adv['refusals'])}")
    elif adv["allowed"]:
        lines.append(f"advance:   to {adv['to']} allowed now")
    else:
        lines.append(f"advance:   to {adv['to']} refused now:")
        lines += [f"             - {why}" for why in adv["refusals"]]
    lines.append(f"next:      {r['next']}")

    lines += ["", "history:"]
    for t in r["history"]:
        frm = t["from"] or "-"
        lines.append(f"  v{t['phase_version']:<3} {_when(t['at'])}  {t['action']:<8} {frm:>10} -> {t['to']:<10}"
                     f"  by {t['who']}")

    f = r["fleet"]
    ack = (f"all acknowledged phase version {f['phase_version']}" if f["acknowledged"]
           else f"{len(f['lagging'])} lagging behind phase version {f['phase_version']}")
    lines += ["", f"shims:     {f['live']} live ({ack}), {f['expired']} expired"]
    if not r["shims"]:
        lines.append("  (no shim has reported: the acknowledgement is immediate)")
    for s in r["shims"]:
        mark = "expired" if not s["live"] else ("ok" if s["acknowledged"] else "LAGGING")
        lines.append(f"  {s['instance']:<24} {s['host']} pid {s['pid']:<7} on {s['phase']} v{s['phase_version']:<4}"
                     f" {s['seconds_ago']:>7}s ago  {mark}")

    lines += ["", "jobs:" if r["jobs"] else "jobs:      none yet"]
    for j in r["jobs"]:
        lines += _render_job(j)
    return "\n".join(lines)


def next_step(state: MigrationState) -> str:
    """The command an operator most likely runs next, for the printed hints."""
    mid = state.id
    return {
        Phase.PLANNED: f"deploy the shim, then `reshard advance {mid}` (to dual_write)",
        Phase.DUAL_WRITE: f"`reshard advance {mid}` (to dual_read) once the fleet acknowledged",
        Phase.DUAL_READ: f"`reshard advance {mid}` (to backfill)",
        Phase.BACKFILL: f"`reshard backfill {mid} --segments 16`, then `reshard verify {mid}`, "
                        f"then `reshard advance {mid}` (to cutover)",
        Phase.CUTOVER: f"check the application, then `reshard advance {mid}` (to cleanup; "
                       "no rollback after that)",
        Phase.CLEANUP: f"`reshard cleanup {mid}`, then `reshard advance {mid}` (to complete)",
        Phase.COMPLETE: "nothing: the new layout is the steady state",
        Phase.ABORTED: f"`reshard cleanup {mid}` removes the new-layout items",
    }[state.phase]


# ---------------------------------------------------------------------- transitions
@command(cli, "advance")
@migration_argument
@wait_option
@from_option
def advance(env: Env, migration: str | None, wait: float | None, from_phase: str | None) -> None:
    """Move the migration one phase forward (checks the fleet and the gates).

    \b
    Refused (exit 2) while a live shim has not acknowledged the current phase
    (unless --wait lets it catch up), and into cutover without a finished backfill
    and a passing verify started after it. Of two operators advancing at once,
    exactly one wins.

    \b
    Example:
      reshard advance --wait 60
      reshard advance migrations/0001_sensor_events.toml
    """
    run_transition(env, migration, Action.ADVANCE, wait, from_phase)


@command(cli, "rollback")
@migration_argument
@wait_option
@from_option
def rollback(env: Env, migration: str | None, wait: float | None, from_phase: str | None) -> None:
    """Move the migration one phase back, losslessly (up to cutover).

    \b
    cutover -> backfill -> dual_read -> dual_write -> planned. Refused (exit 2) from
    cleanup and complete: cleanup retires old-layout items. Like every transition it
    waits for the live shims' acknowledgement (--wait).

    \b
    Example:
      reshard rollback --wait 60
    """
    run_transition(env, migration, Action.ROLLBACK, wait, from_phase)


@command(cli, "abort")
@migration_argument
@wait_option
@from_option
def abort(env: Env, migration: str | None, wait: float | None, from_phase: str | None) -> None:
    """Return to the old layout only (`aborted`); `reshard cleanup` then removes new-layout items.

    \b
    Allowed from planned, dual_write, dual_read and backfill. From cutover roll back
    first (`reshard rollback`), then abort; refused from cleanup and complete.

    \b
    Example:
      reshard abort --wait 60
      reshard cleanup sensor-events-16-to-32
    """
    run_transition(env, migration, Action.ABORT, wait, from_phase)


def run_transition(env: Env, ref: str | None, action: Action, wait: float | None,
                   from_phase: str | None = None) -> None:
    """Apply one transition; with ``wait``, wait for the fleet before and after it.

    Refusals (rules, a lagging fleet, a lost race) raise and exit 2. Once the
    transition happened the exit status is 0 even if the fleet has not caught up,
    but the output says so plainly.
    """
    store = env.store()
    mid = env.migration_id(ref)
    expected = None
    if from_phase is not None:
        current = store.load_state(mid)
        if current.phase.value != from_phase:
            raise errors.ConcurrentChange(
                f"{action.value} refused for {mid!r}: it is in {current.phase} (phase version "
                f"{current.phase_version}, last moved by {current.last.who if current.last else '?'}), "
                f"not {from_phase}; check `reshard status` before acting again")
        # The compare-and-set below then acts on exactly the version we checked.
        expected = current.phase_version
    if wait:
        start_at = store.clock()
        before = store.load_state(mid)
        census = fleet.census(store, mid, before.phase_version)
        if not census.acknowledged:
            env.info(f"waiting up to {wait:g}s for {len(census.lagging)} live shim(s) to acknowledge "
                     f"{before.phase} v{before.phase_version}")
            census = fleet.wait_for_ack(store, mid, before.phase_version, max(0.0, wait - (store.clock() - start_at)))
        if not census.acknowledged:
            env.info(f"gave up after {wait:g}s waiting for the fleet to acknowledge {before.phase} "
                     f"v{before.phase_version}; lagging: {', '.join(h.describe() for h in census.lagging)}")
        # Act only on the state we waited for: if another operator moved the migration
        # meanwhile, the compare-and-set below fails and we say so instead of moving it again.
        if expected is not None and before.phase_version != expected:
            raise store.lost_race(mid, expected)
        expected = before.phase_version
        remaining = max(0.0, wait - (store.clock() - start_at))
    before, after = transition(store, mid, action, expected_version=expected)
    census = fleet.wait_for_ack(store, mid, after.phase_version, remaining) if wait else \
        fleet.census(store, mid, after.phase_version)
    nxt = next_step(after)
    data = {"migration": mid, "action": action.value, "from": before.phase.value, "to": after.phase.value,
            "phase": after.phase.value, "phase_version": after.phase_version,
            "who": after.last.who if after.last else None, "fleet": fleet_summary(census), "next": nxt}
    env.emit(data, lambda: _transition_text(before, after, action, census, wait, nxt))


def _transition_text(before: MigrationState, after: MigrationState, action: Action, census: Census,
                     wait: float | None, nxt: str) -> str:
    lines = [f"{action.value}: {after.id} moved {before.phase} -> {after.phase} (phase version {after.phase_version})"]
    if not census.live:
        lines.append("fleet: no live shims; acknowledged at once")
    elif census.acknowledged:
        lines.append(f"fleet: all {len(census.live)} live shim(s) acknowledged {after.phase}")
    else:
        lag = census.lagging
        lines.append(f"fleet: NOT caught up: {len(lag)} of {len(census.live)} live shim(s) still act on an "
                     f"earlier phase" + (" after waiting" if wait else "") + ":")
        lines += [f"  {h.describe()}" for h in lag[:20]]
        if len(lag) > 20:
            lines.append(f"  ... and {len(lag) - 20} more")
        lines.append(f"the next transition is refused until they acknowledge {after.phase}; "
                     "watch `reshard status`, or use `--wait SECONDS`")
    lines.append(f"next: {nxt}")
    return "\n".join(lines)
