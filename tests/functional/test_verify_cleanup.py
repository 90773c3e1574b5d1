"""verify, the cutover gate, cleanup, abort and retire on moto (small tables)."""

from __future__ import annotations

import time

import pytest

from reshard import errors


from reshard.core.layout import NEW_COPY_ATTR, VERSION_ATTR, is_tombstone
from reshard.core.phases import Action, Phase
from reshard.control.gates import verify_missing
from reshard.core.versions import version_of
from reshard.core.wire import key_of
from reshard.control.transition import transition
from reshard.jobs.runner import run_job
from reshard.jobs.runner import JobOptions
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.verify import VERIFY
from reshard.jobs.cleanup import CLEANUP

from tests.backfill_support import Shim, logical, scan_all, setup_migration

FAST = dict(segments=2, workers=1, page_size=50)


def backfilled(dynamo, kind="sensor", n=40, table=None):
    """A migration in the backfill phase with n seeded items, a few shim writes, backfilled."""
    m, mapper, store = setup_migration(dynamo, kind, table or f"V{kind}")
    shim = Shim(dynamo, mapper, m.table)
    for i in range(n):
        shim.seed(logical(kind, i))
    for i in range(n, n + 6):
        shim.put(logical(kind, i))
    shim.delete(logical(kind, n + 2))
    result = run_job(BACKFILL, dynamo, store, m.id, JobOptions(**FAST))
    assert result.done
    return m, mapper, store, shim


def verify(dynamo, store, m, **kw):
    return run_job(VERIFY, dynamo, store, m.id, JobOptions(**FAST, rechecks=2, recheck_pause=0.0, **kw),
                      sleep=lambda s: None)


def moved_items(mapper, shim):
    return [o for o in shim.model.values() if mapper.moves(o) and not is_tombstone(o)]


def new_copy_of(mapper, old):
    new, moved = mapper.remap(old)
    assert moved
    return new


@pytest.mark.parametrize("kind", ["sensor", "invoices", "hourly"])
def test_verify_passes_on_a_clean_copy_and_opens_the_cutover_gate(moto_dynamo, kind):
    m, mapper, store, shim = backfilled(moto_dynamo, kind)
    assert "no verify since the backfill" in verify_missing(store, store.load_state(m.id))
    with pytest.raises(errors.RefusedTransition, match="verify"):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    result = verify(moto_dynamo, store, m)
    assert result.finished and result.passed, result.differences
    assert result.checked >= len(shim.model) and not any(result.differences.values())
    assert verify_missing(store, store.load_state(m.id)) is None
    _, after = transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    assert after.phase is Phase.CUTOVER


def test_verify_is_refused_before_the_backfill_finished(moto_dynamo):
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Vearly")
    with pytest.raises(errors.RefusedTransition, match="backfill has not finished"):
        verify(moto_dynamo, store, m)


