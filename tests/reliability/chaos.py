"""Chaos support for the reliability suite: a faulty loopback proxy, the oracle, app threads.

FaultProxy
    A small HTTP proxy on 127.0.0.1 in front of dynalite, run by a thread of the test
    process. Every client goes through it -- the in-process shims and the
    ``python -m reshard`` subprocesses -- so faults reach all of them. Per request it
    answers ~10 % of writes with ProvisionedThroughputExceededException, ~3 % of all calls
    with HTTP 500 (neither forwarded: nothing applied), and splits ~20 % of
    BatchWriteItem calls: it forwards only the first part and answers the rest as
    UnprocessedItems. ``blocked_tables`` cuts every call naming one of those tables.

Oracle
    Every write an application thread issues, per logical key, with its start and end
    (monotonic clock of this process) and whether it was acknowledged. A read (or the
    final state) is valid if it shows some write W that started before the read ended
    and that no *acknowledged* write strictly after W (started after W ended) had
    finished before the read started -- for concurrent writes any overlapping candidate
    is accepted. Failed writes stay candidates (a write that raised may have landed).
"""

from __future__ import annotations

import http.client
import http.server
import json
import math
import random
import socketserver
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable

from reshard import errors

WRITE_OPS = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"}


# ---------------------------------------------------------------------------------- proxy
class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class FaultProxy:
    """A faulty loopback proxy in front of ``upstream`` (host, port); see the module docstring."""

    def __init__(self, upstream_port: int, seed: int, throttle: float = 0.10, error5xx: float = 0.03,
                 split: float = 0.20):
        self.upstream_port = upstream_port
        self.rng = random.Random(seed)
        self.rates = {"throttle": throttle, "5xx": error5xx, "split": split}
        self.enabled = True
        self.blocked_tables: set[str] = set()
        self.counts: dict[str, int] = {"calls": 0, "throttle": 0, "5xx": 0, "split": 0, "blocked": 0}
        #: Write requests (PutItem, UpdateItem, DeleteItem, BatchWriteItem) forwarded, per table.
        self.writes: dict[str, int] = {}
        self.lock = threading.Lock()
        self._local = threading.local()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    status, headers, out = proxy.handle(self.headers, body)
                except Exception as e:  # upstream down (restarting): a 500 the client retries
                    status, headers, out = _error(500, "InternalFailure", f"proxy: {e}")
                try:
                    self.send_response(status)
                    for k, v in headers:
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    self.close_connection = True  # the client vanished (SIGKILL): fine

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _count(self, k: str) -> None:
        with self.lock:
            self.counts[k] = self.counts.get(k, 0) + 1

    def _forward(self, headers, body: bytes) -> tuple[int, list, bytes]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        hdrs = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length", "connection")}
        try:
            conn.request("POST", "/", body=body, headers=hdrs)
            resp = conn.getresponse()
            out = resp.read()
        except Exception:
            conn.close()
            self._local.conn = None
            raise
        keep = [(k, v) for k, v in resp.getheaders()
                if k.lower() not in ("content-length", "connection", "transfer-encoding", "date")]
        return resp.status, keep, out

    def handle(self, headers, body: bytes) -> tuple[int, list, bytes]:
        op = (headers.get("X-Amz-Target") or "").split(".")[-1]
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            req = {}
        tables = {req["TableName"]} if "TableName" in req else set(req.get("RequestItems", {}))
        self._count("calls")
        if tables & self.blocked_tables:
            self._count("blocked")
            return _error(500, "InternalFailure", "proxy: this table is cut off")
        if self.enabled:
            with self.lock:
                r_throttle, r_5xx, r_split = self.rng.random(), self.rng.random(), self.rng.random()
            if op in WRITE_OPS and r_throttle < self.rates["throttle"]:
                self._count("throttle")
                return _error(400, "ProvisionedThroughputExceededException", "injected throttle")
            if r_5xx < self.rates["5xx"]:
                self._count("5xx")
                return _error(500, "InternalFailure", "injected 500")
            if op == "BatchWriteItem" and r_split < self.rates["split"]:
                (table, reqs), = req["RequestItems"].items()
                if len(reqs) > 1:
                    with self.lock:
                        cut = self.rng.randrange(1, len(reqs))
                    part = dict(req, RequestItems={table: reqs[:cut]})
                    status, hdrs, out = self._forward(headers, json.dumps(part).encode())
                    if status != 200:
                        return status, hdrs, out
                    resp = json.loads(out)
                    unprocessed = resp.get("UnprocessedItems", {}).get(table, []) + reqs[cut:]
                    resp["UnprocessedItems"] = {table: unprocessed}
                    self._count("split")
                    hdrs = [(k, v) for k, v in hdrs if k.lower() != "x-amz-crc32"]
                    return 200, hdrs, json.dumps(resp).encode()
        if op in WRITE_OPS:
            with self.lock:
                for t in tables:
                    self.writes[t] = self.writes.get(t, 0) + 1
        return self._forward(headers, body)

    def faults(self) -> dict[str, int]:
        with self.lock:
            return {k: v for k, v in self.counts.items() if k != "calls"}


