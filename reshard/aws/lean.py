"""A lean request path for DynamoDB's single-item writes, used by :class:`reshard.aws.dynamo.Dynamo`.

Why: the fenced copy and the cleanup send one conditional write per item, and boto3
spends about 1 ms of client CPU per request on its event system, user-agent building,
request model walking and urllib3 (issue 16's profile), so a copy was CPU-bound far below
what the table could take. This path builds the same JSON request itself (orjson when
installed), signs it with Signature Version 4 (:func:`sign`, checked against botocore's
``SigV4Auth`` in ``tests/unit/test_lean.py``), and sends it on a keep-alive connection per
thread with a minimal HTTP/1.1 exchange (``http.client`` parses every answer's headers with
the ``email`` package: a third of this path's CPU).

What it keeps (it is *not* a second client): :meth:`Dynamo.call` still owns the retries,
the ``guard=`` before every attempt, error translation, throttle reports and consumed
capacity; this module raises exactly what botocore raises (``ClientError`` with the same
``Error``/``ResponseMetadata`` shape, botocore's connection and timeout exceptions), and
it emits botocore's ``before-send`` and ``after-call`` events on the client, so hooks that
tests and moto register keep working (a ``before-send`` answer is used as the response).

Where it is used: for PutItem, DeleteItem and UpdateItem whose answer carries no
attribute values (no ``ReturnValues``), for GetItem and BatchGetItem (the shim's reads:
issue 14's overhead goals), for Scan (the jobs' pages: botocore's shape walk was most of
verify's client CPU per item, issue 16) and Query (the control table's segment and run rows,
read every page; the shim's fan-out), whose answers are turned into botocore's shapes by
:func:`_decode_binaries` (B and BS values base64-decoded to bytes, everything else is
already what botocore's JSON parser returns); only on a client whose endpoint, credentials
and hooks it understands (:func:`lean_sender`); anything else goes through botocore unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import socket
import ssl
import threading
import time
import zlib
from urllib.parse import urlsplit

import botocore.exceptions
from botocore.awsrequest import AWSPreparedRequest

from reshard.aws.signing import SIGN_DATE

try:  # a faster encoder when installed; the standard one otherwise
    import orjson

    def _dumps(obj) -> bytes:
        try:
            return orjson.dumps(obj, default=_binary)
        except TypeError:  # a lone surrogate, which orjson refuses: escaped as botocore's json does
            return json.dumps(obj, default=_binary, separators=(",", ":")).encode()

    def _loads(content: bytes):
        try:
            return orjson.loads(content)
        except ValueError:  # e.g. an escaped lone surrogate: the standard parser takes it, as botocore's
            return json.loads(content)
except ImportError:  # pragma: no cover - orjson is optional
    def _dumps(obj) -> bytes:
        return json.dumps(obj, default=_binary, separators=(",", ":")).encode()

    _loads = json.loads

class UnreadableAnswer(botocore.exceptions.BotoCoreError):
    """An answer that is no DynamoDB answer: a 2xx body neither JSON parser reads or that is no
    JSON object (``[]``, ``123``), or one past the bounds below. Retried like a dropped
    connection (Dynamo.call), then reported; never an empty page, never a raw TypeError."""
    fmt = "unreadable {operation} answer ({size} bytes): {why}"


#: What a server's answer may be, at most (the path trusts no server: a proxy, a stub, a
#: compromised endpoint). DynamoDB's largest answer is a 16 MB BatchGetItem.
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_HEADER_LINE_BYTES = 8 * 1024
MAX_HEADERS = 100
MAX_HEAD_BYTES = 64 * 1024


#: botocore snake_case name -> DynamoDB operation.
OPERATIONS = {"put_item": "PutItem", "delete_item": "DeleteItem", "update_item": "UpdateItem",
              "get_item": "GetItem", "batch_get_item": "BatchGetItem", "scan": "Scan",
              "query": "Query"}
#: Reads: their answers carry attribute values (see :func:`_decode_binaries`).
_READS = frozenset({"GetItem", "BatchGetItem", "Scan", "Query"})
#: A B or BS type tag in an answer's JSON (a quote inside a string value is escaped, so
#: ``"B":`` there is a map key: a type tag, or an attribute named B, which decoding walks
#: past correctly); without one, the answer has no binary value to decode.
_BINARY_TAG = re.compile(rb'"BS?"\s*:')
_TARGET = "DynamoDB_20120810."
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


#: The events of botocore's call path that this path does not emit (it emits before-send and
#: after-call): a handler of anyone but botocore on one of them (a tracer's, such as Sentry's
#: ``request-created``; an app's ``before-call``) sends the call through botocore instead.
_SKIPPED_STEPS = ("provide-client-params", "before-parameter-build", "before-call", "request-created",
                  "before-sign", "after-call-error")
_STOCK: list = []


def _stock_handlers() -> frozenset:
    """botocore's own handlers (and those a library such as moto adds to its built-in list)."""
    if not _STOCK:
        from botocore.handlers import BUILTIN_HANDLERS
        _STOCK.append(frozenset(h[1] for h in BUILTIN_HANDLERS))
    return _STOCK[0]


