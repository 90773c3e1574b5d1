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
from reshard.core import expressions
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


def top_attribute(target: str, names: Mapping[str, str] | None) -> tuple[str, bool]:
    """(top-level attribute, whether ``target`` is that whole attribute rather than a nested path)."""
    m = _HEAD.match(target)
    if not m:
        raise BadInput(f"UpdateExpression: cannot read the target {target.strip()!r}")
    return resolve_name(m.group(1), names), target.strip() == m.group(1)


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


def unwrap(condition: str) -> str:
    """``condition`` without parentheses that enclose all of it: DynamoDB refuses
    ``((a = :a))`` as "redundant parentheses", and boto3's builder parenthesises an
    ``&``/``|`` condition, so wrapping it again must not double them."""
    text = condition.strip()
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(text) - 1:
                return text  # the first "(" closes before the end: "(a) AND (b)"
        text = text[1:-1].strip()
    return text


def and_conditions(app: str | None, ours: str | None) -> str | None:
    """``(app) AND (ours)``; either may be missing."""
    if app and ours:
        return f"({unwrap(app)}) AND ({unwrap(ours)})"
    return app or ours


# ---------------------------------------------------------------------- conditions vs tombstones
#
# A tombstone is a stored item (physical key, logical key fields, ``_rs_v``, ``_rs_del``),
# but the application must see it as *absent*: ``attribute_not_exists(sensor_id)`` has to
# hold on it, ``attribute_exists(PK)`` must not. On an absent item every path is missing,
# so the application's condition evaluated there is a constant; we compute it from the
# text (no request), with DynamoDB's rules for missing operands (the same rules
# tests/model/expressions.py checks against dynalite), and the server then decides:
#
#   constant True:   attribute_exists(#rs_del) OR (app)
#   constant False:  attribute_not_exists(#rs_del) AND (app)
#
# When the constant cannot be computed (a text we cannot parse) the condition is left as
# the application wrote it. Comparisons of two values are folded before (decide_key_fields):
# `attribute_not_exists(x) AND :a = :b` would otherwise stay unknown here and be refused on a
# tombstone that stores x (a key field).

_TOKEN = re.compile(r"""\s*(?:
      (?P<cmp><>|<=|>=|=|<|>)
    | (?P<punct>[(),.\[\]])
    | (?P<value>:[A-Za-z0-9_]+)
    | (?P<name>\#[A-Za-z0-9_]+|[A-Za-z_][A-Za-z0-9_]*)
    | (?P<num>[0-9]+)
    )""", re.VERBOSE)

_MISSING = "missing"  # an operand on an absent item: a path or size(path)
_VALUE = "value"      # an ExpressionAttributeValues placeholder
_FUNCS = {"attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains"}