def _error(status: int, code: str, message: str) -> tuple[int, list, bytes]:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": message}).encode()
    return status, [("Content-Type", "application/x-amz-json-1.0"), ("x-amzn-RequestId", "injected")], body


# ---------------------------------------------------------------------------------- oracle
ABSENT = "<absent>"


@dataclass
class Write:
    token: str                 # the value's identity: the item's "op" attribute, or ABSENT
    kind: str                  # seed | put | insert | update | delete | initial
    start: float
    end: float
    acked: bool
    expect: dict | None        # attributes the result must show (None for a delete)
    note: str = ""             # who wrote it, in which phase (for failure messages)


@dataclass
class Oracle:
    """The log of every write per logical key (see the module docstring)."""

    writes: dict[Any, list[Write]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, key, w: Write) -> None:
        with self.lock:
            self.writes.setdefault(key, []).append(w)

    def history(self, key) -> list[Write]:
        with self.lock:
            return list(self.writes.get(key, ()))

    def candidates(self, key, read_start: float, read_end: float) -> list[Write]:
        hist = self.history(key)
        out = []
        for w in hist:
            if w.start > read_end:
                continue
            superseded = any(o.acked and o.start > w.end and o.end < read_start for o in hist)
            if not superseded:
                out.append(w)
        return out

    def check(self, key, got: dict | None, read_start: float, read_end: float) -> str | None:
        """None when ``got`` is a valid read; else 'lost', 'resurrected' or 'stale' with detail."""
        cands = self.candidates(key, read_start, read_end)
        token = got.get("op", "<no op>") if got else ABSENT
        for w in cands:
            if w.token == token and (got is None or all(got.get(k) == v for k, v in (w.expect or {}).items())):
                return None
        present = [w for w in cands if w.token != ABSENT]
        if got is None and present:
            kind = "lost"
        elif got is not None and not present:
            kind = "resurrected"
        else:
            kind = "stale"
        hist = [(w.kind, w.token, w.acked, w.note, round(w.start, 3), round(w.end, 3)) for w in self.history(key)]
        return (f"{kind}: {key} read {token!r} in [{read_start:.3f}, {read_end:.3f}], "
                f"candidates {[(w.kind, w.token, w.acked) for w in cands]}; history {hist[-8:]}")


# ---------------------------------------------------------------------------------- workload
@dataclass
class Workload:
    """How to build the logical keys and items of one migration's application."""

    key: Callable[[int], dict]                     # logical key of item i (python values)
    item: Callable[[int, str, random.Random], dict]  # a whole logical item of i carrying token
    ident: Callable[[int], Any] = lambda i: i


