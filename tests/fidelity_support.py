"""Helpers of the fidelity proxy's tests: raw signed requests at a chosen date, tables, clients."""

from __future__ import annotations

import http.client
import json
import time

from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.aws.lean import sign, signing_key

FAST = RetryPolicy(max_attempts=4, max_seconds=10.0, base_seconds=0.01, max_backoff_seconds=0.05)


def raw_call(endpoint: str, op: str, body: dict, signed_at: float | None = None) -> tuple[int, dict, dict]:
    """One request signed (SigV4, placeholder credentials) as of ``signed_at`` (default now):
    status, headers (lower-case names, a repeated header's values in a list), JSON body."""
    host = endpoint.split("//", 1)[1]
    raw = json.dumps(body).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"DynamoDB_20120810.{op}"}
    when = time.gmtime(time.time() if signed_at is None else signed_at)
    headers.update(sign(lambda s, d: signing_key(s, d, "us-east-1"), "testing", "testing", "us-east-1", host,
                        headers, raw, when))
    h, p = host.rsplit(":", 1)
    conn = http.client.HTTPConnection(h, int(p), timeout=30)
    try:
        conn.request("POST", "/", raw, headers)
        resp = conn.getresponse()
        data = resp.read()
        got: dict = {}
        for k, v in resp.getheaders():
            k = k.lower()
            got[k] = [got[k], v] if k in got and not isinstance(got[k], list) else (got[k] + [v] if k in got else v)
    finally:
        conn.close()
    return resp.status, got, json.loads(data or b"{}")


def client(endpoint: str, retry: RetryPolicy = FAST, read_timeout: float = 5.0) -> Dynamo:
    return Dynamo(endpoint_url=endpoint, region="us-east-1", retry=retry, connect_timeout=1, read_timeout=read_timeout)


def make_table(dynamo: Dynamo, name: str, sort: bool = False, gsi: str | None = None) -> None:
    """An on-demand table keyed ``pk`` (and ``sk``), with a GSI on ``gpk``/``gsk`` when ``gsi`` names it."""
    from reshard.aws.local import wait_active
    schema = [{"AttributeName": "pk", "KeyType": "HASH"}]
    attrs = [{"AttributeName": "pk", "AttributeType": "S"}]
    if sort:
        schema.append({"AttributeName": "sk", "KeyType": "RANGE"})
        attrs.append({"AttributeName": "sk", "AttributeType": "S"})
    kwargs: dict = {}
    if gsi:
        attrs += [{"AttributeName": "gpk", "AttributeType": "S"}, {"AttributeName": "gsk", "AttributeType": "S"}]
        kwargs["GlobalSecondaryIndexes"] = [{
            "IndexName": gsi, "KeySchema": [{"AttributeName": "gpk", "KeyType": "HASH"},
                                            {"AttributeName": "gsk", "KeyType": "RANGE"}],
            "Projection": {"ProjectionType": "ALL"}}]
    dynamo.call("create_table", TableName=name, KeySchema=schema, AttributeDefinitions=attrs,
                BillingMode="PAY_PER_REQUEST", **kwargs)
    wait_active(dynamo, name)


def get(dynamo: Dynamo, table: str, pk: str, **key) -> dict | None:
    """The item as it is now (a consistent read)."""
    k = {"pk": {"S": pk}, **{a: {"S": v} for a, v in key.items()}}
    return dynamo.call("get_item", TableName=table, Key=k, ConsistentRead=True).get("Item")
