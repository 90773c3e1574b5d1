"""A null data server: DynamoDB's data plane for the benchmark's data tables, at (almost) no CPU.

Why: on a 2-core machine dynalite (one single-threaded node process) spends more CPU per
conditional write than reshard's client, so the benchmarks measured the server, not the
client. Real DynamoDB spreads its side over partitions and never shares the client's cores.
This server takes the server's work out: it runs as its own process (its CPU is not in the
client's ``process_time`` and it holds no GIL of the client's), speaks HTTP/1.1 keep-alive
on 127.0.0.1 from one epoll loop with hand-parsed requests (25 µs of its CPU per conditional
PutItem in a micro-benchmark, kernel included, where an asyncio ``Protocol`` cost 60; 31-44 µs
per request in the benchmarks), and for each table it was told to *snapshot*:

* ``Scan`` is served from a frozen copy of the table loaded from dynalite once (the
  benchmark prepares the real state first: filled, or backfilled and cut over). Segment ``s``
  of ``TotalSegments`` is the ``s``-th contiguous slice of the snapshot (every item in exactly
  one segment); ``Limit``, ``ExclusiveStartKey`` → ``LastEvaluatedKey`` and
  ``ReturnConsumedCapacity`` are honoured. Items are serialised once at load, so a page costs
  a join of bytes. (No 1 MB page cap; a Scan with a filter, projection, index or ``Select``
  is forwarded instead.)
* ``PutItem``/``UpdateItem``/``DeleteItem``/``BatchWriteItem`` are answered success (``{}``,
  ``UnprocessedItems: {}``, ``ConsumedCapacity`` of 1 unit per item when asked) and stored
  nowhere: every condition holds. They are *counted* (by operation, with how many carried a
  ``ConditionExpression``), so a benchmark asserts that its writes reached the server,
  conditional, instead of trusting the client.

Everything else (the control table, other tables, DescribeTable, GetItem/Query/BatchGetItem
of a snapshot table, ...) is forwarded verbatim to dynalite, which does not check
signatures, on keep-alive connections (one per forwarding thread).

Control requests (not DynamoDB's): ``POST /_null/snapshot`` with ``{"table": NAME}`` loads a
table (again: the latest state); ``GET /_null/stats`` answers the counters and the server's
own CPU seconds (``time.process_time``). :class:`NullServer` starts and drives it from a
benchmark::

    with NullServer(dynalite.endpoint) as null:
        null.snapshot("table")             # after preparing it on dynalite
        before = null.stats()
        ...                                # clients on null.endpoint
        delta = null.delta(before)         # writes, conditional, scans, forwarded, cpu
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import select
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

try:
    import orjson

    _loads = orjson.loads

    def _dumps(obj) -> bytes:
        return orjson.dumps(obj)

    def _key_bytes(key: dict) -> bytes:
        return orjson.dumps(key, option=orjson.OPT_SORT_KEYS)
except ImportError:  # pragma: no cover - orjson is optional
    _loads = json.loads

    def _dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def _key_bytes(key: dict) -> bytes:
        return json.dumps(key, separators=(",", ":"), sort_keys=True).encode()

ROOT = pathlib.Path(__file__).resolve().parent.parent
_TARGET = b"dynamodb_20120810."
_WRITES = (b"putitem", b"updateitem", b"deleteitem")
#: Scan parameters this server does not implement: such a Scan is forwarded to dynalite.
_SCAN_FORWARDED = ("FilterExpression", "ProjectionExpression", "IndexName", "Select", "ScanFilter",
                   "AttributesToGet", "ConsistentRead")


def _answer(body: bytes, status: bytes = b"200 OK") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/x-amz-json-1.0\r\n"
            b"x-amzn-RequestId: null\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


_EMPTY = _answer(b"{}")


def _header(low: bytes, name: bytes) -> bytes:
    """The value of header ``name`` (b"\\r\\nname:") in a lower-cased head whose lines end in CRLF."""
    j = low.find(name)
    if j < 0:
        return b""
    j += len(name)
    return low[j:low.find(b"\r\n", j)].strip()


class Snapshot:
    """One table's items, serialised once, in a fixed order; key -> position."""

    def __init__(self, table: str, key_attrs: list[str], items: list[dict]):
        self.table = table
        self.key_attrs = key_attrs
        self.items = [_dumps(it) for it in items]
        self.keys = [_key_bytes({a: it[a] for a in key_attrs}) for it in items]
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.cum = [0]
        for raw in self.items:
            self.cum.append(self.cum[-1] + len(raw))
        self.write_answer = _answer(_dumps({"ConsumedCapacity": {"TableName": table, "CapacityUnits": 1.0}}))

    def page(self, req: dict) -> bytes:
        n = len(self.items)
        total = int(req.get("TotalSegments", 1))
        seg = int(req.get("Segment", 0))
        lo, hi = seg * n // total, (seg + 1) * n // total
        start = req.get("ExclusiveStartKey")
        if start:
            pos = self.index.get(_key_bytes(start))
            if pos is None or not lo <= pos < hi:
                return _answer(_dumps({"__type": "com.amazonaws.dynamodb.v20120810#ValidationException",
                                       "message": "null server: ExclusiveStartKey is not in this segment"}),
                               b"400 Bad Request")
            lo = pos + 1
        limit = int(req.get("Limit", 0)) or (hi - lo)
        end = min(hi, lo + limit)
        parts = [b'{"Items":[', b",".join(self.items[lo:end]), b'],"Count":', str(end - lo).encode(),
                 b',"ScannedCount":', str(end - lo).encode()]
        if end < hi:
            parts += [b',"LastEvaluatedKey":', self.keys[end - 1]]
        if req.get("ReturnConsumedCapacity", "NONE") != "NONE":
            # An eventually consistent read: half a unit per 4 KB of the page (JSON size as the item size).
            units = max(1, -(-(self.cum[end] - self.cum[lo]) // 4096)) * 0.5
            parts += [b',"ConsumedCapacity":{"TableName":', _dumps(self.table), b',"CapacityUnits":',
                      repr(units).encode(), b"}"]
        parts.append(b"}")
        return _answer(b"".join(parts))


class Server:
    """The serving state: snapshots, counters, each forwarding thread's connection to dynalite."""

    def __init__(self, upstream: str):
        up = urlsplit(upstream)
        self.up_host, self.up_port = up.hostname, up.port
        self.snapshots: dict[str, Snapshot] = {}
        self.stats = {"requests": 0, "writes": {"PutItem": 0, "UpdateItem": 0, "DeleteItem": 0},
                      "conditional": 0, "return_values": 0, "batch_write_items": 0, "scans": 0,
                      "forwarded": {}, "forwarded_data": {}}
        self._local = threading.local()  # each forwarding thread's connection to dynalite

    # -- the null data plane
    def handle(self, target: bytes, body: bytes) -> bytes | None:
        """The answer to a DynamoDB request, or None to forward it."""
        op = target[len(_TARGET):] if target.startswith(_TARGET) else b""
        if op in _WRITES:
            req = _loads(body)
            snap = self.snapshots.get(req.get("TableName"))
            if snap is None:
                return None
            st = self.stats
            st["writes"][{b"putitem": "PutItem", b"updateitem": "UpdateItem", b"deleteitem": "DeleteItem"}[op]] += 1
            if "ConditionExpression" in req:
                st["conditional"] += 1
            if req.get("ReturnValues", "NONE") not in ("NONE", None):
                st["return_values"] += 1  # answered without Attributes: a benchmark must not rely on them
            return snap.write_answer if req.get("ReturnConsumedCapacity", "NONE") != "NONE" else _EMPTY
        if op == b"scan":
            req = _loads(body)
            snap = self.snapshots.get(req.get("TableName"))
            if snap is None:
                return None
            if any(k in req for k in _SCAN_FORWARDED):
                return self.forwarded_data("scan")
            answer = snap.page(req)
            self.stats["scans"] += 1
            return answer
        if op == b"batchwriteitem":
            req = _loads(body)
            tables = req.get("RequestItems") or {}
            if not tables or not all(t in self.snapshots for t in tables):
                return None
            counts = {t: len(reqs) for t, reqs in tables.items()}
            self.stats["batch_write_items"] += sum(counts.values())
            out: dict = {"UnprocessedItems": {}}
            if req.get("ReturnConsumedCapacity", "NONE") != "NONE":
                out["ConsumedCapacity"] = [{"TableName": t, "CapacityUnits": float(c)} for t, c in counts.items()]
            return _answer(_dumps(out))
        if self.snapshots and op:  # a read of a snapshot table (GetItem, Query, ...) is dynalite's: counted apart
            try:
                table = _loads(body).get("TableName")
            except ValueError:
                table = None
            if table in self.snapshots:
                return self.forwarded_data(op.decode())
        return None

    def forwarded_data(self, op: str) -> None:
        """Count a request on a snapshot table that dynalite answers (the benchmark can tell its share)."""
        self.stats["forwarded_data"][op] = self.stats["forwarded_data"].get(op, 0) + 1
        return None

    # -- control requests
    def control(self, method: bytes, path: bytes, body: bytes) -> bytes:
        if method == b"GET" and path == b"/_null/stats":
            return _answer(_dumps(dict(self.stats, cpu_seconds=time.process_time(),
                                       tables={t: len(s.items) for t, s in self.snapshots.items()})))
        if method == b"POST" and path == b"/_null/snapshot":
            table = _loads(body)["table"]
            self.snapshots[table] = self.load(table)
            return _answer(_dumps({"table": table, "items": len(self.snapshots[table].items)}))
        return _answer(b'{"message":"unknown control request"}', b"404 Not Found")

    def upstream_call(self, target: str, req: dict) -> dict:
        """One request to dynalite, blocking (only while loading a snapshot: nothing is timed then)."""
        from reshard.aws.lean import sign, signing_key
        body = _dumps(req)
        host = f"{self.up_host}:{self.up_port}"
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "DynamoDB_20120810." + target}
        # dynalite checks that a signature is there, not that it is right.
        headers.update(sign(lambda s, d: signing_key(s, d, "us-east-1"), "null", "null", "us-east-1", host,
                            headers, body, time.gmtime()))
        conn = http.client.HTTPConnection(self.up_host, self.up_port, timeout=60)
        try:
            conn.request("POST", "/", body, headers)
            resp = conn.getresponse()
            data = _loads(resp.read())
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"{target} of the snapshot failed: {data}")
        return data

    def load(self, table: str) -> Snapshot:
        schema = self.upstream_call("DescribeTable", {"TableName": table})["Table"]["KeySchema"]
        keys = [k["AttributeName"] for k in sorted(schema, key=lambda k: k["KeyType"] != "HASH")]
        items, req = [], {"TableName": table}
        while True:
            page = self.upstream_call("Scan", req)
            items += page.get("Items", [])
            if not page.get("LastEvaluatedKey"):
                return Snapshot(table, keys, items)
            req["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    # -- forwarding
    def forward(self, raw: bytes) -> bytes:
        """``raw`` (one whole request) to dynalite on this thread's keep-alive connection; the answer, verbatim."""
        for attempt in (0, 1):  # a kept connection dynalite closed while idle: once more on a fresh one
            conn = getattr(self._local, "conn", None)
            fresh = conn is None
            if fresh:
                try:
                    sock = socket.create_connection((self.up_host, self.up_port), timeout=60)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    return _answer(b'{"message":"null server: dynalite is not there"}', b"502 Bad Gateway")
                conn = self._local.conn = (sock, sock.makefile("rb"))
            sock, reader = conn
            try:
                sock.sendall(raw)
                answer, close = _read_answer(reader)
            except (OSError, ValueError):
                self._local.conn = None
                reader.close()
                sock.close()
                if fresh or attempt:
                    return _answer(b'{"message":"null server: dynalite did not answer"}', b"502 Bad Gateway")
                continue
            if close:
                self._local.conn = None
                reader.close()
                sock.close()
            return answer
        raise AssertionError("unreachable")


def _read_answer(reader) -> tuple[bytes, bool]:
    """One HTTP/1.1 answer as raw bytes (Content-Length or chunked), and whether the server closes."""
    head = bytearray()
    while True:
        line = reader.readline(65537)
        if not line:
            raise ConnectionResetError("dynalite closed the connection")
        head += line
        if line in (b"\r\n", b"\n"):
            break
    low = bytes(head).lower()
    if b"\r\ntransfer-encoding: chunked" in low:
        body = bytearray()
        while True:
            line = reader.readline(65537)
            size = int(line.split(b";")[0], 16)
            body += line + reader.read(size + 2)
            if size == 0:
                break
    else:
        n = int(_header(low, b"\r\ncontent-length:") or 0)
        body = reader.read(n)
        if len(body) != n:
            raise ConnectionResetError("the answer was cut short")
    return bytes(head) + bytes(body), b"\r\nconnection: close" in low


def serve(upstream: str, port: int = 0) -> None:
    """The server's loop: one thread on epoll answers the null plane (no asyncio: its event loop
    cost ~4x this loop's CPU per request); forwarded requests go to a few threads, each with its
    own keep-alive connection to dynalite, so a slow control-table request holds up nobody."""
    server = Server(upstream)
    listener = socket.socket()
    listener.bind(("127.0.0.1", port))
    listener.listen(256)
    listener.setblocking(False)
    print(listener.getsockname()[1], flush=True)  # the parent waits for this line
    ep = select.epoll()
    ep.register(listener.fileno(), select.EPOLLIN)
    stdin = sys.stdin.fileno()
    ep.register(stdin, select.EPOLLIN)  # the parent went away when its end closes: never outlive it
    socks: dict[int, socket.socket] = {}
    bufs: dict[int, bytes] = {}
    pool = ThreadPoolExecutor(8, thread_name_prefix="forward")

    def forward(fd: int, sock: socket.socket, raw: bytes) -> None:
        answer = server.forward(raw)
        try:
            sock.sendall(answer)
        except OSError:
            pass  # the client went away: the loop sees it on the next read
        ep.register(fd, select.EPOLLIN)  # its next request (the client waited for this answer)

    def close(fd: int) -> None:
        ep.unregister(fd)
        socks.pop(fd).close()
        bufs.pop(fd, None)

    while True:
        for fd, _ in ep.poll():
            if fd == listener.fileno():
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    continue
                # Blocking with a timeout: a read follows readiness; an answer goes out whole (sendall).
                sock.settimeout(30)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                socks[sock.fileno()] = sock
                bufs[sock.fileno()] = b""
                ep.register(sock.fileno(), select.EPOLLIN)
                continue
            if fd == stdin:
                if not os.read(stdin, 4096):
                    pool.shutdown(wait=False)
                    return
                continue
            sock = socks.get(fd)
            if sock is None:
                continue
            try:
                data = sock.recv(262144)
            except OSError:
                data = b""
            if not data:
                close(fd)
                continue
            buf = bufs[fd] + data if bufs[fd] else data
            try:
                while True:
                    i = buf.find(b"\r\n\r\n")
                    if i < 0:
                        break
                    low = buf[:i + 2].lower()  # the head, each header line ending in CRLF
                    end = i + 4 + int(_header(low, b"\r\ncontent-length:") or 0)
                    if len(buf) < end:
                        break
                    raw, body, buf = buf[:end], buf[i + 4:end], buf[end:]
                    server.stats["requests"] += 1
                    if low.startswith(b"get /_null/") or low.startswith(b"post /_null/"):
                        method, path = raw.split(b" ", 2)[:2]
                        try:
                            answer = server.control(method, path, body)
                        except Exception as e:  # noqa: BLE001 - e.g. a snapshot of a missing table: the caller's error
                            answer = _answer(_dumps({"message": f"{type(e).__name__}: {e}"}),
                                             b"500 Internal Server Error")
                        sock.sendall(answer)
                        continue
                    target = _header(low, b"\r\nx-amz-target:")
                    answer = server.handle(target, body)
                    if answer is None:
                        op = target.rpartition(b".")[2].decode() or "?"
                        server.stats["forwarded"][op] = server.stats["forwarded"].get(op, 0) + 1
                        ep.unregister(fd)  # until the answer is out (clients do not pipeline)
                        pool.submit(forward, fd, sock, raw)
                        break
                    sock.sendall(answer)
            except OSError:
                close(fd)
                continue
            bufs[fd] = buf


class NullServer:
    """The null server as a child process; use as a context manager."""

    def __init__(self, upstream: str, start_timeout: float = 20.0):
        self.upstream = upstream
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "NullServer":
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, __file__, "--upstream", self.upstream], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        ready, _, _ = select.select([self.proc.stdout], [], [], self.start_timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the null server did not start within {self.start_timeout:g}s")
        self.port = int(line)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.stdin.close()  # it exits when its stdin closes
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()

    def __enter__(self) -> "NullServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path, json.dumps(body).encode() if body is not None else None)
            resp = conn.getresponse()
            data = json.loads(resp.read())
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"null server {path}: {resp.status} {data}")
        return data

    def snapshot(self, table: str) -> int:
        """Load ``table``'s current items from dynalite (its Scan and writes are served from now on)."""
        return self._request("POST", "/_null/snapshot", {"table": table})["items"]

    def stats(self) -> dict:
        """The counters so far (see :meth:`delta`)."""
        return self._request("GET", "/_null/stats")

    def delta(self, before: dict) -> dict:
        """What happened since ``before`` (a :meth:`stats`): ``writes`` by operation, ``conditional``,
        ``batch_write_items``, ``scans`` (served from a snapshot), ``forwarded`` by operation (all
        tables; lower-case names, as ``getitem``), ``forwarded_data`` (of those, the ones on a
        snapshot table), ``requests``,
        ``cpu_seconds`` (the stats request that reads them is not counted)."""
        now = self.stats()
        out = {k: now[k] - before[k] for k in ("requests", "conditional", "return_values", "batch_write_items",
                                                "scans", "cpu_seconds")}
        out["requests"] -= 1  # the stats request that read `now`
        out["writes"] = {k: now["writes"][k] - before["writes"][k] for k in now["writes"]}
        for name in ("forwarded", "forwarded_data"):
            out[name] = {k: v - before[name].get(k, 0) for k, v in now[name].items() if v - before[name].get(k, 0)}
        out["null_answered"] = out["requests"] - sum(out["forwarded"].values())
        return out


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description="the null data server (started by benchmarks through NullServer)")
    ap.add_argument("--upstream", required=True, help="dynalite's endpoint, for everything not answered here")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    serve(args.upstream, args.port)


if __name__ == "__main__":
    main()
