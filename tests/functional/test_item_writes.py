"""runner.item_writes: a page's per-item writes in flight at once, and what it promises the page."""

from __future__ import annotations

import threading
import time

import pytest

from reshard.jobs.budget import CapacityBudget
from reshard.jobs.runner import item_writes


class Ctx:
    """The part of a PageContext item_writes uses: the lease's guard (counts overlapping calls)."""

    def __init__(self):
        self.inside = 0
        self.overlaps = 0
        self.calls = 0
        self.lock = threading.Lock()

    def write_guard(self):
        with self.lock:
            self.inside += 1
            self.calls += 1
            self.overlaps += self.inside > 1
        time.sleep(0.001)
        with self.lock:
            self.inside -= 1


def test_results_in_item_order_usage_summed_and_the_guard_never_runs_twice_at_once():
    ctx, budget = Ctx(), CapacityBudget()
    running, peak = [0], [0]
    lock = threading.Lock()

    def write(guard, item):
        guard()
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        with budget.spend("write", 2.0):
            time.sleep(0.01)
        with lock:
            running[0] -= 1
        return item * 10

    results, used = item_writes(ctx, budget, write, list(range(40)), concurrency=8)
    assert results == [i * 10 for i in range(40)]
    assert used == {"rcu": 0.0, "wcu": 80.0}  # each write's units, from the threads that spent them
    assert ctx.calls == 40 and ctx.overlaps == 0
    assert 2 <= peak[0] <= 8


def test_the_first_failure_stops_the_rest_and_is_raised_once_nothing_is_in_flight():
    ctx, budget = Ctx(), CapacityBudget()
    finished, started = [], []
    lock = threading.Lock()

    class Deadline(Exception):
        pass

    def write(guard, item):
        with lock:
            started.append(item)
        if item == 4:  # in the first chunk: the others are still writing when it fails
            raise Deadline("the lease's deadline passed")
        time.sleep(0.05)
        with lock:
            finished.append(item)
        return item

    with pytest.raises(Deadline):
        item_writes(ctx, budget, write, list(range(200)), concurrency=4)
    done_at_raise = len(finished)
    time.sleep(0.2)
    assert len(finished) == done_at_raise  # every write that had started had answered before the raise
    assert len(started) < 200  # the items after the failure were not written


def test_concurrency_one_writes_on_the_page_thread_in_order():
    ctx, budget = Ctx(), CapacityBudget()
    threads, order = set(), []

    def write(guard, item):
        threads.add(threading.current_thread().name)
        order.append(item)
        return item

    results, used = item_writes(ctx, budget, write, [3, 1, 2], concurrency=1)
    assert results == [3, 1, 2] and order == [3, 1, 2]
    assert threads == {threading.current_thread().name} and used == {"rcu": 0.0, "wcu": 0.0}