def _stock(handler) -> bool:
    """A handler botocore (or boto3) registers itself: its built-in list, the client's request
    signer on ``request-created``, its retry handlers."""
    if handler in _stock_handlers():
        return True
    module = getattr(handler, "__module__", None) or ""
    return module.split(".", 1)[0] in ("botocore", "boto3")


#: (class, attribute) that tracers wrap in place -- X-Ray's ``patch(["botocore"])``, OpenTelemetry's
#: ``BotocoreInstrumentor``, Datadog's ``patch(botocore=True)`` all wrap ``BaseClient._make_api_call``
#: (a span per call) and ``Endpoint.prepare_request`` (the trace header), with wrapt; no event.
_TRACED = (("botocore.client", "BaseClient", "_make_api_call"), ("botocore.endpoint", "Endpoint", "prepare_request"))


_TRACED_CLASSES: list = []


def _call_path(client) -> tuple:
    """The functions botocore's call path runs for ``client`` now (what a tracer replaces); read
    on every request (a few dict lookups): a tracer may patch after the shim was built."""
    if not _TRACED_CLASSES:
        import importlib
        _TRACED_CLASSES.extend((getattr(importlib.import_module(m), c).__dict__, a) for m, c, a in _TRACED)
    (call_dict, call), (prepare_dict, prepare) = _TRACED_CLASSES
    # a subclass of the app's, or a per-instance wrap, counts too
    return (call_dict.get(call), prepare_dict.get(prepare), type(client).__dict__.get("_make_api_call"),
            client.__dict__.get("_make_api_call"))


def _botocore_own(fn) -> bool:
    """``fn`` is a plain function whose code is botocore's (``type()``, not ``isinstance``: wrapt's
    proxies pass isinstance checks, and ``functools.wraps`` copies ``__module__``, not the code)."""
    import types

    import botocore
    return type(fn) is types.FunctionType and fn.__code__.co_filename.startswith(os.path.dirname(botocore.__file__))


def traced(client) -> bool:
    """Whether something wraps botocore's call path for ``client`` (a tracer): such a wrapper
    sees only requests sent through ``client._make_api_call``, never this path's."""
    base_call, base_prepare, own_class, own_instance = _call_path(client)
    return own_class is not None or own_instance is not None or not (_botocore_own(base_call)
                                                                      and _botocore_own(base_prepare))


def _binary(value):
    """orjson/json hook: a B value (bytes) goes on the wire as base64, as botocore sends it."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


class _Response:
    """What we read (the shape of what a ``before-send`` hook may return): status, headers, body."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers, content: bytes):
        self.status_code = status_code
        self.headers = headers
        self.content = content


