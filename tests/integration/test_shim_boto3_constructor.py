"""Issue 26, case 8: the shim takes the application's boto3 ``Session``, ``client`` or botocore
``Config``; its retries and timeouts stay in force; ``ResponseMetadata`` as boto3 reports it;
``RESHARD_CONTROL_TABLE``; boto3's Table attributes (``table_name``, ``key_schema``, ``load()``...).

Each case is checked against a plain boto3 ``Table`` on the same client where boto3 has an answer.
"""

from __future__ import annotations

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError

from reshard import errors
from reshard.aws.dynamo import SHIM_RETRIES
from reshard.control.store import ControlStore
from reshard.core.phases import ORDER, Phase
from reshard.shim.table import ShardedTable
from tests.integration.test_interleavings_shim import create_table, ev, key
from tests.shim_helpers import migration


def _file(tmp_path, m) -> str:
    """The 0001 migration file, renamed to the test's table."""
    path = tmp_path / "m.toml"
    path.write_text(m.text.replace('table = "SensorEvents"', f'table = "{m.table}"'))
    return str(path)


def _client(server, **config):
    return boto3.client("dynamodb", endpoint_url=server.endpoint, region_name="us-east-1",
                        aws_access_key_id="app-key", aws_secret_access_key="app-secret",
                        config=botocore.config.Config(**config) if config else None)


class Throttle:
    """A ``before-send`` hook answering ThrottlingException ``times`` times for the table's
    requests (then nothing: the request goes to the server); counts the attempts it saw."""

    def __init__(self, table: str, times: int):
        self.table, self.times, self.seen = table, times, 0

    def __call__(self, request, **_):
        if f'"{self.table}"'.encode() not in (request.body or b""):
            return None
        self.seen += 1
        if self.times <= 0:
            return None
        self.times -= 1
        from botocore.awsrequest import AWSResponse

        class Raw:
            def stream(self, **_):
                yield b""
        body = b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"slow down"}'
        resp = AWSResponse(request.url, 400, {"x-amzn-requestid": "t", "content-type": "application/x-amz-json-1.0"},
                           Raw())
        resp._content = body
        return resp


@pytest.mark.parametrize("lean", ["1", "0"])
def test_response_metadata_as_boto3(dynalite_server, dynalite, unique_name, tmp_path, monkeypatch, lean):
    """A successful read shows the real RetryAttempts and no MaxAttemptsReached (before: the shim's
    one-attempt botocore client marked every answer MaxAttemptsReached: True; the lean path said 0
    retries after retrying); a request retried once says RetryAttempts 1, as boto3 does."""
    monkeypatch.setenv("RESHARD_LEAN", lean)
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    with ShardedTable.from_file(_file(tmp_path, m), endpoint_url=dynalite_server.endpoint, region_name="us-east-1",
                                control_table=None) as t:
        t.put_item(Item=ev(1))
        for resp in (t.get_item(Key=key(1)), t.put_item(Item=ev(1)), t.query(Key={"sensor_id": "s-1"}),
                     t.update_item(Key=key(1), UpdateExpression="SET n = :n", ExpressionAttributeValues={":n": 1},
                                   ReturnValues="ALL_NEW")):
            meta = resp["ResponseMetadata"]
            assert "MaxAttemptsReached" not in meta and meta["RetryAttempts"] == 0, meta
        hook = Throttle(m.table, 1)
        t.dynamo.client.meta.events.register("before-send.dynamodb", hook)
        meta = t.get_item(Key=key(1))["ResponseMetadata"]
        assert hook.seen == 2 and meta["RetryAttempts"] == 1 and "MaxAttemptsReached" not in meta, meta


