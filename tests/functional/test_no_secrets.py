"""No command prints a credential: every command, with --verbose, on success and on its
error paths, run with known fake credentials; all output (stdout, stderr, and what the
``reshard`` loggers emit at DEBUG) is searched for the access key, the secret, the session
token and request-signing headers.
"""

from __future__ import annotations

import logging

import pytest

from reshard.aws import dynamo as dynamo_module
from reshard.cli import main as cli_main
from reshard.cli.main import main
from reshard.shim.table import ShardedTable

from tests.backfill_support import migration_text
from tests.iam_support import fake_credentials, leaks
from tests.shim_helpers import read_item

#: Commands with no AWS request at all, or that run a whole embedded demo.
NOT_HERE = {"demo"}


@pytest.fixture
def creds(monkeypatch):
    fake_credentials(monkeypatch)
    # One attempt per request: the error paths below must not sit in backoff.
    fast = dynamo_module.RetryPolicy(max_attempts=1, max_seconds=2)
    monkeypatch.setattr(dynamo_module, "RetryPolicy", lambda *a, **k: fast)


def _failing(monkeypatch, code: str, message: str) -> None:
    """Every request answers with this AWS error (a botocore before-send hook)."""
    from botocore.awsrequest import AWSResponse

    original = dynamo_module.make_client

    def make_client(*args, **kwargs):
        client = original(*args, **kwargs)

        def answer(request, **_):
            body = ('{"__type":"com.amazonaws.dynamodb.v20120810#%s","message":"%s"}' % (code, message)).encode()

            class Raw:
                def stream(self, *a, **k):
                    yield body

            return AWSResponse(request.url, 400, {"x-amzn-RequestId": "RID1"}, Raw())

        client.meta.events.register("before-send.dynamodb", answer)
        return client

    monkeypatch.setattr(dynamo_module, "make_client", make_client)


def test_no_command_prints_a_credential(dynalite_server, creds, tmp_path, capsys, caplog, monkeypatch):
    import uuid

    from reshard.aws import local
    from reshard.aws.dynamo import Dynamo
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse

    caplog.set_level(logging.DEBUG, logger="reshard")
    table = f"t-sec-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "m.toml"
    path.write_text(migration_text("sensor", table))
    m = parse(path.read_text(), str(path))
    local.create_table(Dynamo(endpoint_url=dynalite_server.endpoint), table, KeyMapper(m).keys)
    ep = ["--endpoint-url", dynalite_server.endpoint, "--control-table", f"{table}-ctl", "--verbose"]
    ran: set[str] = set()
    outputs: list[str] = []

    def run(*args: str, g=ep) -> int:
        ran.add(args[0])
        code = main([*args, *g])
        out, err = capsys.readouterr()
        outputs.append(f"$ reshard {' '.join(args)} -> {code}\n{out}{err}")
        return code

    # Before anything exists: the missing control table, a missing file, a bad option.
    assert run("status", m.id) == 2
    assert run("advance", m.id) == 2
    assert run("plan", str(tmp_path / "missing.toml")) == 2
    assert run("start", str(path), "--no-such-option") == 2
    # Success paths, text and JSON.
    assert run("plan", str(path), "--sample", "10", "--segments", "1") == 0
    assert run("start", str(path)) == 0
    assert run("status", "--output", "json") == 0
    assert run("iam-policy", str(path), "--role", "app") == 0
    for _ in range(3):
        assert run("advance", m.id, "--allow-no-shims") == 0
    with ShardedTable.from_file(str(path), endpoint_url=dynalite_server.endpoint, control_table=f"{table}-ctl",
                                refresh_seconds=60) as shim:
        shim.put_item(Item={"sensor_id": "s", "event_id": "e", "ts": "2024-01-01T00:00:00Z"})
        assert read_item(shim, Key={"sensor_id": "s", "event_id": "e", "ts": "2024-01-01T00:00:00Z"})
    # The data jobs' success paths run with these credentials and --verbose in
    # tests/integration/test_iam_requests.py (one lifecycle for both); here their refusals.
    run("verify", m.id, "--segments", "1", "--output", "json")  # before a backfill: whatever it says is searched
    assert run("status", m.id) == 0
    assert run("rollback", m.id, "--allow-no-shims") == 0
    assert run("abort", m.id, "--allow-no-shims") == 0
    assert run("advance", m.id) == 2  # refused: aborted
    others = sorted(set(cli_main.cli.commands) - NOT_HERE - ran)  # commands added later (list, doctor, ...)
    for name in others:
        run(name, m.id)
    # An unreachable endpoint (a connection error, one attempt).
    assert run("status", m.id, g=["--endpoint-url", "http://127.0.0.1:9", "--verbose"]) != 0
    # AWS refusing every request: the error line, and --verbose's traceback.
    _failing(monkeypatch, "AccessDeniedException", "User: arn:aws:sts::123456789012:assumed-role/app/i-1 is not "
                                                   "authorized to perform: dynamodb:Scan")
    for args in (("status", m.id), ("start", str(path)), ("backfill", m.id), ("verify", m.id),
                 ("cleanup", m.id), ("advance", m.id), ("rollback", m.id), ("abort", m.id),
                 ("plan", str(path), "--sample", "5")):
        assert run(*args) != 0, args
    for name in others:
        run(name, m.id)
    assert "not authorized" in "".join(outputs)  # the hook really answered
    # The shim's own log lines on a failing refresh.
    ShardedTable.from_file(str(path), endpoint_url=dynalite_server.endpoint, control_table=f"{table}-ctl",
                           refresh_seconds=60).close()

    everything = "\n".join(outputs) + "\n".join(r.getMessage() for r in caplog.records)
    assert "Traceback" in everything  # --verbose printed tracebacks: they were searched too
    assert leaks(everything) == []
    # Every command of the CLI was run here (one this test does not know, with MIGRATION only).
    assert set(cli_main.cli.commands) - NOT_HERE <= ran
