"""Issue 25, shim side, on dynalite: the table marker (case 5) and retired copies (``_rs_gone``, case 6).

The marker is a fact in the data table itself: a shim whose control table is mistyped, or that
still runs an earlier migration's file, refuses instead of writing a layout nobody reads. A copy
that a cleanup retired (``_rs_gone``) waits for its TTL; no read of the shim returns it, and no
write builds on it. Each test failed before the fix.
"""

from __future__ import annotations

import dataclasses

import pytest

from reshard import errors
from reshard.aws.dynamo import to_wire
from reshard.control.store import ControlStore
from reshard.core.layout import GONE_ATTR, NEW_COPY_ATTR, VERSION_ATTR, KeyMapper
from reshard.core.marker import Owner, marker_item, marker_key
from reshard.core.phases import Phase
from reshard.shim.table import ShardedTable
from tests.shim_helpers import create_table, migration, scan, shim


def _marker(dynamo, m, owner: Owner) -> None:
    dynamo.call("put_item", TableName=m.table, Item=marker_item(marker_key("PK", "S", "SK", "S"), owner))


def _move(store: ControlStore, mid: str, target: Phase) -> None:
    store.set_phase(store.load_state(mid), target, "test", "test")


def _complete(store: ControlStore, m) -> None:
    for p in (Phase.DUAL_WRITE, Phase.DUAL_READ, Phase.BACKFILL, Phase.CUTOVER, Phase.CLEANUP, Phase.COMPLETE):
        _move(store, m.id, p)
    store.release_table(m.table, m.id)  # a transition to complete frees the table


def ev(k: int, **extra) -> dict:
    return {"sensor_id": "s-1", "event_id": f"e-{k}", "ts": f"2024-10-27T15:{k:02d}:00Z", **extra}


def key(k: int) -> dict:
    return ev(k)


