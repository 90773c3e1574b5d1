"""Every metric reshard exports, named once (pure: no I/O).

Two families, one table each, and docs/metrics.md shows both (a test checks they agree):

* :data:`JOB_METRICS`: a data job (backfill, verify, cleanup) on ``--metrics-port`` as
  Prometheus text (names carry their unit, counters end in ``_total``: Backfila's style) and
  with ``--metrics emf`` as CloudWatch embedded-metric-format lines (CamelCase names beside
  DynamoDB's own ``ConsumedWriteCapacityUnits`` & co.; dimensions ``Migration`` and ``Job``,
  plus ``Reason`` on the throttle lines: every distinct dimension value is a CloudWatch metric
  of its own, so they stay few). Labels on Prometheus: ``migration``, ``job`` (and ``reason``).
* :data:`SHIM_METRICS`: the application shim's, through the OpenTelemetry metrics API
  (:mod:`reshard.shim.metrics`; a no-op unless the application installs an SDK).
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER, GAUGE, HISTOGRAM, OBSERVABLE_GAUGE = "counter", "gauge", "histogram", "observable gauge"


@dataclass(frozen=True)
class JobMetric:
    """One job metric: its Prometheus name, kind, unit, what it means, and its EMF name and unit.

    ``source``: the key of the job's state it is read from (:class:`reshard.jobs.metrics.JobMetrics`).
    ``emf_unit``: a CloudWatch unit (``Count``, ``Seconds``, ``Count/Second``, ``None``).
    """

    name: str
    kind: str
    unit: str
    help: str
    emf: str
    emf_unit: str
    source: str
    labels: tuple[str, ...] = ()


#: The labels every job metric carries (Prometheus) / its dimensions (EMF: Migration, Job).
JOB_LABELS = ("migration", "job")

JOB_METRICS: tuple[JobMetric, ...] = (
    JobMetric("reshard_job_items_scanned_total", COUNTER, "items",
              "Items the job's scan read (its progress unit; verify: items checked)",
              "ItemsScanned", "Count", "scanned"),
    JobMetric("reshard_job_items_copied_total", COUNTER, "items",
              "Items the backfill copied to the new layout", "ItemsCopied", "Count", "copied"),
    JobMetric("reshard_job_items_fenced_total", COUNTER, "items",
              "Copies refused by the version fence (a newer write was already there and stays)",
              "ItemsFenced", "Count", "fenced"),
    JobMetric("reshard_job_items_unmappable_total", COUNTER, "items",
              "Items the layouts cannot map (left in place, listed by `reshard status`)",
              "ItemsUnmappable", "Count", "unmappable"),
    JobMetric("reshard_job_consumed_write_capacity_units_total", COUNTER, "WCU",
              "Write capacity units the job consumed (DynamoDB's ConsumedCapacity)",
              "ConsumedWriteCapacityUnits", "Count", "consumed_wcu"),
    JobMetric("reshard_job_consumed_read_capacity_units_total", COUNTER, "RCU",
              "Read capacity units the job consumed (DynamoDB's ConsumedCapacity)",
              "ConsumedReadCapacityUnits", "Count", "consumed_rcu"),
    JobMetric("reshard_job_write_capacity_budget_units_per_second", GAUGE, "WCU/s",
              "The run's write budget (--max-wcu or `reshard throttle`), all processes together; absent without one",
              "WriteCapacityBudget", "Count/Second", "max_wcu"),
    JobMetric("reshard_job_read_capacity_budget_units_per_second", GAUGE, "RCU/s",
              "The run's read budget (--max-rcu or `reshard throttle`); absent without one",
              "ReadCapacityBudget", "Count/Second", "max_rcu"),
    JobMetric("reshard_job_write_capacity_share_units_per_second", GAUGE, "WCU/s",
              "This command's share of the run's write budget (its processes together)",
              "WriteCapacityShare", "Count/Second", "share_wcu"),
    JobMetric("reshard_job_read_capacity_share_units_per_second", GAUGE, "RCU/s",
              "This command's share of the run's read budget", "ReadCapacityShare", "Count/Second", "share_rcu"),
    JobMetric("reshard_job_throttles_total", COUNTER, "answers",
              "Throttled DynamoDB answers, by reason (ThrottlingReasons, else the error code; UnprocessedItems)",
              "Throttles", "Count", "throttles", ("reason",)),
    JobMetric("reshard_job_budget_wait_seconds_total", COUNTER, "seconds",
              "Time requests waited for the budget (summed over threads): the job is budget-bound while it grows",
              "BudgetWaitSeconds", "Seconds", "budget_wait_seconds"),
    JobMetric("reshard_job_lease_takeovers_total", COUNTER, "leases",
              "Segment leases this command took over from an owner that never released them",
              "LeaseTakeovers", "Count", "takeovers"),
    JobMetric("reshard_job_leases_lost_total", COUNTER, "leases",
              "Segment leases this command lost to another worker (its lease had expired)",
              "LeasesLost", "Count", "leases_lost"),
    JobMetric("reshard_job_pages_redone_total", COUNTER, "pages",
              "Pages done again: one per takeover and per failed page attempt",
              "PagesRedone", "Count", "pages_redone"),
    JobMetric("reshard_job_pages_total", COUNTER, "pages", "Pages this command completed", "Pages", "Count",
              "pages"),
    JobMetric("reshard_job_segments_done", GAUGE, "segments", "Segments this command completed (of the run: reshard_job_segments)",
              "SegmentsDone", "Count", "segments_done"),
    JobMetric("reshard_job_segments", GAUGE, "segments", "Segments of the run", "Segments", "Count", "segments"),
    JobMetric("reshard_job_progress_ratio", GAUGE, "ratio",
              "Items done / the item total (an estimate: DescribeTable's ItemCount or a counted total)",
              "ProgressRatio", "None", "progress_ratio"),
    JobMetric("reshard_job_items_per_second", GAUGE, "items/s", "Items per second since this command started",
              "ItemsPerSecond", "Count/Second", "rate"),
    JobMetric("reshard_job_eta_seconds", GAUGE, "seconds",
              "Estimated seconds left at the current rate; absent while unknown", "EtaSeconds", "Seconds", "eta"),
    JobMetric("reshard_job_paused", GAUGE, "boolean",
              "1 while the run is paused (`reshard pause`), else 0", "Paused", "None", "paused"),
    JobMetric("reshard_job_phase", GAUGE, "ordinal",
              "The migration's phase as the job last read it (0 planned .. 6 complete, -1 aborted); "
              "Prometheus also labels it phase=\"...\"",
              "Phase", "None", "phase_ordinal", ("phase",)),
    JobMetric("reshard_job_processes", GAUGE, "processes",
              "Processes of this command that report (--processes)", "Processes", "Count", "processes"),
)

#: Job metrics by Prometheus name.
JOB_METRIC_NAMES = {m.name: m for m in JOB_METRICS}

#: EMF namespace (CloudWatch) of the job metrics.
EMF_NAMESPACE = "reshard"
#: EMF dimensions of every line (and ``Reason`` on the throttle lines).
EMF_DIMENSIONS = ("Migration", "Job")


@dataclass(frozen=True)
class ShimMetric:
    """One OpenTelemetry instrument of the shim: name, instrument kind, UCUM unit, attributes."""

    name: str
    kind: str
    unit: str
    help: str
    attributes: tuple[str, ...]


SHIM_METRICS: tuple[ShimMetric, ...] = (
    ShimMetric("reshard.shim.request.duration", HISTOGRAM, "s",
               "Latency of each shim request (the whole logical request: every physical call, a switch's hold)",
               ("reshard.migration", "reshard.phase", "reshard.operation")),
    ShimMetric("reshard.shim.switch.held", COUNTER, "{request}",
               "Requests held while the fleet switched authority (backfill <-> cutover), and how they ended",
               ("reshard.migration", "reshard.outcome")),
    ShimMetric("reshard.shim.switch.hold.duration", HISTOGRAM, "s",
               "How long each held request was held by the switch", ("reshard.migration", "reshard.outcome")),
    ShimMetric("reshard.shim.mirror.failures", COUNTER, "{write}",
               "Mirror writes that failed after the authoritative write landed (re-run verify before the next "
               "transition)", ("reshard.migration", "reshard.phase")),
    ShimMetric("reshard.shim.refresh.failures", COUNTER, "{refresh}",
               "Phase refreshes (control-table reads + heartbeat) that failed", ("reshard.migration",)),
    ShimMetric("reshard.shim.refresh.age", OBSERVABLE_GAUGE, "s",
               "Seconds since this instance's last successful refresh (ShimUnavailable past its liveness window)",
               ("reshard.migration", "reshard.instance")),
    ShimMetric("reshard.shim.unavailable", COUNTER, "{request}",
               "Requests refused with ShimUnavailable (or SwitchInProgress): nothing was sent",
               ("reshard.migration", "reshard.error")),
)

SHIM_METRIC_NAMES = {m.name: m for m in SHIM_METRICS}
