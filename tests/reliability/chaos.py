"""Chaos support for the reliability suite: a faulty loopback proxy, the oracle, app threads.

FaultProxy
    The fidelity proxy (reshard/aws/fidelity) on 127.0.0.1 in front of dynalite, run by
    threads of the test process, with the chaos suite's random faults switched on. Every
    client goes through it -- the in-process shims and the ``python -m reshard``
    subprocesses -- so faults reach all of them. Per request it
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
    Under late faults (``late_window``), a write sent in an unfenced phase (the steady
    state: no version condition; every migration phase is fenced) may land up to that long after it ended -- a held
    request or a late duplicate, which DynamoDB refuses only past its horizon -- so only
    an acknowledged write started after that supersedes it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable

from reshard import errors
from reshard.aws.fidelity import FidelityProcess, FidelityProxy
from reshard.core.phases import ROUTING, STEADY, Phase

# ---------------------------------------------------------------------------------- proxy
class _BlockedTables(set):
    """``FaultProxy.blocked_tables``: a set whose changes reach the proxy at once."""

    def __init__(self, proxy: FidelityProxy):
        super().__init__()
        self._proxy = proxy

    def _sync(self) -> None:
        self._proxy.configure(blocked_tables=sorted(self))

    def add(self, table: str) -> None:
        super().add(table)
        self._sync()

    def discard(self, table: str) -> None:
        super().discard(table)
        self._sync()

    def clear(self) -> None:
        super().clear()
        self._sync()


class _Faults:
    """What the chaos suite reads of its proxy, in-process or a process: the switch and the
    old counters, through the control API both have (``settings``, ``configure``, ``stats``)."""

    def _faults_init(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.blocked_tables = _BlockedTables(self)

    @property
    def enabled(self) -> bool:
        return self.settings()["faults_enabled"]

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self.configure(faults_enabled=bool(on))

    @property
    def counts(self) -> dict:
        """The old counters: calls (every request), throttle, 5xx, split, blocked."""
        c = self.stats()
        return {"calls": c.get("requests", 0), **{k: c.get(k, 0) for k in ("throttle", "5xx", "split", "blocked")}}

    def faults(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if k != "calls"}


def _fault_settings(throttle: float, error5xx: float, split: float, settings: dict) -> dict:
    return {"faults_enabled": True, "fault_rates": {"throttle": throttle, "5xx": error5xx, "split": split},
            **settings}


class FaultProxy(_Faults, FidelityProxy):
    """The chaos suite's faults on the fidelity proxy (reshard/aws/fidelity), in a thread of
    this process, in front of dynalite on ``upstream_port``; see the module docstring.

    A thin wrapper: the rates become the proxy's ``fault_rates``, ``enabled`` its
    ``faults_enabled``, ``blocked_tables`` its ``blocked_tables``; everything else of the
    proxy (signature dates, held requests, lost answers, duplicates, the behaviours of
    issue 29) is there too, each off until switched on.
    """

    def __init__(self, upstream_port: int, seed: int, throttle: float = 0.10, error5xx: float = 0.03,
                 split: float = 0.20, **settings):
        super().__init__(f"http://127.0.0.1:{upstream_port}", seed=seed,
                         **_fault_settings(throttle, error5xx, split, settings))
        self._faults_init(upstream_port)
        self._writes: dict[str, int] = {}

    @property
    def rates(self) -> dict:
        return self.config["fault_rates"]  # the live dict: a test may update it in place

    @property
    def writes(self) -> dict[str, int]:
        """Write requests (PutItem, UpdateItem, DeleteItem, BatchWriteItem) forwarded, per table."""
        with self.lock:
            return dict(self._writes)

    def forward(self, req):
        if req.op in ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"):
            with self.lock:
                for t in req.tables():
                    self._writes[t] = self._writes.get(t, 0) + 1
        return super().forward(req)


class FaultProcess(_Faults, FidelityProcess):
    """:class:`FaultProxy` as a process of its own (``python -m reshard.aws.fidelity``): the same
    attributes, driven over its control API; its CPU (every behaviour on costs it more than a
    client request) stays out of the test process, where the application threads run."""

    def __init__(self, upstream_port: int, seed: int, throttle: float = 0.10, error5xx: float = 0.03,
                 split: float = 0.20, **settings):
        super().__init__(f"http://127.0.0.1:{upstream_port}", seed=seed,
                         **_fault_settings(throttle, error5xx, split, settings))
        self._faults_init(upstream_port)


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
    unfenced: bool = False     # sent in a phase without a version fence (the steady state only)


@dataclass
class Oracle:
    """The log of every write per logical key (see the module docstring)."""

    writes: dict[Any, list[Write]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: How long after it ended a write sent in an unfenced phase may still land (a late request
    #: or a late duplicate, refused by DynamoDB only past its horizon): such a write is
    #: superseded only by an acknowledged write that started after that. In a fenced phase its
    #: version refuses a late copy under any newer write, so no window there.
    late_window: float = 0.0
    #: Reads (and final states) valid only thanks to ``late_window``: what it let through.
    window_saves: list = field(default_factory=list)

    def record(self, key, w: Write) -> None:
        with self.lock:
            self.writes.setdefault(key, []).append(w)

    def history(self, key) -> list[Write]:
        with self.lock:
            return list(self.writes.get(key, ()))

    def candidates(self, key, read_start: float, read_end: float, window: float | None = None) -> list[Write]:
        hist = self.history(key)
        window = self.late_window if window is None else window
        out = []
        for w in hist:
            if w.start > read_end:
                continue
            landed_by = w.end + window if w.unfenced else w.end
            superseded = any(o.acked and o.start > landed_by and o.end < read_start for o in hist)
            if not superseded:
                out.append(w)
        return out

    def check(self, key, got: dict | None, read_start: float, read_end: float) -> str | None:
        """None when ``got`` is a valid read; else 'lost', 'resurrected' or 'stale' with detail."""
        cands = self.candidates(key, read_start, read_end)
        token = got.get("op", "<no op>") if got else ABSENT

        def shows(w: Write) -> bool:
            return w.token == token and (got is None or all(got.get(k) == v for k, v in (w.expect or {}).items()))

        if any(shows(w) for w in cands):
            if self.late_window and not any(shows(w) for w in self.candidates(key, read_start, read_end, 0.0)):
                with self.lock:
                    self.window_saves.append(f"{key} read {token!r} at [{read_start:.3f}, {read_end:.3f}]")
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


def unfenced(phase: str) -> bool:
    """A shim write in ``phase`` (ShardedTable.phase) carries no version fence: a late copy of
    it lands over newer writes until its horizon, as plain DynamoDB writes do (docs/shim.md)."""
    if phase == "steady":
        return not STEADY.fenced
    try:
        return not ROUTING[Phase(phase)].fenced
    except (ValueError, KeyError):  # e.g. held by a switch: fenced phases on both sides
        return False


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
        w = Write(token, kind, time.monotonic(), math.inf, False, expect, f"{self.name}@{self.table.phase}",
                  unfenced=unfenced(self.table.phase))
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
            w.unfenced = w.unfenced or unfenced(self.table.phase)
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
