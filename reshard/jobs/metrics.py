"""A data job's metrics: one subscriber that keeps them, two ways out.

:class:`JobMetrics` is a :class:`~reshard.jobs.subscribers.Subscriber`: it counts pages,
items, takeovers and lost leases from the engine's events, and keeps each process's last
budget beat (:func:`reshard.jobs.runner.budget_state`: capacity consumed, budget and share,
throttles by reason, the run's pause, the phase). A ``--processes`` parent gets the same
events from every child, so one endpoint serves the whole command. The names, units and
meanings are :data:`reshard.core.metrics.JOB_METRICS` (docs/metrics.md).

* :class:`PrometheusExporter` (``--metrics-port``): prometheus_client's HTTP server over a
  registry of its own, whose one collector reads :meth:`JobMetrics.snapshot` at each scrape.
* :class:`EmfWriter` (``--metrics emf``): every ``interval`` seconds, and once at the end, one
  CloudWatch embedded-metric-format JSON line (counters as the increase since the last line,
  gauges as they are), plus one line per throttle reason that grew. Written here rather than
  with ``aws-embedded-metrics``: that library flushes through asyncio and picks its sink by
  probing the environment (the CloudWatch agent's socket on EC2); a job needs one synchronous
  line on stdout, which a log driver or agent ships, and the format is a small JSON document.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Callable

from reshard.core.metrics import EMF_DIMENSIONS, EMF_NAMESPACE, JOB_METRICS, COUNTER
from reshard.core.phases import ORDER, Phase
from reshard.core.progress import Progress, progress_counter
from reshard.jobs.subscribers import Subscriber

#: Page counters that feed a job metric directly (the progress counter feeds ``scanned``).
_PAGE_COUNTERS = ("copied", "fenced", "unmappable")
#: Budget-beat fields summed over processes (the rest: the same run-wide value, or any).
_SUMMED = ("consumed_wcu", "consumed_rcu", "share_wcu", "share_rcu", "budget_wait_seconds")


def phase_ordinal(phase: str | None) -> int | None:
    """0 planned .. 6 complete, -1 aborted (an alarm on "the phase changed" compares numbers)."""
    if phase is None:
        return None
    if phase == Phase.ABORTED.value:
        return -1
    names = [p.value for p in ORDER]
    return names.index(phase) if phase in names else None


class JobMetrics(Subscriber):
    """Every job metric of one command, fed by the engine's events and the budget's beats."""

    def __init__(self, job: str, migration_id: str, segments: int, *,
                 total: Callable[[], tuple[int | None, str]] = lambda: (None, ""),
                 done_before: Callable[[int], int] = lambda run: 0, clock: Callable[[], float] = time.monotonic):
        self.job, self.migration_id, self.segments = job, migration_id, segments
        self.counter = progress_counter(job)
        self._total, self._done_before, self.clock = total, done_before, clock
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(("scanned", *_PAGE_COUNTERS, "pages", "takeovers", "leases_lost",
                                     "pages_redone", "segments_done"), 0)
        self.states: dict = {}  # process -> its last budget beat
        self.total: int | None = None
        self.before = 0
        self.started: float | None = None

    # -- the engine's events
    def on_run_start(self, run) -> None:
        total, _ = self._total()
        before = int(self._done_before(run.run))
        with self._lock:
            self.total, self.before, self.started = total, before, self.clock()

    def on_page(self, segment: int, counts: dict) -> None:
        with self._lock:
            self.counts["scanned"] += int(counts.get(self.counter, 0))
            for k in _PAGE_COUNTERS:
                self.counts[k] += int(counts.get(k, 0))
            self.counts["pages"] += 1

    def on_segment_done(self, segment: int, counters: dict) -> None:
        with self._lock:
            self.counts["segments_done"] += 1

    def on_segment_failed(self, segment: int, error: str, attempts: int, final: bool) -> None:
        with self._lock:
            self.counts["pages_redone"] += 1  # the failed page is done again (here or elsewhere)

    def on_takeover(self, segment: int, previous_owner: str) -> None:
        with self._lock:
            self.counts["takeovers"] += 1
            self.counts["pages_redone"] += 1  # the page since the owner's checkpoint

    def on_lease_lost(self, segment: int, reason: str) -> None:
        with self._lock:
            self.counts["leases_lost"] += 1

    def on_budget_state(self, state: dict) -> None:
        with self._lock:
            self.states[state.get("process") or state.get("pid")] = dict(state)

    # -- what the exporters read
    def snapshot(self) -> dict:
        """source -> value (None: unknown now), as :data:`reshard.core.metrics.JOB_METRICS` names them."""
        with self._lock:
            out: dict = dict(self.counts)
            states = list(self.states.values())
            done = self.before + self.counts["scanned"]
            elapsed = self.clock() - self.started if self.started is not None else 0.0
            total, before = self.total, self.before
        for k in _SUMMED:
            values = [s[k] for s in states if s.get(k) is not None]
            out[k] = round(sum(values), 3) if values else None
        for k in ("max_wcu", "max_rcu"):
            values = [s[k] for s in states if s.get(k) is not None]
            out[k] = max(values) if values else None
        throttles: dict = {}
        for s in states:
            for reason, n in (s.get("throttles") or {}).items():
                throttles[reason] = throttles.get(reason, 0) + n
        out["throttles"] = throttles
        out["paused"] = int(any(s.get("paused") for s in states))
        phase = next((s.get("phase") for s in states if s.get("phase")), None)
        out["phase"], out["phase_ordinal"] = phase, phase_ordinal(phase)
        out["processes"] = max(1, len(states))
        out["segments"] = self.segments
        p = Progress(done, total, elapsed, before)
        out["progress_ratio"] = None if p.pct is None else round(p.pct / 100, 4)
        out["rate"] = round(p.rate, 2)
        out["eta"] = None if p.eta_seconds is None else round(p.eta_seconds, 1)
        out["hold_reason"] = next((s.get("hold_reason") for s in states if s.get("hold_reason")), None)
        return out


# --------------------------------------------------------------------------- Prometheus

class _Collector:
    """prometheus_client's custom-collector protocol: the families, read at each scrape."""

    def __init__(self, metrics: JobMetrics):
        self.metrics = metrics

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        snap = self.metrics.snapshot()
        base = [self.metrics.migration_id, self.metrics.job]
        for m in JOB_METRICS:
            labels = ["migration", "job", *m.labels]
            family = (CounterMetricFamily if m.kind == COUNTER else GaugeMetricFamily)(
                m.name, f"{m.help} ({m.unit})", labels=labels)
            value = snap.get(m.source)
            if m.source == "throttles":
                for reason, n in sorted(value.items()):
                    family.add_metric(base + [reason], n)
            elif m.source == "phase_ordinal":
                if value is not None:
                    family.add_metric(base + [snap["phase"]], value)
            elif value is not None:
                family.add_metric(base, value)
            yield family