def lean_sender(client, *, connect_timeout: float, read_timeout: float) -> "LeanSender | None":
    """A lean sender for ``client``, or None where the lean path would not do the same as
    botocore (proxies configured, TLS verification off, an endpoint that is not plain
    http(s), retries in adaptive mode, or ``RESHARD_LEAN=0``)."""
    if os.environ.get("RESHARD_LEAN", "1") == "0" or any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    try:
        meta = client.meta
        cfg = meta.config
        if getattr(cfg, "proxies", None) or meta.service_model.service_name != "dynamodb":
            return None
        if (getattr(cfg, "retries", None) or {}).get("mode") == "adaptive":
            # Adaptive mode's rate limiter learns from botocore's needs-retry event, which this
            # path does not emit: an app's adaptive client keeps botocore's path throughout.
            return None
        url = urlsplit(meta.endpoint_url)
        if url.scheme not in ("http", "https") or (url.path not in ("", "/")) or url.query:
            return None
        credentials = client._request_signer._credentials  # refreshed by botocore when they expire
        verify = getattr(client._endpoint.http_session, "_verify", True)
    except AttributeError:  # a botocore that is built differently: stay on the ordinary path
        return None
    if credentials is None or verify is False:
        return None
    return LeanSender(client, url.scheme, url.hostname, url.port, credentials, verify=verify,
                      connect_timeout=connect_timeout, read_timeout=read_timeout)


