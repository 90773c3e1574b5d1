"""Text and JSON for the commands, made from what :mod:`reshard.operations` returns.

``*_data`` builds the JSON document of ``--output json``; ``*_text`` the text for
people, from the same data, so the two never tell different stories.
"""

from __future__ import annotations

import shlex

from reshard.cli.formats import instant
from reshard.control.fleet import Census
from reshard.core import planning
from reshard.core.decode import safe_text, utc_text
from reshard.core.progress import describe as describe_progress, duration
from reshard.core.phases import TERMINAL
from reshard.operations import IndexPlanReport, Listed, Plan, Started, Status, Transitioned


def fleet_summary(census: Census) -> dict:
    return {"phase_version": census.version, "live": len(census.live), "expired": len(census.expired),
            "acknowledged": census.acknowledged, "lagging": census.describe_lagging()}


# ---------------------------------------------------------------------- start

def start_data(r: Started) -> dict:
    state = r.state
    return {"migration": state.id, "table": state.table, "control_table": r.control_table, "created": r.created,
            "control_table_created": r.control_table_created, "phase": state.phase.value,
            "phase_version": state.phase_version, "next": r.next, "same_bytes": r.same_bytes,
            "allow_unmappable": r.allow_unmappable, "item_count": r.item_count,
            "checked": None if r.checked is None else {
                "sampled": r.checked.scanned, "mappable": r.checked.mappable,
                "unmappable": r.checked.unmappable_count, "collisions": r.checked.collisions}}


def start_text(r: Started) -> str:
    state = r.state
    if r.created:
        text = f"registered migration {state.id!r} on table {state.table!r}: phase {state.phase}"
        if r.checked is not None:
            a = r.checked
            text += (f"\nchecked {a.scanned} sampled item(s): {a.mappable} mappable, {a.unmappable_count} unmappable"
                     f" (allowed: {r.allow_unmappable}), {a.collisions} collisions")
        if r.item_count:
            text += f"\nitems: {r.item_count['items']} ({r.item_count['source']})"
    elif r.same_bytes:
        text = (f"migration {state.id!r} is already registered with this file: phase {state.phase} "
                f"(phase version {state.phase_version}); nothing changed")
    else:
        text = (f"migration {state.id!r} is already registered with a file of the same meaning (this one differs "
                "only in comments, whitespace, key order, quoting or description; the registered text stays): "
                f"phase {state.phase} (phase version {state.phase_version}); nothing changed")
    if not r.created and state.phase in TERMINAL:
        text += f"\n(it is {state.phase}; to migrate again, give the file a new id)"
    return f"{text}\nnext: {r.next}"


# ---------------------------------------------------------------------- status

def status_data(s: Status) -> dict:
    """Everything ``status`` shows, as plain data (the JSON output)."""
    state, census, decision = s.state, s.census, s.advance
    lagging = {h.instance for h in census.lagging}
    shims = [dict(h.as_dict(s.now, True), acknowledged=h.instance not in lagging) for h in census.live]
    shims += [dict(h.as_dict(s.now, False), acknowledged=False) for h in census.expired]
    return {
        "migration": state.id, "table": state.table, "control_table": s.control_table,
        "phase": state.phase.value, "phase_version": state.phase_version, "switching": state.switching,
        "retired": state.retired, "active": state.active,
        "created_at": state.created_at, "created_by": state.created_by,
        # Late writes (docs/late-writes.md): the request horizon, whether the server enforces it,
        # when the current phase began on the server's clock, and the catch-up flag.
        "request_horizon": state.request_horizon, "server_deadline": state.server_deadline,
        "phase_since": state.phase_since, "newer_may_be": state.newer_may_be,
        "catch_up_verified_by": s.catch_up_run,
        "history": [t.as_dict() for t in s.history],
        "fleet": fleet_summary(census),
        "shims": shims,
        "jobs": s.jobs,
        "advance": {"allowed": decision.allowed, "to": decision.target.value if decision.target else None,
                    "refusals": list(decision.refusals)},
        "next": s.next,
    }


#: The counters worth a column per job in the text output (all of them are in the JSON).
_SHOWN = {"backfill": ("scanned", "moved", "copied", "fenced", "duplicates", "collisions", "unmoved", "new_layout",
                       "unmappable", "gsi_moved", "gsi_already", "gsi_raced"),
          "verify": ("checked", "unmoved", "settled", "missing", "stale", "diverged", "extra", "new_only",
                     "resurrected", "duplicate", "collision", "too_large", "unmappable", "old_copies", "repaired",
                     "gsi_checked", "gsi_value", "gsi_query"),
          "cleanup": ("scanned", "expiring", "deleted", "kept_own_ttl", "tombstones_retired", "new_copies_removed",
                      "gsi_moved"),
          "strip-bookkeeping": ("scanned", "stripped", "tombstones_deleted", "changed_meanwhile")}


