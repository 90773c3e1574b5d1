"""The shim's metrics recorded with the OpenTelemetry SDK's in-memory reader across a switch
(backfill -> cutover) on dynalite: per-phase latency, a request held by the switch and for how
long, a mirror failure, a failed refresh, the refresh age, and a ShimUnavailable."""

from __future__ import annotations

import dataclasses
import threading
import time
from decimal import Decimal

import pytest

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core.metrics import SHIM_METRIC_NAMES
from reshard.core.phases import Action, Phase
from reshard.shim.table import ShardedTable
from tests.otel_support import points, reader
from tests.shim_helpers import create_table, migration

OPEN = lambda store, state: {"backfill_missing": None, "verify_missing": None, "cleanup_missing": None}  # noqa: E731


class FailingMirror(Dynamo):
    """Once armed, fails the second data-table PutItem (a put's mirror: the first is its
    authoritative write)."""

    puts = None

    def call(self, operation: str, **kwargs) -> dict:
        if self.puts is not None and operation == "put_item" and not kwargs["TableName"].endswith("-ctl"):
            self.puts += 1
            if self.puts == 2:
                raise errors.AWSError("put_item", "InternalServerError", "injected: the mirror write failed")
        return super().call(operation, **kwargs)


def test_shim_metrics_across_a_switch_with_the_sdk_in_memory_reader(dynalite_server, unique_name):
    reader()  # the SDK, installed before the shim records anything here
    ctl = f"{unique_name}-ctl"
    m = dataclasses.replace(migration("sensor", table=unique_name), id=unique_name)
    base = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1",
                  retry=RetryPolicy(max_attempts=2, base_seconds=0.01))
    create_table(base, m)
    store = ControlStore(base, ctl)
    store.register(m)
    while store.load_state(m.id).phase is not Phase.BACKFILL:
        transition(store, m.id, Action.ADVANCE, gates=OPEN, allow_no_shims=True)
    dyn = FailingMirror(endpoint_url=dynalite_server.endpoint, region="us-east-1",
                        retry=RetryPolicy(max_attempts=1, base_seconds=0.01))
    shim = ShardedTable(m, dyn, control_table=ctl, refresh_seconds=600, liveness_seconds=600,
                        switch_hold_seconds=20, writer_id="a")
    key = {"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:00:00Z"}
    try:
        for i in range(3):
            shim.put_item(Item={**key, "n": Decimal(i)})
        shim.get_item(Key=key)
        # The switch: the operator's transition waits for the fleet; the shim's next request is
        # held until the switch is over, then goes on under cutover.
        box: dict = {}
        op = threading.Thread(target=lambda: box.setdefault("t", transition(
            store, m.id, Action.ADVANCE, gates=OPEN, switch_wait=20, allow_no_shims=True)))
        op.start()
        deadline = time.monotonic() + 15
        while not store.load_state(m.id).switching:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        shim.refresh()
        shim.put_item(Item={**key, "n": Decimal(10)})  # held, then served under cutover
        op.join(20)
        assert shim.phase == "cutover" and "t" in box
        shim.put_item(Item={**key, "n": Decimal(11)})
        dyn.puts = 0  # cutover mirrors to the old layout: that write fails
        with pytest.raises(errors.AWSError, match="the mirror write failed"):
            shim.put_item(Item={**key, "n": Decimal(12)})
        dyn.puts = None
        real = shim._phases._control.load_state
        shim._phases._control.load_state = lambda *a, **k: (_ for _ in ()).throw(
            errors.AWSError("get_item", "InternalServerError", "injected"))
        assert shim.refresh() is False  # a failed refresh
        shim._phases._control.load_state = real
        shim._phases.liveness_seconds = 0.0  # its window ran out: the next request fails closed
        time.sleep(0.01)
        with pytest.raises(errors.ShimUnavailable):
            shim.get_item(Key=key)
        got = points(m.id)
    finally:
        shim.close()

    assert set(got) <= set(SHIM_METRIC_NAMES)
    latency = {(a["reshard.phase"], a["reshard.operation"]): p.count for a, p in got["reshard.shim.request.duration"]}
    assert latency[("backfill", "PutItem")] == 3 and latency[("backfill", "GetItem")] == 1
    assert latency[("cutover", "PutItem")] == 3  # the held put, the next, the one whose mirror failed
    held = {a["reshard.outcome"]: p.value for a, p in got["reshard.shim.switch.held"]}
    assert held == {"switched": 1}
    (_, hold), = got["reshard.shim.switch.hold.duration"]
    assert hold.count == 1 and hold.sum > 0
    assert [(a["reshard.phase"], p.value) for a, p in got["reshard.shim.mirror.failures"]] == [("cutover", 1)]
    assert [p.value for _, p in got["reshard.shim.refresh.failures"]] == [1]
    assert [(a["reshard.error"], p.value) for a, p in got["reshard.shim.unavailable"]] == [("ReshardShimUnavailable", 1)]
    ages = [(a["reshard.instance"], p.value) for a, p in got["reshard.shim.refresh.age"]]
    assert ages and ages[0][0] == "a" and ages[0][1] >= 0
