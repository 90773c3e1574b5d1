"""Record every DynamoDB request reshard sends, and judge each against an IAM policy.

The evaluator is small on purpose and refuses what it does not understand (an unknown
condition operator or key raises, never allows): Effect Allow/Deny, Action and Resource
with IAM's ``*``/``?`` wildcards, and ``ForAllValues:StringLike`` /
``ForAllValues:StringEquals`` on ``dynamodb:LeadingKeys``, with IAM's rules that an
explicit Deny wins, nothing matching is an implicit deny, and ``ForAllValues`` over a
request without keys (a Scan) is true.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

REGION, ACCOUNT = "us-east-1", "123456789012"

#: Known fake credentials, and what must never appear in any output (tests/functional/test_no_secrets.py).
KEY_ID = "AKIARESHARDFAKE7KEY0"
SECRET = "reShArd/FakeSecret+Value/0123456789abcdefXYZ"
TOKEN = "IQoJb3JpZ2luX2VjReshardFakeSessionToken//0123456789+abc="
FORBIDDEN = (KEY_ID, SECRET, TOKEN, SECRET[:12], TOKEN[:16], "Authorization", "X-Amz-Security-Token",
             "Signature=", "Credential=", "aws_secret_access_key", "aws_session_token")


def fake_credentials(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def leaks(text: str) -> list[tuple[str, str]]:
    """Each forbidden word found, with what surrounds it."""
    return [(w, text[max(0, text.find(w) - 200):text.find(w) + 50]) for w in FORBIDDEN if w in text]


@dataclass(frozen=True)
class Request:
    """One IAM authorisation: what a DynamoDB request asks for, per table."""

    role: str
    operation: str  # e.g. PutItem
    table: str
    index: str | None = None
    leading_keys: frozenset = field(default_factory=frozenset)

    @property
    def action(self) -> str:
        return f"dynamodb:{self.operation}"

    @property
    def resource(self) -> str:
        arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{self.table}"
        return f"{arn}/index/{self.index}" if self.index else arn

    def __str__(self) -> str:
        keys = f" keys {sorted(self.leading_keys)}" if self.leading_keys else ""
        return f"{self.role}: {self.operation} {self.table}{'/' + self.index if self.index else ''}{keys}"


def _wildcard(pattern: str, flags: int = 0) -> re.Pattern:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + r"\Z",
                      flags | re.DOTALL)


def _matches(patterns, value: str, flags: int = 0) -> bool:
    patterns = [patterns] if isinstance(patterns, str) else patterns
    return any(_wildcard(p, flags).match(value) for p in patterns)


def _condition(cond: dict, req: Request) -> bool:
    for operator, keys in cond.items():
        for key, values in keys.items():
            if key != "dynamodb:LeadingKeys":
                raise NotImplementedError(f"condition key {key}")
            values = [values] if isinstance(values, str) else values
            if operator == "ForAllValues:StringLike":
                ok = all(_matches(values, v) for v in req.leading_keys)
            elif operator == "ForAllValues:StringEquals":
                ok = all(v in values for v in req.leading_keys)
            else:
                raise NotImplementedError(f"condition operator {operator}")
            if not ok:
                return False
    return True


def _applies(st: dict, req: Request) -> bool:
    if "NotAction" in st or "NotResource" in st or "Principal" in st:
        raise NotImplementedError(f"statement element in {st}")
    return (_matches(st["Action"], req.action, re.IGNORECASE) and _matches(st["Resource"], req.resource)
            and _condition(st.get("Condition", {}), req))


def allowed(policy: dict, req: Request) -> bool:
    """IAM's decision for one request under one identity policy."""
    statements = policy["Statement"]
    if any(st["Effect"] == "Deny" and _applies(st, req) for st in statements):
        return False
    return any(st["Effect"] == "Allow" and _applies(st, req) for st in statements)


# --------------------------------------------------------------------------- the request's context

def _s(value: dict) -> str:
    return next(iter(value.values()))


def _query_keys(params: dict, hash_key: str) -> set[str]:
    names = params.get("ExpressionAttributeNames", {})
    values = params.get("ExpressionAttributeValues", {})
    for name, placeholder in re.findall(r"(#?[\w.-]+)\s*=\s*(:[\w]+)", params.get("KeyConditionExpression", "")):
        if names.get(name, name) == hash_key:
            return {_s(values[placeholder])}
    raise ValueError(f"no partition key in {params.get('KeyConditionExpression')!r}")


def requests_of(role: str, operation: str, params: dict, hash_keys: dict[str, str]) -> list[Request]:
    """The authorisations one API call needs (a batch call: one per table)."""
    def keys(table: str, key_dicts) -> frozenset:
        hk = hash_keys.get(table)
        if hk is None:
            return frozenset({"?unknown-table"})  # fails every LeadingKeys condition
        return frozenset(_s(k[hk]) for k in key_dicts)

    if operation == "BatchGetItem":
        return [Request(role, operation, t, None, keys(t, spec["Keys"])) for t, spec in params["RequestItems"].items()]
    if operation == "BatchWriteItem":
        return [Request(role, operation, t, None,
                        keys(t, [w.get("PutRequest", {}).get("Item") or w["DeleteRequest"]["Key"] for w in ws]))
                for t, ws in params["RequestItems"].items()]
    table = params["TableName"]
    lk: frozenset = frozenset()
    if operation in ("GetItem", "DeleteItem", "UpdateItem"):
        lk = keys(table, [params["Key"]])
    elif operation == "PutItem":
        lk = keys(table, [params["Item"]])
    elif operation == "Query":
        lk = frozenset(_query_keys(params, hash_keys[table])) if table in hash_keys else frozenset({"?"})
    elif operation not in ("Scan", "DescribeTable", "CreateTable", "DescribeTimeToLive", "UpdateTimeToLive"):
        raise NotImplementedError(f"operation {operation}")
    return [Request(role, operation, table, params.get("IndexName"), lk)]


class Recorder:
    """A botocore ``before-parameter-build`` hook on every client reshard makes while
    installed; each client is tagged with the role current when it was made (the CLI
    makes its client inside the command, the shim when it is constructed)."""

    def __init__(self):
        self.role = "?"
        #: What the test is calling now (a shim method's name): each request is tagged with it.
        self.method = ""
        self.calls: list[tuple[str, str, dict]] = []
        self.methods: list[str] = []
        self._lock = threading.Lock()

    def install(self, monkeypatch) -> None:
        import reshard.aws.dynamo as dynamo_module

        original = dynamo_module.make_client

        def make_client(*args, **kwargs):
            client = original(*args, **kwargs)
            role = self.role

            def hook(params, model, **_):
                with self._lock:
                    self.calls.append((role, model.name, _copy(params)))
                    self.methods.append(self.method)

            client.meta.events.register("before-parameter-build.dynamodb", hook)
            return client

        monkeypatch.setattr(dynamo_module, "make_client", make_client)

    def requests(self, hash_keys: dict[str, str]) -> list[Request]:
        with self._lock:
            calls = list(self.calls)
        return [r for role, op, params in calls for r in requests_of(role, op, params, hash_keys)]

    def by_method(self, table: str) -> dict[str, set[str]]:
        """The operations sent to ``table`` while each shim method ran (method -> operations)."""
        with self._lock:
            pairs = list(zip(self.methods, self.calls))
        out: dict[str, set[str]] = {}
        for method, (_, op, params) in pairs:
            if method and (params.get("TableName") == table or table in (params.get("RequestItems") or {})):
                out.setdefault(method, set()).add(op)
        return out


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
