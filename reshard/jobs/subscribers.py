"""Progress subscribers for the segment engine: the interface, a tqdm bar, and an event log.

The engine never touches a UI (s3transfer-style); the command picks a subscriber.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # annotations only: the engine imports this module
    from reshard.control.records import RunInfo
    from reshard.jobs.engine import RunResult


class Subscriber:
    """Progress callbacks (s3transfer-style). Override what you need; called from worker threads."""

    def on_run_start(self, run: "RunInfo") -> None: ...
    def on_segment_start(self, segment: int, resumed: bool, reason: str) -> None: ...
    def on_page(self, segment: int, counts: dict) -> None: ...
    def on_segment_done(self, segment: int, counters: dict) -> None: ...
    def on_segment_failed(self, segment: int, error: str, attempts: int, final: bool) -> None: ...
    def on_lease_lost(self, segment: int, reason: str) -> None: ...
    def on_throttle(self, reason: str) -> None: ...
    def on_run_done(self, result: "RunResult") -> None: ...


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
                self.bar.write(f"segment {segment} failed after {attempts} attempts: {error}")

    def on_run_done(self, result: RunResult) -> None:
        if self.bar is not None:
            self.bar.close()


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
    def on_run_done(self, result) -> None: self._add("run_done", result.done)

    def kinds(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]
