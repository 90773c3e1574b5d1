"""``--metrics-port P`` and ``--metrics emf`` of the data jobs (backfill, verify, cleanup).

The options only record their values (in the click context, like the global options); the
job's subscribers are built by :func:`job_metrics`, which
:func:`reshard.cli.options.job_progress` calls, and the exporters stop when the command ends
(the EMF writer's last line then carries the final counters).
"""

from __future__ import annotations

from typing import Any, Callable

import click

from reshard import errors

_KEYS = ("metrics_port", "metrics", "metrics_interval", "metrics_addr")


def _keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        ctx.meta[f"reshard.{param.name}"] = value
    return value


def metrics_options(f: Callable) -> Callable:
    """The metrics options of a data job's command (docs/metrics.md lists what they export)."""
    options = [
        click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, expose_value=False,
                     callback=_keep, envvar="RESHARD_METRICS_PORT", show_envvar=True, metavar="PORT",
                     help="Serve the job's metrics as Prometheus text on http://ADDR:PORT/metrics while it runs "
                          "(0: any free port; the first line says which). Names: docs/metrics.md."),
        click.option("--metrics-addr", default=None, expose_value=False, callback=_keep, metavar="ADDR",
                     help="The address --metrics-port listens on (default 0.0.0.0)."),
        click.option("--metrics", type=click.Choice(["emf"]), default=None, expose_value=False, callback=_keep,
                     envvar="RESHARD_METRICS", show_envvar=True,
                     help="emf: write CloudWatch embedded-metric-format JSON lines to stdout (a log driver or the "
                          "CloudWatch agent turns them into metrics; dimensions Migration and Job)."),
        click.option("--metrics-interval", type=click.FloatRange(min=0.05), default=None, expose_value=False,
                     callback=_keep, metavar="SECONDS",
                     help="Seconds between two EMF lines (default 60, CloudWatch's standard resolution); a last "
                          "line is written when the job ends."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def job_metrics(env, job: str, mid: str, options, total: Callable, done_before: Callable) -> list:
    """The job's metrics subscriber, with the exporters the options asked for (none: [])."""
    ctx = click.get_current_context(silent=True)
    meta: dict = {}
    while ctx is not None:
        meta = {**{k: v for k, v in ctx.meta.items() if k.startswith("reshard.metrics")}, **meta}
        ctx = ctx.parent
    values = {k: meta.get(f"reshard.{k}") for k in _KEYS}
    if values["metrics_port"] is None and values["metrics"] is None:
        return []
    from reshard.jobs.metrics import EmfWriter, JobMetrics, PrometheusExporter
    metrics = JobMetrics(job, mid, options.segments + (job == "verify"), total=total, done_before=done_before)
    root = click.get_current_context()
    if values["metrics_port"] is not None:
        try:
            exporter = PrometheusExporter(metrics, values["metrics_port"], values["metrics_addr"] or "0.0.0.0")
        except OSError as e:
            raise errors.BadInput(f"--metrics-port {values['metrics_port']}: cannot listen there ({e.strerror or e}); "
                                  "pick another port (0: any free one)") from None
        root.call_on_close(exporter.close)
        env.info(f"metrics: Prometheus text on http://{exporter.addr}:{exporter.port}/metrics "
                 f"({job} of {mid}; names in docs/metrics.md)")
    if values["metrics"] == "emf":
        writer = EmfWriter(metrics, values["metrics_interval"] or 60.0).start()
        root.call_on_close(writer.close)
    return [metrics]
