"""One capacity budget shared by every process and host of a job run (pure).

``--max-wcu`` / ``--max-rcu`` are the run's budget, however many processes run it. Each
process is a *member* of the run's budget row (``B#<job>#<run>`` in the job's control
partition, :mod:`reshard.control.budget`): the row holds the total and every member's
*share* (units/s), and a member paces its requests at its share.

The invariant: the shares written in the row never add up to more than the total
    A member only ever changes its own share, with a compare-and-set on the row's
    version, to :func:`next_share`: its target when that is a decrease, and at most what
    the other live members leave free when it is an increase. It lowers its pacing
    *before* it writes a decrease (once requests already scheduled at the larger share
    went out) and raises it only *after* an increase was written, so the rates in use
    never add up to more than the row's shares. A newcomer therefore starts at what is
    free (often 0) and reaches its target once the others shrank, at their next refresh:
    joining costs the newcomer up to about a refresh of its speed, never an overshoot.

Targets follow demand
    A member's target is ``total / active members``, where *active* means live and with
    demand on that lane (a request waited for the budget within the last refreshes). A
    member whose workers have nothing to do (every segment left is leased elsewhere)
    aims at 0 and gives its share to the others instead of holding it idle; once it has
    demand again it takes what is free, as a newcomer does.

Liveness, judged on the judge's own clock (as the shim census and the segment leases)
    A member bumps ``beat`` in its own member row every refresh. Another member calls it
    gone once it has watched that beat unchanged, on its own monotonic clock, for the
    member's ``liveness_seconds`` + ``request_seconds`` (:func:`silence_bound`), and then
    drops its share from the row in its next compare-and-set. The member itself stops
    pacing anything once its last successful beat was sent ``liveness_seconds`` ago on its
    own clock (:func:`beat_valid_until`), so a stalled member (a pause, a lost network)
    has stopped sending before anyone gives its share away. No two clocks are compared.

What the invariant does not cover (docs/deploy.md states it)
    * A request already sent when its member stops: at most one attempt per request in
      flight, covered by ``request_seconds`` in the silence bound; a retry scheduled by
      the choke point after a throttle is not re-paced.
    * Lowering the total while the run is on: the next process started with the new
      ``--max-wcu`` writes it; the others keep their larger shares until their next refresh
      (one refresh interval above the new total, never above the old one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

#: Seconds between two refreshes of a member (beat, read the row, take its share).
DEFAULT_REFRESH_SECONDS = 1.0
#: A member that could not beat for this long stops pacing anything (seconds).
DEFAULT_LIVENESS_SECONDS = 10.0
#: Rounding slack when comparing sums of floats (units/s): shares are written rounded to 1e-3.
EPSILON = 1e-3

LANES = ("write", "read")


@dataclass(frozen=True)
class Member:
    """One member's row as read: who, its beat counter, and its own time bounds."""

    member: str
    beat: int
    liveness_seconds: float = DEFAULT_LIVENESS_SECONDS
    request_seconds: float = 0.0
    host: str = ""
    pid: int = 0
    idle: frozenset = frozenset()  # lanes it had no demand on when it beat


def silence_bound(m: Member) -> float:
    """How long an observer must see ``m``'s beat unchanged before ``m`` can send nothing more.

    ``m`` stops pacing at its liveness window after its last successful beat was *sent*;
    the observer's timer starts after it *read* that beat (later); one attempt already in
    flight lands within ``request_seconds``.
    """
    return m.liveness_seconds + m.request_seconds


def beat_valid_until(sent_at: float, liveness_seconds: float) -> float:
    """Until when (the member's monotonic clock) a beat sent at ``sent_at`` lets it pace requests."""
    return sent_at + liveness_seconds