class AppThread(threading.Thread):
    """One application thread writing through a real ShardedTable; bounded in ops and time.

    Ops: whole-item puts (inserts for never-written keys), updates, deletes and reads;
    after each acknowledged write, half the time the same key is read back (read your
    writes). Every write and read is checked against the oracle.
    """

    def __init__(self, name: str, table, workload: Workload, oracle: Oracle, keys: list[int], hot: list[int],
                 seed: int, max_ops: int, deadline: float, pause: float = 0.004):
        super().__init__(name=name, daemon=True)
        self.table, self.w, self.oracle = table, workload, oracle
        self.keys, self.hot = keys, hot
        self.rng = random.Random(seed)
        self.max_ops, self.deadline, self.pause = max_ops, deadline, pause
        self.stop = threading.Event()
        self.ops: dict[str, int] = {}
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.seq = 0

    def _n(self, kind: str) -> None:
        self.ops[kind] = self.ops.get(kind, 0) + 1

    def run(self) -> None:
        try:
            while not self.stop.is_set() and sum(self.ops.values()) < self.max_ops \
                    and time.monotonic() < self.deadline:
                i = self.rng.choice(self.hot) if self.rng.random() < 0.2 else self.rng.choice(self.keys)
                r = self.rng.random()
                if r < 0.35:
                    acked = self.put(i)
                elif r < 0.6:
                    acked = self.update(i)
                elif r < 0.7:
                    acked = self.delete(i)
                else:
                    self.read(i)
                    acked = False
                if acked and self.rng.random() < 0.5:
                    self.read(i, ryw=True)
                self.stop.wait(self.pause)
        except BaseException as e:  # surfaced by the test
            self.errors.append(f"{self.name} crashed: {e!r}")

    def _token(self) -> str:
        self.seq += 1
        return f"{self.name}-{self.seq}"

    def _write(self, i: int, kind: str, token: str, expect: dict | None, fn) -> bool:
        # Recorded before it is sent: a concurrent reader must see it as a candidate while
        # it is in flight (pending: end = inf, not acknowledged, supersedes nothing).
        w = Write(token, kind, time.monotonic(), math.inf, False, expect, f"{self.name}@{self.table.phase}")
        self.oracle.record(self.w.ident(i), w)
        try:
            fn()
            ok = True
        except errors.ReshardError as e:
            ok = False
            self._n("failed")
            self.errors.append(f"{kind} {i}: {e}")
        with self.oracle.lock:
            w.end, w.acked = time.monotonic(), ok
        if ok:
            self._n(kind)
        return ok

    def put(self, i: int) -> bool:
        token = self._token()
        item = self.w.item(i, token, self.rng)
        # An insert: the key never held an item (only its "initial" absent state so far).
        kind = "insert" if all(w.kind == "initial" for w in self.oracle.history(self.w.ident(i))) else "put"
        return self._write(i, kind, token, item, lambda: self.table.put_item(Item=item))

    def update(self, i: int) -> bool:
        token = self._token()
        temp = Decimal(self.rng.randrange(-400, 400)) / 10
        return self._write(i, "update", token, {"temp": temp, "op": token}, lambda: self.table.update_item(
            Key=self.w.key(i), UpdateExpression="SET #t = :t, #o = :o",
            ExpressionAttributeNames={"#t": "temp", "#o": "op"},
            ExpressionAttributeValues={":t": temp, ":o": token}))

    def delete(self, i: int) -> bool:
        return self._write(i, "delete", ABSENT, None, lambda: self.table.delete_item(Key=self.w.key(i)))

    def read(self, i: int, ryw: bool = False) -> None:
        start = time.monotonic()
        try:
            got = self.table.get_item(Key=self.w.key(i), ConsistentRead=True).get("Item")
        except errors.ReshardError as e:
            self._n("failed")
            self.errors.append(f"read {i}: {e}")
            return
        end = time.monotonic()
        self._n("ryw_read" if ryw else "read")
        problem = self.oracle.check(self.w.ident(i), got, start, end)
        if problem:
            problem += f" (reader phase {self.table.phase}, version {got and got.get('_rs_v')})"
            self.violations.append(("read-your-writes " if ryw else "read ") + problem)


def total_ops(threads: list[AppThread]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in threads:
        for k, v in t.ops.items():
            out[k] = out.get(k, 0) + v
    return out
