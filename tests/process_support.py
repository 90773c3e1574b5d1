"""What a spawned ``--processes`` child of a test imports: kept apart from the test modules, so
a child does not import pytest, the command line or the test helpers (about a second each under load)."""

from __future__ import annotations

import time

from reshard.aws.dynamo import Dynamo, RetryPolicy


def slow_client(endpoint: str, delay: float) -> Dynamo:
    """A client whose every request first sleeps ``delay`` seconds (a test catches its process mid-run)."""
    d = Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=5, base_seconds=0.01),
               connect_timeout=1, read_timeout=2)
    d.client.meta.events.register("before-send.dynamodb", lambda **kw: time.sleep(delay))
    return d
