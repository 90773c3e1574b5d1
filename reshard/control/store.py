"""The control table: where migrations, their phase, history, fleet and jobs live.

Item layout (one DynamoDB table, default ``reshard-control``, PAY_PER_REQUEST,
partition key ``pk`` and sort key ``sk``, both strings)::

    pk              sk                          what
    M#<id>          META                        the migration: file text + hash, table,
                                                phase, phase_version, last transition
    M#<id>          H#<phase_version:08d>       one transition: from, to, action, who, at
    M#<id>          S#<instance id>             a shim heartbeat: host, pid, phase and
                                                phase_version it acts on, at, liveness
    M#<id>          J#<job>#<run>#<segment:05d> a job segment (backfill/verify/cleanup):
                                                lease owner/expiry/counter, checkpoint
    M#<id>          R#<job>#<run>               a job run: started/finished, totals, result
    M#<id>          U#<job>#<digest>            an unmappable item found by a job
    T#<table>       ACTIVE                      which migration owns a data table now

Everything about one migration shares a partition, so ``status`` is one Query.

Every state change is a conditional write. Phase changes compare-and-set on
``phase_version``: the loser of two racing operators gets
:class:`~reshard.errors.ConcurrentChange` naming the phase the winner set. The
``T#<table>`` lock makes "one active migration per table" race-free.
"""

from __future__ import annotations

import difflib
import getpass
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from reshard import errors
from reshard.aws.dynamo import Dynamo, expression_kwargs
from reshard.core.migration import Migration, parse
from reshard.core.phases import Action, Facts, Phase, TERMINAL, decide

DEFAULT_CONTROL_TABLE = "reshard-control"
META = "META"

#: A shim refuses to act once it could not refresh for this long (seconds).
DEFAULT_LIVENESS_SECONDS = 30.0
#: What an operator needs on the control table (named in permission errors).
CONTROL_TABLE_PERMISSIONS = ("dynamodb:DescribeTable, CreateTable, GetItem, PutItem, UpdateItem, DeleteItem, "
                             "Query and Scan")
#: The census keeps a heartbeat this much longer than the shim's own liveness window,
#: to absorb clock skew between the shim's host and the operator's.
CLOCK_SKEW_ALLOWANCE_SECONDS = 15.0


def operator_name() -> str:
    """Who is acting: ``$RESHARD_OPERATOR``, else ``user@host``."""
    env = os.environ.get("RESHARD_OPERATOR")
    if env:
        return env
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def S(v: str) -> dict:
    return {"S": v}


def N(v: float | int) -> dict:
    return {"N": repr(v) if isinstance(v, float) else str(v)}


def _s(item: dict, k: str, default: str | None = None) -> str | None:
    return item[k]["S"] if k in item else default


def _n(item: dict, k: str, default: float | None = None) -> float | None:
    if k not in item:
        return default
    v = item[k]["N"]
    return int(v) if v.lstrip("-").isdigit() else float(v)


@dataclass(frozen=True)
class Transition:
    """One recorded phase change."""

    phase_version: int
    from_phase: str
    to_phase: str
    action: str
    who: str
    at: float

    def as_dict(self) -> dict:
        return {"phase_version": self.phase_version, "from": self.from_phase, "to": self.to_phase,
                "action": self.action, "who": self.who, "at": self.at}


@dataclass(frozen=True)
class MigrationState:
    """The META record of a migration, parsed."""

    id: str
    table: str
    phase: Phase
    phase_version: int
    file_text: str
    file_hash: str
    created_at: float
    created_by: str
    updated_at: float
    last: Transition | None
    raw: dict = field(repr=False, default_factory=dict)

    def migration(self) -> Migration:
        """The migration file as registered (the control table is the source of truth)."""
        return parse(self.file_text, f"control-table:{self.id}")

    @property
    def retired(self) -> bool:
        """An aborted migration whose cleanup pass finished: shims serve the old layout as steady state."""
        return bool(self.raw.get("retired", {}).get("BOOL", False))

    @property
    def active(self) -> bool:
        """Still owns its table: not complete, and not aborted-and-cleaned-up."""
        if self.phase is Phase.ABORTED:
            return not self.retired
        return self.phase not in TERMINAL


