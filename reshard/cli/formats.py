"""``--output json|text|table`` and ``--query``: the one path from a command's data to stdout.

Every command that prints data builds one plain document (``render.*_data``) and hands it
to :meth:`reshard.cli.options.Env.emit`, which calls :func:`emit_text` here. As in aws-cli,
``--query`` (JMESPath) is applied to that document first, then the output format:

* ``json``: the (queried) document, indented, keys sorted;
* ``text``: without ``--query`` the command's own text for people; with it, aws-cli's text
  form of the result (scalars as they are, a list one line per element, the fields of an
  object tab-separated), made for ``cut`` and shell loops;
* ``table``: the result as boxed tables (an object's scalars as key/value rows, each list
  of objects as its own table with a column per field).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Callable

import jmespath
import jmespath.exceptions

from reshard import errors

FORMATS = ("text", "json", "table")


def compile_query(query: str | None):
    """The compiled JMESPath expression, or a one-line bad-input error naming what is wrong."""
    if query is None:
        return None
    try:
        return jmespath.compile(query)
    except jmespath.exceptions.JMESPathError as e:
        first = str(e).strip().splitlines()[0]
        raise errors.BadInput(f"--query {query!r} is not a JMESPath expression: {first}") from None


def json_default(o: Any):
    if isinstance(o, Decimal):
        return int(o) if o == o.to_integral_value() else float(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if isinstance(o, bytes):
        return o.hex()
    return str(o)


def plain(data: Any) -> Any:
    """``data`` as JSON types only (what JMESPath and the formats below expect)."""
    return json.loads(json.dumps(data, default=json_default))


def emit_text(data: dict, text: str | Callable[[], str], output: str, query=None) -> str:
    """What a command prints on stdout for ``data`` (its text form: ``text``)."""
    if query is not None:
        data = query.search(plain(data))
    if output == "json":
        return json.dumps(data, indent=2, sort_keys=True, default=json_default)
    if output == "table":
        return table(plain(data))
    if query is not None:
        return aws_text(plain(data))
    return text() if callable(text) else text


# ---------------------------------------------------------------------- text (aws-cli style)

def _scalar(v: Any) -> str:
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    return str(v)


def aws_text(data: Any) -> str:
    """aws-cli's ``--output text`` of a query result: one line per list element, fields tab-separated."""
    if isinstance(data, list):
        if all(not isinstance(v, (dict, list)) for v in data):
            return "\t".join(_scalar(v) for v in data)
        return "\n".join(aws_text(v) for v in data)
    if isinstance(data, dict):
        return "\t".join(_scalar(data[k]) for k in sorted(data))
    return _scalar(data)


# ---------------------------------------------------------------------- table

def _box(title: str | None, header: list[str] | None, rows: list[list[str]]) -> list[str]:
    cols = len(header) if header else max((len(r) for r in rows), default=1)
    widths = [0] * cols
    for r in ([header] if header else []) + rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    inner = sum(widths) + 3 * (cols - 1)
    if title and len(title) > inner:
        widths[-1] += len(title) - inner
        inner = len(title)
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = []
    if title:
        out += ["+" + "-" * (inner + 2) + "+", f"| {title.center(inner)} |"]
    out.append(rule)
    if header:
        out += ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |", rule]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(r + [""] * (cols - len(r)), widths)) + " |" for r in rows]
    if rows or header:
        out.append(rule)
    return out


def _tables(data: Any, title: str | None) -> list[str]:
    if isinstance(data, dict):
        scalars = [[k, _scalar(v)] for k, v in data.items() if not isinstance(v, (dict, list))]
        out = _box(title, None, scalars) if scalars or title else []
        for k, v in data.items():
            if isinstance(v, (dict, list)):
                out += _tables(v, f"{title}.{k}" if title else k)
        return out
    if isinstance(data, list):
        if data and all(isinstance(v, dict) for v in data):
            header: list[str] = []
            for v in data:
                header += [k for k in v if k not in header]
            return _box(title, header, [[_scalar(v.get(k, "")) for k in header] for v in data])
        return _box(title, None, [[_scalar(v)] for v in data])
    return _box(title, None, [[_scalar(data)]])


def table(data: Any) -> str:
    """``data`` as boxed tables (aws-cli's ``--output table``, flattened one level per section)."""
    return "\n".join(_tables(data, None))
