"""DynamoDB expressions for the in-memory client (the model checker's DynamoDB).

The tokenizer, the condition/filter/key-condition and projection parser and the evaluator
are the product's own, :mod:`reshard.core.expressions` (the shim evaluates filters with
them); this module adds what only a DynamoDB server needs: UpdateExpression (parse and
apply) and number arithmetic. ``tests/model/test_memory_dynamo.py`` checks the whole --
the shared half included -- against dynalite.

Values are wire format; numbers are compared and added as Decimals. Errors are
:class:`~reshard.core.expressions.ExprError` carrying DynamoDB's error code
(``ValidationException`` unless said otherwise) and a message in DynamoDB's words; the
client turns them into botocore ``ClientError``.

Update grammar (DynamoDB's)::

    update     := (SET set_action (',' set_action)* | REMOVE path (',' path)*
                  | ADD path ':value' (',' ...)* | DELETE path ':value' (',' ...)*)+
    set_action := path '=' value ( ('+' | '-') value )?
    value      := path | ':value' | if_not_exists '(' path ',' value ')' | list_append '(' value ',' value ')'
"""

from __future__ import annotations

import decimal
from typing import Any

from reshard.core import expressions as core
from reshard.core.expressions import (  # noqa: F401 - re-exported: the model's clients import them from here
    _CTX, FUNCTIONS, Context, ExprError, evaluate, fmt_num, get_path, num, parse_condition, parse_projection,
    paths_of, project, sort_value, vtype)


def add_numbers(a: str, b: str, sign: int = 1) -> str:
    try:
        r = _CTX.add(num(a), num(b)) if sign > 0 else _CTX.subtract(num(a), num(b))
    except (decimal.Inexact, decimal.Overflow):
        raise ExprError("Number overflow. Attempting to store a number with magnitude larger than supported "
                        "range") from None
    return fmt_num(r)




class Parser(core.Parser):
    """The product's parser plus UpdateExpression."""

    # -- update
    def update(self) -> dict:
        clauses: dict[str, list] = {}
        if self.tok.kind == "eof":
            raise self.error()
        while self.tok.kind != "eof":
            t = self.next()
            kw = t.text.upper() if t.kind == "ident" else ""
            if kw not in ("SET", "REMOVE", "ADD", "DELETE"):
                raise self.error(t)
            if kw in clauses:
                raise ExprError(f"Invalid {self.what}: The \"{kw}\" section can only be used once in an update "
                                "expression;")
            actions = clauses[kw] = [self.action(kw)]
            while self.tok.kind == "punct" and self.tok.text == ",":
                self.next()
                actions.append(self.action(kw))
        return clauses

    def action(self, kw: str) -> tuple:
        target = self.path()
        if kw == "SET":
            self.expect("op", "=")
            left = self.set_value()
            if self.tok.kind == "punct" and self.tok.text in "+-":
                op = self.next().text
                return ("set", target, ("arith", op, left, self.set_value()))
            return ("set", target, left)
        if kw == "REMOVE":
            return ("remove", target)
        return (kw.lower(), target, self.value())

    def set_value(self) -> tuple:
        t = self.tok
        if t.kind == "value":
            return self.value()
        if self.is_call(("if_not_exists",)):
            self.next()
            args = self.args(self.set_value)
            if len(args) != 2:
                raise ExprError(f"Invalid {self.what}: Incorrect number of operands for operator or function; "
                                f"operator or function: if_not_exists, number of operands: {len(args)}")
            if args[0][0] != "path":
                raise ExprError(f"Invalid {self.what}: Operator or function requires a document path; "
                                "operator or function: if_not_exists")
            return ("if_not_exists", args[0], args[1])
        if self.is_call(("list_append",)):
            self.next()
            args = self.args(self.set_value)
            if len(args) != 2:
                raise ExprError(f"Invalid {self.what}: Incorrect number of operands for operator or function; "
                                f"operator or function: list_append, number of operands: {len(args)}")
            return ("list_append", args[0], args[1])
        if self.is_call(FUNCTIONS):
            raise ExprError(f"Invalid {self.what}: The function is not allowed in an update expression; "
                            f"function: {t.text}")
        if t.kind in ("name", "ident"):
            return self.path()
        raise self.error()

    # -- projection


def parse_update(text: str, ctx: Context) -> dict:
    p = Parser(text, "UpdateExpression", ctx)
    clauses = p.update()
    p.done()
    return clauses


def set_path(item: dict, path: tuple, value: dict) -> None:
    parent = get_path(item, path[:-1]) if len(path) > 1 else {"M": item}
    last = path[-1]
    invalid = ExprError("The document path provided in the update expression is invalid for update")
    if isinstance(last, int):
        if vtype(parent) != "L":
            raise invalid
        lst = parent["L"]
        if last >= len(lst):
            lst.append(value)
        else:
            lst[last] = value
    else:
        if vtype(parent) != "M":
            raise invalid
        parent["M"][last] = value


