"""The proxy: a loopback HTTP server in front of dynalite (or moto's server), its pipeline and its control API.

Threads: one accepts connections; each client connection gets a thread that reads a request,
runs it through :meth:`FidelityProxy.handle` and writes the answer (a held request in
``wait`` mode simply keeps its connection's thread waiting); each thread that forwards has
its own keep-alive connection upstream. One timer thread delivers held requests and
duplicates whose time has come.

The pipeline of one request (:meth:`FidelityProxy.handle`):

1. a table cut off (``blocked_tables``): 500, nothing forwarded;
2. the first rule that applies (rules.py): hold / lose the answer / duplicate / fail;
3. the random faults of the chaos suite (``fault_rates`` while ``faults_enabled``):
   throttled writes, 500s, BatchWriteItem split into a part and UnprocessedItems;
4. :meth:`FidelityProxy.deliver`, at the moment the request reaches upstream: the signature
   date against the proxy's clock, then :class:`~reshard.aws.fidelity.behaviours.Behaviours`
   (per-partition throughput, TTL, stale reads), then upstream.

Every answer leaves with a ``Date`` header from the proxy's clock (real time plus
``clock_offset``), as DynamoDB's answers carry its clock, replacing upstream's.
"""

from __future__ import annotations

import heapq
import os
import random
import select
import socket
import sys
import threading
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from reshard.aws.fidelity import wire
from reshard.aws.fidelity.rules import Held, Rule
from reshard.aws.fidelity.wire import CORAL_ERROR, DYNAMODB_ERROR, Answer, Request, aws_error

#: What a handler returns to close the client's connection without an answer.
CLOSE = None
CONTROL_PREFIX = "/_fidelity/"
WRITE_OPS = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"})
#: Counters ``stats`` always shows (0 until something happens).
COUNTERS = ("requests", "forwarded", "refused_signature", "held", "copies", "released", "dropped",
            "rule_hold", "rule_lose_answer", "rule_duplicate", "rule_fail", "throttle", "5xx", "split", "blocked",
            "upstream_errors", "proxy_errors")

#: Settings and their defaults (``configure`` takes any of them; ``settings`` reads them all).
DEFAULTS: dict[str, Any] = {
    # SigV4 date check: a request dated more than this many seconds before or after the
    # proxy's clock is refused (AWS: 5 minutes, as users observe it). 0 turns it off.
    "signature_window": 300.0,
    # The proxy's clock is real time plus this offset (a server clock ahead of the clients'
    # is positive): it dates the answers and judges the signatures.
    "clock_offset": 0.0,
    # The chaos suite's random faults, drawn per request while faults_enabled: throttle (writes
    # only), 5xx (any request), split (BatchWriteItem: a part forwarded, the rest unprocessed).
    "faults_enabled": False,
    "fault_rates": {"throttle": 0.0, "5xx": 0.0, "split": 0.0},
    # Tables whose every request is answered 500 (a network partition to one table).
    "blocked_tables": [],
}


