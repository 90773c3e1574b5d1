"""verify against dynalite, on the states issue 12 reproduced (cases 3, 4, 10, 11; plan's collisions).

Each test builds the table a migration really reaches -- seeded old items, a real backfill
run, then the few physical items an interleaving leaves behind (a stale blind copy over a
tombstone's mirror, a delete that tombstoned one of two old copies, a cutover put stored once,
a copy TTL already deleted) -- and runs the real verify job (and the gate) on dynalite.

The last two freeze a ``verify --repair`` worker at its repair write (the ``Freezer`` of
``test_interleavings_backfill``): stalled past its lease through an abort and retire, it sends
nothing (the per-attempt lease-deadline guard; without it the repair restored a new-layout
copy after the retire); frozen on the wire while a shim writes the same item, its write fails
its version condition and the shim's write stays (the server fence).
"""

from __future__ import annotations

import json
import pathlib
import time

import pytest

from reshard import errors
from reshard.control.gates import verify_missing
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core.layout import MAX_ITEM_BYTES, NEW_COPY_ATTR, KeyMapper, hash_shard, item_size
from reshard.core.migration import parse
from reshard.core.phases import Action, Phase
from reshard.core.versions import tombstone, version_of
from reshard.jobs import verify as verify_module
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.verify import VERIFY

from tests.backfill_support import Shim, create_table, logical, migration_text, scan_all, setup_migration
from tests.shim_helpers import shim as pinned_shim

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAST = dict(segments=2, workers=1, page_size=50)
V1, V2 = "1700000000000.000000.shimA", "1700000000001.000000.shimB"


def backfilled(dynamo, kind: str, table: str, n: int = 30):
    m, mapper, store = setup_migration(dynamo, kind, table, control=f"{table}-ctl")
    shim = Shim(dynamo, mapper, m.table)
    for i in range(n):
        shim.seed(logical(kind, i))
    assert run_job(BACKFILL, dynamo, store, m.id, JobOptions(**FAST)).done
    return m, mapper, store


def verify(dynamo, store, m, **kw):
    return run_job(VERIFY, dynamo, store, m.id, JobOptions(**FAST, rechecks=2, recheck_pause=0.0, **kw),
                   sleep=lambda s: None)


def failing(result) -> dict:
    return {k: n for k, n in result.differences.items() if n}


def put(dynamo, table, item):
    dynamo.call("put_item", TableName=table, Item=item)


def get(dynamo, table, key):
    return dynamo.call("get_item", TableName=table, Key=key, ConsistentRead=True).get("Item")


def fields_of(mapper, item):
    return {f: item[f] for f in mapper.key_fields}


def new_shard(mapper, item) -> int:
    return int(mapper.new.key(mapper.logical_fields(item))["PK"]["S"].rsplit("#", 1)[1])


def pick(kind, mapper, want, start):
    """The first logical item from ``start`` on that satisfies ``want``."""
    return next(x for x in (logical(kind, i) for i in range(start, start + 4000)) if want(x))


# --------------------------------------------------------------------------- case 11 a (and 3)

