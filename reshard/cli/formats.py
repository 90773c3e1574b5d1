"""``--output json|text|table`` and ``--query``: the one path from a command's data to stdout.

Every command that prints data builds one plain document (``render.*_data``) and hands it
to :meth:`reshard.cli.options.Env.emit`, which calls :func:`emit_text` here. As in aws-cli,
``--query`` (JMESPath) is applied to that document first, then the output format:

* no ``--output``: the command's own text for people (with ``--query``: aws-cli's text of
  the result);
* ``json``: the (queried) document, indented, keys sorted;
* ``text``: aws-cli's text form of the (queried) document: scalars as they are, a list one
  line per element, an object's scalar fields tab-separated in key order, a nested list of
  objects one line per object led by its key in capitals; made for ``cut`` and shell loops;
* ``table``: the result as boxed tables (an object's scalars as key/value rows, each list
  of objects as its own table with a column per field).

Times are ISO 8601 in UTC in every machine format (aws-cli v2): an :class:`Instant`, and a
number under a key ``at`` or ``*_at`` (epoch seconds), become ``2024-10-27T15:00:00.123000+00:00``
before the query runs (0 or none: null). The text for people keeps its own formats.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Callable

import jmespath
import jmespath.exceptions

from reshard import errors

FORMATS = ("text", "json", "table")


class Instant(float):
    """An epoch time (seconds) in a command's data: ISO 8601 in machine output, as is for the text."""


def instant(t: float | None) -> Instant | None:
    """``t`` marked as a time (None for none, and for 0: never set)."""
    return Instant(t) if t else None


def iso8601(t: float) -> str:
    """``2024-10-27T15:00:00.123000+00:00`` (UTC, microseconds: aws-cli v2's timestamp form)."""
    return datetime.fromtimestamp(float(t), timezone.utc).isoformat(timespec="microseconds")


def _is_time_key(key: Any) -> bool:
    return isinstance(key, str) and (key == "at" or key.endswith("_at"))


def with_iso_times(data: Any) -> Any:
    """``data`` with every time as ISO 8601 (see the module docstring)."""
    if isinstance(data, Instant):
        return iso8601(data)
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if _is_time_key(k) and isinstance(v, (int, float, Decimal)) and not isinstance(v, bool):
                out[k] = iso8601(v) if v else None
            else:
                out[k] = with_iso_times(v)
        return out
    if isinstance(data, (list, tuple)):
        return [with_iso_times(v) for v in data]
    return data


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


def emit_text(data: dict, text: str | Callable[[], str], output: str | None, query=None) -> str:
    """What a command prints on stdout for ``data`` (its text for people: ``text``).

    ``output`` None: no ``--output`` was given (people's text, unless ``--query``)."""
    if output is None and query is None:
        return text() if callable(text) else text
    data = plain(with_iso_times(data))
    if query is not None:
        data = query.search(data)
    if output == "json":
        return json.dumps(data, indent=2, sort_keys=True, default=json_default)
    if output == "table":
        return table(plain(data))
    return aws_text(plain(data))


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
    """aws-cli's ``--output text`` of a document (or a query result).

    A scalar on its own line; a list of scalars on one line, tab-separated; a list of
    lists, one line per inner list; an object's scalar fields on one line, tab-separated,
    in key order, its nested lists and objects after it, each line led by the field's name
    in capitals; a list of objects, one line per object, every object giving the same
    columns (the scalar keys of all of them, in order; a missing one is empty).
    """
    lines: list[str] = []
    _text(data, lines, None, None)
    return "\n".join(lines)


def _text(item: Any, lines: list[str], name: str | None, columns: list[str] | None) -> None:
    if isinstance(item, dict):
        if columns is None:
            cells = [_scalar(item[k]) for k in sorted(item) if not isinstance(item[k], (dict, list))]
            nested = [(k, item[k]) for k in sorted(item) if isinstance(item[k], (dict, list))]
        else:
            cells = [_scalar(item[k]) if k in item else "" for k in columns]
            nested = [(k, item[k]) for k in sorted(set(item) - set(columns))]
        if cells:
            lines.append("\t".join(([name.upper()] if name else []) + cells))
        for k, v in nested:
            _text(v, lines, k, None)
    elif isinstance(item, list):
        if not item:
            return
        if any(isinstance(v, dict) for v in item):
            keys = sorted({k for v in item if isinstance(v, dict) for k, x in v.items()
                           if not isinstance(x, (dict, list))})
            for v in item:
                _text(v, lines, name, keys if isinstance(v, dict) else None)
        elif any(isinstance(v, list) for v in item):
            scalars = [v for v in item if not isinstance(v, list)]
            if scalars:
                _scalar_line(scalars, lines, name)
            for v in item:
                if isinstance(v, list):
                    _text(v, lines, name, None)
        else:
            _scalar_line(item, lines, name)
    else:
        lines.append(_scalar(item))


def _scalar_line(values: list, lines: list[str], name: str | None) -> None:
    if name is not None:
        lines.extend(f"{name.upper()}\t{_scalar(v)}" for v in values)
    else:
        lines.append("\t".join(_scalar(v) for v in values))


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
