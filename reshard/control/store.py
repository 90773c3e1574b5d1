"""The control table's record store: table set-up, row primitives, migration records,
history, the table lock, and the compare-and-set writes that change a phase.

Every state change is a conditional write. A phase change compare-and-sets on
``phase_version`` (:meth:`ControlStore.set_phase`): of two operators who read the same
version, exactly one write matches and the other gets
:class:`~reshard.errors.ConcurrentChange` naming the phase the winner set. The
``T#<table>`` lock makes "one active migration per table" race-free. What a transition
needs (rules, fleet, gates) is decided elsewhere: :mod:`reshard.control.transition`.
Row layout: :mod:`reshard.control.records`.
"""

from __future__ import annotations

import getpass
import os
import pathlib
import socket
import time
from typing import Any, Callable, Mapping

from reshard import errors
from reshard.aws.dynamo import Dynamo, expression_kwargs
from reshard.control.records import (META, SCHEMA, TABLE_LOCK_SK, MigrationState, Transition, check_row, heartbeat_pk,
                                     history_sk, jobs_pk, migration_pk, table_lock_pk)
from reshard.core.deadlines import DEFAULT_HORIZON_SECONDS, clamp_horizon
from reshard.core.leases import LeaseWatch
from reshard.core.migration import Migration, load
from reshard.core.phases import Phase
from reshard.core.wire import N, S, carries, get_s, projection

DEFAULT_CONTROL_TABLE = "reshard-control"
#: What an operator needs on the control table (named in permission errors).
CONTROL_TABLE_PERMISSIONS = ("dynamodb:DescribeTable, CreateTable, GetItem, PutItem, UpdateItem, DeleteItem, "
                             "Query and Scan")


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


def landed(dynamo: Dynamo, table: str, key: dict, wrote: Mapping[str, dict] | None) -> bool:
    """Did my conditional write land? Asked after it failed its condition: ``Dynamo.call``
    sends a write again when its answer was lost, and the resend fails on the first attempt's
    own effect. One consistent read: the item holds exactly what this write set (``wrote``,
    with something only this attempt writes: a new version, its own ``updated_at`` and
    operator; None for a delete: the item is gone) -- the write happened, and the caller goes
    on as if the answer had come. Otherwise another writer's change failed it."""
    item = dynamo.call("get_item", TableName=table, Key=key, ConsistentRead=True).get("Item")
    return carries(item, wrote)