def test_random_suffix_old_side_is_judged_over_every_candidate_shard(dynalite, unique_name):
    """Several old copies of one item (apps re-put with a fresh suffix): verify must judge the
    newest of them, wherever it is, against the new copy.

    Before the fix each old copy was compared alone, and a newer tombstone in another shard
    was never compared (resurrected is a new-side kind, and the new side stopped at the live
    old copy): verify passed over a deleted item brought back by a stale blind copy.
    """
    m, mapper, store = backfilled(dynalite, "invoices", unique_name)
    t = m.table
    old = lambda x, shard, **kw: mapper.to_physical(dict(x, **kw), mapper.old, shard)  # noqa: E731

    # X: old copy A (shard 2) and a copy tombstoned by a shim delete (shard 7); a stale blind
    # copy of A landed on the new key over the tombstone's mirror (case 3).
    x = pick("invoices", mapper, lambda x: new_shard(mapper, x) >= 10, 5000)
    put(dynalite, t, old(x, 2))
    put(dynalite, t, tombstone(old(fields_of(mapper, x), 7), V1))
    put(dynalite, t, mapper.remap(old(x, 2))[0])
    # Y: the same with A sitting at Y's new key (it does not move, carries no marker).
    y = pick("invoices", mapper, lambda y: new_shard(mapper, y) < 10, 6000)
    hy = new_shard(mapper, y)
    put(dynalite, t, old(y, hy))
    put(dynalite, t, tombstone(old(fields_of(mapper, y), (hy + 1) % 10), V1))
    # Z: an old copy newer (a shim write, shard 4) than the one the new copy was taken from.
    z = pick("invoices", mapper, lambda z: new_shard(mapper, z) >= 10, 7000)
    put(dynalite, t, old(z, 1))
    put(dynalite, t, old(z, 4, amount={"N": "99"}, _rs_v={"S": V2}))
    put(dynalite, t, mapper.remap(old(z, 1))[0])
    # W: same shape, but the new copy holds the newest: fine (the newest wins), information only.
    w = pick("invoices", mapper, lambda w: new_shard(mapper, w) >= 10, 8000)
    put(dynalite, t, old(w, 1))
    put(dynalite, t, old(w, 4, amount={"N": "98"}, _rs_v={"S": V2}))
    put(dynalite, t, mapper.remap(old(w, 4, amount={"N": "98"}, _rs_v={"S": V2}))[0])
    # C: two unversioned copies with different content: nobody can say which is right.
    c = pick("invoices", mapper, lambda c: new_shard(mapper, c) >= 10, 9000)
    put(dynalite, t, old(c, 3))
    put(dynalite, t, old(c, 8, amount={"N": "97"}))
    put(dynalite, t, mapper.remap(old(c, 3))[0])

    result = verify(dynalite, store, m)
    assert failing(result) == {"resurrected": 2, "stale": 1, "collision": 1}, (failing(result), result.examples)
    assert result.counts["old_copies"] == 1  # W (counted as information; Z is reported as stale)
    kinds = {e["kind"] for e in result.examples}
    assert kinds == {"resurrected", "stale", "collision"}
    assert "found differences (1 stale, 2 resurrected, 1 collision)" in verify_missing(store, store.load_state(m.id))

    # The repair fixes what it can from the newest old copy; the collision stays (with guidance).
    repaired = verify(dynalite, store, m, repair=True)
    assert repaired.repaired == 3, repaired.examples
    again = verify(dynalite, store, m)
    assert failing(again) == {"collision": 1}
    assert get(dynalite, t, mapper.new.key(mapper.logical_fields(z)))["amount"] == {"N": "99"}
    assert "keep the right copy" in verify_missing(store, store.load_state(m.id))


# --------------------------------------------------------------------------- case 11 b