@pytest.mark.parametrize("how", ["get", "put", "put_returning"])
def test_app_client_retries_stay_in_force(dynalite_server, dynalite, unique_name, tmp_path, how):
    """``client=``: the app's retry configuration decides how often a request is tried, on the
    lean path (get, put) and on botocore's (a put with ReturnValues) alike, and the error says
    so as boto3's does (before: client= was refused, TypeError)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    client = _client(dynalite_server, retries={"total_max_attempts": 3, "mode": "legacy"})
    plain = boto3.resource("dynamodb", endpoint_url=dynalite_server.endpoint, region_name="us-east-1",
                           aws_access_key_id="x", aws_secret_access_key="x").Table(m.table)
    plain.meta.client.meta.events  # noqa: B018 (plain's own client; the hook goes on the app's)
    with ShardedTable.from_file(_file(tmp_path, m), client=client, control_table=None) as t:
        assert t.dynamo.client is client
        hook = Throttle(m.table, 10)
        client.meta.events.register("before-send.dynamodb", hook)
        calls = {"get": lambda: t.get_item(Key=key(1)), "put": lambda: t.put_item(Item=ev(1)),
                 "put_returning": lambda: t.put_item(Item=ev(1), ReturnValues="ALL_OLD")}
        with pytest.raises(ClientError) as e:
            calls[how]()
        assert hook.seen == 3, hook.seen
        assert e.value.response["Error"]["Code"] == "ThrottlingException"
        assert e.value.response["ResponseMetadata"]["RetryAttempts"] == 2
        assert e.value.response["ResponseMetadata"]["MaxAttemptsReached"] is True
        # boto3's Table on the same client: the same attempts and metadata.
        hook.seen = 0
        with pytest.raises(ClientError) as b:
            client.get_item(TableName=m.table, Key={"PK": {"S": "x"}, "SK": {"S": "y"}})
        assert hook.seen == 3
        assert {k: b.value.response["ResponseMetadata"][k] for k in ("RetryAttempts", "MaxAttemptsReached")} == \
            {k: e.value.response["ResponseMetadata"][k] for k in ("RetryAttempts", "MaxAttemptsReached")}


def test_app_timeouts_and_the_refresh_policy(dynalite_server, unique_name):
    """The app's timeouts bound the app's requests (the lean path's attempt too, and what the shim
    publishes as its request bound); the control refresh keeps the shim's bounded policy."""
    m = migration("sensor", table=unique_name)
    client = _client(dynalite_server, connect_timeout=2, read_timeout=7,
                     retries={"total_max_attempts": 4, "mode": "standard"})
    data, control = _app(client)
    t = ShardedTable(m, data, control_dynamo=control, start=False)
    try:
        assert t.dynamo.attempt_seconds == 9 and t.dynamo._lean.attempt_seconds == 9
        assert t.dynamo.retry.max_attempts == 4 and t.dynamo.client_retries
        control = t._phases._dynamo
        assert control is not t.dynamo and control.client is client
        assert control.retry is SHIM_RETRIES and control._lean.attempt_seconds == 35
    finally:
        t.close()


def test_an_app_policy_past_reshards_bounds_is_refused_with_the_fix(dynalite_server, unique_name):
    """botocore's legacy retry mode (DynamoDB: 10 attempts of 60 + 60 s; the default before
    botocore 1.44, whose default is standard mode's 3) lets one write last ~50 minutes: past what
    the gates wait for. Refused at construction, one line naming a Config that fits."""
    m = migration("sensor", table=unique_name)
    with pytest.raises(errors.BadInput, match=r"2980\.8s.*total_max_attempts"):
        ShardedTable(m, *_app(_client(dynalite_server, retries={"mode": "legacy"}))[:1], control_table="ctl",
                     start=False)
    ok = _client(dynalite_server, connect_timeout=5, read_timeout=30, retries={"mode": "standard",
                                                                              "total_max_attempts": 3})
    data, control = _app(ok)
    ShardedTable(m, data, control_dynamo=control, control_table="ctl", start=False).close()


def test_adaptive_retries_keep_botocores_path(dynalite_server, unique_name):
    """Adaptive mode's client-side rate limiter learns from botocore's needs-retry event, which
    the lean path does not emit: such a client is served by botocore throughout."""
    data, control = _app(_client(dynalite_server, retries={"mode": "adaptive"}))
    assert data._lean is None and control._lean is None and data.client_retries


def _app(client):
    from reshard.shim.table import app_dynamo
    data, control = app_dynamo(None, None, None, None, client, None)
    return data, control


def test_refuses_mixed_constructor_arguments(dynalite_server, tmp_path, unique_name):
    m = migration("sensor", table=unique_name)
    with pytest.raises(errors.BadInput, match="pass it alone"):
        ShardedTable.from_file(_file(tmp_path, m), client=_client(dynalite_server), region_name="eu-west-1")
    with pytest.raises(errors.BadInput, match="DynamoDB client"):
        ShardedTable.from_file(_file(tmp_path, m), client=boto3.client("s3", region_name="us-east-1"))


