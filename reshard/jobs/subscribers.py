"""Progress subscribers for the segment engine: the interface, a tqdm bar, and an event log.

The engine never touches a UI (s3transfer-style); the command picks a subscriber.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable

from reshard.core.decode import safe_text
from reshard.core.progress import Progress, progress_counter

if TYPE_CHECKING:  # annotations only: the engine imports this module
    from reshard.control.records import RunInfo
    from reshard.jobs.engine import RunResult


class Subscriber:
    """Progress callbacks (s3transfer-style). Override what you need; called from worker threads."""

    def on_budget(self, reason: Callable[[], str]) -> None:
        """Before the run starts: ``reason()`` says why the job's budget slows it now (or "")."""
    def on_run_start(self, run: "RunInfo") -> None: ...
    def on_segment_start(self, segment: int, resumed: bool, reason: str) -> None: ...
    def on_page(self, segment: int, counts: dict) -> None: ...
    def on_segment_done(self, segment: int, counters: dict) -> None: ...
    def on_segment_failed(self, segment: int, error: str, attempts: int, final: bool) -> None: ...
    def on_lease_lost(self, segment: int, reason: str) -> None: ...
    def on_throttle(self, reason: str) -> None: ...
    def on_run_done(self, result: "RunResult") -> None: ...
    def on_hold(self, segment: int | None, reason: str) -> None:
        """A worker waits while the run is paused (about every second while it lasts)."""
    def on_takeover(self, segment: int, previous_owner: str) -> None:
        """This process took over a lease its owner never released (the page since its checkpoint is redone)."""
    def on_budget_state(self, state: dict) -> None:
        """After every budget beat: this process's budget, consumption and control state
        (:func:`reshard.jobs.runner.budget_state`); a ``--processes`` parent gets each child's
        with ``state["process"]`` set."""


class Fanout(Subscriber):
    """Calls every subscriber in turn."""

    def __init__(self, subs: Iterable[Subscriber]):
        self.subs = list(subs)

    def __getattribute__(self, name):
        if name.startswith("on_"):
            subs = object.__getattribute__(self, "subs")
            return lambda *a, **k: [getattr(s, name)(*a, **k) for s in subs]
        return object.__getattribute__(self, name)


class TqdmSubscriber(Subscriber):
    """A tqdm bar in items with items/s and an ETA against ``total`` (DescribeTable's ItemCount).

    ``counter`` is the page count that advances the bar (``scanned`` for scans).
    Quiet (no bar at all) when ``enabled`` is false: not a TTY, or ``--output json``.
    """

    def __init__(self, total: int | None, *, initial: int = 0, enabled: bool = True, counter: str = "scanned",
                 desc: str = "backfill"):
        self.enabled = enabled
        self.counter = counter
        self._lock = threading.Lock()
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total or None, initial=initial, unit="item", unit_scale=True, desc=desc,
                            dynamic_ncols=True, smoothing=0.1)

    def on_page(self, segment: int, counts: dict) -> None:
        if self.bar is not None:
            with self._lock:
                self.bar.update(counts.get(self.counter, 0))

    def on_throttle(self, reason: str) -> None:
        if self.bar is not None:
            with self._lock:
                self.bar.set_postfix_str(reason[:60], refresh=False)

    def on_segment_failed(self, segment: int, error: str, attempts: int, final: bool) -> None:
        if self.bar is not None and final:
            with self._lock:
                self.bar.write(f"segment {segment} failed after {attempts} attempts: {safe_text(error, 1000)}")

    def on_run_done(self, result: RunResult) -> None:
        if self.bar is not None:
            self.bar.close()