def test_expired_copies_are_absent_on_a_table_with_ttl(dynalite, unique_name, monkeypatch):
    """DynamoDB deletes expired items lazily, each copy at its own time. dynalite keeps expired
    items for ever (it has no TTL), which is the "not deleted yet" half; DescribeTimeToLive is
    patched to say TTL is on, as it would on AWS."""
    monkeypatch.setattr(verify_module, "ttl_status", lambda dynamo, table: ("ENABLED", "expires_at"), raising=False)
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=f"{unique_name}-ctl")
    shim = Shim(dynalite, mapper, m.table)
    import time
    past, future = int(time.time()) - 120, int(time.time()) + 3600
    moving = [x for x in (logical("sensor", i) for i in range(200)) if mapper.moves(mapper.to_physical(x, mapper.old))]
    p, q, r, s = (dict(x, expires_at={"N": str(past)}) for x in moving[:4])
    live = dict(moving[4], expires_at={"N": str(future)})
    for x in (p, q, r, s, live, *moving[5:25]):
        shim.seed(x)
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**FAST)).done
    t = m.table
    new_key = lambda x: mapper.new.key(mapper.logical_fields(x))  # noqa: E731
    old_key = lambda x: mapper.old.key(mapper.logical_fields(x))  # noqa: E731
    dynalite.call("delete_item", TableName=t, Key=new_key(p))  # TTL took P's new copy first
    dynalite.call("delete_item", TableName=t, Key=old_key(q))  # ... and Q's old item first
    # R: both still there, both expired, the new copy an older content: nothing to compare.
    put(dynalite, t, dict(get(dynalite, t, new_key(r)), temp={"N": "-5"}))
    # S: expired old item, its new copy live again (a later write renewed the TTL): not missing.
    put(dynalite, t, dict(get(dynalite, t, new_key(s)), expires_at={"N": str(future)}))
    # A live (not expired) item whose new copy is gone: still a real difference.
    dynalite.call("delete_item", TableName=t, Key=new_key(live))

    result = verify(dynalite, store, m)
    # S's new copy is unversioned and the old one expired: an unversioned stray copy (extra).
    assert failing(result) == {"missing": 1, "extra": 1}, (failing(result), result.examples)
    missing = [e for e in result.examples if e["kind"] == "missing"]
    assert missing[0]["new_key"] == new_key(live)
    extra = [e for e in result.examples if e["kind"] == "extra"]
    assert extra[0]["new_key"] == new_key(s)


# --------------------------------------------------------------------------- case 11 c

def test_a_template_that_matches_no_item_does_not_pass(dynalite, unique_name):
    """[from] says ``{sensor_id}|{shard}``; the table's keys are ``s-1#3``: every item is
    unmappable. verify used to pass (nothing compared) and open the cutover gate."""
    right = parse(migration_text("sensor", unique_name), "<sensor>")
    text = migration_text("sensor", unique_name).replace('partition = "{sensor_id}#{shard}"',
                                                         'partition = "{sensor_id}|{shard}"', 1)
    m = parse(text, "<wrong>")
    assert m.source.partition_text == "{sensor_id}|{shard}" and m.target.partition_text == "{sensor_id}#{shard}"
    create_table(dynalite, unique_name, KeyMapper(m))
    store = ControlStore(dynalite, f"{unique_name}-ctl")
    store.register(m)
    for _ in range(3):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    shim = Shim(dynalite, KeyMapper(right), unique_name)
    for i in range(20):
        shim.seed(logical("sensor", i))
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**FAST)).done

    result = verify(dynalite, store, m)
    assert result.finished and not result.passed
    assert failing(result) == {"unmappable": 20}
    assert result.checked == 20
    why = verify_missing(store, store.load_state(m.id))
    assert "20 unmappable" in why and "template" in why
    with pytest.raises(errors.RefusedTransition, match="unmappable"):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)


# --------------------------------------------------------------------------- case 10

def test_an_item_too_large_for_the_new_layout_is_too_large_with_guidance(dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=f"{unique_name}-ctl")
    shim = Shim(dynalite, mapper, m.table)
    for i in range(20):
        shim.seed(logical("sensor", i))
    big = pick("sensor", mapper, lambda x: mapper.moves(mapper.to_physical(x, mapper.old)), 3000)
    phys = mapper.to_physical(dict(big, blob={"S": ""}), mapper.old)
    phys["blob"] = {"S": "x" * (MAX_ITEM_BYTES - item_size(phys) - 4)}  # fits; its new copy does not
    put(dynalite, m.table, phys)
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**FAST)).done
    assert get(dynalite, m.table, mapper.new.key(mapper.logical_fields(big))) is None

    result = verify(dynalite, store, m)
    assert failing(result) == {"too_large": 1}, failing(result)
    assert "shrink" in result.examples[0]["detail"]
    why = verify_missing(store, store.load_state(m.id))
    assert "1 too_large" in why and "shrink each listed item below 400 KB" in why
    with pytest.raises(errors.RefusedTransition, match="shrink"):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    # The repair cannot fix it and does not pretend to.
    assert verify(dynalite, store, m, repair=True).repaired == 0


