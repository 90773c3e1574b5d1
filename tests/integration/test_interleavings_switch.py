"""Issue 12, case 1: the authority switch (backfill <-> cutover), forced interleavings on dynalite.

Two shims A and B on one table. The operator moves the migration across an authority
change while B is frozen in the middle of a read-modify-write (its authoritative write
done, its mirror write not yet sent) and has not refreshed its phase; A has refreshed.
Without a switch, A acts at once on the new authority while B still acts on the old
one, and two acknowledged ``ADD n :1`` leave n = 1. With the switch, A's request is held
until B's request finished and B acknowledged the switch, so n = 2.

The interleaving is forced: B's client blocks before its second write until the test
releases it; A's request runs in a thread; every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest

from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core.phases import Action, Phase
from reshard.shim.table import ShardedTable
from tests.shim_helpers import create_table, migration

OPEN = lambda store, state: {"backfill_missing": None, "verify_missing": None, "cleanup_missing": None}  # noqa: E731


class FreezableDynamo(Dynamo):
    """A Dynamo whose n-th data write (after ``arm``) blocks until ``release``."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.armed_at: int | None = None
        self.writes = 0
        self.frozen = threading.Event()
        self.go = threading.Event()

    def arm(self, nth_write: int) -> None:
        self.armed_at, self.writes = nth_write, 0

    def call(self, operation: str, **kwargs) -> dict:
        if self.armed_at is not None and operation in ("put_item", "update_item", "delete_item") \
                and not kwargs.get("TableName", "").endswith("-ctl"):
            self.writes += 1
            if self.writes == self.armed_at:
                self.frozen.set()
                assert self.go.wait(30), "never released"
        return super().call(operation, **kwargs)