class LeanSender:
    """Sends one single-item write; thread-safe (one keep-alive connection per thread)."""

    def __init__(self, client, scheme: str, host: str, port: int | None, credentials, *,
                 verify: bool | str = True, connect_timeout: float, read_timeout: float):
        self.client = client
        self.events = client.meta.events
        self.region = client.meta.region_name
        self.scheme, self.host = scheme, host
        self.port = port or (443 if scheme == "https" else 80)
        # The Host header as botocore signs it: the port only when it is not the scheme's default.
        self.host_header = host if port in (None, 443 if scheme == "https" else 80) else f"{host}:{port}"
        self.url = f"{scheme}://{self.host_header}/"
        self.credentials = credentials
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        try:  # botocore's own string (it carries the app id, AWS_SDK_UA_APP_ID), built once
            agent = client._user_agent_creator.to_string() + " reshard-lean"
        except AttributeError:
            agent = f"{client.meta.config.user_agent or 'Botocore'} reshard-lean"
        # The app's user_agent_extra is its text: a CR/LF there must not start a header of its own.
        self.user_agent = _CONTROL.sub(" ", agent)
        #: How long one attempt may take in all (connect, send, the whole answer): the
        #: attempt bound the census and the job fences assume (Dynamo.attempt_seconds).
        self.attempt_seconds = connect_timeout + read_timeout
        self._local = threading.local()
        self._keys: dict = {}
        self._ssl = None
        if scheme == "https":
            from botocore.httpsession import get_cert_path  # the CA bundle botocore would use
            self._ssl = ssl.create_default_context(cafile=verify if isinstance(verify, str) else get_cert_path(True))
        self._emitter = getattr(self.events, "_emitter", self.events)
        self._decided: dict = {}
        #: Serve calls through botocore while a tracer wraps its call path (:func:`traced`); False
        #: for reshard's own background requests (the shim's control refresh), which no
        #: application trace contains.
        self.yield_to_tracers = True

    def _only_stock_hooks(self, op: str) -> bool:
        """Hooks on the steps this path skips (parameters, before-call, request-created, ...)
        may rewrite a call, answer it or trace it: with any beyond botocore's own, the call goes
        the ordinary way."""
        for step in _SKIPPED_STEPS:
            for handler in self._emitter._handlers.prefix_search(f"{step}.dynamodb.{op}"):
                if not _stock(handler):
                    return False
        return True

    def handles(self, operation: str, kwargs: dict) -> bool:
        op = OPERATIONS.get(operation)
        if op is None or kwargs.get("ReturnValues", "NONE") != "NONE" or "ReturnValuesOnConditionCheckFailure" in kwargs:
            return False
        try:
            # botocore replaces its lookup cache on every (un)register: the same cache object,
            # the same hooks as when we last looked (holding it keeps its identity unique).
            cache = self._emitter._lookup_cache
            path = _call_path(self.client) if self.yield_to_tracers else ()
            known = self._decided.get(op)
            # Compared by identity: a wrapt proxy compares equal to the function it wraps.
            if known is not None and known[0] is cache and len(known[1]) == len(path) \
                    and all(a is b for a, b in zip(known[1], path)):
                return known[2]
            # A tracer that wraps botocore's call path sees only calls made through it: the
            # application's requests then go that way (docs/shim.md, "The lean path and tracing").
            ok = self._only_stock_hooks(op) and not (self.yield_to_tracers and traced(self.client))
            self._decided[op] = (cache, path, ok)
            return ok
        except AttributeError:
            return False

    # -- one request
    def send(self, operation: str, kwargs: dict) -> dict:
        op = OPERATIONS[operation]
        body = _dumps(kwargs)
        creds = self.credentials.get_frozen_credentials()  # botocore refreshes expiring ones
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": _TARGET + op}
        if creds.token:
            if _CONTROL.search(creds.token):
                # Written raw it would end the header; the value itself is never shown.
                raise botocore.exceptions.HTTPClientError(error="the session token holds a control character "
                                                                "(a line break?): no request sent")
            headers["X-Amz-Security-Token"] = creds.token
        when = SIGN_DATE.get()  # a horizon's date (reshard/aws/signing.py), else now
        headers.update(sign(self._signing_key, creds.access_key, creds.secret_key, self.region, self.host_header,
                            headers, body, time.gmtime() if when is None else time.gmtime(when)))
        headers["User-Agent"] = self.user_agent
        answered = None
        request = AWSPreparedRequest("POST", self.url, headers, body, False)
        for _, response in self.events.emit(f"before-send.dynamodb.{op}", request=request):
            if response is not None:  # a hook answered (a test's fault, moto): as botocore does
                answered = response
                break
        if answered is None:
            answered = self._roundtrip(headers, body)
        status = answered.status_code
        content = answered.content or b""
        rid = answered.headers.get("x-amzn-requestid") or answered.headers.get("x-amzn-RequestId")
        meta = {"RequestId": rid, "HTTPStatusCode": status, "HTTPHeaders": dict(answered.headers), "RetryAttempts": 0}
        try:
            parsed = _loads(content) if content else {}
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            if status < 300:
                # Never an empty page: a job would take it for the end of its segment.
                raise UnreadableAnswer(operation=op, size=len(content), why="not a JSON object")
            parsed = {}
        if status >= 300 or "__type" in parsed:
            code = str(parsed.get("__type", "")).rpartition("#")[2] or str(status)
            message = parsed.get("message") or parsed.get("Message") or ""
            error = {"Code": code, "Message": message if isinstance(message, str) else str(message)}
            parsed = self._modeled_error(code, status, answered.headers, content) if len(parsed) > 2 else {}
            parsed.update(Error=error, ResponseMetadata=meta)
        else:
            if op in _READS and _BINARY_TAG.search(content):  # no B/BS tag in the text: nothing to decode
                _decode_answer(parsed)
            parsed["ResponseMetadata"] = meta
        self.events.emit(f"after-call.dynamodb.{op}", http_response=answered, parsed=parsed,
                         model=self.client.meta.service_model.operation_model(op), context={})
        if "Error" in parsed:  # the modeled class, as botocore raises it (ConditionalCheckFailedException, ...)
            raise self.client.exceptions.from_code(parsed["Error"]["Code"])(parsed, op)
        return parsed

    def _modeled_error(self, code: str, status: int, headers, content: bytes) -> dict:
        """The error's modeled members (``ThrottlingReasons``, a failed condition's ``Item``), as
        botocore adds them to the response of the exception it raises (``Endpoint._add_modeled_error_fields``)."""
        try:
            shape = self.client.meta.service_model.shape_for_error_code(code)
            if shape is None:
                return {}
            return dict(self.client._response_parser.parse(
                {"status_code": status, "headers": dict(headers), "body": content}, shape))
        except Exception:  # noqa: BLE001 - a botocore built differently: the Error alone, as before
            return {}

    def _signing_key(self, secret: str, date: str) -> bytes:
        key = self._keys.get((secret, date))
        if key is None:
            key = signing_key(secret, date, self.region)
            self._keys = {(secret, date): key}  # one day's key; replaced whole (thread-safe)
        return key

    def _roundtrip(self, headers: dict, body: bytes) -> _Response:
        # One deadline for the whole attempt, not a timeout per read: an answer trickling in a
        # byte at a time must not outlast the attempt bound the fences count on.
        deadline = time.monotonic() + self.attempt_seconds
        sock, reader = self._connection()
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        data = (f"POST / HTTP/1.1\r\nHost: {self.host_header}\r\n{head}Content-Length: {len(body)}\r\n\r\n"
                .encode("latin-1") + body)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(data)
            reader.deadline = deadline
            status, answer_headers, content = _read_response(reader)
        except socket.timeout as e:
            self._drop()
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=self.url, error=e) from e
        except _TooLarge as e:
            self._drop()
            raise UnreadableAnswer(operation=headers.get("X-Amz-Target", "").rpartition(".")[2], size="?",
                                   why=str(e)) from None
        except (OSError, ValueError) as e:
            self._drop()
            raise botocore.exceptions.ConnectionClosedError(endpoint_url=self.url, error=e) from e
        if answer_headers.get("connection", "").lower() == "close" or reader.buffered():
            self._drop()  # closing, or bytes after the answer: nothing more is read from it
        crc = answer_headers.get("x-amz-crc32")
        if crc is not None and status < 300 and (not crc.isdigit() or int(crc) != zlib.crc32(content)):
            # botocore retries a damaged answer; so do we (a dropped connection is retried).
            self._drop()
            raise botocore.exceptions.ConnectionClosedError(endpoint_url=self.url, error="CRC32 mismatch")
        return _Response(status, answer_headers, content)

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is not None and _dropped(conn[0]):
            self._drop()  # the server closed the idle keep-alive connection: a fresh one
            conn = None
        if conn is None:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
            except socket.timeout as e:
                raise botocore.exceptions.ConnectTimeoutError(endpoint_url=self.url, error=e) from e
            except OSError as e:
                raise botocore.exceptions.EndpointConnectionError(endpoint_url=self.url, error=e) from e
            try:
                if self._ssl is not None:
                    sock = self._ssl.wrap_socket(sock, server_hostname=self.host)
                sock.settimeout(self.read_timeout)  # connected: from now on, every send and read
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except OSError as e:
                sock.close()
                raise botocore.exceptions.EndpointConnectionError(endpoint_url=self.url, error=e) from e
            conn = self._local.conn = (sock, _Reader(sock))
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn[0].close()


