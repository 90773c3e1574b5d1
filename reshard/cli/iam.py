"""`reshard iam-policy`: print the least-privilege IAM policy of one role for a migration."""

from __future__ import annotations

import json

import click

from reshard import errors, operations
from reshard.cli.options import Env, command
from reshard.core.iam import ROLES
from reshard.core.migration import load


@command("iam-policy")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--role", type=click.Choice(list(ROLES)), default=None,
              help="Required. app: instances importing the shim (data items; writes only their migration's heartbeat "
                   "partition). observer: plan, status, list, doctor without --repair, verify --no-record "
                   "(reads only, writes nothing). worker: backfill, verify (the recorded run the cutover gate "
                   "counts), verify --repair, cleanup (data writes, job leases; no "
                   "transition). operator: transitions and everything above.")
@click.option("--account", default="*", show_default=True, help="AWS account id for the ARNs.")
def iam_policy(env: Env, file: str, role: str, account: str) -> None:
    """Print the least-privilege IAM policy (JSON) of one role for FILE's table and the control table.

    Control-table writes are limited by partition (dynamodb:LeadingKeys): an app may write only
    S#<id> (heartbeats), a worker only J#<id>#<job> (its job's runs and leases), never the phase
    row M#<id> or the table lock T#<table>.

    \b
    Example:
      reshard iam-policy migrations/0001_sensor_events.toml --role app --account 123456789012
    """
    if role is None:
        # No default: the broadest policy (operator) printed by accident is the wrong one to paste.
        raise errors.BadInput("iam-policy needs --role, one of: app (the application instances' shim), observer "
                              "(reads only: plan, status, list, doctor, verify --no-record), worker (backfill, "
                              "verify, cleanup), operator (transitions and everything else)")
    policy = operations.iam_policy(load(file), role, env.control_table, env.region, account)
    # JSON in text mode too (it is the product); --query/--output table go through the one path.
    env.emit(policy.document, lambda: json.dumps(policy.document, indent=2))
