"""A job's phase guard and fact keeper: every data write of a job carries a horizon
(docs/late-writes.md, issue 25 case 2).

The guard the engine checks before every page stops a job once the migration left the
phases it may run in. That is a check on the client's side of the wire: a worker that
passed it and then froze (or whose request the network held) could still land its write
long after -- a backfill copy after cleanup deleted the item, say. So every data-table
write of a job is signed with a date that makes DynamoDB refuse it once the server's
clock passes ``fact_date + H``:

* ``fact_date`` is the server's ``Date`` of the latest consistent read of the control row
  (META) that saw a phase the job may write in (the *fact*);
* ``H`` is the migration's request horizon (``request_horizon`` on META).

The keeper re-reads META at least every ``H/3`` (so a steady job never waits), and before a
write whose fact is too old to be usable it reads again; if the phase moved, or no fresh
fact can be had, the write is not sent (:class:`FactExpired`: the engine releases the
segment's lease, its page is redone by whoever claims it). Transitions wait until a phase
lasted ``H + DATE_MARGIN`` on the server's clock, so a write obeying a fact read before a
transition can land only while the next phase is current -- never two phases later.

A fact is also keyed by the **phase version** the job started under, not the phase's name: a
job whose decision was taken under one version (a repair judged while the catch-up flag was
set, say) must not have its write dated by a read of a later version of the same phase
(r25's B3: a frozen ``verify --repair`` landing after cleanup). Any version change stops the job.

And by the **table marker** (``reshard.core.marker``) as the job first saw it: when a next
migration's ``start`` claims the marker, no fact of this one can be renewed, so its late writes
(a previous migration's strip or sweep still running) land within ``H`` of the claim, while
the next migration is still in ``planned`` (which lasts at least the previous owner's ``H``,
``previous_horizon``; r25's B4/B5). A job of a migration the marker does not name (a retired
migration's sweep) dates with at most the steady horizon, which ``planned`` always lasts.

Without a server deadline (``server_deadline`` off: test servers) no write is dated and the
keeper is the phase guard it always was.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

from reshard.aws.dynamo import Dynamo
from reshard.control.records import MigrationState
from reshard.control.store import ControlStore
from reshard.core import marker as markers
from reshard.core.deadlines import STEADY_HORIZON_SECONDS, horizon_of, usable
from reshard.core.phases import Phase
from reshard.jobs.engine import LeaseDeadline

#: Data-table operations that write: each is sent with the keeper's horizon.
WRITE_OPERATIONS = frozenset({"put_item", "update_item", "delete_item", "batch_write_item"})


class FactExpired(LeaseDeadline):
    """No usable fact for a data write (the phase moved, or the control row could not be read
    afresh in time): the write is not sent, the page is given back."""


class JobFacts:
    """The engine's guard (``guard()`` -> a reason to stop, or None; ``guard.fresh()`` reads
    afresh) and every data write's horizon (:meth:`horizon`, for ``Dynamo.call(horizon=)``).

    ``min_interval``: how often the page guard re-reads META at most (seconds, local
    monotonic clock: it only narrows how soon a job notices a move).
    """

    def __init__(self, store: ControlStore, migration_id: str, job: str, phases: Iterable[Phase], *,
                 min_interval: float = 1.0, monotonic: Callable[[], float] = time.monotonic,
                 state: MigrationState | None = None, marker: tuple[Dynamo, str, dict] | None = None):
        self.store = store
        #: ``(dynamo, data table, marker key)``: the marker is read with every fact (None: not read).
        self.marker = marker
        self._version: int | None = None  # the phase version every fact must still show
        self._owner: tuple | None = None  # the marker's owner as first read ((id, control) or None)
        self._owner_read = False
        self._for_good = False  # stopped by a version or marker change
        self.migration_id = migration_id
        self.job = job
        self.phases = frozenset(phases)
        self.min_interval = min_interval
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._read_at = -1e18  # monotonic time of the last read (any outcome)
        self._why: str | None = None
        self._phase: str | None = None
        #: The fact: the server's Date of the latest read that saw an allowed phase, and our
        #: monotonic time when that answer came (server time since = our time since).
        self._fact_date: float | None = None
        self._fact_mono = 0.0
        self.enforced = False
        self.horizon_seconds = 0.0
        #: The most this job's writes may be dated ahead (the steady horizon for a job of a
        #: migration the marker does not name).
        self.horizon_cap = float("inf")
        self.reads = 0
        if marker is not None and (state is None or state.server_deadline):
            # The owner the job begins under (not at its first page: a job stalled before it
            # must still see a next migration's claim as a change).
            self._check_owner(markers.owner_of(self._read_marker()[0]))
        if state is not None:
            self._learn(state, None)

    # -- reading the control row
    def _read(self) -> None:
        state = self.store.load_state(self.migration_id)  # consistent GetItem
        date = self.store.dynamo.answer_date()
        owner_why = None
        if self.marker is not None and state.server_deadline:
            item, marker_date = self._read_marker()
            if date is not None and marker_date is not None:
                date = min(date, marker_date)  # the fact is as old as its older read
            owner_why = self._check_owner(markers.owner_of(item))
        self._learn(state, date, owner_why)

    def _read_marker(self) -> tuple[dict | None, float | None]:
        """The table marker as it is now (consistent), and the server's Date of that answer."""
        dynamo, table, key = self.marker
        item = dynamo.call("get_item", TableName=table, Key=key, ConsistentRead=True).get("Item")
        return item, dynamo.answer_date()

    def _check_owner(self, owner: markers.Owner | None) -> str | None:
        seen = None if owner is None else (owner.migration_id, owner.control_table)
        if not self._owner_read:
            self._owner, self._owner_read = seen, True
            if seen != (self.migration_id, self.store.table):
                # Not ours (a retired migration's sweep): date within the steady horizon,
                # which a next migration's `planned` always outlasts.
                self.horizon_cap = STEADY_HORIZON_SECONDS
            return None
        if seen != self._owner:
            return (f"{self.job} stopped: the table's marker now names "
                    f"{owner.text() if owner else 'no migration'} (it named "
                    f"{'migration %r' % self._owner[0] if self._owner else 'none'} when the job began)")
        return None

    def _learn(self, state: MigrationState, date: float | None, owner_why: str | None = None) -> None:
        now = self.monotonic()
        self._read_at = now
        self.reads += 1
        self.enforced = state.server_deadline
        self.horizon_seconds = min(state.request_horizon, self.horizon_cap)
        self._phase = state.phase.value
        if self._version is None:
            self._version = state.phase_version
        if self._for_good:
            return  # a version or marker change is for good: no later read makes a fact again
        if owner_why:
            self._why, self._for_good = owner_why, True
        elif state.phase_version != self._version and state.phase in self.phases:
            what = state.last.action if state.last else "a change"
            self._why, self._for_good = (
                f"{self.job} stopped: the migration's phase version moved from {self._version} to "
                f"{state.phase_version} ({what}); the job's decisions were taken under the old one: run it again"), True
        elif state.phase in self.phases:
            self._why = None
            if date is not None:
                self._fact_date, self._fact_mono = date, now
        else:
            self._why = (f"{self.job} stopped: the migration moved to {state.phase} "
                         f"(phase version {state.phase_version})")

    # -- the engine's page guard
    def __call__(self, fresh: bool = False) -> str | None:
        with self._lock:
            if fresh or self.monotonic() - self._read_at >= self.min_interval:
                self._read()
            return self._why

    def fresh(self) -> str | None:
        return self(fresh=True)

    def phase(self) -> str | None:
        """The phase as last read (None before the first read): the job's metrics show it."""
        return self._phase

    # -- every data write
    def server_now(self) -> float | None:
        """The server's clock now, as best known: the fact's Date plus our time since."""
        if self._fact_date is None:
            return None
        return self._fact_date + (self.monotonic() - self._fact_mono)

    def horizon(self) -> float | None:
        """The last server time the write about to be sent may land at (None: no server
        deadline, nothing to date). Reads META afresh when the fact is older than ``H/3``,
        or no longer usable; raises :class:`FactExpired` when the phase moved or no usable
        fact can be had (the write is not sent)."""
        with self._lock:
            if not self.enforced:
                return None
            h = self.horizon_seconds
            if self._fact_date is None or self.monotonic() - self._fact_mono >= h / 3:
                self._read()
            if self._why:
                raise FactExpired(self._why)
            if self._fact_date is None:
                raise FactExpired(f"{self.job}: the server sent no Date header, so no write can be dated; "
                                  "the migration was started with a server deadline on a server without one")
            horizon = horizon_of(self._fact_date, h)
            if not usable(horizon, self.server_now()):
                self._read()  # one more look: the last read may have been answered slowly
                if self._why:
                    raise FactExpired(self._why)
                horizon = horizon_of(self._fact_date, h)
                if not usable(horizon, self.server_now()):
                    raise FactExpired(f"{self.job}: no fresh enough reading of the phase (request horizon "
                                      f"{h:g}s; the control table answers too slowly): the page is given back")
            return horizon


class DatedWrites:
    """A :class:`Dynamo` whose writes to ``table`` carry ``horizon`` (every other call, and
    everything else of the client, passes through unchanged): the one place a job's data
    writes get their date, so no write path can forget it."""

    def __init__(self, dynamo: Dynamo, table: str, horizon: Callable[[], float | None]):
        self._dynamo = dynamo
        self._table = table
        self._horizon = horizon

    def __getattr__(self, name: str):
        return getattr(self._dynamo, name)

    @property
    def undated(self) -> Dynamo:
        """The client itself: for a write that obeys no fact of the job (the retire's marker
        give-back, conditional on the marker naming the retired migration: safe whenever it
        lands), which the job's facts would refuse once the retire moved the phase version."""
        return self._dynamo

    def call(self, operation: str, **kwargs):
        if operation in WRITE_OPERATIONS and "horizon" not in kwargs and (
                kwargs.get("TableName") == self._table or self._table in kwargs.get("RequestItems", {})):
            kwargs["horizon"] = self._horizon
        return self._dynamo.call(operation, **kwargs)