class _Unknown(Exception):
    """The text is outside what absent_value() understands: leave the condition alone."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise _Unknown(text[pos:])
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    """DynamoDB's condition grammar, evaluated on an absent item in three-valued logic
    (True, False, None = depends on values we do not compare)."""

    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, k: int = 0) -> tuple[str, str] | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def kw(self, word: str) -> bool:
        t = self.peek()
        if t and t[0] == "name" and t[1].upper() == word:
            self.i += 1
            return True
        return False

    def expect(self, value: str) -> None:
        t = self.peek()
        if not t or t[1] != value:
            raise _Unknown(f"expected {value}")
        self.i += 1

    def run(self) -> bool | None:
        v = self.or_()
        if self.peek() is not None:
            raise _Unknown("trailing text")
        return v

    def or_(self):
        v = self.and_()
        while self.kw("OR"):
            w = self.and_()
            v = True if (v is True or w is True) else (None if (v is None or w is None) else False)
        return v

    def and_(self):
        v = self.not_()
        while self.kw("AND"):
            w = self.not_()
            v = False if (v is False or w is False) else (None if (v is None or w is None) else True)
        return v

    def not_(self):
        if self.kw("NOT"):
            v = self.not_()
            return None if v is None else not v
        return self.primary()

    def primary(self):
        t = self.peek()
        if t and t[1] == "(":
            self.i += 1
            v = self.or_()
            self.expect(")")
            return v
        if t and t[0] == "name" and t[1] in _FUNCS and self.peek(1) and self.peek(1)[1] == "(":
            return self.function()
        a = self.operand()
        if self.kw("BETWEEN"):
            lo = self.operand()
            if not self.kw("AND"):
                raise _Unknown("BETWEEN without AND")
            hi = self.operand()
            return False if _MISSING in (a, lo, hi) else None
        if self.kw("IN"):
            self.expect("(")
            self.operand()
            while self.peek() and self.peek()[1] == ",":
                self.i += 1
                self.operand()
            self.expect(")")
            return False if a == _MISSING else None
        t = self.peek()
        if not t or t[0] != "cmp":
            raise _Unknown("expected a comparator")
        self.i += 1
        b = self.operand()
        op = t[1]
        if (a == _MISSING) == (b == _MISSING):
            return None  # two values, or two missing operands: not worth guessing
        # One side missing: DynamoDB's `=` is false, `<>` true, orderings false.
        return op == "<>"

    def function(self):
        name = self.toks[self.i][1]
        self.i += 2  # name and "("
        args = [self.operand()]
        while self.peek() and self.peek()[1] == ",":
            self.i += 1
            args.append(self.operand())
        self.expect(")")
        if name == "attribute_exists":
            return False
        if name == "attribute_not_exists":
            return True
        # attribute_type, begins_with, contains: false on a missing first operand.
        return False if args[0] == _MISSING else None

    def operand(self) -> str:
        t = self.peek()
        if not t:
            raise _Unknown("expected an operand")
        if t[0] == "value":
            self.i += 1
            return _VALUE
        if t[0] == "name" and t[1] == "size" and self.peek(1) and self.peek(1)[1] == "(":
            self.i += 2
            self.path()
            self.expect(")")
            return _MISSING  # the size of a missing attribute is missing too
        if t[0] == "name" and t[1].upper() not in ("AND", "OR", "NOT", "BETWEEN", "IN"):
            self.path()
            return _MISSING
        raise _Unknown(f"unexpected {t[1]!r}")

    def path(self) -> None:
        self.i += 1  # the head name
        while self.peek() and self.peek()[1] in (".", "["):
            if self.peek()[1] == ".":
                self.i += 1
                t = self.peek()
                if not t or t[0] != "name":
                    raise _Unknown("bad path")
                self.i += 1
            else:
                self.i += 1
                t = self.peek()
                if not t or t[0] != "num":
                    raise _Unknown("bad index")
                self.i += 1
                self.expect("]")


def absent_value(condition: str) -> bool | None:
    """What ``condition`` evaluates to on an item that does not exist; None if that
    depends on values (``:a = :b``) or the text is not understood."""
    try:
        return _Parser(condition).run()
    except (_Unknown, IndexError):
        return None


TOMBSTONE_NAME = "#rs_del"


def tombstone_aware(condition: str | None) -> tuple[str | None, bool]:
    """The application's ``condition`` rewritten so a tombstone counts as an absent item.

    Returns ``(condition, uses_name)``; ``uses_name``: the result refers to
    :data:`TOMBSTONE_NAME` (the caller maps it to the tombstone attribute; DynamoDB
    rejects unused names, so it is added only then).
    """
    if not condition or not condition.strip():
        return condition, False
    on_absent = absent_value(condition)
    if on_absent is True:
        return f"attribute_exists({TOMBSTONE_NAME}) OR ({unwrap(condition)})", True
    if on_absent is False:
        return f"attribute_not_exists({TOMBSTONE_NAME}) AND ({unwrap(condition)})", True
    return condition, False


# ---------------------------------------------------------------------- conditions on key fields
#
# A logical key field may live only inside the physical keys (the hourly layout's
# `sensor_id`/`ts` are parsed from PK/SK; items the application wrote before the shim, and
# their backfill copies, do not store them), so DynamoDB evaluating the application's
# condition on the physical item would find such a field missing: `attribute_not_exists(
# sensor_id)` would hold on an existing item and a create-only put would overwrite it.
# The request's key fixes every key field (the item at that physical key *is* the item
# with those key values), so each comparison or function over key fields only is a
# constant per case: its value on the existing item (the key values) and on an absent one
# (every path missing). Equal constants fold away; different ones become the item's
# existence, `attribute_exists(<partition attribute>)` or its negation. A comparison that
# mixes a key field with a stored attribute gets the key value as an operand, guarded by
# existence. Value-only comparisons (`:a = :b`) fold too, so what a condition means on an
# absent item (tombstone_aware) never depends on them. DynamoDB's grammar and rules come
# from reshard.core.expressions; a text it refuses is sent as written (DynamoDB answers).

_PLACEHOLDER = re.compile(r"[#:][A-Za-z0-9_]+")
_PRIMITIVES = ("cmp", "between", "in", "func")


def decide_key_fields(condition: str | None, names: Mapping[str, str], values: Mapping[str, dict],
                      key: Mapping[str, dict], item_attr: str, elsewhere: str = "") -> tuple[str | None, dict, dict]:
    """``(condition, names, values)`` with every part over ``key``'s fields (wire values of
    the request's logical key) or over values alone decided as above.

    ``item_attr``: the physical partition attribute (present on every stored item).
    ``elsewhere``: the request's other expressions (an UpdateExpression); a placeholder only
    the original condition used is dropped with it (DynamoDB refuses unused placeholders),
    one no expression used stays (DynamoDB refuses it, as for a plain table).
    """
    names, values = dict(names or {}), dict(values or {})
    if not condition or not condition.strip():
        return condition, names, values
    try:
        node = expressions.parse_condition(condition, expressions.Context(names, values))
    except expressions.ExprError:
        return condition, names, values
    if not any(_decidable(p, key) for p in _primitives(node)):
        return condition, names, values
    exists = ("func", "attribute_exists", (("path", (item_attr,)),))
    absent = ("func", "attribute_not_exists", (("path", (item_attr,)),))
    decided = _decide(node, key, exists, absent)
    if decided is True:
        text = None
    else:
        if decided is False:
            decided = ("and", exists, absent)  # DynamoDB has no literal false
        ours_n: dict = {}
        ours_v: dict = {}
        text = _text(decided, ours_n, ours_v)
    dropped = set(_PLACEHOLDER.findall(condition)) - set(_PLACEHOLDER.findall(elsewhere or ""))
    names = {k: v for k, v in names.items() if k not in dropped}
    values = {k: v for k, v in values.items() if k not in dropped}
    if text is not None:
        names.update(ours_n)
        values.update(ours_v)
    return text, names, values


def _primitives(node: tuple):
    if node[0] in ("and", "or"):
        yield from _primitives(node[1])
        yield from _primitives(node[2])
    elif node[0] == "not":
        yield from _primitives(node[1])
    else:
        yield node


def _decidable(node: tuple, key: Mapping[str, dict]) -> bool:
    paths = expressions.paths_of(node)
    return not paths or any(p[0] in key for p in paths)


def _decide(node: tuple, key: Mapping[str, dict], exists: tuple, absent: tuple):
    """``node`` with decided parts replaced: True/False, or a node."""
    kind = node[0]
    if kind in ("and", "or"):
        a, b = _decide(node[1], key, exists, absent), _decide(node[2], key, exists, absent)
        short = kind == "or"  # the value that decides the whole: True for OR, False for AND
        if a is short or b is short:
            return short
        if isinstance(a, bool):
            return b
        if isinstance(b, bool):
            return a
        return (kind, a, b)
    if kind == "not":
        a = _decide(node[1], key, exists, absent)
        return (not a) if isinstance(a, bool) else ("not", a)
    if not _decidable(node, key):
        return node
    on_absent = expressions.evaluate(node, {})
    paths = expressions.paths_of(node)
    if all(p[0] in key for p in paths):
        on_item = expressions.evaluate(node, dict(key))
        if on_item == on_absent:
            return on_item
        return exists if on_item else absent
    substituted = _with_key_values(node, key)
    if substituted is None:
        return node  # a path below a key field (always missing): left to DynamoDB
    return ("or", absent, substituted) if on_absent else ("and", exists, substituted)


def _with_key_values(node, key: Mapping[str, dict]):
    """``node`` with each operand over a key field replaced by its value (None: not possible)."""
    if not isinstance(node, tuple) or not node:
        return node
    if node[0] in ("path", "size") and isinstance(node[1], tuple):
        path = node[1] if node[0] == "path" else node[1][1]
        if path[0] not in key:
            return node
        value = expressions.operand(dict(key), node)
        return None if value is None else ("value", value)
    if node[0] == "value":
        return node
    out = []
    for child in node:
        if isinstance(child, tuple):
            child = _with_key_values(child, key)
            if child is None:
                return None
        out.append(child)
    return tuple(out)


def _text(node: tuple, names: dict, values: dict) -> str:
    """A parsed condition as text, every name and value through a fresh ``#rs_c``/``:rs_c`` placeholder."""
    kind = node[0]
    if kind in ("and", "or"):
        return f"({_text(node[1], names, values)}) {kind.upper()} ({_text(node[2], names, values)})"
    if kind == "not":
        return f"NOT ({_text(node[1], names, values)})"
    def op(n: tuple) -> str:
        return _operand_text(n, names, values)

    if kind == "cmp":
        return f"{op(node[2])} {node[1]} {op(node[3])}"
    if kind == "between":
        return f"{op(node[1])} BETWEEN {op(node[2])} AND {op(node[3])}"
    if kind == "in":
        return f"{op(node[1])} IN ({', '.join(op(n) for n in node[2])})"
    if kind == "func":
        return f"{node[1]}({', '.join(op(n) for n in node[2])})"
    raise AssertionError(node)


