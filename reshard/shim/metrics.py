"""The shim's metrics, through the OpenTelemetry metrics API.

``opentelemetry-api`` alone records nothing: its instruments are proxies that do nothing
until the application installs an SDK (``opentelemetry.metrics.set_meter_provider``), before
or after it imports reshard. So an application without an SDK pays, per request, two clock
reads and a call into a no-op proxy (benchmarks/shim.py states the cost with and without).

The instruments (names, units, attributes: :data:`reshard.core.metrics.SHIM_METRICS`,
docs/metrics.md) are recorded from a few points only:

* :func:`request_done`: every public method of ``ShardedTable`` (its ``client_errors`` wrapper)
  -- latency per phase and operation, and ``ShimUnavailable`` raised;
* :func:`held`: ``PhaseCache.begin`` after a request was held by a switch (and how it ended);
* :func:`mirror_failed`: ``ShardedTable._mirror`` when a mirror write failed;
* :func:`refresh_failed`, :func:`watch` / :func:`forget`: ``PhaseCache``'s refresh, and the
  age of its last success (an observable gauge read at each collection).
"""

from __future__ import annotations

import weakref

from importlib import metadata

from opentelemetry import metrics as otel

from reshard.core.metrics import SHIM_METRIC_NAMES


def _version() -> str:
    try:
        return metadata.version("reshard")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0"


_meter = otel.get_meter("reshard.shim", _version())


def _instrument(name: str):
    spec = SHIM_METRIC_NAMES[name]
    make = {"histogram": _meter.create_histogram, "counter": _meter.create_counter}[spec.kind]
    return make(name, unit=spec.unit, description=spec.help)


_duration = _instrument("reshard.shim.request.duration")
_held = _instrument("reshard.shim.switch.held")
_hold_duration = _instrument("reshard.shim.switch.hold.duration")
_mirror_failures = _instrument("reshard.shim.mirror.failures")
_refresh_failures = _instrument("reshard.shim.refresh.failures")
_unavailable = _instrument("reshard.shim.unavailable")

#: Attribute dicts by value, built once: a request records with a dict it did not build.
_attrs: dict[tuple, dict] = {}


def _a(*pairs) -> dict:
    found = _attrs.get(pairs)
    if found is None:
        found = _attrs[pairs] = dict(zip(pairs[::2], pairs[1::2]))
    return found


def request_done(migration_id: str, phase: str, operation: str, seconds: float) -> None:
    """One logical request of the application finished (or raised) after ``seconds``."""
    _duration.record(seconds, _a("reshard.migration", migration_id, "reshard.phase", phase,
                                 "reshard.operation", operation))


def unavailable(migration_id: str, error_code: str) -> None:
    """A request refused with ``ShimUnavailable`` (``ReshardShimUnavailable``) or
    ``SwitchInProgress`` (``ReshardSwitchInProgress``): nothing was sent."""
    _unavailable.add(1, _a("reshard.migration", migration_id, "reshard.error", error_code))


def held(migration_id: str, seconds: float, outcome: str) -> None:
    """A request held by a switch for ``seconds``; ``outcome``: ``switched`` (it went on under
    the new phase) or ``timed_out`` (SwitchInProgress, not sent)."""
    attrs = _a("reshard.migration", migration_id, "reshard.outcome", outcome)
    _held.add(1, attrs)
    _hold_duration.record(seconds, attrs)


def mirror_failed(migration_id: str, phase: str) -> None:
    _mirror_failures.add(1, _a("reshard.migration", migration_id, "reshard.phase", phase))


def refresh_failed(migration_id: str) -> None:
    _refresh_failures.add(1, _a("reshard.migration", migration_id))


# -- the age of each live instance's last successful refresh (read at collection time)
_caches: "weakref.WeakSet" = weakref.WeakSet()


def watch(cache) -> None:
    """Report ``cache.refresh_age()`` until :func:`forget` (or until it is garbage)."""
    _caches.add(cache)


def forget(cache) -> None:
    _caches.discard(cache)


def _ages(options):
    for cache in list(_caches):
        yield otel.Observation(cache.refresh_age(), _a("reshard.migration", cache.migration.id,
                                                       "reshard.instance", cache.instance_id))


_meter.create_observable_gauge("reshard.shim.refresh.age", callbacks=[_ages],
                               unit=SHIM_METRIC_NAMES["reshard.shim.refresh.age"].unit,
                               description=SHIM_METRIC_NAMES["reshard.shim.refresh.age"].help)
