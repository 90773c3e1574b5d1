"""Deterministic interleaving of actors over the in-memory DynamoDB.

An *actor* is a Python callable run in its own thread (a shim doing ``put_item``, a
copier doing one page, an operator's transition). The scheduler installs itself as the
memory client's interceptor, so every call an actor makes into the client is a *yield
point*: the actor parks there, announcing the call it is about to make, until the
scheduler lets exactly that actor proceed. The call then runs (under the client's lock)
and the actor runs on to its next yield point (or to its end) before anything else
happens. So one *step* = one DynamoDB call plus the actor's local computation after it,
and only one actor ever runs at a time: a run is a deterministic function of the order
in which actors are stepped.

Besides stepping, a test (or the explorer) can

* **stall** an actor: it stays parked, not eligible, until **resumed** (a GC pause, a
  host frozen past its lease -- combine with :meth:`Scheduler.tick` to let the clock run);
* **kill** an actor: its thread is abandoned between two calls. It is woken with
  :class:`Killed` (a ``BaseException``) raised from the yield point, and *any* later call
  from that thread raises ``Killed`` again without reaching the database: a killed actor
  never makes another call, whatever ``finally`` blocks or ``except BaseException``
  handlers the product code runs while its stack unwinds;
* **tick** the logical clock. ``LogicalClock`` is a ``time.time``-like callable to inject
  wherever reshard takes ``clock=`` (``ControlStore``, ``SegmentEngine``, ``ShardedTable``);
  :meth:`Scheduler.sleep` is the matching ``sleep=``: a yield point that, when granted,
  advances the clock by the time slept (time passes while a process waits).

and, to model the network and the server (the contract's fault model, PRODUCT.md 5b):

* **hold** an actor's call: the request is kept as it was sent (its signing date too, see
  ``reshard.aws.signing.SIGN_DATE``) and the actor's connection times out (a retryable
  error: the product retries per its policy); the held request is **delivered** later, at
  any scheduling point, once or twice -- the server checks its signature's age against the
  clock *then*, as DynamoDB does;
* **lose** the answer of an actor's call: the request is applied, the actor times out.

Calls made from a thread the scheduler does not know (a product thread pool) while
actors run are refused with ``RuntimeError``: they would escape the schedule. The
scheduler's own thread may call freely between steps (to inspect, or to set up).
"""

from __future__ import annotations

import copy
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from tests.model.memory_dynamo import MemoryDynamo

#: How long a step may take (real seconds) before the actor counts as stuck outside the
#: scheduler (blocked on a lock, a queue, a thread pool, a real sleep...). Generous: only a real
#: block should reach it, and at load 30 on two cores one step of an operator's `start` in
#: the issue-25 scenarios once took more than 10 s.
STEP_TIMEOUT = 60.0


class Killed(BaseException):
    """Raised inside a killed actor's thread: it never makes another call."""


class StuckActor(RuntimeError):
    """An actor neither reached a yield point nor finished within STEP_TIMEOUT."""


class LogicalClock:
    """Wall-clock seconds that move only when told (``tick``) or when an actor sleeps."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.t = float(start)

    def __call__(self) -> float:
        return self.t

    def now_ms(self) -> int:
        """For ``VersionClock(now_ms=...)``."""
        return int(self.t * 1000)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the clock never goes back")
        self.t += seconds


@dataclass
class Step:
    """One entry of a run's trace."""

    index: int
    actor: str
    op: str
    detail: str
    result: str = ""

    def line(self) -> str:
        return f"{self.index:4d}  {self.actor:<10} {self.op:<16} {self.detail}" + \
            (f"  ->  {self.result}" if self.result else "")


@dataclass
class Held:
    """A request kept by the network (:meth:`Scheduler.hold`), to be delivered later."""

    ident: int
    actor: str
    op: str
    kwargs: dict
    sign: float | None          # the SigV4 date it was sent with (None: "now" at delivery)
    copies: int                 # deliveries left (2: it may arrive twice)
    detail: str = ""