def _dyn(endpoint: str, cls=Dynamo) -> Dynamo:
    return cls(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=5, base_seconds=0.01))


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _wait_for(pred, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not pred():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


@pytest.mark.parametrize("start,action", [(Phase.BACKFILL, Action.ADVANCE), (Phase.CUTOVER, Action.ROLLBACK)])
def test_two_adds_across_the_authority_switch_both_count(dynalite_server, unique_name, start, action):
    got, final = _race_two_adds(dynalite_server, unique_name, start, action)
    assert sorted(got) == [1, 2], got  # each caller saw its own increment on top of the other's
    assert final == [2, 2]  # both acknowledged increments count, read through either shim


def test_without_the_switch_hold_an_acknowledged_add_is_lost(dynalite_server, unique_name, monkeypatch):
    """Mutation check: with the switch disabled the same interleaving loses an increment,
    so the test above can fail."""
    import reshard.control.transition as transition_module
    monkeypatch.setattr(transition_module, "changes_authority", lambda frm, to: False)
    got, final = _race_two_adds(dynalite_server, unique_name, Phase.BACKFILL, Action.ADVANCE)
    assert got == [1, 1] and final == [1, 1]


def _race_two_adds(dynalite_server, unique_name, start, action):
    ctl = f"{unique_name}-ctl"
    m = migration("sensor", table=unique_name)
    base = _dyn(dynalite_server.endpoint)
    create_table(base, m)
    store = ControlStore(base, ctl)
    store.register(m)
    while store.load_state(m.id).phase is not start:
        transition(store, m.id, Action.ADVANCE, gates=OPEN, allow_no_shims=True)
    dyn_b = _dyn(dynalite_server.endpoint, FreezableDynamo)
    shims = [ShardedTable(m, d, control_table=ctl, refresh_seconds=3600, liveness_seconds=600,
                          switch_hold_seconds=20, writer_id=w)
             for d, w in ((_dyn(dynalite_server.endpoint), "a"), (dyn_b, "b"))]
    a, b = shims
    try:
        key = {"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:00:00Z"}
        a.put_item(Item={**key, "n": Decimal(0)})
        add = {"UpdateExpression": "ADD n :one", "ExpressionAttributeValues": {":one": Decimal(1)},
               "ReturnValues": "ALL_NEW"}

        # B starts its read-modify-write on the current authority and freezes between
        # its authoritative write and its mirror write.
        dyn_b.arm(2)
        tb, box_b = _in_thread(lambda: b.update_item(Key=key, **add))
        assert dyn_b.frozen.wait(10)

        # The operator moves the migration across the authority change.
        before = store.load_state(m.id).phase_version
        top, box_op = _in_thread(lambda: transition(store, m.id, action, gates=OPEN, switch_wait=20, allow_no_shims=True))
        _wait_for(lambda: store.load_state(m.id).phase_version > before)

        # A notices the change and does the same update.
        a.refresh()
        ta, box_a = _in_thread(lambda: a.update_item(Key=key, **add))
        ta.join(1.0)  # with the switch A is held here; without it A is done already

        # B finishes its request and notices the change too; the operator can finish.
        dyn_b.go.set()
        tb.join(15)
        b.refresh()
        for t in (ta, top):
            t.join(30)
        assert not any(t.is_alive() for t in (ta, tb, top))
        for box in (box_a, box_b, box_op):
            assert "error" not in box, box["error"]
        after = store.load_state(m.id)
        assert after.phase is (Phase.CUTOVER if action is Action.ADVANCE else Phase.BACKFILL)
        assert not after.switching
        b.refresh()
        got = [box_a["value"]["Attributes"]["n"], box_b["value"]["Attributes"]["n"]]
        return got, [s.get_item(Key=key, ConsistentRead=True).get("Item")["n"] for s in (a, b)]
    finally:
        dyn_b.go.set()
        for s in shims:
            s.close()


def test_a_switch_the_fleet_does_not_reach_is_abandoned_and_nothing_acts_on_the_new_authority(
        dynalite_server, unique_name):
    """A shim that never acknowledges (frozen mid-request, never refreshing) makes the switch
    go back to backfill after ``switch_wait``; a held request meanwhile is never sent and
    fails with the retryable SwitchInProgress when its hold bound passes."""
    from reshard import errors
    ctl = f"{unique_name}-ctl"
    m = migration("sensor", table=unique_name)
    base = _dyn(dynalite_server.endpoint)
    create_table(base, m)
    store = ControlStore(base, ctl)
    store.register(m)
    while store.load_state(m.id).phase is not Phase.BACKFILL:
        transition(store, m.id, Action.ADVANCE, gates=OPEN, allow_no_shims=True)
    dyn_b = _dyn(dynalite_server.endpoint, FreezableDynamo)
    a = ShardedTable(m, _dyn(dynalite_server.endpoint), control_table=ctl, refresh_seconds=3600,
                     liveness_seconds=600, switch_hold_seconds=1.0, writer_id="a")
    b = ShardedTable(m, dyn_b, control_table=ctl, refresh_seconds=3600, liveness_seconds=600, writer_id="b")
    try:
        key = {"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:00:00Z"}
        a.put_item(Item={**key, "n": Decimal(0)})
        dyn_b.arm(2)
        tb, box_b = _in_thread(lambda: b.update_item(Key=key, UpdateExpression="ADD n :one",
                                                     ExpressionAttributeValues={":one": Decimal(1)}))
        assert dyn_b.frozen.wait(10)
        top, box_op = _in_thread(lambda: transition(store, m.id, Action.ADVANCE, gates=OPEN, switch_wait=2.0, allow_no_shims=True))
        _wait_for(lambda: store.load_state(m.id).switching)
        a.refresh()
        started = time.monotonic()
        with pytest.raises(errors.SwitchInProgress, match="retry"):
            a.put_item(Item={**key, "n": Decimal(100)})
        assert time.monotonic() - started >= 0.9
        top.join(15)
        assert isinstance(box_op.get("error"), errors.RefusedTransition), box_op
        assert "abandoned" in str(box_op["error"])
        state = store.load_state(m.id)
        assert state.phase is Phase.BACKFILL and not state.switching
        dyn_b.go.set()
        tb.join(15)
        assert "error" not in box_b, box_b
        a.refresh()
        # B's increment; A's held put was never sent
        assert a.get_item(Key=key, ConsistentRead=True)["Item"]["n"] == 1
        history = [(t.from_phase, t.to_phase, t.action) for t in store.history(m.id)][-2:]
        assert history == [("backfill", "cutover", "advance"), ("cutover", "backfill", "switch-abandoned")]
    finally:
        dyn_b.go.set()
        a.close()
        b.close()