class PrometheusExporter:
    """``--metrics-port``: Prometheus text on ``http://ADDR:PORT/metrics`` while the command runs
    (port 0: any free port, :attr:`port` says which)."""

    def __init__(self, metrics: JobMetrics, port: int, addr: str = "0.0.0.0"):
        from prometheus_client import CollectorRegistry, start_http_server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(metrics))
        self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        self.addr = addr
        self.port = self.server.server_port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


# --------------------------------------------------------------------------- CloudWatch EMF

def emf_lines(snap: dict, previous: dict | None, migration: str, job: str, timestamp_ms: int) -> list[dict]:
    """The EMF documents for one flush: counters as the increase since ``previous`` (None: since
    the start), gauges as they are; a gauge with no value is left out. Pure."""
    previous = previous or {}
    values: dict = {}
    units: dict = {}
    for m in JOB_METRICS:
        v = snap.get(m.source)
        if m.source == "throttles":
            v = sum(v.values()) - sum((previous.get("throttles") or {}).values())
        elif m.kind == COUNTER:
            v = None if v is None else round(v - (previous.get(m.source) or 0), 3)
        if v is None:
            continue
        values[m.emf], units[m.emf] = v, m.emf_unit
    dims = {"Migration": migration, "Job": job}
    main = {"_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": [{
        "Namespace": EMF_NAMESPACE, "Dimensions": [list(EMF_DIMENSIONS)],
        "Metrics": [{"Name": k, "Unit": units[k]} for k in values]}]},
        **dims, **values}
    if snap.get("phase"):
        main["PhaseName"] = snap["phase"]  # a property (searchable in Logs Insights), not a dimension
    out = [main]
    before = previous.get("throttles") or {}
    for reason, n in sorted((snap.get("throttles") or {}).items()):
        grew = n - before.get(reason, 0)
        if grew > 0:
            out.append({"_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": [{
                "Namespace": EMF_NAMESPACE, "Dimensions": [[*EMF_DIMENSIONS, "Reason"]],
                "Metrics": [{"Name": "Throttles", "Unit": "Count"}]}]},
                **dims, "Reason": reason, "Throttles": grew})
    return out


class EmfWriter:
    """``--metrics emf``: EMF JSON lines on stdout every ``interval`` seconds and once at the end."""

    def __init__(self, metrics: JobMetrics, interval: float = 60.0, *, write: Callable[[str], None] | None = None,
                 wall: Callable[[], float] = time.time):
        self.metrics, self.interval, self.wall = metrics, interval, wall
        self.write = write or _stdout
        self._previous: dict | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reshard-emf", daemon=True)

    def start(self) -> "EmfWriter":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            snap = self.metrics.snapshot()
            for doc in emf_lines(snap, self._previous, self.metrics.migration_id, self.metrics.job,
                                 int(self.wall() * 1000)):
                self.write(json.dumps(doc, separators=(",", ":"), sort_keys=True))
            self._previous = snap

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.flush()


def _stdout(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