# ---------------------------------------------------------------------------------- case 5
def test_case5_a_shim_with_a_mistyped_control_table_refuses_once_the_marker_exists(dynalite, unique_name):
    """The migration is registered in ``ctl`` (and in cutover); a shim reading ``ctl-typo`` sees no
    migration there. Before the marker it served the steady state (old layout, plain deletes) next
    to a fleet in cutover; now it refuses every request, naming both control tables."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    store = ControlStore(dynalite, f"{unique_name}-ctl")
    store.register(m)
    for p in (Phase.DUAL_WRITE, Phase.DUAL_READ, Phase.BACKFILL, Phase.CUTOVER):
        _move(store, m.id, p)
    typo = ControlStore(dynalite, f"{unique_name}-ctl-typo")
    typo.ensure_table()
    with ShardedTable(m, dynalite, control_table=typo.table, refresh_seconds=3600) as t:
        assert t.phase == "steady"  # no marker yet: nothing tells it (the pre-marker behaviour)
        _marker(dynalite, m, Owner(m.id, store.table))
        assert not t.refresh()
        for call in (lambda: t.put_item(Item=ev(1)), lambda: t.get_item(Key=key(1)),
                     lambda: t.delete_item(Key=key(1))):
            with pytest.raises(errors.ShimUnavailable, match=f"reads control table '{typo.table}'") as e:
                call()
            assert store.table in str(e.value)
        assert [i for i in scan(dynalite, m.table) if "sensor_id" in i] == []  # nothing was written


def test_case5_a_shim_on_an_earlier_migrations_file_refuses_after_the_next_one_completed(dynalite, unique_name):
    """Migration P completed; the next migration M of the same table starts (the marker names M,
    replacing P) and completes. A shim still running P's file acted on P's ``complete`` routing
    (P's new layout, which M moved on from) once M released the table; now the marker refuses it.
    The next migration's file deployed before M's ``start`` serves the steady state."""
    ctl = f"{unique_name}-ctl"
    p = migration("sensor", table=unique_name)
    create_table(dynalite, p)
    store = ControlStore(dynalite, ctl)
    store.register(p)
    _marker(dynalite, p, Owner(p.id, ctl))
    _complete(store, p)
    nxt = dataclasses.replace(migration("sensor", table=unique_name), id="sensor-32-to-64")
    with ShardedTable(nxt, dynalite, control_table=ctl, refresh_seconds=3600) as early, \
            ShardedTable(p, dynalite, control_table=ctl, refresh_seconds=3600) as old:
        assert early.phase == "steady" and old.phase == "complete"
        early.put_item(Item=ev(1, val=1))  # the next migration's file before `start`: steady, serves
        old.put_item(Item=ev(2, val=1))

        store.register(nxt)  # `start` of the next migration: the marker names it, replacing P
        _marker(dynalite, p, Owner(nxt.id, ctl, previous=Owner(p.id, ctl)))
        _complete(store, nxt)
        assert not old.refresh()
        with pytest.raises(errors.ShimUnavailable, match=f"'{nxt.id}'.*now owns the layout"):
            old.put_item(Item=ev(3, val=1))
        with pytest.raises(errors.ShimUnavailable):
            old.get_item(Key=key(2))
        assert early.refresh() and early.phase == "complete"  # its own migration: serves
        early.put_item(Item=ev(4, val=1))
        assert early.get_item(Key=key(4), ConsistentRead=True)["Item"] == ev(4, val=1)


def test_case5_a_retired_migrations_shim_serves_the_owner_it_replaced(dynalite, unique_name):
    """M aborted and retired: the marker names P again (the owner M replaced). M's shim, which saw
    the marker name M, serves M's old layout -- P's -- as steady state instead of refusing."""
    ctl = f"{unique_name}-ctl"
    p = migration("sensor", table=unique_name)
    create_table(dynalite, p)
    store = ControlStore(dynalite, ctl)
    store.register(p)
    _complete(store, p)
    m = dataclasses.replace(migration("sensor", table=unique_name), id="sensor-32-to-64")
    store.register(m)
    _marker(dynalite, m, Owner(m.id, ctl, previous=Owner(p.id, ctl)))
    with ShardedTable(m, dynalite, control_table=ctl, refresh_seconds=3600) as t:
        assert t.phase == "planned"
        _move(store, m.id, Phase.ABORTED)
        store.mark_retired(store.load_state(m.id), "test")
        _marker(dynalite, m, Owner(p.id, ctl))
        assert t.refresh() and t.phase == "steady"
        t.put_item(Item=ev(1, val=1))
        assert t.get_item(Key=key(1), ConsistentRead=True)["Item"] == ev(1, val=1)


def test_the_marker_item_is_never_returned(dynalite, unique_name):
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t = shim(m, dynalite, "backfill")
    _marker(dynalite, m, Owner(m.id, "ctl"))
    t.put_item(Item=ev(1, val=1))
    assert t.scan(ConsistentRead=True)["Items"] == [ev(1, val=1)]
    assert shim(m, dynalite, "complete").scan()["Items"] == [ev(1, val=1)]
    assert shim(m, dynalite, None).scan()["Items"] == [ev(1, val=1)]


# ---------------------------------------------------------------------------------- _rs_gone
def _gone_copy(dynamo, m, mapper: KeyMapper, item: dict, side: str, version: str, **extra) -> dict:
    """A copy of ``item`` at its ``side`` key that a cleanup retired (with ``extra`` attributes)."""
    fields = mapper.logical_fields(to_wire(item))
    k = mapper.layout(side).key(fields)
    stored = {**to_wire({**item, **extra}), **k, VERSION_ATTR: {"S": version}, GONE_ATTR: {"S": "an-earlier-one"}}
    if side == "new":
        stored[NEW_COPY_ATTR] = {"S": m.id}
    dynamo.call("put_item", TableName=m.table, Item=stored)
    return k


def _moving(mapper: KeyMapper) -> int:
    return next(i for i in range(100)
                if mapper.old.key(mapper.logical_fields(to_wire(ev(i)))) != mapper.new.key(mapper.logical_fields(to_wire(ev(i)))))


def test_retired_copies_are_absent_to_every_read(dynalite, unique_name):
    """A retired copy with a *higher* version than the live one (both layouts read): every read
    returns the live copy; where only the retired copy's layout is read, the item is absent.
    Before the fix the retired copy won (its stale content) or counted as the item."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    mapper = KeyMapper(m)
    k = _moving(mapper)
    writer = shim(m, dynalite, "dual_write")
    writer.put_item(Item=ev(k, val=1))
    new_key = mapper.new.key(mapper.logical_fields(to_wire(ev(k))))
    dynalite.call("delete_item", TableName=m.table, Key=new_key)  # only the old copy is live
    _gone_copy(dynalite, m, mapper, ev(k), "new", "9" * 13 + ".000000.zz", val=99)

    both = shim(m, dynalite, "backfill")
    assert both.get_item(Key=key(k), ConsistentRead=True)["Item"] == ev(k, val=1)
    assert both.batch_get_item(Keys=[key(k)], ConsistentRead=True)["Items"] == [ev(k, val=1)]
    assert both.query(Key={"sensor_id": "s-1"}, ConsistentRead=True)["Items"] == [ev(k, val=1)]
    assert both.scan(ConsistentRead=True)["Items"] == [ev(k, val=1)]

    new_only = shim(m, dynalite, "complete")
    assert new_only.get_item(Key=key(k), ConsistentRead=True).get("Item") is None
    assert new_only.batch_get_item(Keys=[key(k)], ConsistentRead=True)["Items"] == []
    assert new_only.query(Key={"sensor_id": "s-1"}, ConsistentRead=True)["Items"] == []
    assert new_only.scan(ConsistentRead=True)["Items"] == []


@pytest.mark.parametrize("phase", ["cutover", "complete"])
def test_no_write_builds_on_a_retired_copy(dynalite, unique_name, phase):
    """A retired copy (stale attributes ``val``, ``old``) at the key an update writes: the update
    acts on an absent item -- ``attribute_exists`` fails, a plain update creates the item with
    only its own attributes, ``ALL_OLD`` returns nothing. Before the fix the update merged into
    the retired copy and revived its attributes (a deleted item's fields came back)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    mapper = KeyMapper(m)
    k = _moving(mapper)
    t = shim(m, dynalite, phase)
    _gone_copy(dynalite, m, mapper, ev(k), "new", "9" * 13 + ".000000.zz", val=99, old="stale")
    with pytest.raises(errors.ConditionalCheckFailed):
        t.update_item(Key=key(k), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 1},
                      ConditionExpression="attribute_exists(sensor_id)")
    out = t.update_item(Key=key(k), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 1},
                        ReturnValues="ALL_OLD")
    assert "Attributes" not in out
    assert t.get_item(Key=key(k), ConsistentRead=True)["Item"] == ev(k, val=1)
    assert not [i for i in scan(dynalite, m.table) if GONE_ATTR in i]


def _write(t, op: str, k: int, condition: str, **kw):
    if op == "put":
        return t.put_item(Item=ev(k, val=1), ConditionExpression=condition, **kw)
    if op == "delete":
        return t.delete_item(Key=key(k), ConditionExpression=condition, **kw)
    return t.update_item(Key=key(k), UpdateExpression="SET val = :v", ExpressionAttributeValues={":v": 1},
                         ConditionExpression=condition, **kw)


@pytest.mark.parametrize("op", ["put", "delete", "update"])
@pytest.mark.parametrize("phase", [None, "cutover"], ids=["steady", "cutover"])
def test_an_app_condition_judges_a_retired_copy_as_the_absent_item_it_stands_for(dynalite, unique_name, phase, op):
    """A retired copy (stale ``val``, an *older* version than any write's) at the key a conditional
    write goes to: the application's condition is decided as boto3's Table decides it on an
    absent item. ``attribute_exists(val)`` fails (``ReturnValuesOnConditionCheckFailure``: no
    item); ``attribute_not_exists(val)`` holds: the put/update stores only its own attributes,
    the delete deletes nothing that was there (no old values). Before the fix the condition was
    judged on the retired copy: a put or delete with ``attribute_exists`` passed (a put in the
    steady state and in cutover alike: the old copy's version does not stop it), the update with
    ``attribute_not_exists`` landed on the copy in the steady state (the a25 finding) and the
    ones with ``attribute_not_exists`` failed."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    mapper = KeyMapper(m)
    k = _moving(mapper)
    side = "old" if phase is None else "new"  # the authoritative layout
    t = shim(m, dynalite, phase)
    _gone_copy(dynalite, m, mapper, ev(k), side, "1700000000000.000000.aa", val=99, old="stale")
    with pytest.raises(errors.ConditionalCheckFailed) as e:
        _write(t, op, k, "attribute_exists(val)", ReturnValuesOnConditionCheckFailure="ALL_OLD")
    assert "Item" not in e.value.response, e.value.response
    assert t.get_item(Key=key(k), ConsistentRead=True).get("Item") is None

    _gone_copy(dynalite, m, mapper, ev(k), side, "1700000000000.000000.aa", val=99, old="stale")
    out = _write(t, op, k, "attribute_not_exists(val)", **({} if op == "update" else {"ReturnValues": "ALL_OLD"}))
    assert "Attributes" not in out, out
    got = t.get_item(Key=key(k), ConsistentRead=True).get("Item")
    assert got == (None if op == "delete" else ev(k, val=1))
    assert not [i for i in scan(dynalite, m.table) if GONE_ATTR in i]