class ControlAPI:
    """The proxy's control calls, the same in-process (:class:`FidelityProxy`) and over HTTP
    (:class:`RemoteFidelity`, :class:`FidelityProcess`). Match arguments of the rule calls:
    ``op``, ``table`` (a name or a list), ``key`` (``{"PK": "a#1"}`` or wire values),
    ``contains`` (a substring of the body), ``nth`` (the n-th matching request, from 1),
    ``times`` (at most this many; None: all), ``probability``; in-process also
    ``where=callable(op, request_dict)``."""

    def _call(self, name: str, **kwargs):  # pragma: no cover - implemented by both sides
        raise NotImplementedError

    def configure(self, **settings) -> dict:
        """Change settings (see ``DEFAULTS`` and the behaviours'); returns them all."""
        return self._call("configure", **settings)

    def settings(self) -> dict:
        return self._call("settings")

    def now(self) -> float:
        """The proxy's clock: seconds since the epoch (real time + ``clock_offset``)."""
        return self._call("now")

    def advance_clock(self, seconds: float) -> float:
        """Move the proxy's clock forward (``clock_offset += seconds``); returns the new offset."""
        return self._call("advance_clock", seconds=seconds)

    def hold(self, *, delay: float | None = None, mode: str = "wait", age: float = 0.0, **match) -> str:
        """Hold matching requests; deliver each after ``delay`` seconds or on ``release``.
        ``mode="lose"`` closes the client's connection at once. ``age``: judge its signature
        date on delivery as if it had been held that many seconds more. Returns the rule id."""
        return self._call("add_rule", action="hold", delay=delay, mode=mode, age=age, **match)

    def lose_answer(self, **match) -> str:
        """Deliver matching requests, then close the client's connection without the answer."""
        return self._call("add_rule", action="lose_answer", **match)

    def duplicate(self, *, copy: str = "now", delay: float | None = None, age: float = 0.0, **match) -> str:
        """Deliver matching requests twice: the copy right after the original (``now``), after
        ``delay`` seconds (``copy="delay"``), or when released (``copy="hold"``); ``age`` as for hold."""
        return self._call("add_rule", action="duplicate", copy=copy, delay=delay, age=age, **match)

    def fail(self, *, status: int = 500, code: str = "InternalServerError", message: str = "injected by the proxy",
             **match) -> str:
        """Answer matching requests with this error, never delivering them."""
        return self._call("add_rule", action="fail", status=status, code=code, message=message, **match)

    def remove_rule(self, rule: str) -> dict:
        return self._call("remove_rule", rule=rule)

    def clear_rules(self) -> int:
        return self._call("clear_rules")

    def rules(self) -> list:
        return self._call("rules")

    def held(self, rule: str | None = None, state: str | None = "held") -> list:
        """Held requests (``state=None``: also the delivered and dropped ones) as dicts with a ``handle``."""
        return self._call("held", rule=rule, state=state)

    def wait_held(self, count: int = 1, rule: str | None = None, timeout: float = 10.0) -> list:
        """Wait until ``count`` requests (of ``rule``) are held; returns them. TimeoutError otherwise."""
        return self._call("wait_held", count=count, rule=rule, timeout=timeout)

    def release(self, handle: str, timeout: float = 30.0) -> dict:
        """Deliver a held request now; returns its outcome ``{status, code, message, body}``."""
        return self._call("release", handle=handle, timeout=timeout)

    def release_all(self, rule: str | None = None, timeout: float = 30.0) -> list:
        return self._call("release_all", rule=rule, timeout=timeout)

    def drop(self, handle: str) -> dict:
        """Forget a held request: it never lands (its waiting client's connection is closed)."""
        return self._call("drop", handle=handle)

    def ttl_sweep(self) -> int:
        """Run one TTL sweep now (``ttl`` on); returns how many expired items it deleted."""
        return self._call("ttl_sweep")

    def stats(self) -> dict:
        """Counters (requests, forwarded, refusals by kind, rules applied, ...) and ``cpu_seconds``."""
        return self._call("stats")

    def reset_stats(self) -> dict:
        return self._call("reset_stats")


