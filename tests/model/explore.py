"""A bounded explorer of interleavings: stateless model checking by replay.

A *scenario factory* ``factory(world)`` sets up a fresh world -- tables and seed items
through ``world.dynamo`` (or ``world.db``), actors through ``world.actor(name, fn)``,
optional environment moves (``world.may_tick``, ``world.may_kill``) -- and returns the
invariant check, a callable raising ``AssertionError`` when the final state is wrong.

:func:`explore` enumerates every *schedule* up to ``max_steps`` moves, depth first. A
move is one of: step an actor (``"A"``: its pending call and its computation up to the
next call), advance the clock (``"tick"``), kill an actor (``"kill:A"``), and the network's
moves: hold an actor's request and time it out (``"hold:A"``), deliver a held request
(``"deliver:1"``, at any later point, maybe twice), lose an answer (``"lose:A"``), and at
the end of a run, never deliver what is still held (``"drop"``); freeze an actor before a
call while the clock runs on (``"freeze:A"``, :meth:`World.may_freeze`). Every schedule
is run from scratch (a new world from the factory, the prefix replayed, then the first
enabled move at every later point), and the alternatives seen at each point past the
prefix are pushed onto the stack: every leaf of the tree of choices is run exactly once.
No state is snapshotted or hashed, so a scenario must be deterministic given its
schedule (the explorer checks that replays see the same choices).

Long actors (a real ``transition`` makes 14 calls) make the full tree astronomically
wide; two bounds keep exhaustive search useful: ``max_steps`` (depth: truncated runs are
not checked unless ``check_truncated``) and ``preemption_bound`` (CHESS-style: at most k
switches away from an actor that could have gone on -- most concurrency bugs need very
few). With ``samples=N`` the explorer then runs N schedules chosen at random (seeded)
up to ``sample_max_steps``, with no preemption bound.

The first violation -- the check failed, or an actor raised -- is reported with its
schedule and its trace (actor, call, table, key, condition, result per step), and
:func:`replay` reproduces it.
"""

from __future__ import annotations

import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from reshard.aws.dynamo import Dynamo, RetryPolicy
from tests.model.memory_dynamo import MemoryDynamo
from tests.model.scheduler import LogicalClock, Scheduler, Step

TICK = "tick"
DROP = "drop"
#: The operations that change an item (what ``may_hold`` / ``may_lose`` apply to by default).
WRITES = ("put_item", "update_item", "delete_item", "batch_write_item")


def writes_to(*tables: str) -> Callable[[str, dict], bool]:
    """A ``where=`` for :meth:`World.may_hold` / :meth:`World.may_lose`: item writes to ``tables``."""
    def where(op: str, kwargs: dict) -> bool:
        if op not in WRITES:
            return False
        if op == "batch_write_item":
            return any(t in tables for t in kwargs.get("RequestItems", {}))
        return kwargs.get("TableName") in tables
    return where


class ModelDynamo(Dynamo):
    """The real choke point, plus the model's view of a guarded request (``call(guard=...)``,
    a job's lease-deadline check before every attempt of a data write or a renewal), when the
    world asks for it (:attr:`World.max_request_seconds`):

    * a yield point just *before* the guard (``guard`` in the trace): an actor frozen there
      has not checked its deadline yet, so the check sees the freeze;
    * once the guard passed, the request is *in flight* and lands within
      ``max_request_seconds`` of logical time (the explorer lets no move advance the clock
      past that before it lands): the bound the product's time fence relies on (every
      attempt's connect + read timeout). A freeze after the check is that request in
      flight, never longer.
    """

    world: "World"

    def call(self, operation: str, *, guard=None, horizon=None, **kwargs) -> dict:
        w = self.world
        if guard is None or w.max_request_seconds is None or not w.sched.is_actor():
            return super().call(operation, guard=guard, horizon=horizon, **kwargs)
        inner = guard

        def checked() -> None:
            w.sched.before_guard(operation, kwargs)
            inner()
            w.sched.sent(w.clock() + w.max_request_seconds)
        return super().call(operation, guard=checked, horizon=horizon, **kwargs)