def _decode_answer(parsed: dict) -> None:
    """A GetItem/BatchGetItem/Scan/Query answer's attribute values as botocore parses them (in place)."""
    for name in ("Item", "LastEvaluatedKey"):
        item = parsed.get(name)
        if item:
            _decode_binaries(item)
    for item in parsed.get("Items") or ():
        _decode_binaries(item)
    for items in (parsed.get("Responses") or {}).values():
        for item in items:
            _decode_binaries(item)
    for req in (parsed.get("UnprocessedKeys") or {}).values():  # re-sent by Dynamo.batch_get
        for key in req.get("Keys") or ():
            _decode_binaries(key)


def _decode_binaries(item: dict) -> None:
    """botocore's JSON parser turns the ``blob`` members of AttributeValue (``B``, each of
    ``BS``) into bytes; every other member is a string, bool, list or map as JSON has it.
    Walks ``{name: AttributeValue}`` in place (an AttributeValue has one type tag)."""
    _decode_values(item.values())


def _decode_values(values) -> None:
    for value in values:
        if "B" in value:
            value["B"] = base64.b64decode(value["B"])
        elif "BS" in value:
            value["BS"] = [base64.b64decode(b) for b in value["BS"]]
        elif "M" in value:
            _decode_values(value["M"].values())
        elif "L" in value:
            _decode_values(value["L"])


