"""Shared fixtures: moto (in-process) and dynalite (a real server process).

Layers, by folder and marker:
  tests/unit         pure domain, no AWS              (-m unit)
  tests/functional   moto's mock_aws, in-process      (-m functional)
  tests/integration  dynalite on 127.0.0.1            (-m integration)
  tests/reliability  chaos, faults, races, bad input  (-m reliability)
  tests/aws          the real-AWS acceptance check    (-m aws; skipped without RESHARD_AWS_TEST_REGION)
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import pytest

from reshard.aws.local import DynaliteServer, dynalite_available
from reshard.aws.moto_speedups import install as install_moto_speedups

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: The caller's own AWS settings, kept before they are replaced below, for tests/aws alone: the
#: real-AWS acceptance check, which runs only when RESHARD_AWS_TEST_REGION is set.
AWS_VARS = ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION",
            "AWS_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
CALLER_AWS_ENV = {k: os.environ[k] for k in AWS_VARS if k in os.environ}
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# Never let a test reach a real AWS account by accident.
for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
    os.environ.pop(var, None)
os.environ["AWS_ACCESS_KEY_ID"] = "testing"
os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
# verify's records (reshard.jobs.records) of runs a test leaves unfinished: not in ~/.cache.
os.environ.setdefault("RESHARD_VERIFY_DIR", tempfile.mkdtemp(prefix="reshard-verify-tests-"))
# The data jobs' --processes defaults to the cores; a spawned process costs ~1 s of imports, so
# the tests run jobs in-process unless they ask for processes (tests/integration/test_processes.py).
os.environ["RESHARD_PROCESSES"] = "1"
# dynalite and moto accept requests signed at any date: `reshard start` would refuse them
# (docs/late-writes.md). Every test (and every subprocess) runs in "server deadline off" mode;
# the tests of the server-enforced horizon run through the fidelity proxy and unset this.
os.environ["RESHARD_NO_SERVER_DEADLINE"] = "1"

# moto's per-request costs that grow with the table (Query and Scan sort every item) and its
# serializer, cut for every test of the session alike (same answers; reshard/aws/moto_speedups.py).
# strict: a moto whose code is not the code they were checked against stops the suite here.
install_moto_speedups(strict=os.environ.get("RESHARD_MOTO_SPEEDUPS") != "0")


#: Tests of ~30 s and more: started first, so the parallel workers do not end on one of them
#: while the others are idle (the whole suite must stay near 5 minutes).
SLOW_FIRST = ("tests/reliability/", "tests/integration/test_backfill_dynalite.py::test_sigkill",
              "tests/functional/test_demo.py", "tests/integration/test_lifecycle.py",
              "tests/integration/test_key_shapes_lifecycle.py", "tests/integration/test_runbooks.py",
              "tests/integration/test_live_control.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = pathlib.Path(str(item.fspath)).relative_to(ROOT).parts
        if len(parts) > 1 and parts[1] in ("unit", "functional", "integration", "reliability", "aws"):
            item.add_marker(getattr(pytest.mark, parts[1]))
    items.sort(key=lambda item: not item.nodeid.startswith(SLOW_FIRST))  # stable: the rest keep their order


@pytest.fixture
def moto_dynamo():
    """A reshard Dynamo client inside moto's mock_aws (fresh state per test)."""
    from moto import mock_aws

    from reshard.aws.dynamo import Dynamo, RetryPolicy

    with mock_aws():
        # Bounded timeouts (one attempt <= 5 s): the jobs' time fence subtracts them from a lease.
        yield Dynamo(region="us-east-1", retry=RetryPolicy(max_attempts=3, base_seconds=0.001),
                     connect_timeout=1, read_timeout=4)


@pytest.fixture(scope="session")
def dynalite_server(tmp_path_factory):
    """One dynalite process for the session (tests use unique table names)."""
    if not dynalite_available():
        pytest.fail("dynalite is not installed: run `npm ci` in the repository root "
                    "(the README's test command does)")
    server = DynaliteServer(tmp_path_factory.mktemp("dynalite"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def dynalite(dynalite_server):
    """A reshard Dynamo client on the shared dynalite server."""
    from reshard.aws.dynamo import Dynamo, RetryPolicy

    return Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1",
                  retry=RetryPolicy(max_attempts=5, base_seconds=0.01), connect_timeout=1, read_timeout=4)


@pytest.fixture
def unique_name(request):
    """A table-name-safe unique name for this test."""
    import uuid
    return f"t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:6]}"
