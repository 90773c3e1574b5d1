"""An in-memory DynamoDB with the low-level boto3 client's surface.

Pass an instance as the ``client`` of :class:`reshard.aws.dynamo.Dynamo`: the real choke
point (retries, error translation, capacity accounting) then runs unchanged on top::

    db = MemoryDynamo()
    dynamo = Dynamo(db)

Every call runs under one lock, so calls are linearizable in the order they take it;
an *interceptor* (the scheduler of :mod:`tests.model.scheduler`) sees every call before
it runs (``before(op, kwargs)``, where an actor thread can be held back) and after
(``after(op, kwargs, response, error)``, for the trace).

Items are stored in wire format (``{"S": ...}``); numbers are normalized as DynamoDB and
dynalite do (``"1.50"`` -> ``"1.5"``, ``"1e3"`` -> ``"1000"``; more than 38 digits refused). Failures
are botocore ``ClientError``s with DynamoDB's error codes. The README in this folder
lists what is and is not supported.
"""

from __future__ import annotations

import copy
import decimal
import hashlib
import itertools
import math
import threading
import time
from decimal import Decimal
from types import SimpleNamespace
from typing import Any, Callable

import botocore.exceptions
from email.utils import formatdate

from reshard.aws.signing import SIGN_DATE
from reshard.core.deadlines import SIGNATURE_WINDOW_SECONDS, amz_date
from tests.model import expressions as ex
from tests.model.expressions import Context, ExprError, vtype

_WIDE = decimal.Context(prec=200)
MAX_ITEM_BYTES = 400 * 1024
MAX_PAGE_BYTES = 1024 * 1024
_OPERATION_NAMES = {
    "create_table": "CreateTable", "describe_table": "DescribeTable", "delete_table": "DeleteTable",
    "list_tables": "ListTables", "put_item": "PutItem", "get_item": "GetItem", "update_item": "UpdateItem",
    "delete_item": "DeleteItem", "query": "Query", "scan": "Scan", "batch_write_item": "BatchWriteItem",
    "batch_get_item": "BatchGetItem", "describe_time_to_live": "DescribeTimeToLive",
    "update_time_to_live": "UpdateTimeToLive",
}


# --------------------------------------------------------------------------- values


def normalize(v: Any, where: str = "") -> dict:
    """Validate one request AttributeValue and return an independent copy (binary as bytes)."""
    if not isinstance(v, dict) or len(v) != 1:
        raise ExprError(f"Supplied AttributeValue has more than one datatypes set, must contain exactly one of the "
                        f"supported datatypes{where}" if isinstance(v, dict) and v else
                        f"Supplied AttributeValue is empty, must contain exactly one of the supported datatypes{where}")
    t, x = next(iter(v.items()))
    if t == "S":
        if not isinstance(x, str):
            raise ExprError(f"Invalid S value{where}")
        return {"S": x}
    if t == "N":
        return {"N": _number(x)}
    if t == "B":
        return {"B": _bytes(x)}
    if t == "BOOL":
        return {"BOOL": bool(x)}
    if t == "NULL":
        if x is not True:
            raise ExprError(f"One or more parameter values were invalid: Null attribute value types must have the "
                            f"value of true{where}")
        return {"NULL": True}
    if t in ("SS", "NS", "BS"):
        items = list(x)
        if not items:
            kind = {"SS": "string", "NS": "number", "BS": "binary"}[t]
            raise ExprError(f"One or more parameter values were invalid: An {kind} set  may not be empty{where}")
        if t == "NS":
            items = [_number(i) for i in items]
            keys = [Decimal(i) for i in items]
        elif t == "BS":
            items = [_bytes(i) for i in items]
            keys = items
        else:
            keys = items
        if len(set(keys)) != len(keys):
            raise ExprError(f"One or more parameter values were invalid: Input collection {items} contains "
                            f"duplicates.{where}")
        return {t: items}
    if t == "L":
        return {"L": [normalize(i, where) for i in x]}
    if t == "M":
        return {"M": {k: normalize(i, where) for k, i in x.items()}}
    raise ExprError(f"Supplied AttributeValue has an unsupported datatype {t}{where}")


def _number(x: Any) -> str:
    """A number as DynamoDB (and dynalite) store it: checked, in plain notation, no trailing zeros."""
    try:
        d = Decimal(str(x))
        if not d.is_finite():
            raise decimal.InvalidOperation
    except decimal.InvalidOperation:
        raise ExprError(f"The parameter cannot be converted to a numeric value: {x}") from None
    if d == 0:
        return "0"
    _, digits, exp = d.normalize(_WIDE).as_tuple()
    e = len(digits) - 1 + exp
    if e > 125:
        raise ExprError("Number overflow. Attempting to store a number with magnitude larger than supported range")
    if e < -130:
        raise ExprError("Number underflow. Attempting to store a number with magnitude smaller than supported range")
    if len(digits) > 38:
        raise ExprError("Attempting to store more than 38 significant digits in a Number")
    return format(d.normalize(_WIDE), "f")


def _bytes(x: Any) -> bytes:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        return x.encode("utf-8")  # what botocore sends for a str given as a blob
    raise ExprError("Invalid B value")


def value_size(v: dict) -> int:
    t, x = next(iter(v.items()))
    if t == "S":
        return len(x.encode("utf-8"))
    if t == "N":
        digits = Decimal(x).normalize(_WIDE).as_tuple().digits
        return (len(digits) + 1) // 2 + 1
    if t == "B":
        return len(x)
    if t in ("BOOL", "NULL"):
        return 1
    if t == "SS":
        return sum(len(i.encode("utf-8")) for i in x)
    if t == "NS":
        return sum(value_size({"N": i}) for i in x)
    if t == "BS":
        return sum(len(i) for i in x)
    if t == "L":
        return 3 + sum(1 + value_size(i) for i in x)
    return 3 + sum(1 + len(k.encode("utf-8")) + value_size(i) for k, i in x.items())


