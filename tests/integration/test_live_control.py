"""Live control of a running backfill across processes (issue 28's "done when").

Two ``reshard backfill`` processes (two subprocesses: two hosts as far as the run knows) share
one run through a counting proxy in front of dynalite, each serving its metrics on its own
``--metrics-port``. Mid-run, ``reshard throttle --max-wcu`` lowers the run's budget: within
10 s the capacity each process consumes per window (read from its own Prometheus endpoint)
follows its share of the new budget. ``reshard pause`` holds both (the proxy counts no write
to the data table while they are paused, and no lease is taken over), and ``reshard resume``
(after a throttle back up) lets the run finish. Bounded: 1,500 small items, budgets of tens
of WCU/s.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from reshard.cli.main import main
from reshard.control.runs import segment_records
from tests.backfill_support import logical, setup_migration
from tests.conftest import ROOT
from tests.reliability.chaos import FaultProxy

ITEMS, SEGMENTS = 1500, 8
START_WCU, LOW_WCU = 60.0, 12.0
CONSUMED = "reshard_job_consumed_write_capacity_units_total"


class Worker:
    """One ``reshard backfill`` subprocess: its output drained by a thread, its metrics port."""

    def __init__(self, cmd: list[str], env: dict):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.ports: queue.Queue = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("metrics: Prometheus text on http://"):
                self.ports.put(int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]))

    def port(self) -> int:
        try:
            self.port_ = self.ports.get(timeout=60)
        except queue.Empty:
            raise AssertionError("no metrics port line:\n" + "\n".join(self.lines)) from None
        return self.port_

    def metrics(self) -> dict:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port_}/metrics", timeout=5).read().decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if "reason" not in s.labels}


def wait_for(what: str, check, timeout: float, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def test_throttle_pause_and_resume_reach_every_process_of_a_run(dynalite, dynalite_server, unique_name):
    m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=unique_name + "-c", mid=unique_name)
    dynalite.batch_write(m.table, [{"PutRequest": {"Item": mapper.to_physical(logical("invoices", i), mapper.old,
                                                                              i % mapper.old.shards)}}
                                   for i in range(ITEMS)])
    env = dict(os.environ, PYTHONPATH=str(ROOT), RESHARD_PROGRESS_SECONDS="3600", RESHARD_PROCESSES="1")
    ctl = ["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table]
    with FaultProxy(dynalite_server.port, seed=1, throttle=0, error5xx=0, split=0) as proxy:
        proxy.enabled = False  # it only counts
        cmd = [sys.executable, "-m", "reshard", "--endpoint-url", proxy.endpoint, "--control-table", store.table,
               "backfill", m.id, "--segments", str(SEGMENTS), "--page-size", "25", "--max-wcu", str(START_WCU),
               "--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--lease-seconds", "20"]
        workers = [Worker(cmd + ["--host-id", f"pod-{i}"], env) for i in range(2)]
        try:
            for w in workers:
                w.port()
            wait_for("both processes copying", lambda: all(w.metrics().get(CONSUMED, 0) > 0 for w in workers), 30)

            # -- throttle: each process's consumed WCU per window follows its share of the new budget.
            assert main([*ctl, "throttle", m.id, "--max-wcu", str(LOW_WCU)]) == 0
            changed = time.monotonic()
            share = LOW_WCU / 2
            window = 3.0
            samples = [[(time.monotonic(), w.metrics()[CONSUMED])] for w in workers]

            def following():
                for w, seen in zip(workers, samples):
                    seen.append((time.monotonic(), w.metrics()[CONSUMED]))
                rates = []
                for seen in samples:
                    now, last = seen[-1]
                    old = [(t, c) for t, c in seen if t <= now - window and t >= changed]
                    if not old:
                        return None
                    t0, c0 = old[-1]
                    rates.append((last - c0) / (now - t0))
                # Each at its share: not above it (the token bucket's half second of burst and the beat's
                # one-second steps aside), and not far below (requests reserved at the old share go out
                # first, then the new share repays their debt: a gap of a few seconds, then the share).
                return rates if all(share * 0.5 <= r <= share * 1.3 + 1 for r in rates) else None
            rates = wait_for(f"every process at most its share ({share:g} WCU/s) of the new budget", following,
                             10 + window, poll=0.5)
            assert sum(rates) <= LOW_WCU * 1.3 + 2, rates
            adopted = time.monotonic() - changed - window  # the window's start: when both were at it
            print(f"throttle {START_WCU:g} -> {LOW_WCU:g} WCU/s: every process at its share within {adopted:.1f} s; "
                  f"WCU/s per process over the {window:g} s after: {[round(r, 1) for r in rates]}")
            assert adopted <= 10
            for w in workers:
                got = w.metrics()
                assert got["reshard_job_write_capacity_budget_units_per_second"] == LOW_WCU
                assert got["reshard_job_write_capacity_share_units_per_second"] <= share + 0.01

            # -- pause: every worker holds; no data write reaches the server while paused.
            assert main([*ctl, "pause", m.id]) == 0
            wait_for("both processes paused", lambda: all(w.metrics()["reshard_job_paused"] == 1 for w in workers), 10)
            time.sleep(0.5)  # a write whose last check passed just before the pause lands within its round trip
            before = proxy.writes.get(m.table, 0)
            owners = {r.segment: r.token for r in segment_records(store, m.id, "backfill", 1, SEGMENTS)
                      if r.held}
            time.sleep(2.5)
            assert proxy.writes.get(m.table, 0) == before, "a data write reached the server during the pause"
            held = {r.segment: r for r in segment_records(store, m.id, "backfill", 1, SEGMENTS) if r.held}
            assert owners and set(held) == set(owners)  # the leases stayed with their owners ...
            assert all(held[s].owner == owners[s][0] for s in owners)
            copied_in_pause = sum(w.metrics()["reshard_job_items_copied_total"] for w in workers)
            assert copied_in_pause < ITEMS  # ... mid-run

            # -- resume (at a budget that finishes quickly): the run completes, nothing redone.
            assert main([*ctl, "throttle", m.id, "--max-wcu", "3000"]) == 0
            assert main([*ctl, "resume", m.id]) == 0
            for w in workers:
                assert w.proc.wait(timeout=120) == 0, "\n".join(w.lines)
        finally:
            for w in workers:
                if w.proc.poll() is None:
                    w.proc.kill()
    records = segment_records(store, m.id, "backfill", 1, SEGMENTS)
    assert all(r.done for r in records)
    assert sum(r.takeovers for r in records) == 0  # the kept leases were never taken over
    totals = {k: sum(r.counters.get(k, 0) for r in records) for k in ("moved", "copied", "duplicates")}
    assert totals["copied"] + totals["duplicates"] == totals["moved"] > 0
