"""Issue 26: the lean path and tracing. A tracer sees every request the shim sends for the app:
hooks on botocore's events (before-send, after-call, before-call, Sentry's request-created), and
tracers that wrap botocore's call path (X-Ray, OpenTelemetry, Datadog wrap
``BaseClient._make_api_call``), in the steady state and in a phase that writes both layouts."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from decimal import Decimal
from unittest import mock

import boto3
import botocore.client
import pytest

from reshard.shim.table import ShardedTable, app_dynamo
from tests.integration.test_interleavings_shim import create_table, ev, key
from tests.shim_helpers import ROOT, migration

EVENTS = ["before-send", "after-call", "before-call", "request-created"]


def _shim(server, m, phase):
    client = boto3.client("dynamodb", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x")
    data, control = app_dynamo(None, None, None, None, client, None)
    t = ShardedTable(m, data, control_table=None, control_dynamo=control)
    t._pin_phase(phase)
    return t, client


def _traffic(t) -> None:
    """One of each item call (lean-path ones and botocore-path ones)."""
    t.put_item(Item=ev(1, n=1))
    t.get_item(Key=key(1))
    t.get_item(Key=key(1), ConsistentRead=True)
    t.update_item(Key=key(1), UpdateExpression="SET n = :n", ExpressionAttributeValues={":n": Decimal(2)},
                  ReturnValues="ALL_NEW")
    t.batch_get_item(Keys=[key(1)])
    t.query(Key={"sensor_id": "s-1"})
    t.scan()
    t.delete_item(Key=key(1))


@pytest.mark.parametrize("phase", [None, "dual_write"])
@pytest.mark.parametrize("event", EVENTS)
def test_event_hooks_see_every_app_request(dynalite_server, dynalite, unique_name, event, phase):
    """A handler the app registered on its client's events runs once per request the shim sends:
    before-send and after-call because the lean path emits them, the others because a handler on
    an event it skips sends the call through botocore. (Before: request-created -- Sentry's -- was
    skipped by the lean path's gets and puts.)"""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t, client = _shim(dynalite_server, m, phase)
    seen = []
    client.meta.events.register(f"{event}.dynamodb", lambda event_name, **_: seen.append(event_name))
    try:
        before = sum(t.dynamo.stats.calls.values())
        _traffic(t)
        sent = sum(t.dynamo.stats.calls.values()) - before
        assert sent >= 10 and len(seen) == sent, (len(seen), dict(t.dynamo.stats.calls))
    finally:
        t.close()


@pytest.mark.parametrize("phase", [None, "dual_write"])
def test_a_tracer_wrapping_botocore_sees_every_app_request(dynalite_server, dynalite, unique_name, phase):
    """X-Ray, OpenTelemetry and Datadog wrap ``BaseClient._make_api_call`` (no event): while one
    does, the app's requests go through it (before: the lean path's gets/puts/queries bypassed it)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    t, client = _shim(dynalite_server, m, phase)
    real = botocore.client.BaseClient._make_api_call
    spans = []

    @functools.wraps(real)  # as a tracer's wrapper: botocore's name and module, its own code
    def traced(self, operation_name, api_params):
        spans.append(operation_name)
        return real(self, operation_name, api_params)
    try:
        with mock.patch.object(botocore.client.BaseClient, "_make_api_call", traced):
            before = sum(t.dynamo.stats.calls.values())
            _traffic(t)
            sent = sum(t.dynamo.stats.calls.values()) - before
        assert sent >= 10 and len(spans) == sent, (spans, dict(t.dynamo.stats.calls))
        # Unpatched, the lean path serves them again (the decision follows the patch).
        spans.clear()
        t.get_item(Key=key(1))
        assert spans == [] and t.dynamo._lean.handles("get_item", {})
    finally:
        t.close()


def test_xray_records_a_subsegment_per_request(dynalite_server, dynalite, unique_name):
    """The real X-Ray SDK (its patch is global and cannot be undone: in a process of its own)."""
    pytest.importorskip("aws_xray_sdk")
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from aws_xray_sdk.core import xray_recorder, patch
        from aws_xray_sdk.core.models.segment import Segment
        xray_recorder.configure(sampling=False, context_missing="IGNORE_ERROR")
        patch(["botocore"])
        import boto3
        from tests.shim_helpers import migration
        from reshard.shim.table import ShardedTable
        m = migration("sensor", table={m.table!r})
        client = boto3.client("dynamodb", endpoint_url={dynalite_server.endpoint!r}, region_name="us-east-1",
                              aws_access_key_id="x", aws_secret_access_key="x")
        from reshard.shim.table import app_dynamo
        data, control = app_dynamo(None, None, None, None, client, None)
        t = ShardedTable(m, data, control_table=None, control_dynamo=control)
        t._pin_phase("dual_write")
        seg = xray_recorder.begin_segment("app")
        t.put_item(Item={{"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:01:00Z"}})
        t.get_item(Key={{"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:01:00Z"}})
        subs = [s.aws["operation"] for s in seg.subsegments]
        print(subs, sum(t.dynamo.stats.calls.values()))
        assert len(subs) == sum(t.dynamo.stats.calls.values()) >= 3, subs
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