class World:
    """One run's universe: the memory DynamoDB, the choke point over it, a clock, the scheduler."""

    #: The world most recently made (runs are sequential): for product functions that take
    #: their clock and sleep only as defaults (see ``tests/model/conftest.py``).
    current: "World | None" = None

    def __init__(self, clock_start: float = 1_700_000_000.0):
        self.clock = LogicalClock(clock_start)
        self.db = MemoryDynamo(clock=self.clock)
        self.sched = Scheduler(self.db, self.clock)
        #: The real reshard choke point; never sleeps for real (retries back off on the logical clock).
        self.dynamo = ModelDynamo(self.db, retry=RetryPolicy(max_attempts=3, base_seconds=0.0,
                                                             max_backoff_seconds=0.0), sleep=self.sched.sleep)
        self.dynamo.world = self
        #: None: guarded requests are plain calls. A number: the longest a guarded request is
        #: in flight after its guard passed (see :class:`ModelDynamo`); set it to the jobs'
        #: ``max_request_seconds``.
        self.max_request_seconds: float | None = None
        World.current = self
        self.tick_seconds = 0.0
        self.ticks_left = 0
        self.kills_left: dict[str, int] = {}
        #: The network's moves per actor: times left, and which of its calls they apply to.
        self.holds_left: dict[str, tuple[int, int, Callable[[str, dict], bool]]] = {}
        self.loses_left: dict[str, tuple[int, Callable[[str, dict], bool]]] = {}
        #: Freeze points per actor: (times left, seconds) -- see :meth:`may_freeze`.
        self.freezes_left: dict[str, tuple[int, float]] = {}
        self.truncated = False
        #: Preemption bounding (CHESS): at most this many switches away from an actor that could
        #: have gone on. None: unbounded. Ticks and kills are not switches.
        self.preemption_bound: int | None = None
        self.preemptions = 0
        self.last_actor: str | None = None

    def actor(self, name: str, fn: Callable[[], object]) -> None:
        if name in (TICK, DROP, "network") or name.startswith(("kill:", "hold:", "lose:", "deliver:", "freeze:")):
            raise ValueError(f"actor name {name!r} is reserved")
        self.sched.actor(name, fn)

    def may_tick(self, seconds: float, times: int = 1) -> None:
        """Let the explorer advance the clock by ``seconds``, up to ``times`` times, at any point."""
        self.tick_seconds, self.ticks_left = seconds, times

    def may_kill(self, name: str, times: int = 1) -> None:
        """Let the explorer kill ``name`` at any point where it waits at a call."""
        self.kills_left[name] = times

    def may_hold(self, name: str, times: int = 1, copies: int = 1,
                 where: Callable[[str, dict], bool] = lambda op, kw: op in WRITES) -> None:
        """Let the network hold up to ``times`` of ``name``'s calls (those ``where`` accepts): the
        actor times out, the request arrives at any later point, ``copies`` times at most (2: it may
        be delivered twice), or never."""
        self.holds_left[name] = (times, copies, where)

    def may_lose(self, name: str, times: int = 1,
                 where: Callable[[str, dict], bool] = lambda op, kw: op in WRITES) -> None:
        """Let the network lose the answer of up to ``times`` of ``name``'s calls (applied, the
        actor times out and retries per its policy)."""
        self.loses_left[name] = (times, where)

    def may_freeze(self, name: str, seconds: float, times: int = 1) -> None:
        """Let ``name`` freeze for ``seconds`` of logical time (past any horizon: a GC pause, a
        stopped VM) just before any of its calls but a sleep, up to ``times`` times: the clock
        runs on while ``name`` stays at that call; every actor may go next (the others act
        during the freeze). Unlike :meth:`may_tick` it is offered only where ``name`` is about
        to call. A request in flight (its lease check passed) is not frozen past its bound
        unless ``max_request_seconds`` is None (the contract's fault model)."""
        self.freezes_left[name] = (times, seconds)

    @property
    def sleep(self) -> Callable[[float], None]:
        return self.sched.sleep

    @property
    def trace(self) -> list[Step]:
        return self.sched.trace

    @property
    def errors(self) -> dict[str, BaseException]:
        return {n: a.error for n, a in self.sched.actors.items() if a.error is not None and not a.killed}

    def steppable(self) -> list[str]:
        """Actors that may be stepped now: enabled, and not moving the clock past a request in
        flight (it lands within the longest request time: another actor's sleep waits for it)."""
        steps = self.sched.enabled()
        if self.sched.in_flight:
            land_by = min(self.sched.in_flight.values())
            steps = [n for n in steps if n in self.sched.in_flight or self.clock() + self._sleeps(n) <= land_by]
        return steps

    def moves(self) -> list[str]:
        steps = self.steppable()
        if not steps:
            # Every actor is done (or stalled): what the network still holds arrives now, or never.
            return [f"deliver:{i}" for i in self.sched.held] + ([DROP] if self.sched.held else [])
        if self.preemption_bound is not None and self.preemptions >= self.preemption_bound \
                and self.last_actor in steps:
            steps = [self.last_actor]  # no switch left: the running actor goes on
        out = list(steps)
        if self.ticks_left > 0 and (not self.sched.in_flight or
                                    self.clock() + self.tick_seconds <= min(self.sched.in_flight.values())):
            out.append(TICK)
        out += [f"kill:{n}" for n in steps if self.kills_left.get(n, 0) > 0]
        out += [f"freeze:{n}" for n in steps if self._may_freeze(n)]
        out += [f"hold:{n}" for n in steps if self._network(self.holds_left, n)]
        out += [f"lose:{n}" for n in steps if self._network(self.loses_left, n)]
        out += [f"deliver:{i}" for i in self.sched.held]
        return out

    def _may_freeze(self, name: str) -> bool:
        times, seconds = self.freezes_left.get(name, (0, 0.0))
        if times <= 0 or self.sched.actors[name].pending[0] == "sleep":
            return False
        return not self.sched.in_flight or self.clock() + seconds <= min(self.sched.in_flight.values())

    def _network(self, table: dict, name: str) -> bool:
        entry = table.get(name)
        if not entry or entry[0] <= 0:
            return False
        op, kwargs = self.sched.actors[name].pending
        return op not in ("sleep", "guard") and entry[-1](op, kwargs)

    def _sleeps(self, name: str) -> float:
        """How far stepping ``name`` moves the clock (its pending call is a sleep)."""
        op, kwargs = self.sched.actors[name].pending
        return float(kwargs["seconds"]) if op == "sleep" else 0.0

    def apply(self, move: str) -> None:
        if move == TICK:
            self.ticks_left -= 1
            self.sched.tick(self.tick_seconds)
        elif move.startswith("kill:"):
            name = move[5:]
            self.kills_left[name] -= 1
            self.sched.kill(name)
        elif move.startswith("freeze:"):
            name = move[7:]
            times, seconds = self.freezes_left[name]
            self.freezes_left[name] = (times - 1, seconds)
            self.sched.clock.advance(seconds)
            self.sched._note(name, "freeze", f"frozen {seconds:g}s before its {self.sched.actors[name].pending[0]} "
                                              f"-> t={self.clock():.3f}")
            self.last_actor = None  # the freeze lets any actor go next: no preemption counted
        elif move.startswith("deliver:"):
            self.sched.deliver(int(move[8:]))
        elif move == DROP:
            self.sched.drop_held()
        elif move.startswith(("hold:", "lose:")):
            kind, name = move.split(":", 1)
            self._count_preemption(name)
            if kind == "hold":
                times, copies, where = self.holds_left[name]
                self.holds_left[name] = (times - 1, copies, where)
                self.sched.hold(name, copies)
            else:
                times, where = self.loses_left[name]
                self.loses_left[name] = (times - 1, where)
                self.sched.lose(name)
        else:
            self._count_preemption(move)
            self.sched.step(move)

    def _count_preemption(self, name: str) -> None:
        if self.last_actor not in (None, name) and self.last_actor in self.steppable():
            self.preemptions += 1
        self.last_actor = name


