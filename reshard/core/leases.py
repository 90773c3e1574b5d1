"""Segment leases, decided purely (KCL-style): the record of a segment and who may claim it.

The segment engine (:mod:`reshard.jobs.engine`) reads a segment's record, asks
:func:`lease_decision` whether this worker may claim it, and then makes the claim a
compare-and-set on ``lease_counter`` in the control table; this module never writes.

Expiry is judged on the judge's own clock, never by comparing clocks
    The holder bumps ``lease_counter`` with every renewal (each checkpoint renews). A
    claimant remembers, on its own monotonic clock, when it first saw each
    (owner, counter) token of a segment (:class:`LeaseWatch`); the lease is expired for
    it once the token has not changed for the holder's ``lease_seconds``. The holder's
    wall-clock ``lease_expires`` is only shown by ``status``. The holder itself stops
    writing at its *local deadline*: its last successful claim or renewal (on its
    monotonic clock, taken before sending it) + ``lease_seconds`` - the longest a
    request can be in flight (``max_request_seconds``). Since the claimant's timer starts
    only after that renewal landed, every write the holder sent lands before anyone
    may take the lease over, whatever the two wall clocks say.

Gates that need "no job is writing" (cutover, the abort's cleanup and retire) wait until
every lease is released, or its token has been unchanged for lease + max request
seconds on the gate's own clock (:func:`quiet_remaining`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from reshard.core import decode
from reshard.core.decode import MAX_LEASE_SECONDS, MAX_REQUEST_SECONDS
from reshard.core.wire import get_n, get_s, load_key, number

#: The owner of a free lease.
FREE = "-"

#: For records written before the holder recorded its own numbers: the engine's default
#: lease and the choke point's default connect + read timeout.
ASSUMED_LEASE_SECONDS = 60.0
ASSUMED_MAX_REQUEST_SECONDS = 35.0


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
    lease_seconds: float = 0.0        # the holder's lease length (0: not recorded)
    max_request_seconds: float = 0.0  # the holder's longest request in flight (0: not recorded)

    @classmethod
    def from_item(cls, segment: int, item: dict | None) -> "SegmentRecord":
        if not item:
            return cls(segment)
        # A worker's row (any worker, or an operator's typo): types checked, and the waits it
        # asks observers for clamped (reshard.core.decode), before anyone acts on it.
        decode.check_types(item, "segment")  # the checkpoint too: a key reshard can read back
        cp = get_s(item, "checkpoint")
        checkpoint = load_key(cp) if cp else None
        counters = {k: number(v["N"]) for k, v in item.get("counters", {}).get("M", {}).items()}
        return cls(segment, True, get_s(item, "owner", FREE), float(get_n(item, "lease_expires", 0)),
                   int(get_n(item, "lease_counter", 0)), checkpoint, counters,
                   item.get("done", {}).get("BOOL", False), item.get("failed", {}).get("BOOL", False),
                   get_s(item, "failed_by", ""), int(get_n(item, "attempts", 0)), get_s(item, "last_error", ""),
                   int(get_n(item, "takeovers", 0)), get_s(item, "last_throttle", ""),
                   decode.seconds(get_n(item, "lease_seconds"), MAX_LEASE_SECONDS),
                   decode.seconds(get_n(item, "max_request_seconds"), MAX_REQUEST_SECONDS))

    @property
    def held(self) -> bool:
        """Someone holds the lease (its worker may still write)."""
        return self.exists and self.owner != FREE and not self.done

    @property
    def token(self) -> tuple[str, int]:
        """What changes with every claim and renewal: an observer times how long it stays."""
        return (self.owner, self.lease_counter)

    def holder_lease_seconds(self, default: float = ASSUMED_LEASE_SECONDS) -> float:
        return self.lease_seconds or default

    def holder_max_request_seconds(self) -> float:
        return self.max_request_seconds or ASSUMED_MAX_REQUEST_SECONDS

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


class LeaseWatch:
    """When this observer first saw each lease token, on its own monotonic clock.

    ``observe(key, token, now)`` returns how long ``token`` has been unchanged as far as
    this observer knows (0 the first time it sees it). Nothing is compared with another
    host's clock; an observer that just started waits a whole lease before it calls a
    lease expired (KCL does the same).
    """

    def __init__(self) -> None:
        self._seen: dict = {}

    def observe(self, key, token, now: float) -> float:
        seen = self._seen.get(key)
        if seen is None or seen[0] != token:
            self._seen[key] = (token, now)
            return 0.0
        return max(0.0, now - seen[1])


def quiet_remaining(rec: SegmentRecord, unchanged_for: float, default_lease: float = ASSUMED_LEASE_SECONDS) -> float:
    """Seconds until a held lease's worker can no longer write anything that lands:
    its token unchanged for the holder's lease + its longest request in flight. 0 if free."""
    if not rec.held:
        return 0.0
    return max(0.0, rec.holder_lease_seconds(default_lease) + rec.holder_max_request_seconds() - unchanged_for)


def lease_decision(rec: SegmentRecord, *, me: str, invocation: str, unchanged_for: float,
                   lease_seconds: float = ASSUMED_LEASE_SECONDS,
                   is_dead: Callable[[str], bool] = lambda owner: False) -> LeaseDecision:
    """Decide locally whether ``me`` may claim ``rec`` (the write is then a compare-and-set).

    ``unchanged_for``: how long this claimant has seen the record's token unchanged, on
    its own monotonic clock (:class:`LeaseWatch`); the lease expires after the holder's
    recorded lease length (``lease_seconds`` for records that do not say).
    """
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
    if unchanged_for >= rec.holder_lease_seconds(lease_seconds):
        return LeaseDecision(True, f"lease of {rec.owner} expired", takeover=True)
    if is_dead(rec.owner):
        return LeaseDecision(True, f"owner {rec.owner} is a dead process on this host", takeover=True)
    return LeaseDecision(False, f"leased by {rec.owner}")
