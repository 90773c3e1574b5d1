"""The deployment recipes in deploy/ parse, and the command line each one runs is one the CLI accepts.

Each recipe's ``reshard`` command is parsed by the real click command (types, ranges and
option names, as ``reshard backfill`` itself would), with the host id variable replaced by
an index; the Kubernetes recipe must be an Indexed Job taking its host id from the
completion index, the AWS Batch one an array job taking it from the array index, both as
the same worker role, whose policy file is what ``reshard iam-policy --role worker`` prints.
The Kubernetes manifests also pass the Kubernetes JSON schemas (kubernetes-validate, strict:
an unknown or misspelled field fails); both recipes size ``--processes`` from the CPU they
are given and memory from the measured figure; the Dockerfile is pinned and runs as a user
with a home of its own. Docker does not run here: the Dockerfile is parsed, not built.
"""

from __future__ import annotations

import json
import math
import os
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


# --------------------------------------------------------------------------- schemas and sizes

#: Kubernetes versions the manifests are checked against: the oldest still common on EKS
#: and the newest the validator has schemas for.
K8S_VERSIONS = ("1.29", "latest")

#: Peak resident memory of a ``reshard backfill --processes P`` tree, measured by
#: benchmarks/pod_memory.py (docs/deploy.md has the runs): the command's own process with the
#: helpers multiprocessing starts beside it (its forkserver and resource tracker), about
#: 56 + 45 + 13 MB, plus about 58 MB per worker process; a container gets this much headroom.
FIXED_MB = 120
PEAK_MB_PER_WORKER = 60
HEADROOM = 1.5


def memory_needed_mb(processes: int) -> float:
    return (FIXED_MB + processes * PEAK_MB_PER_WORKER) * HEADROOM


