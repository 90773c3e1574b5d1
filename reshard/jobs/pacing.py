"""Per-key pacing of the copy: no new partition key is written faster than DynamoDB serves one key.

Why: DynamoDB serves one partition key value at most 1,000 WCU per second, whatever the
table's capacity or budget ("Key range throughput exceeded"; burst capacity does not lift
it). A layout with few new partition keys -- fewer shards than before, or a time-bucket
layout whose copies all fall in a few hours -- sends the whole copy to those few keys: a
budget of thousands of WCU/s then pushes each key far past its limit, the copy is
throttled for as long as it runs (the shims' writes to the same keys with it), and the
budget's AIMD slows *every* key for the fault of a few. Pacing each new key at a rate under
the limit keeps the copy of a hot key at what the key can take and lets the others run at
the budget.

:class:`KeyPacer` is a token bucket per partition key value (``core.capacity.TokenBucket``,
reserve-then-sleep, like the budget: concurrent copies of one key are spaced out, not woken
at once), checked by the copy before each conditional put, after the budget's own wait.
Its rate is per process: ``--processes P`` divides it among the P processes of a host; runs
on several hosts at once share nothing, so give each host its part (``--max-wcu-per-key``).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Hashable

from reshard.core.capacity import TokenBucket

#: DynamoDB's partition limit is 1,000 WCU/s; the copy leaves a fifth of it to the shims'
#: own writes to the same keys.
DEFAULT_KEY_WCU = 800.0


class KeyPacer:
    """Per-key token buckets at ``wcu_per_key`` WCU/s (None or 0: no pacing); thread-safe.

    ``burst_seconds``: how much of an idle key's rate may go at once (small, so a burst
    stays inside what the key's partition holds in one second).
    """

    def __init__(self, wcu_per_key: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, burst_seconds: float = 0.25):
        self.rate = wcu_per_key or None
        self.clock, self.sleep, self.burst_seconds = clock, sleep, burst_seconds
        self._buckets: dict[Hashable, TokenBucket] = {}
        self._lock = threading.Lock()
        self.waited = 0.0   # seconds slept for keys' sake, all threads
        self.paced = 0      # writes that waited

    def pace(self, key: Hashable, units: float) -> float:
        """Wait until ``units`` may be written to ``key``; returns the seconds waited."""
        if self.rate is None:
            return 0.0
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) > 4096:
                    self._forget_idle()
                bucket = self._buckets[key] = TokenBucket(self.rate, self.clock, self.burst_seconds)
                bucket.tokens = self.rate * self.burst_seconds  # an idle key may take its burst at once
            delay = bucket.reserve(units)
            if delay > 0:
                self.waited += delay
                self.paced += 1
        if delay > 0:
            self.sleep(delay)
        return delay

    def _forget_idle(self) -> None:
        """Keys not written for longer than a refill are full again: forgotten (memory)."""
        now = self.clock()
        for key in [k for k, b in self._buckets.items() if now - b.last > self.burst_seconds + 1.0]:
            del self._buckets[key]


def key_pacer(wcu_per_key: float | None, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> KeyPacer:
    """This process's pacer (``--processes`` children are given their part of the host's rate)."""
    return KeyPacer(wcu_per_key or None, clock, sleep)