def test_verify_finds_each_planted_difference_and_repair_converges(moto_dynamo):
    m, mapper, store, shim = backfilled(moto_dynamo, n=60)
    table = m.table
    put = lambda item: moto_dynamo.call("put_item", TableName=table, Item=item)  # noqa: E731
    moved = moved_items(mapper, shim)
    assert len(moved) >= 5

    # missing: the new copy of a moved item is gone.
    a = moved[0]
    moto_dynamo.call("delete_item", TableName=table, Key=mapper.new.key(mapper.fields(a, mapper.old)))
    # stale: the old item got a newer write than its new copy holds.
    b = moved[1]
    newer = dict(b, temp={"N": "999"}, **{VERSION_ATTR: {"S": "9999999999999.000000.zz"}})
    put(newer)
    # diverged: the new copy holds other content under the same version.
    c = moved[2]
    put(dict(new_copy_of(mapper, c), temp={"N": "-1"}))
    # resurrected: the old item is a tombstone, its new copy is live again.
    d = moved[3]
    fields = {f: d[f] for f in mapper.key_fields}
    put(dict(mapper.to_physical(fields, mapper.old), **{VERSION_ATTR: {"S": "9999999999999.000001.zz"},
                                                        "_rs_del": {"BOOL": True}}))
    # extra: a new copy of an item the old layout never had.
    ghost = logical("sensor", 5000)
    ghost_new = mapper.to_physical(ghost, mapper.new)
    ghost_new[NEW_COPY_ATTR] = {"S": m.id}
    put(ghost_new)
    # duplicate: a marked copy sitting at a key its fields do not map to.
    e = moved[4]
    misplaced = dict(new_copy_of(mapper, e))
    misplaced["PK"] = {"S": misplaced["PK"]["S"].rsplit("#", 1)[0] + "#31"} \
        if not misplaced["PK"]["S"].endswith("#31") else {"S": misplaced["PK"]["S"][:-3] + "#30"}
    misplaced["SK"] = {"S": misplaced["SK"]["S"] + "-x"}
    put(misplaced)

    result = verify(moto_dynamo, store, m)
    assert result.finished and not result.passed
    # (the other kinds -- collision, new_only, too_large, unmappable -- are zero)
    assert {k: n for k, n in result.differences.items() if n} == {
        "missing": 1, "stale": 1, "diverged": 1, "extra": 1, "resurrected": 1, "duplicate": 1}, result.differences
    kinds = sorted(e["kind"] for e in result.examples)
    assert kinds == ["diverged", "duplicate", "extra", "missing", "resurrected", "stale"]
    assert "found differences" in verify_missing(store, store.load_state(m.id))
    with pytest.raises(errors.RefusedTransition, match="found differences"):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)

    repaired = verify(moto_dynamo, store, m, repair=True)
    assert repaired.repaired == 6 and not repaired.passed, repaired.examples  # a repairing run never passes
    again = verify(moto_dynamo, store, m)
    assert again.passed, again.counts
    items = scan_all(moto_dynamo, table)
    # The repairs came from the old (authoritative) layout: the stale copy carries the newer write,
    # the resurrected copy is a tombstone again, the extra and misplaced copies are gone.
    new_b = moto_dynamo.call("get_item", TableName=table, Key=mapper.new.key(mapper.fields(b, mapper.old)),
                             ConsistentRead=True)["Item"]
    assert new_b["temp"] == {"N": "999"} and version_of(new_b) == version_of(newer)
    new_d = moto_dynamo.call("get_item", TableName=table, Key=mapper.new.key(mapper.fields(d, mapper.old)),
                             ConsistentRead=True)["Item"]
    assert is_tombstone(new_d)
    assert not any(i.get("event_id") == ghost["event_id"] for i in items.values())
    assert not any(i.get("SK", {}).get("S", "").endswith("-x") for i in items.values())


def test_repair_never_overwrites_a_newer_version_in_the_new_layout(moto_dynamo):
    m, mapper, store, shim = backfilled(moto_dynamo)
    x = moved_items(mapper, shim)[0]
    newest = dict(new_copy_of(mapper, x), temp={"N": "7"}, **{VERSION_ATTR: {"S": "9999999999999.000000.zz"}})
    moto_dynamo.call("put_item", TableName=m.table, Item=newest)
    result = verify(moto_dynamo, store, m, repair=True)
    # The newer new copy stays; the repair copies it back over the older old copy (the catch-up
    # of a write whose mirror never landed, docs/late-writes.md), never the other way.
    assert result.differences["diverged"] == 1 and result.repaired == 1
    got = moto_dynamo.call("get_item", TableName=m.table, Key=mapper.new.key(mapper.fields(x, mapper.old)),
                           ConsistentRead=True)["Item"]
    assert got == newest
    old = moto_dynamo.call("get_item", TableName=m.table, Key=key_of(x, mapper.old.key_attrs),
                           ConsistentRead=True)["Item"]
    assert old[VERSION_ATTR] == newest[VERSION_ATTR] and old["temp"] == {"N": "7"}


def to_cleanup(dynamo, store, m):
    assert verify(dynamo, store, m).passed
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # cutover
    assert verify(dynamo, store, m).passed  # the catch-up verify after the switch
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # cleanup