def remove_path(item: dict, path: tuple) -> None:
    parent = get_path(item, path[:-1]) if len(path) > 1 else {"M": item}
    last = path[-1]
    if isinstance(last, int):
        if vtype(parent) == "L" and last < len(parent["L"]):
            del parent["L"][last]
        elif parent is not None and vtype(parent) != "L":
            raise ExprError("The document path provided in the update expression is invalid for update")
    else:
        if vtype(parent) == "M":
            parent["M"].pop(last, None)
        else:  # a missing or non-map parent: DynamoDB (and dynalite) refuse, unlike a missing leaf
            raise ExprError("The document path provided in the update expression is invalid for update")





# --------------------------------------------------------------------------- update


def _update_value(item: dict, node: tuple) -> dict:
    kind = node[0]
    if kind == "value":
        return node[1]
    if kind == "path":
        v = get_path(item, node[1])
        if v is None:
            raise ExprError("The provided expression refers to an attribute that does not exist in the item")
        return v
    if kind == "if_not_exists":
        v = get_path(item, node[1][1])
        return v if v is not None else _update_value(item, node[2])
    if kind == "list_append":
        a, b = _update_value(item, node[1]), _update_value(item, node[2])
        if vtype(a) != "L" or vtype(b) != "L":
            raise ExprError("Invalid UpdateExpression: Incorrect operand type for operator or function; "
                            f"operator or function: list_append, operand type: {vtype(a) if vtype(a) != 'L' else vtype(b)}")
        return {"L": list(a["L"]) + list(b["L"])}
    if kind == "arith":
        a, b = _update_value(item, node[2]), _update_value(item, node[3])
        if vtype(a) != "N" or vtype(b) != "N":
            raise ExprError("An operand in the update expression has an incorrect data type")
        return {"N": add_numbers(a["N"], b["N"], 1 if node[1] == "+" else -1)}
    raise AssertionError(node)


def targets(clauses: dict) -> list[tuple]:
    return [a[1][1] for actions in clauses.values() for a in actions]


def check_overlaps(clauses: dict) -> None:
    paths = targets(clauses)
    for i, p in enumerate(paths):
        for q in paths[i + 1:]:
            n = min(len(p), len(q))
            if p[:n] == q[:n]:
                one, two = (p, q) if len(p) <= len(q) else (q, p)
                raise ExprError("Invalid UpdateExpression: Two document paths overlap with each other; must remove "
                                f"or rewrite one of these paths; path one: [{', '.join(map(str, one))}], path two: "
                                f"[{', '.join(map(str, two))}]")


def apply_update(old: dict, clauses: dict) -> dict:
    """The item after the update (``old`` untouched). Every value is computed against ``old``."""
    import copy
    new = copy.deepcopy(old)
    # DynamoDB evaluates every operand against the item as it was before the update.
    planned: list[tuple] = []
    for action in clauses.get("SET", []):
        planned.append(("set", action[1][1], _update_value(old, action[2])))
    for action in clauses.get("REMOVE", []):
        planned.append(("remove", action[1][1], None))
    for action in clauses.get("ADD", []):
        path, val = action[1][1], action[2][1]
        cur = get_path(old, path)
        t = vtype(val)
        if t == "N":
            if cur is None:
                planned.append(("set", path, {"N": fmt_num(num(val["N"]))}))
            elif vtype(cur) == "N":
                planned.append(("set", path, {"N": add_numbers(cur["N"], val["N"])}))
            else:
                raise ExprError("An operand in the update expression has an incorrect data type")
        elif t in ("SS", "NS", "BS"):
            if cur is None:
                planned.append(("set", path, {t: list(val[t])}))
            elif vtype(cur) == t:
                merged = list(cur[t]) + [e for e in val[t] if not _in_set(t, e, cur[t])]
                planned.append(("set", path, {t: merged}))
            else:
                raise ExprError("An operand in the update expression has an incorrect data type")
        else:
            raise ExprError("Invalid UpdateExpression: Incorrect operand type for operator or function; operator: "
                            f"ADD, operand type: {t}")
    for action in clauses.get("DELETE", []):
        path, val = action[1][1], action[2][1]
        t = vtype(val)
        if t not in ("SS", "NS", "BS"):
            raise ExprError("Invalid UpdateExpression: Incorrect operand type for operator or function; operator: "
                            f"DELETE, operand type: {t}")
        cur = get_path(old, path)
        if cur is None:
            continue
        if vtype(cur) != t:
            raise ExprError("An operand in the update expression has an incorrect data type")
        left = [e for e in cur[t] if not _in_set(t, e, val[t])]
        planned.append(("set", path, {t: left}) if left else ("remove", path, None))
    for kind, path, value in planned:
        if kind == "set":
            set_path(new, path, value)
    # Removals last, list elements from the highest index down: every index names an element of
    # the list as it was before the update ("REMOVE l[0], l[2]" removes the first and the third).
    removals = [path for kind, path, _ in planned if kind == "remove"]
    removals.sort(key=lambda p: tuple((0, x) if isinstance(x, int) else (1, x) for x in p), reverse=True)
    for path in removals:
        remove_path(new, path)
    return new


def _in_set(t: str, e: Any, values: list) -> bool:
    if t == "NS":
        return any(num(e) == num(v) for v in values)
    if t == "BS":
        return any(bytes(e) == bytes(v) for v in values)
    return e in values
