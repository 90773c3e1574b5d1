"""The server-enforced request horizon (docs/late-writes.md): dates, horizons and waits.

Pure domain module (standard library only).

DynamoDB refuses a request whose SigV4 date is more than :data:`SIGNATURE_WINDOW_SECONDS`
from its own clock. reshard signs a data-table request with ``horizon - W`` so that DynamoDB
refuses it once the server's clock passes ``horizon``: a frozen process, a retry or a request
held in the network can then never land after the fleet moved on. ``horizon`` is
``fact_date + H``: the server's ``Date`` of the control-plane read the request obeys, plus the
migration's request horizon ``H``. A transition out of a phase waits until the server's clock
reads ``since + H + DATE_MARGIN_SECONDS`` (:func:`phase_left`), so only requests obeying the
current phase or the one before it can ever land.
"""

from __future__ import annotations

import calendar
import math
import time
from email.utils import parsedate_tz

#: How far from its own clock DynamoDB accepts a SigV4 date (observed, not documented; probed by
#: ``start`` and every transition: :func:`probe_dates`).
SIGNATURE_WINDOW_SECONDS = 300.0
#: A migration's request horizon unless ``start --request-horizon`` says otherwise.
DEFAULT_HORIZON_SECONDS = 15.0
#: The horizon of a shim that sees no migration (the steady state).
STEADY_HORIZON_SECONDS = 15.0
#: The ``Date`` header has one-second resolution, and a server answers a little after it read:
#: a fact read before a change carries a date at most this much after the change's own date.
DATE_MARGIN_SECONDS = 2.0
#: A request is not sent when the server's clock may be this close to its horizon (it would
#: be refused on arrival): refresh the fact first, or fail closed.
SEND_MARGIN_SECONDS = 1.0
#: The bounds a control row's horizon is clamped to (a typo must not stop every transition for
#: hours, nor make requests expire before they are sent).
MIN_HORIZON_SECONDS = 1.0
MAX_HORIZON_SECONDS = SIGNATURE_WINDOW_SECONDS - 10.0

_AMZ = "%Y%m%dT%H%M%SZ"


def amz_date(epoch: float) -> str:
    """``X-Amz-Date`` text of an epoch time (whole seconds, rounded down)."""
    return time.strftime(_AMZ, time.gmtime(math.floor(epoch)))


def parse_amz_date(text: str) -> float:
    """Epoch seconds of an ``X-Amz-Date`` (``20261127T193000Z``); ValueError if malformed."""
    return float(calendar.timegm(time.strptime(text, _AMZ)))


def parse_http_date(text: str | None) -> float | None:
    """Epoch seconds of an HTTP ``Date`` header (RFC 7231), None if absent or unreadable."""
    if not text:
        return None
    parts = parsedate_tz(text)
    if parts is None:
        return None
    try:
        return float(calendar.timegm(parts[:9])) - (parts[9] or 0)
    except (OverflowError, ValueError):
        return None


def clamp_horizon(seconds: float | None) -> float:
    """A request horizon read from a control row, within documented bounds."""
    if seconds is None or not math.isfinite(seconds):
        return DEFAULT_HORIZON_SECONDS
    return min(max(float(seconds), MIN_HORIZON_SECONDS), MAX_HORIZON_SECONDS)


def horizon_of(fact_date: float, horizon_seconds: float) -> float:
    """The last server time at which a request obeying a fact read at ``fact_date`` may land."""
    return fact_date + horizon_seconds


def sign_epoch(horizon: float, window: float = SIGNATURE_WINDOW_SECONDS) -> float:
    """The date to sign with so that the server refuses the request after ``horizon``.

    Rounded *down*: the request dies at or before ``horizon``, never after.
    """
    return math.floor(horizon - window)


def usable(horizon: float, server_now: float | None) -> bool:
    """Whether a request with ``horizon`` may still be sent at ``server_now`` (None: unknown)."""
    return server_now is None or server_now + SEND_MARGIN_SECONDS < horizon


def phase_left(since: float | None, server_now: float, horizon_seconds: float) -> float:
    """Seconds of server time until a phase that began at ``since`` has lasted long enough for a
    transition out of it: every request obeying an earlier phase has landed or can never land.
    ``since`` None (not recorded): the caller uses the first time it saw the phase instead."""
    if since is None:
        return horizon_seconds + DATE_MARGIN_SECONDS
    return max(0.0, since + horizon_seconds + DATE_MARGIN_SECONDS - server_now)


def probe_dates(server_now: float, window: float = SIGNATURE_WINDOW_SECONDS) -> tuple[float, float]:
    """(a date the server must refuse, a date it must accept) to check that it enforces ``window``.

    The first is a little more than ``window`` old, the second a little less: a server whose
    window were longer than ours would accept the first (our horizons would not hold); one whose
    window were shorter would refuse the second (our requests would die before their horizon).
    """
    return math.floor(server_now - window - 3.0), math.floor(server_now - window + 3.0)