def test_session_and_config(dynalite_server, dynalite, unique_name, tmp_path):
    """``session=``: the app's credentials and region; ``config=``: merged over the shim's (what it
    sets wins: timeouts, user agent, retries)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    session = boto3.Session(aws_access_key_id="app-key", aws_secret_access_key="app-secret", region_name="us-east-1")
    config = botocore.config.Config(read_timeout=11, user_agent_extra="my-app/1.0",
                                    retries={"total_max_attempts": 2, "mode": "standard"})
    with ShardedTable.from_file(_file(tmp_path, m), endpoint_url=dynalite_server.endpoint, session=session,
                                config=config, control_table=None) as t:
        c = t.dynamo.client
        assert c._request_signer._credentials.access_key == "app-key" and c.meta.region_name == "us-east-1"
        assert c.meta.config.read_timeout == 11 and c.meta.config.connect_timeout == 5  # ours where unset
        assert "my-app/1.0" in t.dynamo._lean.user_agent
        assert t.dynamo.retry.max_attempts == 2
        t.put_item(Item=ev(1, n=1))
        assert t.get_item(Key=key(1), ConsistentRead=True)["Item"] == ev(1, n=1)
    with ShardedTable.from_file(_file(tmp_path, m), endpoint_url=dynalite_server.endpoint, session=session,
                                control_table=None) as t:
        assert t.dynamo.retry is SHIM_RETRIES and t._phases._dynamo.retry is SHIM_RETRIES  # the shim's own policy


def test_control_table_from_the_environment(dynalite_server, dynalite, unique_name, tmp_path, monkeypatch):
    """``RESHARD_CONTROL_TABLE`` names the control table when the constructor names none, as for
    the CLI (before: the shim read ``reshard-control`` and acted steady while the fleet was in dual_write)."""
    m = migration("sensor", table=unique_name)
    create_table(dynalite, m)
    store = ControlStore(dynalite, f"ctl-{unique_name}"[:200])
    store.ensure_table()
    store.register(m)
    for p in ORDER[1:ORDER.index(Phase.DUAL_WRITE) + 1]:
        store.set_phase(store.load_state(m.id), p, "test", "test")
    monkeypatch.setenv("RESHARD_CONTROL_TABLE", store.table)
    with ShardedTable.from_file(_file(tmp_path, m), endpoint_url=dynalite_server.endpoint,
                                region_name="us-east-1") as t:
        assert t.phase == "dual_write"
    with ShardedTable.from_migration_id(m.id, endpoint_url=dynalite_server.endpoint, region_name="us-east-1") as t:
        assert t.phase == "dual_write" and t.migration.id == m.id


def test_boto3_table_attributes(dynalite_server, dynalite, unique_name, tmp_path):
    """What an application may touch of boto3's Table besides the item calls: the name, ``load()``
    / ``reload()`` and the description attributes (the physical table's), ``key_schema`` and
    ``attribute_definitions`` (logical: the fields a ``Key`` holds), ``meta.client``."""
    m = migration("sensor", table=unique_name)
    client = _client(dynalite_server)
    with ShardedTable.from_file(_file(tmp_path, m), client=client, control_table=None) as t:
        with pytest.raises(ClientError) as e:
            t.load()  # as boto3's Table.load of a table that does not exist
        assert e.value.response["Error"]["Code"] == "ResourceNotFoundException"
        create_table(dynalite, m)
        plain = boto3.resource("dynamodb", endpoint_url=dynalite_server.endpoint, region_name="us-east-1",
                               aws_access_key_id="x", aws_secret_access_key="x").Table(m.table)
        assert t.table_name == t.name == t.meta.table_name == plain.table_name
        t.put_item(Item=ev(1))
        t.reload()
        plain.reload()
        for attr in ("table_status", "table_arn", "item_count", "provisioned_throughput", "billing_mode_summary",
                     "global_secondary_indexes", "creation_date_time"):
            assert getattr(t, attr) == getattr(plain, attr), attr
        assert t.key_schema == [{"AttributeName": "sensor_id", "KeyType": "HASH"},
                                {"AttributeName": "event_id", "KeyType": "HASH"},
                                {"AttributeName": "ts", "KeyType": "RANGE"}]
        assert t.attribute_definitions == [{"AttributeName": f, "AttributeType": "S"}
                                           for f in ("sensor_id", "event_id", "ts")]
        # What an app builds from key_schema is a Key the shim takes.
        built = {k["AttributeName"]: ev(1)[k["AttributeName"]] for k in t.key_schema}
        assert t.get_item(Key=built, ConsistentRead=True)["Item"] == ev(1)
        assert t.meta.client.describe_table(TableName=m.table)["Table"]["TableName"] == m.table
        with pytest.raises(ClientError):
            t.meta.client.get_item(TableName=m.table, Key={"PK": {"S": "x"}, "SK": {"S": "y"}})