def _operand_text(node: tuple, names: dict, values: dict) -> str:
    if node[0] == "value":
        ph = f":rs_c{len(values)}"
        values[ph] = node[1]
        return ph
    if node[0] == "size":
        return f"size({_operand_text(node[1], names, values)})"
    out = ""
    for part in node[1]:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            ph = f"#rs_c{len(names)}"
            names[ph] = part
            out += ("." if out else "") + ph
    return out


def updated_paths(clauses: Mapping[str, str], names: Mapping[str, str] | None) -> list[tuple] | None:
    """The document paths the update's actions write (``m.b.c``, ``l[0]``: ``("m", "b", "c")``,
    ``("l", 0)``) -- what DynamoDB's ``UPDATED_NEW``/``UPDATED_OLD`` return; None when a target
    is not a path the grammar reads (DynamoDB then answers the request)."""
    ctx = expressions.Context(dict(names or {}), {})
    out = []
    for keyword, body in clauses.items():
        for action in split_top(body):
            if keyword == "SET":
                target = action.split("=", 1)[0]
            elif keyword in ("ADD", "DELETE"):
                target = action.rsplit(None, 1)[0]
            else:
                target = action
            try:
                parser = expressions.Parser(target, "UpdateExpression", ctx)
                node = parser.path()
                parser.done()
            except (expressions.ExprError, IndexError):
                return None
            out.append(node)
    return out
