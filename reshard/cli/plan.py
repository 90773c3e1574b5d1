"""``reshard plan FILE``: validate a migration against the live table and show what it will do.

Read-only: DescribeTable, DescribeTimeToLive and Scan, nothing else. The arithmetic
lives in :mod:`reshard.core.planning`; this module gathers the inputs and prints them.
"""

from __future__ import annotations

import math
import shlex
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import click

from reshard import errors

from reshard.core import capacity, planning
from reshard.cli.main import cli
from reshard.cli.options import Env, command, max_wcu_option
from reshard.aws.dynamo import Dynamo
from reshard.core.layout import KeyMapper
from reshard.core.migration import Migration, load


@command(cli, short_help="Check a migration file against the live table and estimate the work.")
@click.argument("file", type=click.Path(dir_okay=True))
@click.option("--sample", type=click.IntRange(min=0), default=planning.DEFAULT_SAMPLE, show_default=True,
              help="Items to sample, spread over the scan segments; 0 scans the whole table.")
@click.option("--segments", type=click.IntRange(1, 1000), default=8, show_default=True,
              help="Parallel-scan segments (TotalSegments) for the sample or the full scan.")
@max_wcu_option
@click.option("--peak-writes-per-sec", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Peak writes per second to the hottest entity (for the recommended shard count).")
@click.option("--item-kb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Item size in KB for the recommendation (default: the sample's mean item size).")
@click.option("--headroom", type=click.FloatRange(min=1), default=planning.DEFAULT_HEADROOM, show_default=True,
              help="Factor over the minimum shard count in the recommendation.")
@click.option("--write-price", type=click.FloatRange(min=0), default=planning.DEFAULT_WRITE_PRICE,
              show_default=True, help="USD per million on-demand write request units (us-east-1 list price).")
@click.option("--read-price", type=click.FloatRange(min=0), default=planning.DEFAULT_READ_PRICE,
              show_default=True, help="USD per million on-demand read request units (us-east-1 list price).")
def plan(env: Env, file: str, sample: int, segments: int, max_wcu: float | None,
         peak_writes_per_sec: float | None, item_kb: float | None, headroom: float,
         write_price: float, read_price: float) -> None:
    """Validate FILE against the live table; show items, moves, shard skew, capacity, cost and next steps.

    \b
    Samples --sample items (default 2000) over --segments parallel-scan segments, or
    scans everything with --sample 0. Estimates are scaled to the table's item count.
    On-demand prices default to us-east-1 list prices: check yours.

    \b
    Example:
      reshard plan migrations/0001_sensor_events.toml
      reshard plan migrations/0001_sensor_events.toml --max-wcu 2000 \\
          --peak-writes-per-sec 2000 --item-kb 1
    """
    if item_kb is not None and peak_writes_per_sec is None:
        raise errors.BadInput("--item-kb needs --peak-writes-per-sec (the recommendation uses both)")
    m = load(file)
    mapper = KeyMapper(m)
    dynamo = env.dynamo()
    table = describe(dynamo, m)
    ttl = describe_ttl(dynamo, m.table)

    analysis = planning.SampleAnalysis(mapper)
    full = sample == 0
    if full:
        env.info(f"scanning all of {m.table} ({segments} segments) ...")

    def observe(items: list[dict]) -> None:
        for item in items:
            analysis.observe(item)

    scan_segments(dynamo, m.table, segments, None if full else sample, observe)

    item_count = int(table.get("ItemCount", 0) or 0)
    table_items = analysis.scanned if full else max(item_count, analysis.scanned)
    est = planning.estimate(analysis, table_items, max_wcu=max_wcu,
                            write_price=write_price, read_price=read_price)
    rec = None
    if peak_writes_per_sec is not None:
        if item_kb is None:
            item_kb = math.ceil(analysis.bytes_all / analysis.scanned / capacity.KB) if analysis.scanned else 1
        rec = planning.recommend(peak_writes_per_sec, item_kb, m.target.shards, headroom)

    report = build_report(env, m, file, table, ttl, analysis, est, rec, sample, segments, table_items)
    env.emit(report, lambda: render(report, analysis))


# --------------------------------------------------------------------------- AWS reads

def describe(dynamo: Dynamo, m: Migration) -> dict:
    """DescribeTable, and refuse a table whose key schema is not the file's ``[keys]``."""
    t = dynamo.describe_table(m.table)
    schema = {k["KeyType"]: k["AttributeName"] for k in t.get("KeySchema", [])}
    types = {a["AttributeName"]: a["AttributeType"] for a in t.get("AttributeDefinitions", [])}
    want = {"HASH": m.keys.partition, **({"RANGE": m.keys.sort} if m.keys.sort else {})}
    if schema != want:
        raise errors.TableProblem(f"table {m.table!r} has key schema {_schema_text(schema)} but {m.path} "
                                  f"[keys] says {_schema_text(want)}")
    # A template that is more than one {field} writes a string; a number or binary key
    # attribute would reject every write of the new layout.
    layouts = ((m.keys.partition, m.source.partition, m.target.partition),
                      (m.keys.sort, m.source.sort, m.target.sort))
    for attr, *templates in layouts:
        if attr is None:
            continue
        for parts in templates:
            if parts is not None and not (len(parts) == 1 and parts[0].field and not parts[0].spec) \
                    and types.get(attr, "S") != "S":
                raise errors.TableProblem(f"table {m.table!r}: key attribute {attr!r} has type "
                                          f"{types[attr]} but the templates of {m.path} build strings")
    return t


def describe_ttl(dynamo: Dynamo, table: str) -> dict:
    """TTL status and attribute; ``{"status": "UNKNOWN"}`` if the endpoint cannot tell."""
    try:
        d = dynamo.call("describe_time_to_live", TableName=table).get("TimeToLiveDescription", {})
    except errors.AccessDenied:
        raise
    except errors.AWSError as e:
        return {"status": "UNKNOWN", "attribute": None, "error": e.code}
    return {"status": d.get("TimeToLiveStatus", "DISABLED"), "attribute": d.get("AttributeName")}


def scan_segments(dynamo: Dynamo, table: str, segments: int, sample: int | None,
                  on_page: Callable[[list[dict]], None]) -> None:
    """Scan every parallel-scan segment concurrently, handing each page to ``on_page``.

    With ``sample`` each segment stops after its share (:func:`planning.sample_quota`),
    so the sample comes from every part of the key space, not only the first pages.
    Pages are handed over one at a time under a lock and not kept, so a full scan
    of a large table needs memory for a page per segment only.
    """
    quotas = planning.sample_quota(sample, segments) if sample is not None else [None] * segments
    lock = threading.Lock()

    def one(segment: int) -> None:
        quota = quotas[segment]
        if quota == 0:
            return
        kwargs: dict[str, Any] = {"TableName": table, "Segment": segment, "TotalSegments": segments}
        seen = 0
        while True:
            if quota is not None:
                kwargs["Limit"] = min(1000, quota - seen)
            resp = dynamo.call("scan", **kwargs)
            items = resp.get("Items", [])
            seen += len(items)
            with lock:
                on_page(items)
            lek = resp.get("LastEvaluatedKey")
            if not lek or (quota is not None and seen >= quota):
                return
            kwargs["ExclusiveStartKey"] = lek

    with ThreadPoolExecutor(max_workers=min(segments, 8)) as pool:
        for f in [pool.submit(one, s) for s in range(segments)]:
            f.result()  # re-raise a segment's error


# --------------------------------------------------------------------------- the report

def build_report(env: Env, m: Migration, file: str, table: dict, ttl: dict, a: planning.SampleAnalysis,
                 est: planning.Estimate, rec: planning.Recommendation | None, sample: int, segments: int,
                 table_items: int) -> dict:
    """Everything the plan shows, as plain data (the JSON output; the text is rendered from it)."""
    billing = (table.get("BillingModeSummary") or {}).get("BillingMode", "PROVISIONED")
    pt = table.get("ProvisionedThroughput") or {}
    provisioned = None
    if billing == "PROVISIONED":
        provisioned = {"rcu": pt.get("ReadCapacityUnits"), "wcu": pt.get("WriteCapacityUnits")}
    old, new = a.old_distribution(), a.new_distribution()
    warnings = []
    if m.cleanup.ttl_attribute:
        if ttl["status"] == "UNKNOWN":
            warnings.append(f"could not read the TTL setting of {m.table} ({ttl.get('error')}): make sure TTL "
                            f"is enabled on {m.cleanup.ttl_attribute!r} before cleanup")
        elif ttl["status"] not in ("ENABLED", "ENABLING") or ttl["attribute"] != m.cleanup.ttl_attribute:
            now = (f"TTL is {ttl['status']}" + (f" on {ttl['attribute']!r}" if ttl["attribute"] else ""))
            warnings.append(f"[cleanup] ttl_attribute = {m.cleanup.ttl_attribute!r} but {now} on {m.table}: "
                            f"old items would never expire; enable TTL on {m.cleanup.ttl_attribute!r} "
                            f"before cleanup")
    else:
        warnings.append("[cleanup] has no ttl_attribute: cleanup will delete old-layout items one by one")
    if a.unmappable_count:
        warnings.append(f"{a.unmappable_count} sampled item(s) cannot be mapped: the backfill will count, "
                        "list and skip them (see the examples)")
    if a.in_new_layout or a.tombstones:
        warnings.append(f"{a.in_new_layout} sampled item(s) are already in the new layout and {a.tombstones} are "
                        "tombstones: a migration has written this table (plan is meant for before `start`)")
    if a.scanned == 0:
        warnings.append(f"{m.table} looks empty: nothing to sample, estimates are zero")
    if rec and rec.warning:
        warnings.append(rec.warning)
    if new.total and new.skew > 2:
        # A small sample is uneven by chance alone; say so rather than stay silent.
        noise = (f" (only {new.mean:.1f} sampled items per shard: part of that is sampling noise)"
                 if new.mean < 20 else "")
        warnings.append(f"new layout is skewed: the hottest shard holds {new.hottest_pct:.1f}% "
                        f"(skew {new.skew:.2f}); check shard_by has enough distinct values{noise}")

    prefix = _global_prefix(env)
    fq = shlex.quote(file)
    mid = m.id
    segs = max(1, min(16, segments * 2))
    budget = f" --max-wcu {est.max_wcu:g}" if est.max_wcu else ""
    next_commands = [
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

    def layout(spec) -> dict:
        return {"partition": spec.partition_text, "sort": spec.sort_text, "shards": spec.shards,
                "shard_by": "random" if spec.random else list(spec.shard_by),
                "hash": spec.hash, "shard_function": spec.shard_function}

    return {
        "migration": {"id": m.id, "file": file, "table": m.table, "description": m.description,
                      "keys": {"partition": m.keys.partition, "sort": m.keys.sort},
                      "from": layout(m.source), "to": layout(m.target),
                      "cleanup": {"ttl_attribute": m.cleanup.ttl_attribute,
                                  "retain_hours": m.cleanup.retain_hours}},
        "table": {"name": m.table, "status": table.get("TableStatus"), "billing_mode": billing,
                  "provisioned": provisioned, "item_count": int(table.get("ItemCount", 0) or 0),
                  "size_bytes": int(table.get("TableSizeBytes", 0) or 0), "ttl": ttl},
        "sample": {"requested": sample, "full_scan": full_scan(sample), "segments": segments,
                   "scanned": a.scanned, "scale": round(est.scale, 6)},
        "items": {"table": table_items, "sampled": a.scanned, "mappable": a.mappable,
                  "in_new_layout": a.in_new_layout, "tombstones": a.tombstones,
                  "unmappable": a.unmappable_count, "unmappable_by_reason": dict(sorted(a.unmappable.items())),
                  "unmappable_examples": a.examples, "moves": a.moves, "stays": a.mappable - a.moves,
                  "moves_pct": round(100.0 * a.moves / a.mappable, 2) if a.mappable else 0.0,
                  "estimated_moves": round(a.moves * est.scale),
                  "estimated_unmappable": round(a.unmappable_count * est.scale)},
        "distribution": {"old": old.as_dict(), "new": new.as_dict()},
        "capacity": est.as_dict(),
        "recommendation": rec.as_dict() if rec else None,
        "warnings": warnings,
        "next": next_commands,
    }


def full_scan(sample: int) -> bool:
    return sample == 0


def _global_prefix(env: Env) -> str:
    out = ""
    if env.endpoint_url:
        out += f" --endpoint-url {shlex.quote(env.endpoint_url)}"
    if env.region:
        out += f" --region {shlex.quote(env.region)}"
    if env.profile:
        out += f" --profile {shlex.quote(env.profile)}"
    return out


def _schema_text(schema: dict) -> str:
    return ", ".join(f"{v} ({k})" for k, v in sorted(schema.items())) or "(none)"


def render(r: dict, a: planning.SampleAnalysis) -> str:
    """The text form of the report (same content as the JSON)."""
    m, t, s, it, cap = r["migration"], r["table"], r["sample"], r["items"], r["capacity"]
    old, new = a.old_distribution(), a.new_distribution()
    out = []
    add = out.append
    add(f"Migration {m['id']}  ({m['file']})")
    if m["description"]:
        add(f"  {m['description']}")
    for side in ("from", "to"):
        lay = m[side]
        rule = "random" if lay["shard_by"] == "random" else \
            f"{lay['hash'] or lay['shard_function']}({' # '.join(lay['shard_by'])}) % {lay['shards']}"
        sort = f", sort {lay['sort']!r}" if lay["sort"] else ""
        add(f"  {side:<4} partition {lay['partition']!r}{sort}, {lay['shards']} shards, shard = {rule}")
    add("")
    prov = t["provisioned"]
    billing = t["billing_mode"] + (f" ({prov['rcu']} RCU / {prov['wcu']} WCU)" if prov else "")
    ttl = t["ttl"]
    add(f"Table {t['name']}: {t['status']}, {billing}, {t['item_count']} items (DescribeTable), "
        f"{t['size_bytes']} bytes; TTL {ttl['status']}" + (f" on {ttl['attribute']!r}" if ttl["attribute"] else ""))
    how = "full scan" if s["full_scan"] else f"sample of up to {s['requested']}"
    add(f"Scanned {s['scanned']} items ({how}, {s['segments']} segments); estimates scaled x{s['scale']:g} "
        f"to {it['table']} items")
    add("")
    add("Items")
    add(f"  sampled     {it['sampled']:>8}")
    add(f"  mappable    {it['mappable']:>8}")
    add(f"  unmappable  {it['unmappable']:>8}" + (
        "  (" + ", ".join(f"{k}: {v}" for k, v in it["unmappable_by_reason"].items()) + ")"
        if it["unmappable"] else ""))
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
    bf, cl, od = cap["backfill"], cap["cleanup"], cap["on_demand"]
    add("Capacity (whole table)")
    add(f"  backfill  {bf['rcu']:>12,.1f} RCU (scan {bf['scan_rcu']:,.1f} + read-back {bf['readback_rcu']:,.1f})"
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
    rec = r["recommendation"]
    add("")
    if rec:
        add(f"Recommended shards: {rec['recommended_shards']} = ceil({rec['base_shards']} x {rec['headroom']:g} "
            f"headroom); base = ceil({rec['peak_writes_per_sec']:g} writes/s x ceil({rec['item_kb']:g} KB) / 1000); "
            f"[to] has {rec['to_shards']}")
    else:
        add("Recommended shards: give --peak-writes-per-sec N (and --item-kb K) for a recommendation")
    if r["warnings"]:
        add("")
        for w in r["warnings"]:
            add(f"warning: {w}")
    add("")
    add("Next:")
    for c in r["next"]:
        add(f"  {c}")
    return "\n".join(out)
