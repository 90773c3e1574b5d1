"""The policy tables cover the code (issue 30, case 5): a shim method or a data job added later
cannot be left out of the policies they are made from. What each one actually sends is
recorded and judged in tests/integration/test_iam_requests.py."""

from __future__ import annotations

import inspect

import pytest

from reshard.core import iam
from reshard.core.phases import JOB_RULES
from reshard.shim.table import LOADS, BatchWriter, ShardedTable

pytestmark = pytest.mark.unit

#: Public members of the shim that send no data-table request of their own.
NO_REQUEST = {"from_file", "from_migration_id", "close", "refresh", "phase", "refresh_seconds", "liveness_seconds",
              "meta", "name", "table_name", "key_schema"}


def test_every_public_method_of_the_shim_has_a_row_the_app_policy_is_made_from():
    public = {n for n, _ in inspect.getmembers(ShardedTable) if not n.startswith("_")}
    # load()'s row stands for reload() and the description attributes, which call it.
    assert public - NO_REQUEST - LOADS == set(iam.SHIM_METHODS)
    # The batch writer's methods are the ``batch_writer`` row.
    assert {n for n, _ in inspect.getmembers(BatchWriter) if not n.startswith("_")} == {"put_item", "delete_item",
                                                                                         "flush"}
    app = {a for st in iam.policy("app", "T", "ctl", migration_id="m")["Statement"] if st["Resource"] == [
        iam.table_arn("T")] for a in st["Action"]}
    assert app == {f"dynamodb:{a}" for actions in (*iam.SHIM_METHODS.values(), iam.SHIM_REFRESH) for a in actions}
    assert "dynamodb:Scan" in app  # scan(): once missing, an AccessDenied in production


def test_every_data_job_has_its_command_and_partition_in_the_worker_policy():
    assert set(iam.JOBS) == set(JOB_RULES)
    worker = iam.policy("worker", "T", "ctl", migration_id="m")
    partitions = {p for st in worker["Statement"] for p in st.get("Condition", {}).get(
        "ForAllValues:StringLike", {}).get("dynamodb:LeadingKeys", [])}
    for job, (command, _) in iam.JOBS.items():
        assert command in iam.ROLES["worker"] and command in iam.ROLES["operator"]
        assert f"J#m#{job.split(' ')[0]}" in partitions
    assert "J#m#strip-bookkeeping" in partitions  # cleanup --strip-bookkeeping's rows