# --------------------------------------------------------------------------- case 4 (verify side)

def test_repair_never_deletes_a_shim_write_found_in_the_new_layout_only(dynalite, unique_name):
    """Puts through a cutover shim stored once, marked, with no old copy (case 4), or whose mirror
    to the old layout never landed; then a rollback to backfill. ``verify --repair`` used to
    delete them as ``extra`` and the next verify passed: acknowledged writes gone."""
    m, mapper, store = backfilled(dynalite, "invoices", unique_name)
    t = m.table

    def derived(x):  # the old shard the shim gives a brand-new item (from its identity)
        ident = mapper.identity(mapper.logical_fields(x))
        return hash_shard("#".join(ident), mapper.old.shards)

    # A: its new key is the old shard derived for it: stored once, marked (case 4).
    a = pick("invoices", mapper, lambda x: new_shard(mapper, x) == derived(x), 5000)
    # B: a new key outside the old shards; the mirror to the old layout never landed.
    b = pick("invoices", mapper, lambda x: new_shard(mapper, x) >= 10, 6000)
    writes = {}
    for x, v in ((a, V1), (b, V2)):
        item = mapper.to_physical(dict(x, amount={"N": "42"}, _rs_v={"S": v}), mapper.new)
        item[NEW_COPY_ATTR] = {"S": m.id}
        put(dynalite, t, item)
        writes[v] = item
    # The rollback from cutover: the migration is in backfill (where --repair runs).
    assert store.load_state(m.id).phase is Phase.BACKFILL

    repaired = verify(dynalite, store, m, repair=True)
    for v, item in writes.items():
        key = {"PK": item["PK"], "SK": item["SK"]}
        got = get(dynalite, t, key)
        assert got is not None and version_of(got) == v, f"the shim write {v} was deleted by the repair"
    assert failing(repaired) == {"new_only": 2}, (failing(repaired), repaired.examples)
    assert repaired.repaired == 2
    # A now serves both layouts at its key (unmarked); B has its old copy back at its derived shard.
    assert NEW_COPY_ATTR not in get(dynalite, t, {"PK": writes[V1]["PK"], "SK": writes[V1]["SK"]})
    b_old = mapper.old.key(mapper.logical_fields(b), derived(b))
    assert version_of(get(dynalite, t, b_old)) == V2
    assert verify(dynalite, store, m).passed
    # Readers of every phase from backfill back to planned still see both writes.
    for phase in (Phase.BACKFILL, Phase.DUAL_WRITE, Phase.CUTOVER):
        with pinned_shim(m, dynalite, phase=phase) as app:
            for x in (a, b):
                key = {f: x[f]["S"] for f in mapper.key_fields}
                assert app.get_item(Key=key, ConsistentRead=True).get("Item")["amount"] == 42, (phase, key)


# --------------------------------------------------------------------------- plan (case 3)