def _render_job(j: dict) -> list[str]:
    state = "finished " + _when(j["finished_at"]) if j["finished_at"] else "in progress"
    head = f"  {j['job']} run {j['run']}: {j['done']}/{j['total_segments']} segments done, {state}"
    if j["failed"]:
        head += f"; FAILED segments {', '.join(map(str, j['failed']))}"
    lines = [head]
    shown = _SHOWN.get(j["job"], ())
    totals = ", ".join(f"{k} {j['totals'][k]}" for k in shown if j["totals"].get(k))
    if totals:
        lines.append(f"    totals: {totals}")
    if j["job"] == "verify":
        r = j["result"]
        if r["finished"]:
            diffs = ", ".join(f"{n} {k}" for k, n in r["counts"].items() if n) or "no differences"
            lines.append(f"    verdict: {'PASSED' if r['passed'] else 'FAILED'} ({diffs})")
            for e in r["examples"]:
                example = f"{e.get('kind', '?')}: old {e.get('old_key')} new {e.get('new_key')} {e.get('detail', '')}"
                lines.append("      " + safe_text(example, 1000).rstrip())
    if j.get("unmappable", {}).get("count"):
        u = j["unmappable"]
        lines.append(f"    unmappable items (left in place): {u['count']}, allowed {u.get('allowed', 0)} "
                     "(start --allow-unmappable)" + _more(u))
        for e in u["examples"]:
            lines.append(f"      {_key_text(e['old_key'])}: {safe_text(e['reason'])}: {safe_text(e['detail'], 1000)}")
    if j.get("collisions", {}).get("count"):
        c = j["collisions"]
        lines.append(f"    COLLISIONS (two pre-migration copies of one item differ; whichever the backfill met "
                     f"first was copied, the other never over it; verify fails until you decide which is right: "
                     f"runbooks/incident-unmappable.md): {c['count']}" + _more(c))
        for e in c["examples"]:
            lines.append(f"      {_key_text(e['old_key'])} and {_key_text(e.get('other_key'))} differ")
    if j.get("progress"):
        p = j["progress"]
        if j["finished_at"]:
            lines.append(f"    progress: {p['done']:,} items in {duration(p['elapsed_seconds'])} "
                         f"({p['rate']:,.1f} items/s)")
        else:
            lines.append(f"    progress: {describe_progress(p)}"
                         + (f" (total: {p['total_source']})" if p.get("total_source") else ""))
    if j.get("last_throttle"):
        label = "last budget decision" if j["finished_at"] else "throttling"
        lines.append(f"    {label}: {j['last_throttle']}")
    lines += _control_lines(j)
    if j.get("budget") and not j["finished_at"]:
        b = j["budget"]
        units = [(lane, unit.upper(), b[f"max_{unit}"]) for lane, unit in (("write", "wcu"), ("read", "rcu"))
                 if b.get(f"max_{unit}")]
        total = ", ".join(f"{limit:g} {u}/s" for _, u, limit in units)
        shares = "; ".join(f"{m} " + ", ".join(f"{v.get(lane, 0):g} {u}/s" for lane, u, _ in units)
                           for m, v in b["shares"].items()) or "none held"
        lines.append(f"    budget for the whole run: {total}; shares: {shares}")
    if not j["latest"] or j["finished_at"]:
        return lines  # older or finished runs: the summary is enough
    for seg in j["segments"]:
        c = seg["counters"]
        progress = " ".join(f"{k}={int(c[k]) if float(c[k]).is_integer() else c[k]}" for k in shown if c.get(k))
        owner = f" owner {safe_text(seg['owner'])} ({seg['lease_seconds_left']}s left)" if seg["owner"] else ""
        err = f" error: {safe_text(seg['last_error'], 500)}" if seg["last_error"] else ""
        lines.append(f"    segment {seg['segment']:>4} {seg['state']:<8}{owner} {progress}{err}".rstrip())
    return lines


def _control_lines(j: dict) -> list[str]:
    """The run's live control (``reshard throttle/pause/resume``): who paused or throttled it, when."""
    c = j.get("control")
    if not c:
        return []
    out = []
    if c["paused"] and not j["finished_at"]:
        leases = "leases released" if c["release_leases"] else "leases kept and renewed"
        out.append(f"    PAUSED by {c['paused_by']} since {_when(c['paused_since'])} ({leases}): no data write "
                   f"until `reshard resume`")
    budget = [f"{c[f]:g} {f[4:].upper()}/s (by {c['set_by'][f]})" for f in ("max_wcu", "max_rcu") if c.get(f)]
    if budget and not j["finished_at"]:
        out.append(f"    budget set by `reshard throttle`: {', '.join(budget)}; it wins over the processes' options")
    for ch in c["changes"][-3:]:
        out.append(f"    control v{ch['version']} {_when(ch['at'])} {ch['action']:<8} {ch['text']}  by {ch['who']}")
    return out