def test_cleanup_ttl_marks_exactly_the_moved_old_items(moto_dynamo):
    m, mapper, store, shim = backfilled(moto_dynamo, n=64)
    # An item whose own TTL expires sooner than the retention keeps it (written by the app
    # through the dual-writing shim, so both layouts have it).
    own = int(time.time()) + 60
    soon = next(x for x in (logical("sensor", i, expires_at=own) for i in range(1000, 1100))
                if mapper.moves(mapper.to_physical(x, mapper.old)))
    shim.put(soon)
    to_cleanup(moto_dynamo, store, m)
    with pytest.raises(errors.BadInput, match="TTL is DISABLED"):
        run_job(CLEANUP, moto_dynamo, store, m.id, JobOptions(**FAST))
    with pytest.raises(errors.RefusedTransition, match="cleanup pass has not run"):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    before = scan_all(moto_dynamo, m.table)
    t0 = time.time()
    result = run_job(CLEANUP, moto_dynamo, store, m.id, JobOptions(**FAST, enable_ttl=True))
    assert result.done
    after = scan_all(moto_dynamo, m.table)
    old_moved = {k for k, i in before.items() if NEW_COPY_ATTR not in i and not is_tombstone(i)
                 and mapper.moves(i)}
    retain = m.cleanup.retain_hours * 3600
    for k, item in after.items():
        if k in old_moved:
            exp = int(item["expires_at"]["N"])
            if item.get("event_id") == soon["event_id"]:
                assert exp == own
            else:
                assert t0 + retain - 5 <= exp <= time.time() + retain + 5
        else:
            assert item == before[k]  # unmoved items and new copies are untouched
    # Tombstones of both layouts are retired; nothing else disappeared.
    assert not any(is_tombstone(i) for i in after.values())
    assert set(before) - set(after) == {k for k, i in before.items() if is_tombstone(i)}
    assert result.counts["expiring"] == len(old_moved) - 1 and result.counts["kept_own_ttl"] == 1
    # Half the calculated-suffix items stay where they are (N -> 2N).
    old_live = [i for i in before.values() if NEW_COPY_ATTR not in i and not is_tombstone(i)]
    assert 0 < result.counts["unmoved"] < len(old_live)
    _, done = transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    assert done.phase is Phase.COMPLETE


def test_cleanup_delete_removes_exactly_the_moved_old_items(moto_dynamo):
    m, mapper, store, shim = backfilled(moto_dynamo, kind="hourly", n=50)
    to_cleanup(moto_dynamo, store, m)
    before = scan_all(moto_dynamo, m.table)
    result = run_job(CLEANUP, moto_dynamo, store, m.id, JobOptions(**FAST, delete=True))
    assert result.done
    after = scan_all(moto_dynamo, m.table)
    gone = set(before) - set(after)
    expected_gone = {k for k, i in before.items()
                     if is_tombstone(i) or (NEW_COPY_ATTR not in i and mapper.moves(i))}
    assert gone == expected_gone
    assert all(after[k] == before[k] for k in after)


def test_abort_then_cleanup_leaves_the_old_layout_byte_identical(moto_dynamo):
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Vabort")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(50):
        shim.seed(logical("sensor", i))
    snapshot = scan_all(moto_dynamo, m.table)
    run_job(BACKFILL, moto_dynamo, store, m.id, JobOptions(**FAST))
    assert len(scan_all(moto_dynamo, m.table)) > len(snapshot)  # the new copies are there
    transition(store, m.id, Action.ABORT, allow_no_shims=True)
    result = run_job(CLEANUP, moto_dynamo, store, m.id, JobOptions(**FAST))
    assert result.done and result.counts["new_copies_removed"] > 0
    assert scan_all(moto_dynamo, m.table) == snapshot
    state = store.load_state(m.id)
    assert state.retired and not state.active


def test_cleanup_refused_outside_cleanup_and_aborted(moto_dynamo):
    m, mapper, store, shim = backfilled(moto_dynamo)
    with pytest.raises(errors.RefusedTransition, match="cleanup runs only in cleanup or aborted"):
        run_job(CLEANUP, moto_dynamo, store, m.id, JobOptions(**FAST, delete=True))


def test_verify_and_cleanup_commands_exit_codes(moto_dynamo, capsys):
    import json

    from reshard.cli.main import main

    m, mapper, store, shim = backfilled(moto_dynamo)
    # One worker: moto's conditional writes are not atomic across threads (two workers both won
    # the claim of verify's join; the one whose page found the repair done had the last word).
    # That product side -- a join page redone after its repair -- is proved on dynalite:
    # tests/integration/test_interleavings_verify.py::test_a_join_page_redone_after_its_repair_never_passes
    args = [m.id, "--segments", "2", "--workers", "1", "--control-table", store.table]
    assert main(["cleanup", *args, "--delete"]) == 2
    assert "cleanup runs only in cleanup or aborted" in capsys.readouterr().err
    assert main(["verify", *args]) == 0
    out = capsys.readouterr().out
    assert f"verify {m.id} run 1: PASSED" in out
    x = moved_items(mapper, shim)[0]
    moto_dynamo.call("delete_item", TableName=m.table, Key=mapper.new.key(mapper.fields(x, mapper.old)))
    assert main(["verify", *args, "--output", "json"]) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["counts"]["missing"] == 1 and not report["passed"] and report["run"] == 2
    assert err.strip().splitlines()[-1] == "reshard: error: verify found differences (1 missing)"
    assert main(["verify", *args, "--repair"]) == 1  # repaired, but a repairing run does not pass
    capsys.readouterr()
    assert main(["verify", *args]) == 0


