"""Progress subscribers for the segment engine: the interface, a tqdm bar, and an event log.

The engine never touches a UI (s3transfer-style); the command picks a subscriber.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable

from reshard.core.decode import safe_text
from reshard.core.progress import Progress, progress_done

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
    def on_wait(self, segment: int | None, what: str) -> None:
        """A worker waits (a lease held elsewhere, the settle window, capacity): what for.
        Called often while it waits (at least every few seconds); a reporter rate-limits."""
    def on_stopping(self, message: str) -> None:
        """The run is stopping (Ctrl-C, SIGTERM): said once, at once."""
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

    ``counter`` is the job whose unit advances the bar (:func:`reshard.core.progress.progress_done`).
    Quiet (no bar at all) when ``enabled`` is false: not a TTY, or ``--output json``.
    """

    def __init__(self, total: int | None, *, initial: int = 0, enabled: bool = True, counter: str = "backfill",
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
                self.bar.update(progress_done(self.counter, counts))

    def on_throttle(self, reason: str) -> None:
        if self.bar is not None:
            with self._lock:
                self.bar.set_postfix_str(reason[:60], refresh=False)

    def on_wait(self, segment: int | None, what: str) -> None:
        self.on_throttle(what)

    def on_segment_failed(self, segment: int, error: str, attempts: int, final: bool) -> None:
        if self.bar is not None and final:
            with self._lock:
                self.bar.write(f"segment {segment} failed after {attempts} attempts: {safe_text(error, 1000)}")

    def on_run_done(self, result: RunResult) -> None:
        if self.bar is not None:
            if getattr(result, "done", False) and self.bar.total and self.bar.n < self.bar.total:
                self.bar.total = self.bar.n  # the total was an estimate: a finished run is 100 %
                self.bar.refresh()
            self.bar.close()


#: A wait not reported again for this long is over (each waiting worker reports every few seconds).
WAIT_STALE_SECONDS = 3.0
#: A wait is said when it begins, then at least this often, whatever the progress interval
#: (PRODUCT.md: every 10 s).
WAIT_SAY_SECONDS = 8.0


class ProgressReporter(Subscriber):
    """What an operator sees while a data job runs, gh-ost style.

    Nothing before the run starts (:func:`reshard.jobs.runner.run_job` calls
    ``on_run_start`` only once every precondition passed, so a refused job prints no
    header). Then one header line, and either a tqdm bar with a total (``tty``) or, every
    ``interval`` seconds, one log line: items done / total, %, rate, ETA, segments done and
    why the budget throttles. Done and total count one unit, the old layout's items
    (:func:`reshard.core.progress.progress_done`); a finished run ends at 100 %.

    While a worker waits (a lease held elsewhere, verify's settle window, capacity), the
    line says what for, and a line is said at least every :data:`WAIT_SAY_SECONDS` even
    when no page finishes. A stop (Ctrl-C) is said at once.

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
        self._total, self._done_before = total, done_before
        self.say, self.tty, self.interval, self.clock, self.wall = say, tty, interval, clock, wall
        self._lock = threading.Lock()
        self.bar = None
        self.total: int | None = None
        self.source = ""
        self.done = self.before = 0
        self.done_segments: set[int] = set()
        self.started = self.last_line = 0.0
        self.throttle = ""
        self._reason: Callable[[], str] | None = None
        self.held: tuple[float, str] | None = None  # (when, why) a worker last said it waits for `resume`
        self._waits: dict = {}  # key -> (what, when reported)
        self.lines: list[str] = []  # every log line said (tests and the final summary read them)

    @property
    def segments_done(self) -> int:
        return len(self.done_segments)

    def on_run_start(self, run: "RunInfo") -> None:
        # Per run: a cleanup that retires an aborted migration sweeps twice with these subscribers.
        self.total, self.source = self._total()
        self.done = self.before = int(self._done_before(run.run))
        self.done_segments = set()
        self._waits = {}
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

    def waits(self) -> list[str]:
        """What workers wait for now (reported within the last few seconds)."""
        now = self.clock()
        self._waits = {k: v for k, v in self._waits.items() if now - v[1] <= WAIT_STALE_SECONDS}
        return [what if key is None else f"segment {key}: {what}" for key, (what, _) in
                sorted(self._waits.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))]

    def line(self) -> str:
        """One log record: UTC time, job, progress, segments, throttling, what it waits for."""
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall()))
        out = (f"{at} {self.job} {self.migration_id}: {self.progress().text()}; "
               f"{self.segments_done}/{self.segments} segments done here")
        held = self.held
        if held is not None and self.clock() - held[0] <= 3.0:
            return out + f"; HELD: {held[1]}"  # paused: the line says what the job waits for
        why = self._reason() if self._reason else self.throttle
        waits = self.waits()
        said = why and any(why in w for w in waits)  # the budget's own wait says it already
        return out + (f"; throttling: {why}" if why and not said else "") + (
            f"; waiting: {' | '.join(waits[:4])}" if waits else "")

    def _maybe_say(self, force: bool = False) -> None:
        now = self.clock()
        every = min(self.interval, WAIT_SAY_SECONDS) if self._waits else self.interval
        if self.bar is None and (force or now - self.last_line >= every):
            self.last_line = now
            text = self.line()
            self.lines.append(text)
            self.say(text)

    def on_page(self, segment: int, counts: dict) -> None:
        with self._lock:
            n = progress_done(self.job, counts)
            self.done += n
            if self.bar is not None:
                self.bar.update(n)
            self._maybe_say()

    def on_segment_done(self, segment: int, counters: dict) -> None:
        with self._lock:
            self.done_segments.add(segment)
            self._waits.pop(segment, None)

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

    def on_wait(self, segment: int | None, what: str) -> None:
        with self._lock:
            now = self.clock()
            if not self.started:
                # Before the run starts (the job waits for the fleet to acknowledge its phase):
                # no progress yet, only what it waits for, when it begins and every few seconds.
                if now - self.last_line >= WAIT_SAY_SECONDS or not self.lines:
                    self.last_line = now
                    text = f"{self.job} of {self.migration_id}: waiting: {what}"
                    self.lines.append(text)
                    self.say(text)
                return
            began = segment not in self._waits or now - self._waits[segment][1] > WAIT_STALE_SECONDS
            self._waits[segment] = (what, now)
            if self.bar is not None:
                self.bar.set_postfix_str(f"waiting: {what}"[:80], refresh=True)
            # A wait that begins is said at once (then every WAIT_SAY_SECONDS at least).
            self._maybe_say(force=began)

    def on_stopping(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message)
        else:
            self.say(message)

    def on_segment_failed(self, segment: int, error: str, attempts: int, final: bool) -> None:
        if self.bar is not None and final:
            with self._lock:
                self.bar.write(f"segment {segment} failed after {attempts} attempts: {safe_text(error, 1000)}")

    def on_run_done(self, result: "RunResult") -> None:
        with self._lock:
            self._waits = {}
            finished = bool(getattr(result, "done", False))
            if finished and self.total and self.done < self.total:
                # The total was an estimate (a count taken earlier, or DescribeTable's): every
                # segment is done, so this is all there was. The last line says 100 %.
                self.total = self.done
            if self.bar is not None:
                if finished:
                    self.bar.total = self.bar.n
                    self.bar.refresh()
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
    def on_wait(self, segment, what) -> None: self._add("wait", segment, what)
    def on_stopping(self, message) -> None: self._add("stopping", message)
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
