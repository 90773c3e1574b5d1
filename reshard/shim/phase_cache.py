"""The shim's knowledge of the migration phase: :class:`PhaseCache`.

Requests never read the control table: a daemon thread refreshes the phase every
``refresh_seconds`` (with jitter) and writes a heartbeat with the phase version this
instance acts on. The operator's tools move the fleet only once every live heartbeat
acknowledges the current version, so three rules keep that acknowledgement honest:

* start-up writes a heartbeat (``starting``, version 0) *before* the first phase read,
  so a census cannot miss a shim that is starting;
* a version is acknowledged only when no request that started under an older version
  is still running (:meth:`PhaseCache.begin` / :meth:`PhaseCache.end` count them);
* an instance that could not refresh for ``liveness_seconds`` -- after which the census
  no longer waits for it -- raises :class:`~reshard.errors.ShimUnavailable` instead of
  acting on a phase the fleet may have left.

Those are client-side checks: they narrow windows but a frozen process or a late request
passes them. What bounds a late request is the **server** (docs/late-writes.md): every
refresh is a *fact* -- the control reads (META, the table lock) and the table marker read
(one consistent GetItem on the data table) -- dated by the server's ``Date`` header of their
answers (the earliest). :class:`Facts` keeps, per phase version, the latest fact that saw it;
every data request under that version is signed so that DynamoDB refuses it once its clock
passes ``fact date + H`` (:meth:`PhaseCache.horizon`, ``H`` the migration's request horizon).
A request with no usable fact left refreshes first or fails closed, never is sent.

The marker (``reshard.core.marker``) is part of the fact: a table owned by a migration this
shim cannot see (a mistyped control table, an earlier migration's file) is refused.

This is the only module of the shim that talks to the control table.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from reshard import errors
from reshard.aws.dynamo import Dynamo
# DEFAULT_* are re-exported for table.py, so this stays the shim's one control-plane module.
from reshard.control import fleet
from reshard.control.records import DEFAULT_LIVENESS_SECONDS, TABLE_LOCK_SK, check_row, table_lock_pk  # noqa: F401
from reshard.control.store import DEFAULT_CONTROL_TABLE, ControlStore  # noqa: F401
from reshard.core.decode import MAX_LIVENESS_SECONDS, MAX_REQUEST_SECONDS, MAX_WRITE_SECONDS, check_bound
from reshard.core import marker
from reshard.core.deadlines import DATE_MARGIN_SECONDS, STEADY_HORIZON_SECONDS, amz_date, usable
from reshard.core.migration import Migration
from reshard.core.phases import STEADY, Phase, Routing, routing_of
from reshard.core.settle import shim_write_seconds
from reshard.core.survive import FailureLog, describe
from reshard.core.wire import get_s
from reshard.shim import metrics

# The logger name predates this module; applications may already configure it.
log = logging.getLogger("reshard.shim.table")

STEADY_NAME = "steady"
#: How often a shim re-reads the control row while the fleet switches authority (100-250 ms).
SWITCH_POLL_SECONDS = 0.15
#: How long a request is held during a switch, beyond the refresh interval, before it
#: fails with a retryable SwitchInProgress (it is never sent on the old authority).
SWITCH_HOLD_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class PhaseState:
    """The phase an instance acts on: name, control-table version and routing."""

    phase: str
    version: int
    routing: Routing

    @property
    def stamps(self) -> bool:
        # Versions are stamped whenever a migration is registered (even in unfenced
        # cleanup/complete), so versions on the authoritative copy only grow and a
        # failed fence is never mistaken for the app's condition next to a cleanup shim.
        return self.phase != STEADY_NAME


class Facts:
    """The fact-keeping part of a shim: per phase version, the horizon of its latest fact, and
    the best estimate of the server's clock.

    A fact is one refresh (control reads + marker read), dated by the earliest server ``Date``
    of their answers; a request under phase version ``v`` may land until ``horizon(v)`` =
    that date + ``H``. The server's clock now is estimated as the latest refresh's latest
    ``Date`` plus the time elapsed since on ``clock`` (the shim's monotonic clock): the ``Date`` header is
    whole seconds, rounded down, so the estimate is early by up to a second, which
    ``deadlines.SEND_MARGIN_SECONDS`` absorbs; an estimate that is too early only makes the
    server refuse a request we thought still in time (fail closed), never the reverse.
    """

    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self._lock = threading.Lock()
        self._horizons: dict[int, float] = {}  # phase version -> latest fact date + H
        self._dates: dict[int, float] = {}  # phase version -> that fact's date (for messages)
        self._answer: tuple[float, float] | None = None  # (server Date, our clock when it came)
        #: ``H`` of the latest fact: the refresh interval is kept below a third of it.
        self.horizon_seconds = STEADY_HORIZON_SECONDS

    def note_answer(self, date: float | None) -> None:
        """The server's ``Date`` of an answer that just arrived: the clock estimate's new anchor."""
        if date is None:
            return
        now = self._clock()
        with self._lock:
            self._answer = (date, now)

    def saw(self, version: int, fact_date: float | None, horizon_seconds: float) -> None:
        """A fact dated ``fact_date`` (None: no answer carried a date) saw ``version``."""
        with self._lock:
            self.horizon_seconds = horizon_seconds
            if fact_date is not None and fact_date >= self._dates.get(version, float("-inf")):
                self._dates[version] = fact_date
                self._horizons[version] = fact_date + horizon_seconds

    @property
    def dated(self) -> bool:
        """Whether the server dates its answers (every DynamoDB does; some stubs do not)."""
        return self._answer is not None

    def server_now(self) -> float | None:
        with self._lock:
            if self._answer is None:
                return None
            date, at = self._answer
            return date + max(0.0, self._clock() - at)

    def horizon(self, version: int) -> float | None:
        """The last server time a request under ``version`` may land at; None: no fact saw it."""
        return self._horizons.get(version)

    def fact_date(self, version: int) -> float | None:
        return self._dates.get(version)

    def usable(self, version: int) -> bool:
        h = self._horizons.get(version)
        return h is not None and usable(h, self.server_now())

    def forget_before(self, version: int) -> None:
        """Drop the facts of versions older than ``version`` (no request runs under them)."""
        with self._lock:
            for v in [v for v in self._horizons if v < version]:
                del self._horizons[v]
                self._dates.pop(v, None)


#: A policy within reshard's bounds, for the refusal's line (botocore's defaults -- 10 attempts of
#: 60 s connect + 60 s read -- let one write last ~50 minutes).
SHORTER = (" (e.g. botocore.config.Config(connect_timeout=5, read_timeout=30, retries={'mode': 'standard', "
           "'total_max_attempts': 3}); the shim's default client has such a policy)")


def registered_migration(dynamo: Dynamo, control_table: str, migration_id: str) -> Migration:
    """The migration as registered in the control table (its file text is stored there)."""
    return ControlStore(dynamo, control_table).load_state(migration_id).migration()


def _signing_horizon(state) -> float:
    """The horizon a shim's requests are dated by under ``state`` (None: no migration).

    A retired migration's shims serve the steady state, and the next migration of the table
    (its marker no longer names the retired one: no ``previous_horizon``) waits out only the
    steady horizon in ``planned``: so they sign with at most that (a25's finding 3), as a
    retired migration's jobs do (``jobs/facts``). A shorter horizon is always safe: it only
    refreshes sooner."""
    if state is None:
        return STEADY_HORIZON_SECONDS
    if state.retired:
        return min(state.request_horizon, STEADY_HORIZON_SECONDS)
    return state.request_horizon


class PhaseCache:
    """The phase one shim instance acts on, kept fresh in the background.

    Without a control table (``control_table=None``) the phase is steady forever and no
    thread or heartbeat exists.
    """

    def __init__(self, migration: Migration, dynamo: Dynamo, control_table: str | None, instance_id: str, *,
                 refresh_seconds: float, liveness_seconds: float, clock: Callable[[], float],
                 switch_hold_seconds: float | None = None, control_clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] = time.sleep, control_dynamo: Dynamo | None = None):
        self.migration = migration
        self.instance_id = instance_id
        self.refresh_seconds = refresh_seconds
        self.liveness_seconds = liveness_seconds
        self._switch_hold = switch_hold_seconds
        self._enforced = False  # the migration's server deadline is enforced: a switch lasts H + 2 s
        self._clock = clock
        if control_table:
            # The census clamps what a heartbeat says to these bounds (reshard.core.decode): a
            # shim publishing more would be dropped by it while still acting.
            check_bound("the shim's liveness_seconds", liveness_seconds, MAX_LIVENESS_SECONDS,
                        "pass a smaller liveness_seconds")
            check_bound("one request attempt of the shim's client (connect + read timeout)", dynamo.attempt_seconds,
                        MAX_REQUEST_SECONDS, "give its botocore config shorter timeouts" + SHORTER)
            check_bound("the longest a shim write can take after its first copy landed (its client's timeouts "
                        "and retries)", shim_write_seconds(dynamo.attempt_seconds, dynamo.max_request_seconds),
                        MAX_WRITE_SECONDS, "give its botocore config shorter timeouts or fewer attempts" + SHORTER)
        # control_clock: the wall clock heartbeats are stamped with (default time.time);
        # injectable so a test's logical clock drives both liveness and the census.
        # The refresh's own requests (control table, marker) may go through another Dynamo than
        # the application's (``control_dynamo``: the shim's bounded policy over the app's client).
        self._dynamo = control_dynamo or dynamo
        self._control = (ControlStore(self._dynamo, control_table,
                                      **({"clock": control_clock} if control_clock else {}))
                         if control_table else None)
        self._lock = threading.Lock()
        self._state: PhaseState | None = None if self._control else PhaseState(STEADY_NAME, 0, STEADY)
        self._last_ok = clock()
        self._last_error: str | None = None
        self._pinned = False
        self._seen_migration = False  # a META row of our migration was read once: never steady again
        self._refused = False  # refresh found the table locked by another active migration
        self._inflight: dict[int, int] = {}  # phase version -> requests running under it
        self._states: dict[int, PhaseState] = {}
        self._acked: int | None = None
        self._announced = False  # a heartbeat of ours is in the control table
        self._beats = 0  # heartbeats written (the census's liveness token)
        self._data = dynamo  # the app's requests: their attempt bound is what we report as request_seconds
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # One refresh at a time, so an older read never replaces a newer state; held
        # requests wait on `_refreshed` for whoever is polling.
        self._sleep = sleep  # the hold's pauses (a test's logical clock advances with it)
        self._refresh_lock = threading.Lock()
        self._refreshed = threading.Condition()
        self._last_poll = 0.0
        # Failures of the refresh (the thread survives every one): logged once per kind.
        self._failures = FailureLog(log, f"reshard shim {instance_id}: phase refresh")
        #: Fact dates and request horizons (the server-enforced bound on every data request).
        self.facts = Facts(clock)
        self._marker_key: dict | None = None  # the data table's marker key (DescribeTable once)
        self._marker: tuple[dict | None, float | None] | None = None  # the last marker read, and its Date
        self._replaced: marker.Owner | None = None  # the owner our migration's marker replaced
        self._signed = threading.local()  # the horizon of this thread's last request (for messages)

    @property
    def switch_hold_seconds(self) -> float:
        """How long a request is held during a switch before it fails with SwitchInProgress.

        A switch ends once every shim noticed it (within ~1.2 refresh intervals) and, with a
        server deadline, once it lasted ``H + 2`` s of server time (no request of the old
        authority can land after): hold that long, plus slack, unless told otherwise.
        """
        if self._switch_hold is not None:
            return self._switch_hold
        wait = self.facts.horizon_seconds + DATE_MARGIN_SECONDS if self._enforced else 0.0
        return self.refresh_seconds * 1.2 + SWITCH_HOLD_SLACK_SECONDS + wait

    @property
    def controlled(self) -> bool:
        """Whether a control table is consulted at all (False: steady forever)."""
        return self._control is not None

    @property
    def phase(self) -> str:
        st = self._state
        return st.phase if st else "unknown"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Announce this instance, read the phase, and start the refresh thread."""
        # Announce ourselves before reading the phase: an operator's census taken between
        # our phase read and our first acknowledgement would otherwise not see us, and
        # could move the fleet two phases away from the one we are about to act on.
        try:
            self._heartbeat("starting", 0)
        except errors.ResourceNotFound:
            pass  # no control table: no migration can be registered either; refresh says STEADY
        except Exception as e:  # noqa: BLE001 - the refresh below (and its thread) try again
            self._failures.failed(e)
        self.refresh()
        metrics.watch(self)  # the age of our last successful refresh, in the shim's metrics
        self._thread = threading.Thread(target=self._run, name=f"reshard-shim-{self.instance_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the refresh thread and remove our heartbeat (we leave the census at once)."""
        self._stop.set()
        self._wake.set()
        metrics.forget(self)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        # A pinned (test) cache never announced itself on purpose; don't touch the table.
        if self._control is not None and not self._pinned and self._announced:
            try:
                fleet.forget(self._control, self.migration.id, self.instance_id)
            except Exception as e:  # noqa: BLE001 - the census drops a silent heartbeat anyway
                log.warning("could not remove heartbeat of %s: %s", self.instance_id, describe(e))

    def _run(self) -> None:
        # The thread lives as long as the shim: whatever one refresh raises is logged (once per
        # kind) and the next one tries again, so the shim serves again by itself once the
        # cause is gone -- without it, requests fail with ShimUnavailable until a restart.
        while not self._stop.is_set():
            st = self._state
            if st is not None and st.routing.hold:
                delay = SWITCH_POLL_SECONDS  # a switch ends soon: notice it at once
            else:
                delay = self.refresh_seconds * random.uniform(0.8, 1.2)  # jitter: a fleet must not beat in step
                # A fact lasts H: refresh at least three times per H, so a request always finds one.
                delay = min(delay, self.facts.horizon_seconds / 3)
            self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.refresh(marker_again=not (st is not None and st.routing.hold))
            except Exception as e:  # noqa: BLE001 - _refresh_locked catches; this is the last line
                self._failures.failed(e)

    # ------------------------------------------------------------------ refresh
    def refresh(self, marker_again: bool = True) -> bool:
        """Read the phase and write the heartbeat now. True on success."""
        if self._pinned or self._control is None:
            return True
        with self._refresh_lock:
            ok = self._refresh_locked(marker_again)
        with self._refreshed:
            self._refreshed.notify_all()
        return ok

    def _refresh_locked(self, marker_again: bool = True) -> bool:
        """One refresh (see :meth:`refresh`). ``marker_again`` False (the switch's polls, every
        150 ms): the marker read of the last refresh stands in -- its older date only makes the
        fact older (a shorter horizon), and the marker changes only at ``start`` and a retire."""
        started = self._clock()
        dates: list[float] = []  # the server's Date of every answer this fact rests on

        def dated(read):
            try:
                return read()
            finally:
                date = self._dynamo.answer_date()
                if date is not None:
                    dates.append(date)
        try:
            try:
                state = dated(lambda: self._control.load_state(self.migration.id, missing_ok=True))
                lock = dated(lambda: self._control.get(table_lock_pk(self.migration.table), TABLE_LOCK_SK))
            except (errors.ResourceNotFound, errors.ControlTableMissing):
                state = lock = None  # the control table does not exist: nothing is registered
                table_exists = False
            else:
                table_exists = True
            # Fail closed (issue 12, case 8): once we have seen our migration's META row, a
            # missing control table or row is an outage or a mistake (a mistyped table
            # name, a deleted row), never "no migration": routing to the old layout now
            # could write where nobody reads (after cutover or complete). Count it as a
            # failed refresh: we keep the last known phase until its fact runs out (or the
            # liveness window), then requests raise ShimUnavailable. Only a shim that never
            # saw a migration treats "no row" as steady (deployed before `reshard start`).
            if state is None and self._seen_migration:
                raise errors.ShimUnavailable(
                    f"migration {self.migration.id!r} was registered, but "
                    + (f"its record is missing from control table {self._control.table!r}" if table_exists
                       else f"control table {self._control.table!r} is missing")
                    + "; keeping the last known phase until its request horizon ends (check --control-table)")
            # Another migration owns the table (case 7): its shims write a layout ours
            # neither reads nor fences against. Refuse at once, whatever our own phase. The
            # lock row is checked like any row (a mistyped owner is refused, not a KeyError).
            if lock:
                check_row(lock)
            owner = get_s(lock, "migration_id", "") if lock else ""
            if owner and owner != self.migration.id:
                other = self._control.load_state(owner, missing_ok=True)
                if other is not None and other.active:
                    self._refused = True
                    path = get_s(other.raw, "file_path", "") or "its migration file"
                    raise errors.ShimUnavailable(
                        f"table {self.migration.table!r} is being migrated by another migration {owner!r} (in "
                        f"{other.phase}); this shim runs migration {self.migration.id!r} and must not serve it. "
                        f"Deploy {path} (migration {owner!r}) to this application, or use "
                        f"ShardedTable.from_migration_id({owner!r})")
            # The marker, in the data table itself: a fact no control-table mistake can hide.
            if marker_again or not self._marker_fresh():
                item = dated(self._read_marker)
                self._marker = (item, self._dynamo.answer_date())
            else:
                item = self._marker[0]
                if self._marker[1] is not None:
                    dates.append(self._marker[1])
            self._check_marker(item, state)
            if state is None:
                new = PhaseState(STEADY_NAME, 0, STEADY)
            else:
                self._seen_migration = True
                changes = state.changes_from(self.migration)
                if changes:
                    # Routing by a file of another meaning would write keys the fleet does not
                    # read: refuse (the except below clears the state: fail closed). A file that
                    # differs only in comments or layout means the same and is served.
                    raise errors.BadInput(
                        f"migration {self.migration.id!r} is registered with a file of another meaning than the "
                        f"one this shim loaded ({'; '.join(changes[:6])}); deploy the registered file (or use "
                        "ShardedTable.from_migration_id)")
                elif state.retired:
                    # An aborted migration whose cleanup finished: the old layout is plain
                    # steady state again (no versions, no tombstones).
                    new = PhaseState(STEADY_NAME, state.phase_version, STEADY)
                else:
                    new = PhaseState(state.phase.value, state.phase_version,
                                     routing_of(state.phase, state.switching, state.newer_may_be))
            # The fact: the earliest answer it rests on dates it (a request obeying it was
            # decided no earlier than that); the latest answer tells the server's clock now.
            self.facts.note_answer(max(dates, default=None))
            self.facts.saw(new.version, min(dates, default=None), _signing_horizon(state))
            self._enforced = state is not None and state.server_deadline
            # New requests use the new phase at once; the heartbeat may still name an
            # older one (see _ack_state_locked) until the requests on it drain.
            with self._lock:
                self._states[new.version] = new
                self._state = new
                ack = self._ack_state_locked()
                oldest = min(self._inflight, default=new.version)
            self.facts.forget_before(min(oldest, ack.version))
            if table_exists:
                self._heartbeat(ack.phase, ack.version)
            with self._lock:
                self._acked = ack.version
                # Conservative: liveness counts from the start of the refresh, which is
                # before the heartbeat's timestamp, so we stop before the census drops us.
                self._last_ok = started
                self._last_error = None
            self._failures.recovered()
            return True
        except errors.ReshardError as e:
            with self._lock:
                self._last_error = describe(e)
                if (isinstance(e, errors.BadInput) and not isinstance(e, errors.ForeignControlRow)) \
                        or self._refused:
                    self._state = None  # a wrong file or another migration's table: refuse now
                self._refused = False
            self._failures.failed(e)
            metrics.refresh_failed(self.migration.id)
            return False
        except Exception as e:  # noqa: BLE001 - anything else a server or a row can cause
            # Not ours to understand (a 2xx answer that is no DynamoDB answer, a bug): a failed
            # refresh like an outage -- the last phase holds until the liveness window ends.
            with self._lock:
                self._last_error = describe(e)
                self._refused = False
            self._failures.failed(e)
            metrics.refresh_failed(self.migration.id)
            return False

    def _marker_fresh(self) -> bool:
        """The last marker read may stand in for a new one: it is less than H/3 old."""
        if self._marker is None or self._marker[1] is None:
            return False
        now = self.facts.server_now()
        return now is not None and now - self._marker[1] < self.facts.horizon_seconds / 3

    # ------------------------------------------------------------------ the table marker
    def _read_marker(self) -> dict | None:
        """The data table's marker item (one consistent GetItem), None if there is none.

        The marker's key depends on the table's key types: one DescribeTable, the first time.
        A data table that does not exist has no marker (and every data request fails anyway).
        """
        table = self.migration.table
        try:
            if self._marker_key is None:
                desc = self._dynamo.call("describe_table", TableName=table)["Table"]
                types = {a["AttributeName"]: a["AttributeType"] for a in desc["AttributeDefinitions"]}
                schema = {k["KeyType"]: k["AttributeName"] for k in desc["KeySchema"]}
                sort = schema.get("RANGE")
                self._marker_key = marker.marker_key(schema["HASH"], types[schema["HASH"]], sort,
                                                     types[sort] if sort else None)
            return self._dynamo.call("get_item", TableName=table, Key=self._marker_key,
                                     ConsistentRead=True).get("Item")
        except errors.ResourceNotFound:
            return None

    def _check_marker(self, item: dict | None, state) -> None:
        """Refuse (ShimUnavailable) when the marker names an owner this shim must not serve
        next to (issue 25, case 5): ``core/marker.refusal`` decides."""
        owner = marker.owner_of(item)
        if owner is None:
            return
        mine = self._control.table
        if owner.migration_id == self.migration.id and owner.control_table == mine:
            # Remember whom our migration replaced: after a retire the marker names it again,
            # and this shim then serves its layout (our old layout) as steady state.
            self._replaced = owner.previous
            return
        owner_active = None
        if owner.control_table == mine and owner.migration_id != self.migration.id:
            other = self._control.load_state(owner.migration_id, missing_ok=True)
            owner_active = other is not None and other.active
        registered = state is not None and not (state.retired and owner == self._replaced)
        why = marker.refusal(owner, my_migration=self.migration.id, my_control_table=mine,
                             registered=registered, owner_active=owner_active)
        if why:
            self._refused = True
            raise errors.ShimUnavailable(
                f"reshard shim for table {self.migration.table!r} (migration {self.migration.id!r}, control table "
                f"{mine!r}) refuses every request: {why}")

    def _ack_state_locked(self) -> PhaseState:
        # Acknowledge the oldest version a request is still running under: the fleet
        # must not move on while one of our requests still follows an older phase.
        oldest = min(self._inflight, default=None)
        if oldest is not None and oldest < self._state.version and oldest in self._states:
            return self._states[oldest]
        return self._state

    def _heartbeat(self, phase: str, version: int) -> None:
        # Unconditional put: each instance owns its heartbeat row.
        self._beats += 1  # the census watches this change, on its own clock
        fleet.heartbeat(self._control, self.migration.id, self.instance_id, phase, version,
                        liveness_seconds=self.liveness_seconds, table=self.migration.table,
                        refresh_seconds=self.refresh_seconds, beat=self._beats,
                        request_seconds=self._data.attempt_seconds,
                        write_seconds=shim_write_seconds(self._data.attempt_seconds, self._data.max_request_seconds))
        self._announced = True

    def pin(self, phase: Phase | str | None, version: int = 1, newer_may_be: str | None = None) -> None:
        """TEST ONLY: act on ``phase`` (None: steady) from now on, ignoring the control table
        (no facts: requests carry no horizon)."""
        self._pinned = True
        if phase is None or phase == STEADY_NAME:
            st = PhaseState(STEADY_NAME, 0, STEADY)
        else:
            p = Phase(phase)
            st = PhaseState(p.value, version, routing_of(p, False, newer_may_be))
        with self._lock:
            self._states[st.version] = st
            self._state = st

    # ------------------------------------------------------------------ per request
    def begin(self) -> PhaseState:
        """The phase a request acts on; it counts as in flight on that version until :meth:`end`.

        While the fleet switches authority the request is *held* here -- not in flight
        under any version, so this instance can acknowledge the switch -- and proceeds
        only on the phase that follows the switch; after :attr:`switch_hold_seconds` it
        raises :class:`~reshard.errors.SwitchInProgress` without having sent anything.
        """
        give_up_at = None
        while True:
            now = self._clock()
            with self._lock:
                st = self._state
                if st is None:
                    raise errors.ShimUnavailable(
                        f"reshard shim for table {self.migration.table!r} (migration {self.migration.id!r}) has no "
                        f"usable phase: {self._last_error or 'not loaded yet'}")
                # Past the liveness window the census no longer counts us, so the fleet may
                # already be two phases ahead: fail closed rather than act on a stale phase.
                self._check_live_locked(now)
                if not st.routing.hold:
                    self._inflight[st.version] = self._inflight.get(st.version, 0) + 1
                    if give_up_at is not None:  # it was held by the switch: how long
                        metrics.held(self.migration.id, now - (give_up_at - self.switch_hold_seconds), "switched")
                    return st
            if give_up_at is None:
                give_up_at = now + self.switch_hold_seconds
                self._wake.set()  # acknowledge the switch now if nothing else runs under the old version
            left = give_up_at - now
            if left <= 0:
                metrics.held(self.migration.id, self.switch_hold_seconds, "timed_out")
                raise errors.SwitchInProgress(
                    f"reshard shim for table {self.migration.table!r} (migration {self.migration.id!r}): the fleet "
                    f"is switching authority to {st.phase} and did not finish within {self.switch_hold_seconds:g}s; "
                    "the request was held and not sent: retry it")
            self._poll_switch(min(left, SWITCH_POLL_SECONDS))

    def _poll_switch(self, timeout: float) -> None:
        """Re-read the control row every SWITCH_POLL_SECONDS while requests are held (one
        poller at a time; the other held requests wait for its result)."""
        if self._refresh_lock.acquire(blocking=False):
            try:
                pause = SWITCH_POLL_SECONDS - (self._clock() - self._last_poll)
                if pause > 0:
                    self._sleep(min(pause, timeout))
                self._last_poll = self._clock()
                ok = self._refresh_locked(marker_again=False)
            finally:
                self._refresh_lock.release()
            with self._refreshed:
                self._refreshed.notify_all()
            if not ok:
                self._sleep(min(timeout, SWITCH_POLL_SECONDS))
        else:
            with self._refreshed:
                self._refreshed.wait(timeout)

    def refresh_age(self) -> float:
        """Seconds since the start of our last successful refresh (on the cache's clock)."""
        return max(0.0, self._clock() - self._last_ok)

    def check_live(self) -> None:
        """Raise :class:`~reshard.errors.ShimUnavailable` once our liveness window ran out.

        Runs before every attempt of every data write (``Dynamo.call(guard=)``), not only
        when a request begins: a request whose retries outlast the window would otherwise
        land after the census stopped counting us. The census waits our liveness window +
        one attempt's bound (``request_seconds`` in our heartbeat) before it drops us.
        """
        with self._lock:
            self._check_live_locked(self._clock())

    def _check_live_locked(self, now: float) -> None:
        if self._control is not None and not self._pinned and now - self._last_ok > self.liveness_seconds:
            raise errors.ShimUnavailable(
                f"reshard shim for table {self.migration.table!r} (migration {self.migration.id!r}) could not "
                f"refresh its phase for {now - self._last_ok:.0f}s (liveness window "
                f"{self.liveness_seconds:g}s); refusing to act on a possibly stale phase. "
                f"Last error: {self._last_error or 'none'}")

    def current(self) -> PhaseState:
        """The phase new requests act on (ShimUnavailable if none is usable)."""
        st = self._state
        if st is None:
            raise errors.ShimUnavailable(
                f"reshard shim for table {self.migration.table!r} (migration {self.migration.id!r}) has no usable "
                f"phase: {self._last_error or 'not loaded yet'}")
        return st

    # ------------------------------------------------------------------ request horizons
    def horizon(self, st: PhaseState) -> float | None:
        """The last server time (epoch seconds) a data request under ``st`` may land at: the
        horizon of the latest fact that saw its phase version. ``Dynamo.call(horizon=)`` runs this
        before every attempt and signs the attempt so that DynamoDB refuses it after that time.

        With no usable fact left (the refresh thread is late, or failing) it refreshes first; if
        that gives none either -- the phase moved on to another version, the control table is
        unreachable -- it raises :class:`~reshard.errors.ShimUnavailable` and nothing is sent.
        None: nothing to sign by (a pinned test cache, no control table, or a server whose
        answers carry no ``Date``): the liveness window is then the only bound.
        """
        if self._pinned or self._control is None:
            return None
        h = self.facts.horizon(st.version)
        if h is None and not self.facts.dated:
            return None
        if h is None or not usable(h, self.facts.server_now()):
            self._refresh_for(st.version)
            h = self.facts.horizon(st.version)
            if h is None or not usable(h, self.facts.server_now()):
                raise errors.ShimUnavailable(self._no_fact(st, h))
        self._signed.horizon = h
        return h

    def _refresh_for(self, version: int) -> None:
        """Refresh now, unless another thread just brought a usable fact for ``version``."""
        with self._refresh_lock:
            if not self.facts.usable(version):
                self._refresh_locked()
        with self._refreshed:
            self._refreshed.notify_all()

    def _no_fact(self, st: PhaseState, h: float | None) -> str:
        cur = self._state
        now = self.facts.server_now()
        why = (f"the phase moved on to version {cur.version} ({cur.phase})" if cur is not None and cur.version != st.version
               else f"the refresh failed: {self._last_error or 'no answer'}")
        last = (f"its last fact allowed requests until {amz_date(h)}" if h is not None
                else "no fact of it is left")
        return (f"reshard shim for table {self.migration.table!r} (migration {self.migration.id!r}) has no usable fact "
                f"for phase version {st.version} ({st.phase}): {last} (request horizon "
                f"{self.facts.horizon_seconds:g}s), the server's clock is about "
                f"{amz_date(now) if now is not None else 'unknown'}, and {why}; nothing was sent (retry the request)")

    def refused_late(self, e: errors.AWSError, operation: str) -> errors.ShimUnavailable:
        """The ShimUnavailable for a request DynamoDB refused as signed too long ago: it arrived
        after its horizon (this process froze, or the request was held on the way)."""
        h = getattr(self._signed, "horizon", None)
        when = f"by {amz_date(h)}" if h is not None else "within its request horizon"
        return errors.ShimUnavailable(
            f"reshard shim for table {self.migration.table!r} (migration {self.migration.id!r}): DynamoDB refused a "
            f"{operation} that had to land {when} (its phase fact + request horizon "
            f"{self.facts.horizon_seconds:g}s) and arrived later ({e.aws_message}); it was not applied: the phase "
            "it obeyed may be over (retry the request)")

    def end(self, st: PhaseState) -> None:
        """The request that :meth:`begin` returned ``st`` to has finished."""
        with self._lock:
            n = self._inflight[st.version] - 1
            if n:
                self._inflight[st.version] = n
                return
            del self._inflight[st.version]
            lagging_ack = self._acked is not None and self._state is not None and self._acked < self._state.version
        if lagging_ack:
            self._wake.set()  # the last request on an old version finished: acknowledge now
