"""What the benchmarks need besides reshard itself: an example migration on a fresh
table, moved to the backfill phase, and items to fill it with.

Everything else comes from the package (:mod:`reshard.aws.local` starts dynalite), so a
benchmark never depends on the test suite.
"""

from __future__ import annotations

import pathlib
import random
from typing import Iterator

from reshard import operations
from reshard.aws import local
from reshard.aws.dynamo import to_wire
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper
from reshard.core.migration import load, parse
from reshard.core.phases import Action

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIGRATIONS = {
    "sensor": ROOT / "migrations" / "0001_sensor_events.toml",
    "invoices": ROOT / "migrations" / "0002_invoices.toml",
    "hourly": ROOT / "migrations" / "0003_sensor_hourly.toml",
}


def migration_text(kind: str, table: str, mid: str | None = None) -> str:
    """The example migration file with another table name (and id)."""
    text = MIGRATIONS[kind].read_text()
    m = load(MIGRATIONS[kind])
    text = text.replace(f'table = "{m.table}"', f'table = "{table}"')
    if mid:
        text = text.replace(f'id = "{m.id}"', f'id = "{mid}"')
    return text


def setup_migration(dynamo, kind: str, table: str, control: str, mid: str):
    """Create the data table, register the migration and advance it to ``backfill``."""
    m = parse(migration_text(kind, table, mid), f"<{kind}>")
    mapper = KeyMapper(m)
    local.create_table(dynamo, table, m.keys)
    store = ControlStore(dynamo, control)
    store.register(m)
    for _ in range(3):  # planned -> dual_write -> dual_read -> backfill (no shims: acknowledged at once)
        operations.transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    return m, mapper, store


def logical(kind: str, i: int) -> dict:
    """A logical item (wire format) of the migration ``kind``, number ``i``."""
    if kind == "invoices":
        base = {"invoice_number": str(100000 + i // 4), "line": str(i % 4)}
    else:
        base = {"sensor_id": f"s-{i % 7}", "event_id": f"e-{i}",
                "ts": f"2024-10-27T{i % 24:02d}:{(i // 24) % 60:02d}:{i % 60:02d}.{i:06d}Z"}
    base.update({"temp": i % 50, "note": "x" * (i % 5)})
    return to_wire(base)


def old_items(mapper: KeyMapper, kind: str, n: int, seed: int = 1) -> Iterator[dict]:
    """``n`` pre-migration items as the application wrote them: the old layout, with a
    random shard per item when that layout shards at random."""
    rng = random.Random(seed)
    for i in range(n):
        shard = rng.randrange(mapper.old.shards) if mapper.old.random else None
        yield mapper.to_physical(logical(kind, i), mapper.old, shard)


def latency_client(endpoint: str, latency_ms: float):
    """A reshard client whose every request sleeps ``latency_ms`` in ``before-send`` (an emulated
    network round trip; boto3 and reshard's lean path both emit it). Module-level, so a spawned
    ``--processes`` child can build its own."""
    import time

    from reshard.aws.dynamo import Dynamo, RetryPolicy

    # Timeouts within a third of the default lease, so run_job keeps this client (and its hook).
    d = Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(base_seconds=0.02), connect_timeout=5,
               read_timeout=10)
    if latency_ms > 0:
        d.client.meta.events.register("before-send.dynamodb", lambda **kw: time.sleep(latency_ms / 1000))
    return d


def machine_cpu() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (Linux /proc/stat; (0, 0) elsewhere):
    with :func:`busy_since`, how much of the cores anything used during a run, so a figure can
    say whether its own processes or other load had the cores."""
    try:
        ticks = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks[:8]) - idle, sum(ticks[:8])


def busy_since(before: tuple[int, int]) -> float | None:
    """The fraction of all cores busy (any process) since ``before`` (a :func:`machine_cpu`)."""
    busy, total = machine_cpu()
    return round((busy - before[0]) / (total - before[1]), 3) if total > before[1] else None
