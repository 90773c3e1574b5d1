"""The AWS environment as a command sees it, through the real ``main()`` (issue 27, points 3-5).

* The region: ``--region`` > ``AWS_REGION`` > ``AWS_DEFAULT_REGION`` > the profile's ``region``,
  as aws-cli v2 reads them (botocore itself reads no AWS_REGION). moto keeps one DynamoDB per
  region, so each region here holds a migration of its own and ``list`` shows which one a
  command reached.
* A profile the AWS files do not have: one line, exit 2.
* An endpoint where nothing listens: exit 2 after a few quick attempts, one line naming it; an
  endpoint without a scheme is said to be one.
"""

from __future__ import annotations

import http.server
import json
import pathlib
import threading

import pytest
from moto import mock_aws

from reshard import errors
from reshard.aws.dynamo import FIRST_CONTACT_ATTEMPTS, Dynamo, RetryPolicy
from reshard.aws.local import free_port
from reshard.cli.main import main
from reshard.control.store import ControlStore
from reshard.core.migration import parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENSOR_TEXT = (ROOT / "migrations" / "0001_sensor_events.toml").read_text()
REGIONS = ("eu-west-1", "us-west-2", "ap-south-1")


@pytest.fixture
def aws_files(tmp_path, monkeypatch):
    """No region anywhere but where a test puts one; a profile ``team`` whose region is ap-south-1."""
    config, credentials = tmp_path / "config", tmp_path / "credentials"
    config.write_text("[profile team]\nregion = ap-south-1\n")
    credentials.write_text("[team]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_DYNAMODB"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def one_migration_per_region(aws_files):
    with mock_aws():
        for region in REGIONS:
            m = parse(SENSOR_TEXT.replace('id = "sensor-events-16-to-32"', f'id = "in-{region}"'), "m.toml")
            ControlStore(Dynamo(region=region), "rs-control").register(m, who="test")
        yield


def listed(capsys, *args: str) -> list[str]:
    code = main([*args, "list", "--control-table", "rs-control", "--output", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [m["id"] for m in json.loads(out)["migrations"]]


@pytest.mark.parametrize("args,env,region", [
    ([], {"AWS_REGION": "eu-west-1"}, "eu-west-1"),                                   # what the recipes set
    ([], {"AWS_DEFAULT_REGION": "us-west-2"}, "us-west-2"),
    ([], {"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-west-2"}, "eu-west-1"),  # AWS_REGION first
    (["--region", "us-west-2"], {"AWS_REGION": "eu-west-1"}, "us-west-2"),             # the option before both
    (["--profile", "team"], {}, "ap-south-1"),                                         # the profile's region last
    (["--profile", "team"], {"AWS_DEFAULT_REGION": "us-west-2"}, "us-west-2"),
    (["--profile", "team"], {"AWS_REGION": "eu-west-1"}, "eu-west-1"),
], ids=["AWS_REGION", "AWS_DEFAULT_REGION", "both", "option", "profile", "default-over-profile",
        "region-over-profile"])
def test_the_region_comes_from_where_aws_cli_v2_takes_it(one_migration_per_region, capsys, monkeypatch, args, env,
                                                          region):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert listed(capsys, *args) == [f"in-{region}"]


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reshard: error: "), err
    return lines[0]


def test_no_region_at_all_names_every_place_a_region_comes_from(aws_files, capsys):
    code = main(["status", "--control-table", "rs-control"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "no AWS region set: use --region, AWS_REGION or AWS_DEFAULT_REGION, or a profile with a region" \
        in one_error_line(err)


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_profile_that_does_not_exist_is_one_line_exit_2(aws_files, capsys, monkeypatch, how):
    # No region in the environment: the region lookup is what used to meet the missing profile
    # outside any try ("internal error: ProfileNotFound", exit 1).
    if how == "env":
        monkeypatch.setenv("AWS_PROFILE", "nosuch")
    code = main([*(["--profile", "nosuch"] if how == "option" else []), "status", "--control-table", "rs-control"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    source = "--profile" if how == "option" else "AWS_PROFILE"
    line = one_error_line(err)
    assert f"AWS profile 'nosuch' ({source}) is not in " in line and "(profiles there: team)" in line
    assert "`aws configure --profile nosuch` creates it" in line


# --------------------------------------------------------------------------- endpoints

@pytest.mark.parametrize("how", ["option", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"])
def test_an_endpoint_without_a_scheme_is_said_to_be_one(aws_files, capsys, monkeypatch, how):
    args = ["--endpoint-url", "localhost:8000"] if how == "option" else []
    if how != "option":
        monkeypatch.setenv(how, "localhost:8000")
    code = main([*args, "status", "--control-table", "rs-control"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    source = "--endpoint-url" if how == "option" else how
    assert f"{source} 'localhost:8000' has no scheme: write http://localhost:8000 for a local server" \
        in one_error_line(err)


def test_an_endpoint_where_nothing_listens_is_one_line_exit_2(aws_files, capsys):
    port = free_port()  # bound once, then released: nothing listens there
    code = main(["--endpoint-url", f"http://127.0.0.1:{port}", "status", "--control-table", "rs-control"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert one_error_line(err) == (
        f"reshard: error: nothing answers at http://127.0.0.1:{port} (connection refused; the endpoint comes from "
        f"--endpoint-url): start the server there (reshard local starts one) or fix --endpoint-url")


class _Answers(http.server.BaseHTTPRequestHandler):
    """A DynamoDB that answers every request with ResourceNotFoundException (an answer all the same)."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ResourceNotFoundException",
                           "message": "Requested resource not found"}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_dead_endpoint_gets_a_few_attempts_until_it_answered_once_then_the_whole_policy(aws_files):
    """The bound is on first contact only: once the endpoint answered, a refused connection (a
    server restarting) is retried under the whole policy; the shim (no first-contact bound) always is."""
    sleeps: list[float] = []
    policy = RetryPolicy(max_attempts=7, max_seconds=1e9, base_seconds=0.05)

    def dynamo(endpoint: str, **kwargs) -> Dynamo:
        return Dynamo(endpoint_url=endpoint, retry=policy, sleep=sleeps.append, **kwargs)

    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(errors.BadInput, match="nothing answers at"):
        dynamo(dead, first_contact_attempts=FIRST_CONTACT_ATTEMPTS).call("describe_table", TableName="t")
    assert len(sleeps) == FIRST_CONTACT_ATTEMPTS - 1 and sum(sleeps) <= 0.05 * (2 ** FIRST_CONTACT_ATTEMPTS)
    sleeps.clear()
    with pytest.raises(errors.AWSError, match="EndpointConnectionError"):
        dynamo(dead).call("describe_table", TableName="t")                     # the library's default
    assert len(sleeps) == policy.max_attempts - 1

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    client = dynamo(endpoint, first_contact_attempts=FIRST_CONTACT_ATTEMPTS)
    with pytest.raises(errors.ResourceNotFound):
        client.call("describe_table", TableName="t")                           # it answered once
    server.shutdown()
    server.server_close()
    thread.join(5)
    sleeps.clear()
    with pytest.raises(errors.AWSError, match="EndpointConnectionError") as refused:
        client.call("describe_table", TableName="t")
    assert not isinstance(refused.value, errors.BadInput) and len(sleeps) == policy.max_attempts - 1
