"""Issue 25 case 6: the previous migration's leftovers, on dynalite (no late request is
involved: no proxy needed).

* Cleanup's TTL marking also marks each retired old-layout item ``_rs_gone`` = the migration.
  A second migration started inside the first one's ``retain_hours`` meets those items (their
  TTL has not fired yet): ``start``'s sample, the backfill and verify skip them (not
  unmappable, not missing), and a copy replaces one that sits at its new key (it would keep
  the TTL and expire the item). Fails without the mark: ``start`` refuses the leftovers as
  unmappable (their keys were computed with the first migration's shard count), and the
  reverse migration keeps them as the new copies, TTL included.
* A retired migration's copies are judged by their marker alone: a copy whose version was
  stamped by a writer whose clock runs 10 minutes ahead of the operator's is still removed
  (doctor --repair, and the next migration's cleanup pass). Fails with the old rule (the
  version's wall time against the retire's).
"""

from __future__ import annotations

import dataclasses
import time

from reshard import operations
from reshard.aws.dynamo import from_wire
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core.layout import GONE_ATTR, NEW_COPY_ATTR, VERSION_ATTR, KeyMapper, is_tombstone
from reshard.core.migration import parse
from reshard.core.phases import Action, Phase
from reshard.core.versions import VersionClock
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.cleanup import CLEANUP
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.verify import VERIFY

from tests.backfill_support import create_table, key_str, logical, scan_all
from tests.shim_helpers import shim

OPTS = dict(segments=2, workers=1, lease_seconds=30, concurrency=1)
#: dynalite has no UpdateTimeToLive: the pass's check of the table's TTL setting is skipped.
CLEANUP_ON_DYNALITE = dataclasses.replace(CLEANUP, prepare=lambda ctx: None)
N_ITEMS = 24


def sensor(mid: str, table: str, frm: int, to: int):
    return parse(f'id = "{mid}"\ntable = "{table}"\n[keys]\npartition = "PK"\nsort = "SK"\n'
                 f'[from]\npartition = "{{sensor_id}}#{{shard}}"\nsort = "{{ts}}"\nshards = {frm}\n'
                 f'shard_by = ["event_id"]\n[to]\npartition = "{{sensor_id}}#{{shard}}"\nsort = "{{ts}}"\n'
                 f'shards = {to}\nshard_by = ["event_id"]\n[cleanup]\nttl_attribute = "expires_at"\n'
                 f'retain_hours = 168\n', f"<{mid}>")


def advance(store, mid, action=Action.ADVANCE):
    return transition(store, mid, action, allow_no_shims=True)[1]


def first_migration_complete(dynamo, table: str):
    """Migration 1 (4 -> 8 shards) from start to complete, old items TTL-marked by cleanup; then
    the app deletes one item and updates another (a complete-phase shim: the new layout only)."""
    m1 = sensor("m1", table, 4, 8)
    mapper = KeyMapper(m1)
    create_table(dynamo, table, mapper)
    items = [logical("sensor", i) for i in range(N_ITEMS)]
    for x in items:
        dynamo.call("put_item", TableName=table, Item=mapper.to_physical(x, mapper.old))
    store = ControlStore(dynamo, table + "-c")
    operations.start(dynamo, store, m1, sample=0, server_deadline=False)
    for _ in range(3):
        advance(store, m1.id)
    assert run_job(BACKFILL, dynamo, store, m1.id, JobOptions(**OPTS)).done
    assert run_job(VERIFY, dynamo, store, m1.id, JobOptions(**OPTS)).passed
    advance(store, m1.id)
    assert run_job(VERIFY, dynamo, store, m1.id, JobOptions(**OPTS)).passed  # the catch-up verify
    advance(store, m1.id)
    result = run_job(CLEANUP_ON_DYNALITE, dynamo, store, m1.id, JobOptions(**OPTS))
    assert result.done and result.totals["expiring"] > 0
    assert advance(store, m1.id).phase is Phase.COMPLETE
    moved = [x for x in items if mapper.moves(mapper.to_physical(x, mapper.old))]
    gone, kept = moved[0], moved[1]
    app = shim(m1, dynamo, phase="complete")
    app.delete_item(Key={f: v for f, v in from_wire(gone).items() if f in mapper.key_fields})
    leftovers = [i for i in scan_all(dynamo, table).values() if GONE_ATTR in i]
    assert len(leftovers) == len(moved) and all(i[GONE_ATTR] == {"S": "m1"} and "expires_at" in i
                                               for i in leftovers)
    return store, items, gone, kept, moved