@dataclass(frozen=True)
class Heartbeat:
    """One shim instance's last report."""

    instance: str
    host: str
    pid: int
    phase: str
    phase_version: int
    at: float
    liveness_seconds: float

    def live(self, now: float) -> bool:
        return now - self.at <= self.liveness_seconds + CLOCK_SKEW_ALLOWANCE_SECONDS

    def describe(self) -> str:
        return f"{self.instance} ({self.host} pid {self.pid}, on {self.phase} v{self.phase_version})"

    def as_dict(self, now: float) -> dict:
        return {"instance": self.instance, "host": self.host, "pid": self.pid, "phase": self.phase,
                "phase_version": self.phase_version, "seconds_ago": round(now - self.at, 1),
                "live": self.live(now)}


@dataclass(frozen=True)
class Census:
    """The live fleet, and who lags behind a phase version."""

    live: tuple[Heartbeat, ...]
    expired: tuple[Heartbeat, ...]
    version: int

    @property
    def lagging(self) -> tuple[Heartbeat, ...]:
        return tuple(h for h in self.live if h.phase_version < self.version)

    @property
    def acknowledged(self) -> bool:
        return not self.lagging


#: A gate supplies the facts for the cutover and completion preconditions. The
#: control plane calls it with the store and the state; later issues plug theirs in.
FactsProvider = Callable[["ControlStore", MigrationState], dict]
_fact_providers: list[FactsProvider] = []


def register_facts_provider(fn: FactsProvider) -> FactsProvider:
    """Add a provider of :class:`~reshard.core.phases.Facts` fields (backfill, verify, cleanup)."""
    _fact_providers.append(fn)
    return fn