def test_plan_counts_and_lists_collisions_in_a_random_suffix_table(dynalite, dynalite_server, unique_name,
                                                                  tmp_path, capsys):
    from reshard.cli.main import main

    path = tmp_path / "invoices.toml"
    path.write_text(migration_text("invoices", unique_name))
    mapper = KeyMapper(parse(path.read_text(), str(path)))
    create_table(dynalite, unique_name, mapper)
    items = [mapper.to_physical(logical("invoices", i), mapper.old, i % 10) for i in range(120)]
    x = logical("invoices", 500)
    # The same invoice line under two suffixes with different amounts (an app re-put it).
    items.append(mapper.to_physical(dict(x, amount={"N": "1"}), mapper.old, 2))
    items.append(mapper.to_physical(dict(x, amount={"N": "2"}), mapper.old, 6))
    # ... and one re-put with the same content: a duplicate, not a collision.
    y = logical("invoices", 600)
    items += [mapper.to_physical(y, mapper.old, 1), mapper.to_physical(y, mapper.old, 8)]
    dynalite.batch_write(unique_name, [{"PutRequest": {"Item": i}} for i in items])

    args = ["--endpoint-url", dynalite_server.endpoint, "plan", str(path), "--sample", "0", "--segments", "3"]
    assert main([*args, "--output", "json"]) == 1  # start refuses the collision: plan says so in its status
    r = json.loads(capsys.readouterr().out)
    assert r["items"]["collisions"] == 1
    ex = r["items"]["collision_examples"][0]
    assert sorted(k["PK"] for k in ex["keys"]) == ["InvoiceNumber#100125#2", "InvoiceNumber#100125#6"]
    assert any("collisions" in w for w in r["warnings"])
    assert main(args) == 1
    text = capsys.readouterr().out
    assert "collisions         1" in text and "InvoiceNumber#100125#2" in text


# --------------------------------------------------------------------------- another item at the new key

def test_another_items_old_copy_at_the_new_key_is_a_collision_never_overwritten(dynalite, unique_name):
    """Two events of one sensor in one millisecond; with 24 new shards the first one's new key
    is the second one's old key. verify used to compare the two different items (diverged)
    and ``--repair`` overwrote the second event's only copy with the first one's."""
    text = migration_text("sensor", unique_name).replace("shards = 32", "shards = 24")
    m = parse(text, "<16-to-24>")
    mapper = KeyMapper(m)
    create_table(dynalite, unique_name, mapper)
    store = ControlStore(dynalite, f"{unique_name}-ctl")
    store.register(m)
    for _ in range(3):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    shim = Shim(dynalite, mapper, unique_name)
    for i in range(20):
        shim.seed(logical("sensor", i))
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**FAST)).done

    ids = [f"ev-{i}" for i in range(400)]
    e1 = next(e for e in ids if hash_shard(e, 24) < 16 and hash_shard(e, 24) != hash_shard(e, 16))
    # (and not the other way round too: then each would land on the other, two collisions)
    e2 = next(e for e in ids if e != e1 and hash_shard(e, 16) == hash_shard(e1, 24)
              and hash_shard(e, 24) != hash_shard(e1, 16))
    same = {"sensor_id": {"S": "s-9"}, "ts": {"S": "2024-10-27T15:00:00.123Z"}}
    one = mapper.to_physical(dict(same, event_id={"S": e1}, temp={"N": "1"}), mapper.old)
    two = mapper.to_physical(dict(same, event_id={"S": e2}, temp={"N": "2"}), mapper.old)
    assert mapper.new.key(mapper.fields(one, mapper.old)) == {"PK": two["PK"], "SK": two["SK"]}
    put(dynalite, unique_name, one)
    put(dynalite, unique_name, two)
    put(dynalite, unique_name, mapper.remap(two)[0])  # event 2's own new copy is fine

    # Two events of another sensor whose new keys are equal: only event 4's copy is there.
    # Event 3's old side used to defer to the marked copy at its new key (event 4's), which
    # judges only event 4: event 3 was never compared, and verify passed.
    e3 = next(e for e in ids if hash_shard(e, 24) >= 16)
    e4 = next(e for e in ids
              if hash_shard(e, 24) == hash_shard(e3, 24) and hash_shard(e, 16) != hash_shard(e3, 16))
    other = {"sensor_id": {"S": "s-8"}, "ts": {"S": "2024-10-27T16:00:00.456Z"}}
    three = mapper.to_physical(dict(other, event_id={"S": e3}, temp={"N": "3"}), mapper.old)
    four = mapper.to_physical(dict(other, event_id={"S": e4}, temp={"N": "4"}), mapper.old)
    for item in (three, four, mapper.remap(four)[0]):
        put(dynalite, unique_name, item)

    result = verify(dynalite, store, m, repair=True)
    assert get(dynalite, unique_name, {"PK": two["PK"], "SK": two["SK"]}) == two, "the repair overwrote event 2"
    assert failing(result) == {"collision": 2}, (failing(result), result.examples)
    assert all("another item" in e["detail"] for e in result.examples)
    assert {e["identity"][2] for e in result.examples} == {e1, e3}


