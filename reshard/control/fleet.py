"""The shim fleet: heartbeats, the census of live shims, and waiting for acknowledgement.

Each shim instance owns one row ``S#<instance>`` in its migration's heartbeat partition
``S#<id>`` (the only partition an app's IAM policy lets it write) and rewrites it every refresh with the phase version it acts on and a counter it bumps
(``beat``). A transition (and a data job) needs every *live* shim to have acknowledged
the current version, so at most two adjacent phases serve traffic at once.

Liveness is judged KCL-style, never by comparing two hosts' clocks: a shim counts as
live until *this* process has watched its ``beat`` stay unchanged, on its own clock,
for the shim's liveness window + the longest one of its requests can be in flight
(:attr:`Heartbeat.silence_seconds`). The shim stops sending at the end of its liveness
window measured on its own clock, so nothing it sent lands after the census drops it.
A single look therefore never drops a shim: a crashed instance's row holds a transition
back until an operator waits (``--wait``) long enough to watch it go silent, and the
wait then removes the row (:func:`reap`).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from reshard import errors
from reshard.control.records import DEFAULT_LIVENESS_SECONDS, Heartbeat, shim_sk
from reshard.control.store import ControlStore
from reshard.core.wire import N, S


@dataclass(frozen=True)
class Census:
    """The live fleet of a data table, and who lags behind a phase version.

    ``foreign``: live shims of the same table that run *another* migration's file (an
    earlier migration's, or a second one started meanwhile). They route by other
    templates and phases, so they lag behind every version of this migration until they
    are redeployed with its file.
    """

    live: tuple[Heartbeat, ...]
    expired: tuple[Heartbeat, ...]
    version: int
    foreign: tuple[Heartbeat, ...] = ()

    @property
    def lagging(self) -> tuple[Heartbeat, ...]:
        return tuple(h for h in self.live if h.phase_version < self.version) + self.foreign

    @property
    def acknowledged(self) -> bool:
        return not self.lagging

    def describe_lagging(self) -> list[str]:
        return [h.describe_foreign() if h in self.foreign else h.describe() for h in self.lagging]


def heartbeat(store: ControlStore, migration_id: str, instance: str, phase: str, phase_version: int,
              liveness_seconds: float = DEFAULT_LIVENESS_SECONDS, host: str | None = None,
              pid: int | None = None, table: str = "", refresh_seconds: float = 0.0, beat: int = 0,
              request_seconds: float = 0.0, write_seconds: float = 0.0) -> None:
    """Record that a shim acts on ``phase_version`` (unconditional: a shim owns its row).

    ``beat`` must change with every call (the census watches it); ``request_seconds``:
    the longest one attempt of the shim's requests can be in flight; ``write_seconds``: the
    longest a write can still be completing after its authoritative copy landed.
    """
    store.put({"pk": S(store.hpk(migration_id)), "sk": S(shim_sk(instance)), "instance": S(instance),
               "host": S(host or socket.gethostname()), "pid": N(pid if pid is not None else os.getpid()),
               "phase": S(phase), "phase_version": N(phase_version), "at": N(store.clock()),
               "liveness_seconds": N(float(liveness_seconds)), "refresh_seconds": N(float(refresh_seconds)),
               "beat": N(beat), "request_seconds": N(float(request_seconds)),
               "write_seconds": N(float(write_seconds)), "data_table": S(table or "-")})


def forget(store: ControlStore, migration_id: str, instance: str) -> None:
    """Remove a heartbeat (a shim closing cleanly leaves the census at once)."""
    store.delete(store.hpk(migration_id), shim_sk(instance))


def heartbeats(store: ControlStore, migration_id: str) -> list[Heartbeat]:
    """Every heartbeat row of the migration, live or not.

    Also the rows a shim of an older release writes in the migration's own partition
    (``M#<id>``, where heartbeats lived before they got theirs): uncounted, such a shim
    could lag a phase unnoticed. A row that fails :func:`~reshard.control.records.check_row`
    raises (fail closed: a census that skipped it could miss a shim).
    """
    rows = store.query(store.hpk(migration_id), "S#") + store.query(store.mpk(migration_id), "S#")
    return [Heartbeat.from_item(i) for i in rows]


def silent_for(store: ControlStore, h: Heartbeat, now: float) -> float:
    """How long this process has seen ``h``'s token unchanged (0 at the first look)."""
    return store.heartbeat_watch.observe((h.migration_id, h.instance), h.token, now)


def is_live(store: ControlStore, h: Heartbeat, now: float) -> bool:
    return silent_for(store, h, now) <= h.silence_seconds


def census(store: ControlStore, migration_id: str, version: int) -> Census:
    """Which shims of the migration's table are live now, and which lag behind ``version``.

    Counts the heartbeats of *every* migration registered on the same data table: a shim
    still running another migration's file writes that file's layouts, unfenced or
    fenced differently, so it must hold this migration back as a lagging shim does.
    """
    beats = heartbeats(store, migration_id)
    table = store.load_state(migration_id).table
    others = [h for other in store.list_states() if other.table == table and other.id != migration_id
              for h in heartbeats(store, other.id)]
    # Read first, then take the time: a beat we saw was sent before this instant, so
    # timing its silence from here never starts the timer before the shim's own.
    now = store.monotonic()
    live = tuple(h for h in beats if is_live(store, h, now))
    foreign = tuple(h for h in others if is_live(store, h, now))
    return Census(live, tuple(h for h in beats if h not in live), version, foreign)


def reap(store: ControlStore, migration_id: str, gone: Iterable[Heartbeat]) -> int:
    """Remove heartbeats the census watched go silent, so later commands (each a new
    process that would have to watch them again) do not wait for them. Conditional on
    the row being unchanged: a shim that beat meanwhile keeps its row."""
    removed = 0
    for h in gone:
        try:
            store.delete(h.row_pk or store.hpk(migration_id), shim_sk(h.instance), condition="(#b = :b OR attribute_not_exists(#b)) AND #at = :at",
                         names={"#b": "beat", "#at": "at"}, values={":b": N(h.beat), ":at": N(h.at)})
            removed += 1
        except errors.ConditionalCheckFailed:
            pass  # it beat again (or was removed already): not ours to remove
        except errors.ReshardError:
            break  # no permission (a read-only role) or an outage: harmless, it stays silent
    return removed


def wait_for_ack(store: ControlStore, migration_id: str, version: int, seconds: float,
                 sleep: Callable[[float], None] = time.sleep, poll: float = 1.0,
                 on_wait: Callable[[Census], None] | None = None) -> Census:
    """Poll the census until every live shim acknowledged ``version`` or time runs out.

    The deadline is measured with the store's clock, the same clock that decides
    liveness, so a test that injects a clock and a ``sleep`` advancing it sees
    heartbeats expire while it waits (and never spins on the real clock). ``on_wait``:
    called with each census that is still waiting (to say who lags).
    """
    deadline = store.monotonic() + max(0.0, seconds)
    while True:
        c = census(store, migration_id, version)
        if c.expired:
            reap(store, migration_id, c.expired)
        left = deadline - store.monotonic()
        if c.acknowledged or left <= 0:
            return c
        if on_wait is not None:
            on_wait(c)
        sleep(min(poll, left))