def _key_text(key: dict | None) -> str:
    """``PK='a#1', SK='0'`` for a key in the attribute-value format (as ``plan`` shows keys)."""
    if not key:
        return "?"
    if not isinstance(key, dict):
        return safe_text(key)  # a recorded key that was no JSON key: shown as its text
    return safe_text(", ".join(f"{a}={(next(iter(v.values())) if isinstance(v, dict) and len(v) == 1 else v)!r}"
                               for a, v in key.items()), 500)


def _more(report: dict) -> str:
    """How to list the rest of a U#backfill report when status shows only the first few."""
    left = report["count"] - len(report["examples"])
    return (f" (the first {len(report['examples'])} below; every one is a U#backfill# row of the control table, "
            f"the query is in runbooks/incident-unmappable.md)" if left > 0 else "")


def _when(at: float) -> str:
    return utc_text(at)  # "?" for a time from a row that is no time at all (1E+125)


def _since(history: list[dict]) -> str:
    return f", since {_when(history[-1]['at'])} by {safe_text(history[-1]['who'])}" if history else ""


def status_text(r: dict) -> str:
    """The text form of :func:`status_data`, for an operator."""
    retired = " (retired: cleaned up, the table is free)" if r.get("retired") else ""
    lines = [f"migration {r['migration']}  (table {r['table']}, control table {r['control_table']})",
             f"phase:     {r['phase']}{retired}  (phase version {r['phase_version']}" + _since(r["history"]) + ")"]
    if r.get("switching"):
        lines.append(f"switch:    the fleet is switching authority to {r['phase']}: shims hold every request; "
                     f"`reshard advance {r['migration']}` finishes the switch, `reshard rollback` undoes it")
    if r.get("newer_may_be") and r.get("catch_up_verified_by"):
        lines.append(f"catch-up:  verify run {r['catch_up_verified_by']} passed after the switch: the next transition "
                     f"clears the flag (until then shims read both layouts)")
    elif r.get("newer_may_be"):
        lines.append(f"catch-up:  the {r['newer_may_be']} layout may hold writes whose mirror was lost in the switch: "
                     f"shims read both layouts; a passing `reshard verify {r['migration']}` lifts it")
    if "server_deadline" in r:
        lines.append(f"horizon:   {r['request_horizon']:g} s, " + (
            "enforced by the server (each phase lasts at least that + 2 s)" if r["server_deadline"]
            else "not enforced (--no-server-deadline: nothing refuses a late request)"))
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
        lines.append(f"  v{t['phase_version']:<3} {_when(t['at'])}  {safe_text(t['action']):<8} {safe_text(frm):>10} "
                     f"-> {safe_text(t['to']):<10}  by {safe_text(t['who'])}")

    f = r["fleet"]
    ack = (f"all acknowledged phase version {f['phase_version']}" if f["acknowledged"]
           else f"{len(f['lagging'])} lagging behind phase version {f['phase_version']}")
    lines += ["", f"shims:     {f['live']} live ({ack}), {f['expired']} expired"]
    if not r["shims"]:
        lines.append("  (no shim has reported: a transition needs a live shim, or --allow-no-shims if nothing "
                     "writes the table)")
    for s in r["shims"]:
        mark = "expired" if not s["live"] else ("ok" if s["acknowledged"] else "LAGGING")
        if s.get("unreadable"):
            # A row the census could not decode: named, never printed raw (it counts as lagging).
            lines.append(f"  {safe_text(s['instance']):<24} UNREADABLE ({safe_text(s['unreadable'])})  {mark}")
            continue
        lines.append(f"  {safe_text(s['instance']):<24} {safe_text(s['host'])} pid {s['pid']:<7} on "
                     f"{safe_text(s['phase'])} v{s['phase_version']:<4} {s['seconds_ago']:>7}s ago  {mark}")

    lines += ["", "jobs:" if r["jobs"] else "jobs:      none yet"]
    for j in r["jobs"]:
        lines += _render_job(j)
    return "\n".join(lines)


# ---------------------------------------------------------------------- list

def list_data(r: Listed) -> dict:
    return {"control_table": r.control_table, "control_table_exists": r.control_table_exists,
            "migrations": [dict(m, started=instant(m["started"]), finished=instant(m["finished"]))
                           for m in r.migrations]}


def list_text(r: dict) -> str:
    """One line per migration, oldest first: id, table, phase, started, finished."""
    if not r["migrations"]:
        if not r.get("control_table_exists", True):
            return (f"no migration: control table {r['control_table']} does not exist yet (`reshard start FILE` "
                    "creates it; --control-table or $RESHARD_CONTROL_TABLE names another)")
        return f"no migration in control table {r['control_table']} (run `reshard start FILE`)"
    rows = [("ID", "TABLE", "PHASE", "STARTED", "FINISHED")]
    for m in r["migrations"]:
        phase = m["phase"] + (" (retired)" if m["retired"] else "")
        rows.append((m["id"], m["table"], phase, _when(m["started"]),
                     _when(m["finished"]) if m["finished"] else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4] for row in rows)