@dataclass
class Actor:
    name: str
    fn: Callable[[], Any]
    thread: threading.Thread | None = None
    state: str = "new"  # new, running, parked, done, failed, killed, stuck
    pending: tuple | None = None  # (op, kwargs) at the yield point
    sign: float | None = None  # the pending call's signing date (SIGN_DATE on its thread)
    fate: str | None = None  # what the network does to the call being stepped: None, "hold", "lose"
    current_fate: str | None = None  # ... to the call running now (for the trace)
    held_id: int = 0  # the id of its last held request
    stalled: bool = False
    killed: bool = False
    calls: int = 0
    result: Any = None
    error: BaseException | None = None
    current: Step | None = None
    go: threading.Event = field(default_factory=threading.Event)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "killed", "stuck")


class Scheduler:
    """Runs actors one call at a time, in the order the caller decides."""

    def __init__(self, db: MemoryDynamo, clock: LogicalClock | None = None, *, sleep_advances_clock: bool = True,
                 step_timeout: float = STEP_TIMEOUT):
        self.db = db
        self.clock = clock or LogicalClock()
        self.sleep_advances_clock = sleep_advances_clock
        self.step_timeout = step_timeout
        self.actors: dict[str, Actor] = {}
        self.trace: list[Step] = []
        self._cv = threading.Condition()
        self._by_thread: dict[int, Actor] = {}
        self._owner = threading.get_ident()
        self.running = False
        #: Actors with a guarded request in flight (its lease check passed, not landed yet):
        #: name -> the logical time by which it must land (see :meth:`sent`).
        self.in_flight: dict[str, float] = {}
        #: Requests the network holds (:meth:`hold`), by id, until delivered (:meth:`deliver`).
        self.held: dict[int, Held] = {}
        self._held_ids = 0
        db.interceptor = self

    # ---------------------------------------------------------------- set-up
    def actor(self, name: str, fn: Callable[[], Any]) -> Actor:
        if name in self.actors:
            raise ValueError(f"two actors named {name!r}")
        if self.running:
            raise RuntimeError("add actors before start()")
        a = self.actors[name] = Actor(name, fn)
        return a

    def start(self) -> None:
        """Start every actor, one after the other, each up to its first yield point (or its end)."""
        self.running = True
        for a in self.actors.values():
            a.thread = threading.Thread(target=self._body, args=(a,), name=f"actor-{a.name}", daemon=True)
            with self._cv:
                a.state = "running"
            a.thread.start()
            self._wait(a)

    def _body(self, a: Actor) -> None:
        self._by_thread[threading.get_ident()] = a
        final = "done"
        try:
            a.result = a.fn()
        except Killed:
            final = "killed"
        except BaseException as e:  # noqa: BLE001 - reported, not swallowed: see Actor.error
            a.error = e
            final = "killed" if a.killed else "failed"
        finally:
            self._by_thread.pop(threading.get_ident(), None)
            self.in_flight.pop(a.name, None)
            with self._cv:
                a.state = final
                a.pending = None
                self._cv.notify_all()

    def _wait(self, a: Actor) -> None:
        with self._cv:
            ok = self._cv.wait_for(lambda: a.state != "running", self.step_timeout)
        if not ok:
            a.state = "stuck"
            raise StuckActor(f"actor {a.name} neither made a call nor finished within {self.step_timeout}s: it is "
                             "blocked outside the scheduler (a lock, a thread pool, a real sleep?)")

    # ---------------------------------------------------------------- the schedule
    def enabled(self) -> list[str]:
        """Actors that can be stepped now: parked at a call, not stalled."""
        return [n for n, a in self.actors.items() if a.state == "parked" and not a.stalled]

    def parked(self) -> list[str]:
        return [n for n, a in self.actors.items() if a.state == "parked"]

    def step(self, name: str, fate: str | None = None) -> Step:
        """Let ``name`` make its pending call and run on to its next yield point (``fate``: see
        :meth:`hold` and :meth:`lose`)."""
        a = self.actors[name]
        if a.state != "parked":
            raise RuntimeError(f"actor {name} is {a.state}, not at a call")
        if a.stalled:
            raise RuntimeError(f"actor {name} is stalled")
        op, kwargs = a.pending
        entry = Step(len(self.trace) + 1, name, op, describe(self.db, op, kwargs))
        self.trace.append(entry)
        a.current = entry
        a.calls += 1
        a.fate = fate
        if fate == "hold":
            self._held_ids += 1
            a.held_id = self._held_ids
            self.held[self._held_ids] = Held(self._held_ids, name, op, copy.deepcopy(kwargs), a.sign, self._copies,
                                             entry.detail)
        with self._cv:
            a.state = "running"
        a.go.set()
        self._wait(a)
        return entry

    #: How many times a held request may be delivered (set by :meth:`hold`).
    _copies = 1

    def hold(self, name: str, copies: int = 1) -> Step:
        """``name``'s pending call is kept by the network (delivered later by :meth:`deliver`,
        up to ``copies`` times); the actor times out at once and runs on (it retries or gives up
        per its retry policy) to its next yield point."""
        self._copies = copies
        try:
            return self.step(name, fate="hold")
        finally:
            self._copies = 1

    def lose(self, name: str) -> Step:
        """``name``'s pending call is applied, and its answer lost: the actor times out."""
        return self.step(name, fate="lose")

    def deliver(self, ident: int) -> Step:
        """The held request ``ident`` arrives at the server now (the scheduler's thread applies
        it: the server checks its signing date against the clock *now*)."""
        h = self.held[ident]
        h.copies -= 1
        if h.copies <= 0:
            del self.held[ident]
        entry = Step(len(self.trace) + 1, "network", "deliver", f"#{h.ident} ({h.actor}'s {h.op}) {h.detail}")
        self.trace.append(entry)
        resp, err = None, None
        try:
            resp = self.db.deliver(h.op, h.kwargs, h.sign)
        except Exception as e:  # noqa: BLE001 - the answer goes nowhere: only the trace shows it
            err = e
        entry.result = outcome(h.op, resp, err)
        return entry

    def drop_held(self) -> None:
        """The held requests never arrive (the end of a run)."""
        for ident in list(self.held):
            self._note("network", "drop", f"#{ident} never arrives")
        self.held.clear()

    def run(self, order: list[str]) -> None:
        for name in order:
            self.step(name)

    def run_to_end(self, pick: Callable[[list[str]], str] = lambda names: names[0], max_steps: int = 10_000) -> None:
        """Step enabled actors (the first by default) until none is left."""
        for _ in range(max_steps):
            names = self.enabled()
            if not names:
                return
            self.step(pick(names))
        raise RuntimeError(f"still running after {max_steps} steps")

    def stall(self, name: str) -> None:
        self.actors[name].stalled = True
        self._note(name, "stall", "(paused: not scheduled until resumed)")

    def resume(self, name: str) -> None:
        self.actors[name].stalled = False
        self._note(name, "resume", "")

    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self._note("clock", "tick", f"+{seconds:g}s -> t={self.clock():.3f}")

    def kill(self, name: str) -> None:
        """Abandon ``name`` between two calls: it never makes another call."""
        a = self.actors[name]
        if a.finished:
            return
        if a.state != "parked":
            raise RuntimeError(f"actor {name} is {a.state}: only a parked actor can be killed")
        a.killed = True
        self.in_flight.pop(name, None)  # a request that never lands: it was lost with the process
        self._note(name, "kill", f"(before its call {describe(self.db, *a.pending)})")
        with self._cv:
            a.state = "running"
        a.go.set()
        self._wait(a)

    def shutdown(self) -> None:
        """Kill every actor still parked (end of a bounded run) and stop intercepting."""
        for name, a in self.actors.items():
            if a.state == "parked":
                a.killed = True
                with self._cv:
                    a.state = "running"
                a.go.set()
                try:
                    self._wait(a)
                except StuckActor:
                    pass
        self.running = False

    def _note(self, actor: str, op: str, detail: str) -> None:
        self.trace.append(Step(len(self.trace) + 1, actor, op, detail))

    # ---------------------------------------------------------------- the interceptor
    def before(self, op: str, kwargs: dict) -> None:
        a = self._by_thread.get(threading.get_ident())
        if a is None:
            if self.running and threading.get_ident() != self._owner:
                raise RuntimeError(f"{op} from thread {threading.current_thread().name!r}, which is no actor: calls "
                                   "outside the schedule would make runs nondeterministic")
            return
        if a.killed:
            raise Killed(a.name)
        from reshard.aws.signing import SIGN_DATE
        with self._cv:
            a.pending = (op, kwargs)
            a.sign = SIGN_DATE.get()
            a.state = "parked"
            self._cv.notify_all()
        a.go.wait()
        a.go.clear()
        if a.killed:
            raise Killed(a.name)
        fate, a.fate = a.fate, None
        a.current_fate = fate
        return fate

    def after(self, op: str, kwargs: dict, resp: dict | None, err: BaseException | None) -> None:
        a = self._by_thread.get(threading.get_ident())
        if a is None:
            return
        self.in_flight.pop(a.name, None)  # the request landed (or the network kept it)
        if a.current is not None:
            fate = a.current_fate
            if fate == "hold":
                a.current.result = f"held by the network as #{a.held_id}; {a.name} times out"
            elif fate == "lose":
                a.current.result = outcome(op, resp, err) + f"; the answer is lost, {a.name} times out"
            else:
                a.current.result = outcome(op, resp, err)
            a.current_fate = None

    # ---------------------------------------------------------------- guarded requests
    def current(self) -> str | None:
        """The name of the actor whose thread calls this (None: not an actor)."""
        a = self._by_thread.get(threading.get_ident())
        return a.name if a else None

    def is_actor(self) -> bool:
        """The calling thread is one of this scheduler's actors."""
        return threading.get_ident() in self._by_thread

    def before_guard(self, operation: str, kwargs: dict) -> None:
        """A yield point just before a request's guard (a job's lease-deadline check) runs: an
        actor frozen here has *not* checked its deadline yet, so its check sees the freeze."""
        if self._by_thread.get(threading.get_ident()) is not None:
            self.before("guard", {"operation": operation, "request": kwargs})

    def sent(self, land_by: float) -> None:
        """The calling actor's guard passed: its request is in flight and lands by ``land_by``
        (logical time). Until it lands, no move may advance the clock past that (the explorer's
        :meth:`World.moves`): a request in flight lasts at most the longest request time."""
        a = self._by_thread.get(threading.get_ident())
        if a is not None:
            self.in_flight[a.name] = land_by

    # ---------------------------------------------------------------- injectable sleep
    def sleep(self, seconds: float) -> None:
        """``sleep=`` for product code: a yield point; when granted, the clock moves by ``seconds``."""
        a = self._by_thread.get(threading.get_ident())
        if a is None:
            self.clock.advance(seconds)
            return
        self.before("sleep", {"seconds": seconds})
        if self.sleep_advances_clock:
            self.clock.advance(seconds)
        if a.current is not None:
            a.current.result = f"t={self.clock():.3f}"