def k8s_manifests() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.y*ml")):
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def mebibytes(quantity: str) -> float:
    """A Kubernetes memory quantity (512Mi, 1Gi, 600M, ...) in MiB."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 1e3, "M": 1e6, "G": 1e9, "": 1}
    number, unit = re.fullmatch(r"([0-9.]+)([KMG]i?|)", str(quantity)).groups()
    return float(number) * units[unit] / 2**20


def cores(quantity: str) -> float:
    q = str(quantity)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_manifests_pass_the_kubernetes_schemas(version):
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.utils.latest_version()
    docs = k8s_manifests()
    assert {d["kind"] for _, d in docs} >= {"Job", "ServiceAccount"}
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{name}: {doc['kind']} is not a valid Kubernetes {version} object: {e.message} "
                        f"at {'.'.join(map(str, e.absolute_path))}")


def test_the_schema_check_catches_a_misspelled_field_and_a_missing_one():
    import kubernetes_validate

    job = next(d for _, d in k8s_manifests() if d["kind"] == "Job")
    typo = json.loads(json.dumps(job))
    typo["spec"]["template"]["spec"]["containers"][0]["resources"]["limit"] = {"cpu": "1"}
    missing = json.loads(json.dumps(job))
    del missing["spec"]["podFailurePolicy"]["rules"][1]["onPodConditions"][0]["status"]  # as the recipe had it
    for bad in (typo, missing):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, "1.29", strict=True)


def test_kubernetes_processes_follow_the_containers_cpu_limit_and_memory_fits_them(monkeypatch):
    job = next(d for _, d in k8s_manifests() if d["kind"] == "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    env = {e["name"]: e for e in container["env"]}
    # RESHARD_PROCESSES (--processes' variable) is the CPU limit, whole cores rounded up, by the
    # downward API: a pod on a 32-core node still runs limits.cpu workers, not 32.
    assert env["RESHARD_PROCESSES"]["valueFrom"]["resourceFieldRef"] == {
        "containerName": container["name"], "resource": "limits.cpu", "divisor": "1"}
    assert "cpu" in limits          # without a CPU limit the downward API gives the node's allocatable CPU
    assert "--processes" not in container["args"]                            # the variable decides
    processes = math.ceil(cores(limits["cpu"]))
    monkeypatch.setenv("RESHARD_PROCESSES", str(processes))                  # what the kubelet puts there
    _, params = parse_reshard([a.replace("$(JOB_COMPLETION_INDEX)", "0") for a in container["args"]])
    assert params["processes"] == processes
    # Budget members: one per worker process of every pod, each with --workers threads, and a
    # segment for each of those threads.
    members = job["spec"]["completions"] * processes
    assert params["segments"] >= members * params["workers"]
    need = memory_needed_mb(processes)
    assert mebibytes(limits["memory"]) >= need, (limits["memory"], need)
    assert container["resources"]["requests"]["memory"] == limits["memory"]  # no OOM kill below the request
    assert cores(container["resources"]["requests"]["cpu"]) == cores(limits["cpu"])


def test_aws_batch_processes_follow_the_vcpus_and_memory_fits_them():
    props = json.loads((DEPLOY / "aws-batch" / "job-definition.json").read_text())["containerProperties"]
    resources = {r["type"]: r["value"] for r in props["resourceRequirements"]}
    env = {e["name"]: e["value"] for e in props["environment"]}
    processes = math.ceil(float(resources["VCPU"]))
    assert int(env["RESHARD_PROCESSES"]) == processes
    assert "--processes" not in props["command"][2]
    assert float(resources["MEMORY"]) >= memory_needed_mb(processes)


@pytest.mark.parametrize("recipe", ["kubernetes", "aws-batch"])
def test_the_recipes_region_variable_is_the_region_reshard_uses(recipe, monkeypatch, tmp_path):
    """They set AWS_REGION only (as aws-cli v2 users do): reshard must take it (botocore alone does not)."""
    from reshard.aws.dynamo import make_client

    if recipe == "kubernetes":
        job = next(d for _, d in k8s_manifests() if d["kind"] == "Job")
        env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    else:
        props = json.loads((DEPLOY / "aws-batch" / "job-definition.json").read_text())["containerProperties"]
        env = {e["name"]: e["value"] for e in props["environment"]}
    assert "AWS_DEFAULT_REGION" not in env
    for var in ("AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_REGION", env["AWS_REGION"])
    assert make_client().meta.region_name == env["AWS_REGION"]


# --------------------------------------------------------------------------- the image

def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_is_pinned_and_runs_as_a_user_with_a_home():
    steps = dockerfile()
    (base,) = [a for i, a in steps if i == "FROM"]
    # An exact Python release (not a moving 3.11 or latest), optionally with its digest; the
    # Python that setup.cfg allows and CI tests on.
    m = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base)
    assert m, f"FROM {base}: not an exact tag"
    floor = re.search(r"python_requires\s*=\s*>=\s*(\d+)\.(\d+)", (ROOT / "setup.cfg").read_text()).groups()
    assert (int(m[1]), int(m[2])) >= tuple(map(int, floor))
    # Every package at the version constraints.txt pins, and that file is in the image.
    installs = [a for i, a in steps if i == "RUN" and "pip install" in a]
    assert installs and all("--constraint /src/constraints.txt" in a for a in installs), installs
    assert any(i == "COPY" and "constraints.txt" in a.split() for i, a in steps)
    for i, a in steps:
        if i == "COPY":
            assert all((ROOT / src).exists() for src in a.split()[:-1]), a
    # A non-root user from the last USER on, with a HOME it owns (created by useradd).
    user_at = [k for k, (i, _) in enumerate(steps) if i == "USER"]
    assert user_at and user_at[-1] > max(k for k, (i, _) in enumerate(steps) if i == "RUN")
    uid = steps[user_at[-1]][1].split(":")[0]
    assert uid not in ("0", "root")
    home = re.search(r"HOME=(\S+)", " ".join(a for i, a in steps if i == "ENV")).group(1)
    assert home != "/" and any(i == "RUN" and "useradd" in a and f"--uid {uid}" in a and f"--home-dir {home}" in a
                               and "--create-home" in a for i, a in steps)
    # The Kubernetes recipe runs as that same user.
    job = next(d for _, d in k8s_manifests() if d["kind"] == "Job")
    ctx = job["spec"]["template"]["spec"]["securityContext"]
    assert ctx["runAsNonRoot"] is True and str(ctx["runAsUser"]) == uid


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out


def declared() -> list[str]:
    """Every requirement of setup.cfg: install_requires and every extra."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in cfg["options.extras_require"].values():
        lines += extra.splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_constraints_pin_every_declared_dependency_within_its_range():
    from packaging.requirements import Requirement

    pinned = pins()
    assert "reshard" not in pinned          # the package itself is installed from the checkout
    for text in declared():
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pinned, f"{text}: not pinned in constraints.txt (refresh it: its header says how)"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{text}: pinned at {pinned[name]}"
