"""The "hosts" section of benchmarks/scale.py: one --max-wcu across 1, 2 and 4 separate hosts.

Each "host" is a ``reshard backfill`` subprocess with its own ``--host-id``, all started
together on one run of one dynalite table, with ``--max-wcu`` set below what they copy
unpaced. Consumed WCU is counted by a proxy between the processes and dynalite (the
``ConsumedCapacity`` of every data-table write answer, timestamped where it passes), not
by the processes themselves, and summed per 10 s window from the first write on. Goal:
every full window within ±5 % of the budget and ≥ 90 % of it used.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from benchmarks._support import ROOT, old_items, setup_migration

KIND = "invoices"  # random suffix 10 -> hashed 20: about 95 % of the items move (1 WCU each)
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"}
WINDOW = 10.0


class CountingProxy:
    """An HTTP/1.1 keep-alive proxy to dynalite that records (monotonic time, WCU) of every
    data-table write answer passing through it."""

    def __init__(self, upstream: str, table_prefix: str):
        up = urlsplit(upstream)
        self.samples: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                conn = getattr(local, "conn", None)
                if conn is None:
                    conn = local.conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                try:
                    conn.request("POST", self.path, body, headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException):
                    local.conn = None
                    self.send_error(502)
                    return
                target = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
                if resp.status == 200 and target in WRITES:
                    proxy.count(data, table_prefix)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        local = threading.local()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def count(self, data: bytes, table_prefix: str) -> None:
        cc = json.loads(data or b"{}").get("ConsumedCapacity")
        units = sum(float(e.get("CapacityUnits", 0)) for e in (cc if isinstance(cc, list) else [cc] if cc else [])
                    if e.get("TableName", "").startswith(table_prefix))
        if units:
            with self.lock:
                self.samples.append((time.monotonic(), units))

    def __enter__(self) -> "CountingProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("AWS_PROFILE", None)
    return env


def one_config(dynamo, endpoint: str, hosts: int, max_wcu: float, seconds: float, segments: int,
               page_size: int, tag: str) -> dict:
    """``hosts`` backfill processes on one run under ``--max-wcu``; WCU per 10 s window."""
    name = f"hosts{hosts}-{tag}"
    items = int(max_wcu * (seconds + 2 * WINDOW) / 0.95)
    m, mapper, store = setup_migration(dynamo, KIND, name, control=f"{name}-control", mid=name)
    dynamo.batch_write(m.table, [{"PutRequest": {"Item": it}} for it in old_items(mapper, KIND, items)])
    with CountingProxy(endpoint, name) as proxy:
        cmd = [sys.executable, "-m", "reshard", "--endpoint-url", proxy.endpoint, "--control-table", store.table,
               "--output", "json", "backfill", m.id, "--segments", str(segments), "--workers", "4",
               "--page-size", str(page_size), "--max-wcu", f"{max_wcu:g}"]
        started = time.monotonic()
        procs = [subprocess.Popen([*cmd, "--host-id", f"host-{i}"], env=_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(hosts)]
        outs = [p.communicate(timeout=seconds * 4 + 120) for p in procs]
        exits = [(time.monotonic(), p.returncode) for p in procs]
        with proxy.lock:
            samples = sorted(proxy.samples)
    failed = [o[1][-400:] for o, p in zip(outs, procs) if p.returncode != 0]
    if failed:
        raise SystemExit(f"a backfill process failed: {failed}")
    summaries = [json.loads(o[0]) for o in outs]
    t0 = samples[0][0] if samples else started
    last = samples[-1][0] if samples else started
    windows, w = [], 0
    while t0 + (w + 1) * WINDOW <= last:  # full windows only; the last partial one is the tail
        lo, hi = t0 + w * WINDOW, t0 + (w + 1) * WINDOW
        windows.append(round(sum(u for ts, u in samples if lo <= ts < hi) / WINDOW, 1))
        w += 1
    tail_seconds = last - (t0 + w * WINDOW)
    tail = sum(u for ts, u in samples if ts >= t0 + w * WINDOW) / tail_seconds if tail_seconds > 0 else 0.0
    fractions = [round(x / max_wcu, 3) for x in windows]
    # The goal is judged on the first `seconds` of copying: the table holds enough items for
    # two more windows at the budget, so the work cannot run out inside them. The windows
    # after (the run ending: segments finish one by one) are shown, not judged.
    judged = fractions[:int(seconds // WINDOW)]
    return {"hosts": hosts, "max_wcu": max_wcu, "items": items, "segments": segments,
            "windows_wcu_per_s": windows, "window_fraction_of_budget": fractions, "judged_windows": len(judged),
            "tail": {"seconds": round(tail_seconds, 1), "wcu_per_s": round(tail, 1)},
            "total_wcu": round(sum(u for _, u in samples), 1), "copy_seconds": round(last - t0, 1),
            "worked_per_host": [len(s["worked_here"]) for s in summaries],
            "budget_seen": [s.get("budget") for s in summaries],
            "met": bool(judged) and all(0.95 <= f <= 1.05 for f in judged) and min(judged) >= 0.90,
            "wall_seconds": round(max(t for t, _ in exits) - started, 1)}


def unpaced_rate(dynamo, endpoint: str, segments: int, page_size: int, items: int, tag: str) -> float:
    """WCU/s one unbudgeted host reaches through the proxy (so the budget is set below it)."""
    name = f"unpaced-{tag}"
    m, mapper, store = setup_migration(dynamo, KIND, name, control=f"{name}-control", mid=name)
    dynamo.batch_write(m.table, [{"PutRequest": {"Item": it}} for it in old_items(mapper, KIND, items)])
    with CountingProxy(endpoint, name) as proxy:
        cmd = [sys.executable, "-m", "reshard", "--endpoint-url", proxy.endpoint, "--control-table", store.table,
               "--output", "json", "backfill", m.id, "--segments", str(segments), "--workers", "4",
               "--page-size", str(page_size)]
        subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, check=True)
        with proxy.lock:
            samples = sorted(proxy.samples)
    span = samples[-1][0] - samples[0][0] if len(samples) > 1 else 1.0
    return sum(u for _, u in samples) / span


def hosts_section(dynamo, endpoint: str, *, max_wcu: float, seconds: float, counts=(1, 2, 4), segments: int = 16,
                  page_size: int = 100) -> dict:
    """The hosts section: an unpaced reference, then each host count under one budget."""
    tag = f"{int(time.time()) % 100000}"
    reference = unpaced_rate(dynamo, endpoint, segments, page_size, 3000, tag)
    configs = [one_config(dynamo, endpoint, n, max_wcu, seconds, segments, page_size, tag) for n in counts]
    return {"max_wcu": max_wcu, "unpaced_one_host_wcu_per_s": round(reference, 1), "configs": configs,
            "load_average_1m_at_end": round(os.getloadavg()[0], 1),
            "goal": "every full 10 s window within 0.95..1.05 of --max-wcu and >= 0.90 used",
            "met": all(c["met"] for c in configs) and reference > max_wcu}


def rows(section: dict) -> list[tuple[str, str, str]]:
    """Table rows: (measure, value, goal)."""
    out = [("one host unpaced (reference)", f"{section['unpaced_one_host_wcu_per_s']:.0f} WCU/s",
            f"> budget {section['max_wcu']:g}")]
    for c in section["configs"]:
        n = c["judged_windows"]
        judged, after = c["windows_wcu_per_s"][:n], c["windows_wcu_per_s"][n:]
        fr = c["window_fraction_of_budget"][:n]
        span = f" ({min(fr):.3f}..{max(fr):.3f})" if fr else ""
        out.append((f"{c['hosts']} host(s): WCU/s per 10 s window", (", ".join(f"{x:.0f}" for x in judged) or "-") + span,
                    f"{0.95 * c['max_wcu']:.0f}..{1.05 * c['max_wcu']:.0f} {'met' if c['met'] else 'NOT MET'}"))
        out.append((f"{c['hosts']} host(s): run ending (windows after, tail)",
                    f"{', '.join(f'{x:.0f}' for x in after) or '-'}; {c['tail']['seconds']} s at "
                    f"{c['tail']['wcu_per_s']:.0f}", "(information)"))
    return out