# --------------------------------------------------------------------------- repair writes: fenced like the copy

def _repair_worker(dynalite_server, store, m, mapper, freezer_point: str, lease: float, **engine_kw):
    """A ``verify --repair`` worker with its own clients, frozen at its first repair write
    (``freezer_point``: see :class:`Freezer`); returns (freezer, thread, out, data client)."""
    from reshard.jobs.budget import CapacityBudget
    from reshard.jobs.engine import SegmentEngine
    from reshard.jobs.verify import Verifier
    from tests.integration.test_interleavings_backfill import Freezer, _start, fast_dynamo

    a_data = fast_dynamo(dynalite_server.endpoint)
    a_store = ControlStore(fast_dynamo(dynalite_server.endpoint), store.table)
    freezer = Freezer(a_data, freezer_point)
    a_budget = freezer.budget(CapacityBudget().attach(a_data, m.table))
    opts = JobOptions(segments=1, workers=1, page_size=100, rechecks=2, recheck_pause=0.0, repair=True)
    page = Verifier(a_data, a_store, m.id, 1, mapper, m.table, a_budget, opts, sleep=lambda s: None).page
    # One scan segment and the join (the run's last segment, where differences are judged and repaired).
    engine = SegmentEngine(a_store, m.id, "verify", 1, 2, page, workers=1, lease_seconds=lease,
                           max_request_seconds=a_data.attempt_seconds, invocation="A", join=True, **engine_kw)
    thread, out = _start(engine)
    return freezer, thread, out, a_data


def _with_a_missing_copy(dynalite, unique_name):
    """A backfilled sensor table (backfill phase) whose one moved item ``x`` (logical) lost its new copy."""
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c", mid=unique_name)
    shim = Shim(dynalite, mapper, m.table, writer="app")
    items = [logical("sensor", i) for i in range(8)]
    for i in items:
        shim.seed(i)
    before = scan_all(dynalite, m.table)
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(segments=1, workers=1)).done
    x = next(i for i in items if mapper.moves(mapper.to_physical(i, mapper.old)))
    new_key = mapper.new.key(mapper.logical_fields(x))
    dynalite.call("delete_item", TableName=m.table, Key=new_key)
    return m, mapper, store, shim, x, new_key, before


def test_a_repair_worker_frozen_past_its_lease_writes_nothing_after_the_abort_retire(dynalite, dynalite_server,
                                                                                    unique_name):
    """``verify --repair`` stalled (where the budget paces, just before its repair PutItem) past
    its lease while the operator aborts and cleanup retires the migration. Its write would
    restore a new-layout copy -- onto an empty key, so no version condition stops it -- in a
    table the retire declared clean. The per-attempt lease-deadline guard stops it; before the
    guard the copy appeared after the retire."""
    from reshard.jobs.cleanup import CLEANUP
    from reshard.jobs.runner import phase_guard
    from tests.integration.test_interleavings_backfill import LEASE, WAIT

    m, mapper, store, shim, x, new_key, before = _with_a_missing_copy(dynalite, unique_name)
    freezer, thread_a, out_a, a_data = _repair_worker(
        dynalite_server, store, m, mapper, "budget", LEASE,
        guard=phase_guard(ControlStore(dynalite, store.table), m.id, "verify", (Phase.BACKFILL,), min_interval=0))
    assert freezer.frozen.wait(WAIT), "the repair worker never reached its write"

    transition(store, m.id, Action.ABORT, allow_no_shims=True)
    started = time.monotonic()
    while True:  # as an operator would: retry a refused cleanup until it runs (bounded)
        try:
            result = run_job(CLEANUP, dynalite, store, m.id, JobOptions(segments=1, workers=1, lease_seconds=30))
            break
        except errors.RefusedTransition:
            assert time.monotonic() - started < WAIT
            time.sleep(0.5)
    assert result.done and store.load_state(m.id).retired
    # The retire waited for the verify lease to stay unchanged for lease + its longest request.
    assert time.monotonic() - started >= LEASE + a_data.attempt_seconds - 0.5

    freezer.release.set()  # the repair worker wakes up past its deadline
    thread_a.join(WAIT)
    assert not thread_a.is_alive() and "error" not in out_a, out_a
    assert get(dynalite, m.table, new_key) is None, "a repair write landed after the retire"
    assert scan_all(dynalite, m.table) == before
    assert freezer.sent_after_release == 0


