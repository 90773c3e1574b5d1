"""Input reshard did not write itself, decoded before anything trusts it (pure).

Every control-table row is written by some role (:mod:`reshard.control.records`: the app
writes its heartbeats, a worker its job rows, the operator the rest), and an operator can
type anything into a console. So a row is *input*: each of its attributes is checked here
against the type reshard writes it with (:data:`ROW_TYPES`, per kind of row), and the
times a row tells its readers to wait are clamped to documented maxima (:func:`seconds`).
A row that fails is refused in one line naming the row, the attribute and what is wrong
(:class:`~reshard.errors.ForeignControlRow`: ``doctor`` lists it as ``foreign_row``, the
census counts it as an unreadable shim, everything else stops on it) -- never a
``KeyError``, never a value taken on trust.

The bounds (documented in docs/iam.md, "Bounds"), and why
    A heartbeat's ``liveness_seconds`` and ``request_seconds`` say how long the census must
    watch it silent before it may drop the shim; ``write_seconds`` is verify's settle
    window; a segment's ``lease_seconds`` and ``max_request_seconds`` say how long a gate
    waits for a stalled worker; a budget member's the same for its share. A value of
    ``1E+125`` would make each of those waits endless. Clamping is safe only because reshard
    itself never writes more: the shim refuses a liveness window or an attempt bound above
    these (:func:`check_bound`), ``--lease-seconds`` stops at :data:`MAX_LEASE_SECONDS`.

    * :data:`MAX_LIVENESS_SECONDS` 600 s: twenty times the shim's default (30 s); a shim
      that cannot refresh for ten minutes is down, not slow.
    * :data:`MAX_REQUEST_SECONDS` 300 s: one attempt's connect + read timeout (reshard's own
      is 35 s, botocore's default read timeout 60 s).
    * :data:`MAX_WRITE_SECONDS` 1200 s: one attempt plus two whole calls with retries at
      that bound (:func:`reshard.core.settle.shim_write_seconds` with the shim's retry
      policy: 300 + 2 x 311 s), rounded up.
    * :data:`MAX_LEASE_SECONDS` 3600 s: a segment lease; pages take seconds.

Display: :func:`safe_text` is what every renderer (the CLI's text and table output, its
error line, ``describe()`` of rows) passes a string from a row through, so an escape
sequence in a ``host`` reaches a terminal as ``\\x1b``, never raw.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from typing import Any, Mapping

from reshard import errors
from reshard.core.wire import load_key

MAX_LIVENESS_SECONDS = 600.0
MAX_REQUEST_SECONDS = 300.0
MAX_WRITE_SECONDS = 1200.0
MAX_LEASE_SECONDS = 3600.0
#: How much of a string from a row a renderer shows (the rest is counted, not printed).
MAX_SHOWN_CHARS = 200

# --------------------------------------------------------------------------- row types

_NUMBERS = "N"
#: The attributes every row may carry, whatever its kind.
_COMMON = {"pk": "S", "sk": "S", "schema": "N"}
#: Per kind of row (:func:`row_kind`): attribute -> the type reshard writes it with. ``M:N``
#: is a map of numbers, ``M:M:N`` a map of maps of numbers, ``L:S`` a list of strings.
#: An attribute not listed is left alone (a newer release may add some; it is never read).
ROW_TYPES: dict[str, dict[str, str]] = {
    "meta": {"id": "S", "table": "S", "phase": "S", "phase_version": "N", "file_text": "S", "file_hash": "S",
             "file_path": "S", "created_at": "N", "created_by": "S", "updated_at": "N", "updated_by": "S",
             "last_from": "S", "last_to": "S", "last_action": "S", "switching": "BOOL", "retired": "BOOL",
             "allow_unmappable": "N", "allowance_by": "S", "allowance_at": "N", "item_count": "N",
             "item_count_source": "S", "item_count_at": "N"},
    "history": {"from": "S", "to": "S", "action": "S", "who": "S", "at": "N", "phase_version": "N"},
    "heartbeat": {"instance": "S", "host": "S", "pid": "N", "phase": "S", "phase_version": "N", "at": "N",
                  "liveness_seconds": "N", "refresh_seconds": "N", "beat": "N", "request_seconds": "N",
                  "write_seconds": "N", "data_table": "S"},
    "run": {"job": "S", "run": "N", "total_segments": "N", "started_at": "N", "started_by": "S",
            "finished_at": "N", "totals": "M:N", "repair_pages": "N", "abandoned_at": "N", "abandoned_by": "S"},
    "segment": {"owner": "S", "lease_expires": "N", "lease_counter": "N", "done": "BOOL", "job": "S", "run": "N",
                "segment": "N", "takeovers": "N", "lease_seconds": "N", "max_request_seconds": "N",
                "failed": "BOOL", "attempts": "N", "checkpoint": "S", "counters": "M:N", "last_throttle": "S",
                "updated_at": "N", "finished_at": "N", "last_error": "S", "failed_by": "S", "released_by": "S"},
    "unmappable": {"job": "S", "old_key": "S", "reason": "S", "detail": "S", "size": "N", "at": "N",
                   "other_key": "S"},
    "example": {"body": "S", "job": "S"},
    "budget": {"job": "S", "run": "N", "version": "N", "at": "N", "shares": "M:M:N", "max_wcu": "N",
               "max_rcu": "N"},
    "member": {"job": "S", "run": "N", "member": "S", "beat": "N", "liveness_seconds": "N",
               "request_seconds": "N", "host": "S", "pid": "N", "at": "N", "idle": "L:S"},
    "lock": {"migration_id": "S", "at": "N"},
}


#: Per kind of row: the attributes its readers cannot do without.
REQUIRED: dict[str, tuple[str, ...]] = {
    "meta": ("id", "table", "phase", "phase_version", "file_text", "file_hash"),
}


def row_kind(pk: str, sk: str) -> str | None:
    """Which kind of row sits under this key (None: no row reshard writes)."""
    kind = pk[:2]
    if kind == "M#":
        return "meta" if sk == "META" else "history" if sk.startswith("H#") else \
            "heartbeat" if sk.startswith("S#") else None
    if kind == "S#":
        return "heartbeat" if sk.startswith("S#") else None
    if kind == "J#":
        head, _, rest = sk.partition("#")
        if head == "B":
            # B#<job>#<run> is the budget, B#<job>#<run>#<member> a member's beat.
            return "member" if rest.count("#") >= 2 else "budget"
        return {"R": "run", "J": "segment", "U": "unmappable", "D": "example"}.get(head)
    if kind == "T#":
        return "lock" if sk == "ACTIVE" else None
    return None


def where(item: Mapping) -> str:
    """How a message names a row: ``control row ('S#m1', 'S#i-1')``."""
    pk, sk = item.get("pk"), item.get("sk")
    return f"control row ({_key_text(pk)}, {_key_text(sk)})"


def _key_text(value: Any) -> str:
    if isinstance(value, Mapping) and isinstance(value.get("S"), str):
        return quoted(value["S"])
    return quoted(value)


def check_keys(item: Mapping) -> None:
    """Raise :class:`~reshard.errors.ForeignControlRow` unless ``item`` is a map whose ``pk``
    and ``sk`` are strings (what every other check reads first)."""
    if not isinstance(item, Mapping):
        raise errors.ForeignControlRow(f"a control row that is not a map ({type(item).__name__}): refusing "
                                       "to act on it")
    for name in ("pk", "sk"):
        value = item.get(name)
        if not (isinstance(value, Mapping) and isinstance(value.get("S"), str)):
            raise errors.ForeignControlRow(f"{where(item)}: its key {name!r} is not a string: refusing to act on it")


def check_types(item: Mapping, kind: str | None = None) -> None:
    """Raise :class:`~reshard.errors.ForeignControlRow` unless every attribute of ``item``
    that reshard reads has the type reshard writes it with (numbers: finite and parseable)."""
    check_keys(item)
    if kind is None:
        kind = row_kind(item["pk"]["S"], item["sk"]["S"])
    types = ROW_TYPES.get(kind or "", {})
    for name in REQUIRED.get(kind or "", ()):
        if name not in item:
            raise errors.ForeignControlRow(f"{where(item)}: no attribute {quoted(name)}, which every such row "
                                           "reshard writes has: refusing to act on it")
    for name, value in item.items():
        expected = _COMMON.get(name) or types.get(name)
        if expected is not None:
            problem = _type_problem(value, expected)
            if problem:
                raise errors.ForeignControlRow(f"{where(item)}: attribute {quoted(name)} {problem} (reshard writes "
                                               f"{_spelled(expected)}): refusing to act on it")
    if kind == "segment" and "checkpoint" in item:
        cp = item["checkpoint"]["S"]
        try:
            key = load_key(cp) if cp else {}
            if not isinstance(key, dict):
                raise ValueError("not a key")
        except (ValueError, TypeError, AttributeError, KeyError):
            raise errors.ForeignControlRow(f"{where(item)}: its checkpoint {quoted(cp)} is no key reshard wrote: "
                                           "refusing to act on it") from None


def _type_problem(value: Any, expected: str) -> str | None:
    head, _, inner = expected.partition(":")
    if not isinstance(value, Mapping) or len(value) != 1:
        return "is not a DynamoDB attribute value"
    tag, raw = next(iter(value.items()))
    if tag != head:
        return f"is {quoted(tag)}"
    if head == "S":
        return None if isinstance(raw, str) else "is S but holds no string"
    if head == "N":
        return None if _finite(raw) else f"is N but {quoted(raw)} is not a finite number"
    if head == "BOOL":
        return None if isinstance(raw, bool) else "is BOOL but holds no boolean"
    if head == "M":
        if not isinstance(raw, Mapping):
            return "is M but holds no map"
        for k, v in raw.items():
            problem = _type_problem(v, inner)
            if problem:
                return f"has member {quoted(k)} that {problem}"
        return None
    if head == "L":
        if not isinstance(raw, list):
            return "is L but holds no list"
        for v in raw:
            problem = _type_problem(v, inner)
            if problem:
                return f"has an element that {problem}"
        return None
    return None  # pragma: no cover - ROW_TYPES names no other type


def _spelled(expected: str) -> str:
    head, _, inner = expected.partition(":")
    words = {"S": "a string (S)", "N": "a number (N)", "BOOL": "a boolean (BOOL)"}
    if head == "M":
        return f"a map (M) of {_spelled(inner)}"
    if head == "L":
        return f"a list (L) of {_spelled(inner)}"
    return words[head]


def _finite(raw: Any) -> bool:
    if not isinstance(raw, str) or len(raw) > 64:
        return False
    try:
        return math.isfinite(float(raw))
    except ValueError:
        return False


def digest(item: Mapping) -> str:
    """A short fingerprint of a row's whole content (what changes when anyone rewrites it)."""
    text = json.dumps(item, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:16]


