"""HTTP/1.1 on the proxy's two sides, hand-parsed: requests in, answers out, answers from upstream.

Why by hand: ``http.server`` parses every head with the ``email`` package and ``http.client``
does the same for answers (tens of µs per request each); the proxy sits in front of every
request of a test or a chaos run and must not eat the client's CPU (the same reasoning as
``reshard/aws/lean.py`` and ``benchmarks/_null_server.py``). DynamoDB's protocol is small:
``POST /`` with a JSON body and ``Content-Length``, answers with ``Content-Length`` (chunked
answers from upstream are read too).
"""

from __future__ import annotations

import calendar
import email.utils
import itertools
import json
import re
import threading
import time
import zlib

try:
    import orjson

    def dumps(obj) -> bytes:
        return orjson.dumps(obj)

    def loads(raw: bytes):
        try:
            return orjson.loads(raw)
        except ValueError:  # e.g. an escaped lone surrogate: the standard parser takes it
            return json.loads(raw)
except ImportError:  # pragma: no cover - orjson is a dependency, but keep working without it
    def dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    loads = json.loads

#: The JSON type prefix of DynamoDB's own errors (throttles, validation, conditions).
DYNAMODB_ERROR = "com.amazonaws.dynamodb.v20120810#"
#: The prefix of errors raised by AWS's request layer before DynamoDB sees the request
#: (signatures, unknown operations), as DynamoDB answers them.
CORAL_ERROR = "com.amazon.coral.service#"
JSON_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "DynamoDB_20120810."

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 413: b"Request Entity Too Large",
            500: b"Internal Server Error", 502: b"Bad Gateway", 503: b"Service Unavailable"}


class Request:
    """One request as read from a client: method, path, head (raw bytes), body.

    Headers are looked up in the lower-cased head (``header``); the dict of them
    (``headers``, lower-case names) is built only when asked for. Forwarded unchanged, the
    request goes upstream as the client sent it (``raw``).
    """

    __slots__ = ("method", "path", "head", "low", "body", "_json", "_headers", "_raw", "op")

    def __init__(self, method: str, path: str, head: bytes, body: bytes, low: bytes | None = None,
                 raw: bytes | None = None):
        self.method, self.path, self.head, self.body = method, path, head, body
        self.low = head.lower() if low is None else low
        self._json = None
        self._headers = None
        self._raw = raw
        target = self.header(b"x-amz-target")
        self.op = target[len(TARGET_PREFIX):] if target.startswith(TARGET_PREFIX) else target.rpartition(".")[2]

    @classmethod
    def make(cls, headers: dict, body: bytes, method: str = "POST", path: str = "/") -> "Request":
        """A request built here (the proxy's own calls, tests): headers as a dict."""
        head = "".join(f"\r\n{k}: {v}" for k, v in headers.items()).encode("latin-1")
        return cls(method, path, head, body)

    def header(self, name: bytes) -> str:
        """The value of header ``name`` (lower-case bytes), or ""."""
        low = self.low
        j = low.find(b"\r\n" + name + b":")
        if j < 0:
            return ""
        j += len(name) + 3
        k = low.find(b"\r\n", j)
        return self.head[j:k if k >= 0 else len(low)].strip().decode("latin-1")

    @property
    def headers(self) -> dict:
        """Every header, lower-case names (built on first use)."""
        if self._headers is None:
            out = {}
            for line in self.head.split(b"\r\n")[1:]:
                name, _, value = line.decode("latin-1").partition(":")
                out[name.strip().lower()] = value.strip()
            self._headers = out
        return self._headers

    @property
    def json(self) -> dict:
        """The body, parsed once (an unreadable body reads as ``{}``: upstream refuses it)."""
        if self._json is None:
            self._json = _object(self.body)
        return self._json

    def with_body(self, req: dict) -> "Request":
        """The same request with another JSON body (a split batch, an added ReturnValues)."""
        out = Request(self.method, self.path, self.head, dumps(req), self.low)
        out._json = req
        return out

    def tables(self) -> list[str]:
        req = self.json
        name = req.get("TableName")
        if name is not None:
            return [name]
        return list(req.get("RequestItems") or ())

    def raw(self, host: str) -> bytes:
        """The request as sent upstream: as the client sent it (its signature untouched), with
        this body's Content-Length (dynalite and moto ignore Host)."""
        if self._raw is not None:
            return self._raw
        lines = [line for line in self.head.split(b"\r\n")[1:]
                 if line[:line.find(b":")].strip().lower() not in _HOP]
        return (f"{self.method} {self.path} HTTP/1.1\r\nhost: {host}\r\n".encode("latin-1") + b"\r\n".join(lines)
                + f"\r\ncontent-length: {len(self.body)}\r\n\r\n".encode("latin-1") + self.body)


