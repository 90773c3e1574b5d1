"""Segment leases, decided purely (KCL-style): the record of a segment and who may claim it.

The segment engine (:mod:`reshard.jobs.engine`) reads a segment's record, asks
:func:`lease_decision` whether this worker may claim it, and then makes the claim a
compare-and-set on ``lease_counter`` in the control table; this module never writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from reshard.core.wire import get_n, get_s, load_key, number

#: The owner of a free lease.
FREE = "-"


@dataclass(frozen=True)
class SegmentRecord:
    """One segment's lease and checkpoint as read from the control table."""

    segment: int
    exists: bool = False
    owner: str = FREE
    lease_expires: float = 0.0
    lease_counter: int = 0
    checkpoint: dict | None = None
    counters: dict = field(default_factory=dict)
    done: bool = False
    failed: bool = False
    failed_by: str = ""
    attempts: int = 0
    last_error: str = ""
    takeovers: int = 0
    last_throttle: str = ""

    @classmethod
    def from_item(cls, segment: int, item: dict | None) -> "SegmentRecord":
        if not item:
            return cls(segment)
        cp = get_s(item, "checkpoint")
        counters = {k: number(v["N"]) for k, v in item.get("counters", {}).get("M", {}).items()}
        return cls(segment, True, get_s(item, "owner", FREE), float(get_n(item, "lease_expires", 0)),
                   int(get_n(item, "lease_counter", 0)), load_key(cp) if cp else None, counters,
                   item.get("done", {}).get("BOOL", False), item.get("failed", {}).get("BOOL", False),
                   get_s(item, "failed_by", ""), int(get_n(item, "attempts", 0)), get_s(item, "last_error", ""),
                   int(get_n(item, "takeovers", 0)), get_s(item, "last_throttle", ""))

    def as_dict(self, now: float) -> dict:
        state = "done" if self.done else "failed" if self.failed else \
            "leased" if self.owner != FREE and self.lease_expires > now else \
            "pending" if not self.exists else "released"
        return {"segment": self.segment, "state": state, "owner": None if self.owner == FREE else self.owner,
                "lease_seconds_left": round(max(0.0, self.lease_expires - now), 1) if self.owner != FREE else 0,
                "counters": self.counters, "attempts": self.attempts, "last_error": self.last_error or None,
                "takeovers": self.takeovers, "last_throttle": self.last_throttle or None,
                "resumable_from_checkpoint": self.checkpoint is not None}


@dataclass(frozen=True)
class LeaseDecision:
    """Whether a worker may claim a segment, and why (for logs and tests)."""

    claim: bool
    reason: str
    takeover: bool = False  # the previous owner never released it: its page is redone


def lease_decision(rec: SegmentRecord, *, me: str, invocation: str, now: float,
                   is_dead: Callable[[str], bool] = lambda owner: False) -> LeaseDecision:
    """Decide locally whether ``me`` may claim ``rec`` (the write is then a compare-and-set)."""
    if rec.done:
        return LeaseDecision(False, "done")
    if rec.failed and rec.failed_by == invocation:
        return LeaseDecision(False, f"failed in this run after {rec.attempts} attempts")
    if not rec.exists:
        return LeaseDecision(True, "new")
    if rec.owner == FREE:
        return LeaseDecision(True, "free")
    if rec.owner == me:
        return LeaseDecision(True, "already mine")
    if rec.lease_expires <= now:
        return LeaseDecision(True, f"lease of {rec.owner} expired", takeover=True)
    if is_dead(rec.owner):
        return LeaseDecision(True, f"owner {rec.owner} is a dead process on this host", takeover=True)
    return LeaseDecision(False, f"leased by {rec.owner}")