# --------------------------------------------------------------------------- bounded values

def seconds(value: float | int | None, maximum: float, default: float = 0.0) -> float:
    """A duration a row asks its readers to wait, clamped to ``[0, maximum]`` (``default``
    when the row does not say). The row's writer never writes more (:func:`check_bound`)."""
    if value is None:
        return default
    v = float(value)
    if not math.isfinite(v) or v < 0:
        return 0.0 if v < 0 else maximum
    return min(v, maximum)


def check_bound(what: str, value: float, maximum: float, fix: str) -> None:
    """Refuse (bad input) a duration reshard would publish above the maximum its readers
    clamp it to: a census that clamped our liveness window would drop us while we act."""
    if not value <= maximum:
        raise errors.BadInput(f"{what} is {value:g}s, above reshard's bound of {maximum:g}s (the census and the "
                              f"gates never wait longer for a row): {fix}")


# --------------------------------------------------------------------------- display

def utc_text(at: float | int | None) -> str:
    """An epoch time from a row as ``%Y-%m-%d %H:%M:%SZ``; ``?`` for none, or for one no clock
    shows (``1E+125`` overflows ``gmtime``: a row must not crash the renderer)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(float(at))) if at else "?"
    except (OverflowError, ValueError, OSError, TypeError):
        return "?"


#: C0 and C1 controls, DEL, and the Unicode format characters that reorder or hide text
#: (bidirectional overrides and isolates, zero-width joiners, the BOM).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_UNSAFE_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def _escape(m: re.Match) -> str:
    c = m.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100
                                                              else f"\\u{ord(c):04x}")


def safe_text(value: Any, limit: int | None = MAX_SHOWN_CHARS, *, keep_lines: bool = False) -> str:
    """``value`` as text a terminal shows as it is: every control character (ESC, BEL, CR,
    C1, bidi overrides; also newline and tab unless ``keep_lines``) escaped as ``\\xNN``, and
    at most ``limit`` characters (None: all), the rest counted."""
    text = value if isinstance(value, str) else str(value)
    cut = ""
    if limit is not None and len(text) > limit:
        cut = f"...({len(text) - limit} more characters)"
        text = text[:limit]
    return (_UNSAFE_KEEP_LINES if keep_lines else _UNSAFE).sub(_escape, text) + cut


def quoted(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """A value from a row as a message names it: ``repr`` (every control character escaped)
    of at most ``limit`` characters, the rest counted."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        return f"{text[:limit]!r}...({len(text) - limit} more characters)"
    return repr(text)