class ProgressReporter(Subscriber):
    """What an operator sees while a data job runs, gh-ost style.

    Nothing before the run starts (:func:`reshard.jobs.runner.run_job` calls
    ``on_run_start`` only once every precondition passed, so a refused job prints no
    header). Then one header line, and either a tqdm bar with a total (``tty``) or, every
    ``interval`` seconds, one log line: items done / total, %, rate, ETA, segments done and
    why the budget throttles.

    ``total() -> (items | None, source)``: the estimate the percent and ETA use (see
    :func:`reshard.operations.progress_total`). ``done_before(run) -> items``: what earlier
    invocations of the run already did (a resumed run starts there; not counted in the rate).
    """

    def __init__(self, job: str, migration_id: str, segments: int, workers: int, *,
                 total: Callable[[], tuple[int | None, str]], done_before: Callable[[int], int] = lambda run: 0,
                 say: Callable[[str], None] = print, tty: bool = False, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 processes: int = 1):
        self.job, self.migration_id, self.segments, self.workers = job, migration_id, segments, workers
        self.processes = processes
        self.counter = progress_counter(job)
        self._total, self._done_before = total, done_before
        self.say, self.tty, self.interval, self.clock, self.wall = say, tty, interval, clock, wall
        self._lock = threading.Lock()
        self.bar = None
        self.total: int | None = None
        self.source = ""
        self.done = self.before = self.segments_done = 0
        self.started = self.last_line = 0.0
        self.throttle = ""
        self._reason: Callable[[], str] | None = None
        self.held: tuple[float, str] | None = None  # (when, why) a worker last said it waits for `resume`
        self.lines: list[str] = []  # every log line said (tests and the final summary read them)

    def on_run_start(self, run: "RunInfo") -> None:
        self.total, self.source = self._total()
        self.done = self.before = int(self._done_before(run.run))
        self.started = self.last_line = self.clock()
        of = f"; about {self.total:,} items ({self.source})" if self.total else \
            (f"; total unknown ({self.source})" if self.source else "")
        workers = (f"{self.processes} processes × {self.workers} workers" if self.processes > 1
                   else f"{self.workers} workers")
        self.say(f"{self.job} of {self.migration_id}: {self.segments} segments, {workers} on this "
                 f"host (run {run.run}){of}")
        if self.tty:
            from tqdm import tqdm
            self.bar = tqdm(total=self.total or None, initial=self.before, unit="item", unit_scale=True,
                            desc=self.job, dynamic_ncols=True, smoothing=0.1)

    def progress(self) -> Progress:
        return Progress(self.done, self.total, self.clock() - self.started, self.before, self.source)

    def line(self) -> str:
        """One log record: UTC time, job, progress, segments, throttling."""
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall()))
        out = (f"{at} {self.job} {self.migration_id}: {self.progress().text()}; "
               f"{self.segments_done}/{self.segments} segments done here")
        held = self.held
        if held is not None and self.clock() - held[0] <= 3.0:
            return out + f"; HELD: {held[1]}"  # paused: the line says what the job waits for
        why = self._reason() if self._reason else self.throttle
        return out + (f"; throttling: {why}" if why else "")

    def _maybe_say(self, force: bool = False) -> None:
        now = self.clock()
        if self.bar is None and (force or now - self.last_line >= self.interval):
            self.last_line = now
            text = self.line()
            self.lines.append(text)
            self.say(text)

    def on_page(self, segment: int, counts: dict) -> None:
        with self._lock:
            n = counts.get(self.counter, 0)
            self.done += int(n)
            if self.bar is not None:
                self.bar.update(n)
            self._maybe_say()

    def on_segment_done(self, segment: int, counters: dict) -> None:
        with self._lock:
            self.segments_done += 1

    def on_budget(self, reason: Callable[[], str]) -> None:
        self._reason = reason

    def on_hold(self, segment: int | None, reason: str) -> None:
        # A paused job writes no page: without this its log would go silent for the whole pause.
        with self._lock:
            self.held = (self.clock(), reason)
            if self.started:
                self._maybe_say()

    def on_throttle(self, reason: str) -> None:
        # No lock: the budget calls this holding its own lock, and on_page (holding ours)
        # asks the budget for its reason; two plain assignments need none.
        self.throttle = reason
        if self.bar is not None:
            self.bar.set_postfix_str(reason[:60], refresh=False)

    def on_segment_failed(self, segment: int, error: str, attempts: int, final: bool) -> None:
        if self.bar is not None and final:
            with self._lock:
                self.bar.write(f"segment {segment} failed after {attempts} attempts: {safe_text(error, 1000)}")

    def on_run_done(self, result: "RunResult") -> None:
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
            elif self.started:
                self._maybe_say(force=True)


class EventLog(Subscriber):
    """Records every callback as a tuple (tests, and a debugging aid)."""

    def __init__(self):
        self.events: list[tuple] = []
        self._lock = threading.Lock()

    def _add(self, *event) -> None:
        with self._lock:
            self.events.append(event)

    def on_run_start(self, run: RunInfo) -> None: self._add("run_start", run.run)
    def on_segment_start(self, segment, resumed, reason) -> None: self._add("start", segment, resumed, reason)
    def on_page(self, segment, counts) -> None: self._add("page", segment, dict(counts))
    def on_segment_done(self, segment, counters) -> None: self._add("done", segment)
    def on_segment_failed(self, segment, error, attempts, final) -> None: self._add("failed", segment, error, attempts, final)
    def on_lease_lost(self, segment, reason) -> None: self._add("lease_lost", segment, reason)
    def on_throttle(self, reason) -> None: self._add("throttle", reason)
    def on_hold(self, segment, reason) -> None: self._add("hold", segment, reason)
    def on_takeover(self, segment, previous_owner) -> None: self._add("takeover", segment, previous_owner)
    def on_run_done(self, result) -> None: self._add("run_done", result.done)

    def kinds(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]