# ---------------------------------------------------------------------- advance, rollback, abort

def transition_data(t: Transitioned) -> dict:
    after = t.after
    return {"migration": after.id, "action": t.action.value, "from": t.before.phase.value, "to": after.phase.value,
            "phase": after.phase.value, "phase_version": after.phase_version,
            "who": after.last.who if after.last else None, "fleet": fleet_summary(t.census),
            "retired": after.retired, "next": t.next}


def transition_text(t: Transitioned) -> str:
    before, after, action, census, wait = t.before, t.after, t.action, t.census, t.waited
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
                     f"`reshard wait {after.id}` waits for them (and moves nothing)")
    lines.append(f"next: {t.next}")
    return "\n".join(lines)


def preview_data(p) -> dict:
    """``--dry-run``: the move it would make, each precondition with its state (nothing written)."""
    s = p.state
    return {"migration": s.id, "action": p.action.value, "dry_run": True, "phase": s.phase.value,
            "phase_version": s.phase_version, "switching": s.switching,
            "to": p.target.value if p.target else None, "would_move": p.allowed, "through_switch": p.switch,
            "exit_status": p.exit_code,
            "preconditions": [{"what": c.what, "ok": c.ok, "state": c.state, "clears_by_waiting": c.clears_by_waiting}
                              for c in p.checks],
            "fleet": fleet_summary(p.census)}


def preview_text(p) -> str:
    s = p.state
    head = f"{p.action.value} --dry-run: {s.id} is in {s.phase} (phase version {s.phase_version})"
    if p.allowed:
        how = (" through the switch (shims hold their requests until every live shim acknowledged it)"
               if p.switch else "")
        lines = [f"{head}; it would move {s.phase} -> {p.target} (phase version {s.phase_version + 1}){how}"]
    elif p.target is None:
        lines = [f"{head}; refused: there is no {p.action.value} from here"]
    else:
        why = "refused for now (a wait may clear it: `reshard wait`)" if p.exit_code == 1 else "refused"
        lines = [f"{head}; {p.action.value} to {p.target}: {why}"]
    for c in p.checks:
        lines.append(f"  [{'ok' if c.ok else 'NO'}] {c.what}: {c.state}")
    lines.append("nothing written (--dry-run)")
    return "\n".join(lines)


def wait_data(w) -> dict:
    return {"migration": w.state.id, "phase": w.state.phase.value, "phase_version": w.state.phase_version,
            "done": w.done, "waited_seconds": round(w.seconds, 1), "fleet": fleet_summary(w.census),
            "job_leases": list(w.writers), "next": w.next}