class ControlStore:
    """Reads and conditional writes of the control table."""

    def __init__(self, dynamo: Dynamo, table: str = DEFAULT_CONTROL_TABLE,
                 clock: Callable[[], float] = time.time):
        self.dynamo = dynamo
        self.table = table
        self.clock = clock

    # ------------------------------------------------------------------ table
    def exists(self) -> bool:
        try:
            self.dynamo.call("describe_table", TableName=self.table)
            return True
        except errors.ResourceNotFound:
            return False
        except errors.AccessDenied as e:
            raise errors.AccessDenied(e.operation, e.code, f"cannot describe control table {self.table!r}: "
                                      f"{e.aws_message} (reshard needs {CONTROL_TABLE_PERMISSIONS} on it; "
                                      "`reshard iam-policy FILE` prints the policy)",
                                      e.request_id) from None

    def ensure_table(self) -> bool:
        """Create the control table if missing (idempotent). True if we created it."""
        if self.exists():
            return False
        try:
            self.dynamo.call(
                "create_table", TableName=self.table, BillingMode="PAY_PER_REQUEST",
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                      {"AttributeName": "sk", "AttributeType": "S"}],
            )
        except errors.AccessDenied as e:
            raise errors.AccessDenied(e.operation, e.code, f"cannot create control table {self.table!r}: "
                                      f"{e.aws_message} (grant dynamodb:CreateTable, or have an admin create "
                                      "it: PAY_PER_REQUEST, key pk (S, HASH) + sk (S, RANGE); `reshard iam-policy FILE` "
                                      "prints the policy)", e.request_id) from None
        except errors.AWSError as e:
            if e.code != "ResourceInUseException":  # another process created it first: fine
                raise
        self._wait_active()
        return True

    def _wait_active(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.dynamo.call("describe_table", TableName=self.table)["Table"]
            if t.get("TableStatus") == "ACTIVE":
                return
            time.sleep(0.5)
        raise errors.AWSError("create_table", "Timeout", f"control table {self.table} not ACTIVE after {timeout}s")

    def require_table(self) -> None:
        if not self.exists():
            raise self._missing_table()

    def _missing_table(self) -> errors.ControlTableMissing:
        return errors.ControlTableMissing(f"control table {self.table!r} does not exist at "
                                        f"{self.dynamo.endpoint_url}: run `reshard start FILE` first "
                                        "(or pass --control-table)")

    def _read(self, operation: str, **kwargs) -> dict:
        """A read of the control table; a missing table becomes the one clear line above
        (exit 2) instead of DynamoDB's bare ResourceNotFoundException."""
        try:
            return self.dynamo.call(operation, **kwargs)
        except errors.ResourceNotFound:
            raise self._missing_table() from None

    # ------------------------------------------------------------------ primitives
    def get(self, pk: str, sk: str, consistent: bool = True) -> dict | None:
        resp = self._read("get_item", TableName=self.table, Key={"pk": S(pk), "sk": S(sk)},
                          ConsistentRead=consistent)
        return resp.get("Item")

    def query(self, pk: str, prefix: str = "", consistent: bool = True) -> list[dict]:
        kwargs: dict[str, Any] = {"TableName": self.table, "ConsistentRead": consistent,
                                  "ExpressionAttributeValues": {":pk": S(pk)}}
        if prefix:
            kwargs["KeyConditionExpression"] = "pk = :pk AND begins_with(sk, :p)"
            kwargs["ExpressionAttributeValues"][":p"] = S(prefix)
        else:
            kwargs["KeyConditionExpression"] = "pk = :pk"
        try:
            return list(self.dynamo.query_all(**kwargs))
        except errors.ResourceNotFound:
            raise self._missing_table() from None

    def put(self, item: dict, condition: str | None = None, names: dict | None = None,
            values: dict | None = None) -> None:
        self.dynamo.call("put_item", TableName=self.table, Item=item, **expression_kwargs(condition, names, values))

    def update(self, pk: str, sk: str, expression: str, condition: str | None = None,
               names: dict | None = None, values: dict | None = None, return_new: bool = False) -> dict | None:
        kwargs = expression_kwargs(condition, names, values)
        if return_new:
            kwargs["ReturnValues"] = "ALL_NEW"
        resp = self.dynamo.call("update_item", TableName=self.table, Key={"pk": S(pk), "sk": S(sk)},
                                UpdateExpression=expression, **kwargs)
        return resp.get("Attributes")

    def delete(self, pk: str, sk: str, condition: str | None = None, names: dict | None = None,
               values: dict | None = None) -> None:
        self.dynamo.call("delete_item", TableName=self.table, Key={"pk": S(pk), "sk": S(sk)},
                         **expression_kwargs(condition, names, values))

    # ------------------------------------------------------------------ migrations
    @staticmethod
    def mpk(migration_id: str) -> str:
        return f"M#{migration_id}"

    def register(self, m: Migration, who: str | None = None) -> tuple[MigrationState, bool]:
        """Register a migration as ``planned``. Idempotent for the same file text.

        Returns (state, created). Refuses a changed file under the same id (with a diff
        summary) and a second active migration on the same table.
        """
        self.ensure_table()
        who = who or operator_name()
        now = self.clock()
        existing = self.load_state(m.id, missing_ok=True)
        if existing is not None:
            if existing.file_hash == m.content_hash:
                return existing, False
            raise errors.BadInput(f"migration {m.id!r} is already registered with different content; "
                                  f"{diff_summary(existing.file_text, m.text)}. Give the changed file a new id.")
        self._claim_table(m, now)
        item = {
            "pk": S(self.mpk(m.id)), "sk": S(META), "id": S(m.id), "table": S(m.table),
            "file_text": S(m.text), "file_hash": S(m.content_hash), "file_path": S(m.path),
            "phase": S(Phase.PLANNED.value), "phase_version": N(1),
            "created_at": N(now), "created_by": S(who), "updated_at": N(now), "updated_by": S(who),
            "last_from": S(""), "last_to": S(Phase.PLANNED.value), "last_action": S("start"),
        }
        try:
            self.put(item, condition="attribute_not_exists(pk)")
        except errors.ConditionalCheckFailed:
            # Someone registered the same id between our read and write.
            return self.register(m, who)
        self._record_history(m.id, Transition(1, "", Phase.PLANNED.value, "start", who, now))
        return self.load_state(m.id), True

    def _claim_table(self, m: Migration, now: float) -> None:
        """Take the ``T#<table>`` lock: at most one active migration per data table."""
        lock = {"pk": S(f"T#{m.table}"), "sk": S("ACTIVE"), "migration_id": S(m.id), "at": N(now)}
        try:
            # Conditional: free, or already ours (a retried start). Two starts of different
            # migrations on one table race here and exactly one wins.
            self.put(lock, condition="attribute_not_exists(pk) OR migration_id = :id", values={":id": S(m.id)})
            return
        except errors.ConditionalCheckFailed:
            pass
        owner = self.get(f"T#{m.table}", "ACTIVE")
        other = _s(owner or {}, "migration_id", "?")
        other_state = self.load_state(other, missing_ok=True)
        if other_state is not None and other_state.active:
            hint = ("run `reshard cleanup` on it first" if other_state.phase is Phase.ABORTED
                    else "complete or abort it first")
            raise errors.BadInput(f"table {m.table!r} already has an active migration {other!r} "
                                  f"(in {other_state.phase}); {hint}")
        # A stale lock: its owner finished (and died before releasing the lock) or never
        # got its META written. Take it over only if it still names that owner, so two
        # operators taking over at once cannot both win.
        try:
            self.put(lock, condition="migration_id = :other", values={":other": S(other)})
        except errors.ConditionalCheckFailed:
            raise errors.ConcurrentChange(f"another operator claimed table {m.table!r} at the same moment; "
                                          "check `reshard status` and retry") from None

    def load_state(self, migration_id: str, missing_ok: bool = False) -> MigrationState | None:
        item = self.get(self.mpk(migration_id), META)
        if item is None:
            if missing_ok:
                return None
            raise errors.MigrationNotFound(f"no migration {migration_id!r} in control table {self.table!r} "
                                           "(run `reshard start FILE`)")
        return _state(item)

    def list_states(self) -> list[MigrationState]:
        """Every registered migration (a Scan of META records; the control table is small)."""
        out, kwargs = [], {"TableName": self.table, "FilterExpression": "sk = :m",
                           "ExpressionAttributeValues": {":m": S(META)}, "ConsistentRead": True}
        while True:
            resp = self._read("scan", **kwargs)
            out.extend(_state(i) for i in resp.get("Items", []))
            if not resp.get("LastEvaluatedKey"):
                return sorted(out, key=lambda s: s.created_at)
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def history(self, migration_id: str) -> list[Transition]:
        rows = [_transition(i) for i in self.query(self.mpk(migration_id), "H#")]
        state = self.load_state(migration_id, missing_ok=True)
        # META is written first; a crash before the history row leaves META's copy.
        if state and state.last and (not rows or rows[-1].phase_version < state.last.phase_version):
            rows.append(state.last)
        return rows

    def _record_history(self, migration_id: str, t: Transition) -> None:
        try:
            self.put({"pk": S(self.mpk(migration_id)), "sk": S(f"H#{t.phase_version:08d}"),
                      "from": S(t.from_phase), "to": S(t.to_phase), "action": S(t.action), "who": S(t.who),
                      "at": N(t.at), "phase_version": N(t.phase_version)},
                     condition="attribute_not_exists(pk)")
        except errors.ConditionalCheckFailed:
            pass  # already recorded (a retried call): history rows are write-once

    # ------------------------------------------------------------------ transitions
    def facts(self, state: MigrationState, census: Census) -> Facts:
        from reshard.control import gates  # noqa: F401  (registers the job gates' facts providers once)
        extra: dict = {}
        for provider in _fact_providers:
            extra.update(provider(self, state))
        return Facts(lagging=tuple(h.describe() for h in census.lagging), **extra)

    def transition(self, migration_id: str, action: Action, who: str | None = None,
                   expected_version: int | None = None) -> tuple[MigrationState, MigrationState]:
        """Apply ``action`` if the rules allow it. Returns (before, after).

        The write is a compare-and-set on ``phase_version``: of two operators who
        read the same state, exactly one write matches; the other raises
        ConcurrentChange with the phase the winner set.
        """
        who = who or operator_name()
        state = self.load_state(migration_id)
        if expected_version is not None and state.phase_version != expected_version:
            raise self.lost_race(migration_id, expected_version)
        if state.last is not None:
            # The previous transition wrote META first and its history row second; if that
            # process died in between, record the row now (write-once, so a no-op normally),
            # before META's copy of it is overwritten and the history would keep a gap.
            self._record_history(migration_id, state.last)
        census = self.census(migration_id, state.phase_version)
        decision = decide(action, state.phase, self.facts(state, census))
        if not decision.allowed:
            raise errors.RefusedTransition(f"{action.value} refused for {migration_id!r} in {state.phase}: "
                                           + "; ".join(decision.refusals))
        now = self.clock()
        new_version = state.phase_version + 1
        target = decision.target
        try:
            # The compare-and-set: only the operator who read this exact version wins.
            self.update(
                self.mpk(migration_id), META,
                "SET phase = :to, phase_version = :nv, updated_at = :now, updated_by = :who, "
                "last_from = :from, last_to = :to, last_action = :act",
                condition="phase_version = :v AND phase = :from",
                values={":to": S(target.value), ":nv": N(new_version), ":now": N(now), ":who": S(who),
                        ":from": S(state.phase.value), ":act": S(action.value), ":v": N(state.phase_version)},
            )
        except errors.ConditionalCheckFailed:
            raise self.lost_race(migration_id, state.phase_version) from None
        self._record_history(migration_id, Transition(new_version, state.phase.value, target.value,
                                                      action.value, who, now))
        if target is Phase.COMPLETE:
            # An aborted migration keeps the table until `reshard cleanup` removed its new
            # copies (see retire): a new migration must not start among them.
            self._release_table(state.table, migration_id)
        return state, self.load_state(migration_id)

    def retire(self, migration_id: str, who: str | None = None) -> MigrationState:
        """Mark an aborted migration cleaned up (its cleanup pass finished).

        A compare-and-set that also bumps ``phase_version``: shims pick the change up
        like a phase change (aborted + retired = steady state: plain deletes, no
        versions) and acknowledge it. Idempotent; releases the table for a new migration.
        """
        who = who or operator_name()
        state = self.load_state(migration_id)
        if state.phase is not Phase.ABORTED:
            raise errors.RefusedTransition(f"only an aborted migration can be retired ({migration_id!r} is in "
                                           f"{state.phase})")
        if not state.retired:
            now = self.clock()
            try:
                self.update(self.mpk(migration_id), META,
                            "SET retired = :t, phase_version = :nv, updated_at = :now, updated_by = :who, "
                            "last_from = :ph, last_to = :ph, last_action = :act",
                            condition="phase_version = :v AND phase = :ph",
                            values={":t": {"BOOL": True}, ":nv": N(state.phase_version + 1), ":now": N(now),
                                    ":who": S(who), ":ph": S(Phase.ABORTED.value), ":act": S("retire"),
                                    ":v": N(state.phase_version)})
                self._record_history(migration_id, Transition(state.phase_version + 1, Phase.ABORTED.value,
                                                              Phase.ABORTED.value, "retire", who, now))
            except errors.ConditionalCheckFailed:
                pass  # another host finished the same cleanup run and retired it first
        self._release_table(state.table, migration_id)
        return self.load_state(migration_id)

    def lost_race(self, migration_id: str, version: int) -> errors.ConcurrentChange:
        now = self.load_state(migration_id)
        who = now.last.who if now.last else "?"
        return errors.ConcurrentChange(
            f"another operator ({who}) moved migration {migration_id!r} first: it is now in {now.phase} "
            f"(phase version {now.phase_version}, you acted on {version}); check `reshard status` before acting again")

    def _release_table(self, table: str, migration_id: str) -> None:
        try:
            self.delete(f"T#{table}", "ACTIVE", condition="migration_id = :id", values={":id": S(migration_id)})
        except errors.ConditionalCheckFailed:
            pass

    def active_migration_ids(self) -> list[str]:
        """Ids of migrations that still own their table (not complete, not aborted-and-cleaned)."""
        return [s.id for s in self.list_states() if s.active]

    # ------------------------------------------------------------------ fleet
    def heartbeat(self, migration_id: str, instance: str, phase: str, phase_version: int,
                  liveness_seconds: float = DEFAULT_LIVENESS_SECONDS, host: str | None = None,
                  pid: int | None = None, table: str = "") -> None:
        """Record that a shim acts on ``phase_version`` (unconditional: a shim owns its row)."""
        self.put({"pk": S(self.mpk(migration_id)), "sk": S(f"S#{instance}"), "instance": S(instance),
                  "host": S(host or socket.gethostname()), "pid": N(pid if pid is not None else os.getpid()),
                  "phase": S(phase), "phase_version": N(phase_version), "at": N(self.clock()),
                  "liveness_seconds": N(float(liveness_seconds)), "data_table": S(table or "-")})

    def forget_shim(self, migration_id: str, instance: str) -> None:
        """Remove a heartbeat (a shim closing cleanly leaves the census at once)."""
        self.delete(self.mpk(migration_id), f"S#{instance}")

    def heartbeats(self, migration_id: str) -> list[Heartbeat]:
        out = []
        for i in self.query(self.mpk(migration_id), "S#"):
            out.append(Heartbeat(_s(i, "instance"), _s(i, "host", "?"), int(_n(i, "pid", 0)), _s(i, "phase", "?"),
                                 int(_n(i, "phase_version", 0)), float(_n(i, "at", 0)),
                                 float(_n(i, "liveness_seconds", DEFAULT_LIVENESS_SECONDS))))
        return out

    def census(self, migration_id: str, version: int) -> Census:
        now = self.clock()
        beats = self.heartbeats(migration_id)
        return Census(tuple(h for h in beats if h.live(now)), tuple(h for h in beats if not h.live(now)), version)

    def wait_for_ack(self, migration_id: str, version: int, seconds: float,
                     sleep: Callable[[float], None] = time.sleep, poll: float = 1.0) -> Census:
        """Poll the census until every live shim acknowledged ``version`` or time runs out.

        The deadline is measured with the store's clock, the same clock that decides
        liveness, so a test that injects a clock and a ``sleep`` advancing it sees
        heartbeats expire while it waits (and never spins on the real clock).
        """
        deadline = self.clock() + max(0.0, seconds)
        while True:
            c = self.census(migration_id, version)
            left = deadline - self.clock()
            if c.acknowledged or left <= 0:
                return c
            sleep(min(poll, left))


def diff_summary(old: str, new: str, limit: int = 6) -> str:
    """One line saying how two migration files differ (changed lines, first few)."""
    changes = [l for l in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
               if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    shown = " | ".join(c.strip() for c in changes[:limit])
    more = f" (+{len(changes) - limit} more)" if len(changes) > limit else ""
    return f"{len(changes)} changed line(s): {shown}{more}"


def _transition(i: dict) -> Transition:
    return Transition(int(_n(i, "phase_version", 0)), _s(i, "from", ""), _s(i, "to", ""), _s(i, "action", ""),
                      _s(i, "who", "?"), float(_n(i, "at", 0)))


def _state(item: dict) -> MigrationState:
    version = int(_n(item, "phase_version"))
    last = None
    if "last_to" in item:
        last = Transition(version, _s(item, "last_from", ""), _s(item, "last_to"), _s(item, "last_action", ""),
                          _s(item, "updated_by", "?"), float(_n(item, "updated_at", 0)))
    return MigrationState(
        id=_s(item, "id"), table=_s(item, "table"), phase=Phase(_s(item, "phase")), phase_version=version,
        file_text=_s(item, "file_text"), file_hash=_s(item, "file_hash"),
        created_at=float(_n(item, "created_at", 0)), created_by=_s(item, "created_by", "?"),
        updated_at=float(_n(item, "updated_at", 0)), last=last, raw=item)


def resolve(store: ControlStore, ref: str | None) -> str:
    """A migration id from a file path, an id, or nothing (exactly one active migration)."""
    import pathlib
    if ref:
        p = pathlib.Path(ref)
        if ref.endswith(".toml") or p.is_file():
            from reshard.core.migration import load
            return load(ref).id
        return ref
    store.require_table()
    active = store.active_migration_ids()
    if len(active) == 1:
        return active[0]
    if not active:
        raise errors.MigrationNotFound("no active migration in control table "
                                       f"{store.table!r}; name one (file or id)")
    raise errors.BadInput(f"{len(active)} active migrations ({', '.join(active)}); name one (file or id)")

