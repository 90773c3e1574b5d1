"""The deployment recipes in deploy/ parse, and the command line each one runs is one the CLI accepts.

Each recipe's ``reshard`` command is parsed by the real click command (types, ranges and
option names, as ``reshard backfill`` itself would), with the host id variable replaced by
an index; the Kubernetes recipe must be an Indexed Job taking its host id from the
completion index, the AWS Batch one an array job taking it from the array index, both as
the same worker role, whose policy file is what ``reshard iam-policy --role worker`` prints.
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex

import click
import pytest
import yaml
from click.testing import CliRunner

from reshard.cli.main import cli
from reshard.core.migration import load
from tests.unit.test_docs import check_invocation, reshard_invocations

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MIGRATION = load(ROOT / "migrations" / "0001_sensor_events.toml")


def parse_reshard(argv: list[str]) -> tuple[str, dict]:
    """Parse ``reshard ARGV`` with the real commands (without running it): (command, its params)."""
    assert argv and not argv[0].startswith("-"), argv
    name, rest = argv[0], argv[1:]
    assert name in cli.commands, f"no command {name!r}"
    try:
        ctx = cli.commands[name].make_context(name, list(rest))
    except click.UsageError as e:  # noqa: PT017 - shown with the argv
        pytest.fail(f"`reshard {' '.join(argv)}` is refused by the parser: {e.format_message()}")
    return name, ctx.params


def k8s_docs() -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / "backfill-indexed-job.yaml").read_text()))


def test_kubernetes_indexed_job_runs_an_accepted_backfill_per_completion_index():
    docs = {d["kind"]: d for d in k8s_docs()}
    job = docs["Job"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] >= 2
    assert spec["parallelism"] == spec["completions"]          # every host runs at once: one budget between them
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert container["command"] == ["reshard"]
    args = [a.replace("$(JOB_COMPLETION_INDEX)", "3") for a in container["args"]]
    name, params = parse_reshard(args)
    assert name == "backfill" and params["migration"] == MIGRATION.id
    assert params["host_id"] == "backfill-3" and params["max_wcu"] > 0 and params["max_rcu"] > 0
    assert params["segments"] >= spec["completions"] * (params["workers"] or 1)  # a segment per worker thread
    # Exit 2 (refused, bad input) fails the Job instead of being retried into the same refusal.
    rule = next(r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob")
    assert rule["onExitCodes"] == {"containerName": container["name"], "operator": "In", "values": [2]}
    assert pod["restartPolicy"] == "Never"                      # podFailurePolicy requires it
    assert pod["terminationGracePeriodSeconds"] >= 60           # SIGTERM: finish the page, release the leases


def test_aws_batch_array_job_runs_an_accepted_backfill_per_array_index():
    definition = json.loads((DEPLOY / "aws-batch" / "job-definition.json").read_text())
    submit = json.loads((DEPLOY / "aws-batch" / "submit-array-job.json").read_text())
    assert submit["jobDefinition"] == definition["jobDefinitionName"] and submit["arrayProperties"]["size"] >= 2
    props = definition["containerProperties"]
    sh, flag, script = props["command"]
    assert (sh, flag) == ("sh", "-c")
    assert "${AWS_BATCH_JOB_ARRAY_INDEX}" in script
    tokens = shlex.split(script.replace("${AWS_BATCH_JOB_ARRAY_INDEX}", "2"))
    assert tokens[:2] == ["exec", "reshard"]                     # exec: reshard itself gets SIGTERM
    name, params = parse_reshard(tokens[2:])
    assert name == "backfill" and params["migration"] == MIGRATION.id and params["host_id"] == "batch-2"
    assert params["max_wcu"] > 0
    first = definition["retryStrategy"]["evaluateOnExit"][0]
    assert first == {"onExitCode": "2", "action": "EXIT"}        # refused: no retry


def test_both_recipes_run_as_the_worker_role_with_the_worker_policy():
    sa = next(d for d in k8s_docs() if d["kind"] == "ServiceAccount")
    k8s_role = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    batch_role = json.loads((DEPLOY / "aws-batch" / "job-definition.json").read_text())["containerProperties"]["jobRoleArn"]
    assert k8s_role == batch_role and k8s_role.endswith(":role/reshard-worker")
    account = re.search(r"::(\d+):", k8s_role).group(1)
    out = CliRunner().invoke(cli, ["iam-policy", str(ROOT / "migrations" / "0001_sensor_events.toml"), "--role",
                                   "worker", "--account", account])
    assert out.exit_code == 0, out.output
    committed = json.loads((DEPLOY / "iam" / "worker-policy.json").read_text())
    assert committed == json.loads(out.output), "deploy/iam/worker-policy.json is stale: regenerate it"
    # The budget row and the members' beats are rows of the job's own partition: the worker may write them.
    partitions = [s["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
                  for s in committed["Statement"] if "Condition" in s]
    assert [f"J#{MIGRATION.id}#backfill" in p for p in partitions] == [True]


def test_the_parser_check_catches_a_wrong_flag():
    with pytest.raises(pytest.fail.Exception, match="No such option"):
        parse_reshard(["backfill", MIGRATION.id, "--max-wcuu", "5"])
    with pytest.raises(pytest.fail.Exception, match="not in the range"):
        parse_reshard(["backfill", MIGRATION.id, "--max-wcu", "0"])


def test_docs_deploy_names_only_real_commands_and_options():
    calls = reshard_invocations((ROOT / "docs" / "deploy.md").read_text())
    assert calls, "docs/deploy.md shows no reshard command"
    assert [f"reshard {' '.join(t)}: {why}" for t in calls if (why := check_invocation(t))] == []
