"""Expressions for the shim: merging the application's UpdateExpression and
ConditionExpression with reshard's bookkeeping.

Pure module (no boto3). The shim adds its own actions to the application's
UpdateExpression -- ``SET #rs_v = :rs_v`` (the write's version), ``REMOVE #rs_del``
(an update of a tombstone brings the item back), ``SET #rs_k0 = if_not_exists(#rs_k0,
:rs_k0)`` for every logical key field (an update that creates the item yields a
complete item the backfill can re-key) -- and ANDs the version fence onto the
application's condition. Every placeholder the shim adds starts with ``#rs_`` or
``:rs_``; the application may not use those, nor touch attributes named ``_rs_*``,
key fields or physical key attributes, so the merged expression can never collide.

Clause keywords (SET, REMOVE, ADD, DELETE) are reserved words in DynamoDB, so an
application can only name such an attribute through a ``#placeholder``: splitting the
expression on the bare keywords is therefore exact.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from reshard.errors import BadInput
from reshard.core.migration import RESERVED_PREFIX

_CLAUSE = re.compile(r"\b(SET|REMOVE|ADD|DELETE)\b", re.IGNORECASE)
_HEAD = re.compile(r"\s*([^.\[\s=]+)")
CLAUSES = ("SET", "REMOVE", "ADD", "DELETE")


def split_clauses(expression: str) -> dict[str, str]:
    """``"SET a = :a REMOVE b"`` -> ``{"SET": "a = :a", "REMOVE": "b"}`` (order kept)."""
    parts = _CLAUSE.split(expression)
    if parts[0].strip():
        raise BadInput(f"UpdateExpression {expression!r}: must start with SET, REMOVE, ADD or DELETE")
    out: dict[str, str] = {}
    for keyword, body in zip(parts[1::2], parts[2::2]):
        keyword = keyword.upper()
        if keyword in out:
            raise BadInput(f"UpdateExpression {expression!r}: the {keyword} clause appears twice")
        if not body.strip():
            raise BadInput(f"UpdateExpression {expression!r}: the {keyword} clause is empty")
        out[keyword] = body.strip()
    return out


def split_top(body: str) -> list[str]:
    """Split a clause body on commas outside parentheses and brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(body[start:i].strip())
            start = i + 1
    out.append(body[start:].strip())
    return [p for p in out if p]


def touched_attributes(clauses: Mapping[str, str], names: Mapping[str, str] | None) -> list[str]:
    """The top-level attribute names the update's actions write (SET/REMOVE/ADD/DELETE targets)."""
    out = []
    for keyword, body in clauses.items():
        for action in split_top(body):
            target = action.split("=", 1)[0] if keyword == "SET" else action
            m = _HEAD.match(target)
            if not m:
                raise BadInput(f"UpdateExpression: cannot read the target of {action!r}")
            out.append(resolve_name(m.group(1), names))
    return out


def resolve_name(token: str, names: Mapping[str, str] | None) -> str:
    if token.startswith("#"):
        if not names or token not in names:
            raise BadInput(f"expression uses {token} but ExpressionAttributeNames does not define it")
        return names[token]
    return token


def check_placeholders(names: Mapping[str, str] | None, values: Mapping | None) -> None:
    """Refuse application placeholders in the shim's namespace, and names of bookkeeping attributes."""
    for n, attr in (names or {}).items():
        if n.lower().startswith("#rs_"):
            raise BadInput(f"ExpressionAttributeNames {n}: placeholders starting with #rs_ are reserved for reshard")
        if attr.startswith(RESERVED_PREFIX):
            raise BadInput(f"ExpressionAttributeNames {n} = {attr!r}: attributes starting with "
                           f"{RESERVED_PREFIX!r} are reshard's bookkeeping")
    for v in values or {}:
        if v.lower().startswith(":rs_"):
            raise BadInput(f"ExpressionAttributeValues {v}: placeholders starting with :rs_ are reserved for reshard")


def check_targets(targets: Iterable[str], forbidden: Iterable[str], why: str) -> None:
    bad = set(forbidden)
    for t in targets:
        if t.startswith(RESERVED_PREFIX):
            raise BadInput(f"UpdateExpression writes {t!r}: attributes starting with {RESERVED_PREFIX!r} "
                           "are reshard's bookkeeping")
        if t in bad:
            raise BadInput(f"UpdateExpression writes {t!r}, {why}")


def merge_update(expression: str | None, extra_set: list[str], extra_remove: list[str]) -> str:
    """The application's UpdateExpression with the shim's actions added to its clauses."""
    clauses = split_clauses(expression) if expression and expression.strip() else {}
    if extra_set:
        clauses["SET"] = ", ".join([c for c in (clauses.get("SET"),) if c] + extra_set)
    if extra_remove:
        clauses["REMOVE"] = ", ".join([c for c in (clauses.get("REMOVE"),) if c] + extra_remove)
    return " ".join(f"{k} {v}" for k, v in clauses.items())


def and_conditions(app: str | None, ours: str | None) -> str | None:
    """``(app) AND (ours)``; either may be missing."""
    if app and ours:
        return f"({app}) AND ({ours})"
    return app or ours
