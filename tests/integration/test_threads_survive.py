"""Long-lived threads survive whatever a server or a row says, and recover by themselves (issue 30, case 1).

A shim's refresh thread, and a job's budget beat, each meet every trigger the issue found
on loopback: a 2xx answer whose body is ``[]`` or ``123``, a non-numeric ``x-amz-crc32``, a
Content-Length of 2**62, and a META row or the table lock with an attribute of the wrong
type (an operator's console typo). Before the fix the first of them killed the refresh
thread for good: once the liveness window passed, every request raised ShimUnavailable --
also after the endpoint or the row was healthy again -- until the application restarted.
Now the shim fails closed while the cause lasts, logs the failure once (not at every
refresh), and serves again once the endpoint is healed, with the same thread.
"""

from __future__ import annotations

import logging
import time
import uuid
from decimal import Decimal

import pytest

from reshard import errors
from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.control import budget as rows
from reshard.control.budget import BudgetMembership
from reshard.control.records import TABLE_LOCK_SK, table_lock_pk
from reshard.control.store import ControlStore
from reshard.core.phases import Action
from reshard.control.transition import transition
from reshard.jobs.budget import CapacityBudget
from reshard.shim.table import ShardedTable

from tests.hostile_server import Fault, HostileProxy, answer, on_table
from tests.shim_helpers import create_table, migration

pytestmark = pytest.mark.integration

LIVENESS = 2.0
REFRESH = 0.05

#: Each trigger: a fault the proxy serves for control-table requests, or a row edit.
ANSWERS = {
    "2xx body []": Fault(answer("[]")),
    "2xx body 123": Fault(answer("123")),
    "non-numeric x-amz-crc32": Fault(answer("{}", headers={"x-amz-crc32": "not-a-number"})),
    "Content-Length 2**62": Fault(answer("", length=str(2 ** 62)), close=True),
}
ROWS = ("META phase_version stored as S", "table lock migration_id stored as N")


def wait_until(what, timeout: float = 30.0, pause: float = 0.02):
    """Poll ``what()`` until it is truthy (never a timing assertion: the deadline only ends a hang)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(pause)
    raise AssertionError(f"still not true after {timeout}s")


@pytest.fixture
def setting(dynalite_server, unique_name):
    """A migration in dual_write, its control table, and a hostile proxy in front of dynalite."""
    base = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1")
    m = migration("sensor", unique_name)
    create_table(base, m)
    store = ControlStore(base, f"{unique_name}-ctl")
    store.register(m)
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    with HostileProxy(dynalite_server.endpoint) as proxy:
        yield m, store, proxy


def break_row(store: ControlStore, m, which: str):
    """Write the typo; return how to put the row back."""
    if which.startswith("META"):
        key = (store.mpk(m.id), "META")
        bad = {"phase_version": {"S": "three"}}
    else:
        key = (table_lock_pk(m.table), TABLE_LOCK_SK)
        bad = {"migration_id": {"N": "7"}}
    good = store.get(*key)
    store.dynamo.call("put_item", TableName=store.table, Item={**good, **bad})
    return lambda: store.dynamo.call("put_item", TableName=store.table, Item=good)


@pytest.mark.parametrize("trigger", [*ANSWERS, *ROWS])
def test_the_refresh_thread_survives_each_trigger_and_the_shim_serves_again_once_healed(setting, trigger, caplog):
    m, store, proxy = setting
    caplog.set_level(logging.WARNING, logger="reshard")
    offset = [0.0]
    dynamo = Dynamo(endpoint_url=proxy.endpoint, region="us-east-1",
                    retry=RetryPolicy(max_attempts=2, max_seconds=2, base_seconds=0.01, max_backoff_seconds=0.02),
                    connect_timeout=1, read_timeout=3)
    shim = ShardedTable(m, dynamo, control_table=store.table, refresh_seconds=REFRESH, liveness_seconds=LIVENESS,
                        clock=lambda: time.monotonic() + offset[0])
    key = {"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:00:00Z"}
    try:
        shim.put_item(Item={**key, "v": Decimal(1)})
        thread = shim._phases._thread
        if trigger in ANSWERS:
            proxy.fault = on_table(store.table, ANSWERS[trigger])
            wait_until(lambda: proxy.faults_served >= 3)  # the thread met it three times (or died at the first)
        else:
            heal_row = break_row(store, m, trigger)
            wait_until(lambda: shim._phases._last_error)
            time.sleep(10 * REFRESH)  # more refreshes meet the typo
        assert thread.is_alive(), "the refresh thread died"
        # Past the liveness window (the injected clock jumps) the shim fails closed.
        offset[0] += LIVENESS + 1
        with pytest.raises(errors.ShimUnavailable):
            shim.put_item(Item={**key, "v": Decimal(2)})
        # Healed: the same thread refreshes again, and the shim serves without a restart.
        if trigger in ANSWERS:
            proxy.fault = None
        else:
            heal_row()
        healed_at = shim._phases._clock()
        wait_until(lambda: shim._phases._last_ok >= healed_at)  # a refresh begun after the heal worked
        shim.put_item(Item={**key, "v": Decimal(3)})
        assert shim.get_item(Key=key)["Item"]["v"] == 3
        assert shim._phases._thread is thread and thread.is_alive()
    finally:
        proxy.fault = None
        shim.close()
    failures = [r.getMessage() for r in caplog.records if "phase refresh failed" in r.getMessage()]
    assert 1 <= len(failures) <= 2, failures  # once per kind (a second kind: the retry's), not per refresh
    assert all("\x1b" not in f for f in failures)
    assert any("phase refresh works again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("trigger", ["2xx body []", "Content-Length 2**62"])
def test_a_budget_beat_survives_a_bad_answer_and_holds_its_share_again_once_healed(setting, trigger, caplog):
    m, store, proxy = setting
    caplog.set_level(logging.WARNING, logger="reshard")
    dynamo = Dynamo(endpoint_url=proxy.endpoint, region="us-east-1",
                    retry=RetryPolicy(max_attempts=2, max_seconds=2, base_seconds=0.01, max_backoff_seconds=0.02),
                    connect_timeout=1, read_timeout=3)
    budget = CapacityBudget(100.0)
    member = BudgetMembership(ControlStore(dynamo, store.table), m.id, "backfill", 1, budget, {"write": 100.0},
                              member=f"h:{uuid.uuid4().hex[:6]}", request_seconds=0.5, refresh_seconds=0.05,
                              liveness_seconds=1.0).join()
    try:
        proxy.fault = on_table(store.table, ANSWERS[trigger])
        wait_until(lambda: proxy.faults_served >= 3)
        wait_until(lambda: budget.clock() > budget.valid_until)  # its share lapsed: it sends nothing
        assert member._thread.is_alive()
        proxy.fault = None
        wait_until(lambda: budget.clock() < budget.valid_until)  # the same thread holds a share again
        assert member._thread.is_alive() and rows.read_shares(store, m.id, "backfill", 1) is not None
    finally:
        proxy.fault = None
        member.leave()
    failures = [r.getMessage() for r in caplog.records if "budget beat" in r.getMessage() and "failed" in r.getMessage()]
    assert 1 <= len(failures) <= 2, failures
    assert any("works again" in r.getMessage() for r in caplog.records)