def _object(body: bytes) -> dict:
    """A JSON object body, or ``{}`` for anything else (empty, unreadable, not an object)."""
    try:
        parsed = loads(body) if body else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


_HOP = frozenset({b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"expect", b"host"})


class Answer:
    """An answer for a client: status, header lines (bytes, each ending in CRLF, without
    Date/Content-Length/Connection: the proxy sets those), body."""

    __slots__ = ("status", "lines", "body", "_json", "close")

    def __init__(self, status: int, lines: bytes, body: bytes, close: bool = False):
        self.status, self.lines, self.body = status, lines, body
        self._json = None
        self.close = close  # upstream closes its connection after this answer

    @property
    def headers(self) -> list:
        out = []
        for line in self.lines.split(b"\r\n"):
            if line:
                name, _, value = line.decode("latin-1").partition(":")
                out.append((name.strip(), value.strip()))
        return out

    @property
    def json(self) -> dict:
        if self._json is None:
            self._json = _object(self.body)
        return self._json

    @property
    def code(self) -> str:
        """The error code (``__type`` after its ``#``), or "" for a success."""
        if self.status < 300 and b"__type" not in self.body[:200]:
            return ""
        return str(self.json.get("__type", "")).rpartition("#")[2] or str(self.status)

    def with_json(self, body: dict) -> "Answer":
        """The same answer with another JSON body (its CRC32 recomputed: botocore checks it)."""
        raw = dumps(body)
        lines = b"".join(line + b"\r\n" for line in self.lines.split(b"\r\n")
                         if line and not line.lower().startswith(b"x-amz-crc32:"))
        out = Answer(self.status, lines + b"x-amz-crc32: %d\r\n" % zlib.crc32(raw), raw)
        out._json = body
        return out

    def summary(self) -> dict:
        """What a test wants of a delivered request: status, code, message, body."""
        body = self.json
        return {"status": self.status, "code": self.code, "message": body.get("message", ""), "body": body}


_request_ids = itertools.count(1)


def request_id() -> str:
    """A request id shaped like DynamoDB's (52 upper-case letters and digits)."""
    return f"FIDELITY{next(_request_ids):044d}"


def aws_error(status: int, type_: str, message: str, **extra) -> Answer:
    """An error answer as DynamoDB sends it: ``{"__type": ..., "message": ...}`` plus members."""
    body = {"__type": type_, "message": message, **extra}
    out = json_answer(body, status)
    out._json = body
    return out


def json_answer(body, status: int = 200) -> Answer:
    raw = dumps(body)
    return Answer(status, (f"Content-Type: {JSON_TYPE}\r\nx-amzn-RequestId: {request_id()}\r\n"
                           f"x-amz-crc32: {zlib.crc32(raw)}\r\n").encode("latin-1"), raw)


# ------------------------------------------------------------------------------ reading
class Stream:
    """A socket read one HTTP message at a time, heads parsed as whole blocks (no readline)."""

    __slots__ = ("sock", "buf")

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _head(self) -> int | None:
        """The index of the CRLFCRLF ending the next head (reading until it is there); None at EOF."""
        buf = self.buf
        i = buf.find(b"\r\n\r\n")
        while i < 0:
            data = self.sock.recv(65536)
            if not data:
                if buf.strip():
                    raise ConnectionResetError("the message was cut short")
                return None
            buf += data
            i = buf.find(b"\r\n\r\n", max(0, len(buf) - len(data) - 3))
        return i

    def _body(self, start: int, length: int) -> bytes:
        buf = self.buf
        end = start + length
        while len(buf) < end:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionResetError("the message was cut short")
            buf += data
        body = bytes(buf[start:end])
        del buf[:end]
        return body

    def read_request(self) -> Request | None:
        """The next request of a client; None when the client closed the connection."""
        i = self._head()
        while i is not None and self.buf[:2] == b"\r\n":  # stray CRLFs between requests (RFC 7230 3.5)
            del self.buf[:2]
            i = self._head()
        if i is None:
            return None
        buf = self.buf
        first = buf.find(b"\r\n", 0, i + 2)
        parts = bytes(buf[:first]).split()
        if len(parts) < 3:
            raise ValueError(f"not an HTTP request: {bytes(buf[:80])!r}")
        head = bytes(buf[first:i])  # from the CRLF before the first header line
        low = head.lower()
        if b"\r\ntransfer-encoding:" in low:
            raise ValueError("chunked requests are not supported (DynamoDB clients send Content-Length)")
        end = i + 4 + _int_header(low, b"\r\ncontent-length:")
        while len(buf) < end:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionResetError("the request was cut short")
            buf += data
        raw = bytes(buf[:end])  # forwarded as it is, unless the proxy changes the body
        del buf[:end]
        return Request(parts[0].decode("latin-1"), parts[1].decode("latin-1"), head, raw[i + 4:], low, raw)

    def read_answer(self) -> Answer:
        """The next answer of upstream (Content-Length or chunked), without the headers the proxy sets."""
        i = self._head()
        if i is None:
            raise ConnectionResetError("upstream closed the connection")
        first = self.buf.find(b"\r\n", 0, i + 2)
        status_line = bytes(self.buf[:first])
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
        head = bytes(self.buf[first:i])
        low = head.lower()
        rest = _OWN_LINES.sub(b"", head)  # CRLF-led lines, or b"" when upstream sent only those
        lines = rest[2:] + b"\r\n" if rest else b""
        close = b"\r\nconnection: close" in low
        if b"\r\ntransfer-encoding: chunked" in low:
            del self.buf[:i + 4]
            body = self._chunked()
        else:
            body = self._body(i + 4, _int_header(low, b"\r\ncontent-length:"))
        return Answer(int(parts[1]), lines, body, close)

    def _chunked(self) -> bytes:
        chunks = []
        while True:
            j = self._line()
            size = int(bytes(self.buf[:j]).split(b";", 1)[0], 16)
            del self.buf[:j + 2]
            if size == 0:
                while self._line() != 0:  # trailers, up to the empty line
                    del self.buf[:self._line() + 2]
                del self.buf[:2]
                return b"".join(chunks)
            chunks.append(self._body(0, size))
            del self.buf[:2]

    def _line(self) -> int:
        j = self.buf.find(b"\r\n")
        while j < 0:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionResetError("the message was cut short")
            self.buf += data
            j = self.buf.find(b"\r\n")
        return j