def test_a_shim_write_between_verifys_read_and_its_repair_write_survives(dynalite, dynalite_server, unique_name):
    """verify read X (old copy, no new copy: ``missing``) and is about to send its repair PutItem
    (frozen on the wire, in botocore's before-send, well within its lease); the application
    writes X through the shim (old first, then the fenced mirror). The repair lands last and
    must fail its version condition: the shim's write stays at the new key."""
    from tests.integration.test_interleavings_backfill import WAIT

    m, mapper, store, shim, x, new_key, _ = _with_a_missing_copy(dynalite, unique_name)
    freezer, thread_a, out_a, _ = _repair_worker(dynalite_server, store, m, mapper, "before_send", 60.0)
    assert freezer.frozen.wait(WAIT), "the repair worker never reached its write"

    shim.put(dict(x, temp={"N": "777"}))
    written = get(dynalite, m.table, new_key)
    assert written is not None and written["temp"] == {"N": "777"}

    freezer.release.set()
    thread_a.join(WAIT)
    assert not thread_a.is_alive() and "error" not in out_a, out_a
    got = get(dynalite, m.table, new_key)
    assert got == written, "the repair wrote over the shim's newer write"
    run = out_a["result"]
    assert run.done
    totals = run.totals
    assert totals["missing"] == 1 and totals["unrepaired"] == 1 and totals["repaired"] == 0, totals
    assert verify(dynalite, store, m).passed


def test_the_worker_that_loses_the_race_for_the_join_does_not_sleep_a_poll(dynalite, unique_name):
    """Two workers of one process finish the last two scan segments together and both try to
    claim the join: the loser looks again (the join is this process's now) and leaves, instead
    of sleeping a poll interval (2 s by default) before it sees that. Forced: both finish,
    then both read the segments, then both claim."""
    import threading

    from reshard.jobs.engine import SegmentEngine
    m, _, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c", mid=unique_name)
    slept: list[float] = []
    engine = SegmentEngine(store, m.id, "verify", 1, 3, lambda ctx, key: ({}, None), workers=2, lease_seconds=30,
                           max_request_seconds=1, sleep=slept.append, poll_seconds=2.0, join=True)
    finished, claiming = threading.Barrier(2, timeout=10), threading.Barrier(2, timeout=10)
    finish, claim = engine.finish_segment, engine.claim
    tries = []

    def finish_together(lease, counters):
        finish(lease, counters)
        if lease.segment < 2:
            finished.wait()  # both scan segments done before either worker looks for more

    def claim_together(rec, me):
        if rec.segment == 2:
            tries.append(me)
            if len(tries) <= 2:
                claiming.wait()  # both read the join unclaimed before either claims it
        return claim(rec, me)

    engine.finish_segment, engine.claim = finish_together, claim_together
    assert engine.run_all().done
    assert len(tries) == 2 and slept == []