@dataclass(frozen=True)
class Shares:
    """The budget row: the run's totals (None: no budget for that lane) and each member's shares."""

    total: Mapping[str, float | None]
    shares: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # member -> lane -> units/s
    version: int = 0

    def share(self, member: str, lane: str) -> float:
        return float(self.shares.get(member, {}).get(lane, 0.0))

    def held(self, lane: str, members: Iterable[str]) -> float:
        """The sum of ``members``' shares of ``lane``."""
        return sum(self.share(m, lane) for m in members)


def even_split(total: float, members: int) -> float:
    """Every active member's target: the total divided evenly (the member itself counts)."""
    return total / max(1, members)


def next_share(total: float | None, others_held: float, target: float) -> float | None:
    """The share a member writes for one lane; None for a lane without a budget.

    ``others_held``: what the *live* others hold in the row (a member judged gone holds
    nothing: its share is dropped in the same write); ``target``: this member's even split
    (0 while it has no demand). The result never makes the row's sum exceed ``total``
    (:func:`row_sum_ok` holds after the write if it held before).
    """
    if total is None:
        return None
    # A decrease is the target; an increase takes no more than the others leave free
    # (they shrink at their own refresh, then this member grows at its next one).
    # Rounded down, so a sum of written shares never exceeds the total by a rounding.
    return math.floor(max(0.0, min(target, total - others_held)) * 1000) / 1000


def row_sum_ok(row: Shares, lane: str, members: Iterable[str] | None = None) -> bool:
    """The invariant: the shares of ``lane`` (of ``members``, default all) add up to at most the total."""
    total = row.total.get(lane)
    if total is None:
        return True
    names = row.shares.keys() if members is None else members
    return row.held(lane, names) <= total + EPSILON


@dataclass(frozen=True)
class Rebalance:
    """What one refresh of ``member`` decided: its new shares, who to drop, whether to write."""

    member: str
    shares: dict[str, float | None]   # lane -> units/s (None: no budget on that lane)
    drop: tuple[str, ...]             # members judged gone: their shares leave the row
    write: bool                       # the row changes (the shares, the totals, or a drop)
    totals: dict[str, float | None]
    targets: dict[str, float | None]  # lane -> the even split this member aims at

    @property
    def below_target(self) -> bool:
        """Some lane is short of its target: the others have not shrunk yet."""
        return any(v is not None and self.targets[k] is not None and v < self.targets[k] - EPSILON
                   for k, v in self.shares.items())


def rebalance(row: Shares, member: str, live: Iterable[str], totals: Mapping[str, float | None] | None = None,
              idle: Mapping[str, Iterable[str]] | None = None) -> Rebalance:
    """One member's refresh, decided from the row it read and the members it judged live.

    ``totals``: the budget this member was started with; a lane it gives replaces the
    row's, a lane it leaves out (None) keeps the row's. The member counts itself live.
    Members of the row it did not judge live are dropped. ``idle``: lane -> the live
    members (this one included, if so) without demand on that lane (nothing to send: its
    workers wait for segments others hold); they aim at 0, the active ones at the total
    divided among the active.
    """
    live_set = set(live) | {member}
    idle = idle or {}
    new_totals = {lane: row.total.get(lane) for lane in LANES}
    new_totals.update({lane: v for lane, v in (totals or {}).items() if v is not None})
    drop = tuple(sorted(m for m in row.shares if m not in live_set))
    others = [m for m in row.shares if m in live_set and m != member]
    shares: dict[str, float | None] = {}
    targets: dict[str, float | None] = {}
    for lane in LANES:
        total = new_totals.get(lane)
        resting = set(idle.get(lane, ())) & live_set
        targets[lane] = None if total is None else 0.0 if member in resting else \
            even_split(total, len(live_set - resting))
        shares[lane] = next_share(total, row.held(lane, others), targets[lane] or 0.0)
    current = row.shares.get(member)
    changed = (current is None or drop or new_totals != {lane: row.total.get(lane) for lane in LANES}
               or any(abs((shares[k] or 0.0) - float(current.get(k, 0.0))) > EPSILON for k in LANES))
    return Rebalance(member, shares, drop, bool(changed), new_totals, targets)