def test_a_retired_migration_puts_its_shims_back_in_steady_state(moto_dynamo):
    from reshard.shim.table import ShardedTable

    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Vretire")
    t = ShardedTable(m, moto_dynamo, control_table=store.table, refresh_seconds=3600)
    try:
        t.refresh()
        assert t.phase == "backfill"
        transition(store, m.id, Action.ABORT, allow_no_shims=True)
        t.refresh()  # acknowledges aborted
        item = {"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:00:00Z"}
        t.put_item(Item=item)
        t.delete_item(Key=item)
        assert [is_tombstone(i) for i in scan_all(moto_dynamo, m.table).values()] == [True]  # still fenced
        result = run_job(CLEANUP, moto_dynamo, store, m.id, JobOptions(**FAST))
        assert result.done and result.counts["tombstones_retired"] == 1
        assert scan_all(moto_dynamo, m.table) == {}
        t.refresh()
        assert t.phase == "steady"
        t.put_item(Item=item)
        assert "_rs_v" not in list(scan_all(moto_dynamo, m.table).values())[0]  # plain steady-state writes
        t.delete_item(Key=item)
        assert scan_all(moto_dynamo, m.table) == {}  # a plain delete, no tombstone
    finally:
        t.close()


def test_an_abort_stops_a_running_backfill_and_cleanup_waits_for_its_leases(moto_dynamo):
    """A backfill started before an abort must not keep writing new copies behind the
    abort-cleanup's scan: its workers stop at the next page, and cleanup refuses while a
    lease is still held."""
    from reshard.jobs.backfill import Backfill
    from reshard.jobs.budget import CapacityBudget
    from reshard.jobs.runner import phase_guard
    from reshard.jobs.engine import SegmentEngine

    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Vstop")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(60):
        shim.seed(logical("sensor", i))
    snapshot = scan_all(moto_dynamo, m.table)
    budget = CapacityBudget().attach(moto_dynamo, m.table)
    copier = Backfill(moto_dynamo, store, m.id, mapper, m.table, budget, page_size=10)
    pages = []

    def page(ctx, key):
        pages.append(ctx.segment)
        if len(pages) == 2:
            transition(store, m.id, Action.ABORT, allow_no_shims=True)  # an operator aborts mid-copy
            # ...while this worker still holds its lease: cleanup must wait for it (here:
            # not at all, so it refuses and says how long to wait).
            with pytest.raises(errors.RefusedTransition, match="lease.*wait"):
                run_job(CLEANUP, moto_dynamo, store, m.id, JobOptions(**FAST, lease_wait=0))
        return copier.page(ctx, key)

    engine = SegmentEngine(store, m.id, "backfill", 1, 1, page, workers=1,
                           guard=phase_guard(store, m.id, "backfill", (Phase.BACKFILL,), min_interval=0))
    result = engine.run_all()
    assert result.stopped and not result.done and "moved to aborted" in result.stop_reason
    assert len(pages) == 2  # no page after the abort was seen
    result = run_job(CLEANUP, moto_dynamo, store, m.id, JobOptions(**FAST))
    assert result.done
    assert scan_all(moto_dynamo, m.table) == snapshot


def test_cleanup_command_on_an_aborted_migration_retires_and_sweeps_again(moto_dynamo, capsys):
    import json

    from reshard.cli.main import main

    m, mapper, store, shim = backfilled(moto_dynamo)
    transition(store, m.id, Action.ABORT, allow_no_shims=True)
    # One worker: moto's tables are not safe for a concurrent scan and delete (a flake on
    # "dictionary changed size during iteration" inside moto otherwise).
    args = [m.id, "--segments", "2", "--workers", "1", "--control-table", store.table]
    assert main(["cleanup", *args]) == 0
    out = capsys.readouterr().out
    assert "retired; after the fleet acknowledged, run 2 swept again: 0 late delete markers retired" in out
    assert store.load_state(m.id).retired
    assert not [i for i in scan_all(moto_dynamo, m.table) if NEW_COPY_ATTR in i or is_tombstone(i)]
    assert main(["cleanup", *args, "--output", "json"]) == 0  # idempotent: no second retire, no sweep
    data = json.loads(capsys.readouterr().out)
    assert "sweep" not in data and data["finished"]
