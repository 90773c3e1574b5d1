"""Waits that say what they wait for (PRODUCT.md: "every wait says what it waits for ... at
least every 10 s").

One helper for every wait of the operator and the jobs: the first look says what is awaited
and why, later looks repeat it (with what is left) at most every :data:`SAY_EVERY_SECONDS`.
"""

from __future__ import annotations

import time
from typing import Callable

#: How often a wait repeats what it waits for.
SAY_EVERY_SECONDS = 10.0


def _quiet(message: str) -> None:
    pass


class Waiting:
    """Says ``what`` (and how long is left) now, then at most every ``every`` seconds."""

    def __init__(self, say: Callable[[str], None] | None, what: str, *, every: float = SAY_EVERY_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic):
        self.say = say or _quiet
        self.what = what
        self.every = every
        self.monotonic = monotonic
        self._last: float | None = None
        self.looks = 0

    def tick(self, left: float | None = None, detail: str = "") -> None:
        """One look that found the wait not over; ``left``: seconds still to wait, if known."""
        self.looks += 1
        now = self.monotonic()
        if self._last is not None and now - self._last < self.every:
            return
        self._last = now
        parts = [f"waiting for {self.what}"]
        if left is not None:
            parts.append(f"{left:.0f}s left")
        if detail:
            parts.append(detail)
        self.say(": ".join(parts[:1]) + (f" ({'; '.join(parts[1:])})" if len(parts) > 1 else ""))