def signing_key(secret: str, date: str, region: str) -> bytes:
    """SigV4's derived key for one day, region and DynamoDB."""
    key = ("AWS4" + secret).encode()
    for part in (date, region, "dynamodb", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(key_for, access_key: str, secret: str, region: str, host: str, headers: dict, body: bytes,
         now: time.struct_time) -> dict:
    """The ``X-Amz-Date`` and ``Authorization`` headers of a POST to ``/`` (Signature Version 4,
    every header given signed, as botocore signs them). ``key_for(secret, date)``: the day's key."""
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", now)
    date = amz_date[:8]
    signed = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    signed["host"] = host
    signed["x-amz-date"] = amz_date
    names = sorted(signed)
    canonical = "\n".join(("POST", "/", "", "".join(f"{n}:{signed[n]}\n" for n in names), ";".join(names),
                           hashlib.sha256(body).hexdigest()))
    scope = f"{date}/{region}/dynamodb/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    signature = hmac.new(key_for(secret, date), to_sign.encode(), hashlib.sha256).hexdigest()
    return {"X-Amz-Date": amz_date,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, "
                             f"Signature={signature}"}


class _TooLarge(ValueError):
    """An answer past one of the bounds above (a clean error, never a MemoryError)."""


#: Characters no header value may carry raw (CR and LF above all).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Reader:
    """Reads one connection's answers under one deadline per attempt (:attr:`deadline`, set
    by the sender): every wait for bytes is given only the time left, so an answer that
    trickles in cannot outlast the attempt, however often a byte arrives."""

    __slots__ = ("sock", "buf", "deadline")

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.deadline = float("inf")

    def buffered(self) -> bool:
        return bool(self.buf)

    def _fill(self) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the answer did not arrive within the attempt's bound")
        self.sock.settimeout(left)
        data = self.sock.recv(262144)
        if not data:
            return False
        self.buf += data
        return True

    def head(self) -> list[bytes]:
        """The status line and the header lines of the next answer (line endings removed), read
        up to the blank line at most MAX_HEAD_BYTES in: one search of the buffer, not a read
        per line (the CPU of this path counts)."""
        start = 0
        while True:
            i = self.buf.find(b"\r\n\r\n", start)
            if i >= 0:
                end, sep = i, 4
                break
            i = self.buf.find(b"\n\n", start)  # a server ending its lines with LF alone
            if i >= 0:
                end, sep = i, 2
                break
            if len(self.buf) > MAX_HEAD_BYTES:
                raise _TooLarge(f"more than {MAX_HEAD_BYTES} bytes of headers")
            start = max(0, len(self.buf) - 3)
            if not self._fill():
                raise ConnectionResetError("the server closed the connection" if not self.buf
                                           else "the answer was cut short")
        if end > MAX_HEAD_BYTES:
            raise _TooLarge(f"more than {MAX_HEAD_BYTES} bytes of headers")
        block = bytes(self.buf[:end])
        del self.buf[:end + sep]
        return block.replace(b"\r\n", b"\n").split(b"\n")

    def readline(self, limit: int) -> bytes:
        """Up to and including the next LF; at most ``limit`` bytes (then what there is)."""
        start = 0
        while True:
            i = self.buf.find(b"\n", start)
            if i >= 0 or len(self.buf) >= limit:
                n = min(i + 1 if i >= 0 else limit, limit)
                line = bytes(self.buf[:n])
                del self.buf[:n]
                return line
            start = len(self.buf)
            if not self._fill():
                line = bytes(self.buf)
                self.buf.clear()
                return line

    def read(self, n: int) -> bytes:
        """``n`` bytes, or fewer if the connection ends first."""
        while len(self.buf) < n:
            if not self._fill():
                break
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def _line(reader, what: str) -> bytes:
    line = reader.readline(MAX_HEADER_LINE_BYTES + 1)
    if len(line) > MAX_HEADER_LINE_BYTES:
        raise _TooLarge(f"{what} longer than {MAX_HEADER_LINE_BYTES} bytes")
    return line


def _head_lines(reader) -> list[bytes]:
    """:meth:`_Reader.head` for any reader with ``readline`` (a file: the unit tests)."""
    lines, head = [], 0
    while True:
        line = _line(reader, "a header line")
        if not lines and not line:
            raise ConnectionResetError("the server closed the connection")
        if line in (b"\r\n", b"\n", b""):
            return lines
        head += len(line)
        if len(lines) > MAX_HEADERS or head > MAX_HEAD_BYTES:
            raise _TooLarge(f"more than {MAX_HEADERS} headers or {MAX_HEAD_BYTES} bytes of them")
        lines.append(line.rstrip(b"\r\n"))


def _read_response(reader) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 answer: status, headers (lower-case names), body (Content-Length or chunked).

    Bounded (the server is not trusted): a status line and each header line at most
    MAX_HEADER_LINE_BYTES, at most MAX_HEADERS headers and MAX_HEAD_BYTES in all, a body of at
    most MAX_BODY_BYTES (Content-Length digits only: ``-1`` or ``2**62`` is refused, never read
    to the end of the connection nor allocated)."""
    lines = reader.head() if isinstance(reader, _Reader) else _head_lines(reader)
    line = lines[0]
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise ValueError(f"not an HTTP answer: {line[:80]!r}")
    status = int(parts[1])
    if len(lines) > MAX_HEADERS + 1:
        raise _TooLarge(f"more than {MAX_HEADERS} headers")
    headers: dict = {}
    for line in lines:
        if len(line) > MAX_HEADER_LINE_BYTES:
            raise _TooLarge(f"a header line longer than {MAX_HEADER_LINE_BYTES} bytes")
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        total = 0
        while True:
            size_text = _line(reader, "a chunk size").split(b";", 1)[0].strip()
            if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
                raise ValueError(f"bad chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                while _line(reader, "a trailer") not in (b"\r\n", b"\n", b""):
                    pass
                break
            total += size
            if total > MAX_BODY_BYTES:
                raise _TooLarge(f"a body of more than {MAX_BODY_BYTES} bytes")
            chunk = reader.read(size)
            if len(chunk) != size:
                raise ConnectionResetError("the answer was cut short")
            chunks.append(chunk)
            _line(reader, "a chunk end")
        content = b"".join(chunks)
    else:
        text = headers.get("content-length", "0")
        if not text.isascii() or not text.isdigit() or len(text) > 20:
            raise ValueError(f"bad Content-Length {text[:20]!r}")
        length = int(text)
        if length > MAX_BODY_BYTES:
            raise _TooLarge(f"Content-Length {length}: more than {MAX_BODY_BYTES} bytes")
        content = reader.read(length) if length else b""
        if len(content) != length:
            raise ConnectionResetError("the answer was cut short")
    return status, headers, content


def _dropped(sock) -> bool:
    """An idle keep-alive socket that is readable was closed by the server (or has junk)."""
    from urllib3.util.wait import wait_for_read
    try:
        return wait_for_read(sock, timeout=0.0)
    except OSError:
        return True