class ControlStore:
    """Reads and conditional writes of the control table."""

    def __init__(self, dynamo: Dynamo, table: str = DEFAULT_CONTROL_TABLE,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] | None = None):
        self.dynamo = dynamo
        self.table = table
        #: The wall clock rows are stamped with (shown, never compared across hosts).
        self.clock = clock
        #: This host's clock for durations it measures itself (how long a heartbeat went
        #: unchanged); a test that injects ``clock`` drives both.
        self.monotonic = monotonic or (time.monotonic if clock is time.time else clock)
        #: What this process has seen of each heartbeat, and since when (the census's memory:
        #: a shim is only called gone once *we* watched it stay silent long enough).
        self.heartbeat_watch = LeaseWatch()

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

    def query(self, pk: str, prefix: str = "", consistent: bool = True, attributes: tuple[str, ...] = (),
              page_size: int | None = None) -> list[dict]:
        """Every row of partition ``pk`` whose sort key starts with ``prefix``; ``attributes``:
        only these (a ProjectionExpression: junk attributes are not transferred or parsed);
        ``page_size``: at most this many rows per request (Limit)."""
        kwargs: dict[str, Any] = {"TableName": self.table, "ConsistentRead": consistent,
                                  "ExpressionAttributeValues": {":pk": S(pk)}}
        if attributes:
            kwargs.update(projection(attributes))
        if page_size:
            kwargs["Limit"] = page_size
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
        """Every row reshard puts says which format it has (``check_row`` refuses others)."""
        item = {**item, "schema": item.get("schema", N(SCHEMA))}
        self.dynamo.call("put_item", TableName=self.table, Item=item, **expression_kwargs(condition, names, values))

    def update(self, pk: str, sk: str, expression: str, condition: str | None = None,
               names: dict | None = None, values: dict | None = None, return_new: bool = False,
               guard: Callable[[], None] | None = None) -> dict | None:
        """``guard``: run before every attempt (see :meth:`Dynamo.call`), e.g. a lease renewal's deadline."""
        kwargs = expression_kwargs(condition, names, values)
        if return_new:
            kwargs["ReturnValues"] = "ALL_NEW"
        if guard is not None:
            kwargs["guard"] = guard
        resp = self.dynamo.call("update_item", TableName=self.table, Key={"pk": S(pk), "sk": S(sk)},
                                UpdateExpression=expression, **kwargs)
        return resp.get("Attributes")

    def delete(self, pk: str, sk: str, condition: str | None = None, names: dict | None = None,
               values: dict | None = None) -> None:
        self.dynamo.call("delete_item", TableName=self.table, Key={"pk": S(pk), "sk": S(sk)},
                         **expression_kwargs(condition, names, values))

    def landed(self, pk: str, sk: str, wrote: Mapping[str, dict] | None) -> bool:
        """Whether the row holds what a conditional write of ours set (:func:`landed`)."""
        return landed(self.dynamo, self.table, {"pk": S(pk), "sk": S(sk)}, wrote)

    # ------------------------------------------------------------------ migrations
    @staticmethod
    def mpk(migration_id: str) -> str:
        return migration_pk(migration_id)

    @staticmethod
    def hpk(migration_id: str) -> str:
        return heartbeat_pk(migration_id)

    @staticmethod
    def jpk(migration_id: str, job: str) -> str:
        return jobs_pk(migration_id, job)

    def register(self, m: Migration, who: str | None = None, *, request_horizon: float = DEFAULT_HORIZON_SECONDS,
                 server_deadline: bool = False, previous_horizon: float = 0.0) -> tuple[MigrationState, bool]:
        """Register a migration as ``planned``. Idempotent for a file of the same meaning.

        Returns (state, created). A file that differs from the registered one only in what is
        not meaning (comments, whitespace, key order, quoting, description) is the same
        migration: the registered text stays. Refuses a change of meaning under the same id
        (naming each change, ``to.shards: 32 -> 64``) and a second active migration on the
        same table. The row keeps the hash of the bytes (``file_hash``, what earlier releases
        compare) beside the hash of the meaning (``meaning_hash``). ``request_horizon`` and
        ``server_deadline`` (whether the server was found to enforce the signature window:
        ``start``'s probe) go into META (docs/late-writes.md); a re-registration keeps what
        the first one recorded.
        """
        self.ensure_table()
        who = who or operator_name()
        now = self.clock()
        existing = self.load_state(m.id, missing_ok=True)
        if existing is not None:
            changes = existing.changes_from(m)
            if not changes:
                return existing, False
            raise errors.BadInput(changed_meaning(m.id, changes))
        self._claim_table(m, now)
        item = {
            "pk": S(self.mpk(m.id)), "sk": S(META), "id": S(m.id), "table": S(m.table),
            "file_text": S(m.text), "file_hash": S(m.content_hash), "meaning_hash": S(m.meaning_hash),
            "file_path": S(m.path),
            "phase": S(Phase.PLANNED.value), "phase_version": N(1),
            "created_at": N(now), "created_by": S(who), "updated_at": N(now), "updated_by": S(who),
            "last_from": S(""), "last_to": S(Phase.PLANNED.value), "last_action": S("start"),
            "request_horizon": N(clamp_horizon(request_horizon)),
            "server_deadline": S("enforced" if server_deadline else "off"),
        }
        if previous_horizon:  # the horizon of the marker's previous owner: `planned` outlasts it
            item["previous_horizon"] = N(clamp_horizon(previous_horizon))
        try:
            self.put(item, condition="attribute_not_exists(pk)")
        except errors.ConditionalCheckFailed:
            if not self.landed(self.mpk(m.id), META, {k: item[k] for k in ("created_at", "created_by", "meaning_hash")}):
                # Someone registered the same id between our read and write.
                return self.register(m, who, request_horizon=request_horizon, server_deadline=server_deadline,
                                     previous_horizon=previous_horizon)
            # else: our own put landed and its answer was lost (the resend failed on it): go on.
        self.stamp_since(m.id, 1)
        self.record_history(m.id, Transition(1, "", Phase.PLANNED.value, "start", who, now))
        return self.load_state(m.id), True

    def set_allowance(self, migration_id: str, allow_unmappable: int, who: str | None = None) -> None:
        """Record the operator's ``--allow-unmappable N`` on META (read by verify, backfill and the gates)."""
        self.update(self.mpk(migration_id), META, "SET allow_unmappable = :n, allowance_by = :w, allowance_at = :t",
                    condition="attribute_exists(pk)",
                    values={":n": N(allow_unmappable), ":w": S(who or operator_name()), ":t": N(self.clock())})

    def set_item_count(self, migration_id: str, items: int, source: str) -> None:
        """Record an exact item count of the data table on META (progress totals and ETA)."""
        self.update(self.mpk(migration_id), META, "SET item_count = :n, item_count_source = :s, item_count_at = :t",
                    condition="attribute_exists(pk)",
                    values={":n": N(items), ":s": S(source), ":t": N(self.clock())})

    def _claim_table(self, m: Migration, now: float) -> None:
        """Take the ``T#<table>`` lock: at most one active migration per data table."""
        lock = {"pk": S(table_lock_pk(m.table)), "sk": S(TABLE_LOCK_SK), "migration_id": S(m.id), "at": N(now)}
        try:
            # Conditional: free, or already ours (a retried start). Two starts of different
            # migrations on one table race here and exactly one wins.
            self.put(lock, condition="attribute_not_exists(pk) OR migration_id = :id", values={":id": S(m.id)})
            return
        except errors.ConditionalCheckFailed:
            pass
        owner = self.get(table_lock_pk(m.table), TABLE_LOCK_SK)
        if owner:
            check_row(owner)
        other = get_s(owner or {}, "migration_id", "?")
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
            if self.landed(table_lock_pk(m.table), TABLE_LOCK_SK, {"migration_id": lock["migration_id"], "at": lock["at"]}):
                return  # our takeover landed; its answer was lost
            raise errors.ConcurrentChange(f"another operator claimed table {m.table!r} at the same moment; "
                                          "check `reshard status` and retry") from None

    def load_state(self, migration_id: str, missing_ok: bool = False) -> MigrationState | None:
        item = self.get(self.mpk(migration_id), META)
        if item is None:
            if missing_ok:
                return None
            raise errors.MigrationNotFound(f"no migration {migration_id!r} in control table {self.table!r} "
                                           "(run `reshard start FILE`)")
        return MigrationState.from_item(item)

    def list_states(self) -> list[MigrationState]:
        """Every registered migration (a Scan of META records; the control table is small)."""
        # Only META rows in migration partitions: an app may write any sort key in its
        # heartbeat partition, and a "META" there must not pass for a migration.
        out, kwargs = [], {"TableName": self.table, "FilterExpression": "sk = :m AND begins_with(pk, :mp)",
                           "ExpressionAttributeValues": {":m": S(META), ":mp": S("M#")}, "ConsistentRead": True}
        while True:
            resp = self._read("scan", **kwargs)
            out.extend(MigrationState.from_item(i) for i in resp.get("Items", []))
            if not resp.get("LastEvaluatedKey"):
                return sorted(out, key=lambda s: s.created_at)
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def history(self, migration_id: str) -> list[Transition]:
        rows = [Transition.from_item(i) for i in self.query(self.mpk(migration_id), "H#")]
        state = self.load_state(migration_id, missing_ok=True)
        # META is written first; a crash before the history row leaves META's copy.
        if state and state.last and (not rows or rows[-1].phase_version < state.last.phase_version):
            rows.append(state.last)
        return rows

    def record_history(self, migration_id: str, t: Transition) -> None:
        try:
            self.put({"pk": S(self.mpk(migration_id)), "sk": S(history_sk(t.phase_version)),
                      "from": S(t.from_phase), "to": S(t.to_phase), "action": S(t.action), "who": S(t.who),
                      "at": N(t.at), "phase_version": N(t.phase_version)},
                     condition="attribute_not_exists(pk)")
        except errors.ConditionalCheckFailed:
            pass  # already recorded (a retried call): history rows are write-once

    # ------------------------------------------------------------------ phase writes
    def set_phase(self, state: MigrationState, target: Phase, action: str, who: str,
                  switching: bool = False, newer_may_be: str | None = None) -> MigrationState:
        """Compare-and-set the phase from ``state`` to ``target`` and record the transition.

        Only the operator who read this exact ``phase_version`` wins; the loser gets
        ConcurrentChange with the phase the winner set. ``switching``: the fleet must
        hold requests until the switch into ``target`` is finished (a second write).
        ``newer_may_be``: set the catch-up flag (the end of an authority switch: the layout
        that was authoritative may hold a write whose mirror never landed); None leaves it.

        The write removes ``phase_since``; :meth:`stamp_since` then records the server's
        ``Date`` of this write's answer (a second write: the date is known only once the
        server answered). A process that dies in between leaves it absent, and the next
        reader counts from its own first sight of the version -- never from the previous
        phase's date, which would end this phase too early. After a lost answer (the write
        landed, :func:`landed` says so) the date recorded is that of a later answer (the
        read's): the phase counts as begun later, never earlier.
        """
        now = self.clock()
        new_version = state.phase_version + 1
        values = {":to": S(target.value), ":nv": N(new_version), ":now": N(now), ":who": S(who),
                  ":from": S(state.phase.value), ":act": S(action), ":v": N(state.phase_version),
                  ":sw": {"BOOL": switching}}
        sets = ("SET phase = :to, phase_version = :nv, updated_at = :now, updated_by = :who, "
                "last_from = :from, last_to = :to, last_action = :act, switching = :sw")
        wrote = {"phase": values[":to"], "phase_version": values[":nv"], "updated_at": values[":now"],
                 "updated_by": values[":who"], "last_from": values[":from"], "last_action": values[":act"],
                 "switching": values[":sw"]}
        if newer_may_be is not None:
            sets += ", newer_may_be = :nmb"
            values[":nmb"] = wrote["newer_may_be"] = S(newer_may_be)
        try:
            self.update(self.mpk(state.id), META, sets + " REMOVE phase_since",
                        condition="phase_version = :v AND phase = :from", values=values)
        except errors.ConditionalCheckFailed:
            # Our own write, landed with its answer lost (the resend failed on it: a25), is no
            # other operator's move: go on as if the answer had come.
            if not self.landed(self.mpk(state.id), META, wrote):
                raise self.lost_race(state.id, state.phase_version) from None
        self.stamp_since(state.id, new_version)
        self.record_history(state.id, Transition(new_version, state.phase.value, target.value, action, who, now))
        return self.load_state(state.id)

    def stamp_since(self, migration_id: str, version: int, date: float | None = None) -> None:
        """Record ``phase_since`` for ``version``: ``date``, else the server's ``Date`` of the
        answer this thread just got (the compare-and-set that made ``version``). Conditional
        on the version and on no date being recorded yet; skipped when the server sent no
        ``Date`` (readers then count from their own first sight)."""
        date = self.dynamo.answer_date() if date is None else date
        if date is None:
            return
        try:
            self.update(self.mpk(migration_id), META, "SET phase_since = :d",
                        condition="phase_version = :v AND attribute_not_exists(phase_since)",
                        values={":d": N(int(date)), ":v": N(version)})
        except errors.ConditionalCheckFailed:
            pass  # moved on meanwhile, or already recorded

    def clear_newer_may_be(self, state: MigrationState, who: str) -> bool:
        """Clear the catch-up flag of ``state`` (a verify that started in its phase version
        passed), only if the migration is still at that version with that flag. False: it
        moved, or is clear.

        A phase change in all but name: the version is bumped (``phase_since`` stamped anew,
        the history records it), so the fleet must acknowledge the cleared flag, and with a
        server deadline the phase must last ``H`` again, before the next move. A shim still
        on the flagged version reads both layouts and repairs before it writes; next to a
        ``cleanup`` shim (plain deletes of the new copy only) its read would find the old
        copy again.
        """
        now = self.clock()
        values = {":nv": N(state.phase_version + 1), ":now": N(now), ":who": S(who), ":ph": S(state.phase.value),
                  ":act": S("catch-up"), ":v": N(state.phase_version), ":f": S(state.newer_may_be or "")}
        try:
            self.update(self.mpk(state.id), META,
                        "SET phase_version = :nv, updated_at = :now, updated_by = :who, last_from = :ph, "
                        "last_to = :ph, last_action = :act REMOVE newer_may_be, phase_since",
                        condition="phase_version = :v AND phase = :ph AND newer_may_be = :f", values=values)
        except errors.ConditionalCheckFailed:
            if not self.landed(self.mpk(state.id), META, _moved(values)):
                return False
        self.stamp_since(state.id, state.phase_version + 1)
        self.record_history(state.id, Transition(state.phase_version + 1, state.phase.value, state.phase.value,
                                                 "catch-up", who, now))
        return True

    def mark_retired(self, state: MigrationState, who: str) -> None:
        """Compare-and-set ``retired`` on an aborted migration, bumping ``phase_version`` so
        shims pick the change up (and acknowledge it) like a phase change. A lost race means
        another host retired it first: fine. Our own write, landed with its answer lost, goes
        on to its date and history row (:func:`landed`)."""
        now = self.clock()
        values = {":t": {"BOOL": True}, ":nv": N(state.phase_version + 1), ":now": N(now), ":who": S(who),
                  ":ph": S(Phase.ABORTED.value), ":act": S("retire"), ":v": N(state.phase_version)}
        try:
            self.update(self.mpk(state.id), META,
                        "SET retired = :t, phase_version = :nv, updated_at = :now, updated_by = :who, "
                        "last_from = :ph, last_to = :ph, last_action = :act REMOVE phase_since",
                        condition="phase_version = :v AND phase = :ph", values=values)
        except errors.ConditionalCheckFailed:
            if not self.landed(self.mpk(state.id), META, {**_moved(values), "retired": values[":t"]}):
                return
        self.stamp_since(state.id, state.phase_version + 1)  # the second sweep counts from here
        self.record_history(state.id, Transition(state.phase_version + 1, Phase.ABORTED.value,
                                                 Phase.ABORTED.value, "retire", who, now))

    def lost_race(self, migration_id: str, version: int) -> errors.ConcurrentChange:
        """The error of a compare-and-set on ``version`` that lost: names the move that won
        (META's copy of the last move, or the history row right after ``version`` when it
        moved more than once since)."""
        now = self.load_state(migration_id)
        won = now.last
        if won is None or won.phase_version != version + 1:
            # It moved more than once since: the move right after ours is in the history.
            row = self.get(self.mpk(migration_id), history_sk(version + 1))
            won = Transition.from_item(row) if row is not None else won
        if won is None:  # pragma: no cover - a registered migration always has a last move
            return errors.ConcurrentChange(f"migration {migration_id!r} moved since phase version {version}; "
                                           "nothing done; check `reshard status`")
        return errors.ConcurrentChange(moved_meanwhile(won, migration_id))

    def release_table(self, table: str, migration_id: str) -> None:
        """Free the ``T#<table>`` lock if this migration still holds it."""
        try:
            self.delete(table_lock_pk(table), TABLE_LOCK_SK, condition="migration_id = :id",
                        values={":id": S(migration_id)})
        except errors.ConditionalCheckFailed:
            pass

    def table_locks(self) -> dict[str, dict]:
        """Every ``T#<table>`` lock row, by table (a Scan; the control table is small)."""
        out, kwargs = {}, {"TableName": self.table, "FilterExpression": "sk = :a AND begins_with(pk, :t)",
                           "ExpressionAttributeValues": {":a": S(TABLE_LOCK_SK), ":t": S(table_lock_pk(""))},
                           "ConsistentRead": True}
        while True:
            resp = self._read("scan", **kwargs)
            for item in resp.get("Items", []):
                out[get_s(item, "pk")[len(table_lock_pk("")):]] = item
            if not resp.get("LastEvaluatedKey"):
                return out
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def active_migration_ids(self) -> list[str]:
        """Ids of migrations that still own their table (not complete, not aborted-and-cleaned)."""
        return [s.id for s in self.list_states() if s.active]


