"""The model checker's specification of issue 12: a fleet of real shims, an operator, copiers,
a history of what the application was told, and the invariants checked after every schedule.

A scenario factory builds a :class:`Fleet` on a :class:`~tests.model.explore.World`:

* the data table and a control table, the migration registered and moved to a starting
  phase by the real ``transition`` (unscheduled set-up);
* real :class:`~reshard.ShardedTable` shims with the control table (``start=False``: no
  refresh thread; a refresh is an actor step, ``("refresh",)``), the logical clock for
  liveness *and* heartbeats (``control_clock``), versions from the logical clock, and an
  inline query fan-out (``query_workers=1``);
* an operator actor doing advance / rollback / abort / retire through
  ``reshard.control.transition`` (the gates are passed in open: a scenario is about the
  shims and copiers racing a transition, not about the gates' bookkeeping);
* copier actors: the real ``Backfill.page`` through a ``SegmentEngine`` worker run inline
  (``SegmentEngine.work_inline``), with short leases on the logical clock.

Every application call a shim actor makes is recorded in a :class:`History` with its
invocation and response positions in the run's trace (a call that raised a retryable
reshard error or was cut short by a kill has an *unknown* outcome: it may or may not
have taken effect). At the end of a run, :meth:`Fleet.check`:

1. reads every touched logical item through a fresh shim pinned to the final phase (the
   view the application has now) and, in phases where both layouts are written, through
   each layout alone;
2. asks for a linearization of that item's history (Wing & Gong; histories are a handful
   of calls) that explains the final view, every result the application got (``ADD``
   counts, conditional-write outcomes) and every read. What fails names the invariant:
   **lost acknowledged write / resurrection** (no order explains the final state),
   **wrong result** (two callers told the same count, two CAS both won), **read-your-writes
   / stale read** (a read no order explains);
3. **layouts converge**: where both layouts are written, both hold the same item;
4. **no duplicate**: one physical item per logical item per layout (beyond seeded ones);
5. runs the real verify page function over the final state (phases where verify runs)
   and says in the report whether **verify passed while** an invariant was violated.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable

from reshard import errors
from reshard.control.runs import sum_counters
from reshard.control.store import ControlStore
from reshard.control.transition import retire, transition
from reshard.core.compare import differences
from reshard.core.layout import TOMBSTONE_ATTR, KeyMapper
from reshard.core.migration import parse
from reshard.core.phases import BACKFILL_JOB, VERIFY_JOB, Action, Phase, job_rule
from reshard.core.versions import VersionClock
from reshard.jobs.backfill import Backfill
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import SegmentEngine
from reshard.jobs.runner import JobOptions, phase_guard, require_phase_and_ack
from reshard.jobs.verify import Verifier
from reshard.shim.table import ShardedTable
from tests.backfill_support import create_table as create_data_table
from tests.backfill_support import migration_text
from tests.model.explore import World
from tests.shim_helpers import by_layout

CONTROL = "ctl"
def lift_catch_up(store, migration_id: str) -> None:
    """With open gates, the catch-up verify after a switch counts as passed too (the flag is a
    verify's bookkeeping, docs/late-writes.md): clear ``newer_may_be`` as the operator's next
    transition would after one."""
    state = store.load_state(migration_id)
    if state.newer_may_be:
        store.clear_newer_may_be(state, "setup")


#: The gates, open: scenarios race transitions, they do not re-prove the gates' bookkeeping.
OPEN_GATES: Callable = lambda store, state: {"backfill_missing": None, "verify_missing": None,
                                             "cleanup_missing": None}
#: Phases where verify runs (core.phases.JOB_RULES).
VERIFY_PHASES = {"backfill", "cutover"}

UNKNOWN = object()  # an outcome the application never learned
_SET_UP: dict = {}  # (kind, phase, table, clock) -> the memory tables after the set-up


# ----------------------------------------------------------------------------- history

@dataclass
class Op:
    actor: str
    kind: str                 # put, add, delete, cas, get
    ident: str                # the logical item's name in the scenario
    args: dict
    invoke: int
    resp: int | None = None   # None: no answer (killed, or a retryable error): may or may not have happened
    result: Any = UNKNOWN

    def text(self) -> str:
        r = "?" if self.resp is None else (self.result if self.kind in ("add", "cas", "get") else "ok")
        return f"{self.actor}.{self.kind}({self.ident}{', ' + str(self.args) if self.args else ''}) -> {r}"


@dataclass
class History:
    world: World
    ops: list[Op] = field(default_factory=list)

    def now(self) -> int:
        return len(self.world.sched.trace)

    def begin(self, actor: str, kind: str, ident: str, args: dict) -> Op:
        op = Op(actor, kind, ident, args, self.now())
        self.ops.append(op)
        return op

    def done(self, op: Op, result: Any = None) -> None:
        op.resp, op.result = self.now(), result
        self.world.sched._note(op.actor, "ack", op.text())


def apply(state: dict | None, op: Op, keys: dict) -> tuple[dict | None, Any]:
    """The sequential specification of one logical item: (new state, the result the op returns)."""
    if op.kind == "put":
        return {**keys, **op.args}, None
    if op.kind == "delete":
        return None, None
    if op.kind == "add":
        base = dict(state) if state else dict(keys)
        base["n"] = base.get("n", Decimal(0)) + 1
        return base, base["n"]
    if op.kind == "cas":
        have = state.get("ver") if state else None
        if have != op.args["expect"]:
            return state, "failed"
        return {**keys, "ver": op.args["ver"], "by": op.args["by"]}, "ok"
    if op.kind == "get":
        return state, state
    raise ValueError(op.kind)


def linearizable(ops: list[Op], initial: dict | None, keys: dict, final: dict | None, *, results: bool,
                 reads: bool) -> bool:
    """Is there an order of ``ops`` respecting real time (a call answered before another began
    comes first) whose sequential run ends in ``final`` (and, if asked, gives every result and
    every read the application saw)? Calls with no answer may be left out anywhere."""
    ops = [o for o in ops if reads or o.kind != "get"]
    n = len(ops)

    def before(a: Op, b: Op) -> bool:
        return a.resp is not None and a.resp <= b.invoke

    preds = [[j for j in range(n) if before(ops[j], ops[i])] for i in range(n)]
    seen: set = set()

    def search(done: frozenset, state) -> bool:
        memo = (done, repr(state))
        if memo in seen:
            return False
        seen.add(memo)
        if all(i in done or ops[i].resp is None for i in range(n)) and state == final:
            return True
        for i in range(n):
            if i in done or any(p not in done for p in preds[i]):
                continue
            new, got = apply(state, ops[i], keys)
            if ops[i].resp is not None and ops[i].result is not UNKNOWN:
                if ops[i].kind == "get" and reads and got != ops[i].result:
                    continue
                if ops[i].kind in ("add", "cas") and results and got != ops[i].result:
                    continue
            if search(done | {i}, new):
                return True
            if ops[i].resp is None and search(done | {i}, state):  # unanswered: also "never happened"
                return True
        return False

    return search(frozenset(), initial)


# ----------------------------------------------------------------------------- the fleet

class Fleet:
    """One scenario's migration, shims, operator and copiers on a World."""

    def __init__(self, w: World, kind: str = "sensor", phase: str = "backfill", table: str = "data",
                 lease_seconds: float = 10.0, max_request_seconds: float = 1.0, lease_wait: float | None = 0.0):
        self.w = w
        w.fleet = self  # for openings (``drive``) that act on the fleet's control store
        self.m = parse(migration_text(kind, table), f"<{kind}>")
        self.kind = kind
        self.mapper = KeyMapper(self.m)
        self.table = table
        self.lease_seconds = lease_seconds
        self.max_request_seconds = max_request_seconds
        # A guarded request (a job's data write or renewal) has a yield point before its
        # lease-deadline check and is in flight at most this long after it (explore.ModelDynamo).
        w.max_request_seconds = max_request_seconds
        #: How long the operator's cutover waits for job leases to go quiet (``advance --wait``;
        #: 0: one look, refused while one is held; None: as long as they need).
        self.lease_wait = lease_wait
        #: How often a copier waiting for a held lease looks again (the engine's default is 2 s
        #: for 10 s leases; a coarser poll is the same interleavings with fewer identical reads).
        self.poll_seconds = 5.0
        self.store = ControlStore(w.dynamo, CONTROL, clock=w.clock)
        cached = _SET_UP.get((kind, phase, table, w.clock()))
        if cached is not None:
            # The same set-up as a previous run (deterministic): restore it, ~30 calls saved per schedule.
            w.db.tables = copy.deepcopy(cached)
        else:
            create_data_table(w.dynamo, table, self.mapper)
            self.store.register(self.m, who="setup")
            # No shims yet: every transition is acknowledged at once. "aborted" is reached from backfill.
            path = ["planned", "dual_write", "dual_read", "backfill", "aborted"] if phase == "aborted" else \
                [p.value for p in Phase][:[p.value for p in Phase].index(phase) + 1]
            for target in path[1:]:
                action = Action.ABORT if target == "aborted" else Action.ADVANCE
                lift_catch_up(self.store, self.m.id)
                transition(self.store, self.m.id, action, who="setup", gates=OPEN_GATES, allow_no_shims=True)
            _SET_UP[(kind, phase, table, w.clock())] = copy.deepcopy(w.db.tables)
        assert self.store.load_state(self.m.id).phase.value == phase
        self.history = History(w)
        self.keys: dict[str, dict] = {}       # scenario name -> logical key fields (python)
        self.initial: dict[str, dict | None] = {}
        self.seeded_old: dict[str, int] = {}  # old-layout physical copies seeded per item
        self.shims: dict[str, ShardedTable] = {}
        self.outcomes: dict[str, list] = {}   # operator actions: (action, "ok" | refusal)
        self.verify_runs = 0
        #: Set when a copier runs: then every item (seeded ones too) must be in both layouts.
        self.copied = False
        #: The trace position where the operator's ``cleanup+sweep`` returned (None: it did not),
        #: and how long its second pass waits for the fleet's acknowledgement of the retire
        #: (``--lease-wait``; polled every second of logical time, then refused).
        self.swept_at: int | None = None
        self.sweep_wait = 2.0

    # ------------------------------------------------------------ items
    def key(self, name: str, **fields) -> dict:
        self.keys[name] = fields
        self.initial.setdefault(name, None)
        return fields

    def seed(self, name: str, attrs: dict, shards: tuple[int | None, ...] = (None,), versions=()) -> None:
        """A pre-migration item written straight to the old layout (several shards: random-suffix
        duplicates; ``versions``: an ``_rs_v`` per copy, "" for none)."""
        from reshard.aws.dynamo import to_wire
        logical = to_wire({**self.keys[name], **attrs})
        for i, shard in enumerate(shards):
            phys = self.mapper.to_physical(logical, self.mapper.old, shard)
            v = versions[i] if i < len(versions) else ""
            if v:
                phys["_rs_v"] = {"S": v}
            self.w.dynamo.call("put_item", TableName=self.table, Item=phys)
        self.seeded_old[name] = len(shards)

    def expect_initial(self, name: str, attrs: dict | None) -> None:
        self.initial[name] = None if attrs is None else {**self.keys[name], **attrs}

    # ------------------------------------------------------------ actors
    def shim(self, name: str) -> ShardedTable:
        t = ShardedTable(self.m, self.w.dynamo, control_table=CONTROL, clock=self.w.clock, control_clock=self.w.clock,
                         sleep=self.w.sleep,
                         writer_id=name, start=False, query_workers=1,
                         version_clock=VersionClock(name, now_ms=self.w.clock.now_ms))
        t._phases._heartbeat("starting", 0)  # what start() does, minus the refresh thread
        assert t.refresh()
        self.shims[name] = t
        return t

    def shim_actor(self, name: str, *steps: tuple) -> ShardedTable:
        """A shim instance running ``steps`` in order: ("refresh",), ("close",), ("put", item, attrs),
        ("add", item), ("delete", item), ("cas", item, expect, ver), ("get", item)."""
        t = self.shim(name)
        h = self.history

        def body():
            for step in steps:
                kind = step[0]
                if kind == "refresh":
                    t.refresh()
                    continue
                if kind == "close":  # the instance shuts down: its heartbeat leaves the census
                    t.close()
                    continue
                ident = step[1]
                key = self.keys[ident]
                args = {"put": lambda: dict(step[2]), "cas": lambda: {"expect": step[2], "ver": step[3], "by": name}
                        }.get(kind, dict)()
                op = h.begin(name, kind, ident, args)
                try:
                    if kind == "put":
                        t.put_item(Item={**key, **args})
                        h.done(op)
                    elif kind == "add":
                        r = t.update_item(Key=key, UpdateExpression="ADD n :one",
                                          ExpressionAttributeValues={":one": 1}, ReturnValues="UPDATED_NEW")
                        h.done(op, r["Attributes"]["n"])
                    elif kind == "delete":
                        t.delete_item(Key=key)
                        h.done(op)
                    elif kind == "cas":
                        cond, vals = (("attribute_not_exists(ver)", None) if step[2] is None
                                      else ("ver = :v", {":v": step[2]}))
                        try:
                            t.put_item(Item={**key, "ver": step[3], "by": name}, ConditionExpression=cond,
                                       ExpressionAttributeValues=vals)
                            h.done(op, "ok")
                        except errors.ConditionalCheckFailed:
                            h.done(op, "failed")
                    elif kind == "get":
                        h.done(op, t.get_item(Key=key, ConsistentRead=True).get("Item"))
                    else:
                        raise ValueError(kind)
                except errors.ShimUnavailable:
                    h.ops.remove(op)  # refused before anything was written: the app got an error
                except errors.AWSError as e:
                    if e.code != "ReshardVersionConflict":
                        raise
                    # Lost the version race every time: nothing acknowledged; the app was told to retry.
        self.w.actor(name, body)
        return t

    def operator(self, name: str, *actions: str) -> None:
        """An operator doing ``actions`` (advance, rollback, abort, retire) in order; a refused or
        lost transition is recorded, not raised (the operator would wait and retry)."""
        def body():
            for a in actions:
                self.transition(name, a)
        self.w.actor(name, body)

    def transition(self, who: str, a: str) -> None:
        """One operator action, from the calling actor's thread: advance / rollback / abort /
        retire with open gates; ``repair``: ``verify --repair`` (backfill only); ``verify+advance``: a real verify run (scheduled, like every
        call of the actor), then advance through the *real* gates (backfill finished, a
        passing verify since); ``cleanup``: the real cleanup pass (its precondition, the
        Cleaner page function, and the retire of an aborted migration when it is done)."""
        out = self.outcomes.setdefault(who, [])
        try:
            if a == "retire":
                retire(self.store, self.m.id, who=who)
            elif a == "verify+advance":
                require_phase_and_ack(self.store, self.m.id, VERIFY_JOB)
                passed, diffs = self.verify(run=1, host=who)
                out.append(("verify", "passed" if passed else f"failed: {diffs}"))
                transition(self.store, self.m.id, Action.ADVANCE, who=who, allow_no_shims=True,
                           sleep=self.w.sleep, lease_wait=self.lease_wait)  # the real gates
            elif a == "cleanup":
                self.cleanup_pass(who)
            elif a == "cleanup+sweep":
                # `reshard cleanup` of an aborted migration (operations.run_data_job): the pass
                # retires it, then, once the fleet acknowledged the retire (run_job's
                # precondition, waiting), a second pass sweeps tombstones of shims still on aborted.
                from reshard import operations
                before = self.store.load_state(self.m.id)
                self.cleanup_pass(who)
                if operations.sweeps_again(before, lambda: self.store.load_state(self.m.id)):
                    self.cleanup_pass(who, run=2, wait=self.sweep_wait)
                self.swept_at = len(self.w.sched.trace)
            elif a == "repair":  # `reshard verify --repair`, inside the schedule, with run_job's precondition
                require_phase_and_ack(self.store, self.m.id, VERIFY_JOB, repair=True)
                passed, diffs = self.verify(run=2, host=who, repair=True)
                out.append(("repair", "clean" if passed else f"found {diffs}"))
            else:
                # sleep: a switch waits for the fleet on the logical clock, letting the shims run.
                lift_catch_up(self.store, self.m.id)
                transition(self.store, self.m.id, Action(a), who=who, gates=OPEN_GATES, allow_no_shims=True,
                           sleep=self.w.sleep, lease_wait=self.lease_wait)
            out.append((a, "ok"))
        except (errors.RefusedTransition, errors.ConcurrentChange) as e:
            out.append((a, f"refused: {e}"))

    def cleanup_pass(self, who: str, run: int = 1, wait: float | None = 0.0) -> None:
        from reshard.jobs import cleanup
        # run_job's precondition (``wait``: its ``lease_wait``, polled on the logical clock)
        state = require_phase_and_ack(self.store, self.m.id, "cleanup", wait=wait, sleep=self.w.sleep)
        opts = JobOptions(segments=1, workers=1, page_size=50, delete=True)
        cleanup._check(self.store, state, opts)  # refuses while a backfill/verify lease is live
        budget = CapacityBudget(None, None, clock=self.w.clock, sleep=self.w.sleep)
        page = cleanup.Cleaner(self.w.dynamo, self.mapper, self.table, budget, opts,
                               state.phase is Phase.ABORTED, self.w.clock).page
        engine = SegmentEngine(self.store, self.m.id, "cleanup", run, 1, page, workers=1, clock=self.w.clock,
                               lease_seconds=self.lease_seconds, max_request_seconds=self.max_request_seconds,
                               sleep=self.w.sleep, host=who, invocation=who, is_dead=lambda owner: False)
        engine.work_inline()
        if state.phase is Phase.ABORTED and not state.retired:
            # cleanup's finish: retire looks at the job leases again, with the pass's wait.
            retire(self.store, self.m.id, who=who, lease_wait=opts.lease_wait)

    def copier(self, host: str, segments: int = 1, page_size: int = 10, run: int = 1,
               then: Callable[[], None] | None = None) -> SegmentEngine:
        """A backfill host: the real Backfill.page through one SegmentEngine worker, inline
        (``then``: what the same actor does once the worker has nothing left)."""
        w = self.w
        budget = CapacityBudget(None, None, clock=w.clock, sleep=w.sleep)
        budget.attach(w.dynamo, self.table)
        page = Backfill(w.dynamo, self.store, self.m.id, self.mapper, self.table, budget, page_size=page_size).page
        # The runner's phase guard, read before every page (min_interval 0: its cache runs on
        # the real monotonic clock, which would make runs depend on real time).
        guard = phase_guard(self.store, self.m.id, BACKFILL_JOB, job_rule(BACKFILL_JOB).phases, min_interval=0.0)
        engine = SegmentEngine(self.store, self.m.id, BACKFILL_JOB, run, segments, page, workers=1,
                               lease_seconds=self.lease_seconds, max_request_seconds=self.max_request_seconds,
                               poll_seconds=self.poll_seconds, clock=w.clock, sleep=w.sleep, host=host,
                               invocation=host, is_dead=lambda owner: False, guard=guard)
        def body():
            try:
                require_phase_and_ack(self.store, self.m.id, BACKFILL_JOB)  # run_job's precondition
            except errors.RefusedTransition:
                return
            engine.work_inline()
            if then is not None:
                then()
        w.actor(host, body)
        self.copied = True
        return engine

    # ------------------------------------------------------------ the final state
    def phase(self) -> tuple[str, bool]:
        st = self.store.load_state(self.m.id)
        return st.phase.value, st.retired

    def view(self, phase: str | None, name: str) -> dict | None:
        """The logical item as a shim pinned to ``phase`` reads it (None: steady)."""
        t = ShardedTable(self.m, self.w.dynamo, control_table=None, writer_id="viewer", query_workers=1)
        t._pin_phase(phase)
        return t.get_item(Key=self.keys[name], ConsistentRead=True).get("Item")

    def verify(self, run: int | None = None, host: str = "verifier", repair: bool = False) -> tuple[bool, dict]:
        """The real verify page function over the whole table, one segment, inline; (passed, counts)."""
        self.verify_runs += 1
        run = run or 100 + self.verify_runs
        budget = CapacityBudget(None, None, clock=self.w.clock, sleep=lambda s: None)
        opts = JobOptions(segments=1, workers=1, page_size=50, rechecks=2, recheck_pause=0.0, repair=repair)
        v = Verifier(self.w.dynamo, self.store, self.m.id, run, self.mapper, self.table, budget, opts,
                     sleep=lambda s: None)
        # run_job's phase guard, read before every page (afresh after every claim).
        guard = phase_guard(self.store, self.m.id, VERIFY_JOB, job_rule(VERIFY_JOB, repair).phases, min_interval=0.0)
        # One scan segment and the join (the run's last segment), as run_job runs VERIFY.
        engine = SegmentEngine(self.store, self.m.id, VERIFY_JOB, run, 2, v.page, workers=1, clock=self.w.clock,
                               lease_seconds=self.lease_seconds, max_request_seconds=self.max_request_seconds,
                               sleep=lambda s: None, host=host, invocation=host,
                               is_dead=lambda owner: False, guard=guard, join=True)
        engine.work_inline()
        totals = sum_counters(engine.records())
        diffs = {k: int(n) for k, n in differences(totals).items() if n}
        return (not diffs and all(r.done for r in engine.records())), diffs

    def problems(self) -> list[str]:
        """Every invariant violated by the final state and the history (empty: all hold)."""
        phase, retired = self.phase()
        read_phase = None if (phase == "aborted" and retired) else phase
        out: list[str] = []
        by_item: dict[str, list[Op]] = {}
        for op in self.history.ops:
            by_item.setdefault(op.ident, []).append(op)
        layouts = by_layout(self.mapper, self.w.db.items(self.table))
        for name, fields in self.keys.items():
            ops = by_item.get(name, [])
            keys = dict(fields)
            initial = self.initial.get(name)
            final = self.view(read_phase, name)
            lin = lambda fin, **kw: linearizable(ops, initial, keys, fin, **kw)  # noqa: E731
            if not lin(final, results=False, reads=False):
                told = [o.text() for o in ops]
                writes = [o for o in ops if o.kind not in ("get", "delete")]
                deletes = [o for o in ops if o.kind == "delete" and o.resp is not None]
                resurrected = final is not None and any(
                    all(o.resp is not None and o.resp <= d.invoke for o in writes) for d in deletes)
                kind = "resurrection (an acknowledged delete undone)" if resurrected else "lost acknowledged write"
                out.append(f"{kind}: {name} reads {final} in {phase}; the application was told {told}")
            elif not lin(final, results=True, reads=False):
                out.append(f"wrong result: no order of {[o.text() for o in ops]} gives every caller the answer "
                           f"it got (e.g. two callers told the same count, two conditional writes both won)")
            elif not lin(final, results=True, reads=True):
                out.append(f"read-your-writes / stale read: no order of {[o.text() for o in ops]} explains "
                           "every read")
            # From backfill on, the next transition reads the other layout: both must hold the
            # same item (items the shims wrote; every item once a copier ran). Before backfill a
            # lagging planned shim may legitimately leave the new layout behind: the copy fixes it.
            if phase in ("backfill", "cutover") and (ops or self.copied):
                old, new = self.view("dual_write", name), self.view("cutover", name)
                if old != new:
                    out.append(f"layouts disagree on {name} in {phase}: old layout {old}, new layout {new}")
            ident = self.mapper.identity(self.mapper.logical_fields(_wire(fields)))
            n_old = len(layouts["old"].get(ident, []))
            n_new = len(layouts["new"].get(ident, []))
            if n_old > max(1, self.seeded_old.get(name, 1)) or n_new > 1:
                out.append(f"duplicate: {name} has {n_old} old-layout and {n_new} new-layout physical items")
        if self.swept_at is not None:
            # `reshard cleanup` returned: no tombstone is left once every delete was acknowledged
            # before it (a later delete by a shim still on aborted is that shim's: it was live).
            deletes = [o for o in self.history.ops if o.kind == "delete"]
            swept = deletes and all(o.resp is not None and o.resp <= self.swept_at for o in deletes)
            left = [i for i in self.w.db.items(self.table) if TOMBSTONE_ATTR in i] if swept else []
            if left:
                out.append(f"leftover tombstone after the cleanup returned: {left}")
        if phase == "aborted" and retired:
            # A retired migration left no new-layout copy behind: a retry of the migration
            # would find it at its new key (issue 12 case 6).
            left = [i for i in self.w.db.items(self.table) if self.mapper.is_new_copy(i)]
            if left:
                out.append(f"leftover new-layout copies after retire: {left}")
        return out

    def check(self, w: World) -> None:
        problems = self.problems()
        phase, _ = self.phase()
        note = ""
        if problems and phase in VERIFY_PHASES:
            # Only a violated state needs verify's verdict: "verify never passes while an
            # invariant is violated" says nothing about a correct state.
            passed, diffs = self.verify()
            note = "\n  and VERIFY PASSED over this state" if passed else f"\n  (verify failed: {diffs})"
        if problems:
            raise AssertionError("; ".join(problems) + f" [final phase {phase}; operator: {self.outcomes}]" + note)


def _wire(fields: dict) -> dict:
    from reshard.aws.dynamo import to_wire
    return to_wire(fields)


def scenario(build: Callable[[World], Fleet]) -> Callable[[World], Callable[[World], None]]:
    """A factory for :func:`~tests.model.explore.explore` from a function that builds a Fleet."""
    def factory(w: World):
        fleet = build(w)
        return fleet.check
    return factory

