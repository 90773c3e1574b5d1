"""A misbehaving DynamoDB endpoint on loopback, for tests of what reshard does with bad answers.

:class:`HostileProxy` forwards every request to a real server (dynalite) on keep-alive
connections, unless its ``fault`` callable answers it first: ``fault(target, body)`` gets
the request's ``X-Amz-Target`` operation (``GetItem``, ...) and its JSON body (a dict), and
returns None (forward it) or a :class:`Fault`: raw bytes to write instead of an answer,
optionally trickled a few bytes at a time, and whether to close the connection afterwards.
Swap ``fault`` at any time (a test "heals" the endpoint by setting it back to None).
"""

from __future__ import annotations

import http.client
import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit


@dataclass
class Fault:
    """What to write back instead of the real answer."""

    raw: bytes
    trickle: float = 0.0  # seconds between chunks (0: all at once)
    chunk: int = 1
    close: bool = False


def answer(body: bytes | str, status: int = 200, headers: dict | None = None, *, length: str | None = None) -> bytes:
    """An HTTP/1.1 answer as raw bytes (``length``: a Content-Length to claim instead of the real one)."""
    body = body.encode() if isinstance(body, str) else body
    head = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": "HOSTILE",
            "Content-Length": length if length is not None else str(len(body)), **(headers or {})}
    reason = {200: "OK", 400: "Bad Request", 500: "Internal Server Error"}.get(status, "X")
    return (f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode() \
        + body


class HostileProxy:
    """A loopback proxy in front of ``upstream`` (``http://host:port``); a context manager."""

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.fault: Callable[[str, dict], Fault | None] | None = None
        self.faults_served = 0
        #: The headers of every request received (name -> value), in order.
        self.requests: list[dict] = []
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                up = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                try:
                    while proxy._one(self.rfile, self.connection, up):
                        pass
                except (OSError, ValueError):
                    pass
                finally:
                    up.close()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "HostileProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _one(self, rfile, sock: socket.socket, up: http.client.HTTPConnection) -> bool:
        line = rfile.readline(65537)
        if not line:
            return False
        headers = {}
        while True:
            h = rfile.readline(65537)
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            headers[name.strip()] = value.strip()
        self.requests.append(dict(headers))
        lower = {k.lower(): v for k, v in headers.items()}
        body = rfile.read(int(lower.get("content-length", "0")))
        target = lower.get("x-amz-target", "").rpartition(".")[2]
        try:
            doc = json.loads(body) if body else {}
        except ValueError:
            doc = {}
        fault = self.fault(target, doc) if self.fault else None
        if fault is not None:
            self.faults_served += 1
            if fault.trickle:
                for i in range(0, len(fault.raw), fault.chunk):
                    sock.sendall(fault.raw[i:i + fault.chunk])
                    time.sleep(fault.trickle)
            else:
                sock.sendall(fault.raw)
            return not fault.close
        method, path, _ = line.decode("latin-1").split(" ", 2)
        skip = {"host", "content-length", "connection"}
        up.request(method, path, body=body, headers={k: v for k, v in headers.items() if k.lower() not in skip})
        resp = up.getresponse()
        data = resp.read()
        out = [f"HTTP/1.1 {resp.status} {resp.reason}\r\n"]
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                out.append(f"{k}: {v}\r\n")
        out.append(f"Content-Length: {len(data)}\r\n\r\n")
        sock.sendall("".join(out).encode("latin-1") + data)
        return True


def on_table(table: str, fault: Fault, operations: tuple[str, ...] = ()) -> Callable[[str, dict], Fault | None]:
    """A ``fault`` for every request naming ``table`` (and of ``operations``, when given)."""
    def decide(target: str, body: dict) -> Fault | None:
        if operations and target not in operations:
            return None
        return fault if body.get("TableName") == table else None
    return decide