def test_a_second_migration_within_retain_hours_skips_the_first_ones_leftovers(dynalite, unique_name):
    store, items, gone, kept, moved = first_migration_complete(dynalite, unique_name)
    m2 = sensor("m2", unique_name, 8, 16)
    started = operations.start(dynalite, ControlStore(dynalite, unique_name + "-c"), m2, sample=0,
                               server_deadline=False)
    assert started.checked.unmappable_count == 0  # the leftovers are not items to plan for
    for _ in range(3):
        advance(store, m2.id)
    result = run_job(BACKFILL, dynalite, store, m2.id, JobOptions(**OPTS))
    assert result.done and result.totals["unmappable"] == 0
    assert result.totals["not_data"] == len(moved) + 1  # every leftover, and the table marker
    assert run_job(VERIFY, dynalite, store, m2.id, JobOptions(**OPTS)).passed
    mapper2 = KeyMapper(m2)
    left = scan_all(dynalite, unique_name)
    # The deleted item is not copied back: at most its tombstone (complete deletes with one) is.
    copied = left.get(key_str(mapper2.to_physical(gone, mapper2.new)))
    assert copied is None or is_tombstone(copied), copied


def test_the_reverse_migration_replaces_the_leftovers_at_its_new_keys(dynalite, unique_name):
    store, items, gone, kept, moved = first_migration_complete(dynalite, unique_name)
    m2 = sensor("m2", unique_name, 8, 4)  # back: its new keys are where migration 1's leftovers wait
    # (The allowance only lets the code without the mark get as far as the copies: with it,
    # the leftovers are not unmappable and the allowance is never used.)
    operations.start(dynalite, ControlStore(dynalite, unique_name + "-c"), m2, sample=0, server_deadline=False,
                     allow_unmappable=len(moved))
    for _ in range(3):
        advance(store, m2.id)
    assert run_job(BACKFILL, dynalite, store, m2.id, JobOptions(**OPTS)).done
    assert run_job(VERIFY, dynalite, store, m2.id, JobOptions(**OPTS)).passed
    mapper2 = KeyMapper(m2)
    left = scan_all(dynalite, unique_name)
    for x in items:
        if x is gone:
            continue
        copy = left[key_str(mapper2.to_physical(x, mapper2.new))]
        # A live item's copy in the new layout: never the leftover, whose TTL would delete it.
        assert GONE_ATTR not in copy and "expires_at" not in copy, copy


def test_a_retired_migrations_copy_stamped_by_a_clock_ten_minutes_ahead_is_still_removed(dynalite, unique_name):
    m1 = sensor("m1", unique_name, 4, 8)
    mapper = KeyMapper(m1)
    create_table(dynalite, unique_name, mapper)
    store = ControlStore(dynalite, unique_name + "-c")
    operations.start(dynalite, store, m1, sample=0, server_deadline=False)
    advance(store, m1.id)
    advance(store, m1.id, Action.ABORT)
    assert operations.run_data_job("cleanup", dynalite, store, m1.id, JobOptions(**OPTS)).done
    assert store.load_state(m1.id).retired
    # A copy of migration 1 left behind (by anything), versioned by a writer whose clock is
    # 10 minutes ahead of the operator's: its version's wall time is after the retire.
    ahead = VersionClock("shim-ahead", now_ms=lambda: (time.time_ns() // 1_000_000) + 600_000)
    x = logical("sensor", 5)
    copy = dict(mapper.to_physical(x, mapper.new), **{VERSION_ATTR: {"S": ahead.next()}, NEW_COPY_ATTR: {"S": "m1"}})
    dynalite.call("put_item", TableName=unique_name, Item=copy)

    report = operations.doctor(store, dynalite, m1.id)
    assert [f.kind for f in report.diagnosis.findings] == ["retired_copies"], report.text()
    # The next migration's cleanup pass removes it too (its own copy of the same item stays).
    m2 = sensor("m2", unique_name, 4, 8)
    operations.start(dynalite, store, m2, sample=0, server_deadline=False)
    advance(store, m2.id)
    advance(store, m2.id, Action.ABORT)
    result = operations.run_data_job("cleanup", dynalite, store, m2.id, JobOptions(**OPTS))
    assert result.totals["retired_copies_removed"] == 1, result.totals
    assert key_str(copy) not in scan_all(dynalite, unique_name)
    assert operations.doctor(store, dynalite).healthy
