"""When verify may call a disagreement between two copies real: a time fence (pure).

A shim writes the authoritative copy, then mirrors the stored item to the other layout
(same version). Between the two, the copies disagree, and verify must not report that
tail of an in-flight write. The shim bounds it: once its authoritative attempt landed,
that attempt answers within one attempt's bound, and what follows (an update's read of
the result, then the mirror) are calls each bounded by the shim's retry policy (attempts,
backoffs, total time: ``Dynamo.max_request_seconds``). Each shim publishes that whole
bound in its heartbeat (``write_seconds``). So once verify has seen the *same versions*
on its own monotonic clock for at least the largest bound any shim published (the
window), no write that caused them can still be completing: a disagreement is real.

Nothing here compares two hosts' clocks: only verify's own observations are timed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from reshard.core.leases import ASSUMED_MAX_REQUEST_SECONDS

#: Calls a shim write may still make after its authoritative copy landed: an UpdateItem
#: asked for old values reads the result back, then every write mirrors it (one mirror:
#: a phase writes at most two layouts).
CALLS_AFTER_AUTHORITATIVE = 2

#: For a shim that did not publish its retry bound: the shim's default policy keeps
#: retrying for at most 10 s, and its last backoff sleeps at most 1 s before the last
#: attempt (``SHIM_RETRIES`` in ``reshard.aws.dynamo``).
ASSUMED_SHIM_RETRY_SECONDS = 11.0


def shim_write_seconds(attempt_seconds: float, call_seconds: float) -> float:
    """The longest a shim write can still be completing after its authoritative copy
    landed: that attempt's answer, then every call after it, each whole (all retries)."""
    return attempt_seconds + CALLS_AFTER_AUTHORITATIVE * call_seconds


def assumed_write_seconds(request_seconds: float = 0.0) -> float:
    """A shim's write bound when it published only one attempt's bound (or nothing)."""
    attempt = request_seconds or ASSUMED_MAX_REQUEST_SECONDS
    return shim_write_seconds(attempt, ASSUMED_SHIM_RETRY_SECONDS + attempt)


def settle_window(published: Iterable[float]) -> float:
    """The window for a table's fleet: the largest write bound any shim published.

    No shim row, no shim write can be in flight (a shim writes its heartbeat before it
    serves, and its row is removed only once it closed, or was watched silent); then the
    window is 0 and only the quick re-reads remain.
    """
    return max((float(w) for w in published), default=0.0)


@dataclass
class Watch:
    """Verify's observations of one suspect: the versions of every copy, since when (on
    verify's monotonic clock) they have been the same, how many looks and changes."""

    versions: tuple | None = None
    since: float = 0.0
    looks: int = 0  # consecutive looks that saw ``versions``
    changes: int = 0

    def observe(self, versions: tuple, now: float) -> None:
        if self.looks and versions == self.versions:
            self.looks += 1
            return
        if self.looks:
            self.changes += 1
        self.versions, self.since, self.looks = versions, now, 1


def decide(w: Watch, now: float, window: float, *, max_changes: int, pause: float) -> tuple[str, float]:
    """Whether a still-disagreeing suspect is reported now, and if not, when to look again.

    Returns ``("report", now)`` once the same versions were seen on at least two looks
    and for at least ``window`` seconds (no write that made them can still be landing),
    ``("changing", now)`` once they changed ``max_changes`` times (a hot item: reported,
    fail-safe), else ``("wait", t)``: look again at ``t`` -- soon at first (most writes
    land within milliseconds), doubling, never later than the window's end.
    """
    if w.changes >= max_changes:
        return "changing", now
    steady_for = now - w.since
    if w.looks >= 2 and steady_for >= window:
        return "report", now
    soon = now + pause * 2 ** max(0, w.looks - 1)
    if w.looks < 2:
        return "wait", soon  # a second look first, a pause apart (as the quick re-reads always did)
    return "wait", max(now, min(soon, w.since + window))