#: How often a gate re-reads the job leases while it waits for them to go quiet, on the
#: logical clock (the product polls every 0.5 s; a coarser poll only makes the gate wait a
#: little longer -- a token is timed from its first look -- with far fewer identical reads).
GATE_POLL_SECONDS = 4.0
#: How often a wait on the server's clock (``control/horizon.await_phase_age``: a phase lasting
#: H + 2 s) re-reads the control row here (the product: every second). Coarser only ends a wait
#: later (each look's ``Date`` decides), with far fewer identical reads.
HORIZON_POLL_SECONDS = 7.0


class InlineExecutor:
    """A ``ThreadPoolExecutor`` stand-in that runs each task at once on the calling thread."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args, **kwargs):
        from concurrent.futures import Future
        f: Future = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to whoever asks the future, as a pool does
            f.set_exception(e)
        return f


def logical_gates(monkeypatch) -> None:
    """``await_no_writers`` (cutover's, retire's and the abort's cleanup's wait for job leases)
    takes its monotonic clock and its sleep only as defaults (real time). Called from an actor of
    the current World, it runs on the world's logical clock and sleeps through the scheduler
    (a yield point), like every other wait in a scenario. ``tests/model/conftest.py`` applies it
    to every test here."""
    import reshard.control.transition as transition_module
    import reshard.jobs.cleanup as cleanup_module
    from reshard.control.runs import await_no_writers as real

    def await_no_writers(store, migration_id, jobs, wait, **kwargs):
        w = World.current
        if w is not None and w.sched.is_actor():
            kwargs.setdefault("monotonic", w.clock)
            kwargs.setdefault("sleep", w.sleep)
            kwargs.setdefault("poll", GATE_POLL_SECONDS)
        return real(store, migration_id, jobs, wait, **kwargs)

    monkeypatch.setattr(transition_module, "await_no_writers", await_no_writers)
    monkeypatch.setattr(cleanup_module, "await_no_writers", await_no_writers)
    # start's sample scan (``inspect.scan_segments``) runs its segments on a thread pool: one after
    # the other on the calling thread here, so `start` can be a step of an operator actor.
    import reshard.aws.inspect as inspect_module
    monkeypatch.setattr(inspect_module, "ThreadPoolExecutor", InlineExecutor)
    try:
        import reshard.control.horizon as horizon_module
    except ImportError:  # before issue 25's operator side
        return
    real_age = horizon_module.await_phase_age

    def await_phase_age(store, state, seconds, **kwargs):
        # Waits on the server's clock (a phase lasting H + 2 s, the switch's hold, cleanup and
        # strip starting H + 2 s into their phase): from an actor, through the scheduler.
        w = World.current
        if w is not None and getattr(store.dynamo, "client", None) is w.db:  # a store of this world
            if kwargs.get("sleep") in (None, time.sleep):
                kwargs["sleep"] = w.sleep
            kwargs.setdefault("monotonic", w.clock)
            kwargs.setdefault("poll", HORIZON_POLL_SECONDS)
        return real_age(store, state, seconds, **kwargs)

    monkeypatch.setattr(horizon_module, "await_phase_age", await_phase_age)
    monkeypatch.setattr(transition_module, "await_phase_age", await_phase_age)


@dataclass
class Run:
    schedule: list[str]
    choices: list[list[str]]
    truncated: bool
    violation: str | None
    trace: list[Step]

    def trace_text(self) -> str:
        return "\n".join(s.line() for s in self.trace)


@dataclass
class Violation:
    schedule: list[str]
    message: str
    trace: list[Step]
    sampled: bool = False

    def report(self) -> str:
        how = "a random sample" if self.sampled else "exhaustive search"
        return (f"violation found by {how}: {self.message}\n"
                f"schedule: {' '.join(self.schedule)}\n"
                f"trace:\n" + "\n".join(s.line() for s in self.trace))


@dataclass
class Result:
    schedules: int = 0            # distinct schedules run by exhaustive search
    complete: int = 0             # ... of which every actor finished
    truncated: int = 0            # ... of which hit max_steps
    sampled: int = 0              # random schedules run after the exhaustive search
    seconds: float = 0.0
    violation: Violation | None = None
    longest: int = 0
    runs: list[Run] = field(default_factory=list, repr=False)

    @property
    def per_second(self) -> float:
        return (self.schedules + self.sampled) / self.seconds if self.seconds else 0.0

    def assert_ok(self) -> None:
        if self.violation is not None:
            raise AssertionError(self.violation.report())


def run_one(factory: Callable[[World], Callable[[World], None]], prefix: list[str], *,
            max_steps: int | None, pick: Callable[[list[str]], str] = lambda moves: moves[0],
            check_truncated: bool = False, preemption_bound: int | None = None,
            drive: Callable[[World], None] | None = None) -> Run:
    """Run one schedule: ``drive`` (a fixed opening, not explored), ``prefix``, then ``pick``
    among the moves at every later point."""
    world = World()
    world.preemption_bound = preemption_bound
    check = factory(world)
    schedule: list[str] = []
    choices: list[list[str]] = []
    violation = None
    try:
        world.sched.start()
        if drive is not None:
            drive(world)  # a fixed opening (e.g. freeze a copier before its lease check): explored from here
            world.preemptions, world.last_actor = 0, None  # the opening's switches are not the schedule's
        while True:
            moves = world.moves()
            if not moves:
                break
            if max_steps is not None and len(schedule) >= max_steps:
                world.truncated = True
                break
            i = len(schedule)
            move = prefix[i] if i < len(prefix) else pick(moves)
            if move not in moves:
                raise RuntimeError(f"replay diverged at move {i + 1}: {move!r} is not among {moves} "
                                   "(is the scenario deterministic?)")
            choices.append(moves)
            schedule.append(move)
            world.apply(move)
    finally:
        world.sched.shutdown()
    if world.errors:
        name, err = next(iter(world.errors.items()))
        violation = f"actor {name} raised {type(err).__name__}: {err}\n" + \
            "".join(traceback.format_exception(type(err), err, err.__traceback__)[-3:])
    elif not world.truncated or check_truncated:
        try:
            if check is not None:
                check(world)
        except AssertionError as e:
            violation = f"invariant: {e}"
    return Run(schedule, choices, world.truncated, violation, list(world.trace))


def explore(factory: Callable[[World], Callable[[World], None]], *, max_steps: int | None = None,
            preemption_bound: int | None = None, samples: int = 0, seed: int = 0,
            sample_max_steps: int | None = None, check_truncated: bool = False, stop_at_first: bool = True,
            keep_runs: bool = False, max_schedules: int = 200_000,
            drive: Callable[[World], None] | None = None) -> Result:
    """Every schedule up to ``max_steps`` moves (depth first) with at most ``preemption_bound``
    preemptions, then ``samples`` random schedules (unbounded preemptions, ``sample_max_steps``)."""
    result = Result()
    start = time.perf_counter()
    stack: list[list[str]] = [[]]
    while stack:
        prefix = stack.pop()
        run = run_one(factory, prefix, max_steps=max_steps, check_truncated=check_truncated,
                      preemption_bound=preemption_bound, drive=drive)
        result.schedules += 1
        result.longest = max(result.longest, len(run.schedule))
        if run.truncated:
            result.truncated += 1
        else:
            result.complete += 1
        if keep_runs:
            result.runs.append(run)
        if run.violation and result.violation is None:
            result.violation = Violation(run.schedule, run.violation, run.trace)
            if stop_at_first:
                break
        # Alternatives at every point this run decided by itself (past the replayed prefix),
        # pushed so the deepest is popped first and siblings in order: lexicographic DFS.
        for i in range(len(prefix), len(run.schedule)):
            for alt in reversed(run.choices[i][1:]):
                stack.append(run.schedule[:i] + [alt])
        if result.schedules >= max_schedules:
            raise RuntimeError(f"more than {max_schedules} schedules: lower max_steps or use samples")
    if samples and (result.violation is None or not stop_at_first):
        rng = random.Random(seed)
        for _ in range(samples):
            run = run_one(factory, [], max_steps=sample_max_steps, pick=rng.choice, check_truncated=check_truncated,
                          drive=drive)
            result.sampled += 1
            result.longest = max(result.longest, len(run.schedule))
            if run.violation and result.violation is None:
                result.violation = Violation(run.schedule, run.violation, run.trace, sampled=True)
                if stop_at_first:
                    break
    result.seconds = time.perf_counter() - start
    return result


def replay(factory: Callable[[World], Callable[[World], None]], schedule: list[str],
           check_truncated: bool = True, drive: Callable[[World], None] | None = None) -> Run:
    """Run exactly ``schedule`` (e.g. a reported violation's) and return the run with its trace."""
    return run_one(factory, schedule, max_steps=len(schedule), check_truncated=check_truncated, drive=drive)


def describe_bounds(result: Result) -> str:
    return (f"{result.schedules} schedules ({result.complete} complete, {result.truncated} truncated), "
            f"{result.sampled} sampled, longest {result.longest} moves, {result.seconds:.2f}s, "
            f"{result.per_second:.0f}/s")