def item_size(item: dict) -> int:
    return sum(len(k.encode("utf-8")) + value_size(v) for k, v in item.items())


def _num_to_buffer(text: str) -> bytes:
    """dynalite's numToBuffer (db/index.js): the bytes it hashes for a number hash key."""
    d = Decimal(text)
    if d == 0:
        return bytes([0x80])
    sign, digits, exp = d.normalize(_WIDE).as_tuple()
    scale = -1 if sign else 1
    mantissa = list(digits)
    exponent = len(digits) + exp  # Big.js e + 1
    append_zero = 1 if exponent % 2 else 0
    length = (len(mantissa) + append_zero + 1) // 2
    if length < 20 and scale == -1:
        arr: list = [None] * (length + 2)
        arr[length + 1] = 102
    else:
        arr = [None] * (length + 1)
    arr[0] = (exponent + append_zero) // 2 - 64
    if scale == -1:
        arr[0] = ~arr[0]
    appended, i = False, 0
    while i < len(mantissa):
        idx = (i + append_zero) // 2 + 1
        if append_zero and i == 0 and not appended:
            arr[idx] = 0
            appended = True
            i -= 1
        elif (i + append_zero) % 2 == 0:
            arr[idx] = mantissa[i] * 10
        else:
            arr[idx] += mantissa[i]
        if ((i + append_zero) % 2) or i == len(mantissa) - 1:
            if i >= 0:
                arr[idx] = 101 - arr[idx] if scale == -1 else arr[idx] + 1
        i += 1
    return bytes((b or 0) & 0xFF for b in arr)


def hash_prefix(v: dict) -> str:
    """dynalite's hashPrefix: six hex digits of md5("Outliers" + hash key) -- the scan order and the
    parallel-scan split (segment = first three hex digits * TotalSegments // 4096)."""
    t = vtype(v)
    raw = v["S"].encode("utf-8") if t == "S" else bytes(v["B"]) if t == "B" else _num_to_buffer(v["N"])
    return hashlib.md5(b"Outliers" + raw).hexdigest()[:6]


def http_date(epoch: float) -> str:
    """The HTTP ``Date`` header of an answer (RFC 7231, whole seconds: the fraction is cut)."""
    return formatdate(math.floor(epoch), usegmt=True)


def segment_of(prefix: str, total: int) -> int:
    return int(prefix[:3], 16) * total // 4096


def _check_table_name(name: Any) -> None:
    import re
    if not isinstance(name, str) or not 3 <= len(name) <= 255:
        raise ExprError("TableName must be at least 3 characters long and at most 255 characters long")
    if not re.fullmatch(r"[a-zA-Z0-9_.-]+", name):
        raise ExprError(f"1 validation error detected: Value '{name}' at 'tableName' failed to satisfy constraint: "
                        "Member must satisfy regular expression pattern: [a-zA-Z0-9_.-]+")


def _parameters(fn) -> frozenset:
    import inspect
    cached = _PARAMS.get(fn.__name__)
    if cached is None:
        cached = _PARAMS[fn.__name__] = frozenset(inspect.signature(fn).parameters)
    return cached


_PARAMS: dict[str, frozenset] = {}


# --------------------------------------------------------------------------- tables


class Index:
    def __init__(self, name: str, hash_attr: str, range_attr: str | None, projection: dict):
        self.name, self.hash, self.range, self.projection = name, hash_attr, range_attr, projection

    @property
    def attrs(self) -> list[str]:
        return [a for a in (self.hash, self.range) if a]


class Table:
    def __init__(self, name: str, hash_attr: str, range_attr: str | None, types: dict, request: dict,
                 indexes: list[Index], created: float):
        self.name = name
        self.hash, self.range = hash_attr, range_attr
        self.types = types
        self.request = request
        self.indexes = {i.name: i for i in indexes}
        self.created = created
        self.items: dict[tuple, dict] = {}
        self.ttl: dict = {"TimeToLiveStatus": "DISABLED"}

    @property
    def key_attrs(self) -> list[str]:
        return [a for a in (self.hash, self.range) if a]

    def key_of(self, item: dict, *, exact: bool, in_item: bool = False) -> tuple:
        """The storage key of an item or a Key; ValidationException like DynamoDB's."""
        if exact and set(item) != set(self.key_attrs):
            raise ExprError("The provided key element does not match the schema")
        out = []
        for a in self.key_attrs:
            v = item.get(a)
            if v is None:
                raise ExprError(f"One or more parameter values were invalid: Missing the key {a} in the item"
                                if in_item else "The provided key element does not match the schema")
            if vtype(v) != self.types[a]:
                raise ExprError(f"One or more parameter values were invalid: Type mismatch for key {a} expected: "
                                f"{self.types[a]} actual: {vtype(v)}")
            if vtype(v) in ("S", "B") and len(v[vtype(v)]) == 0:
                raise ExprError("One or more parameter values are not valid. The AttributeValue for a key attribute "
                                f"cannot contain an empty {'string' if vtype(v) == 'S' else 'binary'} value. Key: {a}")
            limit = 2048 if a == self.hash else 1024
            if value_size(v) > limit:
                raise ExprError(f"One or more parameter values were invalid: Size of {'hashkey' if a == self.hash else 'rangekey'} "
                                f"has exceeded the maximum size limit of{limit} bytes")
            out.append(ex.sort_value(v))
        return tuple(out)

    def check_item(self, item: dict, update: bool = False) -> None:
        for idx in self.indexes.values():
            for a in idx.attrs:
                v = item.get(a)
                if v is not None and vtype(v) != self.types[a]:
                    raise ExprError(f"One or more parameter values were invalid: Type mismatch for Index Key {a} "
                                    f"Expected: {self.types[a]} Actual: {vtype(v)} IndexName: {idx.name}")
        if item_size(item) > MAX_ITEM_BYTES:
            raise ExprError("Item size to update has exceeded the maximum allowed size" if update
                            else "Item size has exceeded the maximum allowed size")

    def scan_order(self, item: dict) -> tuple:
        return (hash_prefix(item[self.hash]),) + tuple(ex.sort_value(item[a]) for a in self.key_attrs)

    def describe(self, status: str = "ACTIVE") -> dict:
        out = {
            "TableName": self.name, "TableStatus": status,
            "KeySchema": [{"AttributeName": self.hash, "KeyType": "HASH"}]
            + ([{"AttributeName": self.range, "KeyType": "RANGE"}] if self.range else []),
            "AttributeDefinitions": [{"AttributeName": a, "AttributeType": t} for a, t in self.types.items()],
            "ItemCount": len(self.items),
            "TableSizeBytes": sum(item_size(i) for i in self.items.values()),
            "CreationDateTime": self.created,
            "TableArn": f"arn:aws:dynamodb:us-east-1:000000000000:table/{self.name}",
            "BillingModeSummary": {"BillingMode": self.request.get("BillingMode", "PROVISIONED")},
        }
        if self.indexes:
            out["GlobalSecondaryIndexes"] = [
                {"IndexName": i.name, "IndexStatus": "ACTIVE", "Projection": i.projection,
                 "KeySchema": [{"AttributeName": i.hash, "KeyType": "HASH"}]
                 + ([{"AttributeName": i.range, "KeyType": "RANGE"}] if i.range else [])}
                for i in self.indexes.values()]
        return out