def wait_text(w) -> str:
    s = w.state
    if w.done:
        shims = (f"all {len(w.census.live)} live shim(s) acknowledged" if w.census.live else "no live shim reports; "
                 "nothing to acknowledge")
        lines = [f"wait: {s.id} in {s.phase} (phase version {s.phase_version}): {shims}; no job lease held "
                 f"(after {w.seconds:.1f}s; nothing moved)"]
    else:
        lines = [f"wait: {s.id} in {s.phase} (phase version {s.phase_version}): still waiting after "
                 f"{w.seconds:.1f}s (nothing moved)"]
        lines += [f"  shim {d}: has not acknowledged" for d in w.census.describe_lagging()[:20]]
        lines += [f"  {d}" for d in w.writers[:20]]
    lines.append(f"next: {w.next}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- plan

def next_commands(p: Plan, file: str, prefix: str = "") -> list[str]:
    """The whole session for this migration, with the global options ``prefix`` repeated."""
    fq = shlex.quote(file)
    mid = p.migration.id
    segs = max(1, min(16, p.segments * 2))
    budget = f" --max-wcu {p.estimate.max_wcu:g}" if p.estimate.max_wcu else ""
    return [
        f"reshard{prefix} start {fq}",
        f"reshard{prefix} advance {mid}            # dual_write: deploy the shim first",
        f"reshard{prefix} advance {mid}            # dual_read",
        f"reshard{prefix} advance {mid}            # backfill",
        f"reshard{prefix} backfill {mid} --segments {segs}{budget}",
        f"reshard{prefix} verify {mid}",
        f"reshard{prefix} advance {mid}            # cutover",
        f"reshard{prefix} advance {mid}            # cleanup (no rollback after this)",
        f"reshard{prefix} cleanup {mid}",
        f"reshard{prefix} advance {mid}            # complete",
    ]


def plan_data(p: Plan, file: str, prefix: str = "") -> dict:
    """Everything the plan shows, as plain data (the JSON output; the text is rendered from it)."""
    m, table, a, est, rec = p.migration, p.table, p.analysis, p.estimate, p.recommendation
    billing = (table.get("BillingModeSummary") or {}).get("BillingMode", "PROVISIONED")
    pt = table.get("ProvisionedThroughput") or {}
    provisioned = None
    if billing == "PROVISIONED":
        provisioned = {"rcu": pt.get("ReadCapacityUnits"), "wcu": pt.get("WriteCapacityUnits")}
    old, new = a.old_distribution(), a.new_distribution()

    def layout(spec) -> dict:
        return {"partition": spec.partition_text, "sort": spec.sort_text, "shards": spec.shards,
                "shard_by": "random" if spec.random else list(spec.shard_by),
                "hash": spec.hash, "shard_function": spec.shard_function}

    return {
        "migration": {"id": m.id, "file": file, "table": m.table, "description": m.description,
                      "keys": {"partition": m.keys.partition, "sort": m.keys.sort},
                      "from": layout(m.source), "to": layout(m.target),
                      "cleanup": {"ttl_attribute": m.cleanup.ttl_attribute,
                                  "retain_hours": m.cleanup.retain_hours},
                      **({"indexes": _index_specs(m)} if m.indexes else {})},
        "table": {"name": m.table, "status": table.get("TableStatus"), "billing_mode": billing,
                  "provisioned": provisioned, "item_count": int(table.get("ItemCount", 0) or 0),
                  "size_bytes": int(table.get("TableSizeBytes", 0) or 0), "ttl": p.ttl},
        "sample": {"requested": p.sample, "full_scan": p.sample == 0, "segments": p.segments,
                   "scanned": a.scanned, "scale": round(est.scale, 6)},
        "items": {"table": p.table_items, "table_source": p.count_source, "sampled": a.scanned, "mappable": a.mappable,
                  "in_new_layout": a.in_new_layout, "tombstones": a.tombstones,
                  "unmappable": a.unmappable_count, "unmappable_by_reason": dict(sorted(a.unmappable.items())),
                  "unmappable_examples": a.examples, "collisions": a.collisions,
                  "collision_examples": a.collision_examples, "moves": a.moves, "stays": a.mappable - a.moves,
                  "moves_pct": round(100.0 * a.moves / a.mappable, 2) if a.mappable else 0.0,
                  "estimated_moves": round(a.moves * est.scale),
                  "estimated_unmappable": round(a.unmappable_count * est.scale)},
        "distribution": {"old": old.as_dict(), "new": new.as_dict()},
        "moves": (a.alternatives or planning.MoveComparison(a.mapper)).as_dict(est.scale),
        "capacity": est.as_dict(),
        "recommendation": rec.as_dict() if rec else None,
        "warnings": list(p.warnings),
        "start_refuses": list(p.blockers),
        "next": next_commands(p, file, prefix),
        # A combined migration (the table's keys and [index.NAME]): the GSI half, as an index-only plan shows it.
        **({"indexes": [x.as_dict(est.scale) for x in a.index.analyses.values()],
            "capacity_gsi": p.index_capacity["backfill"],
            # Verify runs after the copy: every moved item is then there twice (old and new copy).
            "capacity_gsi_verify": {k: round(v * (1 + a.moves / a.mappable if a.mappable else 1), 1)
                                    for k, v in p.index_capacity["verify"].items()}} if a.index is not None else {}),
    }


def _index_specs(m) -> list[dict]:
    """The file's ``[index.NAME]`` sections as plain data."""
    def layout(spec) -> dict:
        return {"partition": spec.partition_text, "shards": spec.shards,
                "shard_by": "random" if spec.random else list(spec.shard_by),
                "hash": spec.hash, "shard_function": spec.shard_function}
    return [{"name": i.name, "partition": i.partition, "sort": i.sort, "type": i.partition_type,
             "from": layout(i.source), "to": layout(i.target)} for i in m.indexes]


def plan_index_data(p: IndexPlanReport, file: str, prefix: str = "") -> dict:
    """``plan`` of an index-only migration as plain data (the JSON output; the text is rendered from it)."""
    m, table = p.migration, p.table
    billing = (table.get("BillingModeSummary") or {}).get("BillingMode", "PROVISIONED")
    scale = p.capacity["scale"]
    return {
        "migration": {"id": m.id, "file": file, "table": m.table, "description": m.description,
                      "keys": {"partition": m.keys.partition, "sort": m.keys.sort}, "changes_table": False,
                      "indexes": _index_specs(m)},
        "table": {"name": m.table, "status": table.get("TableStatus"), "billing_mode": billing,
                  "item_count": int(table.get("ItemCount", 0) or 0),
                  "size_bytes": int(table.get("TableSizeBytes", 0) or 0)},
        "sample": {"requested": p.sample, "full_scan": p.sample == 0, "segments": p.segments,
                   "scanned": p.analysis.scanned, "scale": scale},
        "items": {"table": p.table_items, "table_source": p.count_source},
        "indexes": [a.as_dict(scale) for a in p.analysis.analyses.values()],
        "capacity": p.capacity,
        "warnings": list(p.warnings),
        "start_refuses": list(p.blockers),
        "next": next_commands_index(m.id, file, prefix, p.capacity.get("max_wcu")),
    }


def next_commands_index(mid: str, file: str, prefix: str = "", max_wcu: float | None = None) -> list[str]:
    """The session of an index-only migration (cleanup has nothing to expire: it deletes the shims' tombstones)."""
    budget = f" --max-wcu {max_wcu:g}" if max_wcu else ""
    return [
        f"reshard{prefix} start {shlex.quote(file)}",
        f"reshard{prefix} advance {mid}            # dual_write: deploy the shim first (queries read both layouts)",
        f"reshard{prefix} advance {mid}            # dual_read: shims write the new GSI values (a switch)",
        f"reshard{prefix} advance {mid}            # backfill",
        f"reshard{prefix} backfill {mid}{budget}   # rewrites the GSI attribute in place",
        f"reshard{prefix} verify {mid}",
        f"reshard{prefix} advance {mid}            # cutover: queries read the new GSI values only",
        f"reshard{prefix} advance {mid}            # cleanup",
        f"reshard{prefix} cleanup {mid}            # nothing to expire: items keep their keys",
        f"reshard{prefix} advance {mid}            # complete",
    ]


def plan_index_text(r: dict) -> str:
    """The text form of :func:`plan_index_data` (same content as the JSON)."""
    m, t, s, cap = r["migration"], r["table"], r["sample"], r["capacity"]
    out = []
    add = out.append
    add(f"Migration {m['id']}  ({m['file']})  index-only: the table's keys do not change")
    if m["description"]:
        add(f"  {m['description']}")
    _index_spec_lines(add, m["indexes"])
    add("")
    add(f"Table {t['name']}: {t['status']}, {t['billing_mode']}, ItemCount {t['item_count']} (DescribeTable), "
        f"{t['size_bytes']} bytes")
    how = "full scan" if s["full_scan"] else f"sample of up to {s['requested']}"
    add(f"Scanned {s['scanned']} items ({how}, {s['segments']} segments); estimates scaled x{s['scale']:g} "
        f"to {r['items']['table']} items, {r['items']['table_source']}")
    _index_lines(add, r["indexes"])
    bf, od = cap["backfill"], cap["on_demand"]
    add("")
    add("Capacity (whole table)")
    add(f"  backfill  {bf['scan_rcu']:>12,.1f} RCU (scan)  {bf['wcu']:>12,.1f} WCU (table {bf['table_wcu']:,.1f} + "
        f"GSI {bf['index_wcu']:,.1f})")
    vf = cap["verify"]
    add(f"  verify    {vf['rcu']:>12,.1f} RCU (scan {vf['scan_rcu']:,.1f} + index side {vf['index_rcu']:,.1f}: "
        "every GSI entry read once by the fan-out over the [to] values)")
    add(f"  cleanup   {cap['cleanup']}")
    if cap["max_wcu"]:
        add(f"  at --max-wcu {cap['max_wcu']:g}: backfill {planning.human_seconds(cap['backfill_seconds'])}")
    else:
        add("  (give --max-wcu N for the time at a write budget)")
    add(f"  on-demand cost: backfill ${od['backfill_usd']:,.4f}  (at ${od['write_price_per_million']:g}/M WRU, "
        f"${od['read_price_per_million']:g}/M RRU: us-east-1 list prices, check yours)")
    _plan_ending(add, r)
    return "\n".join(out)


def _index_spec_lines(add, specs: list[dict]) -> None:
    """The file's ``[index.NAME]`` layouts, one line per side."""
    for ix in specs:
        add(f"  index {ix['name']}: partition {ix['partition']!r} ({ix['type']}, rewritten in place)"
            + (f", sort {ix['sort']!r} (kept)" if ix["sort"] else ""))
        for side in ("from", "to"):
            lay = ix[side]
            if lay["shard_by"] == "random":
                rule = "random"
            elif lay["hash"] == "jump":
                rule = f"jump(sha256({' # '.join(lay['shard_by'])})[:8], {lay['shards']})"
            else:
                rule = f"{lay['hash'] or lay['shard_function']}({' # '.join(lay['shard_by'])}) % {lay['shards']}"
            add(f"    {side:<4} {lay['partition']!r}, {lay['shards']} shards, shard = {rule}")


def _index_lines(add, indexes: list[dict]) -> None:
    """Per ``[index.NAME]``: who is rewritten, the GSI shard skew before/after, the rewrite's WCU."""
    for ix in indexes:
        it = ix["items"]
        add("")
        add(f"Index {ix['name']} (projection {ix['projection']})")
        add(f"  in the index      {it['indexed']:>8}")
        add(f"  not in the index  {it['not_indexed']:>8}  (no {ix['partition']!r}"
            + (f" or no {ix['sort']!r}" if ix["sort"] else "") + ": left alone)")
        add(f"  rewritten         {it['moves']:>8}  ({it['moves_pct']:.1f}% of mappable; ~{it['estimated_moves']} "
            "in the table)")
        add(f"  already new       {it['already_new']:>8}")
        add(f"  unmappable        {it['unmappable']:>8}" + (
            "  (" + ", ".join(f"{k}: {v}" for k, v in it["unmappable_by_reason"].items()) + ")"
            if it["unmappable"] else ""))
        for ex in it["unmappable_examples"]:
            key = ", ".join(f"{k}={v!r}" for k, v in ex["key"].items())
            add(f"    e.g. {key}: {ex['reason']}: {ex['detail']}")
        for name, label in (("old", "now"), ("new", "after (every item at its new value)")):
            d = ix["distribution"][name]
            dist = planning.Distribution(tuple(d["counts"]))
            hot = f"hottest GSI shard {d['hottest_shard']} holds {d['hottest_pct']:.1f}%" if d["total"] else "no items"
            add(f"  Items per GSI shard, {label}, {d['shards']} shards: skew {d['skew']:.2f} (max/mean), {hot}")
            add(planning.histogram(dist, width=30, label="gsi"))
        w = ix["rewrite_wcu"]
        copies = (f" + new copies' GSI puts {w['copies_index']:,.1f}" if w.get("copies_index") else "")
        add(f"  rewrite: {w['total']:,.1f} WCU = table {w['table']:,.1f} + GSI {w['index']:,.1f}{copies} "
            "(an UpdateItem that changes a GSI key also deletes and puts the index entry)")


def _plan_ending(add, r: dict) -> None:
    """What every plan text ends with: warnings, what start will refuse, the next commands."""
    if r["warnings"]:
        add("")
        for w in r["warnings"]:
            add(f"warning: {w}")
    if r["start_refuses"]:
        add("")
        add(f"start will refuse ({len(r['start_refuses'])} problem(s)):")
        for b in r["start_refuses"]:
            add(f"  - {b}")
    add("")
    add("Next:" if not r["start_refuses"] else "Next (once start's problems are fixed):")
    for c in r["next"]:
        add(f"  {c}")


def plan_text(r: dict, a: planning.SampleAnalysis) -> str:
    """The text form of :func:`plan_data` (same content as the JSON)."""
    m, t, s, it, cap = r["migration"], r["table"], r["sample"], r["items"], r["capacity"]
    old, new = a.old_distribution(), a.new_distribution()
    out = []
    add = out.append
    add(f"Migration {m['id']}  ({m['file']})")
    if m["description"]:
        add(f"  {m['description']}")
    for side in ("from", "to"):
        lay = m[side]
        if lay["shard_by"] == "random":
            rule = "random"
        elif lay["hash"] == "jump":  # not a modulo: jump of the first 8 bytes of sha256 (see the README)
            rule = f"jump(sha256({' # '.join(lay['shard_by'])})[:8], {lay['shards']})"
        else:
            rule = f"{lay['hash'] or lay['shard_function']}({' # '.join(lay['shard_by'])}) % {lay['shards']}"
        sort = f", sort {lay['sort']!r}" if lay["sort"] else ""
        add(f"  {side:<4} partition {lay['partition']!r}{sort}, {lay['shards']} shards, shard = {rule}")
    if "indexes" in m:  # combined: the table's keys and these GSIs at once
        _index_spec_lines(add, m["indexes"])
    add("")
    prov = t["provisioned"]
    billing = t["billing_mode"] + (f" ({prov['rcu']} RCU / {prov['wcu']} WCU)" if prov else "")
    ttl = t["ttl"]
    add(f"Table {t['name']}: {t['status']}, {billing}, ItemCount {t['item_count']} (DescribeTable), "
        f"{t['size_bytes']} bytes; TTL {ttl['status']}" + (f" on {ttl['attribute']!r}" if ttl["attribute"] else ""))
    how = "full scan" if s["full_scan"] else f"sample of up to {s['requested']}"
    add(f"Scanned {s['scanned']} items ({how}, {s['segments']} segments); estimates scaled x{s['scale']:g} "
        f"to {it['table']} items, {it['table_source']}")
    add("")
    add("Items")
    add(f"  sampled     {it['sampled']:>8}")
    add(f"  mappable    {it['mappable']:>8}")
    add(f"  unmappable  {it['unmappable']:>8}" + (
        "  (" + ", ".join(f"{k}: {v}" for k, v in it["unmappable_by_reason"].items()) + ")"
        if it["unmappable"] else ""))
    add(f"  collisions  {it['collisions']:>8}" + ("  (old items with other content on the same new key)"
                                                  if it["collisions"] else ""))
    for ex in it["collision_examples"]:
        keys = " and ".join(", ".join(f"{k}={v!r}" for k, v in key.items()) for key in ex["keys"])
        new_key = ", ".join(f"{k}={v!r}" for k, v in ex["new_key"].items())
        add(f"    e.g. {keys} -> {new_key}")
    add(f"  move        {it['moves']:>8}  ({it['moves_pct']:.1f}% of mappable; ~{it['estimated_moves']} in the table)")
    add(f"  stay        {it['stays']:>8}")
    if it["in_new_layout"] or it["tombstones"]:
        add(f"  new layout  {it['in_new_layout']:>8}  (already copied)")
        add(f"  tombstones  {it['tombstones']:>8}")
    for ex in it["unmappable_examples"]:
        key = ", ".join(f"{k}={v!r}" for k, v in ex["key"].items())
        add(f"    e.g. {key}: {ex['reason']}: {ex['detail']}")
    add("")
    for name, d in (("old", old), ("new", new)):
        hot = f"hottest shard {d.hottest_shard} holds {d.hottest_pct:.1f}%" if d.total else "no items"
        add(f"Items per shard, {name} layout ({d.shards} shards): skew {d.skew:.2f} (max/mean), {hot}")
        add(planning.histogram(d, width=30))
        add("")
    add(move_text(r["moves"]))
    if "indexes" in r:
        _index_lines(add, r["indexes"])
    add("")
    bf, cl, od = cap["backfill"], cap["cleanup"], cap["on_demand"]
    add("Capacity (whole table)")
    add(f"  backfill  {bf['rcu']:>12,.1f} RCU (scan {bf['scan_rcu']:,.1f} + fence reads {bf['fence_read_rcu']:,.1f})"
        f"  {bf['wcu']:>12,.1f} WCU")
    add(f"  cleanup   {cl['rcu']:>12,.1f} RCU (scan)  {cl['wcu']:>12,.1f} WCU")
    if cap["max_wcu"]:
        add(f"  at --max-wcu {cap['max_wcu']:g}: backfill {planning.human_seconds(cap['backfill_seconds'])}, "
            f"cleanup {planning.human_seconds(cap['cleanup_seconds'])}")
    else:
        add("  (give --max-wcu N for the time at a write budget)")
    add(f"  on-demand cost: backfill ${od['backfill_usd']:,.4f} + cleanup ${od['cleanup_usd']:,.4f} = "
        f"${od['total_usd']:,.4f}  (at ${od['write_price_per_million']:g}/M WRU, "
        f"${od['read_price_per_million']:g}/M RRU: us-east-1 list prices, check yours)")
    if "capacity_gsi" in r:  # combined: the same backfill also rewrites the GSI values
        g = r["capacity_gsi"]
        add(f"  backfill's GSI half {g['wcu']:>12,.1f} WCU more (old copies' UpdateItem {g['table_wcu']:,.1f} + GSI "
            f"{g['index_wcu']:,.1f}, new copies' GSI puts included); the same scan")
        v = r["capacity_gsi_verify"]
        add(f"  verify    {v['rcu']:>12,.1f} RCU (scan {v['scan_rcu']:,.1f} + index side {v['index_rcu']:,.1f}: "
            "old and new copies, every GSI entry read once by the fan-out over the [to] values)")
    rec = r["recommendation"]
    add("")
    if rec:
        add(f"Recommended shards: {rec['recommended_shards']} = ceil({rec['base_shards']} x {rec['headroom']:g} "
            f"headroom); base = ceil({rec['peak_writes_per_sec']:g} writes/s x ceil({rec['item_kb']:g} KB) / 1000); "
            f"[to] has {rec['to_shards']}")
    else:
        add("Recommended shards: give --peak-writes-per-sec N (and --item-kb K) for a recommendation")
    _plan_ending(add, r)
    return "\n".join(out)


def move_text(mv: dict) -> str:
    """The "Items that move" table of the plan: the [to] layout vs the same with jump."""
    lay = mv["layouts"]
    t = lay["target"]
    heads = [f"this migration (-> {t['shards']})", f"then {t['shards']} -> {t['doubling']['to_shards']}",
             f"then {t['shards']} -> {t['growth']['to_shards']}"]
    out = [f"Items that move (sample of {mv['sampled']}, ~ scaled to the table)",
           ("  " + " " * 22 + "".join(f"{h:<28}" for h in heads)).rstrip()]
    for name, label in (("target", f"[to] {t['hash'] or t['shard_function']}"), ("jump", "[to] with jump")):
        if name == "jump" and t["hash"] == "jump":
            continue
        cells = "".join(f"{100 * lay[name][sc]['fraction']:5.1f}%  ~{lay[name][sc]['estimated_items']:<19,}"
                        for sc in planning.SCENARIOS)
        out.append(f"  {label[:20]:<22}{cells}".rstrip())
    out.append(f"  {mv['advice']}")
    return "\n".join(out)
