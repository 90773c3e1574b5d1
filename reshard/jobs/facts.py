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
from reshard.core.deadlines import horizon_of, usable
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
                 state: MigrationState | None = None):
        self.store = store
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
        self.reads = 0
        if state is not None:
            self._learn(state, None)

    # -- reading the control row
    def _read(self) -> None:
        state = self.store.load_state(self.migration_id)  # consistent GetItem
        self._learn(state, self.store.dynamo.answer_date())

    def _learn(self, state: MigrationState, date: float | None) -> None:
        now = self.monotonic()
        self._read_at = now
        self.reads += 1
        self.enforced = state.server_deadline
        self.horizon_seconds = state.request_horizon
        self._phase = state.phase.value
        if state.phase in self.phases:
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

    def call(self, operation: str, **kwargs):
        if operation in WRITE_OPERATIONS and "horizon" not in kwargs and (
                kwargs.get("TableName") == self._table or self._table in kwargs.get("RequestItems", {})):
            kwargs["horizon"] = self._horizon
        return self._dynamo.call(operation, **kwargs)
