"""Review of session 6 (issue 16's speed work): holes found, each a test that fails on main
(``xfail(strict=True)``: the suite stays green, and a fix makes it pass and fail the xfail).

What the review checked and found sound is in ``notes/review_s6.md``, not here."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from reshard.core.compare import classify
from reshard.core.join import digest
from reshard.core.layout import KeyMapper
from reshard.core.migration import load
from reshard.jobs.processes import _woken_by

from tests.conftest import ROOT


@pytest.mark.parametrize("tag, members", [("SS", ["a", "b"]), ("NS", ["1", "2"]), ("BS", [b"\x01", b"\x02"])])
def test_one_set_listed_in_another_order_is_no_difference(tag, members):
    """DynamoDB's sets are unordered (the order a read lists members in is not part of the
    value); PRODUCT.md: verify's exit 0 means identical. The copy carries the old item's order,
    but an application write to one copy (or DynamoDB's own storage) may list the same set
    otherwise: the join's digest and the judge's ``==`` both see a difference."""
    m = KeyMapper(load(ROOT / "migrations" / "0001_sensor_events.toml"))
    old = m.to_physical({"sensor_id": {"S": "s-1"}, "ts": {"S": "t"}, "event_id": {"S": "e-1"},
                         "tags": {tag: members}}, m.old)
    new, _ = m.remap(old)
    new["tags"] = {tag: list(reversed(members))}
    assert digest(m.content(old, m.old)) == digest(m.content(new, m.new))  # the join's first look
    assert classify(m, old, new) is None  # the judge's verdict on the re-read


def test_a_wake_reaches_every_idle_worker_of_the_child():
    """processes._woken_by promises 'no wake is lost'. Two idle workers of one child: A waits, B
    is between its read of the segments and its wait when a sibling's segment ends; the parent
    counts it once; A's wait returns, and so does B's (it saw the count before its read).
    The first version shared one Event that each worker cleared: B slept its whole poll."""
    wakes = multiprocessing.get_context("spawn").RawValue("Q", 0)
    idle_wait = _woken_by(wakes, slice_seconds=0.01)
    done = []
    b_read = threading.Event()

    def worker_b():
        idle_wait(0.0)  # B's previous wait ended: the count it knows
        b_read.set()  # ... B reads the segments here (its sibling's segment not yet done)
        wake_given.wait(5)
        t0 = time.monotonic()
        idle_wait(30.0)  # B's wait: the segments changed since its read
        done.append(time.monotonic() - t0)

    wake_given = threading.Event()
    a = threading.Thread(target=lambda: (idle_wait(30.0), done.append("a")))  # worker A: idle, waiting
    b = threading.Thread(target=worker_b)
    a.start()
    b.start()
    assert b_read.wait(5)
    wakes.value += 1  # the parent relays the sibling's segment_done
    wake_given.set()
    a.join(10)
    b.join(10)
    assert not a.is_alive() and not b.is_alive(), "a worker slept its whole poll: the wake was lost"
    assert "a" in done and len(done) == 2
    # With nothing new since its last wait, a wait lasts its time.
    idle_wait(0.0)
    t0 = time.monotonic()
    idle_wait(0.1)
    assert time.monotonic() - t0 >= 0.1


@pytest.mark.xfail(strict=True, reason="KeyMapper.fields takes a derived field's source from the key text (a str) "
                                       "over the stored number: an epoch-seconds ts the shim wrote is "
                                       "'bad-timestamp' to backfill and verify (pre-existing, not this session's)")
def test_an_epoch_seconds_source_the_shim_wrote_maps_back():
    """0003_sensor_hourly: bucket = strftime(ts), and ``derive_time`` takes ISO text OR epoch
    seconds as a number. The shim writes ts N 1700000000 into bucket 2023-11-14T22 and the sort
    key "s1#1700000000"; parsing the keys back gives ts as the text "1700000000", which is no ISO
    time: the backfill cannot copy the item and verify counts it unmappable (a blocked
    migration, never a pass). The stored attribute (N) says what the text was."""
    m = KeyMapper(load(ROOT / "migrations" / "0003_sensor_hourly.toml"))
    item = m.to_physical({"sensor_id": {"S": "s1"}, "ts": {"N": "1700000000"}, "v": {"N": "1"}}, m.old)
    assert item["PK"]["S"].endswith("#2023-11-14T22")
    values = m.fields(item, m.old)
    copy, _ = m.remap(item)
    assert m.fields(copy, m.new) == values


def test_the_recorder_digests_a_set_in_any_order_alike_and_a_list_in_another_order_apart():
    """The scan's records (the join's first look) agree with the judge: a set listed in
    another order at any depth is the same value; a list in another order is not."""
    from reshard.core.join import NEW, OLD, Recorder

    m = KeyMapper(load(ROOT / "migrations" / "0001_sensor_events.toml"))
    r = Recorder(m)
    base = {"sensor_id": {"S": "s-1"}, "ts": {"S": "t"}, "event_id": {"S": "e-1"}}

    def records(old_value, new_value):
        old = m.to_physical({**base, "x": old_value}, m.old)
        new, _ = m.remap(old)
        new["x"] = new_value
        return (r.record(old, OLD, m.fields(old, m.old)).digest, r.record(new, NEW, m.fields(new, m.new)).digest)

    a, b = records({"M": {"n": {"NS": ["10", "9", "1.5"]}}}, {"M": {"n": {"NS": ["1.5", "9", "10"]}}})
    assert a == b
    a, b = records({"L": [{"SS": ["b", "a"]}]}, {"L": [{"SS": ["a", "b"]}]})
    assert a == b
    a, b = records({"L": [{"S": "a"}, {"S": "b"}]}, {"L": [{"S": "b"}, {"S": "a"}]})
    assert a != b
    a, b = records({"SS": ["a", "b"]}, {"SS": ["a", "c"]})
    assert a != b
