"""Progress arithmetic, gh-ost style: items done of a total, percent, rate and ETA.

Pure module: the periodic log line of a data job, its tqdm bar's total and ``status``'s
per-job rate and ETA all come from :class:`Progress`. The total is an estimate (DynamoDB's
ItemCount, refreshed about every six hours, or a counted total), so the percent is capped at
100 and the ETA at zero rather than going past them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The counter that says how many physical items a job has read (its unit of progress).
PROGRESS_COUNTER = {"backfill": "scanned", "verify": "checked", "cleanup": "scanned"}


def progress_counter(job: str) -> str:
    """The page counter that measures ``job``'s progress."""
    return PROGRESS_COUNTER.get(job, "scanned")


@dataclass(frozen=True)
class Progress:
    """``done`` items of ``total`` (None: unknown) after ``elapsed`` seconds, of which
    ``done_before`` were done by an earlier invocation (they do not count for the rate)."""

    done: int
    total: int | None
    elapsed: float
    done_before: int = 0
    total_source: str = ""

    @property
    def pct(self) -> float | None:
        if not self.total:
            return None
        return min(100.0, 100.0 * self.done / self.total)

    @property
    def rate(self) -> float:
        """Items per second over this invocation."""
        return (self.done - self.done_before) / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        if not self.total or self.rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / self.rate)

    def as_dict(self) -> dict:
        eta = self.eta_seconds
        return {"done": self.done, "total": self.total, "total_source": self.total_source or None,
                "pct": None if self.pct is None else round(self.pct, 1), "rate": round(self.rate, 1),
                "elapsed_seconds": round(self.elapsed, 1), "eta_seconds": None if eta is None else round(eta)}

    def text(self) -> str:
        """``1,200/20,000 items (6.0%), 150 items/s, ETA 2m05s`` (no total: no percent, no ETA)."""
        return describe(self.as_dict())


def describe(p: dict) -> str:
    """The text of :meth:`Progress.as_dict` (``status`` renders the recorded dict with it)."""
    of = f"/{p['total']:,}" if p.get("total") else ""
    pct = f" ({p['pct']:.1f}%)" if p.get("pct") is not None else ""
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
