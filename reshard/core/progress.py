"""Progress arithmetic, gh-ost style: items done of a total, percent, rate and ETA.

Pure module: the periodic log line of a data job, its tqdm bar and ``status``'s per-job
rate and ETA all come from :class:`Progress`, and what a page did from
:func:`progress_done`: the same unit (the old layout's items) on both sides of done / total.
The total is an estimate (a counted total, or DynamoDB's ItemCount, refreshed about every
six hours), so done never runs past the total shown (the total follows done), the percent
is capped at 100 and the ETA at zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

#: The counter that says how many physical items a job's scan read.
PROGRESS_COUNTER = {"backfill": "scanned", "verify": "checked", "cleanup": "scanned"}

#: The new layout's items a job's scan met (counted apart, so progress leaves them out).
NEW_LAYOUT_COUNTER = {"backfill": "new_layout", "verify": "new_copies", "cleanup": "new_layout"}


def progress_counter(job: str) -> str:
    """The page counter of the physical items ``job``'s scan read."""
    return PROGRESS_COUNTER.get(job, "scanned")


def progress_done(job: str, counts: Mapping[str, float]) -> int:
    """How much of ``job`` a page (or a run's counters) did, in the unit of its total.

    The unit is the old layout's items, on both sides of done / total: the total is the
    item count ``start --count`` (or a full-scan ``start``) stored, taken before any shim
    wrote a new-layout copy, or DescribeTable's ItemCount. A scan reads the whole table,
    both layouts, so the new layout's copies it meets (a shim's mirror write, a copy made
    earlier) are left out of done: counting them made ``6,196/4,401 (100%)``. A migration
    that keeps the table's keys (index-only) and ``cleanup --strip-bookkeeping`` (one
    layout left) count every item scanned.
    """
    read = counts.get(progress_counter(job), 0) or 0
    new = counts.get(NEW_LAYOUT_COUNTER.get(job, ""), 0) or 0
    return max(0, int(read) - int(new))


@dataclass(frozen=True)
class Progress:
    """``done`` items of ``total`` (None: unknown) after ``elapsed`` seconds, of which
    ``done_before`` were done by an earlier invocation (they do not count for the rate).

    ``total`` is an estimate: once ``done`` passes it, the total shown is ``done`` (never
    ``6,196/4,401``) and :attr:`estimate_low` says so.
    """

    done: int
    total: int | None
    elapsed: float
    done_before: int = 0
    total_source: str = ""

    @property
    def estimate_low(self) -> bool:
        return bool(self.total) and self.done > self.total

    @property
    def shown_total(self) -> int | None:
        """The total as shown: never below ``done``."""
        return max(self.total, self.done) if self.total else None

    @property
    def pct(self) -> float | None:
        if not self.total:
            return None
        return min(100.0, 100.0 * self.done / self.shown_total)

    @property
    def rate(self) -> float:
        """Items per second over this invocation."""
        return (self.done - self.done_before) / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        if not self.total or self.rate <= 0:
            return None
        return max(0.0, (self.shown_total - self.done) / self.rate)

    def as_dict(self) -> dict:
        eta = self.eta_seconds
        return {"done": self.done, "total": self.shown_total, "total_source": self.total_source or None,
                "estimate_low": self.estimate_low,
                "pct": None if self.pct is None else round(self.pct, 1), "rate": round(self.rate, 1),
                "elapsed_seconds": round(self.elapsed, 1), "eta_seconds": None if eta is None else round(eta)}

    def text(self) -> str:
        """``1,200/20,000 items (6.0%), 150 items/s, ETA 2m05s`` (no total: no percent, no ETA)."""
        return describe(self.as_dict())


def describe(p: dict) -> str:
    """The text of :meth:`Progress.as_dict` (``status`` renders the recorded dict with it)."""
    of = f"/{p['total']:,}" if p.get("total") else ""
    pct = f" ({p['pct']:.1f}%)" if p.get("pct") is not None else ""
    if p.get("estimate_low"):
        pct += " (more than the estimated total)"
    out = f"{p['done']:,}{of} items{pct}, {p['rate']:,.1f} items/s"
    if p.get("eta_seconds") is not None:
        out += f", ETA {duration(p['eta_seconds'])}"
    elif not p.get("total"):
        out += ", total unknown (no ETA)"
    return out


def duration(seconds: float) -> str:
    """``45s``, ``2m05s``, ``3h07m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