# --------------------------------------------------------------------------- trace text

_PLACEHOLDER = re.compile(r"[#:][A-Za-z0-9_]+")


def short(v: Any, limit: int = 40) -> str:
    """A wire value, compactly: ``{"S": "x"}`` -> ``x``, ``{"N": "3"}`` -> ``3``."""
    if isinstance(v, dict) and len(v) == 1:
        t, x = next(iter(v.items()))
        if t in ("S", "N"):
            text = str(x)
        elif t == "B":
            text = repr(bytes(x))
        elif t == "BOOL":
            text = "true" if x else "false"
        elif t == "NULL":
            text = "null"
        elif t in ("SS", "NS", "BS"):
            text = "{" + ",".join(str(i) for i in x) + "}"
        elif t == "L":
            text = "[" + ",".join(short(i, 12) for i in x) + "]"
        else:
            text = "{" + ",".join(f"{k}={short(i, 12)}" for k, i in x.items()) + "}"
    else:
        text = str(v)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def item_text(item: dict | None, keys: list[str] | None = None, limit: int = 6) -> str:
    if item is None:
        return "none"
    order = [k for k in (keys or []) if k in item] + sorted(k for k in item if k not in (keys or []))
    parts = [f"{k}={short(item[k])}" for k in order[:limit]]
    if len(order) > limit:
        parts.append(f"+{len(order) - limit}")
    return "{" + ", ".join(parts) + "}"


