"""How a long-lived background thread reports a failure it survives (pure: stdlib logging).

The shim's refresh thread (phase + heartbeat) and a job's budget beat run for the life of
their process. Whatever one attempt raises -- a control row of the wrong type, a server
answering ``[]``, a bug of ours -- the thread must keep running and try again at its next
turn, so the process recovers by itself when the cause goes away (a row fixed, an endpoint
healthy again). What it must not do is fill a log at every turn: :class:`FailureLog` logs a
kind of failure once, then at most once per :attr:`FailureLog.every` seconds with how many
times it happened meanwhile, and once more when the thread recovered.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from reshard import errors
from reshard.core.decode import safe_text

#: A kind of failure is logged again (with its count) at most this often (seconds).
REPEAT_SECONDS = 300.0


def kind_of(exc: BaseException) -> str:
    """What makes two failures "the same kind": the class, and the AWS error code if any."""
    code = getattr(exc, "code", None)
    return f"{type(exc).__name__}:{code}" if isinstance(code, str) else type(exc).__name__


def describe(exc: BaseException) -> str:
    """One line for a log: class and message, scrubbed of credentials and control characters."""
    return safe_text(errors.scrub(f"{type(exc).__name__}: {exc}"), 500)


class FailureLog:
    """Rate-limited logging of the failures of one background thread (thread-safe)."""

    def __init__(self, logger: logging.Logger, what: str, every: float = REPEAT_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.what, self.every, self.clock = logger, what, every, clock
        self._lock = threading.Lock()
        self._seen: dict[str, list] = {}  # kind -> [last logged at, times since]

    def failed(self, exc: BaseException) -> None:
        kind = kind_of(exc)
        now = self.clock()
        with self._lock:
            seen = self._seen.get(kind)
            if seen is not None and now - seen[0] < self.every:
                seen[1] += 1
                return
            again = seen[1] if seen is not None else 0
            self._seen[kind] = [now, 0]
        more = f" (and {again} more time(s) since it was last logged)" if again else ""
        self.logger.warning("%s failed, will retry: %s%s", self.what, describe(exc), more)

    def recovered(self) -> None:
        with self._lock:
            if not self._seen:
                return
            kinds = ", ".join(sorted(self._seen))
            self._seen.clear()
        self.logger.warning("%s works again (after %s)", self.what, kinds)
