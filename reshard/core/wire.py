"""DynamoDB's wire format (``{"S": ...}``, ``{"N": ...}``), spelled once.

Control-table rows and data-table keys travel in the low-level client's attribute-value
form. The row codecs of the control table, checkpoint keys and projections all build on
these few helpers instead of each module carrying its own.
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal, InvalidOperation
from typing import Iterable, Mapping


def S(v: str) -> dict:
    """A string attribute value."""
    return {"S": v}


def N(v: float | int) -> dict:
    """A number attribute value (``repr`` keeps a float's full precision)."""
    return {"N": repr(v) if isinstance(v, float) else str(v)}


def carries(item: Mapping | None, wrote: Mapping[str, dict] | None) -> bool:
    """Whether a stored ``item`` (wire form) holds exactly the values ``wrote`` of one write
    (``wrote`` None: the item is absent, a delete's effect).

    How a writer tells its own landed write from another writer's after a conditional write
    failed -- its first attempt landed, the answer was lost, the retry failed on that very
    effect: ``wrote`` includes something only this attempt writes (a fresh version, its own
    ``updated_at`` and operator). Numbers compare by value: DynamoDB normalises their text."""
    if wrote is None or item is None:
        return wrote is None and item is None
    for k, v in wrote.items():
        got = item.get(k)
        if got == v:
            continue
        if got is None or "N" not in v or "N" not in got:
            return False
        try:
            if Decimal(got["N"]) != Decimal(v["N"]):
                return False
        except (InvalidOperation, TypeError):
            return False
    return True


def number(text: str) -> float | int:
    """A wire number as int when it is integral text, else float."""
    return int(text) if text.lstrip("-").isdigit() else float(text)


def get_s(item: Mapping, k: str, default: str | None = None) -> str | None:
    """The string attribute ``k`` of a wire item, or ``default``."""
    return item[k]["S"] if k in item else default


def get_n(item: Mapping, k: str, default: float | None = None) -> float | int | None:
    """The number attribute ``k`` of a wire item, or ``default``."""
    return number(item[k]["N"]) if k in item else default


def get_bool(item: Mapping, k: str, default: bool = False) -> bool:
    """The boolean attribute ``k`` of a wire item, or ``default``."""
    return item[k]["BOOL"] if k in item else default


def dump_key(key: Mapping) -> str:
    """A wire key (LastEvaluatedKey, an item's key) as JSON text; binary values as base64.

    botocore hands binary attributes over as ``bytes``, which JSON cannot hold.
    """
    return json.dumps({a: ({"B64": base64.b64encode(v["B"]).decode()} if "B" in v else v) for a, v in key.items()},
                      sort_keys=True, separators=(",", ":"))


def load_key(text: str) -> dict:
    """The inverse of :func:`dump_key`."""
    return {a: ({"B": base64.b64decode(v["B64"])} if "B64" in v else v) for a, v in json.loads(text).items()}


def key_of(item: Mapping, attrs: Iterable[str]) -> dict:
    """The key attributes ``attrs`` of a wire item."""
    return {a: item[a] for a in attrs}


def key_id(item: Mapping, attrs: Iterable[str]) -> tuple:
    """A cheap hashable id of an item's key: (type, value) of each attribute in ``attrs``."""
    return tuple(next(iter(item[a].items())) for a in attrs)


def still_as_read(attrs: Iterable[str], read: Mapping, tag: str, names: dict, values: dict) -> list[str]:
    """Conditions that each of ``attrs`` still holds what ``read`` held (equal, or still
    absent): the guard of a write made from what was read. Placeholders ``#<tag><n>`` and
    ``:<tag><n>`` are added to ``names`` and ``values``."""
    cond = []
    for n, attr in enumerate(attrs):
        names[f"#{tag}{n}"] = attr
        if attr in read:
            values[f":{tag}{n}"] = read[attr]
            cond.append(f"#{tag}{n} = :{tag}{n}")
        else:
            cond.append(f"attribute_not_exists(#{tag}{n})")
    return cond


def projection(attrs: Iterable[str]) -> dict:
    """``ProjectionExpression`` + ``ExpressionAttributeNames`` reading just ``attrs``.

    Every name goes through a placeholder: attribute names may be reserved words or hold
    characters an expression cannot spell.
    """
    names = {f"#p{i}": a for i, a in enumerate(dict.fromkeys(attrs))}
    return {"ProjectionExpression": ", ".join(names), "ExpressionAttributeNames": names}
