"""`reshard cleanup --strip-bookkeeping` against dynalite: refused before complete; after it,
every _rs_v/_rs_new/_rs_src goes and leftover tombstones are deleted; a shim write or delete
between the scan and the REMOVE is never clobbered (forced interleavings)."""

from __future__ import annotations

import pytest

from reshard import operations
from reshard.cli.main import main
from reshard.control.records import META
from reshard.control.store import ControlStore
from reshard.core.layout import NEW_COPY_ATTR, SOURCE_ATTR, VERSION_ATTR
from reshard.core.migration import parse
from reshard.core.phases import STRIP_JOB
from reshard.core.wire import N, S
from reshard.jobs.runner import JobOptions

from tests.backfill_support import migration_text
from tests.shim_helpers import create_table, read_item, scan, shim


def ev(k: int, **extra) -> dict:
    return {"sensor_id": "s-1", "event_id": f"e-{k}", "ts": f"2024-10-27T15:{k:02d}:00Z", **extra}


@pytest.fixture
def done(dynalite, unique_name):
    """A migration forced into ``complete`` on a small table, and a shim on ``complete``."""
    table = unique_name[:50]
    m = parse(migration_text("sensor", table, "m1"), "<m1>")
    create_table(dynalite, m)
    store = ControlStore(dynalite, f"{table}-ctl")
    store.register(m)
    t = shim(m, dynalite, "complete")
    return m, store, t


def force_phase(store: ControlStore, phase: str) -> None:
    store.update(store.mpk("m1"), META, "SET phase = :p, phase_version = :v",
                 values={":p": S(phase), ":v": N(8)})


def bookkept(dynamo, table) -> list[dict]:
    return [i for i in scan(dynamo, table) if any(k.startswith("_rs_") for k in i)]


def test_refused_unless_complete(done, dynalite_server, capsys):
    m, store, _ = done
    force_phase(store, "cleanup")
    code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table, "cleanup", "m1",
                 "--strip-bookkeeping"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("reshard: error: cleanup --strip-bookkeeping refused for 'm1': the migration is in "
                          "cleanup; it runs only after complete")
    assert len(err.strip().splitlines()) == 1


def test_strips_every_item_and_deletes_leftover_tombstones(done, dynalite, dynalite_server, capsys):
    m, store, t = done
    for k in range(4):
        t.put_item(Item=ev(k, temp=k))  # complete: stamped _rs_v, marked _rs_new (the key moved)
    raw = lambda pk, **a: dynalite.call("put_item", TableName=m.table, Item={"PK": S(pk), "SK": S("x"), **a})
    raw("copied", **{SOURCE_ATTR: S("old-key"), NEW_COPY_ATTR: S("m1"), "temp": N(7)})  # unversioned copy
    raw("tomb", _rs_del={"BOOL": True}, _rs_v=S("0001700000000.000000.w"))
    raw("plain", temp=N(1))
    assert len(bookkept(dynalite, m.table)) == 6
    force_phase(store, "complete")
    code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table, "cleanup", "m1",
                 "--strip-bookkeeping", "--segments", "2", "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "       5  items stripped of _rs_v/_rs_new/_rs_src" in out
    assert "       1  leftover delete markers deleted" in out
    assert bookkept(dynalite, m.table) == []
    items = scan(dynalite, m.table)
    assert len(items) == 6 and all("temp" in i for i in items)
    # The shim still reads them (no version, no marker: plain items of the one layout).
    assert read_item(t, Key=ev(2))["temp"] == 2
    # `status` lists the pass with its counters.
    assert main(["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table, "status", "m1"]) == 0
    assert "strip-bookkeeping run 1: 2/2 segments done" in capsys.readouterr().out
    # A later shim write (still on the migration's file) stamps them again, as the docs say.
    t.put_item(Item=ev(2, temp=20))
    assert len(bookkept(dynalite, m.table)) == 1


def _strip_with(dynamo, store, table, hook) -> dict:
    """Run the pass with ``hook`` run once, just before the first REMOVE on ``table`` is sent
    (after the scan read the item)."""
    fired = []

    def before(params, **kwargs):
        if not fired and params.get("TableName") == table and "REMOVE" in params.get("UpdateExpression", ""):
            fired.append(params["Key"])
            hook()

    event = "before-parameter-build.dynamodb.UpdateItem"
    dynamo.client.meta.events.register(event, before)
    try:
        result = operations.run_data_job(STRIP_JOB, dynamo, store, "m1", JobOptions(segments=1, workers=1))
    finally:
        dynamo.client.meta.events.unregister(event, before)
    assert fired, "the pass sent no REMOVE"
    return result.counts


def test_a_shim_write_between_scan_and_strip_keeps_its_version(done, dynalite):
    """Forced: the shim rewrites the item after the scan read it; the REMOVE, conditioned on the
    scanned version, fails, and the item keeps the shim's write with its new version."""
    m, store, t = done
    t.put_item(Item=ev(1, temp=1))
    force_phase(store, "complete")
    counts = _strip_with(dynalite, store, m.table, lambda: t.put_item(Item=ev(1, temp=99)))
    assert (counts["stripped"], counts["changed_meanwhile"]) == (0, 1)
    [item] = scan(dynalite, m.table)
    assert item["temp"] == {"N": "99"} and VERSION_ATTR in item and NEW_COPY_ATTR in item


def test_a_shim_delete_between_scan_and_strip_is_not_undone(done, dynalite):
    """Forced: the shim deletes the item (complete: a tombstone with a newer version) after the
    scan; an unconditioned REMOVE would strip the tombstone's flag and version into a visible
    key-only item -- the condition on the scanned version keeps it deleted."""
    m, store, t = done
    t.put_item(Item=ev(1, temp=1))
    force_phase(store, "complete")
    counts = _strip_with(dynalite, store, m.table, lambda: t.delete_item(Key=ev(1)))
    assert counts["changed_meanwhile"] == 1
    left = scan(dynalite, m.table)
    assert left and all(i.get("_rs_del") == {"BOOL": True} and VERSION_ATTR in i for i in left), left
    assert read_item(t, Key=ev(1)) is None
