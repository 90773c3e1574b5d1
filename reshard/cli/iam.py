"""`reshard iam-policy`: print the least-privilege IAM policy for a migration."""

from __future__ import annotations

import json

import click

from reshard import operations
from reshard.cli.options import Env, command
from reshard.core.migration import load


@command("iam-policy")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--role", type=click.Choice(["operator", "app"]), default="operator", show_default=True,
              help="operator: runs reshard commands; app: instances importing the shim.")
@click.option("--account", default="*", show_default=True, help="AWS account id for the ARNs.")
def iam_policy(env: Env, file: str, role: str, account: str) -> None:
    """Print the least-privilege IAM policy (JSON) for FILE's table and the control table.

    \b
    Example:
      reshard iam-policy migrations/0001_sensor_events.toml --role app --account 123456789012
    """
    policy = operations.iam_policy(load(file), role, env.control_table, env.region, account)
    # JSON in text mode too (it is the product); --query/--output table go through the one path.
    env.emit(policy.document, lambda: json.dumps(policy.document, indent=2))
