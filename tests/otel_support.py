"""The OpenTelemetry SDK for tests that record the shim's metrics: one in-memory reader per
test process (a global MeterProvider can be set only once; the shim's instruments are API
proxies that start recording into it from then on). Tests tell their points apart by the
``reshard.migration`` attribute (a unique migration id each)."""

from __future__ import annotations

from opentelemetry import metrics as otel
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

_READER: list[InMemoryMetricReader] = []


def reader() -> InMemoryMetricReader:
    if not _READER:
        _READER.append(InMemoryMetricReader())
        otel.set_meter_provider(MeterProvider(metric_readers=[_READER[0]]))
    return _READER[0]


def points(migration_id: str) -> dict[str, list]:
    """Every data point recorded for ``migration_id``: instrument name -> [(attributes, point)]."""
    out: dict[str, list] = {}
    data = reader().get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    attrs = dict(p.attributes or {})
                    if attrs.get("reshard.migration") == migration_id:
                        out.setdefault(metric.name, []).append((attrs, p))
    return out
