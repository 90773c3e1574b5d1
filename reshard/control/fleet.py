"""The shim fleet: heartbeats, the census of live shims, and waiting for acknowledgement.

Each shim instance owns one row ``S#<instance>`` in its migration's partition and
rewrites it every refresh with the phase version it acts on. A transition (and a data
job) needs every *live* shim to have acknowledged the current version, so at most two
adjacent phases serve traffic at once.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

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
              pid: int | None = None, table: str = "", refresh_seconds: float = 0.0) -> None:
    """Record that a shim acts on ``phase_version`` (unconditional: a shim owns its row)."""
    store.put({"pk": S(store.mpk(migration_id)), "sk": S(shim_sk(instance)), "instance": S(instance),
               "host": S(host or socket.gethostname()), "pid": N(pid if pid is not None else os.getpid()),
               "phase": S(phase), "phase_version": N(phase_version), "at": N(store.clock()),
               "liveness_seconds": N(float(liveness_seconds)), "refresh_seconds": N(float(refresh_seconds)),
               "data_table": S(table or "-")})


def forget(store: ControlStore, migration_id: str, instance: str) -> None:
    """Remove a heartbeat (a shim closing cleanly leaves the census at once)."""
    store.delete(store.mpk(migration_id), shim_sk(instance))


def heartbeats(store: ControlStore, migration_id: str) -> list[Heartbeat]:
    """Every heartbeat row of the migration, live or not."""
    return [Heartbeat.from_item(i) for i in store.query(store.mpk(migration_id), "S#")]


def census(store: ControlStore, migration_id: str, version: int) -> Census:
    """Which shims of the migration's table are live now, and which lag behind ``version``.

    Counts the heartbeats of *every* migration registered on the same data table: a shim
    still running another migration's file writes that file's layouts, unfenced or
    fenced differently, so it must hold this migration back as a lagging shim does.
    """
    now = store.clock()
    beats = heartbeats(store, migration_id)
    table = store.load_state(migration_id).table
    foreign = [h for other in store.list_states() if other.table == table and other.id != migration_id
               for h in heartbeats(store, other.id) if h.live(now)]
    return Census(tuple(h for h in beats if h.live(now)), tuple(h for h in beats if not h.live(now)), version,
                  tuple(foreign))


def wait_for_ack(store: ControlStore, migration_id: str, version: int, seconds: float,
                 sleep: Callable[[float], None] = time.sleep, poll: float = 1.0) -> Census:
    """Poll the census until every live shim acknowledged ``version`` or time runs out.

    The deadline is measured with the store's clock, the same clock that decides
    liveness, so a test that injects a clock and a ``sleep`` advancing it sees
    heartbeats expire while it waits (and never spins on the real clock).
    """
    deadline = store.clock() + max(0.0, seconds)
    while True:
        c = census(store, migration_id, version)
        left = deadline - store.clock()
        if c.acknowledged or left <= 0:
            return c
        sleep(min(poll, left))
