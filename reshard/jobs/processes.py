"""``--processes P``: one data job run by P worker processes of this host.

One Python process is bound by its GIL to about one core of client CPU (signing,
encoding, the event hooks of every request), however many ``--workers`` threads it
runs. Processes are the way past it, and they need no new coordination: each child runs
the unchanged per-process machinery (:func:`reshard.jobs.runner.run_job`: its own
DynamoDB client and lean connections, its own segment engine, workers, ``--concurrency``
and capacity budget) as one more worker of the same run, exactly as a second host would
(the KCL pattern: the segment leases in the control table decide who copies what; owner
ids are ``host:pid:invocation:worker``, so every child is a distinct owner).

The parent
    * checks every precondition once and chooses the run (:func:`reshard.jobs.runner.choose_run`)
      before any child starts, so a refusal is one line and every child joins the same run
      (each child still checks the preconditions itself: it is a worker like any other);
    * starts the children from a fork server (or with "spawn"; :func:`context`), never by
      forking itself (forking a process that has threads, as boto3's and the job's do, can
      copy a lock held by another thread);
    * turns their progress events into one header and one bar or log line (the command's
      own subscribers, fed over one pipe per child: a child killed mid-write breaks only
      its own pipe, never a queue lock the others share);
    * forwards SIGTERM and SIGINT to every child as one SIGTERM (each finishes its page and
      releases its leases, as a single process does on Ctrl-C);
    * reaps a child that dies at once, so its siblings see its pid gone and take its
      segments over without waiting for the lease to expire (``engine.same_host_dead``),
      and reports it in one line (exit 1), or else the worst child's error;
    * calls the job's ``finish`` hook once (cleanup retires an aborted migration).

Budget: each child is a member of the run's budget row (``--max-wcu``/``--max-rcu`` hold
for the whole run, :mod:`reshard.control.budget`), exactly like a process of another host;
each passes the whole budget and paces at the share the row gives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import pathlib
import resource
import signal
import sys
import threading
import time
import types
from multiprocessing.connection import wait as wait_ready
from typing import Callable, Iterable, Iterator

import reshard
from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.runs import allowed_unmappable, examples as recorded_examples, read_run, segment_records
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper
from reshard.core.phases import BACKFILL_JOB, CLEANUP_JOB, STRIP_JOB, VERIFY_JOB
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import RunResult
from reshard.jobs.runner import JobContext, JobOptions, JobResult, JobSpec, choose_run, run_job
from reshard.jobs.subscribers import Fanout, Subscriber

#: Where each job's spec lives (a child imports only its own job's module).
SPECS = {BACKFILL_JOB: ("reshard.jobs.backfill", "BACKFILL"), VERIFY_JOB: ("reshard.jobs.verify", "VERIFY"),
         CLEANUP_JOB: ("reshard.jobs.cleanup", "CLEANUP"), STRIP_JOB: ("reshard.jobs.strip", "STRIP")}

#: How often a child's idle worker looks at the segments again: at the end of a run it waits
#: for its siblings' last segments (to take them over if one dies), one query of the segment
#: rows each. The parent also wakes it as soon as a sibling's segment ends or a sibling exits
#: (:func:`_wake_siblings`), so this bounds only what the parent cannot see: another host's work.
CHILD_POLL_SECONDS = 0.5

#: Exit status of a child stopped by a signal before it had a result (as the CLI's Ctrl-C).
INTERRUPTED = 130


def context(start_method: str | None = None):
    """The multiprocessing context children start in: "forkserver" where there is one, else "spawn".

    Never a plain fork of the parent (it runs threads: boto3's, the job's; a fork copies any
    lock another thread holds at that moment). The fork server is a fresh single-threaded
    interpreter that imports the job modules once and forks each child from itself, so a
    child starts in milliseconds instead of re-importing boto3 and reshard (about a second
    of CPU each: P of them at once on a many-core host). Children see the environment the
    server started with: the command's own, plus the two variables of
    :func:`_server_imports_ours`.
    """
    method = start_method or ("forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn")
    mp = multiprocessing.get_context(method)
    if method == "forkserver":
        mp.set_forkserver_preload([__name__, "reshard.jobs.index_jobs", *(module for module, _ in SPECS.values())])
    return mp


#: The directory this process imported reshard from (a child must run the same code).
RESHARD_ROOT = str(pathlib.Path(reshard.__file__).resolve().parent.parent)


@contextlib.contextmanager
def _server_imports_ours() -> Iterator[None]:
    """While the fork server may be starting: make it import this process's reshard.

    The server imports the preloaded modules with its own ``sys.path`` (CPython 3.11 ignores
    the parent's there), whose first entry would be the working directory: a ``reshard/``
    checkout there would become the children's code. ``PYTHONSAFEPATH`` drops that entry
    and ``PYTHONPATH`` puts ours first (only the server's start reads them).
    """
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONSAFEPATH")}
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join([RESHARD_ROOT] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"]
                                                                 else []))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def job_spec(job: str, index_only: bool = False) -> JobSpec:
    """The spec of ``job`` (``index_only``: its variant for a migration of a GSI only)."""
    module, name = SPECS[job]
    spec = getattr(importlib.import_module(module), name)
    if index_only:
        from reshard.jobs.index_jobs import index_spec
        spec = index_spec(spec)
    else:
        from reshard.jobs.combined import combined_spec  # a combined file's pages, chosen per run
        spec = combined_spec(spec)
    return spec


def default_processes() -> int:
    """``--processes`` when not given: the cores this process may run on (its CPU affinity,
    which a container's cpuset narrows; a CPU quota is not seen: give --processes there)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


class ProcessFailed(errors.ReshardError):
    """A child process died, or failed with an error; ``exit_code`` is the worst child's."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# --------------------------------------------------------------------------- the child

class _Forward(Subscriber):
    """A child's only subscriber: every event to the parent, over this child's pipe."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()  # one pipe, many worker threads
        self.reason: Callable[[], str] = lambda: ""
        self.waits: dict = {}

    def _send(self, *event) -> None:
        with self.lock:
            self.conn.send(event)

    def on_budget(self, reason) -> None:
        self.reason = reason

    def on_run_start(self, run) -> None: self._send("run_start", run)
    def on_segment_start(self, segment, resumed, reason) -> None: self._send("segment_start", segment, resumed, reason)
    def on_page(self, segment, counts) -> None: self._send("page", segment, dict(counts), self.reason())
    def on_segment_done(self, segment, counters) -> None: self._send("segment_done", segment, dict(counters))
    def on_segment_failed(self, segment, error, attempts, final) -> None:
        self._send("segment_failed", segment, error, attempts, final)
    def on_lease_lost(self, segment, reason) -> None: self._send("lease_lost", segment, reason)
    def on_throttle(self, reason) -> None: self._send("throttle", reason)
    def on_hold(self, segment, reason) -> None: self._send("hold", segment, reason)
    def on_takeover(self, segment, previous_owner) -> None: self._send("takeover", segment, previous_owner)
    def on_budget_state(self, state) -> None: self._send("budget_state", dict(state))
    def on_wait(self, segment, what) -> None:
        # A held request reports every 50 ms: pass on a change, or the same wait once a second.
        now = time.monotonic()
        last = self.waits.get(segment)
        if last is None or last[0] != what or now - last[1] >= 1.0:
            self.waits[segment] = (what, now)
            self._send("wait", segment, what)


def _stop_once(signum, frame):
    # The parent forwards a stop as one SIGTERM; it becomes Ctrl-C here, once (a second
    # one must not interrupt the release of the leases). run_job installs the same during the run.
    signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt


def _woken_by(wakes, slice_seconds: float = 0.05) -> Callable[[float], None]:
    """An idle worker's wait: up to ``seconds``, or until the parent counts another ended
    segment or exited sibling in ``wakes`` (a shared counter; the run may be complete, or a
    join ready). Each worker thread compares it with the count it saw when its last wait
    ended, that is before it read the segments again, so a wake that came while it was
    reading (or while a sibling worker was waiting) is never lost: its next wait returns at
    once. It looks at the counter every ``slice_seconds`` (shared memory, no request)."""
    local = threading.local()
    start = wakes.value

    def wait(seconds: float) -> None:
        seen = getattr(local, "seen", start)
        deadline = time.monotonic() + seconds
        while True:
            now_count = wakes.value
            left = deadline - time.monotonic()
            if now_count != seen or left <= 0:
                local.seen = now_count
                return
            time.sleep(min(slice_seconds, left))
    return wait


def _child(conn, index: int, make_dynamo: Callable[[], Dynamo], control_table: str, job: str, migration_id: str,
           options: JobOptions, run: int, root: str, index_only: bool = False, wakes=None) -> None:
    """A child process: one more worker process of ``run``, with its own client (nothing of the
    parent's clients, threads or locks comes along: it is forked by the fork server, or spawned)."""
    # Ctrl-C in a terminal reaches the whole process group: the parent forwards it as
    # SIGTERM, so each child stops exactly once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop_once)
    cpu0 = time.process_time()
    try:
        if RESHARD_ROOT != root:
            raise errors.ReshardError(f"a worker process imported reshard from {RESHARD_ROOT}, the command from "
                                      f"{root}: run the command with --processes 1")
        dynamo = make_dynamo()
        store = ControlStore(dynamo, control_table)
        result = run_job(job_spec(job, index_only), dynamo, store, migration_id, options, subscribers=[_Forward(conn)],
                         run=run, finish=False, idle_wait=_woken_by(wakes) if wakes is not None else None)
        conn.send(("result", {"worked": result.worked, "consumed": result.consumed,
                              "last_throttle": result.last_throttle, "stopped": result.stopped,
                              "stop_reason": result.stop_reason, "pid": os.getpid(),
                              "shared_budget": result.shared_budget,
                              "cpu_seconds": time.process_time() - cpu0,
                              "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
    except KeyboardInterrupt:
        conn.send(("error", INTERRUPTED, "interrupted"))
    except errors.ReshardError as e:
        conn.send(("error", e.exit_code, str(e)))
    except BaseException as e:  # noqa: BLE001 - a bug of ours: one line in the parent, like the CLI's
        conn.send(("error", 1, f"internal error: {type(e).__name__}: {e}"))
    finally:
        conn.close()


# --------------------------------------------------------------------------- the parent

@contextlib.contextmanager
def _without_main(make_dynamo: Callable) -> Iterator[None]:
    """While a child is spawned, hide the parent's ``__main__`` from it.

    A spawned child first re-imports the parent's main module (the ``reshard`` script: the
    whole command line, click, tqdm), about a third of its start-up, for nothing: what it
    runs lives in this module. Kept when the client factory itself lives in ``__main__``.
    """
    func = getattr(make_dynamo, "func", make_dynamo)
    if getattr(func, "__module__", None) == "__main__":
        yield
        return
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__: nothing to re-import
    try:
        yield
    finally:
        sys.modules["__main__"] = real


@dataclasses.dataclass
class _Child:
    index: int
    process: multiprocessing.process.BaseProcess
    conn: object | None
    outcome: tuple | None = None  # ("result", dict) or ("error", code, message)


def run_processes(job: str, make_dynamo: Callable[[], Dynamo], dynamo: Dynamo, store: ControlStore,
                  migration_id: str, options: JobOptions, *, subscribers: Iterable[Subscriber] = (),
                  sleep: Callable[[float], None] = time.sleep, start_method: str | None = None,
                  index_only: bool = False) -> JobResult:
    """Run ``job`` with ``options.processes`` child processes; one :class:`JobResult` for all.

    ``make_dynamo``: how a child builds its own client (picklable: a module-level function
    or a ``functools.partial`` of one). ``start_method``: None picks :func:`context`'s.
    ``index_only``: the jobs' variant for a migration of a GSI only (:func:`job_spec`).
    ``dynamo``/``store``: the parent's, for the preconditions, the result and the finish hook.
    """
    spec = job_spec(job, index_only)
    subs = Fanout(subscribers)
    state, run = choose_run(spec, dynamo, store, migration_id, options, sleep,
                            on_wait=lambda what: subs.on_wait(None, what))
    count = max(1, options.processes)
    # Each child passes the run's whole budget: the budget row shares it between the members.
    # The per-key pace has no shared row: each child takes its part of the host's.
    per_key = options.max_wcu_per_key / count if options.max_wcu_per_key else options.max_wcu_per_key
    child_opts = dataclasses.replace(options, processes=1, max_wcu_per_key=per_key,
                                     poll_seconds=options.poll_seconds or min(CHILD_POLL_SECONDS,
                                                                              options.lease_seconds / 4))
    mp = context(start_method)
    started_at = time.monotonic()
    children: list[_Child] = []
    stopping = threading.Event()

    def forward(signum, frame) -> None:
        if not stopping.is_set():
            stopping.set()
            subs.on_stopping("stopping: every process finishes the page in flight and releases its leases")
            for c in children:
                if c.process.exitcode is None:
                    try:
                        os.kill(c.process.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass

    on_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if on_main else {}
    try:
        if on_main:
            # A child starts with SIGINT ignored (inherited through exec), so a Ctrl-C in the
            # terminal, which reaches the whole process group, never interrupts its start-up;
            # the stop comes from here, as one SIGTERM each.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, forward)
        # Counts ended segments and exited children; every child's idle workers watch it
        # (only this process writes it: no lock).
        wakes = mp.RawValue("Q", 0)
        for i in range(count):
            recv, send = mp.Pipe(duplex=False)
            p = mp.Process(target=_child, name=f"reshard-{job}-{i + 1}",
                           args=(send, i, make_dynamo, store.table, job, migration_id, child_opts, run,
                                 RESHARD_ROOT, index_only, wakes))
            with _without_main(make_dynamo), _server_imports_ours():
                p.start()
            send.close()  # the child's end: EOF here once the child is gone, however it ends
            children.append(_Child(i, p, recv))
        if on_main:
            signal.signal(signal.SIGINT, forward)
        state_box = {"started": False, "reasons": {}}
        _pump(children, subs, state_box, wakes)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        alive = [c for c in children if c.process.exitcode is None]
        for c in alive:  # only if the parent itself failed: stop them (each releases its leases)
            os.kill(c.process.pid, signal.SIGTERM)
        for c in alive:
            c.process.join(options.lease_seconds)
    result = _combine(spec, job, dynamo, store, state, migration_id, options, run, children, subs, state_box,
                      stopping.is_set(), time.monotonic() - started_at, sleep)
    if stopping.is_set():
        raise KeyboardInterrupt  # stopped by Ctrl-C or SIGTERM: the command exits 130, as one process does
    return result


def _pump(children: list[_Child], subs: Fanout, box: dict, wakes) -> None:
    """Relay every child's events to ``subs`` until every child has ended and been reaped."""
    reasons: dict[int, str] = box["reasons"]
    by_conn = {id(c.conn): c for c in children}
    subs.on_budget(lambda: next((r for r in reasons.values() if r), ""))
    while any(c.conn is not None for c in children):
        ready = wait_ready([c.conn for c in children if c.conn is not None], timeout=0.5)
        for conn in ready:
            c = by_conn[id(conn)]
            try:
                event = conn.recv()
            except (EOFError, OSError):
                # Gone (finished, or killed): reap it now, so its pid no longer exists and
                # its siblings take its leases over at once (same_host_dead).
                conn.close()
                c.conn = None
                c.process.join(5)
                wakes.value += 1
                continue
            _relay(c, event, subs, box, reasons)
            if event[0] in _WAKING:
                wakes.value += 1
    for c in children:
        c.process.join()


#: A child's events after which its siblings' idle workers look at the segments at once
#: instead of at their next poll: a segment ended or was let go, or the child is done (without
#: it the run's end waited up to a poll interval, 0.5 s, for each idle child).
_WAKING = frozenset({"segment_done", "segment_failed", "lease_lost", "result", "error"})


def _relay(c: _Child, event: tuple, subs: Fanout, box: dict, reasons: dict) -> None:
    kind = event[0]
    if kind == "run_start":
        if not box["started"]:  # one header for all
            box["started"] = True
            subs.on_run_start(event[1])
    elif kind == "page":
        reasons[c.index] = event[3]
        subs.on_page(event[1], event[2])
    elif kind == "segment_start":
        subs.on_segment_start(*event[1:])
    elif kind == "segment_done":
        subs.on_segment_done(*event[1:])
    elif kind == "segment_failed":
        subs.on_segment_failed(*event[1:])
    elif kind == "lease_lost":
        subs.on_lease_lost(*event[1:])
    elif kind == "throttle":
        subs.on_throttle(event[1])
    elif kind == "hold":
        subs.on_hold(*event[1:])
    elif kind == "takeover":
        subs.on_takeover(*event[1:])
    elif kind == "budget_state":
        subs.on_budget_state({**event[1], "process": c.index + 1})
    elif kind == "wait":
        subs.on_wait(*event[1:])
    elif kind in ("result", "error"):
        c.outcome = event


def _death(c: _Child, count: int, job: str, migration_id: str) -> str:
    code = c.process.exitcode
    how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
           else f"exit status {code}")
    return (f"{job} process {c.index + 1} of {count} (pid {c.process.pid}) died ({how}); the segments it held "
            f"are taken over by the other processes, by a re-run (`reshard {job} {migration_id}`) at once on "
            f"this host, or elsewhere once its lease expires")


def verdict(children: list[_Child], stopped: bool, job: str, migration_id: str) -> list[dict]:
    """The children's results; raises :class:`ProcessFailed` (one line, the worst child's exit
    status) if one died or failed. A child interrupted because the parent was stopped did not fail."""
    failures: list[tuple[int, str]] = []
    results: list[dict] = []
    for c in children:
        if c.outcome is None:
            failures.append((1, _death(c, len(children), job, migration_id)))
        elif c.outcome[0] == "error":
            code, message = c.outcome[1], c.outcome[2]
            if not (stopped and code == INTERRUPTED):
                failures.append((code, message))
        else:
            results.append(c.outcome[1])
    if failures:
        code = max(f[0] for f in failures)
        first = next(m for c_, m in failures if c_ == code)
        others = len({m for _, m in failures}) - 1
        raise ProcessFailed(first + (f" (and {others} other process failure(s))" if others else ""), code)
    return results


def _combine(spec: JobSpec, job: str, dynamo: Dynamo, store: ControlStore, state, migration_id: str,
             options: JobOptions, run: int, children: list[_Child], subs: Fanout, box: dict, stopped: bool,
             elapsed: float, sleep) -> JobResult:
    results = verdict(children, stopped, job, migration_id)
    info = read_run(store, migration_id, job, run)
    if info is None:  # stopped before any child reached the run
        raise ProcessFailed(f"{job} of {migration_id} was stopped before it started; nothing was written",
                            INTERRUPTED if stopped else 1)
    records = segment_records(store, migration_id, job, run, options.segments)
    worked = sorted({s for r in results for s in r["worked"]})
    reasons = [r["stop_reason"] for r in results if r["stop_reason"]]
    outcome = RunResult(info, records, worked, elapsed, stopped or any(r["stopped"] for r in results),
                        reasons[0] if reasons else "")
    consumed = {k: round(sum(r["consumed"].get(k, 0.0) for r in results), 1) for k in ("rcu", "wcu")}
    throttles = [r["last_throttle"] for r in results if r["last_throttle"]]
    if box["started"]:
        subs.on_run_done(outcome)
    if outcome.done:
        m = state.migration()
        mapper = KeyMapper(m) if m.changes_table else None  # None: an index-only migration, as run_job does
        ctx = JobContext(dynamo, store, state, m, mapper, run, CapacityBudget(), options, time.time, sleep)
        spec.finish(ctx, outcome)
    shown = recorded_examples(store, migration_id, job, run)[:options.examples] if options.examples else []
    budgets = [r["shared_budget"] for r in results if r["shared_budget"]]
    return JobResult(job, migration_id, run, outcome, consumed=consumed,
                     last_throttle=throttles[-1] if throttles else "", examples=shown,
                     shared_budget=budgets[-1] if budgets else {},
                     allowed_unmappable=allowed_unmappable(store, migration_id),
                     processes=[{k: r[k] for k in ("pid", "worked", "consumed", "cpu_seconds", "maxrss_kb")}
                                for r in results])
