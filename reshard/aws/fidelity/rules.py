"""Late requests, lost answers, duplicates and injected errors: which requests, and what happens to them.

A :class:`Rule` picks requests (operation, table, a key, a substring of the body, "the n-th
such request", a probability, at most ``times`` of them) and says what the proxy does with
each one it applies to:

``hold``
    The request is kept and delivered upstream later: after ``delay`` seconds, or when a test
    calls ``release(handle)``. ``mode="wait"``: the client's connection stays open and gets
    the answer of the late delivery (unless its own read timeout fired first);
    ``mode="lose"``: the client's connection is closed at once, without an answer, so the
    client retries while the original is still to land (botocore and ``Dynamo.call`` retry a
    closed connection).
``lose_answer``
    The request is delivered (it is applied), then the client's connection is closed without
    the answer: the client retries a request that already landed.
``duplicate``
    The request is delivered and answered; a copy is delivered again: right after
    (``copy="now"``), after ``delay`` seconds, or held for ``release`` (``copy="hold"``).
``fail``
    The request is answered with an error (``status``, ``code``, ``message``) and never delivered.

``age`` (hold, duplicate): a held request or a duplicate's copy is judged, when it is
delivered, as if it reached upstream ``age`` more seconds later than it does: its signature
date is checked against the proxy's clock plus ``age``. A test emulates a request held for
minutes (``age=240``, within AWS's 5; ``age=400``, past them) while holding it for a moment.

Every delivery, late ones too, goes through the same checks as a fresh request at the moment
it reaches upstream (that is when DynamoDB would receive it): a held request whose signature
date is now out of the window is refused with ``InvalidSignatureException``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

ACTIONS = ("hold", "lose_answer", "duplicate", "fail")
MODES = ("wait", "lose")


def _names(value) -> frozenset | None:
    if value is None:
        return None
    return frozenset([value] if isinstance(value, str) else value)


def wire_key(key: dict | None) -> dict | None:
    """A key given as plain strings (``{"PK": "a#1"}``) or wire values (``{"PK": {"S": "a#1"}}``)."""
    if key is None:
        return None
    return {k: (v if isinstance(v, dict) else {"S": str(v)}) for k, v in key.items()}


class Rule:
    """Which requests, and what to do with them (see the module docstring)."""

    def __init__(self, rule_id: str, action: str, *, op=None, table=None, key: dict | None = None,
                 contains: str | bytes | None = None, nth: int = 1, times: int | None = 1,
                 probability: float | None = None, where: Callable[[str, dict], bool] | None = None,
                 delay: float | None = None, mode: str = "wait", copy: str = "now", age: float = 0.0,
                 status: int = 500, code: str = "InternalServerError", message: str = "injected by the proxy"):
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
        if mode not in MODES:
            raise ValueError(f"unknown hold mode {mode!r}: wait or lose")
        if copy not in ("now", "hold", "delay"):
            raise ValueError(f"unknown copy {copy!r}: now, hold or delay")
        if nth < 1:
            raise ValueError("nth counts from 1")
        self.id, self.action = rule_id, action
        self.ops, self.tables = _names(op), _names(table)
        self.key = wire_key(key)
        self.contains = contains.encode() if isinstance(contains, str) else contains
        self.nth, self.times, self.probability, self.where = nth, times, probability, where
        self.delay, self.mode, self.copy, self.age = delay, mode, copy, float(age or 0.0)
        self.status, self.code, self.message = status, code, message
        self.matched = 0   # requests that matched the predicate
        self.applied = 0   # of those, the ones the action was applied to

    def matches(self, request) -> bool:
        """The predicate only (no counting): cheap tests first, the body parsed only if needed."""
        if self.ops is not None and request.op not in self.ops:
            return False
        if self.contains is not None and self.contains not in request.body:
            return False
        if self.tables is not None and not self.tables.intersection(request.tables()):
            return False
        if self.key is not None and not any(_has(k, self.key) for k in request_keys(request.json)):
            return False
        if self.where is not None and not self.where(request.op, request.json):
            return False
        return True

    def take(self, rng) -> bool:
        """Count one match; True if the action applies to it (nth, times, probability). Caller holds the lock."""
        self.matched += 1
        if self.matched < self.nth:
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        if self.probability is not None and rng.random() >= self.probability:
            return False
        self.applied += 1
        return True

    def describe(self) -> dict:
        out = {"id": self.id, "action": self.action, "matched": self.matched, "applied": self.applied}
        for name in ("nth", "times", "probability", "delay", "key"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.age:
            out["age"] = self.age
        if self.ops is not None:
            out["op"] = sorted(self.ops)
        if self.tables is not None:
            out["table"] = sorted(self.tables)
        if self.action == "hold":
            out["mode"] = self.mode
        if self.action == "duplicate":
            out["copy"] = self.copy
        if self.action == "fail":
            out.update(status=self.status, code=self.code)
        return out


def _has(item: dict, key: dict) -> bool:
    return all(item.get(k) == v for k, v in key.items())


def request_keys(req: dict) -> list[dict]:
    """Every item or key a request names (Key, Item, and each of a batch's)."""
    out = []
    for name in ("Key", "Item"):
        if name in req:
            out.append(req[name])
    for entries in (req.get("RequestItems") or {}).values():
        if isinstance(entries, dict):  # BatchGetItem: {"Keys": [...]}
            out.extend(entries.get("Keys") or ())
            continue
        for e in entries:              # BatchWriteItem: [{"PutRequest": {"Item"}}, {"DeleteRequest": {"Key"}}]
            if "PutRequest" in e:
                out.append(e["PutRequest"].get("Item") or {})
            elif "DeleteRequest" in e:
                out.append(e["DeleteRequest"].get("Key") or {})
    return out


class Held:
    """One request kept by the proxy, to be delivered upstream later (or dropped).

    ``client``: True while a client connection waits for this request's answer (``hold``
    with ``mode="wait"``). ``state``: held → delivered (``outcome`` set) or dropped.
    """

    def __init__(self, handle: str, rule: Rule, request, received: float, due: float | None, client: bool,
                 kind: str):
        self.handle, self.rule, self.request = handle, rule, request
        self.received = received        # the proxy's clock when it arrived
        self.due = due                  # time.monotonic() when it is delivered by itself; None: on release
        self.client = client
        self.kind = kind                # "held" (the request itself) or "copy" (a duplicate's second delivery)
        self.state = "held"
        self.outcome = None             # the Answer of its delivery
        self.kept_at = time.monotonic()
        self.held_seconds: float | None = None  # from arrival to delivery (or drop)
        self.released = threading.Event()   # a waiting client's thread delivers when this is set
        self.done = threading.Event()       # delivered or dropped
        self.lock = threading.Lock()

    def claim(self) -> bool:
        """The one caller that delivers (release, the timer, or the waiting client's thread)."""
        with self.lock:
            if self.state != "held":
                return False
            self.state = "delivering"
            return True

    def finish(self, outcome, state: str = "delivered") -> None:
        self.outcome, self.state = outcome, state
        self.held_seconds = time.monotonic() - self.kept_at
        self.done.set()

    def describe(self) -> dict[str, Any]:
        req = self.request.json
        out = {"handle": self.handle, "rule": self.rule.id, "kind": self.kind, "op": self.request.op,
               "tables": self.request.tables(), "state": self.state, "received": self.received,
               "client_waiting": self.client and self.state == "held",
               "keys": request_keys(req)[:25], "amz_date": self.request.header(b"x-amz-date")}
        if self.due is not None:
            out["due_in"] = max(0.0, self.due - time.monotonic())
        if self.outcome is not None:
            out["outcome"] = self.outcome.summary()
        if self.held_seconds is not None:
            out["held_seconds"] = self.held_seconds
        return out