# --------------------------------------------------------------------------- the client


class MemoryDynamo:
    """The DynamoDB low-level client surface, in memory, one call at a time."""

    def __init__(self, region: str = "us-east-1", interceptor=None, clock: Callable[[], float] = time.time):
        # A call lands at once; a nominal bound for the jobs' time fence (Dynamo.attempt_seconds).
        self.meta = SimpleNamespace(endpoint_url="memory://dynamodb", region_name=region,
                                    config=SimpleNamespace(connect_timeout=0.5, read_timeout=0.5))
        self.tables: dict[str, Table] = {}
        self.lock = threading.RLock()
        self.interceptor = interceptor
        self.clock = clock
        #: Fault injectors: ``fn(operation, kwargs) -> error code or None`` (a code -> ClientError, 500 for
        #: server-side codes), consulted before each call runs. For throttles and 5xx in model tests.
        self.faults: list[Callable[[str, dict], str | None]] = []
        self.calls = 0
        self._request_ids = itertools.count(1)
        #: How far a request's SigV4 date may be from the server's clock (DynamoDB: 5 minutes,
        #: observed). A request signed with a chosen date (``reshard.aws.signing.SIGN_DATE``, set
        #: by ``Dynamo.call(horizon=...)``) is refused when it arrives further from ``clock()``
        #: than this; a request with no chosen date is signed "now" and always passes. None: not
        #: enforced (a server like dynalite or moto).
        self.signature_window: float | None = SIGNATURE_WINDOW_SECONDS
        #: False: answers carry no ``Date`` header (a server or proxy that sends none): the
        #: product then has no server time to date by (``Dynamo.answer_date()`` is None).
        self.send_date = True

    # -- the boto3 method surface
    def create_table(self, **kw): return self._call("create_table", kw)
    def describe_table(self, **kw): return self._call("describe_table", kw)
    def delete_table(self, **kw): return self._call("delete_table", kw)
    def list_tables(self, **kw): return self._call("list_tables", kw)
    def put_item(self, **kw): return self._call("put_item", kw)
    def get_item(self, **kw): return self._call("get_item", kw)
    def update_item(self, **kw): return self._call("update_item", kw)
    def delete_item(self, **kw): return self._call("delete_item", kw)
    def query(self, **kw): return self._call("query", kw)
    def scan(self, **kw): return self._call("scan", kw)
    def batch_write_item(self, **kw): return self._call("batch_write_item", kw)
    def batch_get_item(self, **kw): return self._call("batch_get_item", kw)
    def describe_time_to_live(self, **kw): return self._call("describe_time_to_live", kw)
    def update_time_to_live(self, **kw): return self._call("update_time_to_live", kw)

    # -- helpers for tests (no interception)
    def items(self, table: str) -> list[dict]:
        """Every item of a table (deep copies), in key order."""
        with self.lock:
            t = self._table(table)
            return [copy.deepcopy(t.items[k]) for k in sorted(t.items)]

    def expire_ttl(self, now: float) -> int:
        """Delete items whose TTL attribute (enabled tables) is a number <= ``now``; returns the count."""
        n = 0
        with self.lock:
            for t in self.tables.values():
                attr = t.ttl.get("AttributeName") if t.ttl.get("TimeToLiveStatus") == "ENABLED" else None
                if not attr:
                    continue
                for k, item in list(t.items.items()):
                    v = item.get(attr)
                    if vtype(v) == "N" and Decimal(v["N"]) <= Decimal(str(now)):
                        del t.items[k]
                        n += 1
        return n

    # -- dispatch
    def _call(self, op: str, kwargs: dict) -> dict:
        # The date the request is signed with: read on the caller's thread (Dynamo.call sets it
        # around the attempt), so it travels with the request if the interceptor holds it.
        sign = SIGN_DATE.get()
        hook = self.interceptor
        fate = None
        if hook is not None:
            fate = hook.before(op, kwargs)
        if fate == "hold":
            # The interceptor keeps the request to deliver it later (:meth:`deliver`); the
            # caller's connection times out, as a request lost in the network does.
            err = self.timeout()
            hook.after(op, kwargs, None, err)
            raise err
        resp, err = None, None
        try:
            resp = self.deliver(op, kwargs, sign)
        except botocore.exceptions.ClientError as e:
            err = e
            raise
        finally:
            if hook is not None:
                hook.after(op, kwargs, resp, err)
        if fate == "lose":
            raise self.timeout()  # the request was applied; its answer never arrives
        return resp

    def timeout(self) -> botocore.exceptions.BotoCoreError:
        """What a client sees when an answer never comes (retryable, as botocore's)."""
        return botocore.exceptions.ReadTimeoutError(endpoint_url=self.meta.endpoint_url)

    def deliver(self, op: str, kwargs: dict, sign: float | None = None) -> dict:
        """Apply one request now, signed ``sign`` (epoch seconds; None: "now"), as the server
        does when it arrives: the signature's age is checked against the server's clock at
        this moment. No interception (the scheduler calls this for a held request)."""
        now = self.clock()
        try:
            with self.lock:
                self.calls += 1
                now = self.clock()
                self._check_signature(sign, now)
                for fault in self.faults:
                    code = fault(op, kwargs)
                    if code:
                        raise ExprError(f"injected {code}", code)
                fn = getattr(self, "_" + op)
                unknown = set(kwargs) - _parameters(fn)
                if unknown:
                    raise ExprError(f"memory dynamo: {op} does not support {sorted(unknown)}")
                resp = fn(**copy.deepcopy(kwargs))
            resp.setdefault("ResponseMetadata", {"RequestId": f"mem-{next(self._request_ids)}",
                                                 "HTTPStatusCode": 200, "RetryAttempts": 0})
            resp["ResponseMetadata"]["HTTPHeaders"] = {"date": http_date(now)} if self.send_date else {}
            return resp
        except ExprError as e:
            raise self._client_error(op, e, now) from None

    def _check_signature(self, sign: float | None, now: float) -> None:
        """DynamoDB's refusal of a request signed too long before (or after) its own clock."""
        window = self.signature_window
        if sign is None or window is None:
            return
        if now - sign > window:
            raise ExprError(f"Signature expired: {amz_date(sign)} is now earlier than {amz_date(now - window)} "
                            f"({amz_date(now)} - {window / 60:g} min.)", "InvalidSignatureException")
        if sign - now > window:
            raise ExprError(f"Signature not yet current: {amz_date(sign)} is still later than "
                            f"{amz_date(now + window)} ({amz_date(now)} + {window / 60:g} min.)",
                            "InvalidSignatureException")

    def _client_error(self, op: str, e: ExprError, now: float | None = None) -> botocore.exceptions.ClientError:
        status = 500 if e.code in ("InternalServerError", "InternalFailure", "ServiceUnavailable") else 400
        response = {"Error": {"Code": e.code, "Message": e.message},
                    "ResponseMetadata": {"RequestId": f"mem-{next(self._request_ids)}", "HTTPStatusCode": status,
                                         "HTTPHeaders": {"date": http_date(self.clock() if now is None else now)}
                                         if self.send_date else {}}}
        if getattr(e, "item", None) is not None:
            response["Item"] = e.item
        return botocore.exceptions.ClientError(response, _OPERATION_NAMES.get(op, op))

    def _table(self, name: str) -> Table:
        _check_table_name(name)
        t = self.tables.get(name)
        if t is None:
            raise ExprError("Requested resource not found", "ResourceNotFoundException")
        return t

    # -- expressions of one request
    @staticmethod
    def _context(names, values, *expressions) -> Context:
        if names is not None and not names:
            raise ExprError("ExpressionAttributeNames must not be empty")
        if values is not None and not values:
            raise ExprError("ExpressionAttributeValues must not be empty")
        if not any(expressions):
            if names:
                raise ExprError("ExpressionAttributeNames can only be specified when using expressions")
            if values:
                raise ExprError("ExpressionAttributeValues can only be specified when using expressions")
        vals = {k: normalize(v, f" for key {k}") for k, v in (values or {}).items()}
        return Context(names, vals)

    @staticmethod
    def _capacity(table: str, units: float, mode: str | None) -> dict:
        if mode not in ("TOTAL", "INDEXES"):
            return {}
        cc = {"TableName": table, "CapacityUnits": float(units)}
        if mode == "INDEXES":
            cc["Table"] = {"CapacityUnits": float(units)}
        return {"ConsumedCapacity": cc}

    @staticmethod
    def _write_units(*items) -> float:
        return float(max(1, max(math.ceil(item_size(i) / 1024) for i in items if i is not None)
                         if any(i is not None for i in items) else 1))

    @staticmethod
    def _read_units(size: int, consistent: bool) -> float:
        return max(1, math.ceil(size / 4096)) * (1.0 if consistent else 0.5)

    @staticmethod
    def _check_return_values(rv: str | None, allowed: tuple) -> str:
        rv = rv or "NONE"
        if rv not in allowed:
            raise ExprError("Return values set to invalid value" if rv not in
                            ("NONE", "ALL_OLD", "UPDATED_OLD", "ALL_NEW", "UPDATED_NEW")
                            else f"ReturnValues can only be {' or '.join(allowed)} on this operation")
        return rv

    @staticmethod
    def _condition_failed(old: dict | None, on_failure: str | None) -> ExprError:
        e = ExprError("The conditional request failed", "ConditionalCheckFailedException")
        if on_failure == "ALL_OLD" and old:
            e.item = copy.deepcopy(old)
        return e

    # -- tables
    def _create_table(self, TableName, KeySchema, AttributeDefinitions, BillingMode=None, ProvisionedThroughput=None,
                      GlobalSecondaryIndexes=None, LocalSecondaryIndexes=None, StreamSpecification=None,
                      SSESpecification=None, Tags=None, TableClass=None, DeletionProtectionEnabled=None):
        _check_table_name(TableName)
        if LocalSecondaryIndexes:
            raise ExprError("memory dynamo: local secondary indexes are not supported")
        if TableName in self.tables:
            raise ExprError(f"Table already exists: {TableName}", "ResourceInUseException")
        types = {a["AttributeName"]: a["AttributeType"] for a in AttributeDefinitions}

        def schema(ks):
            h = [k["AttributeName"] for k in ks if k["KeyType"] == "HASH"]
            r = [k["AttributeName"] for k in ks if k["KeyType"] == "RANGE"]
            if len(h) != 1 or len(r) > 1:
                raise ExprError("Invalid KeySchema: Some index key attribute have no definition")
            for a in h + r:
                if a not in types:
                    raise ExprError("One or more parameter values were invalid: Some index key attributes are not "
                                    "defined in AttributeDefinitions. Keys: [" + a + "], AttributeDefinitions: ["
                                    + ", ".join(types) + "]")
            return h[0], (r[0] if r else None)

        h, r = schema(KeySchema)
        indexes = []
        for g in GlobalSecondaryIndexes or []:
            gh, gr = schema(g["KeySchema"])
            indexes.append(Index(g["IndexName"], gh, gr, g.get("Projection", {"ProjectionType": "ALL"})))
        used = {h, r} | {a for i in indexes for a in i.attrs}
        if set(types) - used:
            raise ExprError("One or more parameter values were invalid: Number of attributes in KeySchema does not "
                            "exactly match number of attributes defined in AttributeDefinitions")
        t = Table(TableName, h, r, types, {"BillingMode": BillingMode or "PROVISIONED"}, indexes, self.clock())
        self.tables[TableName] = t
        return {"TableDescription": t.describe("ACTIVE")}

    def _describe_table(self, TableName):
        return {"Table": self._table(TableName).describe()}

    def _delete_table(self, TableName):
        t = self._table(TableName)
        del self.tables[TableName]
        return {"TableDescription": t.describe("DELETING")}

    def _list_tables(self, ExclusiveStartTableName=None, Limit=None):
        names = sorted(n for n in self.tables if ExclusiveStartTableName is None or n > ExclusiveStartTableName)
        out = {"TableNames": names[:Limit] if Limit else names}
        if Limit and len(names) > Limit:
            out["LastEvaluatedTableName"] = names[Limit - 1]
        return out

    def _describe_time_to_live(self, TableName):
        return {"TimeToLiveDescription": dict(self._table(TableName).ttl)}

    def _update_time_to_live(self, TableName, TimeToLiveSpecification):
        t = self._table(TableName)
        spec = TimeToLiveSpecification
        if spec.get("Enabled"):
            if t.ttl.get("TimeToLiveStatus") == "ENABLED":
                raise ExprError("TimeToLive is already enabled")
            t.ttl = {"TimeToLiveStatus": "ENABLED", "AttributeName": spec["AttributeName"]}
        else:
            if t.ttl.get("TimeToLiveStatus") != "ENABLED":
                raise ExprError("TimeToLive is already disabled")
            t.ttl = {"TimeToLiveStatus": "DISABLED"}
        return {"TimeToLiveSpecification": {"Enabled": bool(spec.get("Enabled")),
                                            "AttributeName": spec["AttributeName"]}}

    # -- single-item writes
    def _put_item(self, TableName, Item, ConditionExpression=None, ExpressionAttributeNames=None,
                  ExpressionAttributeValues=None, ReturnValues=None, ReturnConsumedCapacity=None,
                  ReturnItemCollectionMetrics=None, ReturnValuesOnConditionCheckFailure=None):
        t = self._table(TableName)
        rv = self._check_return_values(ReturnValues, ("NONE", "ALL_OLD"))
        ctx = self._context(ExpressionAttributeNames, ExpressionAttributeValues, ConditionExpression)
        cond = ex.parse_condition(ConditionExpression, ctx) if ConditionExpression else None
        ctx.check_unused()
        item = {k: normalize(v, f" for key {k}") for k, v in Item.items()}
        key = t.key_of(item, exact=False, in_item=True)
        t.check_item(item)
        old = t.items.get(key)
        if cond is not None and not ex.evaluate(cond, old or {}):
            raise self._condition_failed(old, ReturnValuesOnConditionCheckFailure)
        t.items[key] = item
        out = self._capacity(TableName, self._write_units(old, item), ReturnConsumedCapacity)
        if rv == "ALL_OLD" and old:
            out["Attributes"] = copy.deepcopy(old)
        return out

    def _delete_item(self, TableName, Key, ConditionExpression=None, ExpressionAttributeNames=None,
                     ExpressionAttributeValues=None, ReturnValues=None, ReturnConsumedCapacity=None,
                     ReturnItemCollectionMetrics=None, ReturnValuesOnConditionCheckFailure=None):
        t = self._table(TableName)
        rv = self._check_return_values(ReturnValues, ("NONE", "ALL_OLD"))
        ctx = self._context(ExpressionAttributeNames, ExpressionAttributeValues, ConditionExpression)
        cond = ex.parse_condition(ConditionExpression, ctx) if ConditionExpression else None
        ctx.check_unused()
        key = t.key_of({k: normalize(v) for k, v in Key.items()}, exact=True)
        old = t.items.get(key)
        if cond is not None and not ex.evaluate(cond, old or {}):
            raise self._condition_failed(old, ReturnValuesOnConditionCheckFailure)
        t.items.pop(key, None)
        out = self._capacity(TableName, self._write_units(old), ReturnConsumedCapacity)
        if rv == "ALL_OLD" and old:
            out["Attributes"] = old
        return out

    def _update_item(self, TableName, Key, UpdateExpression=None, ConditionExpression=None,
                     ExpressionAttributeNames=None, ExpressionAttributeValues=None, ReturnValues=None,
                     ReturnConsumedCapacity=None, ReturnItemCollectionMetrics=None,
                     ReturnValuesOnConditionCheckFailure=None):
        t = self._table(TableName)
        rv = self._check_return_values(ReturnValues, ("NONE", "ALL_OLD", "UPDATED_OLD", "ALL_NEW", "UPDATED_NEW"))
        ctx = self._context(ExpressionAttributeNames, ExpressionAttributeValues, ConditionExpression,
                            UpdateExpression)
        clauses = ex.parse_update(UpdateExpression, ctx) if UpdateExpression is not None else {}
        cond = ex.parse_condition(ConditionExpression, ctx) if ConditionExpression else None
        ctx.check_unused()
        ex.check_overlaps(clauses)
        for path in ex.targets(clauses):
            if path[0] in t.key_attrs:
                raise ExprError(f"One or more parameter values were invalid: Cannot update attribute {path[0]}. "
                                "This attribute is part of the key")
        key_item = {k: normalize(v) for k, v in Key.items()}
        key = t.key_of(key_item, exact=True)
        old = t.items.get(key)
        if cond is not None and not ex.evaluate(cond, old or {}):
            raise self._condition_failed(old, ReturnValuesOnConditionCheckFailure)
        base = old if old is not None else copy.deepcopy(key_item)
        new = ex.apply_update(base, clauses)
        t.check_item(new, update=True)
        t.items[key] = new
        out = self._capacity(TableName, self._write_units(old, new), ReturnConsumedCapacity)
        paths = [("path", p) for p in ex.targets(clauses)]
        attrs = {"NONE": None, "ALL_OLD": old, "ALL_NEW": new,
                 "UPDATED_OLD": ex.project(old, paths) if old else None,
                 "UPDATED_NEW": ex.project(new, paths)}[rv]
        if attrs:
            out["Attributes"] = copy.deepcopy(attrs)
        return out

    # -- single-item read
    def _get_item(self, TableName, Key, ConsistentRead=False, ProjectionExpression=None,
                  ExpressionAttributeNames=None, ReturnConsumedCapacity=None, AttributesToGet=None):
        if AttributesToGet is not None:
            raise ExprError("memory dynamo: AttributesToGet (legacy) is not supported; use ProjectionExpression")
        t = self._table(TableName)
        ctx = self._context(ExpressionAttributeNames, None, ProjectionExpression)
        proj = ex.parse_projection(ProjectionExpression, ctx) if ProjectionExpression else None
        ctx.check_unused()
        key = t.key_of({k: normalize(v) for k, v in Key.items()}, exact=True)
        item = t.items.get(key)
        out = self._capacity(TableName, self._read_units(item_size(item) if item else 0, bool(ConsistentRead)),
                             ReturnConsumedCapacity)
        if item is not None:
            out["Item"] = ex.project(item, proj) if proj else item
        return out

    # -- query and scan
    def _key_condition(self, text: str, ctx: Context, hash_attr: str, range_attr: str | None, types: dict):
        node = ex.parse_condition(text, ctx, "KeyConditionExpression")
        leaves, stack = [], [node]
        while stack:
            n = stack.pop()
            if n[0] == "and":
                stack += [n[2], n[1]]
            else:
                leaves.append(n)
        conds: dict[str, tuple] = {}
        for leaf in leaves:
            if leaf[0] == "cmp" and leaf[1] != "<>" and leaf[2][0] == "path" and leaf[3][0] == "value":
                path, vals = leaf[2][1], [leaf[3][1]]
            elif leaf[0] == "between" and leaf[1][0] == "path" and leaf[2][0] == leaf[3][0] == "value":
                path, vals = leaf[1][1], [leaf[2][1], leaf[3][1]]
            elif leaf[0] == "func" and leaf[1] == "begins_with" and leaf[2][0][0] == "path" \
                    and leaf[2][1][0] == "value":
                path, vals = leaf[2][0][1], [leaf[2][1][1]]
            else:
                raise ExprError("Invalid operator used in KeyConditionExpression: "
                                + {"or": "OR", "not": "NOT", "in": "IN"}.get(leaf[0], leaf[0]))
            if len(path) != 1 or path[0] not in (hash_attr, range_attr):
                raise ExprError(f"Query condition missed key schema element: {hash_attr}"
                                if len(path) == 1 else "KeyConditionExpressions cannot have conditions on nested "
                                                       "attributes")
            if path[0] in conds:
                raise ExprError("KeyConditionExpressions must only contain one condition per key")
            for v in vals:
                if vtype(v) != types[path[0]]:
                    raise ExprError("One or more parameter values were invalid: Condition parameter type does not "
                                    "match schema type")
            if leaf[0] == "func" and types[path[0]] not in ("S", "B"):
                raise ExprError(f"Invalid KeyConditionExpression: Incorrect operand type for operator or function; "
                                f"operator or function: begins_with, operand type: {types[path[0]]}")
            conds[path[0]] = leaf
        if hash_attr not in conds:
            raise ExprError(f"Query condition missed key schema element: {hash_attr}")
        if conds[hash_attr][0] != "cmp" or conds[hash_attr][1] != "=":
            raise ExprError("Query key condition not supported")
        return conds[hash_attr][3][1], conds.get(range_attr)

    def _source(self, t: Table, index_name: str | None, consistent: bool):
        """(hash attr, range attr, key attrs of a LastEvaluatedKey, items) of the table or a GSI."""
        if index_name is None:
            return t.hash, t.range, t.key_attrs, list(t.items.values())
        idx = t.indexes.get(index_name)
        if idx is None:
            raise ExprError(f"The table does not have the specified index: {index_name}")
        if consistent:
            raise ExprError("Consistent reads are not supported on global secondary indexes")
        items = [i for i in t.items.values() if all(a in i for a in idx.attrs)]
        keys = list(dict.fromkeys(idx.attrs + t.key_attrs))
        return idx.hash, idx.range, keys, items

    def _page(self, TableName, ordered, key_attrs, ctx_filter, proj, Limit, Select, consistent, capacity):
        if Limit is not None and Limit < 1:
            raise ExprError("1 validation error detected: Value '0' at 'limit' failed to satisfy constraint: "
                            "Member must have value greater than or equal to 1")
        if Select not in (None, "ALL_ATTRIBUTES", "COUNT", "SPECIFIC_ATTRIBUTES", "ALL_PROJECTED_ATTRIBUTES"):
            raise ExprError("Select must be one of ALL_ATTRIBUTES, ALL_PROJECTED_ATTRIBUTES, SPECIFIC_ATTRIBUTES, "
                            "COUNT")
        evaluated, size, last = [], 0, None
        for item in ordered:
            if (Limit is not None and len(evaluated) >= Limit) or size >= MAX_PAGE_BYTES:
                break
            evaluated.append(item)
            size += item_size(item)
            last = item
        out: dict[str, Any] = {}
        if ((Limit is not None and len(evaluated) >= Limit) or size >= MAX_PAGE_BYTES) and last is not None:
            out["LastEvaluatedKey"] = {a: copy.deepcopy(last[a]) for a in key_attrs}
        items = [i for i in evaluated if ctx_filter is None or ex.evaluate(ctx_filter, i)]
        if proj:
            items = [ex.project(i, proj) for i in items]
        out["Count"] = len(items)
        out["ScannedCount"] = len(evaluated)
        if Select != "COUNT":
            out["Items"] = copy.deepcopy(items)
        out.update(self._capacity(TableName, self._read_units(size, consistent), capacity))
        return out

    def _query(self, TableName, KeyConditionExpression=None, IndexName=None, FilterExpression=None,
               ProjectionExpression=None, ExpressionAttributeNames=None, ExpressionAttributeValues=None,
               ScanIndexForward=True, Limit=None, ExclusiveStartKey=None, ConsistentRead=False, Select=None,
               ReturnConsumedCapacity=None):
        t = self._table(TableName)
        if not KeyConditionExpression:
            raise ExprError("Either the KeyConditions or KeyConditionExpression parameter must be specified in the "
                            "request.")
        consistent = bool(ConsistentRead)
        hash_attr, range_attr, lek_attrs, items = self._source(t, IndexName, consistent)
        ctx = self._context(ExpressionAttributeNames, ExpressionAttributeValues, KeyConditionExpression,
                            FilterExpression, ProjectionExpression)
        hash_value, range_cond = self._key_condition(KeyConditionExpression, ctx, hash_attr, range_attr, t.types)
        filt = ex.parse_condition(FilterExpression, ctx, "FilterExpression") if FilterExpression else None
        proj = ex.parse_projection(ProjectionExpression, ctx) if ProjectionExpression else None
        ctx.check_unused()
        if filt is not None:
            for p in ex.paths_of(filt):
                if p[0] in (hash_attr, range_attr):
                    raise ExprError(f"Filter Expression can only contain non-primary key attributes: Primary key "
                                    f"attribute: {p[0]}")
        hv = ex.sort_value(hash_value)
        part = [i for i in items if ex.sort_value(i[hash_attr]) == hv]
        if range_cond is not None:
            part = [i for i in part if range_attr in i and ex.evaluate(range_cond, i)]

        def order(i):
            return ((ex.sort_value(i[range_attr]) if range_attr else b""),) + \
                tuple(ex.sort_value(i[a]) for a in t.key_attrs)

        part.sort(key=order, reverse=not ScanIndexForward)
        if ExclusiveStartKey:
            esk = self._start_key(t, ExclusiveStartKey, lek_attrs)
            pos = order(esk)
            part = [i for i in part if (order(i) > pos if ScanIndexForward else order(i) < pos)]
        return self._page(TableName, part, lek_attrs, filt, proj, Limit, Select, consistent, ReturnConsumedCapacity)

    @staticmethod
    def _start_key(t: Table, esk: dict, attrs: list[str]) -> dict:
        esk = {k: normalize(v) for k, v in esk.items()}
        if set(esk) != set(attrs):
            raise ExprError("The provided starting key is invalid: The provided key element does not match the schema")
        t.key_of({a: esk[a] for a in t.key_attrs}, exact=True)
        return esk

    def _scan(self, TableName, IndexName=None, FilterExpression=None, ProjectionExpression=None,
              ExpressionAttributeNames=None, ExpressionAttributeValues=None, Limit=None, ExclusiveStartKey=None,
              Segment=None, TotalSegments=None, ConsistentRead=False, Select=None, ReturnConsumedCapacity=None):
        t = self._table(TableName)
        consistent = bool(ConsistentRead)
        hash_attr, range_attr, lek_attrs, items = self._source(t, IndexName, consistent)
        ctx = self._context(ExpressionAttributeNames, ExpressionAttributeValues, FilterExpression,
                            ProjectionExpression)
        filt = ex.parse_condition(FilterExpression, ctx, "FilterExpression") if FilterExpression else None
        proj = ex.parse_projection(ProjectionExpression, ctx) if ProjectionExpression else None
        ctx.check_unused()
        if (Segment is None) != (TotalSegments is None):
            raise ExprError("The Segment parameter is required but was not present in the request when parameter "
                            "TotalSegments is present" if Segment is None else
                            "The TotalSegments parameter is required but was not present in the request when "
                            "Segment parameter is present")
        if TotalSegments is not None:
            if not 1 <= TotalSegments <= 1000000:
                raise ExprError(f"1 validation error detected: Value '{TotalSegments}' at 'totalSegments' failed to "
                                "satisfy constraint: Member must have value less than or equal to 1000000")
            if not 0 <= Segment < TotalSegments:
                raise ExprError(f"The Segment parameter is zero-based and must be less than parameter TotalSegments: "
                                f"Segment: {Segment} is not less than TotalSegments: {TotalSegments}")

        def order(i):
            return (hash_prefix(i[hash_attr]), ex.sort_value(i[hash_attr])) + \
                ((ex.sort_value(i[range_attr]),) if range_attr else ()) + \
                tuple(ex.sort_value(i[a]) for a in t.key_attrs)

        if TotalSegments and TotalSegments > 1:
            items = [i for i in items if segment_of(hash_prefix(i[hash_attr]), TotalSegments) == Segment]
        items.sort(key=order)
        if ExclusiveStartKey:
            esk = self._start_key(t, ExclusiveStartKey, lek_attrs)
            if TotalSegments and TotalSegments > 1 and \
                    segment_of(hash_prefix(esk[hash_attr]), TotalSegments) != Segment:
                raise ExprError("The provided starting key is invalid: Invalid ExclusiveStartKey. Please use "
                                f"ExclusiveStartKey with correct Segment. TotalSegments: {TotalSegments} "
                                f"Segment: {Segment}")
            pos = order(esk)
            items = [i for i in items if order(i) > pos]
        return self._page(TableName, items, lek_attrs, filt, proj, Limit, Select, consistent, ReturnConsumedCapacity)

    # -- batches
    def _batch_write_item(self, RequestItems, ReturnConsumedCapacity=None, ReturnItemCollectionMetrics=None):
        n = sum(len(v) for v in RequestItems.values())
        if n == 0:
            raise ExprError("1 validation error detected: Value at 'requestItems' failed to satisfy constraint: "
                            "Map value must satisfy constraint: Member must have length greater than or equal to 1")
        if n > 25:
            raise ExprError("Too many items requested for the BatchWriteItem call")
        plan = []
        for name, requests in RequestItems.items():
            t = self._table(name)
            seen = set()
            for r in requests:
                if len(r) != 1 or next(iter(r)) not in ("PutRequest", "DeleteRequest"):
                    raise ExprError("Supplied AttributeValue has more than one datatypes set, must contain exactly "
                                    "one of the supported datatypes")
                if "PutRequest" in r:
                    item = {k: normalize(v, f" for key {k}") for k, v in r["PutRequest"]["Item"].items()}
                    key = t.key_of(item, exact=False, in_item=True)
                    t.check_item(item)
                    plan.append((t, key, item))
                else:
                    key = t.key_of({k: normalize(v) for k, v in r["DeleteRequest"]["Key"].items()}, exact=True)
                    plan.append((t, key, None))
                if key in seen:
                    raise ExprError("Provided list of item keys contains duplicates")
                seen.add(key)
        units: dict[str, float] = {}
        for t, key, item in plan:  # all validated first: a batch is refused whole or applied whole
            old = t.items.get(key)
            units[t.name] = units.get(t.name, 0.0) + self._write_units(old, item)
            if item is None:
                t.items.pop(key, None)
            else:
                t.items[key] = item
        out: dict[str, Any] = {"UnprocessedItems": {}}
        if ReturnConsumedCapacity in ("TOTAL", "INDEXES"):
            out["ConsumedCapacity"] = [{"TableName": k, "CapacityUnits": v} for k, v in units.items()]
        return out

    def _batch_get_item(self, RequestItems, ReturnConsumedCapacity=None):
        n = sum(len(v.get("Keys", [])) for v in RequestItems.values())
        if n > 100:
            raise ExprError("Too many items requested for the BatchGetItem call")
        if n == 0:
            raise ExprError("1 validation error detected: Value at 'requestItems' failed to satisfy constraint: "
                            "Member must have length greater than or equal to 1")
        responses: dict[str, list] = {}
        caps = []
        for name, req in RequestItems.items():
            t = self._table(name)
            unknown = set(req) - {"Keys", "ConsistentRead", "ProjectionExpression", "ExpressionAttributeNames"}
            if unknown:
                raise ExprError(f"memory dynamo: unsupported BatchGetItem parameters {sorted(unknown)}")
            ctx = self._context(req.get("ExpressionAttributeNames"), None, req.get("ProjectionExpression"))
            proj = ex.parse_projection(req["ProjectionExpression"], ctx) if req.get("ProjectionExpression") else None
            ctx.check_unused()
            keys = [t.key_of({k: normalize(v) for k, v in key.items()}, exact=True) for key in req["Keys"]]
            if len(set(keys)) != len(keys):
                raise ExprError("Provided list of item keys contains duplicates")
            found = [t.items[k] for k in keys if k in t.items]
            responses[name] = copy.deepcopy([ex.project(i, proj) if proj else i for i in found])
            size = sum(item_size(i) for i in found)
            caps.append({"TableName": name, "CapacityUnits":
                         sum(self._read_units(item_size(i), bool(req.get("ConsistentRead"))) for i in found) or
                         self._read_units(size, bool(req.get("ConsistentRead")))})
        out: dict[str, Any] = {"Responses": responses, "UnprocessedKeys": {}}
        if ReturnConsumedCapacity in ("TOTAL", "INDEXES"):
            out["ConsumedCapacity"] = caps
        return out
