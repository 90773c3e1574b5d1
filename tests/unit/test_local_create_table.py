"""``reshard.aws.local.create_table`` returns only once the table is ACTIVE (a bounded poll)."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.aws import local
from reshard.core.migration import Keys


class FakeDynamo:
    """Answers CreateTable, then DescribeTable from a script of statuses (None: not found yet)."""

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.calls = []

    def call(self, op, **kw):
        self.calls.append(op)
        if op == "create_table":
            return {}
        status = self.statuses.pop(0) if self.statuses else self.last
        self.last = status
        if status is None:
            raise errors.ResourceNotFound(op, "ResourceNotFoundException", "not yet")
        return {"Table": {"TableStatus": status}}


def test_create_table_waits_until_active():
    d = FakeDynamo([None, "CREATING", "CREATING", "ACTIVE"])
    local.create_table(d, "t", Keys("PK", "SK"), poll=0.0)
    assert d.calls == ["create_table"] + ["describe_table"] * 4


def test_create_table_gives_up_after_its_timeout():
    d = FakeDynamo(["CREATING"])
    with pytest.raises(errors.AWSError, match="CREATING, not ACTIVE"):
        local.create_table(d, "t", Keys("PK", "SK"), timeout=0.05, poll=0.01)