class FidelityProxy(ControlAPI):
    """The proxy, served by threads of this process (see the module docstring).

    ``upstream``: dynalite's (or moto server's) endpoint. ``clock``: real time by default
    (tests inject one); the proxy's clock is ``clock() + clock_offset``. ``monotonic``: the
    behaviours' time (how long ago a write was, how full a partition's bucket is; tests
    inject one to step it). Settings as keywords.
    """

    def __init__(self, upstream: str, *, port: int = 0, host: str = "127.0.0.1", seed: int = 0,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 **settings):
        if not _is_loopback(host):
            raise ValueError(f"the fidelity proxy listens on loopback only, not {host!r}")
        up = urlsplit(upstream)
        if up.scheme != "http" or not up.hostname or not up.port:
            raise ValueError(f"upstream must be http://HOST:PORT, not {upstream!r}")
        self.upstream = upstream
        self.up_host, self.up_port = up.hostname, up.port
        self.up_hostport = f"{up.hostname}:{up.port}"
        self.clock = clock
        self.monotonic = monotonic  # the behaviours' time (stale-read history, partition buckets)
        self.rng = random.Random(seed)
        self.lock = threading.RLock()
        self.config: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in DEFAULTS.items()}
        self._blocked: frozenset = frozenset()
        self._counts: dict[str, int] = {}
        self.rules_: list[Rule] = []
        self._rule_seq = 0
        self.held_: dict[str, Held] = {}
        self._held_seq = 0
        self._held_changed = threading.Condition(self.lock)
        self._timers: list = []                 # heap of (due, seq, handle)
        self._timer_wake = threading.Condition(threading.Lock())
        self._local = threading.local()         # each thread's keep-alive connection upstream
        self._conns: set = set()
        self._stopped = threading.Event()
        self.http_date = wire.HttpDate()
        from reshard.aws.fidelity.behaviours import Behaviours  # the DynamoDB behaviours (step 2)
        self.behaviours = Behaviours(self)
        self._apply_settings(settings)
        self.listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(256)
        self.host, self.port = host, self.listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, name="fidelity-accept", daemon=True),
                         threading.Thread(target=self._timer_loop, name="fidelity-timer", daemon=True)]

    # ------------------------------------------------------------------ life
    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "FidelityProxy":
        for t in self._threads:
            t.start()
        self.behaviours.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self.behaviours.stop()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            held = list(self.held_.values())
            conns = list(self._conns)
        for h in held:  # a stopped proxy delivers nothing more
            if h.claim():
                h.finish(None, "dropped")
            h.released.set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._timer_wake:
            self._timer_wake.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(5)

    def __enter__(self) -> "FidelityProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Run until stopped (the ``python -m reshard.aws.fidelity`` process)."""
        self.start()
        self._stopped.wait()

    # ------------------------------------------------------------------ clock, counters
    def _now(self) -> float:
        return self.clock() + self.config["clock_offset"]

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self._counts[name] = self._counts.get(name, 0) + n

    # ------------------------------------------------------------------ connections
    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), name="fidelity-conn", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.lock:
            self._conns.add(sock)
        stream = wire.Stream(sock)
        try:
            while not self._stopped.is_set():
                try:
                    req = stream.read_request()
                except (OSError, ValueError):
                    return
                if req is None:
                    return
                if req.path.startswith(CONTROL_PREFIX):
                    answer = self._control_http(req)
                else:
                    try:
                        answer = self.handle(req)
                    except Exception as e:  # noqa: BLE001 - a proxy bug must not look like a lost answer
                        self.count("proxy_errors")
                        answer = aws_error(500, DYNAMODB_ERROR + "InternalServerError",
                                           f"fidelity proxy: {type(e).__name__}: {e}")
                if answer is CLOSE:
                    return
                try:
                    sock.sendall(wire.encode_answer(answer, self.http_date(self._now())))
                except OSError:
                    return  # the client went away (its read timeout, a SIGKILL): nothing to answer
                if b"\r\nconnection: close" in req.low:
                    return
        finally:
            with self.lock:
                self._conns.discard(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    # ------------------------------------------------------------------ the pipeline
    def handle(self, req: Request) -> Answer | None:
        """One client request: its answer, or CLOSE (the connection closed without one)."""
        self.count("requests")
        if self._blocked and self._blocked.intersection(req.tables()):
            self.count("blocked")
            return aws_error(500, DYNAMODB_ERROR + "InternalServerError", "fidelity proxy: this table is cut off")
        if self.rules_:
            rule = self._rule_for(req)
            if rule is not None:
                return self._apply(rule, req)
        if self.config["faults_enabled"]:
            answer = self._random_fault(req)
            if answer is not None:
                return answer
        return self.deliver(req)

    def deliver(self, req: Request, age: float = 0.0) -> Answer:
        """``req`` reaching DynamoDB now: the signature date first (AWS authenticates before
        anything else), then the behaviours, then upstream. ``age``: judge the date as if the
        request arrived that many seconds later (a held request's rule ``age``)."""
        window = self.config["signature_window"]
        if window:
            signed = req.header(b"x-amz-date")
            if signed:
                signed_at = wire.parse_amz_date(signed)
                if signed_at is not None:
                    refusal = wire.signature_refusal(signed, signed_at, self._now() + age, window)
                    if refusal is not None:
                        self.count("refused_signature")
                        return aws_error(400, CORAL_ERROR + "InvalidSignatureException", refusal)
        return self.behaviours.deliver(req)

    def forward(self, req: Request) -> Answer:
        """``req`` to upstream on this thread's keep-alive connection; upstream's answer.

        A failure after the request was sent answers 500 (the client retries, as after a
        DynamoDB 500: it may have been applied); it is never re-sent here.
        """
        local = self._local
        stream = getattr(local, "up", None)
        now = time.monotonic()
        if stream is not None and now - local.used > 1.0 and _dropped(stream.sock):
            self._drop_upstream()  # upstream closed the idle connection: a fresh one
            stream = None
        if stream is None:
            try:
                sock = socket.create_connection((self.up_host, self.up_port), timeout=60)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as e:
                self.count("upstream_errors")
                return aws_error(500, DYNAMODB_ERROR + "InternalServerError", f"fidelity proxy: upstream down: {e}")
            stream = local.up = wire.Stream(sock)
        try:
            stream.sock.sendall(req.raw(self.up_hostport))
            answer = stream.read_answer()
        except (OSError, ValueError) as e:
            self._drop_upstream()
            self.count("upstream_errors")
            return aws_error(500, DYNAMODB_ERROR + "InternalServerError", f"fidelity proxy: upstream failed: {e}")
        local.used = time.monotonic()
        if answer.close:
            self._drop_upstream()
        self.count("forwarded")
        return answer

    def upstream_call(self, op: str, body: dict) -> Answer:
        """A request of the proxy's own to upstream (DescribeTable, the TTL sweep's Scan and
        DeleteItem, a stale-read history's GetItem): signed with placeholder credentials, which
        dynalite and moto accept (they check a signature is there, not that it is right)."""
        from reshard.aws.lean import sign, signing_key
        raw = wire.dumps(body)
        headers = {"content-type": wire.JSON_TYPE, "x-amz-target": wire.TARGET_PREFIX + op}
        signed = sign(lambda s, d: signing_key(s, d, "us-east-1"), "fidelity", "fidelity", "us-east-1",
                      self.up_hostport, headers, raw, time.gmtime())
        headers.update({k.lower(): v for k, v in signed.items()})
        req = Request.make(headers, raw)
        req._json = body
        return self.forward(req)

    def _drop_upstream(self) -> None:
        stream = getattr(self._local, "up", None)
        self._local.up = None
        if stream is not None:
            try:
                stream.sock.close()
            except OSError:
                pass

    # ------------------------------------------------------------------ random faults (the chaos suite's)
    def _random_fault(self, req: Request) -> Answer | None:
        rates = self.config["fault_rates"]
        with self.lock:
            r_throttle, r_5xx, r_split = self.rng.random(), self.rng.random(), self.rng.random()
        if req.op in WRITE_OPS and r_throttle < rates.get("throttle", 0):
            self.count("throttle")
            return aws_error(400, DYNAMODB_ERROR + "ProvisionedThroughputExceededException", "injected throttle")
        if r_5xx < rates.get("5xx", 0):
            self.count("5xx")
            return aws_error(500, DYNAMODB_ERROR + "InternalServerError", "injected 500")
        if req.op == "BatchWriteItem" and r_split < rates.get("split", 0):
            return self._split_batch(req)
        return None

    def _split_batch(self, req: Request) -> Answer | None:
        """Forward a first part of a one-table BatchWriteItem; answer the rest as UnprocessedItems."""
        items = req.json.get("RequestItems") or {}
        if len(items) != 1:
            return None
        (table, reqs), = items.items()
        if len(reqs) < 2:
            return None
        with self.lock:
            cut = self.rng.randrange(1, len(reqs))
        answer = self.deliver(req.with_body(dict(req.json, RequestItems={table: reqs[:cut]})))
        if answer.status != 200:
            return answer
        body = answer.json
        unprocessed = (body.get("UnprocessedItems") or {}).get(table, []) + reqs[cut:]
        self.count("split")
        return answer.with_json(dict(body, UnprocessedItems={table: unprocessed}))

    # ------------------------------------------------------------------ rules
    def _rule_for(self, req: Request) -> Rule | None:
        with self.lock:
            rules = list(self.rules_)
        for rule in rules:
            if rule.matches(req):
                with self.lock:
                    if rule.take(self.rng):
                        return rule
        return None

    def _apply(self, rule: Rule, req: Request) -> Answer | None:
        self.count(f"rule_{rule.action}")
        if rule.action == "fail":
            return aws_error(rule.status, DYNAMODB_ERROR + rule.code, rule.message)
        if rule.action == "lose_answer":
            self.deliver(req)  # applied; its answer goes nowhere
            return CLOSE
        if rule.action == "duplicate":
            answer = self.deliver(req)
            if rule.copy == "now":
                copy = self._keep(rule, req, client=False, kind="copy", due=None)
                if copy.claim():
                    copy.finish(self.deliver(req, rule.age))
            else:
                self._keep(rule, req, client=False, kind="copy",
                           due=time.monotonic() + (rule.delay or 0.0) if rule.copy == "delay" else None)
            return answer
        # hold
        due = time.monotonic() + rule.delay if rule.delay is not None else None
        if rule.mode == "lose":
            self._keep(rule, req, client=False, kind="held", due=due)
            return CLOSE
        held = self._keep(rule, req, client=True, kind="held", due=None)  # this thread delivers it
        held.released.wait(rule.delay)
        if held.claim():
            if self._stopped.is_set():
                held.finish(None, "dropped")
                return CLOSE
            answer = self.deliver(req, rule.age)
            held.finish(answer)
            return answer
        held.done.wait()
        return held.outcome if held.state == "delivered" else CLOSE

    def _keep(self, rule: Rule, req: Request, *, client: bool, kind: str, due: float | None) -> Held:
        with self.lock:
            self._held_seq += 1
            held = Held(f"h{self._held_seq}", rule, req, self._now(), due, client, kind)
            self.held_[held.handle] = held
            self._held_changed.notify_all()
        self.count("held" if kind == "held" else "copies")
        if due is not None:
            with self._timer_wake:
                heapq.heappush(self._timers, (due, self._held_seq, held.handle))
                self._timer_wake.notify()
        return held

    def _timer_loop(self) -> None:
        while not self._stopped.is_set():
            with self._timer_wake:
                while not self._stopped.is_set() and (not self._timers or self._timers[0][0] > time.monotonic()):
                    wait = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._timer_wake.wait(wait)
                if self._stopped.is_set():
                    return
                _, _, handle = heapq.heappop(self._timers)
            held = self.held_.get(handle)
            if held is not None and held.claim():
                held.finish(self.deliver(held.request, held.rule.age))

    # ------------------------------------------------------------------ control
    def _call(self, name: str, **kwargs):
        fn = getattr(self, "_op_" + name, None)
        if fn is None:
            raise ValueError(f"unknown control call {name!r}")
        return fn(**kwargs)

    def _control_http(self, req: Request) -> Answer:
        name = req.path[len(CONTROL_PREFIX):].split("?", 1)[0]
        try:
            kwargs = req.json if req.body else {}
            if "where" in kwargs:
                raise ValueError("where= (a Python callable) is for in-process proxies only")
            return wire.json_answer({"result": self._call(name, **kwargs)})
        except TimeoutError as e:
            return wire.json_answer({"error": str(e), "kind": "TimeoutError"}, 400)
        except (TypeError, ValueError, KeyError) as e:
            return wire.json_answer({"error": f"{type(e).__name__}: {e}", "kind": "ValueError"}, 400)

    def _apply_settings(self, settings: dict) -> None:
        unknown = set(settings) - set(self.config) - set(self.behaviours.defaults())
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(sorted(unknown))}: known are "
                             f"{', '.join(sorted(set(self.config) | set(self.behaviours.defaults())))}")
        with self.lock:
            for k, v in settings.items():
                if k in self.config:
                    if k == "fault_rates":
                        bad = set(v) - {"throttle", "5xx", "split"}
                        if bad:
                            raise ValueError(f"unknown fault rate(s) {sorted(bad)}: throttle, 5xx, split")
                        self.config[k] = dict(self.config[k], **v)
                    elif k in ("signature_window", "clock_offset"):
                        self.config[k] = float(v or 0.0)
                    elif k == "blocked_tables":
                        self.config[k] = sorted(v)
                        self._blocked = frozenset(v)
                    else:
                        self.config[k] = v
            self.behaviours.configure({k: v for k, v in settings.items() if k not in self.config})

    def _op_configure(self, **settings) -> dict:
        self._apply_settings(settings)
        return self._op_settings()

    def _op_settings(self) -> dict:
        with self.lock:
            return {**{k: (dict(v) if isinstance(v, dict) else v) for k, v in self.config.items()},
                    **self.behaviours.settings()}

    def _op_now(self) -> float:
        return self._now()

    def _op_advance_clock(self, seconds: float) -> float:
        with self.lock:
            self.config["clock_offset"] += float(seconds)
            return self.config["clock_offset"]

    def _op_add_rule(self, action: str, **kwargs) -> str:
        with self.lock:
            self._rule_seq += 1
            rule = Rule(f"r{self._rule_seq}", action, **kwargs)
            self.rules_.append(rule)
        return rule.id

    def _op_remove_rule(self, rule: str) -> dict:
        with self.lock:
            found = [r for r in self.rules_ if r.id == rule]
            if not found:
                raise KeyError(f"no rule {rule!r}")
            self.rules_.remove(found[0])
            return found[0].describe()

    def _op_clear_rules(self) -> int:
        with self.lock:
            n, self.rules_ = len(self.rules_), []
        return n

    def _op_rules(self) -> list:
        with self.lock:
            return [r.describe() for r in self.rules_]

    def _op_held(self, rule: str | None = None, state: str | None = "held") -> list:
        with self.lock:
            return [h.describe() for h in self.held_.values()
                    if (rule is None or h.rule.id == rule) and (state is None or h.state == state)]

    def _op_wait_held(self, count: int = 1, rule: str | None = None, timeout: float = 10.0) -> list:
        deadline = time.monotonic() + timeout
        with self._held_changed:
            while True:
                found = [h for h in self.held_.values() if h.state == "held" and h.kind == "held"
                         and (rule is None or h.rule.id == rule)]
                if len(found) >= count:
                    return [h.describe() for h in found]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(found)} of {count} requests held after {timeout:g}s"
                                       + (f" (rule {rule})" if rule else ""))
                self._held_changed.wait(left)

    def _held(self, handle: str) -> Held:
        held = self.held_.get(handle)
        if held is None:
            raise KeyError(f"no held request {handle!r}")
        return held

    def _op_release(self, handle: str, timeout: float = 30.0) -> dict:
        held = self._held(handle)
        if held.client:
            held.released.set()  # the waiting connection's thread delivers and answers its client
        elif held.claim():
            held.finish(self.deliver(held.request, held.rule.age))
        if not held.done.wait(timeout):
            raise TimeoutError(f"{handle} was not delivered within {timeout:g}s")
        self.count("released")
        out = held.describe()
        if held.state != "delivered":
            raise KeyError(f"{handle} was {held.state}, not delivered")
        return out["outcome"]

    def _op_release_all(self, rule: str | None = None, timeout: float = 30.0) -> list:
        with self.lock:
            handles = [h.handle for h in self.held_.values()
                       if h.state == "held" and (rule is None or h.rule.id == rule)]
        return [self._op_release(h, timeout) for h in handles]

    def _op_drop(self, handle: str) -> dict:
        held = self._held(handle)
        if held.claim():
            held.finish(None, "dropped")
            self.count("dropped")
        held.released.set()
        return held.describe()

    def _op_ttl_sweep(self) -> int:
        return self.behaviours.ttl.sweep()

    def _op_stats(self) -> dict:
        with self.lock:
            out = {**dict.fromkeys(COUNTERS, 0), **self._counts}
            out["held_now"] = sum(1 for h in self.held_.values() if h.state == "held")
        out["cpu_seconds"] = time.process_time()
        out["threads"] = threading.active_count()
        out.update(self.behaviours.stats())
        return out

    def _op_reset_stats(self) -> dict:
        with self.lock:
            before, self._counts = self._counts, {}
        return before


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _dropped(sock: socket.socket) -> bool:
    """An idle keep-alive socket that is readable was closed by the other side."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r)
    except (OSError, ValueError):
        return True


# ---------------------------------------------------------------------------------- over HTTP
class RemoteFidelity(ControlAPI):
    """The control API of a proxy running elsewhere (another process), over HTTP."""

    def __init__(self, endpoint: str, timeout: float = 120.0):
        u = urlsplit(endpoint)
        self.host, self.port, self.timeout = u.hostname, u.port, timeout
        self._local = threading.local()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _call(self, name: str, **kwargs):
        import http.client
        import json
        timeout = max(self.timeout, float(kwargs.get("timeout") or 0) + 10)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("POST", CONTROL_PREFIX + name, json.dumps(kwargs).encode(),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = json.loads(resp.read() or b"{}")
        finally:
            conn.close()
        if resp.status != 200:
            kind = TimeoutError if body.get("kind") == "TimeoutError" else ValueError
            raise kind(body.get("error") or f"control call {name} answered {resp.status}")
        return body["result"]


class FidelityProcess(RemoteFidelity):
    """The proxy as a child process (``python -m reshard.aws.fidelity``); use as a context manager.

    It exits when this object stops it or when its parent goes away (its stdin closes).
    """

    def __init__(self, upstream: str, *, seed: int = 0, start_timeout: float = 20.0, **settings):
        super().__init__("http://127.0.0.1:0")
        self.upstream, self.seed, self.start_timeout, self.initial = upstream, seed, start_timeout, settings
        self.proc = None

    def start(self) -> "FidelityProcess":
        import pathlib
        import subprocess
        root = pathlib.Path(__file__).resolve().parents[3]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, "-m", "reshard.aws.fidelity", "--upstream", self.upstream,
                                      "--port", "0", "--seed", str(self.seed), "--exit-with-stdin"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        ready, _, _ = select.select([self.proc.stdout], [], [], self.start_timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the fidelity proxy did not start within {self.start_timeout:g}s")
        self.port = int(line)
        if self.initial:
            self.configure(**self.initial)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # it exits when its stdin closes
        except OSError:
            pass
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 - TimeoutExpired: make sure it goes
            proc.kill()
            proc.wait(5)
        proc.stdout.close()

    def __enter__(self) -> "FidelityProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
