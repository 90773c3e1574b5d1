"""``reshard local`` as a person runs it (a subprocess): it prints the endpoint and the lines to
use it, creates and fills a migration's table from an ``aws dynamodb scan`` export, serves
until Ctrl-C, then exits 130 with a line; bad input is one line, exit 2, before any server."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys

import boto3
import botocore.config
import pytest

from reshard.cli.main import main
from reshard.core.layout import hash_shard

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENSOR_FILE = ROOT / "migrations" / "0001_sensor_events.toml"


def scan_export(n: int) -> dict:
    """What `aws dynamodb scan --output json` prints for n items of the 0001 layout (PK's shard from the
    file's rule: plan refuses items whose key disagrees with it)."""
    return {"Items": [{"PK": {"S": f"sensor-{i % 3}#{hash_shard(f'e-{i}', 16)}"}, "SK": {"S": f"2024-10-27T15:00:{i:02d}Z"},
                       "sensor_id": {"S": f"sensor-{i % 3}"}, "event_id": {"S": f"e-{i}"},
                       "temp": {"N": str(20 + i)}} for i in range(n)],
            "Count": n, "ScannedCount": n}


def test_local_serves_a_loaded_table_until_ctrl_c(tmp_path, capsys, monkeypatch):
    sample = tmp_path / "sample.json"
    sample.write_text(json.dumps(scan_export(40)))
    proc = subprocess.Popen([sys.executable, "-m", "reshard", "local", "--port", "0", "--create", str(SENSOR_FILE),
                             "--load", str(sample)], cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        lines = []
        for line in proc.stdout:  # until the last line of the banner (the server is up by then)
            lines.append(line.rstrip("\n"))
            if line.startswith("Everything is in memory"):
                break
        banner = "\n".join(lines)
        url = re.search(r"^  export AWS_ENDPOINT_URL=(http://127\.0\.0\.1:\d+)$", banner, re.M).group(1)
        assert f"listens at {url}" in lines[0]
        assert "table SensorEvents: created (keys PK, SK; TTL on expires_at), 40 items loaded from" in banner
        assert f"  reshard plan {SENSOR_FILE}" in banner and "Ctrl-C stops it" in banner
        client = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1",
                              aws_access_key_id="local", aws_secret_access_key="local",
                              config=botocore.config.Config(retries={"total_max_attempts": 1}, connect_timeout=2))
        assert client.scan(TableName="SensorEvents", Select="COUNT")["Count"] == 40
        ttl = client.describe_time_to_live(TableName="SensorEvents")["TimeToLiveDescription"]
        assert ttl["AttributeName"] == "expires_at"
        # reshard itself reaches it through the printed variable alone (placeholder credentials for a local endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(var, raising=False)
        code = main(["plan", str(SENSOR_FILE), "--output", "json"])
        planned, err = capsys.readouterr()
        assert code == 0, err
        assert json.loads(planned)["table"]["name"] == "SensorEvents"
        assert proc.poll() is None                               # still serving
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130
    assert f"reshard local: stopped the DynamoDB at {url}; its tables are gone" in err
    with pytest.raises(Exception):  # gone with it
        client.list_tables()  # nothing listens there any more


def test_local_without_a_table_says_how_to_bring_your_own():
    from reshard.cli.local import _banner

    text = _banner("http://127.0.0.1:8000", [], None)
    assert "  export AWS_ENDPOINT_URL=http://127.0.0.1:8000" in text
    assert "aws dynamodb scan --table-name YOUR_TABLE --max-items 5000 --output json > sample.json" in text
    assert "reshard local --create migrations/YOUR_MIGRATION.toml --load sample.json" in text


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reshard: error: "), err
    return lines[0]


@pytest.mark.parametrize("case", ["port in use", "load without create", "not items", "no such file"])
def test_local_bad_input_is_one_line_exit_2_before_any_server(case, tmp_path, capsys):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    bad = tmp_path / "bad.json"
    bad.write_text('{"Items": [{"PK": "not DynamoDB JSON"}]}')
    args, says = {
        "port in use": (["--port", str(port)], f"port {port} on 127.0.0.1 is in use"),
        "load without create": (["--load", str(bad)], "--load needs --create FILE"),
        "not items": (["--port", "0", "--create", str(SENSOR_FILE), "--load", str(bad)],
                      "is not an item in DynamoDB JSON"),
        "no such file": (["--create", str(tmp_path / "nope.toml")], "no such file"),
    }[case]
    try:
        code = main(["local", *args])
    finally:
        held.close()
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert says in one_error_line(err)
