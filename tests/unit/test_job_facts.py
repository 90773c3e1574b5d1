"""A job's fact keeper (reshard/jobs/facts.py): every data write's horizon is the server's Date of
the latest control read that saw a phase the job may write in, plus H; a stale fact is read
again, a moved phase stops the write (issue 25 case 2). Driven with a fake control store."""

from __future__ import annotations

import pytest

from reshard.control.records import MigrationState
from reshard.core.phases import Phase
from reshard.jobs.facts import DatedWrites, FactExpired, JobFacts


def meta(phase: str, version: int, *, enforced: bool = True, horizon: float = 6.0) -> dict:
    return {"pk": {"S": "M#m1"}, "sk": {"S": "META"}, "id": {"S": "m1"}, "table": {"S": "T"},
            "phase": {"S": phase}, "phase_version": {"N": str(version)}, "file_text": {"S": ""},
            "file_hash": {"S": ""}, "request_horizon": {"N": str(horizon)},
            "server_deadline": {"S": "enforced" if enforced else "off"}}


class FakeServer:
    """A control table whose META the test sets, answering with the server clock it keeps."""

    def __init__(self, item: dict, clock: list):
        self.item, self.clock, self.reads = item, clock, 0
        self.dynamo = self
        self._date = None

    def load_state(self, migration_id: str) -> MigrationState:
        self.reads += 1
        self._date = float(int(self.clock[0]))  # the Date header: whole seconds
        return MigrationState.from_item(self.item)

    def answer_date(self) -> float | None:
        return self._date


@pytest.fixture
def world():
    clock = [1000.0]  # server time == local monotonic time here (same rate; the offset is irrelevant)
    store = FakeServer(meta("backfill", 4), clock)
    facts = JobFacts(store, "m1", "backfill", [Phase.BACKFILL], monotonic=lambda: clock[0])
    return clock, store, facts


def test_horizon_is_the_fact_date_plus_h_and_is_refreshed_every_third_of_h(world):
    clock, store, facts = world
    assert facts.fresh() is None and store.reads == 1  # the engine's first page reads afresh
    assert facts.horizon() == 1000.0 + 6.0 and store.reads == 1
    clock[0] = 1001.9  # younger than H/3: the same fact
    assert facts.horizon() == 1006.0 and store.reads == 1
    clock[0] = 1002.5  # H/3 old: read again; the new fact extends the horizon
    assert facts.horizon() == 1002.0 + 6.0 and store.reads == 2


def test_a_moved_phase_stops_the_write_before_it_is_sent(world):
    clock, store, facts = world
    facts.fresh()
    store.item = meta("cutover", 6)
    clock[0] = 1003.0
    with pytest.raises(FactExpired, match="moved to cutover"):
        facts.horizon()
    # ... and every later one: the last fact that saw backfill is never extended again.
    with pytest.raises(FactExpired):
        facts.horizon()
    assert facts() is not None  # the page guard stops the job too


def test_no_server_deadline_dates_nothing():
    clock = [1000.0]
    store = FakeServer(meta("backfill", 4, enforced=False), clock)
    facts = JobFacts(store, "m1", "backfill", [Phase.BACKFILL], monotonic=lambda: clock[0])
    facts.fresh()
    assert facts.horizon() is None


def test_dated_writes_date_writes_to_the_data_table_only():
    calls = []

    class Client:
        def call(self, op, **kw):
            calls.append((op, kw.get("horizon")))
            return {}

    h = lambda: 42.0  # noqa: E731
    d = DatedWrites(Client(), "T", h)
    d.call("put_item", TableName="T", Item={})
    d.call("update_item", TableName="T", Key={})
    d.call("delete_item", TableName="T", Key={})
    d.call("batch_write_item", RequestItems={"T": []})
    d.call("scan", TableName="T")
    d.call("put_item", TableName="ctl", Item={})
    assert calls == [("put_item", h), ("update_item", h), ("delete_item", h), ("batch_write_item", h),
                     ("scan", None), ("put_item", None)]
