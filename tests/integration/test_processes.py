"""``--processes P`` against dynalite, from the command line (``reshard.cli.main.main`` in this
process, its children forked by the fork server): two processes copy every item once and verify
passes with the same per-segment counts as one process; a child killed mid-run is one line and
exit 1, a SIGTERM to the command stops the other with its leases released, and a re-run
finishes. The fork server imports reshard once per test session, so a child costs little; the
tables are small, and the children are slowed (an emulated round trip) only where a test must
catch them mid-run.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time

import pytest

from reshard.cli.main import main
from reshard.cli.options import Env
from reshard.control.runs import backfill_progress, read_run, segment_records
from reshard.control.store import ControlStore
from reshard.core.leases import FREE
from reshard.jobs.engine import SegmentEngine
from reshard.jobs.subscribers import EventLog

from tests.backfill_support import Shim, diff, expected_table, logical, scan_all, setup_migration
from tests.conftest import ROOT
from tests.index_support import create_gsi_table, header, setup_index_migration
from tests.process_support import slow_client

SEGMENTS = 4


@pytest.fixture
def table(dynalite, dynalite_server, unique_name):
    """An invoices table (random suffix: most items move) of ``n`` items, in backfill."""
    def make(n: int):
        control = f"{unique_name}-ctl"
        m, mapper, store = setup_migration(dynalite, "invoices", unique_name, control=control, mid=unique_name)
        shim = Shim(dynalite, mapper, m.table)
        phys = []
        for i in range(n):
            it = logical("invoices", i)
            p = mapper.to_physical(it, mapper.old, shim._shard(shim.ident(it)))
            shim.model[shim.ident(it)] = p
            phys.append({"PutRequest": {"Item": p}})
        dynalite.batch_write(m.table, phys)
        return m, mapper, store, shim
    return make


def cli(capsys, endpoint: str, control: str, *args: str) -> tuple[int, str, str]:
    code = main(["--endpoint-url", endpoint, "--control-table", control, "--output", "json", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_two_processes_copy_every_item_once_and_verify_matches_one_process(table, dynalite, dynalite_server,
                                                                            capsys):
    m, mapper, store, shim = table(240)
    code, out, err = cli(capsys, dynalite_server.endpoint, store.table, "backfill", m.id, "--segments",
                         str(SEGMENTS), "--processes", "2", "--page-size", "20")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["processes"] == 2 and summary["finished"]
    assert summary["worked_here"] == list(range(SEGMENTS)) and summary["pages_redone"] == 0
    assert summary["copied"] == summary["moved"] > 200 and summary["duplicates"] == 0
    # Every logical item once per layout, as the old layout has it.
    assert diff(scan_all(dynalite, m.table), expected_table(mapper, shim.model)) == []

    code, out, err = cli(capsys, dynalite_server.endpoint, store.table, "verify", m.id, "--segments",
                         str(SEGMENTS), "--processes", "2")
    assert code == 0, err
    two = json.loads(out)
    assert two["passed"] and two["processes"] == 2 and two["run"] == 1
    # One process, a fresh run over the same table: the same verdict and per-segment counts.
    code, out, err = cli(capsys, dynalite_server.endpoint, store.table, "verify", m.id, "--segments",
                         str(SEGMENTS), "--processes", "1")
    assert code == 0, err
    one = json.loads(out)
    assert one["run"] == 2 and one["passed"] and one["counts"] == two["counts"] and one["checked"] == two["checked"]

    def per_segment(run: int) -> list[dict]:
        return [{k: v for k, v in r.counters.items() if k not in ("rcu", "wcu")}
                for r in segment_records(store, m.id, "verify", run, SEGMENTS)]

    assert per_segment(1) == per_segment(2)
    assert per_segment(1)[0]["checked"] > 0
    runs = [read_run(store, m.id, "verify", r) for r in (1, 2)]
    assert all(r.finished for r in runs)
    assert {k: v for k, v in runs[0].totals.items() if k not in ("rcu", "wcu")} == \
        {k: v for k, v in runs[1].totals.items() if k not in ("rcu", "wcu")}


def _owners(store, mid: str) -> dict[int, int]:
    """segment -> pid of the process holding its lease (held leases only)."""
    out = {}
    for s in (backfill_progress(store, mid) or {}).get("segments", []):
        owner = s.get("owner") or FREE
        if owner != FREE:
            out[s["segment"]] = int(owner.split(":")[1])
    return out


def _when_both_hold(store, mid: str, act, timeout: float = 60.0) -> threading.Thread:
    """A thread that calls ``act(pids)`` once two child processes hold a lease each."""
    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = set(_owners(store, mid).values()) - {os.getpid()}
            if len(pids) >= 2:
                act(sorted(pids))
                return
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_a_killed_child_is_one_line_a_sigterm_stops_the_other_with_its_leases_released_and_a_rerun_finishes(
        table, dynalite, dynalite_server, capsys, monkeypatch):
    m, mapper, store, shim = table(200)
    # Children slowed to ~10 ms a request, so the test catches them mid-run.
    monkeypatch.setattr(Env, "client_factory",
                        lambda self: functools.partial(slow_client, dynalite_server.endpoint, 0.01))
    events: list = []

    def kill_one_then_stop(pids: list[int]) -> None:
        # SIGKILL one child while both hold a lease; once it is gone, SIGTERM the command
        # itself: it passes a SIGTERM on to the other, which finishes its page and releases.
        victim, other = pids
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(victim, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)
        events.extend([victim, other])
        os.kill(os.getpid(), signal.SIGTERM)

    watcher = _when_both_hold(store, m.id, kill_one_then_stop)
    code, out, err = cli(capsys, dynalite_server.endpoint, store.table, "backfill", m.id, "--segments",
                         str(SEGMENTS), "--processes", "2", "--workers", "1", "--concurrency", "1", "--page-size",
                         "5", "--lease-seconds", "15")
    watcher.join(15)
    assert events, "the two children never held a lease at once"
    victim, other = events
    lines = [line for line in err.strip().splitlines() if line.startswith("reshard:")]
    assert code == 1 and len(lines) == 1 and err.strip().endswith(lines[0]) and "Traceback" not in err, err
    assert lines[0].startswith("reshard: error: backfill process") and \
        f"(pid {victim}) died (killed by SIGKILL)" in lines[0], lines[0]
    after = backfill_progress(store, m.id)
    assert after["done"] < SEGMENTS
    # The stopped child released every lease it held; only the killed one's may be left.
    held = _owners(store, m.id)
    assert other not in held.values() and set(held.values()) <= {victim}, held

    # A re-run (one process, this one) takes the dead child's segment over at once and finishes.
    monkeypatch.undo()
    code, out, err = cli(capsys, dynalite_server.endpoint, store.table, "backfill", m.id, "--segments",
                         str(SEGMENTS), "--processes", "1")
    assert code == 0, err
    summary = json.loads(out)
    # The killed child's page is redone once (by its sibling already, or by this re-run).
    assert summary["finished"] and len(held) <= summary["pages_redone"] <= 1
    assert diff(scan_all(dynalite, m.table), expected_table(mapper, shim.model)) == []


def test_an_interrupt_while_run_all_waits_for_a_worker_mid_page_still_releases_its_lease(dynalite, unique_name):
    """Ctrl-C (or SIGTERM through the runner) landing while ``run_all`` waits for its workers.

    CPython 3.11's ``Thread.join`` interrupted there marks the running thread stopped, so an
    engine that joined its workers returned at once and its process exited mid-page with the
    lease held (the parent of ``--processes`` saw it on every forwarded SIGTERM). Forced: the
    page itself sends SIGINT to the main thread and stays in the page for a second after.
    """
    store = ControlStore(dynalite, f"{unique_name}-ctl")
    store.ensure_table()
    main_thread = threading.main_thread().ident
    stay = threading.Event()

    def page(ctx, start_key):
        signal.pthread_kill(main_thread, signal.SIGINT)
        stay.wait(1.0)  # still mid-page while the main thread handles the interrupt
        return {"scanned": 1}, {"PK": {"S": "next"}}

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    log = EventLog()
    try:
        with pytest.raises(KeyboardInterrupt):  # released, then the command ends as interrupted (exit 130)
            SegmentEngine(store, unique_name, "backfill", 1, 1, page, workers=1, lease_seconds=10,
                          max_request_seconds=dynalite.attempt_seconds, subscribers=[log]).run_all()
    finally:
        signal.signal(signal.SIGINT, previous)
        stay.set()
    (rec,) = segment_records(store, unique_name, "backfill", 1, 1)
    assert rec.owner == FREE and rec.checkpoint == {"PK": {"S": "next"}} and not rec.done
    assert log.kinds("stopping") == [("stopping", "stopping: finishing the page in flight, releasing leases")]


def test_two_processes_rewrite_an_index_only_migration(dynalite, dynalite_server, unique_name, capsys):
    """An index-only migration's jobs are other specs (reshard.jobs.index_jobs): the children run
    those, and the parent's finish has no table layouts to map."""
    table, control = f"{unique_name}-gsi", f"{unique_name}-ctl"
    create_gsi_table(dynalite, table)
    dynalite.batch_write(table, [{"PutRequest": {"Item": header(i, i % 4)}} for i in range(40)])
    text = (ROOT / "migrations" / "0005_invoices_gsi.toml").read_text().replace(
        'table = "InvoiceTransactions"', f'table = "{table}"')
    m, store = setup_index_migration(dynalite, table, control, text=text)
    code, out, err = cli(capsys, dynalite_server.endpoint, control, "backfill", m.id, "--segments", str(SEGMENTS),
                         "--processes", "2")
    assert code == 0, err
    assert json.loads(out)["processes"] == 2
    code, out, err = cli(capsys, dynalite_server.endpoint, control, "verify", m.id, "--segments", str(SEGMENTS),
                         "--processes", "1")
    assert code == 0 and json.loads(out)["passed"], err