def _int_header(low: bytes, name: bytes) -> int:
    j = low.find(name)
    if j < 0:
        return 0
    j += len(name)
    k = low.find(b"\r\n", j)
    return int(low[j:k if k >= 0 else len(low)].strip() or 0)


#: Header lines of upstream's answers the proxy replaces with its own (each with its leading CRLF).
_OWN_LINES = re.compile(rb"\r\n(?:content-length|connection|transfer-encoding|date|keep-alive)[ \t]*:[^\r]*",
                        re.IGNORECASE)


# ------------------------------------------------------------------------------ writing
def encode_answer(answer: Answer, date: str) -> bytes:
    """The bytes of ``answer`` for a client, with the proxy's ``Date`` and a Content-Length."""
    return b"HTTP/1.1 %d %s\r\n%sDate: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        answer.status, _REASONS.get(answer.status, b"Unknown"), answer.lines, date.encode(), len(answer.body),
        answer.body)


class HttpDate:
    """RFC 7231 ``Date`` values (``Thu, 27 Nov 2026 19:40:01 GMT``), formatted once per second."""

    def __init__(self):
        self._lock = threading.Lock()
        self._second = None
        self._text = ""

    def __call__(self, t: float) -> str:
        second = int(t)
        if second != self._second:
            text = email.utils.formatdate(second, usegmt=True)
            with self._lock:
                self._second, self._text = second, text
            return text
        return self._text


# ------------------------------------------------------------------------------ SigV4 dates
def amz_date(t: float) -> str:
    """``X-Amz-Date``'s format (basic ISO 8601, UTC): 20261127T193000Z."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def parse_amz_date(text: str) -> float | None:
    """Seconds since the epoch of an ``X-Amz-Date`` value; None when it is not one."""
    if len(text) != 16 or text[8] != "T" or text[15] != "Z":
        return None
    try:
        return float(calendar.timegm((int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[9:11]),
                                      int(text[11:13]), int(text[13:15]), 0, 0, 0)))
    except ValueError:
        return None


def signature_refusal(signed: str, signed_at: float, now: float, window: float) -> str | None:
    """AWS's refusal message for a request signed at ``signed_at`` reaching it at ``now``, or None.

    The shapes are the ones users quote from DynamoDB (and every SigV4 service):
    ``Signature expired: 20261127T193000Z is now earlier than 20261127T193501Z (20261127T194001Z - 5 min.)``
    and ``Signature not yet current: ... is still later than ... (... + 5 min.)``. A request
    dated exactly at the bound is accepted (the message says "earlier than"/"later than").
    """
    minutes = f"{window / 60:g}"
    now = float(int(now))  # AWS's messages are to the second, as X-Amz-Date is
    if signed_at < now - window:
        return (f"Signature expired: {signed} is now earlier than {amz_date(now - window)} "
                f"({amz_date(now)} - {minutes} min.)")
    if signed_at > now + window:
        return (f"Signature not yet current: {signed} is still later than {amz_date(now + window)} "
                f"({amz_date(now)} + {minutes} min.)")
    return None
