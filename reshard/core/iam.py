"""Least-privilege IAM policies for reshard (pure: builds JSON-able dicts).

Two roles, because they run in different places:

* ``operator``: the person or job running `reshard` commands (plan, start, advance,
  backfill, verify, cleanup). Needs to scan and write the data table and to create and
  write the control table.
* ``app``: the application instances that import the shim. Needs single-item and
  query access to the data table, and to read the migration record and write its own
  heartbeat in the control table. No Scan, no table management.
"""

from __future__ import annotations

OPERATOR_DATA_ACTIONS = [
    "dynamodb:DescribeTable", "dynamodb:DescribeTimeToLive", "dynamodb:UpdateTimeToLive",
    "dynamodb:Scan", "dynamodb:Query", "dynamodb:GetItem", "dynamodb:BatchGetItem",
    "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem",
]
OPERATOR_CONTROL_ACTIONS = [
    "dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:PutItem",
    "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:Query", "dynamodb:Scan",
]
APP_DATA_ACTIONS = [
    "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
    "dynamodb:DeleteItem", "dynamodb:Query", "dynamodb:BatchWriteItem",
]
APP_CONTROL_ACTIONS = ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:DeleteItem"]


def table_arn(table: str, region: str = "*", account: str = "*") -> str:
    return f"arn:aws:dynamodb:{region}:{account}:table/{table}"


def policy(role: str, data_table: str, control_table: str, region: str = "*", account: str = "*") -> dict:
    """The IAM policy document for ``role`` (``operator`` or ``app``)."""
    if role == "operator":
        data, control = OPERATOR_DATA_ACTIONS, OPERATOR_CONTROL_ACTIONS
    elif role == "app":
        data, control = APP_DATA_ACTIONS, APP_CONTROL_ACTIONS
    else:
        raise ValueError(f"unknown role {role!r}")
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ReshardDataTable", "Effect": "Allow", "Action": sorted(data),
             "Resource": [table_arn(data_table, region, account)]},
            {"Sid": "ReshardControlTable", "Effect": "Allow", "Action": sorted(control),
             "Resource": [table_arn(control_table, region, account)]},
        ],
    }
