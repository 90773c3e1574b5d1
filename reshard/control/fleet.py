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
from reshard.core import decode
from reshard.core.wire import N, S, still_as_read


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


#: What the census reads of a heartbeat row (a projection: the app's partition may also hold
#: junk attributes, which are then neither transferred nor parsed).
HEARTBEAT_ATTRIBUTES = ("pk", "sk", "schema", "instance", "host", "pid", "phase", "phase_version", "at",
                        "liveness_seconds", "refresh_seconds", "beat", "request_seconds", "write_seconds")
#: Rows per census request (Limit): a partition stuffed with rows is read in bounded pages.
HEARTBEAT_PAGE = 200


def heartbeats(store: ControlStore, migration_id: str) -> list[Heartbeat]:
    """Every heartbeat row of the migration, live or not.

    Only the rows under ``S#`` of the heartbeat partition are read (a Query, projected to the
    attributes a heartbeat has): whatever else an app writes in its partition costs the
    census nothing. Also the rows a shim of an older release writes in the migration's own
    partition (``M#<id>``, where heartbeats lived before they got theirs): uncounted, such a
    shim could lag a phase unnoticed. A row that fails
    :func:`~reshard.control.records.check_row` (a mistyped attribute, another instance's
    name, an unknown schema) is counted as an unreadable shim that lags every version
    (:meth:`Heartbeat.unreadable_row`): fail closed, yet it stops counting once it stayed
    unchanged for the longest silence any shim may have -- one bad row never holds the
    fleet back for good, and never stops the census.
    """
    out = []
    for pk in (store.hpk(migration_id), store.mpk(migration_id)):
        for i in store.query(pk, "S#", attributes=HEARTBEAT_ATTRIBUTES, page_size=HEARTBEAT_PAGE):
            try:
                out.append(Heartbeat.from_item(i))
            except errors.ForeignControlRow as e:
                out.append(Heartbeat.unreadable_row(i, _reason(i, str(e))))
    return out


def _reason(item: dict, message: str) -> str:
    where = decode.where(item)
    return message[len(where):].lstrip(": ") if message.startswith(where) else message


def silent_for(store: ControlStore, h: Heartbeat, now: float) -> float:
    """How long this process has seen ``h``'s token unchanged (0 at the first look)."""
    return store.heartbeat_watch.observe((h.migration_id, h.instance), h.token, now)


def is_live(store: ControlStore, h: Heartbeat, now: float) -> bool:
    return silent_for(store, h, now) <= h.silence_seconds


def others_on_table(store: ControlStore, migration_id: str) -> tuple[str, ...]:
    """The other migrations registered on this migration's data table (one Scan of the
    control table's META rows: a census that polls reads it once, :func:`wait_for_ack`)."""
    table = store.load_state(migration_id).table
    return tuple(s.id for s in store.list_states() if s.table == table and s.id != migration_id)


def census(store: ControlStore, migration_id: str, version: int, others: tuple[str, ...] | None = None) -> Census:
    """Which shims of the migration's table are live now, and which lag behind ``version``.

    Counts the heartbeats of *every* migration registered on the same data table: a shim
    still running another migration's file writes that file's layouts, unfenced or
    fenced differently, so it must hold this migration back as a lagging shim does.
    ``others``: those migrations' ids when the caller read them already (a poll: no
    migration can register on the table while this one holds its lock, and one that is
    finished cannot move), else one Scan finds them.
    """
    if others is None:
        others = others_on_table(store, migration_id)
    beats = heartbeats(store, migration_id)
    others = [h for other in others for h in heartbeats(store, other)]
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
            if h.unreadable:
                # No beat to condition on: every attribute as it was read (a rewrite changes one).
                store.delete(h.row_pk, shim_sk(h.instance), **unchanged_row(h.raw))
            else:
                store.delete(h.row_pk or store.hpk(migration_id), shim_sk(h.instance),
                             condition="(#b = :b OR attribute_not_exists(#b)) AND #at = :at",
                             names={"#b": "beat", "#at": "at"}, values={":b": N(h.beat), ":at": N(h.at)})
            removed += 1
        except errors.ConditionalCheckFailed:
            pass  # it beat again (or was removed already): not ours to remove
        except errors.ReshardError:
            break  # no permission (a read-only role) or an outage: harmless, it stays silent
    return removed


def unchanged_row(raw: dict) -> dict:
    """The condition (``condition``, ``names``, ``values``) that a heartbeat row still holds
    exactly what the census read of it (every attribute it projects: equal, or still absent)."""
    names, values = {}, {}
    conds = still_as_read([a for a in HEARTBEAT_ATTRIBUTES if a not in ("pk", "sk")], raw, "u", names, values)
    return {"condition": " AND ".join(conds), "names": names, "values": values or None}


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
    others = others_on_table(store, migration_id)  # once: each poll then reads only the heartbeat rows
    while True:
        c = census(store, migration_id, version, others)
        if c.expired:
            reap(store, migration_id, c.expired)
        left = deadline - store.monotonic()
        if c.acknowledged or left <= 0:
            return c
        if on_wait is not None:
            on_wait(c)
        sleep(min(poll, left))