def _moved(values: Mapping[str, dict]) -> dict[str, dict]:
    """What a same-phase version bump (catch-up clear, retire) writes, from its expression
    values: the row it leaves, for :func:`landed`."""
    return {"phase": values[":ph"], "phase_version": values[":nv"], "updated_at": values[":now"],
            "updated_by": values[":who"], "last_action": values[":act"]}


def moved_meanwhile(t: Transition, migration_id: str, after_start: bool = False) -> str:
    """The line of an operator whose move another one made first: who moved the migration, from
    what to what, when, and that nothing was done (``after_start``: that move came after this
    command started, so its operator cannot have meant to move on from there)."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t.at))
    what = (f"finished the switch to {t.to_phase}" if t.action == "switch"
            else f"moved it from {t.from_phase} to {t.to_phase}")
    return (f"{t.who} already {what} at {when}" + (" (after this command started)" if after_start else "")
            + f"; nothing done: {migration_id!r} is in {t.to_phase} (phase version {t.phase_version}); check "
            "`reshard status`, then run the command again if you still mean it from there")


def changed_meaning(migration_id: str, changes: list[str], limit: int = 6) -> str:
    """One line refusing a file whose meaning differs from the registered one, naming the changes."""
    shown = "; ".join(changes[:limit]) + (f" (+{len(changes) - limit} more)" if len(changes) > limit else "")
    return (f"migration {migration_id!r} is already registered with a different meaning: {shown}. A registered "
            "migration cannot change; give the changed file a new id (comments, whitespace, key order, quoting "
            "and description may differ)")


def resolve(store: ControlStore, ref: str | None) -> str:
    """A migration id from a file path, an id, or nothing (exactly one active migration)."""
    if ref:
        p = pathlib.Path(ref)
        if ref.endswith(".toml") or p.is_file():
            return load(ref).id
        return ref
    store.require_table()
    active = store.active_migration_ids()
    if len(active) == 1:
        return active[0]
    if not active:
        raise errors.MigrationNotFound("no active migration in control table "
                                       f"{store.table!r}; name one (file or id)")
    shown = ", ".join(f"{s.id} (table {s.table}, {s.phase})" for s in store.list_states() if s.active)
    raise errors.BadInput(f"{len(active)} active migrations: {shown}; name one (file or id), e.g. "
                          f"`reshard status {active[0]}`")

