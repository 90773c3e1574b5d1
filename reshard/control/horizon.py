"""The operator's side of the request horizon (docs/late-writes.md): the probe, and waits on
the server's clock.

* :func:`probe` checks that the server enforces DynamoDB's signature window, the bound every
  horizon rests on: a GetItem signed a little more than ``W`` ago must be refused
  (``InvalidSignatureException``), one signed a little less than ``W`` ago accepted. dynalite,
  moto and DynamoDB Local accept both: ``start`` refuses them unless ``--no-server-deadline``.
* :func:`await_phase_age` waits until the current phase (or switch) has lasted ``H +
  DATE_MARGIN`` on the **server's** clock (the ``Date`` of the control-row reads it polls): then
  every request that obeyed an earlier phase has landed or can never land. No local clock
  is compared with anything.
"""

from __future__ import annotations

import time
from typing import Callable

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.records import MigrationState
from reshard.control.store import ControlStore
from reshard.control.waits import Waiting
from reshard.core.deadlines import (DATE_MARGIN_SECONDS, SIGNATURE_WINDOW_SECONDS, STEADY_HORIZON_SECONDS,
                                    amz_date, phase_left, probe_dates)
from reshard.core.phases import Phase

#: How often a wait on the server's clock re-reads the control row (each read's ``Date``).
POLL_SECONDS = 1.0

#: What an endpoint that accepts a late-signed request is told (``start`` refuses it).
NOT_ENFORCED = ("does not enforce DynamoDB's signature window (it accepted a request signed {age:.0f}s ago, "
                "beyond the {w:.0f}s DynamoDB allows), so a late request could land after the fleet moved on "
                "and the request horizon (--request-horizon) would fence nothing. Use real DynamoDB (or the "
                "fidelity proxy, `python -m reshard.aws.fidelity`), or pass --no-server-deadline on a test "
                "server (dynalite, moto, DynamoDB Local) to run without that fence")


def probe(dynamo: Dynamo, table: str, key: dict, *, window: float = SIGNATURE_WINDOW_SECONDS) -> str | None:
    """Whether the server enforces the signature window: None if it does, else why not (a
    sentence for the operator).

    Three GetItems of ``key`` in ``table``: a plain one for the server's clock (its answer's
    ``Date``), then one signed ``W + 3`` s before that clock (must be refused with
    ``InvalidSignatureException``) and one signed ``W - 3`` s before it (must be accepted),
    each through :meth:`Dynamo.call`'s ``horizon`` (``horizon = date + W``: the attempt is
    signed ``date``).
    """
    dynamo.call("get_item", TableName=table, Key=key)
    now = dynamo.answer_date()
    if now is None:
        return (f"{dynamo.endpoint_url or 'the endpoint'} sends no HTTP Date header, so reshard cannot read the "
                "server's clock; pass --no-server-deadline on a test server")
    late, fresh = probe_dates(now, window)
    try:
        dynamo.call("get_item", TableName=table, Key=key, horizon=lambda: late + window)
        return f"{dynamo.endpoint_url or 'the endpoint'} " + NOT_ENFORCED.format(age=now - late, w=window)
    except errors.AWSError as e:
        if e.code != "InvalidSignatureException":
            raise
    try:
        dynamo.call("get_item", TableName=table, Key=key, horizon=lambda: fresh + window)
    except errors.AWSError as e:
        if e.code != "InvalidSignatureException":
            raise
        return (f"{dynamo.endpoint_url or 'the endpoint'} refused a request signed {now - fresh:.0f}s ago "
                f"({amz_date(fresh)}, server clock {amz_date(now)}): its signature window is shorter than the "
                f"{window:.0f}s reshard assumes, so every request would expire before its horizon ({e.aws_message})")
    return None


