"""Jobs on eventually consistent scans (issue 29): what the fidelity proxy's stale reads exposed.

A Scan without ``ConsistentRead`` may show an item as it was up to about a second ago: not
yet there if it was just written, at its previous version if just updated. The cleanup runs
right after the fleet entered ``cleanup`` (or the abort), when the last mirror writes of
``cutover`` (or the last copies of a backfill) may have landed a moment before its scan; a
strip runs when the last bookkeeping writes may have just landed. Each decides from the
scanned item alone (write it, or skip it) and never passes again: an item its stale page did
not show was never marked, removed or stripped. They now scan consistently (twice the read
units of the scan; every item they find costs a write anyway).

Each test writes through the proxy at one instant of its injected clock and runs the job
at that same instant: every non-consistent read is then as of before those writes.
"""

from __future__ import annotations

import pytest

from reshard.aws.dynamo import Dynamo, RetryPolicy, to_wire
from reshard.aws.fidelity import FidelityProxy
from reshard.control.records import META
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper, NEW_COPY_ATTR, VERSION_ATTR
from reshard.core.migration import parse
from reshard.core.wire import N, S
from reshard.jobs.cleanup import CLEANUP
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.strip import STRIP

from tests.backfill_support import migration_text
from tests.shim_helpers import create_table, scan, shim


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def ev(k: int, **extra) -> dict:
    return {"sensor_id": "s-1", "event_id": f"e-{k}", "ts": f"2024-10-27T15:{k:02d}:00Z", **extra}


@pytest.fixture
def setup(dynalite, dynalite_server, unique_name):
    table = unique_name[:50]
    m = parse(migration_text("sensor", table, "m1"), "<m1>")
    create_table(dynalite, m)
    store = ControlStore(dynalite, f"{table}-ctl")
    store.register(m)
    clock = Clock()
    with FidelityProxy(dynalite_server.endpoint, monotonic=clock, stale_reads=True, stale_probability=1.0,
                       stale_window=5.0, ttl=True, ttl_sweep_seconds=3600.0) as proxy:
        stale = Dynamo(endpoint_url=proxy.endpoint, region="us-east-1", connect_timeout=1, read_timeout=4,
                       retry=RetryPolicy(max_attempts=5, base_seconds=0.01))
        yield m, store, stale, clock, proxy


def force_phase(store: ControlStore, phase: str) -> None:
    store.update(store.mpk("m1"), META, "SET phase = :p, phase_version = :v", values={":p": S(phase), ":v": N(8)})


def test_cleanup_marks_old_copies_mirrored_just_before_its_scan(setup, dynalite):
    m, store, stale, clock, proxy = setup
    mapper = KeyMapper(m)
    cut = shim(m, stale, "cutover")          # writes the new layout, mirrors the old
    for k in range(12):
        cut.put_item(Item=ev(k, temp=k))
    clock.t += 100
    for k in range(6):                       # the last mirrors of cutover: updates ...
        cut.update_item(Key=ev(k), UpdateExpression="SET #t = :t", ExpressionAttributeNames={"#t": "temp"},
                        ExpressionAttributeValues={":t": 50 + k})
    for k in range(12, 18):                  # ... and new items
        cut.put_item(Item=ev(k, temp=k))
    force_phase(store, "cleanup")
    # What the proxy serves now: a non-consistent read of a late item does not show it yet.
    assert "Item" not in stale.call("get_item", TableName=m.table, Key=mapper.old.key(mapper.logical_fields(
        to_wire(ev(12)))))
    result = run_job(CLEANUP, stale, store, "m1", JobOptions(segments=1, workers=1, enable_ttl=True))
    assert result.done
    late = {f"e-{k}" for k in (*range(6), *range(12, 18))}
    old_copies = [i for i in scan(dynalite, m.table) if not mapper.is_new_copy(i)
                  and mapper.new.key(mapper.fields(i, mapper.old)) != {a: i[a] for a in ("PK", "SK")}]
    assert len(old_copies) >= 6 and late & {i["event_id"]["S"] for i in old_copies}
    unmarked = sorted(i["event_id"]["S"] for i in old_copies if m.cleanup.ttl_attribute not in i)
    assert unmarked == [], f"old copies cleanup never gave a TTL: {unmarked}"


