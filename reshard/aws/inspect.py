"""Read-only looks at a data table: its key schema, its TTL, a sample of its items.

Every check that ``start``, ``plan`` and ``cleanup`` make of the live table before
they act lives here once, so two commands cannot disagree about the same table
(``start`` and ``plan`` word a key mismatch differently, but decide it with the same
:func:`key_mismatch`). Nothing here writes.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, ContextManager

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.core import planning
from reshard.core.capacity import page_scan_units
from reshard.core.migration import Migration


def key_schema(desc: dict) -> dict[str, str]:
    """KeyType (HASH, RANGE) -> attribute name, from a DescribeTable answer."""
    return {k["KeyType"]: k["AttributeName"] for k in desc.get("KeySchema", [])}


def wanted_key_schema(m: Migration) -> dict[str, str]:
    """The key schema the migration file's ``[keys]`` names."""
    return {"HASH": m.keys.partition, **({"RANGE": m.keys.sort} if m.keys.sort else {})}


def key_mismatch(desc: dict, m: Migration) -> tuple[dict, dict] | None:
    """(table's, file's) key schemas when they differ, else None.

    Every layout writes the key attributes the file names: a table keyed otherwise
    would reject (or misplace) every write of the shim.
    """
    have, want = key_schema(desc), wanted_key_schema(m)
    return None if have == want else (have, want)


def string_key_problem(desc: dict, m: Migration) -> str | None:
    """Why the table's key attribute types cannot hold the layouts' keys, or None.

    A template that is more than one bare ``{field}`` writes a string; a number or
    binary key attribute would reject every write of that layout.
    """
    types = {a["AttributeName"]: a["AttributeType"] for a in desc.get("AttributeDefinitions", [])}
    layouts = ((m.keys.partition, m.source.partition, m.target.partition),
               (m.keys.sort, m.source.sort, m.target.sort))
    for attr, *templates in layouts:
        if attr is None:
            continue
        for parts in templates:
            if parts is not None and not (len(parts) == 1 and parts[0].field and not parts[0].spec) \
                    and types.get(attr, "S") != "S":
                return (f"table {m.table!r}: key attribute {attr!r} has type "
                        f"{types[attr]} but the templates of {m.path} build strings")
    return None


def check_keys(dynamo: Dynamo, m: Migration) -> dict:
    """DescribeTable; the table must exist and have the key attributes the file names.

    What ``start`` checks (TableProblem, exit 2, otherwise).
    """
    desc = dynamo.describe_table(m.table)  # TableProblem when missing
    mismatch = key_mismatch(desc, m)
    if mismatch:
        def show(d: dict) -> str:
            return f"partition {d.get('HASH')!r}, sort {d.get('RANGE')!r}"
        have, want = mismatch
        raise errors.TableProblem(f"{m.path}: keys: table {m.table!r} has {show(have)}, "
                                  f"the file says {show(want)}")
    return desc


def check_plannable(dynamo: Dynamo, m: Migration) -> dict:
    """DescribeTable; refuse a table whose keys cannot hold the file's layouts.

    What ``plan`` checks: the key schema (worded for the plan report) and the key types.
    """
    desc = dynamo.describe_table(m.table)
    mismatch = key_mismatch(desc, m)
    if mismatch:
        have, want = mismatch
        raise errors.TableProblem(f"table {m.table!r} has key schema {_schema_text(have)} but {m.path} "
                                  f"[keys] says {_schema_text(want)}")
    problem = string_key_problem(desc, m)
    if problem:
        raise errors.TableProblem(problem)
    return desc


def _schema_text(schema: dict) -> str:
    return ", ".join(f"{v} ({k})" for k, v in sorted(schema.items())) or "(none)"


def ttl_status(dynamo: Dynamo, table: str) -> tuple[str, str | None]:
    """(status, attribute) of the table's TTL, from DescribeTimeToLive."""
    d = dynamo.call("describe_time_to_live", TableName=table).get("TimeToLiveDescription", {})
    return d.get("TimeToLiveStatus", "DISABLED"), d.get("AttributeName")


def ttl_report(dynamo: Dynamo, table: str) -> dict:
    """TTL status and attribute for a report; ``UNKNOWN`` when the endpoint cannot tell.

    A planning report should not fail on a server without DescribeTimeToLive (dynalite),
    but missing permissions are the operator's to fix, so they still raise.
    """
    try:
        status, attribute = ttl_status(dynamo, table)
    except errors.AccessDenied:
        raise
    except errors.AWSError as e:
        return {"status": "UNKNOWN", "attribute": None, "error": e.code}
    return {"status": status, "attribute": attribute}


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


def scan_matching(dynamo: Dynamo, table: str, filter_expression: str, names: dict, page_size: int = 1000,
                  spend: Callable[[str, float], ContextManager] | None = None) -> tuple[list[dict], int, float]:
    """Every item of ``table`` matching a filter (one consistent Scan, page by page):
    (items, items scanned, read units consumed). Reads the whole table once; ``spend``
    (a capacity budget's) paces each page."""
    spend = spend or (lambda kind, units: contextlib.nullcontext())
    out, scanned, units = [], 0, 0.0
    kwargs: dict[str, Any] = {"TableName": table, "FilterExpression": filter_expression,
                              "ExpressionAttributeNames": names, "ConsistentRead": True, "Limit": page_size,
                              "ReturnConsumedCapacity": "TOTAL"}
    while True:
        with spend("read", page_scan_units(page_size, 1024.0, consistent=True)):
            resp = dynamo.call("scan", **kwargs)
        out.extend(resp.get("Items", []))
        scanned += int(resp.get("ScannedCount", 0))
        units += float(resp.get("ConsumedCapacity", {}).get("CapacityUnits", 0) or 0)
        if not resp.get("LastEvaluatedKey"):
            return out, scanned, units
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def count_items(dynamo: Dynamo, table: str, segments: int, on_count: Callable[[int], None],
                pace: Callable[[], ContextManager] | None = None,
                exclude: tuple[str, dict] | None = None) -> int:
    """The exact item count: a parallel ``Select=COUNT`` scan (every segment at once).

    A COUNT scan returns no items but is charged like a full scan (0.5 RCU per 4 KB,
    eventually consistent), so ``pace`` (a budget's ``spend``) wraps every page.
    ``on_count`` gets each page's count, under a lock (a progress bar). ``exclude``: a
    ``(FilterExpression, ExpressionAttributeNames)`` the counted items must pass (the
    filter saves nothing: the scan reads every item).
    """
    lock = threading.Lock()
    totals = [0] * segments

    def one(segment: int) -> None:
        kwargs: dict[str, Any] = {"TableName": table, "Segment": segment, "TotalSegments": segments,
                                  "Select": "COUNT", "ReturnConsumedCapacity": "TOTAL"}
        if exclude is not None:
            kwargs["FilterExpression"], kwargs["ExpressionAttributeNames"] = exclude[0], dict(exclude[1])
        while True:
            with pace() if pace is not None else contextlib.nullcontext():
                resp = dynamo.call("scan", **kwargs)
            n = int(resp.get("Count", 0))
            totals[segment] += n
            with lock:
                on_count(n)
            lek = resp.get("LastEvaluatedKey")
            if not lek:
                return
            kwargs["ExclusiveStartKey"] = lek

    with ThreadPoolExecutor(max_workers=min(segments, 8)) as pool:
        for f in [pool.submit(one, s) for s in range(segments)]:
            f.result()
    return sum(totals)