def horizon_for(state: MigrationState) -> float:
    """How long the current phase of ``state`` must last before a transition out of it:
    ``H``, and out of ``planned`` at least the steady state's horizon (shims that see no
    migration sign with :data:`STEADY_HORIZON_SECONDS`, and the requests of the migration whose
    table marker ``start`` replaced with their own: ``previous_horizon``)."""
    h = state.request_horizon
    if state.phase is Phase.PLANNED and not state.switching:
        return max(h, STEADY_HORIZON_SECONDS, state.previous_horizon)
    return h


def describe_phase(state: MigrationState) -> str:
    return (f"the switch to {state.phase}" if state.switching else str(state.phase)) + f" (v{state.phase_version})"


def await_phase_age(store: ControlStore, state: MigrationState, seconds: float, *, why: str,
                    say: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep,
                    poll: float = POLL_SECONDS, monotonic: Callable[[], float] = time.monotonic) -> MigrationState:
    """Wait until the server's clock reads ``phase_since + seconds + DATE_MARGIN`` for the
    phase version of ``state`` (:func:`reshard.core.deadlines.phase_left`); returns the
    state as last read. ``why`` ends the sentence the wait prints.

    Each look is a consistent GetItem of the control row; its answer's ``Date`` is the
    server's clock. A row without ``phase_since`` (its writer died between the
    compare-and-set and the date) is counted from this process's first sight of the
    version, and that date is recorded for the next reader. Raises
    :class:`~reshard.errors.ConcurrentChange` if the migration moves meanwhile.
    """
    since = state.phase_since
    first_mono: float | None = None
    waiting = Waiting(say, f"{describe_phase(state)} to have lasted {seconds:g}s + {DATE_MARGIN_SECONDS:g}s "
                           f"on the server's clock ({why})")
    while True:
        current = store.load_state(state.id)
        date = store.dynamo.answer_date()
        mono = monotonic()
        if current.phase_version != state.phase_version:
            raise store.lost_race(state.id, state.phase_version)
        if since is None:
            since = current.phase_since
        if since is None and date is not None:
            since = date  # our first sight: the phase began at or before it
            store.stamp_since(state.id, state.phase_version, date)
        if date is None:
            # No Date header (a server reshard cannot read the clock of): count our own time
            # from the first look, the most conservative reading left.
            first_mono = mono if first_mono is None else first_mono
            left = seconds + DATE_MARGIN_SECONDS - (mono - first_mono)
        else:
            left = phase_left(since, date, seconds)
        if left <= 0:
            return current
        waiting.tick(left)
        sleep(min(left, poll))


def await_before_removal(store: ControlStore, state: MigrationState, job: str, *,
                         say: Callable[[str], None] | None = None,
                         sleep: Callable[[float], None] = time.sleep) -> MigrationState:
    """A job that removes or marks (cleanup in ``cleanup``, an abort's cleanup and its second
    sweep, ``--strip-bookkeeping`` in ``complete``) starts only once its phase lasted ``H +
    DATE_MARGIN`` on the server's clock: every mirror, copy or tombstone obeying the phase
    before has landed (and the pass sees it) or can never land behind the scan. Without a
    server deadline nothing waits."""
    if not state.server_deadline:
        return state
    return await_phase_age(store, state, state.request_horizon, say=say, sleep=sleep,
                           why=f"before {job}: every write that obeyed the phase before it must have landed or "
                               "expired, so none lands behind the scan")


def retire_settled(state: MigrationState, server_now: float | None) -> bool:
    """Whether a retired migration's retire is at least its request horizon + DATE_MARGIN old
    on the server's clock (``server_now``: the ``Date`` of a control-table answer): no copy of
    it can land any more, so removing its copies is final. A retire with no recorded date (a
    writer that died before stamping it, an earlier release) or without a server deadline
    counts at once: its abort's cleanup pass already waited for its copies."""
    since = state.phase_since
    if not state.server_deadline or since is None:
        return True
    return server_now is not None and phase_left(since, server_now, state.request_horizon) <= 0