def test_an_aborted_migrations_cleanup_removes_copies_landed_just_before_its_scan(setup, dynalite):
    m, store, stale, clock, proxy = setup
    mapper = KeyMapper(m)
    app = shim(m, stale, "backfill")          # old authoritative, new mirrored: marked copies
    for k in range(4):
        app.put_item(Item=ev(k, temp=k))
    clock.t += 100
    # A backfill's last copies land (marked, versioned) right before the abort's cleanup starts.
    for k in range(4, 7):
        item = mapper.to_physical(to_wire(ev(k, temp=k)), mapper.new)
        item[NEW_COPY_ATTR] = S("m1")
        item[VERSION_ATTR] = S(f"0001700000000.00000{k}.copy")
        stale.call("put_item", TableName=m.table, Item=item)
    force_phase(store, "aborted")
    result = run_job(CLEANUP, stale, store, "m1", JobOptions(segments=1, workers=1, lease_wait=0))
    assert result.done
    left = [i for i in scan(dynalite, m.table) if mapper.is_new_copy(i)]
    assert left == [], f"new copies the abort's cleanup left behind: {[i['SK']['S'] for i in left]}"


def test_strip_strips_items_written_just_before_its_scan(setup, dynalite):
    m, store, stale, clock, proxy = setup
    done = shim(m, stale, "complete")
    for k in range(3):
        done.put_item(Item=ev(k, temp=k))
    clock.t += 100
    for k in range(3, 6):
        done.put_item(Item=ev(k, temp=k))
    force_phase(store, "complete")
    result = run_job(STRIP, stale, store, "m1", JobOptions(segments=1, workers=1))
    assert result.done
    kept = [i["SK"]["S"] for i in scan(dynalite, m.table) if any(a.startswith("_rs_") for a in i)]
    assert kept == [], f"items the strip never stripped: {kept}"


def test_an_aborted_index_migrations_rewrite_back_sees_the_backfills_last_rewrites(dynalite, dynalite_server,
                                                                                    unique_name):
    from reshard import operations
    from reshard.control.transition import transition
    from reshard.core.index import IndexMapper
    from reshard.core.phases import Action

    from tests.index_support import create_gsi_table, header, setup_index_migration

    table = unique_name
    create_gsi_table(dynalite, table)
    m, store = setup_index_migration(dynalite, table, table + "-ctl")  # backfill
    clock = Clock()
    with FidelityProxy(dynalite_server.endpoint, monotonic=clock, stale_reads=True, stale_probability=1.0,
                       stale_window=5.0) as proxy:
        stale = Dynamo(endpoint_url=proxy.endpoint, region="us-east-1", connect_timeout=1, read_timeout=4,
                       retry=RetryPolicy(max_attempts=5, base_seconds=0.01))
        for i in range(12):
            stale.call("put_item", TableName=table, Item=header(i, shard=i % 4))
        clock.t += 100
        opts = JobOptions(segments=1, workers=1, lease_seconds=15)
        assert operations.run_data_job("backfill", stale, store, m.id, opts).done  # rewrites land now
        transition(store, m.id, Action.ABORT, allow_no_shims=True)
        cleaned = operations.run_data_job("cleanup", stale, store, m.id, opts)      # ... and the abort's too
        assert cleaned.finished
    mapper = IndexMapper(m.indexes[0])
    items = scan(dynalite, table)
    assert len(items) == 12
    still_new = [i["PK"]["S"] for i in items if not mapper.is_at(i, "old")]
    assert still_new == [], f"items the abort left at their new GSI value: {still_new}"
