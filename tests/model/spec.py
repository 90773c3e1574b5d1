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
from reshard.core.migration import Migration, parse
from reshard.core.phases import BACKFILL_JOB, VERIFY_JOB, Action, Phase, job_rule
from reshard.core.versions import VersionClock
from reshard.jobs.backfill import Backfill
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.engine import SegmentEngine
from reshard.jobs.runner import JobOptions, phase_guard, removal_hold, require_phase_and_ack
from reshard.jobs.verify import Verifier
from reshard.shim.table import ShardedTable
from tests.backfill_support import create_table as create_data_table
from tests.backfill_support import migration_text
from tests.model.explore import World
from tests.shim_helpers import by_layout

from reshard.shim.errors import OutcomeUnknown  # noqa: E402  (after the imports above: the shim's own errors)

CONTROL = "ctl"
#: Errors the application may get under the fault model (besides ShimUnavailable): the version
#: race lost every time, a request the server refused as signed too long ago (its horizon
#: passed), retries that all timed out (held requests, lost answers).
APP_ERRORS = frozenset({"ReshardVersionConflict", "InvalidSignatureException", "ReadTimeoutError",
                        "ConnectTimeoutError", "ConnectionClosedError", "EndpointConnectionError"})
#: The data-table operations a shim's request may have sent (see :meth:`Fleet._wrote`).
DATA_WRITES = ("put_item", "update_item", "delete_item", "batch_write_item")


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
    if op.kind == "update":
        return {**(state or keys), **op.args}, None
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
                 lease_seconds: float = 10.0, max_request_seconds: float = 1.0, lease_wait: float | None = 0.0,
                 horizon: float | None = None):
        self.w = w
        w.fleet = self  # for openings (``drive``) that act on the fleet's control store
        self.m = parse(migration_text(kind, table), f"<{kind}>")
        self.kind = kind
        self.mapper = KeyMapper(self.m)
        self.table = table
        self.lease_seconds = lease_seconds
        self.max_request_seconds = max_request_seconds
        #: The request horizon H of the migrations this fleet starts (``start --request-horizon``)
        #: with the server deadline enforced (the memory server refuses late-signed requests, as
        #: DynamoDB does); None: registered as before issue 25, ``server_deadline`` off, on a
        #: server that does not check signature dates (dynalite, moto: what ``off`` is for).
        self.horizon = horizon
        #: A request horizon per migration id, for migrations started with another ``H`` than
        #: the fleet's (:meth:`add_migration`'s ``horizon``: the previous owner's H differs).
        self.horizons: dict[str, float] = {}
        if horizon is None:
            w.db.signature_window = None
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
        cache_key = (kind, phase, table, w.clock(), horizon)
        cached = _SET_UP.get(cache_key)
        if cached is not None:
            # The same set-up as a previous run (deterministic): restore it (the clock too: the
            # transitions waited on it), ~30 calls saved per schedule.
            w.db.tables, w.clock.t = copy.deepcopy(cached[0]), cached[1]
        else:
            create_data_table(w.dynamo, table, self.mapper)
            self.start(self.m, who="setup")
            # No shims yet: every transition is acknowledged at once. "aborted" is reached from backfill.
            path = ["planned", "dual_write", "dual_read", "backfill", "aborted"] if phase == "aborted" else \
                [p.value for p in Phase][:[p.value for p in Phase].index(phase) + 1]
            for target in path[1:]:
                action = Action.ABORT if target == "aborted" else Action.ADVANCE
                lift_catch_up(self.store, self.m.id)
                transition(self.store, self.m.id, action, who="setup", gates=OPEN_GATES, allow_no_shims=True,
                           sleep=w.sleep)
            _SET_UP[cache_key] = (copy.deepcopy(w.db.tables), w.clock())
        assert self.store.load_state(self.m.id).phase.value == phase
        #: Every migration of the table the scenario knows, by key ("m1": the first; see
        #: :meth:`add_migration`), in the order they were (or will be) started.
        self.migrations: dict[str, Migration] = {"m1": self.m}
        self.mappers: dict[str, KeyMapper] = {"m1": self.mapper}
        self.history = History(w)
        self.keys: dict[str, dict] = {}       # scenario name -> logical key fields (python)
        self.initial: dict[str, dict | None] = {}
        self.seeded_old: dict[str, int] = {}  # old-layout physical copies seeded per item
        self.shims: dict[str, ShardedTable] = {}
        self.outcomes: dict[str, list] = {}   # operator actions: (action, "ok" | refusal)
        self.verify_run_numbers: dict[str, int] = {}  # per migration key: the last run an operator's verify used
        self.verify_runs = 0
        #: Open gates also clear the catch-up flag (``newer_may_be``) as a passing verify would
        #: (issue-12 scenarios race transitions, not the catch-up bookkeeping); False: only a real
        #: verify run clears it (``"verify"``), as in the product.
        self.open_catch_up = True
        #: The widened fault model (issue 25): a mirror may be lost for good, so the layouts may
        #: disagree in backfill/cutover; then the real verify must not pass over them. False:
        #: the issue-12 invariant, both layouts always hold the same item.
        self.lost_mirrors = False
        #: Set when a copier runs: then every item (seeded ones too) must be in both layouts.
        self.copied = False
        #: The trace position where the operator's ``cleanup+sweep`` returned (None: it did not),
        #: and how long its second pass waits for the fleet's acknowledgement of the retire
        #: (``--lease-wait``; polled every second of logical time, then refused).
        self.swept_at: int | None = None
        self.sweep_wait = 2.0

    def start(self, m: Migration, who: str) -> None:
        """``reshard start`` of ``m``: with a horizon, the real ``operations.start`` (the probe of the
        server's signature window, the table marker, META's request_horizon and server_deadline);
        without, the registration alone, as before issue 25."""
        if self.horizon is None:
            self.store.register(m, who=who)
            return
        from reshard import operations
        operations.start(self.w.dynamo, self.store, m, sample=20, segments=1,
                         request_horizon=self.horizons.get(m.id, self.horizon), server_deadline=True)

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

    # ------------------------------------------------------------ more migrations of the table
    def add_migration(self, key: str, m: Migration, phase: str | None = None,
                      horizon: float | None = None) -> Migration:
        """Another migration of the same table (a second one after ``complete``, a retry after an
        abort): known to the scenario as ``key`` (``"advance@m2"``, ``shim_actor(migration="m2")``);
        registered and moved to ``phase`` now (set-up, unscheduled) if given, else started by an
        operator action ``"start@m2"`` inside the schedule; ``horizon``: its ``--request-horizon``
        when not the fleet's."""
        if horizon is not None:
            self.horizons[m.id] = horizon
        self.migrations[key] = m
        self.mappers[key] = KeyMapper(m)
        if phase is not None:
            self.start(m, who="setup")
            self.setup_to(key, phase)
        return m

    def setup_to(self, key: str, phase: str) -> None:
        """Move migration ``key`` forward to ``phase`` in the set-up (open gates, no shims yet);
        ``"retired"``: aborted, its cleanup pass run, retired."""
        m = self.migrations[key]
        order = [p.value for p in Phase if p is not Phase.ABORTED]
        state = self.store.load_state(m.id)
        target = "aborted" if phase == "retired" else phase
        while state.phase.value != target:
            if target == "aborted":
                action = Action.ABORT if state.phase.value == "backfill" else Action.ADVANCE
            else:
                assert order.index(state.phase.value) < order.index(target), (state.phase, target)
                action = Action.ADVANCE
            lift_catch_up(self.store, m.id)
            transition(self.store, m.id, action, who="setup", gates=OPEN_GATES, allow_no_shims=True,
                       sleep=self.w.sleep)
            state = self.store.load_state(m.id)
        if phase == "retired":
            self.cleanup_pass("setup", key=key)

    # ------------------------------------------------------------ actors
    def shim(self, name: str, migration: str = "m1", control_table: str = CONTROL, skew: float = 0.0,
             late: bool = False) -> ShardedTable:
        """A shim instance of migration ``migration``'s file with ``control_table`` (another name:
        a mistyped one), whose wall clock (versions, heartbeat stamps) runs ``skew`` seconds off the
        server's. ``late``: not started yet (:meth:`start_shim`, inside the schedule)."""
        w = self.w
        wall = (lambda: w.clock() + skew) if skew else w.clock
        t = ShardedTable(self.migrations[migration], w.dynamo, control_table=control_table, clock=w.clock,
                         control_clock=wall, sleep=w.sleep, writer_id=name, start=False, query_workers=1,
                         version_clock=VersionClock(name, now_ms=lambda: int(wall() * 1000)))
        self.shims[name] = t
        if not late:
            self.start_shim(t)  # a failed refresh (a refusal) leaves it failing closed: its requests say so
        return t

    @staticmethod
    def start_shim(t: ShardedTable) -> bool:
        """What ``ShardedTable.start()`` does, minus the refresh thread: announce, then refresh."""
        try:
            t._phases._heartbeat("starting", 0)
        except errors.ResourceNotFound:
            pass  # no such control table (a typo): start() goes on to its refresh, as here
        return t.refresh()

    def shim_actor(self, name: str, *steps: tuple, migration: str = "m1", control_table: str = CONTROL,
                   skew: float = 0.0, late: bool = False) -> ShardedTable:
        """A shim instance running ``steps`` in order: ("refresh",), ("close",), ("put", item, attrs),
        ("update", item, attrs) (SET), ("add", item), ("delete", item), ("cas", item, expect, ver),
        ("get", item); ("batch_put", item, attrs) and ("batch_delete", item) through ``batch_writer``.
        See :meth:`shim` for the other arguments (``late``: the instance starts as the actor's
        first steps, at any point of the schedule)."""
        t = self.shim(name, migration, control_table, skew, late)
        self.w.actor(name, self.shim_body(name, t, steps, late))
        return t

    def shim_body(self, name: str, t: ShardedTable, steps: tuple, late: bool = False) -> Callable[[], None]:
        """What :meth:`shim_actor` runs (ops recorded under ``name``), for :meth:`script` too."""
        h = self.history

        def body():
            if late:
                self.start_shim(t)
            for step in steps:
                kind = step[0]
                if kind == "refresh":
                    t.refresh()
                    continue
                if kind == "close":  # the instance shuts down: its heartbeat leaves the census
                    t.close()
                    continue
                # ("batch_put", ...) / ("batch_delete", ...): the same write through the shim's
                # batch_writer (one request in the batch, flushed when the block ends).
                batch = kind.startswith("batch_")
                kind = kind[len("batch_"):] if batch else kind
                ident = step[1]
                key = self.keys[ident]
                args = {"put": lambda: dict(step[2]), "update": lambda: dict(step[2]),
                        "cas": lambda: {"expect": step[2], "ver": step[3], "by": name}}.get(kind, dict)()
                op = h.begin(name, kind, ident, args)
                try:
                    if kind == "put" and batch:
                        with t.batch_writer() as writer:
                            writer.put_item(Item={**key, **args})
                        h.done(op)
                    elif kind == "put":
                        t.put_item(Item={**key, **args})
                        h.done(op)
                    elif kind == "update":
                        names = {f"#u{i}": a for i, a in enumerate(args)}
                        t.update_item(Key=key, UpdateExpression="SET " + ", ".join(f"#u{i} = :u{i}" for i in
                                                                                  range(len(args))),
                                      ExpressionAttributeNames=names,
                                      ExpressionAttributeValues={f":u{i}": v for i, v in enumerate(args.values())})
                        h.done(op)
                    elif kind == "add":
                        r = t.update_item(Key=key, UpdateExpression="ADD n :one",
                                          ExpressionAttributeValues={":one": 1}, ReturnValues="UPDATED_NEW")
                        h.done(op, r["Attributes"]["n"])
                    elif kind == "delete" and batch:
                        with t.batch_writer() as writer:
                            writer.delete_item(Key=key)
                        h.done(op)
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
                except (errors.ShimUnavailable, errors.AWSError, OutcomeUnknown) as e:
                    # OutcomeUnknown: a write whose answer was lost, not sent again (another
                    # writer's write is stored now): the application is told the outcome is unknown.
                    if isinstance(e, errors.AWSError) and e.code not in APP_ERRORS:
                        raise  # anything else is a bug the run reports (the actor raised)
                    # The app got an error (fail closed, a request refused by the server, retries
                    # that timed out, the version race lost every time): nothing acknowledged. If no
                    # write to the data table was sent for it, nothing can have happened; else
                    # it may or may not have (a request held by the network may land later).
                    if not self._wrote(self.w.sched.current() or name, op.invoke):
                        h.ops.remove(op)
        return body

    def _wrote(self, actor: str, since: int) -> bool:
        """Whether ``actor`` sent a write to the data table since trace position ``since``."""
        return any(s.actor == actor and s.op in DATA_WRITES and s.detail.startswith(self.table + " ")
                   for s in self.w.trace[since:])

    def operator(self, name: str, *actions: str) -> None:
        """An operator doing ``actions`` in order (see :meth:`transition`); a refused or lost
        transition is recorded, not raised (the operator would wait and retry)."""
        self.w.actor(name, self.operator_body(name, actions))

    def operator_body(self, name: str, actions: tuple[str, ...]) -> Callable[[], None]:
        def body():
            for a in actions:
                self.transition(name, a)
        return body

    def script(self, name: str, *parts: Callable[[], None]) -> None:
        """One actor running ``parts`` one after the other: e.g. the operator's actions, then a
        shim that starts once they are done (``shim_body`` of a ``late`` shim). Fewer schedules
        than two actors, for an order the scenario fixes anyway."""
        def body():
            for part in parts:
                part()
        self.w.actor(name, body)

    def transition(self, who: str, a: str) -> None:
        """One operator action, from the calling actor's thread, on migration m1 or, with a
        suffix ``@key``, on that one (:meth:`add_migration`): advance / rollback / abort / retire
        with open gates; ``repair``: ``verify --repair`` (backfill only); ``verify``: a real verify
        run; ``verify+advance``: a real verify run (scheduled, like every call of the actor), then
        advance through the *real* gates (backfill finished, a passing verify since);
        ``cleanup``: the real cleanup pass (its precondition, the Cleaner page function, and the
        retire of an aborted migration when it is done); ``cleanup+sweep``: `reshard cleanup` of
        an aborted migration (the pass, the retire, the second sweep); ``strip``: `reshard cleanup
        --strip-bookkeeping` (complete); ``start``: `reshard start` (registers the migration)."""
        action, _, key = a.partition("@")
        key = key or "m1"
        m = self.migrations[key]
        out = self.outcomes.setdefault(who, [])
        try:
            if action == "retire":
                retire(self.store, m.id, who=who)
            elif action == "start":
                self.start(m, who=who)
            elif action == "verify":
                require_phase_and_ack(self.store, m.id, VERIFY_JOB)
                passed, diffs = self.verify(run=self.next_run(key), host=who, key=key)
                out.append(("verify", "passed" if passed else f"failed: {diffs}"))
            elif action == "verify+advance":
                require_phase_and_ack(self.store, m.id, VERIFY_JOB)
                passed, diffs = self.verify(run=self.next_run(key), host=who, key=key)
                out.append(("verify", "passed" if passed else f"failed: {diffs}"))
                transition(self.store, m.id, Action.ADVANCE, who=who, allow_no_shims=True,
                           sleep=self.w.sleep, lease_wait=self.lease_wait)  # the real gates
            elif action == "cleanup":
                self.cleanup_pass(who, key=key)
            elif action == "strip":
                self.strip_pass(who, key=key)
            elif action == "cleanup+sweep":
                # `reshard cleanup` of an aborted migration (operations.run_data_job): the pass
                # retires it, then, once the fleet acknowledged the retire (run_job's
                # precondition, waiting), a second pass sweeps tombstones of shims still on aborted.
                from reshard import operations
                before = self.store.load_state(m.id)
                self.cleanup_pass(who, key=key)
                if operations.sweeps_again(before, lambda: self.store.load_state(m.id)):
                    self.cleanup_pass(who, run=2, wait=self.sweep_wait, key=key)
                self.swept_at = len(self.w.sched.trace)
            elif action == "repair":  # `reshard verify --repair`, inside the schedule, with run_job's precondition
                require_phase_and_ack(self.store, m.id, VERIFY_JOB, repair=True)
                passed, diffs = self.verify(run=self.next_run(key), host=who, repair=True, key=key)
                out.append(("repair", "clean" if passed else f"found {diffs}"))
            else:
                # sleep: a switch waits for the fleet on the logical clock, letting the shims run.
                if self.open_catch_up:
                    lift_catch_up(self.store, m.id)
                transition(self.store, m.id, Action(action), who=who, gates=OPEN_GATES, allow_no_shims=True,
                           sleep=self.w.sleep, lease_wait=self.lease_wait)
            out.append((a, "ok"))
        except (errors.RefusedTransition, errors.ConcurrentChange, errors.BadInput) as e:
            out.append((a, f"refused: {e}"))

    def next_run(self, key: str) -> int:
        """The next verify run number of migration ``key`` (``reshard verify`` numbers its runs
        upwards: the catch-up gate judges the latest one)."""
        self.verify_run_numbers[key] = self.verify_run_numbers.get(key, 0) + 1
        return self.verify_run_numbers[key]

    def cleanup_pass(self, who: str, run: int = 1, wait: float | None = 0.0, key: str = "m1",
                     ttl: bool = False) -> None:
        """The real cleanup pass of migration ``key`` (``ttl``: old items get the TTL attribute
        instead of being deleted, as without ``--delete``)."""
        from reshard.jobs import cleanup
        m, mapper = self.migrations[key], self.mappers[key]
        # run_job's precondition (``wait``: its ``lease_wait``, polled on the logical clock)
        state = require_phase_and_ack(self.store, m.id, "cleanup", wait=wait, sleep=self.w.sleep)
        opts = JobOptions(segments=1, workers=1, page_size=50, delete=not ttl)
        cleanup._check(self.store, state, opts)  # refuses while a backfill/verify lease is live
        if ttl and state.phase is not Phase.ABORTED:
            cleanup.check_ttl(self.w.dynamo, m, enable=True)
        budget = CapacityBudget(None, None, clock=self.w.clock, sleep=self.w.sleep)
        guard, dynamo = self.job(key, "cleanup")
        # With a server deadline a page's tombstone deletes wait H + 2 s after its scan (cleanup._make_page).
        page = cleanup.Cleaner(dynamo, mapper, self.table, budget, opts, state.phase is Phase.ABORTED,
                               self.w.clock, cleanup.retired_migrations(self.store, self.table, m.id),
                               hold_seconds=removal_hold(state), sleep=self.w.sleep, monotonic=self.w.clock).page
        engine = SegmentEngine(self.store, m.id, "cleanup", run, 1, page, workers=1, clock=self.w.clock,
                               lease_seconds=self.lease_seconds, max_request_seconds=self.max_request_seconds,
                               sleep=self.w.sleep, host=who, invocation=who, is_dead=lambda owner: False,
                               guard=guard if self.horizon is not None else None)
        engine.work_inline()
        if state.phase is Phase.ABORTED and not state.retired:
            # cleanup's finish: retire looks at the job leases again, with the pass's wait.
            retire(self.store, m.id, who=who, lease_wait=opts.lease_wait)

    def job(self, key: str, job: str, repair: bool = False):
        """(guard, dynamo) of a data job of migration ``key`` as ``run_job`` builds them: with a
        server deadline, the job's facts (the phase guard and fact keeper, on the logical clock)
        and a Dynamo whose data writes carry their horizon; without, the phase guard alone and
        the plain Dynamo, as before issue 25."""
        m = self.migrations[key]
        phases = job_rule(job, repair).phases
        if self.horizon is None:
            return phase_guard(self.store, m.id, job, phases, min_interval=0.0), self.w.dynamo
        from reshard.control import marker as markers
        from reshard.jobs.facts import DatedWrites, JobFacts
        # As run_job: the facts keep the phase version and the table marker the job began under.
        marker = (self.w.dynamo, self.table, markers.key_for(self.w.dynamo.describe_table(self.table)))
        facts = JobFacts(self.store, m.id, job, phases, min_interval=0.0, monotonic=self.w.clock,
                         state=self.store.load_state(m.id), marker=marker)
        return facts, DatedWrites(self.w.dynamo, self.table, facts.horizon)

    def strip_pass(self, who: str, key: str = "m1") -> None:
        """`reshard cleanup --strip-bookkeeping` of migration ``key`` (complete): run_job's
        precondition, then the real Stripper page function over one segment, inline."""
        from reshard.core.phases import STRIP_JOB
        from reshard.jobs.strip import Stripper
        m = self.migrations[key]
        state = require_phase_and_ack(self.store, m.id, STRIP_JOB)
        if self.horizon is not None:
            from reshard.jobs import strip
            strip._check(self.store, state, JobOptions())  # starts once complete lasted H + 2 s
        budget = CapacityBudget(None, None, clock=self.w.clock, sleep=self.w.sleep)
        guard, dynamo = self.job(key, STRIP_JOB)
        keys = m.keys
        # With a server deadline each page's REMOVEs wait H + 2 s after its scan (strip._make_page).
        page = Stripper(dynamo, self.table, [keys.partition] + ([keys.sort] if keys.sort else []), budget,
                        JobOptions(segments=1, workers=1, page_size=50), hold_seconds=removal_hold(state),
                        sleep=self.w.sleep,
                        monotonic=self.w.clock).page
        engine = SegmentEngine(self.store, m.id, STRIP_JOB, 1, 1, page, workers=1, clock=self.w.clock,
                               lease_seconds=self.lease_seconds, max_request_seconds=self.max_request_seconds,
                               sleep=self.w.sleep, host=who, invocation=who, is_dead=lambda owner: False,
                               guard=guard if self.horizon is not None else None)
        engine.work_inline()

    def copier(self, host: str, segments: int = 1, page_size: int = 10, run: int = 1,
               then: Callable[[], None] | None = None, key: str = "m1") -> SegmentEngine:
        """A backfill host of migration ``key``: the real Backfill.page through one SegmentEngine
        worker, inline (``then``: what the same actor does once the worker has nothing left)."""
        w = self.w
        m, mapper = self.migrations[key], self.mappers[key]
        budget = CapacityBudget(None, None, clock=w.clock, sleep=w.sleep)
        # The runner's phase guard, read before every page (min_interval 0: its cache runs on
        # the real monotonic clock, which would make runs depend on real time), and with a
        # server deadline the fact keeper dating every copy.
        guard, dynamo = self.job(key, BACKFILL_JOB)
        budget.attach(dynamo, self.table)
        page = Backfill(dynamo, self.store, m.id, mapper, self.table, budget, page_size=page_size).page
        engine = SegmentEngine(self.store, m.id, BACKFILL_JOB, run, segments, page, workers=1,
                               lease_seconds=self.lease_seconds, max_request_seconds=self.max_request_seconds,
                               poll_seconds=self.poll_seconds, clock=w.clock, sleep=w.sleep, host=host,
                               invocation=host, is_dead=lambda owner: False, guard=guard)
        def body():
            try:
                require_phase_and_ack(self.store, m.id, BACKFILL_JOB)  # run_job's precondition
            except errors.RefusedTransition:
                return
            engine.work_inline()
            if then is not None:
                then()
        w.actor(host, body)
        self.copied = True
        return engine

    # ------------------------------------------------------------ the final state
    def registered(self) -> list[str]:
        """The keys of the migrations registered now, in the order they were added."""
        return [k for k, m in self.migrations.items() if self.store.load_state(m.id, missing_ok=True) is not None]

    def governing(self) -> str:
        """The migration whose phase says where the table's items are now: the last one started."""
        return self.registered()[-1]

    def phase(self, key: str | None = None) -> tuple[str, bool]:
        st = self.store.load_state(self.migrations[key or self.governing()].id)
        return st.phase.value, st.retired

    def view(self, phase: str | None, name: str, key: str = "m1", app: bool = False) -> dict | None:
        """The logical item as a shim of migration ``key`` pinned to ``phase`` reads it (None: steady);
        ``app``: as the application reads it now (with the control row's catch-up flag: both layouts)."""
        t = ShardedTable(self.migrations[key], self.w.dynamo, control_table=None, writer_id="viewer",
                         query_workers=1)
        flag = getattr(self.store.load_state(self.migrations[key].id), "newer_may_be", None) if app and phase else None
        if flag:
            # After a switch, until a verify cleared the flag, the application reads both layouts.
            t._phases.pin(phase, newer_may_be=flag)
        else:
            t._pin_phase(phase)
        return t.get_item(Key=self.keys[name], ConsistentRead=True).get("Item")

    def verify(self, run: int | None = None, host: str = "verifier", repair: bool = False,
               key: str = "m1") -> tuple[bool, dict]:
        """The real verify page function over the whole table, one segment, inline; (passed, counts)."""
        m, mapper = self.migrations[key], self.mappers[key]
        self.verify_runs += 1
        run = run or 100 + self.verify_runs
        budget = CapacityBudget(None, None, clock=self.w.clock, sleep=lambda s: None)
        # A pause > 0: on the logical clock only sleeps move time, so a zero pause would re-read a
        # suspect forever without its settle window ever passing.
        opts = JobOptions(segments=1, workers=1, page_size=50, rechecks=2, recheck_pause=1.0, repair=repair)
        # Verify's waits (the settle window of a suspect, a held lease) sleep on the logical clock:
        # through the scheduler from an actor (a scheduling point), at once from the check.
        # run_job's phase guard, read before every page (afresh after every claim).
        guard, dynamo = self.job(key, VERIFY_JOB, repair)
        v = Verifier(dynamo, self.store, m.id, run, mapper, self.table, budget, opts,
                     sleep=self.w.sleep, clock=self.w.clock)
        # One scan segment and the join (the run's last segment), as run_job runs VERIFY.
        engine = SegmentEngine(self.store, m.id, VERIFY_JOB, run, 2, v.page, workers=1, clock=self.w.clock,
                               lease_seconds=self.lease_seconds, max_request_seconds=self.max_request_seconds,
                               sleep=self.w.sleep, host=host, invocation=host,
                               is_dead=lambda owner: False, guard=guard, join=True,
                               # a passing run started in this phase version clears the catch-up flag
                               phase_version=self.store.load_state(m.id).phase_version)
        engine.work_inline()
        totals = sum_counters(engine.records())
        diffs = {k: int(n) for k, n in differences(totals).items() if n}
        return (not diffs and all(r.done for r in engine.records())), diffs

    def problems(self) -> list[str]:
        """Every invariant violated by the final state and the history (empty: all hold)."""
        gkey = self.governing()
        mapper = self.mappers[gkey]
        phase, retired = self.phase(gkey)
        read_phase = None if (phase == "aborted" and retired) else phase
        out: list[str] = []
        by_item: dict[str, list[Op]] = {}
        for op in self.history.ops:
            by_item.setdefault(op.ident, []).append(op)
        items = self.w.db.items(self.table)
        layouts = by_layout(mapper, items)
        where = f"{phase}" + (f" of {gkey}" if len(self.migrations) > 1 else "")
        disagree: list[str] = []
        for name, fields in self.keys.items():
            ops = by_item.get(name, [])
            keys = dict(fields)
            initial = self.initial.get(name)
            final = self.view(read_phase, name, gkey, app=True)
            lin = lambda fin, **kw: linearizable(ops, initial, keys, fin, **kw)  # noqa: E731
            if not lin(final, results=False, reads=False):
                told = [o.text() for o in ops]
                writes = [o for o in ops if o.kind not in ("get", "delete")]
                deletes = [o for o in ops if o.kind == "delete" and o.resp is not None]
                resurrected = final is not None and any(
                    all(o.resp is not None and o.resp <= d.invoke for o in writes) for d in deletes)
                twice = any(linearizable(ops + [Op(o.actor, o.kind, o.ident, o.args, o.invoke)], initial, keys, final,
                                         results=False, reads=False) for o in ops if o.kind == "add")
                kind = ("resurrection (an acknowledged delete undone)" if resurrected else
                        "a write applied twice" if twice else "lost acknowledged write")
                out.append(f"{kind}: {name} reads {final} in {where}; the application was told {told}")
            elif not lin(final, results=True, reads=False):
                out.append(f"wrong result: no order of {[o.text() for o in ops]} gives every caller the answer "
                           f"it got (e.g. two callers told the same count, two conditional writes both won)")
            elif not lin(final, results=True, reads=True):
                out.append(f"read-your-writes / stale read: no order of {[o.text() for o in ops]} explains "
                           f"every read and the final state ({name} reads {final} in {where}: a write a read saw "
                           "was lost, or one a later delete removed came back)")
            # From backfill on, the next transition reads the other layout: both must hold the
            # same item (items the shims wrote; every item once a copier ran). Before backfill a
            # lagging planned shim may legitimately leave the new layout behind: the copy fixes it.
            if phase in ("backfill", "cutover") and (ops or self.copied):
                old, new = self.view("dual_write", name, gkey), self.view("cutover", name, gkey)
                if old != new and self.lost_mirrors:
                    disagree.append(f"{name} (old layout {old}, new layout {new})")
                elif old != new:
                    out.append(f"layouts disagree on {name} in {where}: old layout {old}, new layout {new}")
            ident = mapper.identity(mapper.logical_fields(_wire(fields)))
            n_old = len(layouts["old"].get(ident, []))
            n_new = len(layouts["new"].get(ident, []))
            if n_old > max(1, self.seeded_old.get(name, 1)) or n_new > 1:
                out.append(f"duplicate: {name} has {n_old} old-layout and {n_new} new-layout physical items")
        if self.swept_at is not None:
            # `reshard cleanup` returned: no tombstone is left once every delete was acknowledged
            # before it (a later delete by a shim still on aborted is that shim's: it was live).
            deletes = [o for o in self.history.ops if o.kind == "delete"]
            swept = deletes and all(o.resp is not None and o.resp <= self.swept_at for o in deletes)
            left = [i for i in items if TOMBSTONE_ATTR in i] if swept else []
            if left:
                out.append(f"leftover tombstone after the cleanup returned: {left}")
        if disagree and phase in VERIFY_PHASES:
            # Under the fault model a mirror may be lost for good (its writer died, or it arrived
            # after its horizon): the layouts may disagree, as long as the application's reads
            # do not show it (catch-up) and no verify passes over it -- the verify that gates the
            # next transition reading one layout alone (docs/late-writes.md, catch-up).
            passed, diffs = self.verify(key=gkey)
            if passed:
                out.append(f"verify passed while the layouts disagree on {', '.join(disagree)} in {where}")
        for key in self.registered():
            if self.phase(key) == ("aborted", True):
                # A retired migration left no new-layout copy behind: a retry of the migration
                # would find it at its new key (issue 12 case 6).
                left = [i for i in items if self.mappers[key].is_new_copy(i)]
                if left:
                    out.append(f"leftover new-layout copies after the retire of {self.migrations[key].id}: {left}")
        return out

    def check(self, w: World) -> None:
        problems = self.problems()
        gkey = self.governing()
        phase, _ = self.phase(gkey)
        note = ""
        if problems and phase in VERIFY_PHASES:
            # Only a violated state needs verify's verdict: "verify never passes while an
            # invariant is violated" says nothing about a correct state.
            passed, diffs = self.verify(key=gkey)
            note = "\n  and VERIFY PASSED over this state" if passed else f"\n  (verify failed: {diffs})"
        if problems:
            raise AssertionError("; ".join(problems) + f" [final phase {phase}; operator: {self.outcomes}]" + note)


def migration_variant(kind: str, table: str, mid: str, shards: tuple[int, int] | None = None):
    """The example migration ``kind`` on ``table`` under the id ``mid``, its ``[from]`` / ``[to]``
    shard counts replaced by ``shards`` (a second migration of the same table: 32 -> 64 after
    16 -> 32; a retry of an aborted one: the same layouts, another id)."""
    import re
    text = migration_text(kind, table, mid)
    if shards is not None:
        for section, n in zip(("from", "to"), shards):
            text = re.sub(rf"(\[{section}\][^\[]*?shards = )\d+", rf"\g<1>{n}", text, count=1, flags=re.S)
    return parse(text, f"<{kind}:{mid}>")


def _wire(fields: dict) -> dict:
    from reshard.aws.dynamo import to_wire
    return to_wire(fields)


def scenario(build: Callable[[World], Fleet]) -> Callable[[World], Callable[[World], None]]:
    """A factory for :func:`~tests.model.explore.explore` from a function that builds a Fleet."""
    def factory(w: World):
        fleet = build(w)
        return fleet.check
    return factory