def test_a_join_page_redone_after_its_repair_never_passes(dynalite, unique_name):
    """``verify --repair``: the join page repairs the missing copy, then fails before its
    counters are checkpointed (here: the page raises after returning its work; in the wild a
    throttled example write, a lost lease, a second claimant on a thread-unsafe server). The
    page is redone, finds nothing left to repair, and its counters are the segment's. Without
    the run row's repair record the run said PASSED with the repair only in an example."""
    import dataclasses

    from reshard.control.runs import verify_verdict
    from reshard.jobs import verify as verify_jobs

    m, mapper, store, shim, x, new_key, before = _with_a_missing_copy(dynalite, unique_name)
    pages = []

    def make_page(ctx):
        page = verify_jobs._make_page(ctx)

        def once_lost(pctx, key):
            counts, nxt = page(pctx, key)
            pages.append((pctx.segment, counts.get("missing", 0), counts.get("repaired", 0)))
            if pctx.segment == 1 and len(pages) == 2:  # the join's first page: its repair landed
                raise RuntimeError("the checkpoint after the repair never landed")
            return counts, nxt

        return once_lost

    spec = dataclasses.replace(VERIFY, make_page=make_page)
    result = run_job(spec, dynalite, store, m.id, JobOptions(segments=1, workers=1, repair=True, rechecks=2,
                                                             recheck_pause=0.0, settle_seconds=0.0),
                     sleep=lambda s: None)
    # The join page ran twice: once repairing, once finding it repaired.
    assert pages == [(0, 0, 0), (1, 1, 1), (1, 0, 0)], pages
    assert "Item" in dynalite.call("get_item", TableName=m.table, Key=new_key, ConsistentRead=True)
    assert result.finished and not result.passed, result.totals
    verdict = verify_verdict(store, m.id, result.run)
    assert verdict["finished"] and not verdict["passed"] and verdict["repair_pages"] == 1, verdict
    assert "repaired" in verify_missing(store, store.load_state(m.id))
    again = run_job(VERIFY, dynalite, store, m.id, JobOptions(segments=1, workers=1, settle_seconds=0.0))
    assert again.passed and verify_missing(store, store.load_state(m.id)) is None


def test_the_cli_says_a_run_whose_redone_page_repaired_failed(dynalite, dynalite_server, unique_name, capsys,
                                                              monkeypatch):
    """The same redone repair page through ``reshard verify --repair``: the only sign of the
    repair is the run row's ``repair_pages`` (the redone page's counters replaced the first
    pass's), so the text must still say repairs were sent, and the exit status must not be 0."""
    import dataclasses

    from reshard import operations
    from reshard.cli.main import main
    from reshard.jobs import verify as verify_jobs

    m, mapper, store, shim, x, new_key, before = _with_a_missing_copy(dynalite, unique_name)
    pages = []

    def make_page(ctx):
        page = verify_jobs._make_page(ctx)

        def once_lost(pctx, key):
            counts, nxt = page(pctx, key)
            pages.append((pctx.segment, counts.get("repaired", 0)))
            if pctx.segment == 1 and len(pages) == 2:
                raise RuntimeError("the checkpoint after the repair never landed")
            return counts, nxt

        return once_lost

    monkeypatch.setitem(operations.DATA_JOBS, "verify", dataclasses.replace(VERIFY, make_page=make_page))
    code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table, "verify", m.id,
                 "--repair", "--segments", "1", "--workers", "1", "--processes", "1", "--settle-seconds", "0"])
    out = capsys.readouterr()
    assert pages == [(0, 0), (1, 1), (1, 0)], pages  # the join page repaired, then was redone
    assert code == 1, (code, out.out, out.err)
    assert ": FAILED;" in out.out and f"repairs were sent: run `reshard verify {m.id}` again to confirm" in out.out
    assert f"verify repaired items: run `reshard verify {m.id}` again to confirm" in out.err
    assert "Item" in dynalite.call("get_item", TableName=m.table, Key=new_key, ConsistentRead=True)