def test_an_idle_child_is_woken_when_a_siblings_last_segment_ends(table, dynalite, dynalite_server):
    """Two processes, three segments: the child that is left without a segment waits for its
    sibling's last one. It used to sleep a whole poll interval (0.5 s at each run's end);
    its parent now wakes it when a sibling's segment ends. With a 30 s poll the run ends
    long before one poll: without the wake it took over 30 s."""
    from reshard import operations
    from reshard.jobs.runner import JobOptions

    m, mapper, store, shim = table(150)
    opts = JobOptions(segments=3, processes=2, workers=1, page_size=10, poll_seconds=30, lease_seconds=120)
    t0 = time.monotonic()
    result = operations.run_data_job("backfill", dynalite, store, m.id, opts,
                                     client=functools.partial(slow_client, dynalite_server.endpoint, 0.002))
    elapsed = time.monotonic() - t0
    assert result.finished and result.totals["copied"] == result.totals["moved"] > 100, result.totals
    assert sorted(result.worked) == [0, 1, 2]
    assert elapsed < 25, f"an idle child slept its poll interval ({elapsed:.1f} s)"


def test_a_rerun_waiting_for_a_dead_workers_lease_says_so(dynalite, unique_name):
    """Issue 27 point 12: a re-run after a `kill -9` on another host crawled for the lease's length
    in silence. Its idle workers now say whose lease they wait for and for how long still; the
    segment is taken over once the lease stayed unchanged for the holder's lease."""
    from reshard.core.wire import N, S
    from reshard.jobs.backfill import BACKFILL
    from reshard.jobs.runner import JobOptions, run_job
    from tests.backfill_support import setup_migration

    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=f"{unique_name}-ctl")
    run_sk = "R#backfill#000001"
    store.put({"pk": S(store.jpk(m.id, "backfill")), "sk": S(run_sk), "job": S("backfill"), "run": N(1),
               "total_segments": N(2), "started_at": N(time.time()), "started_by": S("gone-host:42:abc")})
    # Segment 0 leased by a worker of another host, killed: its lease (2 s) is never renewed.
    store.put({"pk": S(store.jpk(m.id, "backfill")), "sk": S("J#backfill#000001#00000"), "job": S("backfill"),
               "run": N(1), "segment": N(0), "owner": S("gone-host:42:abc:0"), "lease_counter": N(3),
               "lease_expires": N(0), "done": {"BOOL": False}, "lease_seconds": N(2), "max_request_seconds": N(1)})
    log = EventLog()
    said: list[str] = []
    from reshard.jobs.subscribers import ProgressReporter
    rep = ProgressReporter("backfill", m.id, 2, 1, total=lambda: (None, ""), say=said.append, interval=60.0)
    result = run_job(BACKFILL, dynalite, store, m.id, JobOptions(segments=2, workers=1, poll_seconds=0.2),
                     subscribers=[log, rep])
    assert result.done
    waits = [w[2] for w in log.kinds("wait")]
    assert waits, (result.run, log.events)
    assert waits[0].startswith("lease of segment 0 held by gone-host:42:abc:0, quiet for 0s of 2s "
                                         "(taken over once unchanged for the whole lease"), waits
    assert any("waiting: lease of segment 0 held by gone-host:42:abc:0, quiet for" in line for line in said), said
