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
from reshard.control.records import DEFAULT_LIVENESS_SECONDS, TABLE_LOCK_SK, table_lock_pk  # noqa: F401
from reshard.control.store import DEFAULT_CONTROL_TABLE, ControlStore  # noqa: F401
from reshard.core.migration import Migration
from reshard.core.phases import ROUTING, STEADY, Phase, Routing, routing_of
from reshard.core.settle import shim_write_seconds
from reshard.core.wire import get_s

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


def registered_migration(dynamo: Dynamo, control_table: str, migration_id: str) -> Migration:
    """The migration as registered in the control table (its file text is stored there)."""
    return ControlStore(dynamo, control_table).load_state(migration_id).migration()


class PhaseCache:
    """The phase one shim instance acts on, kept fresh in the background.

    Without a control table (``control_table=None``) the phase is steady forever and no
    thread or heartbeat exists.
    """

    def __init__(self, migration: Migration, dynamo: Dynamo, control_table: str | None, instance_id: str, *,
                 refresh_seconds: float, liveness_seconds: float, clock: Callable[[], float],
                 switch_hold_seconds: float | None = None, control_clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.migration = migration
        self.instance_id = instance_id
        self.refresh_seconds = refresh_seconds
        self.liveness_seconds = liveness_seconds
        # A switch ends once every shim noticed it (within ~1.2 refresh intervals): hold
        # requests that long, plus slack, before giving up with a retryable error.
        self.switch_hold_seconds = (refresh_seconds * 1.2 + SWITCH_HOLD_SLACK_SECONDS
                                    if switch_hold_seconds is None else switch_hold_seconds)
        self._clock = clock
        # control_clock: the wall clock heartbeats are stamped with (default time.time);
        # injectable so a test's logical clock drives both liveness and the census.
        self._control = (ControlStore(dynamo, control_table, **({"clock": control_clock} if control_clock else {}))
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
        self._dynamo = dynamo  # its attempt bound is what we report as request_seconds
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # One refresh at a time, so an older read never replaces a newer state; held
        # requests wait on `_refreshed` for whoever is polling.
        self._sleep = sleep  # the hold's pauses (a test's logical clock advances with it)
        self._refresh_lock = threading.Lock()
        self._refreshed = threading.Condition()
        self._last_poll = 0.0

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
        except errors.ReshardError as e:
            log.warning("reshard shim %s: first heartbeat failed: %s", self.instance_id, e)
        self.refresh()
        self._thread = threading.Thread(target=self._run, name=f"reshard-shim-{self.instance_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the refresh thread and remove our heartbeat (we leave the census at once)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        # A pinned (test) cache never announced itself on purpose; don't touch the table.
        if self._control is not None and not self._pinned and self._announced:
            try:
                fleet.forget(self._control, self.migration.id, self.instance_id)
            except errors.ReshardError as e:
                log.warning("could not remove heartbeat of %s: %s", self.instance_id, e)

    def _run(self) -> None:
        while not self._stop.is_set():
            st = self._state
            if st is not None and st.routing.hold:
                delay = SWITCH_POLL_SECONDS  # a switch ends soon: notice it at once
            else:
                delay = self.refresh_seconds * random.uniform(0.8, 1.2)  # jitter: a fleet must not beat in step
            self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.refresh()

    # ------------------------------------------------------------------ refresh
    def refresh(self) -> bool:
        """Read the phase and write the heartbeat now. True on success."""
        if self._pinned or self._control is None:
            return True
        with self._refresh_lock:
            ok = self._refresh_locked()
        with self._refreshed:
            self._refreshed.notify_all()
        return ok

    def _refresh_locked(self) -> bool:
        started = self._clock()
        try:
            try:
                state = self._control.load_state(self.migration.id, missing_ok=True)
                lock = self._control.get(table_lock_pk(self.migration.table), TABLE_LOCK_SK)
            except (errors.ResourceNotFound, errors.ControlTableMissing):
                state = lock = None  # the control table does not exist: nothing is registered
                table_exists = False
            else:
                table_exists = True
            # Fail closed (issue 12, case 8): once we have seen our migration's META row, a
            # missing control table or row is an outage or a mistake (a mistyped table
            # name, a deleted row), never "no migration": routing to the old layout now
            # could write where nobody reads (after cutover or complete). Count it as a
            # failed refresh: we keep the last known phase until the liveness window runs
            # out, then begin() raises ShimUnavailable. Only a shim that never saw a
            # migration treats "no row" as steady (deployed before `reshard start`).
            if state is None and self._seen_migration:
                raise errors.ShimUnavailable(
                    f"migration {self.migration.id!r} was registered, but "
                    + (f"its record is missing from control table {self._control.table!r}" if table_exists
                       else f"control table {self._control.table!r} is missing")
                    + "; keeping the last known phase until the liveness window ends (check --control-table)")
            # Another migration owns the table (case 7): its shims write a layout ours
            # neither reads nor fences against. Refuse at once, whatever our own phase.
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
                                     routing_of(state.phase, state.switching))
            # New requests use the new phase at once; the heartbeat may still name an
            # older one (see _ack_state_locked) until the requests on it drain.
            with self._lock:
                self._states[new.version] = new
                self._state = new
                ack = self._ack_state_locked()
            if table_exists:
                self._heartbeat(ack.phase, ack.version)
            with self._lock:
                self._acked = ack.version
                # Conservative: liveness counts from the start of the refresh, which is
                # before the heartbeat's timestamp, so we stop before the census drops us.
                self._last_ok = started
                self._last_error = None
            return True
        except errors.ReshardError as e:
            with self._lock:
                self._last_error = str(e)
                if isinstance(e, errors.BadInput) or self._refused:
                    self._state = None  # a wrong file or another migration's table: refuse now
                self._refused = False
            log.warning("reshard shim %s: phase refresh failed: %s", self.instance_id, e)
            return False

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
                        request_seconds=self._dynamo.attempt_seconds,
                        write_seconds=shim_write_seconds(self._dynamo.attempt_seconds, self._dynamo.max_request_seconds))
        self._announced = True

    def pin(self, phase: Phase | str | None, version: int = 1) -> None:
        """TEST ONLY: act on ``phase`` (None: steady) from now on, ignoring the control table."""
        self._pinned = True
        if phase is None or phase == STEADY_NAME:
            st = PhaseState(STEADY_NAME, 0, STEADY)
        else:
            p = Phase(phase)
            st = PhaseState(p.value, version, ROUTING[p])
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
                    return st
            if give_up_at is None:
                give_up_at = now + self.switch_hold_seconds
                self._wake.set()  # acknowledge the switch now if nothing else runs under the old version
            left = give_up_at - now
            if left <= 0:
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
                ok = self._refresh_locked()
            finally:
                self._refresh_lock.release()
            with self._refreshed:
                self._refreshed.notify_all()
            if not ok:
                self._sleep(min(timeout, SWITCH_POLL_SECONDS))
        else:
            with self._refreshed:
                self._refreshed.wait(timeout)

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