def expression_text(expr: str, names: dict | None, values: dict | None) -> str:
    """An expression with its placeholders replaced by names and (compact) values."""
    def sub(m):
        t = m.group()
        if t.startswith("#"):
            return (names or {}).get(t, t)
        return short((values or {}).get(t, t), 24) if t in (values or {}) else t
    return _PLACEHOLDER.sub(sub, expr)


def _keys_of(db: MemoryDynamo, table: str) -> list[str]:
    t = db.tables.get(table)
    return t.key_attrs if t else []


def describe(db: MemoryDynamo, op: str, kw: dict) -> str:
    """What a call is about to do, in one line: table, key, condition."""
    if op == "sleep":
        return f"{kw['seconds']:g}s"
    if op == "guard":  # the lease-deadline check before a request
        return f"lease check, then {kw['operation']} " + describe(db, kw["operation"], kw["request"])
    table = kw.get("TableName", "")
    names, values = kw.get("ExpressionAttributeNames"), kw.get("ExpressionAttributeValues")
    keys = _keys_of(db, table)
    out = [table]
    if op == "put_item":
        out.append(item_text(kw["Item"], keys))
    elif "Key" in kw:
        out.append(item_text(kw["Key"], keys))
    if op == "update_item" and kw.get("UpdateExpression"):
        out.append(expression_text(kw["UpdateExpression"], names, values))
    if kw.get("KeyConditionExpression"):
        out.append("where " + expression_text(kw["KeyConditionExpression"], names, values))
    if op == "scan" and "TotalSegments" in kw:
        out.append(f"segment {kw.get('Segment')}/{kw['TotalSegments']}")
    if kw.get("ExclusiveStartKey"):
        out.append("after " + item_text(kw["ExclusiveStartKey"]))
    if kw.get("Limit"):
        out.append(f"limit {kw['Limit']}")
    if kw.get("FilterExpression"):
        out.append("filter " + expression_text(kw["FilterExpression"], names, values))
    if kw.get("ConditionExpression"):
        out.append("if " + expression_text(kw["ConditionExpression"], names, values))
    if op == "batch_write_item":
        for t, reqs in kw["RequestItems"].items():
            ks = _keys_of(db, t)
            parts = [("put " + item_text(r["PutRequest"]["Item"], ks, 3)) if "PutRequest" in r
                     else ("delete " + item_text(r["DeleteRequest"]["Key"], ks)) for r in reqs]
            out = [t, "; ".join(parts[:4]) + (f"; +{len(parts) - 4}" if len(parts) > 4 else "")]
    if op == "batch_get_item":
        out = [f"{t} {len(r['Keys'])} keys: " + ", ".join(item_text(k) for k in r["Keys"][:3])
               for t, r in kw["RequestItems"].items()]
    return " ".join(p for p in out if p)


def outcome(op: str, resp: dict | None, err: BaseException | None) -> str:
    if err is not None:
        code = getattr(err, "response", {}).get("Error", {}).get("Code", type(err).__name__)
        return "ConditionalCheckFailed" if code == "ConditionalCheckFailedException" else code
    resp = resp or {}
    if op == "get_item":
        return item_text(resp.get("Item"))
    if op in ("query", "scan"):
        items = resp.get("Items", [])
        more = " (more)" if resp.get("LastEvaluatedKey") else ""
        return f"{len(items)} items{more}: " + ", ".join(item_text(i, limit=3) for i in items[:3]) if items \
            else f"0 items{more}"
    if op == "batch_get_item":
        return ", ".join(f"{t}: {len(v)} found" for t, v in resp.get("Responses", {}).items())
    if "Attributes" in resp:
        return "ok " + item_text(resp["Attributes"])
    return "ok"
